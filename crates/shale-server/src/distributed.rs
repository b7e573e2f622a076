//! Distributed search, the server's part: the searchers of a cluster as `shale_search` sees
//! them (this node's leaf in process, the others through the internal API), and the internal
//! endpoints that serve other roots' leaf requests.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde_json::Value;
use shale_cluster::Membership;
use shale_config::Role;
use shale_metastore::IndexMetadata;
use shale_search::leaf::{
    FetchDocsRequest, FetchDocsResponse, Leaf, LeafError, LeafRequest, LeafResponse,
};
use shale_search::{NodeCallError, SearchNodes};

use crate::http::{ApiError, AppState};
use crate::internal::InternalClient;

/// Timeout of a leaf request between nodes.
const LEAF_CALL: Duration = Duration::from_secs(60);

/// The live searchers of the cluster, as seen by this node's membership.
pub struct ClusterNodes {
    membership: Arc<Membership>,
    leaf: Arc<Leaf>,
    client: InternalClient,
}

impl ClusterNodes {
    /// Searchers from `membership`'s view; `leaf` serves this node's share in process.
    pub fn new(membership: Arc<Membership>, leaf: Arc<Leaf>, client: InternalClient) -> Self {
        ClusterNodes {
            membership,
            leaf,
            client,
        }
    }

    fn address(&self, node: &str) -> Result<String, NodeCallError> {
        self.membership
            .view()
            .node(node)
            .map(|n| n.advertise_address.clone())
            .ok_or_else(|| NodeCallError::Failed(format!("node {node} is not a member")))
    }

    fn is_self(&self, node: &str) -> bool {
        self.membership.identity().node_id == node
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        node: &str,
        path: &str,
        body: Vec<u8>,
    ) -> Result<T, NodeCallError> {
        let address = self.address(node)?;
        let value = self
            .client
            .post(&address, path, body.into(), LEAF_CALL, true)
            .await
            .map_err(|err| match err {
                // A leaf refusing for its memory budget (see `leaf_error`).
                crate::internal::InternalError::Status {
                    status: 429,
                    message,
                    ..
                } => NodeCallError::OverBudget(message),
                err => NodeCallError::Failed(err.to_string()),
            })?;
        serde_json::from_value(value).map_err(|err| {
            NodeCallError::Failed(format!("node {node} answered in an unknown shape: {err}"))
        })
    }
}

#[async_trait]
impl SearchNodes for ClusterNodes {
    fn searchers(&self) -> Vec<String> {
        let view = self.membership.view();
        let mut searchers: Vec<String> = view
            .live_with_role(Role::Searcher)
            .map(|n| n.node_id.clone())
            .collect();
        searchers.sort();
        searchers
    }

    async fn leaf_search(
        &self,
        node: &str,
        request: LeafRequest,
    ) -> Result<LeafResponse, NodeCallError> {
        if self.is_self(node) {
            return self.leaf.search(request).await.map_err(NodeCallError::from);
        }
        let body =
            serde_json::to_vec(&request).map_err(|err| NodeCallError::Failed(err.to_string()))?;
        self.call(node, "/internal/v1/search/leaf", body).await
    }

    async fn fetch_docs(
        &self,
        node: &str,
        request: FetchDocsRequest,
    ) -> Result<FetchDocsResponse, NodeCallError> {
        if self.is_self(node) {
            return self
                .leaf
                .fetch_docs(request)
                .await
                .map_err(NodeCallError::from);
        }
        let body =
            serde_json::to_vec(&request).map_err(|err| NodeCallError::Failed(err.to_string()))?;
        self.call(node, "/internal/v1/search/docs", body).await
    }
}

fn leaf_error(err: LeafError) -> ApiError {
    match err {
        LeafError::InvalidRequest(message) => ApiError::bad_request(message),
        LeafError::Internal(message) => ApiError::internal(message),
        // 429: the root tells this refusal from a failure by it (no retry elsewhere).
        LeafError::OverBudget(message) => ApiError::too_many_requests(message),
    }
}

/// Parses an internal request body; `what` names it in the 400.
fn parse_request<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|err| ApiError::bad_request(format!("invalid {what} request: {err}")))
}

/// A leaf's answer as the JSON body of an internal response.
fn leaf_response<T: serde::Serialize>(
    response: Result<T, LeafError>,
) -> Result<Json<Value>, ApiError> {
    let response = response.map_err(leaf_error)?;
    Ok(Json(
        serde_json::to_value(response).map_err(|err| ApiError::internal(err.to_string()))?,
    ))
}

/// The index a leaf request names, as this node's metastore has it: what the leaf reads (the
/// index's storage, its mapping) never comes from the caller. 404 for an index (or an
/// incarnation of it) the metastore does not have.
async fn own_index(state: &AppState, named: &IndexMetadata) -> Result<IndexMetadata, ApiError> {
    let index = state
        .node
        .metastore
        .index_metadata(named.index_id())
        .await?;
    if index.index_uid != named.index_uid {
        return Err(ApiError::not_found(format!(
            "index `{}` not found",
            named.index_uid
        )));
    }
    Ok(index)
}

/// `POST /internal/v1/search/leaf`: searches splits for another node's search.
pub async fn leaf_search(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let mut request: LeafRequest = parse_request(&body, "leaf")?;
    request.index = own_index(&state, &request.index).await?;
    leaf_response(state.node.search.leaf().search(request).await)
}

/// `POST /internal/v1/search/docs`: fetches documents for another node's search.
pub async fn fetch_docs(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let mut request: FetchDocsRequest = parse_request(&body, "fetch")?;
    request.index = own_index(&state, &request.index).await?;
    leaf_response(state.node.search.leaf().fetch_docs(request).await)
}
