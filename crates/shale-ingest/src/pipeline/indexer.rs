//! The indexer stage: turns records (parsed at ingest, or read back from the WAL) into
//! splits being built — one Tantivy builder per partition — and finishes them into split
//! bundles when the batch is cut.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use shale_config::OTHER_PARTITION_ID;
use shale_index::{BuiltSplit, DocMapper, ParsedDoc, SplitBuilder};
use shale_types::PartitionId;
use tokio::time::Instant;
use tracing::warn;

use super::StepError;

/// A document to index: parsed at ingest, or raw bytes read back from the WAL.
pub(super) enum Record {
    Parsed(ParsedDoc),
    Raw(Vec<u8>),
}

/// Splits being built: one builder per partition, and the WAL positions they cover.
pub(super) struct Batch {
    builders: BTreeMap<PartitionId, SplitBuilder>,
    /// Documents added.
    pub(super) num_docs: u64,
    /// Position of the last record added.
    pub(super) last_position: u64,
    /// When the batch must be cut (commit timeout after its first record).
    pub(super) deadline: Instant,
    scratch: tempfile::TempDir,
}

/// A cut batch: its split bundles (empty partitions left out), the last WAL position it
/// covers, and the scratch directory holding the bundles.
pub(super) struct FinishedBatch {
    pub(super) splits: Vec<(PartitionId, BuiltSplit)>,
    pub(super) last_position: u64,
    pub(super) scratch: tempfile::TempDir,
}

/// The indexer of one shard's pipeline.
pub(super) struct Indexer {
    pub(super) doc_mapper: Arc<DocMapper>,
    pub(super) scratch_dir: PathBuf,
    pub(super) commit_timeout: Duration,
    pub(super) max_num_partitions: u32,
    pub(super) writer_heap_bytes: usize,
    pub(super) writer_threads: usize,
}

impl Indexer {
    /// An empty batch, due after the commit timeout.
    pub(super) fn new_batch(&self) -> Result<Batch, StepError> {
        std::fs::create_dir_all(&self.scratch_dir)?;
        Ok(Batch {
            builders: BTreeMap::new(),
            num_docs: 0,
            last_position: 0,
            deadline: Instant::now() + self.commit_timeout,
            scratch: tempfile::Builder::new()
                .prefix("batch-")
                .tempdir_in(&self.scratch_dir)?,
        })
    }

    /// Parses (if needed) and adds records to the batch's builders, off the async runtime.
    pub(super) async fn add(
        &self,
        mut batch: Batch,
        records: Vec<(u64, Record)>,
    ) -> Result<Batch, StepError> {
        let doc_mapper = self.doc_mapper.clone();
        let max_partitions = self.max_num_partitions.max(1) as usize;
        let threads = self.writer_threads;
        let has_partitions = doc_mapper.partition_key().is_some();
        // Several partitions share the heap budget.
        let heap = if has_partitions {
            self.writer_heap_bytes / 4
        } else {
            self.writer_heap_bytes
        }
        .max(15_000_000);
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
                        e.insert(SplitBuilder::with_threads(
                            doc_mapper.clone(),
                            &dir,
                            heap,
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

    /// Finishes every builder of the batch into a split bundle.
    pub(super) async fn finish(&self, batch: Batch) -> Result<FinishedBatch, StepError> {
        let Batch {
            builders,
            last_position,
            scratch,
            ..
        } = batch;
        let splits = tokio::task::spawn_blocking(move || {
            builders
                .into_iter()
                .map(|(partition, builder)| Ok((partition, builder.finish()?)))
                .collect::<Result<Vec<_>, shale_index::IndexError>>()
        })
        .await??;
        Ok(FinishedBatch {
            splits: splits
                .into_iter()
                .filter(|(_, split)| split.num_docs > 0)
                .collect(),
            last_position,
            scratch,
        })
    }
}
