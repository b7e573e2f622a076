//! Reads the series of a metrics split that a selector matches within a time range. Before
//! decoding anything it rules out row groups: by the statistics of `__timestamp__`, by the
//! statistics of every label an `=` matcher requires, and by the bloom filters of
//! `__name__` and the sort labels; then, within the row groups left, pages by the page index
//! of the same columns. A matcher on a label the split has no column for is decided for the
//! whole split. Parsed footers are cached by split id. A split is read from its bytes in
//! memory, or by byte ranges ([`read_split_ranges`]: only the footer once, then the bloom
//! filters and pages a read needs).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, LazyLock, Mutex};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type};
use arrow_array::{Array, DictionaryArray, RecordBatch};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use parquet::bloom_filter::Sbbf;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::statistics::Statistics;

use crate::split::{FORMAT_VERSION, VERSION_KEY};
use crate::{
    Labels, Matcher, MetricsError, Sample, SeriesSamples, METRIC_NAME_LABEL, TIMESTAMP_COLUMN,
    VALUE_COLUMN,
};

/// What reading a split cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Row groups in the split.
    pub row_groups: usize,
    /// Row groups decoded (the others were ruled out).
    pub row_groups_read: usize,
    /// Rows decoded.
    pub rows_read: u64,
    /// Samples returned.
    pub samples: u64,
}

/// The series a read found, sorted by labels, and what it cost.
#[derive(Clone, Debug, Default)]
pub struct SplitRead {
    /// Matching series with their samples in `[start_ms, end_ms]`.
    pub series: Vec<SeriesSamples>,
    /// The cost.
    pub stats: ReadStats,
}

/// The series of the split `bytes` that every matcher matches, with their samples whose
/// timestamps are in `[start_ms, end_ms]` (series without such a sample are left out).
pub fn read_split(
    bytes: Bytes,
    matchers: &[Matcher],
    start_ms: i64,
    end_ms: i64,
) -> Result<SplitRead, MetricsError> {
    read_split_with(bytes, matchers, start_ms, end_ms, true)
}

/// [`read_split`], ruling out row groups by statistics and bloom filters only when
/// `prune_row_groups` (without, every row group is decoded: the same answer, for checks).
pub fn read_split_with(
    bytes: Bytes,
    matchers: &[Matcher],
    start_ms: i64,
    end_ms: i64,
    prune_row_groups: bool,
) -> Result<SplitRead, MetricsError> {
    read_split_cached(None, bytes, matchers, start_ms, end_ms, prune_row_groups)
}

/// Parsed footers (page index included) of the splits read before, by split id: a split
/// never changes, so a query parses each footer once per node.
static FOOTERS: LazyLock<Mutex<HashMap<String, ArrowReaderMetadata>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Most footers kept (a footer with its page index is some tens of KiB).
const MAX_FOOTERS: usize = 2048;

/// The parsed footer of the split `bytes`, from the cache when `key` names a split read
/// before.
fn reader_metadata(key: Option<&str>, bytes: &Bytes) -> Result<ArrowReaderMetadata, MetricsError> {
    if let Some(key) = key {
        let footers = FOOTERS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(metadata) = footers.get(key) {
            return Ok(metadata.clone());
        }
    }
    let metadata = ArrowReaderMetadata::load(
        bytes,
        ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional),
    )?;
    check_version(metadata.metadata())?;
    if let Some(key) = key {
        remember_footer(key, &metadata);
    }
    Ok(metadata)
}

/// Bloom filters read before, by (split id, row group, column); `None` for a column chunk
/// without one. A split never changes, so a query of a series already asked about fetches
/// only its pages.
static BLOOMS: LazyLock<Mutex<HashMap<BloomKey, Option<Arc<Sbbf>>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// (split id, row group, column) of a cached bloom filter.
type BloomKey = (String, usize, usize);

/// Most bloom filters kept (a filter of a metrics split is a few KiB).
const MAX_BLOOMS: usize = 16_384;

fn cached_bloom(key: &str, row_group: usize, column: usize) -> Option<Option<Arc<Sbbf>>> {
    BLOOMS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(key.to_string(), row_group, column))
        .cloned()
}

fn remember_bloom(key: &str, row_group: usize, column: usize, filter: Option<Arc<Sbbf>>) {
    let mut blooms = BLOOMS.lock().unwrap_or_else(|p| p.into_inner());
    if blooms.len() >= MAX_BLOOMS {
        blooms.clear();
    }
    blooms.insert((key.to_string(), row_group, column), filter);
}

