//! Exactly once across crashes for metrics: a `shale run` process is killed with SIGKILL at
//! random moments during sustained Prometheus remote write, and restarted on the same data
//! dir. Each sample is the only one of its series, so a sample published twice shows in the
//! split counts. Every sample acknowledged — with `commit=wait_for` or `force` (published),
//! and with `commit=auto` (in the WAL) — must then be found, and the published splits must
//! hold each sample exactly once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use serde_json::Value;
use shale_metrics::remote_write::{
    encode_remote_write, Label, ProtoSample, TimeSeries, WriteRequest,
};

use crate::common;
use common::{start_node, wait_ready, NodeProcess};

const CYCLES: usize = 12;
const WRITERS: usize = 3;
const INDEX: &str = "crash-metrics";
/// 2026-05-28T20:00:00Z (ms).
const T0: i64 = 1_780_084_800_000;

fn start(data_dir: &std::path::Path, port: u16) -> NodeProcess {
    start_node(
        port,
        &[
            "--node-id".into(),
            "crash-node".into(),
            "--data-dir".into(),
            data_dir.as_os_str().to_owned(),
        ],
    )
}

/// One sample per series, the series named by `ids`.
fn request(ids: &[String], ts: i64) -> Vec<u8> {
    encode_remote_write(&WriteRequest {
        timeseries: ids
            .iter()
            .map(|id| TimeSeries {
                labels: vec![
                    Label {
                        name: "__name__".into(),
                        value: "crash_sample".into(),
                    },
                    Label {
                        name: "id".into(),
                        value: id.clone(),
                    },
                ],
                samples: vec![ProtoSample {
                    value: 1.0,
                    timestamp: ts,
                }],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    })
}

/// The `id`s of the series the index holds, and the samples its published splits count.
async fn stored(client: &reqwest::Client, base: &str) -> (HashSet<String>, u64) {
    stored_in(client, base, INDEX).await
}

/// [`stored`] for the index `index`.
async fn stored_in(client: &reqwest::Client, base: &str, index: &str) -> (HashSet<String>, u64) {
    let resp: Value = client
        .get(format!("{base}/prometheus/{index}/api/v1/label/id/values"))
        .send()
        .await
        .expect("label values")
        .json()
        .await
        .expect("label values response");
    assert_eq!(resp["status"], "success", "{resp}");
    let ids = resp["data"]
        .as_array()
        .expect("values")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    let splits: Value = client
        .get(format!(
            "{base}/api/v1/indexes/{index}/splits?split_states=Published"
        ))
        .send()
        .await
        .expect("splits")
        .json()
        .await
        .expect("splits response");
    let samples = splits["splits"]
        .as_array()
        .expect("splits")
        .iter()
        .map(|s| s["num_docs"].as_u64().unwrap_or(0))
        .sum();
    (ids, samples)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_samples_survive_sigkill_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let port = shale_testkit::free_port();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    let acked_auto: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut sent_total = 0usize;

    let mut node = start(tmp.path(), port);
    wait_ready(&client, &node.base).await;
    let resp = client
        .post(format!("{}/api/v1/indexes", node.base))
        .body(format!(
            "index_id: {INDEX}\nmetrics:\n  sort_labels: [id]\nindexing_settings:\n  commit_timeout_secs: 1\n"
        ))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());

    for cycle in 0..CYCLES {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let client = client.clone();
            let base = node.base.clone();
            let auto = w == WRITERS - 1;
            let acked = if auto {
                acked_auto.clone()
            } else {
                acked.clone()
            };
            let stop = stop.clone();
            writers.push(tokio::spawn(async move {
                let mut sent = 0usize;
                let mut batch_no = 0usize;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let ids: Vec<String> = (0..50)
                        .map(|i| format!("c{cycle}-w{w}-b{batch_no}-{i}"))
                        .collect();
                    let commit = if auto {
                        "auto"
                    } else if batch_no.is_multiple_of(4) {
                        "force"
                    } else {
                        "wait_for"
                    };
                    // Samples over several time buckets (one split per bucket and commit).
                    let ts = T0 + (cycle as i64 * 7 + batch_no as i64 % 5) * 600_000;
                    batch_no += 1;
                    sent += ids.len();
                    let result = client
                        .post(format!(
                            "{base}/prometheus/{INDEX}/api/v1/write?commit={commit}"
                        ))
                        .header("Content-Encoding", "snappy")
                        .body(request(&ids, ts))
                        .send()
                        .await;
                    match result {
                        Ok(resp) if resp.status().as_u16() == 204 => {
                            acked.lock().unwrap().extend(ids);
                            if auto {
                                tokio::time::sleep(Duration::from_millis(15)).await;
                            }
                        }
                        _ => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
                sent
            }));
        }
        let delay = rand::rng().random_range(300..1800);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        node.child.kill().expect("SIGKILL the node");
        node.child.wait().unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for writer in writers {
            sent_total += writer.await.unwrap();
        }
        node = start(tmp.path(), port);
        wait_ready(&client, &node.base).await;
    }

    let acked = acked.lock().unwrap().clone();
    let acked_auto = acked_auto.lock().unwrap().clone();
    assert!(
        acked.len() > 500,
        "too little acknowledged: {}",
        acked.len()
    );
    assert!(
        acked_auto.len() > 500,
        "too little acknowledged with commit=auto: {}",
        acked_auto.len()
    );
    // What the WAL replays answers queries at once (read back into memory) and is published
    // by the commit timeout after the last restart.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let (ids, samples) = loop {
        let (ids, samples) = stored(&client, &node.base).await;
        let complete = acked.iter().chain(&acked_auto).all(|id| ids.contains(id));
        if (complete && samples >= ids.len() as u64) || std::time::Instant::now() > deadline {
            break (ids, samples);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let missing: Vec<_> = acked.iter().filter(|id| !ids.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged samples lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let missing_auto: Vec<_> = acked_auto.iter().filter(|id| !ids.contains(*id)).collect();
    assert!(
        missing_auto.is_empty(),
        "{} samples acknowledged with commit=auto lost, e.g. {:?}",
        missing_auto.len(),
        &missing_auto[..missing_auto.len().min(10)]
    );
    // One sample per series: more samples than series means one was published twice.
    assert_eq!(
        samples,
        ids.len() as u64,
        "the published splits count {samples} samples for {} series",
        ids.len()
    );
    eprintln!(
        "{CYCLES} SIGKILL cycles: {sent_total} samples sent, {} acknowledged with wait_for/force \
         and {} with auto, {} stored, 0 lost, 0 duplicated",
        acked.len(),
        acked_auto.len(),
        ids.len()
    );
    drop(node);
}

/// Node settings that merge at once and reclaim a killed node's merges quickly.
const MERGING_NODE: &str =
    "compaction:\n  planner_interval_secs: 1\n  merge_lease_secs: 3\n  max_concurrent_merges: 2\n";

/// Metrics merges killed mid-way: each cycle writes unique series into closed buckets (their
/// locality merges start at once), waits until a merge runs and SIGKILLs the node. At the end
/// every acknowledged sample is stored exactly once, and the level-1 splits of each bucket
/// do not overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_node_mid_metrics_merge_conserves_every_sample() {
    const INDEX: &str = "merge-crash-metrics";
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("node.yaml"), MERGING_NODE).unwrap();
    let start = |port: u16| {
        start_node(
            port,
            &[
                "--node-id".into(),
                "merger".into(),
                "--config".into(),
                tmp.path().join("node.yaml").into_os_string(),
                "--data-dir".into(),
                tmp.path().join("data").into_os_string(),
            ],
        )
    };
    let port = shale_testkit::free_port();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut node = start(port);
    wait_ready(&client, &node.base).await;
    let resp = client
        .post(format!("{}/api/v1/indexes", node.base))
        .body(format!(
            "index_id: {INDEX}\nmetrics:\n  sort_labels: [id]\n  target_split_bytes: 30KB\n\
             indexing_settings:\n  commit_timeout_secs: 1\n"
        ))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut kills_mid_merge = 0;
    let cycles = 6;
    for cycle in 0..cycles {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (client, base, acked, stop) = (
                client.clone(),
                node.base.clone(),
                acked.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut batch = 0usize;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let ids: Vec<String> = (0..200)
                        .map(|i| format!("c{cycle}-b{batch}-{i:03}"))
                        .collect();
                    // Three closed buckets, an hour apart, long ago.
                    let ts = T0 + (batch as i64 % 3) * 3_600_000 + cycle as i64 * 1000;
                    batch += 1;
                    let result = client
                        .post(format!(
                            "{base}/prometheus/{INDEX}/api/v1/write?commit=force"
                        ))
                        .header("Content-Encoding", "snappy")
                        .body(request(&ids, ts))
                        .send()
                        .await;
                    match result {
                        Ok(resp) if resp.status().as_u16() == 204 => {
                            acked.lock().unwrap().extend(ids)
                        }
                        _ => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            })
        };
        // A few splits per bucket, then kill as soon as a merge runs (or after 8 s).
        let acked_before = acked.lock().unwrap().len();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while acked.lock().unwrap().len() < acked_before + 1200
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(8);
        while std::time::Instant::now() < deadline {
            let status: Option<Value> = match client
                .get(format!("{}/api/v1/indexes/{INDEX}/compaction", node.base))
                .send()
                .await
            {
                Ok(resp) => resp.json().await.ok(),
                Err(_) => None,
            };
            if status.is_some_and(|s| s["running"].as_array().is_some_and(|r| !r.is_empty())) {
                kills_mid_merge += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        node.child.kill().expect("SIGKILL");
        node.child.wait().unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.await.unwrap();
        node = start(port);
        wait_ready(&client, &node.base).await;
    }
    assert!(
        kills_mid_merge >= cycles / 2,
        "only {kills_mid_merge} kills hit a running merge"
    );
    // Settle (interrupted tasks are reclaimed after 3 s): every bucket's splits level 1, or
    // no merge running for three polls in a row while the bucket's splits are disjoint (a
    // level-0 split whose range meets no other split of its bucket has nothing to merge with:
    // the policy leaves it as it is).
    let acked = acked.lock().unwrap().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut quiet_polls = 0;
    let splits = loop {
        let splits: Value = client
            .get(format!(
                "{}/api/v1/indexes/{INDEX}/splits?split_states=Published",
                node.base
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let list = splits["splits"].as_array().unwrap().clone();
        // `key_level` is left out of a level-0 split's JSON.
        let level_zero = list.iter().filter(|s| s["key_level"] != 1).count();
        if level_zero == 0 {
            break list;
        }
        let status: Value = client
            .get(format!("{}/api/v1/indexes/{INDEX}/compaction", node.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let running = status["running"].as_array().is_some_and(|r| !r.is_empty());
        quiet_polls = if !running && disjoint_per_bucket(&list) {
            quiet_polls + 1
        } else {
            0
        };
        if quiet_polls >= 3 {
            break list;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never settled: {level_zero} level-0 splits"
        );
        tokio::time::sleep(Duration::from_millis(1000)).await;
    };
    let (ids, samples) = stored_in(&client, &node.base, INDEX).await;
    let missing: Vec<_> = acked.iter().filter(|id| !ids.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged samples lost",
        missing.len()
    );
    assert_eq!(samples, ids.len() as u64, "a sample stored twice");
    // Per bucket, key ranges do not overlap; the three buckets were written.
    assert!(
        disjoint_per_bucket(&splits),
        "overlapping splits in a bucket"
    );
    let buckets: HashSet<i64> = splits
        .iter()
        .map(|s| s["time_bucket_start"].as_i64().unwrap())
        .collect();
    assert_eq!(buckets.len(), 3);
    eprintln!(
        "{cycles} kill cycles ({kills_mid_merge} mid-merge): {} samples acknowledged, {} stored \
         in {} disjoint splits, 0 lost, 0 duplicated",
        acked.len(),
        samples,
        splits.len()
    );
    drop(node);
}

/// Whether the published splits of each time bucket have disjoint sort-key ranges (hex).
fn disjoint_per_bucket(splits: &[Value]) -> bool {
    let bytes = |hex: &str| -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .filter_map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect()
    };
    type KeyRange = (Vec<u8>, Vec<u8>);
    let mut by_bucket: std::collections::BTreeMap<i64, Vec<KeyRange>> = Default::default();
    for split in splits {
        by_bucket
            .entry(split["time_bucket_start"].as_i64().unwrap_or(0))
            .or_default()
            .push((
                bytes(split["sort_key_min"].as_str().unwrap_or("")),
                bytes(split["sort_key_max"].as_str().unwrap_or("")),
            ));
    }
    by_bucket.values_mut().all(|ranges| {
        ranges.sort();
        ranges.windows(2).all(|pair| pair[0].1 < pair[1].0)
    })
}
