//! `shale-bench ingest`: the data-path benchmark.
//!
//! 1. Baseline: raw in-process Tantivy indexing of the corpus (same schema, same writer heap)
//!    with Tantivy's default settings on one thread and on one per core, and with the
//!    settings of Shale's splits (its zstd document store) on one per core, in the same run.
//! 2. End to end: a Shale node in this process (embedded defaults: SQLite, local FS), the
//!    corpus POSTed through the HTTP ingest API in 4 MB NDJSON batches by 1, 2 and 4
//!    concurrent clients (a fresh node each), timed until a final `commit=force` returns
//!    (everything published and searchable); the target is 0.8x of raw Tantivy on all cores
//!    writing the same split format (the ratio to Tantivy's defaults is printed too).
//! 3. Search latency p50/p99 for a term query, a phrase query and a time-range + tag query.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

use crate::corpus;
use shale_config::{IndexConfig, NodeConfig};
use tantivy::{Index, IndexWriter, TantivyDocument};

#[derive(clap::Args)]
pub struct Args {
    /// Documents in the corpus.
    #[arg(long, default_value_t = 1_000_000)]
    docs: usize,
    /// Concurrent HTTP clients: one end-to-end run (a fresh node) per count.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    clients: Vec<usize>,
    /// Bytes per ingest request.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    batch_bytes: usize,
    /// Iterations per search query.
    #[arg(long, default_value_t = 100)]
    search_iterations: usize,
    /// Seed of the corpus generator.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Indexing threads of the second raw Tantivy baseline (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Shale's `indexer_threads` (default: the node's default, the machine's cores).
    #[arg(long)]
    indexer_threads: Option<usize>,
}

/// Peak resident memory of this process since the last [`reset_peak_rss`], in MB (Linux).
pub fn peak_rss_mb() -> f64 {
    peak_rss_mb_of("/proc/self/status").unwrap_or(0.0)
}

/// Peak resident memory (`VmHWM`) of the process whose `/proc/<pid>/status` is
/// `status_path`, in MB (Linux).
pub fn peak_rss_mb_of(status_path: &str) -> Option<f64> {
    std::fs::read_to_string(status_path)
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
}

