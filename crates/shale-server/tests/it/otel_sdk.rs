//! OTLP metrics from a real client: the OpenTelemetry Python SDK's OTLP/HTTP exporter
//! (`opentelemetry-exporter-otlp-proto-http`, installed by `.ci/run`, skipped elsewhere when
//! missing) sends counters, up-down counters and histograms; PromQL reads back the exact
//! totals, last values, counts, sums and bucket bounds under Prometheus's names.

use crate::common;

use common::TestNode;
use serde_json::Value;

async fn instant(node: &TestNode, query: &str) -> Vec<(Value, f64)> {
    let resp: Value = node
        .client
        .get(node.url("/prometheus/api/v1/query"))
        .query(&[("query", query)])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(resp["status"], "success", "{query}: {resp}");
    resp["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["metric"].clone(),
                r["value"][1].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

async fn value(node: &TestNode, query: &str) -> f64 {
    let result = instant(node, query).await;
    assert_eq!(result.len(), 1, "{query}: {result:?}");
    result[0].1
}

#[tokio::test]
async fn the_opentelemetry_python_sdk_exports_counters_gauges_and_histograms() {
    let installed = std::process::Command::new("python3")
        .args([
            "-c",
            "import opentelemetry.sdk.metrics, opentelemetry.exporter.otlp.proto.http.metric_exporter",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install the OpenTelemetry Python SDK (.ci/run does)"
        );
        eprintln!("skipped: the OpenTelemetry Python SDK is not installed");
        return;
    }
    let node = TestNode::start().await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/otel_metrics_sdk.py"
    );
    let url = node.url("/api/v1/otlp/v1/metrics?commit=force");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .env("OTLP_URL", url)
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
    // Counter: `_total`, the unit in braces left out; resource attributes as job/instance.
    assert_eq!(value(&node, "shop_orders_total{shop=\"a\"}").await, 12.0);
    assert_eq!(value(&node, "shop_orders_total{shop=\"b\"}").await, 1.0);
    let orders = instant(&node, "shop_orders_total{shop=\"a\"}").await;
    assert_eq!(orders[0].0["job"], "sdk-test");
    assert_eq!(orders[0].0["instance"], "i-1");
    assert_eq!(value(&node, "sum(shop_orders_total)").await, 13.0);
    // Up-down counter: a gauge with the last value.
    assert_eq!(value(&node, "queue_depth{queue=\"q1\"}").await, 7.0);
    // Histogram: `_count`, `_sum` and cumulative `_bucket`s at the SDK's default bounds.
    assert_eq!(value(&node, "http_latency_milliseconds_count").await, 4.0);
    assert_eq!(value(&node, "http_latency_milliseconds_sum").await, 640.0);
    for (le, count) in [
        ("0", 0.0),
        ("5", 1.0),
        ("10", 2.0),
        ("25", 2.0),
        ("50", 3.0),
        ("500", 3.0),
        ("750", 4.0),
        ("+Inf", 4.0),
    ] {
        assert_eq!(
            value(
                &node,
                &format!("http_latency_milliseconds_bucket{{le=\"{le}\"}}")
            )
            .await,
            count,
            "le={le}"
        );
    }
    let buckets = instant(&node, "http_latency_milliseconds_bucket").await;
    assert_eq!(buckets.len(), 16, "{buckets:?}");
    // histogram_quantile over them: the median falls in (5, 10].
    let median = value(
        &node,
        "histogram_quantile(0.5, http_latency_milliseconds_bucket)",
    )
    .await;
    assert!(median > 5.0 && median <= 10.0, "{median}");
    // Exponential histogram (scale 4 from the SDK, kept at scale 3): exact counts at the
    // powers of two, which are bounds at every scale.
    assert_eq!(value(&node, "rpc_duration_seconds_count").await, 5.0);
    assert_eq!(value(&node, "rpc_duration_seconds_sum").await, 207.0);
    for (le, count) in [
        ("1", 1.0),
        ("2", 2.0),
        ("4", 3.0),
        ("128", 5.0),
        ("+Inf", 5.0),
    ] {
        assert_eq!(
            value(
                &node,
                &format!("rpc_duration_seconds_bucket{{le=\"{le}\"}}")
            )
            .await,
            count,
            "le={le}"
        );
    }
    let p90 = value(
        &node,
        "histogram_quantile(0.9, rpc_duration_seconds_bucket)",
    )
    .await;
    assert!(
        (100.0 / 1.1..=100.0 * 1.1).contains(&p90),
        "the 90th percentile within a bucket (9 %) of 100: {p90}"
    );
    // A delta counter: each export's increase, summed over time.
    assert_eq!(
        value(&node, "sum_over_time(jobs_done_total[1h])").await,
        10.0
    );
    // Metric metadata from the instruments: type, description, unit.
    let (_, body) = node
        .get("/prometheus/api/v1/metadata?metric=http_latency_milliseconds")
        .await;
    assert_eq!(
        body["data"]["http_latency_milliseconds"],
        serde_json::json!([{"type": "histogram", "help": "request latency", "unit": "ms"}])
    );
    let (_, body) = node.get("/prometheus/api/v1/metadata").await;
    assert_eq!(body["data"]["shop_orders_total"][0]["type"], "counter");
    assert_eq!(body["data"]["queue_depth"][0]["type"], "gauge");
    // The other resource attributes are in target_info.
    let info = instant(&node, "target_info{job=\"sdk-test\"}").await;
    assert_eq!(info.len(), 1, "{info:?}");
    assert_eq!(info[0].0["deployment_environment"], "ci");
    node.stop().await;
}
