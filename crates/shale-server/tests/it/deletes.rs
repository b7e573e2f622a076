//! Delete tasks on a real node: what they hide and when, what they spare, and the errors.

use crate::common;

use std::time::{Duration, Instant};

use common::{log_docs, TestNode, LOGS_INDEX};
use serde_json::{json, Value};

/// The logs index without automatic merges (deletes are applied at search time only).
fn no_merge_index() -> String {
    LOGS_INDEX.replace(
        "  commit_timeout_secs: 1\n",
        "  commit_timeout_secs: 2\n  merge_policy:\n    type: no_merge\n",
    )
}

async fn delete(node: &TestNode, index: &str, body: Value) -> (u16, Value) {
    node.post(&format!("/api/v1/{index}/delete-tasks"), body.to_string())
        .await
}

/// Waits until the index holds `n` published documents (searchable, deletes aside).
async fn wait_published_docs(node: &TestNode, index: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, splits) = node
            .get(&format!(
                "/api/v1/indexes/{index}/splits?split_states=Published"
            ))
            .await;
        let published: u64 = splits["splits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["num_docs"].as_u64().unwrap())
            .sum();
        if published == n {
            return;
        }
        assert!(Instant::now() < deadline, "{published} of {n} published");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_delete_hides_every_document_acknowledged_before_it_and_none_after() {
    let node = TestNode::start().await;
    node.create_index(&no_merge_index()).await;
    // 0..100 published; 100..200 acknowledged, still in the WAL or a split being built.
    node.ingest("logs", &log_docs(0, 100, 1_700_000_000, "api"), "force")
        .await;
    node.ingest("logs", &log_docs(100, 100, 1_700_000_000, "web"), "auto")
        .await;
    let (status, task) = delete(&node, "logs", json!({"query": "level:ERROR"})).await;
    assert_eq!(status, 200, "{task}");
    assert_eq!(task["opstamp"], 1);
    assert_eq!(task["delete_query"]["query"], "level:ERROR");
    assert!(task["create_timestamp"].as_i64().unwrap() > 1_700_000_000);
    // From the answer on, searches miss them (20 ERROR documents among 0..200).
    assert_eq!(node.count("logs", "level:ERROR").await, 0);
    // Documents acknowledged after the delete are not deleted.
    node.ingest("logs", &log_docs(200, 100, 1_700_000_000, "db"), "force")
        .await;
    assert_eq!(node.count("logs", "level:ERROR").await, 10);
    // Once everything is published, the WAL's documents stay deleted too.
    wait_published_docs(&node, "logs", 300).await;
    assert_eq!(node.count("logs", "level:ERROR").await, 10);
    assert_eq!(node.count("logs", "*").await, 280);
    assert_eq!(node.count("logs", "service:web").await, 90);
    let hits = node
        .search("logs", json!({"query": "level:ERROR", "max_hits": 100}))
        .await;
    let services: Vec<&str> = hits["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["service"].as_str().unwrap())
        .collect();
    assert_eq!(services, vec!["db"; 10]);

    // A second task with a time range and a search field.
    let (status, task) = delete(
        &node,
        "logs",
        json!({"query": "quick", "search_field": ["message"],
               "start_timestamp": 1_700_000_000, "end_timestamp": 1_700_000_050}),
    )
    .await;
    assert_eq!(status, 200, "{task}");
    assert_eq!(task["opstamp"], 2);
    // 0..50, minus the 5 ERROR documents already deleted.
    assert_eq!(node.count("logs", "*").await, 280 - 45);
    let (status, tasks) = node.get("/api/v1/logs/delete-tasks").await;
    assert_eq!(status, 200);
    let opstamps: Vec<u64> = tasks
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["opstamp"].as_u64().unwrap())
        .collect();
    assert_eq!(opstamps, [1, 2]);
    assert_eq!(tasks[1]["delete_query"]["search_field"], json!(["message"]));
    // Quickwit's other path answers the same.
    let (status, same) = node.get("/api/v1/indexes/logs/delete-tasks").await;
    assert_eq!(status, 200);
    assert_eq!(same, tasks);

    // The deletes survive a restart: they are in the metastore, the opstamps in the WAL.
    let dir = node.stop().await.unwrap();
    let node = TestNode::start_with(common::config_in(dir.path())).await;
    assert_eq!(node.count("logs", "*").await, 235);
    node.ingest("logs", &log_docs(300, 10, 1_700_000_010, "late"), "force")
        .await;
    // Inside task 2's time range, but acknowledged after it.
    assert_eq!(node.count("logs", "service:late").await, 10);
    node.stop().await;
    drop(dir);
}

#[tokio::test]
async fn bad_delete_requests_are_json_errors_and_create_nothing() {
    let node = TestNode::start().await;
    node.create_index(&no_merge_index()).await;
    for (body, needle) in [
        (json!({"query": "message:("}), "invalid delete query"),
        (json!({"query": "nosuchfield:x"}), "invalid delete query"),
        (
            json!({"query": "quick", "search_field": ["nosuch"]}),
            "unknown search field",
        ),
        (
            json!({"query": "*", "start_timestamp": 10, "end_timestamp": 10}),
            "invalid time range",
        ),
        (json!({"querry": "x"}), "invalid delete task request"),
        (json!({}), "invalid delete task request"),
    ] {
        let (status, error) = delete(&node, "logs", body.clone()).await;
        assert_eq!(status, 400, "{body}: {error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(needle), "{body}: {message}");
    }
    let (status, error) = node
        .post("/api/v1/logs/delete-tasks", "not json".to_string())
        .await;
    assert_eq!(status, 400, "{error}");
    let (status, error) = delete(&node, "nosuch", json!({"query": "*"})).await;
    assert_eq!(status, 404, "{error}");
    assert!(error["message"].as_str().unwrap().contains("nosuch"));
    let (status, _) = node.get("/api/v1/nosuch/delete-tasks").await;
    assert_eq!(status, 404);
    let (status, tasks) = node.get("/api/v1/logs/delete-tasks").await;
    assert_eq!(status, 200);
    assert_eq!(tasks, json!([]));
    node.stop().await;
}

fn fast_planner(mut config: shale_config::NodeConfig) -> shale_config::NodeConfig {
    config.compaction.planner_interval_secs = 1;
    config.compaction.janitor_interval_secs = 3600;
    config
}

/// An index without merges whose delete compaction fires above `ratio` or `bytes`.
fn delete_compacted_index(index_id: &str, ratio: f64, bytes: u64) -> String {
    format!(
        "{}compaction:\n  delete_ratio: {ratio}\n  delete_bytes: {bytes}\n",
        no_merge_index().replace("index_id: logs", &format!("index_id: {index_id}"))
    )
}

async fn published_splits(node: &TestNode, index: &str) -> Vec<Value> {
    let (status, body) = node
        .get(&format!(
            "/api/v1/indexes/{index}/splits?split_states=Published"
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    body["splits"].as_array().unwrap().clone()
}

fn ids(splits: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = splits
        .iter()
        .map(|s| s["split_id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

/// Waits until the published splits of `index` satisfy `done`.
async fn wait_splits(
    node: &TestNode,
    index: &str,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let splits = published_splits(node, index).await;
        if done(&splits) {
            return splits;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {splits:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn delete_compaction_fires_above_the_ratio_and_the_size_and_not_at_them() {
    let tmp = tempfile::tempdir().unwrap();
    let node = TestNode::start_with(fast_planner(common::config_in(tmp.path()))).await;
    node.create_index(&delete_compacted_index("logs", 0.2, 1_000_000_000))
        .await;
    node.ingest("logs", &log_docs(0, 100, 1_700_000_000, "api"), "force")
        .await;
    node.ingest("logs", &log_docs(100, 100, 1_700_000_000, "web"), "force")
        .await;
    let before = ids(&published_splits(&node, "logs").await);
    assert_eq!(before.len(), 2);
    // 20 of the api split's 100 documents: the ratio exactly, no compaction.
    let (status, _) = delete(
        &node,
        "logs",
        json!({"query": "service:api AND status:200"}),
    )
    .await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(ids(&published_splits(&node, "logs").await), before);
    let (_, compaction) = node.get("/api/v1/indexes/logs/compaction").await;
    assert_eq!(compaction["recent_merges"], json!([]), "{compaction}");
    assert_eq!(node.count("logs", "*").await, 180);
    // 40 of 100: above the ratio. The api split is rewritten, the web split is left alone.
    let (status, _) = delete(
        &node,
        "logs",
        json!({"query": "service:api AND status:201"}),
    )
    .await;
    assert_eq!(status, 200);
    let after = wait_splits(&node, "logs", "the delete compaction", |splits| {
        splits.len() == 2 && ids(splits) != before
    })
    .await;
    let rewritten = after
        .iter()
        .find(|s| !before.contains(&s["split_id"].as_str().unwrap().to_string()))
        .unwrap();
    assert_eq!(rewritten["num_docs"], 60);
    assert_eq!(rewritten["delete_opstamp"], 2);
    assert_eq!(rewritten["num_merge_ops"], 0);
    assert_eq!(node.count("logs", "*").await, 160);
    assert_eq!(node.count("logs", "service:api").await, 60);
    assert_eq!(node.count("logs", "status:200 OR status:201").await, 40);
    let (_, compaction) = node.get("/api/v1/indexes/logs/compaction").await;
    let merges = compaction["recent_merges"].as_array().unwrap();
    assert_eq!(merges.len(), 1, "{compaction}");
    assert_eq!(merges[0]["kind"], "delete");

    // The size trigger: a log line is about 190 bytes; 4 of them stay below 1000 bytes, 8 do
    // not (the ratio, 1.0, never fires).
    node.create_index(&delete_compacted_index("sized", 1.0, 1_000))
        .await;
    node.ingest("sized", &log_docs(0, 100, 1_700_000_000, "api"), "force")
        .await;
    let before = ids(&published_splits(&node, "sized").await);
    let some = |range: std::ops::Range<usize>| {
        range
            .map(|i| format!("doc_id:api-{i}"))
            .collect::<Vec<_>>()
            .join(" OR ")
    };
    let (status, _) = delete(&node, "sized", json!({"query": some(0..4)})).await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(ids(&published_splits(&node, "sized").await), before);
    let (status, _) = delete(&node, "sized", json!({"query": some(4..8)})).await;
    assert_eq!(status, 200);
    let after = wait_splits(&node, "sized", "the size-triggered compaction", |splits| {
        ids(splits) != before
    })
    .await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0]["num_docs"], 92);
    assert_eq!(node.count("sized", "*").await, 92);

    let metrics = node.metrics().await;
    // Every trigger's series exists from the start, at 0: these counted the compactions.
    for trigger in ["delete_ratio", "delete_bytes"] {
        let prefix = format!("shale_compaction_triggers_total{{trigger=\"{trigger}\"}} ");
        let planned = metrics
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.parse::<f64>().ok());
        assert!(planned.is_some_and(|n| n >= 1.0), "{trigger}: {planned:?}");
    }
    node.stop().await;
}

/// Every merge applies the deletes of its inputs, and one that was planned or running when
/// a delete arrived leaves its output unclean of it: the deleted documents stay hidden.
#[tokio::test]
async fn no_merge_brings_a_deleted_document_back() {
    let tmp = tempfile::tempdir().unwrap();
    let node = TestNode::start_with(fast_planner(common::config_in(tmp.path()))).await;
    let index = LOGS_INDEX.replace(
        "  commit_timeout_secs: 1",
        "  commit_timeout_secs: 1\n  merge_policy:\n    type: stable_log\n    merge_factor: 2\n    max_merge_factor: 4\n    min_level_num_docs: 100000",
    );
    node.create_index(&index).await;
    let mut expected_errors = 0;
    for batch in 0..12usize {
        node.ingest(
            "logs",
            &log_docs(batch * 100, 100, 1_700_000_000, "api"),
            "force",
        )
        .await;
        if batch % 3 == 1 {
            // Merges are planned or running: delete what is there so far.
            let (status, _) = delete(
                &node,
                "logs",
                json!({"query": "level:ERROR", "end_timestamp": 1_700_000_000 + batch * 100 + 100}),
            )
            .await;
            assert_eq!(status, 200);
            expected_errors = 0;
        } else {
            expected_errors += 10;
        }
        assert_eq!(node.count("logs", "level:ERROR").await, expected_errors);
    }
    // Merges settle into one split.
    let splits = wait_splits(&node, "logs", "one split", |splits| splits.len() == 1).await;
    let deleted_errors = 120 - expected_errors;
    assert_eq!(node.count("logs", "level:ERROR").await, expected_errors);
    assert_eq!(node.count("logs", "*").await, 1200 - deleted_errors);
    // Searches agree with what the split holds once every delete is purged or applied.
    assert!(splits[0]["num_docs"].as_u64().unwrap() >= 1200 - deleted_errors);
    node.stop().await;
}

/// Delete tasks do not pile up: splits a task cannot reach (its time range, the tags or the
/// documents it matches) are recorded clean of it without a rewrite, a split it reaches is
/// rewritten by delete compaction, and once every split and every pending document is past
/// them the tasks are forgotten — all but the newest, so that opstamps go on growing.
#[tokio::test]
async fn delete_tasks_are_forgotten_once_applied_everywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = fast_planner(common::config_in(tmp.path()));
    config.compaction.janitor_interval_secs = 1;
    let node = TestNode::start_with(config).await;
    node.create_index(&delete_compacted_index("logs", 0.05, 1_000_000_000))
        .await;
    node.ingest("logs", &log_docs(0, 100, 1_700_000_000, "api"), "force")
        .await;
    node.ingest("logs", &log_docs(100, 100, 1_700_000_000, "web"), "force")
        .await;
    let before = published_splits(&node, "logs").await;
    let web_split = before
        .iter()
        .find(|s| s["tags"].to_string().contains("service:web"))
        .map(|s| s["split_id"].clone())
        .unwrap();
    for body in [
        // Outside every split's time range.
        json!({"query": "level:ERROR", "start_timestamp": 1_600_000_000, "end_timestamp": 1_600_000_100}),
        // A tag no split has.
        json!({"query": "service:db"}),
        // 20 of the api split's documents: rewritten by delete compaction.
        json!({"query": "service:api AND status:200"}),
        // Nothing matches, though no metadata says so.
        json!({"query": "doc_id:nothing"}),
        json!({"query": "level:NOPE"}),
    ] {
        let (status, task) = delete(&node, "logs", body).await;
        assert_eq!(status, 200, "{task}");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, tasks) = node.get("/api/v1/logs/delete-tasks").await;
        let opstamps: Vec<u64> = tasks
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["opstamp"].as_u64().unwrap())
            .collect();
        if opstamps == [5] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "delete tasks never forgotten: {opstamps:?} {:?}",
            published_splits(&node, "logs")
                .await
                .iter()
                .map(|s| (s["split_id"].clone(), s["delete_opstamp"].clone()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(node.count("logs", "*").await, 180);
    assert_eq!(node.count("logs", "service:api").await, 80);
    let after = published_splits(&node, "logs").await;
    assert!(
        after.iter().any(|s| s["split_id"] == web_split),
        "the split no task reaches is not rewritten: {after:?}"
    );
    assert!(
        after
            .iter()
            .all(|s| s["delete_opstamp"].as_u64() >= Some(4)),
        "{after:?}"
    );
    // Opstamps go on after the newest task, which is kept.
    let (status, task) = delete(&node, "logs", json!({"query": "level:WARN"})).await;
    assert_eq!(status, 200, "{task}");
    assert_eq!(task["opstamp"], 6);
    node.stop().await;
}
