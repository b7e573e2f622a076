//! A metrics index as a DataFusion table, and the schema of all of them.
//!
//! Columns: `__name__`, one text column per label any published split holds (read from the
//! splits' footers; a label named `timestamp` or `value` is `label_timestamp` /
//! `label_value`), `timestamp` (milliseconds, UTC) and `value`. A scan turns the query's
//! filters into what PromQL prunes with — `=` on `__name__` and labels become matchers,
//! comparisons on `timestamp` the time window — reads the splits left (each split's samples
//! of the matching series, row groups pruned), applies the index's delete tasks, keeps the
//! later split's sample of two with one series and timestamp, and hands the rows to
//! DataFusion, which applies every filter again (the pushdown is inexact).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, Float64Builder, StringBuilder, TimestampMillisecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{SchemaProvider, Session, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use serde_json::{json, Value};
use shale_metastore::{IndexMetadata, ListSplitsQuery, Metastore};
use shale_metrics::{Labels, Matcher, Sample, SeriesDelete, METRIC_NAME_LABEL};
use shale_storage::StorageRef;
use shale_types::{SplitFormat, SplitMetadata, SplitState};

use crate::{SqlLimits, StorageFor};

/// The time column.
const TIMESTAMP: &str = "timestamp";
/// The value column.
const VALUE: &str = "value";
/// Rows per record batch handed to DataFusion.
const BATCH_ROWS: usize = 8192;

/// What a query's scans did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Splits listed by time range.
    pub splits_listed: u64,
    /// Of those, skipped by metric-name tags or sort-key range.
    pub splits_pruned: u64,
    /// Splits read.
    pub splits_opened: u64,
    /// Row groups of the splits read.
    pub row_groups: u64,
    /// Of those, decoded.
    pub row_groups_read: u64,
    /// Samples handed to DataFusion.
    pub samples: u64,
    /// Documents of log indexes handed to DataFusion.
    pub documents: u64,
}

impl ScanStats {
    /// As JSON, for answers.
    pub fn to_json(&self) -> Value {
        json!({
            "splits_listed": self.splits_listed,
            "splits_pruned": self.splits_pruned,
            "splits_opened": self.splits_opened,
            "row_groups": self.row_groups,
            "row_groups_read": self.row_groups_read,
            "samples": self.samples,
            "documents": self.documents,
        })
    }
}

/// The indexes, as the tables of the `public` schema.
pub(crate) struct IndexSchema {
    indexes: HashMap<String, IndexMetadata>,
    metastore: Arc<dyn Metastore>,
    storage_for: StorageFor,
    documents: Option<Arc<dyn crate::DocumentSource>>,
    limits: SqlLimits,
    stats: Arc<Mutex<ScanStats>>,
}

impl std::fmt::Debug for IndexSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexSchema")
            .field("indexes", &self.indexes.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl IndexSchema {
    pub(crate) fn new(
        indexes: Vec<IndexMetadata>,
        metastore: Arc<dyn Metastore>,
        storage_for: StorageFor,
        documents: Option<Arc<dyn crate::DocumentSource>>,
        limits: SqlLimits,
        stats: Arc<Mutex<ScanStats>>,
    ) -> Self {
        IndexSchema {
            documents,
            indexes: indexes
                .into_iter()
                .map(|index| (index.index_id().to_string(), index))
                .collect(),
            metastore,
            storage_for,
            limits,
            stats,
        }
    }
}

#[async_trait]
impl SchemaProvider for IndexSchema {
    fn table_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.indexes.keys().cloned().collect();
        names.sort();
        names
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let Some(index) = self.indexes.get(name) else {
            return Ok(None);
        };
        if index.index_config.metrics.is_none() {
            return Ok(self.documents.as_ref().map(|source| {
                Arc::new(crate::LogsTable::new(
                    index.clone(),
                    source.clone(),
                    self.limits,
                    self.stats.clone(),
                )) as Arc<dyn TableProvider>
            }));
        }
        let storage = (self.storage_for)(index).map_err(DataFusionError::Execution)?;
        let table = MetricsTable::open(
            index.clone(),
            self.metastore.clone(),
            storage,
            self.limits,
            self.stats.clone(),
        )
        .await?;
        Ok(Some(Arc::new(table)))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.indexes.contains_key(name)
    }
}

