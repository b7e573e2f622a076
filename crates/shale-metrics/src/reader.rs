//! Reads the series of a metrics split that a selector matches within a time range. With
//! the split's series index (see [`crate::SeriesIndex`]), the matchers are decided on the
//! index alone, the time window cuts the matching series' rows page by page, and only the
//! timestamps and values of those rows are decoded. Without one (splits written before it),
//! row groups are ruled out by the statistics of `__timestamp__` and of every label an `=`
//! matcher requires and by the bloom filters of `__name__` and the sort labels, then pages by
//! the page index of the same columns, and the label columns of the rows left are decoded to
//! decide the matchers. A matcher on a label the split has no column for is decided for the
//! whole split. Footers (with the parsed series index) are cached by split id. A split is
//! read from its bytes in memory, or by byte ranges ([`read_split_ranges`]: only the footer
//! once, then the pages a read needs; from its second read on, an indexed split's row groups
//! are decoded whole into [`crate::column_cache`] and answered from there).

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
use parquet::arrow::ProjectionMask;
use parquet::bloom_filter::Sbbf;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::statistics::Statistics;

use crate::column_cache::{self, Columns};
use crate::series_index::{SeriesIndex, SERIES_INDEX_KEY};
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

/// A split's parsed footer (page index included) and its series index, if it has one.
#[derive(Clone)]
struct Footer {
    metadata: ArrowReaderMetadata,
    index: Option<Arc<SeriesIndex>>,
    /// Heap bytes both hold (what the cache accounts).
    bytes: usize,
}

impl Footer {
    fn new(metadata: ArrowReaderMetadata) -> Result<Footer, MetricsError> {
        check_version(metadata.metadata())?;
        // A damaged index is not fatal: the page index answers the same, slower.
        let index = metadata
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .and_then(|kvs| kvs.iter().find(|kv| kv.key == SERIES_INDEX_KEY))
            .and_then(|kv| kv.value.as_deref())
            .and_then(|text| SeriesIndex::decode(text).ok())
            .map(Arc::new);
        let bytes = metadata.metadata().memory_size()
            + index.as_ref().map_or(0, |index| index.heap_bytes());
        Ok(Footer {
            metadata,
            index,
            bytes,
        })
    }
}

/// Footers of the splits read before, by split id: a split never changes, so a query
/// parses each footer (and series index) once per node. Bounded by bytes; the oldest go
/// first.
static FOOTERS: LazyLock<Mutex<FooterCache>> = LazyLock::new(|| Mutex::new(FooterCache::default()));

/// Most bytes of footers kept (a footer with its page index and series index is some tens
/// to some hundreds of KiB).
const MAX_FOOTER_BYTES: usize = 256 << 20;

#[derive(Default)]
struct FooterCache {
    footers: HashMap<String, Footer>,
    /// Keys in insertion order (evicted from the front).
    order: std::collections::VecDeque<String>,
    bytes: usize,
}

impl FooterCache {
    fn get(&self, key: &str) -> Option<Footer> {
        self.footers.get(key).cloned()
    }

    fn insert(&mut self, key: &str, footer: &Footer) {
        if self.footers.contains_key(key) || footer.bytes > MAX_FOOTER_BYTES {
            return;
        }
        while self.bytes + footer.bytes > MAX_FOOTER_BYTES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(evicted) = self.footers.remove(&oldest) {
                self.bytes -= evicted.bytes;
            }
        }
        self.bytes += footer.bytes;
        self.order.push_back(key.to_string());
        self.footers.insert(key.to_string(), footer.clone());
    }
}

/// The footer of the split `bytes`, from the cache when `key` names a split read before.
fn load_footer(key: Option<&str>, bytes: &Bytes) -> Result<Footer, MetricsError> {
    if let Some(footer) = key.and_then(cached_footer) {
        return Ok(footer);
    }
    let footer = Footer::new(ArrowReaderMetadata::load(
        bytes,
        ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional),
    )?)?;
    if let Some(key) = key {
        remember_footer(key, &footer);
    }
    Ok(footer)
}

