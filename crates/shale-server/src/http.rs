//! The REST API, Quickwit- and Elasticsearch-compatible. Every error body is JSON with a
//! `message`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use shale_config::{ConfigError, IndexConfig, IndexTemplate};
use shale_ingest::{CommitMode, IngestError};
use shale_metastore::{ListSplitsQuery, MetastoreError};
use shale_search::{SearchError, SearchRequest};
use shale_types::{DeleteQuery, DeleteTask, SplitState};

use crate::auth::{Access, ApiRoutes, Credentials};
use crate::node::{Node, NodeError};

/// An API error: a status and a message, rendered `{"message": …}` (with a `Retry-After`
/// header when the client should come back later).
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable cause.
    pub message: String,
    /// Seconds after which a retry may succeed (429, 503).
    pub retry_after_secs: Option<u64>,
}

/// Seconds a client is told to wait when a node limit refused its request.
pub const RETRY_AFTER_SECS: u64 = 1;

impl ApiError {
    /// An error with `status`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            retry_after_secs: None,
        }
    }
    /// A 429 with `Retry-After`.
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
            retry_after_secs: Some(RETRY_AFTER_SECS),
        }
    }
    /// A 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
    /// A 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }
    /// A 500.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(json!({ "message": self.message }))).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        response
    }
}

impl From<MetastoreError> for ApiError {
    fn from(err: MetastoreError) -> Self {
        let status = match &err {
            MetastoreError::NotFound { .. } => StatusCode::NOT_FOUND,
            MetastoreError::AlreadyExists { .. } => StatusCode::BAD_REQUEST,
            MetastoreError::FailedPrecondition(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, err.to_string())
    }
}

impl From<NodeError> for ApiError {
    fn from(err: NodeError) -> Self {
        match err {
            NodeError::Metastore(err) => err.into(),
            NodeError::InvalidRequest(message) => {
                crate::metrics::count_if_depth_limit(&message);
                ApiError::bad_request(message)
            }
            NodeError::Storage(err @ shale_storage::StorageError::InvalidUri { .. }) => {
                ApiError::bad_request(err.to_string())
            }
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl From<IngestError> for ApiError {
    fn from(err: IngestError) -> Self {
        match err {
            IngestError::IndexNotFound(_) => ApiError::not_found(err.to_string()),
            IngestError::WrongIndexKind(_) => ApiError::bad_request(err.to_string()),
            IngestError::RateLimited(_) => ApiError::too_many_requests(err.to_string()),
            IngestError::NoShardAvailable { .. }
            | IngestError::DeletesUnconfirmed(_)
            | IngestError::StorageUnavailable(_) => ApiError {
                retry_after_secs: Some(RETRY_AFTER_SECS),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string())
            },
            IngestError::ShardNotOpen(_) => ApiError::new(StatusCode::CONFLICT, err.to_string()),
            IngestError::OutcomeUnknown(_) => {
                ApiError::new(StatusCode::BAD_GATEWAY, err.to_string())
            }
            IngestError::Metastore(err) => err.into(),
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl From<SearchError> for ApiError {
    fn from(err: SearchError) -> Self {
        match err {
            SearchError::IndexNotFound(_) => ApiError::not_found(err.to_string()),
            SearchError::InvalidRequest(message) => {
                crate::metrics::count_if_depth_limit(&message);
                ApiError::bad_request(message)
            }
            SearchError::TooManyRequests { .. } => ApiError::too_many_requests(err.to_string()),
            SearchError::OverBudget(message) => {
                crate::metrics::count_refusal("memory_budget");
                ApiError::bad_request(message)
            }
            SearchError::Unavailable(_) => ApiError {
                retry_after_secs: Some(RETRY_AFTER_SECS),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string())
            },
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl From<ConfigError> for ApiError {
    fn from(err: ConfigError) -> Self {
        ApiError::bad_request(err.to_string())
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// `Query<T>` whose rejection is a JSON 400 naming the bad parameter.
pub struct ApiQuery<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(value)| ApiQuery(value))
            .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
    }
}

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    /// The node.
    pub node: Arc<Node>,
    /// The tokens the node accepts (for the UI page, which checks its cookie itself).
    pub credentials: Arc<Credentials>,
}

impl AppState {
    /// The state of `node`'s handlers.
    pub fn new(node: Arc<Node>) -> Self {
        let credentials = Arc::new(Credentials::new(&node.config));
        AppState { node, credentials }
    }
}

/// The REST router: every route of every API ([`api_routes`]) behind the gate
/// ([`crate::auth`]), each request counted in `/metrics` ([`crate::metrics::track_http`]),
/// cross-origin reads as `rest.cors_allow_origins` allows.
pub fn router(node: Arc<Node>) -> Router {
    let cors = cors_layer(&node.config.rest.cors_allow_origins);
    let router = crate::auth::guard(api_routes(), AppState::new(node))
        // Elasticsearch's product header on every answer of its API, refusals included.
        .layer(axum::middleware::from_fn(crate::elastic::product_header))
        .layer(axum::middleware::from_fn(crate::metrics::track_http));
    match cors {
        Some(cors) => router.layer(cors),
        None => router,
    }
}

/// CORS for the allowed origins (`*`: any), `None` when none is.
fn cors_layer(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow_origin = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|origin| header::HeaderValue::from_str(origin).ok()),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow_origin)
            .allow_methods(AllowMethods::mirror_request())
            .allow_headers(AllowHeaders::mirror_request())
            .max_age(std::time::Duration::from_secs(3600)),
    )
}

/// Every route of the REST listener with what it needs. Remote-write bodies are snappy:
/// those routes are outside the gzip decompression of the others.
pub fn api_routes() -> ApiRoutes {
    with_middleware(routes()).merge(crate::prometheus::write_routes().layer(
        tower_http::catch_panic::CatchPanicLayer::custom(panic_response),
    ))
}

/// The middleware every route runs under: a panic while handling a request becomes a JSON
/// 500 that says so (the connection and the node survive it).
pub fn with_middleware(routes: ApiRoutes) -> ApiRoutes {
    routes
        // `Content-Encoding: gzip` request bodies (ingest, `_bulk`, searches) are inflated
        // before the handlers read them; other encodings are a 415.
        .layer(tower_http::decompression::RequestDecompressionLayer::new())
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            panic_response,
        ))
}

fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("no message");
    tracing::error!(panic = detail, "a request handler panicked");
    ApiError::internal(format!(
        "internal error: the server failed while handling this request ({detail}); it is a \
         bug, please report it"
    ))
    .into_response()
}