/// One metrics index as a table of samples.
pub struct MetricsTable {
    index: IndexMetadata,
    metastore: Arc<dyn Metastore>,
    storage: StorageRef,
    schema: SchemaRef,
    /// The label behind each label column, in column order (after `__name__`).
    labels: Vec<String>,
    limits: SqlLimits,
    stats: Arc<Mutex<ScanStats>>,
}

impl std::fmt::Debug for MetricsTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsTable")
            .field("index", &self.index.index_id())
            .field("labels", &self.labels)
            .finish()
    }
}

fn external(err: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(err.to_string())
}

impl MetricsTable {
    /// The table of `index`: its columns from the footers of its published splits.
    pub async fn open(
        index: IndexMetadata,
        metastore: Arc<dyn Metastore>,
        storage: StorageRef,
        limits: SqlLimits,
        stats: Arc<Mutex<ScanStats>>,
    ) -> Result<MetricsTable> {
        let splits = published(&metastore, &index, None).await?;
        let mut labels: BTreeSet<String> = BTreeSet::new();
        for split in &splits {
            let (start, end) = split.footer_offsets;
            let footer = if end > start {
                storage
                    .get_range(&split.object_key(), start..end)
                    .await
                    .map_err(external)?
            } else {
                let bytes = storage
                    .get_bytes(&split.object_key())
                    .await
                    .map_err(external)?;
                let (start, _) = shale_metrics::footer_offsets(&bytes);
                bytes.slice(start as usize..)
            };
            labels.extend(shale_metrics::label_names_from_footer(&footer).map_err(external)?);
        }
        let labels: Vec<String> = labels.into_iter().collect();
        let mut fields = vec![Field::new(METRIC_NAME_LABEL, DataType::Utf8, false)];
        for label in &labels {
            let column = if label == TIMESTAMP || label == VALUE {
                format!("label_{label}")
            } else {
                label.clone()
            };
            fields.push(Field::new(column, DataType::Utf8, true));
        }
        fields.push(Field::new(
            TIMESTAMP,
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            false,
        ));
        fields.push(Field::new(VALUE, DataType::Float64, false));
        Ok(MetricsTable {
            index,
            metastore,
            storage,
            schema: Arc::new(Schema::new(fields)),
            labels,
            limits,
            stats,
        })
    }

    /// The label of a column name, if it is a label column (or `__name__`).
    fn label_of(&self, column: &str) -> Option<String> {
        if column == METRIC_NAME_LABEL {
            return Some(column.to_string());
        }
        self.labels
            .iter()
            .find(|label| {
                *label == column
                    || (format!("label_{label}") == column
                        && (*label == TIMESTAMP || *label == VALUE))
            })
            .cloned()
    }
}

/// The published Parquet splits of `index` overlapping `window_ms` (inclusive), oldest first.
async fn published(
    metastore: &Arc<dyn Metastore>,
    index: &IndexMetadata,
    window_ms: Option<(i64, i64)>,
) -> Result<Vec<SplitMetadata>> {
    let mut query =
        ListSplitsQuery::for_index(index.index_uid.clone()).with_states(&[SplitState::Published]);
    if let Some((start, end)) = window_ms {
        query.time_range_start = Some(start.div_euclid(1000));
        query.time_range_end = Some(end.div_euclid(1000).saturating_add(1));
    }
    let mut splits: Vec<SplitMetadata> = metastore
        .list_splits(query)
        .await
        .map_err(external)?
        .into_iter()
        .map(|split| split.split_metadata)
        .filter(|split| split.format == SplitFormat::Parquet)
        .collect();
    splits.sort_by(|a, b| a.split_id.cmp(&b.split_id));
    Ok(splits)
}

/// A literal timestamp or integer (milliseconds) as milliseconds.
fn literal_ms(value: &ScalarValue) -> Option<i64> {
    match value {
        ScalarValue::TimestampSecond(Some(v), _) => v.checked_mul(1000),
        ScalarValue::TimestampMillisecond(Some(v), _) => Some(*v),
        ScalarValue::TimestampMicrosecond(Some(v), _) => Some(v.div_euclid(1000)),
        ScalarValue::TimestampNanosecond(Some(v), _) => Some(v.div_euclid(1_000_000)),
        ScalarValue::Int64(Some(v)) => Some(*v),
        _ => None,
    }
}

