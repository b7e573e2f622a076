//! Evaluator throughput on the shapes of `shale-bench metrics`, over an in-memory source (no
//! storage: what the evaluator itself costs). The baseline, measured in the same run, is one
//! pass over every sample the query reads (summing them): the floor of any evaluator.
//!
//! `cargo bench -p shale-promql --bench eval` (options: `SERIES`, `RUNS` in the environment).

use std::time::{Duration, Instant};

use shale_promql::{range_query, EngineOptions, Labels, Matcher, PromqlError, Sample};
use shale_promql::{SeriesSamples, SeriesSource};

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

const NAMES: usize = 20;
const COUNTERS: usize = 10;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `series` series on hosts of 100 (20 names × 5 modes), 10 s apart over 2 h.
fn workload(series: usize) -> Vec<SeriesSamples> {
    (0..series)
        .map(|i| {
            let name = format!(
                "metric_{}{}",
                i % 100 % NAMES,
                if i % 100 % NAMES < COUNTERS {
                    "_total"
                } else {
                    ""
                }
            );
            let labels = Labels::new([
                ("__name__".to_string(), name),
                ("instance".to_string(), format!("host-{}", i / 100)),
                ("job".to_string(), "node".to_string()),
                ("mode".to_string(), format!("m{}", i % 100 / NAMES)),
                ("device".to_string(), "d0".to_string()),
            ]);
            let mut value = 0.0;
            let samples = (0..720)
                .map(|k| {
                    value += (k % 7) as f64;
                    Sample {
                        timestamp_ms: k * 10_000 + (i as i64 % 10) * 100,
                        value,
                    }
                })
                .collect();
            SeriesSamples { labels, samples }
        })
        .collect()
}

fn main() {
    let series = env("SERIES", 10_000);
    let runs = env("RUNS", 5);
    let source = MemSource(workload(series));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let options = EngineOptions::default();
    let (start, end, step) = (3_600_000, 7_200_000, 15_000);
    let sum_of_rates = (0..COUNTERS)
        .map(|n| format!("sum by (instance) (rate(metric_{n}_total[5m]))"))
        .collect::<Vec<_>>()
        .join(" + ");
    let shapes = [
        (
            "one series",
            "metric_3_total{instance=\"host-7\",mode=\"m1\"}".to_string(),
        ),
        ("sum by rate, every counter", sum_of_rates),
        (
            "max_over_time, 20 series",
            "max_over_time(metric_12{mode=\"m0\",instance=~\"host-[01]?[0-9]\"}[5m])".to_string(),
        ),
        (
            "rate, one counter name",
            "rate(metric_1_total[5m])".to_string(),
        ),
    ];
    // Baseline: one pass over the samples of the window, per series.
    let baseline = |filter: &dyn Fn(&Labels) -> bool| {
        let t = Instant::now();
        let mut sum = 0.0;
        for s in source.0.iter().filter(|s| filter(&s.labels)) {
            for x in &s.samples {
                if x.timestamp_ms >= start - 300_000 && x.timestamp_ms <= end {
                    sum += x.value;
                }
            }
        }
        std::hint::black_box(sum);
        t.elapsed()
    };
    println!(
        "{series} series × 720 samples; range query over 1 h at a 15 s step; {runs} runs, median"
    );
    println!(
        "{:<30} {:>12} {:>12} {:>9}",
        "shape", "eval", "scan", "ratio"
    );
    for (name, query) in shapes {
        let mut times: Vec<Duration> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                let out = runtime
                    .block_on(range_query(&source, &query, start, end, step, &options))
                    .expect("the query runs");
                std::hint::black_box(out);
                t.elapsed()
            })
            .collect();
        times.sort();
        let eval = times[times.len() / 2];
        let scan = baseline(&|l: &Labels| {
            let n = l.metric_name();
            match name {
                "one series" => {
                    n == "metric_3_total"
                        && l.get("instance") == Some("host-7")
                        && l.get("mode") == Some("m1")
                }
                "sum by rate, every counter" => n.ends_with("_total"),
                "rate, one counter name" => n == "metric_1_total",
                _ => n == "metric_12" && l.get("mode") == Some("m0"),
            }
        });
        println!(
            "{:<30} {:>10.2}ms {:>10.2}ms {:>8.1}×",
            name,
            eval.as_secs_f64() * 1e3,
            scan.as_secs_f64() * 1e3,
            eval.as_secs_f64() / scan.as_secs_f64().max(1e-9)
        );
    }
}
