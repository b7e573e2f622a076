//! Delete compaction planning: which published splits to rewrite without their deleted
//! documents (Milvus' triggers). A split is rewritten once the delete tasks it is not clean
//! of delete more than `compaction.delete_ratio` of its documents, or more than
//! `compaction.delete_bytes` of them (as ingested). Only tasks older than the index's
//! time-travel window count: younger ones must stay visible to `as_of` searches.
//!
//! Counting what a split's tasks delete means opening the split (through the split cache);
//! counts are remembered per split and task range, so a split is counted again only when a
//! new task may touch it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use shale_config::CompactionSettings;
use shale_metastore::{IndexMetadata, ListSplitsQuery, Metastore};
use shale_types::{DeleteTask, IndexUid, MergeKind, MergeTrigger, SplitMetadata, SplitState};
use tracing::{debug, warn};

use super::{CompactionEnv, CompactionError};
use crate::service::metrics;

/// Why a split is rewritten by a delete compaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteTrigger {
    /// Deleted documents exceed `delete_ratio` of the split.
    Ratio,
    /// Deleted documents weigh more than `delete_bytes`.
    Bytes,
}

impl DeleteTrigger {
    /// The trigger's name in metrics and APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteTrigger::Ratio => "delete_ratio",
            DeleteTrigger::Bytes => "delete_bytes",
        }
    }
}

/// Split id → (last task opstamp counted, documents those tasks delete).
type SplitCounts = HashMap<String, (u64, u64)>;

/// Deleted-document counts already computed, per index.
#[derive(Default)]
pub struct DeleteCounts {
    counts: Mutex<HashMap<IndexUid, SplitCounts>>,
}

impl DeleteCounts {
    fn get(&self, index_uid: &IndexUid, split_id: &str, up_to: u64) -> Option<u64> {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts
            .get(index_uid)?
            .get(split_id)
            .filter(|(opstamp, _)| *opstamp == up_to)
            .map(|(_, count)| *count)
    }

    fn set(&self, index_uid: &IndexUid, split_id: &str, up_to: u64, count: u64) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts
            .entry(index_uid.clone())
            .or_default()
            .insert(split_id.to_string(), (up_to, count));
    }

    /// Forgets the splits of `index_uid` not in `keep` (replaced or deleted since).
    fn retain(&self, index_uid: &IndexUid, keep: &HashSet<&str>) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(splits) = counts.get_mut(index_uid) {
            splits.retain(|split_id, _| keep.contains(split_id.as_str()));
        }
    }
}

/// The trigger that fires for a split of `num_docs` documents (`uncompressed_bytes` as
/// ingested) of which `deleted` are deleted, if any.
pub fn delete_trigger(
    settings: &CompactionSettings,
    num_docs: u64,
    uncompressed_bytes: u64,
    deleted: u64,
) -> Option<DeleteTrigger> {
    if deleted == 0 || num_docs == 0 {
        return None;
    }
    if deleted as f64 > settings.delete_ratio * num_docs as f64 {
        return Some(DeleteTrigger::Ratio);
    }
    let deleted_bytes =
        (u128::from(uncompressed_bytes) * u128::from(deleted)) / u128::from(num_docs);
    if deleted_bytes > u128::from(settings.delete_bytes) {
        return Some(DeleteTrigger::Bytes);
    }
    None
}

/// The delete tasks of `index` old enough to be purged at `now` (outside the time-travel
/// window), from `opstamp_gt` on: a prefix of the history, so that "clean up to `o`" keeps
/// meaning every task up to `o`.
pub async fn purgeable_delete_tasks(
    metastore: &dyn Metastore,
    index: &IndexMetadata,
    opstamp_gt: u64,
    now: i64,
) -> Result<Vec<DeleteTask>, CompactionError> {
    let purge_before = now - index.index_config.time_travel_retention_secs();
    Ok(metastore
        .list_delete_tasks(&index.index_uid, opstamp_gt)
        .await?
        .into_iter()
        .take_while(|task| task.create_timestamp <= purge_before)
        .collect())
}

