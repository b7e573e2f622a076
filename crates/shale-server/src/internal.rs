//! The internal API between the nodes of a cluster, served on each node's advertised address
//! under `/internal/v1/` (the version is in the path), and its client.
//!
//! | call | what |
//! |---|---|
//! | `POST /internal/v1/shards/ingest?index_uid&source_id&shard_id&commit[&format=samples]` | append NDJSON documents (or length-prefixed metrics records) to a shard this node hosts; 409 if it is not open here |
//! | `POST /internal/v1/control/round` | the leader runs a control round now (allocates shards) |
//! | `POST /internal/v1/search/leaf` | search some splits for another node's search |
//! | `POST /internal/v1/search/docs` | fetch documents of splits for another node's search |
//! | `POST /internal/v1/metrics/select` | read metrics splits for another node's PromQL query: their series matching a selector in a window |
//! | `POST /internal/v1/metrics/live` | this indexer's samples not yet in published splits, after the query's checkpoint, matching a selector in a window |
//!
//! When the node has a `cluster_secret`, every internal call must carry it in the
//! `x-shale-cluster-secret` header; calls without it get a 401. A node with API tokens and
//! no cluster secret refuses every internal call (see [`crate::auth`]). Requests name
//! indexes by uid only: what the node reads (an index's storage, its config) comes from its
//! own metastore, never from the caller.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use shale_ingest::{CommitMode, IngestError};
use shale_metastore::ShardKey;

use crate::auth::{Access, ApiRoutes};
use crate::http::{commit_mode, ndjson_docs, ApiError, ApiQuery, AppState};
use crate::node::shard_settings;

/// Largest body of an internal call.
const INTERNAL_BODY_LIMIT: usize = 256 << 20;

/// The header carrying the cluster secret.
pub const SECRET_HEADER: &str = "x-shale-cluster-secret";

/// Timeout of an internal call whose answer does not wait for a commit.
const SHORT_CALL: Duration = Duration::from_secs(30);
/// Timeout of an internal call that waits for a commit (`wait_for`, `force`).
const COMMIT_CALL: Duration = Duration::from_secs(600);

/// The internal routes: the gate lets only calls with the cluster secret through
/// ([`Access::Internal`]).
pub fn routes() -> ApiRoutes {
    use Access::Internal;
    ApiRoutes::new()
        .post("/internal/v1/shards/ingest", Internal, shard_ingest)
        .post("/internal/v1/control/round", Internal, control_round)
        .post(
            "/internal/v1/deletes/advance",
            Internal,
            advance_delete_opstamp,
        )
        .post(
            "/internal/v1/search/leaf",
            Internal,
            crate::distributed::leaf_search,
        )
        .post(
            "/internal/v1/search/docs",
            Internal,
            crate::distributed::fetch_docs,
        )
        .post("/internal/v1/metrics/select", Internal, metrics_select)
        .post("/internal/v1/metrics/live", Internal, metrics_live)
        // Leaf requests carry split metadata: allow large bodies.
        .layer(axum::extract::DefaultBodyLimit::max(INTERNAL_BODY_LIMIT))
}

/// Constant-time comparison of two secrets.
pub(crate) fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The records of a `format=samples` body: each after its length (4 bytes little-endian).
fn length_prefixed_records(body: &Bytes) -> Result<Vec<Bytes>, ApiError> {
    let mut records = Vec::new();
    let mut pos = 0;
    while pos < body.len() {
        let len = body
            .get(pos..pos + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| ApiError::bad_request("truncated record length"))?;
        let end = pos + 4 + len;
        if end > body.len() {
            return Err(ApiError::bad_request("truncated record"));
        }
        records.push(body.slice(pos + 4..end));
        pos = end;
    }
    Ok(records)
}

