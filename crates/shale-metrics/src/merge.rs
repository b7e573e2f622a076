//! The metrics merge: m metrics splits of one time bucket in, n out, by a sorted k-way merge.
//!
//! Every input's rows are sorted by (metric name, sort labels, series id, timestamp), so each
//! input is read as a stream of series in sort-key order, a record batch at a time. A heap
//! over the inputs yields the series in global order; the copies of one series in several
//! inputs are merged by timestamp, and of two samples with one timestamp the one of the later
//! input is kept (inputs come oldest first: the last written value wins, as at ingest).
//!
//! Outputs are cut at series boundaries, never inside a series:
//! - at the target size (estimated from the inputs' bytes per sample);
//! - around *fixed* key ranges (the bucket's level-1 splits that are not inputs): no level-1
//!   output reaches into one, and the series inside one go to level-0 outputs of their own.
//!
//! A level-1 output records the range it owns, widened to whole series prefixes
//! (`[first prefix, last prefix ++ 0xFF]`), so that fresh data of any of its series overlaps it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type, UInt64Type};
use arrow_array::{Array, DictionaryArray, Float64Array, Int64Array, RecordBatch, UInt64Array};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use shale_types::sort_key;

use crate::split::{series_sort_key, sort_key_kinds, SortedSplitWriter, SplitSummary};
use crate::{
    Labels, MetricsError, Sample, METRIC_NAME_LABEL, SERIES_ID_COLUMN, TIMESTAMP_COLUMN,
    VALUE_COLUMN,
};

/// Rows per record batch read from an input.
const READ_BATCH_ROWS: usize = 16 * 1024;

/// How to cut the outputs of a merge.
#[derive(Clone, Debug, Default)]
pub struct MergeCut {
    /// An output holds at most about this many bytes (one series bigger than that is not
    /// split). `None`: one output (but for fixed ranges).
    pub target_bytes: Option<u64>,
    /// Sort-key ranges (inclusive) of the bucket's level-1 splits that are not inputs.
    pub fixed_ranges: Vec<(Vec<u8>, Vec<u8>)>,
    /// Whether outputs are level 1 (a locality merge); otherwise they keep `plain_level`.
    pub locality: bool,
    /// The level of the outputs of a plain merge.
    pub plain_level: u8,
}

/// One output of a merge.
#[derive(Debug)]
pub struct MergedOutput {
    /// The Parquet file.
    pub bytes: Vec<u8>,
    /// What it holds.
    pub summary: SplitSummary,
    /// 1 for a locality output outside every fixed range, else 0 (or the plain level).
    pub key_level: u8,
    /// The key range to record: owned whole prefixes for level 1, the keys' range otherwise.
    pub key_range: Option<(Vec<u8>, Vec<u8>)>,
}

/// What a merge did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MergeStats {
    /// Samples read from the inputs.
    pub samples_in: u64,
    /// Samples written.
    pub samples_out: u64,
    /// Samples dropped as duplicates (same series and timestamp in several inputs).
    pub duplicates: u64,
    /// Samples left out because a delete task removes them.
    pub deleted: u64,
    /// Series written.
    pub series_out: u64,
}

/// One series of an input, complete.
struct SeriesRun {
    labels: Labels,
    series_id: u64,
    samples: Vec<Sample>,
}

/// Label columns of the current batch.
struct BatchColumns {
    labels: Vec<(String, DictionaryArray<Int32Type>, Vec<String>)>,
    series_id: UInt64Array,
    timestamp: Int64Array,
    value: Float64Array,
    rows: usize,
}

/// An input read as a stream of series in sort-key order.
struct SeriesCursor {
    reader: ParquetRecordBatchReader,
    batch: Option<BatchColumns>,
    row: usize,
    /// The previous row of the current batch, if it belongs to `current`.
    previous_row: Option<usize>,
    current: Option<SeriesRun>,
    samples_read: u64,
}

