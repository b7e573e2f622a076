//! No document is lost or duplicated by a merge, even when the node is killed (SIGKILL) in the
//! middle of merges, repeatedly. Each cycle ingests while merges run, waits until the
//! compaction API reports a running merge, kills the node at once and restarts it. The
//! interrupted tasks are reclaimed when their lease expires; their half-done outputs are
//! discarded. At the end, every acknowledged document is found exactly once. Run with a
//! `stable_log` index (one output per merge) and a `locality` index (m → n merges into
//! level-1 key ranges, which must also end without two overlapping level-1 splits).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common;
use common::{start_node, wait_ready, NodeProcess};

const CYCLES: usize = 10;

/// Merges any 2..4 small splits.
const MERGE_POLICY: &str = "  merge_policy:\n    type: stable_log\n    merge_factor: 2\n    max_merge_factor: 4\n    min_level_num_docs: 100000\n";

const NODE_CONFIG: &str =
    "compaction:\n  planner_interval_secs: 1\n  merge_lease_secs: 3\n  max_concurrent_merges: 2\n";

fn start(dir: &std::path::Path, port: u16) -> NodeProcess {
    start_node(
        port,
        &[
            "--node-id".into(),
            "merger".into(),
            "--config".into(),
            dir.join("node.yaml").into_os_string(),
            "--data-dir".into(),
            dir.join("data").into_os_string(),
        ],
    )
}

/// A locality index of `ts`, `service` (its sort field), `doc_id` and `body`.
const LOCALITY_INDEX: &str = "index_id: locality-crash
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: service, type: text, tokenizer: raw, fast: true}
    - {name: doc_id, type: text, tokenizer: raw}
    - {name: body, type: text}
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 1
  merge_policy:
    type: locality
    sort_fields: [service]
    time_bucket: 15m
    target_split_num_docs: 300
    max_merge_ops: 4
";

