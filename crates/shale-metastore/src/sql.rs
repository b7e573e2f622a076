//! The SQL implementation of [`Metastore`], written once and shared by the SQLite and
//! PostgreSQL backends. What differs between the two lives in [`Dialect`]: how a write
//! transaction starts, how rows are locked, and how many rows a statement changed.
//!
//! Concurrency: every write transaction first reads (PostgreSQL: locks, with
//! `SELECT … FOR UPDATE`) the index row, then the split rows it changes, in split id order.
//! Writes to one index are therefore serialized, which is what makes `publish_splits`
//! (state checks + checkpoint check + updates) atomic under concurrency. SQLite has one writer
//! at a time anyway (`BEGIN IMMEDIATE`, plus an in-process mutex so that writers queue instead
//! of polling the busy handler). Merge tasks (module `merge_tasks`) add the task row to the
//! lock order: index row, then task row, then split rows; claimers lock only task rows.
//! Write transactions end through `WriteTx::finish`, which rolls back right away on error so
//! that no row stays locked after a failed call.
//!
//! Unsigned 64-bit values (partition ids, positions, counters) are stored bit-for-bit in
//! signed 64-bit columns ([`to_db`], [`from_db`]): equality filters work for every value,
//! ordering only below 2^63.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use shale_config::{IndexConfig, IndexTemplate};
use shale_types::{
    CheckpointDelta, DeleteQuery, DeleteTask, IndexUid, MetricMetadata, SourceCheckpoint, SourceId,
    Split, SplitId, SplitMetadata, SplitState,
};
use sqlx::pool::PoolConnection;
use sqlx::query::Query;
use sqlx::{
    AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Row, Type,
};
use tokio::sync::{Mutex, MutexGuard};

use crate::{
    Compaction, CompactionRequest, CompactionState, Fence, IndexMetadata, Lease, ListSplitsQuery,
    MergeTask, MergeTaskState, Metastore, MetastoreError, MetastoreResult, NewMergeTask,
    NodeIdentity, NodeRecord, Shard, ShardKey, SplitStats,
};

/// Split ids bound per statement, well below SQLite's and PostgreSQL's parameter limits.
const IDS_PER_STATEMENT: usize = 500;

mod cluster;
mod compactions;
mod delete_tasks;
mod merge_tasks;
mod metric_metadata;
mod templates;
pub(crate) mod versions;

mod sealed {
    pub trait Sealed {}
    impl Sealed for sqlx::Sqlite {}
    impl Sealed for sqlx::Postgres {}
}

/// What differs between the SQL databases the metastore runs on (sealed: SQLite, PostgreSQL).
pub trait Dialect: Database + sealed::Sealed {
    /// Statement opening a write transaction.
    const BEGIN_WRITE: &'static str;
    /// Suffix of a `SELECT` that keeps the selected rows from changing until commit, without
    /// blocking other readers (empty when the transaction holds the single write lock).
    const FOR_SHARE: &'static str;
    /// Suffix of a `SELECT` that locks the selected rows until commit (empty when the
    /// transaction already holds the database's single write lock).
    const FOR_UPDATE: &'static str;
    /// Like [`Dialect::FOR_UPDATE`], but rows locked by other transactions are skipped
    /// instead of waited for (concurrent merge task claimers).
    const FOR_UPDATE_SKIP_LOCKED: &'static str;
    /// Statement opening a read-only transaction whose reads all see one snapshot.
    const BEGIN_SNAPSHOT: &'static str;
    /// An expression of the database's clock, in ms since the epoch (a 64-bit integer).
    const NOW_MS: &'static str;
    /// Number of rows a statement inserted, updated or deleted.
    fn rows_affected(result: &Self::QueryResult) -> u64;
}

/// A [`Metastore`] backed by the SQL database `DB`; see [`crate::SqliteMetastore`] and
/// [`crate::PostgresMetastore`].
pub struct SqlMetastore<DB: Dialect> {
    pool: Pool<DB>,
    /// Serializes this process's write transactions (SQLite only).
    write_lock: Option<Arc<Mutex<()>>>,
    /// Checked by every write transaction of this handle (see [`Metastore::with_fence`]).
    fence: Option<Fence>,
    /// Index versions kept between writes while this process writes alone (SQLite).
    versions: Option<Arc<versions::VersionCache>>,
}

impl<DB: Dialect> Clone for SqlMetastore<DB> {
    fn clone(&self) -> Self {
        SqlMetastore {
            pool: self.pool.clone(),
            write_lock: self.write_lock.clone(),
            fence: self.fence.clone(),
            versions: self.versions.clone(),
        }
    }
}

impl<DB: Dialect> std::fmt::Debug for SqlMetastore<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlMetastore")
            .field("backend", &<DB as Database>::NAME)
            .finish_non_exhaustive()
    }
}

/// A transaction on a connection of the pool, holding the in-process write lock (if any)
/// until it ends.
///
/// Transactions are begun and ended with plain `BEGIN`/`COMMIT`/`ROLLBACK` statements rather
/// than sqlx's `Transaction`: when a `COMMIT` fails (SQLite's `SQLITE_FULL` on a full disk),
/// sqlx leaves the connection's transaction depth raised and hands the connection back to the
/// pool, where every later `begin` then fails — the node would need a restart. Here a
/// connection whose transaction could not be ended cleanly (or that is dropped mid-way, by an
/// error path or a cancelled call) is closed instead of being reused: SQLite and PostgreSQL
/// roll back what it held, and the pool opens a fresh one.
struct WriteTx<'a, DB: Database> {
    // Declared first so that it is dropped (closed if need be) before the lock is released.
    tx: PoolConnection<DB>,
    /// Whether the transaction ended cleanly (committed or rolled back).
    ended: bool,
    _guard: Option<MutexGuard<'a, ()>>,
    /// Told when this write transaction ends.
    versions: Option<&'a versions::VersionCache>,
}

impl<DB> WriteTx<'_, DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    /// Begins a transaction with `begin` on a connection of `pool`.
    async fn begin<'a>(
        pool: &Pool<DB>,
        begin: &'static str,
        guard: Option<MutexGuard<'a, ()>>,
    ) -> MetastoreResult<WriteTx<'a, DB>> {
        let mut conn = pool.acquire().await?;
        if let Err(err) = sqlx::raw_sql(begin).execute(&mut *conn).await {
            conn.close_on_drop();
            return Err(err.into());
        }
        Ok(WriteTx {
            tx: conn,
            ended: false,
            _guard: guard,
            versions: None,
        })
    }

    /// Ends the transaction: commits on `Ok`, rolls back on `Err`. The rollback is awaited,
    /// so row locks are released before the call returns: a claimer skipping locked rows must
    /// not miss a task because a failed call still holds it.
    async fn finish<T>(mut self, result: MetastoreResult<T>) -> MetastoreResult<T> {
        match result {
            Ok(value) => match sqlx::raw_sql("COMMIT").execute(&mut *self.tx).await {
                Ok(_) => {
                    self.ended = true;
                    Ok(value)
                }
                Err(err) => {
                    self.rollback().await;
                    Err(err.into())
                }
            },
            Err(err) => {
                self.rollback().await;
                Err(err)
            }
        }
    }

    async fn rollback(&mut self) {
        match sqlx::raw_sql("ROLLBACK").execute(&mut *self.tx).await {
            Ok(_) => self.ended = true,
            Err(err) => {
                tracing::warn!(error = %err, "metastore rollback failed; the connection is dropped")
            }
        }
    }
}

