//! Deleted documents never come back, even when the node is killed (SIGKILL) while it
//! ingests, merges and applies deletes, repeatedly. Each cycle ingests batches while a
//! deleter deletes whole acknowledged batches (and, now and then, a batch not written yet,
//! which must survive: a delete spares what is acknowledged after it), then kills the node
//! as soon as a merge runs, and restarts it. At the end — and again after a manual
//! compaction has purged every delete — the visible documents are exactly the
//! acknowledged ones minus the deleted ones, none twice. A request whose answer was lost in
//! the kill has an unknown outcome: its documents (or its delete) may or may not be there,
//! all or nothing.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common;
use common::{start_node, wait_ready, NodeProcess};

const CYCLES: usize = 10;
const BATCH: usize = 50;
const TS0: i64 = 1_700_000_000;
const INDEX: &str = "delete-crash";

const NODE_CONFIG: &str =
    "compaction:\n  planner_interval_secs: 1\n  merge_lease_secs: 3\n  max_concurrent_merges: 2\n";

/// Merges any 2..4 small splits; delete compaction above 5 % deleted.
const INDEX_YAML: &str = "index_id: delete-crash
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: doc_id, type: text, tokenizer: raw}
    - {name: grp, type: text, tokenizer: raw}
    - {name: body, type: text}
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 1
  merge_policy:
    type: stable_log
    merge_factor: 2
    max_merge_factor: 4
    min_level_num_docs: 100000
compaction:
  delete_ratio: 0.05
";

fn start(dir: &std::path::Path, port: u16) -> NodeProcess {
    start_node(
        port,
        &[
            "--node-id".into(),
            "deleter".into(),
            "--config".into(),
            dir.join("node.yaml").into_os_string(),
            "--data-dir".into(),
            dir.join("data").into_os_string(),
        ],
    )
}

/// What the test knows about each batch (`c{cycle}b{batch}`).
#[derive(Clone, Default)]
struct Ledger {
    /// Batches acknowledged.
    acked: BTreeSet<String>,
    /// Batches whose ingest answer was lost: present or not.
    maybe_acked: BTreeSet<String>,
    /// Batches deleted (the delete was acknowledged after the batch).
    deleted: BTreeSet<String>,
    /// Deletes whose answer was lost.
    maybe_deleted: BTreeSet<String>,
    /// Batches deleted before they were written: they must stay.
    deleted_ahead: BTreeSet<String>,
}

