//! Doc mapping options of Quickwit configs, through the REST API: `dynamic_mapping` (the
//! options of undeclared fields), `index_field_presence` (`field:*` and the Elasticsearch
//! `exists` query on fields that are not fast), `store_document_size` (`_doc_length`
//! aggregations) and default search fields naming dynamic fields and json paths.

use crate::common;

use common::TestNode;
use serde_json::{json, Value};

async fn es_search(node: &TestNode, index: &str, body: Value) -> Value {
    let (status, resp) = node
        .post(
            &format!("/api/v1/_elastic/{index}/_search"),
            body.to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}: {resp}");
    resp
}

#[tokio::test]
async fn dynamic_mapping_presence_document_size_and_default_fields() {
    let node = TestNode::start().await;
    node.create_index(
        &json!({
            "version": "0.8",
            "index_id": "dyn",
            "doc_mapping": {
                "mode": "dynamic",
                "dynamic_mapping": {"tokenizer": "raw", "fast": {"normalizer": "lowercase"}},
                "index_field_presence": true,
                "store_document_size": true,
                "field_mappings": [
                    {"name": "body", "type": "text"},
                    {"name": "attrs", "type": "json"},
                    {"name": "obj", "type": "object", "field_mappings": [
                        {"name": "code", "type": "u64"}
                    ]},
                ],
            },
            "search_settings": {"default_search_fields": ["body", "user", "attrs.note"]},
        })
        .to_string(),
    )
    .await;
    let docs = [
        json!({"body": "hello world", "user": "Alice Smith", "obj": {"code": 1}}),
        json!({"user": "BOB", "attrs": {"note": "quiet"}}),
        json!({"body": "bye", "attrs": {"other": 1}}),
        json!({"level": "ERROR"}),
        json!({"level": "error", "obj": {}}),
    ];
    let ndjson: Vec<String> = docs.iter().map(|d| d.to_string()).collect();
    node.ingest("dyn", &ndjson.join("\n"), "force").await;

    // Raw tokenizer on undeclared fields: the whole value, case kept.
    assert_eq!(node.count("dyn", "user:\"Alice Smith\"").await, 1);
    assert_eq!(node.count("dyn", "user:alice").await, 0);
    // Default search fields: a declared field, a dynamic field, a json path.
    assert_eq!(node.count("dyn", "hello").await, 1);
    assert_eq!(node.count("dyn", "BOB").await, 1);
    assert_eq!(node.count("dyn", "quiet").await, 1);
    // Presence: any field, fast or not, objects included; empty objects are absent.
    assert_eq!(node.count("dyn", "body:*").await, 2);
    assert_eq!(node.count("dyn", "user:*").await, 2);
    assert_eq!(node.count("dyn", "attrs:*").await, 2);
    assert_eq!(node.count("dyn", "attrs.note:*").await, 1);
    assert_eq!(node.count("dyn", "obj:*").await, 1);
    assert_eq!(node.count("dyn", "obj.code:*").await, 1);
    assert_eq!(node.count("dyn", "missing:*").await, 0);
    assert_eq!(node.count("dyn", "NOT body:*").await, 3);
    let resp = es_search(
        &node,
        "dyn",
        json!({"query": {"exists": {"field": "attrs"}}}),
    )
    .await;
    assert_eq!(resp["hits"]["total"]["value"], 2, "{resp}");
    let resp = es_search(
        &node,
        "dyn",
        json!({"query": {"bool": {"must_not": [{"exists": {"field": "user"}}]}}}),
    )
    .await;
    assert_eq!(resp["hits"]["total"]["value"], 3, "{resp}");

    // The lowercase normalizer: one terms bucket for ERROR and error.
    let resp = es_search(
        &node,
        "dyn",
        json!({"size": 0, "aggs": {"levels": {"terms": {"field": "level"}}}}),
    )
    .await;
    assert_eq!(
        resp["aggregations"]["levels"]["buckets"],
        json!([{"key": "error", "doc_count": 2}]),
        "{resp}"
    );

    // Document sizes: the sum of the ingested lines' lengths; not in hits.
    let total: usize = ndjson.iter().map(|line| line.len()).sum();
    let resp = es_search(
        &node,
        "dyn",
        json!({"size": 5, "aggs": {"len": {"sum": {"field": "_doc_length"}}}}),
    )
    .await;
    assert_eq!(
        resp["aggregations"]["len"]["value"],
        json!(total as f64),
        "{resp}"
    );
    for hit in resp["hits"]["hits"].as_array().unwrap() {
        assert!(hit["_source"].get("_doc_length").is_none(), "{hit}");
    }

    // Misconfigurations are 400s naming the problem.
    let refused = |config: Value| {
        let node = &node;
        async move {
            let (status, body) = node.post("/api/v1/indexes", config.to_string()).await;
            assert_eq!(status, 400, "{body}");
            body["message"].as_str().unwrap_or_default().to_string()
        }
    };
    let message = refused(json!({
        "index_id": "bad1",
        "doc_mapping": {"mode": "strict", "dynamic_mapping": {"tokenizer": "raw"}},
    }))
    .await;
    assert!(
        message.contains("only allowed with `mode: dynamic`"),
        "{message}"
    );
    let message = refused(json!({
        "index_id": "bad2",
        "doc_mapping": {"mode": "lenient"},
        "search_settings": {"default_search_fields": ["regular_field"]},
    }))
    .await;
    assert!(
        message.contains("unknown default search field `regular_field`"),
        "{message}"
    );
    let message = refused(json!({
        "index_id": "bad3",
        "doc_mapping": {"dynamic_mapping": {"indexed": false}},
        "search_settings": {"default_search_fields": ["some_field"]},
    }))
    .await;
    assert!(
        message.contains("default search field `some_field` is not indexed"),
        "{message}"
    );
}
