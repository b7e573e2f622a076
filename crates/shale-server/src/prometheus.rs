//! The Prometheus-compatible endpoints of a metrics index: remote write 1.0 at
//! `POST /prometheus/api/v1/write` (into `otel-metrics-v0_9`) and
//! `POST /prometheus/{index_id}/api/v1/write`.
//!
//! A write body is snappy block format around a protobuf `prometheus.WriteRequest`
//! (`Content-Encoding: snappy`, as every remote-write sender sends). Its valid series are
//! encoded as metrics WAL records and go through the normal ingest path (`?commit=` as for
//! `/ingest`); the answer is `204 No Content` once they are persisted as the commit mode
//! says. Series that cannot be stored (an invalid label name, a missing metric name, native
//! histograms) are counted and named in a `400` answer — after the rest of the request was
//! stored, as Prometheus's own receiver does for out-of-order samples — so that the sender
//! does not retry it. Retryable failures (WAL full, no shard) are `429`/`503`.
//!
//! These routes are mounted outside the gzip request decompression of the other routes:
//! their bodies are snappy.
//!
//! The query API, under `/prometheus/api/v1/` (default metrics index) and
//! `/prometheus/{index_id}/api/v1/`: `query`, `query_range`, `series`, `labels`,
//! `label/{name}/values`, `metadata`, `status/buildinfo`, GET or POST with a form body,
//! answered in Prometheus's JSON shape (`status`, `data`, `errorType`, `error`, `warnings`), so
//! that Grafana's Prometheus data source works with `http://<node>:7280/prometheus`. PromQL is
//! evaluated by `shale_promql` over the index's splits ([`crate::metrics_source`]); the
//! `x-shale-splits-listed|pruned|opened` headers (and `data.stats` with `stats=all`) say how
//! many splits a query listed, skipped, and read (here or on the nodes they are placed on:
//! `x-shale-leaf-calls` counts the calls to those).

use std::collections::{BTreeSet, HashMap};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde_json::{json, Value};
use shale_metastore::{IndexMetadata, MetastoreError};
use shale_metrics::{Labels, Matcher};
use shale_promql::{EngineOptions, PromqlError, QueryOutput, SeriesSource, Value as PromValue};

use crate::metrics_source::SplitSource;

use crate::auth::{Access, ApiRoutes};
use crate::http::{admit_ingest, commit_mode, read_body, ApiError, ApiQuery, AppState};
use crate::otlp::OTEL_METRICS_INDEX_ID;

/// Bytes of samples per WAL record.
const RECORD_TARGET_BYTES: usize = 1 << 20;

/// The remote-write routes (mounted without request decompression).
pub fn write_routes() -> ApiRoutes {
    ApiRoutes::new()
        .post("/prometheus/api/v1/write", Access::Write, default_write)
        .post(
            "/prometheus/{index_id}/api/v1/write",
            Access::Write,
            index_write,
        )
}

/// The WAL records of `series`, about [`RECORD_TARGET_BYTES`] each.
pub(crate) fn wal_records(series: &[(Labels, Vec<shale_metrics::Sample>)]) -> Vec<Bytes> {
    shale_metrics::wal::encode_records(series, RECORD_TARGET_BYTES)
        .into_iter()
        .map(Bytes::from)
        .collect()
}

/// Hands metrics records to a shard of `index_id`, waiting as `commit` says; an empty request
/// with `commit=force` still cuts the shard's batch.
pub(crate) async fn ingest_records(
    node: &crate::Node,
    index_id: &str,
    records: Vec<Bytes>,
    commit: shale_ingest::CommitMode,
) -> Result<(), shale_ingest::IngestError> {
    if !records.is_empty() || commit == shale_ingest::CommitMode::Force {
        node.ingest_samples(index_id, records, commit).await?;
    }
    Ok(())
}

async fn default_write(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    remote_write(
        state,
        OTEL_METRICS_INDEX_ID.to_string(),
        params,
        headers,
        body,
    )
    .await
}

async fn index_write(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    remote_write(state, index_id, params, headers, body).await
}

