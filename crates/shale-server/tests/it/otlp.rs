//! OTLP/HTTP ingest on a real node: the OpenTelemetry indexes created at start (or not, with
//! `enable_otlp_endpoint: false`), protobuf and JSON exports of logs and traces (gzip or not)
//! searched back with Quickwit's field names, partial successes, malformed bodies, and other
//! target indexes (path and `qw-otel-*-index` header).

use crate::common;

use std::io::Write;

use common::{config_in, TestNode};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as OtlpValue;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::Event;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use serde_json::{json, Value};

const LOGS: &str = "otel-logs-v0_9";
const TRACES: &str = "otel-traces-v0_9";
/// 2026-05-28T…, in nanoseconds.
const T0: u64 = 1_780_000_000_000_000_000;

fn kv(key: &str, value: OtlpValue) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn string(s: &str) -> OtlpValue {
    OtlpValue::StringValue(s.to_string())
}

fn resource(service: &str) -> Option<Resource> {
    Some(Resource {
        attributes: vec![
            kv("service.name", string(service)),
            kv("host.name", string("host-1")),
        ],
        ..Default::default()
    })
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// POSTs `body` with a content type (and more headers); returns the status, the response's
/// content type and its body.
async fn export(
    node: &TestNode,
    path: &str,
    content_type: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, String, Vec<u8>) {
    let mut request = node
        .client
        .post(node.url(path))
        .header("content-type", content_type)
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (
        status,
        content_type,
        response.bytes().await.unwrap().to_vec(),
    )
}

async fn index_ids(node: &TestNode) -> Vec<String> {
    let (status, body) = node.get("/api/v1/indexes").await;
    assert_eq!(status, 200, "{body}");
    body.as_array()
        .unwrap()
        .iter()
        .map(|index| {
            index["index_config"]["index_id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// Every hit of `query` in `index`, oldest first.
async fn hits(node: &TestNode, index: &str, query: &str, sort_by: &str) -> Vec<Value> {
    let response = node
        .search(
            index,
            json!({"query": query, "max_hits": 100, "sort_by": format!("{sort_by}:asc")}),
        )
        .await;
    response["hits"].as_array().unwrap().clone()
}

/// Two resources (two services), one scope each, three log records: string bodies, a kvlist
/// body, attributes of every type, trace and span ids.
fn logs_request() -> ExportLogsServiceRequest {
    ExportLogsServiceRequest {
        resource_logs: vec![
            ResourceLogs {
                resource: resource("checkout"),
                scope_logs: vec![ScopeLogs {
                    scope: Some(InstrumentationScope {
                        name: "checkout-logger".to_string(),
                        version: "1.2.0".to_string(),
                        ..Default::default()
                    }),
                    log_records: vec![
                        LogRecord {
                            time_unix_nano: T0,
                            observed_time_unix_nano: T0 + 5,
                            severity_number: 9,
                            severity_text: "INFO".to_string(),
                            body: Some(AnyValue {
                                value: Some(string("cart validated for user 42")),
                            }),
                            attributes: vec![
                                kv("http.method", string("GET")),
                                kv("http.status_code", OtlpValue::IntValue(200)),
                                kv("duration_ratio", OtlpValue::DoubleValue(0.25)),
                                kv("cached", OtlpValue::BoolValue(true)),
                                kv(
                                    "tags",
                                    OtlpValue::ArrayValue(ArrayValue {
                                        values: vec![
                                            AnyValue {
                                                value: Some(string("a")),
                                            },
                                            AnyValue {
                                                value: Some(string("b")),
                                            },
                                        ],
                                    }),
                                ),
                            ],
                            trace_id: vec![0xab; 16],
                            span_id: vec![0xcd; 8],
                            flags: 1,
                            ..Default::default()
                        },
                        LogRecord {
                            time_unix_nano: T0 + 1_000_000_000,
                            severity_number: 17,
                            severity_text: "ERROR".to_string(),
                            body: Some(AnyValue {
                                value: Some(string("payment declined for user 42")),
                            }),
                            attributes: vec![kv("http.method", string("POST"))],
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            },
            ResourceLogs {
                resource: resource("payments"),
                scope_logs: vec![ScopeLogs {
                    log_records: vec![LogRecord {
                        time_unix_nano: T0 + 2_000_000_000,
                        severity_number: 13,
                        severity_text: "WARN".to_string(),
                        body: Some(AnyValue {
                            value: Some(OtlpValue::KvlistValue(KeyValueList {
                                values: vec![
                                    kv("message", string("slow acquirer")),
                                    kv("latency_ms", OtlpValue::IntValue(1500)),
                                ],
                            })),
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            },
        ],
    }
}

/// One trace: a root server span with an error, a client child that succeeded; and a span of
/// another trace.
fn traces_request() -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![
            ResourceSpans {
                resource: resource("frontend"),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "http-server".to_string(),
                        ..Default::default()
                    }),
                    spans: vec![
                        Span {
                            trace_id: vec![0x11; 16],
                            span_id: vec![0x01; 8],
                            name: "GET /checkout".to_string(),
                            kind: 2,
                            start_time_unix_nano: T0,
                            end_time_unix_nano: T0 + 1_250_000_000,
                            attributes: vec![kv("http.route", string("/checkout"))],
                            status: Some(Status {
                                code: 2,
                                message: "upstream failed".to_string(),
                            }),
                            events: vec![
                                Event {
                                    time_unix_nano: T0 + 1_000,
                                    name: "retrying upstream".to_string(),
                                    ..Default::default()
                                },
                                Event {
                                    time_unix_nano: T0 + 2_000,
                                    name: "gave up".to_string(),
                                    attributes: vec![kv("attempts", OtlpValue::IntValue(3))],
                                    ..Default::default()
                                },
                            ],
                            ..Default::default()
                        },
                        Span {
                            trace_id: vec![0x11; 16],
                            span_id: vec![0x02; 8],
                            parent_span_id: vec![0x01; 8],
                            name: "call payments".to_string(),
                            kind: 3,
                            start_time_unix_nano: T0 + 100_000_000,
                            end_time_unix_nano: T0 + 400_000_000,
                            status: Some(Status {
                                code: 1,
                                message: String::new(),
                            }),
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            },
            ResourceSpans {
                resource: resource("payments"),
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span {
                        trace_id: vec![0x22; 16],
                        span_id: vec![0x03; 8],
                        name: "charge".to_string(),
                        kind: 1,
                        start_time_unix_nano: T0 + 2_000_000_000,
                        end_time_unix_nano: T0 + 2_000_000_000,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            },
        ],
    }
}

#[tokio::test]
async fn the_otel_indexes_exist_at_start_unless_disabled() {
    let node = TestNode::start().await;
    let ids = index_ids(&node).await;
    assert!(ids.contains(&LOGS.to_string()), "{ids:?}");
    assert!(ids.contains(&TRACES.to_string()), "{ids:?}");
    let (status, logs) = node.get(&format!("/api/v1/indexes/{LOGS}")).await;
    assert_eq!(status, 200);
    assert_eq!(
        logs["index_config"]["doc_mapping"]["timestamp_field"],
        "timestamp_nanos"
    );
    assert_eq!(logs["index_config"]["doc_mapping"]["mode"], "strict");
    // A restart finds them and creates nothing.
    let dir = node.stop().await.unwrap();
    let node = TestNode::start_with(config_in(dir.path())).await;
    assert_eq!(index_ids(&node).await.len(), 3);
    node.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let mut config = config_in(dir.path());
    config.enable_otlp_endpoint = false;
    let node = TestNode::start_with(config).await;
    assert!(index_ids(&node).await.is_empty());
    let (status, _, body) = export(
        &node,
        "/api/v1/otlp/v1/logs",
        "application/x-protobuf",
        &[],
        logs_request().encode_to_vec(),
    )
    .await;
    assert_eq!(status, 404);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("enable_otlp_endpoint"),
        "{body}"
    );
}

#[tokio::test]
async fn nodes_starting_together_create_the_otel_indexes_once() {
    let dir = tempfile::tempdir().unwrap();
    let metastore = format!("sqlite://{}/shared.db", dir.path().display());
    let configs: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|id| {
            let mut config = config_in(&dir.path().join(id));
            config.node_id = id.to_string();
            config.metastore_uri = metastore.clone();
            config.default_index_root_uri = format!("file://{}/indexes", dir.path().display());
            config
        })
        .collect();
    let nodes = futures::future::join_all(configs.into_iter().map(TestNode::start_with)).await;
    let mut ids = index_ids(&nodes[0]).await;
    ids.sort();
    assert_eq!(ids, [LOGS, "otel-metrics-v0_9", TRACES]);
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test]
async fn protobuf_logs_are_indexed_with_quickwit_fields() {
    let node = TestNode::start().await;
    let (status, content_type, body) = export(
        &node,
        "/api/v1/otlp/v1/logs?commit=force",
        "application/x-protobuf",
        &[],
        logs_request().encode_to_vec(),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(content_type, "application/x-protobuf");
    let response = ExportLogsServiceResponse::decode(body.as_slice()).unwrap();
    assert_eq!(response.partial_success, None, "nothing rejected");

    assert_eq!(node.count(LOGS, "*").await, 3);
    assert_eq!(node.count(LOGS, "service_name:checkout").await, 2);
    assert_eq!(node.count(LOGS, "service_name:payments").await, 1);
    assert_eq!(node.count(LOGS, "severity_text:ERROR").await, 1);
    assert_eq!(node.count(LOGS, "severity_number:>=13").await, 2);
    // The default search field is `body.message`, string bodies and kvlist bodies alike.
    assert_eq!(node.count(LOGS, "user").await, 2);
    assert_eq!(node.count(LOGS, "acquirer").await, 1);
    assert_eq!(node.count(LOGS, "body.latency_ms:1500").await, 1);
    // Attributes keep their dotted keys, searchable as paths.
    assert_eq!(node.count(LOGS, "attributes.http.method:GET").await, 1);
    assert_eq!(node.count(LOGS, "attributes.http.status_code:200").await, 1);
    assert_eq!(node.count(LOGS, "attributes.cached:true").await, 1);
    assert_eq!(node.count(LOGS, "attributes.tags:b").await, 1);
    assert_eq!(
        node.count(LOGS, "resource_attributes.host.name:host-1")
            .await,
        3
    );

    let docs = hits(&node, LOGS, "*", "timestamp_nanos").await;
    assert_eq!(docs.len(), 3);
    let first = &docs[0];
    assert_eq!(first["timestamp_nanos"], json!(T0));
    assert_eq!(first["observed_timestamp_nanos"], json!(T0 + 5));
    assert_eq!(first["service_name"], "checkout");
    assert_eq!(first["severity_text"], "INFO");
    assert_eq!(first["severity_number"], 9);
    assert_eq!(
        first["body"],
        json!({"message": "cart validated for user 42"})
    );
    assert_eq!(
        first["attributes"],
        json!({
            "http.method": "GET", "http.status_code": 200, "duration_ratio": 0.25,
            "cached": true, "tags": ["a", "b"]
        })
    );
    assert_eq!(first["trace_id"], "ab".repeat(16));
    assert_eq!(first["span_id"], "cd".repeat(8));
    assert_eq!(first["trace_flags"], 1);
    assert_eq!(first["resource_attributes"], json!({"host.name": "host-1"}));
    assert_eq!(first["scope_name"], "checkout-logger");
    assert_eq!(first["scope_version"], "1.2.0");
    // No ids: no id fields; no observed time: the event time is kept.
    let second = &docs[1];
    assert!(second.get("trace_id").is_none(), "{second}");
    assert_eq!(second["timestamp_nanos"], json!(T0 + 1_000_000_000));
    let third = &docs[2];
    assert_eq!(third["service_name"], "payments");
    assert_eq!(
        third["body"],
        json!({"message": "slow acquirer", "latency_ms": 1500})
    );
    assert!(third.get("scope_name").is_none(), "{third}");
}

#[tokio::test]
async fn protobuf_traces_are_indexed_with_quickwit_fields() {
    let node = TestNode::start().await;
    let (status, content_type, body) = export(
        &node,
        "/api/v1/otlp/v1/traces?commit=force",
        "application/x-protobuf",
        &[],
        traces_request().encode_to_vec(),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(content_type, "application/x-protobuf");
    let response = ExportTraceServiceResponse::decode(body.as_slice()).unwrap();
    assert_eq!(response.partial_success, None);

    assert_eq!(node.count(TRACES, "*").await, 3);
    assert_eq!(node.count(TRACES, "is_root:true").await, 2);
    assert_eq!(node.count(TRACES, "is_root:false").await, 1);
    assert_eq!(node.count(TRACES, "span_status.code:error").await, 1);
    assert_eq!(node.count(TRACES, "span_status.code:ok").await, 1);
    assert_eq!(node.count(TRACES, "span_kind:2").await, 1);
    assert_eq!(node.count(TRACES, "service_name:frontend").await, 2);
    assert_eq!(
        node.count(TRACES, "span_attributes.http.route:\"/checkout\"")
            .await,
        1
    );
    // Default search fields: service_name, span_name, event_names.
    assert_eq!(node.count(TRACES, "payments").await, 1);
    assert_eq!(node.count(TRACES, "retrying").await, 1);
    assert_eq!(node.count(TRACES, "events.event_name:\"gave up\"").await, 1);
    // Bytes terms are base64 in Shale's query language (Quickwit also takes hex there).
    assert_eq!(
        node.count(TRACES, "trace_id:\"EREREREREREREREREREREQ==\"")
            .await,
        2
    );

    let docs = hits(&node, TRACES, "*", "span_start_timestamp_nanos").await;
    let root = &docs[0];
    assert_eq!(root["trace_id"], "11".repeat(16));
    assert_eq!(root["span_id"], "01".repeat(8));
    assert_eq!(root["span_name"], "GET /checkout");
    assert_eq!(root["span_kind"], 2);
    assert_eq!(root["span_start_timestamp_nanos"], json!(T0));
    assert_eq!(root["span_end_timestamp_nanos"], json!(T0 + 1_250_000_000));
    assert_eq!(root["span_duration_millis"], 1250);
    assert_eq!(
        root["span_status"],
        json!({"code": "error", "message": "upstream failed"})
    );
    assert_eq!(root["span_fingerprint"], "frontend\u{0}2\u{0}GET /checkout");
    assert_eq!(root["scope_name"], "http-server");
    assert_eq!(
        root["events"],
        json!([
            {"event_name": "retrying upstream", "event_timestamp_nanos": T0 + 1_000},
            {
                "event_name": "gave up", "event_timestamp_nanos": T0 + 2_000,
                "event_attributes": {"attempts": 3}
            },
        ])
    );
    assert!(root.get("parent_span_id").is_none(), "{root}");
    // `is_root` and `event_names` are indexed, not stored (Quickwit's mapping).
    assert!(root.get("is_root").is_none(), "{root}");
    let child = &docs[1];
    assert_eq!(child["parent_span_id"], "01".repeat(8));
    assert_eq!(child["span_duration_millis"], 300);
    assert_eq!(child["span_status"], json!({"code": "ok"}));
    assert_eq!(child["span_kind"], 3);
    let other = &docs[2];
    assert_eq!(other["service_name"], "payments");
    assert_eq!(other["span_duration_millis"], 0);
    assert!(other.get("span_status").is_none(), "{other}");
}

#[tokio::test]
async fn json_and_gzip_bodies() {
    let node = TestNode::start().await;
    let logs = json!({"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}]},
        "scopeLogs": [{"logRecords": [{
            "timeUnixNano": T0.to_string(),
            "severityNumber": 5,
            "severityText": "DEBUG",
            "body": {"stringValue": "hello from json"},
            "attributes": [{"key": "count", "value": {"intValue": "3"}}],
            "traceId": "0123456789abcdef0123456789abcdef",
            "spanId": "0123456789abcdef"
        }]}]
    }]});
    let (status, content_type, body) = export(
        &node,
        "/api/v1/otlp/v1/logs?commit=force",
        "application/json",
        &[],
        logs.to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(content_type, "application/json");
    let response: Value = serde_json::from_slice(&body).unwrap();
    assert!(response.get("partialSuccess").is_none(), "{response}");
    let docs = hits(&node, LOGS, "service_name:json-svc", "timestamp_nanos").await;
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0]["body"]["message"], "hello from json");
    assert_eq!(docs[0]["attributes"]["count"], 3);
    assert_eq!(docs[0]["trace_id"], "0123456789abcdef0123456789abcdef");
    assert_eq!(docs[0]["severity_number"], 5);

    // gzip, protobuf.
    let (status, _, body) = export(
        &node,
        "/api/v1/otlp/v1/traces?commit=force",
        "application/x-protobuf",
        &[("content-encoding", "gzip")],
        gzip(&traces_request().encode_to_vec()),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(node.count(TRACES, "*").await, 3);

    // gzip, JSON.
    let traces = json!({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "ff".repeat(16), "spanId": "ee".repeat(8), "name": "gzipped",
        "kind": 2, "startTimeUnixNano": T0.to_string(),
        "endTimeUnixNano": (T0 + 7_000_000).to_string(),
        "status": {"code": 2}
    }]}]}]});
    let (status, content_type, body) = export(
        &node,
        "/api/v1/otlp/v1/traces?commit=force",
        "application/json",
        &[("content-encoding", "gzip")],
        gzip(traces.to_string().as_bytes()),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(content_type, "application/json");
    let docs = hits(
        &node,
        TRACES,
        "span_name:gzipped",
        "span_start_timestamp_nanos",
    )
    .await;
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0]["service_name"], "unknown_service");
    assert_eq!(docs[0]["span_duration_millis"], 7);
    assert_eq!(docs[0]["span_status"], json!({"code": "error"}));
}

#[tokio::test]
async fn malformed_bodies_are_refused_and_nothing_is_indexed() {
    let node = TestNode::start().await;
    for (path, content_type, body, needle) in [
        (
            "/api/v1/otlp/v1/logs?commit=force",
            "application/x-protobuf",
            b"\x0a\xff\xff\xff\xff\x0f".to_vec(),
            "ExportLogsServiceRequest",
        ),
        (
            "/api/v1/otlp/v1/traces?commit=force",
            "application/x-protobuf",
            b"not protobuf at all".to_vec(),
            "ExportTraceServiceRequest",
        ),
        (
            "/api/v1/otlp/v1/logs?commit=force",
            "application/json",
            b"{\"resourceLogs\": 3}".to_vec(),
            "JSON",
        ),
    ] {
        let (status, content_type_back, response) =
            export(&node, path, content_type, &[], body).await;
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&response));
        assert!(content_type_back.starts_with("application/json"));
        let response: Value = serde_json::from_slice(&response).unwrap();
        let message = response["message"].as_str().unwrap();
        assert!(message.contains("invalid OTLP"), "{message}");
        assert!(message.contains(needle), "{message}");
    }
    let (status, _, _) = export(
        &node,
        "/api/v1/otlp/v1/logs",
        "text/plain",
        &[],
        logs_request().encode_to_vec(),
    )
    .await;
    assert_eq!(status, 415);
    let (status, _, _) = export(
        &node,
        "/api/v1/otlp/v1/logs?commit=sometimes",
        "application/x-protobuf",
        &[],
        logs_request().encode_to_vec(),
    )
    .await;
    assert_eq!(status, 400);
    for index in [LOGS, TRACES] {
        assert_eq!(node.count(index, "*").await, 0);
        let (_, splits) = node.get(&format!("/api/v1/indexes/{index}/splits")).await;
        assert_eq!(splits["size"], 0, "{splits}");
    }
}

#[tokio::test]
async fn invalid_records_are_a_partial_success() {
    let node = TestNode::start().await;
    let mut request = traces_request();
    // A trace id of 3 bytes: that span is rejected, the others are indexed.
    request.resource_spans[0].scope_spans[0].spans[1].trace_id = vec![1, 2, 3];
    let (status, _, body) = export(
        &node,
        "/api/v1/otlp/v1/traces?commit=force",
        "application/x-protobuf",
        &[],
        request.encode_to_vec(),
    )
    .await;
    assert_eq!(status, 200);
    let partial = ExportTraceServiceResponse::decode(body.as_slice())
        .unwrap()
        .partial_success
        .unwrap();
    assert_eq!(partial.rejected_spans, 1);
    assert!(
        partial.error_message.contains("trace_id"),
        "{}",
        partial.error_message
    );
    assert_eq!(node.count(TRACES, "*").await, 2);

    // A record the index refuses (a negative severity for a u64 field), in JSON.
    let logs = json!({"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"timeUnixNano": T0.to_string(), "severityNumber": -1, "body": {"stringValue": "bad"}},
        {"timeUnixNano": T0.to_string(), "body": {"stringValue": "good"}}
    ]}]}]});
    let (status, _, body) = export(
        &node,
        "/api/v1/otlp/v1/logs?commit=force",
        "application/json",
        &[],
        logs.to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let response: Value = serde_json::from_slice(&body).unwrap();
    let partial = &response["partialSuccess"];
    assert_eq!(
        partial["rejectedLogRecords"].as_i64(),
        Some(1),
        "{response}"
    );
    assert!(
        partial["errorMessage"].as_str().unwrap().contains(LOGS),
        "{response}"
    );
    assert_eq!(node.count(LOGS, "*").await, 1);
    assert_eq!(node.count(LOGS, "good").await, 1);
}

