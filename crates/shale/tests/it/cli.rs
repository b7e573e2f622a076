//! The `shale` CLI against a `shale run` node started with no flag but the data dir and port:
//! index create/list/describe, ingest from a file (with rejected lines summarized, and a
//! failure unless `--allow-rejected`), search, delete (and its list), compact --wait, splits
//! list, cluster members, index delete, and a clear error for a bad config. And `shale run`'s
//! logs: a one-line startup summary, no colour codes off a terminal, JSON lines on request.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{cli as shale, succeeded as stdout, NodeProcess};

/// A node of these tests (killed when dropped).
fn node(child: Child) -> NodeProcess {
    NodeProcess {
        child,
        base: String::new(),
    }
}

#[test]
fn cli_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let port = shale_testkit::free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let _node = node(
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
    let uid = out
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(uid, _)| uid.to_string())
        .unwrap_or_else(|| panic!("no uid in {out}"));
    // The list: one header, then each index's id and uid under it.
    let out = stdout(&shale(&["index", "list"], &endpoint));
    let header = out.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("INDEX ID") && header.ends_with("INDEX UID"),
        "{out}"
    );
    let row = out
        .lines()
        .find(|line| line.starts_with("cli-logs "))
        .unwrap_or_else(|| panic!("no cli-logs row in {out}"));
    assert_eq!(row.find(&uid), header.find("INDEX UID"), "{out}");
    assert!(row.ends_with(&uid), "{out}");

    let input = tmp.path().join("docs.ndjson");
    let mut docs = String::new();
    for i in 0..2500 {
        docs.push_str(&format!(
            "{{\"ts\": {}, \"msg\": \"hello number {i}\"}}\n",
            1_700_000_000 + i
        ));
    }
    let broken = "{broken\n{\"msg\": \"no timestamp\"}\n";
    docs.push_str(broken);
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
            "--allow-rejected",
        ],
        &endpoint,
    ));
    // The summary on a line of its own, nothing glued to it.
    assert!(
        out.lines()
            .any(|line| line.starts_with("ingested 2500 documents in ")
                && line.ends_with(", 2 rejected")),
        "{out}"
    );
    assert!(
        out.contains("invalid_json") && out.contains("invalid_timestamp"),
        "{out}"
    );
    // Without --allow-rejected, rejections fail the command, after the same summary.
    let rejected = tmp.path().join("rejected.ndjson");
    std::fs::write(&rejected, broken).unwrap();
    let output = shale(
        &[
            "ingest",
            "--index",
            "cli-logs",
            "--input",
            rejected.to_str().unwrap(),
        ],
        &endpoint,
    );
    let out = String::from_utf8_lossy(&output.stdout);
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{out}{err}");
    assert!(
        out.lines()
            .any(|line| line.starts_with("ingested 0 documents in ")
                && line.ends_with(", 2 rejected")),
        "{out}"
    );
    assert!(
        err.contains("rejected 2 document(s)") && err.contains("--allow-rejected"),
        "{err}"
    );
    // An empty file: nothing to do, nothing rejected.
    let empty = tmp.path().join("empty.ndjson");
    std::fs::write(&empty, "").unwrap();
    let out = stdout(&shale(
        &[
            "ingest",
            "--index",
            "cli-logs",
            "--input",
            empty.to_str().unwrap(),
        ],
        &endpoint,
    ));
    assert!(out.starts_with("ingested 0 documents in "), "{out}");
    assert!(out.trim_end().ends_with(", 0 rejected"), "{out}");

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
    // The node's heartbeat age, in a column of its own.
    let out = stdout(&shale(&["cluster", "members"], &endpoint));
    let header = out
        .lines()
        .find(|line| line.starts_with("NODE"))
        .unwrap_or_else(|| panic!("no header in {out}"));
    assert!(header.ends_with("LAST HEARTBEAT"), "{out}");
    let row = out.lines().last().unwrap_or_default();
    assert!(row.ends_with(" ms ago") && row.contains(" live "), "{out}");
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
    let _node = node(
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

/// Runs `shale run` (node `log-node` of cluster `log-cluster`) with `log_format` as
/// `SHALE_LOG_FORMAT` until it serves, stops it with SIGTERM, and returns its stderr as
/// written to a file, with the paths and ports it was given.
async fn run_node_logs(log_format: &str) -> (String, std::path::PathBuf, u16, u16) {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    let (port, grpc_port) = (shale_testkit::free_port(), shale_testkit::free_port());
    let log_path = tmp.path().join("stderr.log");
    let child = Command::new(env!("CARGO_BIN_EXE_shale"))
        .args([
            "run",
            "--node-id",
            "log-node",
            "--cluster-id",
            "log-cluster",
        ])
        .args(["--roles", "indexer,searcher", "--data-dir"])
        .arg(&data_dir)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--grpc-listen")
        .arg(format!("127.0.0.1:{grpc_port}"))
        .env("SHALE_LOG", "info")
        .env("SHALE_LOG_FORMAT", log_format)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let mut node = crate::common::NodeProcess {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    let client = reqwest::Client::new();
    crate::common::wait_ready(&client, &node.base).await;
    // A graceful stop, so that the shutdown is logged too.
    let status = Command::new("kill")
        .args(["-TERM", &node.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    while node.child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the node did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(&log_path).unwrap();
    // The directory goes with `tmp`: return the path for the assertions only.
    (log, data_dir, port, grpc_port)
}

#[tokio::test]
async fn shale_run_logs_a_plain_startup_summary_and_json_lines_on_request() {
    // Text (the default) to a file: no colour codes, and one summary line to start with.
    let (log, data_dir, port, grpc_port) = run_node_logs("text").await;
    assert!(!log.contains("\x1b["), "colour codes in a file:\n{log}");
    let starting: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("starting node"))
        .collect();
    assert_eq!(starting.len(), 1, "{log}");
    let data_dir = data_dir.display();
    for field in [
        format!("listen=127.0.0.1:{port}"),
        format!("grpc=127.0.0.1:{grpc_port}"),
        format!("data_dir={data_dir}"),
        format!("metastore=sqlite://{data_dir}/metastore.db"),
        format!("storage=file://{data_dir}/indexes"),
        "node_id=log-node".to_string(),
        "cluster_id=log-cluster".to_string(),
        "roles=indexer,searcher".to_string(),
    ] {
        assert!(starting[0].contains(&field), "no {field}: {}", starting[0]);
    }
    // Not a dump of the whole config.
    assert!(
        !starting[0].contains("NodeConfig") && !starting[0].contains("max_ingest_body_bytes"),
        "{}",
        starting[0]
    );
    assert!(log.contains("node stopped"), "{log}");

    // JSON: every line is a JSON object; the summary's fields are fields of its own.
    let (log, data_dir, port, _) = run_node_logs("json").await;
    let events: Vec<serde_json::Value> = log
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|err| panic!("not JSON ({err}): {line}"))
        })
        .collect();
    assert!(events.len() > 3, "{log}");
    for event in &events {
        assert!(
            event["timestamp"].is_string() && event["level"].is_string(),
            "{event}"
        );
    }
    let summary = events
        .iter()
        .find(|event| event["fields"]["message"] == "starting node")
        .unwrap_or_else(|| panic!("no startup summary in {log}"));
    let fields = &summary["fields"];
    assert_eq!(fields["listen"], format!("127.0.0.1:{port}"), "{summary}");
    assert_eq!(
        fields["metastore"],
        format!("sqlite://{}/metastore.db", data_dir.display()),
        "{summary}"
    );
    assert_eq!(fields["node_id"], "log-node", "{summary}");
    assert_eq!(fields["cluster_id"], "log-cluster", "{summary}");
    assert_eq!(fields["roles"], "indexer,searcher", "{summary}");
    assert!(
        events
            .iter()
            .any(|event| event["fields"]["message"] == "WAL persisted; node stopped"),
        "{log}"
    );

    // A failure to start is a JSON line too.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_shale"))
        .arg("run")
        .arg("--data-dir")
        .arg(tmp.path())
        .arg("--listen")
        .arg(taken.local_addr().unwrap().to_string())
        .env("SHALE_LOG", "info")
        .env("SHALE_LOG_FORMAT", "json")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last: serde_json::Value = serde_json::from_str(stderr.lines().last().unwrap_or_default())
        .unwrap_or_else(|err| panic!("not JSON ({err}): {stderr}"));
    assert_eq!(last["level"], "ERROR", "{stderr}");
    assert!(
        last["fields"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("cannot listen on")),
        "{stderr}"
    );

    // Any other format: a clear error, whatever the command.
    let output = Command::new(env!("CARGO_BIN_EXE_shale"))
        .args(["index", "list", "--endpoint", "http://127.0.0.1:9"])
        .env("SHALE_LOG_FORMAT", "xml")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("SHALE_LOG_FORMAT")
            && stderr.contains("`xml`")
            && stderr.contains("text or json"),
        "{stderr}"
    );
}