/// Caches the parsed footer of the split `key`.
fn remember_footer(key: &str, metadata: &ArrowReaderMetadata) {
    let mut footers = FOOTERS.lock().unwrap_or_else(|p| p.into_inner());
    if footers.len() >= MAX_FOOTERS {
        footers.clear();
    }
    footers.insert(key.to_string(), metadata.clone());
}

/// [`read_split_with`], the split's parsed footer cached under `key` (its split id): rows are
/// also ruled out page by page, by the page index of the `=` matchers' columns and of the
/// timestamps.
pub fn read_split_cached(
    key: Option<&str>,
    bytes: Bytes,
    matchers: &[Matcher],
    start_ms: i64,
    end_ms: i64,
    prune_row_groups: bool,
) -> Result<SplitRead, MetricsError> {
    let reader_metadata = reader_metadata(key, &bytes)?;
    let metadata = reader_metadata.metadata().clone();
    let plan = match Plan::make(
        &reader_metadata,
        matchers,
        start_ms,
        end_ms,
        prune_row_groups,
    )? {
        Planned::Nothing(read) => return Ok(read),
        Planned::Read(plan) => plan,
    };
    let mut plan = plan;
    if plan.filters_by_bloom() {
        let mut kept = Vec::with_capacity(plan.candidates.len());
        for &i in &plan.candidates {
            let row_group = metadata.row_group(i);
            let mut may_hold = true;
            for (column, value) in &plan.required {
                if let Some(filter) =
                    Sbbf::read_from_column_chunk(row_group.column(*column), &bytes)?
                {
                    if !filter.check(value.as_bytes()) {
                        may_hold = false;
                        break;
                    }
                }
            }
            if may_hold {
                kept.push(i);
            }
        }
        plan.candidates = kept;
    }
    let Some(selection) = plan.select_pages(&metadata) else {
        return Ok(plan.read);
    };
    let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(bytes, reader_metadata)
        .with_row_groups(plan.candidates.clone());
    if let Some(selection) = selection {
        builder = builder.with_row_selection(selection);
    }
    let mut series = SeriesMap::default();
    for batch in builder.build()? {
        let batch = batch?;
        plan.read.stats.rows_read += batch.num_rows() as u64;
        collect_batch(&batch, matchers, start_ms, end_ms, &mut series)?;
    }
    Ok(plan.finish(series))
}

/// Fetches byte ranges of one split object (from local disk or object storage).
pub type FetchRange =
    std::sync::Arc<dyn Fn(Range<u64>) -> BoxFuture<'static, Result<Bytes, String>> + Send + Sync>;

/// A split object read by byte ranges: its footer (with the page index) once per node,
/// then only the bloom filters and pages a read needs. Nearby ranges are fetched as one.
#[derive(Clone)]
pub struct RangeReader {
    fetch: FetchRange,
    size: u64,
}

/// Ranges closer than this are fetched together (fewer requests to object storage).
const COALESCE_GAP: u64 = 16 * 1024;

/// Bytes read from the end of an object for its footer at first (the footer and page index
/// of a metrics split usually fit, so one request gets both).
const FOOTER_PREFETCH: usize = 256 * 1024;

impl RangeReader {
    /// A reader of an object of `size` bytes whose ranges `fetch` returns.
    pub fn new(size: u64, fetch: FetchRange) -> Self {
        RangeReader { fetch, size }
    }
}

fn fetch_error(message: String) -> parquet::errors::ParquetError {
    parquet::errors::ParquetError::External(message.into())
}