/// Resets the peak resident memory counter (Linux `clear_refs` 5).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Raw Tantivy: same schema, same parse-from-JSON, `threads` indexing threads (and as many
/// parsing threads feeding them), 128 MB heap per thread.
fn raw_tantivy(
    lines: &[String],
    schema: tantivy::schema::Schema,
    settings: tantivy::IndexSettings,
    threads: usize,
) -> anyhow::Result<Duration> {
    let dir = tempfile::tempdir()?;
    let index = Index::builder()
        .schema(schema.clone())
        .settings(settings)
        .create_in_dir(dir.path())?;
    let started = Instant::now();
    let mut writer: IndexWriter =
        index.writer_with_num_threads(threads, threads * 128 * 1024 * 1024)?;
    if threads <= 1 {
        for line in lines {
            let doc = TantivyDocument::parse_json(&schema, line)?;
            writer.add_document(doc)?;
        }
    } else {
        // Parsing is spread over the threads too: each parses a share and adds it.
        let chunk = lines.len().div_ceil(threads);
        std::thread::scope(|scope| -> anyhow::Result<()> {
            let handles: Vec<_> = lines
                .chunks(chunk.max(1))
                .map(|part| {
                    let (writer, schema) = (&writer, &schema);
                    scope.spawn(move || -> anyhow::Result<()> {
                        for line in part {
                            let doc = TantivyDocument::parse_json(schema, line)?;
                            writer.add_document(doc)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for handle in handles {
                handle
                    .join()
                    .map_err(|_| anyhow::anyhow!("a parsing thread panicked"))??;
            }
            Ok(())
        })?;
    }
    writer.commit()?;
    writer.wait_merging_threads()?;
    Ok(started.elapsed())
}

pub async fn search_latency(
    client: &reqwest::Client,
    base: &str,
    name: &str,
    request: Value,
    iterations: usize,
) -> anyhow::Result<()> {
    let url = format!("{base}/api/v1/bench-logs/search");
    let warm: Value = client
        .post(&url)
        .json(&request)
        .send()
        .await?
        .json()
        .await?;
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let resp = client.post(&url).json(&request).send().await?;
        anyhow::ensure!(
            resp.status().is_success(),
            "search failed: {}",
            resp.text().await?
        );
        let _: Value = resp.json().await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{name:<28} p50 {:>7.2} ms   p99 {:>7.2} ms   hits {:>8}   splits searched {:>3} pruned {:>3}",
        percentile(&samples, 0.50),
        percentile(&samples, 0.99),
        warm["num_hits"],
        warm["num_splits_searched"],
        warm["num_splits_pruned"],
    );
    Ok(())
}

/// Starts a node in this process serving on a free loopback port; returns it, its base URL
/// and an HTTP client.
pub async fn start_node(
    mut config: shale_config::NodeConfig,
) -> anyhow::Result<(Arc<shale_server::Node>, String, reqwest::Client)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    // The address other nodes reach this one at (leaf calls, forwarded writes).
    config.listen_address = addr.to_string();
    let base = format!("http://{addr}");
    let node = shale_server::Node::start(config).await?;
    tokio::spawn(shale_server::serve(
        node.clone(),
        listener,
        std::future::pending(),
    ));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()?;
    Ok((node, base, client))
}

/// Splits the corpus into NDJSON bodies of about `batch_bytes`; the last body is returned
/// apart (it is sent with `commit=force`).
pub fn ndjson_batches(lines: &[String], batch_bytes: usize) -> (Vec<String>, String) {
    let mut batches = Vec::new();
    let mut current = String::with_capacity(batch_bytes + 1024);
    for line in lines {
        current.push_str(line);
        current.push('\n');
        if current.len() >= batch_bytes {
            batches.push(std::mem::take(&mut current));
        }
    }
    (batches, current)
}

/// Spawns `clients` tasks POSTing `batches` (`commit=auto`) to the bench index, in order. With
/// a pace `(start, docs_per_batch, docs_per_sec)`, batch `i` is not sent before
/// `start + i * docs_per_batch / docs_per_sec`.
pub fn spawn_ingest_clients(
    client: &reqwest::Client,
    base: &str,
    batches: Arc<Vec<String>>,
    clients: usize,
    pace: Option<(Instant, f64, f64)>,
) -> Vec<tokio::task::JoinHandle<anyhow::Result<()>>> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    (0..clients)
        .map(|_| {
            let (client, base, batches, next) = (
                client.clone(),
                base.to_string(),
                batches.clone(),
                next.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(batch) = batches.get(i) else { break };
                    if let Some((start, docs_per_batch, docs_per_sec)) = pace {
                        let due = Duration::from_secs_f64(i as f64 * docs_per_batch / docs_per_sec);
                        tokio::time::sleep_until((start + due).into()).await;
                    }
                    let resp = client
                        .post(format!("{base}/api/v1/bench-logs/ingest"))
                        .body(batch.clone())
                        .send()
                        .await
                        .context("ingest request")?;
                    anyhow::ensure!(resp.status().is_success(), "{}", resp.text().await?);
                }
                anyhow::Ok(())
            })
        })
        .collect()
}

/// Sends every batch through `clients` concurrent clients (paced as
/// [`spawn_ingest_clients`]), then `last_batch` with `commit=force`.
pub async fn ingest_all(
    client: &reqwest::Client,
    base: &str,
    batches: Vec<String>,
    last_batch: String,
    clients: usize,
    pace: Option<(Instant, f64, f64)>,
) -> anyhow::Result<()> {
    let tasks = spawn_ingest_clients(client, base, Arc::new(batches), clients, pace);
    for task in tasks {
        task.await??;
    }
    let resp = client
        .post(format!("{base}/api/v1/bench-logs/ingest?commit=force"))
        .body(last_batch)
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success(), "{}", resp.text().await?);
    Ok(())
}

/// Creates an index from its YAML config on the node at `base`.
pub async fn create_index(
    client: &reqwest::Client,
    base: &str,
    yaml: impl Into<reqwest::Body>,
) -> anyhow::Result<()> {
    let resp = client
        .post(format!("{base}/api/v1/indexes"))
        .body(yaml)
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success(), "{}", resp.text().await?);
    Ok(())
}

/// Creates the bench index from `yaml` on the node at `base`, then ingests `lines` in 4 MiB
/// requests from two clients, the last with `commit=force`.
pub async fn create_and_ingest(
    client: &reqwest::Client,
    base: &str,
    yaml: String,
    lines: &[String],
) -> anyhow::Result<()> {
    create_index(client, base, yaml).await?;
    let (batches, last_batch) = ndjson_batches(lines, 4 * 1024 * 1024);
    ingest_all(client, base, batches, last_batch, 2, None).await
}

