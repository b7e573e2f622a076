//! The metrics split: one Parquet file with the samples of one time bucket.
//!
//! Columns: `__name__`, one per label (the index's sort labels first, in their order, then the
//! others by name; null where a series lacks the label), `__series_id__`, `__timestamp__`
//! (milliseconds) and `__value__`. Rows are sorted by (metric name, sort labels, series id,
//! timestamp), one per (series, timestamp): of two samples with one timestamp the last added
//! is kept. Label columns are dictionary-encoded; timestamps delta-encoded; values
//! byte-stream-split (floats of one series compress well once their bytes are grouped);
//! everything zstd. Row groups carry statistics and a page index; `__name__` and the sort
//! labels have bloom filters. The file's key-value metadata records the format version, the
//! sort labels and the series index (every series' first row and label values: see
//! [`crate::SeriesIndex`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use arrow_array::builder::{Float64Builder, Int64Builder, StringDictionaryBuilder, UInt64Builder};
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::{KeyValue, SortingColumn};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use shale_types::sort_key::{self, SortFieldType, SortValue};

use crate::series_index::{SeriesIndexBuilder, SERIES_INDEX_KEY};
use crate::{Labels, MetricsError, Sample, METRIC_NAME_LABEL};

/// The column of series ids.
pub const SERIES_ID_COLUMN: &str = "__series_id__";
/// The column of timestamps (milliseconds since the Unix epoch).
pub const TIMESTAMP_COLUMN: &str = "__timestamp__";
/// The column of values.
pub const VALUE_COLUMN: &str = "__value__";
/// Key-value metadata: the format version.
pub(crate) const VERSION_KEY: &str = "shale.metrics.version";
/// Key-value metadata: the sort labels, as a JSON array.
pub(crate) const SORT_LABELS_KEY: &str = "shale.metrics.sort_labels";
/// The version this crate writes.
pub(crate) const FORMAT_VERSION: &str = "1";

/// Rows per row group (the unit of pruning by statistics and bloom filters).
const ROW_GROUP_ROWS: usize = 256 * 1024;
/// Rows per data page (the unit of the page index).
const PAGE_ROWS: usize = 8 * 1024;
/// Bytes of a page of values before compression (2 Ki values).
const VALUE_PAGE_BYTES: usize = 16 * 1024;
/// Rows per Arrow batch handed to the writer.
const BATCH_ROWS: usize = 64 * 1024;

/// The start (ms) of the time bucket of `timestamp_ms`, buckets of `bucket_secs` seconds
/// aligned on the epoch.
pub fn bucket_start_ms(timestamp_ms: i64, bucket_secs: u64) -> i64 {
    let bucket_ms = (bucket_secs.max(1) * 1000) as i64;
    timestamp_ms.div_euclid(bucket_ms) * bucket_ms
}

/// The kinds of a metrics sort key with `sort_labels` labels: the metric name, each sort
/// label, the series id (then the timestamp component, as every sort key).
pub fn sort_key_kinds(sort_labels: usize) -> Vec<SortFieldType> {
    let mut kinds = vec![SortFieldType::Text; 1 + sort_labels];
    kinds.push(SortFieldType::U64);
    kinds
}

/// What a written split holds, for its metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitSummary {
    /// Samples (rows).
    pub num_samples: u64,
    /// Series.
    pub num_series: u64,
    /// Smallest and largest timestamp (ms), if any sample.
    pub time_range_ms: Option<(i64, i64)>,
    /// The metric names.
    pub metric_names: BTreeSet<String>,
    /// The smallest and largest sort key (see [`sort_key_kinds`]), if any sample.
    pub sort_key_range: Option<(Vec<u8>, Vec<u8>)>,
    /// Bytes of the file.
    pub size_bytes: u64,
}

/// Most metric names recorded as tags of a split; beyond, the split is tagged `__name__!`
/// (it may hold any name) and pruning by name falls to the row groups' bloom filters.
pub const MAX_METRIC_NAME_TAGS: usize = 1000;