/// `POST /internal/v1/metrics/select`: reads metrics splits placed on this node for another
/// node's PromQL query.
async fn metrics_select(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<serde_json::Value>, ApiError> {
    use crate::metrics_source::{read_splits, request_matchers, SelectRequest, SelectResponse};
    let request: SelectRequest = serde_json::from_slice(&body)
        .map_err(|err| ApiError::bad_request(format!("invalid select request: {err}")))?;
    let matchers = request_matchers(&request).map_err(ApiError::bad_request)?;
    let index = state
        .node
        .metastore
        .index_metadata(&request.index_uid.index_id)
        .await?;
    if index.index_uid != request.index_uid {
        return Err(ApiError::not_found(format!(
            "index `{}` not found",
            request.index_uid
        )));
    }
    let storage = state
        .node
        .index_storage(&index)
        .map_err(|err| ApiError::internal(err.to_string()))?;
    let splits = read_splits(
        &storage,
        &request.splits,
        &matchers,
        request.start_ms,
        request.end_ms,
        request.prune,
    )
    .await
    .map_err(ApiError::internal)?;
    Ok(Json(
        serde_json::to_value(SelectResponse { splits })
            .map_err(|err| ApiError::internal(err.to_string()))?,
    ))
}

/// `POST /internal/v1/metrics/live`: this node's acknowledged samples not yet in published
/// splits, for another node's PromQL query (503 when its view of the index is older than
/// what this node still holds).
async fn metrics_live(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<serde_json::Value>, ApiError> {
    use crate::metrics_source::{read_live, LiveRequest, ReadLiveError};
    let request: LiveRequest = serde_json::from_slice(&body)
        .map_err(|err| ApiError::bad_request(format!("invalid live request: {err}")))?;
    let live = state.node.live.clone();
    let response = tokio::task::spawn_blocking(move || read_live(&live, &request))
        .await
        .map_err(|err| ApiError::internal(format!("reading live samples failed: {err}")))?
        .map_err(|err| match err {
            ReadLiveError::Invalid(message) => ApiError::bad_request(message),
            ReadLiveError::Stale(err) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string())
            }
        })?;
    Ok(Json(
        serde_json::to_value(response).map_err(|err| ApiError::internal(err.to_string()))?,
    ))
}

async fn shard_ingest(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let commit = commit_mode(&params, "commit")?;
    let get = |name: &str| {
        params
            .get(name)
            .cloned()
            .ok_or_else(|| ApiError::bad_request(format!("missing `{name}`")))
    };
    let key = ShardKey {
        index_uid: get("index_uid")?
            .parse()
            .map_err(|err| ApiError::bad_request(format!("invalid `index_uid`: {err}")))?,
        source_id: get("source_id")?,
        shard_id: get("shard_id")?,
    };
    let samples = params.get("format").is_some_and(|f| f == "samples");
    let docs = if samples {
        length_prefixed_records(&body)?
    } else {
        ndjson_docs(&body)
    };
    match state
        .node
        .dispatcher
        .ingest_into_local_shard(&key, docs, samples, commit)
        .await
    {
        Ok(outcome) => Ok(Json(json!({
            "num_ingested": outcome.num_ingested,
            "num_rejected": outcome.num_rejected,
        }))
        .into_response()),
        // The error says whether the documents can be in the WAL: the sender retries on
        // another shard only when they cannot.
        Err(err) => {
            let nothing_appended = err.nothing_appended();
            let error = match err {
                IngestError::ShardNotOpen(_) => {
                    ApiError::new(StatusCode::CONFLICT, err.to_string())
                }
                other => ApiError::from(other),
            };
            Ok((
                error.status,
                Json(json!({
                    "message": error.message,
                    "nothing_appended": nothing_appended,
                })),
            )
                .into_response())
        }
    }
}

async fn control_round(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let node = &state.node;
    let Some(leadership) = node.membership.leadership() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "this node is not the leader",
        ));
    };
    let report = shale_cluster::control::control_round(
        leadership.metastore.as_ref(),
        &node.membership.view(),
        shard_settings(&node.config),
    )
    .await?;
    Ok(Json(json!({
        "opened_shards": report.shards.open.len(),
        "closed_shards": report.shards.close.len(),
        "requeued_merges": report.requeued_tasks.len(),
    })))
}

#[derive(serde::Deserialize, serde::Serialize)]
struct AdvanceOpstamp {
    index_uid: String,
    opstamp: u64,
}

