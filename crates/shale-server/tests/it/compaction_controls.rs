//! The operator's compaction controls on a real node: the `compaction.enabled` switch (per
//! node and per index), manual compaction (`POST …/compact`, its states and figures, across
//! a restart, and its failure), the small-split trigger and the `max_split_bytes` cap.

use crate::common;

use std::time::{Duration, Instant};

use common::{log_docs, TestNode, LOGS_INDEX};
use serde_json::{json, Value};
use shale_config::NodeConfig;

const T0: i64 = 1_700_000_000;

fn fast(mut config: NodeConfig) -> NodeConfig {
    config.compaction.planner_interval_secs = 1;
    config.compaction.janitor_interval_secs = 3600;
    config
}

/// The logs index merging any 2..10 splits, with extra top-level config appended.
fn index(index_id: &str, extra: &str) -> String {
    format!(
        "{}{extra}",
        LOGS_INDEX.replace("index_id: logs", &format!("index_id: {index_id}")).replace(
            "  commit_timeout_secs: 1",
            "  commit_timeout_secs: 1\n  merge_policy:\n    type: stable_log\n    merge_factor: 2\n    max_merge_factor: 10\n    min_level_num_docs: 100000",
        )
    )
}

async fn published(node: &TestNode, index: &str) -> Vec<Value> {
    let (status, resp) = node
        .get(&format!(
            "/api/v1/indexes/{index}/splits?split_states=Published"
        ))
        .await;
    assert_eq!(status, 200, "{resp}");
    resp["splits"].as_array().unwrap().clone()
}

async fn compact(node: &TestNode, index: &str, body: Value) -> String {
    let (status, resp) = node
        .post(
            &format!("/api/v1/indexes/{index}/compact"),
            body.to_string(),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["state"], "pending");
    resp["compaction_id"].as_str().unwrap().to_string()
}

async fn wait_compaction(node: &TestNode, index: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let (status, resp) = node
            .get(&format!("/api/v1/indexes/{index}/compactions/{id}"))
            .await;
        assert_eq!(status, 200, "{resp}");
        let state = resp["state"].as_str().unwrap().to_string();
        if seen.last() != Some(&state) {
            seen.push(state.clone());
        }
        if state == "completed" || state == "failed" {
            return resp;
        }
        assert!(Instant::now() < deadline, "compaction stuck: {resp}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn with_compaction_off_nothing_merges_until_a_manual_compaction_does_it_all() {
    let tmp = tempfile::tempdir().unwrap();
    let node = TestNode::start_with(fast(common::config_in(tmp.path()))).await;
    node.create_index(&index(
        "logs",
        "compaction:\n  enabled: false\n  delete_ratio: 0.1\n",
    ))
    .await;
    for batch in 0..5 {
        node.ingest("logs", &log_docs(batch * 100, 100, T0, "api"), "force")
            .await;
    }
    // Half of the first split deleted: far above the ratio, but compaction is off.
    let (status, _) = node
        .post(
            "/api/v1/logs/delete-tasks",
            json!({"query": "*", "end_timestamp": T0 + 50}).to_string(),
        )
        .await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(published(&node, "logs").await.len(), 5);
    let (_, status_body) = node.get("/api/v1/indexes/logs/compaction").await;
    assert_eq!(status_body["recent_merges"], json!([]), "{status_body}");

    let id = compact(&node, "logs", json!({})).await;
    let done = wait_compaction(&node, "logs", &id).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["index_id"], "logs");
    assert!(done["plan"]["total"].as_u64().unwrap() >= 1, "{done}");
    assert_eq!(done["plan"]["completed"], done["plan"]["total"]);
    assert_eq!(done["plan"]["failed"], 0);
    assert_eq!(done["splits_before"], 5);
    assert_eq!(done["splits_after"], 1);
    assert!(done["bytes_read"].as_u64().unwrap() > 0);
    assert!(done["bytes_written"].as_u64().unwrap() > 0);
    assert!(done["started_at"].as_i64().is_some());
    assert!(done["finished_at"].as_i64().unwrap() >= done["started_at"].as_i64().unwrap());
    let splits = published(&node, "logs").await;
    assert_eq!(splits.len(), 1);
    // Every pending delete applied.
    assert_eq!(splits[0]["num_docs"], 450);
    assert_eq!(splits[0]["delete_opstamp"], 1);
    assert_eq!(node.count("logs", "*").await, 450);
    // Its tasks say why they ran.
    let (_, status_body) = node.get("/api/v1/indexes/logs/compaction").await;
    let merges = status_body["recent_merges"].as_array().unwrap();
    assert!(!merges.is_empty());
    assert!(merges
        .iter()
        .all(|m| m["trigger"] == "manual" && m["compaction_id"] == id.as_str()));
    // Listed.
    let (status, list) = node.get("/api/v1/indexes/logs/compactions").await;
    assert_eq!(status, 200);
    assert_eq!(list[0]["compaction_id"], id.as_str());

    // A second compaction with nothing left to do completes at once.
    let id = compact(&node, "logs", json!({"force": true})).await;
    let done = wait_compaction(&node, "logs", &id).await;
    assert_eq!(done["state"], "completed");
    assert_eq!(done["plan"]["total"], 0);
    assert_eq!(done["splits_before"], 1);
    assert_eq!(done["splits_after"], 1);

    // Bad requests are JSON errors.
    for (path, body, expected) in [
        ("/api/v1/indexes/nosuch/compact", "{}", 404),
        (
            "/api/v1/indexes/logs/compact",
            r#"{"start_timestamp": 10, "end_timestamp": 5}"#,
            400,
        ),
        ("/api/v1/indexes/logs/compact", r#"{"forse": true}"#, 400),
        ("/api/v1/indexes/logs/compact", "not json", 400),
    ] {
        let (status, resp) = node.post(path, body.to_string()).await;
        assert_eq!(status, expected, "{path} {body}: {resp}");
        assert!(resp["message"].as_str().is_some(), "{resp}");
    }
    let (status, resp) = node.get("/api/v1/indexes/logs/compactions/nosuch").await;
    assert_eq!(status, 404, "{resp}");
    let (status, _) = node.get("/api/v1/indexes/nosuch/compactions").await;
    assert_eq!(status, 404);
    node.stop().await;
}

#[tokio::test]
async fn a_node_with_compaction_off_runs_only_manual_compactions_and_they_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = fast(common::config_in(tmp.path()));
    config.compaction.enabled = false;
    let node = TestNode::start_with(config.clone()).await;
    node.create_index(&index("logs", "")).await;
    for batch in 0..4 {
        node.ingest("logs", &log_docs(batch * 100, 100, T0, "api"), "force")
            .await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(published(&node, "logs").await.len(), 4);
    // Requested, then the node stops before (or while) it runs.
    let id = compact(&node, "logs", json!({})).await;
    let dir = node.stop().await;
    drop(dir);
    let node = TestNode::start_with(config).await;
    let done = wait_compaction(&node, "logs", &id).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(published(&node, "logs").await.len(), 1);
    assert_eq!(node.count("logs", "*").await, 400);
    node.stop().await;
}

#[tokio::test]
async fn a_manual_compaction_whose_merge_fails_is_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = fast(common::config_in(tmp.path()));
    config.compaction.merge_max_attempts = 1;
    let node = TestNode::start_with(config).await;
    node.create_index(&index("logs", "compaction:\n  enabled: false\n"))
        .await;
    for batch in 0..2 {
        node.ingest("logs", &log_docs(batch * 100, 100, T0, "api"), "force")
            .await;
    }
    // One input's object is lost: its merge cannot run.
    let split_id = published(&node, "logs").await[0]["split_id"]
        .as_str()
        .unwrap()
        .to_string();
    let object = tmp
        .path()
        .join("indexes")
        .join("logs")
        .join(format!("{split_id}.split"));
    std::fs::remove_file(&object).unwrap_or_else(|err| panic!("{}: {err}", object.display()));
    let id = compact(&node, "logs", json!({})).await;
    let done = wait_compaction(&node, "logs", &id).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert_eq!(done["plan"]["failed"], 1);
    assert!(
        done["error"]
            .as_str()
            .unwrap()
            .contains("1 of 1 merges failed"),
        "{done}"
    );
    node.stop().await;
}