impl SplitSummary {
    /// The split's tags: `__name__:<name>` per metric name, or `__name__!` beyond
    /// [`MAX_METRIC_NAME_TAGS`] names.
    pub fn name_tags(&self) -> BTreeSet<String> {
        if self.metric_names.len() > MAX_METRIC_NAME_TAGS {
            return BTreeSet::from([format!("{METRIC_NAME_LABEL}!")]);
        }
        self.metric_names
            .iter()
            .map(|name| format!("{METRIC_NAME_LABEL}:{name}"))
            .collect()
    }

    /// The time range of the samples in whole seconds (floored), as split metadata records it.
    pub fn time_range_secs(&self) -> Option<shale_types::TimeRange> {
        self.time_range_ms
            .map(|(start, end)| shale_types::TimeRange {
                start: start.div_euclid(1000),
                end: end.div_euclid(1000),
            })
    }
}

/// The byte range of a Parquet file's footer (its metadata, the metadata's length and
/// `PAR1`), to the end of the file: what a reader fetches first.
pub fn footer_offsets(file: &[u8]) -> (u64, u64) {
    let size = file.len() as u64;
    let footer_len = file
        .len()
        .checked_sub(8)
        .and_then(|at| file.get(at..at + 4))
        .map(|len| u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as u64)
        .unwrap_or(0);
    (size.saturating_sub(8 + footer_len), size)
}

/// Collects series and samples, then writes them as one sorted Parquet split.
#[derive(Debug)]
pub struct MetricsSplitWriter {
    sort_labels: Vec<String>,
    series: HashMap<Labels, Vec<Sample>>,
    num_added: u64,
    series_index: bool,
}

impl MetricsSplitWriter {
    /// A writer for an index whose sort labels (after the metric name) are `sort_labels`.
    pub fn new(sort_labels: Vec<String>) -> MetricsSplitWriter {
        MetricsSplitWriter {
            sort_labels,
            series: HashMap::new(),
            num_added: 0,
            series_index: true,
        }
    }

    /// Writes the split without a series index, as versions before it did (reads then rule
    /// rows out by the page index: for checking that both give the same answers).
    pub fn without_series_index(mut self) -> MetricsSplitWriter {
        self.series_index = false;
        self
    }

    /// Adds samples of a series; a later sample with the timestamp of an earlier one
    /// replaces it.
    pub fn add(&mut self, labels: &Labels, samples: impl IntoIterator<Item = Sample>) {
        let entry = match self.series.get_mut(labels) {
            Some(entry) => entry,
            None => self.series.entry(labels.clone()).or_default(),
        };
        let before = entry.len();
        entry.extend(samples);
        self.num_added += (entry.len() - before) as u64;
    }

    /// Samples added so far (duplicates included).
    pub fn num_added(&self) -> u64 {
        self.num_added
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.num_added == 0
    }

