//! The janitor: deletes the objects (then the rows) of MarkedForDeletion splits once their
//! grace period is over — so a search that listed them before a merge replaced them still
//! completes —, deletes Staged splits whose upload was never published, applies each index's
//! retention (splits whose time range ends before `now - period` are marked for deletion), and
//! forgets finished merge tasks.

use shale_metastore::{ListSplitsQuery, MetastoreError};
use shale_types::{Split, SplitState};
use tracing::{info, warn};

use super::{CompactionEnv, CompactionError};

/// Finished merge tasks are kept this long for the compaction API.
const FINISHED_TASK_RETENTION_SECS: i64 = 24 * 3600;

/// What a janitor round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JanitorReport {
    /// Splits marked for deletion by retention.
    pub expired_by_retention: usize,
    /// Splits whose objects and rows were deleted.
    pub deleted_split_ids: Vec<String>,
    /// Finished merge tasks forgotten.
    pub deleted_tasks: usize,
}

/// One janitor round over every index.
pub async fn janitor_round(
    env: &CompactionEnv,
    now: i64,
) -> Result<JanitorReport, CompactionError> {
    let mut report = JanitorReport::default();
    let grace = env.config.deletion_grace_period_secs as i64;
    let staged_timeout = env.config.staged_split_timeout_secs as i64;
    for index in env.metastore.list_indexes().await? {
        let storage = env
            .storages
            .for_index(index.index_id(), index.index_config.index_uri.as_deref())?;

        if let Some(retention) = &index.index_config.retention {
            match retention.period_secs() {
                Ok(period) => {
                    let mut query = ListSplitsQuery::for_index(index.index_uid.clone())
                        .with_states(&[SplitState::Published]);
                    query.time_range_end_lt = Some(now - period as i64);
                    let expired: Vec<String> = env
                        .metastore
                        .list_splits(query)
                        .await?
                        .into_iter()
                        .map(|s| s.split_metadata.split_id)
                        .collect();
                    if !expired.is_empty() {
                        env.metastore
                            .mark_splits_for_deletion(&index.index_uid, &expired)
                            .await?;
                        info!(index = %index.index_uid, count = expired.len(), "retention expired splits");
                        report.expired_by_retention += expired.len();
                    }
                }
                Err(err) => warn!(index = %index.index_uid, %err, "invalid retention period"),
            }
        }

        let mut doomed: Vec<Split> = Vec::new();
        let mut marked = ListSplitsQuery::for_index(index.index_uid.clone())
            .with_states(&[SplitState::MarkedForDeletion]);
        marked.update_timestamp_lte = Some(now - grace);
        doomed.extend(env.metastore.list_splits(marked).await?);
        let mut staged =
            ListSplitsQuery::for_index(index.index_uid.clone()).with_states(&[SplitState::Staged]);
        staged.update_timestamp_lte = Some(now - staged_timeout);
        doomed.extend(env.metastore.list_splits(staged).await?);
        if doomed.is_empty() {
            continue;
        }
        let mut deleted = Vec::with_capacity(doomed.len());
        for split in &doomed {
            let split_id = &split.split_metadata.split_id;
            match storage.delete(&split.split_metadata.object_key()).await {
                Ok(()) => deleted.push(split_id.clone()),
                Err(err) => warn!(%split_id, %err, "cannot delete split object; will retry"),
            }
        }
        match env
            .metastore
            .delete_splits(&index.index_uid, &deleted)
            .await
        {
            Ok(()) => {}
            // A split was published meanwhile (a staged split's late publish): retry next round.
            Err(MetastoreError::FailedPrecondition(reason)) => {
                warn!(%reason, "janitor: split rows changed meanwhile");
                continue;
            }
            Err(err) => return Err(err.into()),
        }
        for split_id in &deleted {
            env.cache.remove(split_id).await;
        }
        report.deleted_split_ids.extend(deleted);
    }
    report.deleted_tasks = env
        .metastore
        .delete_merge_tasks(now - FINISHED_TASK_RETENTION_SECS)
        .await?;
    Ok(report)
}
