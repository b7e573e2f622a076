//! `shale-bench metrics`: Prometheus remote write into a metrics index, end to end.
//!
//! The workload: `--series` series (node-exporter-like: 20 metric names, counters and gauges,
//! over hosts of 100 series each) scraped every `--interval-secs` for `--hours`, sent as
//! remote-write requests of `--samples-per-request` samples in time order (each series one
//! sample per request, as Prometheus's remote-write shards send them) by `--clients`
//! concurrent senders, the bodies snappy-encoded before the clock starts.
//!
//! 1. Baseline, in the same run: decoding the same bodies and writing the samples straight
//!    into Parquet splits (one per 15-minute bucket) in this process — the format's own cost,
//!    without WAL, HTTP or metastore.
//! 2. End to end: a node in this process (embedded defaults: SQLite, local FS) takes the
//!    requests at `/prometheus/api/v1/write`; timed until a final `commit=force` returns
//!    (every sample published and queryable). Throughput in samples/s, and bytes per sample
//!    of the published splits.
//! 3. Two PromQL range queries over the whole span (one host's CPU rate; a sum by mode over
//!    every host): latency and splits opened.

use std::time::{Duration, Instant};

use anyhow::Context;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use shale_metrics::remote_write::{
    encode_remote_write, Label, ProtoSample, TimeSeries, WriteRequest,
};

use crate::ingest::start_node;

#[derive(clap::Args)]
pub struct Args {
    /// Series in the workload.
    #[arg(long, default_value_t = 10_000)]
    series: usize,
    /// Seconds between two samples of a series.
    #[arg(long, default_value_t = 10)]
    interval_secs: u64,
    /// Hours of samples.
    #[arg(long, default_value_t = 2.0)]
    hours: f64,
    /// Samples per remote-write request.
    #[arg(long, default_value_t = 2000)]
    samples_per_request: usize,
    /// Concurrent senders.
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// Seed of the generator.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

const NAMES: [(&str, bool); 20] = [
    ("node_cpu_seconds_total", true),
    ("node_network_receive_bytes_total", true),
    ("node_network_transmit_bytes_total", true),
    ("node_disk_read_bytes_total", true),
    ("node_disk_written_bytes_total", true),
    ("node_disk_io_time_seconds_total", true),
    ("node_context_switches_total", true),
    ("node_intr_total", true),
    ("node_forks_total", true),
    ("http_requests_total", true),
    ("node_memory_MemAvailable_bytes", false),
    ("node_memory_Cached_bytes", false),
    ("node_filesystem_avail_bytes", false),
    ("node_load1", false),
    ("node_load5", false),
    ("node_procs_running", false),
    ("node_sockstat_TCP_inuse", false),
    ("node_entropy_available_bits", false),
    ("process_resident_memory_bytes", false),
    ("go_goroutines", false),
];

/// One series of the workload: its labels, whether it is a counter, its value now.
struct Generated {
    labels: Vec<Label>,
    counter: bool,
    value: f64,
    /// The host's scrape offset (ms) within an interval.
    offset_ms: i64,
}

fn workload(args: &Args) -> Vec<Generated> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let modes = ["idle", "user", "system", "iowait", "irq"];
    (0..args.series)
        .map(|i| {
            let host = i / 100;
            let within = i % 100;
            let (name, counter) = NAMES[within % NAMES.len()];
            let label = |name: &str, value: String| Label {
                name: name.to_string(),
                value,
            };
            let labels = vec![
                label("__name__", name.to_string()),
                label("instance", format!("host-{host:04}:9100")),
                label("job", "node".to_string()),
                label("device", format!("d{}", within / NAMES.len() / modes.len())),
                label(
                    "mode",
                    modes[(within / NAMES.len()) % modes.len()].to_string(),
                ),
            ];
            Generated {
                labels,
                counter,
                value: rng.random_range(0.0..1e6f64).round(),
                offset_ms: (host as i64 * 7_919) % 10_000,
            }
        })
        .collect()
}

