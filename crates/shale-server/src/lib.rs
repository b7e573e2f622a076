//! The node: wiring of metastore, WAL, storage, ingest and search ([`Node`]), and the REST API
//! ([`http::router`]), Quickwit- and Elasticsearch-compatible. The only crate that knows HTTP.

pub mod auth;
pub mod build_info;
pub mod data_dir;
pub mod distributed;
pub mod elastic;
pub mod elastic_read;
pub mod http;
pub mod internal;
pub mod metrics;
pub mod metrics_source;
pub mod node;
pub mod otlp;
pub mod otlp_api;
pub mod otlp_grpc;
pub mod prometheus;
pub mod routing;
#[cfg(feature = "sql")]
pub mod sql_api;
pub mod ui;

pub use build_info::{build_info, BuildInfo, LONG_VERSION, VERSION_LINE};
pub use data_dir::DataDirLock;
pub use node::{Node, NodeError};

use std::sync::Arc;

/// Serves the REST API of `node` on `listener` until `shutdown` resolves.
pub async fn serve(
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Routes answer with or without a trailing slash, as Quickwit's do: the path is
    // normalized before routing.
    let app = tower_http::normalize_path::NormalizePath::trim_trailing_slash(http::router(node));
    axum::serve(
        listener,
        axum::ServiceExt::<axum::extract::Request>::into_make_service(app),
    )
    .with_graceful_shutdown(shutdown)
    .await
}
