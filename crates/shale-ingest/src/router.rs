//! The shard host: the shards of this node (each a WAL queue with its indexing pipeline),
//! document validation, appends to a shard, and acknowledgements per commit mode.
//!
//! Which shards a node hosts is decided by the cluster's leader (the `shards` table);
//! [`IngestRouter::sync_shards`] follows it: an open shard is served (queue + pipeline), a
//! closed one keeps its pipeline until everything its WAL holds is published, then its queue
//! and its row are deleted. A WAL queue without a shard row (left by a crash, an older
//! version, or a deleted index) is drained the same way, or dropped when its index is gone.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use shale_index::{DocMapper, DocParsingError, ParsedDoc};
use shale_metastore::{IndexMetadata, MetastoreError, Shard, ShardKey, ShardState};
use shale_storage::{IndexStorages, StorageRef};
use shale_types::IndexUid;
use tokio::sync::RwLock;
use tracing::{info, warn};

use crate::metrics;
use crate::opstamps::DeleteOpstamps;
use crate::pipeline::{spawn_pipeline, PipelineEnv, PipelineHandle, PipelineParams, PreParsed};
use crate::wal::WalError;

/// When an ingest request is acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CommitMode {
    /// Once the documents are in the WAL (durable per the persist policy).
    #[default]
    Auto,
    /// Once the documents are in published splits (after the next commit).
    WaitFor,
    /// Cut a split now, and acknowledge once it is published.
    Force,
}

impl CommitMode {
    /// Parses `auto`, `wait_for`, `force` (and Elasticsearch's `refresh` values
    /// `false`, `wait_for`, `true`).
    pub fn parse(s: &str) -> Option<CommitMode> {
        match s {
            "auto" | "false" | "" => Some(CommitMode::Auto),
            "wait_for" | "wait-for" => Some(CommitMode::WaitFor),
            "force" | "true" => Some(CommitMode::Force),
            _ => None,
        }
    }
}

