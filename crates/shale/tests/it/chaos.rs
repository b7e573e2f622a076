//! Faults on the real parts of a three-node cluster (`shale run` processes, PostgreSQL, an
//! S3-compatible server), under sustained ingest in every commit mode and eager merges:
//!
//! - `kill -9` chaos: nodes killed at random moments and restarted, again and again
//!   (`SHALE_CHAOS_KILLS`, default 12; the closing figures of the project were taken with 100);
//! - PostgreSQL restarted with `pg_ctl restart -m immediate` (every connection cut, as in a
//!   crash) during publishes and merges.
//!
//! Each ends with every node running and checks what a user would: every document
//! acknowledged with a 200 is found exactly once, no document is found twice (a batch that
//! failed may be in at most once), merges went on. Each prints its figures.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{docs, Cluster};
use rand::{Rng, SeedableRng};
use serde_json::Value;

const T0: i64 = 1_700_000_000;

const MERGE_EAGERLY: &str =
    "  merge_policy:\n    type: stable_log\n    merge_factor: 2\n    max_merge_factor: 10\n";

/// What the writers did.
#[derive(Default)]
struct Ledger {
    /// Ids of the documents acknowledged with a 200.
    acked: Vec<String>,
    /// Batches that failed (their documents may be in at most once).
    failed_batches: usize,
    /// Acknowledged batches per commit mode.
    acked_batches: HashMap<&'static str, usize>,
}

/// Three writers, one per commit mode, each sending 20-document batches with fresh ids to
/// one node and moving to the next on a failure, until they are finished.
struct Writers {
    index: &'static str,
    stop: Arc<AtomicBool>,
    ledger: Arc<Mutex<Ledger>>,
    /// Seconds of `ts` the documents span (from `T0`).
    seconds: Arc<AtomicUsize>,
    handles: Vec<tokio::task::JoinHandle<()>>,
}

impl Writers {
    fn start(cluster: &Cluster, index: &'static str) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let ledger: Arc<Mutex<Ledger>> = Arc::default();
        let seconds = Arc::new(AtomicUsize::new(0));
        let bases: Vec<String> = (0..3).map(|i| cluster.base(i)).collect();
        let handles = (0..3)
            .map(|w| {
                let (stop, ledger, bases, seconds) =
                    (stop.clone(), ledger.clone(), bases.clone(), seconds.clone());
                tokio::spawn(async move {
                    let client = reqwest::Client::builder()
                        .timeout(Duration::from_secs(30))
                        .build()
                        .unwrap();
                    let commit: &'static str = ["auto", "wait_for", "force"][w];
                    let mut target = w;
                    let mut batch = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        let second = batch / 10;
                        seconds.fetch_max(second + 1, Ordering::Relaxed);
                        let (ids, body) =
                            docs(&format!("w{w}-b{batch}"), 0..20, T0 + second as i64);
                        let resp = client
                            .post(format!(
                                "{}/api/v1/{index}/ingest?commit={commit}",
                                bases[target]
                            ))
                            .body(body)
                            .send()
                            .await;
                        let ok = match resp {
                            Ok(resp) if resp.status().is_success() => {
                                let v: Value = resp.json().await.unwrap_or(Value::Null);
                                v["num_ingested_docs"] == 20
                            }
                            _ => false,
                        };
                        {
                            let mut ledger = ledger.lock().unwrap();
                            if ok {
                                ledger.acked.extend(ids);
                                *ledger.acked_batches.entry(commit).or_default() += 1;
                            } else {
                                ledger.failed_batches += 1;
                            }
                        }
                        if !ok {
                            target = (target + 1) % 3;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        batch += 1;
                    }
                })
            })
            .collect();
        Writers {
            index,
            stop,
            ledger,
            seconds,
            handles,
        }
    }

    /// Documents acknowledged so far.
    fn acked(&self) -> usize {
        self.ledger.lock().unwrap().acked.len()
    }

    /// A little more ingest on a calm cluster, then stops the writers and checks, once every
    /// node runs, that every acknowledged document is found exactly once. Returns the ledger,
    /// the documents found and the published splits.
    async fn finish(self, cluster: &Cluster) -> (Ledger, usize, usize) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.stop.store(true, Ordering::Relaxed);
        for writer in self.handles {
            writer.await.unwrap();
        }
        cluster.wait_live(3).await;
        let ledger = std::mem::take(&mut *self.ledger.lock().unwrap());
        // Every commit mode was exercised: a run that acknowledged nothing proves nothing.
        for mode in ["auto", "wait_for", "force"] {
            assert!(
                ledger.acked_batches.get(mode).copied().unwrap_or(0) > 0,
                "no batch acknowledged with commit={mode}: {:?}",
                ledger.acked_batches
            );
        }
        let (found, splits) = check_exactly_once(
            cluster,
            self.index,
            &ledger,
            self.seconds.load(Ordering::Relaxed),
        )
        .await;
        (ledger, found, splits)
    }
}

