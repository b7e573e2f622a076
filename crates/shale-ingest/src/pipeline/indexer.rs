//! The indexer stage: turns records (parsed at ingest, or read back from the WAL) into
//! splits being built — one Tantivy builder per partition, and for a locality index per time
//! bucket too (a batch that straddles a bucket boundary gives a split on each side) — and
//! finishes them into split bundles when the batch is cut.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use shale_config::OTHER_PARTITION_ID;
use shale_index::{BuiltSplit, DocMapper, ParsedDoc, SplitBuilder};
use shale_types::PartitionId;
use tokio::time::Instant;
use tracing::warn;

use super::StepError;

/// A document to index: parsed at ingest (with the doc mapping uid it was parsed with), or
/// raw bytes read back from the WAL (a record: see [`crate::opstamps`]).
pub(super) enum Record {
    Parsed(ParsedDoc, Arc<str>),
    Raw(Vec<u8>),
}

impl Record {
    /// The doc mapping the document was accepted under (`None`: a record older than that
    /// information, read with the shard's current mapping).
    pub(super) fn doc_mapping_uid(&self) -> Option<&str> {
        match self {
            Record::Parsed(_, uid) => Some(uid),
            Record::Raw(payload) => crate::opstamps::decode_record(payload).doc_mapping_uid,
        }
    }
}

/// Splits being built: one builder per partition and time bucket (`None` unless the index is
/// a locality index), and the WAL positions they cover. Every split of a batch is built with
/// one doc mapping version: the one its documents were accepted under.
pub(super) struct Batch {
    /// The doc mapper of the batch's documents.
    pub(super) doc_mapper: Arc<DocMapper>,
    builders: BTreeMap<(PartitionId, Option<i64>), SplitBuilder>,
    /// The partitions of `builders` (capped at `max_num_partitions`).
    partitions: BTreeSet<PartitionId>,
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
    /// The doc mapper the splits were built with.
    pub(super) doc_mapper: Arc<DocMapper>,
    pub(super) splits: Vec<(PartitionId, BuiltSplit)>,
    pub(super) last_position: u64,
    pub(super) scratch: tempfile::TempDir,
}

/// The indexer of one shard's pipeline.
pub(super) struct Indexer {
    pub(super) scratch_dir: PathBuf,
    /// Where records that cannot be indexed are kept.
    pub(super) dead_letters: Arc<DeadLetters>,
    pub(super) commit_timeout: Duration,
    pub(super) max_num_partitions: u32,
    pub(super) writer_heap_bytes: usize,
    pub(super) writer_threads: usize,
}

impl Indexer {
    /// An empty batch of documents of `doc_mapper`'s mapping, due after the commit timeout.
    pub(super) fn new_batch(&self, doc_mapper: Arc<DocMapper>) -> Result<Batch, StepError> {
        std::fs::create_dir_all(&self.scratch_dir)?;
        Ok(Batch {
            doc_mapper,
            builders: BTreeMap::new(),
            partitions: BTreeSet::new(),
            num_docs: 0,
            last_position: 0,
            deadline: Instant::now() + self.commit_timeout,
            scratch: tempfile::Builder::new()
                .prefix("batch-")
                .tempdir_in(&self.scratch_dir)?,
        })
    }

