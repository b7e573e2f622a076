//! The indexer stage: turns records (parsed at ingest, or read back from the WAL) into
//! splits being built — one Tantivy builder per partition, and for a locality index per time
//! bucket too (a batch that straddles a bucket boundary gives a split on each side) — and
//! finishes them into split bundles when the batch is cut.
//!
//! A metrics index's records are batches of samples ([`shale_metrics::wal`]): they go to one
//! Parquet writer per time bucket, finished into `.parquet` splits.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use shale_config::OTHER_PARTITION_ID;
use shale_index::{BuiltSplit, DocMapper, ParsedDoc, SplitBuilder};
use shale_metrics::MetricsSplitWriter;
use shale_types::{PartitionId, SplitFormat};
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
    /// Metrics indexes: one Parquet writer per time bucket (start in ms), and its sort labels.
    metrics: BTreeMap<i64, MetricsSplitWriter>,
    /// Metrics indexes: per bucket, the lowest delete opstamp of the records in its writer
    /// (the split is clean of every delete task up to it).
    metrics_min_opstamps: BTreeMap<i64, u64>,
    /// Metrics indexes: the fields of the splits' sort keys (`__name__`, the sort labels,
    /// `__series_id__`).
    metrics_sort_fields: Vec<String>,
    /// Metrics indexes: the label sets of the records decoded so far, shared.
    metrics_labels: shale_metrics::wal::Interner,
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

/// A finished split of a batch.
pub(super) struct FinishedSplit {
    pub(super) partition_id: PartitionId,
    pub(super) built: BuiltSplit,
    pub(super) format: SplitFormat,
    /// Metrics splits: the number of series.
    pub(super) num_series: Option<u64>,
    /// Metrics splits: the fields of their sort keys (Tantivy splits: the mapping's).
    pub(super) sort_fields: Option<Vec<String>>,
}

/// A cut batch: its split bundles (empty partitions left out), the last WAL position it
/// covers, and the scratch directory holding the bundles.
pub(super) struct FinishedBatch {
    /// The doc mapper the splits were built with.
    pub(super) doc_mapper: Arc<DocMapper>,
    pub(super) splits: Vec<FinishedSplit>,
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
    /// Set for a metrics index.
    pub(super) metrics: Option<super::MetricsParams>,
}