async fn post(client: &reqwest::Client, url: String, body: String) -> Option<Value> {
    match client.post(url).body(body).send().await {
        Ok(resp) if resp.status().is_success() => resp.json().await.ok(),
        Ok(resp) => panic!(
            "{}: {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        ),
        Err(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_node_mid_merge_and_mid_delete_never_brings_a_deleted_document_back() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("node.yaml"), NODE_CONFIG).unwrap();
    let port = shale_testkit::free_port();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    let mut node = start(tmp.path(), port);
    wait_ready(&client, &node.base).await;
    let created = post(
        &client,
        format!("{}/api/v1/indexes", node.base),
        INDEX_YAML.to_string(),
    )
    .await;
    assert!(created.is_some());

    let mut kills_mid_merge = 0;
    for cycle in 0..CYCLES {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let next_batch = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let writer = {
            let (client, base, ledger, stop, next_batch) = (
                client.clone(),
                node.base.clone(),
                ledger.clone(),
                stop.clone(),
                next_batch.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let batch = next_batch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let grp = format!("c{cycle}b{batch}");
                    let body: String = (0..BATCH)
                        .map(|i| {
                            json!({"ts": TS0 + cycle as i64, "doc_id": format!("{grp}-{i}"),
                                   "grp": grp, "body": "delete me maybe"})
                            .to_string()
                                + "\n"
                        })
                        .collect();
                    let url = format!("{base}/api/v1/{INDEX}/ingest?commit=force");
                    match client.post(url).body(body).send().await {
                        Ok(resp) if resp.status().is_success() => {
                            let v: Value = resp.json().await.unwrap_or(Value::Null);
                            assert_eq!(v["num_ingested_docs"], BATCH, "{v}");
                            ledger.lock().unwrap().acked.insert(grp);
                        }
                        Ok(_) => {
                            // Refused (e.g. the node is starting): not written.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(_) => {
                            ledger.lock().unwrap().maybe_acked.insert(grp);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            })
        };
        // Deletes while ingest and merges run: every third acknowledged batch, and one batch
        // far ahead of the writer.
        let deleter = {
            let (client, base, ledger, stop, next_batch) = (
                client.clone(),
                node.base.clone(),
                ledger.clone(),
                stop.clone(),
                next_batch.clone(),
            );
            tokio::spawn(async move {
                let mut round = 0usize;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    round += 1;
                    let target = {
                        let ledger = ledger.lock().unwrap();
                        if round.is_multiple_of(4) {
                            let ahead = next_batch.load(std::sync::atomic::Ordering::SeqCst) + 15;
                            Some((format!("c{cycle}b{ahead}"), true))
                        } else {
                            ledger
                                .acked
                                .iter()
                                .filter(|grp| {
                                    !ledger.deleted.contains(*grp)
                                        && !ledger.maybe_deleted.contains(*grp)
                                })
                                .nth(round % 3)
                                .map(|grp| (grp.clone(), false))
                        }
                    };
                    if let Some((grp, ahead)) = target {
                        let url = format!("{base}/api/v1/{INDEX}/delete-tasks");
                        let body = json!({"query": format!("grp:{grp}")}).to_string();
                        let answered = client.post(url).body(body).send().await;
                        let mut ledger = ledger.lock().unwrap();
                        match answered {
                            Ok(resp) if resp.status().is_success() => {
                                if ahead {
                                    ledger.deleted_ahead.insert(grp);
                                } else {
                                    ledger.deleted.insert(grp);
                                }
                            }
                            Ok(resp) => panic!("delete refused: {}", resp.status()),
                            Err(_) if ahead => {
                                ledger.deleted_ahead.insert(grp);
                            }
                            Err(_) => {
                                ledger.maybe_deleted.insert(grp);
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
            })
        };
        // A few batches, then kill as soon as a merge runs (or after 8 s).
        let deadline = Instant::now() + Duration::from_secs(8);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        while Instant::now() < deadline {
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
        deleter.await.unwrap();
        node = start(tmp.path(), port);
        wait_ready(&client, &node.base).await;
    }
    assert!(
        kills_mid_merge >= CYCLES / 2,
        "only {kills_mid_merge} kills hit a running merge"
    );
    wait_idle(&client, &node.base).await;
    let known = ledger.lock().unwrap().clone();
    check(&client, &node.base, &known, "after the kills").await;

    // A manual compaction purges every delete: still exactly the same documents.
    let started = post(
        &client,
        format!("{}/api/v1/indexes/{INDEX}/compact", node.base),
        json!({"force": true}).to_string(),
    )
    .await
    .expect("compact");
    let id = started["compaction_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status: Value = client
            .get(format!(
                "{}/api/v1/indexes/{INDEX}/compactions/{id}",
                node.base
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if status["state"] == "completed" {
            break;
        }
        assert_ne!(status["state"], "failed", "{status}");
        assert!(Instant::now() < deadline, "compaction stuck: {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    check(&client, &node.base, &known, "after purging").await;
}

/// Waits until no merge is pending or running for 5 s.
async fn wait_idle(client: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut idle_since: Option<Instant> = None;
    loop {
        let status: Value = client
            .get(format!("{base}/api/v1/indexes/{INDEX}/compaction"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let idle = status["pending_operations"] == 0
            && status["running"].as_array().is_some_and(|r| r.is_empty());
        if !idle {
            idle_since = None;
        } else if idle_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(5) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "compaction never settled: {status}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Visible documents = acknowledged − deleted, none twice; uncertain batches all or nothing.
async fn check(client: &reqwest::Client, base: &str, ledger: &Ledger, when: &str) {
    let seen = common::doc_id_counts(client, base, INDEX, TS0, TS0 + CYCLES as i64).await;
    let duplicated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(duplicated.is_empty(), "{when}: duplicated {duplicated:?}");
    let mut per_batch: HashMap<String, usize> = HashMap::new();
    for doc_id in seen.keys() {
        let grp = doc_id.split('-').next().unwrap().to_string();
        *per_batch.entry(grp).or_default() += 1;
    }
    let mut expected_visible = 0;
    for grp in &ledger.acked {
        let found = per_batch.get(grp).copied().unwrap_or(0);
        if ledger.deleted.contains(grp) {
            assert_eq!(found, 0, "{when}: deleted batch {grp} came back");
        } else if ledger.maybe_deleted.contains(grp) {
            assert!(
                found == 0 || found == BATCH,
                "{when}: {grp}: {found} of {BATCH}"
            );
        } else {
            assert_eq!(
                found, BATCH,
                "{when}: acknowledged batch {grp} lost documents"
            );
            expected_visible += 1;
        }
    }
    for (grp, found) in &per_batch {
        if !ledger.acked.contains(grp) {
            assert!(
                ledger.maybe_acked.contains(grp),
                "{when}: {grp} was never sent"
            );
            assert!(
                *found == BATCH || ledger.deleted.contains(grp),
                "{when}: {grp}: {found}"
            );
        }
    }
    let spared = ledger
        .deleted_ahead
        .iter()
        .filter(|grp| ledger.acked.contains(*grp))
        .count();
    eprintln!(
        "{when}: {} batches acknowledged, {} deleted ({} uncertain), {} deleted before they \
         were written ({spared} written since, all kept), {expected_visible} visible as expected",
        ledger.acked.len(),
        ledger.deleted.len(),
        ledger.maybe_deleted.len(),
        ledger.deleted_ahead.len()
    );
    assert!(!ledger.deleted.is_empty(), "no delete was acknowledged");
}