/// The health probes: all the plaintext health listener serves.
pub fn health_routes() -> ApiRoutes {
    ApiRoutes::new()
        .get("/health/livez", Access::Public, || async {
            Json(json!(true))
        })
        .get("/health/readyz", Access::Public, readyz)
}

fn routes() -> ApiRoutes {
    use crate::elastic as es;
    use crate::elastic_read as esr;
    use Access::{Admin, Authenticated, Read, Write};
    ApiRoutes::new()
        .merge(crate::internal::routes())
        .merge(crate::otlp_api::routes())
        .merge(crate::prometheus::query_routes())
        .merge(sql_routes())
        .merge(crate::ui::routes())
        .merge(health_routes())
        .get("/metrics", Read, metrics)
        .get("/api/v1/version", Authenticated, version)
        .get("/api/v1/auth", Authenticated, crate::auth::whoami)
        .get("/api/v1/cluster", Read, cluster_state)
        .post("/api/v1/indexes", Admin, create_index)
        .get("/api/v1/indexes", Read, list_indexes)
        .get("/api/v1/indexes/{index_id}", Read, describe_index)
        .put("/api/v1/indexes/{index_id}", Admin, update_index)
        .delete("/api/v1/indexes/{index_id}", Admin, delete_index)
        .get("/api/v1/indexes/{index_id}/splits", Read, list_splits)
        .get(
            "/api/v1/indexes/{index_id}/compaction",
            Read,
            compaction_status,
        )
        .post(
            "/api/v1/indexes/{index_id}/compact",
            Admin,
            start_compaction,
        )
        .get(
            "/api/v1/indexes/{index_id}/compactions",
            Read,
            list_compactions,
        )
        .get(
            "/api/v1/indexes/{index_id}/compactions/{compaction_id}",
            Read,
            get_compaction,
        )
        .post("/api/v1/templates", Admin, create_template)
        .get("/api/v1/templates", Read, list_templates)
        .get("/api/v1/templates/{template_id}", Read, get_template)
        .put("/api/v1/templates/{template_id}", Admin, update_template)
        .delete("/api/v1/templates/{template_id}", Admin, delete_template)
        .post("/api/v1/{index_id}/ingest", Write, ingest)
        .post("/api/v1/{index_id}/delete-tasks", Admin, create_delete_task)
        .get("/api/v1/{index_id}/delete-tasks", Read, list_delete_tasks)
        .post(
            "/api/v1/indexes/{index_id}/delete-tasks",
            Admin,
            create_delete_task,
        )
        .get(
            "/api/v1/indexes/{index_id}/delete-tasks",
            Read,
            list_delete_tasks,
        )
        .get("/api/v1/{index_id}/search", Read, search_get)
        .post("/api/v1/{index_id}/search", Read, search_post)
        .post_put("/api/v1/_elastic/_bulk", Write, es::bulk)
        .post_put("/api/v1/_elastic/{index_id}/_bulk", Write, es::bulk_index)
        // Shippers check the cluster's version before sending: any role may read it.
        .get("/api/v1/_elastic", Authenticated, esr::cluster_info)
        .get("/api/v1/_elastic/", Authenticated, esr::cluster_info)
        .delete("/api/v1/_elastic/{index_id}", Admin, esr::delete_indexes)
        .get("/api/v1/_elastic/_stats", Read, esr::stats_all)
        .get_post("/api/v1/_elastic/_search/scroll", Read, esr::scroll)
        .get("/api/v1/_elastic/{index_id}/_stats", Read, esr::stats_index)
        .get(
            "/api/v1/_elastic/_cluster/health",
            Read,
            esr::cluster_health,
        )
        .get_post("/api/v1/_elastic/_search", Read, esr::search_all)
        .get_post(
            "/api/v1/_elastic/{index_id}/_search",
            Read,
            esr::search_index,
        )
        .get_post("/api/v1/_elastic/{index_id}/_count", Read, esr::count)
        .get_post("/api/v1/_elastic/_msearch", Read, esr::msearch)
        .get_post(
            "/api/v1/_elastic/{index_id}/_msearch",
            Read,
            esr::msearch_index,
        )
        .get_post("/api/v1/_elastic/_field_caps", Read, esr::field_caps_all)
        .get_post(
            "/api/v1/_elastic/{index_id}/_field_caps",
            Read,
            esr::field_caps_index,
        )
        .get("/api/v1/_elastic/_mapping", Read, esr::mapping_all)
        .get(
            "/api/v1/_elastic/{index_id}/_mapping",
            Read,
            esr::mapping_index,
        )
        .get(
            "/api/v1/_elastic/{index_id}/_mappings",
            Read,
            esr::mapping_index,
        )
        .get("/api/v1/_elastic/_cat/indices", Read, esr::cat_indices_all)
        .get(
            "/api/v1/_elastic/_cat/indices/{index_id}",
            Read,
            esr::cat_indices_index,
        )
        .get(
            "/api/v1/_elastic/_resolve/index/{pattern}",
            Read,
            esr::resolve_index,
        )
        .fallback(|| async { ApiError::not_found("no such route") })
}

