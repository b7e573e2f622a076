//! Manual compactions at run time, on the leader: a `pending` compaction is planned into
//! merge tasks carrying its id (then `executing`), and an executing one is followed until
//! its tasks are all finished (`completed`, or `failed` if one failed for good). Its tasks
//! run on any compactor like other merges — also on nodes whose automatic compaction is off.
//!
//! The plan: the Published splits in the requested time range that no live task holds —
//! immature ones, or every split below `compaction.max_split_bytes` with `force` — grouped
//! by merge scope (and time bucket). A locality index gets one locality merge per bucket
//! (of two splits or more, or of a lone level-0 split, which becomes level 1);
//! other indexes get merges of consecutive splits (by time) packed up to the target
//! (`split_num_docs_target` documents or `max_split_bytes`). A split left out of every merge
//! that has pending delete tasks gets a delete compaction, so that every pending delete is
//! applied.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use shale_config::{MergePolicyConfig, ScopeMode};
use shale_metastore::{
    Compaction, CompactionState, IndexMetadata, ListSplitsQuery, MergeTaskState, Metastore,
    MetastoreError, NewMergeTask,
};
use shale_types::{MergeKind, MergeScope, SplitMetadata, SplitState};
use tracing::{info, warn};

use super::deletes::purgeable_delete_tasks;
use super::{metrics, CompactionEnv, CompactionError};

/// One round over the unfinished manual compactions; returns the merge tasks created.
pub async fn manual_round(
    env: &CompactionEnv,
    metastore: &Arc<dyn Metastore>,
    now: i64,
) -> Result<usize, CompactionError> {
    let mut created = 0;
    let open = metastore
        .list_compactions(
            None,
            &[CompactionState::Pending, CompactionState::Executing],
        )
        .await?;
    // Oldest first: a later compaction of the same index sees the earlier one's tasks.
    for mut compaction in open.into_iter().rev() {
        let result = match compaction.state {
            CompactionState::Pending => plan_compaction(env, metastore, &mut compaction, now).await,
            _ => follow_compaction(metastore, &mut compaction, now)
                .await
                .map(|_| 0),
        };
        match result {
            Ok(tasks) => created += tasks,
            Err(CompactionError::Metastore(MetastoreError::NotFound { .. })) => {
                // The index is gone: so is the compaction (deleted with it).
            }
            Err(err) => {
                warn!(compaction_id = %compaction.compaction_id, %err, "manual compaction round failed");
            }
        }
    }
    Ok(created)
}

/// The published splits of the compaction's index in its time range.
async fn splits_in_range(
    metastore: &Arc<dyn Metastore>,
    compaction: &Compaction,
) -> Result<Vec<SplitMetadata>, CompactionError> {
    let mut query = ListSplitsQuery::for_index(compaction.index_uid.clone())
        .with_states(&[SplitState::Published]);
    query.time_range_start = compaction.request.start_timestamp;
    query.time_range_end = compaction.request.end_timestamp;
    Ok(metastore
        .list_splits(query)
        .await?
        .into_iter()
        .map(|split| split.split_metadata)
        .collect())
}

