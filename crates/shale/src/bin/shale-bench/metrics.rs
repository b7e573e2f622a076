//! `shale-bench metrics`: Prometheus remote write into Shale's metrics index, side by side
//! with Prometheus 2.42 and VictoriaMetrics 1.79 on the same samples.
//!
//! The workload: `--series` series (node-exporter-like: 20 metric names, counters and gauges,
//! over hosts of 100 series each, labels `__name__`, `instance`, `job`, `mode`, `device`)
//! scraped every `--interval-secs` for `--hours`, the last sample 20 minutes before now (so
//! every 15-minute bucket of Shale is closed and compacted). The series are dealt to
//! `--clients` concurrent remote-write clients by index modulo the clients, each client
//! sending its own requests of `--samples-per-request` samples in time order (a series is
//! never split over two clients: Prometheus refuses out-of-order samples). The bodies are
//! snappy-encoded once, before any clock starts, and the same bodies go to every system.
//!
//! 1. Baseline, in process: decoding the bodies and writing the samples straight into
//!    Parquet splits (one per 15-minute bucket), one thread — the format's own cost.
//! 2. Prometheus (`prometheus` on `PATH`, unless `--skip-prometheus`), started by the bench on
//!    a free port: ingest by remote write until the last acknowledgement; a check that it
//!    holds every sample (`count_over_time`); bytes per sample of the head written as a block
//!    (`snapshot?skip_head=false`); four `query_range` shapes over the last hour of data at
//!    a 15 s step (one series; `rate` of one series; `sum by (instance) (rate(NAME[5m]))`
//!    added over every counter; `max_over_time` of 50 series), p50 and p99 over
//!    `--query-runs` runs after 2 warm-ups, each run asking for other series (or, for the
//!    sum, another window) so that no cache answers from an earlier run.
//! 3. VictoriaMetrics (`victoria-metrics` on `PATH`, unless `--skip-victoria-metrics`), the
//!    same, ingest timed until the last acknowledgement plus `/internal/force_flush`, bytes
//!    per sample of its data directory once it stopped changing after the flush.
//! 4. Shale, a node in this process (embedded defaults: SQLite, local FS) with automatic
//!    compaction off: ingest at `/prometheus/api/v1/write` timed until every acknowledged
//!    sample answers PromQL (the sample check, polled: from memory or from splits), then
//!    until a final `commit=force` has every sample in a published split; bytes per sample
//!    of the published splits; the sample check again; the queries (with the splits each
//!    opened) — "before compaction".
//! 5. Shale's metrics merge, in process, on the published splits of one bucket:
//!    `shale_metrics::merge_splits` (streaming k-way merge) vs `read_sort_write` (decode
//!    everything, sort, write), samples/s of each.
//! 6. Shale again, a node on the same data dir with compaction on: timed until every bucket
//!    is compacted (its published splits all level 1; a bucket's lone split is rewritten into
//!    level 1 too); bytes per sample and queries "after compaction".
//! 7. A 3-node cluster (PostgreSQL + S3-compatible server, `--cluster-series` series, scrapes
//!    spread over the nodes): splits opened by a one-series 1 h query and its p50 before
//!    compaction and once it settles (see `metrics/cluster.rs`).
//!    Every system: freshness, five one-sample writes of a new series each timed from the
//!    acknowledgement until an instant query finds the sample; a dashboard mix, 20 clients
//!    at once each asking 8 range queries of the four shapes in turn (queries/s, p50, p99);
//!    peak resident memory (`VmHWM`; Shale's: the bench process's peak above what it held
//!    before its node started, over ingest and queries before compaction).
//! 8. The table of every figure, the ratios Shale/Prometheus and Shale/VictoriaMetrics, the
//!    targets with PASS/MISS (the cluster's: ≥ 20x fewer splits opened), and a check that
//!    Shale answers the queries as Prometheus does.

mod cluster;
mod external;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use shale_metrics::remote_write::{
    encode_remote_write, Label, ProtoSample, TimeSeries, WriteRequest,
};

use crate::ingest::{percentile, start_node};
use external::{find_on_path, External};

#[derive(Clone, clap::Args)]
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
    /// Concurrent senders (each owns the series whose index modulo this is its number).
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// Seed of the generator.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Timed runs of each query (after 2 warm-up runs): p50 and p99 over them.
    #[arg(long, default_value_t = 20)]
    query_runs: usize,
    /// Do not start Prometheus.
    #[arg(long)]
    skip_prometheus: bool,
    /// Do not start VictoriaMetrics.
    #[arg(long)]
    skip_victoria_metrics: bool,
    /// Series of the 3-node cluster run (PostgreSQL + S3-compatible server).
    #[arg(long, default_value_t = 1_000)]
    cluster_series: usize,
    /// Minutes of samples of the cluster run (one remote-write request per scrape interval,
    /// spread over the nodes).
    #[arg(long, default_value_t = 75)]
    cluster_minutes: u64,
    /// Do not run the 3-node cluster part.
    #[arg(long)]
    skip_cluster: bool,
    /// Shale's `live_samples_max_bytes` (0: samples visible once published, none kept in
    /// memory), to compare the write path with and without fresh samples.
    #[arg(long, default_value_t = shale_config::DEFAULT_LIVE_SAMPLES_MAX_BYTES)]
    live_samples_max_bytes: u64,
}

/// Shale's default metrics index.
const INDEX: &str = "otel-metrics-v0_9";
/// Untimed runs of each query before the timed ones.
const WARMUP_RUNS: usize = 2;
/// Step of the range queries.
const STEP_SECS: i64 = 15;
/// How long Shale may take to compact every bucket.
const COMPACTION_TIMEOUT: Duration = Duration::from_secs(600);

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