async fn readyz(State(state): State<AppState>) -> Response {
    match state.node.metastore.list_indexes().await {
        Ok(_) => Json(json!(true)).into_response(),
        Err(err) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("metastore unavailable: {err}"),
        )
        .into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    crate::metrics::refresh(&state.node).await;
    match crate::metrics::render() {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(err) => ApiError::internal(err).into_response(),
    }
}

/// `GET /api/v1/version`: Quickwit's `{"build": {…}}`, plus `version`, `commit` and
/// `build_date` at the top level.
async fn version() -> Json<Value> {
    let build = crate::build_info();
    Json(json!({
        "version": build.version,
        "commit": build.commit_hash,
        "build_date": build.build_date,
        "build": build,
    }))
}

/// `GET /api/v1/cluster`: members (live and dead), the leader, shards and running merges per
/// node, as this node sees them.
async fn cluster_state(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let node = &state.node;
    let view = node.membership.view();
    let shards = node.metastore.list_shards(None).await?;
    let running = node
        .metastore
        .list_merge_tasks(None, &[shale_metastore::MergeTaskState::Running], None)
        .await?;
    let leader = view.leader_node().map(|n| n.node_id.clone());
    let render = |record: &shale_metastore::NodeRecord| {
        let identity = record.identity().to_string();
        let node_shards: Vec<Value> = shards
            .iter()
            .filter(|shard| shard.node_id == record.node_id)
            .map(|shard| {
                json!({
                    "index_uid": shard.key.index_uid,
                    "source_id": shard.key.source_id,
                    "shard_id": shard.key.shard_id,
                    "shard_state": shard.state,
                })
            })
            .collect();
        let merges = running
            .iter()
            .filter(|task| task.lease_owner.as_deref() == Some(identity.as_str()))
            .count();
        json!({
            "node_id": record.node_id,
            "generation": record.generation,
            "advertise_address": record.advertise_address,
            "roles": record.roles,
            "is_leader": leader.as_deref() == Some(record.node_id.as_str()),
            "last_heartbeat_ms": record.last_heartbeat_ms,
            // A node that left records its last heartbeat at the epoch: no age to show.
            "heartbeat_age_ms": (record.last_heartbeat_ms > 0)
                .then(|| view.observed_at_ms - record.last_heartbeat_ms),
            "shards": node_shards,
            "running_merges": merges,
        })
    };
    Ok(Json(json!({
        "cluster_id": view.cluster_id,
        "self_node_id": view.self_identity.node_id,
        "self_generation": view.self_identity.generation,
        "leader": view.leader_node().map(|n| json!({
            "node_id": n.node_id,
            "generation": n.generation,
            "fencing_token": view.leader.as_ref().map(|l| l.fencing_token),
        })),
        "live_nodes": view.live_nodes().map(render).collect::<Vec<_>>(),
        "dead_nodes": view.dead_nodes().map(render).collect::<Vec<_>>(),
    })))
}

