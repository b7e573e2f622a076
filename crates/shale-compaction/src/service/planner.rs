//! The merge planner: for each index, groups the Published splits that are not already in a
//! live merge task by merge scope, asks the index's merge policy, and records the operations
//! as merge tasks. Concurrent planners on several nodes are safe: the metastore never puts a
//! split in two live tasks.

use std::collections::HashSet;

use shale_config::ScopeMode;
use shale_metastore::{ListSplitsQuery, MergeTaskState, NewMergeTask};
use shale_types::{MergeScope, SplitMetadata, SplitState};
use tracing::debug;

use super::{CompactionEnv, CompactionError};
use crate::policy::{index_merge_policy, plan};

/// The key of a merge scope as stored with a task:
/// `source/partition/doc_mapping_uid[/node]`.
pub fn scope_key(scope: &MergeScope) -> String {
    let mut key = format!(
        "{}/{}/{}",
        scope.source_id, scope.partition_id, scope.doc_mapping_uid
    );
    if let Some(node) = &scope.node_id {
        key.push('/');
        key.push_str(node);
    }
    key
}

/// One planning round over every index; returns the number of merge tasks created.
pub async fn plan_round(env: &CompactionEnv, now: i64) -> Result<usize, CompactionError> {
    let node_local = env.config.scope == ScopeMode::NodeLocal;
    let mut created = 0;
    for index in env.metastore.list_indexes().await? {
        let policy = index_merge_policy(&index.index_config.indexing_settings);
        let busy: HashSet<String> = env
            .metastore
            .list_merge_tasks(
                Some(&index.index_uid),
                &[MergeTaskState::Pending, MergeTaskState::Running],
                None,
            )
            .await?
            .into_iter()
            .flat_map(|task| task.split_ids)
            .collect();
        let candidates: Vec<SplitMetadata> = env
            .metastore
            .list_splits(
                ListSplitsQuery::for_index(index.index_uid.clone())
                    .with_states(&[SplitState::Published]),
            )
            .await?
            .into_iter()
            .map(|split| split.split_metadata)
            .filter(|split| !busy.contains(&split.split_id))
            // node_local: a node only merges its own splits (Quickwit's behaviour).
            .filter(|split| !node_local || split.node_id == env.node_id)
            .collect();
        if candidates.len() < 2 {
            continue;
        }
        let tasks: Vec<NewMergeTask> = plan(&candidates, policy.as_ref(), node_local, now)
            .into_iter()
            .flat_map(|(scope, operations)| {
                let key = scope_key(&scope);
                operations.into_iter().map(move |op| NewMergeTask {
                    scope: key.clone(),
                    split_ids: op.split_ids,
                    compaction_id: None,
                })
            })
            .collect();
        if tasks.is_empty() {
            continue;
        }
        let new_tasks = env
            .metastore
            .create_merge_tasks(&index.index_uid, tasks, env.config.merge_max_attempts)
            .await?;
        debug!(index = %index.index_uid, tasks = new_tasks.len(), "planned merges");
        created += new_tasks.len();
    }
    Ok(created)
}
