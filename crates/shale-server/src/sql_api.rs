//! `POST /api/v1/_sql`: SQL over the metrics indexes (`shale-sql`, DataFusion). The body is
//! `{"query": "SELECT …", "format": "json" | "arrow"}` (or the query alone as text); the
//! answer is JSON (columns, rows as objects, scan statistics) or an Arrow IPC stream when
//! `format` is `arrow` or the request accepts `application/vnd.apache.arrow.stream`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::Value;

use crate::http::{ApiError, AppState};

/// The Arrow IPC stream media type.
const ARROW_STREAM: &str = "application/vnd.apache.arrow.stream";

/// The SQL route.
pub fn routes() -> Router<AppState> {
    Router::new().route("/api/v1/_sql", post(sql))
}

async fn sql(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    match run(state, headers, body).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    }
}

async fn run(state: AppState, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("json"))
        || body.first() == Some(&b'{');
    let (query, format) = if is_json {
        let request: Value = serde_json::from_slice(&body)
            .map_err(|err| ApiError::bad_request(format!("invalid SQL request: {err}")))?;
        let query = request["query"]
            .as_str()
            .ok_or_else(|| {
                ApiError::bad_request("invalid SQL request: `query` (a string) is missing")
            })?
            .to_string();
        let format = request["format"].as_str().map(str::to_string);
        (query, format)
    } else {
        let query = std::str::from_utf8(&body)
            .map_err(|_| ApiError::bad_request("the SQL query is not UTF-8"))?
            .to_string();
        (query, None)
    };
    if query.trim().is_empty() {
        return Err(ApiError::bad_request("empty SQL query"));
    }
    let arrow = match format.as_deref() {
        Some("arrow") => true,
        Some("json") => false,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown format `{other}`: `json` or `arrow`"
            )))
        }
        None => headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains(ARROW_STREAM)),
    };
    let node = state.node.clone();
    let engine = shale_sql::SqlEngine::new(
        state.node.metastore.clone(),
        Arc::new(move |index| node.index_storage(index).map_err(|err| err.to_string())),
    );
    let output = engine.execute(&query).await.map_err(|err| match err {
        shale_sql::SqlError::Invalid(message) | shale_sql::SqlError::TooLarge(message) => {
            ApiError::bad_request(message)
        }
        shale_sql::SqlError::Internal(message) => ApiError::internal(message),
    })?;
    crate::metrics::SQL_QUERIES.inc();
    if arrow {
        let bytes = output
            .to_arrow_ipc()
            .map_err(|err| ApiError::internal(err.to_string()))?;
        return Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, ARROW_STREAM)],
            bytes,
        )
            .into_response());
    }
    let json = output
        .to_json()
        .map_err(|err| ApiError::internal(err.to_string()))?;
    Ok(axum::Json(json).into_response())
}
