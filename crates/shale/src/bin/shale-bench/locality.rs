//! `shale-bench locality`: the same generated corpus — 2 M log documents over 2 h of event
//! time, 50 services × 200 hosts, 5 % late (up to an hour), replayed in time order over HTTP
//! with 2 s commits — into a `stable_log` index and into a `locality` index (sort fields
//! `service, host`, 15 min buckets), each on a fresh node, one after the other. Reported for
//! both: splits a query opens and its p50/p99 for `service:X AND host:Y` and `service:X` over
//! one hour (the locality index also without key pruning), final splits, bytes on storage,
//! write amplification; and the locality merge's throughput against raw Tantivy
//! `merge_indices` of the same inputs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use shale_config::{IndexConfig, MergePolicyConfig, NodeConfig};
use shale_metastore::{ListSplitsQuery, MergeTaskState};
use shale_search::SearchRequest;
use shale_types::{MergeKind, SplitState};
use tantivy::directory::MmapDirectory;

use crate::corpus;
use crate::ingest::{
    create_index, ingest_all, live_merge_tasks, ndjson_batches, percentile, start_node,
};

#[derive(clap::Args)]
pub struct Args {
    /// Documents in the corpus.
    #[arg(long, default_value_t = 2_000_000)]
    docs: usize,
    /// Hours of event time the corpus spans.
    #[arg(long, default_value_t = 2.0)]
    hours: f64,
    /// Services (sort field 1).
    #[arg(long, default_value_t = 50)]
    services: usize,
    /// Hosts (sort field 2).
    #[arg(long, default_value_t = 200)]
    hosts: usize,
    /// Fraction of documents arriving late (up to an hour).
    #[arg(long, default_value_t = 0.05)]
    late_fraction: f64,
    /// Split size target of both policies, in documents (`split_num_docs_target` of
    /// `stable_log`, `target_split_num_docs` of `locality`). The default scales the corpus
    /// down: 2 M documents model a high-volume index in which a 15-minute bucket holds about
    /// ten target-size splits (Quickwit's 10 M-document splits at ~100 k docs/s). With the
    /// production defaults (10 M and 5 M), the whole corpus fits in one split per bucket.
    #[arg(long, default_value_t = 25_000)]
    target_docs: u64,
    /// `commit_timeout_secs` of both indexes.
    #[arg(long, default_value_t = 2)]
    commit_timeout_secs: u64,
    /// Replay rate, documents per second.
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
    /// Concurrent HTTP clients.
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// Different `service:X AND host:Y` (and `service:X`) queries.
    #[arg(long, default_value_t = 20)]
    queries: usize,
    /// Runs of each query (after one warm-up).
    #[arg(long, default_value_t = 10)]
    iterations: usize,
}

fn index_yaml(policy: &str, commit_timeout_secs: u64, target_docs: u64) -> String {
    let policy_yaml = match policy {
        "locality" => format!(
            "  merge_policy:\n    type: locality\n    sort_fields: [service, host]\n    time_bucket: 15m\n    target_split_num_docs: {target_docs}\n    max_merge_ops: 4\n"
        ),
        _ => format!("  split_num_docs_target: {target_docs}\n"),
    };
    format!(
        "version: 0.8
index_id: bench-logs
doc_mapping:
  mode: lenient
  field_mappings:
    - {{name: timestamp, type: datetime, input_formats: [rfc3339], fast: true, fast_precision: milliseconds}}
    - {{name: service, type: text, tokenizer: raw, fast: true}}
    - {{name: host, type: text, tokenizer: raw, fast: true}}
    - {{name: level, type: text, tokenizer: raw}}
    - {{name: trace_id, type: text, tokenizer: raw}}
    - {{name: message, type: text, tokenizer: default, record: position}}
  timestamp_field: timestamp
  tag_fields: [service]
indexing_settings:
  commit_timeout_secs: {commit_timeout_secs}
{policy_yaml}search_settings:
  default_search_fields: [message]
"
    )
}

