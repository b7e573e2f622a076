//! One process per data directory: a second `shale run` on a directory in use exits at once
//! with a clear error — on another port or on the same one — and the first node goes on
//! untouched (same incarnation, documents still there, still accepting ingest).

use crate::common;

use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{start_node, wait_ready};
use serde_json::{json, Value};

/// Runs a second `shale run` on `data_dir` and `port`; returns its exit status and stderr.
fn second_run(data_dir: &std::path::Path, port: u16) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shale"))
        .arg("run")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(data_dir)
        .env("SHALE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shale run");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let output = child.wait_with_output().expect("output");
            return (status, String::from_utf8_lossy(&output.stderr).to_string());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("a second `shale run` on a data dir in use did not exit");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn generation(client: &reqwest::Client, base: &str) -> u64 {
    let cluster: Value = client
        .get(format!("{base}/api/v1/cluster"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    cluster["self_generation"].as_u64().expect("generation")
}

async fn count(client: &reqwest::Client, base: &str) -> u64 {
    let resp: Value = client
        .get(format!("{base}/api/v1/ddir/search?query=*&max_hits=0"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    resp["num_hits"].as_u64().expect("num_hits")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_on_a_data_dir_in_use_exits_and_leaves_the_first_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    let port = shale_testkit::free_port();
    let client = reqwest::Client::new();
    let first = start_node(
        port,
        &[
            OsString::from("--data-dir"),
            data_dir.clone().into_os_string(),
        ],
    );
    wait_ready(&client, &first.base).await;
    let created = client
        .post(format!("{}/api/v1/indexes", first.base))
        .body(common::kill_test_index("ddir", ""))
        .send()
        .await
        .unwrap();
    assert!(
        created.status().is_success(),
        "{}",
        created.text().await.unwrap_or_default()
    );
    let docs: String = (0..10)
        .map(|i| {
            format!(
                "{}\n",
                json!({"ts": 1_700_000_000 + i, "doc_id": format!("d{i}"), "body": "x"})
            )
        })
        .collect();
    let ingested = client
        .post(format!("{}/api/v1/ddir/ingest?commit=force", first.base))
        .body(docs.clone())
        .send()
        .await
        .unwrap();
    assert!(ingested.status().is_success());
    let generation_before = generation(&client, &first.base).await;

    // On another port, then on the same port: refused by the lock, before anything else.
    for second_port in [shale_testkit::free_port(), port] {
        let (status, stderr) = second_run(&data_dir, second_port);
        assert!(!status.success(), "the second node must fail: {stderr}");
        assert!(
            stderr.contains("is in use by process"),
            "the error names the holder: {stderr}"
        );
        assert!(
            !stderr.contains("cannot listen"),
            "the lock is checked before the port: {stderr}"
        );
    }

    // The first node is untouched: same incarnation, same documents, still ingesting.
    assert_eq!(generation(&client, &first.base).await, generation_before);
    assert_eq!(count(&client, &first.base).await, 10);
    let ingested = client
        .post(format!("{}/api/v1/ddir/ingest?commit=force", first.base))
        .body(docs)
        .send()
        .await
        .unwrap();
    assert!(ingested.status().is_success());
    assert_eq!(count(&client, &first.base).await, 20);
}

/// A node whose port is taken exits without registering: it never fences out the node
/// that serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_listen_never_registers() {
    let tmp = tempfile::tempdir().unwrap();
    let port = shale_testkit::free_port();
    let client = reqwest::Client::new();
    let metastore = format!("sqlite://{}/shared.db", tmp.path().display());
    let first = start_node(
        port,
        &[
            OsString::from("--data-dir"),
            tmp.path().join("a").into_os_string(),
            OsString::from("--metastore-uri"),
            OsString::from(&metastore),
            OsString::from("--node-id"),
            OsString::from("n1"),
        ],
    );
    wait_ready(&client, &first.base).await;
    let generation_before = generation(&client, &first.base).await;
    // Same node id, another data dir, the same (taken) port.
    let output = Command::new(env!("CARGO_BIN_EXE_shale"))
        .args([
            "run",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--node-id",
            "n1",
        ])
        .arg("--data-dir")
        .arg(tmp.path().join("b"))
        .args(["--metastore-uri", &metastore])
        .env("SHALE_LOG", "warn")
        .output()
        .expect("run");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot listen"), "{stderr}");
    assert_eq!(generation(&client, &first.base).await, generation_before);
    // Still a live node: its heartbeats are not refused.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(generation(&client, &first.base).await, generation_before);
    let ready = client
        .get(format!("{}/health/readyz", first.base))
        .send()
        .await
        .unwrap();
    assert!(ready.status().is_success());
}
