//! The query memory budget (`query_memory_budget_bytes`): one small request that would take
//! gigabytes (a huge SQL answer, a PromQL subquery of millions of steps, deeply nested
//! aggregations sent at once) is refused with its API's own error before the memory is
//! taken, the refusals are counted in `/metrics`, and the node's peak resident memory stays
//! under the budget (each test runs in its own process under nextest, so the process's peak
//! is the node's).

use serde_json::{json, Value};

use crate::common::{config_in, TestNode, LOGS_INDEX};

/// The budget of these nodes.
const BUDGET: u64 = 256 << 20;

async fn node_with_budget() -> TestNode {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config_in(tmp.path());
    config.query_memory_budget_bytes = BUDGET;
    let mut node = TestNode::start_with(config).await;
    node.keep_dir(tmp);
    node
}

/// The process's peak resident memory so far (`VmHWM`), in bytes.
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The peak stays under what the process held before plus the budget.
fn assert_peak_under_budget(what: &str, before: u64) {
    let peak = peak_rss();
    eprintln!(
        "{what}: peak RSS {} MiB (before the requests {} MiB, budget {} MiB)",
        peak >> 20,
        before >> 20,
        BUDGET >> 20
    );
    assert!(
        peak < before + BUDGET,
        "{what}: peak RSS {} MiB passed the budget ({} MiB over {} MiB)",
        peak >> 20,
        BUDGET >> 20,
        before >> 20
    );
}

