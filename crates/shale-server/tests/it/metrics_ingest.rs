//! Metrics ingest on a real node: the `otel-metrics-v0_9` index created at start, Prometheus
//! remote write and OTLP metrics (protobuf and JSON) into Parquet splits — one per time bucket
//! — with their metadata in the metastore, read back sample for sample; refusals counted and
//! answered; documents and searches kept away from metrics indexes.

use crate::common;

use common::TestNode;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as OtlpValue;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Gauge, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use serde_json::{json, Value};
use shale_metrics::remote_write::{
    encode_remote_write, Label, MetricMetadata, ProtoSample, TimeSeries, WriteRequest,
};
use shale_metrics::{Labels, Matcher};

const METRICS: &str = "otel-metrics-v0_9";
/// 2026-05-28T20:00:00Z in ms: a 15-minute bucket boundary.
const T0: i64 = 1_780_084_800_000;

fn series(name: &str, extra: &[(&str, &str)], samples: &[(i64, f64)]) -> TimeSeries {
    let mut labels = vec![Label {
        name: "__name__".into(),
        value: name.into(),
    }];
    labels.extend(extra.iter().map(|(n, v)| Label {
        name: n.to_string(),
        value: v.to_string(),
    }));
    TimeSeries {
        labels,
        samples: samples
            .iter()
            .map(|&(timestamp, value)| ProtoSample { value, timestamp })
            .collect(),
        ..Default::default()
    }
}