/// The opstamp `split` is clean up to without being rewritten: past its own, each next task
/// (in opstamp order) that cannot reach it by its metadata (time range, tags, key range), or
/// that is known to delete none of its documents (`zero_through`: every purgeable task up to
/// that opstamp was counted and deletes nothing in it). A prefix, so that "clean up to `o`"
/// keeps meaning every task up to `o`.
fn clean_without_rewrite(
    split: &SplitMetadata,
    tasks: &[(DeleteTask, shale_index::SplitPruner)],
    zero_through: Option<u64>,
) -> u64 {
    let mut clean = split.delete_opstamp;
    for (task, pruner) in tasks {
        if task.opstamp <= clean {
            continue;
        }
        let passes =
            zero_through.is_some_and(|zero| task.opstamp <= zero) || !pruner.may_match(split);
        if !passes {
            break;
        }
        clean = task.opstamp;
    }
    clean
}

/// What a node holding records of an index (a shard of it, open or draining) last reported
/// of those it has not published yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingStamps {
    /// When the report was made (the cluster's clock, ms).
    pub reported_at_ms: i64,
    /// The lowest delete opstamp among those records (`None`: there are none).
    pub lowest: Option<u64>,
}

/// The opstamp up to which the delete tasks of an index may be forgotten, if any: a prefix
/// of `tasks` (by opstamp) whose every task is older than the time-travel window
/// (`window_secs`) and reached every record not yet in a split — each holder of such records
/// reported, after the task was acknowledged (`acknowledged_within_ms` after its creation),
/// only records stamped at or above it. A holder that did not report (`None`: dead, or not
/// reporting) keeps every task. What splits hold is checked by the metastore
/// ([`Metastore::purge_delete_tasks`]).
pub fn delete_purge_limit(
    tasks: &[DeleteTask],
    now_secs: i64,
    window_secs: i64,
    acknowledged_within_ms: i64,
    holders: &[Option<PendingStamps>],
) -> Option<u64> {
    let holders: Vec<PendingStamps> = holders.iter().copied().collect::<Option<_>>()?;
    tasks
        .iter()
        .take_while(|task| {
            // Creation times are whole seconds: the task may have been created up to 1 s later.
            let acknowledged_by_ms = (task.create_timestamp + 1)
                .saturating_mul(1000)
                .saturating_add(acknowledged_within_ms);
            task.create_timestamp <= now_secs - window_secs
                && holders.iter().all(|holder| {
                    holder.reported_at_ms > acknowledged_by_ms
                        && holder.lowest.is_none_or(|lowest| lowest >= task.opstamp)
                })
        })
        .last()
        .map(|task| task.opstamp)
}

