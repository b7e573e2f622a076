//! Compaction end to end on a real node: automatic merges while ingest and search go on,
//! `node_local` vs `cluster` merge scopes across a node-id change, the janitor (grace period,
//! stale listings, retention) and the compaction status API.

use crate::common;

use std::time::{Duration, Instant};

use common::{log_docs, TestNode, LOGS_INDEX};
use serde_json::{json, Value};
use shale_config::{NodeConfig, ScopeMode};

const T0: i64 = 1_700_000_000;

/// Merges any 2..10 small splits together.
fn merging_index(index_id: &str) -> String {
    LOGS_INDEX.replace("index_id: logs", &format!("index_id: {index_id}")).replace(
        "  commit_timeout_secs: 1",
        "  commit_timeout_secs: 1\n  merge_policy:\n    type: stable_log\n    merge_factor: 2\n    max_merge_factor: 10\n    min_level_num_docs: 100000",
    )
}

fn fast_compaction(mut config: NodeConfig) -> NodeConfig {
    config.compaction.planner_interval_secs = 1;
    config.compaction.janitor_interval_secs = 3600;
    config
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

async fn wait_for_splits(node: &TestNode, index: &str, expected: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let splits = published(node, index).await;
        if splits.len() == expected {
            return splits;
        }
        assert!(
            Instant::now() < deadline,
            "expected {expected} published splits, still {}",
            splits.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn splits_merge_automatically_and_no_document_is_lost_or_duplicated() {
    let tmp = tempfile::tempdir().unwrap();
    let node = TestNode::start_with(fast_compaction(common::config_in(tmp.path()))).await;
    node.create_index(&merging_index("logs")).await;
    for batch in 0..6 {
        node.ingest("logs", &log_docs(batch * 100, 100, T0, "api"), "force")
            .await;
        // search keeps working while merges happen
        assert_eq!(node.count("logs", "*").await, (batch as u64 + 1) * 100);
    }
    let splits = wait_for_splits(&node, "logs", 1).await;
    assert_eq!(splits[0]["num_docs"], 600);
    assert!(splits[0]["num_merge_ops"].as_u64().unwrap() >= 1);
    assert_eq!(splits[0]["time_range"]["start"], T0);
    assert_eq!(splits[0]["time_range"]["end"], T0 + 599);
    assert_eq!(node.count("logs", "*").await, 600);
    let resp = node
        .search("logs", json!({"query": "*", "max_hits": 1000}))
        .await;
    let mut ids: Vec<&str> = resp["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["doc_id"].as_str().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 600);
    assert_eq!(node.count("logs", "\"request 555 handled\"").await, 1);

    // replaced inputs wait for the janitor's grace period
    let (_, resp) = node
        .get("/api/v1/indexes/logs/splits?split_states=MarkedForDeletion")
        .await;
    assert!(resp["splits"].as_array().unwrap().len() >= 6);

    let (status, status_body) = node.get("/api/v1/indexes/logs/compaction").await;
    assert_eq!(status, 200);
    assert_eq!(status_body["scope_mode"], "cluster");
    assert_eq!(status_body["published_splits"], 1);
    let recent = status_body["recent_merges"].as_array().unwrap();
    assert!(!recent.is_empty());
    assert!(
        recent.iter().all(|t| t["state"] == "Succeeded"),
        "{status_body}"
    );

    let text = node.metrics().await;
    assert!(text.contains("shale_merges_succeeded_total"));
    assert!(text.contains("shale_merge_bytes_written_total"));
    assert!(text.contains("shale_write_amplification"));
    assert!(text.contains("shale_scope_splits{"));
    node.stop().await;
}

/// Ingest one split as node `a`, restart as node `b`, ingest two more.
async fn node_change_scenario(scope: ScopeMode) -> usize {
    let tmp = tempfile::tempdir().unwrap();
    let config = |node_id: &str| {
        let mut config = fast_compaction(common::config_in(tmp.path()));
        config.node_id = node_id.to_string();
        config.compaction.scope = scope;
        config
    };
    let node = TestNode::start_with(config("a")).await;
    node.create_index(&merging_index("logs")).await;
    node.ingest("logs", &log_docs(0, 100, T0, "api"), "force")
        .await;
    node.stop().await;

    let node = TestNode::start_with(config("b")).await;
    node.ingest("logs", &log_docs(100, 100, T0, "api"), "force")
        .await;
    node.ingest("logs", &log_docs(200, 100, T0, "api"), "force")
        .await;
    // b's own two splits always merge
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let splits = published(&node, "logs").await;
        let b_fresh = splits
            .iter()
            .filter(|s| s["node_id"] == "b" && s["num_merge_ops"] == 0)
            .count();
        if b_fresh == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "b's splits never merged");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // let a few more planning rounds pass: nothing else may change
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(node.count("logs", "*").await, 300);
    let splits = published(&node, "logs").await;
    node.stop().await;
    splits.len()
}

#[tokio::test]
async fn node_local_scope_orphans_the_splits_of_a_departed_node_cluster_scope_does_not() {
    // node_local (Quickwit's behaviour): a's split is never merged again.
    assert_eq!(node_change_scenario(ScopeMode::NodeLocal).await, 2);
    // cluster: a's split merges with b's.
    assert_eq!(node_change_scenario(ScopeMode::Cluster).await, 1);
}

#[tokio::test]
async fn janitor_deletes_replaced_splits_after_grace_and_stale_searches_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = fast_compaction(common::config_in(tmp.path()));
    config.compaction.deletion_grace_period_secs = 0;
    let node = TestNode::start_with(config).await;
    node.create_index(&merging_index("logs")).await;
    node.ingest("logs", &log_docs(0, 100, T0, "api"), "force")
        .await;
    // a search lists (and opens) the first split ...
    assert_eq!(node.count("logs", "*").await, 100);
    node.ingest("logs", &log_docs(100, 100, T0, "api"), "force")
        .await;
    let before_merge = node
        .node
        .metastore
        .list_splits(
            shale_metastore::ListSplitsQuery::for_index(
                node.node
                    .metastore
                    .index_metadata("logs")
                    .await
                    .unwrap()
                    .index_uid,
            )
            .with_states(&[shale_types::SplitState::Published]),
        )
        .await
        .unwrap();
    assert_eq!(before_merge.len(), 2);
    wait_for_splits(&node, "logs", 1).await;
    // ... a search that listed the splits before the merge still completes on them
    let stale = node
        .node
        .search
        .search_splits(
            "logs",
            shale_search::SearchRequest {
                query: "*".into(),
                max_hits: 5,
                ..Default::default()
            },
            before_merge
                .iter()
                .map(|s| s.split_metadata.clone())
                .collect(),
        )
        .await
        .unwrap();
    assert_eq!(stale.num_hits, 200);
    assert!(stale.errors.is_empty(), "{:?}", stale.errors);

    // after the grace period the janitor deletes objects and rows of the replaced splits
    let report = node.node.run_janitor().await.unwrap();
    assert_eq!(report.deleted_split_ids.len(), 2);
    let (_, resp) = node
        .get("/api/v1/indexes/logs/splits?split_states=MarkedForDeletion")
        .await;
    assert!(resp["splits"].as_array().unwrap().is_empty());
    let meta = node.node.metastore.index_metadata("logs").await.unwrap();
    let storage = node.node.index_storage(&meta).unwrap();
    let objects = storage.list().await.unwrap();
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(node.count("logs", "*").await, 200);
    node.stop().await;
}

#[tokio::test]
async fn retention_expires_old_splits() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = fast_compaction(common::config_in(tmp.path()));
    config.compaction.deletion_grace_period_secs = 0;
    let node = TestNode::start_with(config).await;
    let index = format!(
        "{}retention:\n  period: 30 days\n  schedule: hourly\n",
        LOGS_INDEX.replace("index_id: logs", "index_id: retained")
    );
    node.create_index(&index).await;
    let now = shale_types::now_unix_secs();
    // one old split (2023), one fresh split
    node.ingest("retained", &log_docs(0, 10, T0, "old"), "force")
        .await;
    node.ingest("retained", &log_docs(0, 10, now - 60, "new"), "force")
        .await;
    assert_eq!(node.count("retained", "*").await, 20);
    // The schedule is honoured: the first round only schedules the next hourly tick.
    let report = node.node.run_janitor_at(now).await.unwrap();
    assert_eq!(report.retention_evaluated, 0);
    assert_eq!(report.expired_by_retention, 0);
    assert_eq!(node.count("retained", "*").await, 20);
    // At the tick, retention runs.
    let tick = now - now.rem_euclid(3600) + 3600;
    let report = node.node.run_janitor_at(tick).await.unwrap();
    assert_eq!(report.retention_evaluated, 1);
    assert_eq!(report.expired_by_retention, 1);
    // grace period 0: the expired split's object goes in the same round
    assert_eq!(report.deleted_split_ids.len(), 1);
    assert_eq!(node.count("retained", "*").await, 10);
    assert_eq!(node.count("retained", "service:old").await, 0);
    // Not again before the next tick.
    let report = node.node.run_janitor_at(tick + 60).await.unwrap();
    assert_eq!(report, Default::default());
    let report = node.node.run_janitor_at(tick + 3600).await.unwrap();
    assert_eq!(report.retention_evaluated, 1);
    assert_eq!(report.expired_by_retention, 0);
    node.stop().await;
}

/// A stale upload (a Staged split whose publish never came) is first marked for deletion —
/// after which a late publish fails — and its object is deleted only after the grace period.
#[tokio::test]
async fn stale_staged_splits_are_marked_before_their_objects_are_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = fast_compaction(common::config_in(tmp.path()));
    config.compaction.staged_split_timeout_secs = 600;
    config.compaction.deletion_grace_period_secs = 60;
    let node = TestNode::start_with(config).await;
    node.create_index(LOGS_INDEX).await;
    node.ingest("logs", &log_docs(0, 5, T0, "api"), "force")
        .await;
    let (orphan, storage) = common::stage_orphan(&node, "logs", b"a slow upload").await;
    let uid = node
        .node
        .metastore
        .index_metadata("logs")
        .await
        .unwrap()
        .index_uid;
    let now = shale_types::now_unix_secs();

    // Not stale yet.
    let report = node.node.run_janitor_at(now).await.unwrap();
    assert_eq!(report.stale_staged_marked, 0);
    // Stale: marked, object kept for the grace period.
    let report = node.node.run_janitor_at(now + 601).await.unwrap();
    assert_eq!(report.stale_staged_marked, 1);
    assert!(report.deleted_split_ids.is_empty());
    assert!(storage.exists(&orphan.object_key()).await.unwrap());
    let (_, resp) = node
        .get("/api/v1/indexes/logs/splits?split_states=MarkedForDeletion")
        .await;
    assert_eq!(resp["splits"][0]["split_id"], orphan.split_id.as_str());
    // The late publish loses: its split can no longer become visible.
    let late = node
        .node
        .metastore
        .publish_splits(&uid, std::slice::from_ref(&orphan.split_id), &[], None)
        .await;
    assert!(
        matches!(
            late,
            Err(shale_metastore::MetastoreError::FailedPrecondition(_))
        ),
        "{late:?}"
    );
    // After the grace period: object, then row.
    let report = node
        .node
        .run_janitor_at(shale_types::now_unix_secs() + 61)
        .await
        .unwrap();
    assert_eq!(report.deleted_split_ids, vec![orphan.split_id.clone()]);
    assert!(!storage.exists(&orphan.object_key()).await.unwrap());
    assert_eq!(storage.list().await.unwrap().len(), 1);
    assert_eq!(node.count("logs", "*").await, 5);
    node.stop().await;
}

