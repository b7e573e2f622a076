//! The router: validates documents against their index's doc mapping, appends the valid ones
//! to the index's shard in the WAL, and acknowledges per the requested commit mode. It also
//! owns the shards and pipelines of the indexes this node serves.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use shale_index::{DocMapper, DocParsingError};
use shale_metastore::{IndexMetadata, MetastoreError};
use shale_storage::{IndexStorages, StorageRef};
use shale_types::{new_ulid, IndexUid, INGEST_API_SOURCE_ID};
use tokio::sync::RwLock;
use tracing::info;

use crate::metrics;
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

struct ServedIndex {
    index_uid: IndexUid,
    doc_mapper: Arc<DocMapper>,
    /// The shard new documents go to.
    active_queue: String,
    /// Every shard of the index on this node (the active one included), with its pipeline.
    pipelines: HashMap<String, PipelineHandle>,
}

/// The ingest router of a node.
pub struct IngestRouter {
    env: PipelineEnv,
    storages: IndexStorages,
    indexes: RwLock<HashMap<String, Arc<ServedIndex>>>,
    limits: IngestLimits,
    /// One permit per in-flight byte (in KiB units, so that any limit fits a `u32`).
    in_flight: Arc<tokio::sync::Semaphore>,
}

/// Permits of the in-flight semaphore count KiB.
const IN_FLIGHT_UNIT: u64 = 1024;

/// Queue name of a shard: `{index_uid}/{source_id}/{shard_id}`.
fn queue_name(index_uid: &IndexUid, shard_id: &str) -> String {
    format!("{index_uid}/{INGEST_API_SOURCE_ID}/{shard_id}")
}

fn queue_prefix(index_uid: &IndexUid) -> String {
    format!("{index_uid}/{INGEST_API_SOURCE_ID}/")
}

/// Builds the pipeline parameters from an index's metadata.
pub fn pipeline_params(
    index: &IndexMetadata,
    storage: StorageRef,
) -> Result<PipelineParams, shale_index::IndexError> {
    let config = &index.index_config;
    let doc_mapper = Arc::new(DocMapper::new(
        &config.doc_mapping,
        &config.search_settings,
    )?);
    let settings = &config.indexing_settings;
    Ok(PipelineParams {
        index_uid: index.index_uid.clone(),
        doc_mapper,
        storage,
        commit_timeout: Duration::from_secs(settings.commit_timeout_secs.max(1)),
        split_num_docs_target: settings.split_num_docs_target.max(1),
        merge_policy: settings.merge_policy.clone(),
        max_num_partitions: config.doc_mapping.max_num_partitions,
    })
}