/// The published splits of `index`, not in `busy` (and, when given, made by one of
/// `live_nodes`), whose purgeable delete tasks pass a trigger, with the trigger. On the way,
/// splits the next tasks cannot reach are recorded as clean of them without a rewrite
/// ([`Metastore::advance_split_delete_opstamps`]): searches then list fewer tasks, and the
/// tasks can be purged.
pub async fn plan_delete_compactions(
    env: &CompactionEnv,
    metastore: &Arc<dyn Metastore>,
    index: &IndexMetadata,
    busy: &HashSet<String>,
    live_nodes: Option<&HashSet<String>>,
    last_opstamp: Option<u64>,
    now: i64,
) -> Result<Vec<(SplitMetadata, DeleteTrigger)>, CompactionError> {
    // Only the splits not clean of the last task: the others have nothing to do here.
    let Some(last_opstamp) = last_opstamp else {
        return Ok(Vec::new());
    };
    if index.index_config.metrics.is_some() {
        return plan_metrics_delete_compactions(
            env,
            metastore,
            index,
            busy,
            live_nodes,
            last_opstamp,
            now,
        )
        .await;
    }
    let Some((published, min_clean)) = unclean_splits(env, metastore, index, last_opstamp).await?
    else {
        return Ok(Vec::new());
    };
    let all_tasks = metastore
        .list_delete_tasks(&index.index_uid, min_clean)
        .await?;
    if all_tasks.is_empty() {
        return Ok(Vec::new());
    }
    let purge_before = now - index.index_config.time_travel_retention_secs();
    let tasks: Vec<DeleteTask> = all_tasks
        .iter()
        .take_while(|task| task.create_timestamp <= purge_before)
        .cloned()
        .collect();
    let settings = &index.index_config.compaction;
    let doc_mapper = Arc::new(shale_index::DocMapper::for_index(&index.index_config)?);
    let pruners: Vec<(DeleteTask, shale_index::SplitPruner)> = all_tasks
        .into_iter()
        .map(|task| {
            let pruner = shale_index::SplitPruner::new(
                &doc_mapper,
                &task.delete_query.query,
                task.delete_query.start_timestamp,
                task.delete_query.end_timestamp,
                true,
            );
            (task, pruner)
        })
        .collect();
    let storage = env
        .storages
        .for_index(index.index_id(), index.index_config.index_uri.as_deref())?;
    let mut planned = Vec::new();
    let mut advanced = Vec::new();
    for split in published {
        // node_local: only a live node's splits (its own workers claim their tasks).
        if busy.contains(&split.split_id)
            || live_nodes.is_some_and(|live| !live.contains(&split.node_id))
        {
            continue;
        }
        let touching: Vec<DeleteTask> = tasks
            .iter()
            .filter(|task| task.may_touch(&split))
            .cloned()
            .collect();
        let deleted = match touching.last().map(|task| task.opstamp) {
            None => None,
            Some(up_to) => match env
                .delete_counts
                .get(&index.index_uid, &split.split_id, up_to)
            {
                Some(count) => Some((up_to, count)),
                None => {
                    let pin = match env
                        .cache
                        .get_split(storage.as_ref(), &split.split_id, split.size_bytes)
                        .await
                    {
                        Ok(pin) => pin,
                        Err(err) => {
                            warn!(%err, split_id = %split.split_id, "cannot count deleted documents");
                            continue;
                        }
                    };
                    let path = pin.split_file();
                    let doc_mapper = doc_mapper.clone();
                    let count = tokio::task::spawn_blocking(move || {
                        let index = shale_index::open_split(&path)?;
                        shale_index::count_deleted(&doc_mapper, &index, &touching)
                    })
                    .await??;
                    drop(pin);
                    env.delete_counts
                        .set(&index.index_uid, &split.split_id, up_to, count);
                    Some((up_to, count))
                }
            },
        };
        if let Some((_, deleted)) = deleted {
            if let Some(trigger) = delete_trigger(
                settings,
                split.num_docs,
                split.uncompressed_docs_size_bytes,
                deleted,
            ) {
                debug!(split_id = %split.split_id, deleted, trigger = trigger.as_str(), "delete compaction");
                planned.push((split, trigger));
                continue;
            }
        }
        // Every purgeable task up to the last one touching the split deletes nothing in it
        // when that count is zero (those not touching it cannot reach it at all).
        let zero_through = match deleted {
            Some((up_to, 0)) => Some(up_to),
            Some(_) => None,
            None => tasks.last().map(|task| task.opstamp),
        };
        let clean = clean_without_rewrite(&split, &pruners, zero_through);
        if clean > split.delete_opstamp {
            let expected = split.delete_opstamp;
            let mut split = split;
            split.delete_opstamp = clean;
            advanced.push((split, expected));
        }
    }
    if !advanced.is_empty() {
        let num_advanced = metastore
            .advance_split_delete_opstamps(&index.index_uid, &advanced)
            .await?;
        debug!(index = %index.index_uid, num_advanced, "splits clean of more delete tasks without a rewrite");
    }
    Ok(planned)
}

/// The published splits of `index` not clean of `last_opstamp`, and the lowest opstamp they
/// are clean up to (`None`: there are none); forgets the counts of the other splits.
async fn unclean_splits(
    env: &CompactionEnv,
    metastore: &Arc<dyn Metastore>,
    index: &IndexMetadata,
    last_opstamp: u64,
) -> Result<Option<(Vec<SplitMetadata>, u64)>, CompactionError> {
    let published: Vec<SplitMetadata> = metastore
        .list_splits(ListSplitsQuery {
            delete_opstamp_lt: Some(last_opstamp),
            ..ListSplitsQuery::for_index(index.index_uid.clone())
                .with_states(&[SplitState::Published])
        })
        .await?
        .into_iter()
        .map(|split| split.split_metadata)
        .collect();
    env.delete_counts.retain(
        &index.index_uid,
        &published.iter().map(|s| s.split_id.as_str()).collect(),
    );
    let min_clean = published.iter().map(|s| s.delete_opstamp).min();
    Ok(min_clean.map(|min| (published, min)))
}