/// Waits until every acknowledged id of `ledger` is found through node 0, then checks that
/// none is missing and none is found twice. Returns (found, published splits).
async fn check_exactly_once(
    cluster: &Cluster,
    index: &str,
    ledger: &Ledger,
    seconds: usize,
) -> (usize, usize) {
    let to = T0 + seconds as i64 + 1;
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let counts = loop {
        let counts = common::doc_id_counts(&client, &cluster.base(0), index, T0, to).await;
        if ledger.acked.iter().all(|id| counts.contains_key(id)) || Instant::now() > deadline {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let missing: Vec<&String> = ledger
        .acked
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged documents lost, e.g. {:?}\n{}",
        missing.len(),
        &missing[..missing.len().min(5)],
        (0..3)
            .map(|i| cluster.log(i))
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
    let twice: Vec<(&String, &usize)> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} documents found more than once, e.g. {:?}",
        twice.len(),
        &twice[..twice.len().min(5)]
    );
    let found = counts.values().sum();
    (found, cluster.published_splits(0, index).await.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_chaos_loses_and_duplicates_nothing() {
    let kills: usize = std::env::var("SHALE_CHAOS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let seed: u64 = std::env::var("SHALE_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(42);
    let Some(mut cluster) = Cluster::start(3, "cluster").await else {
        return;
    };
    cluster
        .create_index(0, &common::kill_test_index("chaos", MERGE_EAGERLY))
        .await;
    let writers = Writers::start(&cluster, "chaos");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let mut killed_leaders = 0;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for _ in 0..kills {
        let victim = rng.random_range(0..3);
        if cluster.leader().await == Some(victim) {
            killed_leaders += 1;
        }
        // Anywhere in a commit, a publish or a merge.
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..700))).await;
        cluster.kill(victim);
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..1500))).await;
        cluster.start_node(victim);
        cluster.wait_ready(victim).await;
    }
    let chaos = started.elapsed();
    let (ledger, found, splits) = writers.finish(&cluster).await;
    eprintln!(
        "kill -9 chaos: {kills} kills ({killed_leaders} of the leader) in {:.0} s, seed {seed}; \
         {} documents acknowledged (batches per mode: {:?}), {} batches failed; {found} found, \
         0 lost, 0 duplicated; {splits} published splits",
        chaos.as_secs_f64(),
        ledger.acked.len(),
        ledger.acked_batches,
        ledger.failed_batches,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_during_publishes_and_merges_loses_and_duplicates_nothing() {
    if shale_testkit::s3::endpoint().is_none() {
        return;
    }
    let postgres = match shale_testkit::postgres::DedicatedCluster::start() {
        Ok(postgres) => postgres,
        Err(err) if shale_testkit::under_ci() => panic!("no PostgreSQL cluster: {err}"),
        Err(err) => {
            eprintln!("skipping: no PostgreSQL cluster: {err}");
            return;
        }
    };
    let url = postgres.database_url().await.expect("database");
    let Some(cluster) = Cluster::start_on(3, "cluster", &[], &url).await else {
        return;
    };
    cluster
        .create_index(0, &common::kill_test_index("pgrestart", MERGE_EAGERLY))
        .await;
    let writers = Writers::start(&cluster, "pgrestart");
    let restarts = 4;
    let mut acked_between = Vec::new();
    for _ in 0..restarts {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let before = writers.acked();
        postgres
            .restart_immediate()
            .expect("pg_ctl restart -m immediate");
        // The cluster takes ingest again once the nodes have reconnected.
        let deadline = Instant::now() + Duration::from_secs(60);
        while writers.acked() <= before {
            assert!(
                Instant::now() < deadline,
                "no ingest acknowledged after the restart:\n{}",
                cluster.log(0)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        acked_between.push(writers.acked() - before);
    }
    let (ledger, found, splits) = writers.finish(&cluster).await;
    // Merges went on after the restarts: fewer splits than commits.
    let batches: usize = ledger.acked_batches.values().sum();
    eprintln!(
        "PostgreSQL restarted {restarts} times (immediate) under ingest and merges: {} documents \
         acknowledged (batches per mode: {:?}, acknowledged right after each restart: \
         {acked_between:?}), {} batches failed; {found} found, 0 lost, 0 duplicated; \
         {splits} published splits for {batches} acknowledged batches",
        ledger.acked.len(),
        ledger.acked_batches,
        ledger.failed_batches,
    );
}