    /// Sorts, deduplicates and writes the split; returns its bytes and summary.
    pub fn finish(mut self) -> Result<(Vec<u8>, SplitSummary), MetricsError> {
        let mut series: Vec<(Labels, u64, Vec<Sample>)> = std::mem::take(&mut self.series)
            .into_iter()
            .map(|(labels, samples)| {
                // Of equal timestamps the last added is kept.
                let id = labels.series_id();
                (labels, id, crate::last_per_timestamp(samples))
            })
            .collect();
        let sort_labels = &self.sort_labels;
        series.sort_by(|(a, a_id, _), (b, b_id, _)| {
            a.metric_name()
                .cmp(b.metric_name())
                .then_with(|| {
                    sort_labels
                        .iter()
                        .map(|l| a.get(l))
                        .cmp(sort_labels.iter().map(|l| b.get(l)))
                })
                .then(a_id.cmp(b_id))
                .then_with(|| a.cmp(b))
        });

        // Label columns: the sort labels, then every other label by name.
        let mut others: BTreeSet<&str> = BTreeSet::new();
        let mut distinct: Vec<BTreeSet<&str>> = vec![BTreeSet::new(); 1 + sort_labels.len()];
        for (labels, _, _) in &series {
            for (name, _) in labels.iter() {
                if name != METRIC_NAME_LABEL && !sort_labels.iter().any(|l| l == name) {
                    others.insert(name);
                }
            }
            distinct[0].insert(labels.metric_name());
            for (i, label) in sort_labels.iter().enumerate() {
                if let Some(value) = labels.get(label) {
                    distinct[i + 1].insert(value);
                }
            }
        }
        let other_columns: Vec<String> = others.into_iter().map(str::to_string).collect();
        let distinct_counts: Vec<u64> = distinct.iter().map(|d| d.len() as u64).collect();
        let mut writer = SortedSplitWriter::new(sort_labels, &other_columns, &distinct_counts)?;
        if !self.series_index {
            writer.index = None;
        }
        for (labels, id, samples) in &series {
            writer.push_series(labels, *id, samples)?;
        }
        writer.finish()
    }
}

/// The sort key of a series at `timestamp_ms` (`None`: the series' prefix, the key without
/// its timestamp component).
pub fn series_sort_key(
    sort_labels: &[String],
    labels: &Labels,
    series_id: u64,
    timestamp_ms: Option<i64>,
) -> Vec<u8> {
    let mut values = Vec::with_capacity(sort_labels.len() + 2);
    values.push(SortValue::Text(labels.metric_name().to_string()));
    for label in sort_labels {
        values.push(match labels.get(label) {
            Some(value) => SortValue::Text(value.to_string()),
            None => SortValue::Missing,
        });
    }
    values.push(SortValue::U64(series_id));
    let mut key = sort_key::encode(&sort_key_kinds(sort_labels.len()), &values, timestamp_ms);
    if timestamp_ms.is_none() {
        // Drop the "no timestamp" marker: a prefix sorts before every key that extends it.
        key.pop();
    }
    key
}

/// Writes series that come in sort-key order (metric name, sort labels, series id) as one
/// Parquet split, streaming: rows go to the Parquet writer a batch at a time. The label
/// columns are known up front (the sort labels, then `other_labels`); a series may lack any.
pub struct SortedSplitWriter {
    sort_labels: Vec<String>,
    label_columns: Vec<String>,
    schema: Arc<Schema>,
    writer: ArrowWriter<Vec<u8>>,
    rows: Rows,
    num_samples: u64,
    num_series: u64,
    time_range: Option<(i64, i64)>,
    key_range: Option<(Vec<u8>, Vec<u8>)>,
    first_prefix: Option<Vec<u8>>,
    last_prefix: Option<Vec<u8>>,
    metric_names: BTreeSet<String>,
    /// `None`: the split is written without a series index.
    index: Option<SeriesIndexBuilder>,
}

impl std::fmt::Debug for SortedSplitWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SortedSplitWriter")
            .field("label_columns", &self.label_columns)
            .field("num_samples", &self.num_samples)
            .finish()
    }
}