#[tokio::test]
async fn exports_into_another_index() {
    let node = TestNode::start().await;
    node.create_index(
        r#"
version: 0.8
index_id: team-logs
doc_mapping:
  mode: dynamic
  field_mappings:
    - name: timestamp_nanos
      type: datetime
      input_formats: [unix_timestamp]
      fast: true
  timestamp_field: timestamp_nanos
indexing_settings:
  commit_timeout_secs: 1
"#,
    )
    .await;
    let body = logs_request().encode_to_vec();
    let (status, _, response) = export(
        &node,
        "/api/v1/team-logs/otlp/v1/logs?commit=force",
        "application/x-protobuf",
        &[],
        body.clone(),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&response));
    let (status, _, response) = export(
        &node,
        "/api/v1/otlp/v1/logs?commit=force",
        "application/x-protobuf",
        &[("qw-otel-logs-index", "team-logs")],
        body.clone(),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&response));
    assert_eq!(node.count("team-logs", "*").await, 6);
    assert_eq!(node.count("team-logs", "service_name:payments").await, 2);
    assert_eq!(node.count(LOGS, "*").await, 0);

    let (status, _, response) = export(
        &node,
        "/api/v1/no-such-index/otlp/v1/traces",
        "application/x-protobuf",
        &[],
        traces_request().encode_to_vec(),
    )
    .await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&response));
    let (status, _, _) = export(
        &node,
        "/api/v1/otlp/v1/traces",
        "application/x-protobuf",
        &[("qw-otel-traces-index", "no-such-index")],
        traces_request().encode_to_vec(),
    )
    .await;
    assert_eq!(status, 404);
}
