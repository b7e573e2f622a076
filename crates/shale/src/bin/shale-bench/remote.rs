//! `shale-bench remote`: searching splits that live on an S3-compatible server, read by
//! byte ranges (hot cache + range cache) against downloading whole splits first.
//!
//! The corpus is ingested into a node whose index root is a bucket (the server named by
//! `--s3-endpoint`, else moto started on loopback), cut into `--splits` splits. Then, for each
//! way of reading, a fresh node (empty caches, same metastore) runs: the first term query
//! (cold: every split opened), the same query again (warm, p50 over `--iterations`), and a
//! first phrase query on the opened splits; each with its latency and the bytes it fetched
//! from the object store.

use std::time::Instant;

use shale_config::{IndexConfig, NodeConfig};
use shale_search::SearchRequest;

use crate::corpus;
use crate::ingest::{create_and_ingest, percentile, published_splits, start_node};

#[derive(clap::Args)]
pub struct Args {
    /// Splits in the index.
    #[arg(long, default_value_t = 10)]
    splits: usize,
    /// Documents per split.
    #[arg(long, default_value_t = 100_000)]
    split_docs: usize,
    /// Warm iterations of the term query.
    #[arg(long, default_value_t = 20)]
    iterations: usize,
    /// Seed of the corpus generator.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// An S3-compatible endpoint (`http://127.0.0.1:9000`, any credentials); default: moto
    /// started on loopback (`python3 -m moto.server`).
    #[arg(long)]
    s3_endpoint: Option<String>,
    /// An existing bucket to use (default: a new one, created with an unsigned request as
    /// moto accepts).
    #[arg(long)]
    bucket: Option<String>,
}

/// One way of reading, measured.
struct Run {
    cold_ms: f64,
    cold_bytes: u64,
    cold_gets: u64,
    warm_p50_ms: f64,
    warm_bytes: u64,
    second_ms: f64,
    second_bytes: u64,
    hits: u64,
}

fn node_config(
    data_dir: &std::path::Path,
    metastore_uri: &str,
    endpoint: &str,
    bucket: &str,
) -> NodeConfig {
    let mut config = NodeConfig {
        node_id: "bench".into(),
        ..NodeConfig::with_data_dir(data_dir)
    };
    config.metastore_uri = metastore_uri.to_string();
    config.default_index_root_uri = format!("s3://{bucket}/indexes");
    config.s3.endpoint = Some(endpoint.to_string());
    config.s3.access_key_id = Some(shale_testkit::s3::ACCESS_KEY.into());
    config.s3.secret_access_key = Some(shale_testkit::s3::SECRET_KEY.into());
    config
}

/// Bytes fetched from the object store by `node` so far, and GETs (ranged reads only).
fn fetched(node: &shale_server::Node) -> (u64, u64) {
    let whole = node.search.cache().downloaded_bytes();
    match node.search.leaf().range_cache() {
        Some(ranges) => (whole + ranges.fetched_bytes(), ranges.fetches()),
        None => (whole, node.search.cache().hit_miss().1),
    }
}