fn literal_text(value: &ScalarValue) -> Option<&str> {
    match value {
        ScalarValue::Utf8(Some(v))
        | ScalarValue::LargeUtf8(Some(v))
        | ScalarValue::Utf8View(Some(v)) => Some(v.as_str()),
        _ => None,
    }
}

/// What the filters let a scan prune with: `=` matchers and the time window.
struct Pruning {
    matchers: Vec<Matcher>,
    start_ms: i64,
    end_ms: i64,
}

impl MetricsTable {
    fn pruning(&self, filters: &[Expr]) -> Pruning {
        let mut pruning = Pruning {
            matchers: Vec::new(),
            start_ms: i64::MIN / 4,
            end_ms: i64::MAX / 4,
        };
        for filter in filters {
            match filter {
                Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                    let (column, op, literal) = match (left.as_ref(), right.as_ref()) {
                        (Expr::Column(c), Expr::Literal(v, _)) => (c, *op, v),
                        (Expr::Literal(v, _), Expr::Column(c)) => match op.swap() {
                            Some(swapped) => (c, swapped, v),
                            None => continue,
                        },
                        _ => continue,
                    };
                    if column.name == TIMESTAMP {
                        let Some(ms) = literal_ms(literal) else {
                            continue;
                        };
                        match op {
                            Operator::Eq => {
                                pruning.start_ms = pruning.start_ms.max(ms);
                                pruning.end_ms = pruning.end_ms.min(ms);
                            }
                            Operator::Gt => pruning.start_ms = pruning.start_ms.max(ms + 1),
                            Operator::GtEq => pruning.start_ms = pruning.start_ms.max(ms),
                            Operator::Lt => pruning.end_ms = pruning.end_ms.min(ms - 1),
                            Operator::LtEq => pruning.end_ms = pruning.end_ms.min(ms),
                            _ => {}
                        }
                    } else if op == Operator::Eq {
                        if let (Some(label), Some(text)) =
                            (self.label_of(&column.name), literal_text(literal))
                        {
                            pruning.matchers.push(Matcher::equal(&label, text));
                        }
                    }
                }
                Expr::Between(between) if !between.negated => {
                    if let (Expr::Column(c), Expr::Literal(low, _), Expr::Literal(high, _)) = (
                        between.expr.as_ref(),
                        between.low.as_ref(),
                        between.high.as_ref(),
                    ) {
                        if c.name == TIMESTAMP {
                            if let (Some(low), Some(high)) = (literal_ms(low), literal_ms(high)) {
                                pruning.start_ms = pruning.start_ms.max(low);
                                pruning.end_ms = pruning.end_ms.min(high);
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        pruning
    }

    /// The samples the scan reads: per series, merged across splits (the later split wins a
    /// shared timestamp) with the delete tasks applied.
    async fn read(&self, pruning: &Pruning) -> Result<Vec<(Labels, Vec<Sample>)>> {
        let mut stats = ScanStats::default();
        if pruning.start_ms > pruning.end_ms {
            return Ok(Vec::new());
        }
        let window = Some((pruning.start_ms, pruning.end_ms));
        let mut splits = published(&self.metastore, &self.index, window).await?;
        stats.splits_listed = splits.len() as u64;
        splits.retain(|split| shale_metrics::split_may_hold(split, &pruning.matchers));
        stats.splits_pruned = stats.splits_listed - splits.len() as u64;
        let deletes: Vec<SeriesDelete> = self
            .metastore
            .list_delete_tasks(&self.index.index_uid, 0)
            .await
            .map_err(external)?
            .iter()
            .map(SeriesDelete::from_task)
            .collect::<std::result::Result<_, _>>()
            .map_err(external)?;
        let mut merged: HashMap<Labels, Vec<Sample>> = HashMap::new();
        let mut total = 0u64;
        for split in &splits {
            // Read by byte ranges: the cached footer, then the pages the matchers leave.
            let fetch = shale_storage::range_fetcher(self.storage.clone(), split.object_key());
            let reader = shale_metrics::RangeReader::new(split.size_bytes, fetch);
            let read = shale_metrics::read_split_ranges(
                &split.split_id,
                reader,
                &pruning.matchers,
                pruning.start_ms,
                pruning.end_ms,
                true,
            )
            .await
            .map_err(external)?;
            stats.splits_opened += 1;
            stats.row_groups += read.stats.row_groups as u64;
            stats.row_groups_read += read.stats.row_groups_read as u64;
            let pending: Vec<&SeriesDelete> = deletes
                .iter()
                .filter(|d| d.opstamp > split.delete_opstamp)
                .collect();
            for mut series in read.series {
                if !pending.is_empty() {
                    shale_metrics::apply_deletes(&pending, &series.labels, &mut series.samples);
                }
                total += series.samples.len() as u64;
                if total > self.limits.max_samples {
                    return Err(DataFusionError::External(
                        format!(
                            "too many samples: the query reads more than {} samples from the \
                             splits; narrow it with `timestamp` bounds or `=` on `__name__` \
                             and labels",
                            self.limits.max_samples
                        )
                        .into(),
                    ));
                }
                merged
                    .entry(series.labels)
                    .or_default()
                    .extend(series.samples);
            }
        }
        let mut out: Vec<(Labels, Vec<Sample>)> = merged
            .into_iter()
            // Of one timestamp the later split's sample is kept.
            .map(|(labels, samples)| (labels, shale_metrics::last_per_timestamp(samples)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        stats.samples = out.iter().map(|(_, s)| s.len() as u64).sum();
        let mut shared = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        shared.splits_listed += stats.splits_listed;
        shared.splits_pruned += stats.splits_pruned;
        shared.splits_opened += stats.splits_opened;
        shared.row_groups += stats.row_groups;
        shared.row_groups_read += stats.row_groups_read;
        shared.samples += stats.samples;
        Ok(out)
    }

    /// The rows of `series` as record batches of the table's schema.
    fn batches(&self, series: &[(Labels, Vec<Sample>)]) -> Result<Vec<RecordBatch>> {
        let mut batches = Vec::new();
        let mut rows = Rows::new(self.labels.len());
        for (labels, samples) in series {
            for sample in samples {
                rows.name.append_value(labels.metric_name());
                for (builder, label) in rows.labels.iter_mut().zip(&self.labels) {
                    builder.append_option(labels.get(label));
                }
                rows.timestamp.append_value(sample.timestamp_ms);
                rows.value.append_value(sample.value);
                rows.len += 1;
                if rows.len >= BATCH_ROWS {
                    batches.push(rows.finish(&self.schema)?);
                }
            }
        }
        if rows.len > 0 {
            batches.push(rows.finish(&self.schema)?);
        }
        Ok(batches)
    }
}

/// Column builders of one batch.
struct Rows {
    name: StringBuilder,
    labels: Vec<StringBuilder>,
    timestamp: TimestampMillisecondBuilder,
    value: Float64Builder,
    len: usize,
}

impl Rows {
    fn new(labels: usize) -> Rows {
        Rows {
            name: StringBuilder::new(),
            labels: (0..labels).map(|_| StringBuilder::new()).collect(),
            timestamp: TimestampMillisecondBuilder::new().with_timezone("UTC"),
            value: Float64Builder::new(),
            len: 0,
        }
    }

    fn finish(&mut self, schema: &SchemaRef) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.labels.len() + 3);
        columns.push(Arc::new(self.name.finish()));
        for builder in &mut self.labels {
            columns.push(Arc::new(builder.finish()));
        }
        columns.push(Arc::new(self.timestamp.finish()));
        columns.push(Arc::new(self.value.finish()));
        self.len = 0;
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }
}

#[async_trait]
impl TableProvider for MetricsTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        // Used for pruning only: DataFusion applies every filter to the rows again.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let pruning = self.pruning(filters);
        let series = self.read(&pruning).await?;
        let batches = self.batches(&series)?;
        let exec: Arc<dyn ExecutionPlan> =
            MemorySourceConfig::try_new_exec(&[batches], self.schema.clone(), projection.cloned())?;
        Ok(exec)
    }
}