impl SeriesCursor {
    fn open(bytes: Bytes) -> Result<SeriesCursor, MetricsError> {
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)?;
        crate::reader::check_version(builder.metadata())?;
        let reader = builder.with_batch_size(READ_BATCH_ROWS).build()?;
        Ok(SeriesCursor {
            reader,
            batch: None,
            row: 0,
            previous_row: None,
            current: None,
            samples_read: 0,
        })
    }

    fn load_batch(&mut self) -> Result<bool, MetricsError> {
        self.previous_row = None;
        self.row = 0;
        let Some(batch) = self.reader.next().transpose()? else {
            self.batch = None;
            return Ok(false);
        };
        self.batch = Some(batch_columns(&batch)?);
        Ok(true)
    }

    fn labels_at(columns: &BatchColumns, row: usize) -> Labels {
        Labels::new(columns.labels.iter().filter_map(|(name, array, values)| {
            let keys = array.keys();
            if keys.is_null(row) {
                return None;
            }
            let value = values.get(usize::try_from(keys.value(row)).ok()?)?;
            Some((name.clone(), value.clone()))
        }))
    }

    fn same_keys(columns: &BatchColumns, a: usize, b: usize) -> bool {
        columns.series_id.value(a) == columns.series_id.value(b)
            && columns.labels.iter().all(|(_, array, _)| {
                let keys = array.keys();
                (!keys.is_null(a)).then(|| keys.value(a))
                    == (!keys.is_null(b)).then(|| keys.value(b))
            })
    }

    /// The next complete series, or `None` at the end of the input.
    fn next_series(&mut self) -> Result<Option<SeriesRun>, MetricsError> {
        loop {
            let exhausted = self.batch.as_ref().is_none_or(|b| self.row >= b.rows);
            if exhausted {
                if !self.load_batch()? {
                    return Ok(self.current.take());
                }
                continue;
            }
            let Some(columns) = self.batch.as_ref() else {
                continue;
            };
            let row = self.row;
            let same = self
                .previous_row
                .is_some_and(|previous| Self::same_keys(columns, previous, row));
            let mut finished = None;
            if !same {
                let labels = Self::labels_at(columns, row);
                let series_id = columns.series_id.value(row);
                let continues = self
                    .current
                    .as_ref()
                    .is_some_and(|c| c.series_id == series_id && c.labels == labels);
                if !continues {
                    finished = self.current.replace(SeriesRun {
                        labels,
                        series_id,
                        samples: Vec::new(),
                    });
                }
            }
            if let Some(current) = self.current.as_mut() {
                current.samples.push(Sample {
                    timestamp_ms: columns.timestamp.value(row),
                    value: columns.value.value(row),
                });
            }
            self.samples_read += 1;
            self.previous_row = Some(row);
            self.row += 1;
            if finished.is_some() {
                return Ok(finished);
            }
        }
    }
}

fn batch_columns(batch: &RecordBatch) -> Result<BatchColumns, MetricsError> {
    let schema = batch.schema();
    let mut labels = Vec::new();
    let mut series_id = None;
    let mut timestamp = None;
    let mut value = None;
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        match field.name().as_str() {
            SERIES_ID_COLUMN => series_id = column.as_primitive_opt::<UInt64Type>().cloned(),
            TIMESTAMP_COLUMN => timestamp = column.as_primitive_opt::<Int64Type>().cloned(),
            VALUE_COLUMN => value = column.as_primitive_opt::<Float64Type>().cloned(),
            name if name == METRIC_NAME_LABEL || !name.starts_with("__") => {
                let array = column
                    .as_dictionary_opt::<Int32Type>()
                    .ok_or_else(|| {
                        MetricsError::InvalidSplit(format!(
                            "label column `{name}` is not dictionary-encoded text"
                        ))
                    })?
                    .clone();
                let strings = array.values().as_string_opt::<i32>().ok_or_else(|| {
                    MetricsError::InvalidSplit(format!("label column `{name}` does not hold text"))
                })?;
                let values = (0..strings.len())
                    .map(|i| strings.value(i).to_string())
                    .collect();
                labels.push((name.to_string(), array, values));
            }
            _ => {}
        }
    }
    match (series_id, timestamp, value) {
        (Some(series_id), Some(timestamp), Some(value)) => Ok(BatchColumns {
            labels,
            series_id,
            timestamp,
            value,
            rows: batch.num_rows(),
        }),
        _ => Err(MetricsError::InvalidSplit(
            "no series id, timestamp or value column".to_string(),
        )),
    }
}

/// The label column names of a split (its Parquet schema), but the metric name.
fn label_columns(bytes: &Bytes) -> Result<Vec<String>, MetricsError> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes.clone())?;
    Ok(builder
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|name| !name.starts_with("__"))
        .collect())
}

/// Merges the samples of `a` (older) and `b` (newer), both sorted by timestamp with one
/// sample per timestamp; `b` wins a shared timestamp. Returns the duplicates dropped.
fn merge_samples(a: Vec<Sample>, b: &[Sample]) -> (Vec<Sample>, u64) {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let mut duplicates = 0;
    let mut j = 0;
    for sample in a {
        while j < b.len() && b[j].timestamp_ms < sample.timestamp_ms {
            out.push(b[j]);
            j += 1;
        }
        if j < b.len() && b[j].timestamp_ms == sample.timestamp_ms {
            duplicates += 1;
            continue;
        }
        out.push(sample);
    }
    out.extend_from_slice(&b[j..]);
    (out, duplicates)
}

