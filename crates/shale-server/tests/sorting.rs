//! `sort_by` as Quickwit reads it: comma-separated criteria over fast fields (or `_score`),
//! `-field` ascending, `field`/`+field` descending, documents without a value last; the
//! order holds across splits; sorting by an unknown or non-fast field is a 400.

mod common;

use common::{log_docs, TestNode, LOGS_INDEX};
use serde_json::{json, Value};

const T0: i64 = 1_700_000_000;

async fn sorted(node: &TestNode, sort_by: &str, max_hits: usize) -> Vec<Value> {
    let resp = node
        .search(
            "logs",
            json!({"query": "*", "max_hits": max_hits, "sort_by": sort_by}),
        )
        .await;
    resp["hits"].as_array().unwrap().clone()
}

fn field<'a>(hits: &'a [Value], name: &str) -> Vec<&'a Value> {
    hits.iter().map(|h| &h[name]).collect()
}

#[tokio::test]
async fn sort_by_fast_fields_in_either_direction_across_splits() {
    let node = TestNode::start().await;
    node.create_index(&LOGS_INDEX.replace(
        "  commit_timeout_secs: 1\n",
        "  commit_timeout_secs: 1\n  merge_policy:\n    type: no_merge\n",
    ))
    .await;
    // Three splits; status = 200 + i % 5.
    for (i, service) in ["api", "web", "db"].into_iter().enumerate() {
        node.ingest("logs", &log_docs(i * 20, 20, T0, service), "force")
            .await;
    }
    let (_, splits) = node
        .get("/api/v1/indexes/logs/splits?split_states=Published")
        .await;
    assert_eq!(splits["splits"].as_array().unwrap().len(), 3);

    // One numeric field, both ways.
    let hits = sorted(&node, "status", 60).await;
    let statuses: Vec<u64> = field(&hits, "status")
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let mut expected = statuses.clone();
    expected.sort_by(|a, b| b.cmp(a));
    assert_eq!(statuses, expected);
    assert_eq!(statuses[0], 204);
    let hits = sorted(&node, "-status", 5).await;
    assert!(field(&hits, "status")
        .iter()
        .all(|v| v.as_u64() == Some(200)));

    // Two criteria: service ascending, then newest first within a service.
    let hits = sorted(&node, "-service,timestamp", 60).await;
    let keys: Vec<(String, String)> = hits
        .iter()
        .map(|h| {
            (
                h["service"].as_str().unwrap().to_string(),
                h["timestamp"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut expected = keys.clone();
    expected.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    assert_eq!(keys, expected);
    assert_eq!(keys[0].0, "api");
    assert_eq!(keys[59].0, "web");
    // Paging keeps the order.
    let page = node
        .search(
            "logs",
            json!({"query": "*", "max_hits": 10, "start_offset": 20, "sort_by": "-service,timestamp"}),
        )
        .await;
    assert_eq!(
        field(page["hits"].as_array().unwrap(), "doc_id"),
        field(&hits[20..30], "doc_id")
    );
    // `_score` as a criterion.
    let resp = node
        .search(
            "logs",
            json!({"query": "fox", "max_hits": 3, "sort_by": "_score,-timestamp"}),
        )
        .await;
    assert_eq!(resp["hits"].as_array().unwrap().len(), 3);

    // Errors.
    for (sort_by, needle) in [
        ("level", "not a fast field"),
        ("nosuch", "no such field"),
        ("status,timestamp,service", "at most 2"),
        ("status:up", "unknown sort order"),
    ] {
        let (status, body) = node
            .post(
                "/api/v1/logs/search",
                json!({"query": "*", "sort_by": sort_by}).to_string(),
            )
            .await;
        assert_eq!(status, 400, "{sort_by}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains(needle),
            "{sort_by}: {body}"
        );
    }
    node.stop().await;
}
