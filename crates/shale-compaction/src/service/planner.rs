//! The merge planner: for each index, groups the immature Published splits that are not
//! already in a live merge task by merge scope, asks the index's merge policy, and records the
//! operations as merge tasks. Concurrent planners on several nodes are safe: the metastore
//! never puts a split in two live tasks.
//!
//! One planner (the leader's) plans for the whole cluster. In `node_local` mode it plans each
//! live node's splits in that node's scope; the node's own workers claim them.
//!
//! Scope mode changes never strand a task: in `cluster` mode workers claim any task (a task of
//! one node's splits is a valid cluster merge too); in `node_local` mode workers claim only the
//! tasks of their own node, so the planner releases the claimable cluster-scope tasks (left by
//! a run in `cluster` mode), whose splits are then planned again in node scope.

use std::collections::HashSet;
use std::sync::Arc;

use shale_config::{MergePolicyConfig, ScopeMode};
use shale_metastore::{IndexMetadata, ListSplitsQuery, MergeTaskState, Metastore, NewMergeTask};
use shale_types::{MergeKind, MergeScope, MergeTrigger, SplitMetadata, SplitState};
use tracing::{debug, info};

use super::{metrics, CompactionEnv, CompactionError};
use crate::policy::{index_merge_policy, plan, small_split_operations, small_split_target};

/// The reason recorded on tasks released because no node of this scope mode claims them.
pub const RELEASED_FOR_SCOPE_MODE: &str =
    "released: cluster-scope task, and this node merges in node_local scope";

/// One planning round over every index, through `metastore` (the leader's fenced handle);
/// returns the number of merge tasks created. In `node_local` mode the splits of nodes not
/// in `live_nodes` are left alone, as Quickwit leaves a departed node's splits: nobody would
/// claim their merges.
pub async fn plan_round(
    env: &CompactionEnv,
    metastore: &Arc<dyn Metastore>,
    live_nodes: &HashSet<String>,
    now: i64,
) -> Result<usize, CompactionError> {
    let node_local = env.config.scope == ScopeMode::NodeLocal;
    let mut created = 0;
    // Indexes with delete tasks (the others need no delete compaction).
    let last_opstamps = metastore.last_delete_opstamps().await?;
    for index in metastore.list_indexes().await? {
        // Off for the node or the index: no automatic merge nor delete compaction.
        if !env.config.enabled || !index.index_config.compaction.enabled {
            continue;
        }
        let policy = index_merge_policy(&index.index_config.indexing_settings);
        let live = metastore
            .list_merge_tasks(
                Some(&index.index_uid),
                &[MergeTaskState::Pending, MergeTaskState::Running],
                None,
            )
            .await?;
        let mut released: HashSet<String> = HashSet::new();
        if node_local {
            let stranded: Vec<String> = live
                .iter()
                .filter(|task| task.scope.node_id.is_none())
                .map(|task| task.task_id.clone())
                .collect();
            if !stranded.is_empty() {
                released.extend(
                    metastore
                        .release_merge_tasks(&stranded, RELEASED_FOR_SCOPE_MODE, now)
                        .await?,
                );
                info!(index = %index.index_uid, released = released.len(), "released cluster-scope merge tasks");
            }
        }
        let mut busy: HashSet<String> = live
            .into_iter()
            .filter(|task| !released.contains(&task.task_id))
            .flat_map(|task| task.split_ids)
            .collect();
        let mut query = ListSplitsQuery::for_index(index.index_uid.clone())
            .with_states(&[SplitState::Published]);
        query.immature_at = Some(now);
        let listed: Vec<SplitMetadata> = metastore
            .list_splits(query)
            .await?
            .into_iter()
            .map(|split| split.split_metadata)
            // node_local: a node only merges its own splits (Quickwit's behaviour), so the
            // splits of a departed node are never merged again.
            .filter(|split| !node_local || live_nodes.contains(&split.node_id))
            .collect();
        let locality = matches!(
            index.index_config.indexing_settings.merge_policy,
            MergePolicyConfig::Locality(_)
        );
        // Locality: the buckets (per scope) with a merge in flight get no other locality
        // merge, which could cut level-1 ranges overlapping the running one's outputs.
        let busy_buckets: HashSet<(MergeScope, Option<i64>)> = listed
            .iter()
            .filter(|split| locality && busy.contains(&split.split_id))
            .map(|split| (split.merge_scope(node_local), split.time_bucket_start))
            .collect();
        let mut candidates: Vec<SplitMetadata> = listed
            .into_iter()
            .filter(|split| !busy.contains(&split.split_id))
            .collect();
        if locality {
            let extra = bucket_neighbours(metastore, &index, &candidates, &busy, now).await?;
            candidates.extend(
                extra
                    .into_iter()
                    .filter(|split| !node_local || live_nodes.contains(&split.node_id)),
            );
        }
        let mut tasks: Vec<NewMergeTask> = Vec::new();
        for (scope, operations) in plan(&candidates, policy.as_ref(), node_local, now) {
            for op in operations {
                if op.kind == MergeKind::Locality {
                    let bucket = candidates
                        .iter()
                        .find(|split| Some(&split.split_id) == op.split_ids.first())
                        .and_then(|split| split.time_bucket_start);
                    if busy_buckets.contains(&(scope.clone(), bucket)) {
                        continue;
                    }
                }
                // Under `max_split_bytes`, a plain merge whose inputs would come out as many
                // splits as they are (or more) is pointless churn.
                if op.kind == MergeKind::Merge
                    && !reduces_split_count(
                        &op.split_ids,
                        &candidates,
                        index.index_config.compaction.max_split_bytes,
                    )
                {
                    continue;
                }
                tasks.push(NewMergeTask::new(scope.clone(), op.split_ids).with_kind(op.kind));
            }
        }
        if !tasks.is_empty() {
            let new_tasks = metastore
                .create_merge_tasks(&index.index_uid, tasks, env.config.merge_max_attempts)
                .await?;
            debug!(index = %index.index_uid, tasks = new_tasks.len(), "planned merges");
            metrics::COMPACTION_TRIGGERS
                .with_label_values(&["policy"])
                .inc_by(new_tasks.len() as u64);
            created += new_tasks.len();
            busy.extend(new_tasks.into_iter().flat_map(|task| task.split_ids));
        }
        // Too many small splits in a scope: merge them, whatever the policy waits for.
        if let Some(target) = small_split_target(&index.index_config.indexing_settings) {
            let free: Vec<SplitMetadata> = candidates
                .iter()
                .filter(|split| !busy.contains(&split.split_id))
                .cloned()
                .collect();
            let small = small_split_operations(
                &free,
                target,
                index.index_config.compaction.small_split_count,
                node_local,
            );
            let cap = index.index_config.compaction.max_split_bytes;
            let small: Vec<_> = small
                .into_iter()
                .filter(|(_, split_ids)| reduces_split_count(split_ids, &free, cap))
                .collect();
            if !small.is_empty() {
                let tasks = small
                    .into_iter()
                    .map(|(scope, split_ids)| {
                        NewMergeTask::new(scope, split_ids).with_trigger(MergeTrigger::SmallSplits)
                    })
                    .collect();
                let new_tasks = metastore
                    .create_merge_tasks(&index.index_uid, tasks, env.config.merge_max_attempts)
                    .await?;
                info!(index = %index.index_uid, tasks = new_tasks.len(), "small-split merges");
                metrics::COMPACTION_TRIGGERS
                    .with_label_values(&["small_splits"])
                    .inc_by(new_tasks.len() as u64);
                created += new_tasks.len();
                busy.extend(new_tasks.into_iter().flat_map(|task| task.split_ids));
            }
        }
        // Delete compaction of the splits no merge takes (merges apply deletes themselves).
        let Some(last_opstamp) = last_opstamps.get(&index.index_uid).copied() else {
            continue;
        };
        let planned = super::deletes::plan_delete_compactions(
            env,
            metastore,
            &index,
            &busy,
            node_local.then_some(live_nodes),
            Some(last_opstamp),
            now,
        )
        .await?;
        created += super::deletes::create_delete_tasks(env, metastore, &index, planned, node_local)
            .await?;
    }
    Ok(created)
}

