//! The indexing pipeline of one shard: it drains the shard's WAL queue into splits, through
//! three named stages (each timed in `shale_indexing_stage_seconds`, failures counted in
//! `shale_indexing_errors_total` by stage):
//!
//! 1. [`indexer`]: WAL records → `DocMapper::parse_doc` (skipped when the router handed the
//!    parsed documents over) → one `SplitBuilder` per partition; on commit timeout, doc
//!    target or forced commit the batch is cut and finished into split bundles. Each record
//!    is indexed with the doc mapping version it was accepted under (recorded in it): a batch
//!    holds one version, and a record of another version cuts it (after an index update,
//!    what was accepted before is indexed as it was validated);
//! 2. [`uploader`]: split metadata → stage in the metastore → upload `{split_id}.split`;
//! 3. [`publisher`]: publish the splits with the checkpoint delta `(checkpoint, last
//!    position]` in ONE metastore transaction → truncate the WAL.
//!
//! A cut batch is finished, uploaded and published in a task of its own while the indexer
//! goes on with the next batch: indexing does not pause for a commit. One commit is in flight
//! at a time, so splits are published in WAL order; the next cut waits for it.
//!
//! A failure anywhere drops the in-memory batch and rebuilds it from the WAL after the stored
//! checkpoint, so a document is published exactly once.

mod indexer;
mod publisher;
mod uploader;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shale_index::{DocMapper, ParsedDoc};
use shale_metastore::{Metastore, MetastoreError};
use shale_storage::StorageRef;
use shale_types::{IndexUid, INGEST_API_SOURCE_ID};
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;
use tracing::{debug, error};

use crate::metrics::stage;
use crate::wal::Wal;
use indexer::{Batch, DeadLetters, Indexer, Record};
use publisher::Publisher;
use uploader::Uploader;

/// Records read from the WAL per step.
const READ_BATCH_RECORDS: usize = 8_192;
/// Bytes read from the WAL per step.
const READ_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// What a pipeline needs to know about its index.
#[derive(Clone)]
pub struct PipelineParams {
    /// The index.
    pub index_uid: IndexUid,
    /// Its doc mapper.
    pub doc_mapper: Arc<DocMapper>,
    /// Where its splits go.
    pub storage: StorageRef,
    /// Cut a split this long after its first document.
    pub commit_timeout: Duration,
    /// Cut a split when the batch holds this many documents.
    pub split_num_docs_target: u64,
    /// The index's merge policy: it decides the maturity of fresh splits.
    pub merge_policy: shale_config::MergePolicyConfig,
    /// Distinct partitions per batch before documents go to the catch-all partition.
    pub max_num_partitions: u32,
    /// The index's own indexing memory per split builder (`resources.heap_size`), overriding
    /// the node's.
    pub writer_heap_bytes: Option<usize>,
    /// Set for a metrics index: its records are batches of samples, written as Parquet
    /// splits (one per time bucket) instead of Tantivy splits.
    pub metrics: Option<MetricsParams>,
}

/// How a metrics index's splits are written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsParams {
    /// The label keys after the metric name in the rows' sort key.
    pub sort_labels: Vec<String>,
    /// The time bucket of a split, in seconds.
    pub bucket_secs: u64,
}

/// Node-wide services a pipeline uses.
#[derive(Clone)]
pub struct PipelineEnv {
    /// This node's id, recorded in split metadata.
    pub node_id: String,
    /// The metastore.
    pub metastore: Arc<dyn Metastore>,
    /// The WAL.
    pub wal: Arc<Wal>,
    /// Scratch space for split building (`data_dir/indexing`).
    pub scratch_dir: PathBuf,
    /// Where records that cannot be indexed are kept (`data_dir/dead-letters`).
    pub dead_letter_dir: PathBuf,
    /// Tantivy writer heap per split builder.
    pub writer_heap_bytes: usize,
    /// Tantivy indexing threads per split builder.
    pub writer_threads: usize,
    /// Notified after every publish (the merge planner listens).
    pub on_publish: Option<Arc<Notify>>,
    /// The acknowledged samples of metrics shards not yet published, kept for PromQL: a
    /// publish lets them go.
    pub live: Arc<crate::LiveSamples>,
}