impl IngestRouter {
    /// A router with no index served yet.
    pub fn new(env: PipelineEnv, storages: IndexStorages, limits: IngestLimits) -> Self {
        let units = (limits.max_in_flight_bytes / IN_FLIGHT_UNIT).max(1);
        IngestRouter {
            env,
            storages,
            indexes: RwLock::new(HashMap::new()),
            limits,
            in_flight: Arc::new(tokio::sync::Semaphore::new(
                usize::try_from(units).unwrap_or(usize::MAX >> 4),
            )),
        }
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

    /// Starts serving every index of the metastore: resumes each shard found in the WAL from
    /// its checkpoint, and drops WAL queues of indexes that no longer exist.
    pub async fn start(&self) -> Result<(), IngestError> {
        let indexes = self.env.metastore.list_indexes().await?;
        let known: Vec<String> = indexes.iter().map(|i| queue_prefix(&i.index_uid)).collect();
        for (queue, _) in self.env.wal.queues().await {
            if !known.iter().any(|prefix| queue.starts_with(prefix)) {
                info!(%queue, "deleting WAL queue of a deleted index");
                self.env.wal.delete_queue(&queue).await?;
            }
        }
        for index in indexes {
            self.serve_index(&index).await?;
        }
        Ok(())
    }

    /// Starts (or restarts, after a config change) serving `index`.
    pub async fn serve_index(&self, index: &IndexMetadata) -> Result<(), IngestError> {
        self.stop_index(index.index_id()).await;
        let storage = self
            .storages
            .for_index(index.index_id(), index.index_config.index_uri.as_deref())?;
        let params = pipeline_params(index, storage)?;
        let checkpoint = index.checkpoint(INGEST_API_SOURCE_ID);
        let prefix = queue_prefix(&index.index_uid);
        let mut queues: Vec<String> = self
            .env
            .wal
            .queues()
            .await
            .into_iter()
            .map(|(q, _)| q)
            .filter(|q| q.starts_with(&prefix))
            .collect();
        if queues.is_empty() {
            queues.push(queue_name(&index.index_uid, &new_ulid()));
        }
        let mut pipelines = HashMap::new();
        for queue in &queues {
            let position = checkpoint.position(queue);
            self.env.wal.ensure_queue(queue, position).await?;
            // Records at or before the checkpoint are published: drop them.
            if let Some(position) = position {
                self.env.wal.truncate(queue, position).await?;
            }
            let handle = spawn_pipeline(self.env.clone(), params.clone(), queue.clone(), position);
            pipelines.insert(queue.clone(), handle);
        }
        let served = ServedIndex {
            index_uid: index.index_uid.clone(),
            doc_mapper: params.doc_mapper.clone(),
            active_queue: queues.last().cloned().unwrap_or_default(),
            pipelines,
        };
        self.indexes
            .write()
            .await
            .insert(index.index_id().to_string(), Arc::new(served));
        Ok(())
    }

    /// Stops the pipelines of `index_id` (WAL kept).
    pub async fn stop_index(&self, index_id: &str) {
        if let Some(served) = self.indexes.write().await.remove(index_id) {
            for handle in served.pipelines.values() {
                handle.stop();
            }
        }
    }

    /// Stops serving `index_id` and deletes its WAL queues (index deleted).
    pub async fn remove_index(&self, index_uid: &IndexUid) -> Result<(), IngestError> {
        self.stop_index(&index_uid.index_id).await;
        let prefix = queue_prefix(index_uid);
        for (queue, _) in self.env.wal.queues().await {
            if queue.starts_with(&prefix) {
                self.env.wal.delete_queue(&queue).await?;
            }
        }
        Ok(())
    }

    /// Validates `docs` (one JSON document each), appends the valid ones to the index's shard
    /// and waits as `commit` says. Invalid documents are reported, the rest indexed.
    pub async fn ingest(
        &self,
        index_id: &str,
        docs: Vec<bytes::Bytes>,
        commit: CommitMode,
    ) -> Result<IngestOutcome, IngestError> {
        let served = self
            .indexes
            .read()
            .await
            .get(index_id)
            .cloned()
            .ok_or_else(|| IngestError::IndexNotFound(index_id.to_string()))?;
        let doc_mapper = served.doc_mapper.clone();
        let (outcome, valid, parsed) = tokio::task::spawn_blocking(move || {
            let mut outcome = IngestOutcome::default();
            let mut valid = Vec::with_capacity(docs.len());
            let mut parsed = Vec::with_capacity(docs.len());
            for doc in docs {
                match doc_mapper.parse_doc(&doc) {
                    Ok(parsed_doc) => {
                        outcome.results.push(None);
                        valid.push(doc);
                        parsed.push(parsed_doc);
                    }
                    Err(err) => outcome.results.push(Some(err)),
                }
            }
            outcome.num_ingested = valid.len();
            outcome.num_rejected = outcome.results.len() - valid.len();
            (outcome, valid, parsed)
        })
        .await
        .map_err(|err| {
            IngestError::Internal(format!("document validation failed unexpectedly: {err}"))
        })?;
        metrics::DOCS_REJECTED.inc_by(outcome.num_rejected as u64);
        if !valid.is_empty() {
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
        }
        let refs: Vec<&[u8]> = valid.iter().map(|d| d.as_ref()).collect();
        let positions = self.env.wal.append(&served.active_queue, &refs).await?;
        metrics::DOCS_INGESTED.inc_by(valid.len() as u64);
        metrics::BYTES_INGESTED.inc_by(valid.iter().map(|d| d.len() as u64).sum());
        let Some(pipeline) = served.pipelines.get(&served.active_queue) else {
            return Err(IngestError::PipelineStopped);
        };
        if let Some((first_position, _)) = positions {
            pipeline.offer_parsed(PreParsed {
                first_position,
                docs: parsed,
            });
        }
        pipeline.notify_new_records();
        match (commit, positions) {
            (CommitMode::Auto, _) => {}
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
            (CommitMode::WaitFor, None) => {}
        }
        Ok(outcome)
    }

    /// The index uids served, by index id.
    pub async fn served_indexes(&self) -> Vec<IndexUid> {
        self.indexes
            .read()
            .await
            .values()
            .map(|s| s.index_uid.clone())
            .collect()
    }

    /// Refreshes the WAL size gauges.
    pub async fn update_wal_metrics(&self) {
        metrics::WAL_MEMORY_BYTES.set(self.env.wal.memory_size().await as i64);
        metrics::WAL_BACKLOG_BYTES.set(self.env.wal.backlog_bytes() as i64);
        metrics::WAL_DISK_BYTES.set(self.env.wal.disk_size().await as i64);
    }
}