/// Errors of the ingest path (per-document errors are in [`IngestOutcome`]).
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// No such index.
    #[error("index `{0}` not found")]
    IndexNotFound(String),
    /// The WAL failed: nothing of the request was accepted.
    #[error("{0}")]
    Wal(#[from] WalError),
    /// The metastore failed.
    #[error("{0}")]
    Metastore(#[from] MetastoreError),
    /// The index's config cannot be served.
    #[error("{0}")]
    Index(#[from] shale_index::IndexError),
    /// The storage of the index cannot be resolved.
    #[error("{0}")]
    Storage(#[from] shale_storage::StorageError),
    /// The pipeline stopped before the commit completed (documents are in the WAL).
    #[error("indexing pipeline stopped before the documents were published; they are in the WAL and will be published after restart")]
    PipelineStopped,
    /// A limit of the node is reached; nothing of the request (or bulk item) was accepted.
    #[error("rate limited: {0}; retry later")]
    RateLimited(String),
    /// An unexpected failure before anything was written to the WAL.
    #[error("internal error, nothing was ingested: {0}")]
    Internal(String),
    /// The documents were handed to another node, which did not answer or failed after it
    /// may have appended them: they may or may not have been ingested (sending them again
    /// may index them twice).
    #[error("the outcome is unknown, the documents may or may not have been ingested (sending them again may index them twice): {0}")]
    OutcomeUnknown(String),
    /// The node cannot confirm which deletes apply to new documents (it has not reached the
    /// metastore within its lease): nothing was appended.
    #[error("this node cannot confirm the delete history with the metastore ({0}); nothing was ingested, retry later")]
    DeletesUnconfirmed(String),
    /// The request does not fit the index (documents sent to a metrics index, samples to a
    /// documents index): nothing was ingested.
    #[error("{0}")]
    WrongIndexKind(String),
    /// The shard is not (or no longer) open on this node: try another one.
    #[error("shard `{0}` is not open on this node")]
    ShardNotOpen(String),
    /// The index's storage cannot be reached lately: nothing was ingested; retry later.
    #[error("{0}")]
    StorageUnavailable(String),
    /// No open shard can take the documents now (no live indexer, or all failed).
    #[error("no shard can take documents of index `{index_id}` now: {reason}; retry later")]
    NoShardAvailable {
        /// The index.
        index_id: String,
        /// Why.
        reason: String,
    },
}

impl IngestError {
    /// Whether this failure guarantees that none of the request's documents reached a WAL,
    /// so that it may be sent to another shard without indexing anything twice. False when
    /// the documents were (or may have been) appended: the pipeline stopped after the append,
    /// the WAL took them but could not make them durable, or a forward got no answer.
    pub fn nothing_appended(&self) -> bool {
        match self {
            IngestError::PipelineStopped | IngestError::OutcomeUnknown(_) => false,
            IngestError::Wal(err) => err.nothing_appended(),
            _ => true,
        }
    }
}

/// Limits of the ingest path.
#[derive(Clone, Copy, Debug)]
pub struct IngestLimits {
    /// Bytes of ingest requests being handled at once (bodies read, validated, appended).
    pub max_in_flight_bytes: u64,
    /// Bytes of WAL records not yet in published splits (held in memory) before ingest is
    /// refused until indexing catches up.
    pub max_wal_memory_bytes: u64,
}

impl Default for IngestLimits {
    fn default() -> Self {
        IngestLimits {
            max_in_flight_bytes: 256 << 20,
            max_wal_memory_bytes: 2 << 30,
        }
    }
}

/// Bytes of an ingest request admitted by [`IngestRouter::admit_bytes`]; released on drop.
pub struct InFlightPermit {
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// What happened to each document of an ingest request.
#[derive(Debug, Default)]
pub struct IngestOutcome {
    /// `None` for an accepted document, else why it was rejected; in request order.
    pub results: Vec<Option<DocParsingError>>,
    /// Number accepted.
    pub num_ingested: usize,
    /// Number rejected.
    pub num_rejected: usize,
}

/// Documents validated against a doc mapping: per-document results, and the valid ones raw
/// and parsed.
pub struct Validated {
    /// Per-document outcome, in request order.
    pub outcome: IngestOutcome,
    /// The valid documents as received.
    pub raw: Vec<bytes::Bytes>,
    /// The same, parsed.
    pub parsed: Vec<ParsedDoc>,
}

/// Validates `docs` against `doc_mapper`, off the async runtime.
pub async fn validate(
    doc_mapper: Arc<DocMapper>,
    docs: Vec<bytes::Bytes>,
) -> Result<Validated, IngestError> {
    let validated = tokio::task::spawn_blocking(move || {
        let mut outcome = IngestOutcome::default();
        let mut raw = Vec::with_capacity(docs.len());
        let mut parsed = Vec::with_capacity(docs.len());
        for doc in docs {
            match doc_mapper.parse_doc(&doc) {
                Ok(parsed_doc) => {
                    outcome.results.push(None);
                    raw.push(doc);
                    parsed.push(parsed_doc);
                }
                Err(err) => outcome.results.push(Some(err)),
            }
        }
        outcome.num_ingested = raw.len();
        outcome.num_rejected = outcome.results.len() - raw.len();
        Validated {
            outcome,
            raw,
            parsed,
        }
    })
    .await
    .map_err(|err| {
        IngestError::Internal(format!("document validation failed unexpectedly: {err}"))
    })?;
    metrics::DOCS_REJECTED.inc_by(validated.outcome.num_rejected as u64);
    Ok(validated)
}

/// A shard this node hosts: its WAL queue and pipeline.
struct ServedShard {
    key: ShardKey,
    doc_mapper: Arc<DocMapper>,
    /// The index config its pipeline was built from (a new one restarts it).
    config: shale_config::IndexConfig,
    /// Whether documents are still appended to it (closed shards only drain).
    open: std::sync::atomic::AtomicBool,
    pipeline: PipelineHandle,
    /// The delete opstamps of its records not published yet.
    stamps: std::sync::Mutex<StampRuns>,
}

/// The delete opstamps of a shard's records, by runs: stamps never decrease along a shard
/// (an append reads its stamp under the lock that advancing takes), so a run starts where
/// the stamp changes. Records already in the WAL when the shard was served have stamps not
/// tracked here.
#[derive(Debug, Default)]
struct StampRuns {
    /// Records below this position were in the WAL before the shard was served.
    untracked_below: u64,
    /// (first position, stamp) of each run, oldest first.
    runs: std::collections::VecDeque<(u64, u64)>,
}

impl StampRuns {
    fn record(&mut self, first_position: u64, stamp: u64) {
        if self.runs.back().is_none_or(|(_, last)| *last != stamp) {
            self.runs.push_back((first_position, stamp));
        }
    }

    /// The lowest stamp of the records from `first_unpublished` to `next_position`
    /// (excluded); `None` when there is none. Runs wholly published are forgotten.
    fn lowest_pending(&mut self, first_unpublished: u64, next_position: u64) -> Option<u64> {
        if first_unpublished >= next_position {
            return None;
        }
        if first_unpublished < self.untracked_below {
            return Some(0);
        }
        while self.runs.len() > 1 && self.runs[1].0 <= first_unpublished {
            self.runs.pop_front();
        }
        match self.runs.front() {
            Some((first, stamp)) if *first <= first_unpublished => Some(*stamp),
            // Records before the first tracked run: not tracked.
            _ => Some(0),
        }
    }
}

/// What a node reports about one of its shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardStatus {
    /// The shard.
    pub key: ShardKey,
    /// Open (appended to) or closed (draining).
    pub open: bool,
    /// The next WAL position to be assigned.
    pub next_position: u64,
    /// The last published position.
    pub published_position: Option<u64>,
}

/// The shard host of a node.
pub struct IngestRouter {
    env: PipelineEnv,
    storages: IndexStorages,
    shards: RwLock<HashMap<String, Arc<ServedShard>>>,
    limits: IngestLimits,
    /// One permit per in-flight byte (in KiB units, so that any limit fits a `u32`).
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Bytes appended per index since the last rate sample, and the sample's start.
    rates: std::sync::Mutex<(std::time::Instant, HashMap<String, u64>)>,
    /// The delete opstamps stamped on acknowledged documents.
    opstamps: Arc<DeleteOpstamps>,
    /// Held while the shards to serve are read and served (see [`IngestRouter::sync_lock`]).
    sync: tokio::sync::Mutex<()>,
}

/// Permits of the in-flight semaphore count KiB.
const IN_FLIGHT_UNIT: u64 = 1024;

/// The shard of a WAL queue named `{index_uid}/{source_id}/{shard_id}`.
fn shard_of_queue(queue: &str) -> Option<ShardKey> {
    let mut parts = queue.splitn(3, '/');
    let index_uid: IndexUid = parts.next()?.parse().ok()?;
    let source_id = parts.next()?.to_string();
    let shard_id = parts.next()?.to_string();
    Some(ShardKey {
        index_uid,
        source_id,
        shard_id,
    })
}

/// Builds the pipeline parameters from an index's metadata.
pub fn pipeline_params(
    index: &IndexMetadata,
    storage: StorageRef,
) -> Result<PipelineParams, shale_index::IndexError> {
    let config = &index.index_config;
    let doc_mapper = Arc::new(DocMapper::for_index(config)?);
    let settings = &config.indexing_settings;
    Ok(PipelineParams {
        index_uid: index.index_uid.clone(),
        doc_mapper,
        storage,
        commit_timeout: Duration::from_secs(settings.commit_timeout_secs.max(1)),
        split_num_docs_target: settings.split_num_docs_target.max(1),
        merge_policy: settings.merge_policy.clone(),
        max_num_partitions: config.doc_mapping.max_num_partitions,
        writer_heap_bytes: settings
            .heap_size_bytes()
            .map_err(|err| shale_index::IndexError::InvalidArgument(err.to_string()))?
            .map(|bytes| usize::try_from(bytes).unwrap_or(usize::MAX)),
        metrics: config
            .metrics
            .as_ref()
            .map(|metrics| crate::pipeline::MetricsParams {
                sort_labels: metrics.sort_labels.clone(),
                bucket_secs: metrics.time_bucket_secs(),
            }),
    })
}

impl IngestRouter {
    /// Where the indexes' splits live.
    pub fn storages(&self) -> &IndexStorages {
        &self.storages
    }

    /// A router hosting no shard yet.
    pub fn new(env: PipelineEnv, storages: IndexStorages, limits: IngestLimits) -> Self {
        let units = (limits.max_in_flight_bytes / IN_FLIGHT_UNIT).max(1);
        IngestRouter {
            env,
            storages,
            shards: RwLock::new(HashMap::new()),
            limits,
            in_flight: Arc::new(tokio::sync::Semaphore::new(
                usize::try_from(units).unwrap_or(usize::MAX >> 4),
            )),
            rates: std::sync::Mutex::new((std::time::Instant::now(), HashMap::new())),
            opstamps: Arc::new(DeleteOpstamps::new()),
            sync: tokio::sync::Mutex::new(()),
        }
    }

    /// The delete opstamps this node stamps on the documents it acknowledges.
    pub fn delete_opstamps(&self) -> &Arc<DeleteOpstamps> {
        &self.opstamps
    }

    /// Serializes the decisions of what to serve: whoever reads the shards table to serve,
    /// close or drop shards ([`IngestRouter::sync_shards`], or serving one shard on demand)
    /// holds this from before the read until it is done, so that no decision is taken on a
    /// read older than a shard served meanwhile (a WAL queue without a row in a stale read
    /// would be closed, or dropped as a deleted index's, with its acknowledged documents).
    pub async fn sync_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.sync.lock().await
    }

    /// Catches up with the delete tasks in the metastore (at start, before serving a shard,
    /// and periodically, for a delete whose call this node missed). With `confirmed_since`
    /// (the start of this node's last heartbeat the metastore took), what is known is
    /// confirmed from then for the lease (see [`crate::opstamps`]).
    pub async fn refresh_delete_opstamps(
        &self,
        confirmed_since: Option<std::time::Instant>,
    ) -> Result<(), IngestError> {
        let started = std::time::Instant::now();
        let last = self.env.metastore.last_delete_opstamps().await?;
        self.opstamps.advance_all(last).await;
        if let Some(since) = confirmed_since {
            self.opstamps.confirm(since.min(started));
        }
        Ok(())
    }

    /// Has appends wait for a confirmation of the delete history younger than `lease`
    /// (cluster nodes: see [`crate::opstamps`]).
    pub fn with_delete_stamp_lease(mut self, lease: std::time::Duration) -> Self {
        self.opstamps = Arc::new(DeleteOpstamps::with_lease(lease));
        self
    }

    /// The limits.
    pub fn limits(&self) -> IngestLimits {
        self.limits
    }

    /// The semaphore of in-flight ingest bytes (one permit per KiB).
    pub fn in_flight_permits(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.in_flight
    }

    /// Admits a request of `bytes` (its body size, or the body limit when unknown), or refuses
    /// it with [`IngestError::RateLimited`] when the node already handles
    /// `max_in_flight_bytes`.
    pub fn admit_bytes(&self, bytes: u64) -> Result<InFlightPermit, IngestError> {
        let units = bytes.div_ceil(IN_FLIGHT_UNIT).max(1);
        let max_units = (self.limits.max_in_flight_bytes / IN_FLIGHT_UNIT).max(1);
        let units = u32::try_from(units.min(max_units)).unwrap_or(u32::MAX);
        self.in_flight
            .clone()
            .try_acquire_many_owned(units)
            .map(|permit| InFlightPermit { _permit: permit })
            .map_err(|_| {
                metrics::INGEST_REJECTED_REQUESTS
                    .with_label_values(&["in_flight_bytes"])
                    .inc();
                IngestError::RateLimited(format!(
                    "too many ingest bytes in flight (max_in_flight_ingest_bytes = {})",
                    self.limits.max_in_flight_bytes
                ))
            })
    }

    /// Brings the hosted shards in line with the shards table: `shards` are the rows of the
    /// shards assigned to this node, `indexes` every index. Serves the open ones, closes and
    /// drains the others, and deletes the queues (and rows, through `delete_rows`) of drained
    /// closed shards. Returns the keys whose rows should be deleted.
    /// The caller holds [`IngestRouter::sync_lock`] since before it read `assigned` and
    /// `indexes`.
    pub async fn sync_shards(
        &self,
        assigned: &[Shard],
        indexes: &[IndexMetadata],
    ) -> Result<Vec<ShardKey>, IngestError> {
        let by_uid: HashMap<&IndexUid, &IndexMetadata> =
            indexes.iter().map(|i| (&i.index_uid, i)).collect();
        let mut wanted: HashMap<String, (ShardKey, bool)> = HashMap::new();
        for shard in assigned {
            wanted.insert(
                shard.key.queue_name(),
                (shard.key.clone(), shard.state == ShardState::Open),
            );
        }
        // Queues without a row: drain them as closed shards (their index still exists).
        for (queue, _) in self.env.wal.queues().await {
            if wanted.contains_key(&queue) {
                continue;
            }
            match shard_of_queue(&queue) {
                Some(key) if by_uid.contains_key(&key.index_uid) => {
                    wanted.insert(queue, (key, false));
                }
                _ => {
                    info!(%queue, "deleting the WAL queue of a deleted index");
                    self.drop_shard(&queue).await?;
                }
            }
        }
        // Serve or close.
        for (queue, (key, open)) in &wanted {
            let Some(index) = by_uid.get(&key.index_uid) else {
                continue;
            };
            let served = self.shards.read().await.get(queue).cloned();
            match served {
                Some(served) if served.config != index.index_config => {
                    // The index was updated: index what is not published yet with the new
                    // config.
                    self.restart_shard(queue, key, *open).await?;
                }
                Some(served) => served
                    .open
                    .store(*open, std::sync::atomic::Ordering::Release),
                None => {
                    self.serve_shard(index, key, *open).await?;
                }
            }
        }
        // Stop serving what is not wanted any more (its index was deleted).
        let stale: Vec<String> = self
            .shards
            .read()
            .await
            .keys()
            .filter(|queue| !wanted.contains_key(*queue))
            .cloned()
            .collect();
        for queue in stale {
            self.drop_shard(&queue).await?;
        }
        // Retire the drained closed shards.
        let mut retired = Vec::new();
        for status in self.shard_statuses().await {
            let drained = status
                .next_position
                .checked_sub(1)
                .is_none_or(|last| status.published_position.is_some_and(|p| p >= last));
            if !status.open && drained {
                info!(shard = %status.key.queue_name(), "closed shard drained: deleting it");
                self.drop_shard(&status.key.queue_name()).await?;
                retired.push(status.key);
            }
        }
        Ok(retired)
    }

    /// Starts serving the shard `key` of `index` (its queue is created if missing; its
    /// pipeline resumes from the checkpoint).
    pub async fn serve_shard(
        &self,
        index: &IndexMetadata,
        key: &ShardKey,
        open: bool,
    ) -> Result<(), IngestError> {
        let queue = key.queue_name();
        // Documents acknowledged from now on must carry the index's current opstamp.
        self.refresh_delete_opstamps(None).await?;
        let mut shards = self.shards.write().await;
        if let Some(served) = shards.get(&queue) {
            served
                .open
                .store(open, std::sync::atomic::Ordering::Release);
            return Ok(());
        }
        let storage = self
            .storages
            .for_index(index.index_id(), index.index_config.index_uri.as_deref())?;
        let params = pipeline_params(index, storage)?;
        let position = index.checkpoint(&key.source_id).position(&queue);
        self.env.wal.ensure_queue(&queue, position).await?;
        // Records at or before the checkpoint are published: drop them.
        if let Some(position) = position {
            self.env.wal.truncate(&queue, position).await?;
        }
        let doc_mapper = params.doc_mapper.clone();
        let untracked_below = self
            .env
            .wal
            .queues()
            .await
            .into_iter()
            .find(|(name, _)| name == &queue)
            .map_or(0, |(_, next)| next);
        let is_metrics = params.metrics.is_some();
        let pipeline = spawn_pipeline(self.env.clone(), params, queue.clone(), position);
        if is_metrics && self.env.live.enabled() {
            // What the WAL holds unpublished is readable again, as before a restart.
            let index_uid = key.index_uid.to_string();
            self.env.live.serve(&index_uid, &queue, position);
            let load = self.env.live.clone().load_from_wal(
                self.env.wal.clone(),
                index_uid,
                queue.clone(),
                position.map_or(0, |p| p + 1),
            );
            tokio::spawn(async move {
                if let Err(err) = load.await {
                    warn!(%err, "reading a metrics shard's unpublished samples from the WAL failed: they are visible once published");
                }
            });
        }
        info!(shard = %queue, open, "serving shard");
        shards.insert(
            queue,
            Arc::new(ServedShard {
                key: key.clone(),
                doc_mapper,
                config: index.index_config.clone(),
                open: std::sync::atomic::AtomicBool::new(open),
                pipeline,
                stamps: std::sync::Mutex::new(StampRuns {
                    untracked_below,
                    runs: Default::default(),
                }),
            }),
        );
        Ok(())
    }

    /// Stops the pipeline of a shard, waits until it is gone, and serves the shard again from
    /// its checkpoint with the index's current config (re-read: the stopped pipeline may have
    /// published since the caller read it). Appends in between wait for the write lock.
    async fn restart_shard(
        &self,
        queue: &str,
        key: &ShardKey,
        open: bool,
    ) -> Result<(), IngestError> {
        let mut shards = self.shards.write().await;
        let Some(served) = shards.remove(queue) else {
            return Ok(());
        };
        drop(shards);
        info!(shard = %queue, "index config changed: restarting the shard's pipeline");
        served.pipeline.stop();
        // Appends in flight hold the shard for a moment; then wait for the task to end, so
        // that nothing of the old pipeline publishes after the checkpoint is re-read.
        let mut served = served;
        for _ in 0..500 {
            match Arc::try_unwrap(served) {
                Ok(owned) => {
                    owned.pipeline.stop_and_wait().await;
                    break;
                }
                Err(shared) => {
                    served = shared;
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
        let index = self
            .env
            .metastore
            .index_metadata(&key.index_uid.index_id)
            .await?;
        if index.index_uid != key.index_uid {
            return Ok(());
        }
        self.serve_shard(&index, key, open).await
    }

    /// Stops the pipeline of a shard and deletes its WAL queue.
    async fn drop_shard(&self, queue: &str) -> Result<(), IngestError> {
        if let Some(served) = self.shards.write().await.remove(queue) {
            served.pipeline.stop();
            self.env
                .live
                .forget(&served.key.index_uid.to_string(), queue);
        }
        self.env.wal.delete_queue(queue).await?;
        Ok(())
    }

    /// Stops every pipeline (the WAL is kept: they resume at the next start).
    pub async fn stop(&self) {
        for served in self.shards.write().await.drain().map(|(_, s)| s) {
            served.pipeline.stop();
        }
    }

    /// Stops serving the shards of `index_uid` and deletes their WAL queues (index deleted).
    pub async fn remove_index(&self, index_uid: &IndexUid) -> Result<(), IngestError> {
        let prefix = format!("{index_uid}/");
        for (queue, _) in self.env.wal.queues().await {
            if queue.starts_with(&prefix) {
                self.drop_shard(&queue).await?;
            }
        }
        Ok(())
    }

    /// The doc mapper of the open shard `key` served here, if any.
    pub async fn open_shard_mapper(&self, key: &ShardKey) -> Option<Arc<DocMapper>> {
        let shards = self.shards.read().await;
        let served = shards.get(&key.queue_name())?;
        served
            .open
            .load(std::sync::atomic::Ordering::Acquire)
            .then(|| served.doc_mapper.clone())
    }

    /// Appends documents validated with the doc mapping `doc_mapping_uid` to the open shard
    /// `key` and waits as `commit` says. The records carry that uid: they are indexed with
    /// that mapping even if the index is updated before they are.
    pub async fn append(
        &self,
        key: &ShardKey,
        raw: &[bytes::Bytes],
        parsed: Vec<ParsedDoc>,
        doc_mapping_uid: &str,
        commit: CommitMode,
    ) -> Result<(), IngestError> {
        let queue = key.queue_name();
        let served = self
            .shards
            .read()
            .await
            .get(&queue)
            .cloned()
            .filter(|s| s.open.load(std::sync::atomic::Ordering::Acquire))
            .ok_or_else(|| IngestError::ShardNotOpen(queue.clone()))?;
        if raw.is_empty() {
            if commit == CommitMode::Force {
                // Cut the batch, and answer once what the shard holds is published.
                let next = self
                    .env
                    .wal
                    .queues()
                    .await
                    .into_iter()
                    .find(|(q, _)| *q == queue)
                    .map_or(0, |(_, next)| next);
                served.pipeline.force_commit();
                if next > 0 {
                    served
                        .pipeline
                        .wait_published(next - 1)
                        .await
                        .map_err(|_| IngestError::PipelineStopped)?;
                }
            }
            return Ok(());
        }
        let backlog = self.env.wal.backlog_bytes();
        if backlog >= self.limits.max_wal_memory_bytes {
            metrics::INGEST_REJECTED_REQUESTS
                .with_label_values(&["wal_memory"])
                .inc();
            return Err(IngestError::RateLimited(format!(
                "WAL full: {backlog} bytes are not indexed yet (max_wal_memory_bytes = {})",
                self.limits.max_wal_memory_bytes
            )));
        }
        let refs: Vec<&[u8]> = raw.iter().map(|d| d.as_ref()).collect();
        // The opstamp cannot advance until the records are in the WAL: a delete task created
        // meanwhile reaches these documents (acknowledged before it), later ones do not.
        let opstamps = self.opstamps.read().await;
        if let Err(unconfirmed) = self.opstamps.check_confirmed() {
            return Err(IngestError::DeletesUnconfirmed(
                match unconfirmed.lapsed_for {
                    Some(lapsed) => {
                        format!("its last confirmation lapsed {} ms ago", lapsed.as_millis())
                    }
                    None => "it has not reached the metastore yet".to_string(),
                },
            ));
        }
        let opstamp = opstamps.get(&key.index_uid);
        let positions = self
            .env
            .wal
            .append_with_prefix(
                &queue,
                &crate::opstamps::record_prefix(opstamp, doc_mapping_uid),
                &refs,
            )
            .await?;
        if let Some((first, _)) = positions {
            served
                .stamps
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .record(first, opstamp);
        }
        drop(opstamps);
        if let (Some((first, _)), true) = (positions, served.config.metrics.is_some()) {
            self.keep_live(&served, &queue, first, opstamp, raw).await;
        }
        // The knowledge lapsed while the records were written: a delete created meanwhile may
        // have been acknowledged without this node, and reach them.
        let lapsed = self.opstamps.check_confirmed().is_err();
        let mut parsed = parsed;
        for doc in &mut parsed {
            doc.opstamp = opstamp;
        }
        let bytes: u64 = raw.iter().map(|d| d.len() as u64).sum();
        metrics::DOCS_INGESTED.inc_by(raw.len() as u64);
        metrics::BYTES_INGESTED.inc_by(bytes);
        {
            let mut rates = self.rates.lock().unwrap_or_else(|p| p.into_inner());
            *rates.1.entry(key.index_uid.to_string()).or_default() += bytes;
        }
        let pipeline = &served.pipeline;
        if let (Some((first_position, _)), false) = (positions, parsed.is_empty()) {
            pipeline.offer_parsed(PreParsed {
                first_position,
                docs: parsed,
                doc_mapping_uid: Arc::from(doc_mapping_uid),
            });
        }
        pipeline.notify_new_records();
        if lapsed {
            return Err(IngestError::OutcomeUnknown(
                "this node lost contact with the metastore while the documents were written: \
                 a delete created meanwhile may apply to them"
                    .to_string(),
            ));
        }
        match (commit, positions) {
            (CommitMode::Auto, _) | (CommitMode::WaitFor, None) => {}
            (CommitMode::WaitFor, Some((_, last))) => {
                pipeline
                    .wait_published(last)
                    .await
                    .map_err(|_| IngestError::PipelineStopped)?;
            }
            (CommitMode::Force, positions) => {
                pipeline.force_commit();
                if let Some((_, last)) = positions {
                    pipeline
                        .wait_published(last)
                        .await
                        .map_err(|_| IngestError::PipelineStopped)?;
                }
            }
        }
        Ok(())
    }

    /// The open shards of `index_uid` served here.
    pub async fn open_shards_of(&self, index_uid: &IndexUid) -> Vec<ShardKey> {
        self.shards
            .read()
            .await
            .values()
            .filter(|s| {
                &s.key.index_uid == index_uid && s.open.load(std::sync::atomic::Ordering::Acquire)
            })
            .map(|s| s.key.clone())
            .collect()
    }

    /// Per index, the lowest delete opstamp of the records this node holds and has not
    /// published yet (indexes with none are absent): a delete task at or below it has reached
    /// every such record (0 when not known). The leader forgets a task only once every node
    /// holding records of the index reports them above it.
    pub async fn pending_delete_opstamps(&self) -> BTreeMap<IndexUid, u64> {
        let served: Vec<Arc<ServedShard>> = self.shards.read().await.values().cloned().collect();
        let next: HashMap<String, u64> = self.env.wal.queues().await.into_iter().collect();
        let mut lowest: BTreeMap<IndexUid, u64> = BTreeMap::new();
        for shard in served {
            let next_position = next.get(&shard.key.queue_name()).copied().unwrap_or(0);
            let first_unpublished = shard.pipeline.published_position().map_or(0, |p| p + 1);
            let pending = shard
                .stamps
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .lowest_pending(first_unpublished, next_position);
            if let Some(stamp) = pending {
                let entry = lowest.entry(shard.key.index_uid.clone()).or_insert(stamp);
                *entry = (*entry).min(stamp);
            }
        }
        lowest
    }

    /// The shards served here, with their positions.
    pub async fn shard_statuses(&self) -> Vec<ShardStatus> {
        let served: Vec<Arc<ServedShard>> = self.shards.read().await.values().cloned().collect();
        let next: HashMap<String, u64> = self.env.wal.queues().await.into_iter().collect();
        let mut statuses: Vec<ShardStatus> = served
            .iter()
            .map(|s| ShardStatus {
                key: s.key.clone(),
                open: s.open.load(std::sync::atomic::Ordering::Acquire),
                next_position: next.get(&s.key.queue_name()).copied().unwrap_or(0),
                published_position: s.pipeline.published_position(),
            })
            .collect();
        statuses.sort_by(|a, b| a.key.cmp(&b.key));
        statuses
    }

    /// Bytes per second appended per index since the previous call (for the leader's shard
    /// allocation), keyed by index uid.
    pub fn take_ingest_rates(&self) -> HashMap<String, f64> {
        let mut rates = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = rates.0.elapsed().as_secs_f64().max(0.001);
        let out = rates
            .1
            .drain()
            .map(|(index, bytes)| (index, bytes as f64 / elapsed))
            .collect();
        rates.0 = std::time::Instant::now();
        out
    }

    /// Keeps the metrics records just appended at `first` for PromQL, before they are
    /// acknowledged; when memory for them is short, the shard cuts its batch early.
    async fn keep_live(
        &self,
        served: &ServedShard,
        queue: &str,
        first: u64,
        opstamp: u64,
        raw: &[bytes::Bytes],
    ) {
        if !self.env.live.enabled() {
            return;
        }
        let (live, index_uid, queue) = (
            self.env.live.clone(),
            served.key.index_uid.to_string(),
            queue.to_string(),
        );
        let records = raw.to_vec();
        let kept = tokio::task::spawn_blocking(move || {
            live.insert_encoded(&index_uid, &queue, first, opstamp, &records)
        })
        .await;
        if !matches!(kept, Ok(true)) {
            served.pipeline.force_commit();
        }
    }

    /// Refreshes the WAL size gauges and those of the samples kept for PromQL.
    pub async fn update_wal_metrics(&self) {
        metrics::WAL_MEMORY_BYTES.set(self.env.wal.memory_size().await as i64);
        metrics::WAL_BACKLOG_BYTES.set(self.env.wal.backlog_bytes() as i64);
        let live = self.env.live.stats();
        metrics::LIVE_BYTES.set(live.bytes as i64);
        metrics::LIVE_SAMPLES.set(live.samples as i64);
        metrics::LIVE_SERIES.set(live.series as i64);
    }
}

/// Warns about an error of the background shard synchronization.
pub fn log_sync_error(err: &IngestError) {
    warn!(%err, "shard synchronization failed");
}

#[cfg(test)]
mod stamp_tests {
    use super::StampRuns;

    #[test]
    fn the_lowest_pending_stamp_follows_publication() {
        let mut runs = StampRuns {
            untracked_below: 10,
            runs: Default::default(),
        };
        runs.record(10, 3);
        runs.record(15, 3);
        runs.record(20, 5);
        // Records from before the shard was served: unknown.
        assert_eq!(runs.lowest_pending(8, 25), Some(0));
        assert_eq!(runs.lowest_pending(12, 25), Some(3));
        assert_eq!(runs.lowest_pending(20, 25), Some(5));
        assert_eq!(runs.runs.len(), 1, "published runs are forgotten");
        assert_eq!(runs.lowest_pending(25, 25), None, "nothing pending");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shale_types::INGEST_API_SOURCE_ID;

    #[test]
    fn queue_names_parse_back_into_shard_keys() {
        let key = ShardKey {
            index_uid: IndexUid::new("logs"),
            source_id: INGEST_API_SOURCE_ID.to_string(),
            shard_id: "01ABC".to_string(),
        };
        assert_eq!(shard_of_queue(&key.queue_name()), Some(key));
        assert_eq!(shard_of_queue("nonsense"), None);
    }
}
