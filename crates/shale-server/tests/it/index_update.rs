//! `PUT /api/v1/indexes/{id}` (Quickwit's index update): the merge policy, search settings
//! and the doc mapping change; splits published under `no_merge` start merging once a
//! merging policy is set (maturity follows the current policy); splits of the old mapping
//! stay searchable next to the new mapping's; what cannot change is a 400.

use crate::common;

use std::time::{Duration, Instant};

use common::{log_docs, TestNode, LOGS_INDEX};
use serde_json::{json, Value};

const T0: i64 = 1_700_000_000;

async fn put(node: &TestNode, path: &str, body: String) -> (u16, Value) {
    let resp = node
        .client
        .put(node.url(path))
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn published(node: &TestNode) -> Vec<Value> {
    let (_, resp) = node
        .get("/api/v1/indexes/logs/splits?split_states=Published")
        .await;
    resp["splits"].as_array().unwrap().clone()
}

fn with_policy(policy: &str) -> String {
    LOGS_INDEX.replace(
        "  commit_timeout_secs: 1\n",
        &format!("  commit_timeout_secs: 1\n  merge_policy:\n{policy}"),
    )
}

#[tokio::test]
async fn merge_policy_and_doc_mapping_updates() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    config.compaction.planner_interval_secs = 1;
    let node = TestNode::start_with(config).await;
    node.create_index(&with_policy("    type: no_merge\n"))
        .await;
    for batch in 0..3 {
        node.ingest("logs", &log_docs(batch * 10, 10, T0, "api"), "force")
            .await;
    }
    assert_eq!(published(&node).await.len(), 3);
    let old_uid = node.get("/api/v1/indexes/logs").await.1["index_config"]["doc_mapping"]
        ["doc_mapping_uid"]
        .as_str()
        .unwrap()
        .to_string();

    // A merging policy: the splits born mature under no_merge merge now.
    let merging = with_policy(
        "    type: stable_log\n    merge_factor: 3\n    max_merge_factor: 10\n    min_level_num_docs: 100000\n",
    );
    let (status, updated) = put(&node, "/api/v1/indexes/logs", merging.clone()).await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(
        updated["index_config"]["doc_mapping"]["doc_mapping_uid"], old_uid,
        "the doc mapping did not change"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while published(&node).await.len() != 1 {
        assert!(
            Instant::now() < deadline,
            "the no_merge splits never merged"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(node.count("logs", "*").await, 30);

    // A new field and new default search fields: a new doc mapping uid; the old split stays
    // searchable next to the new ones.
    let remapped = merging
        .replace(
            "    - name: doc_id\n",
            "    - name: region\n      type: text\n      tokenizer: raw\n      fast: true\n    - name: doc_id\n",
        )
        .replace(
            "  default_search_fields: [message]",
            "  default_search_fields: [message, region]",
        );
    let (status, updated) = put(&node, "/api/v1/indexes/logs", remapped).await;
    assert_eq!(status, 200, "{updated}");
    let new_uid = updated["index_config"]["doc_mapping"]["doc_mapping_uid"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(new_uid, old_uid);
    let docs: String = (0..5)
        .map(|i| {
            format!(
                "{}\n",
                json!({"timestamp": T0 + 100 + i, "service": "web", "level": "INFO",
                       "message": format!("new doc {i}"), "region": "eu", "doc_id": format!("new-{i}")})
            )
        })
        .collect();
    node.ingest("logs", &docs, "force").await;
    let splits = published(&node).await;
    let uids: std::collections::BTreeSet<&str> = splits
        .iter()
        .map(|s| s["doc_mapping_uid"].as_str().unwrap())
        .collect();
    assert_eq!(uids.len(), 2, "splits of both mappings: {splits:?}");
    assert_eq!(node.count("logs", "*").await, 35);
    assert_eq!(node.count("logs", "region:eu").await, 5);
    assert_eq!(
        node.count("logs", "eu").await,
        5,
        "new default search field"
    );
    assert_eq!(node.count("logs", "service:api").await, 30);
    assert_eq!(node.count("logs", "service:api OR region:eu").await, 35);
    // Hits of both mappings render by field name, sorted across them.
    let hits = node
        .search(
            "logs",
            json!({"query": "*", "max_hits": 35, "sort_by": "-timestamp"}),
        )
        .await["hits"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(hits[0]["doc_id"], "api-0");
    assert_eq!(hits[34]["doc_id"], "new-4");
    assert_eq!(hits[34]["region"], "eu");
    // Aggregations span both.
    let aggs = node
        .search(
            "logs",
            json!({"query": "*", "max_hits": 0,
                   "aggs": {"s": {"terms": {"field": "service", "order": {"_key": "asc"}}}}}),
        )
        .await["aggregations"]
        .clone();
    assert_eq!(aggs["s"]["buckets"][0]["doc_count"], 30);
    assert_eq!(aggs["s"]["buckets"][1]["doc_count"], 5);

    // What cannot change.
    let (status, body) = put(
        &node,
        "/api/v1/indexes/logs",
        merging.replace("index_id: logs", "index_id: other"),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = put(
        &node,
        "/api/v1/indexes/logs",
        merging.replace(
            "index_id: logs\n",
            "index_id: logs\nindex_uri: file:///tmp/elsewhere\n",
        ),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("index_uri"));
    let (status, _) = put(
        &node,
        "/api/v1/indexes/nope",
        merging.replace("index_id: logs", "index_id: nope"),
    )
    .await;
    assert_eq!(status, 404);
    let (status, body) = put(
        &node,
        "/api/v1/indexes/logs",
        "index_id: logs\n".to_string(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    node.stop().await;
}

#[tokio::test]
async fn new_default_search_fields_apply_to_the_next_search() {
    let node = TestNode::start().await;
    node.create_index(LOGS_INDEX).await;
    node.ingest("logs", &log_docs(0, 10, T0, "api"), "force")
        .await;
    // `ERROR` is a level, not a word of any message: a bare term finds it only once `level`
    // is a default search field, though the doc mapping (and its uid) does not change.
    assert_eq!(node.count("logs", "ERROR").await, 0);
    let (status, updated) = put(
        &node,
        "/api/v1/indexes/logs",
        LOGS_INDEX.replace(
            "  default_search_fields: [message]",
            "  default_search_fields: [message, level]",
        ),
    )
    .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(node.count("logs", "ERROR").await, 1);
}