fn cached_footer(key: &str) -> Option<Footer> {
    FOOTERS.lock().unwrap_or_else(|p| p.into_inner()).get(key)
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

/// Caches the footer of the split `key`.
fn remember_footer(key: &str, footer: &Footer) {
    FOOTERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, footer);
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
    let footer = load_footer(key, &bytes)?;
    if let (true, Some(index)) = (prune_row_groups, &footer.index) {
        let Some(plan) = IndexedPlan::make(&footer.metadata, index, matchers, start_ms, end_ms)?
        else {
            return Ok(IndexedPlan::nothing(&footer.metadata));
        };
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(bytes, footer.metadata)
            .with_projection(plan.projection.clone())
            .with_row_groups(plan.row_groups.clone())
            .with_row_selection(plan.selection.clone())
            .build()?;
        let mut collector = plan.collector(index);
        for batch in reader {
            collector.add(&batch?)?;
        }
        return Ok(collector.finish());
    }
    let reader_metadata = footer.metadata;
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
    let footer = match cached_footer(key) {
        Some(footer) => footer,
        None => {
            let footer = Footer::new(
                ArrowReaderMetadata::load_async(
                    &mut reader,
                    ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional),
                )
                .await?,
            )?;
            remember_footer(key, &footer);
            footer
        }
    };
    if let (true, Some(index)) = (prune_row_groups, &footer.index) {
        let Some(plan) = IndexedPlan::make(&footer.metadata, index, matchers, start_ms, end_ms)?
        else {
            return Ok(IndexedPlan::nothing(&footer.metadata));
        };
        // Hot row groups are answered from their decoded columns; a split read again is
        // decoded whole to be.
        if let Some(columns) = column_cache::get_all(key, &plan.row_groups) {
            return plan.read_columns(index, &columns);
        }
        if column_cache::admit(key) {
            let columns = decode_row_groups(
                key,
                reader,
                &footer.metadata,
                &plan.projection,
                &plan.row_groups,
            )
            .await?;
            return plan.read_columns(index, &columns);
        }
        let mut stream =
            ParquetRecordBatchStreamBuilder::new_with_metadata(reader, footer.metadata)
                .with_projection(plan.projection.clone())
                .with_row_groups(plan.row_groups.clone())
                .with_row_selection(plan.selection.clone())
                .build()?;
        let mut collector = plan.collector(index);
        while let Some(batch) = stream.next().await {
            collector.add(&batch?)?;
        }
        return Ok(collector.finish());
    }
    let reader_metadata = footer.metadata;
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

/// Decodes the timestamps and values (`projection`) of `row_groups` of split `key` whole,
/// keeps them in the column cache and returns them in that order.
async fn decode_row_groups(
    key: &str,
    reader: RangeReader,
    metadata: &ArrowReaderMetadata,
    projection: &ProjectionMask,
    row_groups: &[usize],
) -> Result<Vec<Arc<Columns>>, MetricsError> {
    let mut stream = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, metadata.clone())
        .with_projection(projection.clone())
        .with_row_groups(row_groups.to_vec())
        .build()?;
    let group_rows: Vec<usize> = row_groups
        .iter()
        .map(|&g| usize::try_from(metadata.metadata().row_group(g).num_rows()).unwrap_or(0))
        .collect();
    let mut done = Vec::with_capacity(row_groups.len());
    let mut current = Columns::default();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let (timestamps, values) = timestamps_and_values(&batch)?;
        let mut row = 0;
        while row < timestamps.len() {
            let want = group_rows.get(done.len()).copied().unwrap_or(0);
            let take = (want - current.timestamps.len()).min(timestamps.len() - row);
            if take == 0 {
                return Err(MetricsError::InvalidSplit(
                    "more rows than its row groups say".to_string(),
                ));
            }
            current
                .timestamps
                .extend_from_slice(&timestamps[row..row + take]);
            current.values.extend_from_slice(&values[row..row + take]);
            row += take;
            if current.timestamps.len() == want {
                let group = row_groups[done.len()];
                done.push(column_cache::insert(
                    key,
                    group,
                    std::mem::take(&mut current),
                ));
            }
        }
    }
    // Row groups without rows, or a stream that ended early.
    while done.len() < row_groups.len() {
        if group_rows[done.len()] != current.timestamps.len() {
            return Err(MetricsError::InvalidSplit(
                "fewer rows than its row groups say".to_string(),
            ));
        }
        let group = row_groups[done.len()];
        done.push(column_cache::insert(
            key,
            group,
            std::mem::take(&mut current),
        ));
    }
    Ok(done)
}

