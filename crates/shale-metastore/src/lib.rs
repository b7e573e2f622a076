//! The metastore: the durable bookkeeping of indexes, splits and source checkpoints.
//! One trait, [`Metastore`], with two backends — SQLite (embedded default, a file in the data
//! dir) and PostgreSQL (selected by a `postgres://` URI) — that pass one conformance suite.
//! This is the only crate that knows SQL.
//!
//! - [`open_metastore`] picks the backend from a URI; [`SqliteMetastore::open`] and
//!   [`PostgresMetastore::connect`] open one explicitly. Both apply their schema migrations
//!   (`migrations/`) on start.
//! - Both backends share one SQL implementation ([`SqlMetastore`], module `sql`): every write
//!   is one transaction that locks the index row first, so `publish_splits` — state checks,
//!   checkpoint check and updates — is atomic even when nodes publish concurrently.
//! - Merge tasks ([`MergeTask`], module `merge_task`) live here too, so that any node can
//!   claim them: PostgreSQL claimers use `SELECT … FOR UPDATE SKIP LOCKED` under a lease, and
//!   a merge is published in one transaction that checks the claim and the inputs.
//! - Delete tasks ([`DeleteTask`]: a query and an opstamp, per index) and manual compactions
//!   ([`Compaction`], module `compaction`) live here too.
//! - The `testing` feature exposes the `conformance` module: the test suite every backend
//!   passes, run against both backends by `tests/sqlite.rs` and `tests/postgres.rs`.

mod cluster;
mod compaction;
mod merge_task;
mod migrations;
mod postgres;
mod sql;
mod sqlite;

#[cfg(feature = "testing")]
pub mod conformance;
#[cfg(feature = "testing")]
pub mod recording;

pub use cluster::{
    Fence, Lease, NodeIdentity, NodeRecord, Shard, ShardKey, ShardState, LEADER_LEASE,
};
pub use compaction::{Compaction, CompactionProgress, CompactionRequest, CompactionState};
pub use merge_task::{MergeTask, MergeTaskState, NewMergeTask};
pub use postgres::PostgresMetastore;
pub use sql::{Dialect, SqlMetastore};
pub use sqlite::SqliteMetastore;

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use shale_config::{IndexConfig, IndexTemplate};
use shale_types::{
    CheckpointDelta, DeleteQuery, DeleteTask, IndexUid, MergeScope, MetricMetadata, PartitionId,
    SourceCheckpoint, SourceId, Split, SplitId, SplitMetadata, SplitState,
};
use std::collections::BTreeMap;

/// Errors of metastore operations.
#[derive(Debug, thiserror::Error)]
pub enum MetastoreError {
    /// The index, split or merge task does not exist.
    #[error("{kind} `{id}` not found")]
    NotFound {
        /// `index`, `split` or `merge task`.
        kind: &'static str,
        /// Its id.
        id: String,
    },
    /// The index already exists.
    #[error("{kind} `{id}` already exists")]
    AlreadyExists {
        /// `index` or `split`.
        kind: &'static str,
        /// Its id.
        id: String,
    },
    /// The operation's preconditions do not hold; nothing was changed.
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// The database failed.
    #[error("metastore database error: {0}")]
    Db(String),
    /// Stored data could not be (de)serialized.
    #[error("metastore serialization error: {0}")]
    Serde(String),
}

/// Result of metastore operations.
pub type MetastoreResult<T> = Result<T, MetastoreError>;

impl From<sqlx::Error> for MetastoreError {
    fn from(err: sqlx::Error) -> Self {
        MetastoreError::Db(err.to_string())
    }
}

impl From<sqlx::migrate::MigrateError> for MetastoreError {
    fn from(err: sqlx::migrate::MigrateError) -> Self {
        MetastoreError::Db(format!("schema migration failed: {err}"))
    }
}