impl<DB: Database> Drop for WriteTx<'_, DB> {
    fn drop(&mut self) {
        if !self.ended {
            self.tx.close_on_drop();
        }
        if let Some(versions) = self.versions {
            versions.write_ended(!self.ended);
        }
    }
}

/// A value bound to a dynamically built statement.
enum Bind {
    Int(i64),
    Text(String),
}

/// Stores a `u64` bit-for-bit in a signed 64-bit column.
pub(crate) fn to_db(value: u64) -> i64 {
    value as i64
}

/// Reads back a `u64` stored by [`to_db`].
pub(crate) fn from_db(value: i64) -> u64 {
    value as u64
}

/// `$first, $first+1, …` for `count` parameters.
fn placeholders(first: usize, count: usize) -> String {
    (first..first + count)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn serde_err(err: impl std::fmt::Display) -> MetastoreError {
    MetastoreError::Serde(err.to_string())
}

fn index_not_found(index_uid: &IndexUid) -> MetastoreError {
    MetastoreError::NotFound {
        kind: "index",
        id: index_uid.to_string(),
    }
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
    /// Wraps a pool whose schema is up to date.
    pub(crate) fn from_pool(pool: Pool<DB>, serialize_writes: bool) -> Self {
        SqlMetastore {
            pool,
            write_lock: serialize_writes.then(|| Arc::new(Mutex::new(()))),
            fence: None,
            versions: None,
        }
    }

    /// Answers index versions from memory while `alone` says every write to the database
    /// goes through this handle and its clones (see [`versions`]).
    pub(crate) fn with_version_cache(mut self, alone: versions::Alone) -> Self {
        self.versions = Some(Arc::new(versions::VersionCache::new(alone)));
        self
    }

    /// Closes the connection pool; the metastore must not be used afterwards.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    async fn begin_write(&self) -> MetastoreResult<WriteTx<'_, DB>> {
        let guard = match &self.write_lock {
            Some(lock) => Some(lock.lock().await),
            None => None,
        };
        let mut write = WriteTx::begin(&self.pool, DB::BEGIN_WRITE, guard).await?;
        write.versions = self.versions.as_deref();
        if let Some(fence) = &self.fence {
            if let Err(err) = Self::check_fence(&mut write.tx, fence).await {
                return write.finish(Err(err)).await;
            }
        }
        Ok(write)
    }

    fn bind_all<'q>(
        mut query: Query<'q, DB, DB::Arguments>,
        binds: Vec<Bind>,
    ) -> Query<'q, DB, DB::Arguments> {
        for bind in binds {
            query = match bind {
                Bind::Int(value) => query.bind(value),
                Bind::Text(value) => query.bind(value),
            };
        }
        query
    }

    /// Checks the index exists, locks its row until commit (PostgreSQL; SQLite's write
    /// transactions are exclusive) and raises its version: every write that touches an index
    /// goes through here, so a reader that sees the same version twice saw the same index
    /// ([`Metastore::index_version`]). Returns the new version: the transaction records it
    /// on every split row it writes (`update_version`), so a reader can fetch only the rows
    /// written after a version it saw ([`Metastore::index_changes`]).
    async fn lock_index(conn: &mut DB::Connection, index_uid: &IndexUid) -> MetastoreResult<i64> {
        let row = sqlx::query::<DB>(
            "UPDATE indexes SET version = version + 1 WHERE index_uid = $1 RETURNING version",
        )
        .bind(index_uid.to_string())
        .fetch_optional(&mut *conn)
        .await?;
        match row {
            Some(row) => Ok(row.try_get::<i64, _>("version")?),
            None => Err(index_not_found(index_uid)),
        }
    }

    /// The index's uid and version, read from the database.
    async fn read_index_version(&self, index_id: &str) -> MetastoreResult<crate::IndexVersion> {
        let row = sqlx::query::<DB>("SELECT index_uid, version FROM indexes WHERE index_id = $1")
            .bind(index_id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => Ok(crate::IndexVersion {
                index_uid: row
                    .try_get::<String, _>("index_uid")?
                    .parse()
                    .map_err(serde_err)?,
                version: from_db(row.try_get::<i64, _>("version")?),
            }),
            None => Err(MetastoreError::NotFound {
                kind: "index",
                id: index_id.to_string(),
            }),
        }
    }

    /// The states of the splits of `index_uid` among `split_ids`; with `lock`, their rows
    /// are locked until commit (PostgreSQL), in split id order.
    async fn split_states(
        conn: &mut DB::Connection,
        index_uid: &IndexUid,
        split_ids: &[SplitId],
        lock: bool,
    ) -> MetastoreResult<BTreeMap<SplitId, SplitState>> {
        let mut sorted: Vec<&SplitId> = split_ids.iter().collect();
        sorted.sort();
        sorted.dedup();
        let mut states = BTreeMap::new();
        for chunk in sorted.chunks(IDS_PER_STATEMENT) {
            let sql = format!(
                "SELECT split_id, split_state FROM splits \
                 WHERE index_uid = $1 AND split_id IN ({}) ORDER BY split_id{}",
                placeholders(2, chunk.len()),
                if lock { DB::FOR_UPDATE } else { "" }
            );
            let mut query = sqlx::query::<DB>(AssertSqlSafe(sql)).bind(index_uid.to_string());
            for split_id in chunk {
                query = query.bind(split_id.to_string());
            }
            for row in query.fetch_all(&mut *conn).await? {
                let split_id: String = row.try_get("split_id")?;
                let state: String = row.try_get("split_state")?;
                let state = SplitState::parse(&state)
                    .ok_or_else(|| serde_err(format!("unknown split state `{state}`")))?;
                states.insert(split_id, state);
            }
        }
        Ok(states)
    }

    /// Sets the state (and update timestamp, and publish timestamp when publishing) of the
    /// splits of `index_uid` among `split_ids` that are in another state, recording the
    /// index `version` of the transaction on them.
    async fn set_split_states(
        conn: &mut DB::Connection,
        index_uid: &IndexUid,
        split_ids: &[SplitId],
        state: SplitState,
        now: i64,
        version: i64,
    ) -> MetastoreResult<()> {
        let publish = if state == SplitState::Published {
            ", publish_timestamp = $3"
        } else {
            ""
        };
        for chunk in split_ids.chunks(IDS_PER_STATEMENT) {
            let sql = format!(
                "UPDATE splits SET split_state = $2, update_timestamp = $3, \
                     update_version = $4{publish} \
                 WHERE index_uid = $1 AND split_state <> $2 AND split_id IN ({})",
                placeholders(5, chunk.len())
            );
            let mut query = sqlx::query::<DB>(AssertSqlSafe(sql))
                .bind(index_uid.to_string())
                .bind(state.as_str().to_string())
                .bind(now)
                .bind(version);
            for split_id in chunk {
                query = query.bind(split_id.clone());
            }
            query.execute(&mut *conn).await?;
        }
        Ok(())
    }

    /// The checkpoints of every source of `index_uid`.
    async fn load_checkpoints(
        conn: &mut DB::Connection,
        index_uid: &IndexUid,
    ) -> MetastoreResult<BTreeMap<SourceId, SourceCheckpoint>> {
        let rows = sqlx::query::<DB>(
            "SELECT index_uid, source_id, partition_id, position FROM checkpoints \
             WHERE index_uid = $1",
        )
        .bind(index_uid.to_string())
        .fetch_all(&mut *conn)
        .await?;
        let mut checkpoints = Self::group_checkpoints(&rows)?;
        Ok(checkpoints
            .remove(&index_uid.to_string())
            .unwrap_or_default())
    }

    /// Groups `checkpoints` rows by index uid, then source.
    fn group_checkpoints(
        rows: &[DB::Row],
    ) -> MetastoreResult<BTreeMap<String, BTreeMap<SourceId, SourceCheckpoint>>> {
        let mut checkpoints: BTreeMap<String, BTreeMap<SourceId, SourceCheckpoint>> =
            BTreeMap::new();
        for row in rows {
            let index_uid: String = row.try_get("index_uid")?;
            let source_id: String = row.try_get("source_id")?;
            let partition_id: String = row.try_get("partition_id")?;
            let position: i64 = row.try_get("position")?;
            checkpoints
                .entry(index_uid)
                .or_default()
                .entry(source_id)
                .or_default()
                .per_partition
                .insert(partition_id, from_db(position));
        }
        Ok(checkpoints)
    }

    /// Decodes an `indexes` row (checkpoints are filled in by the caller).
    fn decode_index(row: &DB::Row) -> MetastoreResult<IndexMetadata> {
        let index_uid: String = row.try_get("index_uid")?;
        let config_json: String = row.try_get("index_config_json")?;
        let create_timestamp: i64 = row.try_get("create_timestamp")?;
        Ok(IndexMetadata {
            index_uid: index_uid.parse().map_err(serde_err)?,
            index_config: IndexConfig::from_stored_json(&config_json).map_err(serde_err)?,
            checkpoints: BTreeMap::new(),
            create_timestamp,
        })
    }

    /// Loads one index, by id or by uid.
    async fn load_index(
        conn: &mut DB::Connection,
        index_id: Option<&str>,
        index_uid: Option<&IndexUid>,
    ) -> MetastoreResult<Option<IndexMetadata>> {
        let query = match (index_id, index_uid) {
            (_, Some(index_uid)) => sqlx::query::<DB>(
                "SELECT index_uid, index_config_json, create_timestamp FROM indexes \
                 WHERE index_uid = $1",
            )
            .bind(index_uid.to_string()),
            (Some(index_id), None) => sqlx::query::<DB>(
                "SELECT index_uid, index_config_json, create_timestamp FROM indexes \
                 WHERE index_id = $1",
            )
            .bind(index_id.to_string()),
            (None, None) => return Ok(None),
        };
        let Some(row) = query.fetch_optional(&mut *conn).await? else {
            return Ok(None);
        };
        let mut index = Self::decode_index(&row)?;
        index.checkpoints = Self::load_checkpoints(conn, &index.index_uid).await?;
        Ok(Some(index))
    }

    /// Records the doc mapping version of `config` (its uid, the config of the day), once.
    async fn insert_doc_mapping_version(
        conn: &mut DB::Connection,
        index_uid: &IndexUid,
        config: &IndexConfig,
        now: i64,
    ) -> MetastoreResult<()> {
        let config_json = serde_json::to_string(config).map_err(serde_err)?;
        sqlx::query::<DB>(
            "INSERT INTO doc_mappings (index_uid, doc_mapping_uid, index_config_json, \
             create_timestamp) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (index_uid, doc_mapping_uid) DO NOTHING",
        )
        .bind(index_uid.to_string())
        .bind(config.doc_mapping.doc_mapping_uid.clone())
        .bind(config_json)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Decodes a `splits` row selected with [`SPLIT_COLUMNS`].
    fn decode_split(row: &DB::Row) -> MetastoreResult<Split> {
        let state: String = row.try_get("split_state")?;
        let split_state = SplitState::parse(&state)
            .ok_or_else(|| serde_err(format!("unknown split state `{state}`")))?;
        let metadata_json: String = row.try_get("split_metadata_json")?;
        Ok(Split {
            split_state,
            update_timestamp: row.try_get("update_timestamp")?,
            publish_timestamp: row.try_get("publish_timestamp")?,
            split_metadata: serde_json::from_str(&metadata_json).map_err(serde_err)?,
        })
    }

    /// Inserts `split` as Staged, or updates it if it is Staged already, at index
    /// `version`. Returns whether a row was written (not: the split exists in another state
    /// or index).
    async fn upsert_staged_split(
        conn: &mut DB::Connection,
        split: &SplitMetadata,
        now: i64,
        version: i64,
    ) -> MetastoreResult<bool> {
        let tags = serde_json::to_string(&split.tags).map_err(serde_err)?;
        let metadata_json = serde_json::to_string(split).map_err(serde_err)?;
        let result = sqlx::query::<DB>(
            "INSERT INTO splits (split_id, index_uid, source_id, node_id, partition_id, \
                 doc_mapping_uid, split_state, num_docs, size_bytes, time_range_start, \
                 time_range_end, tags, create_timestamp, update_timestamp, publish_timestamp, \
                 maturity_timestamp, num_merge_ops, delete_opstamp, split_metadata_json, \
                 update_version) \
             VALUES ($1, $2, $3, $4, $5, $6, 'Staged', $7, $8, $9, $10, $11, $12, $13, NULL, \
                 $14, $15, $16, $17, $18) \
             ON CONFLICT (split_id) DO UPDATE SET \
                 source_id = excluded.source_id, node_id = excluded.node_id, \
                 partition_id = excluded.partition_id, \
                 doc_mapping_uid = excluded.doc_mapping_uid, num_docs = excluded.num_docs, \
                 size_bytes = excluded.size_bytes, \
                 time_range_start = excluded.time_range_start, \
                 time_range_end = excluded.time_range_end, tags = excluded.tags, \
                 create_timestamp = excluded.create_timestamp, \
                 update_timestamp = excluded.update_timestamp, \
                 maturity_timestamp = excluded.maturity_timestamp, \
                 num_merge_ops = excluded.num_merge_ops, \
                 delete_opstamp = excluded.delete_opstamp, \
                 split_metadata_json = excluded.split_metadata_json, \
                 update_version = excluded.update_version \
             WHERE splits.split_state = 'Staged' AND splits.index_uid = excluded.index_uid",
        )
        .bind(split.split_id.clone())
        .bind(split.index_uid.to_string())
        .bind(split.source_id.clone())
        .bind(split.node_id.clone())
        .bind(to_db(split.partition_id))
        .bind(split.doc_mapping_uid.clone())
        .bind(to_db(split.num_docs))
        .bind(to_db(split.size_bytes))
        .bind(split.time_range.map(|r| r.start))
        .bind(split.time_range.map(|r| r.end))
        .bind(tags)
        .bind(split.create_timestamp)
        .bind(now)
        .bind(split.maturity_timestamp())
        .bind(i64::from(split.num_merge_ops))
        .bind(to_db(split.delete_opstamp))
        .bind(metadata_json)
        .bind(version)
        .execute(&mut *conn)
        .await?;
        Ok(DB::rows_affected(&result) > 0)
    }

    /// The body of [`Metastore::publish_splits`], in a write transaction that locked the
    /// index row: checks (changing nothing on failure, the caller then rolls back), then
    /// applies the checkpoint delta and the split state changes, with timestamp `now`, at
    /// index `version` (what [`Self::lock_index`] returned).
    async fn publish_locked(
        conn: &mut DB::Connection,
        index_uid: &IndexUid,
        staged: &[SplitId],
        replaced: &[SplitId],
        checkpoint_delta: Option<(SourceId, CheckpointDelta)>,
        now: i64,
        version: i64,
    ) -> MetastoreResult<()> {
        let staged_set: BTreeSet<&SplitId> = staged.iter().collect();
        if let Some(split_id) = replaced.iter().find(|id| staged_set.contains(id)) {
            return Err(MetastoreError::FailedPrecondition(format!(
                "split `{split_id}` cannot be both published and replaced"
            )));
        }
        let all_ids: Vec<SplitId> = staged.iter().chain(replaced).cloned().collect();
        let states = Self::split_states(&mut *conn, index_uid, &all_ids, true).await?;
        for (ids, expected) in [
            (staged, SplitState::Staged),
            (replaced, SplitState::Published),
        ] {
            for split_id in ids {
                match states.get(split_id) {
                    Some(state) if *state == expected => {}
                    Some(state) => {
                        return Err(MetastoreError::FailedPrecondition(format!(
                            "split `{split_id}` is {}, not {}",
                            state.as_str(),
                            expected.as_str()
                        )))
                    }
                    None => {
                        return Err(MetastoreError::FailedPrecondition(format!(
                            "split `{split_id}` does not exist in index `{index_uid}`"
                        )))
                    }
                }
            }
        }
        if let Some((source_id, delta)) = &checkpoint_delta {
            let mut checkpoints = Self::load_checkpoints(&mut *conn, index_uid).await?;
            let checkpoint = checkpoints.entry(source_id.clone()).or_default();
            checkpoint.try_apply(delta).map_err(|err| {
                MetastoreError::FailedPrecondition(format!(
                    "source `{source_id}` of index `{index_uid}`: {err}"
                ))
            })?;
            for (partition_id, partition_delta) in &delta.per_partition {
                sqlx::query::<DB>(
                    "INSERT INTO checkpoints (index_uid, source_id, partition_id, position) \
                     VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (index_uid, source_id, partition_id) \
                     DO UPDATE SET position = excluded.position",
                )
                .bind(index_uid.to_string())
                .bind(source_id.clone())
                .bind(partition_id.clone())
                .bind(to_db(partition_delta.to))
                .execute(&mut *conn)
                .await?;
            }
        }
        Self::set_split_states(
            &mut *conn,
            index_uid,
            staged,
            SplitState::Published,
            now,
            version,
        )
        .await?;
        Self::set_split_states(
            &mut *conn,
            index_uid,
            replaced,
            SplitState::MarkedForDeletion,
            now,
            version,
        )
        .await?;
        Ok(())
    }
}