async fn create_index(State(state): State<AppState>, body: Bytes) -> ApiResult<Json<Value>> {
    let config = IndexConfig::parse(&body)?;
    let index = state.node.create_index(config).await?;
    Ok(Json(json!(index)))
}

async fn update_index(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let config = IndexConfig::parse(&body)?;
    let index = state.node.update_index(&index_id, config).await?;
    Ok(Json(json!(index)))
}

/// `POST /api/v1/templates`: records an index template (400 if its id is taken).
async fn create_template(State(state): State<AppState>, body: Bytes) -> ApiResult<Json<Value>> {
    let template = IndexTemplate::parse(&body)?;
    state
        .node
        .metastore
        .create_index_template(template.clone())
        .await?;
    Ok(Json(json!(template)))
}

/// `GET /api/v1/templates`: every template, by id.
async fn list_templates(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let templates = state.node.metastore.list_index_templates().await?;
    Ok(Json(json!(templates)))
}

/// `GET /api/v1/templates/{id}` (404 if unknown).
async fn get_template(
    State(state): State<AppState>,
    Path(template_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let template = state.node.metastore.index_template(&template_id).await?;
    Ok(Json(json!(template)))
}

/// `PUT /api/v1/templates/{id}`: replaces the template (the id of the path wins over the
/// body's; 404 if unknown).
async fn update_template(
    State(state): State<AppState>,
    Path(template_id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let template = IndexTemplate::parse_with_id(&body, &template_id)?;
    state
        .node
        .metastore
        .update_index_template(template.clone())
        .await?;
    Ok(Json(json!(template)))
}

/// `DELETE /api/v1/templates/{id}` (404 if unknown). Indexes created from it stay.
async fn delete_template(
    State(state): State<AppState>,
    Path(template_id): Path<String>,
) -> ApiResult<Json<Value>> {
    state
        .node
        .metastore
        .delete_index_templates(&[template_id])
        .await?;
    Ok(Json(Value::Null))
}

async fn list_indexes(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let indexes = state.node.metastore.list_indexes().await?;
    Ok(Json(json!(indexes)))
}

async fn describe_index(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let index = state.node.metastore.index_metadata(&index_id).await?;
    Ok(Json(json!(index)))
}

async fn delete_index(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let splits = state.node.delete_index(&index_id).await?;
    let files: Vec<Value> = splits
        .iter()
        .map(|s| {
            json!({
                "file_name": s.split_metadata.object_key(),
                "file_size_bytes": s.split_metadata.size_bytes,
            })
        })
        .collect();
    Ok(Json(json!(files)))
}

#[derive(Deserialize)]
struct ListSplitsParams {
    #[serde(default)]
    split_states: Option<String>,
    #[serde(default)]
    start_timestamp: Option<i64>,
    #[serde(default)]
    end_timestamp: Option<i64>,
}

async fn list_splits(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    ApiQuery(params): ApiQuery<ListSplitsParams>,
) -> ApiResult<Json<Value>> {
    let index = state.node.metastore.index_metadata(&index_id).await?;
    let mut query = ListSplitsQuery::for_index(index.index_uid.clone());
    if let Some(states) = &params.split_states {
        for state_name in states.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let split_state = SplitState::parse(state_name).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "unknown split state `{state_name}` (Staged, Published or MarkedForDeletion)"
                ))
            })?;
            query.split_states.push(split_state);
        }
    }
    query.time_range_start = params.start_timestamp;
    query.time_range_end = params.end_timestamp;
    let splits = state.node.metastore.list_splits(query).await?;
    Ok(Json(json!({
        "offset": 0,
        "size": splits.len(),
        "splits": splits,
    })))
}