/// Opens the metastore at `uri`: `postgres://` or `postgresql://` selects PostgreSQL;
/// `sqlite://…`, `sqlite::memory:` or a plain file path selects SQLite; other schemes are an
/// error. Error messages never show the URI's password.
pub async fn open_metastore(uri: &str) -> MetastoreResult<Arc<dyn Metastore>> {
    let opened: MetastoreResult<Arc<dyn Metastore>> =
        if uri.starts_with("postgres://") || uri.starts_with("postgresql://") {
            PostgresMetastore::connect(uri)
                .await
                .map(|m| Arc::new(m) as Arc<dyn Metastore>)
        } else if uri.starts_with("sqlite:") || !uri.contains("://") {
            SqliteMetastore::open(uri)
                .await
                .map(|m| Arc::new(m) as Arc<dyn Metastore>)
        } else {
            Err(MetastoreError::Db(format!(
                "unsupported metastore URI `{uri}`: expected postgres://, postgresql://, \
                 sqlite:// or a file path"
            )))
        };
    opened.map_err(|err| err.scrubbed(uri))
}

impl MetastoreError {
    /// The error with `uri` and its secrets redacted from its message.
    pub fn scrubbed(self, uri: &str) -> MetastoreError {
        let scrub = |message: String| shale_config::scrub(&message, uri);
        match self {
            MetastoreError::Db(message) => MetastoreError::Db(scrub(message)),
            MetastoreError::Serde(message) => MetastoreError::Serde(scrub(message)),
            MetastoreError::FailedPrecondition(message) => {
                MetastoreError::FailedPrecondition(scrub(message))
            }
            other => other,
        }
    }
}

/// An index as stored: its config, uid and source checkpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexMetadata {
    /// Id plus incarnation.
    pub index_uid: IndexUid,
    /// The config, with `doc_mapping.doc_mapping_uid` filled in.
    pub index_config: IndexConfig,
    /// Source id → checkpoint.
    pub checkpoints: BTreeMap<SourceId, SourceCheckpoint>,
    /// Seconds since epoch.
    pub create_timestamp: i64,
}

impl IndexMetadata {
    /// The index id.
    pub fn index_id(&self) -> &str {
        &self.index_uid.index_id
    }
    /// The checkpoint of `source_id` (empty if none yet).
    pub fn checkpoint(&self, source_id: &str) -> SourceCheckpoint {
        self.checkpoints.get(source_id).cloned().unwrap_or_default()
    }
}

/// Filters for [`Metastore::list_splits`]; every `None`/empty filter matches all.
#[derive(Clone, Debug, Default)]
pub struct ListSplitsQuery {
    /// Splits of this index only.
    pub index_uid: Option<IndexUid>,
    /// Splits in one of these states (empty: any state).
    pub split_states: Vec<SplitState>,
    /// Splits whose time range intersects `[start, end)` (seconds). Splits without a time
    /// range always match.
    pub time_range_start: Option<i64>,
    /// Exclusive end of the time filter.
    pub time_range_end: Option<i64>,
    /// Splits whose time range ends strictly before this second (retention).
    pub time_range_end_lt: Option<i64>,
    /// Splits last updated at or before this second (janitor grace periods).
    pub update_timestamp_lte: Option<i64>,
    /// Splits of this partition only.
    pub partition_id: Option<PartitionId>,
    /// Splits immature at this second only (for the merge planner).
    pub immature_at: Option<i64>,
    /// Splits that were Published at the end of this second (time travel): published then,
    /// and still Published or marked for deletion later. Overrides `split_states`.
    pub visible_at: Option<i64>,
    /// Splits not clean of the delete task with this opstamp (`delete_opstamp` below it).
    pub delete_opstamp_lt: Option<u64>,
}

impl ListSplitsQuery {
    /// All splits of `index_uid`.
    pub fn for_index(index_uid: IndexUid) -> Self {
        ListSplitsQuery {
            index_uid: Some(index_uid),
            ..Default::default()
        }
    }
    /// Restricts to `states`.
    pub fn with_states(mut self, states: &[SplitState]) -> Self {
        self.split_states = states.to_vec();
        self
    }
}

/// Split counts of one group of [`Metastore::split_stats`]: the splits of one index, state,
/// merge scope (with the node that made them), maturity and level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitStats {
    /// The state of the splits.
    pub split_state: SplitState,
    /// Their scope; `node_id` is the node that made them (always set).
    pub scope: MergeScope,
    /// Whether they are mature at the time asked.
    pub mature: bool,
    /// Their level: the merges they went through (`num_merge_ops`).
    pub num_merge_ops: u32,
    /// How many.
    pub num_splits: u64,
    /// Their bytes.
    pub size_bytes: u64,
    /// Their documents.
    pub num_docs: u64,
}

