//! Prometheus metrics of ingestion, registered in the default registry (the server exposes it).

use std::sync::LazyLock;

use prometheus::{
    register_histogram_vec, register_int_counter, register_int_counter_vec, register_int_gauge,
    HistogramVec, IntCounter, IntCounterVec, IntGauge,
};

macro_rules! metric {
    ($name:ident: $ty:ty = $reg:expr) => {
        /// See the metric's help text.
        pub static $name: LazyLock<$ty> = LazyLock::new(|| $reg.expect("metric registered once"));
    };
}

metric!(DOCS_INGESTED: IntCounter = register_int_counter!(
    "shale_ingest_docs_total", "Documents accepted into the WAL."));
metric!(DOCS_REJECTED: IntCounter = register_int_counter!(
    "shale_ingest_docs_rejected_total", "Documents rejected at ingest (parse or validation errors)."));
metric!(BYTES_INGESTED: IntCounter = register_int_counter!(
    "shale_ingest_bytes_total", "Bytes of documents accepted into the WAL."));
metric!(SPLITS_PUBLISHED: IntCounter = register_int_counter!(
    "shale_indexing_splits_published_total", "Splits published by indexing pipelines."));
metric!(SPLIT_BYTES_WRITTEN: IntCounter = register_int_counter!(
    "shale_indexing_split_bytes_total", "Bytes of split objects uploaded by indexing pipelines."));
metric!(PIPELINE_ERRORS: IntCounterVec = register_int_counter_vec!(
    "shale_indexing_errors_total", "Indexing pipeline failures, by stage.", &["stage"]));
metric!(PIPELINE_STAGE_SECONDS: HistogramVec = register_histogram_vec!(
    "shale_indexing_stage_seconds",
    "Time spent in each stage of the indexing pipeline (index, finish, upload, publish).",
    &["stage"],
    vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]));
metric!(WAL_MEMORY_BYTES: IntGauge = register_int_gauge!(
    "shale_wal_memory_bytes", "Bytes of not-yet-truncated WAL records held in memory."));
metric!(WAL_BACKLOG_BYTES: IntGauge = register_int_gauge!(
    "shale_wal_backlog_bytes", "Bytes of WAL records not yet in published splits (ingest gets a 429 beyond max_wal_memory_bytes)."));
metric!(WAL_DISK_BYTES: IntGauge = register_int_gauge!(
    "shale_wal_disk_bytes", "Bytes used by WAL files on disk."));
metric!(WAL_FSYNCS: IntCounter = register_int_counter!(
    "shale_wal_fsync_rounds_total", "WAL fsync rounds (each covers every append before it: group commit)."));
metric!(WAL_APPENDS: IntCounter = register_int_counter!(
    "shale_wal_appends_total", "WAL appends (one per ingest request and shard)."));
metric!(WAL_REOPENS: IntCounter = register_int_counter!(
    "shale_wal_reopens_total", "WAL reopened from its files after a failed write (a full disk)."));
metric!(HANDOFFS_DROPPED: IntCounter = register_int_counter!(
    "shale_indexing_handoffs_dropped_total", "Ingest requests whose parsed documents the pipeline could not hold (it parses them again from the WAL)."));
metric!(DEAD_LETTERS: IntCounter = register_int_counter!(
    "shale_indexing_dead_letters_total", "WAL records that could not be indexed, kept in the data directory's dead letters with their position."));
metric!(INGEST_REJECTED_REQUESTS: IntCounterVec = register_int_counter_vec!(
    "shale_ingest_rejected_requests_total", "Ingest requests (or bulk items) refused with 429, by limit.", &["limit"]));
metric!(LIVE_BYTES: IntGauge = register_int_gauge!(
    "shale_metrics_live_bytes", "Estimated memory of the acknowledged samples not yet in published splits, kept for PromQL (at most live_samples_max_bytes)."));
metric!(LIVE_SAMPLES: IntGauge = register_int_gauge!(
    "shale_metrics_live_samples", "Acknowledged samples kept in memory for PromQL until their split is published."));
metric!(LIVE_SERIES: IntGauge = register_int_gauge!(
    "shale_metrics_live_series", "Series of the samples kept in memory for PromQL (once per shard)."));
metric!(LIVE_SAMPLES_NOT_KEPT: IntCounter = register_int_counter!(
    "shale_metrics_live_samples_not_kept_total", "Acknowledged samples not kept in memory because live_samples_max_bytes was reached (visible once published)."));

/// The stages of the indexing pipeline (`stage` of [`PIPELINE_STAGE_SECONDS`] and
/// [`PIPELINE_ERRORS`]).
pub const STAGES: [&str; 4] = ["index", "finish", "upload", "publish"];

/// The limits that refuse ingest requests with a 429 (`limit` of
/// [`INGEST_REJECTED_REQUESTS`]).
pub const REJECTION_LIMITS: [&str; 2] = ["in_flight_bytes", "wal_memory"];

/// Registers every ingest metric, its known label values at zero (so every family is
/// exported before first use).
pub fn register() {
    for stage in STAGES {
        PIPELINE_ERRORS.with_label_values(&[stage]);
        PIPELINE_STAGE_SECONDS.with_label_values(&[stage]);
    }
    for limit in REJECTION_LIMITS {
        INGEST_REJECTED_REQUESTS.with_label_values(&[limit]);
    }
    LazyLock::force(&DOCS_INGESTED);
    LazyLock::force(&DOCS_REJECTED);
    LazyLock::force(&BYTES_INGESTED);
    LazyLock::force(&SPLITS_PUBLISHED);
    LazyLock::force(&SPLIT_BYTES_WRITTEN);
    LazyLock::force(&PIPELINE_ERRORS);
    LazyLock::force(&PIPELINE_STAGE_SECONDS);
    LazyLock::force(&WAL_MEMORY_BYTES);
    LazyLock::force(&HANDOFFS_DROPPED);
    LazyLock::force(&DEAD_LETTERS);
    LazyLock::force(&WAL_DISK_BYTES);
    LazyLock::force(&WAL_BACKLOG_BYTES);
    LazyLock::force(&WAL_FSYNCS);
    LazyLock::force(&WAL_APPENDS);
    LazyLock::force(&WAL_REOPENS);
    LazyLock::force(&INGEST_REJECTED_REQUESTS);
    LazyLock::force(&LIVE_BYTES);
    LazyLock::force(&LIVE_SAMPLES);
    LazyLock::force(&LIVE_SERIES);
    LazyLock::force(&LIVE_SAMPLES_NOT_KEPT);
}

/// Runs one pipeline stage, recording its duration and, on failure, an error of that stage.
pub(crate) async fn stage<T, E>(
    name: &'static str,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let timer = PIPELINE_STAGE_SECONDS
        .with_label_values(&[name])
        .start_timer();
    let result = work.await;
    timer.observe_duration();
    if result.is_err() {
        PIPELINE_ERRORS.with_label_values(&[name]).inc();
    }
    result
}