/// A delete task as the API shows it (Quickwit's shape, with the query as given).
fn render_delete_task(task: &DeleteTask) -> Value {
    json!({
        "create_timestamp": task.create_timestamp,
        "opstamp": task.opstamp,
        "delete_query": {
            "index_uid": task.index_uid.to_string(),
            "query": task.delete_query.query,
            "search_field": task.delete_query.search_field,
            "start_timestamp": task.delete_query.start_timestamp,
            "end_timestamp": task.delete_query.end_timestamp,
        },
    })
}

/// The SQL route (`shale-sql`), when this build has it.
#[cfg(feature = "sql")]
fn sql_routes() -> ApiRoutes {
    crate::sql_api::routes()
}

/// Without the `sql` feature, `POST /api/v1/_sql` says so.
#[cfg(not(feature = "sql"))]
fn sql_routes() -> ApiRoutes {
    ApiRoutes::new().post("/api/v1/_sql", Access::Read, || async {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "this build of shale has no SQL (the `sql` feature of shale-server)",
        )
    })
}

/// `POST /api/v1/{index_id}/delete-tasks`: the body is Quickwit's delete query.
async fn create_delete_task(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let delete_query: DeleteQuery = serde_json::from_slice(&body)
        .map_err(|err| ApiError::bad_request(format!("invalid delete task request: {err}")))?;
    let task = state
        .node
        .create_delete_task(&index_id, delete_query)
        .await?;
    Ok(Json(render_delete_task(&task)))
}

/// `GET /api/v1/{index_id}/delete-tasks`: every delete task of the index, by opstamp.
async fn list_delete_tasks(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let index = state.node.metastore.index_metadata(&index_id).await?;
    let tasks = state
        .node
        .metastore
        .list_delete_tasks(&index.index_uid, 0)
        .await?;
    Ok(Json(Value::Array(
        tasks.iter().map(render_delete_task).collect(),
    )))
}