/// The remote-write bodies of the workload, in time order.
fn bodies(args: &Args, start_ms: i64) -> (Vec<Vec<u8>>, u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed + 1);
    let mut series = workload(args);
    let steps = (args.hours * 3600.0 / args.interval_secs as f64) as i64;
    let mut out = Vec::new();
    let mut pending: Vec<TimeSeries> = Vec::new();
    let mut samples = 0u64;
    for step in 0..steps {
        let base = start_ms + step * args.interval_secs as i64 * 1000;
        for s in series.iter_mut() {
            if s.counter {
                s.value += rng.random_range(0.0..50.0f64).round();
            } else {
                s.value = (s.value + rng.random_range(-500.0..500.0f64))
                    .max(0.0)
                    .round();
            }
            pending.push(TimeSeries {
                labels: s.labels.clone(),
                samples: vec![ProtoSample {
                    value: s.value,
                    timestamp: base + s.offset_ms,
                }],
                ..Default::default()
            });
            samples += 1;
            if pending.len() >= args.samples_per_request {
                out.push(encode_remote_write(&WriteRequest {
                    timeseries: std::mem::take(&mut pending),
                    ..Default::default()
                }));
            }
        }
    }
    if !pending.is_empty() {
        out.push(encode_remote_write(&WriteRequest {
            timeseries: pending,
            ..Default::default()
        }));
    }
    (out, samples)
}

