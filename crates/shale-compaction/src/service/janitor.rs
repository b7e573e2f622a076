//! The janitor: garbage collection of split objects and rows, and retention.
//!
//! - **Replaced and expired splits** (MarkedForDeletion): once their grace period is over —
//!   so that a search that listed them before a merge replaced them still completes — and
//!   the index's `time_travel_retention` too (an `as_of` search may need them), their
//!   objects are deleted, then their rows.
//! - **Stale uploads** (Staged splits older than the staged timeout: an upload whose publish
//!   never came): first marked for deletion in the metastore, only if still Staged, so that
//!   a late publish can no longer succeed; their objects and rows then go the way of every
//!   marked split, after the grace period. An object is never deleted while its row could
//!   still be published.
//! - **Retention**: at each tick of an index's retention `schedule` (the first one after the
//!   janitor first sees the index, then the next after each evaluation, as Quickwit does),
//!   Published splits whose time range ends at or before `now - period` are marked for
//!   deletion.
//! - Finished merge tasks are forgotten after a day.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use shale_metastore::{ListSplitsQuery, Metastore, MetastoreError};
use shale_types::{IndexUid, Split, SplitState};
use tracing::{info, warn};

use super::{CompactionEnv, CompactionError};

/// Finished merge tasks are kept this long for the compaction API.
const FINISHED_TASK_RETENTION_SECS: i64 = 24 * 3600;

/// What a janitor round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JanitorReport {
    /// Indexes whose retention policy was evaluated.
    pub retention_evaluated: usize,
    /// Splits marked for deletion by retention.
    pub expired_by_retention: usize,
    /// Stale Staged splits marked for deletion (deleted after the grace period).
    pub stale_staged_marked: usize,
    /// Splits whose objects and rows were deleted.
    pub deleted_split_ids: Vec<String>,
    /// Finished merge tasks forgotten.
    pub deleted_tasks: usize,
    /// Delete tasks forgotten (applied everywhere, outside every time-travel window).
    pub purged_delete_tasks: usize,
}

/// The janitor of a node; remembers when each index's retention is next due.
pub struct Janitor {
    env: Arc<CompactionEnv>,
    next_retention: Mutex<HashMap<IndexUid, i64>>,
}

impl Janitor {
    /// A janitor working with `env`.
    pub fn new(env: Arc<CompactionEnv>) -> Self {
        Janitor {
            env,
            next_retention: Mutex::new(HashMap::new()),
        }
    }

    fn next_retention(&self) -> std::sync::MutexGuard<'_, HashMap<IndexUid, i64>> {
        self.next_retention
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the retention of `index_uid` is due at `now`; schedules the next evaluation.
    fn retention_due(
        &self,
        index_uid: &IndexUid,
        next_after: impl Fn(i64) -> Option<i64>,
        now: i64,
    ) -> bool {
        let mut next = self.next_retention();
        match next.get(index_uid).copied() {
            Some(due) if due <= now => {
                match next_after(now) {
                    Some(following) => next.insert(index_uid.clone(), following),
                    None => next.remove(index_uid),
                };
                true
            }
            Some(_) => false,
            None => {
                if let Some(first) = next_after(now) {
                    next.insert(index_uid.clone(), first);
                }
                false
            }
        }
    }