/// A manual compaction as the API shows it.
fn render_compaction(index_id: &str, compaction: &shale_metastore::Compaction) -> Value {
    let progress = &compaction.progress;
    json!({
        "compaction_id": compaction.compaction_id,
        "index_id": index_id,
        "state": compaction.state.as_str(),
        "request": compaction.request,
        "plan": {
            "total": progress.total,
            "completed": progress.completed,
            "failed": progress.failed,
        },
        "splits_before": progress.splits_before,
        "splits_after": progress.splits_after,
        "bytes_read": progress.bytes_read,
        "bytes_written": progress.bytes_written,
        "error": compaction.error,
        "created_at": compaction.create_timestamp,
        "started_at": compaction.start_timestamp,
        "finished_at": compaction.finish_timestamp,
    })
}

/// `POST /api/v1/indexes/{index_id}/compact`, optional body `{start_timestamp,
/// end_timestamp, force}`: starts a manual compaction, answers its id at once.
async fn start_compaction(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let request: shale_metastore::CompactionRequest = if body.iter().all(u8::is_ascii_whitespace) {
        Default::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|err| ApiError::bad_request(format!("invalid compaction request: {err}")))?
    };
    let compaction = state.node.start_compaction(&index_id, request).await?;
    Ok(Json(json!({
        "compaction_id": compaction.compaction_id,
        "state": compaction.state.as_str(),
    })))
}

async fn list_compactions(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let index = state.node.metastore.index_metadata(&index_id).await?;
    let compactions = state
        .node
        .metastore
        .list_compactions(Some(&index.index_uid), &[])
        .await?;
    Ok(Json(Value::Array(
        compactions
            .iter()
            .map(|c| render_compaction(&index_id, c))
            .collect(),
    )))
}

async fn get_compaction(
    State(state): State<AppState>,
    Path((index_id, compaction_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let index = state.node.metastore.index_metadata(&index_id).await?;
    let compaction = state
        .node
        .metastore
        .list_compactions(Some(&index.index_uid), &[])
        .await?
        .into_iter()
        .find(|c| c.compaction_id == compaction_id)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "compaction `{compaction_id}` of index `{index_id}` not found"
            ))
        })?;
    Ok(Json(render_compaction(&index_id, &compaction)))
}

/// Recent finished merges shown by the compaction endpoint.
const RECENT_MERGES: usize = 20;

#[derive(Deserialize)]
struct CompactionParams {
    /// How many finished merges to show (newest first).
    #[serde(default = "default_recent_merges")]
    recent_merges: usize,
}

fn default_recent_merges() -> usize {
    RECENT_MERGES
}

async fn compaction_status(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    ApiQuery(params): ApiQuery<CompactionParams>,
) -> ApiResult<Json<Value>> {
    use shale_metastore::MergeTaskState as S;
    let metastore = &state.node.metastore;
    let index = metastore.index_metadata(&index_id).await?;
    let uid = Some(&index.index_uid);
    let pending = metastore.list_merge_tasks(uid, &[S::Pending], None).await?;
    let running = metastore.list_merge_tasks(uid, &[S::Running], None).await?;
    let recent = metastore
        .list_merge_tasks(uid, &[S::Succeeded, S::Failed], Some(params.recent_merges))
        .await?;
    let splits = metastore
        .list_splits(
            ListSplitsQuery::for_index(index.index_uid.clone())
                .with_states(&[SplitState::Published]),
        )
        .await?;
    let now = shale_types::now_unix_secs();
    let immature = splits
        .iter()
        .filter(|s| !s.split_metadata.is_mature(now))
        .count();
    Ok(Json(json!({
        "index_id": index_id,
        "scope_mode": state.node.config.compaction.scope,
        "merge_policy": index.index_config.indexing_settings.merge_policy,
        "published_splits": splits.len(),
        "immature_splits": immature,
        "pending_operations": pending.len(),
        "pending": pending,
        "running": running,
        "recent_merges": recent,
    })))
}