/// The baseline: decode every body and write the samples into one Parquet split per
/// 15-minute bucket, in this thread. Returns the time and the bytes written.
fn raw_parquet(bodies: &[Vec<u8>]) -> anyhow::Result<(Duration, u64)> {
    let started = Instant::now();
    let mut writers: std::collections::BTreeMap<i64, shale_metrics::MetricsSplitWriter> =
        Default::default();
    for body in bodies {
        let decoded = shale_metrics::remote_write::decode_remote_write(body)?;
        for (labels, samples) in decoded.series {
            for sample in samples {
                writers
                    .entry(shale_metrics::bucket_start_ms(sample.timestamp_ms, 900))
                    .or_insert_with(|| {
                        shale_metrics::MetricsSplitWriter::new(vec![
                            "job".to_string(),
                            "instance".to_string(),
                        ])
                    })
                    .add(&labels, [sample]);
            }
        }
    }
    let mut bytes = 0u64;
    for (_, writer) in writers {
        let (file, _) = writer.finish()?;
        bytes += file.len() as u64;
    }
    Ok((started.elapsed(), bytes))
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let now = (time::OffsetDateTime::now_utc().unix_timestamp() - 60) * 1000;
    let span_ms = (args.hours * 3_600_000.0) as i64;
    let start_ms = now - span_ms;
    eprintln!(
        "generating {} series x {} s x {} h…",
        args.series, args.interval_secs, args.hours
    );
    let (bodies, samples) = bodies(&args, start_ms);
    let body_bytes: usize = bodies.iter().map(Vec::len).sum();
    println!(
        "workload: {} series, one sample every {} s for {} h: {samples} samples in {} remote-write requests ({:.1} MB snappy, {:.2} bytes/sample on the wire)",
        args.series,
        args.interval_secs,
        args.hours,
        bodies.len(),
        body_bytes as f64 / 1e6,
        body_bytes as f64 / samples as f64,
    );

    let (raw_time, raw_bytes) = raw_parquet(&bodies)?;
    let raw_rate = samples as f64 / raw_time.as_secs_f64();
    println!(
        "baseline (decode + Parquet splits in process, 1 thread): {:.2} s, {:.0} samples/s, {:.2} bytes/sample",
        raw_time.as_secs_f64(),
        raw_rate,
        raw_bytes as f64 / samples as f64
    );

    let dir = tempfile::tempdir()?;
    let config = shale_config::NodeConfig::with_data_dir(dir.path());
    let (node, base, client) = start_node(config).await?;
    let url = format!("{base}/prometheus/api/v1/write");
    let started = Instant::now();
    let queue = std::sync::Arc::new(std::sync::Mutex::new(
        bodies
            .into_iter()
            .enumerate()
            .collect::<std::collections::VecDeque<_>>(),
    ));
    let mut tasks = Vec::new();
    for _ in 0..args.clients.max(1) {
        let (queue, client, url) = (queue.clone(), client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let next = queue
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .pop_front();
                let Some((_, body)) = next else {
                    return anyhow::Ok(());
                };
                loop {
                    let resp = client
                        .post(&url)
                        .header("Content-Encoding", "snappy")
                        .header("Content-Type", "application/x-protobuf")
                        .body(body.clone())
                        .send()
                        .await?;
                    match resp.status().as_u16() {
                        204 => break,
                        429 | 503 => tokio::time::sleep(Duration::from_millis(100)).await,
                        status => anyhow::bail!("remote write: {status} {}", resp.text().await?),
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    let acked = started.elapsed();
    let resp = client
        .post(format!("{url}?commit=force"))
        .header("Content-Encoding", "snappy")
        .body(encode_remote_write(&WriteRequest::default()))
        .send()
        .await?;
    anyhow::ensure!(
        resp.status().as_u16() == 204,
        "final commit: {}",
        resp.status()
    );
    // Wait until every acknowledged sample is in a published split.
    let published = loop {
        let splits: Value = client
            .get(format!(
                "{base}/api/v1/indexes/otel-metrics-v0_9/splits?split_states=Published"
            ))
            .send()
            .await?
            .json()
            .await?;
        let list = splits["splits"].as_array().context("splits")?.clone();
        let stored: u64 = list.iter().filter_map(|s| s["num_docs"].as_u64()).sum();
        if stored >= samples || started.elapsed() > Duration::from_secs(3600) {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let elapsed = started.elapsed();
    let stored: u64 = published
        .iter()
        .filter_map(|s| s["num_docs"].as_u64())
        .sum();
    let bytes: u64 = published
        .iter()
        .filter_map(|s| s["size_bytes"].as_u64())
        .sum();
    let rate = samples as f64 / elapsed.as_secs_f64();
    println!(
        "end to end (remote write → WAL → Parquet splits, {} clients): acknowledged in {:.2} s, published in {:.2} s: {:.0} samples/s ({:.2}x the baseline's time)",
        args.clients,
        acked.as_secs_f64(),
        elapsed.as_secs_f64(),
        rate,
        elapsed.as_secs_f64() / raw_time.as_secs_f64(),
    );
    println!(
        "storage: {} splits, {stored} samples, {:.1} MB: {:.2} bytes/sample ({:.2}x the baseline's one split per bucket; 16 bytes/sample as raw timestamp + value)",
        published.len(),
        bytes as f64 / 1e6,
        bytes as f64 / stored.max(1) as f64,
        bytes as f64 / raw_bytes.max(1) as f64,
    );
    anyhow::ensure!(stored == samples, "{stored} samples stored of {samples}");

    for query in [
        "rate(node_cpu_seconds_total{instance=\"host-0042:9100\"}[5m])",
        "sum by (mode) (rate(node_cpu_seconds_total[5m]))",
    ] {
        let mut times = Vec::new();
        let mut opened = String::new();
        for _ in 0..5 {
            let t = Instant::now();
            let resp = client
                .get(format!("{base}/prometheus/api/v1/query_range"))
                .query(&[
                    ("query", query.to_string()),
                    ("start", format!("{}", start_ms / 1000 + 600)),
                    ("end", format!("{}", now / 1000)),
                    ("step", "60".to_string()),
                ])
                .send()
                .await?;
            opened = resp
                .headers()
                .get("x-shale-splits-opened")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("?")
                .to_string();
            let body: Value = resp.json().await?;
            anyhow::ensure!(body["status"] == "success", "{query}: {body}");
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "query_range over {} h, step 60 s: `{query}`: median {:.0} ms, {opened} splits opened",
            args.hours,
            times[times.len() / 2]
        );
    }
    node.shutdown().await;
    Ok(())
}
