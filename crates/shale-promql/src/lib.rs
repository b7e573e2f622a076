//! PromQL evaluation over a [`SeriesSource`], with Prometheus's semantics.
//!
//! The query is parsed by `promql-parser`; everything after is this crate's: the selectors of
//! the query are collected with the time windows they need (offset, `@`, ranges, subqueries,
//! the 5-minute lookback), read once each from the source, then the expression is evaluated
//! step by step as Prometheus's engine does.

use std::time::Duration;

pub use shale_metrics::{Labels, MatchOp, Matcher, Sample, SeriesSamples};

mod aggregate;
mod binary;
mod eval;
mod functions;
pub mod go_format;
mod go_math;
mod plan;

/// Where selectors read their series.
#[async_trait::async_trait]
pub trait SeriesSource: Send + Sync {
    /// The series matching every matcher, with their samples of `[start_ms, end_ms]`
    /// (inclusive) in timestamp order, one per timestamp, staleness markers included.
    async fn select(
        &self,
        matchers: &[Matcher],
        start_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<SeriesSamples>, PromqlError>;
}

/// Limits and defaults of an evaluation.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// How far back an instant selector looks for a sample (Prometheus: 5 minutes).
    pub lookback_ms: i64,
    /// Most samples a query may hold in memory at once (Prometheus's `--query.max-samples`).
    pub max_samples: usize,
    /// Longest evaluation (Prometheus's `--query.timeout`).
    pub timeout: Duration,
    /// The node's query memory budget: the series read, the samples held and the subquery
    /// steps kept are reserved from it as the evaluation takes them, and the query fails
    /// (`execution`) instead of passing it.
    pub budget: Option<shale_types::memory::MemoryBudget>,
}

/// Bytes counted for one sample held (its value and time, its series' share of labels, the
/// containers around it).
pub const BYTES_PER_SAMPLE: u64 = 64;
/// Bytes counted for one series read (its labels and vectors).
pub const BYTES_PER_SERIES: u64 = 256;

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            lookback_ms: 5 * 60 * 1000,
            max_samples: 50_000_000,
            timeout: Duration::from_secs(120),
            budget: None,
        }
    }
}

/// Why a query failed, as Prometheus's API classifies it (`errorType`).
#[derive(Debug, thiserror::Error)]
pub enum PromqlError {
    /// The query does not parse or is invalid (`bad_data`, HTTP 400).
    #[error("{0}")]
    BadData(String),
    /// The evaluation failed (`execution`, HTTP 422), e.g. duplicate series on one side of a
    /// one-to-one match.
    #[error("{0}")]
    Execution(String),
    /// Over the timeout (`timeout`, HTTP 503).
    #[error("query timed out in {0}")]
    Timeout(String),
    /// Over `max_samples` (`execution`, HTTP 422).
    #[error("query processing would load too many samples into memory in {0}")]
    TooManySamples(String),
    /// Over the node's query memory budget (`execution`, HTTP 422), before taking the memory.
    #[error("{0}")]
    OverBudget(String),
    /// The source failed (`internal`, HTTP 500).
    #[error("{0}")]
    Source(String),
    /// The source cannot answer now but may on a retry (`unavailable`, HTTP 503).
    #[error("{0}")]
    Unavailable(String),
}

/// One sample of an instant vector.
#[derive(Clone, Debug, PartialEq)]
pub struct VectorSample {
    /// The series' labels.
    pub labels: Labels,
    /// The evaluation time (milliseconds since the epoch).
    pub timestamp_ms: i64,
    /// The value.
    pub value: f64,
}

/// One series of a range vector (a matrix).
#[derive(Clone, Debug, PartialEq)]
pub struct RangeSeries {
    /// The series' labels.
    pub labels: Labels,
    /// Its samples, by increasing timestamp.
    pub samples: Vec<Sample>,
}

/// The result of a query, as Prometheus's API types it (`resultType`).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A number at a time.
    Scalar {
        /// The evaluation time.
        timestamp_ms: i64,
        /// The value.
        value: f64,
    },
    /// A string at a time.
    String {
        /// The evaluation time.
        timestamp_ms: i64,
        /// The string.
        value: String,
    },
    /// An instant vector.
    Vector(Vec<VectorSample>),
    /// A range vector (every range query's result).
    Matrix(Vec<RangeSeries>),
}