async fn remote_write(
    state: AppState,
    index_id: String,
    params: HashMap<String, String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let commit = commit_mode(&params, "commit")?;
    if let Some(encoding) = headers.get(header::CONTENT_ENCODING) {
        let encoding = encoding.to_str().unwrap_or_default().trim();
        if !encoding.eq_ignore_ascii_case("snappy") {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "unsupported Content-Encoding `{encoding}`: remote write bodies are snappy"
                ),
            ));
        }
    }
    let _admitted = admit_ingest(&state, &headers)?;
    let body = read_body(&state, &headers, body).await?;
    // Decompressing, decoding and encoding records is CPU work: off the async workers.
    let (decoded, records) = tokio::task::spawn_blocking(move || {
        shale_metrics::remote_write::decode_remote_write(&body).map(|decoded| {
            let records = wal_records(&decoded.series);
            (decoded, records)
        })
    })
    .await
    .map_err(|err| ApiError::internal(format!("decoding the remote write failed: {err}")))?
    .map_err(|err| ApiError::bad_request(err.to_string()))?;
    ingest_records(&state.node, &index_id, records, commit).await?;
    state
        .node
        .record_metric_metadata(&index_id, &decoded.metadata)
        .await?;
    crate::metrics::METRIC_SAMPLES_INGESTED
        .with_label_values(&["remote_write"])
        .inc_by(decoded.num_samples);
    let refused = decoded.refused_series + decoded.refused_histograms;
    if refused > 0 {
        crate::metrics::METRIC_SAMPLES_REFUSED
            .with_label_values(&["remote_write"])
            .inc_by(refused);
        return Err(ApiError::bad_request(format!(
            "{} samples stored; {} series and {} native histogram samples refused: {}",
            decoded.num_samples,
            decoded.refused_series,
            decoded.refused_histograms,
            decoded.reasons.join("; ")
        )));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

// ----- the query API -----

/// The Prometheus HTTP API routes (GET, and POST with form bodies), for the default metrics
/// index and for a named one.
pub fn query_routes() -> ApiRoutes {
    use Access::{Admin, Read};
    let mut routes = ApiRoutes::new();
    for prefix in ["/prometheus/api/v1", "/prometheus/{index_id}/api/v1"] {
        routes = routes
            .get_post(&format!("{prefix}/query"), Read, query)
            .get_post(&format!("{prefix}/query_range"), Read, query_range)
            .get_post(&format!("{prefix}/series"), Read, series)
            .get_post(&format!("{prefix}/labels"), Read, labels)
            .get(
                &format!("{prefix}/label/{{name}}/values"),
                Read,
                label_values,
            )
            .get(&format!("{prefix}/metadata"), Read, metadata)
            .post_put(
                &format!("{prefix}/admin/tsdb/delete_series"),
                Admin,
                delete_series,
            )
            .post_put(
                &format!("{prefix}/admin/tsdb/clean_tombstones"),
                Admin,
                clean_tombstones,
            )
            .get(
                &format!("{prefix}/status/buildinfo"),
                Access::Authenticated,
                buildinfo,
            );
    }
    routes
}

/// An answer in Prometheus's error shape.
#[derive(Debug)]
pub struct PromError {
    status: StatusCode,
    error_type: &'static str,
    message: String,
}

impl PromError {
    fn bad_data(message: impl Into<String>) -> Self {
        PromError {
            status: StatusCode::BAD_REQUEST,
            error_type: "bad_data",
            message: message.into(),
        }
    }

    fn internal(message: impl Into<String>) -> Self {
        PromError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            error_type: "internal",
            message: message.into(),
        }
    }
}

impl From<PromqlError> for PromError {
    fn from(err: PromqlError) -> Self {
        let (status, error_type) = match &err {
            PromqlError::BadData(message) => {
                crate::metrics::count_if_depth_limit(message);
                (StatusCode::BAD_REQUEST, "bad_data")
            }
            PromqlError::Execution(_) | PromqlError::TooManySamples(_) => {
                (StatusCode::UNPROCESSABLE_ENTITY, "execution")
            }
            PromqlError::OverBudget(_) => {
                crate::metrics::count_refusal("memory_budget");
                (StatusCode::UNPROCESSABLE_ENTITY, "execution")
            }
            PromqlError::Timeout(_) => (StatusCode::SERVICE_UNAVAILABLE, "timeout"),
            PromqlError::Source(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            PromqlError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        };
        PromError {
            status,
            error_type,
            message: err.to_string(),
        }
    }
}

impl IntoResponse for PromError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({
                "status": "error",
                "errorType": self.error_type,
                "error": self.message,
            })),
        )
            .into_response()
    }
}