async fn compaction_status(client: &reqwest::Client, base: &str, index: &str) -> Option<Value> {
    let resp = client
        .get(format!("{base}/api/v1/indexes/{index}/compaction"))
        .send()
        .await
        .ok()?;
    resp.json().await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_node_mid_merge_loses_and_duplicates_nothing() {
    let splits = kill_cycles(
        "merge-crash",
        &common::kill_test_index("merge-crash", MERGE_POLICY),
        CYCLES,
    )
    .await;
    let merged = splits
        .iter()
        .filter(|s| s["num_merge_ops"].as_u64().unwrap_or(0) > 0)
        .count();
    assert!(merged > 0, "no merge ever completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_node_mid_locality_merge_loses_and_duplicates_nothing() {
    let splits = kill_cycles("locality-crash", LOCALITY_INDEX, 6).await;
    let mut level1: Vec<(String, String)> = splits
        .iter()
        .filter(|s| s["key_level"] == 1)
        .map(|s| {
            (
                s["sort_key_min"].as_str().unwrap().to_string(),
                s["sort_key_max"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(!level1.is_empty(), "no locality merge ever completed");
    // One bucket: its level-1 ranges must not overlap (hex keys of one length order as bytes
    // do only by position, so compare the decoded bytes).
    let bytes = |hex: &str| -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    };
    level1.sort_by_key(|(min, _)| bytes(min));
    for pair in level1.windows(2) {
        assert!(
            bytes(&pair[0].1) < bytes(&pair[1].0),
            "overlapping level-1 splits: {pair:?}"
        );
    }
}

/// Ingests while merges run and kills the node mid-merge `cycles` times; then checks that
/// every acknowledged document is found exactly once. Returns the Published splits.
async fn kill_cycles(index: &str, index_yaml: &str, cycles: usize) -> Vec<Value> {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("node.yaml"), NODE_CONFIG).unwrap();
    let port = shale_testkit::free_port();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut node = start(tmp.path(), port);
    wait_ready(&client, &node.base).await;
    let resp = client
        .post(format!("{}/api/v1/indexes", node.base))
        .body(index_yaml.to_string())
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());

    let mut kills_mid_merge = 0;
    for cycle in 0..cycles {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (client, base, acked, stop, index) = (
                client.clone(),
                node.base.clone(),
                acked.clone(),
                stop.clone(),
                index.to_string(),
            );
            tokio::spawn(async move {
                let mut batch = 0usize;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let ids: Vec<String> =
                        (0..100).map(|i| format!("c{cycle}-b{batch}-{i}")).collect();
                    batch += 1;
                    let body: String = ids
                        .iter()
                        .map(|id| {
                            json!({"ts": 1_700_000_000 + cycle as i64, "doc_id": id, "body": "merge me",
                                   "service": format!("svc-{}", id.len() % 7 + id.as_bytes()[id.len() - 1] as usize % 5)})
                                .to_string()
                                + "\n"
                        })
                        .collect();
                    let ok = match client
                        .post(format!("{base}/api/v1/{index}/ingest?commit=force"))
                        .body(body)
                        .send()
                        .await
                    {
                        Ok(resp) if resp.status().is_success() => {
                            let v: Value = resp.json().await.unwrap_or(Value::Null);
                            v["num_ingested_docs"] == 100
                        }
                        _ => false,
                    };
                    if ok {
                        acked.lock().unwrap().extend(ids);
                    } else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            })
        };
        // Ingest a few batches (several fresh splits), then kill as soon as a merge is running
        // (or after 8 s).
        let acked_before = acked.lock().unwrap().len();
        let deadline = Instant::now() + Duration::from_secs(5);
        while acked.lock().unwrap().len() < acked_before + 500 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let deadline = Instant::now() + Duration::from_secs(8);
        while Instant::now() < deadline {
            if let Some(status) = compaction_status(&client, &node.base, index).await {
                if status["running"].as_array().is_some_and(|r| !r.is_empty()) {
                    kills_mid_merge += 1;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        node.child.kill().expect("SIGKILL");
        node.child.wait().unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.await.unwrap();
        node = start(tmp.path(), port);
        wait_ready(&client, &node.base).await;
    }
    assert!(
        kills_mid_merge >= cycles / 2,
        "only {kills_mid_merge} kills hit a running merge"
    );

    // Let compaction settle: interrupted tasks are reclaimed after their lease (3 s); idle
    // for 10 s (the locality policy waits for late splits to stop arriving before merging).
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut idle_since: Option<Instant> = None;
    loop {
        let status = compaction_status(&client, &node.base, index).await.unwrap();
        let idle = status["pending_operations"] == 0
            && status["running"].as_array().is_some_and(|r| r.is_empty());
        if !idle {
            idle_since = None;
        } else if idle_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(10) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "compaction never settled: {status}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let acked = acked.lock().unwrap().clone();
    let seen = common::doc_id_counts(
        &client,
        &node.base,
        index,
        1_700_000_000,
        1_700_000_000 + cycles as i64,
    )
    .await;
    let duplicated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicated.is_empty(),
        "duplicated: {:?}",
        &duplicated[..duplicated.len().min(10)]
    );
    let missing: Vec<_> = acked.iter().filter(|id| !seen.contains_key(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged documents lost",
        missing.len()
    );
    let splits: Value = client
        .get(format!(
            "{}/api/v1/indexes/{index}/splits?split_states=Published",
            node.base
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let splits = splits["splits"].as_array().unwrap().clone();
    let merged = splits
        .iter()
        .filter(|s| s["num_merge_ops"].as_u64().unwrap_or(0) > 0)
        .count();
    eprintln!(
        "{index}: {cycles} SIGKILLs ({kills_mid_merge} mid-merge): {} acknowledged, {} found, 0 lost, 0 duplicated, {} published splits ({merged} merged)",
        acked.len(),
        seen.len(),
        splits.len()
    );
    splits
}
