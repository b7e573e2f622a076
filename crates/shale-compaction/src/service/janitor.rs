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
//! - **Unreachable storage**: an index whose storage cannot be reached (an object store that
//!   does not answer) is skipped, not the round: its storage is recorded as unreachable (its
//!   searches and ingests are then answered "unavailable") and tried again with a growing
//!   backoff, until it answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use shale_metastore::{ListSplitsQuery, Metastore, MetastoreError};
use shale_types::{IndexUid, Split, SplitState};
use tracing::{info, warn};

use super::{CompactionEnv, CompactionError};

/// Finished merge tasks are kept this long for the compaction API.
const FINISHED_TASK_RETENTION_SECS: i64 = 24 * 3600;

/// The first wait before an unreachable storage is tried again; doubled at each failure.
const FIRST_STORAGE_RETRY_SECS: i64 = 10;
/// The longest wait before an unreachable storage is tried again.
const MAX_STORAGE_RETRY_SECS: i64 = 600;
/// The object a janitor asks for to learn whether an index's storage answers (it need not
/// exist: "not found" is an answer).
const PROBE_OBJECT: &str = "shale-janitor-probe";

/// An index whose storage could not be reached.
#[derive(Debug, Clone, Copy)]
struct StorageBackoff {
    /// Consecutive failed attempts.
    failures: u32,
    /// When it is tried again (seconds since epoch).
    retry_at: i64,
}

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
    /// Indexes skipped because their storage could not be reached (now or lately).
    pub unreachable_indexes: Vec<IndexUid>,
}

/// The janitor of a node; remembers when each index's retention is next due.
pub struct Janitor {
    env: Arc<CompactionEnv>,
    next_retention: Mutex<HashMap<IndexUid, i64>>,
    /// Indexes whose storage answered at least once (not probed again unless it fails).
    reached: Mutex<std::collections::HashSet<IndexUid>>,
    /// Indexes whose storage could not be reached, and when each is tried again.
    unreachable: Mutex<HashMap<IndexUid, StorageBackoff>>,
}