impl SortedSplitWriter {
    /// A writer with the columns of `sort_labels` then `other_labels` (sorted by name, none
    /// of them a sort label). `distinct_counts` estimates the distinct values of the metric
    /// name and of each sort label (it sizes their bloom filters).
    pub fn new(
        sort_labels: &[String],
        other_labels: &[String],
        distinct_counts: &[u64],
    ) -> Result<SortedSplitWriter, MetricsError> {
        let label_columns: Vec<String> = sort_labels
            .iter()
            .chain(other_labels.iter())
            .cloned()
            .collect();
        let dictionary =
            || DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let mut fields = vec![Field::new(METRIC_NAME_LABEL, dictionary(), false)];
        fields.extend(
            label_columns
                .iter()
                .map(|name| Field::new(name, dictionary(), true)),
        );
        fields.push(Field::new(SERIES_ID_COLUMN, DataType::UInt64, false));
        fields.push(Field::new(TIMESTAMP_COLUMN, DataType::Int64, false));
        fields.push(Field::new(VALUE_COLUMN, DataType::Float64, false));
        let schema = Arc::new(Schema::new(fields));

        let mut builder = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_data_page_row_count_limit(PAGE_ROWS)
            .set_sorting_columns(Some(
                (0..=sort_labels.len())
                    .chain([1 + label_columns.len(), 2 + label_columns.len()])
                    .map(|column| SortingColumn {
                        column_idx: column as i32,
                        descending: false,
                        nulls_first: true,
                    })
                    .collect(),
            ))
            .set_key_value_metadata(Some(vec![
                KeyValue::new(VERSION_KEY.to_string(), FORMAT_VERSION.to_string()),
                KeyValue::new(
                    SORT_LABELS_KEY.to_string(),
                    serde_json::to_string(sort_labels).unwrap_or_else(|_| "[]".to_string()),
                ),
            ]));
        // Values: smaller pages (a one-series read decompresses the pages of its rows
        // only), without page statistics (no query prunes by value).
        builder = builder
            .set_column_data_page_size_limit(ColumnPath::from(VALUE_COLUMN), VALUE_PAGE_BYTES)
            .set_column_statistics_enabled(
                ColumnPath::from(VALUE_COLUMN),
                EnabledStatistics::Chunk,
            );
        for column in [TIMESTAMP_COLUMN, VALUE_COLUMN] {
            let path = ColumnPath::from(column);
            builder = builder
                .set_column_dictionary_enabled(path.clone(), false)
                .set_column_encoding(
                    path,
                    if column == TIMESTAMP_COLUMN {
                        Encoding::DELTA_BINARY_PACKED
                    } else {
                        Encoding::BYTE_STREAM_SPLIT
                    },
                );
        }
        let bloom_columns =
            std::iter::once(METRIC_NAME_LABEL).chain(sort_labels.iter().map(String::as_str));
        for (i, column) in bloom_columns.enumerate() {
            let path = ColumnPath::from(column);
            builder = builder
                .set_column_bloom_filter_enabled(path.clone(), true)
                .set_column_bloom_filter_fpp(path.clone(), 0.01)
                .set_column_bloom_filter_max_ndv(
                    path,
                    distinct_counts.get(i).copied().unwrap_or(1).max(1),
                );
        }
        let writer = ArrowWriter::try_new(Vec::new(), schema.clone(), Some(builder.build()))?;
        Ok(SortedSplitWriter {
            sort_labels: sort_labels.to_vec(),
            rows: Rows::new(label_columns.len()),
            index: Some(SeriesIndexBuilder::new(&label_columns)),
            label_columns,
            schema,
            writer,
            num_samples: 0,
            num_series: 0,
            time_range: None,
            key_range: None,
            first_prefix: None,
            last_prefix: None,
            metric_names: BTreeSet::new(),
        })
    }

