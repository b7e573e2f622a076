//! Top k by timestamp without searching every split: splits are visited newest first (oldest
//! first for an ascending sort), a split whose time range cannot hold a hit better than the
//! current k-th is only counted — from its metadata for a query matching all of it, else
//! without collecting hits — and the answer (count and hits) stays exactly what an
//! independent evaluation says.

use crate::common;

use common::TestNode;
use serde_json::{json, Value};

const INDEX: &str = "
index_id: timed
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: n, type: u64, fast: true}
    - {name: message, type: text}
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 1
compaction:
  enabled: false
search_settings:
  default_search_fields: [message]
";

const T0: i64 = 1_700_000_000;
const SPLITS: u64 = 12;
const PER_SPLIT: u64 = 50;

async fn only_counted(node: &TestNode, how: &str) -> u64 {
    node.metric_value(&format!(
        "shale_search_leaf_splits_only_counted_total{{how=\"{how}\"}}"
    ))
    .await
}

fn numbers(response: &Value) -> Vec<u64> {
    response["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|hit| hit["n"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn splits_behind_the_kth_hit_are_only_counted_and_answers_stay_exact() {
    // Every search computed, none served by the partial-result cache.
    let node = TestNode::start_uncached().await;
    node.create_index(INDEX).await;
    // Split s holds documents n = s*50 .. s*50+49, one a second: splits' time ranges are
    // disjoint and n orders documents as their timestamps do. Every third says "timeout".
    for split in 0..SPLITS {
        let ndjson: String = (split * PER_SPLIT..(split + 1) * PER_SPLIT)
            .map(|n| {
                let word = if n.is_multiple_of(3) { "timeout" } else { "ok" };
                format!(
                    "{}\n",
                    json!({"ts": T0 + n as i64, "n": n, "message": format!("{word} {n}")})
                )
            })
            .collect();
        node.ingest("timed", &ndjson, "force").await;
    }
    let total = SPLITS * PER_SPLIT;

    // Everything, newest first: the newest split holds the top 10; the others (but those
    // already running when it finished) are counted from their metadata.
    let before = only_counted(&node, "metadata").await;
    let newest = node
        .search(
            "timed",
            json!({"query": "*", "max_hits": 10, "sort_by": "ts"}),
        )
        .await;
    assert_eq!(newest["num_hits"], total);
    assert_eq!(
        numbers(&newest),
        (total - 10..total).rev().collect::<Vec<_>>()
    );
    let skipped = only_counted(&node, "metadata").await - before;
    assert!(
        skipped >= SPLITS - 4,
        "only {skipped} splits counted from metadata"
    );

    // Oldest first.
    let oldest = node
        .search(
            "timed",
            json!({"query": "*", "max_hits": 10, "sort_by": "-ts"}),
        )
        .await;
    assert_eq!(oldest["num_hits"], total);
    assert_eq!(numbers(&oldest), (0..10).collect::<Vec<_>>());

    // A term: the splits behind are counted by the query, the count stays exact.
    let before = only_counted(&node, "query").await;
    let timeouts = node
        .search(
            "timed",
            json!({"query": "timeout", "max_hits": 5, "sort_by": "ts"}),
        )
        .await;
    let expected: Vec<u64> = (0..total).rev().filter(|n| n.is_multiple_of(3)).collect();
    assert_eq!(timeouts["num_hits"], expected.len() as u64);
    assert_eq!(numbers(&timeouts), expected[..5]);
    assert!(only_counted(&node, "query").await > before);

    // A time range that cuts splits: those are counted by the query, never by metadata.
    let (start, end) = (T0 + 75, T0 + 430);
    let ranged = node
        .search(
            "timed",
            json!({"query": "*", "max_hits": 3, "sort_by": "ts",
                   "start_timestamp": start, "end_timestamp": end}),
        )
        .await;
    assert_eq!(ranged["num_hits"], (end - start) as u64);
    assert_eq!(numbers(&ranged), vec![429, 428, 427]);

    // Counting alone: every split from its metadata.
    let before = only_counted(&node, "metadata").await;
    let count = node
        .search("timed", json!({"query": "*", "max_hits": 0}))
        .await;
    assert_eq!(count["num_hits"], total);
    assert_eq!(only_counted(&node, "metadata").await - before, SPLITS);

    // A deep page crossing splits, and a page behind a search_after cursor: as without the
    // skipping (the same documents, in order).
    let deep = node
        .search(
            "timed",
            json!({"query": "*", "max_hits": 20, "start_offset": 90, "sort_by": "ts"}),
        )
        .await;
    assert_eq!(
        numbers(&deep),
        (total - 110..total - 90).rev().collect::<Vec<_>>()
    );
    node.stop().await;
}
