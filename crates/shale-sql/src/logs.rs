//! A log (document) index as a DataFusion table.
//!
//! Columns: one per declared field of the current doc mapping (an object's fields as
//! `parent.child`), typed from the mapping — text, ip and bytes as text, integers, floats,
//! booleans, datetimes as UTC timestamps (µs), json as its JSON text — then `_source`, the
//! whole document as JSON text (dynamic fields included). A value that does not fit its
//! column (an array in a number column, say) is null there and still in `_source`.
//!
//! The documents come from a [`DocumentSource`] (the server's search path: splits pruned by
//! time range, delete tasks applied). Comparisons of the timestamp field with literals become
//! the time range the source prunes with; DataFusion applies every filter to the rows again.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder, UInt64Builder,
};
use datafusion::arrow::compute::kernels::cast_utils::string_to_timestamp_nanos;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use serde_json::Value;
use shale_config::{FieldKind, FieldMapping};
use shale_metastore::IndexMetadata;

use crate::table::ScanStats;
use crate::SqlLimits;

/// The column holding the whole document.
const SOURCE: &str = "_source";
/// Rows per record batch handed to DataFusion.
const BATCH_ROWS: usize = 8192;

/// What a scan of a log index asks its source for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DocumentsRequest {
    /// Inclusive lower bound on the timestamp field (Unix seconds).
    pub start_timestamp: Option<i64>,
    /// Exclusive upper bound on the timestamp field (Unix seconds).
    pub end_timestamp: Option<i64>,
    /// Most documents to return.
    pub max_documents: usize,
}

/// The documents a source found.
#[derive(Clone, Debug, Default)]
pub struct Documents {
    /// The documents (JSON objects), at most the request's `max_documents`.
    pub docs: Vec<Value>,
    /// How many documents matched (may exceed `docs.len()`).
    pub num_hits: u64,
    /// Splits searched.
    pub splits_searched: u64,
}

/// Reads the documents of a log index for SQL.
#[async_trait]
pub trait DocumentSource: Send + Sync {
    /// The documents of `index_id` in the request's time range, deletes applied.
    async fn documents(
        &self,
        index_id: &str,
        request: DocumentsRequest,
    ) -> std::result::Result<Documents, String>;
}

/// The type of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Text,
    I64,
    U64,
    F64,
    Bool,
    Timestamp,
}

/// One log index as a table of documents.
pub struct LogsTable {
    index: IndexMetadata,
    source: Arc<dyn DocumentSource>,
    schema: SchemaRef,
    /// The path of each field column (`parent.child`), its kind, in column order.
    columns: Vec<(String, Kind)>,
    timestamp_field: Option<String>,
    limits: SqlLimits,
    stats: Arc<Mutex<ScanStats>>,
}

impl std::fmt::Debug for LogsTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogsTable")
            .field("index", &self.index.index_id())
            .field("columns", &self.columns)
            .finish()
    }
}

/// The field columns of `fields` under `prefix`.
fn field_columns(fields: &[FieldMapping], prefix: &str, out: &mut Vec<(String, Kind)>) {
    for field in fields {
        let path = format!("{prefix}{}", field.name);
        let kind = match &field.kind {
            FieldKind::Object(object) => {
                field_columns(&object.field_mappings, &format!("{path}."), out);
                continue;
            }
            FieldKind::Concatenate(_) => continue,
            _ if field.array => Kind::Text,
            FieldKind::Text(_) | FieldKind::Json(_) | FieldKind::Bytes(_) | FieldKind::Ip(_) => {
                Kind::Text
            }
            FieldKind::I64(_) => Kind::I64,
            FieldKind::U64(_) => Kind::U64,
            FieldKind::F64(_) => Kind::F64,
            FieldKind::Bool(_) => Kind::Bool,
            FieldKind::Datetime(_) => Kind::Timestamp,
        };
        out.push((path, kind));
    }
}

impl LogsTable {
    /// The table of `index`, its columns from its current doc mapping.
    pub fn new(
        index: IndexMetadata,
        source: Arc<dyn DocumentSource>,
        limits: SqlLimits,
        stats: Arc<Mutex<ScanStats>>,
    ) -> LogsTable {
        let mapping = &index.index_config.doc_mapping;
        let mut columns = Vec::new();
        field_columns(&mapping.field_mappings, "", &mut columns);
        columns.retain(|(path, _)| path != SOURCE);
        let mut fields: Vec<Field> = columns
            .iter()
            .map(|(path, kind)| {
                let data_type = match kind {
                    Kind::Text => DataType::Utf8,
                    Kind::I64 => DataType::Int64,
                    Kind::U64 => DataType::UInt64,
                    Kind::F64 => DataType::Float64,
                    Kind::Bool => DataType::Boolean,
                    Kind::Timestamp => {
                        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
                    }
                };
                Field::new(path, data_type, true)
            })
            .collect();
        fields.push(Field::new(SOURCE, DataType::Utf8, false));
        LogsTable {
            timestamp_field: mapping.timestamp_field.clone(),
            index,
            source,
            schema: Arc::new(Schema::new(fields)),
            columns,
            limits,
            stats,
        }
    }

