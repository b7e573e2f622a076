//! SQL over the indexes, with DataFusion. Every metrics index is a table of samples
//! (`__name__`, one column per label, `timestamp`, `value`), read from its published Parquet
//! splits with the same pruning as PromQL — splits by time range, metric-name tags and
//! sort-key range, row groups by statistics and bloom filters — and with the index's delete
//! tasks applied. Every log index is a table of documents (a column per declared field, and
//! `_source`), read through a [`DocumentSource`] (the server's search path) with the time
//! range its filters allow. DataFusion plans and runs the query; answers come as Arrow record
//! batches, encoded as JSON rows or an Arrow IPC stream.
//!
//! Only the SQL path builds DataFusion: this crate is the server's only one that depends on it.

mod logs;
pub mod nesting;
mod table;

use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::SchemaProvider;
use datafusion::error::DataFusionError;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext};
use serde_json::{json, Value};
use shale_metastore::{IndexMetadata, Metastore};
use shale_storage::StorageRef;
use shale_types::memory::{MemoryBudget, Reservation};

pub use logs::{DocumentSource, Documents, DocumentsRequest, LogsTable};
pub use table::{MetricsTable, ScanStats};

/// How the engine reaches an index's objects.
pub type StorageFor = Arc<dyn Fn(&IndexMetadata) -> Result<StorageRef, String> + Send + Sync>;

/// Limits of one query.
#[derive(Clone, Copy, Debug)]
pub struct SqlLimits {
    /// Most samples a query may read from splits (after pruning).
    pub max_samples: u64,
    /// Most documents a query may read from a log index (after pruning).
    pub max_documents: usize,
    /// Most rows in an answer.
    pub max_result_rows: usize,
    /// Most bytes of an answer (its Arrow batches, then its JSON).
    pub max_result_bytes: usize,
}

/// Default [`SqlLimits::max_result_rows`].
pub const DEFAULT_MAX_RESULT_ROWS: usize = 100_000;
/// Default [`SqlLimits::max_result_bytes`]: 64 MiB.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 64 << 20;

impl Default for SqlLimits {
    fn default() -> Self {
        SqlLimits {
            max_samples: 50_000_000,
            max_documents: 1_000_000,
            max_result_rows: DEFAULT_MAX_RESULT_ROWS,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
        }
    }
}

/// What can go wrong with a SQL query.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    /// The query does not parse or plan (unknown table or column, wrong types, a statement
    /// other than a query).
    #[error("{0}")]
    Invalid(String),
    /// The query reads more than the limits allow.
    #[error("{0}")]
    TooLarge(String),
    /// Reading the splits or running the plan failed.
    #[error("{0}")]
    Internal(String),
}

impl From<DataFusionError> for SqlError {
    fn from(err: DataFusionError) -> Self {
        match err.find_root() {
            DataFusionError::SQL(..)
            | DataFusionError::Plan(..)
            | DataFusionError::SchemaError(..)
            | DataFusionError::NotImplemented(..) => SqlError::Invalid(err.strip_backtrace()),
            DataFusionError::ResourcesExhausted(..) => SqlError::TooLarge(err.strip_backtrace()),
            DataFusionError::External(inner)
                if inner.to_string().contains("too many samples")
                    || inner.to_string().contains("too many documents") =>
            {
                SqlError::TooLarge(err.strip_backtrace())
            }
            _ => SqlError::Internal(err.strip_backtrace()),
        }
    }
}

/// A query's answer.
#[derive(Debug)]
pub struct SqlOutput {
    /// The result's columns.
    pub schema: SchemaRef,
    /// Its rows.
    pub batches: Vec<RecordBatch>,
    /// What reading the tables cost.
    pub stats: ScanStats,
}

impl SqlOutput {
    /// Rows in the answer.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }

    /// The answer as a JSON document: its columns (name and Arrow type), its rows as objects
    /// (nulls explicit), and the scan statistics. The rows are written as Arrow's JSON writer
    /// writes them, straight into the document (no tree of values in between); refused past
    /// `max_bytes`.
    pub fn to_json_bytes(&self, max_bytes: usize) -> Result<Vec<u8>, SqlError> {
        let columns: Vec<Value> = self
            .schema
            .fields()
            .iter()
            .map(|f| json!({"name": f.name(), "type": f.data_type().to_string()}))
            .collect();
        let mut out = Vec::new();
        out.extend_from_slice(b"{\"columns\":");
        serde_json::to_writer(&mut out, &columns)
            .map_err(|err| SqlError::Internal(err.to_string()))?;
        out.extend_from_slice(b",\"rows\":");
        let rows_start = out.len();
        {
            let mut writer = arrow_json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow_json::writer::JsonArray>(&mut out);
            for batch in &self.batches {
                writer
                    .write(batch)
                    .map_err(|err| SqlError::Internal(err.to_string()))?;
            }
            writer
                .finish()
                .map_err(|err| SqlError::Internal(err.to_string()))?;
        }
        if out.len() == rows_start {
            out.extend_from_slice(b"[]");
        }
        if out.len() > max_bytes {
            return Err(SqlError::TooLarge(format!(
                "the answer is larger than {max_bytes} bytes of JSON, the most an answer may \
                 have: select fewer rows or columns (LIMIT)"
            )));
        }
        out.extend_from_slice(b",\"num_rows\":");
        out.extend_from_slice(self.num_rows().to_string().as_bytes());
        out.extend_from_slice(b",\"stats\":");
        serde_json::to_writer(&mut out, &self.stats.to_json())
            .map_err(|err| SqlError::Internal(err.to_string()))?;
        out.push(b'}');
        Ok(out)
    }

