//! The cluster part of `shale-bench metrics`: three nodes (in this process, each with its own
//! data dir, HTTP port and shard) on one PostgreSQL metastore (a private cluster started by
//! the bench) and one S3-compatible bucket (moto on loopback, or `SHALE_TEST_S3_ENDPOINT`).
//!
//! Scrapes are spread over the nodes as a load balancer would: scrape `k` (every series'
//! sample of one interval, one remote-write request) goes to node `k % 3`, committed at once
//! (`commit=force`: one split per scrape, what a node committing every `commit_timeout_secs`
//! produces when a scrape reaches it every three intervals). The index's compaction is off
//! while ingesting. Then a one-series query over the last hour of data is timed (splits
//! opened, p50); compaction is switched on (`PUT` of the index config) and, once every bucket
//! is level 1, the same query is timed again and its answer compared with the first.

use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use serde_json::Value;

use super::{load_average, splits_per_bucket, sum_field, time_query, Args};
use crate::ingest::start_node;

/// The metrics index of the cluster run.
const INDEX: &str = "bench-spread";

/// How long the cluster may take to compact every bucket.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(900);

/// What the cluster run measured.
pub struct ClusterRun {
    /// Published splits after ingest.
    pub splits_before: usize,
    /// Published splits once compaction settled.
    pub splits_after: usize,
    /// Splits opened by the one-series query before compaction (`x-shale-splits-opened`).
    pub opened_before: u64,
    /// The same, after.
    pub opened_after: u64,
    pub p50_before_ms: f64,
    pub p50_after_ms: f64,
    /// Whether the query answered the same before and after.
    pub same_answer: bool,
}

fn index_yaml(compaction_off: bool) -> String {
    format!(
        "index_id: {INDEX}\nmetrics:\n  sort_labels: [job, instance]\n  time_bucket: 15m\nindexing_settings:\n  commit_timeout_secs: 10\n{}",
        if compaction_off {
            "compaction:\n  enabled: false\n"
        } else {
            ""
        }
    )
}