/// What an evaluation read and held.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryStats {
    /// Series returned by the source, over all selectors.
    pub series_read: u64,
    /// Samples returned by the source, over all selectors.
    pub samples_read: u64,
    /// Most samples held at once during the evaluation.
    pub peak_samples: u64,
}

/// A query's result with its warnings and statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct QueryOutput {
    /// The result.
    pub value: Value,
    /// Warnings (none are produced yet; kept for the API's `warnings`).
    pub warnings: Vec<String>,
    /// What the evaluation read and held.
    pub stats: QueryStats,
}

/// Evaluates `query` at `time_ms` (Prometheus's `/api/v1/query`).
pub async fn instant_query(
    source: &dyn SeriesSource,
    query: &str,
    time_ms: i64,
    options: &EngineOptions,
) -> Result<QueryOutput, PromqlError> {
    run(source, query, time_ms, time_ms, 1, true, options).await
}

/// Evaluates `query` at `start_ms, start_ms + step_ms, …, end_ms` (Prometheus's
/// `/api/v1/query_range`); the result is a matrix sorted by labels.
pub async fn range_query(
    source: &dyn SeriesSource,
    query: &str,
    start_ms: i64,
    end_ms: i64,
    step_ms: i64,
    options: &EngineOptions,
) -> Result<QueryOutput, PromqlError> {
    if step_ms <= 0 {
        return Err(PromqlError::BadData(
            "zero or negative query resolution step widths are not accepted. Try a positive integer"
                .to_string(),
        ));
    }
    if end_ms < start_ms {
        return Err(PromqlError::BadData(
            "end timestamp must not be before start time".to_string(),
        ));
    }
    run(source, query, start_ms, end_ms, step_ms, false, options).await
}

async fn run(
    source: &dyn SeriesSource,
    query: &str,
    start_ms: i64,
    end_ms: i64,
    step_ms: i64,
    instant: bool,
    options: &EngineOptions,
) -> Result<QueryOutput, PromqlError> {
    let started = std::time::Instant::now();
    register_legacy_functions();
    let expr = shale_metrics::promql_depth::parse_bounded(query).map_err(PromqlError::BadData)?;
    if !instant {
        match expr.value_type() {
            promql_parser::parser::value::ValueType::String => {
                return Err(PromqlError::BadData(
                    "invalid expression type \"string\" for range query, must be Scalar or instant Vector"
                        .to_string(),
                ))
            }
            promql_parser::parser::value::ValueType::Matrix => {
                return Err(PromqlError::BadData(
                    "invalid expression type \"range vector\" for range query, must be Scalar or instant Vector"
                        .to_string(),
                ))
            }
            _ => {}
        }
    }
    let window = plan::QueryWindow {
        start_ms,
        end_ms,
        lookback_ms: options.lookback_ms,
    };
    // Boxed: the series read are keyed by their selector's address, which must not move.
    let expr = Box::new(expr);
    let (data, mut stats) = plan::fetch(source, &expr, &window).await?;
    // The evaluation is CPU work of up to the query timeout: on the blocking pool, so that
    // it never holds an async worker (and several queries evaluate on several cores).
    let options = options.clone();
    let (value, peak_samples) = tokio::task::spawn_blocking(move || {
        let evaluator = eval::Evaluator::new(data, window, &options, started)?;
        let value = if instant {
            evaluator.run_instant(&expr, start_ms)?
        } else {
            evaluator.run_range(&expr, start_ms, end_ms, step_ms)?
        };
        Ok::<_, PromqlError>((value, evaluator.peak_samples()))
    })
    .await
    .map_err(|err| PromqlError::Execution(format!("the evaluation failed: {err}")))??;
    stats.peak_samples = peak_samples;
    Ok(QueryOutput {
        value,
        warnings: Vec::new(),
        stats,
    })
}

/// Teaches the parser the 2.42 functions it no longer knows (`holt_winters`, renamed in 3.0).
fn register_legacy_functions() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use promql_parser::parser::value::ValueType;
        // Fails only if the name is built in, in which case the parser knows it already.
        let _ = promql_parser::parser::register_extra_functions(vec![
            promql_parser::parser::Function::new(
                "holt_winters",
                vec![ValueType::Matrix, ValueType::Scalar, ValueType::Scalar],
                0,
                ValueType::Vector,
                false,
            ),
        ]);
    });
}
