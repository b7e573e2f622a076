//! The indexing pipeline of one shard: it drains the shard's WAL queue into splits.
//!
//! WAL records → `DocMapper::parse_doc` → one `SplitBuilder` per partition → on commit timeout,
//! doc target or forced commit: finish the splits → stage them → upload `{split_id}.split` →
//! publish them with the checkpoint delta `(checkpoint, last position]` in ONE metastore
//! transaction → truncate the WAL. A failure anywhere drops the in-memory batch and rebuilds
//! it from the WAL after the stored checkpoint, so a document is published exactly once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use shale_config::OTHER_PARTITION_ID;
use shale_index::{BuiltSplit, DocMapper, ParsedDoc, SplitBuilder};
use shale_metastore::{Metastore, MetastoreError};
use shale_storage::StorageRef;
use shale_types::{
    new_ulid, now_unix_secs, CheckpointDelta, IndexUid, PartitionId, SplitMetadata,
    INGEST_API_SOURCE_ID,
};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::metrics;
use crate::wal::Wal;

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
    /// Tantivy writer heap per split builder.
    pub writer_heap_bytes: usize,
    /// Tantivy indexing threads per split builder.
    pub writer_threads: usize,
    /// Notified after every publish (the merge planner listens).
    pub on_publish: Option<Arc<Notify>>,
}

/// Documents the router already parsed while validating them, handed to the pipeline in
/// memory so that it does not parse them again (it falls back to the WAL whenever the handoff
/// is missing, late or dropped).
pub struct PreParsed {
    /// WAL position of the first document.
    pub first_position: u64,
    /// The documents, at consecutive positions.
    pub docs: Vec<ParsedDoc>,
}

/// Pre-parsed batches buffered per pipeline before the handoff is dropped.
const PREPARSED_CHANNEL: usize = 16;

/// Handle on a running pipeline.
pub struct PipelineHandle {
    preparsed: mpsc::Sender<PreParsed>,
    new_records: Arc<Notify>,
    force_commit: Arc<Notify>,
    published: watch::Receiver<Option<u64>>,
    task: tokio::task::JoinHandle<()>,
}

impl PipelineHandle {
    /// Wakes the pipeline up: new records were appended.
    pub fn notify_new_records(&self) {
        self.new_records.notify_one();
    }

    /// Offers documents parsed at ingest (already in the WAL at their positions). Dropped when
    /// the pipeline is behind: it then reads them back from the WAL.
    pub fn offer_parsed(&self, batch: PreParsed) {
        let _ = self.preparsed.try_send(batch);
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
    }
}

impl Drop for PipelineHandle {
    fn drop(&mut self) {
        self.task.abort();
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
    let (preparsed, preparsed_rx) = mpsc::channel(PREPARSED_CHANNEL);
    let pipeline = Pipeline {
        preparsed_rx,
        pending_preparsed: None,
        env,
        params,
        queue,
        checkpoint,
        new_records: new_records.clone(),
        force_commit: force_commit.clone(),
        published_tx,
    };
    let task = tokio::spawn(pipeline.run());
    PipelineHandle {
        preparsed,
        new_records,
        force_commit,
        published,
        task,
    }
}

/// A document to index: parsed at ingest, or raw bytes read back from the WAL.
enum Record {
    Parsed(ParsedDoc),
    Raw(Vec<u8>),
}

/// Splits being built: one builder per partition.
struct Batch {
    builders: BTreeMap<PartitionId, SplitBuilder>,
    num_docs: u64,
    last_position: u64,
    deadline: Instant,
    scratch: tempfile::TempDir,
}

struct Pipeline {
    preparsed_rx: mpsc::Receiver<PreParsed>,
    pending_preparsed: Option<PreParsed>,
    env: PipelineEnv,
    params: PipelineParams,
    queue: String,
    checkpoint: Option<u64>,
    new_records: Arc<Notify>,
    force_commit: Arc<Notify>,
    published_tx: watch::Sender<Option<u64>>,
}

#[derive(Debug, thiserror::Error)]
enum StepError {
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
    #[error("split building task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

impl Pipeline {
    async fn run(mut self) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.run_until_error().await {
                Ok(()) => return,
                Err(err) => {
                    error!(queue = %self.queue, %err, "indexing pipeline failed; rebuilding from the WAL");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    // Re-read the checkpoint: a publish may have succeeded before the error.
                    if let Ok(meta) = self
                        .env
                        .metastore
                        .index_metadata(&self.params.index_uid.index_id)
                        .await
                    {
                        self.checkpoint =
                            meta.checkpoint(INGEST_API_SOURCE_ID).position(&self.queue);
                        self.published_tx.send_replace(self.checkpoint);
                    }
                }
            }
        }
    }