/// The timestamp and value columns of a decoded batch.
fn timestamps_and_values(batch: &RecordBatch) -> Result<(&[i64], &[f64]), MetricsError> {
    let column = |name: &str| batch.column_by_name(name);
    match (
        column(TIMESTAMP_COLUMN).and_then(|c| c.as_primitive_opt::<Int64Type>()),
        column(VALUE_COLUMN).and_then(|c| c.as_primitive_opt::<Float64Type>()),
    ) {
        (Some(timestamps), Some(values)) => Ok((timestamps.values(), values.values())),
        _ => Err(MetricsError::InvalidSplit(
            "no timestamp or value column".to_string(),
        )),
    }
}

/// A read planned on a split's series index: the matching series' rows, cut by the time
/// window page by page, and only the timestamp and value columns decoded.
struct IndexedPlan {
    /// Row groups holding selected rows, in order.
    row_groups: Vec<usize>,
    /// The selected rows of those row groups.
    selection: RowSelection,
    /// Timestamps and values.
    projection: ProjectionMask,
    /// (series, selected rows), in row order: how the decoded rows split into series.
    runs: Vec<(usize, usize)>,
    /// (series, row group, rows within it), in row order: where each run's rows are.
    cuts: Vec<(usize, usize, Range<usize>)>,
    row_groups_total: usize,
    start_ms: i64,
    end_ms: i64,
}

impl IndexedPlan {
    /// The empty read of a split in which nothing matches.
    fn nothing(metadata: &ArrowReaderMetadata) -> SplitRead {
        SplitRead {
            stats: ReadStats {
                row_groups: metadata.metadata().num_row_groups(),
                ..ReadStats::default()
            },
            ..SplitRead::default()
        }
    }

