//! The OTLP/HTTP endpoints, at Quickwit's paths: `POST /api/v1/otlp/v1/logs|traces|metrics`
//! (into the index named by the `qw-otel-logs-index` / `qw-otel-traces-index` /
//! `qw-otel-metrics-index` header, else `otel-logs-v0_9` / `otel-traces-v0_9` /
//! `otel-metrics-v0_9`) and `POST /api/v1/{index_id}/otlp/v1/logs|traces|metrics`. Metrics
//! become Prometheus series in a metrics index (see `shale_metrics::otlp`).
//! Bodies are protobuf or OTLP/JSON (gzip or not); the documents go through the normal ingest
//! path (`commit=` as for `/ingest`); the response is in the request's encoding.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::auth::{Access, ApiRoutes};
use crate::http::{admit_ingest, commit_mode, read_body, ApiError, ApiQuery, AppState};
use crate::otlp::{decode_documents, decode_metrics, encode_response, Encoding, Signal};

/// The OTLP/HTTP routes.
pub fn routes() -> ApiRoutes {
    use Access::Write;
    ApiRoutes::new()
        .post("/api/v1/otlp/v1/logs", Write, default_logs)
        .post("/api/v1/otlp/v1/traces", Write, default_traces)
        .post("/api/v1/{index_id}/otlp/v1/logs", Write, index_logs)
        .post("/api/v1/{index_id}/otlp/v1/traces", Write, index_traces)
        .post("/api/v1/otlp/v1/metrics", Write, default_metrics)
        .post("/api/v1/{index_id}/otlp/v1/metrics", Write, index_metrics)
}

async fn default_metrics(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    export(state, Signal::Metrics, None, params, headers, body).await
}

async fn index_metrics(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    export(
        state,
        Signal::Metrics,
        Some(index_id),
        params,
        headers,
        body,
    )
    .await
}

async fn default_logs(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    export(state, Signal::Logs, None, params, headers, body).await
}

async fn default_traces(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    export(state, Signal::Traces, None, params, headers, body).await
}

async fn index_logs(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    export(state, Signal::Logs, Some(index_id), params, headers, body).await
}

async fn index_traces(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    export(state, Signal::Traces, Some(index_id), params, headers, body).await
}

/// The index of a request: the path's, else the signal's header, else the default one.
fn target_index(
    signal: Signal,
    index_id: Option<String>,
    headers: &HeaderMap,
) -> Result<String, ApiError> {
    if let Some(index_id) = index_id {
        return Ok(index_id);
    }
    match headers.get(signal.index_header()) {
        None => Ok(signal.default_index_id().to_string()),
        Some(value) => value
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|index_id| !index_id.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "invalid `{}` header: expected an index id",
                    signal.index_header()
                ))
            }),
    }
}

async fn export(
    state: AppState,
    signal: Signal,
    index_id: Option<String>,
    params: HashMap<String, String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    if !state.node.config.enable_otlp_endpoint {
        return Err(ApiError::not_found(
            "the OTLP endpoint is disabled on this node (`enable_otlp_endpoint: false`)",
        ));
    }
    let commit = commit_mode(&params, "commit")?;
    let index_id = target_index(signal, index_id, &headers)?;
    let content_type = match headers.get(header::CONTENT_TYPE) {
        None => None,
        Some(value) => Some(value.to_str().map_err(|_| {
            ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "the content type is not ASCII",
            )
        })?),
    };
    let encoding = Encoding::from_content_type(content_type)
        .map_err(|err| ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, err.to_string()))?;
    let _admitted = admit_ingest(&state, &headers)?;
    let body = read_body(&state, &headers, body).await?;
    if signal == Signal::Metrics {
        return export_metrics(state, &index_id, encoding, commit, body).await;
    }
    let now_nanos =
        u64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos()).unwrap_or_default();
    // Decoding and converting a large request is CPU work: off the async workers.
    let documents =
        tokio::task::spawn_blocking(move || decode_documents(signal, encoding, &body, now_nanos))
            .await
            .map_err(|err| ApiError::internal(format!("the OTLP conversion failed: {err}")))?
            .map_err(|err| ApiError::bad_request(err.to_string()))?;
    let (num_rejected, message) =
        ingest_documents(&state.node, signal, &index_id, documents, commit).await?;
    let response = encode_response(signal, encoding, num_rejected, &message)
        .map_err(|err| ApiError::internal(err.to_string()))?;
    Ok(([(header::CONTENT_TYPE, encoding.content_type())], response).into_response())
}