/// Pending merge tasks left by a run in the other scope mode are never stranded: a
/// `node_local` node releases cluster-scope tasks (no node_local worker would claim them) and
/// plans its own; a `cluster` node claims a departed node's node-scoped tasks.
#[tokio::test]
async fn switching_scope_mode_never_strands_merge_tasks() {
    use shale_metastore::MergeTaskState;
    for (first, second) in [
        (ScopeMode::Cluster, ScopeMode::NodeLocal),
        (ScopeMode::NodeLocal, ScopeMode::Cluster),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let config = |node_id: &str, scope: ScopeMode, merges: usize| {
            let mut config = fast_compaction(common::config_in(tmp.path()));
            config.node_id = node_id.to_string();
            config.compaction.scope = scope;
            config.compaction.max_concurrent_merges = merges;
            config
        };
        // No worker: the planned task stays Pending.
        let node = TestNode::start_with(config("a", first, 0)).await;
        node.create_index(&merging_index("logs")).await;
        node.ingest("logs", &log_docs(0, 50, T0, "api"), "force")
            .await;
        node.ingest("logs", &log_docs(50, 50, T0, "api"), "force")
            .await;
        let uid = node
            .node
            .metastore
            .index_metadata("logs")
            .await
            .unwrap()
            .index_uid;
        let deadline = Instant::now() + Duration::from_secs(30);
        let pending = loop {
            let pending = node
                .node
                .metastore
                .list_merge_tasks(Some(&uid), &[MergeTaskState::Pending], None)
                .await
                .unwrap();
            if !pending.is_empty() {
                break pending;
            }
            assert!(Instant::now() < deadline, "no merge planned");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(
            pending[0].scope.node_id.is_some(),
            first == ScopeMode::NodeLocal
        );
        node.stop().await;

        // The other mode (node_local keeps the node id; cluster comes back as another node).
        let second_id = if second == ScopeMode::NodeLocal {
            "a"
        } else {
            "b"
        };
        let node = TestNode::start_with(config(second_id, second, 1)).await;
        wait_for_splits(&node, "logs", 1).await;
        assert_eq!(node.count("logs", "*").await, 100);
        let tasks = node
            .node
            .metastore
            .list_merge_tasks(Some(&uid), &[], None)
            .await
            .unwrap();
        let old = tasks
            .iter()
            .find(|task| task.task_id == pending[0].task_id)
            .unwrap();
        if second == ScopeMode::NodeLocal {
            assert_eq!(old.state, MergeTaskState::Failed);
            assert_eq!(
                old.error.as_deref(),
                Some(shale_compaction::service::RELEASED_FOR_SCOPE_MODE)
            );
            assert!(tasks
                .iter()
                .any(|task| task.state == MergeTaskState::Succeeded
                    && task.scope.node_id.as_deref() == Some("a")));
        } else {
            assert_eq!(old.state, MergeTaskState::Succeeded);
            assert_eq!(old.lease_owner.as_deref(), Some("b#1"));
        }
        node.stop().await;
    }
}

/// Merges whose inputs would take more than half the split cache download them into their
/// own scratch space instead: a small cache never blocks compaction. (Splits on S3: those
/// of a local storage are merged where they lie.)
#[tokio::test]
async fn merges_bigger_than_the_split_cache_still_run() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(config) = common::on_s3(common::config_in(tmp.path()), true) else {
        return;
    };
    let mut config = fast_compaction(config);
    config.split_cache_max_bytes = 4096;
    let node = TestNode::start_with(config).await;
    node.create_index(&merging_index("logs")).await;
    node.ingest("logs", &log_docs(0, 100, T0, "api"), "force")
        .await;
    node.ingest("logs", &log_docs(100, 100, T0, "api"), "force")
        .await;
    let splits = wait_for_splits(&node, "logs", 1).await;
    assert_eq!(splits[0]["num_docs"], 200);
    assert_eq!(splits[0]["num_merge_ops"], 1);
    assert!(node.node.search.cache().size_bytes() <= 4096);
    node.stop().await;
}

