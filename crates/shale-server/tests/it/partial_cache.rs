//! The leaf's partial-result cache on a real node: a repeated search, a page further on, a
//! smaller page, a sliding time window and a repeated aggregation are answered from it, with
//! the same answer as without it; a delete task is never hidden by it; with the cache off
//! nothing is served from it.

use crate::common;

use common::TestNode;
use serde_json::{json, Value};

const INDEX: &str = "
index_id: cached
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: service, type: text, tokenizer: raw, fast: true}
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
const SPLITS: usize = 3;
const DOCS_PER_SPLIT: usize = 200;

/// The counter of cache lookups with `outcome`, as `/metrics` shows it.
async fn lookups(node: &TestNode, outcome: &str) -> u64 {
    node.metric_value(&format!(
        "shale_search_partial_cache_lookups_total{{outcome=\"{outcome}\"}}"
    ))
    .await
}

/// The parts of a response a cache could change: the count, the hits, the aggregations.
fn answer(response: &Value) -> Value {
    json!({
        "num_hits": response["num_hits"],
        "hits": response["hits"],
        "aggregations": response["aggregations"],
    })
}

/// A node (and its data dir) with `cache_bytes` of cache and 3 splits of 200 documents.
async fn loaded_node(cache_bytes: u64) -> (TestNode, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    config.partial_result_cache_max_bytes = cache_bytes;
    let node = TestNode::start_with(config).await;
    node.create_index(INDEX).await;
    for split in 0..SPLITS {
        let ndjson: String = (0..DOCS_PER_SPLIT)
            .map(|i| {
                let n = split * DOCS_PER_SPLIT + i;
                let service = ["api", "db", "web"][n % 3];
                format!(
                    "{}\n",
                    json!({
                        "ts": T0 + n as i64,
                        "service": service,
                        "message": if n.is_multiple_of(4) { format!("timeout {n}") } else { format!("ok {n}") },
                    })
                )
            })
            .collect();
        node.ingest("cached", &ndjson, "force").await;
    }
    (node, tmp)
}

#[tokio::test]
async fn repeated_paged_and_sliding_searches_are_answered_from_the_cache_unchanged() {
    let (node, _dir) = loaded_node(64 << 20).await;
    let total = (SPLITS * DOCS_PER_SPLIT) as u64;
    let timeouts = (0..total).filter(|n| n % 4 == 0).count() as u64;
    let request = json!({"query": "timeout", "max_hits": 40, "sort_by": "ts"});

    // The same search twice: the second is served by the cache, one lookup per split.
    let first = node.search("cached", request.clone()).await;
    assert_eq!(first["num_hits"], timeouts);
    let hits_before = lookups(&node, "hit").await;
    let second = node.search("cached", request.clone()).await;
    assert_eq!(answer(&second), answer(&first));
    assert_eq!(lookups(&node, "hit").await - hits_before, SPLITS as u64);

    // A page further on within the first 40, and a smaller page: served by the 40-hit entries.
    let hits_before = lookups(&node, "hit").await;
    let page2 = node
        .search(
            "cached",
            json!({"query": "timeout", "max_hits": 20, "start_offset": 20, "sort_by": "ts"}),
        )
        .await;
    let small = node
        .search(
            "cached",
            json!({"query": "timeout", "max_hits": 5, "sort_by": "ts"}),
        )
        .await;
    assert_eq!(lookups(&node, "hit").await - hits_before, 2 * SPLITS as u64);
    assert_eq!(
        page2["hits"].as_array().unwrap()[..],
        first["hits"].as_array().unwrap()[20..40]
    );
    assert_eq!(
        small["hits"].as_array().unwrap()[..],
        first["hits"].as_array().unwrap()[..5]
    );

    // A deeper page than anything cached searches again.
    let misses_before = lookups(&node, "miss").await;
    let deep = node
        .search(
            "cached",
            json!({"query": "timeout", "max_hits": 60, "sort_by": "ts"}),
        )
        .await;
    assert_eq!(lookups(&node, "miss").await - misses_before, SPLITS as u64);
    assert_eq!(
        deep["hits"].as_array().unwrap()[..40],
        first["hits"].as_array().unwrap()[..]
    );

    // A sliding window: both windows cover the two older splits whole, so they are served
    // from the cache; the newest split is cut by both ends differently. (Enough hits asked
    // for that no split is only counted.)
    let window = |start: i64, end: i64| {
        json!({"query": "*", "max_hits": 1000, "sort_by": "ts",
               "start_timestamp": start, "end_timestamp": end})
    };
    let newest_start = T0 + ((SPLITS - 1) * DOCS_PER_SPLIT) as i64;
    node.search("cached", window(T0 - 100, newest_start + 50))
        .await;
    let hits_before = lookups(&node, "hit").await;
    let slid = node
        .search("cached", window(T0 - 90, newest_start + 60))
        .await;
    assert_eq!(
        lookups(&node, "hit").await - hits_before,
        (SPLITS - 1) as u64
    );
    assert_eq!(
        slid["num_hits"],
        ((SPLITS - 1) * DOCS_PER_SPLIT + 60) as u64,
        "{slid}"
    );

    // Aggregations, repeated.
    let aggs = json!({"query": "*", "max_hits": 0,
        "aggs": {"per_service": {"terms": {"field": "service"}},
                 "over_time": {"date_histogram": {"field": "ts", "fixed_interval": "60s"}}}});
    let first_aggs = node.search("cached", aggs.clone()).await;
    let hits_before = lookups(&node, "hit").await;
    let second_aggs = node.search("cached", aggs.clone()).await;
    assert_eq!(lookups(&node, "hit").await - hits_before, SPLITS as u64);
    assert_eq!(answer(&second_aggs), answer(&first_aggs));

    // A delete task: the next search is not served a stale answer.
    let (status, body) = node
        .post(
            "/api/v1/cached/delete-tasks",
            json!({"query": "service:api"}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let after_delete = node.search("cached", request.clone()).await;
    let expected = (0..total).filter(|n| n % 4 == 0 && n % 3 != 0).count() as u64;
    assert_eq!(after_delete["num_hits"], expected, "{after_delete}");
    assert!(after_delete["hits"]
        .as_array()
        .unwrap()
        .iter()
        .all(|hit| hit["service"] != "api"));

    // Every answer above equals the uncached one.
    node.node.search.set_partial_result_cache(0);
    let uncached = node.search("cached", request.clone()).await;
    assert_eq!(answer(&uncached), answer(&after_delete));
    let uncached_aggs = node.search("cached", aggs).await;
    assert_ne!(
        uncached_aggs["num_hits"], first_aggs["num_hits"],
        "the delete applies"
    );
    node.stop().await;
}

#[tokio::test]
async fn with_the_cache_off_nothing_is_served_from_it() {
    let (node, _dir) = loaded_node(0).await;
    let request = json!({"query": "timeout", "max_hits": 10, "sort_by": "ts"});
    let first = node.search("cached", request.clone()).await;
    let second = node.search("cached", request).await;
    assert_eq!(answer(&first), answer(&second));
    assert_eq!(lookups(&node, "hit").await, 0);
    node.stop().await;
}
