//! Request forms clients use beyond the plain ones: routes with a trailing slash (Quickwit's
//! routes accept both) and `Content-Encoding: gzip` bodies on ingest, `_bulk` and search.

use crate::common;

use std::io::Write;

use common::{log_docs, TestNode, LOGS_INDEX};
use serde_json::{json, Value};

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

async fn send(
    node: &TestNode,
    method: reqwest::Method,
    path: &str,
    body: Vec<u8>,
    encoding: Option<&str>,
) -> (u16, Value) {
    let mut request = node.client.request(method, node.url(path)).body(body);
    if let Some(encoding) = encoding {
        request = request.header("content-encoding", encoding);
    }
    let resp = request.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn trailing_slashes_and_gzip_bodies() {
    let node = TestNode::start().await;
    // Trailing slashes.
    let (status, body) = send(
        &node,
        reqwest::Method::POST,
        "/api/v1/indexes/",
        LOGS_INDEX.as_bytes().to_vec(),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = node.get("/api/v1/indexes/logs/").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["index_config"]["index_id"], "logs");
    let (status, _) = node.get("/api/v1/indexes/").await;
    assert_eq!(status, 200);

    // gzip ingest.
    let docs = log_docs(0, 50, 1_700_000_000, "zipped");
    let (status, body) = send(
        &node,
        reqwest::Method::POST,
        "/api/v1/logs/ingest?commit=force",
        gzip(docs.as_bytes()),
        Some("gzip"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["num_ingested_docs"], 50, "{body}");
    // gzip _bulk.
    let bulk: String = (0..10)
        .map(|i| {
            format!(
                "{}\n{}\n",
                json!({"index": {"_index": "logs"}}),
                json!({"timestamp": 1_700_001_000 + i, "service": "bulk-zipped", "message": "m"})
            )
        })
        .collect();
    let (status, body) = send(
        &node,
        reqwest::Method::POST,
        "/api/v1/_elastic/_bulk?refresh=true",
        gzip(bulk.as_bytes()),
        Some("gzip"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["errors"], false, "{body}");
    // gzip search body, on a route with a trailing slash.
    let (status, body) = send(
        &node,
        reqwest::Method::POST,
        "/api/v1/logs/search/",
        gzip(
            json!({"query": "service:zipped OR service:bulk-zipped", "max_hits": 0})
                .to_string()
                .as_bytes(),
        ),
        Some("gzip"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["num_hits"], 60);
    // A corrupt gzip body is refused; an unknown encoding is a 415.
    let (status, _) = send(
        &node,
        reqwest::Method::POST,
        "/api/v1/logs/ingest",
        b"not gzip".to_vec(),
        Some("gzip"),
    )
    .await;
    assert_eq!(status, 400, "corrupt gzip");
    let (status, _) = send(
        &node,
        reqwest::Method::POST,
        "/api/v1/logs/ingest",
        b"{}".to_vec(),
        Some("snappy"),
    )
    .await;
    assert_eq!(status, 415);
    assert_eq!(node.count("logs", "*").await, 60);
    node.stop().await;
}
