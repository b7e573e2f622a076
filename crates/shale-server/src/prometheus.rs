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

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;

use crate::http::{admit_ingest, commit_mode, read_body, ApiError, ApiQuery, AppState};
use crate::otlp::OTEL_METRICS_INDEX_ID;

/// Bytes of samples per WAL record.
const RECORD_TARGET_BYTES: usize = 1 << 20;

/// The remote-write routes (mounted without request decompression).
pub fn write_routes() -> Router<AppState> {
    Router::new()
        .route("/prometheus/api/v1/write", post(default_write))
        .route("/prometheus/{index_id}/api/v1/write", post(index_write))
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
            let records: Vec<Bytes> =
                shale_metrics::wal::encode_records(&decoded.series, RECORD_TARGET_BYTES)
                    .into_iter()
                    .map(Bytes::from)
                    .collect();
            (decoded, records)
        })
    })
    .await
    .map_err(|err| ApiError::internal(format!("decoding the remote write failed: {err}")))?
    .map_err(|err| ApiError::bad_request(err.to_string()))?;
    if !records.is_empty() {
        state
            .node
            .ingest_samples(&index_id, records, commit)
            .await?;
    }
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