impl AsyncFileReader for RangeReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        let fetch = (self.fetch)(range);
        async move { fetch.await.map_err(fetch_error) }.boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        // Sorted and merged when close, fetched concurrently, then cut back.
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        order.sort_by_key(|&i| ranges[i].start);
        let mut merged: Vec<Range<u64>> = Vec::new();
        for &i in &order {
            let range = &ranges[i];
            match merged.last_mut() {
                Some(last) if range.start <= last.end.saturating_add(COALESCE_GAP) => {
                    last.end = last.end.max(range.end);
                }
                _ => merged.push(range.clone()),
            }
        }
        let fetches: Vec<_> = merged.iter().map(|r| (self.fetch)(r.clone())).collect();
        async move {
            let fetched = futures::future::try_join_all(fetches)
                .await
                .map_err(fetch_error)?;
            ranges
                .iter()
                .map(|range| {
                    let at = merged.partition_point(|m| m.end < range.end);
                    let (Some(chunk), Some(whole)) = (merged.get(at), fetched.get(at)) else {
                        return Err(fetch_error(format!("range {range:?} was not fetched")));
                    };
                    let from = usize::try_from(range.start - chunk.start).unwrap_or(usize::MAX);
                    let to = usize::try_from(range.end - chunk.start).unwrap_or(usize::MAX);
                    if chunk.start > range.start || to > whole.len() {
                        return Err(fetch_error(format!(
                            "short read: {} bytes for range {chunk:?}",
                            whole.len()
                        )));
                    }
                    Ok(whole.slice(from..to))
                })
                .collect()
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        let size = self.size;
        async move {
            let metadata = ParquetMetaDataReader::new()
                .with_page_index_policy(PageIndexPolicy::Optional)
                .with_prefetch_hint(Some(FOOTER_PREFETCH))
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

/// [`read_split_cached`] of a split read by byte ranges: the footer from the node's cache (or
/// fetched once), then the bloom filters of the row groups statistics leave (cached too) and
/// only the pages the page index leaves — a one-series read of a big split fetches some KiB.
pub async fn read_split_ranges(
    key: &str,
    mut reader: RangeReader,
    matchers: &[Matcher],
    start_ms: i64,
    end_ms: i64,
    prune_row_groups: bool,
) -> Result<SplitRead, MetricsError> {
    let cached = FOOTERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(key)
        .cloned();
    let reader_metadata = match cached {
        Some(metadata) => metadata,
        None => {
            let metadata = ArrowReaderMetadata::load_async(
                &mut reader,
                ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional),
            )
            .await?;
            check_version(metadata.metadata())?;
            remember_footer(key, &metadata);
            metadata
        }
    };
    let metadata = reader_metadata.metadata().clone();
    let mut plan = match Plan::make(
        &reader_metadata,
        matchers,
        start_ms,
        end_ms,
        prune_row_groups,
    )? {
        Planned::Nothing(read) => return Ok(read),
        Planned::Read(plan) => plan,
    };
    let mut builder =
        ParquetRecordBatchStreamBuilder::new_with_metadata(reader, reader_metadata.clone());
    if plan.filters_by_bloom() {
        let mut kept = Vec::with_capacity(plan.candidates.len());
        for &i in &plan.candidates {
            let mut may_hold = true;
            for (column, value) in &plan.required {
                let filter = match cached_bloom(key, i, *column) {
                    Some(filter) => filter,
                    None => {
                        let filter = builder
                            .get_row_group_column_bloom_filter(i, *column)
                            .await?
                            .map(Arc::new);
                        remember_bloom(key, i, *column, filter.clone());
                        filter
                    }
                };
                if let Some(filter) = filter {
                    if !filter.check(value.as_bytes()) {
                        may_hold = false;
                        break;
                    }
                }
            }
            if may_hold {
                kept.push(i);
            }
        }
        plan.candidates = kept;
    }
    let Some(selection) = plan.select_pages(&metadata) else {
        return Ok(plan.read);
    };
    builder = builder.with_row_groups(plan.candidates.clone());
    if let Some(selection) = selection {
        builder = builder.with_row_selection(selection);
    }
    let mut stream = builder.build()?;
    let mut series = SeriesMap::default();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        plan.read.stats.rows_read += batch.num_rows() as u64;
        collect_batch(&batch, matchers, start_ms, end_ms, &mut series)?;
    }
    Ok(plan.finish(series))
}

/// What a read of one split decided before fetching pages.
enum Planned {
    /// Nothing of the split can match: this is the (empty) read.
    Nothing(SplitRead),
    /// Row groups to read.
    Read(Plan),
}

/// The row groups of a split left by statistics, and the values the `=` matchers require.
struct Plan {
    read: SplitRead,
    /// Row groups that may hold matching rows, in order.
    candidates: Vec<usize>,
    /// (column, value) of each `=` matcher on a column of the split.
    required: Vec<(usize, String)>,
    timestamp_column: usize,
    start_ms: i64,
    end_ms: i64,
    prune: bool,
}

