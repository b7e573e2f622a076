//! Exactly once across crashes: a `shale run` process is killed with SIGKILL at random moments
//! during sustained ingest, 24 times, and restarted on the same data dir. Every document
//! acknowledged with `commit=wait_for` (or `force`) must then be found exactly once, and no
//! document at all may be found twice.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use serde_json::{json, Value};

mod common;
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
            let acked = acked.clone();
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
                    let commit = if batch_no.is_multiple_of(4) { "force" } else { "wait_for" };
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
    assert!(
        acked.len() > 1000,
        "too little acknowledged: {}",
        acked.len()
    );
    let resp: Value = client
        .post(format!("{}/api/v1/crash-logs/search", node.base))
        .json(&json!({"query": "*", "max_hits": sent_total + 10}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for hit in resp["hits"].as_array().unwrap() {
        *seen
            .entry(hit["doc_id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(
        resp["num_hits"].as_u64().unwrap() as usize,
        seen.values().sum::<usize>()
    );
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
    eprintln!(
        "{CYCLES} SIGKILL cycles: {} sent, {} acknowledged, {} found, 0 lost, 0 duplicated",
        sent_total,
        acked.len(),
        seen.len()
    );
    drop(node);
}
