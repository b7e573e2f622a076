//! Object storage that misbehaves, on the real parts: a node whose S3 endpoint is a
//! fault-injecting proxy (`shale_testkit::fault_proxy`) in front of the S3 test server (moto).
//! The proxy answers 500/503, holds requests unanswered, resets connections before or in the
//! middle of answers and trickles bodies, on PUT, GET, ranged GET and multipart requests,
//! while the node ingests, merges and searches. What a user would notice is asserted:
//!
//! - every document acknowledged with 200 is searchable exactly once when the faults stop;
//! - every published split has its object (checked on moto directly, not through the proxy);
//! - merges that fail are retried, and end with fewer splits and the same documents;
//! - a search answers the exact count, or says what failed (an error status, or `errors`
//!   naming the split): never a wrong count without an error.
//!
//! Each test prints what the proxy did (faults and retries per kind) and the figures of the
//! scenario.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::TestNode;
use rand::distr::{Alphanumeric, SampleString};
use rand::SeedableRng;
use serde_json::{json, Value};
use shale_config::NodeConfig;
use shale_storage::StorageRef;
use shale_testkit::fault_proxy::{Fault, FaultProxy, FaultRule, FaultStats, RequestKind};

const T0: i64 = 1_700_000_000;

const PUTS: [RequestKind; 2] = [RequestKind::PutObject, RequestKind::Multipart];
const GETS: [RequestKind; 2] = [RequestKind::GetObject, RequestKind::RangeGet];

/// A node config whose S3 endpoint is a fault proxy in front of the test server, with a
/// client of the same bucket that bypasses the proxy.
struct FaultyS3 {
    config: NodeConfig,
    proxy: FaultProxy,
    bucket: String,
    direct: shale_storage::StorageResolver,
}

impl FaultyS3 {
    /// `None` (a skipped test) when there is no S3 test server outside CI.
    fn new(config: NodeConfig, whole_splits: bool) -> Option<FaultyS3> {
        let mut config = common::on_s3(config, whole_splits)?;
        let upstream = config.s3.endpoint.clone().unwrap();
        let direct = shale_storage::StorageResolver::new(shale_server::node::s3_options(&config));
        let bucket = config
            .default_index_root_uri
            .strip_prefix("s3://")
            .and_then(|rest| rest.split('/').next())
            .unwrap()
            .to_string();
        let proxy = FaultProxy::start(&upstream).unwrap();
        config.s3.endpoint = Some(proxy.endpoint());
        Some(FaultyS3 {
            config,
            proxy,
            bucket,
            direct,
        })
    }

    /// The index's storage on the S3 server itself (no faults).
    fn direct_storage(&self, index_id: &str) -> StorageRef {
        self.direct
            .resolve(&format!("s3://{}/indexes/{index_id}", self.bucket))
            .unwrap()
    }

    /// Checks that every published split of `index_id` has its whole object on the S3
    /// server (a HEAD and a read of its last byte, bypassing the proxy); returns how many.
    async fn check_published_objects(&self, node: &TestNode, index_id: &str) -> usize {
        let storage = self.direct_storage(index_id);
        let splits = published_splits(node, index_id).await;
        for split in &splits {
            let split_id = split["split_id"].as_str().unwrap();
            let size = split["size_bytes"].as_u64().unwrap();
            let name = format!("{split_id}.split");
            assert!(
                storage.exists(&name).await.unwrap(),
                "published split {split_id} has no object {name} on the S3 server"
            );
            let last = storage.get_range(&name, size - 1..size).await.unwrap();
            assert_eq!(last.len(), 1, "the object of split {split_id} is short");
        }
        splits.len()
    }
}

/// The test index: a unique `doc_id` (fast, so a terms aggregation counts each one), a
/// stored-only `payload` to make big splits cheaply.
fn index_yaml(index_id: &str, commit_timeout_secs: u64, merge_policy: &str) -> String {
    format!(
        r#"
version: 0.8
index_id: {index_id}
doc_mapping:
  mode: lenient
  field_mappings:
    - name: timestamp
      type: datetime
      input_formats: [unix_timestamp]
      fast: true
    - name: doc_id
      type: text
      tokenizer: raw
      fast: true
    - name: service
      type: text
      tokenizer: raw
      fast: true
    - name: level
      type: text
      tokenizer: raw
    - name: message
      type: text
      tokenizer: default
      record: position
    - name: payload
      type: text
      indexed: false
  timestamp_field: timestamp
  tag_fields: [service]
indexing_settings:
  commit_timeout_secs: {commit_timeout_secs}
  merge_policy:
{merge_policy}
search_settings:
  default_search_fields: [message]
"#
    )
}