/// Whether merging `split_ids` (among `splits`) under a `max_split_bytes` cap writes fewer
/// splits than it reads (the worker cuts outputs at 90 % of the cap).
pub fn reduces_split_count(
    split_ids: &[String],
    splits: &[SplitMetadata],
    max_split_bytes: u64,
) -> bool {
    let bytes: u64 = splits
        .iter()
        .filter(|split| split_ids.contains(&split.split_id))
        .map(|split| split.size_bytes)
        .sum();
    let budget = (max_split_bytes / 10 * 9).max(1);
    let outputs = bytes.div_ceil(budget).max(1);
    outputs < split_ids.len() as u64
}

/// Locality: the Published splits of every ended bucket that holds a fresh (level-0)
/// candidate, mature by time or not, that are not candidates already nor in a live task. Late
/// data must meet its bucket's level-1 splits, however old they are; the usual listing only
/// holds splits younger than their maturation period.
async fn bucket_neighbours(
    metastore: &Arc<dyn Metastore>,
    index: &IndexMetadata,
    candidates: &[SplitMetadata],
    busy: &HashSet<String>,
    now: i64,
) -> Result<Vec<SplitMetadata>, CompactionError> {
    let MergePolicyConfig::Locality(config) = &index.index_config.indexing_settings.merge_policy
    else {
        return Ok(Vec::new());
    };
    let bucket_secs = config.time_bucket_secs as i64;
    let buckets: std::collections::BTreeSet<i64> = candidates
        .iter()
        .filter(|split| split.key_level == 0)
        .filter_map(|split| split.time_bucket_start)
        .filter(|start| start.saturating_add(bucket_secs) <= now)
        .collect();
    let known: HashSet<&str> = candidates.iter().map(|s| s.split_id.as_str()).collect();
    let mut extra = Vec::new();
    for bucket in buckets {
        let mut query = ListSplitsQuery::for_index(index.index_uid.clone())
            .with_states(&[SplitState::Published]);
        query.time_range_start = Some(bucket);
        query.time_range_end = Some(bucket.saturating_add(bucket_secs));
        for split in metastore.list_splits(query).await? {
            let split = split.split_metadata;
            if split.time_bucket_start == Some(bucket)
                && split.key_level > 0
                && !known.contains(split.split_id.as_str())
                && !busy.contains(&split.split_id)
            {
                extra.push(split);
            }
        }
    }
    Ok(extra)
}
