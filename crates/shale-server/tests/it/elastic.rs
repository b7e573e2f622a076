//! The Elasticsearch `_bulk` API as Elasticsearch answers it, and the official Python client's
//! bulk helpers against a real node.

use crate::common;

use common::{TestNode, LOGS_INDEX};
use serde_json::{json, Value};

const T0: i64 = 1_700_000_000;

async fn bulk(
    node: &TestNode,
    method: reqwest::Method,
    path: &str,
    lines: &[Value],
) -> (u16, Option<String>, Value) {
    let body: String = lines.iter().map(|line| format!("{line}\n")).collect();
    let resp = node
        .client
        .request(method, node.url(path))
        .header("content-type", "application/x-ndjson")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let product = resp
        .headers()
        .get("x-elastic-product")
        .map(|v| v.to_str().unwrap().to_string());
    (status, product, resp.json().await.unwrap_or(Value::Null))
}

fn doc(i: i64) -> Value {
    json!({"timestamp": T0 + i, "service": "es", "message": format!("bulk {i}")})
}

#[tokio::test]
async fn bulk_answers_as_elasticsearch_does() {
    let node = TestNode::start().await;
    node.create_index(LOGS_INDEX).await;
    // PUT, as the official clients send it; items get an `_id` even when none was given.
    let (status, product, resp) = bulk(
        &node,
        reqwest::Method::PUT,
        "/api/v1/_elastic/_bulk?refresh=true",
        &[
            json!({"index": {"_index": "logs", "_id": "a"}}),
            doc(1),
            json!({"create": {"_index": "logs"}}),
            doc(2),
            json!({"index": {"_index": "Bad Name!"}}),
            doc(3),
            json!({"index": {"_index": "nope-index"}}),
            doc(4),
        ],
    )
    .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(product.as_deref(), Some("Elasticsearch"));
    assert_eq!(resp["errors"], true);
    let items = resp["items"].as_array().unwrap();
    assert_eq!(items[0]["index"]["_id"], "a");
    assert_eq!(items[0]["index"]["status"], 201);
    assert_eq!(items[0]["index"]["result"], "created");
    assert!(!items[1]["create"]["_id"].as_str().unwrap().is_empty());
    assert_eq!(items[2]["index"]["status"], 400);
    assert_eq!(
        items[2]["index"]["error"]["type"],
        "invalid_index_name_exception"
    );
    assert_eq!(items[3]["index"]["status"], 404);
    assert_eq!(
        items[3]["index"]["error"]["type"],
        "index_not_found_exception"
    );
    assert_eq!(items[3]["index"]["error"]["resource.id"], "nope-index");
    assert_eq!(node.count("logs", "*").await, 2);
    // PUT on the index-scoped form.
    let (status, _, resp) = bulk(
        &node,
        reqwest::Method::PUT,
        "/api/v1/_elastic/logs/_bulk?refresh=true",
        &[json!({"index": {}}), doc(5)],
    )
    .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["errors"], false);

    // Whole-request refusals: nothing of the request is indexed.
    for (lines, kind) in [
        (
            vec![
                json!({"index": {"_index": "logs"}}),
                doc(6),
                json!({"upsert": {"_index": "logs"}}),
                doc(7),
            ],
            "illegal_argument_exception",
        ),
        (
            vec![
                json!({"index": {"_index": "logs"}}),
                doc(6),
                json!({"index": {}}),
                doc(7),
            ],
            "action_request_validation_exception",
        ),
        (vec![json!(["index"]), doc(6)], "illegal_argument_exception"),
        (
            vec![json!({"index": "logs"}), doc(6)],
            "illegal_argument_exception",
        ),
        (
            vec![json!({"index": {"_index": "logs"}})],
            "illegal_argument_exception",
        ),
    ] {
        let (status, product, resp) = bulk(
            &node,
            reqwest::Method::POST,
            "/api/v1/_elastic/_bulk?refresh=true",
            &lines,
        )
        .await;
        assert_eq!(status, 400, "{lines:?}: {resp}");
        assert_eq!(product.as_deref(), Some("Elasticsearch"));
        assert_eq!(resp["error"]["type"], kind, "{lines:?}: {resp}");
        assert_eq!(resp["error"]["root_cause"][0]["type"], kind);
        assert_eq!(resp["status"], 400);
    }
    let resp = node
        .client
        .post(node.url("/api/v1/_elastic/_bulk"))
        .body("{\"index\": {\"_index\": \"logs\"}}\n{\"a\": 1}\n{not json\n{}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "illegal_argument_exception");
    assert!(
        body["error"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("Malformed action/metadata line [3]"),
        "{body}"
    );
    assert_eq!(node.count("logs", "*").await, 3);

    // Any response under the Elasticsearch prefix carries the product header.
    let resp = node
        .client
        .get(node.url("/api/v1/_elastic/unknown/route"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.headers().get("x-elastic-product").unwrap(),
        "Elasticsearch"
    );
    // Not elsewhere.
    let resp = node
        .client
        .get(node.url("/health/livez"))
        .send()
        .await
        .unwrap();
    assert!(resp.headers().get("x-elastic-product").is_none());
    node.stop().await;
}

/// `helpers.bulk` and `helpers.streaming_bulk` of the official `elasticsearch` Python package
/// (8.x; installed by `.ci/run`, skipped elsewhere when missing).
#[tokio::test]
async fn the_official_python_client_bulk_helpers_work() {
    if !crate::common::python_module_installed("elasticsearch") {
        return;
    }
    let node = TestNode::start().await;
    node.create_index(&LOGS_INDEX.replace("index_id: logs", "index_id: es-logs"))
        .await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/es_client.py");
    let base = node.url("/api/v1/_elastic");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .env("ES_URL", base)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "python client failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(results["bulk_ok"], 500, "{results}");
    assert_eq!(results["bulk_errors"], 0);
    assert_eq!(results["streaming_ok"], 100, "{results}");
    assert_eq!(
        results["streaming_failed"],
        json!([400, 400, 404]),
        "{results}"
    );
    assert_eq!(results["raised"], true);
    assert_eq!(results["raised_type"], "index_not_found_exception");
    assert_eq!(node.count("es-logs", "service:py").await, 600);
    assert_eq!(node.count("es-logs", "message:\"python 1042\"").await, 1);
    // The read side through the same client.
    assert_eq!(results["version"], "7.17.0");
    assert_eq!(results["search_total"], 600, "{results}");
    assert_eq!(results["search_first"], "python 1099");
    assert_eq!(results["search_sort"], json!([1_700_001_099_000i64]));
    assert_eq!(results["count"], 1);
    assert_eq!(results["msearch"], json!([200, 404]));
    assert_eq!(results["histogram_total"], 600);
    // Datetime columns are `date_nanos`, as Quickwit lists them.
    assert_eq!(results["field_caps_timestamp"], json!(["date_nanos"]));
    // With the OpenTelemetry indexes every node creates at start.
    assert_eq!(
        results["cat"],
        json!([
            ["es-logs", "600"],
            ["otel-logs-v0_9", "0"],
            ["otel-traces-v0_9", "0"]
        ])
    );
    assert_eq!(results["resolved"], json!(["es-logs"]));
    assert_eq!(results["missing"], "index_not_found_exception");
    node.stop().await;
}
