//! `shale-bench compaction`: sustained HTTP ingest of the corpus into an index with the
//! default merge policy (stable_log) while the node compacts; reports the split count over
//! time, the final split count, write amplification (split bytes written by ingest and merges
//! over split bytes written by ingest, from the metastore) and search latency plus
//! `num_splits_searched` for the same queries over the fresh ingest splits (kept during the
//! deletion grace period) and over the compacted splits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use shale_config::NodeConfig;
use shale_metastore::{ListSplitsQuery, MergeTaskState};
use shale_types::SplitState;

use crate::corpus;
use crate::ingest::{
    create_index, live_merge_tasks, ndjson_batches, percentile, spawn_ingest_clients, start_node,
};

#[derive(clap::Args)]
pub struct Args {
    /// Documents ingested.
    #[arg(long, default_value_t = 2_000_000)]
    docs: usize,
    /// `indexing_settings.commit_timeout_secs` of the index (small: many fresh splits).
    #[arg(long, default_value_t = 2)]
    commit_timeout_secs: u64,
    /// Concurrent HTTP clients.
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// Steady ingest rate, documents per second (0: as fast as possible).
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
    /// Iterations per search query.
    #[arg(long, default_value_t = 50)]
    search_iterations: usize,
}

fn queries() -> Vec<(&'static str, Value)> {
    let mid = corpus::T0 + corpus::SPAN_SECS / 2;
    vec![
        (
            "term (message:timeout)",
            json!({"query": "message:timeout", "max_hits": 20}),
        ),
        (
            "phrase (\"connection refused\")",
            json!({"query": "\"connection refused\"", "max_hits": 20}),
        ),
        (
            "time range 10 min + tag",
            json!({"query": "service:payment AND level:ERROR", "start_timestamp": mid, "end_timestamp": mid + 600, "max_hits": 20}),
        ),
    ]
}

