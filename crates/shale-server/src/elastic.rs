//! Elasticsearch's `_bulk` API over Shale's ingest: `index` and `create` actions, the
//! `refresh` parameter mapped to commit modes, and a response in Elasticsearch's bulk shape
//! with a status and error per item, so Elasticsearch bulk clients work unchanged.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};
use shale_ingest::IngestError;

use crate::http::{admit_ingest, commit_mode, read_body, ApiError, ApiQuery, AppState};

/// `POST /api/v1/_elastic/_bulk`.
pub async fn bulk(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    bulk_inner(state, None, params, headers, body).await
}

/// `POST /api/v1/_elastic/{index}/_bulk`: actions without `_index` go to `index`.
pub async fn bulk_index(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    bulk_inner(state, Some(index_id), params, headers, body).await
}

/// One item of the bulk request.
struct Item {
    action: String,
    index_id: String,
    doc_id: Option<String>,
    /// Either a document to ingest, or an error already known.
    outcome: Result<Bytes, (u16, &'static str, String)>,
}

async fn bulk_inner(
    state: AppState,
    default_index: Option<String>,
    params: HashMap<String, String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let started = Instant::now();
    let commit = commit_mode(&params, "refresh")?;
    // Refused as a whole (429) before anything is accepted.
    let _admitted = admit_ingest(&state, &headers)?;
    let body = read_body(&state, &headers, body).await?;
    let mut lines = body
        .split(|b| *b == b'\n')
        .filter(|line| line.iter().any(|b| !b.is_ascii_whitespace()));
    let mut items: Vec<Item> = Vec::new();
    let mut line_no = 0usize;
    while let Some(action_line) = lines.next() {
        line_no += 1;
        let action: Value = serde_json::from_slice(action_line).map_err(|err| {
            ApiError::bad_request(format!("malformed action at line {line_no}: {err}"))
        })?;
        let (name, meta) = action
            .as_object()
            .and_then(|o| o.iter().next())
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "malformed action at line {line_no}: expected {{\"index\": {{…}}}}"
                ))
            })?;
        let index_id = meta
            .get("_index")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| default_index.clone());
        let doc_id = meta.get("_id").map(|id| match id {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        let takes_source = matches!(name.as_str(), "index" | "create" | "update");
        let source = if takes_source {
            line_no += 1;
            Some(lines.next().ok_or_else(|| {
                ApiError::bad_request(format!(
                    "action `{name}` at line {} has no document",
                    line_no - 1
                ))
            })?)
        } else {
            None
        };
        let outcome = match (name.as_str(), &index_id, source) {
            (_, None, _) => Err((
                400,
                "action_request_validation_exception",
                "index is missing".to_string(),
            )),
            ("index" | "create", Some(_), Some(source)) => Ok(body.slice_ref(source)),
            (other, Some(_), _) => Err((
                400,
                "illegal_argument_exception",
                format!("action `{other}` is not supported: only `index` and `create` are"),
            )),
        };
        items.push(Item {
            action: name.clone(),
            index_id: index_id.unwrap_or_default(),
            doc_id,
            outcome,
        });
    }

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
        match state.node.dispatcher.ingest(&index_id, docs, commit).await {
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
            let mut body = json!({ "_index": item.index_id });
            if let Some(id) = &item.doc_id {
                body["_id"] = json!(id);
            }
            match &item.outcome {
                Ok(_) => {
                    body["status"] = json!(201);
                    body["result"] = json!("created");
                }
                Err((status, kind, reason)) => {
                    errors = true;
                    body["status"] = json!(status);
                    body["error"] = json!({
                        "type": kind,
                        "reason": reason,
                        "index": item.index_id,
                    });
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