type PromResult = Result<Response, PromError>;

/// The parameters of a request: the query string's, then a form body's (repeated keys kept).
struct Params(Vec<(String, String)>);

impl Params {
    fn read(uri: &axum::http::Uri, headers: &HeaderMap, body: &[u8]) -> Params {
        let mut pairs: Vec<(String, String)> = uri
            .query()
            .map(|q| {
                url::form_urlencoded::parse(q.as_bytes())
                    .into_owned()
                    .collect()
            })
            .unwrap_or_default();
        let form = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
        if form {
            pairs.extend(url::form_urlencoded::parse(body).into_owned());
        }
        Params(pairs)
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
            .collect()
    }
}

/// A time parameter: Unix seconds (with a fraction) or RFC 3339, in milliseconds.
fn parse_time(name: &str, text: &str) -> Result<i64, PromError> {
    if let Ok(secs) = text.parse::<f64>() {
        if secs.is_finite() {
            return Ok((secs * 1000.0).round() as i64);
        }
    }
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
        .map_err(|_| {
            PromError::bad_data(format!(
                "invalid parameter \"{name}\": cannot parse \"{text}\" to a valid timestamp"
            ))
        })
}

/// A duration parameter: seconds (with a fraction) or a Prometheus duration (`1h30m`), in
/// milliseconds.
fn parse_duration_ms(name: &str, text: &str) -> Result<i64, PromError> {
    let invalid = || {
        PromError::bad_data(format!(
            "invalid parameter \"{name}\": cannot parse \"{text}\" to a valid duration"
        ))
    };
    if let Ok(secs) = text.parse::<f64>() {
        if !secs.is_finite() || secs.abs() > (i64::MAX / 1000) as f64 {
            return Err(invalid());
        }
        return Ok((secs * 1000.0).round() as i64);
    }
    let mut total: i64 = 0;
    let mut rest = text;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 {
            return Err(invalid());
        }
        let value: i64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let (unit_ms, len) = if rest.starts_with("ms") {
            (1, 2)
        } else {
            match rest.chars().next() {
                Some('s') => (1_000, 1),
                Some('m') => (60_000, 1),
                Some('h') => (3_600_000, 1),
                Some('d') => (86_400_000, 1),
                Some('w') => (604_800_000, 1),
                Some('y') => (31_536_000_000, 1),
                _ => return Err(invalid()),
            }
        };
        rest = &rest[len..];
        total = value
            .checked_mul(unit_ms)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(invalid)?;
    }
    Ok(total)
}

/// A float as Prometheus writes sample values (see [`shale_promql::go_format::sample_value`]).
pub fn format_value(value: f64) -> String {
    shale_promql::go_format::sample_value(value)
}

fn labels_json(labels: &Labels) -> Value {
    Value::Object(
        labels
            .iter()
            .map(|(name, value)| (name.to_string(), Value::String(value.to_string())))
            .collect(),
    )
}

/// The metrics index of a request (the default one without an index in the path), as it
/// was at the request's `as_of` (time travel) if it has one.
async fn metrics_index(
    state: &AppState,
    index_id: Option<String>,
    params: &Params,
) -> Result<(IndexMetadata, SplitSource), PromError> {
    let index_id = index_id.unwrap_or_else(|| OTEL_METRICS_INDEX_ID.to_string());
    // The index as this node last saw it, while its version holds (no metastore read of
    // its splits and delete tasks per query).
    let view = match state.node.search.index_view(&index_id).await {
        Ok(view) => view,
        Err(shale_search::SearchError::IndexNotFound(_)) => {
            return Err(PromError {
                status: StatusCode::NOT_FOUND,
                error_type: "not_found",
                message: format!("index `{index_id}` not found"),
            })
        }
        Err(err) => return Err(PromError::internal(err.to_string())),
    };
    let index = view.index().clone();
    if index.index_config.metrics.is_none() {
        return Err(PromError::bad_data(format!(
            "`{index_id}` is not a metrics index: PromQL reads indexes with a `metrics` section"
        )));
    }
    let storage = state
        .node
        .index_storage(&index)
        .map_err(|err| PromError::internal(err.to_string()))?;
    let source = SplitSource::new(
        state.node.metastore.clone(),
        storage,
        index.index_uid.clone(),
    )
    .with_leaves(crate::metrics_source::Leaves {
        membership: state.node.membership.clone(),
        client: state.node.client.clone(),
    })
    .with_view(view)
    .with_live(state.node.live.clone());
    let as_of = match params.get("as_of") {
        Some(text) => {
            let ms = parse_time("as_of", text)?;
            let as_of = ms.div_euclid(1000);
            Some(
                index
                    .index_config
                    .check_as_of(as_of, shale_types::now_unix_secs())
                    .map_err(PromError::bad_data)?,
            )
        }
        None => None,
    };
    Ok((index, source.as_of(as_of)))
}