    /// The answer as an Arrow IPC stream.
    pub fn to_arrow_ipc(&self) -> Result<Vec<u8>, SqlError> {
        let mut out = Vec::new();
        {
            let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut out, &self.schema)
                .map_err(|err| SqlError::Internal(err.to_string()))?;
            for batch in &self.batches {
                writer
                    .write(batch)
                    .map_err(|err| SqlError::Internal(err.to_string()))?;
            }
            writer
                .finish()
                .map_err(|err| SqlError::Internal(err.to_string()))?;
        }
        Ok(out)
    }
}

/// A budget refusal as a SQL error.
fn too_large(err: shale_types::memory::BudgetExceeded) -> SqlError {
    SqlError::TooLarge(err.to_string())
}

/// DataFusion's memory pool for one query, over a reservation from the node's budget.
#[derive(Debug)]
struct BudgetPool {
    reservation: Mutex<Reservation>,
}

impl BudgetPool {
    fn new(reservation: Reservation) -> Self {
        BudgetPool {
            reservation: Mutex::new(reservation),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reservation> {
        self.reservation.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `bytes` of the answer (which DataFusion no longer counts once it is handed over).
    fn hold(&self, bytes: u64) -> Result<(), shale_types::memory::BudgetExceeded> {
        self.lock().try_grow(bytes)
    }
}

impl std::fmt::Display for BudgetPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "shale query memory budget")
    }
}

impl datafusion::execution::memory_pool::MemoryPool for BudgetPool {
    fn name(&self) -> &str {
        "shale-budget"
    }

    fn grow(&self, _: &datafusion::execution::memory_pool::MemoryReservation, additional: usize) {
        self.lock().force_grow(additional as u64);
    }

    fn shrink(&self, _: &datafusion::execution::memory_pool::MemoryReservation, shrink: usize) {
        self.lock().shrink(shrink as u64);
    }

    fn try_grow(
        &self,
        _: &datafusion::execution::memory_pool::MemoryReservation,
        additional: usize,
    ) -> datafusion::error::Result<()> {
        self.lock()
            .try_grow(additional as u64)
            .map_err(|err| DataFusionError::ResourcesExhausted(err.to_string()))
    }

    fn reserved(&self) -> usize {
        usize::try_from(self.lock().bytes()).unwrap_or(usize::MAX)
    }

    fn memory_limit(&self) -> datafusion::execution::memory_pool::MemoryLimit {
        let budget = self.lock().budget().total();
        datafusion::execution::memory_pool::MemoryLimit::Finite(
            usize::try_from(budget).unwrap_or(usize::MAX),
        )
    }
}

/// Stack of each thread of the SQL runtime. DataFusion plans and optimizes expressions
/// recursively, some tens of KiB a level in a debug build: this holds the deepest query
/// [`nesting`] lets through with room to spare (the memory is reserved, and only touched as
/// deep as a query goes).
pub const SQL_THREAD_STACK_BYTES: usize = 64 << 20;

/// The runtime SQL queries are planned and run on: threads with [`SQL_THREAD_STACK_BYTES`] of
/// stack (the node's own threads have 2 MiB), one per core, started at the first query.
pub fn runtime() -> Result<&'static tokio::runtime::Runtime, &'static std::io::Error> {
    static RUNTIME: std::sync::LazyLock<std::io::Result<tokio::runtime::Runtime>> =
        std::sync::LazyLock::new(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(
                    std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get),
                )
                .thread_name("shale-sql")
                .thread_stack_size(SQL_THREAD_STACK_BYTES)
                .enable_all()
                .build()
        });
    RUNTIME.as_ref()
}

/// Runs SQL queries over the indexes of a metastore (log indexes when it has a document
/// source).
#[derive(Clone)]
pub struct SqlEngine {
    metastore: Arc<dyn Metastore>,
    storage_for: StorageFor,
    documents: Option<Arc<dyn DocumentSource>>,
    limits: SqlLimits,
    budget: Option<MemoryBudget>,
}

/// Plans `sql` against no tables (every name is unknown) on the SQL runtime: what a query's
/// text goes through before any index is read — the nesting bounds, DataFusion's parser, its
/// planner — without the metastore. The parsers' fuzz target runs it.
pub async fn plan_without_tables(sql: &str) -> Result<(), SqlError> {
    nesting::check(sql).map_err(SqlError::Invalid)?;
    let sql = sql.to_string();
    runtime()
        .map_err(|err| SqlError::Internal(format!("cannot start the SQL runtime: {err}")))?
        .spawn(async move {
            let ctx = SessionContext::new();
            let options = SQLOptions::new()
                .with_allow_ddl(false)
                .with_allow_dml(false)
                .with_allow_statements(false);
            let frame = ctx.sql_with_options(&sql, options).await?;
            // The optimizer recurses too.
            frame.into_optimized_plan()?;
            Ok(())
        })
        .await
        .map_err(|err| SqlError::Internal(format!("the SQL query failed: {err}")))?
}