/// [`plan_delete_compactions`] for a metrics index: what a split's purgeable tasks delete
/// is counted by reading the split's samples of the series they match (in their windows);
/// a split they delete nothing of is recorded clean of them without a rewrite.
async fn plan_metrics_delete_compactions(
    env: &CompactionEnv,
    metastore: &Arc<dyn Metastore>,
    index: &IndexMetadata,
    busy: &HashSet<String>,
    live_nodes: Option<&HashSet<String>>,
    last_opstamp: u64,
    now: i64,
) -> Result<Vec<(SplitMetadata, DeleteTrigger)>, CompactionError> {
    let Some((published, min_clean)) = unclean_splits(env, metastore, index, last_opstamp).await?
    else {
        return Ok(Vec::new());
    };
    let tasks = purgeable_delete_tasks(metastore.as_ref(), index, min_clean, now).await?;
    let Some(newest) = tasks.last().map(|task| task.opstamp) else {
        return Ok(Vec::new());
    };
    let mut parsed = Vec::with_capacity(tasks.len());
    for task in &tasks {
        match shale_metrics::SeriesDelete::from_task(task) {
            Ok(delete) => parsed.push((task.clone(), delete)),
            Err(err) => {
                warn!(%err, opstamp = task.opstamp, "a metrics delete task does not parse");
                return Ok(Vec::new());
            }
        }
    }
    let storage = env
        .storages
        .for_index(index.index_id(), index.index_config.index_uri.as_deref())?;
    let settings = &index.index_config.compaction;
    let mut planned = Vec::new();
    let mut advanced = Vec::new();
    for split in published {
        if busy.contains(&split.split_id)
            || live_nodes.is_some_and(|live| !live.contains(&split.node_id))
        {
            continue;
        }
        let touching: Vec<shale_metrics::SeriesDelete> = parsed
            .iter()
            .filter(|(task, _)| task.may_touch(&split))
            .map(|(_, delete)| delete.clone())
            .collect();
        let deleted = if touching.is_empty() {
            0
        } else if let Some(count) = env
            .delete_counts
            .get(&index.index_uid, &split.split_id, newest)
        {
            count
        } else {
            let bytes = match storage.get_bytes(&split.object_key()).await {
                Ok(bytes) => bytes,
                Err(err) => {
                    warn!(%err, split_id = %split.split_id, "cannot count deleted samples");
                    continue;
                }
            };
            let count = tokio::task::spawn_blocking(move || -> Result<u64, String> {
                let start = touching
                    .iter()
                    .map(|d| d.start_ms)
                    .min()
                    .unwrap_or(i64::MIN);
                let end = touching.iter().map(|d| d.end_ms).max().unwrap_or(i64::MAX);
                let read = shale_metrics::read_split(bytes, &[], start, end)
                    .map_err(|err| err.to_string())?;
                let refs: Vec<&shale_metrics::SeriesDelete> = touching.iter().collect();
                Ok(read
                    .series
                    .into_iter()
                    .map(|mut series| {
                        shale_metrics::apply_deletes(&refs, &series.labels, &mut series.samples)
                    })
                    .sum())
            })
            .await?
            .map_err(CompactionError::Metrics)?;
            env.delete_counts
                .set(&index.index_uid, &split.split_id, newest, count);
            count
        };
        if let Some(trigger) = delete_trigger(
            settings,
            split.num_docs,
            split.uncompressed_docs_size_bytes,
            deleted,
        ) {
            debug!(split_id = %split.split_id, deleted, trigger = trigger.as_str(), "metrics delete compaction");
            planned.push((split, trigger));
        } else if deleted == 0 && newest > split.delete_opstamp {
            // Nothing of it deleted by any purgeable task: clean of them as it is.
            let expected = split.delete_opstamp;
            let mut split = split;
            split.delete_opstamp = newest;
            advanced.push((split, expected));
        }
    }
    if !advanced.is_empty() {
        metastore
            .advance_split_delete_opstamps(&index.index_uid, &advanced)
            .await?;
    }
    Ok(planned)
}

