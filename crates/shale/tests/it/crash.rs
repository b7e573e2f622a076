//! Exactly once across crashes: a `shale run` process is killed with SIGKILL at random moments
//! during sustained ingest, 24 times, and restarted on the same data dir. Every document
//! acknowledged — with `commit=wait_for` or `force` (published), and with `commit=auto` (in
//! the WAL, under the default `on-delay` persist policy: a process kill loses nothing, only
//! a power loss may) — must then be found exactly once, and no document at all may be found
//! twice.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use serde_json::{json, Value};

use crate::common;
use common::{start_node, wait_ready, NodeProcess};

const CYCLES: usize = 24;
const WRITERS: usize = 3;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_documents_survive_sigkill_exactly_once() {
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
        .body(common::kill_test_index("crash-logs", ""))
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
            // The last writer acknowledges with `commit=auto`.
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
                    let body: String = ids
                        .iter()
                        .map(|id| {
                            json!({"ts": 1_700_000_000 + cycle as i64, "doc_id": id, "body": "payload text"})
                                .to_string()
                                + "\n"
                        })
                        .collect();
                    let commit = if auto {
                        "auto"
                    } else if batch_no.is_multiple_of(4) {
                        "force"
                    } else {
                        "wait_for"
                    };
                    batch_no += 1;
                    sent += ids.len();
                    let result = client
                        .post(format!("{base}/api/v1/crash-logs/ingest?commit={commit}"))
                        .body(body)
                        .send()
                        .await;
                    match result {
                        Ok(resp) if resp.status().is_success() => {
                            let v: Value = resp.json().await.unwrap_or(Value::Null);
                            if v["num_ingested_docs"] == 50 {
                                acked.lock().unwrap().extend(ids);
                            }
                            if auto {
                                // `auto` answers at once: pace it like the others.
                                tokio::time::sleep(Duration::from_millis(15)).await;
                            }
                        }
                        _ => {
                            // the node died under us
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
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

    // Let the last restart publish anything replayed from the WAL, then count.
    let resp = client
        .post(format!(
            "{}/api/v1/crash-logs/ingest?commit=force",
            node.base
        ))
        .body(json!({"ts": 1_700_000_000, "doc_id": "final", "body": "x"}).to_string())
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    let acked = acked.lock().unwrap().clone();
    let acked_auto = acked_auto.lock().unwrap().clone();
    assert!(
        acked.len() > 1000,
        "too little acknowledged: {}",
        acked.len()
    );
    assert!(
        acked_auto.len() > 500,
        "too little acknowledged with commit=auto: {}",
        acked_auto.len()
    );
    // Documents acknowledged with `auto` are published by the commit timeout after restart.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let seen = loop {
        let seen = common::doc_id_counts(
            &client,
            &node.base,
            "crash-logs",
            1_700_000_000,
            1_700_000_000 + CYCLES as i64,
        )
        .await;
        if acked_auto.iter().all(|id| seen.contains_key(id)) || std::time::Instant::now() > deadline
        {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let duplicated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicated.is_empty(),
        "documents found more than once: {:?}",
        &duplicated[..duplicated.len().min(10)]
    );
    let missing: Vec<_> = acked.iter().filter(|id| !seen.contains_key(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged documents lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let missing_auto: Vec<_> = acked_auto
        .iter()
        .filter(|id| !seen.contains_key(*id))
        .collect();
    assert!(
        missing_auto.is_empty(),
        "{} documents acknowledged with commit=auto lost, e.g. {:?}",
        missing_auto.len(),
        &missing_auto[..missing_auto.len().min(10)]
    );
    eprintln!(
        "{CYCLES} SIGKILL cycles: {} sent, {} acknowledged with wait_for/force and {} with auto, {} found, 0 lost, 0 duplicated",
        sent_total,
        acked.len(),
        acked_auto.len(),
        seen.len()
    );
    drop(node);
}