async fn plan_compaction(
    env: &CompactionEnv,
    metastore: &Arc<dyn Metastore>,
    compaction: &mut Compaction,
    now: i64,
) -> Result<usize, CompactionError> {
    let index = metastore
        .index_metadata(&compaction.index_uid.index_id)
        .await?;
    if index.index_uid != compaction.index_uid {
        return Err(CompactionError::Metastore(MetastoreError::NotFound {
            kind: "index",
            id: compaction.index_uid.to_string(),
        }));
    }
    let splits = splits_in_range(metastore, compaction).await?;
    let busy: HashSet<String> = metastore
        .list_merge_tasks(
            Some(&index.index_uid),
            &[MergeTaskState::Pending, MergeTaskState::Running],
            None,
        )
        .await?
        .into_iter()
        .flat_map(|task| task.split_ids)
        .collect();
    let node_local = env.config.scope == ScopeMode::NodeLocal;
    let tasks = plan_tasks(
        &index, &splits, &busy, compaction, node_local, now, metastore,
    )
    .await?;
    let by_id: HashMap<&str, &SplitMetadata> =
        splits.iter().map(|s| (s.split_id.as_str(), s)).collect();
    let created = metastore
        .create_merge_tasks(&index.index_uid, tasks, env.config.merge_max_attempts)
        .await?;
    metrics::COMPACTION_TRIGGERS
        .with_label_values(&["manual"])
        .inc_by(created.len() as u64);
    compaction.progress.total = created.len() as u64;
    compaction.progress.splits_before = splits.len() as u64;
    compaction.progress.bytes_read = created
        .iter()
        .flat_map(|task| &task.split_ids)
        .filter_map(|id| by_id.get(id.as_str()))
        .map(|split| split.size_bytes)
        .sum();
    compaction.start_timestamp = Some(now);
    compaction.update_timestamp = now;
    if created.is_empty() {
        compaction.state = CompactionState::Completed;
        compaction.progress.splits_after = Some(splits.len() as u64);
        compaction.finish_timestamp = Some(now);
    } else {
        compaction.state = CompactionState::Executing;
    }
    metastore.update_compaction(compaction).await?;
    info!(
        compaction_id = %compaction.compaction_id,
        index = %index.index_uid,
        tasks = created.len(),
        splits = splits.len(),
        "manual compaction planned"
    );
    Ok(created.len())
}

/// The merge and delete tasks of a compaction (see the module docs).
async fn plan_tasks(
    index: &IndexMetadata,
    splits: &[SplitMetadata],
    busy: &HashSet<String>,
    compaction: &Compaction,
    node_local: bool,
    now: i64,
    metastore: &Arc<dyn Metastore>,
) -> Result<Vec<NewMergeTask>, CompactionError> {
    let config = &index.index_config;
    let cap = config.compaction.max_split_bytes;
    let target_docs = match &config.indexing_settings.merge_policy {
        MergePolicyConfig::Locality(locality) => locality.target_num_docs(),
        _ => config.indexing_settings.split_num_docs_target,
    };
    let locality = matches!(
        config.indexing_settings.merge_policy,
        MergePolicyConfig::Locality(_)
    );
    let mut groups: BTreeMap<(MergeScope, Option<i64>), Vec<&SplitMetadata>> = BTreeMap::new();
    for split in splits {
        if busy.contains(&split.split_id) {
            continue;
        }
        let eligible = if compaction.request.force {
            split.size_bytes < cap
        } else {
            !split.is_mature(now)
        };
        if eligible {
            groups
                .entry((split.merge_scope(node_local), split.time_bucket_start))
                .or_default()
                .push(split);
        }
    }
    let id = &compaction.compaction_id;
    let mut tasks = Vec::new();
    let mut merged: HashSet<&str> = HashSet::new();
    for ((scope, _), mut members) in groups {
        members.sort_by_key(|s| (s.time_range.map(|r| r.start), s.split_id.clone()));
        if locality {
            // A lone split is rewritten too if it is level 0 (it becomes level 1).
            if members.len() >= 2 || members.iter().any(|s| s.key_level == 0) {
                merged.extend(members.iter().map(|s| s.split_id.as_str()));
                tasks.push(
                    NewMergeTask::new(scope, members.iter().map(|s| s.split_id.clone()).collect())
                        .with_kind(MergeKind::Locality)
                        .with_compaction(id.clone()),
                );
            }
            continue;
        }
        // Consecutive splits packed up to the target.
        let mut pack: Vec<&SplitMetadata> = Vec::new();
        let mut packs = Vec::new();
        for split in members {
            let docs: u64 = pack.iter().map(|s| s.num_docs).sum();
            let bytes: u64 = pack.iter().map(|s| s.size_bytes).sum();
            if !pack.is_empty()
                && (docs >= target_docs || bytes.saturating_add(split.size_bytes) > cap)
            {
                packs.push(std::mem::take(&mut pack));
            }
            pack.push(split);
        }
        packs.push(pack);
        for pack in packs.into_iter().filter(|pack| pack.len() >= 2) {
            merged.extend(pack.iter().map(|s| s.split_id.as_str()));
            tasks.push(
                NewMergeTask::new(
                    scope.clone(),
                    pack.iter().map(|s| s.split_id.clone()).collect(),
                )
                .with_compaction(id.clone()),
            );
        }
    }
    // Every pending delete applied: the splits no merge takes get a delete compaction.
    if let Some(min_clean) = splits.iter().map(|s| s.delete_opstamp).min() {
        let deletes = purgeable_delete_tasks(metastore.as_ref(), index, min_clean, now).await?;
        for split in splits {
            if merged.contains(split.split_id.as_str()) || busy.contains(&split.split_id) {
                continue;
            }
            if deletes.iter().any(|task| task.may_touch(split)) {
                tasks.push(
                    NewMergeTask::new(split.merge_scope(node_local), vec![split.split_id.clone()])
                        .with_kind(MergeKind::Delete)
                        .with_compaction(id.clone()),
                );
            }
        }
    }
    Ok(tasks)
}

