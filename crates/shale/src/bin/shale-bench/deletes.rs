//! `shale-bench deletes`: 1 M documents in splits of 100 000, then deletes of 1 %, 10 % and
//! 30 % of them (cumulative; by host, so that every split loses its share). For each: search
//! latency with the deletes applied at search time vs once purged, a delete compaction of one
//! split through Shale's merge worker vs a raw Tantivy rewrite of the same split (delete by
//! query, commit, merge its segments), and the bytes a purge reclaims. Automatic compaction
//! is off; purges are manual compactions, as an operator would run them.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use shale_config::NodeConfig;
use shale_metastore::NewMergeTask;
use shale_types::{MergeKind, SplitMetadata};

use crate::corpus;
use crate::ingest::{
    create_index, ingest_all, ndjson_batches, percentile, published_splits, start_node,
};

#[derive(clap::Args)]
pub struct Args {
    /// Documents.
    #[arg(long, default_value_t = 1_000_000)]
    docs: usize,
    /// Documents per split.
    #[arg(long, default_value_t = 100_000)]
    split_docs: usize,
    /// Searches per latency figure.
    #[arg(long, default_value_t = 50)]
    search_iterations: usize,
    /// Corpus seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

const SERVICES: usize = corpus::SERVICES.len();
const HOSTS_PER_SERVICE: usize = 40;

/// Host `k` of the corpus' 480, spread over services: service `k % 12`, number `k / 12`.
fn host(k: usize) -> String {
    format!(
        "{}-{:02}.prod.internal",
        corpus::SERVICES[k % SERVICES],
        k / SERVICES
    )
}

async fn p50(
    client: &reqwest::Client,
    url: &str,
    request: &Value,
    iterations: usize,
) -> anyhow::Result<(f64, u64)> {
    let warm: Value = client.post(url).json(request).send().await?.json().await?;
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let resp = client.post(url).json(request).send().await?;
        anyhow::ensure!(resp.status().is_success(), "{}", resp.text().await?);
        let _: Value = resp.json().await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    Ok((
        percentile(&samples, 0.5),
        warm["num_hits"].as_u64().unwrap_or(0),
    ))
}

async fn published(node: &shale_server::Node) -> anyhow::Result<Vec<SplitMetadata>> {
    let (_, splits) = published_splits(node, "bench-logs").await?;
    Ok(splits.into_iter().map(|s| s.split_metadata).collect())
}

/// Raw Tantivy: the split unpacked, its deleted documents deleted by query, committed, its
/// segments merged into one without them. Returns the time and the documents left.
fn raw_rewrite(
    bundle: &std::path::Path,
    work: &std::path::Path,
    mapper: &shale_index::DocMapper,
    tasks: &[shale_types::DeleteTask],
) -> anyhow::Result<(Duration, u64)> {
    let dir = work.join("raw-rewrite");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    shale_index::unpack_split(bundle, &dir)?;
    let index = tantivy::Index::open_in_dir(&dir)?;
    let query = mapper
        .deletes_query(tasks)?
        .ok_or_else(|| anyhow::anyhow!("no delete task"))?;
    let started = Instant::now();
    let mut writer: tantivy::IndexWriter = index.writer_with_num_threads(1, 128 * 1024 * 1024)?;
    writer.delete_query(query)?;
    writer.commit()?;
    let segments = index.searchable_segment_ids()?;
    writer.merge(&segments).wait()?;
    writer.wait_merging_threads()?;
    let elapsed = started.elapsed();
    let left = index.reader()?.searcher().num_docs();
    Ok((elapsed, left))
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    eprintln!("generating {} documents…", args.docs);
    let lines = corpus::generate(args.docs, args.seed);
    let data = tempfile::tempdir()?;
    let mut node_config = NodeConfig {
        node_id: "bench".into(),
        ..NodeConfig::with_data_dir(data.path())
    };
    // Automatic compaction off: the figures isolate deletes; purges are manual compactions.
    node_config.compaction.enabled = false;
    node_config.compaction.planner_interval_secs = 1;
    let (node, base, client) = start_node(node_config).await?;
    let index_yaml = corpus::INDEX_YAML.replace(
        "  commit_timeout_secs: 30\n",
        &format!(
            "  commit_timeout_secs: 30\n  split_num_docs_target: {}\n  merge_policy:\n    type: no_merge\n",
            args.split_docs
        ),
    );
    create_index(&client, &base, index_yaml).await?;
    eprintln!("ingesting…");
    let (batches, last_batch) = ndjson_batches(&lines, 8 << 20);
    ingest_all(&client, &base, batches, last_batch, 2, None).await?;
    let splits = published(&node).await?;
    let total_docs: u64 = splits.iter().map(|s| s.num_docs).sum();
    anyhow::ensure!(
        total_docs as usize == args.docs,
        "{total_docs} docs published"
    );
    let mapper = shale_index::DocMapper::for_index(
        &node
            .metastore
            .index_metadata("bench-logs")
            .await?
            .index_config,
    )?;
    let search_url = format!("{base}/api/v1/bench-logs/search");
    let queries = [
        (
            "term message:timeout",
            json!({"query": "message:timeout", "max_hits": 20}),
        ),
        (
            "service:payment AND level:ERROR",
            json!({"query": "service:payment AND level:ERROR", "max_hits": 20}),
        ),
    ];
    println!();
    println!(
        "{} docs in {} splits; deletes by host, cumulative; {} searches per figure",
        total_docs,
        splits.len(),
        args.search_iterations
    );
    let mut baseline = Vec::new();
    for (name, request) in &queries {
        let (ms, hits) = p50(&client, &search_url, request, args.search_iterations).await?;
        println!("no delete       {name:<34} p50 {ms:>7.2} ms  hits {hits}");
        baseline.push(ms);
    }
    let mut deleted_hosts = 0usize;
    let work = data.path().join("bench-work");
    std::fs::create_dir_all(&work)?;
    for fraction in [0.01, 0.10, 0.30] {
        let hosts = ((fraction * (SERVICES * HOSTS_PER_SERVICE) as f64).round() as usize)
            .max(deleted_hosts + 1);
        let names: Vec<String> = (deleted_hosts..hosts).map(host).collect();
        deleted_hosts = hosts;
        let resp = client
            .post(format!("{base}/api/v1/bench-logs/delete-tasks"))
            .json(&json!({"query": format!("host:IN [{}]", names.join(" "))}))
            .send()
            .await?;
        anyhow::ensure!(resp.status().is_success(), "{}", resp.text().await?);
        let (_, left) = p50(
            &client,
            &search_url,
            &json!({"query": "*", "max_hits": 0}),
            1,
        )
        .await?;
        let deleted = total_docs - left;
        println!();
        println!(
            "deleted {:.1} % ({deleted} docs, {hosts} hosts of 480)",
            deleted as f64 * 100.0 / total_docs as f64
        );
        let mut before = Vec::new();
        for (_, request) in &queries {
            before.push(p50(&client, &search_url, request, args.search_iterations).await?);
        }

        // One split: Shale's delete compaction vs a raw Tantivy rewrite.
        let index = node.metastore.index_metadata("bench-logs").await?;
        let splits = published(&node).await?;
        let split = splits
            .iter()
            .max_by_key(|s| s.num_docs)
            .ok_or_else(|| anyhow::anyhow!("no split"))?
            .clone();
        let tasks: Vec<shale_types::DeleteTask> = node
            .metastore
            .list_delete_tasks(&index.index_uid, split.delete_opstamp)
            .await?;
        let storage = node.storages.for_index("bench-logs", None)?;
        let bundle = work.join("input.split");
        storage.get_to_file(&split.object_key(), &bundle).await?;
        let (raw, raw_left) = {
            let (bundle, work, tasks) = (bundle.clone(), work.clone(), tasks.clone());
            let mapper = mapper.clone();
            tokio::task::spawn_blocking(move || raw_rewrite(&bundle, &work, &mapper, &tasks))
                .await??
        };
        let created = node
            .metastore
            .create_merge_tasks(
                &index.index_uid,
                vec![
                    NewMergeTask::new(split.merge_scope(false), vec![split.split_id.clone()])
                        .with_kind(MergeKind::Delete),
                ],
                1,
            )
            .await?;
        anyhow::ensure!(created.len() == 1, "delete task not created");
        let task = node
            .metastore
            .claim_merge_task(
                "bench#1",
                3600,
                shale_types::now_unix_secs(),
                Some(&index.index_uid),
                None,
                false,
            )
            .await?
            .ok_or_else(|| anyhow::anyhow!("no task to claim"))?;
        let env = node.compaction.env().clone();
        let started = Instant::now();
        let outcome = shale_compaction::service::execute_merge(&env, task).await?;
        let shale_time = started.elapsed();
        let shale_left: u64 = outcome.outputs.iter().map(|s| s.num_docs).sum();
        anyhow::ensure!(
            shale_left == raw_left,
            "shale kept {shale_left}, raw {raw_left}"
        );

        // Purge the rest: a manual compaction.
        let bytes_before: u64 = published(&node).await?.iter().map(|s| s.size_bytes).sum();
        let started = Instant::now();
        let resp: Value = client
            .post(format!("{base}/api/v1/indexes/bench-logs/compact"))
            .json(&json!({"force": true}))
            .send()
            .await?
            .json()
            .await?;
        let id = resp["compaction_id"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("{resp}"))?
            .to_string();
        let status = loop {
            let status: Value = client
                .get(format!("{base}/api/v1/indexes/bench-logs/compactions/{id}"))
                .send()
                .await?
                .json()
                .await?;
            if status["state"] == "completed" || status["state"] == "failed" {
                break status;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        anyhow::ensure!(status["state"] == "completed", "{status}");
        let purge_time = started.elapsed();
        let after_splits = published(&node).await?;
        let bytes_after: u64 = after_splits.iter().map(|s| s.size_bytes).sum();
        let (_, still) = p50(
            &client,
            &search_url,
            &json!({"query": "*", "max_hits": 0}),
            1,
        )
        .await?;
        anyhow::ensure!(still == left, "purge changed the count: {still} vs {left}");
        let physically: u64 = after_splits.iter().map(|s| s.num_docs).sum();
        anyhow::ensure!(
            physically == left,
            "{physically} docs stored, {left} visible"
        );

        for (((name, request), (before_ms, hits)), base_ms) in
            queries.iter().zip(&before).zip(&baseline)
        {
            let (after_ms, after_hits) =
                p50(&client, &search_url, request, args.search_iterations).await?;
            anyhow::ensure!(after_hits == *hits, "hits changed by the purge");
            println!(
                "  {name:<34} p50 before purge {before_ms:>7.2} ms  after {after_ms:>7.2} ms  ({:.2}x; no delete {base_ms:.2} ms)  hits {hits}",
                before_ms / after_ms
            );
        }
        let docs_in = split.num_docs as f64;
        println!(
            "  delete compaction of one split ({} docs -> {shale_left}): shale {:.2} s ({:.0} docs/s), raw tantivy rewrite {:.2} s ({:.0} docs/s), ratio {:.2}x",
            split.num_docs,
            shale_time.as_secs_f64(),
            docs_in / shale_time.as_secs_f64(),
            raw.as_secs_f64(),
            docs_in / raw.as_secs_f64(),
            raw.as_secs_f64() / shale_time.as_secs_f64()
        );
        println!(
            "  purge of the index (manual compaction, {} tasks): {:.2} s, {:.1} MB -> {:.1} MB ({:.1} MB reclaimed, {:.1} %)",
            status["plan"]["total"],
            purge_time.as_secs_f64(),
            bytes_before as f64 / 1e6,
            bytes_after as f64 / 1e6,
            (bytes_before - bytes_after) as f64 / 1e6,
            (bytes_before - bytes_after) as f64 * 100.0 / bytes_before as f64
        );
    }
    Ok(())
}