async fn remote_write(node: &TestNode, path: &str, request: &WriteRequest) -> (u16, String) {
    let resp = node
        .client
        .post(node.url(path))
        .header("Content-Encoding", "snappy")
        .header("Content-Type", "application/x-protobuf")
        .header("X-Prometheus-Remote-Write-Version", "0.1.0")
        .body(encode_remote_write(request))
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

async fn splits(node: &TestNode, index: &str) -> Vec<Value> {
    let (status, resp) = node
        .get(&format!(
            "/api/v1/indexes/{index}/splits?split_states=Published"
        ))
        .await;
    assert_eq!(status, 200, "{resp}");
    let mut splits = resp["splits"].as_array().unwrap().clone();
    splits.sort_by_key(|s| s["time_bucket_start"].as_i64());
    splits
}

/// Every series of the index's published splits, read from their Parquet objects.
async fn read_all(node: &TestNode, index: &str) -> Vec<(Labels, Vec<(i64, u64)>)> {
    let mut out = Vec::new();
    for split in splits(node, index).await {
        let name = format!("{}.parquet", split["split_id"].as_str().unwrap());
        let path = node.data_dir.join("indexes").join(index).join(&name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let read = shale_metrics::read_split(bytes.into(), &[], i64::MIN, i64::MAX).unwrap();
        for s in read.series {
            out.push((
                s.labels,
                s.samples
                    .iter()
                    .map(|s| (s.timestamp_ms, s.value.to_bits()))
                    .collect(),
            ));
        }
    }
    out.sort_by(|a, b| (a.0.iter().collect::<Vec<_>>()).cmp(&b.0.iter().collect::<Vec<_>>()));
    out
}

#[tokio::test]
async fn remote_write_lands_in_one_parquet_split_per_time_bucket() {
    let node = TestNode::start().await;
    let (status, index) = node.get(&format!("/api/v1/indexes/{METRICS}")).await;
    assert_eq!(status, 200);
    assert_eq!(
        index["index_config"]["metrics"]["sort_labels"],
        json!(["job", "instance"])
    );
    let stale = f64::from_bits(shale_metrics::STALE_NAN_BITS);
    // Two buckets: the samples before T0 and after; out of order and with a duplicate
    // timestamp (the last written value is kept).
    let request = WriteRequest {
        timeseries: vec![
            series(
                "http_requests_total",
                &[("job", "api"), ("instance", "a:9090")],
                &[
                    (T0 + 10_000, 5.0),
                    (T0 - 10_000, 3.0),
                    (T0 + 20_000, 7.0),
                    (T0 + 10_000, 6.0),
                ],
            ),
            series(
                "http_requests_total",
                &[("job", "api"), ("instance", "b:9090")],
                &[(T0 + 10_000, 1.0), (T0 + 20_000, stale)],
            ),
            series("up", &[("job", "node")], &[(T0 - 5_000, 1.0)]),
        ],
        ..Default::default()
    };
    let (status, body) =
        remote_write(&node, "/prometheus/api/v1/write?commit=force", &request).await;
    assert_eq!(status, 204, "{body}");

    let splits = splits(&node, METRICS).await;
    assert_eq!(splits.len(), 2, "{splits:#?}");
    let (before, after) = (&splits[0], &splits[1]);
    assert_eq!(before["format"], "parquet");
    assert_eq!(before["time_bucket_start"], json!((T0 - 900_000) / 1000));
    assert_eq!(after["time_bucket_start"], json!(T0 / 1000));
    assert_eq!(before["num_docs"], 2);
    assert_eq!(before["num_series"], 2);
    assert_eq!(
        after["num_docs"], 4,
        "the duplicate timestamp keeps one sample"
    );
    assert_eq!(after["num_series"], 2);
    assert_eq!(
        before["tags"],
        json!(["__name__:http_requests_total", "__name__:up"])
    );
    assert_eq!(after["tags"], json!(["__name__:http_requests_total"]));
    assert_eq!(
        after["time_range"],
        json!({"start": T0 / 1000 + 10, "end": T0 / 1000 + 20})
    );
    assert_eq!(
        after["sort_fields"],
        json!(["__name__", "job", "instance", "__series_id__"])
    );

    let all = read_all(&node, METRICS).await;
    let find = |instance: &str| {
        all.iter()
            .filter(|(l, _)| l.get("instance") == Some(instance))
            .flat_map(|(_, s)| s.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        find("a:9090"),
        vec![
            (T0 - 10_000, 3f64.to_bits()),
            (T0 + 10_000, 6f64.to_bits()),
            (T0 + 20_000, 7f64.to_bits())
        ]
    );
    assert_eq!(
        find("b:9090"),
        vec![
            (T0 + 10_000, 1f64.to_bits()),
            (T0 + 20_000, shale_metrics::STALE_NAN_BITS)
        ]
    );
    // Selectors read the split through its matchers.
    let split_path = node
        .data_dir
        .join("indexes")
        .join(METRICS)
        .join(format!("{}.parquet", before["split_id"].as_str().unwrap()));
    let read = shale_metrics::read_split(
        std::fs::read(split_path).unwrap().into(),
        &[Matcher::equal("__name__", "up")],
        i64::MIN,
        i64::MAX,
    )
    .unwrap();
    assert_eq!(read.series.len(), 1);
    assert_eq!(read.series[0].labels.get("job"), Some("node"));
    node.stop().await;
}

#[tokio::test]
async fn invalid_series_are_refused_and_named_while_the_rest_is_stored() {
    let node = TestNode::start().await;
    node.create_index("index_id: prom\nmetrics:\n  sort_labels: [host]\n  time_bucket: 1h\n")
        .await;
    let request = WriteRequest {
        timeseries: vec![
            series("cpu", &[("host", "h1")], &[(T0, 0.5)]),
            series("cpu", &[("bad-label", "x")], &[(T0, 0.5)]),
            series("", &[("host", "h2")], &[(T0, 0.5)]),
        ],
        ..Default::default()
    };
    let (status, body) = remote_write(
        &node,
        "/prometheus/prom/api/v1/write?commit=force",
        &request,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("1 samples stored"), "{body}");
    assert!(body.contains("2 series"), "{body}");
    assert!(body.contains("bad-label"), "{body}");
    let all = read_all(&node, "prom").await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].0.get("host"), Some("h1"));
    assert!(node
        .metrics()
        .await
        .contains("shale_metric_samples_refused_total{protocol=\"remote_write\"} 2"));

    // A body that is not snappy, or another encoding, is a clear 4xx.
    let resp = node
        .client
        .post(node.url("/prometheus/prom/api/v1/write"))
        .header("Content-Encoding", "snappy")
        .body("not snappy")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert!(resp.text().await.unwrap().contains("snappy"));
    let resp = node
        .client
        .post(node.url("/prometheus/prom/api/v1/write"))
        .header("Content-Encoding", "gzip")
        .body(encode_remote_write(&request))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 415);
    // Unknown index: 404.
    let (status, body) = remote_write(&node, "/prometheus/nope/api/v1/write", &request).await;
    assert_eq!(status, 404, "{body}");
    node.stop().await;
}