/// Admits an ingest request into the node's in-flight budget (its `Content-Length`, or the
/// body limit when unknown), or refuses it with a 429.
pub fn admit_ingest(
    state: &AppState,
    headers: &HeaderMap,
) -> ApiResult<shale_ingest::InFlightPermit> {
    let limit = state.node.config.max_ingest_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    Ok(state
        .node
        .router
        .admit_bytes(declared.unwrap_or(limit).min(limit))?)
}

/// Reads a request body, enforcing the node's limit with a JSON 413.
pub async fn read_body(state: &AppState, headers: &HeaderMap, body: Body) -> ApiResult<Bytes> {
    let limit = state.node.config.max_ingest_body_bytes as usize;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body exceeds the limit of {limit} bytes (max_ingest_body_bytes)"),
        )
    };
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > limit {
            return Err(too_large());
        }
    }
    axum::body::to_bytes(body, limit).await.map_err(|err| {
        let err = err.into_inner();
        if err
            .downcast_ref::<http_body_util::LengthLimitError>()
            .is_some()
        {
            too_large()
        } else {
            // E.g. a `Content-Encoding: gzip` body that is not gzip.
            ApiError::bad_request(format!("could not read the request body: {err}"))
        }
    })
}

/// Parses `commit=` (or `refresh=` for the Elasticsearch API).
pub fn commit_mode(params: &HashMap<String, String>, key: &str) -> ApiResult<CommitMode> {
    match params.get(key) {
        None => Ok(CommitMode::Auto),
        Some(value) => CommitMode::parse(value).ok_or_else(|| {
            ApiError::bad_request(format!(
                "invalid `{key}` value `{value}`: expected auto, wait_for or force"
            ))
        }),
    }
}

/// Splits an NDJSON body into documents (blank lines skipped).
pub fn ndjson_docs(body: &Bytes) -> Vec<Bytes> {
    body.split(|b| *b == b'\n')
        .filter(|line| line.iter().any(|b| !b.is_ascii_whitespace()))
        .map(|line| body.slice_ref(line))
        .collect()
}

async fn ingest(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<Value>> {
    let commit = commit_mode(&params, "commit")?;
    let _admitted = admit_ingest(&state, &headers)?;
    let body = read_body(&state, &headers, body).await?;
    let docs = ndjson_docs(&body);
    let num_docs = docs.len();
    let outcome = state.node.ingest(&index_id, docs.clone(), commit).await?;
    let parse_failures: Vec<Value> = outcome
        .results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().map(|err| (i, err)))
        .map(|(i, err)| {
            json!({
                "doc_index": i,
                "reason": parse_failure_reason(err),
                "message": err.to_string(),
                "document": String::from_utf8_lossy(&docs[i][..docs[i].len().min(1024)]),
            })
        })
        .collect();
    Ok(Json(json!({
        "num_docs_for_processing": num_docs,
        "num_ingested_docs": outcome.num_ingested,
        "num_rejected_docs": outcome.num_rejected,
        "parse_failures": parse_failures,
    })))
}

async fn search_get(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    ApiQuery(request): ApiQuery<SearchRequest>,
) -> ApiResult<Json<shale_search::SearchResponse>> {
    // Serialized as it is: no intermediate JSON tree (a copy of every hit).
    Ok(Json(state.node.search.search(&index_id, request).await?))
}

async fn search_post(
    State(state): State<AppState>,
    Path(index_id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<shale_search::SearchResponse>> {
    let request: SearchRequest = serde_json::from_slice(&body)
        .map_err(|err| ApiError::bad_request(format!("invalid search request: {err}")))?;
    Ok(Json(state.node.search.search(&index_id, request).await?))
}

/// A stable, machine-readable reason for a rejected document (Quickwit-like).
fn parse_failure_reason(err: &shale_index::DocParsingError) -> &'static str {
    use shale_index::DocParsingError as E;
    match err {
        E::TooLarge { .. } => "doc_too_large",
        E::InvalidJson(_) | E::NotAnObject => "invalid_json",
        E::InvalidValue { .. } | E::UnknownField { .. } => "invalid_schema",
        E::MissingTimestamp { .. } | E::InvalidTimestamp { .. } => "invalid_timestamp",
    }
}