async fn advance_delete_opstamp(
    State(state): State<AppState>,
    axum::Json(body): axum::Json<AdvanceOpstamp>,
) -> Result<Json<Value>, ApiError> {
    let index_uid: shale_types::IndexUid = body
        .index_uid
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid index uid `{}`", body.index_uid)))?;
    state
        .node
        .router
        .delete_opstamps()
        .advance(&index_uid, body.opstamp)
        .await;
    Ok(Json(json!({ "opstamp": body.opstamp })))
}

/// A failed internal call.
#[derive(Debug, thiserror::Error)]
pub enum InternalError {
    /// The node could not be reached: the request was not delivered.
    #[error("node {address} unreachable: {message}")]
    Unreachable {
        /// The node.
        address: String,
        /// Why.
        message: String,
    },
    /// The request was sent but no answer came (timeout, connection lost): whether the node
    /// applied it is unknown.
    #[error("no answer from node {address}: {message}")]
    NoAnswer {
        /// The node.
        address: String,
        /// Why.
        message: String,
    },
    /// The node answered with an error.
    #[error("node {address} answered {status}: {message}")]
    Status {
        /// The node.
        address: String,
        /// The HTTP status.
        status: u16,
        /// Its message.
        message: String,
        /// Its whole answer.
        body: Value,
    },
}

/// Whether an error answer of `shards/ingest` says none of the documents reached the WAL.
fn err_nothing_appended(err: &InternalError) -> bool {
    matches!(err, InternalError::Status { body, .. } if body["nothing_appended"] == true)
}

/// The client side of the internal API.
#[derive(Clone, Debug)]
pub struct InternalClient {
    http: Http,
    secret: Option<String>,
    /// `http` or, when the nodes' REST listeners have TLS, `https`.
    scheme: &'static str,
}

/// The HTTP client of the internal API: fixed for plain HTTP, rebuilt when its TLS files
/// change for HTTPS.
#[derive(Clone, Debug)]
enum Http {
    Plain(reqwest::Client),
    Tls(Arc<crate::tls::ReloadingClient>),
}

impl InternalClient {
    /// A plain HTTP client presenting `secret` (if any) with every call.
    pub fn new(secret: Option<String>) -> Result<Self, reqwest::Error> {
        Ok(InternalClient {
            http: Http::Plain(Self::builder().build()?),
            secret,
            scheme: "http",
        })
    }

    /// A client for nodes whose REST listeners have `tls` (HTTPS, trusting its `ca_path`,
    /// with the node's certificate as client identity under mutual TLS; rebuilt when those
    /// files change), plain HTTP when `None`.
    pub fn with_tls(
        secret: Option<String>,
        tls: Option<&shale_config::TlsConfig>,
    ) -> Result<Self, crate::tls::TlsError> {
        let client_error = |err: reqwest::Error| crate::tls::TlsError::Client(err.to_string());
        let Some(tls) = tls else {
            return Self::new(secret).map_err(client_error);
        };
        Ok(InternalClient {
            http: Http::Tls(crate::tls::ReloadingClient::start(tls, Self::builder)?),
            secret,
            scheme: "https",
        })
    }

    /// The client for one call.
    fn http(&self) -> reqwest::Client {
        match &self.http {
            Http::Plain(client) => client.clone(),
            Http::Tls(reloading) => reloading.current(),
        }
    }