    /// Appends a series (after every series pushed before it in sort-key order) with its
    /// samples sorted by timestamp, one per timestamp.
    pub fn push_series(
        &mut self,
        labels: &Labels,
        series_id: u64,
        samples: &[Sample],
    ) -> Result<(), MetricsError> {
        let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
            return Ok(());
        };
        self.metric_names.insert(labels.metric_name().to_string());
        if let Some(index) = &mut self.index {
            index.push(labels, self.num_samples);
        }
        self.num_samples += samples.len() as u64;
        self.num_series += 1;
        self.time_range = Some(match self.time_range {
            None => (first.timestamp_ms, last.timestamp_ms),
            Some((lo, hi)) => (lo.min(first.timestamp_ms), hi.max(last.timestamp_ms)),
        });
        // Keys order timestamps descending: a series' smallest key is at its last sample.
        let low = series_sort_key(
            &self.sort_labels,
            labels,
            series_id,
            Some(last.timestamp_ms),
        );
        let high = series_sort_key(
            &self.sort_labels,
            labels,
            series_id,
            Some(first.timestamp_ms),
        );
        self.key_range = Some(match self.key_range.take() {
            None => (low, high),
            Some((lo, hi)) => (lo.min(low), hi.max(high)),
        });
        let prefix = series_sort_key(&self.sort_labels, labels, series_id, None);
        if self.first_prefix.is_none() {
            self.first_prefix = Some(prefix.clone());
        }
        self.last_prefix = Some(prefix);
        for sample in samples {
            self.rows
                .push(labels, &self.label_columns, series_id, *sample);
            if self.rows.len >= BATCH_ROWS {
                self.writer.write(&self.rows.finish(&self.schema)?)?;
            }
        }
        Ok(())
    }

    /// Samples written so far.
    pub fn num_samples(&self) -> u64 {
        self.num_samples
    }

    /// The prefixes (sort keys without timestamp) of the first and last series written.
    pub fn prefix_range(&self) -> Option<(&[u8], &[u8])> {
        Some((self.first_prefix.as_deref()?, self.last_prefix.as_deref()?))
    }

    /// Closes the file; returns its bytes and summary.
    pub fn finish(mut self) -> Result<(Vec<u8>, SplitSummary), MetricsError> {
        if self.rows.len > 0 {
            self.writer.write(&self.rows.finish(&self.schema)?)?;
        }
        if let Some(index) = self.index.and_then(|index| index.finish(self.num_samples)) {
            self.writer.append_key_value_metadata(KeyValue::new(
                SERIES_INDEX_KEY.to_string(),
                index.encode()?,
            ));
        }
        let out = self.writer.into_inner()?;
        let summary = SplitSummary {
            num_samples: self.num_samples,
            num_series: self.num_series,
            time_range_ms: self.time_range,
            metric_names: self.metric_names,
            sort_key_range: self.key_range,
            size_bytes: out.len() as u64,
        };
        Ok((out, summary))
    }
}

/// Column builders of one Arrow batch.
struct Rows {
    name: StringDictionaryBuilder<Int32Type>,
    labels: Vec<StringDictionaryBuilder<Int32Type>>,
    series_id: UInt64Builder,
    timestamp: Int64Builder,
    value: Float64Builder,
    len: usize,
}

impl Rows {
    fn new(label_columns: usize) -> Rows {
        Rows {
            name: StringDictionaryBuilder::new(),
            labels: (0..label_columns)
                .map(|_| StringDictionaryBuilder::new())
                .collect(),
            series_id: UInt64Builder::new(),
            timestamp: Int64Builder::new(),
            value: Float64Builder::new(),
            len: 0,
        }
    }

    fn push(&mut self, labels: &Labels, columns: &[String], series_id: u64, sample: Sample) {
        self.name.append_value(labels.metric_name());
        for (builder, column) in self.labels.iter_mut().zip(columns) {
            match labels.get(column) {
                Some(value) => builder.append_value(value),
                None => builder.append_null(),
            }
        }
        self.series_id.append_value(series_id);
        self.timestamp.append_value(sample.timestamp_ms);
        self.value.append_value(sample.value);
        self.len += 1;
    }

    fn finish(&mut self, schema: &Arc<Schema>) -> Result<RecordBatch, MetricsError> {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.labels.len() + 4);
        columns.push(Arc::new(self.name.finish()));
        for builder in &mut self.labels {
            columns.push(Arc::new(builder.finish()));
        }
        columns.push(Arc::new(self.series_id.finish()));
        columns.push(Arc::new(self.timestamp.finish()));
        columns.push(Arc::new(self.value.finish()));
        self.len = 0;
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }
}
