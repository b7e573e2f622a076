//! The `/metrics` endpoint: the Prometheus default registry (ingest, compaction and search
//! register there), gauges refreshed at scrape time (splits by state and level, caches, WAL
//! size), HTTP requests by route ([`track_http`]) and the process's own metrics (memory, CPU,
//! open files). Every family is rendered from the first scrape: labelled families start with
//! their known label values at zero, and per-index ones with each index's.

use std::sync::LazyLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{
    register_gauge, register_histogram_vec, register_int_counter_vec, register_int_gauge_vec,
    Encoder, Gauge, HistogramVec, IntCounterVec, IntGaugeVec, TextEncoder,
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

static SPLIT_BYTES_BY_STATE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "shale_split_bytes",
        "Bytes of the splits in the metastore, by index and state.",
        &["index", "state"]
    )
    .expect("metric registered once")
});

static SPLIT_DOCS_BY_STATE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "shale_split_docs",
        "Documents (samples for metrics indexes) in the splits of the metastore, by index and state.",
        &["index", "state"]
    )
    .expect("metric registered once")
});

static SPLITS_BY_LEVEL: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "shale_splits_by_level",
        "Published splits by index and level (the merges they went through; 0: as indexed).",
        &["index", "level"]
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

static COLUMN_CACHE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "shale_metrics_column_cache",
        "Decoded timestamps and values of hot metrics row groups (metrics_column_cache_max_bytes): `bytes` and `row_groups` held.",
        &["stat"]
    )
    .expect("metric registered once")
});

static PARTIAL_CACHE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "shale_search_partial_cache",
        "The leaf's partial-result cache (what each split answered to each request shape): `bytes` and `entries` held.",
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

/// Requests refused before their work was done, by reason.
static REQUESTS_REFUSED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "shale_requests_refused_total",
        "Requests refused before any work was done, by reason: `unauthenticated` (no or an unknown token), `forbidden` (a token of the wrong role, or the internal API closed), `cross_site` and `media_type` (browser safety), `depth_limit` (input nested too deep), `memory_budget` (the query memory budget).",
        &["reason"]
    )
    .expect("metric registered once")
});

/// The reasons [`count_refusal`] takes.
pub const REFUSAL_REASONS: &[&str] = &[
    "unauthenticated",
    "forbidden",
    "cross_site",
    "media_type",
    "depth_limit",
    "memory_budget",
];

/// Counts a refused request (`reason`: one of [`REFUSAL_REASONS`]).
pub fn count_refusal(reason: &'static str) {
    REQUESTS_REFUSED.with_label_values(&[reason]).inc();
}

/// Counts a 400 whose message is a depth limit's (each names "the maximum … depth": query,
/// aggregation, PromQL, SQL).
pub fn count_if_depth_limit(message: &str) {
    if message.contains("the maximum") && message.contains(" depth") {
        count_refusal("depth_limit");
    }
}

/// HTTP requests answered, by route template, method and status.
static HTTP_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "shale_http_requests_total",
        "HTTP requests answered, by route (the route's template, `unmatched` when none matched), method and status code.",
        &["route", "method", "status"]
    )
    .expect("metric registered once")
});

/// Time to answer HTTP requests (until the response's head), by route template and method.
static HTTP_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "shale_http_request_duration_seconds",
        "Time from a request to its response's head, by route (template) and method.",
        &["route", "method"],
        vec![
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0
        ]
    )
    .expect("metric registered once")
});

/// The process's resident memory, CPU seconds, open files and threads (Linux), registered
/// once.
static PROCESS: LazyLock<()> = LazyLock::new(|| {
    #[cfg(target_os = "linux")]
    {
        let collector = prometheus::process_collector::ProcessCollector::for_self();
        if let Err(err) = prometheus::register(Box::new(collector)) {
            tracing::warn!(%err, "process metrics not registered");
        }
    }
});

/// The states a split is counted in.
const SPLIT_STATES: [SplitState; 3] = [
    SplitState::Staged,
    SplitState::Published,
    SplitState::MarkedForDeletion,
];