/// The `AND …` filters of a [`ListSplitsQuery`], with their bound values (`$1`, `$2`, …).
fn split_filters(query: &ListSplitsQuery) -> (String, Vec<Bind>) {
    let mut sql = String::new();
    let mut binds: Vec<Bind> = Vec::new();
    let mut push = |sql: &mut String, clause: &str, bind: Bind| {
        binds.push(bind);
        sql.push_str(&clause.replace("$?", &format!("${}", binds.len())));
    };
    if let Some(index_uid) = &query.index_uid {
        push(
            &mut sql,
            " AND index_uid = $?",
            Bind::Text(index_uid.to_string()),
        );
    }
    if !query.split_states.is_empty() && query.visible_at.is_none() {
        sql.push_str(" AND split_state IN (");
        for (i, state) in query.split_states.iter().enumerate() {
            let clause = if i == 0 { "$?" } else { ", $?" };
            push(&mut sql, clause, Bind::Text(state.as_str().to_string()));
        }
        sql.push(')');
    }
    if let Some(start) = query.time_range_start {
        push(
            &mut sql,
            " AND (time_range_end IS NULL OR time_range_end >= $?)",
            Bind::Int(start),
        );
    }
    if let Some(end) = query.time_range_end {
        push(
            &mut sql,
            " AND (time_range_start IS NULL OR time_range_start < $?)",
            Bind::Int(end),
        );
    }
    if let Some(end_lt) = query.time_range_end_lt {
        push(&mut sql, " AND time_range_end < $?", Bind::Int(end_lt));
    }
    if let Some(lte) = query.update_timestamp_lte {
        push(&mut sql, " AND update_timestamp <= $?", Bind::Int(lte));
    }
    if let Some(partition_id) = query.partition_id {
        push(
            &mut sql,
            " AND partition_id = $?",
            Bind::Int(to_db(partition_id)),
        );
    }
    if let Some(now) = query.immature_at {
        push(&mut sql, " AND maturity_timestamp > $?", Bind::Int(now));
    }
    if let Some(opstamp) = query.delete_opstamp_lt {
        push(
            &mut sql,
            " AND delete_opstamp < $?",
            Bind::Int(to_db(opstamp)),
        );
    }
    if let Some(at) = query.visible_at {
        push(
            &mut sql,
            " AND publish_timestamp IS NOT NULL AND publish_timestamp <= $?",
            Bind::Int(at),
        );
        push(
            &mut sql,
            " AND (split_state = 'Published' OR (split_state = 'MarkedForDeletion' \
             AND update_timestamp > $?))",
            Bind::Int(at),
        );
    }
    (sql, binds)
}