/// Where an index stands: its uid and the version its last write raised it to (see
/// [`Metastore::index_version`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexVersion {
    /// The index's uid.
    pub index_uid: IndexUid,
    /// Raised by every write that touches the index.
    pub version: u64,
}

/// What a reader of an index needs to bring its view of it up to date (see
/// [`Metastore::index_changes`]).
#[derive(Clone, Debug)]
pub struct IndexChanges {
    /// Where the index stands: once applied, the view is that of this version.
    pub version: IndexVersion,
    /// The index's metadata with its checkpoints: the positions its Published splits
    /// cover.
    pub index: IndexMetadata,
    /// The splits to apply.
    pub splits: SplitChanges,
    /// The delete tasks above the opstamp asked for, by opstamp (all of them when `splits`
    /// is [`SplitChanges::All`]).
    pub delete_tasks: Vec<DeleteTask>,
}

/// The split part of [`IndexChanges`].
#[derive(Clone, Debug)]
pub enum SplitChanges {
    /// Every Published split, by split id: the view is replaced. Given when the reader has
    /// no view, its view is of another incarnation of the index, or split rows written after
    /// its version have since been deleted (it could not learn of them from changes).
    All(Vec<SplitMetadata>),
    /// The splits written after the reader's version, in any state, by split id: one that is
    /// Published is added to the view (or replaces its older self), any other is removed.
    Since(Vec<Split>),
}

