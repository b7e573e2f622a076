//! PromQL against the real Prometheus: the same generated samples (counters with resets and
//! gaps, gauges that go stale or start late, classic histograms, jittered scrape times) go by
//! remote write into a Prometheus 2.42 (started by the test) and into a Shale node (as
//! several commits, so series span many splits); then hundreds of generated queries, instant
//! and range, are asked of both. Every answer must agree: status and error type, result type,
//! the set of series (label sets), timestamps, and values to 1e-9 relative.

use crate::common;

use std::collections::BTreeMap;

use crate::promql_gen::{AGGREGATIONS, ARITHMETIC, COMPARISONS, DATE_FUNCTIONS, INSTANT_FUNCTIONS};
use common::TestNode;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use shale_metrics::remote_write::{
    encode_remote_write, Label, ProtoSample, TimeSeries, WriteRequest,
};
use shale_testkit::prometheus::Prometheus;

/// An hour boundary (ms).
const T0: i64 = 1_780_081_200_000;
/// Minutes of data.
const MINUTES: i64 = 55;

type Series = (Vec<(String, String)>, Vec<(i64, f64)>);

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// Scrape times every 15 s with up to ±3 s of jitter, from minute `from` to `to`, leaving
/// out the minutes in `gap`.
fn times(rng: &mut rand::rngs::StdRng, from: i64, to: i64, gap: Option<(i64, i64)>) -> Vec<i64> {
    let mut out = Vec::new();
    let mut i = from * 4;
    while i < to * 4 {
        let minute = i / 4;
        i += 1;
        if gap.is_some_and(|(a, b)| minute >= a && minute < b) {
            continue;
        }
        let jitter = rng.random_range(-3_000..=3_000);
        out.push(T0 + (i - 1) * 15_000 + jitter);
    }
    out
}

fn generate() -> Vec<Series> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut out: Vec<Series> = Vec::new();
    for job in ["api", "web"] {
        for instance in ["a", "b", "c"] {
            for code in ["200", "500"] {
                // Counters: resets now and then; one has a 10-minute gap.
                let gap = (instance == "c" && code == "500").then_some((20, 30));
                let mut value: f64 = rng.random_range(0..1000) as f64;
                let samples = times(&mut rng, 0, MINUTES, gap)
                    .into_iter()
                    .map(|t| {
                        if rng.random_bool(0.02) {
                            value = rng.random_range(0..5) as f64;
                        } else {
                            value += rng.random_range(0..20) as f64;
                        }
                        (t, value)
                    })
                    .collect();
                out.push((
                    labels(&[
                        ("__name__", "http_requests_total"),
                        ("job", job),
                        ("instance", instance),
                        ("code", code),
                    ]),
                    samples,
                ));
            }
            for room in ["r1", "r2"] {
                // Gauges: a random walk; one goes stale at minute 35, one starts at 30.
                let (from, to) = match (instance, room) {
                    ("b", "r2") => (30, MINUTES),
                    _ => (0, MINUTES),
                };
                let mut value: f64 = rng.random_range(-10.0..40.0);
                let mut samples: Vec<(i64, f64)> = times(&mut rng, from, to, None)
                    .into_iter()
                    .map(|t| {
                        value += rng.random_range(-1.5..1.5);
                        if rng.random_bool(0.1) {
                            value = value.round();
                        }
                        (t, value)
                    })
                    .collect();
                if instance == "a" && room == "r2" && job == "web" {
                    samples.retain(|(t, _)| *t < T0 + 35 * 60_000);
                    samples.push((
                        T0 + 35 * 60_000 + 1,
                        f64::from_bits(shale_metrics::STALE_NAN_BITS),
                    ));
                }
                out.push((
                    labels(&[
                        ("__name__", "temperature_celsius"),
                        ("job", job),
                        ("instance", instance),
                        ("room", room),
                    ]),
                    samples,
                ));
            }
        }
        // Gauges with NaN and ±Inf among ordinary values.
        for kind in ["nan", "inf", "mixed"] {
            let mut value: f64 = rng.random_range(-5.0..5.0);
            let samples = times(&mut rng, 0, MINUTES, None)
                .into_iter()
                .map(|t| {
                    value += rng.random_range(-1.0..1.0);
                    let odd = match (kind, rng.random_range(0..10)) {
                        ("nan", 0..=2) | ("mixed", 0) => f64::NAN,
                        ("inf", 0 | 1) | ("mixed", 1) => f64::INFINITY,
                        ("inf", 2) | ("mixed", 2) => f64::NEG_INFINITY,
                        ("mixed", 3) => 1e300,
                        _ => value,
                    };
                    (t, odd)
                })
                .collect();
            out.push((
                labels(&[("__name__", "odd_values"), ("job", job), ("kind", kind)]),
                samples,
            ));
        }
        // Classic histograms of two instances.
        for instance in ["a", "b"] {
            let bounds = ["0.1", "0.5", "1", "5", "+Inf"];
            let scrape = times(&mut rng, 0, MINUTES, None);
            let mut buckets = [0f64; 5];
            let (mut sum, mut count) = (0f64, 0f64);
            let mut series: Vec<Vec<(i64, f64)>> = vec![Vec::new(); 7];
            for t in scrape {
                for _ in 0..rng.random_range(0..30) {
                    let observed: f64 = rng.random_range(0.0..3.0f64).powi(2);
                    sum += observed;
                    count += 1.0;
                    for (i, bound) in [0.1, 0.5, 1.0, 5.0, f64::INFINITY].iter().enumerate() {
                        if observed <= *bound {
                            buckets[i] += 1.0;
                        }
                    }
                }
                for i in 0..5 {
                    series[i].push((t, buckets[i]));
                }
                series[5].push((t, sum));
                series[6].push((t, count));
            }
            // One bucket count of instance b is NaN now and then.
            if instance == "b" {
                for (i, point) in series[2].iter_mut().enumerate() {
                    if i % 9 == 4 {
                        point.1 = f64::NAN;
                    }
                }
            }
            for (i, samples) in series.into_iter().enumerate() {
                let mut pairs = vec![("job", job), ("instance", instance)];
                let name = match i {
                    0..=4 => {
                        pairs.push(("le", bounds[i]));
                        "request_duration_seconds_bucket"
                    }
                    5 => "request_duration_seconds_sum",
                    _ => "request_duration_seconds_count",
                };
                pairs.push(("__name__", name));
                out.push((labels(&pairs), samples));
            }
        }
    }
    out
}

