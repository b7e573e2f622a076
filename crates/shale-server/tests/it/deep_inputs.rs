//! Inputs nested far deeper than anyone writes (queries, Elasticsearch DSL, PromQL, SQL,
//! configs): each is a 400 that names the limit, and the node stays up. Without the limits,
//! one such request overflowed a runtime thread's stack and aborted the whole process.

use serde_json::{json, Value};

use crate::common::{TestNode, LOGS_INDEX};

/// `depth` nested copies of `open` … `close` around `inner`.
fn nested(open: &str, inner: &str, close: &str, depth: usize) -> String {
    format!("{}{inner}{}", open.repeat(depth), close.repeat(depth))
}

fn encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// The node still answers, and still finds its document.
async fn still_up(node: &TestNode) {
    let (status, _) = node.get("/health/livez").await;
    assert_eq!(status, 200);
    assert_eq!(node.count("logs", "*").await, 1);
}

fn assert_refused(what: &str, status: u16, body: &Value, limit_words: &str) {
    assert_eq!(status, 400, "{what}: {body}");
    let text = body.to_string();
    assert!(text.contains(limit_words), "{what}: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_inputs_are_refused_and_the_node_stays_up() {
    let node = TestNode::start().await;
    node.create_index(LOGS_INDEX).await;
    node.ingest(
        "logs",
        r#"{"timestamp": 1700000000, "service": "a", "message": "hello"}"#,
        "force",
    )
    .await;

    for query in [
        nested("(", "service:a", ")", 1000),
        format!("{}service:a", "NOT ".repeat(1000)),
        format!("{}service:a", "-".repeat(1000)),
        nested("(", "service:a", ")", 65),
    ] {
        let (status, body) = node
            .get(&format!("/api/v1/logs/search?query={}", encode(&query)))
            .await;
        assert_refused("GET search", status, &body, "maximum query depth");
        let (status, body) = node
            .post("/api/v1/logs/search", json!({ "query": query }).to_string())
            .await;
        assert_refused("POST search", status, &body, "maximum query depth");
        let (status, body) = node
            .post(
                "/api/v1/logs/delete-tasks",
                json!({ "query": query }).to_string(),
            )
            .await;
        assert_refused("delete task", status, &body, "maximum query depth");
        let (status, body) = node
            .post(
                "/api/v1/_elastic/logs/_search",
                json!({"query": {"query_string": {"query": query}}}).to_string(),
            )
            .await;
        assert_refused("ES query_string", status, &body, "maximum query depth");
        still_up(&node).await;
    }
    // 64 levels are fine.
    let (status, body) = node
        .get(&format!(
            "/api/v1/logs/search?query={}",
            encode(&nested("(", "service:a", ")", 64))
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["num_hits"], 1);

    // Elasticsearch DSL: a bool nested as deep as JSON parsing allows, and deeper.
    for depth in [40, 1000] {
        let mut dsl = json!({"term": {"service": "a"}});
        let mut text = dsl.to_string();
        for _ in 0..depth {
            text = format!(r#"{{"bool":{{"must":[{text}]}}}}"#);
        }
        if depth < 100 {
            dsl = serde_json::from_str(&text).unwrap_or(dsl);
            text = json!({ "query": dsl }).to_string();
        } else {
            text = format!(r#"{{"query":{text}}}"#);
        }
        let (status, body) = node.post("/api/v1/_elastic/logs/_search", text).await;
        assert_eq!(status, 400, "ES bool {depth} deep: {body}");
        still_up(&node).await;
    }

    // PromQL: parentheses, unary minus, long binary chains, nested functions.
    for query in [
        nested("(", "1", ")", 1000),
        format!("{}1{}", "-(".repeat(40), ")".repeat(40)),
        format!("1{}", " + 1".repeat(5000)),
        nested("abs(", "vector(1)", ")", 1000),
    ] {
        let (status, body) = node
            .get(&format!(
                "/prometheus/api/v1/query?query={}&time=1700000000",
                encode(&query)
            ))
            .await;
        assert_eq!(status, 400, "PromQL {}: {body}", &query[..20]);
        assert_eq!(body["errorType"], "bad_data", "{body}");
        assert!(body["error"].as_str().unwrap().contains("depth"), "{body}");
        still_up(&node).await;
    }

    // As deep as allowed: answered.
    for query in [
        format!("1{}", " + 1".repeat(62)),
        nested("abs(", "vector(1)", ")", 62),
    ] {
        let (status, body) = node
            .get(&format!(
                "/prometheus/api/v1/query?query={}&time=1700000000",
                encode(&query)
            ))
            .await;
        assert_eq!(status, 200, "{body}");
    }

    // SQL.
    for sql in [
        format!("SELECT {} AS x", nested("(", "1", ")", 1000)),
        format!("SELECT 1{} AS x", " + 1".repeat(5000)),
    ] {
        let (status, body) = node
            .post("/api/v1/_sql", json!({ "query": sql }).to_string())
            .await;
        assert_eq!(status, 400, "SQL: {body}");
        still_up(&node).await;
    }

    // As long as allowed: answered.
    let (status, body) = node
        .post(
            "/api/v1/_sql",
            json!({ "query": format!("SELECT 1{} AS x", " + 1".repeat(500)) }).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Index configs (YAML and JSON) nested deep.
    let yaml = format!(
        "index_id: deep\ndoc_mapping: {}",
        nested("[", "1", "]", 5000)
    );
    let (status, body) = node.post("/api/v1/indexes", yaml).await;
    assert_eq!(status, 400, "{body}");
    let json_config = format!(
        r#"{{"index_id": "deep", "doc_mapping": {}}}"#,
        nested("[", "1", "]", 5000)
    );
    let (status, body) = node.post("/api/v1/indexes", json_config).await;
    assert_eq!(status, 400, "{body}");
    still_up(&node).await;

    // Every refusal above was counted.
    let counted = node
        .metric_value("shale_requests_refused_total{reason=\"depth_limit\"}")
        .await;
    assert!(counted >= 15, "{counted} depth-limit refusals counted");
    node.stop().await;
}
