//! The `/metrics` endpoint: the Prometheus default registry (ingest and search register
//! there) plus gauges refreshed at scrape time (splits by state, WAL size).

use std::sync::LazyLock;

use prometheus::{
    register_gauge, register_int_counter_vec, register_int_gauge_vec, Encoder, Gauge,
    IntCounterVec, IntGaugeVec, TextEncoder,
};
use shale_types::SplitState;

use crate::node::Node;

static SPLITS_BY_STATE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "shale_splits",
        "Splits in the metastore, by index and state.",
        &["index", "state"]
    )
    .expect("metric registered once")
});

static SPLITS_BY_SCOPE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "shale_scope_splits",
        "Published splits per merge scope (source/partition/doc mapping) and maturity.",
        &["index", "scope", "maturity"]
    )
    .expect("metric registered once")
});

static WRITE_AMPLIFICATION: LazyLock<Gauge> = LazyLock::new(|| {
    register_gauge!(
        "shale_write_amplification",
        "Split bytes written by ingest and merges divided by split bytes written by ingest (this node, since start)."
    )
    .expect("metric registered once")
});

static SPLIT_CACHE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "shale_split_cache",
        "The local split cache: `hits`, `misses` and `downloaded_bytes` since start, `bytes` held, `splits` held.",
        &["stat"]
    )
    .expect("metric registered once")
});

static RANGE_CACHE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "shale_range_cache",
        "Byte ranges of remote splits read by searches: `fetched_bytes` and `fetches` (ranged GETs) and `hit_bytes` (served from memory) since start, `bytes` held.",
        &["stat"]
    )
    .expect("metric registered once")
});

/// Metric samples accepted, by protocol (`remote_write`, `otlp`).
pub(crate) static METRIC_SAMPLES_INGESTED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "shale_metric_samples_ingested_total",
        "Samples accepted into metrics indexes, by protocol.",
        &["protocol"]
    )
    .expect("metric registered once")
});

/// SQL queries answered.
#[cfg(feature = "sql")]
pub(crate) static SQL_QUERIES: LazyLock<prometheus::IntCounter> = LazyLock::new(|| {
    prometheus::register_int_counter!("shale_sql_queries_total", "SQL queries answered.")
        .expect("metric registered once")
});

/// Metric samples (or OTLP data points) refused, by protocol.
pub(crate) static METRIC_SAMPLES_REFUSED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "shale_metric_samples_refused_total",
        "Series, native histogram samples (remote write) or data points (OTLP) that could not be stored, by protocol.",
        &["protocol"]
    )
    .expect("metric registered once")
});

/// Registers every metric of the node, so a scrape shows them all from the start.
pub fn register_all() {
    LazyLock::force(&SPLIT_CACHE);
    LazyLock::force(&RANGE_CACHE);
    LazyLock::force(&SPLITS_BY_STATE);
    LazyLock::force(&SPLITS_BY_SCOPE);
    LazyLock::force(&WRITE_AMPLIFICATION);
    LazyLock::force(&METRIC_SAMPLES_INGESTED);
    LazyLock::force(&METRIC_SAMPLES_REFUSED);
    #[cfg(feature = "sql")]
    LazyLock::force(&SQL_QUERIES);
    shale_ingest::metrics::register();
    shale_compaction::service::metrics::register();
    shale_search::register_metrics();
}

/// Refreshes scrape-time gauges: one aggregate query to the metastore (no split is listed).
pub async fn refresh(node: &Node) {
    node.router.update_wal_metrics().await;
    let cache = node.search.cache();
    let (hits, misses) = cache.hit_miss();
    for (stat, value) in [
        ("hits", hits),
        ("misses", misses),
        ("bytes", cache.size_bytes()),
        ("splits", cache.len() as u64),
        ("downloaded_bytes", cache.downloaded_bytes()),
    ] {
        SPLIT_CACHE
            .with_label_values(&[stat])
            .set(i64::try_from(value).unwrap_or(i64::MAX));
    }
    if let Some(ranges) = node.search.leaf().range_cache() {
        for (stat, value) in [
            ("fetched_bytes", ranges.fetched_bytes()),
            ("fetches", ranges.fetches()),
            ("hit_bytes", ranges.hit_bytes()),
            ("bytes", ranges.used_bytes()),
        ] {
            RANGE_CACHE
                .with_label_values(&[stat])
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }
    let ingest_bytes = shale_ingest::metrics::SPLIT_BYTES_WRITTEN.get();
    let merge_bytes = shale_compaction::service::metrics::MERGE_BYTES_WRITTEN.get();
    if ingest_bytes > 0 {
        WRITE_AMPLIFICATION.set((ingest_bytes + merge_bytes) as f64 / ingest_bytes as f64);
    }
    let Ok(stats) = node
        .metastore
        .split_stats(shale_types::now_unix_secs())
        .await
    else {
        return;
    };
    let node_local = node.config.compaction.scope == shale_config::ScopeMode::NodeLocal;
    SPLITS_BY_STATE.reset();
    SPLITS_BY_SCOPE.reset();
    for group in stats {
        let index_id = group.scope.index_uid.index_id.clone();
        let index_id = index_id.as_str();
        SPLITS_BY_STATE
            .with_label_values(&[index_id, group.split_state.as_str()])
            .add(group.num_splits as i64);
        if group.split_state != SplitState::Published {
            continue;
        }
        let mut scope = group.scope;
        if !node_local {
            scope.node_id = None;
        }
        let maturity = if group.mature { "mature" } else { "immature" };
        SPLITS_BY_SCOPE
            .with_label_values(&[index_id, scope.to_string().as_str(), maturity])
            .add(group.num_splits as i64);
    }
}

/// Renders the default registry in the Prometheus text format.
pub fn render() -> Result<String, String> {
    register_all();
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&prometheus::gather(), &mut buf)
        .map_err(|err| err.to_string())?;
    String::from_utf8(buf).map_err(|err| err.to_string())
}