/// The samples of minutes `[from, to)` as a remote-write request.
fn chunk(series: &[Series], from: i64, to: i64) -> WriteRequest {
    let (lo, hi) = (T0 + from * 60_000, T0 + to * 60_000);
    WriteRequest {
        timeseries: series
            .iter()
            .filter_map(|(labels, samples)| {
                let samples: Vec<ProtoSample> = samples
                    .iter()
                    .filter(|(t, _)| *t >= lo && *t < hi)
                    .map(|&(timestamp, value)| ProtoSample { value, timestamp })
                    .collect();
                (!samples.is_empty()).then(|| TimeSeries {
                    labels: labels
                        .iter()
                        .map(|(name, value)| Label {
                            name: name.clone(),
                            value: value.clone(),
                        })
                        .collect(),
                    samples,
                    ..Default::default()
                })
            })
            .collect(),
        ..Default::default()
    }
}

async fn write(client: &reqwest::Client, url: &str, request: &WriteRequest) {
    let resp = client
        .post(url)
        .header("Content-Encoding", "snappy")
        .header("Content-Type", "application/x-protobuf")
        .header("X-Prometheus-Remote-Write-Version", "0.1.0")
        .body(encode_remote_write(request))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    assert!(
        status == 204 || status == 200,
        "{url}: {status} {}",
        resp.text().await.unwrap()
    );
}

/// Range functions asked of counters.
const COUNTER_FUNCTIONS: [&str; 5] = ["rate", "irate", "increase", "resets", "changes"];

/// Range functions asked of gauges.
const GAUGE_FUNCTIONS: [&str; 12] = [
    "delta",
    "idelta",
    "deriv",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "last_over_time",
    "stddev_over_time",
    "stdvar_over_time",
    "present_over_time",
];

