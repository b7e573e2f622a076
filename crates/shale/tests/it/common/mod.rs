//! A `shale run` child process for the tests that kill and restart nodes.

#![allow(dead_code)]

pub mod cluster;

use std::ffi::OsString;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running `shale run`; killed (SIGKILL) and reaped when dropped.
pub struct NodeProcess {
    /// The process.
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `shale run --listen 127.0.0.1:PORT` plus `args`.
pub fn start_node(port: u16, args: &[OsString]) -> NodeProcess {
    let child = Command::new(env!("CARGO_BIN_EXE_shale"))
        .arg("run")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .args(args)
        .env("SHALE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn shale run");
    NodeProcess {
        child,
        base: format!("http://127.0.0.1:{port}"),
    }
}

/// Waits until the node answers `/health/readyz`.
pub async fn wait_ready(client: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(resp) = client.get(format!("{base}/health/readyz")).send().await {
            if resp.status().is_success() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("node did not become ready");
}

/// An index of `ts` (unix seconds), `doc_id` (raw) and `body`, committing every second, with
/// `merge_policy_yaml` (indented lines under `indexing_settings`, or empty).
pub fn kill_test_index(index_id: &str, merge_policy_yaml: &str) -> String {
    format!(
        "index_id: {index_id}
doc_mapping:
  field_mappings:
    - name: ts
      type: datetime
      input_formats: [unix_timestamp]
      fast: true
    - name: doc_id
      type: text
      tokenizer: raw
    - name: body
      type: text
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 1
{merge_policy_yaml}"
    )
}

/// How many times each `doc_id` of `index` is found, for documents with `ts` in
/// `[from_ts, to_ts)`: one query per second of `ts`, paged within Shale's limits (10 000
/// hits per page, offsets up to 10 000).
pub async fn doc_id_counts(
    client: &reqwest::Client,
    base: &str,
    index: &str,
    from_ts: i64,
    to_ts: i64,
) -> std::collections::HashMap<String, usize> {
    use serde_json::{json, Value};
    let mut seen = std::collections::HashMap::new();
    for ts in from_ts..to_ts {
        let mut offset = 0usize;
        loop {
            let resp: Value = client
                .post(format!("{base}/api/v1/{index}/search"))
                .json(&json!({
                    "query": "*",
                    "start_timestamp": ts,
                    "end_timestamp": ts + 1,
                    "max_hits": 10_000,
                    "start_offset": offset,
                    "sort_by": "ts",
                }))
                .send()
                .await
                .expect("search")
                .json()
                .await
                .expect("search response");
            let hits = resp["hits"].as_array().expect("hits");
            for hit in hits {
                *seen
                    .entry(hit["doc_id"].as_str().expect("doc_id").to_string())
                    .or_default() += 1;
            }
            let total = resp["num_hits"].as_u64().expect("num_hits") as usize;
            offset += hits.len();
            if hits.is_empty() || offset >= total {
                break;
            }
            assert!(offset <= 10_000, "more than 20 000 documents in one second");
        }
    }
    seen
}

/// The CLI run with `args` against the node at `endpoint` (`SHALE_ENDPOINT`).
pub fn cli(args: &[&str], endpoint: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shale"))
        .args(args)
        .env("SHALE_ENDPOINT", endpoint)
        .output()
        .expect("run shale")
}

/// The standard output of a command that must have succeeded.
pub fn succeeded(output: &Output) -> String {
    assert!(
        output.status.success(),
        "command failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).to_string()
}