async fn measure(config: NodeConfig, iterations: usize) -> anyhow::Result<Run> {
    let (node, _base, _client) = start_node(config).await?;
    let term = SearchRequest {
        query: "message:timeout".into(),
        max_hits: 20,
        ..Default::default()
    };
    let phrase = SearchRequest {
        query: "message:\"connection refused\"".into(),
        max_hits: 20,
        ..Default::default()
    };
    let started = Instant::now();
    let first = node.search.search("bench-logs", term.clone()).await?;
    let cold_ms = started.elapsed().as_secs_f64() * 1e3;
    let (cold_bytes, cold_gets) = fetched(&node);
    let mut warm = Vec::with_capacity(iterations);
    for _ in 0..iterations.max(1) {
        let started = Instant::now();
        node.search.search("bench-logs", term.clone()).await?;
        warm.push(started.elapsed().as_secs_f64() * 1e3);
    }
    warm.sort_by(|a, b| a.total_cmp(b));
    let (after_warm, _) = fetched(&node);
    let started = Instant::now();
    node.search.search("bench-logs", phrase).await?;
    let second_ms = started.elapsed().as_secs_f64() * 1e3;
    let (after_second, _) = fetched(&node);
    node.shutdown().await;
    node.release_data_dir();
    Ok(Run {
        cold_ms,
        cold_bytes,
        cold_gets,
        warm_p50_ms: percentile(&warm, 0.5),
        warm_bytes: after_warm - cold_bytes,
        second_ms,
        second_bytes: after_second - after_warm,
        hits: first.num_hits,
    })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Runs the remote-search benchmark.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let endpoint = match &args.s3_endpoint {
        Some(endpoint) => endpoint.trim_end_matches('/').to_string(),
        None => shale_testkit::s3::endpoint().ok_or_else(|| {
            anyhow::anyhow!("no S3 server: pass --s3-endpoint or install moto[server]")
        })?,
    };
    let bucket = match args.bucket.clone() {
        Some(bucket) => bucket,
        None => {
            let bucket = format!(
                "shale-bench-{}",
                ulid::Ulid::new().to_string().to_lowercase()
            );
            shale_testkit::s3::create_bucket(&endpoint, &bucket)
                .map_err(|err| anyhow::anyhow!("cannot create bucket {bucket}: {err}"))?;
            bucket
        }
    };

    let docs = args.splits * args.split_docs;
    eprintln!("generating {docs} documents…");
    let lines = corpus::generate(docs, args.seed);
    let yaml = corpus::INDEX_YAML.replace(
        "  commit_timeout_secs: 30\n",
        &format!(
            "  commit_timeout_secs: 30\n  split_num_docs_target: {}\n  merge_policy:\n    type: no_merge\n",
            args.split_docs
        ),
    );
    IndexConfig::parse(yaml.as_bytes())?;
    let data = tempfile::tempdir()?;
    let metastore_uri = format!("sqlite://{}", data.path().join("metastore.db").display());
    let (node, base, client) = start_node(node_config(
        &data.path().join("ingest"),
        &metastore_uri,
        &endpoint,
        &bucket,
    ))
    .await?;
    eprintln!("ingesting into s3://{bucket} on {endpoint}…");
    create_and_ingest(&client, &base, yaml, &lines).await?;
    drop(lines);
    let (_, splits) = published_splits(&node, "bench-logs").await?;
    node.shutdown().await;
    node.release_data_dir();
    let split_bytes: u64 = splits.iter().map(|s| s.split_metadata.size_bytes).sum();
    let hot_bytes: u64 = splits
        .iter()
        .map(|s| s.split_metadata.size_bytes - s.split_metadata.footer_offsets.0)
        .sum();
    println!(
        "corpus: {docs} docs in {} splits on {endpoint}, {:.1} MiB of split objects; hot caches + footers {:.1} KiB in all",
        splits.len(),
        mib(split_bytes),
        hot_bytes as f64 / 1024.0
    );

    let mut ranges_config = node_config(
        &data.path().join("ranges"),
        &metastore_uri,
        &endpoint,
        &bucket,
    );
    ranges_config.range_cache_max_bytes = 512 << 20;
    let ranges = measure(ranges_config, args.iterations).await?;
    let mut whole_config = node_config(
        &data.path().join("whole"),
        &metastore_uri,
        &endpoint,
        &bucket,
    );
    whole_config.range_cache_max_bytes = 0;
    let whole = measure(whole_config, args.iterations).await?;
    anyhow::ensure!(
        ranges.hits == whole.hits,
        "the two ways disagree: {} vs {} hits",
        ranges.hits,
        whole.hits
    );

    println!();
    println!(
        "term query message:timeout ({} hits), top 20 by timestamp + exact count",
        ranges.hits
    );
    println!(
        "{:<34} {:>12} {:>12} {:>8}",
        "", "by ranges", "whole splits", "ratio"
    );
    let row = |name: &str, a: f64, b: f64, unit: &str| {
        let ratio = if b > 0.0 {
            format!("{:.2}x", a / b)
        } else {
            "-".to_string()
        };
        println!("{name:<34} {a:>10.1}{unit} {b:>10.1}{unit} {ratio:>8}");
    };
    row("cold first query (ms)", ranges.cold_ms, whole.cold_ms, "  ");
    row(
        "  fetched (MiB)",
        mib(ranges.cold_bytes),
        mib(whole.cold_bytes),
        "  ",
    );
    println!(
        "{:<34} {:>12} {:>12}",
        "  GETs (ranged / whole objects)", ranges.cold_gets, whole.cold_gets
    );
    row("warm p50 (ms)", ranges.warm_p50_ms, whole.warm_p50_ms, "  ");
    row(
        "  fetched (MiB)",
        mib(ranges.warm_bytes),
        mib(whole.warm_bytes),
        "  ",
    );
    row(
        "first phrase query, splits open (ms)",
        ranges.second_ms,
        whole.second_ms,
        "  ",
    );
    row(
        "  fetched (MiB)",
        mib(ranges.second_bytes),
        mib(whole.second_bytes),
        "  ",
    );
    Ok(())
}