/// The engine's limits for a request (`timeout` shortens the node's).
fn engine_options(params: &Params) -> Result<EngineOptions, PromError> {
    let mut options = EngineOptions::default();
    if let Some(timeout) = params.get("timeout") {
        let ms = parse_duration_ms("timeout", timeout)?;
        if ms > 0 {
            options.timeout = options
                .timeout
                .min(std::time::Duration::from_millis(ms as u64));
        }
    }
    Ok(options)
}

/// A success answer with the split counts in headers (and in `stats` when asked).
fn success(
    data: Value,
    warnings: &[String],
    stats: Option<Value>,
    source: &SplitSource,
) -> Response {
    let mut body = json!({"status": "success", "data": data});
    if let (Some(stats), Value::Object(data)) = (stats, &mut body["data"]) {
        data.insert("stats".to_string(), stats);
    }
    if !warnings.is_empty() {
        body["warnings"] = json!(warnings);
    }
    (split_headers(source), Json(body)).into_response()
}

/// The split counts of a source, as response headers.
fn split_headers(source: &SplitSource) -> [(&'static str, String); 5] {
    let counts = source.stats();
    [
        ("x-shale-splits-listed", counts.splits_listed.to_string()),
        ("x-shale-splits-pruned", counts.splits_pruned.to_string()),
        ("x-shale-splits-opened", counts.splits_opened.to_string()),
        ("x-shale-leaf-calls", counts.leaf_calls.to_string()),
        ("x-shale-live-samples", counts.live_samples.to_string()),
    ]
}

fn query_stats(params: &Params, output: &QueryOutput, source: &SplitSource) -> Option<Value> {
    params.get("stats")?;
    let counts = source.stats();
    Some(json!({
        "samples": {
            "totalQueryableSamples": output.stats.samples_read,
            "peakSamples": output.stats.peak_samples,
        },
        "splits": {
            "listed": counts.splits_listed,
            "pruned": counts.splits_pruned,
            "opened": counts.splits_opened,
            "rowGroupsRead": counts.row_groups_read,
            "rowGroupsPruned": counts.row_groups_pruned,
            "leafCalls": counts.leaf_calls,
        },
        "live": {
            "samples": counts.live_samples,
            "indexerCalls": counts.live_calls,
        },
    }))
}

/// The `query` parameter.
fn query_param(params: &Params) -> Result<&str, PromError> {
    params
        .get("query")
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| PromError::bad_data("invalid parameter \"query\": query must not be empty"))
}

fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