#[tokio::test]
async fn documents_and_searches_are_kept_away_from_metrics_indexes() {
    let node = TestNode::start().await;
    let resp = node
        .client
        .post(node.url(&format!("/api/v1/{METRICS}/ingest")))
        .body("{\"a\": 1}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = resp.json().await.unwrap();
    assert!(body.to_string().contains("metrics index"), "{body}");
    let (status, body) = node
        .post(
            &format!("/api/v1/{METRICS}/search"),
            json!({"query": "*"}).to_string(),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("PromQL"), "{body}");
    // Samples into a logs index are refused too.
    node.create_index("index_id: logs\ndoc_mapping:\n  mode: dynamic\n")
        .await;
    let request = WriteRequest {
        timeseries: vec![series("up", &[], &[(T0, 1.0)])],
        ..Default::default()
    };
    let (status, body) = remote_write(&node, "/prometheus/logs/api/v1/write", &request).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not a metrics index"), "{body}");
    // `*` searches the document indexes only.
    node.ingest("logs", "{\"a\": 1}\n", "force").await;
    let (status, body) = node
        .post(
            "/api/v1/_elastic/*/_search",
            json!({"query": {"match_all": {}}}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["hits"]["total"]["value"], 1);
    // No delete tasks nor manual compactions on a metrics index.
    let (status, _) = node
        .post(
            &format!("/api/v1/{METRICS}/delete-tasks"),
            json!({"query": "*"}).to_string(),
        )
        .await;
    assert_eq!(status, 400);
    node.stop().await;
}

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(OtlpValue::StringValue(value.to_string())),
        }),
        ..Default::default()
    }
}

