//! The `shale` CLI against a `shale run` node started with no flag but the data dir and port:
//! index create/list/describe, ingest from a file (with rejected lines summarized), search,
//! delete (and its list), compact --wait, splits list, index delete, and a clear error for a
//! bad config.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn shale(args: &[&str], endpoint: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shale"))
        .args(args)
        .env("SHALE_ENDPOINT", endpoint)
        .output()
        .expect("run shale")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "command failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).to_string()
}

#[test]
fn cli_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let port = shale_testkit::free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let _node = Node(
        Command::new(env!("CARGO_BIN_EXE_shale"))
            .arg("run")
            .env("SHALE_DATA_DIR", tmp.path().join("data"))
            .env("SHALE_LISTEN", format!("127.0.0.1:{port}"))
            .env("SHALE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "node did not start");
        std::thread::sleep(Duration::from_millis(50));
    }

    let config = tmp.path().join("index.yaml");
    std::fs::write(
        &config,
        "index_id: cli-logs\ndoc_mapping:\n  field_mappings:\n    - name: ts\n      type: datetime\n      fast: true\n    - name: msg\n      type: text\n  timestamp_field: ts\n",
    )
    .unwrap();
    let out = stdout(&shale(
        &[
            "index",
            "create",
            "--index-config",
            config.to_str().unwrap(),
        ],
        &endpoint,
    ));
    assert!(out.contains("created index `cli-logs`"), "{out}");
    assert!(stdout(&shale(&["index", "list"], &endpoint)).contains("cli-logs"));

    let input = tmp.path().join("docs.ndjson");
    let mut docs = String::new();
    for i in 0..2500 {
        docs.push_str(&format!(
            "{{\"ts\": {}, \"msg\": \"hello number {i}\"}}\n",
            1_700_000_000 + i
        ));
    }
    docs.push_str("{broken\n{\"msg\": \"no timestamp\"}\n");
    std::fs::write(&input, docs).unwrap();
    let out = stdout(&shale(
        &[
            "ingest",
            "--index",
            "cli-logs",
            "--input",
            input.to_str().unwrap(),
            "--batch-bytes",
            "20000",
        ],
        &endpoint,
    ));
    assert!(out.contains("ingested 2500 documents"), "{out}");
    assert!(out.contains("2 rejected"), "{out}");
    assert!(
        out.contains("invalid_json") && out.contains("invalid_timestamp"),
        "{out}"
    );

    let out = stdout(&shale(
        &[
            "search",
            "--index",
            "cli-logs",
            "--query",
            "msg:\"number 42\"",
            "--max-hits",
            "1",
        ],
        &endpoint,
    ));
    let resp: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(resp["num_hits"], 1);
    assert_eq!(resp["hits"][0]["msg"], "hello number 42");

    let out = stdout(&shale(
        &["splits", "list", "--index", "cli-logs"],
        &endpoint,
    ));
    assert!(
        out.contains("SPLIT ID") && out.contains("Published"),
        "{out}"
    );
    let out = stdout(&shale(
        &["index", "describe", "--index", "cli-logs"],
        &endpoint,
    ));
    assert!(out.contains("documents:        2500"), "{out}");

    // Deletes: the task is printed, searches miss the documents at once, `--list` lists it.
    let out = stdout(&shale(
        &[
            "delete",
            "--index",
            "cli-logs",
            "--query",
            "msg:\"number 42\"",
        ],
        &endpoint,
    ));
    let task: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(task["opstamp"], 1, "{out}");
    let out = stdout(&shale(
        &[
            "search",
            "--index",
            "cli-logs",
            "--query",
            "msg:\"number 42\"",
        ],
        &endpoint,
    ));
    let resp: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(resp["num_hits"], 0);
    let out = stdout(&shale(
        &["delete", "--index", "cli-logs", "--list"],
        &endpoint,
    ));
    let tasks: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(tasks.as_array().unwrap().len(), 1);
    let out = shale(
        &["delete", "--index", "cli-logs", "--query", "msg:("],
        &endpoint,
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("400"));
    // A manual compaction, waited for: every pending delete applied.
    let out = stdout(&shale(
        &["compact", "--index", "cli-logs", "--force", "--wait"],
        &endpoint,
    ));
    let done: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(done["state"], "completed", "{out}");
    assert_eq!(done["plan"]["failed"], 0, "{out}");
    let out = stdout(&shale(
        &["index", "describe", "--index", "cli-logs"],
        &endpoint,
    ));
    assert!(out.contains("documents:        2499"), "{out}");

    // A locality index: splits list shows each split's bucket, key level and key range.
    let sorted = tmp.path().join("sorted.yaml");
    std::fs::write(
        &sorted,
        "index_id: cli-sorted\ndoc_mapping:\n  field_mappings:\n    - {name: ts, type: datetime, fast: true}\n    - {name: service, type: text, tokenizer: raw, fast: true}\n  timestamp_field: ts\nindexing_settings:\n  merge_policy: {type: locality, sort_fields: [service], time_bucket: 15m}\n",
    )
    .unwrap();
    shale(
        &[
            "index",
            "create",
            "--index-config",
            sorted.to_str().unwrap(),
        ],
        &endpoint,
    );
    let docs: String = ["web", "api", "db"]
        .iter()
        .map(|service| format!("{{\"ts\": 1700000000, \"service\": \"{service}\"}}\n"))
        .collect();
    let input = tmp.path().join("sorted.ndjson");
    std::fs::write(&input, docs).unwrap();
    let out = stdout(&shale(
        &[
            "ingest",
            "--index",
            "cli-sorted",
            "--input",
            input.to_str().unwrap(),
        ],
        &endpoint,
    ));
    assert!(out.contains("ingested 3 documents"), "{out}");
    let out = stdout(&shale(
        &["splits", "list", "--index", "cli-sorted"],
        &endpoint,
    ));
    assert!(out.contains("BUCKET") && out.contains("KEY RANGE"), "{out}");
    assert!(out.contains("2023-11-14T22:00:00Z"), "the bucket: {out}");
    assert!(out.contains("api .. web"), "the key range: {out}");

    let bad = tmp.path().join("bad.yaml");
    std::fs::write(&bad, "index_id: x\ndoc_mapping: {}\n").unwrap();
    let out = shale(
        &["index", "create", "--index-config", bad.to_str().unwrap()],
        &endpoint,
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("index_id"));

    let out = stdout(&shale(
        &["index", "delete", "--index", "cli-logs"],
        &endpoint,
    ));
    assert!(out.contains("deleted index `cli-logs`"), "{out}");
    let out = shale(&["search", "--index", "cli-logs"], &endpoint);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("404"));
}

#[test]
fn the_cli_presents_the_api_token() {
    let tmp = tempfile::tempdir().unwrap();
    let port = shale_testkit::free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let _node = Node(
        Command::new(env!("CARGO_BIN_EXE_shale"))
            .args(["run", "--api-token", "cli-token-123"])
            .env("SHALE_DATA_DIR", tmp.path().join("data"))
            .env("SHALE_LISTEN", format!("127.0.0.1:{port}"))
            .env("SHALE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "node did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = shale(&["index", "list"], &endpoint);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
    let out = Command::new(env!("CARGO_BIN_EXE_shale"))
        .args(["index", "list"])
        .env("SHALE_ENDPOINT", &endpoint)
        .env("SHALE_API_TOKEN", "cli-token-123")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
