//! Time windows on splits of several thousand documents, searched through the REST API: the
//! time filter skips the blocks of documents outside a window, takes those inside whole and
//! checks values only in the blocks a window cuts. Counts and hits must be exactly what an
//! independent evaluation of the same documents says, for documents in time order with
//! stragglers from far away (as late logs arrive), with and without a term, newest or oldest
//! first.

use crate::common;

use common::TestNode;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const INDEX: &str = "
index_id: windows
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: n, type: u64, fast: true}
    - {name: service, type: text, tokenizer: raw}
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 1
compaction:
  enabled: false
";

const T0: i64 = 1_700_000_000;
/// Documents per split: several blocks of the filter's summaries (1024 documents each).
const PER_SPLIT: i64 = 5_000;
const SPLITS: i64 = 2;

/// The timestamp of document `n`: two a second in order, every 37th a straggler from
/// anywhere in the corpus.
fn ts(n: i64) -> i64 {
    if n % 37 == 0 {
        T0 + (n * 7_919) % (PER_SPLIT * SPLITS) / 2
    } else {
        T0 + n / 2
    }
}

fn service(n: i64) -> &'static str {
    ["api", "db", "web", "cache"][(n % 4) as usize]
}

/// The timestamps (seconds) of the hits, in order.
fn hit_times(response: &Value) -> Vec<i64> {
    response["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .map(|hit| hit["n"].as_i64().map(ts).expect("n"))
        .collect()
}

// On a multi-threaded runtime, as a node runs: the page's documents are read in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_windows_answer_as_an_independent_evaluation() {
    // Every search computed, none served by the partial-result cache.
    let node = TestNode::start_uncached().await;
    node.create_index(INDEX).await;
    for split in 0..SPLITS {
        let ndjson: String = (split * PER_SPLIT..(split + 1) * PER_SPLIT)
            .map(|n| format!("{}\n", json!({"ts": ts(n), "n": n, "service": service(n)})))
            .collect();
        node.ingest("windows", &ndjson, "force").await;
    }
    let all: Vec<i64> = (0..PER_SPLIT * SPLITS).collect();
    let span = PER_SPLIT * SPLITS / 2;
    let mut rng = StdRng::seed_from_u64(26);
    for round in 0..60 {
        // Windows from a second to the whole corpus, some past its ends.
        let start = T0 - 5 + rng.random_range(0..span + 10);
        let end = start + rng.random_range(1..span / (1 + round % 5));
        let service_filter = (round % 2 == 1).then(|| service(round));
        let descending = round % 3 != 0;
        let mut expected: Vec<i64> = all
            .iter()
            .copied()
            .filter(|&n| (start..end).contains(&ts(n)))
            .filter(|&n| service_filter.is_none_or(|s| service(n) == s))
            .map(ts)
            .collect();
        expected.sort_unstable();
        if descending {
            expected.reverse();
        }
        let query = service_filter.map_or("*".to_string(), |s| format!("service:{s}"));
        let response = node
            .search(
                "windows",
                json!({"query": query, "max_hits": 7,
                       "sort_by": if descending { "ts" } else { "-ts" },
                       "start_timestamp": start, "end_timestamp": end}),
            )
            .await;
        let context = format!("{query} in [{start}, {end}) descending {descending}");
        assert_eq!(
            response["num_hits"].as_u64(),
            Some(expected.len() as u64),
            "{context}"
        );
        assert_eq!(
            hit_times(&response),
            expected.iter().take(7).copied().collect::<Vec<_>>(),
            "{context}"
        );
    }
    node.stop().await;
}
