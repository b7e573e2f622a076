//! `POST /api/v1/_sql`: SQL over the metrics and log indexes (`shale-sql`, DataFusion); log
//! indexes' documents come through the search path ([`SearchDocuments`]). The body is
//! `{"query": "SELECT …", "format": "json" | "arrow"}` (or the query alone as text); the
//! answer is JSON (columns, rows as objects, scan statistics) or an Arrow IPC stream when
//! `format` is `arrow` or the request accepts `application/vnd.apache.arrow.stream`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::auth::{Access, ApiRoutes};
use crate::http::{ApiError, AppState};

/// The Arrow IPC stream media type.
const ARROW_STREAM: &str = "application/vnd.apache.arrow.stream";

/// The SQL route.
pub fn routes() -> ApiRoutes {
    ApiRoutes::new().post("/api/v1/_sql", Access::Read, sql)
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
    )
    .with_documents(Arc::new(SearchDocuments {
        node: state.node.clone(),
    }))
    .with_budget(state.node.memory_budget.clone());
    let max_result_bytes = engine.limits().max_result_bytes;
    let refused = |message: String| {
        if message.contains("query_memory_budget_bytes") {
            crate::metrics::count_refusal("memory_budget");
        }
        ApiError::bad_request(message)
    };
    let output = engine.execute(&query).await.map_err(|err| match err {
        shale_sql::SqlError::Invalid(message) => {
            crate::metrics::count_if_depth_limit(&message);
            ApiError::bad_request(message)
        }
        shale_sql::SqlError::TooLarge(message) => refused(message),
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
        .to_json_bytes(max_result_bytes)
        .map_err(|err| match err {
            shale_sql::SqlError::TooLarge(message) => refused(message),
            other => ApiError::internal(other.to_string()),
        })?;
    Ok(([(header::CONTENT_TYPE, "application/json")], json).into_response())
}

/// The documents of a log index for SQL, read by searches of `*` (splits pruned by time
/// range, delete tasks applied). A search returns at most 10 000 hits, so a time range with
/// more documents is cut in two, again and again, until each part fits in one search.
struct SearchDocuments {
    node: Arc<crate::Node>,
}

impl SearchDocuments {
    async fn search(
        &self,
        index_id: &str,
        (start, end): (Option<i64>, Option<i64>),
        max_hits: usize,
    ) -> Result<shale_search::SearchResponse, String> {
        let request = shale_search::SearchRequest {
            query: "*".to_string(),
            start_timestamp: start,
            end_timestamp: end,
            max_hits,
            ..Default::default()
        };
        self.node
            .search
            .search(index_id, request)
            .await
            .map_err(|err| err.to_string())
    }

    /// The first and last second of the index's published splits.
    async fn span(&self, index_id: &str) -> Result<Option<(i64, i64)>, String> {
        let index = self
            .node
            .metastore
            .index_metadata(index_id)
            .await
            .map_err(|err| err.to_string())?;
        let splits = self
            .node
            .metastore
            .list_splits(
                shale_metastore::ListSplitsQuery::for_index(index.index_uid)
                    .with_states(&[shale_types::SplitState::Published]),
            )
            .await
            .map_err(|err| err.to_string())?;
        let ranges = splits.iter().filter_map(|s| s.split_metadata.time_range);
        Ok(ranges.fold(None, |span, range| match span {
            None => Some((range.start, range.end)),
            Some((start, end)) => Some((start.min(range.start), end.max(range.end))),
        }))
    }
}

#[async_trait::async_trait]
impl shale_sql::DocumentSource for SearchDocuments {
    async fn documents(
        &self,
        index_id: &str,
        request: shale_sql::DocumentsRequest,
    ) -> Result<shale_sql::Documents, String> {
        let page = shale_search::MAX_HITS_LIMIT;
        let bounds = (request.start_timestamp, request.end_timestamp);
        let first = self
            .search(index_id, bounds, page.min(request.max_documents))
            .await?;
        let mut out = shale_sql::Documents {
            num_hits: first.num_hits,
            splits_searched: first.num_splits_searched as u64,
            docs: Vec::new(),
        };
        if first.num_hits as usize <= first.hits.len() || request.max_documents <= first.hits.len()
        {
            out.docs = first.hits;
            return Ok(out);
        }
        if out.num_hits > request.max_documents as u64 {
            // Over the limit: the caller refuses it (or keeps the first page for a LIMIT).
            out.docs = first.hits;
            return Ok(out);
        }
        // More than a page: cut the time range until each part fits in one search.
        let Some((low, high)) = self.span(index_id).await? else {
            return Ok(out);
        };
        let start = request.start_timestamp.unwrap_or(low).max(low);
        let end = request.end_timestamp.unwrap_or(high + 1).min(high + 1);
        // Each part with the hits already known to exceed a page (the whole range: the first
        // search counted them), so that no range is searched twice.
        let mut pending: Vec<(i64, i64, Option<u64>)> = vec![(start, end, Some(out.num_hits))];
        while let Some((start, end, known)) = pending.pop() {
            let num_hits = match known {
                Some(num_hits) => num_hits,
                None => {
                    let response = self
                        .search(index_id, (Some(start), Some(end)), page)
                        .await?;
                    if response.num_hits as usize <= response.hits.len() {
                        out.docs.extend(response.hits);
                        continue;
                    }
                    response.num_hits
                }
            };
            if end - start < 2 {
                return Err(format!(
                    "too many documents: second {start} of `{index_id}` holds {num_hits} \
                     documents, more than SQL reads from one second ({page})"
                ));
            }
            let middle = start + (end - start) / 2;
            // Later part pushed first: parts are read in time order.
            pending.push((middle, end, None));
            pending.push((start, middle, None));
        }
        Ok(out)
    }
}
