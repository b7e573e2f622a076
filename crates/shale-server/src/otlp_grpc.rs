//! OTLP over gRPC: the `opentelemetry.proto.collector.{logs,trace,metrics}.v1` `Export`
//! services on the node's `grpc_listen_address`, so that an OpenTelemetry Collector's `otlp`
//! exporter (gzip by default) can send to Shale. Each export takes the same path as its
//! OTLP/HTTP twin: the same conversion, indexes (`otel-logs-v0_9`, `otel-traces-v0_9`,
//! `otel-metrics-v0_9`, or the one named by the `qw-otel-*-index` metadata), ingest and
//! partial success.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use shale_ingest::{CommitMode, IngestError};
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use crate::auth::{Access, ApiRoutes};
use crate::http::AppState;
use crate::otlp::Signal;
use crate::Node;

/// Largest message accepted (as the HTTP body limit, at least OTLP's usual 4 MiB).
fn max_message_bytes(node: &Node) -> usize {
    (node.config.max_ingest_body_bytes as usize).max(4 << 20)
}

/// The gRPC services with what they need, as routes for the gate ([`crate::auth`]): every
/// service is added here, so none is outside it.
pub fn grpc_routes(node: Arc<Node>) -> ApiRoutes {
    let limit = max_message_bytes(&node);
    let otlp = Otlp { node };
    ApiRoutes::new()
        .grpc_service(
            Access::Write,
            LogsServiceServer::new(otlp.clone())
                .accept_compressed(CompressionEncoding::Gzip)
                .send_compressed(CompressionEncoding::Gzip)
                .max_decoding_message_size(limit),
        )
        .grpc_service(
            Access::Write,
            TraceServiceServer::new(otlp.clone())
                .accept_compressed(CompressionEncoding::Gzip)
                .send_compressed(CompressionEncoding::Gzip)
                .max_decoding_message_size(limit),
        )
        .grpc_service(
            Access::Write,
            MetricsServiceServer::new(otlp)
                .accept_compressed(CompressionEncoding::Gzip)
                .send_compressed(CompressionEncoding::Gzip)
                .max_decoding_message_size(limit),
        )
        .fallback(|| async {
            Status::unimplemented("no such gRPC service on this node")
                .into_http::<axum::body::Body>()
        })
}

/// Serves the gRPC services on `listener` (HTTP/2, behind the same gate as the REST API)
/// until `shutdown` resolves: over TLS when `grpc.tls` is set.
pub async fn serve_grpc(
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let tls = node.config.grpc.tls.clone();
    let app = crate::auth::guard(grpc_routes(node.clone()), AppState::new(node));
    if let Some(tls) = tls {
        let tls = crate::tls::ReloadingTls::start(&tls, crate::tls::Alpn::Grpc)
            .map_err(|err| std::io::Error::other(format!("grpc.tls: {err}")))?;
        return crate::tls::serve_tls(listener, app, tls, shutdown).await;
    }
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

#[derive(Clone)]
struct Otlp {
    node: Arc<Node>,
}

impl Otlp {
    /// The target index: the signal's metadata header, else its default index.
    fn index<T>(&self, signal: Signal, request: &Request<T>) -> Result<String, Status> {
        if !self.node.config.enable_otlp_endpoint {
            return Err(Status::unimplemented(
                "the OTLP endpoint is disabled on this node (`enable_otlp_endpoint: false`)",
            ));
        }
        match request.metadata().get(signal.index_header()) {
            None => Ok(signal.default_index_id().to_string()),
            Some(value) => value
                .to_str()
                .ok()
                .map(str::trim)
                .filter(|id| !id.is_empty())
                .map(str::to_string)
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "invalid `{}` metadata: expected an index id",
                        signal.index_header()
                    ))
                }),
        }
    }

    /// Converts and ingests an export of logs or traces.
    async fn documents(
        &self,
        signal: Signal,
        index_id: &str,
        convert: impl FnOnce() -> crate::otlp::Documents + Send + 'static,
    ) -> Result<(i64, String), Status> {
        let documents = tokio::task::spawn_blocking(convert)
            .await
            .map_err(|err| Status::internal(format!("the OTLP conversion failed: {err}")))?;
        let (rejected, message) = crate::otlp_api::ingest_documents(
            &self.node,
            signal,
            index_id,
            documents,
            CommitMode::Auto,
        )
        .await
        .map_err(status)?;
        Ok((i64::try_from(rejected).unwrap_or(i64::MAX), message))
    }
}

/// The gRPC status of an ingest failure.
fn status(err: IngestError) -> Status {
    let message = err.to_string();
    match err {
        IngestError::IndexNotFound(_) => Status::not_found(message),
        IngestError::WrongIndexKind(_) => Status::invalid_argument(message),
        IngestError::RateLimited(_) => Status::resource_exhausted(message),
        IngestError::NoShardAvailable { .. }
        | IngestError::DeletesUnconfirmed(_)
        | IngestError::StorageUnavailable(_) => Status::unavailable(message),
        _ => Status::internal(message),
    }
}

fn now_nanos() -> u64 {
    u64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos()).unwrap_or_default()
}

#[tonic::async_trait]
impl LogsService for Otlp {
    async fn export(
        &self,
        request: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        let index_id = self.index(Signal::Logs, &request)?;
        let message = request.into_inner();
        let (rejected, error_message) = self
            .documents(Signal::Logs, &index_id, move || {
                crate::otlp::log_documents(message, now_nanos())
            })
            .await?;
        Ok(Response::new(ExportLogsServiceResponse {
            partial_success: (rejected > 0 || !error_message.is_empty()).then_some(
                ExportLogsPartialSuccess {
                    rejected_log_records: rejected,
                    error_message,
                },
            ),
        }))
    }
}

#[tonic::async_trait]
impl TraceService for Otlp {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let index_id = self.index(Signal::Traces, &request)?;
        let message = request.into_inner();
        let (rejected, error_message) = self
            .documents(Signal::Traces, &index_id, move || {
                crate::otlp::span_documents(message)
            })
            .await?;
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: (rejected > 0 || !error_message.is_empty()).then_some(
                ExportTracePartialSuccess {
                    rejected_spans: rejected,
                    error_message,
                },
            ),
        }))
    }
}

#[tonic::async_trait]
impl MetricsService for Otlp {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        let index_id = self.index(Signal::Metrics, &request)?;
        let message = request.into_inner();
        let (translated, records) = tokio::task::spawn_blocking(move || {
            let translated = shale_metrics::otlp::translate(&message);
            let records = crate::prometheus::wal_records(&translated.series);
            (translated, records)
        })
        .await
        .map_err(|err| Status::internal(format!("the OTLP conversion failed: {err}")))?;
        crate::otlp_api::ingest_series(
            &self.node,
            &index_id,
            &translated,
            records,
            CommitMode::Auto,
        )
        .await
        .map_err(status)?;
        let rejected = i64::try_from(translated.rejected_points).unwrap_or(i64::MAX);
        let error_message = translated.reasons.join("; ");
        Ok(Response::new(ExportMetricsServiceResponse {
            partial_success: (rejected > 0 || !error_message.is_empty()).then_some(
                ExportMetricsPartialSuccess {
                    rejected_data_points: rejected,
                    error_message,
                },
            ),
        }))
    }
}
