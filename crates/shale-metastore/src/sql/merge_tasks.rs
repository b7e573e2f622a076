//! Merge tasks in SQL (tables `merge_tasks` and `merge_task_splits`, migration 0002), shared
//! by both backends; [`SqlMetastore`]'s `Metastore` methods delegate here.
//!
//! - `merge_task_splits` holds the inputs of LIVE tasks only (rows are deleted when a task
//!   finishes), keyed by `(index_uid, split_id)`: "a split is in at most one live task" is a
//!   primary-key constraint. Creators lock the index row (as every index writer does), so two
//!   creators never race for a split.
//! - Lock order (PostgreSQL): index row, then task row, then split rows. Claimers lock only the
//!   task row they take (`FOR UPDATE SKIP LOCKED`, so concurrent claimers take different
//!   tasks) and read split states without locking; `publish_merge` re-checks the inputs under
//!   the index lock anyway.
//! - Tasks are ordered by id: ULIDs from a process-wide monotonic generator, so tasks created
//!   by one process sort in creation order even within a millisecond.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use shale_types::{IndexUid, MergeKind, MergeScope, MergeTrigger, SplitId, SplitState};
use sqlx::{AssertSqlSafe, ColumnIndex, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::{
    from_db, placeholders, serde_err, to_db, Bind, Dialect, SqlMetastore, IDS_PER_STATEMENT,
};
use crate::{MergeTask, MergeTaskState, MetastoreError, MetastoreResult, NewMergeTask};

/// Columns selected to decode a [`MergeTask`].
const TASK_COLUMNS: &str = "task_id, index_uid, scope_source_id, scope_partition_id, \
     scope_doc_mapping_uid, scope_node_id, split_ids, task_state, lease_owner, lease_expires_at, \
     attempts, max_attempts, output_split_ids, error, create_timestamp, update_timestamp, merge_kind, \
     merge_trigger, compaction_id";

/// The error recorded on tasks that a claim fails because their inputs changed.
const INPUTS_NOT_PUBLISHED: &str = "inputs no longer published";

/// A new task id: a ULID greater than every task id this process generated before.
pub(super) fn next_task_id() -> String {
    static GENERATOR: Mutex<ulid::Generator> = Mutex::new(ulid::Generator::new());
    let mut generator = GENERATOR.lock().unwrap_or_else(PoisonError::into_inner);
    match generator.generate() {
        Ok(ulid) => ulid.to_string(),
        // 2^80 ids within one millisecond: cannot happen; fall back to a plain ULID.
        Err(_) => ulid::Ulid::new().to_string(),
    }
}

/// `now + lease_secs`, saturating.
fn lease_end(now: i64, lease_secs: u64) -> i64 {
    now.saturating_add(i64::try_from(lease_secs).unwrap_or(i64::MAX))
}

fn task_not_found(task_id: &str) -> MetastoreError {
    MetastoreError::NotFound {
        kind: "merge task",
        id: task_id.to_string(),
    }
}

/// `FailedPrecondition` unless `task` is Running with lease owner `node_id`.
fn check_owner(task: &MergeTask, node_id: &str) -> MetastoreResult<()> {
    if task.state == MergeTaskState::Running && task.lease_owner.as_deref() == Some(node_id) {
        return Ok(());
    }
    let holder = match (&task.state, &task.lease_owner) {
        (MergeTaskState::Running, Some(owner)) => format!("Running, owned by `{owner}`"),
        (state, _) => state.as_str().to_string(),
    };
    Err(MetastoreError::FailedPrecondition(format!(
        "merge task `{}` is {holder}, not Running with owner `{node_id}`",
        task.task_id
    )))
}

/// `FailedPrecondition` if `split_ids` is empty or has duplicates, or the scope is another
/// index's.
fn check_new_task(index_uid: &IndexUid, task: &NewMergeTask) -> MetastoreResult<()> {
    if &task.scope.index_uid != index_uid {
        return Err(MetastoreError::FailedPrecondition(format!(
            "merge task of scope `{}` belongs to index `{}`, not `{index_uid}`",
            task.scope, task.scope.index_uid
        )));
    }
    if task.split_ids.is_empty() {
        return Err(MetastoreError::FailedPrecondition(format!(
            "merge task of scope `{}` has no splits",
            task.scope
        )));
    }
    let mut seen = BTreeSet::new();
    if let Some(split_id) = task.split_ids.iter().find(|id| !seen.insert(*id)) {
        return Err(MetastoreError::FailedPrecondition(format!(
            "merge task of scope `{}` lists split `{split_id}` twice",
            task.scope
        )));
    }
    Ok(())
}

impl<DB> SqlMetastore<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Decode<'q, DB>,
    for<'q> Option<String>: Encode<'q, DB> + Decode<'q, DB>,
    for<'a> &'a str: ColumnIndex<DB::Row>,
{
    /// Decodes a `merge_tasks` row selected with [`TASK_COLUMNS`].
    fn decode_task(row: &DB::Row) -> MetastoreResult<MergeTask> {
        let index_uid: String = row.try_get("index_uid")?;
        let split_ids: String = row.try_get("split_ids")?;
        let state: String = row.try_get("task_state")?;
        let kind: String = row.try_get("merge_kind")?;
        let trigger: String = row.try_get("merge_trigger")?;
        let output_split_ids: String = row.try_get("output_split_ids")?;
        let output_split_ids: Vec<SplitId> =
            serde_json::from_str(&output_split_ids).map_err(serde_err)?;
        let attempts: i64 = row.try_get("attempts")?;
        let max_attempts: i64 = row.try_get("max_attempts")?;
        let index_uid: IndexUid = index_uid.parse().map_err(serde_err)?;
        let partition_id: i64 = row.try_get("scope_partition_id")?;
        let scope = MergeScope {
            node_id: row.try_get("scope_node_id")?,
            index_uid: index_uid.clone(),
            source_id: row.try_get("scope_source_id")?,
            partition_id: from_db(partition_id),
            doc_mapping_uid: row.try_get("scope_doc_mapping_uid")?,
        };
        Ok(MergeTask {
            task_id: row.try_get("task_id")?,
            index_uid,
            scope,
            split_ids: serde_json::from_str(&split_ids).map_err(serde_err)?,
            kind: MergeKind::parse(&kind)
                .ok_or_else(|| serde_err(format!("unknown merge kind `{kind}`")))?,
            trigger: MergeTrigger::parse(&trigger)
                .ok_or_else(|| serde_err(format!("unknown merge trigger `{trigger}`")))?,
            compaction_id: row.try_get("compaction_id")?,
            state: MergeTaskState::parse(&state)
                .ok_or_else(|| serde_err(format!("unknown merge task state `{state}`")))?,
            lease_owner: row.try_get("lease_owner")?,
            lease_expires_at: row.try_get("lease_expires_at")?,
            attempts: u32::try_from(attempts).map_err(serde_err)?,
            max_attempts: u32::try_from(max_attempts).map_err(serde_err)?,
            output_split_id: output_split_ids.first().cloned(),
            output_split_ids,
            error: row.try_get("error")?,
            create_timestamp: row.try_get("create_timestamp")?,
            update_timestamp: row.try_get("update_timestamp")?,
        })
    }

    /// The task `task_id`, its row locked until commit (PostgreSQL); `NotFound` if none.
    async fn lock_task(conn: &mut DB::Connection, task_id: &str) -> MetastoreResult<MergeTask> {
        let sql = format!(
            "SELECT {TASK_COLUMNS} FROM merge_tasks WHERE task_id = $1{}",
            DB::FOR_UPDATE
        );
        let row = sqlx::query::<DB>(AssertSqlSafe(sql))
            .bind(task_id.to_string())
            .fetch_optional(&mut *conn)
            .await?;
        match row {
            Some(row) => Self::decode_task(&row),
            None => Err(task_not_found(task_id)),
        }
    }

    /// Which of `split_ids` are inputs of live tasks of `index_uid`.
    async fn live_task_splits(
        conn: &mut DB::Connection,
        index_uid: &IndexUid,
        split_ids: &[SplitId],
    ) -> MetastoreResult<BTreeSet<SplitId>> {
        let mut live = BTreeSet::new();
        for chunk in split_ids.chunks(IDS_PER_STATEMENT) {
            let sql = format!(
                "SELECT split_id FROM merge_task_splits WHERE index_uid = $1 AND split_id IN ({})",
                placeholders(2, chunk.len())
            );
            let mut query = sqlx::query::<DB>(AssertSqlSafe(sql)).bind(index_uid.to_string());
            for split_id in chunk {
                query = query.bind(split_id.clone());
            }
            for row in query.fetch_all(&mut *conn).await? {
                live.insert(row.try_get("split_id")?);
            }
        }
        Ok(live)
    }

    /// Inserts a new (Pending) task and its `merge_task_splits` rows.
    async fn insert_task(conn: &mut DB::Connection, task: &MergeTask) -> MetastoreResult<()> {
        let split_ids = serde_json::to_string(&task.split_ids).map_err(serde_err)?;
        let output_split_ids = serde_json::to_string(&task.output_split_ids).map_err(serde_err)?;
        sqlx::query::<DB>(
            "INSERT INTO merge_tasks (task_id, index_uid, scope_source_id, scope_partition_id, \
                 scope_doc_mapping_uid, scope_node_id, split_ids, task_state, lease_owner, \
                 lease_expires_at, attempts, max_attempts, output_split_ids, error, \
                 create_timestamp, update_timestamp, merge_kind, merge_trigger, compaction_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
                 $18, $19)",
        )
        .bind(task.task_id.clone())
        .bind(task.index_uid.to_string())
        .bind(task.scope.source_id.clone())
        .bind(to_db(task.scope.partition_id))
        .bind(task.scope.doc_mapping_uid.clone())
        .bind(task.scope.node_id.clone())
        .bind(split_ids)
        .bind(task.state.as_str().to_string())
        .bind(task.lease_owner.clone())
        .bind(task.lease_expires_at)
        .bind(i64::from(task.attempts))
        .bind(i64::from(task.max_attempts))
        .bind(output_split_ids)
        .bind(task.error.clone())
        .bind(task.create_timestamp)
        .bind(task.update_timestamp)
        .bind(task.kind.as_str().to_string())
        .bind(task.trigger.as_str().to_string())
        .bind(task.compaction_id.clone())
        .execute(&mut *conn)
        .await?;
        // Three parameters per row: stay well below the parameter limits.
        for chunk in task.split_ids.chunks(IDS_PER_STATEMENT / 2) {
            let values = (0..chunk.len())
                .map(|i| format!("($1, ${}, $2)", i + 3))
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "INSERT INTO merge_task_splits (index_uid, split_id, task_id) VALUES {values}"
            );
            let mut query = sqlx::query::<DB>(AssertSqlSafe(sql))
                .bind(task.index_uid.to_string())
                .bind(task.task_id.clone());
            for split_id in chunk {
                query = query.bind(split_id.clone());
            }
            query.execute(&mut *conn).await?;
        }
        Ok(())
    }

    /// Releases the inputs of a task that is no longer live.
    async fn release_splits(conn: &mut DB::Connection, task_id: &str) -> MetastoreResult<()> {
        sqlx::query::<DB>("DELETE FROM merge_task_splits WHERE task_id = $1")
            .bind(task_id.to_string())
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// Marks `task` (locked) Failed with `error`, and releases its inputs.
    async fn fail_locked_task(
        conn: &mut DB::Connection,
        task: &mut MergeTask,
        error: String,
        now: i64,
    ) -> MetastoreResult<()> {
        sqlx::query::<DB>(
            "UPDATE merge_tasks SET task_state = 'Failed', lease_expires_at = NULL, error = $2, \
                 update_timestamp = $3 \
             WHERE task_id = $1",
        )
        .bind(task.task_id.clone())
        .bind(error.clone())
        .bind(now)
        .execute(&mut *conn)
        .await?;
        Self::release_splits(conn, &task.task_id).await?;
        task.state = MergeTaskState::Failed;
        task.lease_expires_at = None;
        task.error = Some(error);
        task.update_timestamp = now;
        Ok(())
    }

    /// See [`crate::Metastore::create_merge_tasks`].
    pub(super) async fn insert_merge_tasks(
        &self,
        index_uid: &IndexUid,
        tasks: Vec<NewMergeTask>,
        max_attempts: u32,
    ) -> MetastoreResult<Vec<MergeTask>> {
        if max_attempts == 0 {
            return Err(MetastoreError::FailedPrecondition(
                "merge tasks need max_attempts >= 1".to_string(),
            ));
        }
        for task in &tasks {
            check_new_task(index_uid, task)?;
        }
        let now = shale_types::now_unix_secs();
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            Self::lock_index(&mut write.tx, index_uid).await?;
            let all_ids: Vec<SplitId> = tasks
                .iter()
                .flat_map(|task| task.split_ids.iter().cloned())
                .collect();
            let states = Self::split_states(&mut write.tx, index_uid, &all_ids, true).await?;
            let mut taken = Self::live_task_splits(&mut write.tx, index_uid, &all_ids).await?;
            let mut created = Vec::new();
            for new_task in tasks {
                let unavailable = new_task.split_ids.iter().find(|split_id| {
                    taken.contains(*split_id)
                        || states.get(*split_id) != Some(&SplitState::Published)
                });
                if let Some(split_id) = unavailable {
                    tracing::debug!(
                        index_uid = %index_uid,
                        scope = %new_task.scope,
                        split_id = %split_id,
                        "merge task skipped: split not Published or already in a live task"
                    );
                    continue;
                }
                let task = MergeTask {
                    task_id: next_task_id(),
                    index_uid: index_uid.clone(),
                    scope: new_task.scope,
                    split_ids: new_task.split_ids,
                    kind: new_task.kind,
                    trigger: new_task.trigger,
                    compaction_id: new_task.compaction_id,
                    state: MergeTaskState::Pending,
                    lease_owner: None,
                    lease_expires_at: None,
                    attempts: 0,
                    max_attempts,
                    output_split_id: None,
                    output_split_ids: Vec::new(),
                    error: None,
                    create_timestamp: now,
                    update_timestamp: now,
                };
                Self::insert_task(&mut write.tx, &task).await?;
                taken.extend(task.split_ids.iter().cloned());
                created.push(task);
            }
            Ok(created)
        }
        .await;
        write.finish(result).await
    }

    /// See [`crate::Metastore::claim_merge_task`].
    pub(super) async fn claim_next_merge_task(
        &self,
        node_id: &str,
        lease_secs: u64,
        now: i64,
        index_uid: Option<&IndexUid>,
        scope_node: Option<&str>,
        manual_only: bool,
    ) -> MetastoreResult<Option<MergeTask>> {
        let mut filters = String::new();
        let mut next_param = 2;
        if index_uid.is_some() {
            filters.push_str(&format!(" AND index_uid = ${next_param}"));
            next_param += 1;
        }
        if scope_node.is_some() {
            filters.push_str(&format!(" AND scope_node_id = ${next_param}"));
        }
        if manual_only {
            filters.push_str(" AND compaction_id IS NOT NULL");
        }
        let sql = format!(
            "SELECT {TASK_COLUMNS} FROM merge_tasks \
             WHERE (task_state = 'Pending' \
                 OR (task_state = 'Running' AND lease_expires_at <= $1)){filters} \
             ORDER BY task_id LIMIT 1{}",
            DB::FOR_UPDATE_SKIP_LOCKED
        );
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            loop {
                let mut query = sqlx::query::<DB>(AssertSqlSafe(sql.clone())).bind(now);
                if let Some(index_uid) = index_uid {
                    query = query.bind(index_uid.to_string());
                }
                if let Some(node) = scope_node {
                    query = query.bind(node.to_string());
                }
                let Some(row) = query.fetch_optional(&mut *write.tx).await? else {
                    return Ok(None);
                };
                let mut task = Self::decode_task(&row)?;
                if task.attempts >= task.max_attempts {
                    let error = match &task.error {
                        Some(last) => format!(
                            "gave up after {} attempts (max_attempts reached); last error: {last}",
                            task.attempts
                        ),
                        None => format!(
                            "gave up after {} attempts (max_attempts reached)",
                            task.attempts
                        ),
                    };
                    tracing::info!(task_id = %task.task_id, "{error}");
                    Self::fail_locked_task(&mut write.tx, &mut task, error, now).await?;
                    continue;
                }
                // Not locked: see the module docs. `publish_merge` checks again.
                let states =
                    Self::split_states(&mut write.tx, &task.index_uid, &task.split_ids, false)
                        .await?;
                let gone: Vec<&str> = task
                    .split_ids
                    .iter()
                    .filter(|split_id| states.get(*split_id) != Some(&SplitState::Published))
                    .map(String::as_str)
                    .collect();
                if !gone.is_empty() {
                    tracing::info!(
                        task_id = %task.task_id,
                        splits = %gone.join(","),
                        "merge task failed: {INPUTS_NOT_PUBLISHED}"
                    );
                    let error = format!("{INPUTS_NOT_PUBLISHED}: {}", gone.join(", "));
                    Self::fail_locked_task(&mut write.tx, &mut task, error, now).await?;
                    continue;
                }
                task.state = MergeTaskState::Running;
                task.lease_owner = Some(node_id.to_string());
                task.lease_expires_at = Some(lease_end(now, lease_secs));
                task.attempts += 1;
                task.update_timestamp = now;
                sqlx::query::<DB>(
                    "UPDATE merge_tasks SET task_state = 'Running', lease_owner = $2, \
                         lease_expires_at = $3, attempts = $4, update_timestamp = $5 \
                     WHERE task_id = $1",
                )
                .bind(task.task_id.clone())
                .bind(task.lease_owner.clone())
                .bind(task.lease_expires_at)
                .bind(i64::from(task.attempts))
                .bind(now)
                .execute(&mut *write.tx)
                .await?;
                return Ok(Some(task));
            }
        }
        .await;
        write.finish(result).await
    }

    /// See [`crate::Metastore::renew_merge_task_lease`].
    pub(super) async fn renew_lease(
        &self,
        task_id: &str,
        node_id: &str,
        lease_secs: u64,
        now: i64,
    ) -> MetastoreResult<()> {
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let task = Self::lock_task(&mut write.tx, task_id).await?;
            check_owner(&task, node_id)?;
            sqlx::query::<DB>(
                "UPDATE merge_tasks SET lease_expires_at = $2, update_timestamp = $3 \
                 WHERE task_id = $1",
            )
            .bind(task_id.to_string())
            .bind(lease_end(now, lease_secs))
            .bind(now)
            .execute(&mut *write.tx)
            .await?;
            Ok(())
        }
        .await;
        write.finish(result).await
    }

    /// See [`crate::Metastore::publish_merge`].
    pub(super) async fn publish_merge_output(
        &self,
        index_uid: &IndexUid,
        task_id: &str,
        node_id: &str,
        output: &[SplitId],
        replaced: &[SplitId],
        now: i64,
    ) -> MetastoreResult<()> {
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let version = Self::lock_index(&mut write.tx, index_uid).await?;
            let task = Self::lock_task(&mut write.tx, task_id).await?;
            if task.index_uid != *index_uid {
                return Err(MetastoreError::FailedPrecondition(format!(
                    "merge task `{task_id}` belongs to index `{}`, not `{index_uid}`",
                    task.index_uid
                )));
            }
            check_owner(&task, node_id)?;
            let inputs: BTreeSet<&SplitId> = task.split_ids.iter().collect();
            if replaced.iter().collect::<BTreeSet<_>>() != inputs {
                return Err(MetastoreError::FailedPrecondition(format!(
                    "the replaced splits must be the inputs of merge task `{task_id}`: {}",
                    task.split_ids.join(", ")
                )));
            }
            Self::publish_locked(
                &mut write.tx,
                index_uid,
                output,
                replaced,
                None,
                now,
                version,
            )
            .await?;
            let output_split_ids = serde_json::to_string(output).map_err(serde_err)?;
            sqlx::query::<DB>(
                "UPDATE merge_tasks SET task_state = 'Succeeded', lease_expires_at = NULL, \
                     output_split_ids = $2, update_timestamp = $3 \
                 WHERE task_id = $1",
            )
            .bind(task_id.to_string())
            .bind(output_split_ids)
            .bind(now)
            .execute(&mut *write.tx)
            .await?;
            Self::release_splits(&mut write.tx, task_id).await?;
            Ok(())
        }
        .await;
        write.finish(result).await
    }

    /// See [`crate::Metastore::fail_merge_task`].
    pub(super) async fn fail_task(
        &self,
        task_id: &str,
        node_id: &str,
        error: &str,
        retry: bool,
        now: i64,
    ) -> MetastoreResult<MergeTask> {
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let mut task = Self::lock_task(&mut write.tx, task_id).await?;
            check_owner(&task, node_id)?;
            if retry && task.attempts < task.max_attempts {
                sqlx::query::<DB>(
                    "UPDATE merge_tasks SET task_state = 'Pending', lease_owner = NULL, \
                         lease_expires_at = NULL, error = $2, update_timestamp = $3 \
                     WHERE task_id = $1",
                )
                .bind(task_id.to_string())
                .bind(error.to_string())
                .bind(now)
                .execute(&mut *write.tx)
                .await?;
                task.state = MergeTaskState::Pending;
                task.lease_owner = None;
                task.lease_expires_at = None;
                task.error = Some(error.to_string());
                task.update_timestamp = now;
            } else {
                Self::fail_locked_task(&mut write.tx, &mut task, error.to_string(), now).await?;
            }
            Ok(task)
        }
        .await;
        write.finish(result).await
    }

    /// See [`crate::Metastore::release_merge_tasks`].
    pub(super) async fn release_tasks(
        &self,
        task_ids: &[String],
        reason: &str,
        now: i64,
    ) -> MetastoreResult<Vec<String>> {
        let mut sorted: Vec<&String> = task_ids.iter().collect();
        sorted.sort();
        sorted.dedup();
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let mut released = Vec::new();
            for task_id in sorted {
                let mut task = match Self::lock_task(&mut write.tx, task_id).await {
                    Ok(task) => task,
                    Err(MetastoreError::NotFound { .. }) => continue,
                    Err(err) => return Err(err),
                };
                let claimable = task.state == MergeTaskState::Pending
                    || (task.state == MergeTaskState::Running
                        && task.lease_expires_at.is_some_and(|end| end <= now));
                if !claimable {
                    continue;
                }
                Self::fail_locked_task(&mut write.tx, &mut task, reason.to_string(), now).await?;
                released.push(task.task_id);
            }
            Ok(released)
        }
        .await;
        write.finish(result).await
    }

    /// See [`crate::Metastore::requeue_merge_tasks`].
    pub(super) async fn requeue_tasks_of(
        &self,
        lease_owners: &[String],
        now: i64,
    ) -> MetastoreResult<Vec<String>> {
        if lease_owners.is_empty() {
            return Ok(Vec::new());
        }
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let sql = format!(
                "SELECT task_id, lease_owner FROM merge_tasks WHERE task_state = 'Running' \
                 AND lease_owner IN ({}) ORDER BY task_id{}",
                placeholders(1, lease_owners.len()),
                DB::FOR_UPDATE
            );
            let mut query = sqlx::query::<DB>(AssertSqlSafe(sql));
            for owner in lease_owners {
                query = query.bind(owner.clone());
            }
            let mut requeued = Vec::new();
            for row in query.fetch_all(&mut *write.tx).await? {
                let task_id: String = row.try_get("task_id")?;
                let owner: String = row.try_get("lease_owner")?;
                sqlx::query::<DB>(
                    "UPDATE merge_tasks SET task_state = 'Pending', lease_owner = NULL, \
                         lease_expires_at = NULL, error = $2, update_timestamp = $3 \
                     WHERE task_id = $1",
                )
                .bind(task_id.clone())
                .bind(format!("requeued: its worker {owner} was declared dead"))
                .bind(now)
                .execute(&mut *write.tx)
                .await?;
                requeued.push(task_id);
            }
            Ok(requeued)
        }
        .await;
        write.finish(result).await
    }

    /// See [`crate::Metastore::list_merge_tasks`].
    pub(super) async fn select_merge_tasks(
        &self,
        index_uid: Option<&IndexUid>,
        states: &[MergeTaskState],
        limit: Option<usize>,
    ) -> MetastoreResult<Vec<MergeTask>> {
        let mut sql = format!("SELECT {TASK_COLUMNS} FROM merge_tasks WHERE 1 = 1");
        let mut binds = Vec::new();
        if let Some(index_uid) = index_uid {
            binds.push(Bind::Text(index_uid.to_string()));
            sql.push_str(&format!(" AND index_uid = ${}", binds.len()));
        }
        if !states.is_empty() {
            let first = binds.len() + 1;
            binds.extend(
                states
                    .iter()
                    .map(|state| Bind::Text(state.as_str().to_string())),
            );
            sql.push_str(&format!(
                " AND task_state IN ({})",
                placeholders(first, states.len())
            ));
        }
        sql.push_str(" ORDER BY task_id DESC");
        if let Some(limit) = limit {
            binds.push(Bind::Int(i64::try_from(limit).unwrap_or(i64::MAX)));
            sql.push_str(&format!(" LIMIT ${}", binds.len()));
        }
        let rows = Self::bind_all(sqlx::query::<DB>(AssertSqlSafe(sql)), binds)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(Self::decode_task).collect()
    }

    /// See [`crate::Metastore::delete_merge_tasks`].
    pub(super) async fn delete_finished_merge_tasks(
        &self,
        finished_before: i64,
    ) -> MetastoreResult<usize> {
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            // Finished tasks hold no `merge_task_splits` rows.
            let result = sqlx::query::<DB>(
                "DELETE FROM merge_tasks \
                 WHERE task_state IN ('Succeeded', 'Failed') AND update_timestamp < $1",
            )
            .bind(finished_before)
            .execute(&mut *write.tx)
            .await?;
            Ok(usize::try_from(DB::rows_affected(&result)).unwrap_or(usize::MAX))
        }
        .await;
        write.finish(result).await
    }
}