impl Plan {
    /// The row groups whose statistics (time, required values) may hold matching rows.
    fn make(
        reader_metadata: &ArrowReaderMetadata,
        matchers: &[Matcher],
        start_ms: i64,
        end_ms: i64,
        prune: bool,
    ) -> Result<Planned, MetricsError> {
        let metadata = reader_metadata.metadata();
        let schema = reader_metadata.schema();
        let read = SplitRead {
            stats: ReadStats {
                row_groups: metadata.num_row_groups(),
                ..ReadStats::default()
            },
            ..SplitRead::default()
        };
        // A label without a column is missing from every series of the split (the batches'
        // filter relies on this check: it is not optional).
        if matchers
            .iter()
            .any(|m| schema.index_of(&m.name).is_err() && !m.matches_missing())
        {
            return Ok(Planned::Nothing(read));
        }
        let column_of = |name: &str| -> Option<usize> {
            metadata
                .file_metadata()
                .schema_descr()
                .columns()
                .iter()
                .position(|c| c.path().string() == name)
        };
        let timestamp_column = column_of(TIMESTAMP_COLUMN)
            .ok_or_else(|| MetricsError::InvalidSplit(format!("no `{TIMESTAMP_COLUMN}` column")))?;
        let required: Vec<(usize, String)> = matchers
            .iter()
            .filter_map(|m| Some((column_of(&m.name)?, m.required_value()?.to_string())))
            .collect();
        let mut candidates = Vec::new();
        for (i, row_group) in metadata.row_groups().iter().enumerate() {
            let overlaps_time = match row_group.column(timestamp_column).statistics() {
                Some(Statistics::Int64(stats)) => match (stats.min_opt(), stats.max_opt()) {
                    (Some(min), Some(max)) => *min <= end_ms && *max >= start_ms,
                    _ => true,
                },
                _ => true,
            };
            let within_stats = required.iter().all(|(column, value)| {
                match row_group.column(*column).statistics() {
                    Some(Statistics::ByteArray(stats)) => {
                        match (stats.min_opt(), stats.max_opt()) {
                            (Some(min), Some(max)) => {
                                min.data() <= value.as_bytes() && value.as_bytes() <= max.data()
                            }
                            _ => true,
                        }
                    }
                    _ => true,
                }
            });
            if !prune || (overlaps_time && within_stats) {
                candidates.push(i);
            }
        }
        Ok(Planned::Read(Plan {
            read,
            candidates,
            required,
            timestamp_column,
            start_ms,
            end_ms,
            prune,
        }))
    }

    /// Whether the candidates are to be checked against the bloom filters.
    fn filters_by_bloom(&self) -> bool {
        self.prune && !self.candidates.is_empty() && !self.required.is_empty()
    }

    /// Drops the candidates whose pages cannot hold matching rows and records the row groups
    /// read; `None` when nothing is left, else the rows to decode (`Some(None)`: all rows of
    /// the candidates).
    fn select_pages(&mut self, metadata: &ParquetMetaData) -> Option<Option<RowSelection>> {
        let mut selection: Option<Vec<RowSelector>> = None;
        if self.prune {
            let required: Vec<(usize, &str)> = self
                .required
                .iter()
                .map(|(column, value)| (*column, value.as_str()))
                .collect();
            let mut selectors = Vec::new();
            let mut kept_groups = Vec::with_capacity(self.candidates.len());
            for &i in &self.candidates {
                let rows = page_rows(
                    metadata,
                    i,
                    self.timestamp_column,
                    &required,
                    self.start_ms,
                    self.end_ms,
                );
                if rows.is_empty() {
                    continue;
                }
                kept_groups.push(i);
                let total = usize::try_from(metadata.row_group(i).num_rows()).unwrap_or(0);
                let mut at = 0;
                for range in rows {
                    if range.start > at {
                        selectors.push(RowSelector::skip(range.start - at));
                    }
                    selectors.push(RowSelector::select(range.end - range.start));
                    at = range.end;
                }
                if total > at {
                    selectors.push(RowSelector::skip(total - at));
                }
            }
            self.candidates = kept_groups;
            selection = Some(selectors);
        }
        self.read.stats.row_groups_read = self.candidates.len();
        if self.candidates.is_empty() {
            return None;
        }
        Some(selection.map(RowSelection::from))
    }

    /// The read, its series sorted by labels and their samples by time.
    fn finish(mut self, series: SeriesMap) -> SplitRead {
        let mut out: Vec<SeriesSamples> = series
            .list
            .into_iter()
            .map(|(labels, mut samples)| {
                samples.sort_by_key(|s| s.timestamp_ms);
                SeriesSamples { labels, samples }
            })
            .collect();
        out.sort_by(|a, b| a.labels.cmp(&b.labels));
        self.read.stats.samples = out.iter().map(|s| s.samples.len() as u64).sum();
        self.read.series = out;
        self.read
    }
}