/// The metastore. Every method is atomic. Methods taking an `index_uid` fail with `NotFound`
/// when that index (incarnation) does not exist.
#[async_trait]
pub trait Metastore: Send + Sync + 'static {
    /// Creates an index: assigns its uid and doc mapping uid. Fails with `AlreadyExists`.
    async fn create_index(&self, index_config: IndexConfig) -> MetastoreResult<IndexMetadata>;

    /// The index with this id (`NotFound` otherwise).
    async fn index_metadata(&self, index_id: &str) -> MetastoreResult<IndexMetadata>;

    /// A number that every write touching the index raises (splits staged, published or
    /// marked, delete tasks, config updates, shards, merge tasks): a reader that sees the
    /// same number twice saw the same splits, delete tasks and config in between. One read
    /// of one row: searchers check it to keep their view of an index current.
    /// `NotFound` if there is no such index. Comes with the index's uid: an index deleted
    /// and created again under the same id starts its versions again.
    async fn index_version(&self, index_id: &str) -> MetastoreResult<IndexVersion>;

    /// What changed in the index since `since`, a version a reader saw, as of one consistent
    /// moment: the index's metadata, the split rows written after that version (or every
    /// Published split, see [`SplitChanges::All`]) and the delete tasks above
    /// `delete_opstamp_gt`. Applying them to the view of `since` gives exactly the view of
    /// the returned version. `NotFound` if there is no such index.
    ///
    /// This default reads the index whole (version first, so a write that lands meanwhile
    /// is seen again at the next version); SQL backends read only the changes.
    async fn index_changes(
        &self,
        index_id: &str,
        since: Option<&IndexVersion>,
        delete_opstamp_gt: u64,
    ) -> MetastoreResult<IndexChanges> {
        let _ = (since, delete_opstamp_gt);
        let version = self.index_version(index_id).await?;
        let index = self.index_metadata(index_id).await?;
        let splits = self
            .list_splits(
                ListSplitsQuery::for_index(index.index_uid.clone())
                    .with_states(&[SplitState::Published]),
            )
            .await?;
        let delete_tasks = self.list_delete_tasks(&index.index_uid, 0).await?;
        Ok(IndexChanges {
            version,
            index,
            splits: SplitChanges::All(splits.into_iter().map(|s| s.split_metadata).collect()),
            delete_tasks,
        })
    }

    /// The index with this id without its checkpoints (`checkpoints` is empty): what a
    /// search needs, in one read.
    async fn index_metadata_without_checkpoints(
        &self,
        index_id: &str,
    ) -> MetastoreResult<IndexMetadata> {
        let mut index = self.index_metadata(index_id).await?;
        index.checkpoints = Default::default();
        Ok(index)
    }

    /// All indexes, by id.
    async fn list_indexes(&self) -> MetastoreResult<Vec<IndexMetadata>>;

    /// Replaces the index config. When the doc mapping changed, a new doc mapping uid is
    /// assigned. The index id cannot change.
    async fn update_index_config(
        &self,
        index_uid: &IndexUid,
        index_config: IndexConfig,
    ) -> MetastoreResult<IndexMetadata>;

    /// Sets the maturity of Published splits of the index to that of the given metadata (the
    /// index's merge policy changed: maturity follows the current policy). Splits that are no
    /// longer Published are left alone. Returns how many were updated.
    async fn update_split_maturities(
        &self,
        index_uid: &IndexUid,
        splits: &[SplitMetadata],
    ) -> MetastoreResult<usize>;

    /// Deletes the index row, its checkpoints, all its split rows, merge tasks and delete tasks;
    /// returns the splits it had, so the caller can delete their objects.
    async fn delete_index(&self, index_uid: &IndexUid) -> MetastoreResult<Vec<Split>>;

    /// Records splits as Staged (or updates splits that are still Staged). Fails with
    /// `FailedPrecondition` if one exists in another state, or belongs to another index;
    /// nothing is written then.
    async fn stage_splits(
        &self,
        index_uid: &IndexUid,
        splits: Vec<SplitMetadata>,
    ) -> MetastoreResult<()>;

    /// In ONE transaction: publishes `staged` splits, marks `replaced` splits for deletion and
    /// applies `checkpoint_delta` to the source's checkpoint. Fails, changing nothing, if a
    /// staged split is not Staged, a replaced split is not Published, or the delta does not
    /// start where the stored checkpoint ends — all with `FailedPrecondition`, including for
    /// split ids that do not exist in the index. Safe under concurrency: of two publishes
    /// replacing the same split, exactly one succeeds.
    async fn publish_splits(
        &self,
        index_uid: &IndexUid,
        staged: &[SplitId],
        replaced: &[SplitId],
        checkpoint_delta: Option<(SourceId, CheckpointDelta)>,
    ) -> MetastoreResult<()>;

    /// Splits matching `query`, ordered by split id.
    async fn list_splits(&self, query: ListSplitsQuery) -> MetastoreResult<Vec<Split>>;

    /// The number of splits matching `query` (none is read).
    async fn count_splits(&self, query: ListSplitsQuery) -> MetastoreResult<u64>;

    /// Marks splits (in any state) for deletion; unknown ids are ignored. Splits already marked
    /// keep their update timestamp (the janitor's grace period is not restarted). Merge tasks
    /// are left alone: claiming a task whose inputs are gone fails it.
    async fn mark_splits_for_deletion(
        &self,
        index_uid: &IndexUid,
        split_ids: &[SplitId],
    ) -> MetastoreResult<()>;

    /// Marks for deletion those of `split_ids` that are still Staged (an upload that was never
    /// published), and returns them; splits in another state are left alone, so a split
    /// published meanwhile is never touched. Once marked, a split can no longer be published:
    /// its object may then be deleted safely.
    async fn mark_staged_splits_for_deletion(
        &self,
        index_uid: &IndexUid,
        split_ids: &[SplitId],
    ) -> MetastoreResult<Vec<SplitId>>;

    /// Counts of splits grouped by index, state, merge scope (with the producing node) and
    /// maturity at `now`, computed by the database (for metrics: no split is listed).
    async fn split_stats(&self, now: i64) -> MetastoreResult<Vec<SplitStats>>;

    /// Deletes split rows that are Staged or MarkedForDeletion. Fails with
    /// `FailedPrecondition` (deleting nothing) if one is Published. Unknown ids are ignored.
    /// Merge tasks are left alone, as by [`Metastore::mark_splits_for_deletion`].
    async fn delete_splits(
        &self,
        index_uid: &IndexUid,
        split_ids: &[SplitId],
    ) -> MetastoreResult<()>;

    // ----- merge tasks -----

    /// Records merge tasks as `Pending`, in ONE transaction, and returns those created (in
    /// the order given). A task is skipped — not created, not an error — when one of its
    /// splits is not a Published split of the index, or is already an input of a live
    /// (`Pending` or `Running`) task, including one created earlier in the same call: a split
    /// is in at most one live task, even under concurrent calls. Fails with
    /// `FailedPrecondition` (creating nothing) when `max_attempts` is 0 or a task has no
    /// splits or lists a split twice.
    async fn create_merge_tasks(
        &self,
        index_uid: &IndexUid,
        tasks: Vec<NewMergeTask>,
        max_attempts: u32,
    ) -> MetastoreResult<Vec<MergeTask>>;

    /// Claims the oldest claimable task (of `index_uid` only, if given): `Pending`, or
    /// `Running` with a lease expired at `now` (`lease_expires_at <= now`). It becomes
    /// `Running`, owned by `node_id` until `now + lease_secs`, with one more attempt. On the
    /// way, tasks whose inputs are no longer all Published, or that used up `max_attempts`,
    /// are marked `Failed` and skipped. `None` when nothing is claimable. Concurrent claimers
    /// never get the same task. With `manual_only`, only tasks of manual compactions (a node
    /// whose automatic compaction is off). With `scope_node`, only tasks whose scope is that node's
    /// (`node_local` mode: a node claims only the tasks of its own splits).
    async fn claim_merge_task(
        &self,
        node_id: &str,
        lease_secs: u64,
        now: i64,
        index_uid: Option<&IndexUid>,
        scope_node: Option<&str>,
        manual_only: bool,
    ) -> MetastoreResult<Option<MergeTask>>;

    /// Gives up those of `task_ids` that are claimable (`Pending`, or `Running` with a lease
    /// expired at `now`): they become `Failed` with `reason`, their splits free to be planned
    /// again. Returns the ids released; others (running, finished, unknown) are left alone.
    async fn release_merge_tasks(
        &self,
        task_ids: &[String],
        reason: &str,
        now: i64,
    ) -> MetastoreResult<Vec<String>>;

    /// Extends the lease of a task `node_id` holds to `now + lease_secs` (even if it expired,
    /// as long as no other node claimed the task since). `FailedPrecondition` if the task is
    /// not `Running` with this owner; `NotFound` if there is no such task.
    async fn renew_merge_task_lease(
        &self,
        task_id: &str,
        node_id: &str,
        lease_secs: u64,
        now: i64,
    ) -> MetastoreResult<()>;

    /// In ONE transaction: publishes the merge's `output` splits (Staged) and marks the
    /// `replaced` splits (exactly the task's inputs, all still Published) for deletion, as
    /// [`Metastore::publish_splits`] does, and marks the task `Succeeded`. The task must be
    /// `Running` and owned by `node_id` (its lease may have expired, but no other node may
    /// have claimed it since). Otherwise `FailedPrecondition` (`NotFound` for an unknown
    /// index or task) and nothing changes: the caller discards its output.
    async fn publish_merge(
        &self,
        index_uid: &IndexUid,
        task_id: &str,
        node_id: &str,
        output: &[SplitId],
        replaced: &[SplitId],
        now: i64,
    ) -> MetastoreResult<()>;

    /// Reports that `node_id` failed to run the task: with `retry` and attempts left it goes
    /// back to `Pending` (lease cleared), otherwise it is `Failed`; `error` is recorded either
    /// way. Returns the updated task. `FailedPrecondition` if the task is not `Running` with
    /// this owner; `NotFound` if there is no such task.
    async fn fail_merge_task(
        &self,
        task_id: &str,
        node_id: &str,
        error: &str,
        retry: bool,
        now: i64,
    ) -> MetastoreResult<MergeTask>;

    /// Merge tasks, newest first (by task id), of `index_uid` only if given, in one of
    /// `states` (empty: any state), at most `limit` of them if given.
    async fn list_merge_tasks(
        &self,
        index_uid: Option<&IndexUid>,
        states: &[MergeTaskState],
        limit: Option<usize>,
    ) -> MetastoreResult<Vec<MergeTask>>;

    /// Deletes `Succeeded` and `Failed` tasks last updated before `finished_before`
    /// (seconds); returns how many were deleted.
    async fn delete_merge_tasks(&self, finished_before: i64) -> MetastoreResult<usize>;

    /// Puts the `Running` tasks held by `lease_owners` (incarnations declared dead) back to
    /// `Pending` at once, without waiting for their leases to expire; returns their ids.
    async fn requeue_merge_tasks(
        &self,
        lease_owners: &[String],
        now: i64,
    ) -> MetastoreResult<Vec<String>>;

    // ----- delete tasks -----

    /// Creates a delete task with the index's next opstamp (1 for the first), created at
    /// `now` (seconds), bound to the index's current doc mapping uid and default search
    /// fields (read in the same transaction): what it deletes never changes with a later
    /// update of the index.
    async fn create_delete_task(
        &self,
        index_uid: &IndexUid,
        delete_query: DeleteQuery,
        now: i64,
    ) -> MetastoreResult<DeleteTask>;

    /// The config of the index the day its doc mapping version `doc_mapping_uid` was created
    /// (`None` for a version older than this record, or of another index): what splits and
    /// WAL records of that version were written with.
    async fn doc_mapping_version(
        &self,
        index_uid: &IndexUid,
        doc_mapping_uid: &str,
    ) -> MetastoreResult<Option<IndexConfig>>;

    /// The delete tasks of `index_uid` whose opstamp is above `opstamp_gt`, by opstamp.
    async fn list_delete_tasks(
        &self,
        index_uid: &IndexUid,
        opstamp_gt: u64,
    ) -> MetastoreResult<Vec<DeleteTask>>;

    /// The last opstamp of every index that has delete tasks.
    async fn last_delete_opstamps(&self) -> MetastoreResult<BTreeMap<IndexUid, u64>>;

    /// Forgets the delete tasks of `index_uid` up to opstamp `up_to` — clamped so that the
    /// newest task is kept (the next opstamp follows it) and so that no split that can still
    /// be searched is less clean than what is forgotten (`delete_opstamp` below it): Staged and
    /// Published splits, and splits marked for deletion at or after `marked_since` (seconds;
    /// `as_of` searches may still see them). What the caller checked of documents not in
    /// splits yet (WAL records), the metastore checks of splits, in one transaction. Returns
    /// how many tasks were forgotten.
    async fn purge_delete_tasks(
        &self,
        index_uid: &IndexUid,
        up_to: u64,
        marked_since: i64,
    ) -> MetastoreResult<usize>;

    /// Records that Published splits are clean of more delete tasks without being rewritten
    /// (the tasks cannot reach them): each `(split, expected)` sets the split's metadata to
    /// `split` (its new `delete_opstamp`) if the split is still Published with
    /// `delete_opstamp == expected`. Returns how many were updated.
    async fn advance_split_delete_opstamps(
        &self,
        index_uid: &IndexUid,
        splits: &[(SplitMetadata, u64)],
    ) -> MetastoreResult<usize>;

    // ----- index templates -----

    /// Records an index template (`AlreadyExists` if one has its id).
    async fn create_index_template(&self, template: IndexTemplate) -> MetastoreResult<()>;

    /// Replaces the template of that id (`NotFound` if there is none).
    async fn update_index_template(&self, template: IndexTemplate) -> MetastoreResult<()>;

    /// The template with this id (`NotFound` otherwise).
    async fn index_template(&self, template_id: &str) -> MetastoreResult<IndexTemplate>;

    /// All templates, by id.
    async fn list_index_templates(&self) -> MetastoreResult<Vec<IndexTemplate>>;

    /// Deletes these templates, all or none (`NotFound` if one does not exist).
    async fn delete_index_templates(&self, template_ids: &[String]) -> MetastoreResult<()>;

    // ----- metric metadata -----

    /// Records the metadata of metric families of a metrics index, replacing what was
    /// recorded for the same family.
    async fn upsert_metric_metadata(
        &self,
        index_uid: &IndexUid,
        metadata: &[MetricMetadata],
    ) -> MetastoreResult<()>;

    /// The metric metadata of an index, by family name.
    async fn list_metric_metadata(
        &self,
        index_uid: &IndexUid,
    ) -> MetastoreResult<Vec<MetricMetadata>>;

    // ----- manual compactions -----

    /// Records a manual compaction of `index_uid` as `pending`.
    async fn create_compaction(
        &self,
        index_uid: &IndexUid,
        request: CompactionRequest,
        now: i64,
    ) -> MetastoreResult<Compaction>;

    /// Manual compactions, newest first, of `index_uid` only if given, in one of `states`
    /// (empty: any state).
    async fn list_compactions(
        &self,
        index_uid: Option<&IndexUid>,
        states: &[CompactionState],
    ) -> MetastoreResult<Vec<Compaction>>;

    /// Stores a compaction's state, progress, error and times (`NotFound` if unknown).
    async fn update_compaction(&self, compaction: &Compaction) -> MetastoreResult<()>;

    // ----- fences -----

    /// The same metastore, through a handle whose every write transaction first checks
    /// `fence` and refuses (`FailedPrecondition`, message starting with `fenced:`), changing
    /// nothing, when it no longer holds: a leader that lost its lease, or a node generation
    /// superseded by a restart, can no longer write.
    fn with_fence(&self, fence: Fence) -> Arc<dyn Metastore>;

    // ----- cluster -----

    /// The metastore's clock, in ms since the epoch: the cluster's one clock (PostgreSQL's
    /// `clock_timestamp()`; for SQLite, the clock of the machine holding the file).
    async fn clock_ms(&self) -> MetastoreResult<i64>;

    /// Registers a node (a new incarnation if it was registered before: its generation grows,
    /// fencing the old one out) with a first heartbeat at `now_ms`.
    async fn register_node(
        &self,
        cluster_id: &str,
        node_id: &str,
        advertise_address: &str,
        roles: &[String],
        now_ms: i64,
    ) -> MetastoreResult<NodeRecord>;

    /// Records a heartbeat of `identity` with what it reports about itself.
    /// `FailedPrecondition` (`fenced: …`) when the node was registered again since (a zombie)
    /// or is unknown.
    async fn heartbeat_node(
        &self,
        cluster_id: &str,
        identity: &NodeIdentity,
        info: serde_json::Value,
        now_ms: i64,
    ) -> MetastoreResult<()>;

    /// The nodes of the cluster (live or not), by id.
    async fn list_nodes(&self, cluster_id: &str) -> MetastoreResult<Vec<NodeRecord>>;

    /// Forgets the nodes whose last heartbeat is before `heartbeat_before_ms`; returns how many.
    async fn forget_nodes(
        &self,
        cluster_id: &str,
        heartbeat_before_ms: i64,
    ) -> MetastoreResult<usize>;

    /// Takes (or renews) the lease `name` for `holder` until `now_ms + ttl_ms`, if it is free,
    /// expired, or already `holder`'s; `None` when another holder has it. The fencing token
    /// grows whenever the holder changes. Only the current generation of a node may hold it.
    async fn acquire_lease(
        &self,
        cluster_id: &str,
        name: &str,
        holder: &NodeIdentity,
        ttl_ms: u64,
        now_ms: i64,
    ) -> MetastoreResult<Option<Lease>>;

    /// Gives the lease up at once if `holder` has it (graceful shutdown).
    async fn release_lease(
        &self,
        cluster_id: &str,
        name: &str,
        holder: &NodeIdentity,
    ) -> MetastoreResult<()>;

    /// The lease `name`, whoever holds it (expired or not).
    async fn get_lease(&self, cluster_id: &str, name: &str) -> MetastoreResult<Option<Lease>>;

    /// The shards of `index_uid` (of every index if `None`).
    async fn list_shards(&self, index_uid: Option<&IndexUid>) -> MetastoreResult<Vec<Shard>>;

    /// Opens shards, each on the given node. `NotFound` for an unknown index.
    async fn open_shards(&self, shards: Vec<(ShardKey, String)>) -> MetastoreResult<Vec<Shard>>;

    /// Closes shards (no more documents are routed to them); unknown ones are ignored.
    async fn close_shards(&self, keys: &[ShardKey]) -> MetastoreResult<()>;

    /// Deletes shards (their node published everything they held); unknown ones are ignored.
    async fn delete_shards(&self, keys: &[ShardKey]) -> MetastoreResult<()>;
}