/// The output under construction.
struct OpenOutput {
    writer: SortedSplitWriter,
    /// Fixed range the output's series are in, and how many fixed ranges lie below them.
    class: (Option<usize>, usize),
}

/// Merges the metrics splits `inputs` (oldest first) of one time bucket, written with
/// `sort_labels`, into outputs cut as `cut` says. `deletes[i]` (if any) are the delete tasks
/// input `i` is not clean of: the samples they remove are left out.
pub fn merge_splits(
    inputs: &[Bytes],
    sort_labels: &[String],
    cut: &MergeCut,
    deletes: &[Vec<crate::SeriesDelete>],
) -> Result<(Vec<MergedOutput>, MergeStats), MetricsError> {
    let kinds = sort_key_kinds(sort_labels.len());
    let prefix_of = |key: &[u8]| -> Result<Vec<u8>, MetricsError> {
        let len = sort_key::prefix_len(&kinds, key)
            .map_err(|err| MetricsError::InvalidSplit(format!("a fixed key range: {err}")))?;
        Ok(key[..len].to_vec())
    };
    let fixed: Vec<(Vec<u8>, Vec<u8>)> = cut
        .fixed_ranges
        .iter()
        .map(|(min, max)| Ok((prefix_of(min)?, prefix_of(max)?)))
        .collect::<Result<_, MetricsError>>()?;

    // The outputs' columns: every label column of an input.
    let mut others: BTreeSet<String> = BTreeSet::new();
    // The inputs' data bytes (row groups, without footers) per sample: the first estimate of
    // an output's size, replaced by the outputs' own ratio once one is written.
    let mut input_bytes = 0u64;
    let mut input_rows = 0u64;
    for bytes in inputs {
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes.clone())?;
        let metadata = reader.metadata();
        input_rows += metadata.file_metadata().num_rows().max(0) as u64;
        input_bytes += metadata
            .row_groups()
            .iter()
            .map(|rg| rg.compressed_size().max(0) as u64)
            .sum::<u64>();
        for name in label_columns(bytes)? {
            if !sort_labels.contains(&name) {
                others.insert(name);
            }
        }
    }
    let others: Vec<String> = others.into_iter().collect();
    // Bloom filters sized for every distinct value the inputs may hold.
    let ndv = vec![input_rows.clamp(1, 1 << 20); 1 + sort_labels.len()];
    let mut bytes_per_sample = if input_rows > 0 {
        (input_bytes as f64 / input_rows as f64).max(0.01)
    } else {
        1.0
    };
    let target_samples = |bytes_per_sample: f64| match cut.target_bytes {
        Some(bytes) => ((bytes as f64 / bytes_per_sample) as u64).max(1),
        None => u64::MAX,
    };

    let mut cursors = inputs
        .iter()
        .map(|bytes| SeriesCursor::open(bytes.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    // (prefix, labels, input) of each input's next series; the series themselves by input.
    let mut heads: Vec<Option<SeriesRun>> = Vec::with_capacity(cursors.len());
    let mut heap: BinaryHeap<Reverse<(Vec<u8>, Labels, usize)>> = BinaryHeap::new();
    for (i, cursor) in cursors.iter_mut().enumerate() {
        let head = cursor.next_series()?;
        if let Some(run) = &head {
            heap.push(Reverse((
                series_sort_key(sort_labels, &run.labels, run.series_id, None),
                run.labels.clone(),
                i,
            )));
        }
        heads.push(head);
    }

    let mut stats = MergeStats::default();
    let mut outputs: Vec<MergedOutput> = Vec::new();
    let mut open: Option<OpenOutput> = None;
    let close = |open: OpenOutput, outputs: &mut Vec<MergedOutput>| -> Result<(), MetricsError> {
        let level = if !cut.locality {
            cut.plain_level
        } else if open.class.0.is_some() {
            0
        } else {
            1
        };
        let owned = open
            .writer
            .prefix_range()
            .map(|(first, last)| (first.to_vec(), sort_key::prefix_upper_bound(last)));
        let (bytes, summary) = open.writer.finish()?;
        if summary.num_samples == 0 {
            return Ok(());
        }
        let key_range = if level > 0 && cut.locality {
            owned
        } else {
            summary.sort_key_range.clone()
        };
        outputs.push(MergedOutput {
            bytes,
            summary,
            key_level: level,
            key_range,
        });
        Ok(())
    };
    while let Some(Reverse((prefix, labels, first))) = heap.pop() {
        // Every input whose next series is this one, oldest first.
        let mut sources = vec![first];
        while let Some(Reverse((p, l, _))) = heap.peek() {
            if *p != prefix || *l != labels {
                break;
            }
            if let Some(Reverse((_, _, i))) = heap.pop() {
                sources.push(i);
            }
        }
        sources.sort_unstable();
        let mut merged: Option<SeriesRun> = None;
        for &i in &sources {
            let Some(mut run) = heads[i].take() else {
                continue;
            };
            if let Some(tasks) = deletes.get(i).filter(|t| !t.is_empty()) {
                let tasks: Vec<&crate::SeriesDelete> = tasks.iter().collect();
                stats.deleted += crate::apply_deletes(&tasks, &run.labels, &mut run.samples);
            }
            merged = Some(match merged {
                None => run,
                Some(mut older) => {
                    let (samples, duplicates) = merge_samples(older.samples, &run.samples);
                    stats.duplicates += duplicates;
                    older.samples = samples;
                    older
                }
            });
            let next = cursors[i].next_series()?;
            if let Some(run) = &next {
                heap.push(Reverse((
                    series_sort_key(sort_labels, &run.labels, run.series_id, None),
                    run.labels.clone(),
                    i,
                )));
            }
            heads[i] = next;
        }
        let Some(series) = merged else {
            continue;
        };
        if series.samples.is_empty() {
            continue;
        }
        // Which fixed range the series is in, and how many lie wholly below it: an output
        // never spans a fixed range, even one no input series falls in.
        let inside = fixed
            .iter()
            .position(|(min, max)| min.as_slice() <= prefix.as_slice() && prefix <= *max);
        let below = fixed.iter().filter(|(_, max)| *max < prefix).count();
        let class = (inside, below);
        let samples = series.samples.len() as u64;
        let start_new = match &open {
            None => true,
            Some(o) => {
                o.class != class
                    || (o.writer.num_samples() > 0
                        && o.writer.num_samples().saturating_add(samples)
                            > target_samples(bytes_per_sample))
            }
        };
        if start_new {
            if let Some(previous) = open.take() {
                close(previous, &mut outputs)?;
                let written: u64 = outputs.iter().map(|o| o.bytes.len() as u64).sum();
                let samples: u64 = outputs.iter().map(|o| o.summary.num_samples).sum();
                if samples > 0 {
                    bytes_per_sample = (written as f64 / samples as f64).max(0.01);
                }
            }
            open = Some(OpenOutput {
                writer: SortedSplitWriter::new(sort_labels, &others, &ndv)?,
                class,
            });
        }
        if let Some(o) = open.as_mut() {
            o.writer
                .push_series(&series.labels, series.series_id, &series.samples)?;
        }
        stats.samples_out += samples;
        stats.series_out += 1;
    }
    if let Some(last) = open.take() {
        close(last, &mut outputs)?;
    }
    stats.samples_in = cursors.iter().map(|c| c.samples_read).sum();
    Ok((outputs, stats))
}

/// The same merge done the plain way, for benchmarks: every input decoded whole into memory,
/// sorted and deduplicated by [`crate::MetricsSplitWriter`], written as one split.
pub fn read_sort_write(
    inputs: &[Bytes],
    sort_labels: &[String],
) -> Result<(Vec<u8>, SplitSummary), MetricsError> {
    let mut writer = crate::MetricsSplitWriter::new(sort_labels.to_vec());
    for bytes in inputs {
        let read = crate::read_split(bytes.clone(), &[], i64::MIN, i64::MAX)?;
        for series in read.series {
            writer.add(&series.labels, series.samples);
        }
    }
    writer.finish()
}

/// Samples by series of some splits, for tests: the multiset a merge must conserve.
pub fn samples_by_series(
    splits: &[Bytes],
) -> Result<BTreeMap<Labels, BTreeMap<i64, u64>>, MetricsError> {
    let mut out: BTreeMap<Labels, BTreeMap<i64, u64>> = BTreeMap::new();
    for bytes in splits {
        let read = crate::read_split(bytes.clone(), &[], i64::MIN, i64::MAX)?;
        for series in read.series {
            let entry = out.entry(series.labels).or_default();
            for sample in series.samples {
                entry.insert(sample.timestamp_ms, sample.value.to_bits());
            }
        }
    }
    Ok(out)
}
