//! End-to-end tests of the evaluator over an in-memory source; every expected value is
//! computed by hand from Prometheus 2.42's documented behaviour.

use std::collections::BTreeMap;

use shale_promql::{
    instant_query, range_query, EngineOptions, Labels, Matcher, PromqlError, Sample, SeriesSamples,
    SeriesSource, Value,
};

const STALE: u64 = shale_metrics::STALE_NAN_BITS;

struct MemSource(Vec<SeriesSamples>);

#[async_trait::async_trait]
impl SeriesSource for MemSource {
    async fn select(
        &self,
        matchers: &[Matcher],
        start_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<SeriesSamples>, PromqlError> {
        Ok(self
            .0
            .iter()
            .filter(|s| matchers.iter().all(|m| m.matches(&s.labels)))
            .map(|s| SeriesSamples {
                labels: s.labels.clone(),
                samples: s
                    .samples
                    .iter()
                    .filter(|x| x.timestamp_ms >= start_ms && x.timestamp_ms <= end_ms)
                    .copied()
                    .collect(),
            })
            .collect())
    }
}

/// A series from "name{a=b,...}"-style pairs and (seconds, value) samples.
fn series(name: &str, labels: &[(&str, &str)], samples: &[(i64, f64)]) -> SeriesSamples {
    let mut pairs: Vec<(String, String)> = labels
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    pairs.push(("__name__".to_string(), name.to_string()));
    SeriesSamples {
        labels: Labels::new(pairs),
        samples: samples
            .iter()
            .map(|&(t, v)| Sample {
                timestamp_ms: t * 1000,
                value: v,
            })
            .collect(),
    }
}

fn stale() -> f64 {
    f64::from_bits(STALE)
}

fn key(labels: &Labels) -> String {
    let name = labels.metric_name().to_string();
    let rest: Vec<String> = labels
        .iter()
        .filter(|(n, _)| *n != "__name__")
        .map(|(n, v)| format!("{n}={v}"))
        .collect();
    format!("{name}{{{}}}", rest.join(","))
}

fn source() -> MemSource {
    MemSource(vec![
        series("a", &[], &[(0, 1.0), (60, 2.0)]),
        series("st", &[], &[(0, 1.0), (30, stale())]),
        // A counter with a reset at 45s.
        series(
            "c",
            &[],
            &[(0, 0.0), (15, 10.0), (30, 20.0), (45, 5.0), (60, 15.0)],
        ),
        series("d", &[], &[(10, 5.0), (20, 10.0)]),
        series("c3", &[], &[(20, 1.0), (30, 11.0)]),
        series("g", &[], &[(10, 5.0), (20, 3.0)]),
        series("g2", &[], &[(0, 0.0), (60, 60.0), (120, 120.0)]),
        series("g3", &[], &[(0, 1.0), (60, 2.0), (120, 6.0)]),
        series("m", &[("job", "a"), ("inst", "1")], &[(0, 1.0)]),
        series("m", &[("job", "a"), ("inst", "2")], &[(0, 3.0)]),
        series("m", &[("job", "b"), ("inst", "1")], &[(0, 5.0)]),
        series("m", &[("job", "b"), ("inst", "2")], &[(0, 7.0)]),
        series("n", &[("job", "a"), ("team", "x")], &[(0, 10.0)]),
        series("n", &[("job", "b"), ("team", "y")], &[(0, 100.0)]),
        series("n2", &[("job", "a"), ("k", "1")], &[(0, 1.0)]),
        series("n2", &[("job", "a"), ("k", "2")], &[(0, 2.0)]),
        series("h", &[("le", "1")], &[(0, 10.0)]),
        series("h", &[("le", "2")], &[(0, 20.0)]),
        series("h", &[("le", "+Inf")], &[(0, 20.0)]),
        series("h2", &[("le", "1")], &[(0, 10.0)]),
        series("h2", &[("le", "2")], &[(0, 20.0)]),
        series("h3", &[("le", "1")], &[(0, 10.0)]),
        series("h3", &[("le", "2")], &[(0, 8.0)]),
        series("h3", &[("le", "+Inf")], &[(0, 20.0)]),
        series("h4", &[("le", "1")], &[(0, 10.0)]),
        series("h4", &[("le", "2")], &[(0, 20.0)]),
        series("h4", &[("le", "+Inf")], &[(0, 30.0)]),
        series("dup", &[("x", "1")], &[(0, 3.0)]),
    ])
}

async fn try_instant(q: &str, t_secs: i64) -> Result<Value, PromqlError> {
    instant_query(&source(), q, t_secs * 1000, &EngineOptions::default())
        .await
        .map(|o| o.value)
}

async fn instant(q: &str, t_secs: i64) -> Value {
    match try_instant(q, t_secs).await {
        Ok(v) => v,
        Err(err) => panic!("{q}: {err}"),
    }
}

/// An instant vector result as label key → value.
async fn vector(q: &str, t_secs: i64) -> BTreeMap<String, f64> {
    match instant(q, t_secs).await {
        Value::Vector(v) => v.iter().map(|s| (key(&s.labels), s.value)).collect(),
        other => panic!("{q}: not a vector: {other:?}"),
    }
}

async fn one(q: &str, t_secs: i64) -> f64 {
    let v = vector(q, t_secs).await;
    assert_eq!(v.len(), 1, "{q}: {v:?}");
    v.into_values().next().unwrap_or(f64::NAN)
}

async fn scalar(q: &str, t_secs: i64) -> f64 {
    match instant(q, t_secs).await {
        Value::Scalar { value, .. } => value,
        other => panic!("{q}: not a scalar: {other:?}"),
    }
}

fn map(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1.0)
}

