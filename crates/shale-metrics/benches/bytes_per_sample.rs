//! Bytes per sample of metrics splits, by kind of series — counters, gauges, classic
//! histograms — with scrape times on a regular grid and with a few milliseconds of jitter,
//! and where the bytes go, column by column (compressed sizes from the Parquet footer). The
//! groundwork for choosing encodings by measurement: run it before and after a change.
//!
//! `cargo bench -p shale-metrics --bench bytes_per_sample` (`SERIES`, 2 000 by default, and
//! `SAMPLES` per series, 720: two hours at a 10 s interval).

use std::collections::BTreeMap;

use bytes::Bytes;
use parquet::file::reader::{FileReader, SerializedFileReader};
use rand::{Rng, SeedableRng};
use shale_metrics::{Labels, MetricsSplitWriter, Sample};

/// The kinds of series measured.
#[derive(Clone, Copy)]
enum Kind {
    /// Integral, increasing, reset now and then (requests, bytes).
    Counter,
    /// A float random walk, rounded to two decimals now and then (temperatures, loads).
    Gauge,
    /// Classic histogram buckets: integral counters, 10 per histogram.
    Histogram,
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One split of `series` series of `kind`, `samples` each; jitter in ms (0: a regular grid).
fn split(kind: Kind, series: usize, samples: usize, jitter_ms: i64) -> (Vec<u8>, u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut writer = MetricsSplitWriter::new(vec!["job".to_string(), "instance".to_string()]);
    let bounds = [
        "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "+Inf",
    ];
    for s in 0..series {
        let instance = format!("10.0.{}.{}:9100", s / 250, s % 250);
        let job = format!("job-{}", s % 20);
        let (name, le) = match kind {
            Kind::Counter => ("http_requests_total", None),
            Kind::Gauge => ("node_load", None),
            Kind::Histogram => ("request_duration_seconds_bucket", Some(bounds[s % 10])),
        };
        let mut pairs = vec![
            ("__name__".to_string(), name.to_string()),
            ("job".to_string(), job),
            ("instance".to_string(), instance),
            ("method".to_string(), ["GET", "POST"][s % 2].to_string()),
        ];
        if let Some(le) = le {
            pairs.push(("le".to_string(), le.to_string()));
        }
        let labels = Labels::new(pairs);
        let mut value: f64 = match kind {
            Kind::Gauge => rng.random_range(0.0..4.0),
            _ => rng.random_range(0..10_000) as f64,
        };
        let start = 1_700_000_000_000i64 + rng.random_range(0..10_000);
        let points: Vec<Sample> = (0..samples as i64)
            .map(|i| {
                match kind {
                    Kind::Gauge => {
                        value = (value + rng.random_range(-0.1..0.1)).max(0.0);
                        if rng.random_bool(0.2) {
                            value = (value * 100.0).round() / 100.0;
                        }
                    }
                    _ => {
                        if rng.random_bool(0.001) {
                            value = 0.0;
                        }
                        value += rng.random_range(0..50) as f64;
                    }
                }
                let jitter = if jitter_ms > 0 {
                    rng.random_range(-jitter_ms..=jitter_ms)
                } else {
                    0
                };
                Sample {
                    timestamp_ms: start + i * 10_000 + jitter,
                    value,
                }
            })
            .collect();
        writer.add(&labels, points);
    }
    let (bytes, summary) = writer.finish().expect("a split");
    (bytes, summary.num_samples)
}

/// Compressed bytes of each column, summed over the row groups.
fn columns(bytes: Vec<u8>) -> BTreeMap<String, i64> {
    let reader = SerializedFileReader::new(Bytes::from(bytes)).expect("a Parquet file");
    let mut out = BTreeMap::new();
    for row_group in reader.metadata().row_groups() {
        for column in row_group.columns() {
            *out.entry(column.column_path().string()).or_default() += column.compressed_size();
        }
    }
    out
}

fn main() {
    let series = env("SERIES", 2_000);
    let samples = env("SAMPLES", 720);
    println!("{series} series × {samples} samples at 10 s, by kind of series:");
    for (name, kind) in [
        ("counters", Kind::Counter),
        ("gauges", Kind::Gauge),
        ("histogram buckets", Kind::Histogram),
    ] {
        for jitter in [0, 25] {
            let (bytes, n) = split(kind, series, samples, jitter);
            let total = bytes.len();
            let by_column = columns(bytes);
            let per = |b: i64| b as f64 / n as f64;
            let detail: Vec<String> = by_column
                .iter()
                .map(|(column, b)| format!("{column} {:.3}", per(*b)))
                .collect();
            println!(
                "  {name:<18} jitter ±{jitter:>2} ms: {:.3} bytes/sample  ({})",
                total as f64 / n as f64,
                detail.join(", ")
            );
        }
    }
}