fn otlp_request() -> ExportMetricsServiceRequest {
    let t = |offset_ms: i64| ((T0 + offset_ms) * 1_000_000) as u64;
    let point = |offset_ms: i64, value: f64, attrs: Vec<KeyValue>| NumberDataPoint {
        attributes: attrs,
        time_unix_nano: t(offset_ms),
        start_time_unix_nano: t(-60_000),
        value: Some(number_data_point::Value::AsDouble(value)),
        ..Default::default()
    };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", "checkout"),
                    kv("service.instance.id", "pod-1"),
                    kv("host.name", "node-7"),
                ],
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![
                    Metric {
                        name: "http.server.requests".into(),
                        unit: "1".into(),
                        data: Some(metric::Data::Sum(Sum {
                            data_points: vec![
                                point(1_000, 10.0, vec![kv("http.method", "GET")]),
                                point(2_000, 12.0, vec![kv("http.method", "GET")]),
                            ],
                            aggregation_temporality: AggregationTemporality::Cumulative as i32,
                            is_monotonic: true,
                        })),
                        ..Default::default()
                    },
                    Metric {
                        name: "queue.size".into(),
                        data: Some(metric::Data::Gauge(Gauge {
                            data_points: vec![point(1_000, 3.0, vec![])],
                        })),
                        ..Default::default()
                    },
                    Metric {
                        name: "bytes.sent".into(),
                        data: Some(metric::Data::Sum(Sum {
                            data_points: vec![point(1_000, 100.0, vec![])],
                            aggregation_temporality: AggregationTemporality::Delta as i32,
                            is_monotonic: true,
                        })),
                        ..Default::default()
                    },
                    // No Prometheus name can be made of it: refused, and said so.
                    Metric {
                        name: "..".into(),
                        data: Some(metric::Data::Gauge(Gauge {
                            data_points: vec![point(1_000, 1.0, vec![])],
                        })),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[tokio::test]
async fn otlp_metrics_protobuf_and_json_with_partial_success() {
    let node = TestNode::start().await;
    let request = otlp_request();
    let resp = node
        .client
        .post(node.url("/api/v1/otlp/v1/metrics?commit=force"))
        .header("Content-Type", "application/x-protobuf")
        .body(request.encode_to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let answer = ExportMetricsServiceResponse::decode(resp.bytes().await.unwrap()).unwrap();
    let partial = answer
        .partial_success
        .expect("the nameless metric is refused");
    assert_eq!(partial.rejected_data_points, 1);
    assert!(
        partial.error_message.contains("no Prometheus name"),
        "{}",
        partial.error_message
    );

    let all = read_all(&node, METRICS).await;
    let names: Vec<&str> = all.iter().map(|(l, _)| l.metric_name()).collect();
    assert!(names.contains(&"http_server_requests_total"), "{names:?}");
    assert!(names.contains(&"queue_size"), "{names:?}");
    // A delta point is stored as exported.
    let sent = all
        .iter()
        .find(|(l, _)| l.metric_name() == "bytes_sent_total")
        .unwrap();
    assert_eq!(sent.1, vec![(T0 + 1_000, 100f64.to_bits())]);
    // The other resource attributes are in `target_info` (as Prometheus's OTLP receiver).
    let info = all
        .iter()
        .find(|(l, _)| l.metric_name() == "target_info")
        .unwrap();
    assert_eq!(info.0.get("host_name"), Some("node-7"));
    assert_eq!(info.0.get("job"), Some("checkout"));
    let requests = all
        .iter()
        .find(|(l, _)| l.metric_name() == "http_server_requests_total")
        .unwrap();
    assert_eq!(requests.0.get("job"), Some("checkout"));
    assert_eq!(requests.0.get("instance"), Some("pod-1"));
    assert_eq!(requests.0.get("http_method"), Some("GET"));
    assert_eq!(
        requests.1,
        vec![(T0 + 1_000, 10f64.to_bits()), (T0 + 2_000, 12f64.to_bits())]
    );

    // OTLP/JSON into another metrics index named by the header.
    node.create_index("index_id: app-metrics\nmetrics: {}\n")
        .await;
    let json_body = serde_json::to_vec(&request).unwrap();
    let resp = node
        .client
        .post(node.url("/api/v1/otlp/v1/metrics?commit=force"))
        .header("Content-Type", "application/json")
        .header("qw-otel-metrics-index", "app-metrics")
        .body(json_body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(
        answer["partialSuccess"]["rejectedDataPoints"],
        json!(1),
        "{answer}"
    );
    let app = read_all(&node, "app-metrics").await;
    assert_eq!(app.len(), all.len());
    // A malformed body is a 400 naming the message.
    let resp = node
        .client
        .post(node.url("/api/v1/otlp/v1/metrics"))
        .header("Content-Type", "application/x-protobuf")
        .body(vec![0xff, 0xff, 0xff])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert!(resp
        .text()
        .await
        .unwrap()
        .contains("ExportMetricsServiceRequest"));
    node.stop().await;
}

/// The requests Grafana's Prometheus data source sends (its health check, the metric
/// browser, panels with the POST method) get Prometheus's answers.
#[tokio::test]
async fn grafana_setup_requests_work() {
    let node = TestNode::start().await;
    let request = WriteRequest {
        timeseries: vec![
            series(
                "up",
                &[("job", "api"), ("instance", "a")],
                &[(T0, 1.0), (T0 + 15_000, 1.0)],
            ),
            series("up", &[("job", "db"), ("instance", "b")], &[(T0, 0.0)]),
            series(
                "cpu_seconds_total",
                &[("job", "api"), ("mode", "idle")],
                &[(T0, 10.0), (T0 + 60_000, 40.0)],
            ),
        ],
        ..Default::default()
    };
    let (status, body) =
        remote_write(&node, "/prometheus/api/v1/write?commit=force", &request).await;
    assert_eq!(status, 204, "{body}");
    let form = |pairs: &[(&str, String)]| {
        pairs
            .iter()
            .map(|(k, v)| format!("{k}={}", urlencode(v)))
            .collect::<Vec<_>>()
            .join("&")
    };
    let post = |path: &'static str, body: String| {
        let node = &node;
        async move {
            let resp = node
                .client
                .post(node.url(path))
                .header("Content-Type", "application/x-www-form-urlencoded")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let opened = resp
                .headers()
                .get("x-shale-splits-opened")
                .map(|v| v.to_str().unwrap().to_string());
            (status, resp.json::<Value>().await.unwrap(), opened)
        }
    };
    // Health check: `1+1`.
    let (status, body, _) = post(
        "/prometheus/api/v1/query",
        form(&[
            ("query", "1+1".into()),
            ("time", ((T0 + 30_000) / 1000).to_string()),
        ]),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"status": "success", "data": {"resultType": "scalar", "result": [(T0 + 30_000) / 1000, "2"]}})
    );
    let (status, body) = node.get("/prometheus/api/v1/status/buildinfo").await;
    assert_eq!(status, 200);
    assert_eq!(body["data"]["version"], "2.42.0");
    // The metric browser.
    let window = format!("start={}&end={}", T0 / 1000 - 60, T0 / 1000 + 120);
    let (_, body) = node
        .get(&format!("/prometheus/api/v1/labels?{window}"))
        .await;
    assert_eq!(body["data"], json!(["__name__", "instance", "job", "mode"]));
    let (_, body) = node
        .get(&format!(
            "/prometheus/api/v1/label/__name__/values?{window}"
        ))
        .await;
    assert_eq!(body["data"], json!(["cpu_seconds_total", "up"]));
    let (_, body) = node
        .get(&format!(
            "/prometheus/api/v1/label/job/values?match[]=up&{window}"
        ))
        .await;
    assert_eq!(body["data"], json!(["api", "db"]));
    let (_, body) = node
        .get(&format!(
            "/prometheus/api/v1/series?match[]={}&{window}",
            urlencode("up{job=~\"a.*\"}")
        ))
        .await;
    assert_eq!(
        body["data"],
        json!([{"__name__": "up", "instance": "a", "job": "api"}])
    );
    // Metadata, as Prometheus sends it: in a request of its own, without samples.
    let meta = |family: &str, kind: i32, help: &str| MetricMetadata {
        r#type: kind,
        metric_family_name: family.into(),
        help: help.into(),
        unit: String::new(),
    };
    let metadata_only = WriteRequest {
        metadata: vec![
            meta("up", 2, "1 if the scrape worked"),
            meta("cpu_seconds_total", 1, "CPU time"),
        ],
        ..Default::default()
    };
    let (status, body) = remote_write(&node, "/prometheus/api/v1/write", &metadata_only).await;
    assert_eq!(status, 204, "{body}");
    let (status, body) = node.get("/prometheus/api/v1/metadata").await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"status": "success", "data": {
            "cpu_seconds_total": [{"type": "counter", "help": "CPU time", "unit": ""}],
            "up": [{"type": "gauge", "help": "1 if the scrape worked", "unit": ""}],
        }})
    );
    let (_, body) = node.get("/prometheus/api/v1/metadata?metric=up").await;
    assert_eq!(body["data"].as_object().unwrap().len(), 1, "{body}");
    let (_, body) = node.get("/prometheus/api/v1/metadata?limit=1").await;
    assert_eq!(body["data"].as_object().unwrap().len(), 1, "{body}");
    // A panel: a range query by POST, with the splits it opened in a header.
    let (status, body, opened) = post(
        "/prometheus/api/v1/query_range",
        form(&[
            ("query", "sum by (job) (up)".into()),
            ("start", (T0 / 1000).to_string()),
            ("end", (T0 / 1000 + 60).to_string()),
            ("step", "30".into()),
        ]),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(opened.as_deref(), Some("1"));
    let t = T0 / 1000;
    assert_eq!(
        body["data"],
        json!({"resultType": "matrix", "result": [
            {"metric": {"job": "api"}, "values": [[t, "1"], [t + 30, "1"], [t + 60, "1"]]},
            {"metric": {"job": "db"}, "values": [[t, "0"], [t + 30, "0"], [t + 60, "0"]]},
        ]})
    );
    // `rate` over the counter, with stats asked for.
    let (_, body) = node
        .get(&format!(
            "/prometheus/api/v1/query?query={}&time={}&stats=all",
            urlencode("rate(cpu_seconds_total[2m])"),
            t + 60
        ))
        .await;
    // 30 over 60 s of samples, extrapolated to 80 s (the counter's zero point is 20 s before
    // its first sample, inside the 2-minute window), divided by the window.
    assert_eq!(
        body["data"]["result"][0]["value"][1], "0.3333333333333333",
        "{body}"
    );
    assert_eq!(body["data"]["stats"]["splits"]["opened"], 1, "{body}");
    // Errors in Prometheus's shape.
    let (status, body) = node.get("/prometheus/api/v1/query?query=sum(").await;
    assert_eq!(status, 400);
    assert_eq!(body["status"], "error");
    assert_eq!(body["errorType"], "bad_data");
    assert!(body["error"].as_str().unwrap().len() > 5, "{body}");
    let (status, body) = node
        .get("/prometheus/api/v1/query_range?query=up&start=10&end=5&step=1")
        .await;
    assert_eq!((status, &body["errorType"]), (400, &json!("bad_data")));
    let (status, body) = node
        .get("/prometheus/api/v1/query_range?query=up&start=0&end=100000&step=1")
        .await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("11,000"), "{body}");
    let (status, body) = node.get("/prometheus/nope/api/v1/query?query=up").await;
    assert_eq!((status, &body["errorType"]), (404, &json!("not_found")));
    node.stop().await;
}