/// The corpus, in replay (arrival) order: event times advance with the documents, 5 % late.
fn generate(args: &Args) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(17);
    let span = (args.hours * 3600.0) as i64;
    // Service popularity: Zipf(1) over the services.
    let weights: Vec<f64> = (0..args.services).map(|r| 1.0 / (r + 1) as f64).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(weights.len());
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cdf.push(acc);
    }
    (0..args.docs)
        .map(|i| {
            let now = corpus::T0 + (i as i64 * span) / args.docs as i64;
            let ts = if rng.random_bool(args.late_fraction) {
                now - rng.random_range(60..3600)
            } else {
                now
            };
            let x: f64 = rng.random();
            let service = cdf.partition_point(|c| *c < x).min(args.services - 1);
            let host = rng.random_range(0..args.hosts);
            let mut doc: serde_json::Value =
                serde_json::from_str(&corpus::gen_doc(&mut rng, i, args.docs)).unwrap_or_default();
            let timestamp = time::OffsetDateTime::from_unix_timestamp(ts)
                .ok()
                .and_then(|t| {
                    t.format(&time::format_description::well_known::Rfc3339)
                        .ok()
                })
                .unwrap_or_default();
            doc["timestamp"] = json!(timestamp);
            doc["service"] = json!(format!("svc-{service:02}"));
            doc["host"] = json!(format!("host-{host:03}"));
            doc.to_string()
        })
        .collect()
}

/// What one policy's run measured.
struct Run {
    final_splits: usize,
    final_bytes: u64,
    write_amplification: f64,
    merges: usize,
    ingest_secs: f64,
    settle_secs: f64,
    /// Per query kind: (splits opened, p50 ms, p99 ms, hits) averaged over the queries,
    /// each query repeated (the partial-result cache on, as a node runs).
    queries: BTreeMap<&'static str, QueryFigures>,
    /// The same, each query computed every time (the partial-result cache off).
    computed: BTreeMap<&'static str, QueryFigures>,
    /// Locality only: splits opened without key pruning, per query kind.
    unpruned: BTreeMap<&'static str, f64>,
    /// Locality only: (inputs docs, locality merge secs, raw merge_indices secs).
    merge: Option<(u64, f64, f64)>,
    /// Median ms of the metastore reads of a root's view read whole (the index without
    /// checkpoints, every Published split, the delete tasks, in one snapshot), done alone: a
    /// search pays it only the first time (after a write, only the changes are read).
    metastore_ms: f64,
}

#[derive(Default, Clone, Copy)]
struct QueryFigures {
    splits: f64,
    p50: f64,
    p99: f64,
    hits: u64,
}

/// The query requests: `(kind, request)` for `queries` random (service, host) pairs over the
/// second half-hour to the 90th minute (one hour).
fn query_requests(args: &Args) -> Vec<(&'static str, SearchRequest)> {
    let mut rng = StdRng::seed_from_u64(99);
    let start = corpus::T0 + 1800;
    let end = start + 3600;
    let mut requests = Vec::new();
    for _ in 0..args.queries {
        // Services of every popularity (the popular ones are the first).
        let service = rng.random_range(0..args.services.min(20));
        let host = rng.random_range(0..args.hosts);
        for (kind, query) in [
            (
                "service:X AND host:Y",
                format!("service:svc-{service:02} AND host:host-{host:03}"),
            ),
            ("service:X", format!("service:svc-{service:02}")),
        ] {
            requests.push((
                kind,
                SearchRequest {
                    query,
                    start_timestamp: Some(start),
                    end_timestamp: Some(end),
                    max_hits: 20,
                    ..Default::default()
                },
            ));
        }
    }
    requests
}