/// Registers every metric of the node, with the label values known in advance at zero, so a
/// scrape shows every family from the start.
pub fn register_all() {
    LazyLock::force(&SPLIT_CACHE);
    LazyLock::force(&RANGE_CACHE);
    LazyLock::force(&PARTIAL_CACHE);
    LazyLock::force(&COLUMN_CACHE);
    LazyLock::force(&SPLITS_BY_STATE);
    LazyLock::force(&SPLITS_BY_SCOPE);
    LazyLock::force(&SPLIT_BYTES_BY_STATE);
    LazyLock::force(&SPLIT_DOCS_BY_STATE);
    LazyLock::force(&SPLITS_BY_LEVEL);
    LazyLock::force(&WRITE_AMPLIFICATION);
    LazyLock::force(&METRIC_SAMPLES_INGESTED);
    LazyLock::force(&METRIC_SAMPLES_REFUSED);
    LazyLock::force(&HTTP_REQUESTS);
    LazyLock::force(&HTTP_DURATION);
    LazyLock::force(&PROCESS);
    #[cfg(feature = "sql")]
    LazyLock::force(&SQL_QUERIES);
    for reason in REFUSAL_REASONS {
        REQUESTS_REFUSED.with_label_values(&[reason]);
    }
    for protocol in ["remote_write", "otlp"] {
        METRIC_SAMPLES_INGESTED.with_label_values(&[protocol]);
        METRIC_SAMPLES_REFUSED.with_label_values(&[protocol]);
    }
    for stat in ["hits", "misses", "bytes", "splits", "downloaded_bytes"] {
        SPLIT_CACHE.with_label_values(&[stat]);
    }
    for stat in ["fetched_bytes", "fetches", "hit_bytes", "bytes"] {
        RANGE_CACHE.with_label_values(&[stat]);
    }
    for stat in ["bytes", "entries"] {
        PARTIAL_CACHE.with_label_values(&[stat]);
    }
    for stat in ["bytes", "row_groups"] {
        COLUMN_CACHE.with_label_values(&[stat]);
    }
    shale_ingest::metrics::register();
    shale_compaction::service::metrics::register();
    shale_search::register_metrics();
}

/// Middleware: counts every request by route template (never the raw path, so the label
/// values are bounded), method and status, and observes its latency.
pub async fn track_http(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_string();
    let method: &'static str = match request.method().as_str() {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    };
    let started = Instant::now();
    let response = next.run(request).await;
    HTTP_DURATION
        .with_label_values(&[route.as_str(), method])
        .observe(started.elapsed().as_secs_f64());
    HTTP_REQUESTS
        .with_label_values(&[route.as_str(), method, response.status().as_str()])
        .inc();
    response
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
    let partial = node.search.leaf().partial_results();
    for (stat, value) in [
        ("bytes", partial.bytes()),
        ("entries", partial.len() as u64),
    ] {
        PARTIAL_CACHE
            .with_label_values(&[stat])
            .set(i64::try_from(value).unwrap_or(i64::MAX));
    }
    let (row_groups, bytes) = shale_metrics::column_cache::column_cache_usage();
    for (stat, value) in [("bytes", bytes), ("row_groups", row_groups)] {
        COLUMN_CACHE
            .with_label_values(&[stat])
            .set(i64::try_from(value).unwrap_or(i64::MAX));
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
    let indexes = node.metastore.list_indexes().await.unwrap_or_default();
    let node_local = node.config.compaction.scope == shale_config::ScopeMode::NodeLocal;
    let per_index = [
        &*SPLITS_BY_STATE,
        &*SPLITS_BY_SCOPE,
        &*SPLIT_BYTES_BY_STATE,
        &*SPLIT_DOCS_BY_STATE,
        &*SPLITS_BY_LEVEL,
    ];
    for family in per_index {
        family.reset();
    }
    // Every index at zero first, so each per-index series exists before its first split
    // (scopes: the ingest source's partition 0 under the current doc mapping).
    for index in &indexes {
        let index_id = index.index_id();
        for state in SPLIT_STATES {
            SPLITS_BY_STATE.with_label_values(&[index_id, state.as_str()]);
            SPLIT_BYTES_BY_STATE.with_label_values(&[index_id, state.as_str()]);
            SPLIT_DOCS_BY_STATE.with_label_values(&[index_id, state.as_str()]);
        }
        SPLITS_BY_LEVEL.with_label_values(&[index_id, "0"]);
        let scope = shale_types::MergeScope {
            node_id: node_local.then(|| node.config.node_id.clone()),
            index_uid: index.index_uid.clone(),
            source_id: shale_types::INGEST_API_SOURCE_ID.to_string(),
            partition_id: 0,
            doc_mapping_uid: index.index_config.doc_mapping.doc_mapping_uid.clone(),
        };
        for maturity in ["mature", "immature"] {
            SPLITS_BY_SCOPE.with_label_values(&[index_id, scope.to_string().as_str(), maturity]);
        }
    }
    for group in stats {
        let index_id = group.scope.index_uid.index_id.clone();
        let index_id = index_id.as_str();
        let state = group.split_state.as_str();
        let clamp = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        SPLITS_BY_STATE
            .with_label_values(&[index_id, state])
            .add(clamp(group.num_splits));
        SPLIT_BYTES_BY_STATE
            .with_label_values(&[index_id, state])
            .add(clamp(group.size_bytes));
        SPLIT_DOCS_BY_STATE
            .with_label_values(&[index_id, state])
            .add(clamp(group.num_docs));
        if group.split_state != SplitState::Published {
            continue;
        }
        SPLITS_BY_LEVEL
            .with_label_values(&[index_id, group.num_merge_ops.to_string().as_str()])
            .add(clamp(group.num_splits));
        let mut scope = group.scope;
        if !node_local {
            scope.node_id = None;
        }
        let maturity = if group.mature { "mature" } else { "immature" };
        SPLITS_BY_SCOPE
            .with_label_values(&[index_id, scope.to_string().as_str(), maturity])
            .add(clamp(group.num_splits));
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