impl SqlEngine {
    /// An engine over `metastore`'s indexes, reading their objects through `storage_for`.
    pub fn new(metastore: Arc<dyn Metastore>, storage_for: StorageFor) -> Self {
        SqlEngine {
            metastore,
            storage_for,
            documents: None,
            limits: SqlLimits::default(),
            budget: None,
        }
    }

    /// The same engine, its queries' memory (DataFusion's operators, the answer) counted in
    /// `budget`: a query that would pass it fails (as too large) instead of taking it.
    pub fn with_budget(mut self, budget: MemoryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The limits of its queries.
    pub fn limits(&self) -> SqlLimits {
        self.limits
    }

    /// The same engine, with the log indexes as tables read through `source`.
    pub fn with_documents(mut self, source: Arc<dyn DocumentSource>) -> Self {
        self.documents = Some(source);
        self
    }

    /// The same engine with other limits.
    pub fn with_limits(mut self, limits: SqlLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Plans and runs one query (a `SELECT`; statements that change anything are refused), on
    /// the SQL runtime ([`runtime`]).
    pub async fn execute(&self, sql: &str) -> Result<SqlOutput, SqlError> {
        nesting::check(sql).map_err(SqlError::Invalid)?;
        let engine = self.clone();
        let sql = sql.to_string();
        runtime()
            .map_err(|err| SqlError::Internal(format!("cannot start the SQL runtime: {err}")))?
            .spawn(async move { engine.execute_here(&sql).await })
            .await
            .map_err(|err| SqlError::Internal(format!("the SQL query failed: {err}")))?
    }

    async fn execute_here(&self, sql: &str) -> Result<SqlOutput, SqlError> {
        let indexes = self
            .metastore
            .list_indexes()
            .await
            .map_err(|err| SqlError::Internal(err.to_string()))?;
        let stats = Arc::new(Mutex::new(ScanStats::default()));
        let schema = Arc::new(table::IndexSchema::new(
            indexes
                .into_iter()
                .filter(|index| index.index_config.metrics.is_some() || self.documents.is_some())
                .collect(),
            self.metastore.clone(),
            self.storage_for.clone(),
            self.documents.clone(),
            self.limits,
            stats.clone(),
        ));
        let config = SessionConfig::new()
            .with_information_schema(true)
            .with_default_catalog_and_schema("shale", "public");
        // DataFusion's operators reserve their memory from the node's budget, through one
        // reservation for the query (given back when it ends).
        let reservation = match &self.budget {
            Some(budget) => Some(budget.try_reserve(0).map_err(too_large)?),
            None => None,
        };
        let pool = reservation.map(|r| Arc::new(BudgetPool::new(r)));
        let mut runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new();
        if let Some(pool) = &pool {
            runtime = runtime.with_memory_pool(pool.clone());
        }
        let ctx = SessionContext::new_with_config_rt(config, runtime.build_arc()?);
        let catalog = Arc::new(datafusion::catalog::MemoryCatalogProvider::new());
        datafusion::catalog::CatalogProvider::register_schema(
            catalog.as_ref(),
            "public",
            schema as Arc<dyn SchemaProvider>,
        )?;
        ctx.register_catalog("shale", catalog);
        let options = SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false);
        let frame = ctx.sql_with_options(sql, options).await?;
        let schema: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
        // The answer is read batch by batch, its rows and bytes counted (and held in the
        // budget) as they come: a query that answers too much stops at the limit.
        let mut stream = frame.execute_stream().await?;
        let mut batches = Vec::new();
        let (mut rows, mut bytes) = (0usize, 0usize);
        while let Some(batch) = futures::StreamExt::next(&mut stream).await {
            let batch = batch?;
            rows += batch.num_rows();
            let size = batch.get_array_memory_size();
            bytes += size;
            if rows > self.limits.max_result_rows {
                return Err(SqlError::TooLarge(format!(
                    "the answer has more than {} rows, the most an answer may have: add a LIMIT \
                     or aggregate",
                    self.limits.max_result_rows
                )));
            }
            if bytes > self.limits.max_result_bytes {
                return Err(SqlError::TooLarge(format!(
                    "the answer holds more than {} bytes, the most an answer may hold: select \
                     fewer rows or columns (LIMIT)",
                    self.limits.max_result_bytes
                )));
            }
            if let Some(pool) = &pool {
                pool.hold(size as u64).map_err(too_large)?;
            }
            batches.push(batch);
        }
        let stats = *stats.lock().unwrap_or_else(|p| p.into_inner());
        Ok(SqlOutput {
            schema,
            batches,
            stats,
        })
    }
}