/// The rows of row group `group` (sorted, disjoint ranges) whose pages may hold a row every
/// required value and the time window accept, by the page index; all rows without one.
fn page_rows(
    metadata: &ParquetMetaData,
    group: usize,
    timestamp_column: usize,
    required: &[(usize, &str)],
    start_ms: i64,
    end_ms: i64,
) -> Vec<Range<usize>> {
    let total = usize::try_from(metadata.row_group(group).num_rows()).unwrap_or(0);
    let all: Vec<Range<usize>> = std::iter::once(0..total).collect();
    let (Some(column_index), Some(offset_index)) =
        (metadata.column_index(), metadata.offset_index())
    else {
        return all;
    };
    let (Some(columns), Some(offsets)) = (column_index.get(group), offset_index.get(group)) else {
        return all;
    };
    // The row ranges of the pages of `column` for which `keep(page)` holds.
    let pages_of = |column: usize, keep: &dyn Fn(&ColumnIndexMetaData, usize) -> bool| {
        let (Some(index), Some(offsets)) = (columns.get(column), offsets.get(column)) else {
            return std::iter::once(0..total).collect();
        };
        let locations = offsets.page_locations();
        let mut out: Vec<Range<usize>> = Vec::new();
        for (page, location) in locations.iter().enumerate() {
            if !keep(index, page) {
                continue;
            }
            let first = usize::try_from(location.first_row_index).unwrap_or(0);
            let end = locations
                .get(page + 1)
                .and_then(|next| usize::try_from(next.first_row_index).ok())
                .unwrap_or(total);
            match out.last_mut() {
                Some(last) if last.end == first => last.end = end,
                _ => out.push(first..end),
            }
        }
        out
    };
    let mut rows = pages_of(timestamp_column, &|index, page| match index {
        ColumnIndexMetaData::INT64(index) => match (index.min_value(page), index.max_value(page)) {
            (Some(min), Some(max)) => *min <= end_ms && *max >= start_ms,
            _ => true,
        },
        _ => true,
    });
    for (column, value) in required {
        let value = value.as_bytes();
        let pages = pages_of(*column, &|index, page| match index {
            ColumnIndexMetaData::BYTE_ARRAY(index) => {
                match (index.min_value(page), index.max_value(page)) {
                    (Some(min), Some(max)) => min <= value && value <= max,
                    _ => true,
                }
            }
            _ => true,
        });
        rows = intersect(&rows, &pages);
        if rows.is_empty() {
            break;
        }
    }
    rows
}

