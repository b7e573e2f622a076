//! The node: wiring of metastore, WAL, storage, ingest and search ([`Node`]), and the REST API
//! ([`http::router`]), Quickwit- and Elasticsearch-compatible. The only crate that knows HTTP.

pub mod allocator;
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
pub mod tls;
pub mod ui;

pub use build_info::{build_info, BuildInfo, LONG_VERSION, VERSION_LINE};
pub use data_dir::DataDirLock;
pub use node::{Node, NodeError};

use std::sync::Arc;

/// Serves the REST API of `node` on `listener` until `shutdown` resolves: over TLS when
/// `rest.tls` is set (an error if its files are not usable).
pub async fn serve(
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let tls = node.config.rest.tls.clone();
    // Routes answer with or without a trailing slash, as Quickwit's do: the path is
    // normalized before routing.
    let app = tower_http::normalize_path::NormalizePath::trim_trailing_slash(http::router(node));
    if let Some(tls) = tls {
        let tls = tls::ReloadingTls::start(&tls, tls::Alpn::Rest)
            .map_err(|err| std::io::Error::other(format!("rest.tls: {err}")))?;
        return tls::serve_tls(listener, app, tls, shutdown).await;
    }
    axum::serve(
        listener,
        axum::ServiceExt::<axum::extract::Request>::into_make_service(app),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// Serves only `/health/livez` and `/health/readyz` of `node`, in plaintext, on `listener`
/// (the `health_listen_address`) until `shutdown` resolves; every other path is a 404.
pub async fn serve_health(
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = auth::guard(http::health_routes(), http::AppState::new(node));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
