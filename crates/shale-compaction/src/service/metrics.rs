//! Prometheus metrics of compaction, in the default registry.

use std::sync::LazyLock;

use shale_types::MergeTrigger;

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

metric!(MERGES_PENDING: IntGauge = register_int_gauge!(
    "shale_merges_pending", "Merge tasks waiting for a worker (all nodes)."));
metric!(MERGES_RUNNING: IntGauge = register_int_gauge!(
    "shale_merges_running", "Merges running on this node."));
metric!(MERGES_SUCCEEDED: IntCounter = register_int_counter!(
    "shale_merges_succeeded_total", "Merges published by this node."));
metric!(MERGES_FAILED: IntCounter = register_int_counter!(
    "shale_merges_failed_total", "Merges that failed or were discarded on this node."));
metric!(MERGE_BYTES_READ: IntCounter = register_int_counter!(
    "shale_merge_bytes_read_total", "Bytes of split inputs read by merges."));
metric!(MERGE_BYTES_WRITTEN: IntCounter = register_int_counter!(
    "shale_merge_bytes_written_total", "Bytes of split outputs written by merges."));

metric!(COMPACTION_TRIGGERS: IntCounterVec = register_int_counter_vec!(
    "shale_compaction_triggers_total",
    "Compaction tasks planned, by trigger: `policy` (the merge policy), `small_splits`, \
     `delete_ratio`, `delete_bytes` or `manual`.",
    &["trigger"]));

metric!(MERGE_STAGE_SECONDS: HistogramVec = register_histogram_vec!(
    "shale_merge_stage_seconds",
    "Time spent in each stage of a merge (prepare, download, merge, upload, publish).",
    &["stage"],
    vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]));

/// Runs one merge stage, recording its duration.
pub(crate) async fn stage<T>(
    name: &'static str,
    work: impl std::future::Future<Output = T>,
) -> (T, std::time::Duration) {
    let started = std::time::Instant::now();
    let result = work.await;
    let elapsed = started.elapsed();
    MERGE_STAGE_SECONDS
        .with_label_values(&[name])
        .observe(elapsed.as_secs_f64());
    (result, elapsed)
}

/// The stages of a merge (`stage` of [`MERGE_STAGE_SECONDS`]).
pub const STAGES: [&str; 5] = ["prepare", "download", "merge", "upload", "publish"];

/// Registers every compaction metric, its known label values at zero (so every family is
/// exported before the first merge).
pub fn register() {
    for stage in STAGES {
        MERGE_STAGE_SECONDS.with_label_values(&[stage]);
    }
    for trigger in [
        MergeTrigger::Policy,
        MergeTrigger::SmallSplits,
        MergeTrigger::DeleteRatio,
        MergeTrigger::DeleteBytes,
        MergeTrigger::Manual,
    ] {
        COMPACTION_TRIGGERS.with_label_values(&[trigger.as_str()]);
    }
    LazyLock::force(&MERGES_PENDING);
    LazyLock::force(&MERGES_RUNNING);
    LazyLock::force(&MERGES_SUCCEEDED);
    LazyLock::force(&MERGES_FAILED);
    LazyLock::force(&MERGE_BYTES_READ);
    LazyLock::force(&MERGE_BYTES_WRITTEN);
    LazyLock::force(&MERGE_STAGE_SECONDS);
    LazyLock::force(&COMPACTION_TRIGGERS);
}
