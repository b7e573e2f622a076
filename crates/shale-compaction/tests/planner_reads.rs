//! The merge planner reads only what it can merge: immature Published splits (the metastore
//! filters them with an index), never every split of an index.

use std::sync::Arc;

use shale_compaction::service::{plan_round, CompactionEnv};
use shale_config::{CompactionConfig, IndexConfig};
use shale_metastore::conformance::split_metadata;
use shale_metastore::recording::RecordingMetastore;
use shale_metastore::{MergeTaskState, Metastore};
use shale_storage::{IndexStorages, SplitCache, StorageResolver};
use shale_types::{SplitMaturity, SplitState};

#[tokio::test]
async fn the_planner_asks_only_for_immature_published_splits() {
    let tmp = tempfile::tempdir().unwrap();
    let recording = RecordingMetastore::sqlite_in(tmp.path()).await.unwrap();
    let metastore: Arc<dyn Metastore> = recording.clone();
    let config = IndexConfig::parse(
        b"index_id: logs\ndoc_mapping: {}\nindexing_settings:\n  merge_policy:\n    type: stable_log\n    merge_factor: 2\n",
    )
    .unwrap();
    let index = metastore.create_index(config).await.unwrap();
    let uid = index.index_uid.clone();
    let now = shale_types::now_unix_secs();
    let mut splits = Vec::new();
    for (split_id, mature) in [("a", false), ("b", false), ("old", true), ("older", true)] {
        let mut split = split_metadata(&uid, split_id);
        split.create_timestamp = now - 60;
        if mature {
            split.maturity = SplitMaturity::Mature;
        }
        splits.push(split);
    }
    let ids: Vec<String> = splits.iter().map(|s| s.split_id.clone()).collect();
    metastore.stage_splits(&uid, splits).await.unwrap();
    metastore
        .publish_splits(&uid, &ids, &[], None)
        .await
        .unwrap();
    recording.take_queries();

    let storages = IndexStorages::new(
        StorageResolver::default(),
        format!("file://{}", tmp.path().join("indexes").display()),
    );
    let env = CompactionEnv {
        node_id: "node-1".to_string(),
        worker_id: "node-1#1".to_string(),
        metastore: metastore.clone(),
        storages,
        cache: Arc::new(SplitCache::open(&tmp.path().join("cache"), 1 << 20).unwrap()),
        scratch_dir: tmp.path().join("merging"),
        config: CompactionConfig::default(),
        delete_counts: Default::default(),
    };
    let live = std::collections::HashSet::from(["node-1".to_string()]);
    assert_eq!(plan_round(&env, &metastore, &live, now).await.unwrap(), 1);
    let queries = recording.take_queries();
    assert_eq!(queries.len(), 1, "{queries:?}");
    assert_eq!(queries[0].index_uid.as_ref(), Some(&uid));
    assert_eq!(queries[0].split_states, [SplitState::Published]);
    assert_eq!(queries[0].immature_at, Some(now));
    let tasks = metastore
        .list_merge_tasks(Some(&uid), &[MergeTaskState::Pending], None)
        .await
        .unwrap();
    let mut inputs = tasks[0].split_ids.clone();
    inputs.sort();
    assert_eq!(inputs, ["a", "b"]);
}