async fn latency(
    node: &shale_server::Node,
    request: &Value,
    splits: Option<&[shale_types::SplitMetadata]>,
    iterations: usize,
) -> anyhow::Result<(f64, f64, u64, usize)> {
    let request: shale_search::SearchRequest = serde_json::from_value(request.clone())?;
    let mut samples = Vec::with_capacity(iterations);
    let mut last = None;
    for i in 0..=iterations {
        let started = Instant::now();
        let resp = match splits {
            Some(splits) => {
                node.search
                    .search_splits("bench-logs", request.clone(), splits.to_vec())
                    .await?
            }
            None => node.search.search("bench-logs", request.clone()).await?,
        };
        if i > 0 {
            samples.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        last = Some(resp);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let last = last.unwrap_or_default();
    Ok((
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        last.num_hits,
        last.num_splits_searched,
    ))
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    eprintln!("generating {} documents…", args.docs);
    let lines = corpus::generate(args.docs, 11);
    let data = tempfile::tempdir()?;
    let mut config = NodeConfig::with_data_dir(data.path());
    config.node_id = "bench".into();
    config.compaction.planner_interval_secs = 1;
    let (node, base, client) = start_node(config).await?;
    let index_yaml = corpus::INDEX_YAML.replace(
        "commit_timeout_secs: 30",
        &format!("commit_timeout_secs: {}", args.commit_timeout_secs),
    );
    create_index(&client, &base, index_yaml).await?;
    let index = node.metastore.index_metadata("bench-logs").await?;

    let (batches, last_batch) = ndjson_batches(&lines, 1 << 20);
    let docs_per_batch = args.docs as f64 / (batches.len() + 1) as f64;
    let started = Instant::now();
    let pace = (args.rate > 0).then_some((started, docs_per_batch, args.rate as f64));
    let tasks = spawn_ingest_clients(&client, &base, Arc::new(batches), args.clients, pace);
    let published = |node: Arc<shale_server::Node>| {
        let uid = index.index_uid.clone();
        async move {
            node.metastore
                .list_splits(ListSplitsQuery::for_index(uid).with_states(&[SplitState::Published]))
                .await
                .map(|s| s.len())
                .unwrap_or(0)
        }
    };
    let mut max_published = 0;
    let mut series = Vec::new();
    while tasks.iter().any(|t| !t.is_finished()) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let n = published(node.clone()).await;
        max_published = max_published.max(n);
        series.push((started.elapsed().as_secs_f64(), n));
    }
    for task in tasks {
        task.await??;
    }
    let resp = client
        .post(format!("{base}/api/v1/bench-logs/ingest?commit=force"))
        .body(last_batch)
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success());
    let ingest_secs = started.elapsed().as_secs_f64();

    // Wait until compaction settles: no pending or running task for 5 s.
    let mut quiet_since = None;
    loop {
        let live = live_merge_tasks(&node, &index.index_uid).await?;
        let n = published(node.clone()).await;
        max_published = max_published.max(n);
        series.push((started.elapsed().as_secs_f64(), n));
        if live == 0 {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(5) {
                break;
            }
        } else {
            quiet_since = None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let settle_secs = started.elapsed().as_secs_f64();

    let all = node
        .metastore
        .list_splits(ListSplitsQuery::for_index(index.index_uid.clone()))
        .await?;
    let fresh: Vec<shale_types::SplitMetadata> = all
        .iter()
        .filter(|s| s.split_metadata.num_merge_ops == 0 && s.split_state != SplitState::Staged)
        .map(|s| s.split_metadata.clone())
        .collect();
    let ingest_bytes: u64 = fresh.iter().map(|s| s.size_bytes).sum();
    let merge_bytes: u64 = all
        .iter()
        .filter(|s| s.split_metadata.num_merge_ops > 0 && s.split_state != SplitState::Staged)
        .map(|s| s.split_metadata.size_bytes)
        .sum();
    let final_splits: Vec<&shale_types::Split> = all
        .iter()
        .filter(|s| s.split_state == SplitState::Published)
        .collect();
    let docs: u64 = final_splits.iter().map(|s| s.split_metadata.num_docs).sum();
    anyhow::ensure!(docs as usize == args.docs, "published {docs} docs");
    let merges = node
        .metastore
        .list_merge_tasks(Some(&index.index_uid), &[MergeTaskState::Succeeded], None)
        .await?
        .len();

    println!();
    println!(
        "sustained ingest of {} docs at {} docs/s, default merge policy (stable_log), commit_timeout_secs {}",
        args.docs, args.rate, args.commit_timeout_secs
    );
    println!(
        "ingest {:.1}s ({:.0} docs/s); compaction settled at {:.1}s",
        ingest_secs,
        args.docs as f64 / ingest_secs,
        settle_secs
    );
    println!(
        "splits: {} produced by ingest, max {} published at once, {} merges, final {} published",
        fresh.len(),
        max_published,
        merges,
        final_splits.len()
    );
    let mut levels = std::collections::BTreeMap::<u32, (usize, u64)>::new();
    for split in &final_splits {
        let e = levels
            .entry(split.split_metadata.num_merge_ops)
            .or_default();
        e.0 += 1;
        e.1 += split.split_metadata.num_docs;
    }
    for (level, (count, docs)) in levels {
        println!("  final splits with {level} merge op(s): {count} ({docs} docs)");
    }
    println!(
        "write amplification: {:.2} ({:.1} MB by ingest + {:.1} MB by merges)",
        (ingest_bytes + merge_bytes) as f64 / ingest_bytes.max(1) as f64,
        ingest_bytes as f64 / 1e6,
        merge_bytes as f64 / 1e6
    );
    let step = (series.len() / 12).max(1);
    let points: Vec<String> = series
        .iter()
        .step_by(step)
        .map(|(t, n)| format!("{t:.0}s:{n}"))
        .collect();
    println!("published splits over time: {}", points.join(" "));
    println!();
    println!(
        "search ({} iterations)          before compaction (fresh splits)     after compaction",
        args.search_iterations
    );
    for (name, request) in queries() {
        let (b50, b99, bhits, bsplits) =
            latency(&node, &request, Some(&fresh), args.search_iterations).await?;
        let (a50, a99, ahits, asplits) =
            latency(&node, &request, None, args.search_iterations).await?;
        anyhow::ensure!(bhits == ahits, "{name}: {bhits} hits before, {ahits} after");
        println!(
            "{name:<30} p50 {b50:>6.2} ms p99 {b99:>6.2} ms {bsplits:>4} splits | p50 {a50:>6.2} ms p99 {a99:>6.2} ms {asplits:>4} splits | {ahits} hits"
        );
    }
    node.shutdown().await;
    node.release_data_dir();
    Ok(())
}
