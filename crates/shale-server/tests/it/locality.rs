//! Locality compaction end to end on a real node (SQLite metastore, local storage): batches
//! straddling time buckets, merges into non-overlapping level-1 key ranges, late data joining
//! its bucket, pruning by key range — with every document found exactly once and every query
//! answering the same with and without pruning, and as an independent count says.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use common::TestNode;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use shale_config::NodeConfig;

/// Start of a 15-minute bucket long closed (the test's documents are all "late" for the
/// node's clock, so their buckets are closed at once and get locality merges).
const BUCKET0: i64 = 1_699_999_200;
const BUCKET: i64 = 900;
const NUM_BUCKETS: i64 = 3;
const TARGET_DOCS: u64 = 700;
const MAX_MERGE_OPS: u64 = 4;

const INDEX: &str = "
index_id: sorted
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: service, type: text, tokenizer: raw, fast: true}
    - {name: host, type: text, tokenizer: raw, fast: true}
    - {name: status, type: u64, fast: true}
    - {name: doc_id, type: text, tokenizer: raw}
    - {name: message, type: text}
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 1
  merge_policy:
    type: locality
    sort_fields: [service, host]
    time_bucket: 15m
    target_split_num_docs: 700
    max_merge_ops: 4
search_settings:
  default_search_fields: [message]
";

/// One ingested document, as the test knows it.
#[derive(Clone, Debug)]
struct Doc {
    id: String,
    service: String,
    host: String,
    ts: i64,
    word: String,
}

fn fast_compaction(mut config: NodeConfig) -> NodeConfig {
    config.compaction.planner_interval_secs = 1;
    config.compaction.janitor_interval_secs = 3600;
    config.compaction.max_concurrent_merges = 2;
    config
}

/// `n` documents with timestamps in `buckets` (bucket indexes), skewed services.
fn docs(rng: &mut StdRng, next_id: &mut usize, n: usize, buckets: &[i64]) -> Vec<Doc> {
    (0..n)
        .map(|_| {
            *next_id += 1;
            // A few big services, many small ones.
            let service = if rng.random_range(0..3) == 0 {
                format!("svc-{:02}", rng.random_range(0..3))
            } else {
                format!("svc-{:02}", rng.random_range(3..16))
            };
            let bucket = buckets[rng.random_range(0..buckets.len())];
            Doc {
                id: format!("d{next_id}"),
                service,
                host: format!("host-{}", rng.random_range(0..8)),
                ts: BUCKET0 + bucket * BUCKET + rng.random_range(0..BUCKET),
                word: format!("w{}", rng.random_range(0..5)),
            }
        })
        .collect()
}

fn ndjson(docs: &[Doc]) -> String {
    docs.iter()
        .map(|d| {
            json!({"ts": d.ts, "service": d.service, "host": d.host, "doc_id": d.id,
                   "status": d.ts % 7, "message": format!("{} event", d.word)})
            .to_string()
                + "\n"
        })
        .collect()
}

async fn published(node: &TestNode) -> Vec<Value> {
    let (status, resp) = node
        .get("/api/v1/indexes/sorted/splits?split_states=Published")
        .await;
    assert_eq!(status, 200, "{resp}");
    resp["splits"].as_array().unwrap().clone()
}