fn urlencode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Retention and the janitor treat metrics splits as any split: an expired one is marked,
/// its `.parquet` object deleted, and PromQL no longer sees its samples.
#[tokio::test]
async fn retention_expires_metrics_splits_and_deletes_their_objects() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    config.compaction.deletion_grace_period_secs = 0;
    let node = TestNode::start_with(config).await;
    node.create_index(
        "index_id: kept\nmetrics: {}\nretention:\n  period: 30 days\n  schedule: hourly\n",
    )
    .await;
    let now = shale_types::now_unix_secs();
    let request = WriteRequest {
        timeseries: vec![
            series("old_metric", &[], &[(T0, 1.0)]),
            series("new_metric", &[], &[((now - 60) * 1000, 2.0)]),
        ],
        ..Default::default()
    };
    let (status, body) = remote_write(
        &node,
        "/prometheus/kept/api/v1/write?commit=force",
        &request,
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let before = splits(&node, "kept").await;
    assert_eq!(before.len(), 2);
    let old = before
        .iter()
        .find(|s| s["tags"] == json!(["__name__:old_metric"]))
        .unwrap();
    let old_path = node
        .data_dir
        .join("indexes/kept")
        .join(format!("{}.parquet", old["split_id"].as_str().unwrap()));
    assert!(old_path.exists());
    node.node.run_janitor_at(now).await.unwrap();
    let tick = now - now.rem_euclid(3600) + 3600;
    let report = node.node.run_janitor_at(tick).await.unwrap();
    assert_eq!(report.expired_by_retention, 1);
    assert_eq!(report.deleted_split_ids.len(), 1);
    assert!(!old_path.exists(), "the expired split's object is deleted");
    let after = splits(&node, "kept").await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0]["tags"], json!(["__name__:new_metric"]));
    let (_, body) = node
        .get("/prometheus/kept/api/v1/label/__name__/values")
        .await;
    assert_eq!(body["data"], json!(["new_metric"]));
    node.stop().await;
}