    /// One round over every index at `now`, through `metastore` (the leader's fenced handle).
    pub async fn round(
        &self,
        metastore: &Arc<dyn Metastore>,
        now: i64,
    ) -> Result<JanitorReport, CompactionError> {
        let env = &self.env;
        let mut report = JanitorReport::default();
        let grace = env.config.deletion_grace_period_secs as i64;
        let staged_timeout = env.config.staged_split_timeout_secs as i64;
        let indexes = metastore.list_indexes().await?;
        self.next_retention()
            .retain(|uid, _| indexes.iter().any(|index| &index.index_uid == uid));
        for index in indexes {
            let storage = env
                .storages
                .for_index(index.index_id(), index.index_config.index_uri.as_deref())?;

            if let Some(retention) = &index.index_config.retention {
                match (retention.period_secs(), retention.schedule()) {
                    (Ok(period), Ok(schedule)) => {
                        if self.retention_due(&index.index_uid, |t| schedule.next_after(t), now) {
                            report.retention_evaluated += 1;
                            let mut query = ListSplitsQuery::for_index(index.index_uid.clone())
                                .with_states(&[SplitState::Published]);
                            // Ends at or before `now - period`.
                            query.time_range_end_lt = Some(now - period as i64 + 1);
                            let expired: Vec<String> = metastore
                                .list_splits(query)
                                .await?
                                .into_iter()
                                .map(|s| s.split_metadata.split_id)
                                .collect();
                            if !expired.is_empty() {
                                metastore
                                    .mark_splits_for_deletion(&index.index_uid, &expired)
                                    .await?;
                                info!(index = %index.index_uid, count = expired.len(), "retention expired splits");
                                report.expired_by_retention += expired.len();
                            }
                        }
                    }
                    (Err(err), _) | (_, Err(err)) => {
                        warn!(index = %index.index_uid, %err, "invalid retention policy")
                    }
                }
            }

            let mut marked = ListSplitsQuery::for_index(index.index_uid.clone())
                .with_states(&[SplitState::MarkedForDeletion]);
            // Replaced splits stay readable by `as_of` searches for the time-travel window.
            let keep = grace.max(index.index_config.time_travel_retention_secs());
            marked.update_timestamp_lte = Some(now - keep);
            let doomed: Vec<Split> = metastore.list_splits(marked).await?;
            if !doomed.is_empty() {
                self.delete_splits(
                    metastore,
                    &index.index_uid,
                    storage.as_ref(),
                    &doomed,
                    &mut report,
                )
                .await?;
            }

            // Stale uploads: mark first (only if still Staged); they are deleted in a later
            // round, after the grace period.
            let mut staged = ListSplitsQuery::for_index(index.index_uid.clone())
                .with_states(&[SplitState::Staged]);
            staged.update_timestamp_lte = Some(now - staged_timeout);
            let stale: Vec<String> = metastore
                .list_splits(staged)
                .await?
                .into_iter()
                .map(|s| s.split_metadata.split_id)
                .collect();
            if !stale.is_empty() {
                let marked = metastore
                    .mark_staged_splits_for_deletion(&index.index_uid, &stale)
                    .await?;
                if !marked.is_empty() {
                    info!(index = %index.index_uid, count = marked.len(), "marked stale staged splits for deletion");
                }
                report.stale_staged_marked += marked.len();
            }
        }
        report.deleted_tasks = metastore
            .delete_merge_tasks(now - FINISHED_TASK_RETENTION_SECS)
            .await?;
        Ok(report)
    }

    /// Deletes the objects, then the rows, of MarkedForDeletion splits.
    async fn delete_splits(
        &self,
        metastore: &Arc<dyn Metastore>,
        index_uid: &IndexUid,
        storage: &dyn shale_storage::Storage,
        doomed: &[Split],
        report: &mut JanitorReport,
    ) -> Result<(), CompactionError> {
        let env = &self.env;
        let mut deleted = Vec::with_capacity(doomed.len());
        for split in doomed {
            let split_id = &split.split_metadata.split_id;
            match storage.delete(&split.split_metadata.object_key()).await {
                Ok(()) => deleted.push(split_id.clone()),
                Err(err) => warn!(%split_id, %err, "cannot delete split object; will retry"),
            }
        }
        match metastore.delete_splits(index_uid, &deleted).await {
            Ok(()) => {}
            // Marked splits never go back to Published; refuse and retry next round anyway.
            Err(MetastoreError::FailedPrecondition(reason)) => {
                warn!(%reason, "janitor: split rows changed meanwhile");
                return Ok(());
            }
            Err(err) => return Err(err.into()),
        }
        for split_id in &deleted {
            env.cache.remove(split_id).await;
        }
        report.deleted_split_ids.extend(deleted);
        Ok(())
    }
}