    /// The time range (Unix seconds, end exclusive) the filters on the timestamp field allow.
    fn time_range(&self, filters: &[Expr]) -> (Option<i64>, Option<i64>) {
        let Some(timestamp_field) = &self.timestamp_field else {
            return (None, None);
        };
        let (mut start, mut end): (Option<i64>, Option<i64>) = (None, None);
        let mut lower = |at: i64| start = Some(start.map_or(at, |s| s.max(at)));
        let mut upper = |at: i64| end = Some(end.map_or(at, |e| e.min(at)));
        for filter in filters {
            let mut bound = |op: Operator, micros: i64| {
                let secs = micros.div_euclid(1_000_000);
                let exact = micros.rem_euclid(1_000_000) == 0;
                match op {
                    Operator::Eq => {
                        lower(secs);
                        upper(secs + 1);
                    }
                    Operator::Gt | Operator::GtEq => lower(secs),
                    Operator::Lt if exact => upper(secs),
                    Operator::Lt | Operator::LtEq => upper(secs + 1),
                    _ => {}
                }
            };
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
                    if &column.name == timestamp_field {
                        if let Some(micros) = literal_micros(literal) {
                            bound(op, micros);
                        }
                    }
                }
                Expr::Between(between) if !between.negated => {
                    if let (Expr::Column(c), Expr::Literal(low, _), Expr::Literal(high, _)) = (
                        between.expr.as_ref(),
                        between.low.as_ref(),
                        between.high.as_ref(),
                    ) {
                        if &c.name == timestamp_field {
                            if let (Some(low), Some(high)) =
                                (literal_micros(low), literal_micros(high))
                            {
                                bound(Operator::GtEq, low);
                                bound(Operator::LtEq, high);
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        (start, end)
    }

    /// The documents as record batches of the table's schema.
    fn batches(&self, docs: &[Value]) -> Result<Vec<RecordBatch>> {
        let mut batches = Vec::new();
        for chunk in docs.chunks(BATCH_ROWS) {
            let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.columns.len() + 1);
            for (path, kind) in &self.columns {
                let values = chunk.iter().map(|doc| lookup(doc, path));
                columns.push(column(*kind, values));
            }
            let mut source = StringBuilder::new();
            for doc in chunk {
                source.append_value(doc.to_string());
            }
            columns.push(Arc::new(source.finish()));
            batches.push(RecordBatch::try_new(self.schema.clone(), columns)?);
        }
        Ok(batches)
    }
}

/// A literal timestamp, or an integer taken as Unix seconds, in microseconds.
fn literal_micros(value: &ScalarValue) -> Option<i64> {
    match value {
        ScalarValue::TimestampSecond(Some(v), _) => v.checked_mul(1_000_000),
        ScalarValue::TimestampMillisecond(Some(v), _) => v.checked_mul(1000),
        ScalarValue::TimestampMicrosecond(Some(v), _) => Some(*v),
        ScalarValue::TimestampNanosecond(Some(v), _) => Some(v.div_euclid(1000)),
        ScalarValue::Int64(Some(v)) => v.checked_mul(1_000_000),
        ScalarValue::Utf8(Some(text)) | ScalarValue::Utf8View(Some(text)) => {
            string_to_timestamp_nanos(text)
                .ok()
                .map(|n| n.div_euclid(1000))
        }
        _ => None,
    }
}

/// The value at a dotted path of `doc` (a key holding dots is tried whole first).
fn lookup<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    if let Some(value) = doc.get(path) {
        return Some(value);
    }
    let (head, rest) = path.split_once('.')?;
    lookup(doc.get(head)?, rest)
}

/// The single value of `value` (itself, or the only element of an array).
fn single(value: &Value) -> Option<&Value> {
    match value {
        Value::Array(items) if items.len() == 1 => items.first(),
        Value::Array(_) | Value::Null => None,
        other => Some(other),
    }
}

/// A datetime as microseconds: RFC 3339 and similar text, or a Unix time in seconds,
/// milliseconds, microseconds or nanoseconds told apart by magnitude.
fn micros_of(value: &Value) -> Option<i64> {
    match value {
        Value::String(text) => string_to_timestamp_nanos(text)
            .ok()
            .map(|n| n.div_euclid(1000)),
        Value::Number(number) => {
            let v = number.as_f64()?;
            let magnitude = v.abs();
            let micros = if magnitude < 1e11 {
                v * 1e6
            } else if magnitude < 1e14 {
                v * 1e3
            } else if magnitude < 1e17 {
                v
            } else {
                v / 1e3
            };
            micros.is_finite().then_some(micros as i64)
        }
        _ => None,
    }
}

/// One column of `kind` from the documents' values.
fn column<'a>(kind: Kind, values: impl Iterator<Item = Option<&'a Value>>) -> ArrayRef {
    match kind {
        Kind::Text => {
            let mut builder = StringBuilder::new();
            for value in values {
                match value {
                    None | Some(Value::Null) => builder.append_null(),
                    Some(Value::String(text)) => builder.append_value(text),
                    Some(other) => builder.append_value(other.to_string()),
                }
            }
            Arc::new(builder.finish())
        }
        Kind::I64 => {
            let mut builder = Int64Builder::new();
            for value in values {
                builder.append_option(value.and_then(single).and_then(|v| match v {
                    Value::String(text) => text.parse().ok(),
                    other => other.as_i64(),
                }));
            }
            Arc::new(builder.finish())
        }
        Kind::U64 => {
            let mut builder = UInt64Builder::new();
            for value in values {
                builder.append_option(value.and_then(single).and_then(|v| match v {
                    Value::String(text) => text.parse().ok(),
                    other => other.as_u64(),
                }));
            }
            Arc::new(builder.finish())
        }
        Kind::F64 => {
            let mut builder = Float64Builder::new();
            for value in values {
                builder.append_option(value.and_then(single).and_then(|v| match v {
                    Value::String(text) => text.parse().ok(),
                    other => other.as_f64(),
                }));
            }
            Arc::new(builder.finish())
        }
        Kind::Bool => {
            let mut builder = BooleanBuilder::new();
            for value in values {
                builder.append_option(value.and_then(single).and_then(|v| match v {
                    Value::String(text) => text.parse().ok(),
                    other => other.as_bool(),
                }));
            }
            Arc::new(builder.finish())
        }
        Kind::Timestamp => {
            let mut builder = TimestampMicrosecondBuilder::new().with_timezone("UTC");
            for value in values {
                builder.append_option(value.and_then(single).and_then(micros_of));
            }
            Arc::new(builder.finish())
        }
    }
}

#[async_trait]
impl TableProvider for LogsTable {
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
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let (start_timestamp, end_timestamp) = self.time_range(filters);
        let empty = matches!((start_timestamp, end_timestamp), (Some(s), Some(e)) if s >= e);
        let documents = if empty {
            Documents::default()
        } else {
            // A limit DataFusion passes down holds for the rows as they come (no filter left).
            let wanted = match limit {
                Some(limit) if filters.is_empty() => limit.min(self.limits.max_documents),
                _ => self.limits.max_documents,
            };
            let request = DocumentsRequest {
                start_timestamp,
                end_timestamp,
                max_documents: wanted,
            };
            let documents = self
                .source
                .documents(self.index.index_id(), request)
                .await
                .map_err(DataFusionError::Execution)?;
            let complete = limit.is_some() && filters.is_empty();
            if documents.num_hits > documents.docs.len() as u64 && !complete {
                return Err(DataFusionError::External(
                    format!(
                        "too many documents: the query reads {} documents of `{}`, more than \
                         {}; narrow it with bounds on `{}`",
                        documents.num_hits,
                        self.index.index_id(),
                        self.limits.max_documents,
                        self.timestamp_field
                            .as_deref()
                            .unwrap_or("the timestamp field"),
                    )
                    .into(),
                ));
            }
            documents
        };
        {
            let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            stats.splits_opened += documents.splits_searched;
            stats.documents += documents.docs.len() as u64;
        }
        let batches = self.batches(&documents.docs)?;
        let exec: Arc<dyn ExecutionPlan> =
            MemorySourceConfig::try_new_exec(&[batches], self.schema.clone(), projection.cloned())?;
        Ok(exec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn datetimes_are_read_from_text_and_unix_times_of_any_unit() {
        let expected = Some(1_700_000_000_000_000);
        assert_eq!(micros_of(&json!("2023-11-14T22:13:20Z")), expected);
        assert_eq!(micros_of(&json!(1_700_000_000)), expected);
        assert_eq!(micros_of(&json!(1_700_000_000_000i64)), expected);
        assert_eq!(micros_of(&json!(1_700_000_000_000_000i64)), expected);
        assert_eq!(micros_of(&json!(1_700_000_000_000_000_000i64)), expected);
        assert_eq!(micros_of(&json!("yesterday")), None);
    }

    #[test]
    fn dotted_paths_reach_nested_values_and_dotted_keys() {
        let doc = json!({"a": {"b": {"c": 1}}, "x.y": 2});
        assert_eq!(lookup(&doc, "a.b.c"), Some(&json!(1)));
        assert_eq!(lookup(&doc, "x.y"), Some(&json!(2)));
        assert_eq!(lookup(&doc, "a.z"), None);
    }
}