/// Series `i` is on host `i / 100`; its metric name is `NAMES[i % 100 % 20]`, its mode
/// `MODES[i % 100 / 20]`, its device always `d0`: a host has each (name, mode) once.
fn series(args: &Args) -> Vec<Generated> {
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

/// The generated samples, encoded.
struct Workload {
    /// Per client, its remote-write bodies in time order.
    bodies: Vec<Vec<Bytes>>,
    /// Samples in all.
    samples: u64,
    /// Samples of each series.
    per_series: u64,
    /// No sample is before this (ms).
    start_ms: i64,
    /// Every sample is before this (ms, a whole second).
    end_ms: i64,
}

/// The remote-write bodies of the workload: samples from `start_ms` on, every series once
/// per interval; series `i` goes to client `i % clients`, each client's requests in time
/// order.
fn workload(args: &Args, start_ms: i64, end_ms: i64) -> Workload {
    let clients = args.clients.max(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed + 1);
    let mut series = series(args);
    let steps = (args.hours * 3600.0 / args.interval_secs as f64) as i64;
    let mut bodies: Vec<Vec<Bytes>> = vec![Vec::new(); clients];
    let mut pending: Vec<Vec<TimeSeries>> = vec![Vec::new(); clients];
    let mut samples = 0u64;
    let flush = |pending: &mut Vec<TimeSeries>| {
        Bytes::from(encode_remote_write(&WriteRequest {
            timeseries: std::mem::take(pending),
            ..Default::default()
        }))
    };
    for step in 0..steps {
        let base = start_ms + step * args.interval_secs as i64 * 1000;
        for (i, s) in series.iter_mut().enumerate() {
            if s.counter {
                s.value += rng.random_range(0.0..50.0f64).round();
            } else {
                s.value = (s.value + rng.random_range(-500.0..500.0f64))
                    .max(0.0)
                    .round();
            }
            let client = i % clients;
            pending[client].push(TimeSeries {
                labels: s.labels.clone(),
                samples: vec![ProtoSample {
                    value: s.value,
                    timestamp: base + s.offset_ms,
                }],
                ..Default::default()
            });
            samples += 1;
            if pending[client].len() >= args.samples_per_request {
                bodies[client].push(flush(&mut pending[client]));
            }
        }
    }
    for (client, rest) in pending.iter_mut().enumerate() {
        if !rest.is_empty() {
            bodies[client].push(flush(rest));
        }
    }
    Workload {
        bodies,
        samples,
        per_series: steps.max(0) as u64,
        start_ms,
        end_ms,
    }
}

/// The baseline: decode every body and write the samples into one Parquet split per
/// 15-minute bucket, in this thread. Returns the time and the bytes written.
fn raw_parquet(bodies: &[Vec<Bytes>]) -> anyhow::Result<(Duration, u64)> {
    let started = Instant::now();
    let mut writers: BTreeMap<i64, shale_metrics::MetricsSplitWriter> = Default::default();
    for body in bodies.iter().flatten() {
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

/// Sends every client's bodies to `url`, the clients concurrently, each in order; a `429` or
/// `503` is retried after 100 ms. Returns once every request is acknowledged.
async fn remote_write(
    client: &reqwest::Client,
    url: &str,
    bodies: &[Vec<Bytes>],
) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for (number, own) in bodies.iter().enumerate() {
        let (client, url, own) = (client.clone(), url.to_string(), own.clone());
        tasks.spawn(async move {
            for (i, body) in own.into_iter().enumerate() {
                let mut retries = 0u32;
                loop {
                    let resp = client
                        .post(&url)
                        .header("Content-Encoding", "snappy")
                        .header("Content-Type", "application/x-protobuf")
                        .header("X-Prometheus-Remote-Write-Version", "0.1.0")
                        .body(body.clone())
                        .send()
                        .await
                        .with_context(|| format!("client {number}: request {i} to {url}"))?;
                    match resp.status().as_u16() {
                        200 | 204 => break,
                        429 | 503 if retries < 36_000 => {
                            retries += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        status => anyhow::bail!(
                            "client {number}: request {i} to {url}: {status} {}",
                            resp.text().await.unwrap_or_default()
                        ),
                    }
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.context("a remote-write client panicked")??;
    }
    Ok(())
}

/// Times, `FRESHNESS_PROBES` times, how long after a one-sample write is acknowledged an
/// instant query at the sample's time finds it (a new series each time, polled every 2 ms,
/// given up after `FRESHNESS_PATIENCE`); prints and returns the p50 and the worst (ms).
async fn freshness(
    client: &reqwest::Client,
    write_url: &str,
    api: &str,
) -> anyhow::Result<Option<(f64, f64)>> {
    let mut took = Vec::new();
    for probe in 0..FRESHNESS_PROBES {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .context("clock before 1970")?
            .as_millis() as i64;
        let run = format!("{}-{probe}", now_ms);
        let request = WriteRequest {
            timeseries: vec![TimeSeries {
                labels: vec![
                    Label {
                        name: "__name__".into(),
                        value: "bench_freshness_probe".into(),
                    },
                    Label {
                        name: "probe".into(),
                        value: run.clone(),
                    },
                ],
                samples: vec![ProtoSample {
                    value: 1.0,
                    timestamp: now_ms,
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        remote_write(
            client,
            write_url,
            &[vec![Bytes::from(encode_remote_write(&request))]],
        )
        .await?;
        let acked = Instant::now();
        let query = format!("bench_freshness_probe{{probe=\"{run}\"}}");
        loop {
            if !instant(client, api, &query, now_ms / 1000 + 1)
                .await?
                .is_empty()
            {
                took.push(acked.elapsed().as_secs_f64() * 1000.0);
                break;
            }
            if acked.elapsed() > FRESHNESS_PATIENCE {
                println!(
                    "  freshness: a sample not visible {} s after its write was acknowledged",
                    FRESHNESS_PATIENCE.as_secs()
                );
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    took.sort_by(f64::total_cmp);
    let (p50, worst) = (percentile(&took, 0.5), took.last().copied().unwrap_or(0.0));
    println!(
        "  freshness: write acknowledged → visible to an instant query, {FRESHNESS_PROBES} one-sample writes: p50 {p50:.1} ms, worst {worst:.1} ms"
    );
    Ok(Some((p50, worst)))
}

/// One-sample writes timed by [`freshness`].
const FRESHNESS_PROBES: usize = 5;
/// How long [`freshness`] waits for a sample.
const FRESHNESS_PATIENCE: Duration = Duration::from_secs(40);

/// The machine's load averages (1, 5, 15 min), as `/proc/loadavg` says: the cores may be
/// shared with other work.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".to_string())
}

/// A query shape of the comparison, varied from run to run: run `r` asks
/// `variants[r % variants.len()]`, over the plan's window moved back `r` minutes when
/// `moving_window` (every system gets the same sequence, so the last answers compare).
struct Shape {
    /// Short name, in the table.
    name: &'static str,
    variants: Vec<String>,
    moving_window: bool,
}

impl Shape {
    /// The query and window of run `run`.
    fn at(&self, run: usize, (start, end): (i64, i64)) -> (String, (i64, i64)) {
        let query = self.variants[run % self.variants.len().max(1)].clone();
        let back = if self.moving_window {
            run as i64 * 60
        } else {
            0
        };
        (query, (start - back, end - back))
    }
}

/// What a query answered: its series, points and the sum of its finite values.
#[derive(Clone, Copy, Debug, Default)]
struct Answer {
    series: usize,
    points: usize,
    sum: f64,
}

impl Answer {
    fn of(body: &Value) -> anyhow::Result<Answer> {
        let result = body["data"]["result"]
            .as_array()
            .with_context(|| format!("no data.result in {body}"))?;
        let mut answer = Answer {
            series: result.len(),
            ..Default::default()
        };
        for series in result {
            let points: Vec<&Value> = match series["values"].as_array() {
                Some(values) => values.iter().collect(),
                None => vec![&series["value"]],
            };
            for point in points {
                answer.points += 1;
                let value: f64 = point[1]
                    .as_str()
                    .with_context(|| format!("a point without a value: {point}"))?
                    .parse()
                    .with_context(|| format!("a point's value: {point}"))?;
                if value.is_finite() {
                    answer.sum += value;
                }
            }
        }
        Ok(answer)
    }

    fn same_as(&self, other: &Answer) -> bool {
        self.series == other.series
            && self.points == other.points
            && (self.sum - other.sum).abs() <= 1e-9 * self.sum.abs().max(other.sum.abs()).max(1.0)
    }
}

/// Latency of one query shape on one system.
#[derive(Clone, Debug)]
struct Timing {
    p50_ms: f64,
    p99_ms: f64,
    /// Shale's `x-shale-splits-opened` of the last run.
    opened: Option<String>,
    answer: Answer,
}

/// Runs `query` over `[start, end]` (s) at a 15 s step: 2 warm-ups, then `runs` timed runs
/// (until the answer's bytes are in; parsing them is not timed).
async fn time_query(
    client: &reqwest::Client,
    api: &str,
    query: &str,
    window: (i64, i64),
    runs: usize,
) -> anyhow::Result<Timing> {
    time_varied(client, api, &|_| (query.to_string(), window), runs).await
}

/// [`time_query`] of a query and window that change with the run (`vary(run)`), so that
/// no cache of an earlier run answers it.
async fn time_varied(
    client: &reqwest::Client,
    api: &str,
    vary: &(dyn Fn(usize) -> (String, (i64, i64)) + Sync),
    runs: usize,
) -> anyhow::Result<Timing> {
    let mut times = Vec::with_capacity(runs);
    let mut opened = None;
    let mut answer = Answer::default();
    for run in 0..WARMUP_RUNS + runs {
        let (query, window) = vary(run);
        let (elapsed, splits_opened, body) = query_range(client, api, &query, window).await?;
        opened = splits_opened;
        if run >= WARMUP_RUNS {
            times.push(elapsed.as_secs_f64() * 1000.0);
        }
        answer = Answer::of(&body)?;
    }
    times.sort_by(f64::total_cmp);
    Ok(Timing {
        p50_ms: percentile(&times, 0.5),
        p99_ms: percentile(&times, 0.99),
        opened,
        answer,
    })
}

/// One `query_range` of `query` over `[start, end]` (s) at a 15 s step: the time until the
/// answer's bytes are in (parsing them is not timed), Shale's `x-shale-splits-opened`, the
/// answer.
async fn query_range(
    client: &reqwest::Client,
    api: &str,
    query: &str,
    (start, end): (i64, i64),
) -> anyhow::Result<(Duration, Option<String>, Value)> {
    let started = Instant::now();
    let resp = client
        .get(format!("{api}/query_range"))
        .query(&[
            ("query", query.to_string()),
            ("start", start.to_string()),
            ("end", end.to_string()),
            ("step", STEP_SECS.to_string()),
        ])
        .send()
        .await
        .with_context(|| format!("query_range {query} at {api}"))?;
    let status = resp.status();
    let opened = resp
        .headers()
        .get("x-shale-splits-opened")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bytes = resp
        .bytes()
        .await
        .with_context(|| format!("query_range {query} at {api}: reading the answer"))?;
    let elapsed = started.elapsed();
    let body: Value = serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "query_range {query} at {api}: {status} {}",
            String::from_utf8_lossy(&bytes)
        )
    })?;
    anyhow::ensure!(
        status.is_success() && body["status"] == "success",
        "query_range {query} at {api}: {status} {body}"
    );
    Ok((elapsed, opened, body))
}

/// Throughput and latency of a dashboard's load.
#[derive(Clone, Copy, Debug)]
struct Mix {
    queries_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// Clients of the dashboard mix, each asking its queries one after the other.
const DASHBOARD_CLIENTS: usize = 20;
/// Queries per client of the dashboard mix.
const DASHBOARD_QUERIES: usize = 8;

/// A dashboard refreshed by [`DASHBOARD_CLIENTS`] viewers at once: each client asks
/// [`DASHBOARD_QUERIES`] range queries in turn, cycling through the plan's shapes (client `c`
/// starting at shape `c`) and their variants and windows; the throughput over the whole
/// run and the latency percentiles over every query.
async fn dashboard(client: &reqwest::Client, api: &str, plan: &Plan) -> anyhow::Result<Mix> {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..DASHBOARD_CLIENTS {
        let queries: Vec<(String, (i64, i64))> = (0..DASHBOARD_QUERIES)
            .map(|k| {
                let shape = &plan.shapes[(c + k) % plan.shapes.len()];
                shape.at((c * DASHBOARD_QUERIES + k) % 60, plan.window)
            })
            .collect();
        let (client, api) = (client.clone(), api.to_string());
        tasks.spawn(async move {
            let mut times = Vec::new();
            for (query, window) in queries {
                let (elapsed, _, _) = query_range(&client, &api, &query, window).await?;
                times.push(elapsed.as_secs_f64() * 1000.0);
            }
            anyhow::Ok(times)
        });
    }
    let mut times = Vec::new();
    while let Some(done) = tasks.join_next().await {
        times.extend(done.context("a dashboard client panicked")??);
    }
    let wall = started.elapsed().as_secs_f64();
    times.sort_by(f64::total_cmp);
    let mix = Mix {
        queries_per_sec: times.len() as f64 / wall,
        p50_ms: percentile(&times, 0.5),
        p99_ms: percentile(&times, 0.99),
    };
    println!(
        "  dashboard: {DASHBOARD_CLIENTS} clients × {DASHBOARD_QUERIES} range queries (the four shapes in turn): {:.1} queries/s, p50 {:.1} ms, p99 {:.1} ms",
        mix.queries_per_sec, mix.p50_ms, mix.p99_ms
    );
    Ok(mix)
}

/// The values of an instant query's vector at `time` (s).
async fn instant(
    client: &reqwest::Client,
    api: &str,
    query: &str,
    time: i64,
) -> anyhow::Result<Vec<f64>> {
    let resp = client
        .get(format!("{api}/query"))
        .query(&[("query", query.to_string()), ("time", time.to_string())])
        .send()
        .await
        .with_context(|| format!("query {query} at {api}"))?;
    let status = resp.status();
    let body: Value = resp
        .json()
        .await
        .with_context(|| format!("query {query} at {api}: {status}"))?;
    anyhow::ensure!(
        status.is_success() && body["status"] == "success",
        "query {query} at {api}: {status} {body}"
    );
    body["data"]["result"]
        .as_array()
        .with_context(|| format!("query {query}: no vector in {body}"))?
        .iter()
        .map(|s| {
            s["value"][1]
                .as_str()
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("query {query}: a sample without a value in {body}"))
        })
        .collect()
}

/// What every system is asked the same way.
struct Plan {
    shapes: Vec<Shape>,
    /// The one-series selector.
    one: String,
    /// The 50-series selector of the `max_over_time` shape.
    fifty: String,
    /// The range queries' `[start, end]` (s): the last hour of data.
    window: (i64, i64),
    runs: usize,
}

/// The figures of one system (or of Shale in one state).
#[derive(Clone, Debug, Default)]
struct Column {
    /// Samples/s by remote write, until queryable.
    ingest: Option<f64>,
    /// Write acknowledged → visible to an instant query, p50 and worst (ms).
    freshness_ms: Option<(f64, f64)>,
    /// The dashboard mix.
    dashboard: Option<Mix>,
    /// Peak resident memory (MB) over the run.
    peak_rss_mb: Option<f64>,
    bytes_per_sample: Option<f64>,
    /// One per shape.
    timings: Vec<Timing>,
}

/// Checks that the system at `api` holds every sample: `count_over_time` of the one series,
/// and `sum(count_over_time(NAME[…]))` of every metric name, summed, at the end of the data
/// (one name at a time: over several names, `count_over_time` drops the names and leaves
/// duplicate label sets, which PromQL refuses). Retries for `patience` while they are short.
/// Prints what it found.
async fn check_samples(
    client: &reqwest::Client,
    api: &str,
    workload: &Workload,
    plan: &Plan,
    patience: Duration,
) -> anyhow::Result<bool> {
    let started = Instant::now();
    let time = workload.end_ms / 1000;
    // Every sample, and 10 minutes more.
    let range = format!("{}s", (workload.end_ms - workload.start_ms) / 1000 + 600);
    let one = format!("count_over_time({}[{range}])", plan.one);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let one_count = instant(client, api, &one, time).await?;
        let one_count = one_count.first().copied().unwrap_or(0.0) as u64;
        let mut all_count = 0u64;
        for (name, _) in NAMES {
            let count = instant(
                client,
                api,
                &format!("sum(count_over_time({name}[{range}]))"),
                time,
            )
            .await?;
            all_count += count.first().copied().unwrap_or(0.0) as u64;
        }
        let ok = one_count == workload.per_series && all_count == workload.samples;
        if ok || started.elapsed() > patience {
            println!(
                "  check: `{one}` = {one_count} (expected {}); `sum(count_over_time(NAME[{range}]))` summed over the 20 names = {all_count} (expected {}){}: {}",
                workload.per_series,
                workload.samples,
                if attempts > 1 {
                    format!(
                        " after {attempts} attempts over {:.1} s",
                        started.elapsed().as_secs_f64()
                    )
                } else {
                    String::new()
                },
                if ok { "OK" } else { "MISMATCH: samples missing" },
            );
            return Ok(ok);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Counts the series of the 50-series selector (instant query at the end of the window) and
/// times every shape; prints each.
async fn measure_queries(
    client: &reqwest::Client,
    api: &str,
    plan: &Plan,
    label: &str,
) -> anyhow::Result<Vec<Timing>> {
    let count = instant(
        client,
        api,
        &format!("count({})", plan.fifty),
        plan.window.1,
    )
    .await?;
    println!(
        "  `count({})` = {} series",
        plan.fifty,
        count.first().copied().unwrap_or(0.0)
    );
    let mut timings = Vec::new();
    for shape in &plan.shapes {
        let timing = time_varied(client, api, &|run| shape.at(run, plan.window), plan.runs).await?;
        println!(
            "  {label} query_range {}: p50 {:.1} ms, p99 {:.1} ms{} ({} series, {} points)",
            shape.name,
            timing.p50_ms,
            timing.p99_ms,
            timing
                .opened
                .as_ref()
                .map(|o| format!(", {o} splits opened"))
                .unwrap_or_default(),
            timing.answer.series,
            timing.answer.points,
        );
        timings.push(timing);
    }
    Ok(timings)
}

async fn run_prometheus(
    binary: &Path,
    client: &reqwest::Client,
    workload: &Workload,
    plan: &Plan,
) -> anyhow::Result<Column> {
    let prometheus = External::prometheus(binary, client).await?;
    println!(
        "Prometheus {} ({}) at {} (load average {}):",
        prometheus
            .version(client)
            .await
            .unwrap_or_else(|| "(version unknown)".into()),
        binary.display(),
        prometheus.base,
        load_average()
    );
    let started = Instant::now();
    remote_write(
        client,
        &format!("{}/api/v1/write", prometheus.base),
        &workload.bodies,
    )
    .await
    .with_context(|| {
        format!(
            "Prometheus; its output ends with:\n{}",
            prometheus.log_tail()
        )
    })?;
    let elapsed = started.elapsed();
    let rate = workload.samples as f64 / elapsed.as_secs_f64();
    println!(
        "  ingest: {} clients, last acknowledgement after {:.2} s: {rate:.0} samples/s",
        workload.bodies.len(),
        elapsed.as_secs_f64()
    );
    let api = format!("{}/api/v1", prometheus.base);
    check_samples(client, &api, workload, plan, Duration::ZERO).await?;
    let bytes = prometheus.prometheus_snapshot_bytes(client).await?;
    let bytes_per_sample = bytes as f64 / workload.samples as f64;
    println!(
        "  storage: the head written as a block (snapshot?skip_head=false): {:.1} MB, {bytes_per_sample:.3} bytes/sample",
        bytes as f64 / 1e6
    );
    let timings = measure_queries(client, &api, plan, "Prometheus").await?;
    let freshness_ms =
        freshness(client, &format!("{}/api/v1/write", prometheus.base), &api).await?;
    let dashboard = dashboard(client, &api, plan).await?;
    let peak_rss_mb = prometheus.peak_rss_mb();
    drop(prometheus);
    Ok(Column {
        ingest: Some(rate),
        freshness_ms,
        dashboard: Some(dashboard),
        peak_rss_mb,
        bytes_per_sample: Some(bytes_per_sample),
        timings,
    })
}

async fn run_victoria_metrics(
    binary: &Path,
    client: &reqwest::Client,
    workload: &Workload,
    plan: &Plan,
) -> anyhow::Result<Column> {
    let vm = External::victoria_metrics(binary, client).await?;
    println!(
        "VictoriaMetrics {} ({}, -search.disableCache: no response cache) at {} (load average {}):",
        vm.version(client)
            .await
            .unwrap_or_else(|| "(the binary reports no version)".into()),
        binary.display(),
        vm.base,
        load_average()
    );
    let started = Instant::now();
    remote_write(
        client,
        &format!("{}/api/v1/write", vm.base),
        &workload.bodies,
    )
    .await
    .with_context(|| format!("VictoriaMetrics; its output ends with:\n{}", vm.log_tail()))?;
    let acked = started.elapsed();
    vm.force_flush(client).await?;
    let elapsed = started.elapsed();
    let rate = workload.samples as f64 / elapsed.as_secs_f64();
    println!(
        "  ingest: {} clients, last acknowledgement after {:.2} s, force_flush done after {:.2} s: {rate:.0} samples/s",
        workload.bodies.len(),
        acked.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    let api = format!("{}/api/v1", vm.base);
    check_samples(client, &api, workload, plan, Duration::from_secs(30)).await?;
    vm.force_flush(client).await?;
    let (bytes, waited) = vm.settled_size().await?;
    let bytes_per_sample = bytes as f64 / workload.samples as f64;
    println!(
        "  storage: the data directory after force_flush, once its size was unchanged for 5 s (waited {waited:.0} s for background merges): {:.1} MB, {bytes_per_sample:.3} bytes/sample",
        bytes as f64 / 1e6
    );
    let timings = measure_queries(client, &api, plan, "VictoriaMetrics").await?;
    let freshness_ms = freshness(client, &format!("{}/api/v1/write", vm.base), &api).await?;
    let dashboard = dashboard(client, &api, plan).await?;
    let peak_rss_mb = vm.peak_rss_mb();
    drop(vm);
    Ok(Column {
        ingest: Some(rate),
        freshness_ms,
        dashboard: Some(dashboard),
        peak_rss_mb,
        bytes_per_sample: Some(bytes_per_sample),
        timings,
    })
}

/// The published splits of the metrics index.
async fn published_splits(client: &reqwest::Client, base: &str) -> anyhow::Result<Vec<Value>> {
    let resp = client
        .get(format!(
            "{base}/api/v1/indexes/{INDEX}/splits?split_states=Published"
        ))
        .send()
        .await
        .context("listing the published splits")?;
    let status = resp.status();
    let body: Value = resp
        .json()
        .await
        .with_context(|| format!("listing the published splits: {status}"))?;
    Ok(body["splits"]
        .as_array()
        .with_context(|| format!("no splits in {body}"))?
        .clone())
}

/// The splits of each time bucket (seconds).
fn splits_per_bucket(splits: &[Value]) -> BTreeMap<i64, Vec<&Value>> {
    let mut buckets: BTreeMap<i64, Vec<&Value>> = BTreeMap::new();
    for split in splits {
        buckets
            .entry(split["time_bucket_start"].as_i64().unwrap_or(i64::MIN))
            .or_default()
            .push(split);
    }
    buckets
}

fn sum_field(splits: &[Value], field: &str) -> u64 {
    splits.iter().filter_map(|s| s[field].as_u64()).sum()
}

/// Shale's merge of one bucket's splits vs the plain read-sort-write.
struct MergeBench {
    bucket_start: i64,
    splits: usize,
    samples: u64,
    input_bytes: u64,
    merge: Duration,
    merge_outputs: usize,
    merge_bytes: u64,
    plain: Duration,
    plain_bytes: u64,
}

/// Takes the bucket of `published` with the most samples (then splits), reads its Parquet
/// objects from `data_dir` (oldest split first) and times both merges, best of 3 each.
fn merge_bench(data_dir: &Path, published: &[Value]) -> anyhow::Result<MergeBench> {
    let mut buckets: BTreeMap<i64, Vec<(String, u64)>> = BTreeMap::new();
    for split in published {
        let bucket = split["time_bucket_start"]
            .as_i64()
            .with_context(|| format!("a split without time_bucket_start: {split}"))?;
        let id = split["split_id"]
            .as_str()
            .with_context(|| format!("a split without split_id: {split}"))?;
        buckets
            .entry(bucket)
            .or_default()
            .push((id.to_string(), split["num_docs"].as_u64().unwrap_or(0)));
    }
    let (bucket_start, mut splits) = buckets
        .into_iter()
        .max_by_key(|(_, splits)| {
            (
                splits.iter().map(|(_, docs)| docs).sum::<u64>(),
                splits.len(),
            )
        })
        .context("no published split")?;
    splits.sort();
    let samples: u64 = splits.iter().map(|(_, docs)| docs).sum();
    let dir = data_dir.join("indexes").join(INDEX);
    let inputs: Vec<Bytes> = splits
        .iter()
        .map(|(id, _)| {
            let path = dir.join(format!("{id}.parquet"));
            std::fs::read(&path)
                .map(Bytes::from)
                .with_context(|| format!("reading {}", path.display()))
        })
        .collect::<anyhow::Result<_>>()?;
    let input_bytes = inputs.iter().map(|b| b.len() as u64).sum();
    let sort_labels: Vec<String> = vec!["job".into(), "instance".into()];
    let cut = shale_metrics::MergeCut {
        target_bytes: Some(256 << 20),
        fixed_ranges: vec![],
        locality: true,
        plain_level: 0,
    };
    let mut merge = Duration::MAX;
    let mut plain = Duration::MAX;
    let (mut merge_outputs, mut merge_bytes, mut plain_bytes) = (0, 0, 0);
    for _ in 0..3 {
        let started = Instant::now();
        let (outputs, stats) = shale_metrics::merge_splits(&inputs, &sort_labels, &cut, &[])?;
        merge = merge.min(started.elapsed());
        anyhow::ensure!(
            stats.samples_in == samples && stats.samples_out + stats.duplicates == samples,
            "merge_splits: {stats:?} of {samples} samples"
        );
        merge_outputs = outputs.len();
        merge_bytes = outputs.iter().map(|o| o.bytes.len() as u64).sum();

        let started = Instant::now();
        let (file, summary) = shale_metrics::merge::read_sort_write(&inputs, &sort_labels)?;
        plain = plain.min(started.elapsed());
        anyhow::ensure!(
            summary.num_samples == stats.samples_out,
            "read_sort_write wrote {} samples, merge_splits {}",
            summary.num_samples,
            stats.samples_out
        );
        plain_bytes = file.len() as u64;
    }
    Ok(MergeBench {
        bucket_start,
        splits: splits.len(),
        samples,
        input_bytes,
        merge,
        merge_outputs,
        merge_bytes,
        plain,
        plain_bytes,
    })
}

/// Shale's figures: before compaction (with the ingest), the merge, after compaction.
struct ShaleRun {
    before: Column,
    after: Column,
    merge: MergeBench,
}

async fn run_shale(workload: &Workload, plan: &Plan, live_bytes: u64) -> anyhow::Result<ShaleRun> {
    let dir = tempfile::tempdir().context("creating Shale's data dir")?;
    let mut config = shale_config::NodeConfig::with_data_dir(dir.path());
    config.compaction.enabled = false;
    config.live_samples_max_bytes = live_bytes;
    // Shale runs in this process: its peak is the process's above what it holds now (the
    // peak, once reset, is the resident memory of the moment).
    crate::ingest::reset_peak_rss();
    let rss_floor = crate::ingest::peak_rss_mb();
    let (node, base, client) = start_node(config).await?;
    println!(
        "Shale (in process, embedded defaults: SQLite, local FS; compaction off) at {base} (load average {}):",
        load_average()
    );
    let api = format!("{base}/prometheus/api/v1");
    let url = format!("{api}/write");
    let started = Instant::now();
    remote_write(&client, &url, &workload.bodies).await?;
    let acked = started.elapsed();
    // Until every acknowledged sample answers PromQL (from memory or from published
    // splits), as the other stores are timed; then until every one is in a published split.
    let complete = check_samples(&client, &api, workload, plan, Duration::from_secs(3600)).await?;
    anyhow::ensure!(complete, "Shale: acknowledged samples never all queryable");
    let queryable = started.elapsed();
    let resp = client
        .post(format!("{url}?commit=force"))
        .header("Content-Encoding", "snappy")
        .body(encode_remote_write(&WriteRequest::default()))
        .send()
        .await
        .context("the final commit=force")?;
    anyhow::ensure!(
        resp.status().as_u16() == 204,
        "final commit: {} {}",
        resp.status(),
        resp.text().await.unwrap_or_default()
    );
    // Wait until every acknowledged sample is in a published split.
    let published = loop {
        let splits = published_splits(&client, &base).await?;
        let stored = sum_field(&splits, "num_docs");
        if stored >= workload.samples {
            break splits;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(3600),
            "after an hour, {stored} of {} samples published",
            workload.samples
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let elapsed = started.elapsed();
    let rate = workload.samples as f64 / queryable.as_secs_f64();
    println!(
        "  ingest: {} clients, acknowledged after {:.2} s, every sample queryable after {:.2} s ({rate:.0} samples/s), every sample published after {:.2} s ({:.0} samples/s)",
        workload.bodies.len(),
        acked.as_secs_f64(),
        queryable.as_secs_f64(),
        elapsed.as_secs_f64(),
        workload.samples as f64 / elapsed.as_secs_f64(),
    );
    let stored = sum_field(&published, "num_docs");
    let bytes = sum_field(&published, "size_bytes");
    let buckets: std::collections::BTreeSet<i64> = published
        .iter()
        .filter_map(|s| s["time_bucket_start"].as_i64())
        .collect();
    println!(
        "  storage before compaction: {} published splits over {} buckets, num_docs sum {stored} (expected {}{}), {:.1} MB: {:.3} bytes/sample",
        published.len(),
        buckets.len(),
        workload.samples,
        if stored == workload.samples { ", OK" } else { ", MISMATCH" },
        bytes as f64 / 1e6,
        bytes as f64 / stored.max(1) as f64
    );
    check_samples(&client, &api, workload, plan, Duration::ZERO).await?;
    let timings = measure_queries(&client, &api, plan, "Shale before compaction").await?;
    let dashboard_before = dashboard(&client, &api, plan).await?;
    let peak_rss_mb = Some(crate::ingest::peak_rss_mb() - rss_floor).filter(|_| rss_floor > 0.0);
    if let Some(mb) = peak_rss_mb {
        println!(
            "  peak resident memory above the bench's own before the node started: {mb:.0} MB"
        );
    }
    let before = Column {
        ingest: Some(rate),
        freshness_ms: None,
        dashboard: Some(dashboard_before),
        peak_rss_mb,
        bytes_per_sample: Some(bytes as f64 / stored.max(1) as f64),
        timings,
    };
    node.shutdown().await;
    node.release_data_dir();

    let data_dir = dir.path().to_path_buf();
    let published_before = published.clone();
    let merge = tokio::task::spawn_blocking(move || merge_bench(&data_dir, &published))
        .await
        .context("the merge benchmark panicked")??;
    let per_sec = |d: Duration| merge.samples as f64 / d.as_secs_f64();
    println!(
        "Shale's metrics merge, in process, of the {} published splits of bucket {} ({} samples, {:.1} MB), best of 3:",
        merge.splits,
        time::OffsetDateTime::from_unix_timestamp(merge.bucket_start)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| merge.bucket_start.to_string()),
        merge.samples,
        merge.input_bytes as f64 / 1e6
    );
    println!(
        "  merge_splits (k-way, locality cut at 256 MiB): {:.3} s, {:.0} samples/s, {} output(s), {:.1} MB",
        merge.merge.as_secs_f64(),
        per_sec(merge.merge),
        merge.merge_outputs,
        merge.merge_bytes as f64 / 1e6
    );
    println!(
        "  read_sort_write (decode all, sort, write; the parquet crate): {:.3} s, {:.0} samples/s, {:.1} MB",
        merge.plain.as_secs_f64(),
        per_sec(merge.plain),
        merge.plain_bytes as f64 / 1e6
    );
    println!(
        "  merge_splits / read_sort_write: {:.2}x the throughput",
        merge.plain.as_secs_f64() / merge.merge.as_secs_f64()
    );

    let mut config = shale_config::NodeConfig::with_data_dir(dir.path());
    config.compaction.enabled = true;
    config.compaction.planner_interval_secs = 1;
    config.live_samples_max_bytes = live_bytes;
    let started = Instant::now();
    let (node, base, client) = start_node(config).await?;
    println!(
        "Shale restarted on the same data dir with compaction on (planner every 1 s) at {base} (load average {}):",
        load_average()
    );
    let api = format!("{base}/prometheus/api/v1");
    // Every bucket compacted: all its splits level 1 (a lone split is rewritten alone).
    let level = |split: &Value| split["key_level"].as_u64().unwrap_or(0);
    let before_per_bucket = splits_per_bucket(&published_before);
    let compacted = loop {
        let splits = published_splits(&client, &base).await?;
        let buckets = splits_per_bucket(&splits);
        let pending: Vec<i64> = buckets
            .iter()
            .filter(|(_, members)| members.iter().any(|split| level(split) != 1))
            .map(|(bucket, _)| *bucket)
            .collect();
        let stored = sum_field(&splits, "num_docs");
        if pending.is_empty() && !splits.is_empty() && stored == workload.samples {
            break splits;
        }
        if started.elapsed() > COMPACTION_TIMEOUT {
            node.shutdown().await;
            node.release_data_dir();
            anyhow::bail!(
                "Shale's compaction did not finish in {} s: {} of {} buckets still have splits not at level 1 ({} splits published, {stored} of {} samples)",
                COMPACTION_TIMEOUT.as_secs(),
                pending.len(),
                buckets.len(),
                splits.len(),
                workload.samples
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let stored = sum_field(&compacted, "num_docs");
    let bytes = sum_field(&compacted, "size_bytes");
    let after_per_bucket = splits_per_bucket(&compacted);
    println!(
        "  compaction: done after {:.1} s (node start included): {} buckets, {} splits before -> {} after; {} of {} splits level 1",
        started.elapsed().as_secs_f64(),
        after_per_bucket.len(),
        before_per_bucket.values().map(Vec::len).sum::<usize>(),
        compacted.len(),
        compacted.iter().filter(|split| level(split) == 1).count(),
        compacted.len(),
    );
    println!(
        "  storage after compaction: {} published splits, num_docs sum {stored} (expected {}{}), {:.1} MB: {:.3} bytes/sample",
        compacted.len(),
        workload.samples,
        if stored == workload.samples { ", OK" } else { ", MISMATCH" },
        bytes as f64 / 1e6,
        bytes as f64 / stored.max(1) as f64
    );
    check_samples(&client, &api, workload, plan, Duration::ZERO).await?;
    let timings = measure_queries(&client, &api, plan, "Shale after compaction").await?;
    let dashboard_after = dashboard(&client, &api, plan).await?;
    // Last: the probes' samples land in the current bucket, which no compaction waits for.
    let freshness_ms = freshness(&client, &format!("{api}/write"), &api).await?;
    node.shutdown().await;
    node.release_data_dir();
    Ok(ShaleRun {
        before,
        after: Column {
            ingest: None,
            freshness_ms,
            dashboard: Some(dashboard_after),
            peak_rss_mb: None,
            bytes_per_sample: Some(bytes as f64 / stored.max(1) as f64),
            timings,
        },
        merge,
    })
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "—".to_string(), |v| format!("{v:.decimals$}"))
}

fn ratio(shale: Option<f64>, other: Option<f64>) -> Option<f64> {
    match (shale, other) {
        (Some(s), Some(o)) if o > 0.0 => Some(s / o),
        _ => None,
    }
}

/// `PASS`/`MISS` of `shale / other` against `limit` (`at_least`: the ratio must reach it).
fn target(shale: Option<f64>, other: Option<f64>, limit: f64, at_least: bool) -> String {
    match ratio(shale, other) {
        Some(r) => {
            let pass = if at_least { r >= limit } else { r <= limit };
            format!("{r:.2}x {}", if pass { "PASS" } else { "MISS" })
        }
        None => "— (not measured)".to_string(),
    }
}

fn print_summary(
    plan: &Plan,
    shale: &ShaleRun,
    prometheus: Option<&Column>,
    vm: Option<&Column>,
    baseline_rate: f64,
) {
    let empty = Column::default();
    let (prom, vmc) = (prometheus.unwrap_or(&empty), vm.unwrap_or(&empty));
    let (before, after) = (&shale.before, &shale.after);
    println!();
    println!(
        "{:<38} {:>13} {:>13} {:>13} {:>13} {:>11} {:>11}",
        "figure", "Shale before", "Shale after", "Prometheus", "Victoria", "Shale/Prom", "Shale/VM"
    );
    let row = |label: &str, cols: [Option<f64>; 4], decimals: usize, shale: Option<f64>| {
        println!(
            "{label:<38} {:>13} {:>13} {:>13} {:>13} {:>11} {:>11}",
            cell(cols[0], decimals),
            cell(cols[1], decimals),
            cell(cols[2], decimals),
            cell(cols[3], decimals),
            cell(ratio(shale, cols[2]), 2),
            cell(ratio(shale, cols[3]), 2),
        );
    };
    row(
        "ingest until queryable, samples/s",
        [before.ingest, after.ingest, prom.ingest, vmc.ingest],
        0,
        before.ingest,
    );
    row(
        "freshness p50 ms (ack → visible)",
        [before, after, prom, vmc].map(|c| c.freshness_ms.map(|f| f.0)),
        1,
        after.freshness_ms.map(|f| f.0),
    );
    row(
        "freshness worst ms",
        [before, after, prom, vmc].map(|c| c.freshness_ms.map(|f| f.1)),
        1,
        after.freshness_ms.map(|f| f.1),
    );
    let mix = |c: &Column, pick: fn(Mix) -> f64| c.dashboard.map(pick);
    for (label, pick) in [
        (
            "dashboard (20 clients) queries/s",
            (|m: Mix| m.queries_per_sec) as fn(Mix) -> f64,
        ),
        ("dashboard p50 ms", |m: Mix| m.p50_ms),
        ("dashboard p99 ms", |m: Mix| m.p99_ms),
    ] {
        let cols = [before, after, prom, vmc].map(|c| mix(c, pick));
        row(label, cols, 1, cols[1]);
    }
    row(
        "peak RSS MB (Shale: ingest + queries)",
        [before, after, prom, vmc].map(|c| c.peak_rss_mb),
        0,
        before.peak_rss_mb,
    );
    row(
        "bytes/sample on storage",
        [
            before.bytes_per_sample,
            after.bytes_per_sample,
            prom.bytes_per_sample,
            vmc.bytes_per_sample,
        ],
        3,
        after.bytes_per_sample,
    );
    let timing = |c: &Column, i: usize| c.timings.get(i).cloned();
    for (i, shape) in plan.shapes.iter().enumerate() {
        for (what, pick) in [
            ("p50 ms", (|t: Timing| t.p50_ms) as fn(Timing) -> f64),
            ("p99 ms", |t: Timing| t.p99_ms),
        ] {
            let cols = [before, after, prom, vmc].map(|c| timing(c, i).map(pick));
            row(&format!("{} {what}", shape.name), cols, 1, cols[1]);
        }
        println!(
            "{:<38} {:>13} {:>13}",
            format!("{} splits opened", shape.name),
            timing(before, i)
                .and_then(|t| t.opened)
                .unwrap_or_else(|| "?".into()),
            timing(after, i)
                .and_then(|t| t.opened)
                .unwrap_or_else(|| "?".into()),
        );
    }
    println!(
        "(ratios: Shale's ingest (compaction off) and Shale after compaction for storage and queries; Shale's ingest is {:.2}x the in-process Parquet baseline)",
        before.ingest.unwrap_or(0.0) / baseline_rate
    );
    let merge = &shale.merge;
    println!(
        "Shale merge throughput: merge_splits {:.0} samples/s vs read_sort_write {:.0} samples/s: {:.2}x",
        merge.samples as f64 / merge.merge.as_secs_f64(),
        merge.samples as f64 / merge.plain.as_secs_f64(),
        merge.plain.as_secs_f64() / merge.merge.as_secs_f64()
    );

    println!();
    println!("targets (Shale ÷ Prometheus | stretch: Shale ÷ VictoriaMetrics):");
    let p50 = |c: &Column, i: usize| timing(c, i).map(|t| t.p50_ms);
    // (label, Shale, Prometheus, VictoriaMetrics, limit against Prometheus, against
    // VictoriaMetrics (None: a stretch, printed without a verdict), at least).
    let lines = [
        (
            "ingest ≥ 1.0x",
            before.ingest,
            prom.ingest,
            vmc.ingest,
            1.0,
            None,
            true,
        ),
        (
            "bytes/sample after compaction ≤ 1.0x",
            after.bytes_per_sample,
            prom.bytes_per_sample,
            vmc.bytes_per_sample,
            1.0,
            None,
            false,
        ),
        (
            "one-series p50 ≤ 1.0x",
            p50(after, 0),
            p50(prom, 0),
            p50(vmc, 0),
            1.0,
            None,
            false,
        ),
        (
            "rate-of-one-series p50 ≤ 1.0x",
            p50(after, 1),
            p50(prom, 1),
            p50(vmc, 1),
            1.0,
            None,
            false,
        ),
        (
            "sum-by-rate p50 ≤ 1.0x | ≤ 2.0x",
            p50(after, 2),
            p50(prom, 2),
            p50(vmc, 2),
            1.0,
            Some(2.0),
            false,
        ),
        (
            "max_over_time p50 ≤ 1.0x | ≤ 2.0x",
            p50(after, 3),
            p50(prom, 3),
            p50(vmc, 3),
            1.0,
            Some(2.0),
            false,
        ),
    ];
    let fresh = after.freshness_ms.map(|f| f.1);
    println!(
        "  {:<38} {}",
        "freshness ≤ 1000 ms (worst probe)",
        match fresh {
            Some(ms) if ms <= 1000.0 => format!("PASS ({ms:.1} ms)"),
            Some(ms) => format!("MISS ({ms:.1} ms)"),
            None => "MISS (not visible)".to_string(),
        }
    );
    for (label, shale_value, prom_value, vm_value, limit, vm_limit, at_least) in lines {
        let vm = match vm_limit {
            Some(vm_limit) => target(shale_value, vm_value, vm_limit, at_least),
            None => cell(ratio(shale_value, vm_value), 2) + "x",
        };
        println!(
            "  {label:<38} Prometheus: {:<18} VictoriaMetrics: {vm}",
            target(shale_value, prom_value, limit, at_least),
        );
    }
    let before_one = ratio(p50(before, 0), p50(prom, 0));
    let before_sum = ratio(p50(before, 2), p50(prom, 2));
    println!(
        "  (before compaction: one-series p50 {}x, sum-by-rate p50 {}x Prometheus's)",
        cell(before_one, 2),
        cell(before_sum, 2)
    );

    println!();
    if prometheus.is_some() {
        for (i, shape) in plan.shapes.iter().enumerate() {
            let reference = timing(prom, i).map(|t| t.answer);
            for (state, column) in [("before", before), ("after", after)] {
                if let (Some(ours), Some(theirs)) = (timing(column, i).map(|t| t.answer), reference)
                {
                    println!(
                        "answers: {} Shale {state} compaction {} Prometheus ({} / {} series, {} / {} points, value sums {} / {})",
                        shape.name,
                        if ours.same_as(&theirs) { "=" } else { "DIFFERS FROM" },
                        ours.series,
                        theirs.series,
                        ours.points,
                        theirs.points,
                        ours.sum,
                        theirs.sum
                    );
                }
            }
        }
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.series > 0 && args.interval_secs > 0 && args.hours > 0.0);
    let now_s = time::OffsetDateTime::now_utc().unix_timestamp();
    // The data ends 20 minutes before now: every 15-minute bucket is closed.
    let end_ms = (now_s - 20 * 60) * 1000;
    let span_ms = (args.hours * 3_600_000.0) as i64;
    let start_ms = end_ms - span_ms;
    eprintln!(
        "generating {} series x {} s x {} h…",
        args.series, args.interval_secs, args.hours
    );
    let workload = workload(&args, start_ms, end_ms);
    let body_bytes: usize = workload.bodies.iter().flatten().map(Bytes::len).sum();
    let requests: usize = workload.bodies.iter().map(Vec::len).sum();
    let at = |ms: i64| {
        time::OffsetDateTime::from_unix_timestamp(ms / 1000)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| ms.to_string())
    };
    println!(
        "workload: {} series, one sample every {} s for {} h ({} .. {}, ending 20 min before now): {} samples ({} per series) in {requests} remote-write requests of {} samples over {} clients (series i to client i % {}), {:.1} MB snappy, {:.2} bytes/sample on the wire",
        args.series,
        args.interval_secs,
        args.hours,
        at(start_ms),
        at(end_ms),
        workload.samples,
        workload.per_series,
        args.samples_per_request,
        workload.bodies.len(),
        workload.bodies.len(),
        body_bytes as f64 / 1e6,
        body_bytes as f64 / workload.samples as f64,
    );

    let (raw_time, raw_bytes) = raw_parquet(&workload.bodies)?;
    let baseline_rate = workload.samples as f64 / raw_time.as_secs_f64();
    println!(
        "baseline (decode + Parquet splits in process, 1 thread): {:.2} s, {baseline_rate:.0} samples/s, {:.3} bytes/sample (load average {})",
        raw_time.as_secs_f64(),
        raw_bytes as f64 / workload.samples as f64,
        load_average()
    );

    let hosts = args.series.div_ceil(100);
    let one_host = 42.min((args.series - 1) / 100);
    let one = format!(
        "node_cpu_seconds_total{{instance=\"host-{one_host:04}:9100\",mode=\"idle\",device=\"d0\"}}"
    );
    let fifty =
        "node_memory_MemAvailable_bytes{mode=\"idle\",instance=~\"host-00[0-4][0-9]:9100\"}"
            .to_string();
    let end_s = end_ms / 1000;
    let counters: Vec<&str> = NAMES
        .iter()
        .filter(|(_, counter)| *counter)
        .map(|(name, _)| *name)
        .collect();
    let sum_of_rates = counters
        .iter()
        .map(|name| format!("sum by (instance) (rate({name}[5m]))"))
        .collect::<Vec<_>>()
        .join(" + ");
    let counter_series = (0..args.series)
        .filter(|i| NAMES[i % 100 % NAMES.len()].1)
        .count();
    // Each run asks for another series: hosts in a stride that visits every one, gauges and
    // modes in turn; the sum moves its window back a minute a run.
    let one_of = |k: usize| {
        let host = (one_host + 37 * k) % hosts.max(1);
        format!(
            "node_cpu_seconds_total{{instance=\"host-{host:04}:9100\",mode=\"idle\",device=\"d0\"}}"
        )
    };
    let gauges: Vec<&str> = NAMES
        .iter()
        .filter(|(_, counter)| !*counter)
        .map(|(name, _)| *name)
        .collect();
    let modes = ["idle", "user", "system", "iowait", "irq"];
    let fifty_of = |k: usize| {
        format!(
            "{}{{mode=\"{}\",instance=~\"host-00[0-4][0-9]:9100\"}}",
            gauges[k % gauges.len()],
            modes[(k / gauges.len()) % modes.len()]
        )
    };
    let plan = Plan {
        shapes: vec![
            Shape {
                name: "one series",
                variants: (0..hosts.max(1)).map(one_of).collect(),
                moving_window: false,
            },
            Shape {
                name: "rate of one series",
                variants: (0..hosts.max(1))
                    .map(|k| format!("rate({}[5m])", one_of(k)))
                    .collect(),
                moving_window: false,
            },
            Shape {
                name: "sum by rate, every counter",
                variants: vec![sum_of_rates.clone()],
                moving_window: true,
            },
            Shape {
                name: "max_over_time, 50 series",
                variants: (0..gauges.len() * modes.len())
                    .map(|k| format!("max_over_time({}[5m])", fifty_of(k)))
                    .collect(),
                moving_window: false,
            },
        ],
        one,
        fifty,
        window: (end_s - (span_ms / 1000).min(3600), end_s),
        runs: args.query_runs.max(1),
    };
    println!(
        "queries: query_range over the last hour of data ({} .. {}) at a {STEP_SECS} s step, {WARMUP_RUNS} warm-up runs then {} timed runs, p50 and p99:",
        at(plan.window.0 * 1000),
        at(plan.window.1 * 1000),
        plan.runs
    );
    println!(
        "  one series: `{}`, then another host each run (each host has each (name, mode) once, device always d0)",
        plan.shapes[0].variants[0]
    );
    println!(
        "  rate of one series: `{}`, another host each run",
        plan.shapes[1].variants[0]
    );
    println!(
        "  sum by rate, every counter: `{}` — one `sum by (instance) (rate(NAME[5m]))` per counter name, added: {} counter series of the {} ({} hosts), the window moved back a minute each run. A single `rate` over several names of this generator (`{{__name__=~\".+_total\"}}`, `{{job=\"node\"}}`) is refused by Prometheus 2.42 and Shale alike (\"vector cannot contain metrics with the same labelset\": without their names, a host's series differ only by name), so the rate is taken per name; the {} gauges are not rated",
        plan.shapes[2].variants[0],
        counter_series,
        args.series,
        hosts,
        args.series - counter_series
    );
    println!(
        "  max_over_time, 50 series: `{}` — one gauge over hosts 0..49 (one series per host and mode), another (gauge, mode) each run; the count is checked on each system below",
        plan.shapes[3].variants[0]
    );

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .context("building the HTTP client")?;
    let mut prometheus = None;
    if args.skip_prometheus {
        println!("Prometheus: skipped (--skip-prometheus)");
    } else if let Some(binary) = find_on_path("prometheus") {
        match run_prometheus(&binary, &client, &workload, &plan).await {
            Ok(column) => prometheus = Some(column),
            Err(err) => println!("Prometheus: FAILED, left out: {err:#}"),
        }
    } else {
        println!("Prometheus: skipped (no `prometheus` on PATH)");
    }
    let mut vm = None;
    if args.skip_victoria_metrics {
        println!("VictoriaMetrics: skipped (--skip-victoria-metrics)");
    } else if let Some(binary) = find_on_path("victoria-metrics") {
        match run_victoria_metrics(&binary, &client, &workload, &plan).await {
            Ok(column) => vm = Some(column),
            Err(err) => println!("VictoriaMetrics: FAILED, left out: {err:#}"),
        }
    } else {
        println!("VictoriaMetrics: skipped (no `victoria-metrics` on PATH)");
    }

    let shale = run_shale(&workload, &plan, args.live_samples_max_bytes).await?;
    drop(workload);
    let cluster_run = if args.skip_cluster {
        println!("Shale cluster: skipped (--skip-cluster)");
        None
    } else {
        match cluster::run(&args, args.cluster_series, args.cluster_minutes).await {
            Ok(run) => Some(run),
            Err(err) => {
                println!("Shale cluster: FAILED: {err:#}");
                None
            }
        }
    };
    print_summary(
        &plan,
        &shale,
        prometheus.as_ref(),
        vm.as_ref(),
        baseline_rate,
    );
    if let Some(run) = &cluster_run {
        cluster::print_summary(run);
    }
    Ok(())
}