impl Janitor {
    /// A janitor working with `env`.
    pub fn new(env: Arc<CompactionEnv>) -> Self {
        Janitor {
            env,
            next_retention: Mutex::new(HashMap::new()),
            reached: Mutex::new(std::collections::HashSet::new()),
            unreachable: Mutex::new(HashMap::new()),
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

    fn unreachable(&self) -> std::sync::MutexGuard<'_, HashMap<IndexUid, StorageBackoff>> {
        self.unreachable
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn reached(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<IndexUid>> {
        self.reached
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records that the storage of `index` failed at `now` (`error` says how): it is marked
    /// unreachable and tried again after a backoff.
    fn storage_failed(&self, index: &shale_metastore::IndexMetadata, now: i64, error: &str) {
        self.reached().remove(&index.index_uid);
        let mut unreachable = self.unreachable();
        let failures = unreachable
            .get(&index.index_uid)
            .map_or(1, |backoff| backoff.failures.saturating_add(1));
        let wait = FIRST_STORAGE_RETRY_SECS
            .saturating_mul(1i64 << failures.saturating_sub(1).min(20))
            .min(MAX_STORAGE_RETRY_SECS);
        unreachable.insert(
            index.index_uid.clone(),
            StorageBackoff {
                failures,
                retry_at: now.saturating_add(wait),
            },
        );
        drop(unreachable);
        self.env.storages.mark_unreachable(
            index.index_id(),
            index.index_config.index_uri.as_deref(),
            error,
        );
        warn!(
            index = %index.index_uid,
            %error,
            failures,
            retry_in_secs = wait,
            "janitor: the index's storage cannot be reached; its searches and ingests answer \
             unavailable until it answers again"
        );
    }

    /// Records that the storage of `index` answered.
    fn storage_answered(&self, index: &shale_metastore::IndexMetadata) {
        if self.unreachable().remove(&index.index_uid).is_some() {
            info!(index = %index.index_uid, "janitor: the index's storage answers again");
        }
        self.reached().insert(index.index_uid.clone());
        self.env
            .storages
            .mark_reachable(index.index_id(), index.index_config.index_uri.as_deref());
    }

    /// The storage of `index` if it can be used in this round at `now`: resolved, and
    /// answering a probe when it never answered or failed lately (then not before its
    /// backoff is over). `None` when it cannot (recorded, see [`Janitor::storage_failed`]).
    async fn usable_storage(
        &self,
        index: &shale_metastore::IndexMetadata,
        now: i64,
    ) -> Option<shale_storage::StorageRef> {
        if let Some(backoff) = self.unreachable().get(&index.index_uid) {
            if now < backoff.retry_at {
                return None;
            }
        }
        let storage = match self
            .env
            .storages
            .for_index(index.index_id(), index.index_config.index_uri.as_deref())
        {
            Ok(storage) => storage,
            Err(err) => {
                self.storage_failed(index, now, &err.to_string());
                return None;
            }
        };
        if !self.reached().contains(&index.index_uid) {
            if let Err(err) = storage.probe(PROBE_OBJECT).await {
                self.storage_failed(index, now, &err.to_string());
                return None;
            }
            self.storage_answered(index);
        }
        Some(storage)
    }

    /// One round over every index at `now`, through `metastore` (the leader's fenced handle).
    /// An index whose storage cannot be reached is skipped (see the module docs).
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
        self.unreachable()
            .retain(|uid, _| indexes.iter().any(|index| &index.index_uid == uid));
        self.reached()
            .retain(|uid| indexes.iter().any(|index| &index.index_uid == uid));
        for index in indexes {
            let Some(storage) = self.usable_storage(&index, now).await else {
                report.unreachable_indexes.push(index.index_uid.clone());
                continue;
            };

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
            let deleted = doomed.is_empty()
                || self
                    .delete_splits(
                        metastore,
                        &index,
                        storage.as_ref(),
                        &doomed,
                        &mut report,
                        now,
                    )
                    .await?;
            if !deleted {
                report.unreachable_indexes.push(index.index_uid.clone());
                continue;
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

    /// Deletes the objects, then the rows, of MarkedForDeletion splits; `false` when the
    /// storage failed the first deletion (then nothing more is tried: the storage is
    /// recorded as unreachable, see [`Janitor::storage_failed`]).
    async fn delete_splits(
        &self,
        metastore: &Arc<dyn Metastore>,
        index: &shale_metastore::IndexMetadata,
        storage: &dyn shale_storage::Storage,
        doomed: &[Split],
        report: &mut JanitorReport,
        now: i64,
    ) -> Result<bool, CompactionError> {
        let env = &self.env;
        let index_uid = &index.index_uid;
        let mut deleted = Vec::with_capacity(doomed.len());
        for (i, split) in doomed.iter().enumerate() {
            let split_id = &split.split_metadata.split_id;
            match storage.delete(&split.split_metadata.object_key()).await {
                Ok(()) => deleted.push(split_id.clone()),
                Err(err) if i == 0 => {
                    self.storage_failed(index, now, &err.to_string());
                    return Ok(false);
                }
                Err(err) => warn!(%split_id, %err, "cannot delete split object; will retry"),
            }
        }
        match metastore.delete_splits(index_uid, &deleted).await {
            Ok(()) => {}
            // Marked splits never go back to Published; refuse and retry next round anyway.
            Err(MetastoreError::FailedPrecondition(reason)) => {
                warn!(%reason, "janitor: split rows changed meanwhile");
                return Ok(true);
            }
            Err(err) => return Err(err.into()),
        }
        for split_id in &deleted {
            env.cache.remove(split_id).await;
        }
        report.deleted_split_ids.extend(deleted);
        Ok(true)
    }
}