#[tokio::test]
async fn more_small_splits_than_the_count_are_merged_whatever_the_policy_waits_for() {
    let tmp = tempfile::tempdir().unwrap();
    let node = TestNode::start_with(fast(common::config_in(tmp.path()))).await;
    // The policy waits for 10 splits; the small-split rule fires above 3.
    let config = index("logs", "compaction:\n  small_split_count: 3\n")
        .replace("merge_factor: 2\n", "merge_factor: 10\n");
    node.create_index(&config).await;
    for batch in 0..3 {
        node.ingest("logs", &log_docs(batch * 100, 100, T0, "api"), "force")
            .await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        published(&node, "logs").await.len(),
        3,
        "3 is not more than 3"
    );
    node.ingest("logs", &log_docs(300, 100, T0, "api"), "force")
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while published(&node, "logs").await.len() != 1 {
        assert!(Instant::now() < deadline, "small splits not merged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(node.count("logs", "*").await, 400);
    let (_, status_body) = node.get("/api/v1/indexes/logs/compaction").await;
    let merges = status_body["recent_merges"].as_array().unwrap();
    assert_eq!(merges.len(), 1, "{status_body}");
    assert_eq!(merges[0]["trigger"], "small_splits");
    let metrics = node.metrics().await;
    // Every trigger's series exists from the start, at 0: this one counted the merge.
    let planned = metrics
        .lines()
        .find_map(|l| l.strip_prefix("shale_compaction_triggers_total{trigger=\"small_splits\"} "))
        .and_then(|v| v.parse::<f64>().ok());
    assert!(planned.is_some_and(|n| n >= 1.0), "{planned:?}");
    node.stop().await;
}

#[tokio::test]
async fn no_merge_output_is_larger_than_max_split_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let node = TestNode::start_with(fast(common::config_in(tmp.path()))).await;
    node.create_index(&index("logs", "compaction:\n  max_split_bytes: 1MB\n"))
        .await;
    // Splits of ~0.3 MB: merged all together they would pass 1 MB.
    let mut batch_bytes = Vec::new();
    for batch in 0..4 {
        node.ingest("logs", &log_docs(batch * 5000, 5000, T0, "api"), "force")
            .await;
        batch_bytes.push(batch);
    }
    let first: u64 = published(&node, "logs").await[0]["size_bytes"]
        .as_u64()
        .unwrap();
    assert!(
        first > 200_000 && first < 900_000,
        "fresh split of {first} bytes"
    );
    // Let merges run, then stop changing.
    let mut last = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let ids: Vec<String> = published(&node, "logs")
            .await
            .iter()
            .map(|s| s["split_id"].as_str().unwrap().to_string())
            .collect();
        if ids == last {
            break;
        }
        last = ids;
        assert!(Instant::now() < deadline, "merges never settle");
    }
    let splits = published(&node, "logs").await;
    assert!(splits.len() < 4, "{} splits: nothing merged", splits.len());
    for split in &splits {
        assert!(
            split["size_bytes"].as_u64().unwrap() <= 1_000_000,
            "{split}"
        );
    }
    assert_eq!(node.count("logs", "*").await, 20_000);
    node.stop().await;
}