/// The queries: every function and operator over the generated metrics.
fn queries() -> Vec<String> {
    let mut q: Vec<String> = Vec::new();
    let counter = "http_requests_total";
    let gauge = "temperature_celsius";
    for selector in [
        counter.to_string(),
        format!("{counter}{{code=\"500\"}}"),
        format!("{counter}{{code!=\"200\",job=~\"a.*\"}}"),
        "{__name__=~\"temp.*\",instance!~\"c|b\"}".to_string(),
        format!("{gauge}{{room=\"r2\"}}"),
        // `=` on the sort labels (job, instance): splits pruned by their key ranges.
        format!("{counter}{{job=\"web\",instance=\"b\"}}"),
        format!("{gauge}{{job=\"api\"}}"),
        "request_duration_seconds_count".to_string(),
        "nonexistent_metric".to_string(),
    ] {
        q.push(selector.clone());
        q.push(format!("{selector} offset 3m"));
        q.push(format!("timestamp({selector})"));
    }
    for range in ["1m", "5m", "11m"] {
        for f in COUNTER_FUNCTIONS {
            q.push(format!("{f}({counter}[{range}])"));
        }
        for f in GAUGE_FUNCTIONS {
            q.push(format!("{f}({gauge}[{range}])"));
        }
        q.push(format!("quantile_over_time(0.9, {gauge}[{range}])"));
        q.push(format!("predict_linear({gauge}[{range}], 600)"));
        q.push(format!("holt_winters({gauge}[{range}], 0.5, 0.3)"));
        q.push(format!("absent_over_time(nonexistent[{range}])"));
        q.push(format!(
            "absent_over_time({gauge}{{room=\"r2\",instance=\"a\"}}[{range}])"
        ));
    }
    for agg in AGGREGATIONS {
        q.push(format!("{agg}({gauge})"));
        q.push(format!("{agg} by (job) (rate({counter}[5m]))"));
        q.push(format!("{agg} without (instance, code) ({counter})"));
    }
    for k in ["1", "2"] {
        q.push(format!("topk({k}, {gauge})"));
        q.push(format!("bottomk({k}, rate({counter}[5m]))"));
        q.push(format!("topk by (job) ({k}, {gauge})"));
    }
    for phi in ["0", "0.25", "0.5", "0.9", "1"] {
        q.push(format!("quantile({phi}, {gauge})"));
        q.push(format!(
            "histogram_quantile({phi}, sum by (le) (rate(request_duration_seconds_bucket[5m])))"
        ));
        q.push(format!(
            "histogram_quantile({phi}, rate(request_duration_seconds_bucket[10m]))"
        ));
    }
    q.push(format!("count_values(\"value\", round({gauge}))"));
    q.push(format!(
        "count_values by (job) (\"v\", floor({gauge} / 10))"
    ));
    for op in ARITHMETIC {
        q.push(format!("{gauge} {op} 3"));
        q.push(format!("2 {op} {gauge}"));
    }
    for op in COMPARISONS {
        q.push(format!("{gauge} {op} 10"));
        q.push(format!("{gauge} {op} bool 10"));
        q.push(format!(
            "rate({counter}[5m]) {op} on(job, instance, code) rate({counter}[10m])"
        ));
    }
    q.push(format!(
        "rate({counter}[5m]) / on(job, instance) group_left sum by (job, instance) (rate({counter}[5m]))"
    ));
    q.push(format!(
        "sum by (job, instance) (rate({counter}[5m])) / ignoring(code) group_right {counter}"
    ));
    q.push(format!("{counter} + {gauge}"));
    q.push(format!("{counter} + on(job, instance) {gauge}"));
    q.push(format!(
        "{counter} + on(job, instance) group_left(room) {gauge}{{room=\"r1\"}}"
    ));
    q.push(format!("{gauge} and {gauge} > 10"));
    q.push(format!("{gauge} or {counter}"));
    q.push(format!(
        "{gauge} unless on(instance) {gauge}{{instance=\"a\"}}"
    ));
    q.push(format!(
        "{gauge}{{room=\"r1\"}} or on(job) {gauge}{{room=\"r2\"}}"
    ));
    q.push(format!("-{gauge}"));
    q.push("1 + 2 * 3 ^ 2 ^ 0.5 % 4".to_string());
    q.push("(1 > bool 0) - (2 == bool 3)".to_string());
    for f in INSTANT_FUNCTIONS
        .iter()
        .filter(|f| !matches!(**f, "round" | "timestamp" | "absent"))
    {
        q.push(format!("{f}({gauge} / 40)"));
    }
    q.push(format!("round({gauge}, 0.3)"));
    q.push(format!("clamp({gauge}, 0, 20)"));
    q.push(format!("clamp_min({gauge}, 5)"));
    q.push(format!("clamp_max({gauge}, 5)"));
    q.push(format!("clamp({gauge}, 20, 0)"));
    for f in DATE_FUNCTIONS {
        q.push(format!("{f}()"));
        q.push(format!("{f}(timestamp({gauge}))"));
    }
    q.push("time()".to_string());
    q.push("vector(time())".to_string());
    q.push(format!("scalar(sum({gauge}))"));
    q.push(format!("scalar({gauge})"));
    q.push("pi()".to_string());
    q.push(format!(
        "label_replace({gauge}, \"host\", \"$1-x\", \"instance\", \"(.*)\")"
    ));
    q.push(format!(
        "label_replace({gauge}, \"room\", \"\", \"room\", \"r1\")"
    ));
    q.push(format!(
        "label_join({gauge}, \"id\", \"/\", \"job\", \"instance\", \"room\")"
    ));
    q.push("absent(nonexistent{job=\"x\", code=~\"5.*\"})".to_string());
    q.push(format!("absent({gauge})"));
    q.push(format!("max_over_time(rate({counter}[1m])[10m:1m])"));
    q.push(format!("avg_over_time({gauge}[7m:30s])"));
    q.push(format!("rate({counter}[5m] offset 5m)"));
    q.push(format!("{gauge} @ {}", (T0 + 20 * 60_000) / 1000));
    q.push(format!(
        "rate({counter}[5m] @ {})",
        (T0 + 30 * 60_000) / 1000
    ));
    q.push(format!("{gauge} @ start()"));
    q.push(format!("{gauge} @ end() offset 1m"));
    q.push(format!("sum(rate({counter}[5m])) by (code) > 1"));
    q.push(format!("increase({counter}[1h])"));
    // Go's conversions and Prometheus's own rules at the edges (NaN, ±Inf, empty sides).
    for f in [
        "month",
        "year",
        "day_of_week",
        "hour",
        "days_in_month",
        "day_of_year",
    ] {
        for v in ["NaN", "Inf", "-Inf", "1e300", "-1e300"] {
            q.push(format!("{f}(vector({v}))"));
        }
    }
    q.push(format!("topk(scalar(nonexistent), {gauge})"));
    q.push(format!("bottomk(Inf, {gauge})"));
    q.push("holt_winters(nonexistent[5m], 2, 0.3)".to_string());
    q.push(format!("holt_winters({gauge}[5m], 2, 0.3)"));
    q.push(format!("{counter} + on(job) nonexistent_metric"));
    q.push(format!("nonexistent_metric * on(job) group_left {counter}"));
    q.push("-{__name__=~\"request_duration_seconds_(sum|count)\"}".to_string());
    q.push("sort(odd_values)".to_string());
    q.push("sort_desc(odd_values)".to_string());
    q.push("absent(nonexistent{job=\"a\", job=\"b\"})".to_string());
    // A later first equality on a name sets it again after another matcher removed it.
    q.push("absent(nonexistent{job!=\"x\", job=\"a\"})".to_string());
    q.push("absent_over_time(nonexistent{job=~\"b|c\", job=\"a\", job!=\"d\"}[5m])".to_string());
    q.push("absent(nonexistent{job=\"\"})".to_string());
    q.push("histogram_quantile(0.5, request_duration_seconds_bucket)".to_string());
    q.push("sum_over_time(odd_values[10m])".to_string());
    q.push("avg_over_time(odd_values[10m])".to_string());
    // Errors must agree too.
    q.push(format!("{counter} + ignoring(code) {gauge}"));
    q.push(format!("{gauge} / on(job) group_left {counter}"));
    q.push("sum(".to_string());
    q.push("rate(http_requests_total)".to_string());
    q
}