    /// The plan, `None` when no row of the split can match.
    fn make(
        reader_metadata: &ArrowReaderMetadata,
        index: &SeriesIndex,
        matchers: &[Matcher],
        start_ms: i64,
        end_ms: i64,
    ) -> Result<Option<IndexedPlan>, MetricsError> {
        let metadata = reader_metadata.metadata();
        let descr = metadata.file_metadata().schema_descr();
        let column_of = |name: &str| {
            leaf_column(metadata, name)
                .ok_or_else(|| MetricsError::InvalidSplit(format!("no `{name}` column")))
        };
        let timestamp_column = column_of(TIMESTAMP_COLUMN)?;
        let value_column = column_of(VALUE_COLUMN)?;
        let series = index.matching(matchers);
        if series.is_empty() {
            return Ok(None);
        }
        // The rows the time window may need, over the whole file: row groups by their
        // statistics, then pages by the page index.
        let mut allowed: Vec<Range<usize>> = Vec::new();
        let mut group_starts = Vec::with_capacity(metadata.num_row_groups() + 1);
        let mut offset = 0usize;
        for (g, row_group) in metadata.row_groups().iter().enumerate() {
            group_starts.push(offset);
            let rows = usize::try_from(row_group.num_rows()).unwrap_or(0);
            let overlaps = may_hold_time(row_group, timestamp_column, start_ms, end_ms);
            if overlaps {
                for range in page_rows(metadata, g, timestamp_column, &[], start_ms, end_ms) {
                    let range = offset + range.start..offset + range.end;
                    match allowed.last_mut() {
                        Some(last) if last.end == range.start => last.end = range.end,
                        _ => allowed.push(range),
                    }
                }
            }
            offset += rows;
        }
        group_starts.push(offset);
        // Each matching series' rows within the allowed ones, cut at row group bounds.
        let mut cuts: Vec<(usize, Range<usize>)> = Vec::new();
        let mut a = 0;
        for s in series {
            let rows = index.rows(s);
            let rows = usize::try_from(rows.start).unwrap_or(usize::MAX)
                ..usize::try_from(rows.end).unwrap_or(usize::MAX).min(offset);
            while a < allowed.len() && allowed[a].end <= rows.start {
                a += 1;
            }
            let mut b = a;
            while b < allowed.len() && allowed[b].start < rows.end {
                let start = allowed[b].start.max(rows.start);
                let end = allowed[b].end.min(rows.end);
                let mut at = start;
                while at < end {
                    let group = group_starts.partition_point(|&g| g <= at) - 1;
                    let group_end = group_starts[group + 1].min(end);
                    cuts.push((s, at..group_end));
                    at = group_end;
                }
                b += 1;
            }
        }
        if cuts.is_empty() {
            return Ok(None);
        }
        let mut row_groups: Vec<usize> = Vec::new();
        let mut selectors: Vec<RowSelector> = Vec::new();
        let mut runs: Vec<(usize, usize)> = Vec::with_capacity(cuts.len());
        let mut group_cuts = Vec::with_capacity(cuts.len());
        // Position within the concatenation of the chosen row groups.
        let mut at = 0usize;
        for (s, range) in cuts {
            let group = group_starts.partition_point(|&g| g <= range.start) - 1;
            let first = group_starts[group];
            group_cuts.push((s, group, range.start - first..range.end - first));
            if row_groups.last() != Some(&group) {
                if let Some(&previous) = row_groups.last() {
                    // Skip the rest of the previous group.
                    let end = group_starts[previous + 1];
                    if end > at {
                        selectors.push(RowSelector::skip(end - at));
                    }
                }
                row_groups.push(group);
                at = group_starts[group];
            }
            if range.start > at {
                selectors.push(RowSelector::skip(range.start - at));
            }
            selectors.push(RowSelector::select(range.end - range.start));
            at = range.end;
            match runs.last_mut() {
                Some((last, count)) if *last == s => *count += range.end - range.start,
                _ => runs.push((s, range.end - range.start)),
            }
        }
        if let Some(&last) = row_groups.last() {
            let end = group_starts[last + 1];
            if end > at {
                selectors.push(RowSelector::skip(end - at));
            }
        }
        Ok(Some(IndexedPlan {
            row_groups,
            selection: RowSelection::from(selectors),
            projection: ProjectionMask::leaves(descr, [timestamp_column, value_column]),
            runs,
            cuts: group_cuts,
            row_groups_total: metadata.num_row_groups(),
            start_ms,
            end_ms,
        }))
    }

    /// The read answered from the decoded columns of the plan's row groups (in its order).
    fn read_columns(
        self,
        index: &SeriesIndex,
        columns: &[Arc<Columns>],
    ) -> Result<SplitRead, MetricsError> {
        let mismatch =
            || MetricsError::InvalidSplit("the series index does not match the rows".into());
        let mut collector = self.collector(index);
        let plan = &collector.plan;
        let mut series: Vec<(usize, Vec<Sample>)> = Vec::new();
        let mut rows_read = 0u64;
        for (s, group, rows) in &plan.cuts {
            let at = plan
                .row_groups
                .iter()
                .position(|g| g == group)
                .ok_or_else(mismatch)?;
            let columns = &columns[at];
            let (Some(timestamps), Some(values)) = (
                columns.timestamps.get(rows.clone()),
                columns.values.get(rows.clone()),
            ) else {
                return Err(mismatch());
            };
            rows_read += rows.len() as u64;
            if series.last().map(|(last, _)| last) != Some(s) {
                series.push((*s, Vec::new()));
            }
            if let Some((_, samples)) = series.last_mut() {
                samples.extend(
                    timestamps
                        .iter()
                        .zip(values)
                        .filter(|(&t, _)| t >= plan.start_ms && t <= plan.end_ms)
                        .map(|(&timestamp_ms, &value)| Sample {
                            timestamp_ms,
                            value,
                        }),
                );
            }
        }
        collector.series = series;
        collector.stats.rows_read = rows_read;
        Ok(collector.finish())
    }

