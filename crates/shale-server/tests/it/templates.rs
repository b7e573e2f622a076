//! Index templates (`/api/v1/templates`): create, get, list, update, delete; ingest and
//! `_bulk` into a missing index whose id matches a template create the index from the
//! template with the highest priority; ids matching no template stay 404s.

use crate::common;

use common::TestNode;
use serde_json::{json, Value};

fn template(id: &str, patterns: &[&str], priority: u64, commit_timeout_secs: u64) -> String {
    json!({
        "version": "0.8",
        "template_id": id,
        "index_id_patterns": patterns,
        "priority": priority,
        "doc_mapping": {
            "mode": "dynamic",
            "field_mappings": [{"name": "ts", "type": "datetime", "fast": true}],
            "timestamp_field": "ts",
        },
        "indexing_settings": {"commit_timeout_secs": commit_timeout_secs},
    })
    .to_string()
}

#[tokio::test]
async fn templates_crud_and_index_creation_on_first_write() {
    let node = TestNode::start().await;
    let (status, body) = node.get("/api/v1/templates").await;
    assert_eq!((status, body), (200, json!([])));

    let (status, body) = node
        .post("/api/v1/templates", template("logs-tpl", &["logs-*"], 1, 1))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["template_id"], "logs-tpl");
    let (status, body) = node
        .post(
            "/api/v1/templates",
            template("eu-tpl", &["logs-eu-*", "-logs-eu-test*"], 5, 2),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Taken ids and bad templates are 400s naming the problem.
    let (status, body) = node
        .post("/api/v1/templates", template("logs-tpl", &["x-*"], 0, 1))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("logs-tpl"),
        "{body}"
    );
    let (status, body) = node
        .post("/api/v1/templates", template("bad-tpl", &["logs/*"], 0, 1))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("index_id_patterns"),
        "{body}"
    );

    let (status, body) = node.get("/api/v1/templates").await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["template_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["eu-tpl", "logs-tpl"]);
    let (status, _) = node.get("/api/v1/templates/nope").await;
    assert_eq!(status, 404);

    // Ingest into a missing index matching a template creates it from that template.
    let body = node
        .ingest(
            "logs-us-1",
            "{\"ts\": 1700000000, \"msg\": \"a\"}\n{\"ts\": 1700000001, \"msg\": \"b\"}",
            "force",
        )
        .await;
    assert_eq!(body["num_ingested_docs"], 2, "{body}");
    let (status, index) = node.get("/api/v1/indexes/logs-us-1").await;
    assert_eq!(status, 200);
    assert_eq!(
        index["index_config"]["indexing_settings"]["commit_timeout_secs"],
        1
    );
    assert_eq!(node.count("logs-us-1", "msg:b").await, 1);

    // The highest priority wins; exclusions fall back to the other templates.
    node.ingest("logs-eu-1", "{\"ts\": 1700000000}", "force")
        .await;
    let (_, index) = node.get("/api/v1/indexes/logs-eu-1").await;
    assert_eq!(
        index["index_config"]["indexing_settings"]["commit_timeout_secs"],
        2
    );
    node.ingest("logs-eu-test1", "{\"ts\": 1700000000}", "force")
        .await;
    let (_, index) = node.get("/api/v1/indexes/logs-eu-test1").await;
    assert_eq!(
        index["index_config"]["indexing_settings"]["commit_timeout_secs"],
        1
    );

    // `_bulk` too; an id no template matches is still an index_not_found_exception.
    let bulk = "{\"index\": {\"_index\": \"logs-bulk\"}}\n{\"ts\": 1700000000, \"msg\": \"x\"}\n\
                {\"index\": {\"_index\": \"other\"}}\n{\"ts\": 1700000000}\n";
    let (status, body) = node
        .post("/api/v1/_elastic/_bulk?refresh=true", bulk.to_string())
        .await;
    assert_eq!(status, 200, "{body}");
    let items = body["items"].as_array().unwrap();
    assert_eq!(items[0]["index"]["status"], 201, "{body}");
    assert_eq!(items[1]["index"]["status"], 404, "{body}");
    assert_eq!(
        items[1]["index"]["error"]["type"],
        "index_not_found_exception"
    );
    assert_eq!(node.count("logs-bulk", "msg:x").await, 1);
    let (status, _) = node.post("/api/v1/nothing-here/ingest", "{}").await;
    assert_eq!(status, 404);

    // Update: the path's id wins; unknown ids are 404s.
    let (status, body) = node
        .put(
            "/api/v1/templates/logs-tpl",
            template("ignored", &["logs-*"], 1, 7),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["template_id"], "logs-tpl");
    let (_, body) = node.get("/api/v1/templates/logs-tpl").await;
    assert_eq!(body["indexing_settings"]["commit_timeout_secs"], 7);
    node.ingest("logs-later", "{\"ts\": 1700000000}", "force")
        .await;
    let (_, index) = node.get("/api/v1/indexes/logs-later").await;
    assert_eq!(
        index["index_config"]["indexing_settings"]["commit_timeout_secs"],
        7
    );
    let (status, _) = node
        .put("/api/v1/templates/nope", template("nope", &["n-*"], 0, 1))
        .await;
    assert_eq!(status, 404);

    // Delete: indexes created from it stay; later writes no longer create indexes.
    let (status, _) = node.delete("/api/v1/templates/logs-tpl").await;
    assert_eq!(status, 200);
    let (status, _) = node.delete("/api/v1/templates/logs-tpl").await;
    assert_eq!(status, 404);
    assert_eq!(node.count("logs-us-1", "*").await, 2);
    let (status, body): (u16, Value) = node.post("/api/v1/logs-new/ingest", "{\"ts\": 1}").await;
    assert_eq!(status, 404, "{body}");
}
