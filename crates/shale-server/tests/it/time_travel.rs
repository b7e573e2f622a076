//! Time travel: `as_of` searches see the index as it was — the splits published then, merged
//! away since or not, and the deletes that existed then — for `time_travel_retention`; the
//! compaction and the janitor keep what such a search needs.

use crate::common;

use std::time::Duration;

use common::{log_docs, TestNode, LOGS_INDEX};
use serde_json::{json, Value};

const T0: i64 = 1_700_000_000;

/// Merges any 2..10 splits, purges deletes above 1 %, keeps one hour of history.
fn time_travel_index(index_id: &str) -> String {
    format!(
        "{}time_travel_retention: 1h\ncompaction:\n  delete_ratio: 0.01\n",
        LOGS_INDEX.replace("index_id: logs", &format!("index_id: {index_id}")).replace(
            "  commit_timeout_secs: 1",
            "  commit_timeout_secs: 1\n  merge_policy:\n    type: stable_log\n    merge_factor: 2\n    max_merge_factor: 10\n    min_level_num_docs: 100000",
        )
    )
}

/// What a user sees: the count and the documents, oldest first.
async fn snapshot(node: &TestNode, as_of: Option<i64>) -> (u64, Vec<String>) {
    let mut request = json!({"query": "*", "max_hits": 1000, "sort_by": "-timestamp"});
    if let Some(as_of) = as_of {
        request["as_of"] = as_of.into();
    }
    let response = node.search("logs", request).await;
    let docs = response["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|hit| hit["doc_id"].as_str().unwrap().to_string())
        .collect();
    (response["num_hits"].as_u64().unwrap(), docs)
}

/// The current second, once no other change can land in it: waits for the next second.
async fn settle_second() -> i64 {
    let now = shale_types::now_unix_secs();
    while shale_types::now_unix_secs() == now {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shale_types::now_unix_secs()
}

async fn published(node: &TestNode) -> Vec<Value> {
    let (_, body) = node
        .get("/api/v1/indexes/logs/splits?split_states=Published")
        .await;
    body["splits"].as_array().unwrap().clone()
}

#[tokio::test]
async fn as_of_searches_see_the_index_as_it_was_through_merges_deletes_and_the_janitor() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    config.compaction.planner_interval_secs = 1;
    config.compaction.janitor_interval_secs = 3600;
    config.compaction.deletion_grace_period_secs = 1;
    let node = TestNode::start_with(config).await;
    node.create_index(&time_travel_index("logs")).await;

    // Record what searches return at several moments; nothing changes in those seconds.
    let mut recorded: Vec<(i64, (u64, Vec<String>))> = Vec::new();
    node.ingest("logs", &log_docs(0, 100, T0, "api"), "force")
        .await;
    let second = settle_second().await;
    recorded.push((second, snapshot(&node, None).await));
    settle_second().await;
    let (status, _) = node
        .post(
            "/api/v1/logs/delete-tasks",
            json!({"query": "level:ERROR"}).to_string(),
        )
        .await;
    assert_eq!(status, 200);
    let second = settle_second().await;
    recorded.push((second, snapshot(&node, None).await));
    settle_second().await;
    node.ingest("logs", &log_docs(100, 100, T0, "web"), "force")
        .await;
    node.ingest("logs", &log_docs(200, 100, T0, "db"), "force")
        .await;
    let second = settle_second().await;
    recorded.push((second, snapshot(&node, None).await));
    settle_second().await;
    // More history: merges into one split, another delete, the janitor.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while published(&node).await.len() != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "merges did not settle"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _) = node
        .post(
            "/api/v1/logs/delete-tasks",
            json!({"query": "status:200"}).to_string(),
        )
        .await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = node.node.run_janitor().await.unwrap();
    assert!(
        report.deleted_split_ids.is_empty(),
        "replaced splits are kept for the window: {report:?}"
    );
    // Deletes inside the window are not purged: far above delete_ratio, but the split keeps
    // its documents (an as_of search before the delete needs them).
    let splits = published(&node).await;
    assert_eq!(splits.len(), 1);
    assert_eq!(splits[0]["num_docs"], 300, "{splits:?}");

    assert_eq!(recorded[0].1 .0, 100);
    assert_eq!(recorded[1].1 .0, 90);
    assert_eq!(recorded[2].1 .0, 290);
    for (second, expected) in &recorded {
        assert_eq!(
            &snapshot(&node, Some(*second)).await,
            expected,
            "as_of {second}"
        );
    }
    // Today is another story: both deletes apply (the 60 documents with status 200 include
    // the 10 errors already deleted).
    let (now_count, _) = snapshot(&node, None).await;
    assert_eq!(now_count, 300 - 10 - 60 + 10);
    // The query string works too.
    let (status, body) = node
        .get(&format!(
            "/api/v1/logs/search?query=level:ERROR&max_hits=0&as_of={}",
            recorded[0].0
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["num_hits"], 10);
    node.stop().await;
}

#[tokio::test]
async fn as_of_outside_the_window_is_a_400_that_says_the_window() {
    let node = TestNode::start().await;
    node.create_index(&time_travel_index("logs")).await;
    node.create_index(&LOGS_INDEX.replace("index_id: logs", "index_id: plain"))
        .await;
    let now = shale_types::now_unix_secs();
    for (index, as_of, needle) in [
        ("logs", now - 7200, "outside the time-travel window"),
        ("logs", now + 3600, "outside the time-travel window"),
        ("plain", now, "time travel is off"),
    ] {
        let (status, body) = node
            .post(
                &format!("/api/v1/{index}/search"),
                json!({"query": "*", "as_of": as_of}).to_string(),
            )
            .await;
        assert_eq!(status, 400, "{index} {as_of}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(needle), "{message}");
    }
    let (_, body) = node
        .post(
            "/api/v1/logs/search",
            json!({"query": "*", "as_of": now - 7200}).to_string(),
        )
        .await;
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("time_travel_retention: 1h"),
        "{body}"
    );
    let (status, _) = node
        .get("/api/v1/logs/search?query=*&as_of=notanumber")
        .await;
    assert_eq!(status, 400);
    node.stop().await;
}

#[tokio::test]
async fn once_the_window_has_passed_deletes_are_purged_and_replaced_splits_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    config.compaction.planner_interval_secs = 1;
    config.compaction.janitor_interval_secs = 3600;
    config.compaction.deletion_grace_period_secs = 1;
    let node = TestNode::start_with(config).await;
    let index = format!(
        "{}time_travel_retention: 3s\ncompaction:\n  delete_ratio: 0.01\n",
        LOGS_INDEX.replace(
            "  commit_timeout_secs: 1",
            "  commit_timeout_secs: 1\n  merge_policy:\n    type: no_merge",
        )
    );
    node.create_index(&index).await;
    node.ingest("logs", &log_docs(0, 100, T0, "api"), "force")
        .await;
    let before = published(&node).await[0]["split_id"].clone();
    let (status, task) = node
        .post(
            "/api/v1/logs/delete-tasks",
            json!({"query": "level:ERROR"}).to_string(),
        )
        .await;
    assert_eq!(status, 200);
    let created = task["create_timestamp"].as_i64().unwrap();
    // Inside the window the split keeps its documents…
    tokio::time::sleep(Duration::from_millis(1500)).await;
    if shale_types::now_unix_secs() < created + 3 {
        assert_eq!(published(&node).await[0]["split_id"], before);
    }
    // …then the delete compaction purges them.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let splits = published(&node).await;
        if splits[0]["split_id"] != before {
            assert_eq!(splits[0]["num_docs"], 90);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never purged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(node.count("logs", "*").await, 90);
    // The replaced split outlives neither the grace period nor the window.
    let report = node
        .node
        .run_janitor_at(shale_types::now_unix_secs() + 10)
        .await
        .unwrap();
    assert_eq!(report.deleted_split_ids, [before.as_str().unwrap()]);
    node.stop().await;
}