fn number(value: &Value) -> f64 {
    match value.as_str() {
        Some("NaN") => f64::NAN,
        Some("+Inf") => f64::INFINITY,
        Some("-Inf") => f64::NEG_INFINITY,
        Some(text) => text.parse().unwrap_or(f64::NAN),
        None => value.as_f64().unwrap_or(f64::NAN),
    }
}

/// Equal to 1e-9 relative, or 1e-12 absolute: sums of terms that cancel out end as rounding
/// noise whose digits depend on the order the terms were added in (Prometheus's own order
/// varies between runs when an aggregation reads another's output).
fn close(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan())
        || a == b
        || (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
        || (a - b).abs() <= 1e-12
}

/// A label set as a key, label values that are numbers (`count_values`, `le`) to 12
/// significant digits: their last digits come from float functions whose last digit may be
/// Go's own (see `function_values_equal_prometheus_to_the_last_digit`).
fn series_key(metric: &Value) -> String {
    let Some(labels) = metric.as_object() else {
        return metric.to_string();
    };
    let canonical: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(name, value)| {
            let text = value.as_str().unwrap_or_default();
            let value = match text.parse::<f64>() {
                Ok(number) if number.is_finite() && text.contains('.') => {
                    Value::String(format!("{number:.11e}"))
                }
                _ => value.clone(),
            };
            (name.clone(), value)
        })
        .collect();
    Value::Object(canonical).to_string()
}

/// Points of a result by label set (`[t, v]` pairs).
fn points(data: &Value) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut out = BTreeMap::new();
    for item in data["result"].as_array().into_iter().flatten() {
        let key = series_key(&item["metric"]);
        let pairs: Vec<(f64, f64)> = if let Some(values) = item["values"].as_array() {
            values
                .iter()
                .map(|p| (number(&p[0]), number(&p[1])))
                .collect()
        } else {
            vec![(number(&item["value"][0]), number(&item["value"][1]))]
        };
        out.insert(key, pairs);
    }
    out
}