/// Documents the router already parsed while validating them, handed to the pipeline in
/// memory so that it does not parse them again (it falls back to the WAL whenever the handoff
/// is missing, late or dropped).
pub struct PreParsed {
    /// WAL position of the first document.
    pub first_position: u64,
    /// The documents, at consecutive positions.
    pub docs: Vec<ParsedDoc>,
    /// The doc mapping they were parsed with.
    pub doc_mapping_uid: Arc<str>,
}

/// Bytes of documents (as ingested JSON) a pipeline holds parsed, waiting to be indexed,
/// before further handoffs are dropped (the pipeline then reads and parses them from the WAL).
/// Sized so that a backlog of several seconds of ingest is parsed once.
const PREPARSED_MAX_BYTES: usize = 256 << 20;

/// A handoff in the channel, with its size.
struct Handoff {
    batch: PreParsed,
    bytes: usize,
}

/// The commit running beside the indexer, as the pipeline's handle sees it: stopping the
/// pipeline aborts it and waits until it is gone.
#[derive(Clone)]
struct CommitSlot {
    /// Held by the running commit task; acquiring it means no commit runs.
    running: Arc<Semaphore>,
    /// Aborts the running commit.
    abort: Arc<std::sync::Mutex<Option<AbortHandle>>>,
}

impl CommitSlot {
    fn new() -> Self {
        CommitSlot {
            running: Arc::new(Semaphore::new(1)),
            abort: Arc::new(std::sync::Mutex::new(None)),
        }
    }

    fn abort(&self) {
        if let Some(abort) = self.abort.lock().unwrap_or_else(|p| p.into_inner()).take() {
            abort.abort();
        }
    }
}

/// Handle on a running pipeline.
pub struct PipelineHandle {
    preparsed: mpsc::UnboundedSender<Handoff>,
    /// Bytes of the handoffs in the channel.
    preparsed_bytes: Arc<AtomicUsize>,
    new_records: Arc<Notify>,
    force_commit: Arc<Notify>,
    published: watch::Receiver<Option<u64>>,
    task: tokio::task::JoinHandle<()>,
    commits: CommitSlot,
}

impl PipelineHandle {
    /// Wakes the pipeline up: new records were appended.
    pub fn notify_new_records(&self) {
        self.new_records.notify_one();
    }