    /// Parses (if needed) and adds records — all accepted under the batch's doc mapping — to
    /// the batch's builders, off the async runtime. A record that does not parse (only
    /// possible for a record older than mapping versions, read with a newer mapping) is kept
    /// in the dead letters, counted and logged with its position.
    pub(super) async fn add(
        &self,
        mut batch: Batch,
        records: Vec<(u64, Record)>,
    ) -> Result<Batch, StepError> {
        let doc_mapper = batch.doc_mapper.clone();
        let dead_letters = self.dead_letters.clone();
        let max_partitions = self.max_num_partitions.max(1) as usize;
        let threads = self.writer_threads;
        let has_partitions = doc_mapper.partition_key().is_some();
        let has_buckets = doc_mapper.sort_field_types().is_some();
        // Several partitions (or time buckets) share the heap budget.
        let heap = if has_partitions || has_buckets {
            self.writer_heap_bytes / 4
        } else {
            self.writer_heap_bytes
        }
        .max(15_000_000);
        tokio::task::spawn_blocking(move || -> Result<Batch, StepError> {
            for (position, record) in records {
                batch.last_position = position;
                let doc = match record {
                    Record::Parsed(doc, _) => doc,
                    Record::Raw(payload) => {
                        let record = crate::opstamps::decode_record(&payload);
                        match doc_mapper.parse_doc(record.json) {
                            Ok(mut doc) => {
                                doc.opstamp = record.opstamp;
                                doc
                            }
                            Err(err) => {
                                dead_letters.keep(position, record.json, &err.to_string())?;
                                continue;
                            }
                        }
                    }
                };
                let mut partition = doc.partition_id;
                if !batch.partitions.contains(&partition)
                    && batch.partitions.len() >= max_partitions
                {
                    partition = OTHER_PARTITION_ID;
                }
                batch.partitions.insert(partition);
                let bucket = doc.time_bucket_start;
                let builder = match batch.builders.entry((partition, bucket)) {
                    std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::btree_map::Entry::Vacant(e) => {
                        let dir = batch.scratch.path().join(match bucket {
                            None => format!("p{partition}"),
                            Some(start) => format!("p{partition}-b{start}"),
                        });
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
    pub(super) async fn finish(batch: Batch) -> Result<FinishedBatch, StepError> {
        let Batch {
            doc_mapper,
            builders,
            last_position,
            scratch,
            ..
        } = batch;
        let splits = tokio::task::spawn_blocking(move || {
            builders
                .into_iter()
                .map(|((partition, _), builder)| Ok((partition, builder.finish()?)))
                .collect::<Result<Vec<_>, shale_index::IndexError>>()
        })
        .await??;
        Ok(FinishedBatch {
            doc_mapper,
            splits: splits
                .into_iter()
                .filter(|(_, split)| split.num_docs > 0)
                .collect(),
            last_position,
            scratch,
        })
    }
}

/// Records of one shard that could not be indexed, kept in `{dir}/{queue}.ndjson`: one JSON
/// line per record with its WAL position, the error and the document as ingested. Each line
/// is fsynced before the record's position can be published past.
pub(crate) struct DeadLetters {
    path: PathBuf,
    queue: String,
}

impl DeadLetters {
    /// The dead letters of `queue`, under `dir` (created on the first record kept).
    pub(crate) fn new(dir: &std::path::Path, queue: &str) -> Self {
        let file_name: String = queue
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        DeadLetters {
            path: dir.join(format!("{file_name}.ndjson")),
            queue: queue.to_string(),
        }
    }

    /// Keeps a record that cannot be indexed (blocking: called off the async runtime).
    pub(crate) fn keep(&self, position: u64, json: &[u8], error: &str) -> std::io::Result<()> {
        use std::io::Write;
        warn!(
            queue = %self.queue,
            position,
            %error,
            path = %self.path.display(),
            "a WAL record cannot be indexed: kept in the dead letters"
        );
        crate::metrics::DEAD_LETTERS.inc();
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let line = serde_json::json!({
            "queue": self.queue,
            "position": position,
            "error": error,
            "document": String::from_utf8_lossy(json),
        });
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        let mut bytes = line.to_string().into_bytes();
        bytes.push(b'\n');
        file.write_all(&bytes)?;
        file.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn a_batch_straddling_bucket_boundaries_gives_one_split_per_bucket() {
        let mut config = shale_config::IndexConfig::parse(
            br#"
index_id: sorted
doc_mapping:
  timestamp_field: ts
  field_mappings:
    - {name: ts, type: datetime, fast: true, input_formats: [unix_timestamp]}
    - {name: service, type: text, tokenizer: raw, fast: true}
"#,
        )
        .expect("config");
        let settings = json!({"sort_fields": ["service"], "time_bucket": "5m"});
        config.indexing_settings.merge_policy = shale_config::MergePolicyConfig::Locality(
            shale_config::LocalityConfig::parse(settings.as_object().expect("object"))
                .expect("settings"),
        );
        let doc_mapper = Arc::new(DocMapper::for_index(&config).expect("mapper"));
        let scratch = tempfile::tempdir().expect("scratch");
        let indexer = Indexer {
            scratch_dir: scratch.path().to_path_buf(),
            dead_letters: Arc::new(DeadLetters::new(scratch.path(), "q")),
            commit_timeout: Duration::from_secs(60),
            max_num_partitions: 10,
            writer_heap_bytes: 15_000_000,
            writer_threads: 1,
        };
        // 1 000 documents over 20 minutes starting mid-bucket, in two batches' worth of
        // records, with late documents of the first bucket at the end.
        let start = 1_800_000_000 + 120;
        let mut records: Vec<(u64, Record)> = (0..1000u64)
            .map(|i| {
                let doc = json!({"ts": start + (i as i64 * 1200) / 1000, "service": format!("s{}", i % 7)});
                (i, Record::Raw(doc.to_string().into_bytes()))
            })
            .collect();
        for i in 0..5u64 {
            let late = json!({"ts": start + 1, "service": "late"});
            let parsed = doc_mapper
                .parse_doc(late.to_string().as_bytes())
                .expect("parses");
            records.push((1000 + i, Record::Parsed(parsed, Arc::from("uid"))));
        }
        let batch = indexer.new_batch(doc_mapper.clone()).expect("batch");
        let batch = indexer.add(batch, records).await.expect("added");
        let finished = Indexer::finish(batch).await.expect("finished");
        assert_eq!(finished.last_position, 1004);
        let mut by_bucket: Vec<(Option<i64>, u64)> = finished
            .splits
            .iter()
            .map(|(_, split)| (split.time_bucket_start, split.num_docs))
            .collect();
        by_bucket.sort();
        let first = start - start % 300;
        let buckets: Vec<Option<i64>> = by_bucket.iter().map(|(b, _)| *b).collect();
        assert_eq!(
            buckets,
            (0..5).map(|k| Some(first + 300 * k)).collect::<Vec<_>>(),
            "{by_bucket:?}"
        );
        assert_eq!(by_bucket.iter().map(|(_, n)| n).sum::<u64>(), 1005);
        for (_, split) in &finished.splits {
            let bucket = split.time_bucket_start.expect("bucket");
            let range = split.time_range.expect("time range");
            assert!(
                range.start >= bucket && range.end < bucket + 300,
                "{range:?} in {bucket}"
            );
            assert!(split.sort_key_min <= split.sort_key_max);
        }
    }
}