    async fn run_until_error(&mut self) -> Result<(), StepError> {
        let mut next_read = self.checkpoint.map(|c| c + 1).unwrap_or(0);
        let mut batch: Option<Batch> = None;
        let mut force = false;
        loop {
            let records = self.next_records(next_read).await?;
            if let Some((last, _)) = records.last() {
                next_read = last + 1;
                let current = match batch.take() {
                    Some(batch) => batch,
                    None => self.new_batch()?,
                };
                let filled = self.add_records(current, records).await?;
                // Cut on the doc target, or on the commit timeout even while a backlog is
                // being drained.
                let due = filled.num_docs >= self.params.split_num_docs_target
                    || Instant::now() >= filled.deadline;
                batch = Some(filled);
                if due {
                    self.commit(batch.take()).await?;
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
            }
        }
    }

    /// The next documents from position `from`: the router's pre-parsed handoff when it
    /// starts there, else records read back from the WAL (up to the next handoff).
    async fn next_records(&mut self, from: u64) -> Result<Vec<(u64, Record)>, StepError> {
        loop {
            if self.pending_preparsed.is_none() {
                self.pending_preparsed = self.preparsed_rx.try_recv().ok();
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
                return Ok(batch
                    .docs
                    .into_iter()
                    .skip(skip)
                    .enumerate()
                    .map(|(i, doc)| (from + i as u64, Record::Parsed(doc)))
                    .collect());
            }
            // A gap before the handoff: read it from the WAL first.
            let gap = (batch.first_position - from) as usize;
            self.pending_preparsed = Some(batch);
            let records = self
                .env
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
            .env
            .wal
            .read(&self.queue, from, READ_BATCH_RECORDS, READ_BATCH_BYTES)
            .await?;
        Ok(records
            .into_iter()
            .map(|(pos, bytes)| (pos, Record::Raw(bytes)))
            .collect())
    }

    fn new_batch(&self) -> Result<Batch, StepError> {
        std::fs::create_dir_all(&self.env.scratch_dir)?;
        Ok(Batch {
            builders: BTreeMap::new(),
            num_docs: 0,
            last_position: 0,
            deadline: Instant::now() + self.params.commit_timeout,
            scratch: tempfile::Builder::new()
                .prefix("batch-")
                .tempdir_in(&self.env.scratch_dir)?,
        })
    }

    /// Parses records and adds them to the batch's builders, off the async runtime.
    async fn add_records(
        &self,
        mut batch: Batch,
        records: Vec<(u64, Record)>,
    ) -> Result<Batch, StepError> {
        let doc_mapper = self.params.doc_mapper.clone();
        let max_partitions = self.params.max_num_partitions.max(1) as usize;
        let heap = self.env.writer_heap_bytes;
        let threads = self.env.writer_threads;
        let has_partitions = doc_mapper.partition_key().is_some();
        tokio::task::spawn_blocking(move || -> Result<Batch, StepError> {
            for (position, record) in records {
                batch.last_position = position;
                let doc = match record {
                    Record::Parsed(doc) => doc,
                    Record::Raw(payload) => match doc_mapper.parse_doc(&payload) {
                        Ok(doc) => doc,
                        Err(err) => {
                            // Validated at ingest: only a mapping change can make this happen.
                            warn!(%err, position, "dropping a WAL record that no longer parses");
                            continue;
                        }
                    },
                };
                let mut partition = doc.partition_id;
                if !batch.builders.contains_key(&partition)
                    && batch.builders.len() >= max_partitions
                {
                    partition = OTHER_PARTITION_ID;
                }
                let builder = match batch.builders.entry(partition) {
                    std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::btree_map::Entry::Vacant(e) => {
                        let dir = batch.scratch.path().join(format!("p{partition}"));
                        std::fs::create_dir_all(&dir)?;
                        let heap = if has_partitions { heap / 4 } else { heap };
                        e.insert(SplitBuilder::with_threads(
                            doc_mapper.clone(),
                            &dir,
                            heap.max(15_000_000),
                            threads,
                        )?)
                    }
                };
                builder.add(doc)?;
                batch.num_docs += 1;
            }
            Ok(batch)
        })
        .await?
    }

    /// Finishes, uploads and publishes the batch with its checkpoint delta, then truncates.
    async fn commit(&mut self, batch: Option<Batch>) -> Result<(), StepError> {
        let Some(batch) = batch else { return Ok(()) };
        let last_position = batch.last_position;
        let Batch {
            builders, scratch, ..
        } = batch;
        let commit_started = std::time::Instant::now();
        let built: Vec<(PartitionId, BuiltSplit)> = tokio::task::spawn_blocking(move || {
            builders
                .into_iter()
                .map(|(partition, builder)| Ok((partition, builder.finish()?)))
                .collect::<Result<Vec<_>, shale_index::IndexError>>()
        })
        .await??;
        let finish_ms = commit_started.elapsed().as_millis() as u64;

        let now = now_unix_secs();
        let doc_mapping_uid = self.params.doc_mapper.doc_mapping().doc_mapping_uid.clone();
        let splits: Vec<(SplitMetadata, PathBuf)> = built
            .into_iter()
            .filter(|(_, split)| split.num_docs > 0)
            .map(|(partition_id, split)| {
                let maturity = self.params.merge_policy.split_maturity(
                    self.params.split_num_docs_target,
                    split.num_docs,
                    0,
                );
                let meta = SplitMetadata {
                    split_id: new_ulid(),
                    index_uid: self.params.index_uid.clone(),
                    source_id: INGEST_API_SOURCE_ID.to_string(),
                    node_id: self.env.node_id.clone(),
                    partition_id,
                    doc_mapping_uid: doc_mapping_uid.clone(),
                    num_docs: split.num_docs,
                    size_bytes: split.size_bytes,
                    uncompressed_docs_size_bytes: split.uncompressed_docs_size_bytes,
                    time_range: split.time_range,
                    tags: split.tags.clone(),
                    create_timestamp: now,
                    maturity,
                    num_merge_ops: 0,
                    delete_opstamp: 0,
                    footer_offsets: split.footer_offsets,
                };
                (meta, split.path)
            })
            .collect();

        let index_uid = &self.params.index_uid;
        let metastore = &self.env.metastore;
        if !splits.is_empty() {
            let metas: Vec<SplitMetadata> = splits.iter().map(|(m, _)| m.clone()).collect();
            metastore
                .stage_splits(index_uid, metas)
                .await
                .inspect_err(|_| {
                    metrics::PIPELINE_ERRORS.with_label_values(&["stage"]).inc();
                })?;
            for (meta, path) in &splits {
                let bytes = self
                    .params
                    .storage
                    .put_file(&meta.object_key(), path)
                    .await
                    .inspect_err(|_| {
                        metrics::PIPELINE_ERRORS
                            .with_label_values(&["upload"])
                            .inc();
                    })?;
                metrics::SPLIT_BYTES_WRITTEN.inc_by(bytes);
            }
        }
        let split_ids: Vec<String> = splits.iter().map(|(m, _)| m.split_id.clone()).collect();
        let delta = CheckpointDelta::single(self.queue.clone(), self.checkpoint, last_position);
        metastore
            .publish_splits(
                index_uid,
                &split_ids,
                &[],
                Some((INGEST_API_SOURCE_ID.to_string(), delta)),
            )
            .await
            .inspect_err(|_| {
                metrics::PIPELINE_ERRORS
                    .with_label_values(&["publish"])
                    .inc();
            })?;
        metrics::SPLITS_PUBLISHED.inc_by(split_ids.len() as u64);
        info!(
            index = %index_uid,
            queue = %self.queue,
            splits = split_ids.len(),
            num_docs = splits.iter().map(|(m, _)| m.num_docs).sum::<u64>(),
            last_position,
            finish_ms,
            total_ms = commit_started.elapsed().as_millis() as u64,
            "published splits"
        );
        self.checkpoint = Some(last_position);
        self.published_tx.send_replace(self.checkpoint);
        if let (Some(listener), false) = (&self.env.on_publish, split_ids.is_empty()) {
            listener.notify_one();
        }
        self.env.wal.truncate(&self.queue, last_position).await?;
        drop(scratch);
        Ok(())
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
