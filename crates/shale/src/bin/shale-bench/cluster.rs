//! `shale-bench cluster`: three `shale run` processes on this machine vs one, on the same
//! corpus (SQLite metastore file and local split directory shared by the processes; build the
//! `shale` binary first: `cargo build --release --bins`).
//!
//! 1. Ingest throughput, measured until every document is searchable, through one node vs
//!    through the three nodes in turn.
//! 2. On each: p50/p99 of a query over ≥ 50 splits through one root, the
//!    splits each node searched (max/mean, from `shale_search_leaf_splits_total`), and the
//!    split-cache hit rate of the repeated query (from `shale_split_cache`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

use crate::corpus;
use crate::ingest::{ndjson_batches, percentile};

#[derive(clap::Args)]
pub struct Args {
    /// Documents in the corpus.
    #[arg(long, default_value_t = 600_000)]
    docs: usize,
    /// Concurrent HTTP clients.
    #[arg(long, default_value_t = 3)]
    clients: usize,
    /// Bytes per ingest request.
    #[arg(long, default_value_t = 1024 * 1024)]
    batch_bytes: usize,
    /// Splits the corpus is cut into (at least 50 for the query figures). An indexer cuts a split
    /// between requests, so a split holds a little more than `docs / splits`.
    #[arg(long, default_value_t = 80)]
    splits: usize,
    /// Iterations of the query.
    #[arg(long, default_value_t = 100)]
    search_iterations: usize,
    /// Seed of the corpus generator.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// `shale run` processes sharing one data root.
struct Nodes {
    children: Vec<Child>,
    bases: Vec<String>,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn shale_binary() -> anyhow::Result<PathBuf> {
    let path = std::env::current_exe()?.with_file_name("shale");
    anyhow::ensure!(
        path.exists(),
        "{} not found: build it first (cargo build --release --bins)",
        path.display()
    );
    Ok(path)
}

async fn start_nodes(root: &Path, n: usize) -> anyhow::Result<Nodes> {
    let binary = shale_binary()?;
    let metastore = format!("sqlite://{}/metastore.db", root.display());
    let storage = format!("file://{}/indexes", root.display());
    let mut nodes = Nodes {
        children: Vec::new(),
        bases: Vec::new(),
    };
    for i in 0..n {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new(&binary)
            .args(["run", "--cluster-id", "bench", "--node-id"])
            .arg(format!("n{i}"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(root.join(format!("n{i}")))
            .arg("--metastore-uri")
            .arg(&metastore)
            .arg("--storage-uri")
            .arg(&storage)
            .env("SHALE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(root.join(format!("n{i}.log")))?)
            .spawn()
            .context("spawn shale run")?;
        nodes.children.push(child);
        nodes.bases.push(format!("http://127.0.0.1:{port}"));
    }
    let client = reqwest::Client::new();
    for base in &nodes.bases {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(resp) = client.get(format!("{base}/health/readyz")).send().await {
                if resp.status().is_success() {
                    break;
                }
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = (0..n)
                    .map(|i| {
                        let log = std::fs::read_to_string(root.join(format!("n{i}.log")))
                            .unwrap_or_default();
                        format!("--- n{i}:\n{log}")
                    })
                    .collect();
                anyhow::bail!("{base} did not start\n{}", logs.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Every node sees the others.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state: Value = client
            .get(format!("{}/api/v1/cluster", nodes.bases[0]))
            .send()
            .await?
            .json()
            .await?;
        if state["live_nodes"].as_array().map_or(0, Vec::len) == n {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the nodes never saw each other");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(nodes)
}

fn index_yaml(split_docs: usize) -> String {
    corpus::INDEX_YAML.replace(
        "  commit_timeout_secs: 30\n",
        &format!(
            "  commit_timeout_secs: 2\n  split_num_docs_target: {split_docs}\n  merge_policy:\n    type: no_merge\n"
        ),
    )
}

/// Ingests the corpus through `nodes` in turn; the time until every document is searchable.
async fn ingest(
    client: &reqwest::Client,
    nodes: &Nodes,
    batches: Arc<Vec<String>>,
    clients: usize,
    total: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let bases = Arc::new(nodes.bases.clone());
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, batches, next, bases) =
                (client.clone(), batches.clone(), next.clone(), bases.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(batch) = batches.get(i) else { break };
                    let base = &bases[i % bases.len()];
                    let resp = client
                        .post(format!("{base}/api/v1/bench-logs/ingest"))
                        .body(batch.clone())
                        .send()
                        .await?;
                    anyhow::ensure!(resp.status().is_success(), "{}", resp.text().await?);
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    loop {
        let resp: Value = client
            .post(format!("{}/api/v1/bench-logs/search", nodes.bases[0]))
            .json(&json!({"query": "*", "max_hits": 0}))
            .send()
            .await?
            .json()
            .await?;
        if resp["num_hits"].as_u64() == Some(total as u64) {
            return Ok(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A metric's value on each node (`name{labels}` exactly as exported).
async fn scrape(client: &reqwest::Client, nodes: &Nodes, series: &str) -> anyhow::Result<Vec<f64>> {
    let mut values = Vec::new();
    for base in &nodes.bases {
        let text = client
            .get(format!("{base}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        let value = text
            .lines()
            .find_map(|line| {
                line.strip_prefix(series)
                    .and_then(|rest| rest.strip_prefix(' '))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .unwrap_or(0.0);
        values.push(value);
    }
    Ok(values)
}

/// The query over every split through the first node as root, repeated; prints its latency,
/// the splits each node searched and the split-cache hit rate, returns the p50 in ms.
async fn query(client: &reqwest::Client, nodes: &Nodes, iterations: usize) -> anyhow::Result<f64> {
    let request = json!({"query": "message:timeout", "max_hits": 20});
    let url = format!("{}/api/v1/bench-logs/search", nodes.bases[0]);
    let leaf_before = scrape(client, nodes, "shale_search_leaf_splits_total").await?;
    let hits_before = scrape(client, nodes, "shale_split_cache{stat=\"hits\"}").await?;
    let misses_before = scrape(client, nodes, "shale_split_cache{stat=\"misses\"}").await?;
    let mut samples = Vec::new();
    let mut last: Value = Value::Null;
    for _ in 0..iterations {
        let started = Instant::now();
        let resp = client.post(&url).json(&request).send().await?;
        anyhow::ensure!(resp.status().is_success(), "{}", resp.text().await?);
        last = resp.json().await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let leaf_after = scrape(client, nodes, "shale_search_leaf_splits_total").await?;
    let hits_after = scrape(client, nodes, "shale_split_cache{stat=\"hits\"}").await?;
    let misses_after = scrape(client, nodes, "shale_split_cache{stat=\"misses\"}").await?;
    let jobs: Vec<f64> = leaf_after
        .iter()
        .zip(&leaf_before)
        .map(|(a, b)| a - b)
        .collect();
    let mean = jobs.iter().sum::<f64>() / jobs.len() as f64;
    let max = jobs.iter().copied().fold(0.0, f64::max);
    let hits: f64 = hits_after.iter().sum::<f64>() - hits_before.iter().sum::<f64>();
    let misses: f64 = misses_after.iter().sum::<f64>() - misses_before.iter().sum::<f64>();
    let p50 = percentile(&samples, 0.50);
    println!(
        "  query `message:timeout` through one root, {iterations} iterations: p50 {p50:.2} ms, p99 {:.2} ms; {} hits, {} splits searched on {} node(s)",
        percentile(&samples, 0.99),
        last["num_hits"],
        last["num_splits_searched"],
        last["num_nodes"],
    );
    println!(
        "  splits searched per node: {jobs:?}; max/mean {:.2}",
        if mean > 0.0 { max / mean } else { 0.0 }
    );
    println!(
        "  split cache over the {iterations} runs: {hits} hits, {misses} misses, hit rate {:.3}",
        if hits + misses > 0.0 {
            hits / (hits + misses)
        } else {
            0.0
        }
    );
    Ok(p50)
}

/// Runs the cluster benchmark.
pub async fn run(args: Args) -> anyhow::Result<()> {
    eprintln!("generating {} documents…", args.docs);
    let lines = corpus::generate(args.docs, args.seed);
    let corpus_bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
    println!(
        "corpus: {} docs, {:.1} MB; index cut into splits of {} docs, no merges",
        args.docs,
        corpus_bytes as f64 / 1e6,
        args.docs / args.splits
    );
    let (mut batches, last) = ndjson_batches(&lines, args.batch_bytes);
    batches.push(last);
    let batches = Arc::new(batches);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()?;
    let yaml = index_yaml(args.docs / args.splits);

    let mut ingest_rates = Vec::new();
    let mut query_p50s = Vec::new();
    for n in [1usize, 3] {
        eprintln!("{n} node(s)…");
        let root = tempfile::tempdir()?;
        let nodes = start_nodes(root.path(), n).await?;
        let resp = client
            .post(format!("{}/api/v1/indexes", nodes.bases[0]))
            .body(yaml.clone())
            .send()
            .await?;
        anyhow::ensure!(resp.status().is_success(), "{}", resp.text().await?);
        let took = ingest(&client, &nodes, batches.clone(), args.clients, args.docs).await?;
        let rate = args.docs as f64 / took.as_secs_f64();
        ingest_rates.push(rate);
        println!(
            "ingest through {n} node(s): {rate:>9.0} docs/s ({:.1} MB/s), all searchable after {:.1}s",
            corpus_bytes as f64 / 1e6 / took.as_secs_f64(),
            took.as_secs_f64()
        );
        if n == 3 {
            println!(
                "ingest 3 nodes / 1 node: {:.2}x",
                ingest_rates[1] / ingest_rates[0]
            );
        }
        let p50 = query(&client, &nodes, args.search_iterations).await?;
        query_p50s.push(p50);
        if n == 3 {
            println!(
                "query p50 3 nodes / 1 node: {:.2}x",
                query_p50s[1] / query_p50s[0]
            );
        }
    }
    Ok(())
}