/// Why two answers differ, if they do.
fn compare(expected: &Value, actual: &Value) -> Option<String> {
    if expected["status"] != actual["status"] {
        return Some("status".to_string());
    }
    if expected["status"] == "error" {
        return (expected["errorType"] != actual["errorType"]).then(|| "errorType".to_string());
    }
    let (e, a) = (&expected["data"], &actual["data"]);
    if e["resultType"] != a["resultType"] {
        return Some("resultType".to_string());
    }
    if matches!(e["resultType"].as_str(), Some("scalar" | "string")) {
        let same = number(&e["result"][0]) == number(&a["result"][0])
            && (close(number(&e["result"][1]), number(&a["result"][1]))
                || e["result"][1] == a["result"][1]);
        return (!same).then(|| "scalar".to_string());
    }
    let (pe, pa) = (points(e), points(a));
    if pe.keys().ne(pa.keys()) {
        let missing: Vec<&String> = pe.keys().filter(|k| !pa.contains_key(*k)).take(3).collect();
        let extra: Vec<&String> = pa.keys().filter(|k| !pe.contains_key(*k)).take(3).collect();
        return Some(format!(
            "series sets differ: missing {missing:?}, extra {extra:?}"
        ));
    }
    for (key, ep) in &pe {
        let ap = &pa[key];
        if ep.len() != ap.len() {
            return Some(format!("{key}: {} points, expected {}", ap.len(), ep.len()));
        }
        for (x, y) in ep.iter().zip(ap) {
            if x.0 != y.0 || !close(x.1, y.1) {
                return Some(format!("{key}: point {y:?}, expected {x:?}"));
            }
        }
    }
    // Sorted results keep their order.
    None
}