/// A selector skips the splits whose metric names or sort-key range cannot hold its series,
/// and says so in the response headers.
#[tokio::test]
async fn selectors_open_only_the_splits_that_may_hold_their_series() {
    let node = TestNode::start().await;
    // Merges off: the test counts the fresh splits a selector opens.
    node.create_index(
        "index_id: hosts\nmetrics:\n  sort_labels: [host]\nindexing_settings:\n  merge_policy:\n    type: no_merge\n",
    )
        .await;
    for (name, host) in [("cpu", "a"), ("cpu", "b"), ("mem", "a")] {
        let request = WriteRequest {
            timeseries: vec![series(
                name,
                &[("host", host)],
                &[(T0, 1.0), (T0 + 10_000, 2.0)],
            )],
            ..Default::default()
        };
        let (status, body) = remote_write(
            &node,
            "/prometheus/hosts/api/v1/write?commit=force",
            &request,
        )
        .await;
        assert_eq!(status, 204, "{body}");
    }
    assert_eq!(splits(&node, "hosts").await.len(), 3);
    let t = T0 / 1000 + 10;
    for (query, opened, result) in [
        ("cpu{host=\"a\"}", "1", 1),
        ("cpu", "2", 2),
        // Without a name the key prefix is empty: every split is read (and its row groups
        // pruned by statistics).
        ("{host=\"a\"}", "3", 2),
        ("sum(cpu{host=~\"a|b\"})", "2", 1),
        ("mem{host=\"b\"}", "0", 0),
    ] {
        let resp = node
            .client
            .get(node.url("/prometheus/hosts/api/v1/query"))
            .query(&[("query", query), ("time", &t.to_string())])
            .send()
            .await
            .unwrap();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default()
        };
        assert_eq!(header("x-shale-splits-listed"), "3", "{query}");
        assert_eq!(header("x-shale-splits-opened"), opened, "{query}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(
            body["data"]["result"].as_array().unwrap().len(),
            result,
            "{query}: {body}"
        );
    }
    node.stop().await;
}