/// The intersection of two sorted lists of disjoint ranges.
fn intersect(a: &[Range<usize>], b: &[Range<usize>]) -> Vec<Range<usize>> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() && j < b.len() {
        let start = a[i].start.max(b[j].start);
        let end = a[i].end.min(b[j].end);
        if start < end {
            out.push(start..end);
        }
        if a[i].end < b[j].end {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

pub(crate) fn check_version(metadata: &ParquetMetaData) -> Result<(), MetricsError> {
    let version = metadata
        .file_metadata()
        .key_value_metadata()
        .and_then(|kvs| kvs.iter().find(|kv| kv.key == VERSION_KEY))
        .and_then(|kv| kv.value.as_deref());
    match version {
        Some(FORMAT_VERSION) => Ok(()),
        Some(other) => Err(MetricsError::InvalidSplit(format!(
            "format version {other}, this build reads version {FORMAT_VERSION}"
        ))),
        None => Err(MetricsError::InvalidSplit(
            "no format version: not a metrics split".to_string(),
        )),
    }
}

/// The series found so far, in order of discovery.
#[derive(Default)]
struct SeriesMap {
    index: HashMap<Labels, usize>,
    list: Vec<(Labels, Vec<Sample>)>,
}

impl SeriesMap {
    fn index_of(&mut self, labels: Labels) -> usize {
        if let Some(index) = self.index.get(&labels) {
            return *index;
        }
        self.list.push((labels.clone(), Vec::new()));
        self.index.insert(labels, self.list.len() - 1);
        self.list.len() - 1
    }
}

/// A label column of a batch: its name, dictionary keys and values.
struct LabelColumn<'a> {
    name: &'a str,
    column: &'a DictionaryArray<Int32Type>,
    values: Vec<&'a str>,
}

fn collect_batch(
    batch: &RecordBatch,
    matchers: &[Matcher],
    start_ms: i64,
    end_ms: i64,
    series: &mut SeriesMap,
) -> Result<(), MetricsError> {
    let schema = batch.schema();
    let mut labels: Vec<LabelColumn> = Vec::new();
    let mut timestamps = None;
    let mut values = None;
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        match field.name().as_str() {
            TIMESTAMP_COLUMN => timestamps = column.as_primitive_opt::<Int64Type>(),
            VALUE_COLUMN => values = column.as_primitive_opt::<Float64Type>(),
            name if name == METRIC_NAME_LABEL || !name.starts_with("__") => {
                let Some(column) = column.as_dictionary_opt::<Int32Type>() else {
                    return Err(MetricsError::InvalidSplit(format!(
                        "label column `{name}` is not dictionary-encoded text"
                    )));
                };
                let Some(strings) = column.values().as_string_opt::<i32>() else {
                    return Err(MetricsError::InvalidSplit(format!(
                        "label column `{name}` does not hold text"
                    )));
                };
                labels.push(LabelColumn {
                    name,
                    column,
                    values: (0..strings.len()).map(|i| strings.value(i)).collect(),
                });
            }
            _ => {}
        }
    }
    let (Some(timestamps), Some(values)) = (timestamps, values) else {
        return Err(MetricsError::InvalidSplit(
            "no timestamp or value column".to_string(),
        ));
    };

    // Each matcher decided once per dictionary value, then per row by key.
    let mut row_ok = vec![true; batch.num_rows()];
    for (row, ok) in row_ok.iter_mut().enumerate() {
        let ts = timestamps.value(row);
        *ok = ts >= start_ms && ts <= end_ms;
    }
    for matcher in matchers {
        let Some(column) = labels.iter().find(|c| c.name == matcher.name) else {
            // No column in this batch: the label is missing everywhere (checked per split).
            continue;
        };
        let per_value: Vec<bool> = column
            .values
            .iter()
            .map(|v| matcher.matches_value(v))
            .collect();
        let missing = matcher.matches_missing();
        let keys = column.column.keys();
        for (row, ok) in row_ok.iter_mut().enumerate() {
            if *ok {
                *ok = if keys.is_null(row) {
                    missing
                } else {
                    usize::try_from(keys.value(row))
                        .ok()
                        .and_then(|key| per_value.get(key))
                        .copied()
                        .unwrap_or(false)
                };
            }
        }
    }

    // Rows of one series are adjacent: look the labels up only when a key changes (compared
    // in place, no allocation per row).
    let key_of = |c: &LabelColumn, row: usize| {
        let keys = c.column.keys();
        (!keys.is_null(row)).then(|| keys.value(row))
    };
    let mut previous: Option<(usize, usize)> = None; // (row, series index)
    for (row, ok) in row_ok.iter().enumerate() {
        if !ok {
            continue;
        }
        let index = match previous {
            Some((prev_row, index))
                if labels.iter().all(|c| key_of(c, prev_row) == key_of(c, row)) =>
            {
                index
            }
            _ => {
                let built = Labels::new(labels.iter().filter_map(|c| {
                    let value = c.values.get(usize::try_from(key_of(c, row)?).ok()?)?;
                    Some((c.name.to_string(), value.to_string()))
                }));
                series.index_of(built)
            }
        };
        previous = Some((row, index));
        series.list[index].1.push(Sample {
            timestamp_ms: timestamps.value(row),
            value: values.value(row),
        });
    }
    Ok(())
}

/// The label names of a metrics split (its columns but `__name__` and the other `__…__`
/// ones), from its footer alone: the bytes of its `footer_offsets` range (the Parquet
/// metadata, its length and `PAR1`).
pub fn label_names_from_footer(footer: &[u8]) -> Result<Vec<String>, MetricsError> {
    let Some(metadata_len) = footer.len().checked_sub(8) else {
        return Err(MetricsError::InvalidSplit(format!(
            "a footer of {} bytes is too short",
            footer.len()
        )));
    };
    let metadata =
        parquet::file::metadata::ParquetMetaDataReader::decode_metadata(&footer[..metadata_len])?;
    check_version(&metadata)?;
    Ok(metadata
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .map(|column| column.path().string())
        .filter(|name| !name.starts_with("__"))
        .collect())
}