const NO_MERGE: &str = "    type: no_merge";
const MERGE_PAIRS: &str = "    type: stable_log\n    merge_factor: 2\n    max_merge_factor: 10\n    min_level_num_docs: 100000";

/// Documents `start..start + n` of `service` (ids `{service}-{i}`; every tenth is an ERROR),
/// each with `payload_bytes` of random text; with their ids.
fn docs(service: &str, start: usize, n: usize, payload_bytes: usize) -> (String, Vec<String>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(start as u64);
    let mut out = String::new();
    let mut ids = Vec::with_capacity(n);
    for i in start..start + n {
        let id = format!("{service}-{i}");
        let mut doc = json!({
            "timestamp": T0 + i as i64,
            "doc_id": id,
            "service": service,
            "level": if i % 10 == 0 { "ERROR" } else { "INFO" },
            "message": format!("request {i} handled by {service} quick brown fox"),
        });
        if payload_bytes > 0 {
            doc["payload"] = json!(Alphanumeric.sample_string(&mut rng, payload_bytes));
        }
        out.push_str(&doc.to_string());
        out.push('\n');
        ids.push(id);
    }
    (out, ids)
}

async fn published_splits(node: &TestNode, index_id: &str) -> Vec<Value> {
    let (status, resp) = node
        .get(&format!(
            "/api/v1/indexes/{index_id}/splits?split_states=Published"
        ))
        .await;
    assert_eq!(status, 200, "{resp}");
    resp["splits"].as_array().unwrap().clone()
}