/// Every (endpoint, parameters) request of the test, for every generated query.
fn requests() -> Vec<(String, Vec<(&'static str, String)>)> {
    let secs = |ms: i64| format!("{}", ms as f64 / 1000.0);
    let instants = [
        7 * 60_000 + 500,
        22 * 60_000 + 30_000,
        44 * 60_000,
        57 * 60_000,
        61 * 60_000,
    ];
    let mut out = Vec::new();
    for query in queries() {
        for t in instants {
            out.push((
                "query".to_string(),
                vec![("query", query.clone()), ("time", secs(T0 + t))],
            ));
        }
        for step in ["60", "43"] {
            out.push((
                "query_range".to_string(),
                vec![
                    ("query", query.clone()),
                    ("start", secs(T0 + 60_000)),
                    ("end", secs(T0 + MINUTES * 60_000)),
                    ("step", step.to_string()),
                ],
            ));
        }
    }
    out
}

async fn get(
    client: &reqwest::Client,
    base: &str,
    endpoint: &str,
    params: &[(&str, String)],
) -> Value {
    client
        .get(format!("{base}/api/v1/{endpoint}"))
        .query(params)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()
}

/// Asks Shale every request and compares with Prometheus's answers; returns the failures.
async fn differences(
    client: &reqwest::Client,
    node: &TestNode,
    requests: &[(String, Vec<(&'static str, String)>)],
    expected: &[Value],
    extra: &[(&'static str, String)],
    phase: &str,
) -> Vec<String> {
    let mut failures = Vec::new();
    for ((endpoint, params), expected) in requests.iter().zip(expected) {
        let mut params = params.clone();
        params.extend(extra.iter().cloned());
        let actual = get(client, &node.url("/prometheus"), endpoint, &params).await;
        if let Some(why) = compare(expected, &actual) {
            failures.push(format!(
                "{phase}: {endpoint} {params:?}: {why}\n  prometheus: {}\n  shale:      {}",
                truncate(expected),
                truncate(&actual)
            ));
        }
    }
    failures
}

/// Writes the generated samples to Prometheus and, five minutes a commit, to the node.
async fn load(client: &reqwest::Client, prometheus: &Prometheus, node: &TestNode, commit: &str) {
    // In the order of their label sets, as Prometheus orders the series of its blocks (its
    // in-memory head keeps them in the order they came): aggregations and `topk` read
    // their input in that order, and their last digits and ties depend on it.
    let mut series = generate();
    for (labels, _) in &mut series {
        labels.sort();
    }
    series.sort_by(|a, b| a.0.cmp(&b.0));
    for from in (0..MINUTES).step_by(5) {
        let request = chunk(&series, from, from + 5);
        write(
            client,
            &format!("{}/api/v1/write", prometheus.url),
            &request,
        )
        .await;
        write(
            client,
            &node.url(&format!("/prometheus/api/v1/write?commit={commit}")),
            &request,
        )
        .await;
    }
}

/// A node without compaction (its splits as written) holding the samples Prometheus holds,
/// each write published before the next.
async fn loaded_node(
    prometheus: &Prometheus,
    dir: &std::path::Path,
) -> (TestNode, reqwest::Client) {
    let mut config = common::config_in(dir);
    config.compaction.enabled = false;
    let node = TestNode::start_with(config).await;
    let client = reqwest::Client::new();
    load(&client, prometheus, &node, "force").await;
    (node, client)
}

/// Random expressions (`promql_gen`, seeded) asked of Prometheus and of a node, instant at
/// two times and over a range: every answer must agree. `SHALE_PROMQL_RANDOM_COUNT`
/// expressions (300 by default), from `SHALE_PROMQL_RANDOM_SEED` (1).
#[tokio::test]
async fn random_promql_expressions_equal_prometheus() {
    let Some(prometheus) = Prometheus::start() else {
        return;
    };
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let count = env("SHALE_PROMQL_RANDOM_COUNT", 300) as usize;
    let seed = env("SHALE_PROMQL_RANDOM_SEED", 1);
    let tmp = tempfile::tempdir().unwrap();
    let (node, client) = loaded_node(&prometheus, tmp.path()).await;
    random_expressions(&prometheus, &node, &client, seed, count).await;
    node.stop().await;
}

/// The same with fresh samples: written without waiting for their splits, read back while
/// the pipeline publishes them (from memory, from splits, or both around a publish), with
/// the cache of decoded columns off: every answer still agrees.
#[tokio::test]
async fn random_promql_expressions_equal_prometheus_from_fresh_samples() {
    let Some(prometheus) = Prometheus::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    config.compaction.enabled = false;
    config.metrics_column_cache_max_bytes = 0;
    let node = TestNode::start_with(config).await;
    let client = reqwest::Client::new();
    load(&client, &prometheus, &node, "auto").await;
    assert!(
        node.node.live.stats().samples > 0,
        "the samples answer from memory (not yet published)"
    );
    random_expressions(&prometheus, &node, &client, 2, 100).await;
    node.stop().await;
}

/// Asks `count` random expressions (`promql_gen`, from `seed`) of Prometheus and of `node`,
/// instant at two times and over a range; fails with every answer that differs.
async fn random_expressions(
    prometheus: &Prometheus,
    node: &TestNode,
    client: &reqwest::Client,
    seed: u64,
    count: usize,
) {
    let secs = |ms: i64| format!("{}", ms as f64 / 1000.0);
    let mut generator =
        crate::promql_gen::Generator::new(seed, T0 / 1000, (T0 + MINUTES * 60_000) / 1000);
    let mut failures = Vec::new();
    let (mut asked, mut with_results, mut errors, mut excluded) = (0, 0, 0, 0);
    for _ in 0..count {
        let query = generator.expression();
        let requests = [
            (
                "query",
                vec![
                    ("query", query.clone()),
                    ("time", secs(T0 + 23 * 60_000 + 7_000)),
                ],
            ),
            (
                "query",
                vec![("query", query.clone()), ("time", secs(T0 + 50 * 60_000))],
            ),
            (
                "query_range",
                vec![
                    ("query", query.clone()),
                    ("start", secs(T0 + 5 * 60_000)),
                    ("end", secs(T0 + 50 * 60_000)),
                    ("step", "90".to_string()),
                ],
            ),
        ];
        for (endpoint, params) in requests {
            if known_prometheus_bug(endpoint, &query) {
                excluded += 1;
                continue;
            }
            asked += 1;
            let expected = get(client, &prometheus.url, endpoint, &params).await;
            let actual = get(client, &node.url("/prometheus"), endpoint, &params).await;
            if expected["status"] == "error" {
                errors += 1;
            } else if expected["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
            {
                with_results += 1;
            }
            let why = compare(&expected, &actual)
                .filter(|_| !same_but_ties(&query, &expected, &actual))
                .or_else(|| sort_order_differs(&query, &expected, &actual));
            if let Some(why) = why {
                failures.push(format!(
                    "{endpoint} {query} {:?}: {why}\n  prometheus: {}\n  shale:      {}",
                    &params[1..],
                    truncate(&expected),
                    truncate(&actual)
                ));
            }
        }
    }
    eprintln!(
        "{count} random expressions (seed {seed}), {asked} answers: {with_results} with \
         results, {errors} errors, {} differ; {excluded} queries left out for a \
         Prometheus 2.42 bug",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {asked} answers differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The values of single functions and aggregations, digit for digit as Prometheus writes
/// them (the other tests compare to 1e-9): Go's float arithmetic, in Prometheus's order.
#[tokio::test]
async fn function_values_equal_prometheus_to_the_last_digit() {
    let Some(prometheus) = Prometheus::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (node, client) = loaded_node(&prometheus, tmp.path()).await;
    let (counter, gauge) = ("http_requests_total", "temperature_celsius");
    let mut queries: Vec<String> = Vec::new();
    for range in ["1m", "5m", "11m"] {
        for f in COUNTER_FUNCTIONS {
            queries.push(format!("{f}({counter}[{range}])"));
        }
        for f in GAUGE_FUNCTIONS {
            queries.push(format!("{f}({gauge}[{range}])"));
            queries.push(format!("{f}(odd_values[{range}])"));
        }
        queries.push(format!("predict_linear({gauge}[{range}], 600)"));
        queries.push(format!("holt_winters({gauge}[{range}], 0.5, 0.3)"));
        queries.push(format!("quantile_over_time(0.3, {gauge}[{range}])"));
    }
    for agg in ["sum", "avg", "stddev", "stdvar"] {
        queries.push(format!("{agg}({gauge})"));
        queries.push(format!("{agg} by (job) ({counter})"));
    }
    queries.push(format!("quantile(0.3, {gauge})"));
    queries.push(
        "histogram_quantile(0.9, sum by (le) (rate(request_duration_seconds_bucket[5m])))"
            .to_string(),
    );
    for op in ["+", "-", "*", "/", "%"] {
        queries.push(format!("{gauge} {op} 3.3"));
    }
    queries.push(format!("{gauge} ^ 3"));
    queries.push(format!("{gauge} ^ -2"));
    // Go's own trigonometric and hyperbolic functions, `atan2` and `^` with a fraction may
    // differ in the last digit (README, "PromQL and Prometheus 2.42"): left out here.
    for f in ["exp", "ln", "log2", "log10", "sqrt"] {
        queries.push(format!("{f}({gauge} / 40)"));
    }
    let secs = |ms: i64| format!("{}", ms as f64 / 1000.0);
    let mut failures = Vec::new();
    let mut compared = 0;
    for query in &queries {
        for t in [22 * 60_000 + 30_000, 44 * 60_000] {
            let params = vec![("query", query.clone()), ("time", secs(T0 + t))];
            let expected = get(&client, &prometheus.url, "query", &params).await;
            let actual = get(&client, &node.url("/prometheus"), "query", &params).await;
            let values = |v: &Value| -> BTreeMap<String, String> {
                v["data"]["result"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|item| {
                        (
                            item["metric"].to_string(),
                            item["value"][1].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect()
            };
            let (e, a) = (values(&expected), values(&actual));
            compared += e.len();
            if e != a {
                let first = e
                    .iter()
                    .find(|(k, v)| a.get(*k) != Some(v))
                    .map(|(k, v)| format!("{k}: {:?}, expected {v}", a.get(k)));
                failures.push(format!("{query} at {t}: {}", first.unwrap_or_default()));
            }
        }
    }
    eprintln!(
        "{} queries, {compared} values compared digit for digit",
        queries.len()
    );
    assert!(
        failures.is_empty(),
        "{} answers differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    node.stop().await;
}

/// Queries Prometheus 2.42 answers wrongly (README, PromQL); Shale answers as documented:
/// - in a range query, a function with a parameter (`predict_linear`, `quantile_over_time`,
///   `holt_winters`) over a range pinned with `@` answers only the first steps
///   (prometheus/prometheus#11708);
/// - `timestamp()` of a selector with both `@` and `offset` replaces the offset by the
///   distance to the `@` time (its fix for prometheus/prometheus#8433), so it reads at the
///   `@` time data it fetched for the offset one: mostly nothing.
fn known_prometheus_bug(endpoint: &str, query: &str) -> bool {
    let with_parameter = ["predict_linear(", "quantile_over_time(", "holt_winters("]
        .iter()
        .any(|f| query.contains(f));
    let pinned_range = endpoint == "query_range" && with_parameter && query.contains("] @ ");
    pinned_range || timestamp_of_pinned_offset(query)
}

/// Whether a `timestamp(…)` argument of `query` holds both `@` and `offset`.
fn timestamp_of_pinned_offset(query: &str) -> bool {
    query.match_indices("timestamp(").any(|(at, call)| {
        let rest = &query[at + call.len()..];
        let mut depth = 1;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                depth += match c {
                    '(' => 1,
                    ')' => -1,
                    _ => 0,
                };
                depth == 0
            })
            .map_or(rest.len(), |(i, _)| i);
        let argument = &rest[..end];
        argument.contains(" @ ") && argument.contains(" offset ")
    })
}

/// For `topk`/`bottomk`: whether the answers differ only in which of equal values (NaN
/// included) were kept — Prometheus keeps the first in its input order, which depends on how
/// its storage holds the series. Compared: each timestamp's values, sorted.
fn same_but_ties(query: &str, expected: &Value, actual: &Value) -> bool {
    if !(query.contains("topk") || query.contains("bottomk")) {
        return false;
    }
    let by_time = |data: &Value| -> BTreeMap<String, Vec<f64>> {
        let mut out: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for pairs in points(data).into_values() {
            for (t, v) in pairs {
                out.entry(format!("{t}")).or_default().push(v);
            }
        }
        for values in out.values_mut() {
            values.sort_by(|a, b| a.total_cmp(b));
        }
        out
    };
    let (e, a) = (by_time(&expected["data"]), by_time(&actual["data"]));
    e.len() == a.len()
        && e.iter().zip(&a).all(|((te, ve), (ta, va))| {
            te == ta && ve.len() == va.len() && ve.iter().zip(va).all(|(x, y)| close(*x, *y))
        })
}

/// For an instant `sort`/`sort_desc` (the only answers whose order Prometheus defines): why
/// the order of the series differs, if it does.
fn sort_order_differs(query: &str, expected: &Value, actual: &Value) -> Option<String> {
    let sorted = query.starts_with("sort(") || query.starts_with("sort_desc(");
    if !sorted || expected["data"]["resultType"] != "vector" {
        return None;
    }
    // Equal values may come in any order: the values' order is compared.
    let values = |v: &Value| -> Vec<f64> {
        v["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|item| number(&item["value"][1]))
            .collect()
    };
    let (e, a) = (values(expected), values(actual));
    let same = e.len() == a.len() && e.iter().zip(&a).all(|(x, y)| close(*x, *y));
    (!same).then(|| format!("order {a:?}, expected {e:?}"))
}

/// The same answers as Prometheus on the fresh splits (compaction off), then after the
/// buckets were compacted into level-1 splits, then with pruning off.
#[tokio::test]
async fn promql_answers_equal_prometheus() {
    let Some(prometheus) = Prometheus::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let config = |enabled: bool| {
        let mut config = common::config_in(tmp.path());
        config.compaction.enabled = enabled;
        config.compaction.planner_interval_secs = 1;
        config
    };
    let node = TestNode::start_with(config(false)).await;
    let client = reqwest::Client::new();
    load(&client, &prometheus, &node, "force").await;
    let requests = requests();
    let mut expected = Vec::with_capacity(requests.len());
    for (endpoint, params) in &requests {
        expected.push(get(&client, &prometheus.url, endpoint, params).await);
    }
    let asked = requests.len();
    // Answers with series (or a scalar), and errors, as Prometheus gave them.
    let non_empty = expected
        .iter()
        .filter(|e| {
            e["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
        })
        .count();
    let errors = expected.iter().filter(|e| e["status"] == "error").count();
    let mut failures = differences(&client, &node, &requests, &expected, &[], "fresh splits").await;
    let (_, before) = node.get("/api/v1/indexes/otel-metrics-v0_9/splits").await;
    let splits_before = before["splits"].as_array().unwrap().len();
    node.stop().await;

    // Compaction on: the closed buckets merge into level-1 splits.
    let node = TestNode::start_with(config(true)).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let splits_after = loop {
        let (_, splits) = node
            .get("/api/v1/indexes/otel-metrics-v0_9/splits?split_states=Published")
            .await;
        let list = splits["splits"].as_array().unwrap().clone();
        if !list.is_empty() && list.iter().all(|s| s["key_level"] == 1) {
            break list.len();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not compacted: {splits}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    };
    assert!(
        splits_after < splits_before,
        "{splits_before} -> {splits_after}"
    );
    failures.extend(differences(&client, &node, &requests, &expected, &[], "compacted").await);
    failures.extend(
        differences(
            &client,
            &node,
            &requests,
            &expected,
            &[("shale_pruning", "false".to_string())],
            "compacted, pruning off",
        )
        .await,
    );
    eprintln!(
        "{asked} answers compared three times ({splits_before} fresh splits, then \
         {splits_after} compacted; pruning on and off): {non_empty} with results, {errors} errors"
    );
    assert!(asked > 1000, "{asked} comparisons");
    assert!(
        non_empty > asked * 3 / 4,
        "{non_empty} of {asked} answers hold results"
    );
    assert!(errors > 10, "{errors} errors");
    assert!(
        failures.is_empty(),
        "{} of {} answers differ:\n{}",
        failures.len(),
        asked * 3,
        failures
            .iter()
            .take(25)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    node.stop().await;
}

fn truncate(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 600 {
        format!("{}…", text.chars().take(600).collect::<String>())
    } else {
        text
    }
}