async fn query(
    State(state): State<AppState>,
    index_id: Option<Path<String>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> PromResult {
    let params = Params::read(&uri, &headers, &body);
    let text = query_param(&params)?;
    let time_ms = match params.get("time") {
        Some(t) => parse_time("time", t)?,
        None => now_ms(),
    };
    let (source, options) = prepare(&state, index_id, &params).await?;
    let output = shale_promql::instant_query(&source, text, time_ms, &options).await?;
    Ok(answer(&params, &output, &source))
}

/// The request's metrics index as a source, and the engine's limits.
async fn prepare(
    state: &AppState,
    index_id: Option<Path<String>>,
    params: &Params,
) -> Result<(SplitSource, EngineOptions), PromError> {
    let mut options = engine_options(params)?;
    options.budget = Some(state.node.memory_budget.clone());
    let (_, mut source) = metrics_index(state, index_id.map(|p| p.0), params).await?;
    // A diagnostic: read every split of the window whole (answers must not change).
    if params.get("shale_pruning") == Some("false") {
        source = source.without_pruning();
    }
    Ok((source, options))
}

/// The answer of an evaluated query, its JSON written directly (a matrix can hold a
/// million points: no `Value` tree is built for them).
fn answer(params: &Params, output: &QueryOutput, source: &SplitSource) -> Response {
    let stats = query_stats(params, output, source);
    let mut body: Vec<u8> = Vec::with_capacity(256);
    body.extend_from_slice(b"{\"status\":\"success\",\"data\":");
    write_value(&mut body, &output.value);
    if let Some(stats) = stats {
        // Inside `data`, after the result: reopen the object just closed.
        body.pop();
        body.extend_from_slice(b",\"stats\":");
        write_json(&mut body, &stats);
        body.push(b'}');
    }
    if !output.warnings.is_empty() {
        body.extend_from_slice(b",\"warnings\":");
        write_json(&mut body, &output.warnings);
    }
    body.push(b'}');
    (
        split_headers(source),
        [(
            axum::http::header::CONTENT_TYPE,
            "application/json".to_string(),
        )],
        body,
    )
        .into_response()
}

/// Appends `value` as JSON (what `serde_json` writes).
fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing to a Vec fails only for a type whose `Serialize` fails; these never do.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// Appends a query's value as the Prometheus API writes `data`.
fn write_value(out: &mut Vec<u8>, value: &PromValue) {
    let sample = |out: &mut Vec<u8>, timestamp_ms: i64, value: f64| {
        out.push(b'[');
        write_time(out, timestamp_ms);
        out.extend_from_slice(b",\"");
        out.extend_from_slice(format_value(value).as_bytes());
        out.extend_from_slice(b"\"]");
    };
    match value {
        PromValue::Scalar {
            timestamp_ms,
            value,
        } => {
            out.extend_from_slice(b"{\"resultType\":\"scalar\",\"result\":");
            sample(out, *timestamp_ms, *value);
        }
        PromValue::String {
            timestamp_ms,
            value,
        } => {
            out.extend_from_slice(b"{\"resultType\":\"string\",\"result\":[");
            write_time(out, *timestamp_ms);
            out.push(b',');
            write_json(out, value);
            out.push(b']');
        }
        PromValue::Vector(samples) => {
            out.extend_from_slice(b"{\"resultType\":\"vector\",\"result\":");
            write_list(out, samples, |out, s| {
                out.extend_from_slice(b"{\"metric\":");
                write_labels(out, &s.labels);
                out.extend_from_slice(b",\"value\":");
                sample(out, s.timestamp_ms, s.value);
                out.push(b'}');
            });
        }
        PromValue::Matrix(series) => {
            out.extend_from_slice(b"{\"resultType\":\"matrix\",\"result\":");
            write_list(out, series, |out, s| {
                out.extend_from_slice(b"{\"metric\":");
                write_labels(out, &s.labels);
                out.extend_from_slice(b",\"values\":");
                write_list(out, &s.samples, |out, p| {
                    sample(out, p.timestamp_ms, p.value)
                });
                out.push(b'}');
            });
        }
    }
    out.push(b'}');
}

/// Appends `items` as a JSON array, each written by `item`.
fn write_list<T>(out: &mut Vec<u8>, items: &[T], item: impl Fn(&mut Vec<u8>, &T)) {
    out.push(b'[');
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        item(out, x);
    }
    out.push(b']');
}

/// Appends a timestamp as Prometheus writes it: Unix seconds, a JSON number.
fn write_time(out: &mut Vec<u8>, ms: i64) {
    if ms % 1000 == 0 {
        write_json(out, &(ms / 1000));
    } else {
        write_json(out, &(ms as f64 / 1000.0));
    }
}

/// Appends a label set as a JSON object (in label order).
fn write_labels(out: &mut Vec<u8>, labels: &Labels) {
    out.push(b'{');
    for (i, (name, value)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_json(out, name);
        out.push(b':');
        write_json(out, value);
    }
    out.push(b'}');
}

/// Most points per series of a range query (Prometheus's limit).
const MAX_POINTS: i64 = 11_000;

