//! What one split costs to read for selectors of few and many series: through the series
//! index (the timestamps and values of the matching rows only), through the page index (a
//! split written without the series index, as before it existed) and with no pruning (every
//! row decoded, the baseline), measured in the same run on one 15-minute bucket of the
//! `shale-bench metrics` workload (10 000 series, 20 names × 5 modes per host, a sample
//! every 10 s; names numbered rather than node exporter's). Footers are cached, as on a node that read the split before.
//!
//! `cargo bench -p shale-metrics --bench select` (`SERIES`, 10 000, `SAMPLES` per series,
//! 90, and `RUNS`, 50, in the environment).

use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use shale_metrics::{
    read_split_cached, Labels, MatchOp, Matcher, MetricsSplitWriter, Sample, SplitRead,
};

/// Metric names per host: the first half counters, the second gauges.
const NAMES: usize = 20;
const MODES: [&str; 5] = ["idle", "user", "system", "iowait", "irq"];

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The bucket's split, with or without its series index.
fn split(series: usize, samples: usize, indexed: bool) -> Bytes {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut writer = MetricsSplitWriter::new(Vec::new());
    if !indexed {
        writer = writer.without_series_index();
    }
    for i in 0..series {
        let (host, within) = (i / 100, i % 100);
        let kind = within % NAMES;
        let counter = kind < NAMES / 2;
        let name = if counter {
            format!("node_counter_{kind}_total")
        } else {
            format!("node_gauge_{kind}")
        };
        let labels = Labels::new([
            ("__name__".to_string(), name),
            ("instance".to_string(), format!("host-{host:04}:9100")),
            ("job".to_string(), "node".to_string()),
            ("device".to_string(), "d0".to_string()),
            ("mode".to_string(), MODES[within / NAMES].to_string()),
        ]);
        let offset = (host as i64 * 7_919) % 10_000;
        let mut value: f64 = rng.random_range(0.0..1e6f64).round();
        let points: Vec<Sample> = (0..samples as i64)
            .map(|k| {
                value = if counter {
                    value + rng.random_range(0.0..50.0f64).round()
                } else {
                    (value + rng.random_range(-500.0..500.0f64))
                        .max(0.0)
                        .round()
                };
                Sample {
                    timestamp_ms: k * 10_000 + offset,
                    value,
                }
            })
            .collect();
        writer.add(&labels, points);
    }
    Bytes::from(writer.finish().expect("a split").0)
}

fn matcher(name: &str, op: MatchOp, value: &str) -> Matcher {
    Matcher::new(name, op, value).expect("a matcher")
}

/// The p50 of `runs` reads (the selector of run `r` from `selector(r)`), and the last read.
fn time_reads(
    key: &str,
    bytes: &Bytes,
    prune: bool,
    runs: usize,
    selector: &dyn Fn(usize) -> Vec<Matcher>,
) -> (Duration, SplitRead) {
    let mut times = Vec::with_capacity(runs);
    let mut last = SplitRead::default();
    for run in 0..runs + 2 {
        let matchers = selector(run);
        let started = Instant::now();
        last = read_split_cached(Some(key), bytes.clone(), &matchers, 0, i64::MAX, prune)
            .expect("a read");
        if run >= 2 {
            times.push(started.elapsed());
        }
    }
    times.sort();
    (times[times.len() / 2], last)
}

/// [`time_reads`] by byte ranges of `bytes` in memory (as from a local file), the split's
/// decoded timestamps and values cached from its second read on (the warm-up runs).
fn time_cached_reads(
    key: &str,
    bytes: &Bytes,
    runs: usize,
    selector: &dyn Fn(usize) -> Vec<Matcher>,
) -> (Duration, SplitRead) {
    let object = bytes.clone();
    let fetch: shale_metrics::FetchRange =
        std::sync::Arc::new(move |range: std::ops::Range<u64>| {
            let slice = object.slice(range.start as usize..range.end as usize);
            Box::pin(async move { Ok(slice) })
        });
    let reader = shale_metrics::RangeReader::new(bytes.len() as u64, fetch);
    let mut times = Vec::with_capacity(runs);
    let mut last = SplitRead::default();
    for run in 0..runs + 2 {
        let matchers = selector(run);
        let started = Instant::now();
        last = futures::executor::block_on(shale_metrics::read_split_ranges(
            key,
            reader.clone(),
            &matchers,
            0,
            i64::MAX,
            true,
        ))
        .expect("a read");
        if run >= 2 {
            times.push(started.elapsed());
        }
    }
    times.sort();
    (times[times.len() / 2], last)
}

fn main() {
    let series = env("SERIES", 10_000);
    let samples = env("SAMPLES", 90);
    let runs = env("RUNS", 50).max(1);
    let hosts = series.div_ceil(100).max(1);
    let indexed = split(series, samples, true);
    let plain = split(series, samples, false);
    println!(
        "one split: {series} series × {samples} samples; {} bytes with the series index, {} without ({:+.2} bytes per sample)",
        indexed.len(),
        plain.len(),
        (indexed.len() as f64 - plain.len() as f64) / (series * samples) as f64
    );
    type Selector = Box<dyn Fn(usize) -> Vec<Matcher>>;
    let shapes: Vec<(&str, Selector)> = vec![
        (
            "one series (another host each run)",
            Box::new(move |run| {
                vec![
                    matcher("__name__", MatchOp::Equal, "node_counter_0_total"),
                    matcher(
                        "instance",
                        MatchOp::Equal,
                        &format!("host-{:04}:9100", (run * 37) % hosts),
                    ),
                    matcher("mode", MatchOp::Equal, "idle"),
                    matcher("device", MatchOp::Equal, "d0"),
                ]
            }),
        ),
        (
            "50 series (one gauge, 50 hosts by regex)",
            Box::new(|_| {
                vec![
                    matcher("__name__", MatchOp::Equal, "node_gauge_10"),
                    matcher("mode", MatchOp::Equal, "idle"),
                    matcher("instance", MatchOp::Regex, "host-00[0-4][0-9]:9100"),
                ]
            }),
        ),
        (
            "one counter name (5 % of the series)",
            Box::new(|_| vec![matcher("__name__", MatchOp::Equal, "node_counter_1_total")]),
        ),
        (
            "every series",
            Box::new(|_| vec![matcher("job", MatchOp::Equal, "node")]),
        ),
    ];
    println!(
        "{:<42} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "selector", "cached cols", "series idx", "page index", "no pruning", "idx/page", "idx/none"
    );
    for (name, selector) in &shapes {
        let (by_index, read) = time_reads("indexed", &indexed, true, runs, selector.as_ref());
        let (by_pages, pages_read) = time_reads("plain", &plain, true, runs, selector.as_ref());
        let (full, full_read) = time_reads("indexed", &indexed, false, runs, selector.as_ref());
        let (cached, cached_read) = time_cached_reads("cached", &indexed, runs, selector.as_ref());
        assert_eq!(read.series, cached_read.series, "{name}: same answers");
        assert_eq!(read.series, pages_read.series, "{name}: same answers");
        assert_eq!(read.series, full_read.series, "{name}: same answers");
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{:<42} {:>9.3} ms {:>9.3} ms {:>9.3} ms {:>9.3} ms {:>9.3}x {:>9.3}x   ({} series, rows decoded {} / {} / {})",
            name,
            ms(cached),
            ms(by_index),
            ms(by_pages),
            ms(full),
            ms(by_index) / ms(by_pages),
            ms(by_index) / ms(full),
            read.series.len(),
            read.stats.rows_read,
            pages_read.stats.rows_read,
            full_read.stats.rows_read,
        );
    }
}