async fn refused_for_memory(node: &TestNode) -> u64 {
    node.metric_value("shale_requests_refused_total{reason=\"memory_budget\"}")
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_sql_answer_is_refused_and_streamed_no_further() {
    let node = node_with_budget().await;
    let before = peak_rss();
    for rows in [1_000_000u64, 5_000_000] {
        let (status, body) = node
            .post(
                "/api/v1/_sql",
                json!({ "query": format!("SELECT * FROM generate_series(1, {rows})") }).to_string(),
            )
            .await;
        assert_eq!(status, 400, "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains("rows"), "{message}");
    }
    // A wide answer under the row cap is refused by its bytes.
    let (status, body) = node
        .post(
            "/api/v1/_sql",
            json!({ "query": "SELECT repeat('x', 2000) AS wide FROM generate_series(1, 90000)" })
                .to_string(),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("bytes"),
        "{body}"
    );
    // Answers within the caps come back whole.
    let (status, body) = node
        .post(
            "/api/v1/_sql",
            json!({ "query": "SELECT count(*) AS n FROM generate_series(1, 5000000)" }).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rows"][0]["n"], 5_000_000, "{body}");
    let (status, body) = node
        .post(
            "/api/v1/_sql",
            json!({ "query": "SELECT * FROM generate_series(1, 1000)" }).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["num_rows"], 1000);
    assert_peak_under_budget("SQL", before);
    // Nothing stays held once the answers are sent.
    assert_eq!(node.node.memory_budget.in_use(), BUDGET / 2);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promql_subquery_of_millions_of_steps_is_refused_before_its_memory() {
    let node = node_with_budget().await;
    let before = peak_rss();
    let refused_before = refused_for_memory(&node).await;
    let (status, body) = node
        .get(&format!(
            "/prometheus/api/v1/query?query={}&time=1700000000",
            url::form_urlencoded::byte_serialize(b"count_over_time(vector(1)[2y:1s])")
                .collect::<String>()
        ))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["errorType"], "execution", "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("query_memory_budget_bytes"),
        "{body}"
    );
    assert!(refused_for_memory(&node).await > refused_before);
    // A subquery within the budget is answered.
    let (status, body) = node
        .get(&format!(
            "/prometheus/api/v1/query?query={}&time=1700000000",
            url::form_urlencoded::byte_serialize(b"count_over_time(vector(1)[1h:1s])")
                .collect::<String>()
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["result"][0]["value"][1], "3601", "{body}");
    assert_peak_under_budget("PromQL", before);
    assert_eq!(node.node.memory_budget.in_use(), BUDGET / 2);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deep_aggregations_are_refused_before_taking_memory() {
    let node = node_with_budget().await;
    ingest_a_value_per_document(&node).await;
    let before = peak_rss();
    // 30 levels of terms on fields with a value per document, 8 at once: they once peaked at
    // gigabytes before each ended as a 400.
    let mut aggs = json!({"terms": {"field": "service", "size": 10000}});
    for level in 0..29 {
        let field = ["service", "status"][level % 2];
        aggs = json!({"terms": {"field": field, "size": 10000}, "aggs": {"inner": aggs}});
    }
    let request = json!({"query": "*", "max_hits": 0, "aggs": {"outer": aggs}}).to_string();
    let calls = (0..8).map(|_| node.post("/api/v1/logs/search", request.clone()));
    let answers: Vec<(u16, Value)> = futures::future::join_all(calls).await;
    for (status, body) in &answers {
        assert_eq!(*status, 400, "{body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("maximum aggregation depth"),
            "{body}"
        );
    }
    assert_peak_under_budget("aggregations", before);
    // The node still answers an aggregation within the depth.
    let body = node
        .search(
            "logs",
            json!({"query": "*", "max_hits": 0, "aggs": {"s": {"terms": {"field": "service", "size": 3}}}}),
        )
        .await;
    assert_eq!(body["num_hits"], 3_000);
    node.stop().await;
}

/// 3 000 logs whose `service` and `status` differ from document to document.
async fn ingest_a_value_per_document(node: &TestNode) {
    node.create_index(LOGS_INDEX).await;
    let docs: String = (0..3_000)
        .map(|i| {
            format!(
                "{{\"timestamp\": {}, \"service\": \"s{i}\", \"status\": {i}, \"message\": \"m\"}}\n",
                1_700_000_000 + i
            )
        })
        .collect();
    node.ingest("logs", &docs, "force").await;
}

/// 8 levels (the most allowed) of `terms` on fields with a value per document: an answer of
/// 24 000 buckets (2.3 MB of JSON) whose intermediate results hold tens of MB.
fn deep_terms_request() -> String {
    let mut aggs = json!({"terms": {"field": "service", "size": 10000}});
    for level in 0..7 {
        let field = ["status", "service"][level % 2];
        aggs = json!({"terms": {"field": field, "size": 10000}, "aggs": {"inner": aggs}});
    }
    json!({"query": "*", "max_hits": 0, "aggs": {"outer": aggs}}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_aggregations_within_the_depth_share_the_budget() {
    let node = node_with_budget().await;
    ingest_a_value_per_document(&node).await;
    let before = peak_rss();
    let refused_before = refused_for_memory(&node).await;
    // 8 at once: they once peaked at 650 MiB over the budget's 256, each answered 200. Now
    // each is answered whole or refused with the budget named, and the peak stays under it.
    // (The answers are read as text: 8 parsed answers would weigh more than the node.)
    let request = deep_terms_request();
    let calls = (0..8).map(|_| node.post_text("/api/v1/logs/search", request.clone()));
    let answers: Vec<(u16, String)> = futures::future::join_all(calls).await;
    let mut answered = 0;
    let mut refused = 0;
    for (status, body) in &answers {
        match status {
            200 => {
                answered += 1;
                assert!(
                    body.len() > 2_000_000,
                    "a whole answer: {} bytes",
                    body.len()
                );
            }
            400 => {
                refused += 1;
                assert!(body.contains("query_memory_budget_bytes"), "{body}");
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert!(answered >= 1, "at least one of them fits the budget");
    assert_eq!(refused_for_memory(&node).await - refused_before, refused);
    assert_peak_under_budget("aggregations within the depth", before);
    // Nothing stays held once the answers are sent; alone, the request is answered whole.
    assert_eq!(node.node.memory_budget.in_use(), BUDGET / 2);
    let (status, body) = node.post("/api/v1/logs/search", request).await;
    assert_eq!(status, 200);
    let outer = body["aggregations"]["outer"]["buckets"].as_array().unwrap();
    assert_eq!(outer.len(), 3_000);
    assert_eq!(
        outer[0]["inner"]["buckets"][0]["doc_count"], 1,
        "{}",
        outer[0]
    );
    node.stop().await;
}