/// An OTLP metrics export: the data points become Prometheus series (as Prometheus's OTLP
/// receiver names them) in the metrics index `index_id`; points that cannot be stored are
/// counted in the response's partial success, with why.
async fn export_metrics(
    state: AppState,
    index_id: &str,
    encoding: Encoding,
    commit: shale_ingest::CommitMode,
    body: bytes::Bytes,
) -> Result<Response, ApiError> {
    let (translated, records) = tokio::task::spawn_blocking(move || {
        decode_metrics(encoding, &body).map(|translated| {
            let records = crate::prometheus::wal_records(&translated.series);
            (translated, records)
        })
    })
    .await
    .map_err(|err| ApiError::internal(format!("the OTLP conversion failed: {err}")))?
    .map_err(|err| ApiError::bad_request(err.to_string()))?;
    ingest_series(&state.node, index_id, &translated, records, commit).await?;
    let response = encode_response(
        Signal::Metrics,
        encoding,
        translated.rejected_points,
        &translated.reasons.join("; "),
    )
    .map_err(|err| ApiError::internal(err.to_string()))?;
    Ok(([(header::CONTENT_TYPE, encoding.content_type())], response).into_response())
}

/// Ingests the documents of an OTLP logs or traces export into `index_id`; returns the
/// records rejected (by the conversion or the index) and why, for the partial success.
pub(crate) async fn ingest_documents(
    node: &crate::Node,
    signal: Signal,
    index_id: &str,
    documents: crate::otlp::Documents,
    commit: shale_ingest::CommitMode,
) -> Result<(u64, String), shale_ingest::IngestError> {
    let mut num_rejected = documents.num_rejected;
    let mut messages = Vec::new();
    if !documents.error_message.is_empty() {
        messages.push(documents.error_message);
    }
    if !documents.docs.is_empty() {
        let outcome = node.ingest(index_id, documents.docs, commit).await?;
        if let Some(err) = outcome.results.iter().flatten().next() {
            messages.push(format!(
                "{} {}(s) rejected by index `{index_id}`, the first because: {err}",
                outcome.num_rejected,
                signal.record_name(),
            ));
        }
        num_rejected += outcome.num_rejected as u64;
    }
    Ok((num_rejected, messages.join("; ")))
}

/// Ingests the series of an OTLP metrics export (already encoded as `records`) into the
/// metrics index `index_id`, counting what was stored and refused.
pub(crate) async fn ingest_series(
    node: &crate::Node,
    index_id: &str,
    translated: &shale_metrics::otlp::OtlpSeries,
    records: Vec<bytes::Bytes>,
    commit: shale_ingest::CommitMode,
) -> Result<(), shale_ingest::IngestError> {
    crate::prometheus::ingest_records(node, index_id, records, commit).await?;
    node.record_metric_metadata(index_id, &translated.metadata)
        .await?;
    let samples: u64 = translated.series.iter().map(|(_, s)| s.len() as u64).sum();
    crate::metrics::METRIC_SAMPLES_INGESTED
        .with_label_values(&["otlp"])
        .inc_by(samples);
    crate::metrics::METRIC_SAMPLES_REFUSED
        .with_label_values(&["otlp"])
        .inc_by(translated.rejected_points);
    Ok(())
}