/// Ingest, planner and workers share one maturity rule: with `limit_merge` and
/// `max_merge_ops: 0` no split may ever be merged, so fresh splits are born mature.
#[tokio::test]
async fn fresh_splits_get_their_maturity_from_the_typed_policy() {
    let node = TestNode::start().await;
    for (index_id, policy, expected) in [
        (
            "never-merged",
            "  merge_policy:\n    type: limit_merge\n    max_merge_ops: 0\n",
            json!({"type": "mature"}),
        ),
        (
            "merged-later",
            "  merge_policy:\n    type: limit_merge\n    max_merge_ops: 2\n    maturation_period: 1h\n",
            json!({"type": "immature", "maturation_period_secs": 3600}),
        ),
        (
            "no-merge",
            "  merge_policy:\n    type: no_merge\n",
            json!({"type": "mature"}),
        ),
    ] {
        let config = LOGS_INDEX
            .replace("index_id: logs", &format!("index_id: {index_id}"))
            .replace(
                "  commit_timeout_secs: 1\n",
                &format!("  commit_timeout_secs: 1\n{policy}"),
            );
        node.create_index(&config).await;
        node.ingest(index_id, &log_docs(0, 10, T0, "api"), "force")
            .await;
        let splits = published(&node, index_id).await;
        assert_eq!(splits.len(), 1);
        assert_eq!(splits[0]["maturity"], expected, "{index_id}");
    }
    node.stop().await;
}
