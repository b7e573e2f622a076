//! Elasticsearch's `_bulk` API over Shale's ingest, as the official clients use it: `POST`
//! and `PUT`, `index` and `create` actions, the `refresh` parameter mapped to commit modes,
//! and responses in Elasticsearch's shapes — a status and an error per item (an invalid index
//! name is a 400 `invalid_index_name_exception` item, an unknown index a 404
//! `index_not_found_exception` item), while a malformed or unknown action line, or an item
//! without an index, rejects the whole request with a 400 (`illegal_argument_exception`
//! "Malformed action/metadata line [N]…", lines numbered without the blank ones, or
//! `action_request_validation_exception`), as Quickwit does.
//! Every response under `/api/v1/_elastic` carries `X-Elastic-Product: Elasticsearch`
//! ([`product_header`]): the 8.x clients refuse to talk to a server without it.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use shale_ingest::IngestError;

use crate::http::{admit_ingest, commit_mode, read_body, ApiError, ApiQuery, AppState};

/// Where the Elasticsearch-compatible API lives.
pub const ELASTIC_PREFIX: &str = "/api/v1/_elastic";

/// Middleware: adds `X-Elastic-Product: Elasticsearch` to every response under
/// [`ELASTIC_PREFIX`], errors included.
pub async fn product_header(request: Request, next: Next) -> Response {
    let elastic = request.uri().path().starts_with(ELASTIC_PREFIX);
    let mut response = next.run(request).await;
    if elastic {
        response.headers_mut().insert(
            HeaderName::from_static("x-elastic-product"),
            HeaderValue::from_static("Elasticsearch"),
        );
    }
    response
}

/// An error in Elasticsearch's shape:
/// `{"error": {"root_cause": [{type, reason}], "type", "reason"}, "status"}`.
#[derive(Debug)]
pub struct EsError {
    /// HTTP status.
    pub status: StatusCode,
    /// Elasticsearch's exception type, e.g. `parse_exception`.
    pub kind: &'static str,
    /// What is wrong.
    pub reason: String,
    /// `Retry-After` seconds (429, 503).
    pub retry_after_secs: Option<u64>,
}

impl EsError {
    /// An error of status `status` and type `kind`.
    pub fn new(status: StatusCode, kind: &'static str, reason: impl Into<String>) -> Self {
        EsError {
            status,
            kind,
            reason: reason.into(),
            retry_after_secs: None,
        }
    }

    /// A 400 of type `kind`.
    pub fn bad_request(kind: &'static str, reason: impl Into<String>) -> Self {
        EsError {
            status: StatusCode::BAD_REQUEST,
            kind,
            reason: reason.into(),
            retry_after_secs: None,
        }
    }
}

impl From<ApiError> for EsError {
    fn from(err: ApiError) -> Self {
        let kind = match err.status.as_u16() {
            400 => "illegal_argument_exception",
            404 => "resource_not_found_exception",
            413 => "content_too_long_exception",
            429 => "es_rejected_execution_exception",
            503 => "unavailable_shards_exception",
            _ => "exception",
        };
        EsError {
            status: err.status,
            kind,
            reason: err.message,
            retry_after_secs: err.retry_after_secs,
        }
    }
}