    /// Splits the decoded rows into the plan's series.
    fn collector(self, index: &SeriesIndex) -> IndexedCollector<'_> {
        IndexedCollector {
            index,
            run: 0,
            left: self.runs.first().map_or(0, |&(_, count)| count),
            series: Vec::new(),
            stats: ReadStats {
                row_groups: self.row_groups_total,
                row_groups_read: self.row_groups.len(),
                ..ReadStats::default()
            },
            plan: self,
        }
    }
}

/// The samples of an indexed read, series by series, as batches come.
struct IndexedCollector<'a> {
    index: &'a SeriesIndex,
    plan: IndexedPlan,
    /// The run the next row belongs to, and its rows not yet seen.
    run: usize,
    left: usize,
    /// (series, samples), in row order.
    series: Vec<(usize, Vec<Sample>)>,
    stats: ReadStats,
}

impl IndexedCollector<'_> {
    fn add(&mut self, batch: &RecordBatch) -> Result<(), MetricsError> {
        let (timestamps, values) = timestamps_and_values(batch)?;
        self.stats.rows_read += batch.num_rows() as u64;
        let mut row = 0;
        while row < batch.num_rows() {
            while self.left == 0 {
                self.run += 1;
                match self.plan.runs.get(self.run) {
                    Some(&(_, count)) => self.left = count,
                    None => {
                        return Err(MetricsError::InvalidSplit(
                            "the series index does not match the rows".to_string(),
                        ))
                    }
                }
            }
            let s = self.plan.runs[self.run].0;
            if self.series.last().map(|(last, _)| *last) != Some(s) {
                self.series.push((s, Vec::new()));
            }
            let take = self.left.min(batch.num_rows() - row);
            if let Some((_, samples)) = self.series.last_mut() {
                for (&timestamp_ms, &value) in timestamps[row..row + take]
                    .iter()
                    .zip(&values[row..row + take])
                {
                    if timestamp_ms >= self.plan.start_ms && timestamp_ms <= self.plan.end_ms {
                        samples.push(Sample {
                            timestamp_ms,
                            value,
                        });
                    }
                }
            }
            self.left -= take;
            row += take;
        }
        Ok(())
    }

    /// The read: series with samples in the window, sorted by labels.
    fn finish(self) -> SplitRead {
        let index = self.index;
        let mut series: Vec<SeriesSamples> = self
            .series
            .into_iter()
            .filter(|(_, samples)| !samples.is_empty())
            .map(|(s, samples)| SeriesSamples {
                labels: index.labels(s),
                samples,
            })
            .collect();
        series.sort_by(|a, b| a.labels.cmp(&b.labels));
        let mut stats = self.stats;
        stats.samples = series.iter().map(|s| s.samples.len() as u64).sum();
        SplitRead { series, stats }
    }
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
        let column_of = |name: &str| leaf_column(metadata, name);
        let timestamp_column = column_of(TIMESTAMP_COLUMN)
            .ok_or_else(|| MetricsError::InvalidSplit(format!("no `{TIMESTAMP_COLUMN}` column")))?;
        let required: Vec<(usize, String)> = matchers
            .iter()
            .filter_map(|m| Some((column_of(&m.name)?, m.required_value()?.to_string())))
            .collect();
        let mut candidates = Vec::new();
        for (i, row_group) in metadata.row_groups().iter().enumerate() {
            let overlaps_time = may_hold_time(row_group, timestamp_column, start_ms, end_ms);
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

/// The leaf column named `name` of a split.
fn leaf_column(metadata: &ParquetMetaData, name: &str) -> Option<usize> {
    metadata
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .position(|c| c.path().string() == name)
}

/// Whether a row group may hold a timestamp in `[start_ms, end_ms]`, by its statistics.
fn may_hold_time(
    row_group: &parquet::file::metadata::RowGroupMetaData,
    timestamp_column: usize,
    start_ms: i64,
    end_ms: i64,
) -> bool {
    match row_group.column(timestamp_column).statistics() {
        Some(Statistics::Int64(stats)) => match (stats.min_opt(), stats.max_opt()) {
            (Some(min), Some(max)) => *min <= end_ms && *max >= start_ms,
            _ => true,
        },
        _ => true,
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