/// The index `index_id` and its Published splits.
pub async fn published_splits(
    node: &shale_server::Node,
    index_id: &str,
) -> anyhow::Result<(shale_metastore::IndexMetadata, Vec<shale_types::Split>)> {
    let index = node.metastore.index_metadata(index_id).await?;
    let splits = node
        .metastore
        .list_splits(
            shale_metastore::ListSplitsQuery::for_index(index.index_uid.clone())
                .with_states(&[shale_types::SplitState::Published]),
        )
        .await?;
    Ok((index, splits))
}

/// Live (pending or running) merge tasks of an index.
pub async fn live_merge_tasks(
    node: &shale_server::Node,
    index_uid: &shale_types::IndexUid,
) -> anyhow::Result<usize> {
    Ok(node
        .metastore
        .list_merge_tasks(
            Some(index_uid),
            &[
                shale_metastore::MergeTaskState::Pending,
                shale_metastore::MergeTaskState::Running,
            ],
            None,
        )
        .await?
        .len())
}

/// One end-to-end ingest through HTTP on a fresh node; the node is kept (for the searches).
struct IngestRun {
    node: Arc<shale_server::Node>,
    _data: tempfile::TempDir,
    base: String,
    client: reqwest::Client,
    docs_per_sec: f64,
}

/// Ingests the corpus through `clients` concurrent HTTP clients into a fresh node until it is
/// all published, and prints what the run measured.
async fn ingest_run(
    args: &Args,
    lines: &[String],
    corpus_bytes: usize,
    clients: usize,
) -> anyhow::Result<IngestRun> {
    let data = tempfile::tempdir()?;
    let mut node_config = NodeConfig {
        node_id: "bench".into(),
        ..NodeConfig::with_data_dir(data.path())
    };
    if let Some(n) = args.indexer_threads {
        node_config.indexer_threads = n;
    }
    let indexer_threads = node_config.indexer_threads;
    let (node, base, client) = start_node(node_config).await?;
    create_index(&client, &base, corpus::INDEX_YAML).await?;

    let stages_before = stage_sums(
        &client
            .get(format!("{base}/metrics"))
            .send()
            .await?
            .text()
            .await?,
    );
    let (batches, last_batch) = ndjson_batches(lines, args.batch_bytes);
    let baseline_rss = peak_rss_mb();
    reset_peak_rss();
    let started = Instant::now();
    ingest_all(&client, &base, batches, last_batch, clients, None).await?;
    let e2e = started.elapsed();
    let ingest_peak_rss = peak_rss_mb();
    let docs_per_sec = args.docs as f64 / e2e.as_secs_f64();

    let splits: Value = client
        .get(format!(
            "{base}/api/v1/indexes/bench-logs/splits?split_states=Published"
        ))
        .send()
        .await?
        .json()
        .await?;
    let num_splits = splits["splits"].as_array().map_or(0, Vec::len);
    let docs_published: u64 = splits["splits"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["num_docs"].as_u64())
        .sum();
    println!();
    println!(
        "shale HTTP, {clients} client(s), indexer_threads {indexer_threads}: {docs_per_sec:.0} docs/s, {:.1} MB/s, {:.1}s; published {docs_published} docs in {num_splits} splits",
        corpus_bytes as f64 / 1e6 / e2e.as_secs_f64(),
        e2e.as_secs_f64()
    );
    println!(
        "  peak RSS during ingest: {ingest_peak_rss:.0} MB (process before ingest, corpus in memory: {baseline_rss:.0} MB)"
    );
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    if let Some(line) = metrics
        .lines()
        .find(|l| l.starts_with("shale_indexing_handoffs_dropped_total"))
    {
        println!("  ingest requests parsed twice (handoff dropped): {line}");
    }
    // The stage sums are the process's (every run's nodes): this run's part is the change.
    let stages: Vec<String> = stage_sums(&metrics)
        .into_iter()
        .map(|(stage, secs)| {
            let before = stages_before.get(&stage).copied().unwrap_or(0.0);
            format!("{stage} {:.2}", secs - before)
        })
        .collect();
    println!("  pipeline time by stage (s): {}", stages.join(", "));
    anyhow::ensure!(
        docs_published as usize == args.docs,
        "published doc count mismatch"
    );
    Ok(IngestRun {
        node,
        _data: data,
        base,
        client,
        docs_per_sec,
    })
}