#[tokio::test]
async fn instant_selector_lookback_and_staleness() {
    assert_eq!(vector("a", 60).await, map(&[("a{}", 2.0)]));
    assert_eq!(vector("a", 90).await, map(&[("a{}", 2.0)]));
    // The lookback window is closed in 2.42: a sample exactly 5m old is still seen.
    assert_eq!(vector("a", 360).await, map(&[("a{}", 2.0)]));
    assert!(vector("a", 361).await.is_empty());
    assert!(vector("a", -1).await.is_empty());
    assert_eq!(vector("st", 20).await, map(&[("st{}", 1.0)]));
    assert!(
        vector("st", 30).await.is_empty(),
        "ends at the stale marker"
    );
    assert!(vector("st", 45).await.is_empty());
    // The output timestamp is the evaluation time.
    match instant("a", 90).await {
        Value::Vector(v) => assert_eq!(v[0].timestamp_ms, 90_000),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn offset_and_at() {
    assert_eq!(one("a offset 1m", 120).await, 2.0);
    assert_eq!(one("a offset 1m", 90).await, 1.0);
    assert_eq!(one("a offset -1m", 0).await, 2.0);
    assert_eq!(one("a @ 60", 1000).await, 2.0);
    assert_eq!(one("a @ 30", 1000).await, 1.0);
    assert_eq!(one("a @ 120 offset 1m", 0).await, 2.0);
    assert_eq!(one("a @ end()", 59).await, 1.0);
    assert_eq!(one("count_over_time(a[1m] @ 60)", 5000).await, 2.0);
    assert_eq!(one("count_over_time(a[1m] offset 1m)", 120).await, 2.0);
    assert_eq!(one("count_over_time(a[1m] offset 1m)", 121).await, 1.0);
}

#[tokio::test]
async fn range_selector_top_level() {
    match instant("c[30s]", 60).await {
        Value::Matrix(m) => {
            assert_eq!(m.len(), 1);
            let ts: Vec<i64> = m[0].samples.iter().map(|s| s.timestamp_ms).collect();
            // Closed window [30s, 60s].
            assert_eq!(ts, vec![30_000, 45_000, 60_000]);
            assert_eq!(m[0].labels.metric_name(), "c");
        }
        other => panic!("{other:?}"),
    }
    match instant("st[1m]", 60).await {
        Value::Matrix(m) => {
            assert_eq!(m[0].samples.len(), 1, "the stale marker is dropped");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn rate_increase_delta() {
    // All five samples in [0, 60]; reset at 45 adds 20: 15 + 20 = 35, no extrapolation.
    assert_eq!(vector("increase(c[1m])", 60).await, map(&[("{}", 35.0)]));
    assert!(close(one("rate(c[1m])", 60).await, 35.0 / 60.0));
    // Sparse: 10s→5, 20s→10 in [0, 60]: to start 10s (< 11s, and the zero point is at
    // 10s), to end 40s (> 11s: half an interval): 5 * (10 + 10 + 5) / 10 = 12.5.
    assert!(close(one("increase(d[1m])", 60).await, 12.5));
    assert!(close(one("rate(d[1m])", 60).await, 12.5 / 60.0));
    // Not a counter: -2 * 25 / 10.
    assert!(close(one("delta(g[1m])", 60).await, -5.0));
    // The counter is not extrapolated below zero: 1 at 20s, 11 at 30s reaches zero 1s
    // before its first sample: 10 * (10 + 1 + 5) / 10 = 16.
    assert!(close(one("increase(c3[1m])", 60).await, 16.0));
    // Fewer than two samples: nothing.
    assert!(vector("rate(a[30s])", 60).await.is_empty());
}

#[tokio::test]
async fn irate_idelta() {
    assert!(close(one("irate(c[1m])", 60).await, 10.0 / 15.0));
    // Last two at 50s are 30s→20 and 45s→5: a reset, so 5 / 15.
    assert!(close(one("irate(c[1m])", 50).await, 5.0 / 15.0));
    assert_eq!(one("idelta(c[1m])", 50).await, -15.0);
}

#[tokio::test]
async fn regression_functions() {
    assert!(close(one("deriv(g2[2m])", 120).await, 1.0));
    assert!(close(one("predict_linear(g2[2m], 60)", 120).await, 180.0));
    assert!(close(one("deriv(g3[2m])", 120).await, 1.0 / 24.0));
    // Relative to 120s: mean 3 at 60s, so 3 + 60 / 24.
    assert!(close(one("predict_linear(g3[2m], 0)", 120).await, 5.5));
    assert!(close(one("predict_linear(g3[2m], 24)", 120).await, 6.5));
}

#[tokio::test]
async fn over_time_functions() {
    let t = 120;
    assert_eq!(
        vector("avg_over_time(g3[2m])", t).await,
        map(&[("{}", 3.0)])
    );
    assert_eq!(one("min_over_time(g3[2m])", t).await, 1.0);
    assert_eq!(one("max_over_time(g3[2m])", t).await, 6.0);
    assert_eq!(one("sum_over_time(g3[2m])", t).await, 9.0);
    assert_eq!(one("count_over_time(g3[2m])", t).await, 3.0);
    assert!(close(one("stdvar_over_time(g3[2m])", t).await, 14.0 / 3.0));
    assert!(close(
        one("stddev_over_time(g3[2m])", t).await,
        (14.0f64 / 3.0).sqrt()
    ));
    assert_eq!(one("quantile_over_time(0.5, g3[2m])", t).await, 2.0);
    assert_eq!(one("quantile_over_time(0.75, g3[2m])", t).await, 4.0);
    assert_eq!(one("changes(g3[2m])", t).await, 2.0);
    assert_eq!(one("resets(c[1m])", 60).await, 1.0);
    assert_eq!(one("present_over_time(g3[2m])", t).await, 1.0);
    // last_over_time keeps the metric name.
    assert_eq!(
        vector("last_over_time(g3[2m])", t).await,
        map(&[("g3{}", 6.0)])
    );
    // holt_winters: s1=0, b=60; i=1: 0.5*60 + 0.5*(0+60) = 60; i=2: b = 0.5*60+0.5*60 = 60,
    // 0.5*120 + 0.5*(60+60) = 120.
    assert!(close(one("holt_winters(g2[2m], 0.5, 0.5)", t).await, 120.0));
    assert!(matches!(
        try_instant("holt_winters(g2[2m], 1, 0.5)", t).await,
        Err(PromqlError::Execution(_))
    ));
}

#[tokio::test]
async fn histogram_quantile_cases() {
    assert!(close(one("histogram_quantile(0.75, h)", 0).await, 1.5));
    assert_eq!(vector("histogram_quantile(0.75, h)", 0).await.len(), 1);
    assert!(
        one("histogram_quantile(0.5, h2)", 0).await.is_nan(),
        "no +Inf"
    );
    // Non-monotonic counts are fixed: le=2 becomes 10; rank 10 falls in the first bucket.
    assert!(close(one("histogram_quantile(0.5, h3)", 0).await, 1.0));
    // Rank in the +Inf bucket: the highest finite bound.
    assert_eq!(one("histogram_quantile(0.99, h4)", 0).await, 2.0);
    assert_eq!(one("histogram_quantile(-1, h)", 0).await, f64::NEG_INFINITY);
    assert_eq!(one("histogram_quantile(2, h)", 0).await, f64::INFINITY);
    // Linear interpolation in the first bucket from 0.
    assert!(close(one("histogram_quantile(0.25, h)", 0).await, 0.5));
}

#[tokio::test]
async fn aggregations() {
    assert_eq!(
        vector("sum by (job) (m)", 0).await,
        map(&[("{job=a}", 4.0), ("{job=b}", 12.0)])
    );
    assert_eq!(
        vector("sum without (inst) (m)", 0).await,
        map(&[("{job=a}", 4.0), ("{job=b}", 12.0)])
    );
    assert_eq!(vector("sum(m)", 0).await, map(&[("{}", 16.0)]));
    assert_eq!(
        vector("avg by (job) (m)", 0).await,
        map(&[("{job=a}", 2.0), ("{job=b}", 6.0)])
    );
    assert_eq!(vector("count(m)", 0).await, map(&[("{}", 4.0)]));
    assert_eq!(
        vector("min by (inst) (m)", 0).await,
        map(&[("{inst=1}", 1.0), ("{inst=2}", 3.0)])
    );
    assert_eq!(vector("max(m)", 0).await, map(&[("{}", 7.0)]));
    assert_eq!(
        vector("group by (job) (m)", 0).await,
        map(&[("{job=a}", 1.0), ("{job=b}", 1.0)])
    );
    assert_eq!(
        vector("stddev by (job) (m)", 0).await,
        map(&[("{job=a}", 1.0), ("{job=b}", 1.0)])
    );
    assert_eq!(vector("stdvar(m)", 0).await, map(&[("{}", 5.0)]));
    assert_eq!(
        vector("topk(1, m)", 0).await,
        map(&[("m{inst=2,job=b}", 7.0)])
    );
    assert_eq!(
        vector("topk by (job) (1, m)", 0).await,
        map(&[("m{inst=2,job=a}", 3.0), ("m{inst=2,job=b}", 7.0)])
    );
    assert_eq!(
        vector("bottomk(2, m)", 0).await,
        map(&[("m{inst=1,job=a}", 1.0), ("m{inst=2,job=a}", 3.0)])
    );
    assert!(vector("topk(0, m)", 0).await.is_empty());
    assert_eq!(vector("quantile(0.5, m)", 0).await, map(&[("{}", 4.0)]));
    assert_eq!(
        vector("count_values(\"v\", m or dup)", 0).await,
        map(&[
            ("{v=1}", 1.0),
            ("{v=3}", 2.0),
            ("{v=5}", 1.0),
            ("{v=7}", 1.0)
        ])
    );
    assert_eq!(
        vector("count_values by (job) (\"v\", m)", 0).await,
        map(&[
            ("{job=a,v=1}", 1.0),
            ("{job=a,v=3}", 1.0),
            ("{job=b,v=5}", 1.0),
            ("{job=b,v=7}", 1.0)
        ])
    );
    assert_eq!(
        vector("count_values(\"v\", vector(1e21))", 0).await,
        map(&[("{v=1000000000000000000000}", 1.0)])
    );
    assert_eq!(
        vector("sum by (__name__) (m)", 0).await,
        map(&[("m{}", 16.0)])
    );
}

#[tokio::test]
async fn arithmetic_and_comparison() {
    assert_eq!(
        vector("m{job=\"a\"} + 1", 0).await,
        map(&[("{inst=1,job=a}", 2.0), ("{inst=2,job=a}", 4.0)])
    );
    assert_eq!(
        vector("m > 4", 0).await,
        map(&[("m{inst=1,job=b}", 5.0), ("m{inst=2,job=b}", 7.0)])
    );
    assert_eq!(
        vector("4 < m", 0).await,
        map(&[("m{inst=1,job=b}", 5.0), ("m{inst=2,job=b}", 7.0)])
    );
    assert_eq!(
        vector("m{job=\"a\"} > bool 2", 0).await,
        map(&[("{inst=1,job=a}", 0.0), ("{inst=2,job=a}", 1.0)])
    );
    assert_eq!(scalar("2 ^ 3 ^ 2", 0).await, 512.0);
    assert_eq!(scalar("-7 % 3", 0).await, -1.0);
    assert_eq!(scalar("1 / 0", 0).await, f64::INFINITY);
    assert!(scalar("0 / 0", 0).await.is_nan());
    assert_eq!(scalar("1 + 2 * 3", 0).await, 7.0);
    assert_eq!(scalar("2 > bool 1", 0).await, 1.0);
    assert_eq!(
        vector("-m{job=\"a\"}", 0).await,
        map(&[("{inst=1,job=a}", -1.0), ("{inst=2,job=a}", -3.0)])
    );
    // One-to-one on all labels but the name.
    assert_eq!(
        vector("m{job=\"a\"} - m{job=\"a\"}", 0).await,
        map(&[("{inst=1,job=a}", 0.0), ("{inst=2,job=a}", 0.0)])
    );
    // on(): the result keeps only the matching labels.
    assert_eq!(
        vector("m{inst=\"1\"} + on(job) n", 0).await,
        map(&[("{job=a}", 11.0), ("{job=b}", 105.0)])
    );
    assert_eq!(
        vector("m{inst=\"1\"} * ignoring(inst, team) n", 0).await,
        map(&[("{job=a}", 10.0), ("{job=b}", 500.0)])
    );
    assert_eq!(
        vector("m * on(job) group_left(team) n", 0).await,
        map(&[
            ("{inst=1,job=a,team=x}", 10.0),
            ("{inst=2,job=a,team=x}", 30.0),
            ("{inst=1,job=b,team=y}", 500.0),
            ("{inst=2,job=b,team=y}", 700.0)
        ])
    );
    assert_eq!(
        vector("n / on(job) group_right m", 0).await,
        map(&[
            ("{inst=1,job=a}", 10.0),
            ("{inst=2,job=a}", 10.0 / 3.0),
            ("{inst=1,job=b}", 20.0),
            ("{inst=2,job=b}", 100.0 / 7.0)
        ])
    );
    // Comparison with group_left keeps the left values and names.
    assert_eq!(
        vector("m > on(job) group_left n{job=\"a\"} / 5", 0).await,
        map(&[("m{inst=2,job=a}", 3.0)])
    );
}

#[tokio::test]
async fn matching_errors() {
    match try_instant("m + on(job) n", 0).await {
        Err(PromqlError::Execution(msg)) => assert!(
            msg.contains("many-to-one matching must be explicit (group_left/group_right)"),
            "{msg}"
        ),
        other => panic!("{other:?}"),
    }
    match try_instant("m * on(job) group_left n2", 0).await {
        Err(PromqlError::Execution(msg)) => assert!(
            msg.starts_with(
                "found duplicate series for the match group {job=\"a\"} on the right hand-side of the operation"
            ),
            "{msg}"
        ),
        other => panic!("{other:?}"),
    }
    match try_instant("n2 * on(job) group_right m", 0).await {
        Err(PromqlError::Execution(msg)) => {
            assert!(msg.contains("on the left hand-side"), "{msg}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn same_labelset_error() {
    // After dropping the name, series of m and of n2 would collide: build two such series.
    let src = MemSource(vec![
        series("x", &[("j", "1")], &[(0, 1.0)]),
        series("y", &[("j", "1")], &[(0, 2.0)]),
    ]);
    let err = instant_query(&src, "abs({j=\"1\"})", 0, &EngineOptions::default())
        .await
        .expect_err("duplicate labelset");
    assert_eq!(
        err.to_string(),
        "vector cannot contain metrics with the same labelset"
    );
    let err = instant_query(&src, "rate({j=\"1\"}[1m])", 0, &EngineOptions::default()).await;
    assert!(err.is_ok(), "no output: fewer than two samples");
}

#[tokio::test]
async fn set_operators() {
    assert_eq!(
        vector("m and on(job) n{job=\"a\"}", 0).await,
        map(&[("m{inst=1,job=a}", 1.0), ("m{inst=2,job=a}", 3.0)])
    );
    assert_eq!(
        vector("m unless on(job) n{job=\"a\"}", 0).await,
        map(&[("m{inst=1,job=b}", 5.0), ("m{inst=2,job=b}", 7.0)])
    );
    assert_eq!(
        vector("m{job=\"a\"} or n", 0).await,
        map(&[
            ("m{inst=1,job=a}", 1.0),
            ("m{inst=2,job=a}", 3.0),
            ("n{job=a,team=x}", 10.0),
            ("n{job=b,team=y}", 100.0)
        ])
    );
    assert_eq!(
        vector("n or on(job) m", 0).await,
        map(&[("n{job=a,team=x}", 10.0), ("n{job=b,team=y}", 100.0)])
    );
    assert!(vector("m and nothing", 0).await.is_empty());
    assert_eq!(vector("m unless nothing", 0).await.len(), 4);
}

#[tokio::test]
async fn subqueries() {
    // Steps 0, 60, 120 (aligned, closed window [0, 120]).
    assert_eq!(one("max_over_time(g2[2m:1m])", 120).await, 120.0);
    assert_eq!(one("count_over_time(g2[2m:1m])", 120).await, 3.0);
    // Steps 60, 90, 120: 60 + 60 (lookback) + 120.
    assert_eq!(one("sum_over_time(g2[1m:30s])", 120).await, 240.0);
    // Default step: 1m.
    assert_eq!(one("count_over_time(g2[3m:])", 150).await, 3.0);
    match instant("g2[2m:1m]", 150).await {
        Value::Matrix(m) => {
            let pts: Vec<(i64, f64)> = m[0]
                .samples
                .iter()
                .map(|s| (s.timestamp_ms, s.value))
                .collect();
            assert_eq!(pts, vec![(60_000, 60.0), (120_000, 120.0)]);
            assert_eq!(m[0].labels.metric_name(), "g2");
        }
        other => panic!("{other:?}"),
    }
    // Offset on a subquery and nested subqueries.
    assert_eq!(one("max_over_time(g2[1m:1m] offset 1m)", 120).await, 60.0);
    assert_eq!(
        one("max_over_time(max_over_time(g2[1m:30s])[2m:1m])", 120).await,
        120.0
    );
    assert!(close(one("rate(g2[2m:1m])", 120).await, 1.0));
}

#[tokio::test]
async fn label_functions() {
    assert_eq!(
        vector(
            "label_replace(n, \"dst\", \"pre-$1\", \"team\", \"(.*)\")",
            0
        )
        .await,
        map(&[
            ("n{dst=pre-x,job=a,team=x}", 10.0),
            ("n{dst=pre-y,job=b,team=y}", 100.0)
        ])
    );
    // No match: unchanged.
    assert_eq!(
        vector("label_replace(n, \"dst\", \"$1\", \"team\", \"z(.*)\")", 0).await,
        map(&[("n{job=a,team=x}", 10.0), ("n{job=b,team=y}", 100.0)])
    );
    // An empty result removes the label.
    assert_eq!(
        vector("label_replace(n, \"team\", \"\", \"team\", \".*\")", 0).await,
        map(&[("n{job=a}", 10.0), ("n{job=b}", 100.0)])
    );
    assert_eq!(
        vector(
            "label_join(n, \"j\", \"-\", \"job\", \"team\", \"none\")",
            0
        )
        .await,
        map(&[
            ("n{j=a-x-,job=a,team=x}", 10.0),
            ("n{j=b-y-,job=b,team=y}", 100.0)
        ])
    );
    assert!(matches!(
        try_instant("label_replace(n, \"1bad\", \"\", \"team\", \".*\")", 0).await,
        Err(PromqlError::Execution(_))
    ));
}

#[tokio::test]
async fn absent_functions() {
    assert_eq!(
        vector("absent(nope{job=\"x\", env=~\"y\", a=\"1\", a=\"2\"})", 0).await,
        map(&[("{job=x}", 1.0)])
    );
    assert!(vector("absent(m)", 0).await.is_empty());
    assert_eq!(vector("absent(sum(nope))", 0).await, map(&[("{}", 1.0)]));
    assert_eq!(
        vector("absent_over_time(nope{a=\"b\"}[1m])", 0).await,
        map(&[("{a=b}", 1.0)])
    );
    assert!(vector("absent_over_time(a[1m])", 60).await.is_empty());
}

#[tokio::test]
async fn scalar_vector_and_time_functions() {
    assert_eq!(scalar("time()", 100).await, 100.0);
    assert_eq!(scalar("pi()", 0).await, std::f64::consts::PI);
    assert_eq!(vector("vector(1)", 0).await, map(&[("{}", 1.0)]));
    assert!(scalar("scalar(m)", 0).await.is_nan());
    assert_eq!(scalar("scalar(g2)", 120).await, 120.0);
    assert_eq!(one("hour(vector(18420))", 0).await, 5.0);
    assert_eq!(one("minute(vector(18420))", 0).await, 7.0);
    assert_eq!(one("day_of_week(vector(0))", 0).await, 4.0);
    assert_eq!(one("year(vector(0))", 0).await, 1970.0);
    assert_eq!(one("month(vector(3456000))", 0).await, 2.0);
    assert_eq!(one("day_of_month(vector(3456000))", 0).await, 10.0);
    assert_eq!(one("day_of_year(vector(3456000))", 0).await, 41.0);
    assert_eq!(one("days_in_month(vector(3456000))", 0).await, 28.0);
    // 2024-02-29T12:00:00Z.
    assert_eq!(one("days_in_month(vector(1709208000))", 0).await, 29.0);
    assert_eq!(one("day_of_year(vector(1709208000))", 0).await, 60.0);
    // Default argument: the evaluation time.
    assert_eq!(one("hour()", 7200).await, 2.0);
    assert_eq!(one("timestamp(g2)", 150).await, 120.0);
    assert_eq!(one("timestamp(g2 + 1)", 150).await, 150.0);
    assert_eq!(one("round(vector(2.5))", 0).await, 3.0);
    assert_eq!(one("round(vector(-2.5))", 0).await, -2.0);
    assert!(close(one("round(vector(1.234), 0.1)", 0).await, 1.2));
    assert_eq!(one("clamp(vector(5), 0, 2)", 0).await, 2.0);
    assert!(vector("clamp(vector(5), 3, 2)", 0).await.is_empty());
    assert_eq!(one("clamp_min(vector(5), 7)", 0).await, 7.0);
    assert_eq!(one("clamp_max(vector(5), 1)", 0).await, 1.0);
    assert_eq!(one("abs(vector(-3))", 0).await, 3.0);
    assert_eq!(one("sgn(vector(-3))", 0).await, -1.0);
    assert_eq!(one("sqrt(vector(16))", 0).await, 4.0);
    assert_eq!(one("deg(vector(pi()))", 0).await, 180.0);
    // Functions drop the name.
    assert_eq!(vector("abs(g2)", 120).await, map(&[("{}", 120.0)]));
}

#[tokio::test]
async fn sort_orders() {
    let order = |v: Value| -> Vec<f64> {
        match v {
            Value::Vector(v) => v.iter().map(|s| s.value).collect(),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(order(instant("sort(m)", 0).await), vec![1.0, 3.0, 5.0, 7.0]);
    assert_eq!(
        order(instant("sort_desc(m)", 0).await),
        vec![7.0, 5.0, 3.0, 1.0]
    );
    match instant("sort(m)", 0).await {
        Value::Vector(v) => assert_eq!(v[0].labels.metric_name(), "m"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn range_query_shape() {
    let opts = EngineOptions::default();
    let out = range_query(&source(), "g2", 0, 120_000, 60_000, &opts)
        .await
        .expect("range query");
    match out.value {
        Value::Matrix(m) => {
            assert_eq!(m.len(), 1);
            let pts: Vec<(i64, f64)> = m[0]
                .samples
                .iter()
                .map(|s| (s.timestamp_ms, s.value))
                .collect();
            assert_eq!(pts, vec![(0, 0.0), (60_000, 60.0), (120_000, 120.0)]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(out.stats.series_read, 1);
    assert_eq!(out.stats.samples_read, 3);
    let out = range_query(&source(), "1 + 1", 0, 60_000, 30_000, &opts)
        .await
        .expect("range query");
    match out.value {
        Value::Matrix(m) => {
            assert_eq!(m.len(), 1);
            assert!(m[0].labels.is_empty());
            assert_eq!(m[0].samples.len(), 3);
        }
        other => panic!("{other:?}"),
    }
    // Sorted by labels.
    let out = range_query(&source(), "m", 0, 0, 1000, &opts)
        .await
        .expect("range query");
    match out.value {
        Value::Matrix(m) => {
            let keys: Vec<String> = m.iter().map(|s| key(&s.labels)).collect();
            let mut sorted = keys.clone();
            sorted.sort();
            assert_eq!(keys, sorted);
            assert_eq!(keys.len(), 4);
        }
        other => panic!("{other:?}"),
    }
    // The stale marker ends the series in a range query.
    let out = range_query(&source(), "st", 0, 60_000, 15_000, &opts)
        .await
        .expect("range query");
    match out.value {
        Value::Matrix(m) => assert_eq!(m[0].samples.len(), 2),
        other => panic!("{other:?}"),
    }
    let err = range_query(&source(), "\"x\"", 0, 60_000, 15_000, &opts)
        .await
        .expect_err("string");
    assert_eq!(
        err.to_string(),
        "invalid expression type \"string\" for range query, must be Scalar or instant Vector"
    );
    assert!(matches!(
        range_query(&source(), "a[1m]", 0, 60_000, 15_000, &opts).await,
        Err(PromqlError::BadData(_))
    ));
    assert!(matches!(
        instant_query(&source(), "sum(", 0, &opts).await,
        Err(PromqlError::BadData(_))
    ));
}

#[tokio::test]
async fn instant_scalar_and_string() {
    assert_eq!(
        instant("1", 5).await,
        Value::Scalar {
            timestamp_ms: 5000,
            value: 1.0
        }
    );
    assert_eq!(
        instant("\"hi\"", 5).await,
        Value::String {
            timestamp_ms: 5000,
            value: "hi".to_string()
        }
    );
}

#[tokio::test]
async fn max_samples_enforced() {
    let opts = EngineOptions {
        max_samples: 5,
        ..EngineOptions::default()
    };
    let err = range_query(&source(), "m", 0, 60_000, 15_000, &opts)
        .await
        .expect_err("too many samples");
    assert!(matches!(err, PromqlError::TooManySamples(_)), "{err}");
    let ok = instant_query(&source(), "sum(m)", 0, &opts).await;
    assert!(ok.is_ok());
    let opts = EngineOptions {
        timeout: std::time::Duration::ZERO,
        ..EngineOptions::default()
    };
    let err = range_query(&source(), "m", 0, 60_000, 15_000, &opts)
        .await
        .expect_err("timeout");
    assert!(matches!(err, PromqlError::Timeout(_)), "{err}");
}

#[tokio::test]
async fn long_range_query_uses_windows() {
    let samples: Vec<(i64, f64)> = (0..100_000).map(|t| (t, t as f64)).collect();
    let src = MemSource(vec![series("lin", &[("k", "v")], &samples)]);
    let started = std::time::Instant::now();
    let out = range_query(
        &src,
        "rate(lin[5m]) and lin",
        300_000,
        99_000_000,
        60_000,
        &EngineOptions::default(),
    )
    .await
    .expect("range query");
    match out.value {
        Value::Matrix(m) => {
            assert_eq!(m.len(), 1);
            assert_eq!(m[0].samples.len(), 1646);
            assert!(m[0].samples.iter().all(|s| close(s.value, 1.0)));
            assert_eq!(key(&m[0].labels), "{k=v}");
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

/// A range query over many series — its range functions computed for every step at once,
/// on several threads, and aggregations folded from those tables — answers at each step
/// exactly (bit for bit) what an instant query at that time answers step by step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_queries_over_many_series_equal_instant_queries_at_each_step() {
    // 2 400 series × 61 steps: enough work for the threads.
    let mut all = Vec::new();
    for i in 0..2_400u32 {
        let mut value = f64::from(i % 7);
        let samples: Vec<(i64, f64)> = (0..60)
            .map(|k| {
                // Counters with a reset now and then, and a few NaNs and infinities.
                value = if (k + i as i64) % 23 == 0 {
                    0.5
                } else {
                    value + f64::from((i * 31 + k as u32) % 11) / 3.0
                };
                let v = match (i % 97, k % 17) {
                    (0, 3) => f64::NAN,
                    (1, 5) => f64::INFINITY,
                    _ => value,
                };
                (k * 10 + i64::from(i % 10), v)
            })
            .collect();
        let group = format!("g{}", i % 13);
        let instance = format!("i{i}");
        all.push(series(
            "c_total",
            &[("group", &group), ("instance", &instance)],
            &samples,
        ));
    }
    let source = MemSource(all);
    let options = EngineOptions::default();
    let (start, end, step) = (60_000, 660_000, 10_000);
    for query in [
        "rate(c_total[1m])",
        "sum by (group) (rate(c_total[1m]))",
        "avg by (group) (max_over_time(c_total[30s]))",
        "stddev without (instance) (increase(c_total[2m]))",
        "count(changes(c_total[1m])) + min(resets(c_total[2m]))",
        "max by (group) (deriv(c_total[1m])) - group by (group) (c_total)",
    ] {
        let Value::Matrix(range) = range_query(&source, query, start, end, step, &options)
            .await
            .unwrap()
            .value
        else {
            panic!("{query}: not a matrix");
        };
        let mut by_step: BTreeMap<(i64, String), u64> = BTreeMap::new();
        for s in &range {
            for p in &s.samples {
                by_step.insert(
                    (p.timestamp_ms, format!("{:?}", s.labels)),
                    p.value.to_bits(),
                );
            }
        }
        let mut expected: BTreeMap<(i64, String), u64> = BTreeMap::new();
        let mut t = start;
        while t <= end {
            let Value::Vector(v) = instant_query(&source, query, t, &options)
                .await
                .unwrap()
                .value
            else {
                panic!("{query}: not a vector");
            };
            for e in v {
                expected.insert((t, format!("{:?}", e.labels)), e.value.to_bits());
            }
            t += step;
        }
        assert!(!expected.is_empty(), "{query}: no values");
        assert_eq!(by_step.len(), expected.len(), "{query}: points");
        for (key, bits) in &expected {
            let got = by_step.get(key).copied();
            let same = got == Some(*bits)
                || (got.is_some_and(|g| f64::from_bits(g).is_nan())
                    && f64::from_bits(*bits).is_nan());
            assert!(
                same,
                "{query} at {key:?}: {:?} from the range query, {} step by step",
                got.map(f64::from_bits),
                f64::from_bits(*bits)
            );
        }
    }
}