/// Records planned delete compactions as merge tasks (one split each); returns how many.
pub async fn create_delete_tasks(
    env: &CompactionEnv,
    metastore: &Arc<dyn Metastore>,
    index: &IndexMetadata,
    planned: Vec<(SplitMetadata, DeleteTrigger)>,
    node_local: bool,
) -> Result<usize, CompactionError> {
    if planned.is_empty() {
        return Ok(0);
    }
    let triggers: HashMap<String, DeleteTrigger> = planned
        .iter()
        .map(|(split, trigger)| (split.split_id.clone(), *trigger))
        .collect();
    let tasks = planned
        .into_iter()
        .map(|(split, trigger)| {
            shale_metastore::NewMergeTask::new(split.merge_scope(node_local), vec![split.split_id])
                .with_kind(MergeKind::Delete)
                .with_trigger(match trigger {
                    DeleteTrigger::Ratio => MergeTrigger::DeleteRatio,
                    DeleteTrigger::Bytes => MergeTrigger::DeleteBytes,
                })
        })
        .collect();
    let created = metastore
        .create_merge_tasks(&index.index_uid, tasks, env.config.merge_max_attempts)
        .await?;
    for task in &created {
        if let Some(trigger) = task.split_ids.first().and_then(|id| triggers.get(id)) {
            metrics::COMPACTION_TRIGGERS
                .with_label_values(&[trigger.as_str()])
                .inc();
        }
    }
    Ok(created.len())
}

#[cfg(test)]
mod purge_tests {
    use super::*;

    fn task(opstamp: u64, create_timestamp: i64) -> DeleteTask {
        DeleteTask {
            index_uid: IndexUid::new("logs"),
            opstamp,
            create_timestamp,
            delete_query: Default::default(),
            default_search_fields: None,
            doc_mapping_uid: None,
        }
    }

    #[test]
    fn tasks_are_forgotten_only_once_every_pending_record_is_above_them() {
        let tasks = [task(1, 100), task(2, 200), task(3, 300)];
        let report = |at_secs: i64, lowest: Option<u64>| {
            Some(PendingStamps {
                reported_at_ms: at_secs * 1000,
                lowest,
            })
        };
        // No holder: every task old enough goes (the metastore keeps the newest).
        assert_eq!(delete_purge_limit(&tasks, 1000, 0, 6000, &[]), Some(3));
        // The time-travel window keeps the young ones.
        assert_eq!(delete_purge_limit(&tasks, 1000, 750, 6000, &[]), Some(2));
        assert_eq!(delete_purge_limit(&tasks, 1000, 950, 6000, &[]), None);
        // A holder with records stamped 2 pending: task 2 still has to reach them.
        assert_eq!(
            delete_purge_limit(
                &tasks,
                1000,
                0,
                6000,
                &[report(900, Some(2)), report(900, None)]
            ),
            Some(2)
        );
        assert_eq!(
            delete_purge_limit(&tasks, 1000, 0, 6000, &[report(900, Some(1))]),
            Some(1)
        );
        assert_eq!(
            delete_purge_limit(&tasks, 1000, 0, 6000, &[report(900, Some(0))]),
            None
        );
        // A report from before a task was acknowledged says nothing of it.
        assert_eq!(
            delete_purge_limit(&tasks, 1000, 0, 6000, &[report(250, None)]),
            Some(2)
        );
        // A holder that did not report keeps everything.
        assert_eq!(
            delete_purge_limit(&tasks, 1000, 0, 6000, &[report(900, None), None]),
            None
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triggers_fire_above_their_thresholds_and_not_at_or_below() {
        let settings = CompactionSettings {
            delete_ratio: 0.2,
            delete_bytes: 10_000,
            ..CompactionSettings::default()
        };
        // 1000 docs of 10 bytes: 200 deleted is the ratio exactly (2000 bytes).
        assert_eq!(delete_trigger(&settings, 1000, 10_000, 200), None);
        assert_eq!(
            delete_trigger(&settings, 1000, 10_000, 201),
            Some(DeleteTrigger::Ratio)
        );
        assert_eq!(delete_trigger(&settings, 1000, 10_000, 0), None);
        // 100_000 docs of 100 bytes: 100 deleted is 10_000 bytes exactly, 101 is above.
        assert_eq!(delete_trigger(&settings, 100_000, 10_000_000, 100), None);
        assert_eq!(
            delete_trigger(&settings, 100_000, 10_000_000, 101),
            Some(DeleteTrigger::Bytes)
        );
        assert_eq!(delete_trigger(&settings, 0, 0, 0), None);
    }
}
