//! A node whose data directory's file system fills up: ingest answers a clear, retryable
//! error, nothing acknowledged is lost or corrupted, searches keep answering, and ingest,
//! heartbeats and merges resume by themselves once space is freed — no restart.
//!
//! The data directory is a small tmpfs mounted for the test (needs root; skipped with a
//! warning elsewhere, a failure under CI).

use crate::common;

use std::time::{Duration, Instant};

use common::TestNode;
use serde_json::{json, Value};
use shale_testkit::tmpfs::Tmpfs;

const INDEX: &str = "
index_id: full
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: doc_id, type: text, tokenizer: raw}
    - {name: body, type: text}
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 1
  merge_policy:
    type: stable_log
    merge_factor: 2
    max_merge_factor: 4
    min_level_num_docs: 1000000
";

fn batch(first: usize, n: usize) -> String {
    let filler = "lorem ipsum dolor sit amet consectetur ".repeat(8);
    (first..first + n)
        .map(|i| {
            format!(
                "{}\n",
                json!({"ts": 1_700_000_000 + i as i64, "doc_id": format!("d{i}"), "body": format!("{filler} {i}")})
            )
        })
        .collect()
}

async fn ingest(node: &TestNode, docs: &str, commit: &str) -> (u16, Value) {
    node.post(
        &format!("/api/v1/full/ingest?commit={commit}"),
        docs.to_string(),
    )
    .await
}

async fn search(node: &TestNode, query: &str) -> Value {
    let (status, body) = node
        .post(
            "/api/v1/full/search",
            json!({"query": query, "max_hits": 0}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "searches keep answering: {body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_survived_without_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::mount(&tmp.path().join("fs"), "64m") else {
        return;
    };
    let mut config = common::config_in(&fs.path().join("data"));
    config.compaction.planner_interval_secs = 1;
    config.cluster.heartbeat_interval_ms = 200;
    let node = TestNode::start_with(config).await;
    node.create_index(INDEX).await;

    // Leave a few MB: ingest fills them.
    let ballast = fs.fill("ballast", 6 << 20);

    let mut acked = 0usize;
    let mut next = 0usize;
    let mut refusals = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while refusals.len() < 5 {
        assert!(Instant::now() < deadline, "the disk never filled up");
        let (status, body) = ingest(&node, &batch(next, 200), "auto").await;
        next += 200;
        if status == 200 {
            acked = next;
            // Acknowledged documents are contiguous: a refused batch is never half in.
            assert_eq!(body["num_ingested_docs"], 200, "{body}");
            refusals.clear();
        } else {
            refusals.push((status, body));
            next -= 200;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    eprintln!("acknowledged {acked} documents before the disk filled; refusals: {refusals:?}");
    for (status, body) in &refusals {
        assert!(
            *status == 503 || *status == 429,
            "a full disk is a retryable refusal: {status} {body}"
        );
        assert!(
            body["message"]
                .as_str()
                .unwrap_or_default()
                .contains("space"),
            "the error says why: {body}"
        );
    }
    assert!(acked > 0);

    // Searches answer while the disk is full, with what is published and no error.
    let answer = search(&node, "*").await;
    assert!(
        answer["errors"].as_array().is_none_or(|e| e.is_empty()),
        "{answer}"
    );
    assert!(answer["num_hits"].as_u64().unwrap() <= acked as u64);

    // Free the space: everything resumes on its own.
    std::fs::remove_file(&ballast).unwrap();
    let resumed = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = ingest(&node, &batch(next, 200), "wait_for").await;
        if status == 200 {
            next += 200;
            acked = next;
            break;
        }
        assert!(
            Instant::now() < resumed,
            "ingest did not resume after space was freed: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Every acknowledged document is published, once.
    let published = Instant::now() + Duration::from_secs(60);
    loop {
        let hits = search(&node, "*").await["num_hits"].as_u64().unwrap();
        if hits == acked as u64 {
            break;
        }
        assert!(
            hits < acked as u64,
            "duplicates: {hits} hits for {acked} documents"
        );
        assert!(
            Instant::now() < published,
            "acknowledged documents missing: {hits} of {acked}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(search(&node, "doc_id:d0").await["num_hits"], 1);
    assert_eq!(
        search(&node, &format!("doc_id:d{}", acked - 1)).await["num_hits"],
        1
    );

    // Heartbeats work again: the node is live, its heartbeat fresh.
    let fresh = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, cluster) = node.get("/api/v1/cluster").await;
        let me = cluster["live_nodes"]
            .as_array()
            .and_then(|nodes| nodes.iter().find(|n| n["node_id"] == "test-node").cloned());
        if me.is_some_and(|me| me["heartbeat_age_ms"].as_i64().unwrap_or(i64::MAX) < 2_000) {
            break;
        }
        assert!(
            Instant::now() < fresh,
            "heartbeats did not resume: {cluster}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // And merges: a manual compaction completes.
    let (status, resp) = node.post("/api/v1/indexes/full/compact", "{}").await;
    assert_eq!(status, 200, "{resp}");
    let id = resp["compaction_id"].as_str().unwrap().to_string();
    let done = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, resp) = node
            .get(&format!("/api/v1/indexes/full/compactions/{id}"))
            .await;
        if resp["state"] == "completed" {
            break;
        }
        assert_ne!(resp["state"], "failed", "{resp}");
        assert!(Instant::now() < done, "compaction stuck: {resp}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        search(&node, "*").await["num_hits"].as_u64().unwrap(),
        acked as u64
    );
    node.stop().await;
    drop(fs);
}