    /// Offers documents parsed at ingest (already in the WAL at their positions). Dropped when
    /// the pipeline is behind: it then reads them back from the WAL.
    pub fn offer_parsed(&self, batch: PreParsed) {
        let bytes: usize = batch.docs.iter().map(|doc| doc.num_bytes).sum();
        let held = self.preparsed_bytes.fetch_add(bytes, Ordering::AcqRel);
        if held + bytes > PREPARSED_MAX_BYTES && held > 0 {
            self.preparsed_bytes.fetch_sub(bytes, Ordering::AcqRel);
            crate::metrics::HANDOFFS_DROPPED.inc();
            return;
        }
        if self.preparsed.send(Handoff { batch, bytes }).is_err() {
            self.preparsed_bytes.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// Asks the pipeline to cut its current batch now.
    pub fn force_commit(&self) {
        self.force_commit.notify_one();
    }

    /// Waits until every record up to `position` is in a published split. Fails if the
    /// pipeline stops first.
    pub async fn wait_published(&self, position: u64) -> Result<(), PipelineStopped> {
        let mut rx = self.published.clone();
        rx.wait_for(|published| published.is_some_and(|p| p >= position))
            .await
            .map(|_| ())
            .map_err(|_| PipelineStopped)
    }

    /// Last published position.
    pub fn published_position(&self) -> Option<u64> {
        *self.published.borrow()
    }

    /// Stops the pipeline (its unpublished batch is rebuilt from the WAL on next start).
    pub fn stop(&self) {
        self.task.abort();
        self.commits.abort();
    }

    /// Stops the pipeline and waits until its tasks are gone (nothing of it publishes after).
    pub async fn stop_and_wait(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
        // The pipeline task no longer starts commits: abort the running one and wait for it.
        self.commits.abort();
        let _ = self.commits.running.acquire().await;
    }
}

impl Drop for PipelineHandle {
    fn drop(&mut self) {
        self.task.abort();
        self.commits.abort();
    }
}

/// The pipeline stopped before the awaited position was published.
#[derive(Debug, thiserror::Error)]
#[error("indexing pipeline stopped")]
pub struct PipelineStopped;

/// Starts the pipeline of shard `queue`, resuming after `checkpoint`.
pub fn spawn_pipeline(
    env: PipelineEnv,
    params: PipelineParams,
    queue: String,
    checkpoint: Option<u64>,
) -> PipelineHandle {
    let new_records = Arc::new(Notify::new());
    let force_commit = Arc::new(Notify::new());
    let (published_tx, published) = watch::channel(checkpoint);
    let (preparsed, preparsed_rx) = mpsc::unbounded_channel();
    let preparsed_bytes = Arc::new(AtomicUsize::new(0));
    let commits = CommitSlot::new();
    let pipeline = Pipeline {
        commits: commits.clone(),
        in_flight: None,
        preparsed_rx,
        preparsed_bytes: preparsed_bytes.clone(),
        pending_preparsed: None,
        wal: env.wal.clone(),
        queue: queue.clone(),
        new_records: new_records.clone(),
        force_commit: force_commit.clone(),
        mappers: Mappers {
            index_uid: params.index_uid.clone(),
            current: params.doc_mapper.clone(),
            metastore: env.metastore.clone(),
            older: std::collections::HashMap::new(),
        },
        indexer: Indexer {
            scratch_dir: env.scratch_dir.clone(),
            dead_letters: Arc::new(DeadLetters::new(&env.dead_letter_dir, &queue)),
            commit_timeout: params.commit_timeout,
            max_num_partitions: params.max_num_partitions,
            writer_heap_bytes: params.writer_heap_bytes.unwrap_or(env.writer_heap_bytes),
            writer_threads: env.writer_threads,
            metrics: params.metrics.clone(),
        },
        uploader: Arc::new(Uploader {
            node_id: env.node_id.clone(),
            index_uid: params.index_uid.clone(),
            merge_policy: params.merge_policy.clone(),
            split_num_docs_target: params.split_num_docs_target,
            metastore: env.metastore.clone(),
            storage: params.storage.clone(),
        }),
        publisher: Arc::new(tokio::sync::Mutex::new(Publisher {
            index_uid: params.index_uid.clone(),
            queue,
            metastore: env.metastore.clone(),
            wal: env.wal.clone(),
            checkpoint,
            published_tx,
            on_publish: env.on_publish.clone(),
            live: env.live.clone(),
        })),
    };
    let task = tokio::spawn(pipeline.run());
    PipelineHandle {
        preparsed,
        preparsed_bytes,
        new_records,
        force_commit,
        published,
        task,
        commits,
    }
}

/// The pipeline's state between steps: its three stages and the hand-off from the router.
struct Pipeline {
    preparsed_rx: mpsc::UnboundedReceiver<Handoff>,
    preparsed_bytes: Arc<AtomicUsize>,
    pending_preparsed: Option<PreParsed>,
    wal: Arc<Wal>,
    queue: String,
    new_records: Arc<Notify>,
    force_commit: Arc<Notify>,
    mappers: Mappers,
    indexer: Indexer,
    uploader: Arc<Uploader>,
    publisher: Arc<tokio::sync::Mutex<Publisher>>,
    commits: CommitSlot,
    /// The commit running beside the indexer.
    in_flight: Option<JoinHandle<Result<(), StepError>>>,
}

/// Why a pipeline step failed (the pipeline then rebuilds its batch from the WAL).
#[derive(Debug, thiserror::Error)]
pub(crate) enum StepError {
    #[error("{0}")]
    Wal(#[from] crate::wal::WalError),
    #[error("{0}")]
    Index(#[from] shale_index::IndexError),
    #[error("{0}")]
    Metastore(#[from] MetastoreError),
    #[error("{0}")]
    Storage(#[from] shale_storage::StorageError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("metrics split: {0}")]
    Metrics(String),
    #[error("split building task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("the pipeline is stopping")]
    Stopped,
}

impl Pipeline {
    async fn run(mut self) {
        const FIRST_BACKOFF: Duration = Duration::from_millis(100);
        let mut backoff = FIRST_BACKOFF;
        // Where the checkpoint was at the last failure: a failure after progress is a new
        // episode, retried quickly again (not 10 s because of failures long past).
        let mut failed_at: Option<Option<u64>> = None;
        loop {
            match self.run_until_error().await {
                Ok(()) => return,
                Err(err) => {
                    error!(queue = %self.queue, %err, "indexing pipeline failed; rebuilding from the WAL");
                    // Let a running commit end (it may publish) before reading where to restart.
                    let _ = self.settle().await;
                    let checkpoint = self.publisher.lock().await.checkpoint;
                    if failed_at != Some(checkpoint) {
                        backoff = FIRST_BACKOFF;
                    }
                    failed_at = Some(checkpoint);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    // Re-read the checkpoint: a publish may have succeeded before the error.
                    let mut publisher = self.publisher.lock().await;
                    let index_id = publisher.index_uid.index_id.clone();
                    if let Ok(meta) = publisher.metastore.index_metadata(&index_id).await {
                        let checkpoint =
                            meta.checkpoint(INGEST_API_SOURCE_ID).position(&self.queue);
                        publisher.checkpoint = checkpoint;
                        publisher.published_tx.send_replace(checkpoint);
                    }
                }
            }
        }
    }

    async fn run_until_error(&mut self) -> Result<(), StepError> {
        let checkpoint = self.publisher.lock().await.checkpoint;
        let mut next_read = checkpoint.map(|c| c + 1).unwrap_or(0);
        let mut batch: Option<Batch> = None;
        let mut force = false;
        loop {
            let records = self.next_records(next_read).await?;
            if let Some((last, _)) = records.last() {
                next_read = last + 1;
                for (uid, run) in runs_by_mapping(records) {
                    let doc_mapper = self.mappers.get(uid.as_deref()).await?;
                    // A batch holds one mapping version: another one cuts it.
                    if batch.as_ref().is_some_and(|b| {
                        b.doc_mapper.doc_mapping().doc_mapping_uid
                            != doc_mapper.doc_mapping().doc_mapping_uid
                    }) {
                        self.commit(batch.take()).await?;
                    }
                    let current = match batch.take() {
                        Some(batch) => batch,
                        None => self.indexer.new_batch(doc_mapper)?,
                    };
                    let filled = stage("index", self.indexer.add(current, run)).await?;
                    // Cut on the doc target, or on the commit timeout even while a backlog
                    // is being drained.
                    let due = filled.num_docs >= self.uploader.split_num_docs_target
                        || Instant::now() >= filled.deadline;
                    batch = Some(filled);
                    if due {
                        self.commit(batch.take()).await?;
                    }
                }
                continue;
            }
            if force {
                force = false;
                self.commit(batch.take()).await?;
                continue;
            }
            let deadline = batch.as_ref().map(|b| b.deadline);
            tokio::select! {
                _ = self.new_records.notified() => {}
                _ = self.force_commit.notified() => { force = true; }
                _ = sleep_until_opt(deadline) => {
                    self.commit(batch.take()).await?;
                }
                // A commit that fails while the pipeline is idle fails it now.
                done = wait_in_flight(&mut self.in_flight) => {
                    self.in_flight = None;
                    done??;
                }
            }
        }
    }

    /// Waits for the running commit, if any; its failure is the pipeline's.
    async fn settle(&mut self) -> Result<(), StepError> {
        match self.in_flight.take() {
            Some(handle) => handle.await?,
            None => Ok(()),
        }
    }

    /// The next documents from position `from`: the router's pre-parsed handoff when it
    /// starts there, else records read back from the WAL (up to the next handoff).
    async fn next_records(&mut self, from: u64) -> Result<Vec<(u64, Record)>, StepError> {
        loop {
            if self.pending_preparsed.is_none() {
                self.pending_preparsed = self.preparsed_rx.try_recv().ok().map(|handoff| {
                    self.preparsed_bytes
                        .fetch_sub(handoff.bytes, Ordering::AcqRel);
                    handoff.batch
                });
            }
            let Some(batch) = self.pending_preparsed.take() else {
                break;
            };
            let end = batch.first_position + batch.docs.len() as u64;
            if end <= from {
                continue; // already read from the WAL
            }
            if batch.first_position <= from {
                let skip = (from - batch.first_position) as usize;
                let uid = batch.doc_mapping_uid.clone();
                return Ok(batch
                    .docs
                    .into_iter()
                    .skip(skip)
                    .enumerate()
                    .map(|(i, doc)| (from + i as u64, Record::Parsed(doc, uid.clone())))
                    .collect());
            }
            // A gap before the handoff: read it from the WAL first.
            let gap = (batch.first_position - from) as usize;
            self.pending_preparsed = Some(batch);
            let records = self
                .wal
                .read(
                    &self.queue,
                    from,
                    gap.min(READ_BATCH_RECORDS),
                    READ_BATCH_BYTES,
                )
                .await?;
            return Ok(records
                .into_iter()
                .map(|(pos, bytes)| (pos, Record::Raw(bytes)))
                .collect());
        }
        let records = self
            .wal
            .read(&self.queue, from, READ_BATCH_RECORDS, READ_BATCH_BYTES)
            .await?;
        Ok(records
            .into_iter()
            .map(|(pos, bytes)| (pos, Record::Raw(bytes)))
            .collect())
    }

    /// Cuts the batch: finish → upload → publish, in a task beside the indexer, once the
    /// previous commit is done.
    async fn commit(&mut self, batch: Option<Batch>) -> Result<(), StepError> {
        let Some(batch) = batch else { return Ok(()) };
        self.settle().await?;
        let permit = self
            .commits
            .running
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StepError::Stopped)?;
        let uploader = self.uploader.clone();
        let publisher = self.publisher.clone();
        let queue = self.queue.clone();
        let handle = tokio::spawn(async move {
            let _permit = permit;
            let started = std::time::Instant::now();
            let finished = stage("finish", Indexer::finish(batch)).await?;
            let uploaded = stage("upload", uploader.upload(finished)).await?;
            stage("publish", async {
                publisher.lock().await.publish(uploaded).await
            })
            .await?;
            debug!(
                queue = %queue,
                total_ms = started.elapsed().as_millis() as u64,
                "batch committed"
            );
            Ok(())
        });
        *self.commits.abort.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle.abort_handle());
        self.in_flight = Some(handle);
        Ok(())
    }
}

/// Records accepted under one doc mapping version (`None`: unknown), with their positions.
type MappingRun = (Option<String>, Vec<(u64, Record)>);

/// Consecutive records grouped by the doc mapping they were accepted under (`None`: older
/// records, read with the current mapping), in order.
fn runs_by_mapping(records: Vec<(u64, Record)>) -> Vec<MappingRun> {
    let mut runs: Vec<MappingRun> = Vec::new();
    for (position, record) in records {
        let uid = record.doc_mapping_uid().map(str::to_string);
        match runs.last_mut() {
            Some((last, run)) if *last == uid => run.push((position, record)),
            _ => runs.push((uid, vec![(position, record)])),
        }
    }
    runs
}

/// The doc mappers of a shard's records: the index's current one, and older versions read
/// from the metastore when records accepted under them are met (an index update while they
/// waited in the WAL).
struct Mappers {
    index_uid: IndexUid,
    current: Arc<DocMapper>,
    metastore: Arc<dyn Metastore>,
    older: std::collections::HashMap<String, Arc<DocMapper>>,
}

impl Mappers {
    /// The mapper of version `uid` (`None`: the current one).
    async fn get(&mut self, uid: Option<&str>) -> Result<Arc<DocMapper>, StepError> {
        let Some(uid) = uid else {
            return Ok(self.current.clone());
        };
        if uid == self.current.doc_mapping().doc_mapping_uid {
            return Ok(self.current.clone());
        }
        if let Some(mapper) = self.older.get(uid) {
            return Ok(mapper.clone());
        }
        let mapper = match self
            .metastore
            .doc_mapping_version(&self.index_uid, uid)
            .await?
        {
            Some(config) => Arc::new(DocMapper::for_index(&config)?),
            None => {
                tracing::warn!(
                    index_uid = %self.index_uid,
                    doc_mapping_uid = uid,
                    "WAL records of an unknown doc mapping version: read with the current one"
                );
                self.current.clone()
            }
        };
        self.older.insert(uid.to_string(), mapper.clone());
        Ok(mapper)
    }
}

/// The running commit's result (never resolves without one).
async fn wait_in_flight(
    in_flight: &mut Option<JoinHandle<Result<(), StepError>>>,
) -> Result<Result<(), StepError>, tokio::task::JoinError> {
    match in_flight {
        Some(handle) => handle.await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