async fn query_range(
    State(state): State<AppState>,
    index_id: Option<Path<String>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> PromResult {
    let params = Params::read(&uri, &headers, &body);
    let text = query_param(&params)?;
    let required = |name: &str| {
        params
            .get(name)
            .ok_or_else(|| PromError::bad_data(format!("invalid parameter \"{name}\": missing")))
    };
    let start = parse_time("start", required("start")?)?;
    let end = parse_time("end", required("end")?)?;
    if end < start {
        return Err(PromError::bad_data(
            "invalid parameter \"end\": end timestamp must not be before start time",
        ));
    }
    let step = parse_duration_ms("step", required("step")?)?;
    if step <= 0 {
        return Err(PromError::bad_data(
            "invalid parameter \"step\": zero or negative query resolution step widths are not \
             accepted. Try a positive integer",
        ));
    }
    if (end - start) / step > MAX_POINTS {
        return Err(PromError::bad_data(
            "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the \
             query resolution (?step=XX)",
        ));
    }
    let (source, options) = prepare(&state, index_id, &params).await?;
    let output = shale_promql::range_query(&source, text, start, end, step, &options).await?;
    Ok(answer(&params, &output, &source))
}

/// The matcher sets of the `match[]` selectors (a series matches if one set matches).
fn match_params(params: &Params) -> Result<Vec<Vec<Matcher>>, PromError> {
    let mut sets = Vec::new();
    for text in params.all("match[]") {
        sets.extend(
            shale_metrics::parse_selector(text).map_err(|err| {
                PromError::bad_data(format!("invalid parameter \"match[]\": {err}"))
            })?,
        );
    }
    Ok(sets)
}

/// `start`/`end` of a metadata request (default: all time).
fn time_window(params: &Params) -> Result<(i64, i64), PromError> {
    let start = match params.get("start") {
        Some(t) => parse_time("start", t)?,
        None => i64::MIN / 4,
    };
    let end = match params.get("end") {
        Some(t) => parse_time("end", t)?,
        None => i64::MAX / 4,
    };
    Ok((start, end))
}

/// The series of the matcher sets in the window (all series without a set), distinct,
/// sorted by labels.
async fn matching_series(
    source: &SplitSource,
    sets: &[Vec<Matcher>],
    start: i64,
    end: i64,
) -> Result<Vec<Labels>, PromError> {
    let mut found: BTreeSet<Labels> = BTreeSet::new();
    let all = [Vec::new()];
    let sets = if sets.is_empty() { &all[..] } else { sets };
    for set in sets {
        for series in source.select(set, start, end).await? {
            found.insert(series.labels);
        }
    }
    Ok(found.into_iter().collect())
}

async fn series(
    State(state): State<AppState>,
    index_id: Option<Path<String>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> PromResult {
    let params = Params::read(&uri, &headers, &body);
    let sets = match_params(&params)?;
    if sets.is_empty() {
        return Err(PromError::bad_data("no match[] parameter provided"));
    }
    let (start, end) = time_window(&params)?;
    let (_, source) = metrics_index(&state, index_id.map(|p| p.0), &params).await?;
    let found = matching_series(&source, &sets, start, end).await?;
    let data: Vec<Value> = found.iter().map(labels_json).collect();
    Ok(success(json!(data), &[], None, &source))
}

async fn labels(
    State(state): State<AppState>,
    index_id: Option<Path<String>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> PromResult {
    let params = Params::read(&uri, &headers, &body);
    let sets = match_params(&params)?;
    let (start, end) = time_window(&params)?;
    let (_, source) = metrics_index(&state, index_id.map(|p| p.0), &params).await?;
    let found = matching_series(&source, &sets, start, end).await?;
    let names: BTreeSet<&str> = found
        .iter()
        .flat_map(|labels| labels.iter().map(|(name, _)| name))
        .collect();
    Ok(success(json!(names), &[], None, &source))
}

async fn label_values(
    State(state): State<AppState>,
    Path(path): Path<HashMap<String, String>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> PromResult {
    let params = Params::read(&uri, &headers, &[]);
    let name = path.get("name").cloned().unwrap_or_default();
    if !shale_metrics::remote_write::is_valid_label_name(&name) {
        return Err(PromError::bad_data(format!(
            "invalid label name: \"{name}\""
        )));
    }
    let sets = match_params(&params)?;
    let (start, end) = time_window(&params)?;
    let (_, source) = metrics_index(&state, path.get("index_id").cloned(), &params).await?;
    let found = matching_series(&source, &sets, start, end).await?;
    let values: BTreeSet<&str> = found
        .iter()
        .filter_map(|labels| labels.get(&name))
        .collect();
    Ok(success(json!(values), &[], None, &source))
}

/// Metric metadata (type, help, unit) as remote write and OTLP last sent it, by family:
/// `{"<family>": [{"type", "help", "unit"}]}`; `metric` keeps one family, `limit` caps the
/// number of families (`limit_per_metric` is accepted: one entry per family is kept).
async fn metadata(
    State(state): State<AppState>,
    index_id: Option<Path<String>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> PromResult {
    let params = Params::read(&uri, &headers, &[]);
    let limit = match params.get("limit") {
        None | Some("") => None,
        Some(text) => match text.parse::<i64>() {
            // Prometheus: a negative or zero limit means no limit.
            Ok(n) if n > 0 => Some(n as usize),
            Ok(_) => None,
            Err(_) => {
                return Err(PromError::bad_data(format!(
                    "invalid parameter `limit`: {text:?} is not an integer"
                )))
            }
        },
    };
    let metric = params.get("metric").filter(|m| !m.is_empty());
    let (index, source) = metrics_index(&state, index_id.map(|p| p.0), &params).await?;
    let all = state
        .node
        .metastore
        .list_metric_metadata(&index.index_uid)
        .await
        .map_err(|err| PromError::internal(err.to_string()))?;
    let mut data = serde_json::Map::new();
    for entry in all
        .iter()
        .filter(|m| metric.is_none_or(|name| m.metric_family == name))
    {
        if limit.is_some_and(|limit| data.len() >= limit) {
            break;
        }
        data.insert(
            entry.metric_family.clone(),
            json!([{"type": entry.metric_type, "help": entry.help, "unit": entry.unit}]),
        );
    }
    Ok(success(Value::Object(data), &[], None, &source))
}

/// `admin/tsdb/delete_series`: deletes the samples of the series the `match[]` selectors
/// select within `[start, end]` (default: all time up to now); `204` once no query sees them.
/// Purged from the splits by delete compaction; samples written after the call are kept.
async fn delete_series(
    State(state): State<AppState>,
    index_id: Option<Path<String>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> PromResult {
    let params = Params::read(&uri, &headers, &body);
    let selectors: Vec<String> = params
        .all("match[]")
        .into_iter()
        .map(str::to_string)
        .collect();
    if selectors.is_empty() {
        return Err(PromError::bad_data("no match[] parameter provided"));
    }
    match_params(&params)?;
    let start = match params.get("start") {
        Some(t) => parse_time("start", t)?,
        None => i64::MIN / 4,
    };
    let end = match params.get("end") {
        Some(t) => parse_time("end", t)?,
        None => shale_types::clock::now_ms(),
    };
    let index_id = index_id
        .map(|p| p.0)
        .unwrap_or_else(|| OTEL_METRICS_INDEX_ID.to_string());
    state
        .node
        .delete_series(&index_id, &selectors, start, end)
        .await
        .map_err(|err| match err {
            crate::node::NodeError::InvalidRequest(message) => PromError::bad_data(message),
            crate::node::NodeError::Metastore(MetastoreError::NotFound { .. }) => PromError {
                status: StatusCode::NOT_FOUND,
                error_type: "not_found",
                message: format!("index `{index_id}` not found"),
            },
            other => PromError::internal(other.to_string()),
        })?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `admin/tsdb/clean_tombstones`: wakes the compaction planner, which purges deleted samples
/// (delete compaction); `204` at once.
async fn clean_tombstones(State(state): State<AppState>) -> Response {
    state.node.compaction.planner_notify().notify_one();
    StatusCode::NO_CONTENT.into_response()
}

/// The Prometheus version whose API and PromQL this node answers, for clients (Grafana)
/// that adapt to it.
async fn buildinfo() -> Response {
    Json(json!({
        "status": "success",
        "data": {
            "version": "2.42.0",
            "revision": "shale",
            "branch": "",
            "buildUser": "shale",
            "buildDate": "",
            "goVersion": "",
            "application": "shale",
            "shaleVersion": env!("CARGO_PKG_VERSION"),
        },
    }))
    .into_response()
}