/// Sends an ingest request; `Err` with the status and body (or why there was no answer).
async fn try_ingest(
    node: &TestNode,
    index_id: &str,
    ndjson: String,
    commit: &str,
) -> Result<Value, String> {
    let resp = node
        .client
        .post(node.url(&format!("/api/v1/{index_id}/ingest?commit={commit}")))
        .body(ndjson)
        .send()
        .await
        .map_err(|err| format!("no answer: {err}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .text()
        .await
        .map_err(|err| format!("{status}, no body: {err}"))?;
    if status == 200 {
        Ok(serde_json::from_str(&body).unwrap())
    } else {
        Err(format!("{status}: {body}"))
    }
}

/// How many times each `doc_id` of `index_id` is found (a terms aggregation over all of
/// them), or `None` when the search did not answer 200 without errors.
async fn doc_id_counts(node: &TestNode, index_id: &str) -> Option<BTreeMap<String, u64>> {
    let request = json!({
        "query": "*",
        "max_hits": 0,
        "aggs": {"ids": {"terms": {"field": "doc_id", "size": 65000}}},
    });
    let (status, resp) = node
        .post(&format!("/api/v1/{index_id}/search"), request.to_string())
        .await;
    if status != 200 || resp["errors"].as_array().is_some_and(|e| !e.is_empty()) {
        return None;
    }
    let ids = &resp["aggregations"]["ids"];
    assert_eq!(ids["sum_other_doc_count"], 0, "{ids}");
    let counts: BTreeMap<String, u64> = ids["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["key"].as_str().unwrap().to_string(),
                b["doc_count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        counts.values().sum::<u64>(),
        resp["num_hits"].as_u64().unwrap(),
        "the buckets do not add up to the count"
    );
    Some(counts)
}

/// Polls until every id of `acked` is found; then checks none is found twice and nothing
/// but `sent` ids is there. Returns the number of documents found.
async fn assert_all_there_exactly_once(
    node: &TestNode,
    index_id: &str,
    acked: &BTreeSet<String>,
    sent: &BTreeSet<String>,
    deadline: Duration,
) -> usize {
    let deadline = Instant::now() + deadline;
    loop {
        let counts = doc_id_counts(node, index_id).await;
        let missing = counts.as_ref().map_or(acked.len(), |c| {
            acked.iter().filter(|id| !c.contains_key(*id)).count()
        });
        if let (Some(counts), 0) = (&counts, missing) {
            let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
            assert!(
                twice.is_empty(),
                "documents found more than once: {:?}",
                &twice[..twice.len().min(10)]
            );
            let unknown: Vec<_> = counts.keys().filter(|id| !sent.contains(*id)).collect();
            assert!(unknown.is_empty(), "documents never sent: {unknown:?}");
            return counts.len();
        }
        assert!(
            Instant::now() < deadline,
            "{missing} of {} acknowledged documents still missing",
            acked.len()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The sum of the samples of metric `name` (any labels) in `/metrics`.
async fn metric(node: &TestNode, name: &str) -> f64 {
    node.metrics()
        .await
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.split([' ', '{']).next() == Some(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The output of `future`, with the time it took.
async fn timed<T>(future: impl std::future::Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let output = future.await;
    (output, started.elapsed())
}

fn print_stats(test: &str, stats: &FaultStats) {
    eprintln!("[{test}] proxy: {stats}");
}

/// Faults on uploads: errors, resets before and during answers, slow bodies, one answer that
/// never comes after the object was written, one request never answered; and first a burst
/// of 503s longer than the S3 client's own retries, so that one upload fails for the
/// pipeline, which must start over from the WAL.
fn upload_faults() -> Vec<FaultRule> {
    vec![
        FaultRule::next(&PUTS, Fault::Status(503), 12),
        FaultRule::next(&[RequestKind::PutObject], Fault::Hold, 1),
        FaultRule::next(&[RequestKind::Multipart], Fault::HoldAfterForward, 1),
        FaultRule::new(&PUTS, Fault::Status(500)).probability(0.1),
        FaultRule::new(&PUTS, Fault::Status(503)).probability(0.1),
        FaultRule::new(&PUTS, Fault::Reset).probability(0.08),
        FaultRule::new(&PUTS, Fault::ResetMidResponse).probability(0.08),
        FaultRule::new(
            &PUTS,
            Fault::Slow {
                chunk_bytes: 64 * 1024,
                delay: Duration::from_millis(5),
            },
        )
        .probability(0.1),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_under_upload_faults_keeps_every_acknowledged_document_exactly_once() {
    let test = "ingest";
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    // One request big enough for a split uploaded in parts (8 MiB each).
    config.max_ingest_body_bytes = 32 << 20;
    let Some(s3) = FaultyS3::new(config, false) else {
        return;
    };
    let started = Instant::now();
    let node = TestNode::start_with(s3.config.clone()).await;
    node.create_index(&index_yaml("ingest", 2, NO_MERGE)).await;
    s3.proxy.set_rules(upload_faults());

    // Two clients at once: one sends small batches in every commit mode, the other one big
    // batch (a split of more than 8 MiB: a multipart upload) and then small ones.
    let small_client = async {
        let mut outcomes = Vec::new();
        for round in 0..9 {
            let commit = ["auto", "wait_for", "force"][round % 3];
            let (ndjson, ids) = docs("small", round * 300, 300, 0);
            outcomes.push((
                commit,
                ids,
                timed(try_ingest(&node, "ingest", ndjson, commit)).await,
            ));
        }
        outcomes
    };
    let big_client = async {
        let mut outcomes = Vec::new();
        let (ndjson, ids) = docs("big", 0, 7000, 2500);
        outcomes.push((
            "force",
            ids,
            timed(try_ingest(&node, "ingest", ndjson, "force")).await,
        ));
        for round in 0..3 {
            let commit = ["auto", "force", "wait_for"][round];
            let (ndjson, ids) = docs("late", round * 200, 200, 0);
            outcomes.push((
                commit,
                ids,
                timed(try_ingest(&node, "ingest", ndjson, commit)).await,
            ));
        }
        outcomes
    };
    let (small, big) = tokio::join!(small_client, big_client);
    let mut acked = BTreeSet::new();
    let mut sent = BTreeSet::new();
    let mut failed = Vec::new();
    let mut acked_requests: BTreeMap<&str, usize> = BTreeMap::new();
    let mut slowest_commit = Duration::ZERO;
    for (commit, ids, (outcome, elapsed)) in small.into_iter().chain(big) {
        sent.extend(ids.iter().cloned());
        match outcome {
            Ok(body) => {
                if commit != "auto" {
                    slowest_commit = slowest_commit.max(elapsed);
                }
                assert_eq!(body["num_ingested_docs"], ids.len(), "{body}");
                *acked_requests.entry(commit).or_default() += 1;
                acked.extend(ids);
            }
            Err(err) => {
                // A request that fails says why.
                assert!(
                    err.contains("message") || err.starts_with("no answer"),
                    "{err}"
                );
                failed.push(err);
            }
        }
    }
    // Still under faults: what is published has its object.
    let published_under_faults = s3.check_published_objects(&node, "ingest").await;
    let during = s3.proxy.stats();
    s3.proxy.clear_rules();
    let found =
        assert_all_there_exactly_once(&node, "ingest", &acked, &sent, Duration::from_secs(90))
            .await;
    let splits = s3.check_published_objects(&node, "ingest").await;
    let upload_errors = metric(&node, "shale_indexing_errors_total").await;
    print_stats(test, &during);
    eprintln!(
        "[{test}] requests acknowledged per commit mode {acked_requests:?}, failed {}: \
         {failed:?}; slowest wait_for/force acknowledgement {:.1} s",
        failed.len(),
        slowest_commit.as_secs_f64()
    );
    eprintln!(
        "[{test}] documents sent {}, acknowledged {}, found {found} (each once); {splits} \
         published splits ({published_under_faults} while the faults went on), all with their \
         objects; pipeline retries (failed commits) {upload_errors}; {:.1} s",
        sent.len(),
        acked.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        during.requests_of(RequestKind::Multipart) > 0,
        "no multipart upload: {during}"
    );
    assert!(during.injected_of(RequestKind::PutObject) > 0, "{during}");
    assert!(during.injected_of(RequestKind::Multipart) > 0, "{during}");
    assert!(during.total_retries() > 0, "{during}");
    assert!(
        upload_errors >= 1.0,
        "the burst of 503s should have failed one commit"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merges_under_download_and_upload_faults_are_retried_and_lose_nothing() {
    let test = "merges";
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    config.compaction.planner_interval_secs = 1;
    config.compaction.janitor_interval_secs = 3600;
    // One merge at a time: the burst of 503s below meets one download, longer than its retries.
    config.compaction.max_concurrent_merges = 1;
    let Some(s3) = FaultyS3::new(config, false) else {
        return;
    };
    let started = Instant::now();
    let node = TestNode::start_with(s3.config.clone()).await;
    node.create_index(&index_yaml("merges", 1, MERGE_PAIRS))
        .await;
    // While the splits are ingested, every download fails: the merges planned meanwhile fail
    // and are retried.
    s3.proxy
        .set_rules(vec![FaultRule::new(&GETS, Fault::Status(503))]);
    let mut sent = BTreeSet::new();
    for batch in 0..6 {
        let (ndjson, ids) = docs("merge", batch * 500, 500, 200);
        try_ingest(&node, "merges", ndjson, "force").await.unwrap();
        sent.extend(ids);
    }
    // Then the next merge's downloads fail beyond the S3 client's retries (it fails once
    // more), the next uploads (merge outputs) get an error and a reset answer, and downloads
    // (ranged GETs too: a download cut short resumes by range) and uploads stay flaky.
    s3.proxy.set_rules(vec![
        FaultRule::next(&GETS, Fault::Status(503), 25),
        FaultRule::next(&PUTS, Fault::Status(500), 1),
        FaultRule::next(&PUTS, Fault::ResetMidResponse, 1),
        FaultRule::new(&GETS, Fault::ResetMidResponse).probability(0.15),
        FaultRule::new(&GETS, Fault::Reset).probability(0.1),
        FaultRule::new(&GETS, Fault::Status(500)).probability(0.1),
        FaultRule::new(
            &GETS,
            Fault::Slow {
                chunk_bytes: 16 * 1024,
                delay: Duration::from_millis(2),
            },
        )
        .probability(0.15),
        FaultRule::new(&PUTS, Fault::Status(500)).probability(0.15),
        FaultRule::new(&PUTS, Fault::Reset).probability(0.1),
        FaultRule::new(&PUTS, Fault::ResetMidResponse).probability(0.1),
    ]);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut split_counts = Vec::new();
    loop {
        let n = published_splits(&node, "merges").await.len();
        if split_counts.last() != Some(&n) {
            split_counts.push(n);
        }
        if n == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {n} published splits (counts seen: {split_counts:?}); proxy: {}",
            s3.proxy.stats()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    s3.check_published_objects(&node, "merges").await;
    let during = s3.proxy.stats();
    s3.proxy.clear_rules();
    let failed = metric(&node, "shale_merges_failed_total").await;
    let succeeded = metric(&node, "shale_merges_succeeded_total").await;
    let found =
        assert_all_there_exactly_once(&node, "merges", &sent, &sent, Duration::from_secs(30)).await;
    assert_eq!(found, 3000);
    let splits = s3.check_published_objects(&node, "merges").await;
    let (_, status) = node.get("/api/v1/indexes/merges/compaction").await;
    let errors: BTreeSet<String> = status["recent_merges"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["error"].as_str())
        .map(|e| e.chars().take(160).collect())
        .collect();
    print_stats(test, &during);
    eprintln!(
        "[{test}] merges failed {failed}, succeeded {succeeded}; published splits over time \
         {split_counts:?}; documents 3000 sent, {found} found (each once) in {splits} split; \
         {:.1} s",
        started.elapsed().as_secs_f64()
    );
    eprintln!("[{test}] merge errors recorded: {errors:?}");
    assert!(failed >= 1.0, "no merge failed: {during}");
    assert!(succeeded >= 1.0);
    assert!(during.injected_of(RequestKind::GetObject) > 0, "{during}");
    assert!(during.injected_of(RequestKind::PutObject) >= 2, "{during}");
    node.stop().await;
}

/// The searches and their true counts over the corpus of [`search_corpus`].
fn search_queries() -> Vec<(Value, u64)> {
    vec![
        (json!({"query": "*", "max_hits": 0}), 9000),
        (
            json!({"query": "level:ERROR", "max_hits": 3, "sort_by": "-timestamp"}),
            900,
        ),
        (json!({"query": "service:db", "max_hits": 5}), 3000),
        (
            json!({"query": "\"request 4321 handled\"", "max_hits": 1}),
            1,
        ),
        (
            json!({"query": "fox AND level:INFO", "max_hits": 2, "sort_by": "timestamp"}),
            8100,
        ),
        (
            json!({"query": "request", "max_hits": 0,
                   "aggs": {"per_service": {"terms": {"field": "service"}}}}),
            9000,
        ),
    ]
}

/// Outcomes of searches under faults.
#[derive(Debug, Default)]
struct SearchOutcomes {
    exact: u64,
    partial_with_errors: u64,
    failed: u64,
    errors: BTreeSet<String>,
    /// The longest time a search took to answer.
    slowest: Duration,
}

impl SearchOutcomes {
    fn add(&mut self, other: SearchOutcomes) {
        self.exact += other.exact;
        self.partial_with_errors += other.partial_with_errors;
        self.failed += other.failed;
        self.errors.extend(other.errors);
        self.slowest = self.slowest.max(other.slowest);
    }
}

/// Runs `queries`; each answer must be the exact count, or an error saying what failed: an
/// error status with a message, or `errors` naming the splits left out (then the count of
/// everything is exactly that of the other splits).
async fn search_round(
    node: &TestNode,
    splits: &BTreeMap<String, u64>,
    queries: &[(Value, u64)],
    outcomes: &mut SearchOutcomes,
) {
    for (request, truth) in queries {
        let truth = *truth;
        let started = Instant::now();
        let resp = node
            .client
            .post(node.url("/api/v1/search-faults/search"))
            .body(request.to_string())
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        outcomes.slowest = outcomes.slowest.max(started.elapsed());
        if status != 200 {
            let message = body["message"].as_str().unwrap_or_default();
            assert!(
                !message.is_empty(),
                "a failed search without a message: {status} {body}"
            );
            outcomes.failed += 1;
            outcomes.errors.insert(format!(
                "{status}: {}",
                message.chars().take(300).collect::<String>()
            ));
            continue;
        }
        let errors = body["errors"].as_array().cloned().unwrap_or_default();
        let num_hits = body["num_hits"].as_u64().unwrap();
        if errors.is_empty() {
            assert_eq!(
                num_hits, truth,
                "a wrong count without an error for {request}: {body}"
            );
            outcomes.exact += 1;
            continue;
        }
        // A partial answer names the splits it could not search.
        let mut left_out = 0;
        for error in &errors {
            let error = error.as_str().unwrap();
            let named: Vec<(&String, &u64)> = splits
                .iter()
                .filter(|(id, _)| error.contains(id.as_str()))
                .collect();
            assert_eq!(named.len(), 1, "an error that names no split: {error}");
            left_out += named[0].1;
            outcomes.errors.insert(error.chars().take(300).collect());
        }
        assert!(
            num_hits <= truth,
            "{request}: {num_hits} hits of {truth} with errors {errors:?}"
        );
        if request["query"] == "*" {
            assert_eq!(num_hits, truth - left_out, "{body}");
        }
        outcomes.partial_with_errors += 1;
    }
}

/// Six splits of 1500 documents (services api, db and web, two each) uploaded without faults;
/// the node is stopped (searches start from cold caches). The splits and their documents.
async fn search_corpus(s3: &FaultyS3) -> BTreeMap<String, u64> {
    let node = TestNode::start_with(s3.config.clone()).await;
    node.create_index(&index_yaml("search-faults", 30, NO_MERGE))
        .await;
    for (i, service) in ["api", "api", "db", "db", "web", "web"]
        .into_iter()
        .enumerate()
    {
        let (ndjson, _) = docs(service, i * 1500, 1500, 100);
        try_ingest(&node, "search-faults", ndjson, "force")
            .await
            .unwrap();
    }
    let splits = published_splits(&node, "search-faults")
        .await
        .iter()
        .map(|s| {
            (
                s["split_id"].as_str().unwrap().to_string(),
                s["num_docs"].as_u64().unwrap(),
            )
        })
        .collect::<BTreeMap<_, _>>();
    assert_eq!(splits.len(), 6);
    node.stop().await;
    splits
}

async fn search_under_faults(whole_splits: bool) {
    let test = if whole_splits {
        "search whole splits"
    } else {
        "search by ranges"
    };
    let tmp = tempfile::tempdir().unwrap();
    let Some(s3) = FaultyS3::new(common::config_in(tmp.path()), whole_splits) else {
        return;
    };
    let started = Instant::now();
    let splits = search_corpus(&s3).await;
    let queries = search_queries();
    let flaky = vec![
        FaultRule::new(&GETS, Fault::Status(500)).probability(0.2),
        FaultRule::new(&GETS, Fault::Status(503)).probability(0.1),
        FaultRule::new(&GETS, Fault::Reset).probability(0.1),
        FaultRule::new(&GETS, Fault::ResetMidResponse).probability(0.15),
        FaultRule::new(
            &GETS,
            Fault::Slow {
                chunk_bytes: 8 * 1024,
                delay: Duration::from_millis(2),
            },
        )
        .probability(0.15),
    ];
    let with_flaky = |mut rules: Vec<FaultRule>| {
        rules.extend(flaky.clone());
        rules
    };
    // An outage longer than the S3 client's retries.
    let outage = with_flaky(vec![FaultRule::next(&GETS, Fault::Status(503), 80)]);
    // One split's object unreadable (every GET of it fails): a search that needs to read it
    // leaves it out and says so; one that does not — the count of everything comes from the
    // splits' metadata, a term's count from the dictionary in a split's hot cache — is exact.
    let down = splits.keys().next().unwrap().clone();
    let one_split_down = vec![FaultRule::new(&GETS, Fault::Status(503)).on_target(&down)];
    // Answers that never come: requests held unanswered, one answered by S3 but never
    // delivered.
    let timeouts = with_flaky(vec![
        FaultRule::next(&GETS, Fault::Hold, 2),
        FaultRule::next(&GETS, Fault::HoldAfterForward, 1),
    ]);
    // Every GET fails once the splits are open (by ranges, the reads Tantivy makes next fail
    // inside the search): no count may come out of the reads that failed.
    let outage_after_open = vec![FaultRule::new(&GETS, Fault::Status(503))];
    // (name, rules, queries, passes, whether the first query runs before the faults start).
    let mut rounds = vec![("flaky", flaky.clone(), &queries[..], 2, false)];
    if whole_splits {
        // Nothing is read after a download: the outage hits the downloads.
        rounds.push(("outage", outage, &queries[..], 1, false));
    } else {
        rounds.push((
            "outage after open",
            outage_after_open,
            &queries[..3],
            1,
            true,
        ));
    }
    rounds.extend([
        ("one split down", one_split_down, &queries[..3], 1, false),
        ("timeouts", timeouts, &queries[..], 1, false),
        ("flaky again", flaky.clone(), &queries[..], 2, false),
    ]);
    let mut per_round = Vec::new();
    let mut total = SearchOutcomes::default();
    for (name, rules, queries, passes, open_first) in rounds {
        // A node started afresh: cold caches, its reads go to S3.
        let node = TestNode::start_with(s3.config.clone()).await;
        let mut outcomes = SearchOutcomes::default();
        let queries = if open_first {
            search_round(&node, &splits, &queries[..1], &mut outcomes).await;
            &queries[1..]
        } else {
            queries
        };
        s3.proxy.set_rules(rules);
        let before = s3.proxy.stats();
        for _ in 0..passes {
            search_round(&node, &splits, queries, &mut outcomes).await;
        }
        s3.proxy.clear_rules();
        let after = s3.proxy.stats();
        per_round.push(format!(
            "{name}: {} exact, {} partial naming the failed split, {} failed; {} faults, \
             {} retries; slowest answer {:.1} s",
            outcomes.exact,
            outcomes.partial_with_errors,
            outcomes.failed,
            after.total_injected() - before.total_injected(),
            after.total_retries() - before.total_retries(),
            outcomes.slowest.as_secs_f64(),
        ));
        match name {
            "outage" | "outage after open" => {
                assert!(
                    outcomes.partial_with_errors + outcomes.failed > 0,
                    "an outage longer than the client's retries went unnoticed: {outcomes:?}"
                );
                // Downloads that failed on the object store are worth retrying: a search
                // that failed on every split says so (503, not 500).
                if name == "outage" {
                    for error in outcomes.errors.iter().filter(|e| e.starts_with("50")) {
                        assert!(error.starts_with("503: "), "not a 503: {error}");
                    }
                }
            }
            "one split down" => {
                assert!(
                    outcomes.exact >= 1 && outcomes.partial_with_errors >= 1,
                    "{outcomes:?}"
                );
                assert_eq!(
                    outcomes.exact + outcomes.partial_with_errors,
                    queries.len() as u64,
                    "{outcomes:?}"
                );
                assert!(
                    outcomes.errors.iter().all(|e| e.contains(&down)),
                    "{outcomes:?}"
                );
            }
            // A request S3 never answers costs a search seconds, not the S3 client's 30 s
            // request timeout (let alone its 3 minutes of retries).
            "timeouts" => assert!(
                outcomes.slowest < Duration::from_secs(25),
                "a search took {:.1} s to get past answers that never came",
                outcomes.slowest.as_secs_f64()
            ),
            _ => {}
        }
        total.add(outcomes);
        node.stop().await;
    }
    // Once the faults stop, every answer is exact.
    let node = TestNode::start_with(s3.config.clone()).await;
    let mut after = SearchOutcomes::default();
    search_round(&node, &splits, &queries, &mut after).await;
    assert_eq!(after.exact, queries.len() as u64, "{after:?}");
    s3.check_published_objects(&node, "search-faults").await;
    node.stop().await;
    let stats = s3.proxy.stats();
    print_stats(test, &stats);
    for round in &per_round {
        eprintln!("[{test}] {round}");
    }
    eprintln!(
        "[{test}] {} answers exact, {} partial naming the failed splits, {} failed with a \
         message, none wrong; {:.1} s",
        total.exact,
        total.partial_with_errors,
        total.failed,
        started.elapsed().as_secs_f64()
    );
    for error in total.errors.iter().take(3) {
        eprintln!("[{test}] error shown: {error}");
    }
    let kind = if whole_splits {
        RequestKind::GetObject
    } else {
        RequestKind::RangeGet
    };
    assert!(stats.injected_of(kind) > 0, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_by_ranges_under_faults_are_exact_or_say_what_failed() {
    search_under_faults(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_of_whole_splits_under_faults_are_exact_or_say_what_failed() {
    search_under_faults(true).await;
}