impl IntoResponse for EsError {
    fn into_response(self) -> Response {
        let cause = json!({ "type": self.kind, "reason": self.reason });
        let body = json!({
            "error": {
                "root_cause": [cause],
                "type": self.kind,
                "reason": self.reason,
            },
            "status": self.status.as_u16(),
        });
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// `POST|PUT /api/v1/_elastic/_bulk`.
pub async fn bulk(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, EsError> {
    bulk_inner(state, None, params, headers, body).await
}

/// `POST|PUT /api/v1/_elastic/{index}/_bulk`: actions without `_index` go to `index`.
pub async fn bulk_index(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, EsError> {
    bulk_inner(state, Some(index_id), params, headers, body).await
}

/// One item of a `_bulk` body, as [`parse_bulk_body`] reads it.
#[derive(Debug)]
pub struct BulkItem {
    /// The action: `index`, `create`, `delete` or `update`.
    pub action: String,
    /// The target index: the action's `_index`, else the URL's.
    pub index_id: String,
    /// The action's `_id` (a non-string one as JSON), else a new ULID.
    pub doc_id: String,
    /// Either the document line to ingest (a slice of the body), or the item's error
    /// already known: (status, Elasticsearch error type, reason).
    pub outcome: Result<Bytes, (u16, &'static str, String)>,
}

/// The actions Elasticsearch knows.
const ACTIONS: [&str; 4] = ["create", "delete", "index", "update"];

/// Why `name` is not a valid index name (Shale's index id rules, which Quickwit's are), if
/// it is not.
fn invalid_index_name(name: &str) -> Option<String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    (!first_ok || !rest_ok || !(3..=255).contains(&name.len())).then(|| {
        format!("Invalid index name [{name}], must match `^[a-zA-Z][a-zA-Z0-9._-]{{2,254}}$`")
    })
}

/// Parses a `_bulk` body (NDJSON: an action line, then a document line unless the action is
/// `delete`) into its items, `default_index` standing for a missing `_index`. A malformed or
/// unknown action line, a missing document line, or an item without an index rejects the
/// whole body (a 400 in Elasticsearch's shape); an invalid index name or an unsupported
/// action is that item's error.
pub fn parse_bulk_body(
    body: &Bytes,
    default_index: Option<&str>,
) -> Result<Vec<BulkItem>, EsError> {
    // Lines are numbered as Quickwit numbers them: blank lines do not count.
    let mut lines = body
        .split(|b| *b == b'\n')
        .filter(|line| line.iter().any(|b| !b.is_ascii_whitespace()))
        .enumerate();
    let mut items: Vec<BulkItem> = Vec::new();
    while let Some((line_index, action_line)) = lines.next() {
        let line_no = line_index + 1;
        let action: Value = serde_json::from_slice(action_line).map_err(|err| {
            EsError::bad_request(
                "illegal_argument_exception",
                format!("Malformed action/metadata line [{line_no}]: {err}"),
            )
        })?;
        let entry = action
            .as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.iter().next());
        let Some((name, meta)) = entry else {
            return Err(EsError::bad_request(
                "illegal_argument_exception",
                format!(
                    "Malformed action/metadata line [{line_no}], expected an object with one \
                     action, e.g. {{\"index\": {{\"_index\": \"logs\"}}}}"
                ),
            ));
        };
        if !ACTIONS.contains(&name.as_str()) {
            return Err(EsError::bad_request(
                "illegal_argument_exception",
                format!(
                    "Malformed action/metadata line [{line_no}], expected one of [create, \
                     delete, index, update] but found [{name}]"
                ),
            ));
        }
        let Some(meta) = meta.as_object() else {
            return Err(EsError::bad_request(
                "illegal_argument_exception",
                format!(
                    "Malformed action/metadata line [{line_no}], expected START_OBJECT after \
                     [{name}]"
                ),
            ));
        };
        let Some(index_id) = meta
            .get("_index")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| default_index.map(str::to_string))
        else {
            return Err(EsError::bad_request(
                "action_request_validation_exception",
                "Validation Failed: 1: index is missing;".to_string(),
            ));
        };
        let doc_id = match meta.get("_id") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            // Elasticsearch makes one up.
            None => shale_types::new_ulid(),
        };
        let source = if name != "delete" {
            match lines.next() {
                Some((_, source)) => Some(source),
                None => {
                    return Err(EsError::bad_request(
                        "illegal_argument_exception",
                        format!("action [{name}] at line [{line_no}] has no document line"),
                    ))
                }
            }
        } else {
            None
        };
        let outcome = match (name.as_str(), source) {
            _ if invalid_index_name(&index_id).is_some() => Err((
                400,
                "invalid_index_name_exception",
                invalid_index_name(&index_id).unwrap_or_default(),
            )),
            ("index" | "create", Some(source)) => Ok(body.slice_ref(source)),
            (other, _) => Err((
                400,
                "illegal_argument_exception",
                format!("action [{other}] is not supported: only [index] and [create] are"),
            )),
        };
        items.push(BulkItem {
            action: name.clone(),
            index_id,
            doc_id,
            outcome,
        });
    }
    Ok(items)
}

async fn bulk_inner(
    state: AppState,
    default_index: Option<String>,
    params: HashMap<String, String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, EsError> {
    let started = Instant::now();
    let commit = commit_mode(&params, "refresh")?;
    // Refused as a whole (429) before anything is accepted.
    let _admitted = admit_ingest(&state, &headers)?;
    let body = read_body(&state, &headers, body).await?;
    let mut items = parse_bulk_body(&body, default_index.as_deref())?;

    // Ingest per index, keeping each document's item number.
    let mut per_index: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        if item.outcome.is_ok() {
            per_index.entry(item.index_id.clone()).or_default().push(i);
        }
    }
    for (index_id, positions) in per_index {
        let docs: Vec<Bytes> = positions
            .iter()
            .filter_map(|&i| items[i].outcome.as_ref().ok().cloned())
            .collect();
        match state.node.ingest(&index_id, docs, commit).await {
            Ok(outcome) => {
                for (&i, result) in positions.iter().zip(outcome.results) {
                    if let Some(err) = result {
                        items[i].outcome =
                            Err((400, "document_parsing_exception", err.to_string()));
                    }
                }
            }
            // Each index's items get their own status: items of other indexes may already be
            // accepted, so the request as a whole must not fail (a retry would duplicate them).
            // Accepted into the WAL (durable, published later) but not yet visible: the items
            // were created; a 500 would make the client send them again.
            Err(IngestError::PipelineStopped) => {}
            Err(err) => {
                let (status, kind, reason) = match &err {
                    IngestError::IndexNotFound(_) => (
                        404,
                        "index_not_found_exception",
                        format!("no such index [{index_id}]"),
                    ),
                    IngestError::RateLimited(_) | IngestError::NoShardAvailable { .. } => {
                        (429, "es_rejected_execution_exception", err.to_string())
                    }
                    IngestError::StorageUnavailable(_) => {
                        (503, "unavailable_shards_exception", err.to_string())
                    }
                    _ => (500, "internal_exception", err.to_string()),
                };
                for &i in &positions {
                    items[i].outcome = Err((status, kind, reason.clone()));
                }
            }
        }
    }

    let mut errors = false;
    let rendered: Vec<Value> = items
        .iter()
        .map(|item| {
            let mut body = json!({ "_index": item.index_id, "_id": item.doc_id });
            match &item.outcome {
                Ok(_) => {
                    body["_version"] = json!(1);
                    body["result"] = json!("created");
                    body["_shards"] = json!({"total": 1, "successful": 1, "failed": 0});
                    body["status"] = json!(201);
                }
                Err((status, kind, reason)) => {
                    errors = true;
                    body["status"] = json!(status);
                    body["error"] = json!({
                        "type": kind,
                        "reason": reason,
                        "index": item.index_id,
                    });
                    if *kind == "index_not_found_exception" {
                        body["error"]["index_uuid"] = json!("_na_");
                        body["error"]["resource.type"] = json!("index_or_alias");
                        body["error"]["resource.id"] = json!(item.index_id);
                    }
                }
            }
            json!({ item.action.clone(): body })
        })
        .collect();
    Ok(Json(json!({
        "took": started.elapsed().as_millis() as u64,
        "errors": errors,
        "items": rendered,
    })))
}
