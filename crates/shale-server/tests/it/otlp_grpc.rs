//! OTLP over gRPC on a real node: the three collector services (logs, traces, metrics) with
//! gzip, as an OpenTelemetry Collector's `otlp` exporter sends them; the records found by
//! search and PromQL; the `qw-otel-*-index` metadata; partial successes; and the OpenTelemetry
//! Python SDK's gRPC exporter (installed by `.ci/run`, skipped elsewhere when missing).

use crate::common;

use std::sync::Arc;

use common::TestNode;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as OtlpValue;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Gauge, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use serde_json::{json, Value};
use tonic::codec::CompressionEncoding;

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(OtlpValue::StringValue(value.to_string())),
        }),
        ..Default::default()
    }
}

fn resource() -> Option<Resource> {
    Some(Resource {
        attributes: vec![kv("service.name", "grpc-svc")],
        ..Default::default()
    })
}

/// Serves OTLP/gRPC for `node` on a free loopback port; returns `http://127.0.0.1:PORT`.
async fn serve_grpc(node: &TestNode) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let node: Arc<shale_server::Node> = node.node.clone();
    tokio::spawn(async move {
        shale_server::otlp_grpc::serve_grpc(node, listener, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (url, stop)
}

async fn instant(node: &TestNode, index: &str, query: &str) -> Value {
    let (status, body) = node
        .get(&format!(
            "/prometheus/{index}/api/v1/query?query={}",
            url::form_urlencoded::byte_serialize(query.as_bytes()).collect::<String>()
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    body["data"]["result"].clone()
}

#[tokio::test]
async fn the_three_collector_services_ingest_over_grpc_with_gzip() {
    let node = TestNode::start().await;
    let (url, _stop) = serve_grpc(&node).await;
    let now = u64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos()).unwrap();

    let mut logs = LogsServiceClient::connect(url.clone())
        .await
        .unwrap()
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip);
    let response = logs
        .export(ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: resource(),
                scope_logs: vec![ScopeLogs {
                    log_records: (0..3)
                        .map(|i| LogRecord {
                            time_unix_nano: now,
                            body: Some(AnyValue {
                                value: Some(OtlpValue::StringValue(format!("grpc line {i}"))),
                            }),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(response.partial_success.is_none(), "{response:?}");

    let mut traces = TraceServiceClient::connect(url.clone()).await.unwrap();
    let response = traces
        .export(ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: resource(),
                scope_spans: vec![ScopeSpans {
                    spans: vec![
                        Span {
                            trace_id: vec![1; 16],
                            span_id: vec![2; 8],
                            name: "checkout".into(),
                            start_time_unix_nano: now,
                            end_time_unix_nano: now + 1_000_000,
                            ..Default::default()
                        },
                        // An id of the wrong length is rejected, the other span kept.
                        Span {
                            trace_id: vec![1; 3],
                            span_id: vec![2; 8],
                            name: "bad".into(),
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.partial_success.unwrap().rejected_spans, 1);

    node.create_index("index_id: grpc-metrics\nmetrics: {}\n")
        .await;
    let mut metrics = MetricsServiceClient::connect(url.clone())
        .await
        .unwrap()
        .send_compressed(CompressionEncoding::Gzip);
    let point = |value: f64| NumberDataPoint {
        time_unix_nano: now,
        start_time_unix_nano: now - 60_000_000_000,
        value: Some(number_data_point::Value::AsDouble(value)),
        ..Default::default()
    };
    let sum = |name: &str, temporality: AggregationTemporality| Metric {
        name: name.into(),
        data: Some(metric::Data::Sum(Sum {
            data_points: vec![point(42.0)],
            aggregation_temporality: temporality as i32,
            is_monotonic: true,
        })),
        ..Default::default()
    };
    let mut request = tonic::Request::new(ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: resource(),
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![
                    sum("jobs.done", AggregationTemporality::Cumulative),
                    sum("jobs.delta", AggregationTemporality::Delta),
                    // No Prometheus name can be made of it: refused, and said so.
                    Metric {
                        name: "..".into(),
                        data: Some(metric::Data::Gauge(Gauge {
                            data_points: vec![point(1.0)],
                        })),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        }],
    });
    request
        .metadata_mut()
        .insert("qw-otel-metrics-index", "grpc-metrics".parse().unwrap());
    let response = metrics.export(request).await.unwrap().into_inner();
    let partial = response.partial_success.unwrap();
    assert_eq!(partial.rejected_data_points, 1);
    assert!(
        partial.error_message.contains("no Prometheus name"),
        "{partial:?}"
    );

    // Commit everything (an empty request with `commit=force` publishes what the shard
    // holds), then read it back.
    for index in ["otel-logs-v0_9", "otel-traces-v0_9"] {
        let (status, body) = node
            .post(&format!("/api/v1/{index}/ingest?commit=force"), "")
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let resp = node
        .client
        .post(node.url("/prometheus/grpc-metrics/api/v1/write?commit=force"))
        .header("Content-Encoding", "snappy")
        .body(shale_metrics::remote_write::encode_remote_write(
            &Default::default(),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    assert_eq!(node.count("otel-logs-v0_9", "body.message:grpc").await, 3);
    assert_eq!(
        node.count("otel-traces-v0_9", "span_name:checkout").await,
        1
    );
    let result = instant(&node, "grpc-metrics", "jobs_done_total").await;
    assert_eq!(result[0]["metric"]["job"], "grpc-svc", "{result}");
    assert_eq!(result[0]["value"][1], "42");
    let result = instant(&node, "grpc-metrics", "jobs_delta_total").await;
    assert_eq!(
        result[0]["value"][1], "42",
        "a delta point, stored as exported"
    );

    // An unknown index is NOT_FOUND.
    let mut request = tonic::Request::new(ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![sum("jobs.done", AggregationTemporality::Cumulative)],
                ..Default::default()
            }],
            ..Default::default()
        }],
    });
    request
        .metadata_mut()
        .insert("qw-otel-metrics-index", "nope".parse().unwrap());
    let mut metrics = MetricsServiceClient::connect(url).await.unwrap();
    let status = metrics.export(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    assert!(status.message().contains("nope"), "{status:?}");
    node.stop().await;
}

/// The OpenTelemetry Python SDK's gRPC exporter (what most SDKs and the Collector speak).
#[tokio::test]
async fn the_python_sdk_grpc_exporter_works() {
    let installed = std::process::Command::new("python3")
        .args([
            "-c",
            "import opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install opentelemetry-exporter-otlp-proto-grpc (.ci/run does)"
        );
        eprintln!("skipped: the OpenTelemetry gRPC exporter is not installed");
        return;
    }
    let node = TestNode::start().await;
    let (url, _stop) = serve_grpc(&node).await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/otel_metrics_sdk.py"
    );
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .env("OTLP_GRPC_URL", url)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the SDK failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // gRPC exports commit on the commit timeout: force it.
    let resp = node
        .client
        .post(node.url("/prometheus/api/v1/write?commit=force"))
        .header("Content-Encoding", "snappy")
        .body(shale_metrics::remote_write::encode_remote_write(
            &Default::default(),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    let result = instant(&node, "otel-metrics-v0_9", "shop_orders_total").await;
    let total: f64 = result
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["value"][1].as_str().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(total, 13.0, "{result}");
    assert_eq!(
        instant(
            &node,
            "otel-metrics-v0_9",
            "http_latency_milliseconds_count"
        )
        .await[0]["value"][1],
        json!("4")
    );
    node.stop().await;
}