    fn builder() -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(30))
    }

    /// POSTs `body` to `{scheme}://{address}{path}` and returns the JSON answer.
    pub(crate) async fn post(
        &self,
        address: &str,
        path: &str,
        body: reqwest::Body,
        timeout: Duration,
        json_body: bool,
    ) -> Result<Value, InternalError> {
        let mut request = self
            .http()
            .post(format!("{}://{address}{path}", self.scheme))
            .timeout(timeout)
            .body(body);
        if json_body {
            request = request.header("content-type", "application/json");
        }
        if let Some(secret) = &self.secret {
            request = request.header(SECRET_HEADER, secret);
        }
        let response = request.send().await.map_err(|err| {
            if err.is_connect() {
                InternalError::Unreachable {
                    address: address.to_string(),
                    message: err.to_string(),
                }
            } else {
                InternalError::NoAnswer {
                    address: address.to_string(),
                    message: err.to_string(),
                }
            }
        })?;
        let status = response.status().as_u16();
        let value: Value = response
            .json()
            .await
            .map_err(|err| InternalError::NoAnswer {
                address: address.to_string(),
                message: format!("invalid answer: {err}"),
            })?;
        if status != 200 {
            return Err(InternalError::Status {
                address: address.to_string(),
                status,
                message: value["message"].as_str().unwrap_or_default().to_string(),
                body: value,
            });
        }
        Ok(value)
    }

    /// Appends documents (NDJSON lines, already validated) — or with `samples`, metrics
    /// records (each after its length as 4 bytes little-endian) — to `shard` on the node at
    /// `address`, waiting as `commit` says.
    pub async fn ingest(
        &self,
        address: &str,
        shard: &ShardKey,
        docs: &[Bytes],
        samples: bool,
        commit: CommitMode,
    ) -> Result<(), IngestError> {
        let mut body = Vec::with_capacity(docs.iter().map(|d| d.len() + 4).sum());
        for doc in docs {
            if samples {
                body.extend_from_slice(&(doc.len() as u32).to_le_bytes());
                body.extend_from_slice(doc);
            } else {
                body.extend_from_slice(doc);
                body.push(b'\n');
            }
        }
        let commit_name = match commit {
            CommitMode::Auto => "auto",
            CommitMode::WaitFor => "wait_for",
            CommitMode::Force => "force",
        };
        let path = format!(
            "/internal/v1/shards/ingest?index_uid={}&source_id={}&shard_id={}&commit={commit_name}{}",
            encode(&shard.index_uid.to_string()),
            encode(&shard.source_id),
            encode(&shard.shard_id),
            if samples { "&format=samples" } else { "" },
        );
        let timeout = if commit == CommitMode::Auto {
            SHORT_CALL
        } else {
            COMMIT_CALL
        };
        match self.post(address, &path, body.into(), timeout, false).await {
            Ok(_) => Ok(()),
            Err(InternalError::Status {
                status: 409,
                message,
                ..
            }) => Err(IngestError::ShardNotOpen(message)),
            Err(InternalError::Status {
                status: 429,
                message,
                ..
            }) => Err(IngestError::RateLimited(message)),
            Err(InternalError::Status {
                status: 404,
                message,
                ..
            }) => Err(IngestError::IndexNotFound(message)),
            // Sent, but no answer: the documents may be in that shard.
            Err(err @ InternalError::NoAnswer { .. }) => {
                Err(IngestError::OutcomeUnknown(err.to_string()))
            }
            // Refused before the documents reached its WAL (the answer says so, or the
            // request itself was refused): another shard may take them. Any other error
            // answer may come after the append (the pipeline stopped while waiting for the
            // commit, the WAL could not sync): never sent elsewhere.
            Err(err @ InternalError::Status { status, .. }) => {
                if err_nothing_appended(&err) || matches!(status, 400 | 401) {
                    Err(IngestError::Internal(err.to_string()))
                } else {
                    Err(IngestError::OutcomeUnknown(err.to_string()))
                }
            }
            Err(err) => Err(IngestError::Internal(err.to_string())),
        }
    }

    /// Has the node at `address` stamp the documents of `index_uid` it acknowledges from now
    /// on with `opstamp` or later; returns once it does.
    pub async fn advance_delete_opstamp(
        &self,
        address: &str,
        index_uid: &shale_types::IndexUid,
        opstamp: u64,
    ) -> Result<(), InternalError> {
        let body = serde_json::to_vec(&AdvanceOpstamp {
            index_uid: index_uid.to_string(),
            opstamp,
        })
        .unwrap_or_default();
        self.post(
            address,
            "/internal/v1/deletes/advance",
            reqwest::Body::from(body),
            SHORT_CALL,
            true,
        )
        .await
        .map(|_| ())
    }

    /// Asks the leader at `address` to run a control round now.
    pub async fn control_round(&self, address: &str) -> Result<(), InternalError> {
        self.post(
            address,
            "/internal/v1/control/round",
            reqwest::Body::from(""),
            SHORT_CALL,
            false,
        )
        .await
        .map(|_| ())
    }
}

/// Percent-encodes a query parameter value.
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"x"));
        assert_eq!(encode("logs:01AB/x y"), "logs%3A01AB%2Fx%20y");
    }
}
