//! The node: wiring of metastore, WAL, storage, ingest and search ([`Node`]), and the REST API
//! ([`http::router`]), Quickwit- and Elasticsearch-compatible. The only crate that knows HTTP.

pub mod distributed;
pub mod elastic;
pub mod elastic_read;
pub mod http;
pub mod internal;
pub mod metrics;
pub mod node;
pub mod routing;

pub use node::{Node, NodeError};

use std::sync::Arc;

/// Serves the REST API of `node` on `listener` until `shutdown` resolves.
pub async fn serve(
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, http::router(node))
        .with_graceful_shutdown(shutdown)
        .await
}