/// Updates an executing compaction from its tasks; finishes it when they are all done.
async fn follow_compaction(
    metastore: &Arc<dyn Metastore>,
    compaction: &mut Compaction,
    now: i64,
) -> Result<(), CompactionError> {
    let tasks: Vec<_> = metastore
        .list_merge_tasks(Some(&compaction.index_uid), &[], None)
        .await?
        .into_iter()
        .filter(|task| task.compaction_id.as_deref() == Some(compaction.compaction_id.as_str()))
        .collect();
    let completed = tasks
        .iter()
        .filter(|t| t.state == MergeTaskState::Succeeded)
        .count() as u64;
    let failed = tasks
        .iter()
        .filter(|t| t.state == MergeTaskState::Failed)
        .count() as u64;
    // Tasks cleaned up by the janitor before we saw them finish count as completed.
    let missing = compaction.progress.total.saturating_sub(tasks.len() as u64);
    let before = compaction.progress.clone();
    compaction.progress.completed = completed + missing;
    compaction.progress.failed = failed;
    let finished = compaction.progress.completed + failed >= compaction.progress.total;
    if finished {
        let outputs: HashSet<&str> = tasks
            .iter()
            .flat_map(|t| &t.output_split_ids)
            .map(String::as_str)
            .collect();
        compaction.progress.bytes_written = metastore
            .list_splits(ListSplitsQuery::for_index(compaction.index_uid.clone()))
            .await?
            .iter()
            .filter(|s| outputs.contains(s.split_metadata.split_id.as_str()))
            .map(|s| s.split_metadata.size_bytes)
            .sum();
        compaction.progress.splits_after =
            Some(splits_in_range(metastore, compaction).await?.len() as u64);
        compaction.finish_timestamp = Some(now);
        if failed > 0 {
            compaction.state = CompactionState::Failed;
            compaction.error = tasks
                .iter()
                .find(|t| t.state == MergeTaskState::Failed)
                .and_then(|t| t.error.clone())
                .map(|error| {
                    format!(
                        "{failed} of {} merges failed: {error}",
                        compaction.progress.total
                    )
                });
        } else {
            compaction.state = CompactionState::Completed;
        }
        info!(compaction_id = %compaction.compaction_id, state = compaction.state.as_str(), "manual compaction finished");
    }
    if finished || compaction.progress != before {
        compaction.update_timestamp = now;
        metastore.update_compaction(compaction).await?;
    }
    Ok(())
}