/// Columns selected to decode a [`Split`].
const SPLIT_COLUMNS: &str = "split_state, update_timestamp, publish_timestamp, split_metadata_json";

#[async_trait]
impl<DB> Metastore for SqlMetastore<DB>
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
    async fn create_index(&self, mut index_config: IndexConfig) -> MetastoreResult<IndexMetadata> {
        let index_uid = IndexUid::new(index_config.index_id.clone());
        index_config.doc_mapping.doc_mapping_uid = shale_types::new_ulid();
        let index = IndexMetadata {
            index_uid,
            index_config,
            checkpoints: BTreeMap::new(),
            create_timestamp: shale_types::now_unix_secs(),
        };
        let config_json = serde_json::to_string(&index.index_config).map_err(serde_err)?;
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let inserted = sqlx::query::<DB>(
                "INSERT INTO indexes (index_uid, index_id, index_config_json, create_timestamp) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(index.index_uid.to_string())
            .bind(index.index_id().to_string())
            .bind(config_json)
            .bind(index.create_timestamp)
            .execute(&mut *write.tx)
            .await;
            match inserted {
                Ok(_) => {}
                Err(sqlx::Error::Database(err)) if err.is_unique_violation() => {
                    return Err(MetastoreError::AlreadyExists {
                        kind: "index",
                        id: index.index_id().to_string(),
                    });
                }
                Err(err) => return Err(err.into()),
            }
            Self::insert_doc_mapping_version(
                &mut write.tx,
                &index.index_uid,
                &index.index_config,
                index.create_timestamp,
            )
            .await?;
            Ok(index)
        }
        .await;
        write.finish(result).await
    }

    async fn index_metadata(&self, index_id: &str) -> MetastoreResult<IndexMetadata> {
        let mut read = WriteTx::begin(&self.pool, "BEGIN", None).await?;
        let index = Self::load_index(&mut read.tx, Some(index_id), None).await;
        let index = read.finish(index).await?;
        index.ok_or_else(|| MetastoreError::NotFound {
            kind: "index",
            id: index_id.to_string(),
        })
    }

    async fn index_metadata_without_checkpoints(
        &self,
        index_id: &str,
    ) -> MetastoreResult<IndexMetadata> {
        let row = sqlx::query::<DB>(
            "SELECT index_uid, index_config_json, create_timestamp FROM indexes \
             WHERE index_id = $1",
        )
        .bind(index_id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => Self::decode_index(&row),
            None => Err(MetastoreError::NotFound {
                kind: "index",
                id: index_id.to_string(),
            }),
        }
    }

    async fn index_version(&self, index_id: &str) -> MetastoreResult<crate::IndexVersion> {
        let writes = match &self.versions {
            Some(versions) => {
                if let Some(version) = versions.get(index_id) {
                    return Ok(version);
                }
                versions.before_read()
            }
            None => None,
        };
        let version = self.read_index_version(index_id).await?;
        if let (Some(versions), Some(writes)) = (&self.versions, writes) {
            versions.keep(index_id, version.clone(), writes);
        }
        Ok(version)
    }

    async fn index_changes(
        &self,
        index_id: &str,
        since: Option<&crate::IndexVersion>,
        delete_opstamp_gt: u64,
    ) -> MetastoreResult<crate::IndexChanges> {
        // One snapshot: every write to the index is serialized by its row lock and numbered
        // by the version it raised, so the rows seen are exactly those of versions up to the
        // one read here.
        let mut read = WriteTx::begin(&self.pool, DB::BEGIN_SNAPSHOT, None).await?;
        let result = async {
            let row = sqlx::query::<DB>(
                "SELECT index_uid, index_config_json, create_timestamp, version, \
                     splits_gone_version FROM indexes WHERE index_id = $1",
            )
            .bind(index_id.to_string())
            .fetch_optional(&mut *read.tx)
            .await?;
            let Some(row) = row else {
                return Err(MetastoreError::NotFound {
                    kind: "index",
                    id: index_id.to_string(),
                });
            };
            let mut index = Self::decode_index(&row)?;
            // What the splits cover: a reader of the shards' unpublished records starts
            // after it.
            index.checkpoints = Self::load_checkpoints(&mut read.tx, &index.index_uid).await?;
            let version = crate::IndexVersion {
                index_uid: index.index_uid.clone(),
                version: from_db(row.try_get::<i64, _>("version")?),
            };
            let gone: i64 = row.try_get("splits_gone_version")?;
            let since = since.filter(|since| {
                since.index_uid == version.index_uid
                    && since.version <= version.version
                    && to_db(since.version) >= gone
            });
            let (splits, delete_opstamp_gt) = match since {
                Some(since) => {
                    let sql = format!(
                        "SELECT {SPLIT_COLUMNS} FROM splits \
                         WHERE index_uid = $1 AND update_version > $2 ORDER BY split_id"
                    );
                    let rows = sqlx::query::<DB>(AssertSqlSafe(sql))
                        .bind(index.index_uid.to_string())
                        .bind(to_db(since.version))
                        .fetch_all(&mut *read.tx)
                        .await?;
                    let splits = rows
                        .iter()
                        .map(Self::decode_split)
                        .collect::<MetastoreResult<Vec<_>>>()?;
                    (crate::SplitChanges::Since(splits), delete_opstamp_gt)
                }
                None => {
                    let sql = format!(
                        "SELECT {SPLIT_COLUMNS} FROM splits \
                         WHERE index_uid = $1 AND split_state = 'Published' ORDER BY split_id"
                    );
                    let rows = sqlx::query::<DB>(AssertSqlSafe(sql))
                        .bind(index.index_uid.to_string())
                        .fetch_all(&mut *read.tx)
                        .await?;
                    let splits = rows
                        .iter()
                        .map(|row| Self::decode_split(row).map(|split| split.split_metadata))
                        .collect::<MetastoreResult<Vec<_>>>()?;
                    (crate::SplitChanges::All(splits), 0)
                }
            };
            let delete_tasks =
                Self::delete_tasks_on(&mut read.tx, &index.index_uid, delete_opstamp_gt).await?;
            Ok(crate::IndexChanges {
                version,
                index,
                splits,
                delete_tasks,
            })
        }
        .await;
        read.finish(result).await
    }

    async fn list_indexes(&self) -> MetastoreResult<Vec<IndexMetadata>> {
        let mut read = WriteTx::begin(&self.pool, "BEGIN", None).await?;
        let rows = async {
            let rows = sqlx::query::<DB>(
                "SELECT index_uid, index_config_json, create_timestamp FROM indexes \
                 ORDER BY index_id",
            )
            .fetch_all(&mut *read.tx)
            .await?;
            let checkpoint_rows = sqlx::query::<DB>(
                "SELECT index_uid, source_id, partition_id, position FROM checkpoints",
            )
            .fetch_all(&mut *read.tx)
            .await?;
            Ok((rows, checkpoint_rows))
        }
        .await;
        let (rows, checkpoint_rows) = read.finish(rows).await?;
        let mut checkpoints = Self::group_checkpoints(&checkpoint_rows)?;
        rows.iter()
            .map(|row| {
                let mut index = Self::decode_index(row)?;
                index.checkpoints = checkpoints
                    .remove(&index.index_uid.to_string())
                    .unwrap_or_default();
                Ok(index)
            })
            .collect()
    }

    async fn update_index_config(
        &self,
        index_uid: &IndexUid,
        mut index_config: IndexConfig,
    ) -> MetastoreResult<IndexMetadata> {
        if index_config.index_id != index_uid.index_id {
            return Err(MetastoreError::FailedPrecondition(format!(
                "the index id cannot change (from `{}` to `{}`)",
                index_uid.index_id, index_config.index_id
            )));
        }
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            Self::lock_index(&mut write.tx, index_uid).await?;
            let mut index = Self::load_index(&mut write.tx, None, Some(index_uid))
                .await?
                .ok_or_else(|| index_not_found(index_uid))?;
            // A new layout (doc mapping or sort fields) is a new version: its splits are
            // never merged, pruned or read as those of another.
            let new_version = !index_config.same_split_layout(&index.index_config);
            index_config.doc_mapping.doc_mapping_uid = if new_version {
                shale_types::new_ulid()
            } else {
                index.index_config.doc_mapping.doc_mapping_uid.clone()
            };
            let config_json = serde_json::to_string(&index_config).map_err(serde_err)?;
            sqlx::query::<DB>("UPDATE indexes SET index_config_json = $2 WHERE index_uid = $1")
                .bind(index_uid.to_string())
                .bind(config_json)
                .execute(&mut *write.tx)
                .await?;
            let now = shale_types::now_unix_secs();
            // The version being replaced is kept (recorded here if it predates versions).
            Self::insert_doc_mapping_version(&mut write.tx, index_uid, &index.index_config, now)
                .await?;
            if new_version {
                Self::insert_doc_mapping_version(&mut write.tx, index_uid, &index_config, now)
                    .await?;
            }
            // Delete tasks recorded without their binding meant what the settings being
            // replaced say: bind them to those before they change.
            let old_fields =
                serde_json::to_string(&index.index_config.search_settings.default_search_fields)
                    .map_err(serde_err)?;
            sqlx::query::<DB>(
                "UPDATE delete_tasks SET default_search_fields = $2, \
                 doc_mapping_uid = COALESCE(doc_mapping_uid, $3) \
                 WHERE index_uid = $1 AND default_search_fields IS NULL",
            )
            .bind(index_uid.to_string())
            .bind(old_fields)
            .bind(index.index_config.doc_mapping.doc_mapping_uid.clone())
            .execute(&mut *write.tx)
            .await?;
            index.index_config = index_config;
            Ok(index)
        }
        .await;
        write.finish(result).await
    }

    async fn update_split_maturities(
        &self,
        index_uid: &IndexUid,
        splits: &[SplitMetadata],
    ) -> MetastoreResult<usize> {
        let now = shale_types::now_unix_secs();
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let version = Self::lock_index(&mut write.tx, index_uid).await?;
            let mut updated = 0;
            for split in splits {
                let metadata_json = serde_json::to_string(split).map_err(serde_err)?;
                let result = sqlx::query::<DB>(
                    "UPDATE splits SET maturity_timestamp = $3, split_metadata_json = $4, \
                         update_timestamp = $5, update_version = $6 \
                     WHERE index_uid = $1 AND split_id = $2 AND split_state = 'Published'",
                )
                .bind(index_uid.to_string())
                .bind(split.split_id.clone())
                .bind(split.maturity_timestamp())
                .bind(metadata_json)
                .bind(now)
                .bind(version)
                .execute(&mut *write.tx)
                .await?;
                updated += DB::rows_affected(&result) as usize;
            }
            Ok(updated)
        }
        .await;
        write.finish(result).await
    }

    async fn delete_index(&self, index_uid: &IndexUid) -> MetastoreResult<Vec<Split>> {
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            Self::lock_index(&mut write.tx, index_uid).await?;
            let sql = format!(
                "SELECT {SPLIT_COLUMNS} FROM splits WHERE index_uid = $1 ORDER BY split_id{}",
                DB::FOR_UPDATE
            );
            let rows = sqlx::query::<DB>(AssertSqlSafe(sql))
                .bind(index_uid.to_string())
                .fetch_all(&mut *write.tx)
                .await?;
            let splits = rows
                .iter()
                .map(Self::decode_split)
                .collect::<MetastoreResult<Vec<_>>>()?;
            for sql in [
                "DELETE FROM merge_task_splits WHERE index_uid = $1",
                "DELETE FROM merge_tasks WHERE index_uid = $1",
                "DELETE FROM delete_tasks WHERE index_uid = $1",
                "DELETE FROM doc_mappings WHERE index_uid = $1",
                "DELETE FROM metric_metadata WHERE index_uid = $1",
                "DELETE FROM compactions WHERE index_uid = $1",
                "DELETE FROM splits WHERE index_uid = $1",
                "DELETE FROM checkpoints WHERE index_uid = $1",
                "DELETE FROM indexes WHERE index_uid = $1",
            ] {
                sqlx::query::<DB>(sql)
                    .bind(index_uid.to_string())
                    .execute(&mut *write.tx)
                    .await?;
            }
            Ok(splits)
        }
        .await;
        write.finish(result).await
    }

    async fn stage_splits(
        &self,
        index_uid: &IndexUid,
        splits: Vec<SplitMetadata>,
    ) -> MetastoreResult<()> {
        if let Some(split) = splits.iter().find(|s| &s.index_uid != index_uid) {
            return Err(MetastoreError::FailedPrecondition(format!(
                "split `{}` belongs to index `{}`, not `{index_uid}`",
                split.split_id, split.index_uid
            )));
        }
        let now = shale_types::now_unix_secs();
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let version = Self::lock_index(&mut write.tx, index_uid).await?;
            let split_ids: Vec<SplitId> = splits.iter().map(|s| s.split_id.clone()).collect();
            let states = Self::split_states(&mut write.tx, index_uid, &split_ids, true).await?;
            if let Some((split_id, state)) = states.iter().find(|(_, s)| **s != SplitState::Staged)
            {
                return Err(MetastoreError::FailedPrecondition(format!(
                    "split `{split_id}` is {}, not Staged",
                    state.as_str()
                )));
            }
            for split in &splits {
                if !Self::upsert_staged_split(&mut write.tx, split, now, version).await? {
                    // The id is taken in another index, or the split changed state meanwhile.
                    return Err(MetastoreError::FailedPrecondition(format!(
                        "split `{}` exists and is not a Staged split of `{index_uid}`",
                        split.split_id
                    )));
                }
            }
            Ok(())
        }
        .await;
        write.finish(result).await
    }

    async fn publish_splits(
        &self,
        index_uid: &IndexUid,
        staged: &[SplitId],
        replaced: &[SplitId],
        checkpoint_delta: Option<(SourceId, CheckpointDelta)>,
    ) -> MetastoreResult<()> {
        let now = shale_types::now_unix_secs();
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let version = Self::lock_index(&mut write.tx, index_uid).await?;
            Self::publish_locked(
                &mut write.tx,
                index_uid,
                staged,
                replaced,
                checkpoint_delta,
                now,
                version,
            )
            .await?;
            Ok(())
        }
        .await;
        write.finish(result).await
    }

    async fn list_splits(&self, query: ListSplitsQuery) -> MetastoreResult<Vec<Split>> {
        let (filters, binds) = split_filters(&query);
        let sql =
            format!("SELECT {SPLIT_COLUMNS} FROM splits WHERE 1 = 1{filters} ORDER BY split_id");
        let rows = Self::bind_all(sqlx::query::<DB>(AssertSqlSafe(sql)), binds)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(Self::decode_split).collect()
    }

    async fn count_splits(&self, query: ListSplitsQuery) -> MetastoreResult<u64> {
        let (filters, binds) = split_filters(&query);
        let sql = format!("SELECT CAST(COUNT(*) AS BIGINT) AS n FROM splits WHERE 1 = 1{filters}");
        let row = Self::bind_all(sqlx::query::<DB>(AssertSqlSafe(sql)), binds)
            .fetch_one(&self.pool)
            .await?;
        let count: i64 = row.try_get("n")?;
        Ok(from_db(count))
    }

    async fn mark_splits_for_deletion(
        &self,
        index_uid: &IndexUid,
        split_ids: &[SplitId],
    ) -> MetastoreResult<()> {
        let now = shale_types::now_unix_secs();
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let version = Self::lock_index(&mut write.tx, index_uid).await?;
            // Lock the rows (PostgreSQL) in id order, as every writer does.
            Self::split_states(&mut write.tx, index_uid, split_ids, true).await?;
            Self::set_split_states(
                &mut write.tx,
                index_uid,
                split_ids,
                SplitState::MarkedForDeletion,
                now,
                version,
            )
            .await?;
            Ok(())
        }
        .await;
        write.finish(result).await
    }

    async fn mark_staged_splits_for_deletion(
        &self,
        index_uid: &IndexUid,
        split_ids: &[SplitId],
    ) -> MetastoreResult<Vec<SplitId>> {
        let now = shale_types::now_unix_secs();
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let version = Self::lock_index(&mut write.tx, index_uid).await?;
            let states = Self::split_states(&mut write.tx, index_uid, split_ids, true).await?;
            let staged: Vec<SplitId> = states
                .into_iter()
                .filter(|(_, state)| *state == SplitState::Staged)
                .map(|(split_id, _)| split_id)
                .collect();
            Self::set_split_states(
                &mut write.tx,
                index_uid,
                &staged,
                SplitState::MarkedForDeletion,
                now,
                version,
            )
            .await?;
            Ok(staged)
        }
        .await;
        write.finish(result).await
    }

    async fn split_stats(&self, now: i64) -> MetastoreResult<Vec<SplitStats>> {
        let rows = sqlx::query::<DB>(
            "SELECT index_uid, split_state, source_id, partition_id, doc_mapping_uid, node_id, \
                 CAST(CASE WHEN maturity_timestamp > $1 THEN 0 ELSE 1 END AS BIGINT) AS mature, \
                 CAST(num_merge_ops AS BIGINT) AS num_merge_ops, \
                 CAST(COUNT(*) AS BIGINT) AS num_splits, \
                 CAST(SUM(size_bytes) AS BIGINT) AS size_bytes, \
                 CAST(SUM(num_docs) AS BIGINT) AS num_docs \
             FROM splits \
             GROUP BY index_uid, split_state, source_id, partition_id, doc_mapping_uid, node_id, \
                 CASE WHEN maturity_timestamp > $1 THEN 0 ELSE 1 END, num_merge_ops \
             ORDER BY index_uid, split_state, source_id, partition_id, doc_mapping_uid, node_id, \
                 num_merge_ops",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let index_uid: String = row.try_get("index_uid")?;
                let state: String = row.try_get("split_state")?;
                let partition_id: i64 = row.try_get("partition_id")?;
                let mature: i64 = row.try_get("mature")?;
                let num_merge_ops: i64 = row.try_get("num_merge_ops")?;
                let num_splits: i64 = row.try_get("num_splits")?;
                let size_bytes: i64 = row.try_get("size_bytes")?;
                let num_docs: i64 = row.try_get("num_docs")?;
                Ok(SplitStats {
                    split_state: SplitState::parse(&state)
                        .ok_or_else(|| serde_err(format!("unknown split state `{state}`")))?,
                    scope: shale_types::MergeScope {
                        node_id: Some(row.try_get("node_id")?),
                        index_uid: index_uid.parse().map_err(serde_err)?,
                        source_id: row.try_get("source_id")?,
                        partition_id: from_db(partition_id),
                        doc_mapping_uid: row.try_get("doc_mapping_uid")?,
                    },
                    mature: mature != 0,
                    num_merge_ops: u32::try_from(num_merge_ops).unwrap_or(u32::MAX),
                    num_splits: from_db(num_splits),
                    size_bytes: from_db(size_bytes),
                    num_docs: from_db(num_docs),
                })
            })
            .collect()
    }

    async fn delete_splits(
        &self,
        index_uid: &IndexUid,
        split_ids: &[SplitId],
    ) -> MetastoreResult<()> {
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            Self::lock_index(&mut write.tx, index_uid).await?;
            let states = Self::split_states(&mut write.tx, index_uid, split_ids, true).await?;
            let published: Vec<&str> = states
                .iter()
                .filter(|(_, state)| **state == SplitState::Published)
                .map(|(split_id, _)| split_id.as_str())
                .collect();
            if !published.is_empty() {
                return Err(MetastoreError::FailedPrecondition(format!(
                    "cannot delete Published splits: {}",
                    published.join(", ")
                )));
            }
            let existing: Vec<SplitId> = states.into_keys().collect();
            for chunk in existing.chunks(IDS_PER_STATEMENT) {
                // A reader whose view predates a deleted row's last write cannot learn of it
                // by reading changes any more: it reads the index whole.
                let sql = format!(
                    "SELECT CAST(COALESCE(MAX(update_version), 0) AS BIGINT) AS newest \
                     FROM splits WHERE index_uid = $1 AND split_id IN ({})",
                    placeholders(2, chunk.len())
                );
                let mut query = sqlx::query::<DB>(AssertSqlSafe(sql)).bind(index_uid.to_string());
                for split_id in chunk {
                    query = query.bind(split_id.clone());
                }
                let newest: i64 = query.fetch_one(&mut *write.tx).await?.try_get("newest")?;
                sqlx::query::<DB>(
                    "UPDATE indexes SET splits_gone_version = $2 \
                     WHERE index_uid = $1 AND splits_gone_version < $2",
                )
                .bind(index_uid.to_string())
                .bind(newest)
                .execute(&mut *write.tx)
                .await?;
                let sql = format!(
                    "DELETE FROM splits WHERE index_uid = $1 AND split_id IN ({})",
                    placeholders(2, chunk.len())
                );
                let mut query = sqlx::query::<DB>(AssertSqlSafe(sql)).bind(index_uid.to_string());
                for split_id in chunk {
                    query = query.bind(split_id.clone());
                }
                query.execute(&mut *write.tx).await?;
            }
            Ok(())
        }
        .await;
        write.finish(result).await
    }

    async fn create_merge_tasks(
        &self,
        index_uid: &IndexUid,
        tasks: Vec<NewMergeTask>,
        max_attempts: u32,
    ) -> MetastoreResult<Vec<MergeTask>> {
        self.insert_merge_tasks(index_uid, tasks, max_attempts)
            .await
    }

    async fn claim_merge_task(
        &self,
        node_id: &str,
        lease_secs: u64,
        now: i64,
        index_uid: Option<&IndexUid>,
        scope_node: Option<&str>,
        manual_only: bool,
    ) -> MetastoreResult<Option<MergeTask>> {
        self.claim_next_merge_task(node_id, lease_secs, now, index_uid, scope_node, manual_only)
            .await
    }

    async fn release_merge_tasks(
        &self,
        task_ids: &[String],
        reason: &str,
        now: i64,
    ) -> MetastoreResult<Vec<String>> {
        self.release_tasks(task_ids, reason, now).await
    }

    async fn renew_merge_task_lease(
        &self,
        task_id: &str,
        node_id: &str,
        lease_secs: u64,
        now: i64,
    ) -> MetastoreResult<()> {
        self.renew_lease(task_id, node_id, lease_secs, now).await
    }

    async fn publish_merge(
        &self,
        index_uid: &IndexUid,
        task_id: &str,
        node_id: &str,
        output: &[SplitId],
        replaced: &[SplitId],
        now: i64,
    ) -> MetastoreResult<()> {
        self.publish_merge_output(index_uid, task_id, node_id, output, replaced, now)
            .await
    }

    async fn fail_merge_task(
        &self,
        task_id: &str,
        node_id: &str,
        error: &str,
        retry: bool,
        now: i64,
    ) -> MetastoreResult<MergeTask> {
        self.fail_task(task_id, node_id, error, retry, now).await
    }

    async fn list_merge_tasks(
        &self,
        index_uid: Option<&IndexUid>,
        states: &[MergeTaskState],
        limit: Option<usize>,
    ) -> MetastoreResult<Vec<MergeTask>> {
        self.select_merge_tasks(index_uid, states, limit).await
    }

    async fn delete_merge_tasks(&self, finished_before: i64) -> MetastoreResult<usize> {
        self.delete_finished_merge_tasks(finished_before).await
    }

    async fn requeue_merge_tasks(
        &self,
        lease_owners: &[String],
        now: i64,
    ) -> MetastoreResult<Vec<String>> {
        self.requeue_tasks_of(lease_owners, now).await
    }

    async fn create_delete_task(
        &self,
        index_uid: &IndexUid,
        delete_query: DeleteQuery,
        now: i64,
    ) -> MetastoreResult<DeleteTask> {
        self.insert_delete_task(index_uid, delete_query, now).await
    }

    async fn doc_mapping_version(
        &self,
        index_uid: &IndexUid,
        doc_mapping_uid: &str,
    ) -> MetastoreResult<Option<IndexConfig>> {
        let row = sqlx::query::<DB>(
            "SELECT index_config_json FROM doc_mappings \
             WHERE index_uid = $1 AND doc_mapping_uid = $2",
        )
        .bind(index_uid.to_string())
        .bind(doc_mapping_uid.to_string())
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => {
                let json: String = row.try_get("index_config_json")?;
                Ok(Some(
                    IndexConfig::from_stored_json(&json).map_err(serde_err)?,
                ))
            }
            None => Ok(None),
        }
    }

    async fn list_delete_tasks(
        &self,
        index_uid: &IndexUid,
        opstamp_gt: u64,
    ) -> MetastoreResult<Vec<DeleteTask>> {
        self.select_delete_tasks(index_uid, opstamp_gt).await
    }

    async fn last_delete_opstamps(&self) -> MetastoreResult<BTreeMap<IndexUid, u64>> {
        self.select_last_delete_opstamps().await
    }

    async fn purge_delete_tasks(
        &self,
        index_uid: &IndexUid,
        up_to: u64,
        marked_since: i64,
    ) -> MetastoreResult<usize> {
        self.delete_delete_tasks(index_uid, up_to, marked_since)
            .await
    }

    async fn advance_split_delete_opstamps(
        &self,
        index_uid: &IndexUid,
        splits: &[(SplitMetadata, u64)],
    ) -> MetastoreResult<usize> {
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let version = Self::lock_index(&mut write.tx, index_uid).await?;
            let mut updated = 0;
            for (split, expected) in splits {
                let metadata_json = serde_json::to_string(split).map_err(serde_err)?;
                let result = sqlx::query::<DB>(
                    "UPDATE splits SET delete_opstamp = $3, split_metadata_json = $4, \
                         update_version = $6 \
                     WHERE index_uid = $1 AND split_id = $2 AND split_state = 'Published' \
                     AND delete_opstamp = $5",
                )
                .bind(index_uid.to_string())
                .bind(split.split_id.clone())
                .bind(to_db(split.delete_opstamp))
                .bind(metadata_json)
                .bind(to_db(*expected))
                .bind(version)
                .execute(&mut *write.tx)
                .await?;
                updated += DB::rows_affected(&result) as usize;
            }
            Ok(updated)
        }
        .await;
        write.finish(result).await
    }

    async fn create_index_template(&self, template: IndexTemplate) -> MetastoreResult<()> {
        self.insert_template(&template).await
    }

    async fn update_index_template(&self, template: IndexTemplate) -> MetastoreResult<()> {
        self.replace_template(&template).await
    }

    async fn index_template(&self, template_id: &str) -> MetastoreResult<IndexTemplate> {
        self.select_template(template_id).await
    }

    async fn list_index_templates(&self) -> MetastoreResult<Vec<IndexTemplate>> {
        self.select_templates().await
    }

    async fn delete_index_templates(&self, template_ids: &[String]) -> MetastoreResult<()> {
        self.remove_templates(template_ids).await
    }

    async fn upsert_metric_metadata(
        &self,
        index_uid: &IndexUid,
        metadata: &[MetricMetadata],
    ) -> MetastoreResult<()> {
        self.write_metric_metadata(index_uid, metadata).await
    }

    async fn list_metric_metadata(
        &self,
        index_uid: &IndexUid,
    ) -> MetastoreResult<Vec<MetricMetadata>> {
        self.select_metric_metadata(index_uid).await
    }

    async fn create_compaction(
        &self,
        index_uid: &IndexUid,
        request: CompactionRequest,
        now: i64,
    ) -> MetastoreResult<Compaction> {
        self.insert_compaction(index_uid, request, now).await
    }

    async fn list_compactions(
        &self,
        index_uid: Option<&IndexUid>,
        states: &[CompactionState],
    ) -> MetastoreResult<Vec<Compaction>> {
        self.select_compactions(index_uid, states).await
    }

    async fn update_compaction(&self, compaction: &Compaction) -> MetastoreResult<()> {
        self.store_compaction(compaction).await
    }

    fn with_fence(&self, fence: Fence) -> Arc<dyn Metastore> {
        Arc::new(self.fenced(fence))
    }

    async fn register_node(
        &self,
        cluster_id: &str,
        node_id: &str,
        advertise_address: &str,
        roles: &[String],
        now_ms: i64,
    ) -> MetastoreResult<NodeRecord> {
        self.register(cluster_id, node_id, advertise_address, roles, now_ms)
            .await
    }

    async fn heartbeat_node(
        &self,
        cluster_id: &str,
        identity: &NodeIdentity,
        info: serde_json::Value,
        now_ms: i64,
    ) -> MetastoreResult<()> {
        self.heartbeat(cluster_id, identity, &info, now_ms).await
    }

    async fn clock_ms(&self) -> MetastoreResult<i64> {
        let sql = format!("SELECT {} AS now_ms", DB::NOW_MS);
        let row = sqlx::query::<DB>(AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get("now_ms")?)
    }

    async fn list_nodes(&self, cluster_id: &str) -> MetastoreResult<Vec<NodeRecord>> {
        self.select_nodes(cluster_id).await
    }

    async fn forget_nodes(
        &self,
        cluster_id: &str,
        heartbeat_before_ms: i64,
    ) -> MetastoreResult<usize> {
        self.delete_nodes(cluster_id, heartbeat_before_ms).await
    }

    async fn acquire_lease(
        &self,
        cluster_id: &str,
        name: &str,
        holder: &NodeIdentity,
        ttl_ms: u64,
        now_ms: i64,
    ) -> MetastoreResult<Option<Lease>> {
        self.try_acquire_lease(cluster_id, name, holder, ttl_ms, now_ms)
            .await
    }

    async fn release_lease(
        &self,
        cluster_id: &str,
        name: &str,
        holder: &NodeIdentity,
    ) -> MetastoreResult<()> {
        self.give_up_lease(cluster_id, name, holder).await
    }

    async fn get_lease(&self, cluster_id: &str, name: &str) -> MetastoreResult<Option<Lease>> {
        self.select_lease(cluster_id, name).await
    }

    async fn list_shards(&self, index_uid: Option<&IndexUid>) -> MetastoreResult<Vec<Shard>> {
        self.select_shards(index_uid).await
    }

    async fn open_shards(&self, shards: Vec<(ShardKey, String)>) -> MetastoreResult<Vec<Shard>> {
        self.insert_shards(&shards).await
    }

    async fn close_shards(&self, keys: &[ShardKey]) -> MetastoreResult<()> {
        self.update_or_delete_shards(keys, false).await
    }

    async fn delete_shards(&self, keys: &[ShardKey]) -> MetastoreResult<()> {
        self.update_or_delete_shards(keys, true).await
    }
}