async fn measure_queries(
    node: &shale_server::Node,
    requests: &[(&'static str, SearchRequest)],
    iterations: usize,
) -> anyhow::Result<(BTreeMap<&'static str, QueryFigures>, Vec<u64>)> {
    let mut per_kind: BTreeMap<&'static str, Vec<QueryFigures>> = BTreeMap::new();
    let mut hits = Vec::new();
    for (kind, request) in requests {
        let warm = node.search.search("bench-logs", request.clone()).await?;
        let mut samples = Vec::with_capacity(iterations);
        for _ in 0..iterations {
            let started = Instant::now();
            node.search.search("bench-logs", request.clone()).await?;
            samples.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        samples.sort_by(|a, b| a.total_cmp(b));
        hits.push(warm.num_hits);
        per_kind.entry(kind).or_default().push(QueryFigures {
            splits: warm.num_splits_searched as f64,
            p50: percentile(&samples, 0.5),
            p99: percentile(&samples, 0.99),
            hits: warm.num_hits,
        });
    }
    let means = per_kind
        .into_iter()
        .map(|(kind, all)| {
            let n = all.len() as f64;
            let mut p50s: Vec<f64> = all.iter().map(|q| q.p50).collect();
            p50s.sort_by(|a, b| a.total_cmp(b));
            let mut p99s: Vec<f64> = all.iter().map(|q| q.p99).collect();
            p99s.sort_by(|a, b| a.total_cmp(b));
            (
                kind,
                QueryFigures {
                    splits: all.iter().map(|q| q.splits).sum::<f64>() / n,
                    // The median query's p50, the worst query's p99.
                    p50: percentile(&p50s, 0.5),
                    p99: percentile(&p99s, 1.0),
                    hits: all.iter().map(|q| q.hits).sum::<u64>() / all.len() as u64,
                },
            )
        })
        .collect();
    Ok((means, hits))
}

async fn run_policy(
    args: &Args,
    policy: &str,
    lines: &[String],
    requests: &[(&'static str, SearchRequest)],
) -> anyhow::Result<(Run, Vec<u64>)> {
    let data = tempfile::tempdir()?;
    let mut config = NodeConfig::with_data_dir(data.path());
    config.node_id = "bench".into();
    config.compaction.planner_interval_secs = 1;
    config.compaction.deletion_grace_period_secs = 24 * 3600;
    let (node, base, client) = start_node(config).await?;
    create_index(
        &client,
        &base,
        index_yaml(policy, args.commit_timeout_secs, args.target_docs),
    )
    .await?;
    let index = node.metastore.index_metadata("bench-logs").await?;

    eprintln!(
        "[{policy}] replaying {} documents at {} docs/s…",
        lines.len(),
        args.rate
    );
    let (batches, last_batch) = ndjson_batches(lines, 512 * 1024);
    let docs_per_batch = lines.len() as f64 / (batches.len() + 1) as f64;
    let started = Instant::now();
    let pace = Some((started, docs_per_batch, args.rate as f64));
    ingest_all(&client, &base, batches, last_batch, args.clients, pace).await?;
    let ingest_secs = started.elapsed().as_secs_f64();

    // Settled: no pending or running merge for 20 s (longer than the locality policy waits
    // for a bucket's inflow to stop).
    eprintln!("[{policy}] waiting for compaction to settle…");
    let mut quiet_since: Option<Instant> = None;
    loop {
        if live_merge_tasks(&node, &index.index_uid).await? == 0 {
            if quiet_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(20) {
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
    let written = |fresh: bool| -> u64 {
        all.iter()
            .filter(|s| s.split_state != SplitState::Staged)
            .filter(|s| (s.split_metadata.num_merge_ops == 0) == fresh)
            .map(|s| s.split_metadata.size_bytes)
            .sum()
    };
    let (ingest_bytes, merge_bytes) = (written(true), written(false));
    let published: Vec<&shale_types::Split> = all
        .iter()
        .filter(|s| s.split_state == SplitState::Published)
        .collect();
    let docs: u64 = published.iter().map(|s| s.split_metadata.num_docs).sum();
    anyhow::ensure!(docs as usize == lines.len(), "published {docs} docs");
    let tasks = node
        .metastore
        .list_merge_tasks(Some(&index.index_uid), &[MergeTaskState::Succeeded], None)
        .await?;

    eprintln!("[{policy}] measuring queries…");
    let (queries, hits) = measure_queries(&node, requests, args.iterations).await?;
    // The same queries computed every time: without the partial-result cache, what a
    // search costs is the splits it opens.
    node.search.set_partial_result_cache(0);
    let (computed, computed_hits) = measure_queries(&node, requests, args.iterations).await?;
    node.search
        .set_partial_result_cache(NodeConfig::default().partial_result_cache_max_bytes);
    anyhow::ensure!(
        computed_hits == hits,
        "[{policy}] the cache changed a count"
    );
    // Where a search's time goes: the metastore reads the root does before opening a split
    // — the index version per search, the whole view the first time.
    let (mut samples, mut versions) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        let started = Instant::now();
        node.metastore.index_version("bench-logs").await?;
        versions.push(started.elapsed().as_secs_f64() * 1000.0);
        let started = Instant::now();
        node.metastore.index_changes("bench-logs", None, 0).await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    versions.sort_by(|a, b| a.total_cmp(b));
    eprintln!(
        "[{policy}] root metastore reads, median ms: per search, the index version {:.3}; the view read whole {:.2}",
        percentile(&versions, 0.5),
        percentile(&samples, 0.5)
    );
    let metastore_ms = percentile(&samples, 0.5);
    let mut unpruned = BTreeMap::new();
    let mut merge = None;
    if policy == "locality" {
        node.search.set_key_pruning(false);
        let mut per_kind: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
        for (kind, request) in requests {
            let resp = node.search.search("bench-logs", request.clone()).await?;
            per_kind
                .entry(kind)
                .or_default()
                .push(resp.num_splits_searched as f64);
        }
        node.search.set_key_pruning(true);
        unpruned = per_kind
            .into_iter()
            .map(|(kind, v)| (kind, v.iter().sum::<f64>() / v.len() as f64))
            .collect();
        // The biggest locality merge, replayed: Shale's m → n locality merge vs raw Tantivy
        // merge_indices of the same inputs (kept by the janitor's grace period).
        let by_id: BTreeMap<&str, &shale_types::SplitMetadata> = all
            .iter()
            .map(|s| (s.split_metadata.split_id.as_str(), &s.split_metadata))
            .collect();
        let biggest = tasks
            .iter()
            .filter(|t| t.kind == MergeKind::Locality)
            .max_by_key(|t| {
                t.split_ids
                    .iter()
                    .filter_map(|id| by_id.get(id.as_str()))
                    .map(|s| s.num_docs)
                    .sum::<u64>()
            });
        if let Some(task) = biggest {
            merge = Some(replay_merge(&node, &index, task, &by_id).await?);
        }
    }
    node.shutdown().await;
    node.release_data_dir();
    Ok((
        Run {
            final_splits: published.len(),
            final_bytes: published.iter().map(|s| s.split_metadata.size_bytes).sum(),
            write_amplification: (ingest_bytes + merge_bytes) as f64 / ingest_bytes.max(1) as f64,
            merges: tasks.len(),
            ingest_secs,
            settle_secs,
            queries,
            computed,
            unpruned,
            merge,
            metastore_ms,
        },
        hits,
    ))
}

/// Downloads the inputs of `task` and merges them twice: Shale's locality merge and raw
/// Tantivy `merge_indices` (best of two runs each).
async fn replay_merge(
    node: &shale_server::Node,
    index: &shale_metastore::IndexMetadata,
    task: &shale_metastore::MergeTask,
    by_id: &BTreeMap<&str, &shale_types::SplitMetadata>,
) -> anyhow::Result<(u64, f64, f64)> {
    let storage = node.storages.for_index(index.index_id(), None)?;
    let work = tempfile::tempdir()?;
    let mut paths = Vec::new();
    let mut docs = 0;
    for id in &task.split_ids {
        let split = by_id
            .get(id.as_str())
            .ok_or_else(|| anyhow::anyhow!("input {id} unknown"))?;
        let path = work.path().join(split.object_key());
        storage.get_to_file(&split.object_key(), &path).await?;
        paths.push(path);
        docs += split.num_docs;
    }
    let config: IndexConfig = index.index_config.clone();
    let MergePolicyConfig::Locality(locality) = &config.indexing_settings.merge_policy else {
        anyhow::bail!("not a locality index");
    };
    let mapper = shale_index::DocMapper::for_index(&config)?;
    let cut = shale_index::LocalityCut {
        target_num_docs: locality.target_num_docs(),
        target_bytes: locality.target_split_bytes,
        fixed_ranges: Vec::new(),
    };
    let (mut shale_best, mut raw_best) = (f64::MAX, f64::MAX);
    for run in 0..2 {
        let out = work.path().join(format!("shale-{run}"));
        let started = Instant::now();
        let (outputs, _) = shale_index::locality_merge_split_files(
            &mapper,
            &paths,
            &vec![Vec::new(); paths.len()],
            &out,
            &cut,
        )?;
        shale_best = shale_best.min(started.elapsed().as_secs_f64());
        let merged: u64 = outputs.iter().map(|o| o.built.num_docs).sum();
        anyhow::ensure!(
            merged == docs,
            "locality merge gave {merged} of {docs} docs"
        );

        let inputs = paths
            .iter()
            .map(|path| shale_index::open_split(path))
            .collect::<Result<Vec<_>, _>>()?;
        let raw_dir = work.path().join(format!("raw-{run}"));
        std::fs::create_dir_all(&raw_dir)?;
        let started = Instant::now();
        let merged = tantivy::indexer::merge_indices(&inputs, MmapDirectory::open(&raw_dir)?)?;
        raw_best = raw_best.min(started.elapsed().as_secs_f64());
        let raw_docs: u64 = merged
            .searchable_segment_metas()?
            .iter()
            .map(|m| u64::from(m.num_docs()))
            .sum();
        anyhow::ensure!(raw_docs == docs, "raw merge gave {raw_docs} of {docs} docs");
    }
    Ok((docs, shale_best, raw_best))
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    eprintln!("generating {} documents…", args.docs);
    let lines = generate(&args);
    let requests = query_requests(&args);
    let (stable, stable_hits) = run_policy(&args, "stable_log", &lines, &requests).await?;
    let (sorted, sorted_hits) = run_policy(&args, "locality", &lines, &requests).await?;
    anyhow::ensure!(
        stable_hits == sorted_hits,
        "the two indexes answered differently"
    );

    println!();
    println!(
        "{} docs over {} h, {} services x {} hosts, {:.0} % late (up to 1 h), replayed in time order at {} docs/s, commit_timeout_secs {}, split target {} docs",
        args.docs,
        args.hours,
        args.services,
        args.hosts,
        args.late_fraction * 100.0,
        args.rate,
        args.commit_timeout_secs,
        args.target_docs
    );
    println!("                                    stable_log      locality     ratio");
    let row = |name: &str, a: f64, b: f64, digits: usize| {
        println!(
            "{name:<34} {a:>12.digits$} {b:>12.digits$} {:>8.2}x",
            if b > 0.0 { a / b } else { f64::NAN }
        );
    };
    for kind in ["service:X AND host:Y", "service:X"] {
        let (a, b) = (stable.queries[kind], sorted.queries[kind]);
        println!(
            "{kind} over 1 h ({} queries, mean {} hits)",
            args.queries, a.hits
        );
        row("  splits opened (mean)", a.splits, b.splits, 1);
        let (ca, cb) = (stable.computed[kind], sorted.computed[kind]);
        for (label, a, b) in [
            ("repeated, partial-result cache on", a, b),
            ("computed each time, cache off", ca, cb),
        ] {
            println!("  {label}:");
            row("    p50 ms (median query)", a.p50, b.p50, 2);
            let ratio = a.p50 / b.p50;
            println!(
                "    target: locality p50 at least 3x lower than stable_log: {ratio:.2}x, {}",
                if ratio >= 3.0 { "met" } else { "NOT met" }
            );
            row("    p99 ms (worst query)", a.p99, b.p99, 2);
        }
        if let Some(unpruned) = sorted.unpruned.get(kind) {
            println!("  locality without key pruning: {unpruned:.1} splits opened");
        }
    }
    row(
        "final splits",
        stable.final_splits as f64,
        sorted.final_splits as f64,
        0,
    );
    row(
        "bytes on storage (MB)",
        stable.final_bytes as f64 / 1e6,
        sorted.final_bytes as f64 / 1e6,
        1,
    );
    println!(
        "sorted / unsorted size: {:.3}",
        sorted.final_bytes as f64 / stable.final_bytes.max(1) as f64
    );
    row(
        "write amplification",
        stable.write_amplification,
        sorted.write_amplification,
        2,
    );
    row("merges", stable.merges as f64, sorted.merges as f64, 0);
    row(
        "metastore read of a whole index view, ms",
        stable.metastore_ms,
        sorted.metastore_ms,
        2,
    );
    println!(
        "ingest {:.1} s / {:.1} s; compaction settled {:.1} s / {:.1} s after the replay began",
        stable.ingest_secs, sorted.ingest_secs, stable.settle_secs, sorted.settle_secs
    );
    if let Some((docs, shale_secs, raw_secs)) = sorted.merge {
        println!(
            "biggest locality merge ({docs} docs): shale locality merge {:.2} s ({:.0} docs/s), raw tantivy merge_indices {:.2} s ({:.0} docs/s): {:.2}x of raw",
            shale_secs,
            docs as f64 / shale_secs,
            raw_secs,
            docs as f64 / raw_secs,
            raw_secs / shale_secs
        );
    }
    Ok(())
}