impl Indexer {
    /// An empty batch of documents of `doc_mapper`'s mapping, due after the commit timeout.
    pub(super) fn new_batch(&self, doc_mapper: Arc<DocMapper>) -> Result<Batch, StepError> {
        std::fs::create_dir_all(&self.scratch_dir)?;
        Ok(Batch {
            doc_mapper,
            builders: BTreeMap::new(),
            metrics: BTreeMap::new(),
            metrics_min_opstamps: BTreeMap::new(),
            metrics_sort_fields: Vec::new(),
            metrics_labels: Default::default(),
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
        if let Some(metrics) = &self.metrics {
            return self.add_samples(batch, records, metrics.clone()).await;
        }
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

    /// Adds metrics records (batches of samples) to the batch's writers, one per time
    /// bucket, off the async runtime. A record that does not decode is kept in the dead
    /// letters.
    async fn add_samples(
        &self,
        mut batch: Batch,
        records: Vec<(u64, Record)>,
        params: super::MetricsParams,
    ) -> Result<Batch, StepError> {
        let dead_letters = self.dead_letters.clone();
        batch.metrics_sort_fields = std::iter::once(shale_metrics::METRIC_NAME_LABEL)
            .chain(params.sort_labels.iter().map(String::as_str))
            .chain([shale_metrics::SERIES_ID_COLUMN])
            .map(str::to_string)
            .collect();
        tokio::task::spawn_blocking(move || -> Result<Batch, StepError> {
            for (position, record) in records {
                batch.last_position = position;
                let Record::Raw(payload) = record else {
                    continue; // never handed over parsed
                };
                let decoded = crate::opstamps::decode_record(&payload);
                let (opstamp, payload) = (decoded.opstamp, decoded.json);
                let series = match batch.metrics_labels.decode(payload) {
                    Ok(series) => series,
                    Err(err) => {
                        dead_letters.keep(position, payload, &err.to_string())?;
                        continue;
                    }
                };
                for (labels, samples) in series {
                    let mut samples = samples.into_iter().peekable();
                    while let Some(first) = samples.peek() {
                        let bucket =
                            shale_metrics::bucket_start_ms(first.timestamp_ms, params.bucket_secs);
                        let end = bucket + (params.bucket_secs * 1000) as i64;
                        let mut run = Vec::new();
                        while let Some(sample) =
                            samples.next_if(|s| s.timestamp_ms >= bucket && s.timestamp_ms < end)
                        {
                            run.push(sample);
                        }
                        batch.num_docs += run.len() as u64;
                        batch
                            .metrics_min_opstamps
                            .entry(bucket)
                            .and_modify(|lowest| *lowest = (*lowest).min(opstamp))
                            .or_insert(opstamp);
                        batch
                            .metrics
                            .entry(bucket)
                            .or_insert_with(|| MetricsSplitWriter::new(params.sort_labels.clone()))
                            .add(&labels, run);
                    }
                }
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
            metrics,
            metrics_min_opstamps,
            metrics_sort_fields,
            last_position,
            scratch,
            ..
        } = batch;
        let dir = scratch.path().to_path_buf();
        let splits =
            tokio::task::spawn_blocking(move || -> Result<Vec<FinishedSplit>, StepError> {
                let mut splits = Vec::new();
                for ((partition_id, _), builder) in builders {
                    splits.push(FinishedSplit {
                        partition_id,
                        built: builder.finish()?,
                        format: SplitFormat::Tantivy,
                        num_series: None,
                        sort_fields: None,
                    });
                }
                for (bucket_ms, writer) in metrics {
                    let mut split = finish_metrics_split(&dir, bucket_ms, writer)?;
                    split.sort_fields = Some(metrics_sort_fields.clone());
                    split.built.min_doc_opstamp =
                        metrics_min_opstamps.get(&bucket_ms).copied().unwrap_or(0);
                    splits.push(split);
                }
                Ok(splits)
            })
            .await??;
        Ok(FinishedBatch {
            doc_mapper,
            splits: splits
                .into_iter()
                .filter(|split| split.built.num_docs > 0)
                .collect(),
            last_position,
            scratch,
        })
    }
}

/// Writes a bucket's samples as a Parquet split in `dir`.
fn finish_metrics_split(
    dir: &std::path::Path,
    bucket_ms: i64,
    writer: MetricsSplitWriter,
) -> Result<FinishedSplit, StepError> {
    let num_added = writer.num_added();
    let (bytes, summary) = writer
        .finish()
        .map_err(|err| StepError::Metrics(err.to_string()))?;
    let path = dir.join(format!("b{bucket_ms}.parquet"));
    std::fs::write(&path, &bytes)?;
    let size = bytes.len() as u64;
    let footer_offsets = shale_metrics::footer_offsets(&bytes);
    let tags = summary.name_tags();
    let time_range = summary.time_range_secs();
    let (sort_key_min, sort_key_max) = match summary.sort_key_range {
        Some((lo, hi)) => (
            Some(shale_types::sort_key::SortKey(lo)),
            Some(shale_types::sort_key::SortKey(hi)),
        ),
        None => (None, None),
    };
    Ok(FinishedSplit {
        partition_id: 0,
        built: BuiltSplit {
            path,
            num_docs: summary.num_samples,
            time_range,
            tags,
            // Samples as received: 16 bytes each (timestamp and value), labels left out.
            uncompressed_docs_size_bytes: num_added * 16,
            size_bytes: size,
            footer_offsets,
            sort_key_min,
            sort_key_max,
            time_bucket_start: Some(bucket_ms.div_euclid(1000)),
            min_doc_opstamp: 0,
        },
        format: SplitFormat::Parquet,
        num_series: Some(summary.num_series),
        sort_fields: None,
    })
}

impl Indexer {}

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
        let indexer = test_indexer(scratch.path(), None);
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
            .map(|split| (split.built.time_bucket_start, split.built.num_docs))
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
        for split in finished.splits.iter().map(|s| &s.built) {
            let bucket = split.time_bucket_start.expect("bucket");
            let range = split.time_range.expect("time range");
            assert!(
                range.start >= bucket && range.end < bucket + 300,
                "{range:?} in {bucket}"
            );
            assert!(split.sort_key_min <= split.sort_key_max);
        }
    }

    /// An indexer with scratch space and dead letters (queue `q`) in `dir`.
    fn test_indexer(
        dir: &std::path::Path,
        metrics: Option<crate::pipeline::MetricsParams>,
    ) -> Indexer {
        Indexer {
            scratch_dir: dir.to_path_buf(),
            dead_letters: Arc::new(DeadLetters::new(dir, "q")),
            commit_timeout: Duration::from_secs(60),
            max_num_partitions: 10,
            writer_heap_bytes: 15_000_000,
            writer_threads: 1,
            metrics,
        }
    }

    #[tokio::test]
    async fn metrics_records_give_one_parquet_split_per_bucket_and_bad_records_are_kept_aside() {
        use shale_metrics::{Labels, Sample};
        let config =
            shale_config::IndexConfig::parse(b"index_id: mmm\nmetrics: {}\n").expect("config");
        let doc_mapper = Arc::new(DocMapper::for_index(&config).expect("mapper"));
        let scratch = tempfile::tempdir().expect("scratch");
        let indexer = test_indexer(
            scratch.path(),
            Some(crate::pipeline::MetricsParams {
                sort_labels: vec!["host".to_string()],
                bucket_secs: 900,
            }),
        );
        // A series whose samples straddle a bucket boundary, and another in one bucket.
        // A bucket boundary (a multiple of 15 minutes).
        let t0 = 1_800_000_000_000i64;
        assert_eq!(t0 % 900_000, 0);
        let series = |host: &str, times: &[i64]| {
            (
                Labels::new([
                    ("__name__".to_string(), "cpu".to_string()),
                    ("host".to_string(), host.to_string()),
                ]),
                times
                    .iter()
                    .map(|&t| Sample {
                        timestamp_ms: t0 + t,
                        value: t as f64,
                    })
                    .collect::<Vec<_>>(),
            )
        };
        let record = |series: &[(Labels, Vec<Sample>)]| {
            let mut bytes = crate::opstamps::record_prefix(0, "uid");
            bytes.extend(shale_metrics::wal::encode_record(series));
            Record::Raw(bytes)
        };
        let records = vec![
            (0, record(&[series("a", &[-20_000, -10_000, 0, 10_000])])),
            (1, Record::Raw(b"garbage".to_vec())),
            (2, record(&[series("b", &[5_000]), series("a", &[-10_000])])),
        ];
        let batch = indexer.new_batch(doc_mapper).expect("batch");
        let batch = indexer.add(batch, records).await.expect("added");
        assert_eq!(batch.num_docs, 6);
        let finished = Indexer::finish(batch).await.expect("finished");
        assert_eq!(finished.last_position, 2);
        let splits: Vec<(Option<i64>, u64, Option<u64>, SplitFormat)> = finished
            .splits
            .iter()
            .map(|s| {
                (
                    s.built.time_bucket_start,
                    s.built.num_docs,
                    s.num_series,
                    s.format,
                )
            })
            .collect();
        assert_eq!(
            splits,
            vec![
                // The duplicate (series a, -10 s) is one sample.
                (Some(t0 / 1000 - 900), 2, Some(1), SplitFormat::Parquet),
                (Some(t0 / 1000), 3, Some(2), SplitFormat::Parquet),
            ]
        );
        for split in &finished.splits {
            assert!(split.built.path.exists());
            assert_eq!(
                split.sort_fields.as_deref(),
                Some(
                    &[
                        "__name__".to_string(),
                        "host".to_string(),
                        "__series_id__".to_string()
                    ][..]
                )
            );
            assert!(split.built.tags.contains("__name__:cpu"));
        }
        let dead = std::fs::read_to_string(scratch.path().join("q.ndjson")).expect("dead letters");
        assert!(dead.contains("\"position\":1"), "{dead}");
    }
}