/// Waits until no merge was pending or running for 10 s: longer than the policy waits for
/// late splits to stop arriving (two commit timeouts and 5 s) before merging them.
async fn settle(node: &TestNode) {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut idle_since: Option<Instant> = None;
    loop {
        let (_, status) = node.get("/api/v1/indexes/sorted/compaction").await;
        let idle = status["pending_operations"] == 0
            && status["running"].as_array().is_some_and(|r| r.is_empty());
        if !idle {
            idle_since = None;
        } else if idle_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(10) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "compaction never settled: {status}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn hex(value: &Value) -> Vec<u8> {
    let text = value.as_str().expect("a hex key");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The invariants of a settled locality index.
fn check_splits(splits: &[Value]) -> BTreeMap<i64, (usize, usize)> {
    let mut per_bucket: BTreeMap<i64, Vec<&Value>> = BTreeMap::new();
    for split in splits {
        let bucket = split["time_bucket_start"]
            .as_i64()
            .expect("every split has a bucket");
        let (start, end) = (
            split["time_range"]["start"].as_i64().unwrap(),
            split["time_range"]["end"].as_i64().unwrap(),
        );
        assert!(
            bucket <= start && end < bucket + BUCKET,
            "split {} holds [{start}, {end}] outside its bucket {bucket}",
            split["split_id"]
        );
        assert!(split["num_merge_ops"].as_u64().unwrap() <= MAX_MERGE_OPS);
        assert!(split["sort_key_min"].is_string() && split["sort_key_max"].is_string());
        per_bucket.entry(bucket).or_default().push(split);
    }
    let mut shape = BTreeMap::new();
    for (bucket, splits) in per_bucket {
        let mut level1: Vec<(Vec<u8>, Vec<u8>)> = splits
            .iter()
            .filter(|s| s["key_level"] == 1)
            .map(|s| (hex(&s["sort_key_min"]), hex(&s["sort_key_max"])))
            .collect();
        level1.sort();
        for pair in level1.windows(2) {
            assert!(
                pair[0].1 < pair[1].0,
                "two level-1 splits of bucket {bucket} overlap"
            );
        }
        let level0 = splits.len() - level1.len();
        shape.insert(bucket, (level1.len(), level0));
    }
    shape
}

/// The ids of the documents a query matches (all pages), and the split counts reported.
async fn run_query(node: &TestNode, query: &str, start: i64, end: i64) -> (Vec<String>, u64, u64) {
    let resp = node
        .search(
            "sorted",
            json!({"query": query, "start_timestamp": start, "end_timestamp": end,
                   "max_hits": 10_000, "sort_by": "ts"}),
        )
        .await;
    let mut ids: Vec<String> = resp["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["doc_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        ids.len() as u64,
        resp["num_hits"].as_u64().unwrap(),
        "{query}"
    );
    ids.sort();
    (
        ids,
        resp["num_splits_pruned"].as_u64().unwrap_or(0),
        resp["num_splits_searched"].as_u64().unwrap_or(0),
    )
}

fn expected(docs: &[Doc], query: &Query, start: i64, end: i64) -> Vec<String> {
    let mut ids: Vec<String> = docs
        .iter()
        .filter(|d| d.ts >= start && d.ts < end && query.matches(d))
        .map(|d| d.id.clone())
        .collect();
    ids.sort();
    ids
}

/// A query the test evaluates on its own documents.
#[derive(Debug)]
enum Query {
    Service(String),
    ServiceHost(String, String),
    Services(Vec<String>),
    ServiceRange(String, String),
    ServiceOrWord(String, String),
    ServiceAndWord(String, String),
    Host(String),
}

impl Query {
    fn text(&self) -> String {
        match self {
            Query::Service(s) => format!("service:{s}"),
            Query::ServiceHost(s, h) => format!("service:{s} AND host:{h}"),
            Query::Services(list) => format!("service:IN [{}]", list.join(" ")),
            Query::ServiceRange(a, b) => format!("service:[{a} TO {b}]"),
            Query::ServiceOrWord(s, w) => format!("service:{s} OR message:{w}"),
            Query::ServiceAndWord(s, w) => format!("(service:{s} OR service:svc-00) AND {w}"),
            Query::Host(h) => format!("host:{h}"),
        }
    }

    fn matches(&self, d: &Doc) -> bool {
        match self {
            Query::Service(s) => d.service == *s,
            Query::ServiceHost(s, h) => d.service == *s && d.host == *h,
            Query::Services(list) => list.contains(&d.service),
            Query::ServiceRange(a, b) => *a <= d.service && d.service <= *b,
            Query::ServiceOrWord(s, w) => d.service == *s || d.word == *w,
            Query::ServiceAndWord(s, w) => {
                (d.service == *s || d.service == "svc-00") && d.word == *w
            }
            Query::Host(h) => d.host == *h,
        }
    }

    fn random(rng: &mut StdRng) -> Query {
        let svc = |rng: &mut StdRng| format!("svc-{:02}", rng.random_range(0..17));
        let host = |rng: &mut StdRng| format!("host-{}", rng.random_range(0..9));
        let word = |rng: &mut StdRng| format!("w{}", rng.random_range(0..5));
        match rng.random_range(0..7) {
            0 => Query::Service(svc(rng)),
            1 => Query::ServiceHost(svc(rng), host(rng)),
            2 => Query::Services(vec![svc(rng), svc(rng), svc(rng)]),
            3 => {
                let (a, b) = (svc(rng), svc(rng));
                if a <= b {
                    Query::ServiceRange(a, b)
                } else {
                    Query::ServiceRange(b, a)
                }
            }
            4 => Query::ServiceOrWord(svc(rng), word(rng)),
            5 => Query::ServiceAndWord(svc(rng), word(rng)),
            _ => Query::Host(host(rng)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locality_compaction_converges_prunes_and_keeps_every_document() {
    let tmp = tempfile::tempdir().unwrap();
    let node = TestNode::start_with(fast_compaction(common::config_in(tmp.path()))).await;
    node.create_index(INDEX).await;
    let mut rng = StdRng::seed_from_u64(42);
    let mut next_id = 0;
    let mut all: Vec<Doc> = Vec::new();

    // Batches straddling the three buckets: each commit cuts one split per bucket.
    let buckets: Vec<i64> = (0..NUM_BUCKETS).collect();
    for _ in 0..8 {
        let batch = docs(&mut rng, &mut next_id, 400, &buckets);
        node.ingest("sorted", &ndjson(&batch), "force").await;
        all.extend(batch);
    }
    settle(&node).await;
    let splits = published(&node).await;
    let shape = check_splits(&splits);
    let per_bucket_docs = |bucket: i64, docs: &[Doc]| {
        docs.iter()
            .filter(|d| d.ts >= BUCKET0 + bucket * BUCKET && d.ts < BUCKET0 + (bucket + 1) * BUCKET)
            .count() as u64
    };
    for (i, (bucket, (level1, level0))) in shape.iter().enumerate() {
        assert_eq!(*bucket, BUCKET0 + i as i64 * BUCKET);
        // Converged: level-1 splits only, about ⌈docs / target⌉ of them (cuts fall on
        // (service, host) boundaries, so a split may end a little short of the target).
        assert_eq!(*level0, 0, "bucket {bucket} kept fresh splits: {shape:?}");
        let docs = per_bucket_docs(i as i64, &all);
        let ideal = docs.div_ceil(TARGET_DOCS) as usize;
        assert!(
            *level1 >= ideal && *level1 <= ideal + 1,
            "bucket {bucket}: {docs} docs in {level1} level-1 splits (ideal {ideal})"
        );
    }
    for split in &splits {
        assert!(split["num_docs"].as_u64().unwrap() <= TARGET_DOCS);
    }

    // Late data for the oldest bucket joins its level-1 splits; other buckets are untouched.
    let before: HashMap<String, i64> = splits
        .iter()
        .map(|s| {
            (
                s["split_id"].as_str().unwrap().to_string(),
                s["time_bucket_start"].as_i64().unwrap(),
            )
        })
        .collect();
    for _ in 0..2 {
        let late = docs(&mut rng, &mut next_id, 150, &[0]);
        node.ingest("sorted", &ndjson(&late), "force").await;
        all.extend(late);
    }
    settle(&node).await;
    let splits = published(&node).await;
    let shape = check_splits(&splits);
    assert_eq!(shape[&BUCKET0].1, 0, "late data stayed level 0: {shape:?}");
    for split in &splits {
        let bucket = split["time_bucket_start"].as_i64().unwrap();
        if bucket != BUCKET0 {
            assert!(
                before.contains_key(split["split_id"].as_str().unwrap()),
                "a merge rewrote bucket {bucket}, which got no late data"
            );
        }
    }

    // Every document exactly once.
    let (ids, _, _) = run_query(&node, "*", BUCKET0, BUCKET0 + NUM_BUCKETS * BUCKET).await;
    assert_eq!(ids.len(), all.len());
    let mut expected_ids: Vec<String> = all.iter().map(|d| d.id.clone()).collect();
    expected_ids.sort();
    assert_eq!(ids, expected_ids);

    // Queries: the independent count, with and without pruning; pruning skips splits. The
    // partial-result cache is on for the first two runs (the second finds what the first
    // searched in it) and off for a third.
    let mut pruned_total = 0;
    let cache_bytes = node.node.config.partial_result_cache_max_bytes;
    assert!(cache_bytes > 0, "the cache is on by default");
    for _ in 0..60 {
        let query = Query::random(&mut rng);
        let start = BUCKET0 + rng.random_range(0..NUM_BUCKETS * BUCKET);
        let end = start + rng.random_range(60..2 * BUCKET);
        let want = expected(&all, &query, start, end);
        node.node.search.set_key_pruning(true);
        let (with, pruned, _) = run_query(&node, &query.text(), start, end).await;
        node.node.search.set_key_pruning(false);
        let (without, _, _) = run_query(&node, &query.text(), start, end).await;
        node.node.search.set_partial_result_cache(0);
        let (uncached, _, _) = run_query(&node, &query.text(), start, end).await;
        node.node.search.set_partial_result_cache(cache_bytes);
        node.node.search.set_key_pruning(true);
        assert_eq!(with, want, "`{}` over [{start}, {end})", query.text());
        assert_eq!(without, want, "`{}` without pruning", query.text());
        assert_eq!(uncached, want, "`{}` without the cache", query.text());
        pruned_total += pruned;
    }
    assert!(pruned_total > 0, "no split was ever pruned by key");

    // A single (service, host) over one bucket opens one split.
    let probe = &all[0];
    let bucket_start = probe.ts - (probe.ts - BUCKET0).rem_euclid(BUCKET);
    let query = format!("service:{} AND host:{}", probe.service, probe.host);
    let resp = node
        .search(
            "sorted",
            json!({"query": query, "start_timestamp": bucket_start,
                   "end_timestamp": bucket_start + BUCKET, "max_hits": 0}),
        )
        .await;
    let all_splits = published(&node).await;
    let in_bucket = all_splits
        .iter()
        .filter(|s| s["time_bucket_start"] == bucket_start)
        .count();
    assert!(in_bucket >= 2, "the bucket has several splits");
    assert_eq!(
        resp["num_splits_pruned"].as_u64().unwrap() as usize,
        all_splits.len() - 1,
        "{resp}"
    );
    node.stop().await;
}
