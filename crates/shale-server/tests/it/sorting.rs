//! `sort_by` as Quickwit reads it: comma-separated criteria over fast fields (or `_score`),
//! `-field` ascending, `field`/`+field` descending, documents without a value last; the
//! order holds across splits; sorting by an unknown or non-fast field is a 400.

use crate::common;

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

/// A dynamic field some splits never saw sorts as missing there (the split is not a failure);
/// values of mixed types in one column order by value, booleans as 0 and 1.
#[tokio::test]
async fn sort_by_a_field_absent_from_some_splits() {
    let node = TestNode::start().await;
    node.create_index(
        "index_id: sparse\ndoc_mapping:\n  mode: dynamic\n  dynamic_mapping:\n    fast: true\nindexing_settings:\n  merge_policy:\n    type: no_merge\n",
    )
    .await;
    node.ingest(
        "sparse",
        &json!({"id": 1, "count": 10}).to_string(),
        "force",
    )
    .await;
    node.ingest("sparse", &json!({"id": 2}).to_string(), "force")
        .await;
    node.ingest(
        "sparse",
        &[
            json!({"id": 3, "count": -2.5}),
            json!({"id": 5, "count": 7}),
        ]
        .map(|d| d.to_string())
        .join("\n"),
        "force",
    )
    .await;
    node.ingest(
        "sparse",
        &json!({"id": 4, "count": true}).to_string(),
        "force",
    )
    .await;
    let resp = node
        .search(
            "sparse",
            json!({"query": "*", "max_hits": 10, "sort_by": "count:asc,id:asc"}),
        )
        .await;
    assert_eq!(resp["num_hits"], 5, "{resp}");
    assert!(
        resp["errors"].as_array().is_none_or(|e| e.is_empty()),
        "{resp}"
    );
    let ids: Vec<i64> = resp["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, vec![3, 4, 5, 1, 2], "{resp}");
    let (status, es) = node
        .post(
            "/api/v1/_elastic/sparse/_search",
            json!({"sort": [{"count": "asc"}, {"id": "asc"}]}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{es}");
    let sorts: Vec<Value> = es["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["sort"][0].clone())
        .collect();
    assert_eq!(
        sorts,
        vec![json!(-2.5), json!(true), json!(7.0), json!(10), Value::Null]
    );
}