/// `shale_indexing_stage_seconds_sum` by stage, from a `/metrics` page.
fn stage_sums(metrics: &str) -> std::collections::BTreeMap<String, f64> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("shale_indexing_stage_seconds_sum{stage=\""))
        .filter_map(|rest| {
            let (stage, value) = rest.split_once("\"} ")?;
            Some((stage.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Runs the ingest benchmark.
pub async fn run(args: Args) -> anyhow::Result<()> {
    eprintln!("generating {} documents…", args.docs);
    let lines = corpus::generate(args.docs, args.seed);
    let corpus_bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
    println!(
        "corpus: {} docs, {:.1} MB, {:.0} B/doc",
        args.docs,
        corpus_bytes as f64 / 1e6,
        corpus_bytes as f64 / args.docs as f64
    );

    let config = IndexConfig::parse(corpus::INDEX_YAML.as_bytes())?;
    let mapper = shale_index::DocMapper::for_index(&config)?;

    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let lines = Arc::new(lines);
    // Raw Tantivy with its default settings (LZ4 document store on 16 KB blocks) on 1 and on
    // every thread, then with the settings of Shale's splits (its document store: zstd), so
    // that the pipeline's overhead and the split format's cost read apart.
    let mut raws = Vec::new();
    for (n, settings, name) in [
        (1, tantivy::IndexSettings::default(), "Tantivy's defaults"),
        (
            threads,
            tantivy::IndexSettings::default(),
            "Tantivy's defaults",
        ),
        (threads, mapper.index_settings(), "Shale's split settings"),
    ] {
        eprintln!("raw tantivy, {n} thread(s), {name}…");
        let lines = lines.clone();
        let schema = mapper.schema().clone();
        let took =
            tokio::task::spawn_blocking(move || raw_tantivy(&lines, schema, settings, n)).await??;
        println!(
            "raw tantivy, {n} thread(s), {name:<22} {:>10.0} docs/s {:>7.1} MB/s {:>6.1}s",
            args.docs as f64 / took.as_secs_f64(),
            corpus_bytes as f64 / 1e6 / took.as_secs_f64(),
            took.as_secs_f64()
        );
        raws.push(args.docs as f64 / took.as_secs_f64());
    }
    let (raw_dps, raw_n_dps, raw_same_dps) = (raws[0], raws[1], raws[2]);
    let mut last = None;
    let mut results = Vec::new();
    for &clients in &args.clients {
        eprintln!("shale end to end, {clients} client(s)…");
        let run = ingest_run(&args, &lines, corpus_bytes, clients).await?;
        results.push((clients, run.docs_per_sec));
        // The previous run's node stops: nothing of it competes for the cores.
        if let Some(previous) = last.replace(run) {
            previous.node.shutdown().await;
        }
    }
    println!();
    println!(
        "ingest until searchable, {} docs   docs/s   / raw 1 thread   / raw {threads} threads   / raw {threads} threads, same settings   target >= 0.80x of the last",
        args.docs
    );
    for (clients, dps) in &results {
        let ratio = dps / raw_same_dps;
        println!(
            "shale HTTP, {clients} client(s)   {dps:>10.0}   {:>13.2}x   {:>14.2}x   {:>14.2}x   {}",
            dps / raw_dps,
            dps / raw_n_dps,
            ratio,
            if ratio >= 0.8 { "met" } else { "NOT met" }
        );
    }
    let Some(IngestRun {
        node: _node,
        base,
        client,
        ..
    }) = last
    else {
        return Ok(());
    };
    println!();
    println!(
        "search latency over {} docs ({} iterations each)",
        args.docs, args.search_iterations
    );
    let mid = corpus::T0 + corpus::SPAN_SECS / 2;
    for (name, request) in [
        (
            "term (message:timeout)",
            json!({"query": "message:timeout", "max_hits": 20}),
        ),
        (
            "term (level:ERROR)",
            json!({"query": "level:ERROR", "max_hits": 20}),
        ),
        (
            "phrase (\"connection refused\")",
            json!({"query": "\"connection refused\"", "max_hits": 20}),
        ),
        (
            "time range 10 min + tag",
            json!({"query": "service:payment AND level:ERROR", "start_timestamp": mid, "end_timestamp": mid + 600, "max_hits": 20}),
        ),
    ] {
        search_latency(&client, &base, name, request, args.search_iterations).await?;
    }
    Ok(())
}