async fn check(resp: reqwest::Response, what: &str) -> anyhow::Result<Value> {
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    anyhow::ensure!(status.is_success(), "{what}: {status} {text}");
    Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn published(client: &reqwest::Client, base: &str) -> anyhow::Result<Vec<Value>> {
    let body = check(
        client
            .get(format!(
                "{base}/api/v1/indexes/{INDEX}/splits?split_states=Published"
            ))
            .send()
            .await
            .context("listing splits")?,
        "listing splits",
    )
    .await?;
    Ok(body["splits"]
        .as_array()
        .with_context(|| format!("no splits in {body}"))?
        .clone())
}

/// Runs the cluster part with `args`' generator: `series` series over `minutes` minutes.
pub async fn run(args: &Args, series: usize, minutes: u64) -> anyhow::Result<ClusterRun> {
    let postgres = shale_testkit::postgres::DedicatedCluster::start()
        .map_err(|err| anyhow::anyhow!("starting PostgreSQL: {err}"))?;
    let metastore = postgres
        .database_url()
        .await
        .map_err(|err| anyhow::anyhow!("creating the metastore database: {err}"))?;
    let endpoint = shale_testkit::s3::endpoint()
        .context("no S3-compatible server (install moto[server] or set SHALE_TEST_S3_ENDPOINT)")?;
    let bucket = format!(
        "shale-bench-{}",
        ulid::Ulid::new().to_string().to_lowercase()
    );
    shale_testkit::s3::create_bucket(&endpoint, &bucket)
        .map_err(|err| anyhow::anyhow!("cannot create bucket {bucket}: {err}"))?;

    // The samples: one request per scrape interval, in time order.
    let now_s = time::OffsetDateTime::now_utc().unix_timestamp();
    let end_ms = (now_s - 20 * 60) * 1000;
    let start_ms = end_ms - minutes as i64 * 60_000;
    let spread_args = Args {
        series,
        hours: minutes as f64 / 60.0,
        samples_per_request: series,
        clients: 1,
        ..args.clone()
    };
    let workload = super::workload(&spread_args, start_ms, end_ms);
    let scrapes: Vec<Bytes> = workload.bodies.into_iter().flatten().collect();

    let dir = tempfile::tempdir().context("creating the nodes' data dirs")?;
    let mut nodes = Vec::new();
    for id in ["a", "b", "c"] {
        let mut config = shale_config::NodeConfig::with_data_dir(&dir.path().join(id));
        config.node_id = id.to_string();
        config.metastore_uri = metastore.clone();
        config.default_index_root_uri = format!("s3://{bucket}/indexes");
        config.s3.endpoint = Some(endpoint.clone());
        config.s3.access_key_id = Some(shale_testkit::s3::ACCESS_KEY.into());
        config.s3.secret_access_key = Some(shale_testkit::s3::SECRET_KEY.into());
        config.cluster.heartbeat_interval_ms = 200;
        config.cluster.dead_after_ms = 3000;
        config.cluster.leader_lease_ms = 2000;
        config.cluster.min_shards_per_index = 3;
        config.compaction.planner_interval_secs = 1;
        nodes.push(start_node(config).await?);
    }
    let client = nodes[0].2.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    for (_, base, _) in &nodes {
        loop {
            let state = check(
                client
                    .get(format!("{base}/api/v1/cluster"))
                    .send()
                    .await
                    .context("cluster state")?,
                "cluster state",
            )
            .await?;
            if state["live_nodes"].as_array().map_or(0, Vec::len) == 3 {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "the nodes never saw each other");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let base = nodes[0].1.clone();
    println!(
        "Shale cluster: 3 nodes in process (PostgreSQL metastore, S3 bucket {bucket} on {endpoint}) at {} (load average {}):",
        nodes
            .iter()
            .map(|(_, base, _)| base.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        load_average()
    );
    check(
        client
            .post(format!("{base}/api/v1/indexes"))
            .body(index_yaml(true))
            .send()
            .await
            .context("creating the index")?,
        "creating the index",
    )
    .await?;

    // Each node's scrapes, sent in order by one client per node.
    let started = Instant::now();
    let mut senders = tokio::task::JoinSet::new();
    for (number, (_, node_base, node_client)) in nodes.iter().enumerate() {
        let own: Vec<Bytes> = scrapes.iter().skip(number).step_by(3).cloned().collect();
        let url = format!("{node_base}/prometheus/{INDEX}/api/v1/write?commit=force");
        let node_client = node_client.clone();
        senders.spawn(async move {
            for (i, body) in own.into_iter().enumerate() {
                let resp = node_client
                    .post(&url)
                    .header("Content-Encoding", "snappy")
                    .header("Content-Type", "application/x-protobuf")
                    .body(body)
                    .send()
                    .await
                    .with_context(|| format!("node {number}: scrape {i}"))?;
                check(resp, &format!("node {number}: scrape {i}")).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = senders.join_next().await {
        done.context("a sender panicked")??;
    }
    let ingest_secs = started.elapsed().as_secs_f64();
    let before = published(&client, &base).await?;
    let stored = sum_field(&before, "num_docs");
    anyhow::ensure!(
        stored == workload.samples,
        "{stored} of {} samples published",
        workload.samples
    );
    let nodes_with_splits = before
        .iter()
        .filter_map(|s| s["node_id"].as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    println!(
        "  ingest: {} scrapes of {series} series ({minutes} min at {} s) spread over the 3 nodes, each committed at once: {} samples in {ingest_secs:.1} s; {} published splits over {} buckets, written by {nodes_with_splits} nodes",
        scrapes.len(),
        args.interval_secs,
        workload.samples,
        before.len(),
        splits_per_bucket(&before).len(),
    );

    let hosts = series.div_ceil(100);
    let one_host = 42.min(hosts - 1);
    let query = format!(
        "node_cpu_seconds_total{{instance=\"host-{one_host:04}:9100\",mode=\"idle\",device=\"d0\"}}"
    );
    let end_s = end_ms / 1000;
    let window = (end_s - 3600.min(minutes as i64 * 60), end_s);
    let api = format!("{base}/prometheus/{INDEX}/api/v1");
    let runs = args.query_runs.clamp(1, 10);
    let timed_before = time_query(&client, &api, &query, window, runs).await?;
    let opened = |timing: &super::Timing| {
        timing
            .opened
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    println!(
        "  before compaction, one series over the last hour (`{query}`): {} splits opened, p50 {:.1} ms, p99 {:.1} ms ({} points)",
        opened(&timed_before),
        timed_before.p50_ms,
        timed_before.p99_ms,
        timed_before.answer.points
    );

    // Compaction on: cluster-scope locality merges gather each bucket from every node.
    let settle_started = Instant::now();
    check(
        client
            .put(format!("{base}/api/v1/indexes/{INDEX}"))
            .body(index_yaml(false))
            .send()
            .await
            .context("switching compaction on")?,
        "switching compaction on",
    )
    .await?;
    let after = loop {
        let splits = published(&client, &base).await?;
        let stored = sum_field(&splits, "num_docs");
        if !splits.is_empty()
            && stored == workload.samples
            && splits.iter().all(|s| s["key_level"].as_u64() == Some(1))
        {
            break splits;
        }
        anyhow::ensure!(
            settle_started.elapsed() < SETTLE_TIMEOUT,
            "compaction did not settle in {} s: {} splits, {} not level 1",
            SETTLE_TIMEOUT.as_secs(),
            splits.len(),
            splits
                .iter()
                .filter(|s| s["key_level"].as_u64() != Some(1))
                .count()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let merged_by = after
        .iter()
        .filter_map(|s| s["node_id"].as_str())
        .collect::<std::collections::BTreeSet<_>>();
    println!(
        "  compaction: settled after {:.1} s: {} -> {} splits ({} buckets, every split level 1, written by {})",
        settle_started.elapsed().as_secs_f64(),
        before.len(),
        after.len(),
        splits_per_bucket(&after).len(),
        merged_by.into_iter().collect::<Vec<_>>().join(", ")
    );
    let timed_after = time_query(&client, &api, &query, window, args.query_runs.max(1)).await?;
    let same_answer = timed_after.answer.same_as(&timed_before.answer);
    println!(
        "  after compaction: {} splits opened, p50 {:.1} ms, p99 {:.1} ms; answer {} ({} points)",
        opened(&timed_after),
        timed_after.p50_ms,
        timed_after.p99_ms,
        if same_answer {
            "the same as before"
        } else {
            "DIFFERENT from before"
        },
        timed_after.answer.points
    );
    for (node, _, _) in &nodes {
        node.shutdown().await;
    }
    drop(postgres);
    Ok(ClusterRun {
        splits_before: before.len(),
        splits_after: after.len(),
        opened_before: opened(&timed_before),
        opened_after: opened(&timed_after),
        p50_before_ms: timed_before.p50_ms,
        p50_after_ms: timed_after.p50_ms,
        same_answer,
    })
}

/// The summary lines of the cluster run, with the target (≥ 20× fewer splits opened).
pub fn print_summary(run: &ClusterRun) {
    let ratio = run.opened_before as f64 / run.opened_after.max(1) as f64;
    println!(
        "3-node cluster, one series over 1 h: {} -> {} splits opened ({} -> {} published), p50 {:.1} -> {:.1} ms, answer {}",
        run.opened_before,
        run.opened_after,
        run.splits_before,
        run.splits_after,
        run.p50_before_ms,
        run.p50_after_ms,
        if run.same_answer { "unchanged" } else { "CHANGED" }
    );
    println!(
        "  splits opened after compaction ≥ 20x fewer   {ratio:.1}x fewer {}",
        if ratio >= 20.0 && run.same_answer {
            "PASS"
        } else {
            "MISS"
        }
    );
}
