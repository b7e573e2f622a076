//! `shale plan`, run as a user would: the binary on fixture files (and on a stand-in for a
//! node's REST API), with exact stdout and exit codes.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{json, Value};

fn shale(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shale"))
        .args(args)
        .current_dir(dir)
        .env("SHALE_LOG", "warn")
        .output()
        .expect("run shale")
}

fn write(dir: &Path, name: &str, content: &str) {
    std::fs::write(dir.join(name), content).expect("write fixture");
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `count` splits of `docs` documents, `{prefix}-{i}` covering minute `i`, created at `now`.
fn splits(prefix: &str, count: usize, docs: u64, now: i64) -> Vec<Value> {
    (0..count)
        .map(|i| {
            json!({
                "split_id": format!("{prefix}-{i:02}"),
                "num_docs": docs,
                "create_timestamp": now,
                "time_range_start": 1_000 + 60 * i as i64,
                "time_range_end": 1_059 + 60 * i as i64,
            })
        })
        .collect()
}

const NOW: &str = "1700000000";

#[test]
fn plan_prints_the_policys_operations() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "policy.yaml",
        "merge_policy:\n  type: stable_log\n  merge_factor: 10\n  max_merge_factor: 12\nsplit_num_docs_target: 10000000\n",
    );
    // 13 splits of one level: one merge of 12, built backwards from the oldest; the newest
    // split (latest time range end) is left over.
    let input = Value::Array(splits("s", 13, 100_000, 1_700_000_000));
    write(dir.path(), "splits.json", &input.to_string());
    let args = [
        "plan",
        "--policy",
        "policy.yaml",
        "--splits",
        "splits.json",
        "--now",
        NOW,
    ];
    let output = shale(&args, dir.path());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        r#"{"operations":[{"split_ids":["s-11","s-10","s-09","s-08","s-07","s-06","s-05","s-04","s-03","s-02","s-01","s-00"]}]}"#
            .to_string()
            + "\n"
    );
    // Past the maturation period (48 h), every split is mature: nothing to do.
    let later = (1_700_000_000 + 48 * 3600).to_string();
    let args = [
        "plan",
        "--policy",
        "policy.yaml",
        "--splits",
        "splits.json",
        "--now",
        &later,
    ];
    let output = shale(&args, dir.path());
    assert_eq!(stdout(&output), "{\"operations\":[]}\n");
}

#[test]
fn plan_groups_by_scope_and_keeps_the_policys_order() {
    let dir = tempfile::tempdir().unwrap();
    // Nested under indexing_settings, as in an index config.
    write(
        dir.path(),
        "index.yaml",
        "index_id: logs\nindexing_settings:\n  split_num_docs_target: 1000\n  merge_policy:\n    type: stable_log\n    merge_factor: 3\n    max_merge_factor: 4\n    min_level_num_docs: 10\n",
    );
    let mut input = Vec::new();
    for node in ["b", "a"] {
        for mut split in splits(node, 5, 10, 1_700_000_000) {
            split["node_id"] = json!(node);
            input.push(split);
        }
    }
    // A split with an explicit maturity and one without a time range.
    input.push(
        json!({"split_id": "m", "num_docs": 10, "create_timestamp": 1_700_000_000,
                      "node_id": "a", "maturity": {"type": "mature"}}),
    );
    input.push(
        json!({"split_id": "z", "num_docs": 1, "create_timestamp": 1_700_000_000,
                      "node_id": "a",
                      "maturity": {"type": "immature", "maturation_period_secs": 60}}),
    );
    write(dir.path(), "splits.json", &Value::Array(input).to_string());
    // Cluster scope: one scope, 11 immature splits; level order newest first, `a` before `b`
    // on ties; one operation of 4 built backwards; the split without time range sorts last.
    let base = [
        "plan",
        "--policy",
        "index.yaml",
        "--splits",
        "splits.json",
        "--now",
        NOW,
    ];
    let output = shale(&base, dir.path());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "{\"operations\":[{\"split_ids\":[\"b-01\",\"a-00\",\"b-00\",\"z\"]}]}\n"
    );
    // node_local: scope `a` (with `m` mature and `z`) then scope `b`.
    let mut args = base.to_vec();
    args.extend(["--scope", "node_local"]);
    let output = shale(&args, dir.path());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        concat!(
            r#"{"operations":[{"split_ids":["a-02","a-01","a-00","z"]},"#,
            r#"{"split_ids":["b-03","b-02","b-01","b-00"]}]}"#,
            "\n"
        )
    );
}

#[test]
fn plan_rejects_bad_input_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "policy.yaml",
        "merge_policy:\n  type: stable_log\n",
    );
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "splits.json",
            json!([{"split_id": "a", "num_docs": 1, "create_timestamp": 1},
                   {"split_id": "b", "num_docs": 1, "create_timestamp": 1},
                   {"split_id": "c", "num_docs": 1, "create_timestamp": 1},
                   {"split_id": "d", "num_docs": -5, "create_timestamp": 1}]),
            "splits[3].num_docs: expected an unsigned integer",
        ),
        (
            "splits.json",
            json!([{"split_id": "a", "create_timestamp": 1}]),
            "splits[0].num_docs: missing",
        ),
        (
            "splits.json",
            json!([{"split_id": "a", "num_docs": 1, "create_timestamp": "yesterday"}]),
            "splits[0].create_timestamp: expected an integer",
        ),
        (
            "splits.json",
            json!([{"split_id": "a", "num_docs": 1, "create_timestamp": 1, "time_range_end": 3}]),
            "splits[0].time_range_start: missing",
        ),
        (
            "splits.json",
            json!([{"split_id": "a", "num_docs": 1, "create_timestamp": 1,
                    "maturity": {"type": "ripe"}}]),
            "splits[0].maturity.type: unknown maturity `ripe`",
        ),
        (
            "splits.json",
            json!([{"split_id": "a", "num_docs": 1, "create_timestamp": 1, "num_doc": 3}]),
            "splits[0].num_doc: unknown field",
        ),
        (
            "splits.json",
            json!([{"split_id": "a", "num_docs": 1, "create_timestamp": 1},
                   {"split_id": "a", "num_docs": 1, "create_timestamp": 1}]),
            "splits[1].split_id: duplicate id `a` (also splits[0])",
        ),
        (
            "splits.json",
            json!({"splits": []}),
            "splits: expected a JSON array",
        ),
    ];
    for (name, content, expected) in cases {
        write(dir.path(), name, &content.to_string());
        let output = shale(
            &[
                "plan",
                "--policy",
                "policy.yaml",
                "--splits",
                name,
                "--now",
                NOW,
            ],
            dir.path(),
        );
        assert_eq!(
            output.status.code(),
            Some(2),
            "{content}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(expected),
            "{expected}: {}",
            stderr(&output)
        );
        assert_eq!(stdout(&output), "");
    }
    write(dir.path(), "splits.json", "[{\"split_id\": ");
    let output = shale(&["plan", "--splits", "splits.json"], dir.path());
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("splits.json: not valid JSON"),
        "{}",
        stderr(&output)
    );

    write(dir.path(), "splits.json", "[]");
    let policies = [
        ("merge_policy:\n  type: stable_log\n  merge_factor: ten\n", "merge_policy.merge_factor: expected an unsigned integer"),
        ("merge_policy:\n  type: tiered\n", "merge_policy.type: unknown merge policy `tiered`"),
        ("merge_policy:\n  type: stable_log\n  max_merge_ops: 3\n", "merge_policy.max_merge_ops: unknown key"),
        ("merge_policy:\n  type: stable_log\n  maturation_period: soon\n", "merge_policy.maturation_period"),
        ("split_num_docs_target: 0\n", "split_num_docs_target: expected an integer of at least 1"),
        ("indexing_settings:\n  merge_policy:\n    type: limit_merge\n    merge_factor: 5\n    max_merge_factor: 4\n", "indexing_settings.merge_policy.max_merge_factor: must be at least `merge_factor`"),
        ("merge_polcy:\n  type: stable_log\n", "merge_polcy: unknown key"),
    ];
    for (policy, expected) in policies {
        write(dir.path(), "bad.yaml", policy);
        let output = shale(
            &["plan", "--policy", "bad.yaml", "--splits", "splits.json"],
            dir.path(),
        );
        assert_eq!(
            output.status.code(),
            Some(2),
            "{policy}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(expected),
            "{expected}: {}",
            stderr(&output)
        );
    }
    let output = shale(
        &[
            "plan",
            "--policy",
            "missing.yaml",
            "--splits",
            "splits.json",
        ],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("cannot read missing.yaml"));
    // Usage errors (clap) also exit with 2.
    let output = shale(&["plan"], dir.path());
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn plan_limit_merge_and_no_merge() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "limit.yaml",
        "merge_policy:\n  type: limit_merge\n  merge_factor: 3\n  max_merge_factor: 3\n  max_merge_ops: 2\nsplit_num_docs_target: 1000000\n",
    );
    write(dir.path(), "none.yaml", "merge_policy:\n  type: no_merge\n");
    let mut input = Vec::new();
    for i in 0..7 {
        // Older first within a num_merge_ops group; splits made by 2 merges are mature.
        let ops = if i < 4 { 0 } else { 1 + i % 2 };
        input.push(json!({"split_id": format!("x{i}"), "num_docs": 10,
                          "create_timestamp": 1_700_000_000 - 10 * i, "num_merge_ops": ops}));
    }
    write(dir.path(), "splits.json", &Value::Array(input).to_string());
    let output = shale(
        &[
            "plan",
            "--policy",
            "limit.yaml",
            "--splits",
            "splits.json",
            "--now",
            NOW,
        ],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "{\"operations\":[{\"split_ids\":[\"x3\",\"x2\",\"x1\"]}]}\n"
    );
    let output = shale(
        &[
            "plan",
            "--policy",
            "none.yaml",
            "--splits",
            "splits.json",
            "--now",
            NOW,
        ],
        dir.path(),
    );
    assert_eq!(stdout(&output), "{\"operations\":[]}\n");
}

/// A one-shot HTTP server on loopback answering GETs by path with canned JSON, standing in for
/// a node's REST API.
fn serve_json(routes: Vec<(&'static str, Value)>) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(routes.len().max(1)) {
            let mut stream = stream.unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            reader.read_line(&mut request_line).unwrap();
            loop {
                let mut header = String::new();
                reader.read_line(&mut header).unwrap();
                if header.trim().is_empty() {
                    break;
                }
            }
            let path = request_line
                .split_whitespace()
                .nth(1)
                .unwrap_or("")
                .to_string();
            let (status, body) = match routes.iter().find(|(route, _)| *route == path) {
                Some((_, body)) => ("200 OK", body.to_string()),
                None => (
                    "404 Not Found",
                    json!({"message": "no such route"}).to_string(),
                ),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(response.as_bytes()).unwrap();
        }
    });
    format!("http://{address}")
}

#[test]
fn plan_over_a_live_index() {
    use shale_types::{IndexUid, Split, SplitMaturity, SplitMetadata, SplitState, TimeRange};
    let index_uid: IndexUid = "logs:01HZZZZZZZZZZZZZZZZZZZZZZZ".parse().unwrap();
    let split = |i: i64, node: &str| Split {
        split_state: SplitState::Published,
        update_timestamp: 1_700_000_000,
        publish_timestamp: Some(1_700_000_000),
        split_metadata: SplitMetadata {
            split_id: format!("{node}-{i}"),
            index_uid: index_uid.clone(),
            source_id: "_ingest-api-source".to_string(),
            node_id: node.to_string(),
            partition_id: 0,
            doc_mapping_uid: "01HZZZZZZZZZZZZZZZZZZZZZZZ".to_string(),
            num_docs: 100,
            size_bytes: 10_000,
            uncompressed_docs_size_bytes: 30_000,
            time_range: Some(TimeRange {
                start: 1_000 * i,
                end: 1_000 * i + 999,
            }),
            tags: Default::default(),
            create_timestamp: 1_700_000_000,
            maturity: SplitMaturity::Immature {
                maturation_period_secs: 3600,
            },
            num_merge_ops: 0,
            delete_opstamp: 0,
            footer_offsets: (9_000, 10_000),
            time_bucket_start: None,
            sort_key_min: None,
            sort_key_max: None,
            key_level: 0,
            sort_fields: None,
            tag_fields: None,
            format: Default::default(),
            num_series: None,
        },
    };
    let splits: Vec<Split> = (0..3)
        .map(|i| split(i, "n1"))
        .chain((0..2).map(|i| split(i, "n2")))
        .collect();
    let metadata = json!({
        "index_uid": index_uid.to_string(),
        "index_config": {
            "index_id": "logs",
            "indexing_settings": {
                "commit_timeout_secs": 60,
                "split_num_docs_target": 10_000_000,
                "merge_policy": {"type": "stable_log", "merge_factor": 3, "max_merge_factor": 3}
            }
        }
    });
    let listing = json!({"offset": 0, "size": splits.len(), "splits": splits});
    let routes = vec![
        ("/api/v1/indexes/logs", metadata),
        (
            "/api/v1/indexes/logs/splits?split_states=Published",
            listing,
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    // Cluster scope: the five splits are one scope; merge_factor 3 = max: the three oldest.
    let endpoint = serve_json(routes.clone());
    let args = [
        "plan",
        "--index",
        "logs",
        "--endpoint",
        &endpoint,
        "--now",
        NOW,
    ];
    let output = shale(&args, dir.path());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "{\"operations\":[{\"split_ids\":[\"n2-1\",\"n1-0\",\"n2-0\"]}]}\n"
    );
    // node_local: only n1 has three splits.
    let endpoint = serve_json(routes);
    let args = [
        "plan",
        "--index",
        "logs",
        "--endpoint",
        &endpoint,
        "--now",
        NOW,
        "--scope",
        "node_local",
    ];
    let output = shale(&args, dir.path());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "{\"operations\":[{\"split_ids\":[\"n1-2\",\"n1-1\",\"n1-0\"]}]}\n"
    );
    // An unknown index is the node's error, not bad input.
    let endpoint = serve_json(vec![]);
    let output = shale(
        &["plan", "--index", "nope", "--endpoint", &endpoint],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("404"), "{}", stderr(&output));
}

#[test]
fn plan_runs_the_locality_policy_on_keyed_splits() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "policy.yaml",
        "indexing_settings:\n  commit_timeout_secs: 2\n  merge_policy:\n    type: locality\n    sort_fields: [service]\n    time_bucket: 15m\n    max_merge_ops: 4\n",
    );
    let bucket: i64 = 1_699_999_200;
    let split = |id: &str, min: &str, max: &str, level: u8| {
        json!({
            "split_id": id, "num_docs": 1000, "create_timestamp": bucket + 900,
            "time_range_start": bucket, "time_range_end": bucket + 899,
            "time_bucket_start": bucket, "sort_key_min": min, "sort_key_max": max,
            "key_level": level, "num_merge_ops": level,
        })
    };
    // Two level-1 splits and a fresh split overlapping only the second.
    let input = json!([
        split("l1-a", "0161", "0168ff", 1),
        split("l1-b", "0170", "0178ff", 1),
        split("fresh", "017201", "017501", 0),
    ]);
    write(dir.path(), "splits.json", &input.to_string());
    let now = (bucket + 3600).to_string();
    let args = [
        "plan",
        "--policy",
        "policy.yaml",
        "--splits",
        "splits.json",
        "--now",
        &now,
    ];
    let output = shale(&args, dir.path());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "{\"operations\":[{\"kind\":\"locality\",\"split_ids\":[\"l1-b\",\"fresh\"]}]}\n"
    );
    // While the bucket is written (the clock right after its end), nothing to do.
    let early = (bucket + 901).to_string();
    let args = [
        "plan",
        "--policy",
        "policy.yaml",
        "--splits",
        "splits.json",
        "--now",
        &early,
    ];
    let output = shale(&args, dir.path());
    assert_eq!(stdout(&output), "{\"operations\":[]}\n");
    // A malformed key is named.
    let bad = json!([split("x", "zz", "01", 0)]);
    write(dir.path(), "bad.json", &bad.to_string());
    let args = [
        "plan",
        "--policy",
        "policy.yaml",
        "--splits",
        "bad.json",
        "--now",
        &now,
    ];
    let output = shale(&args, dir.path());
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("splits[0].sort_key_min"),
        "{}",
        stderr(&output)
    );
}

/// A metrics index config is a policy file: its `metrics` section implies the locality
/// policy (bucket, target, max merge ops), which plans its Parquet splits.
#[test]
fn plan_takes_a_metrics_index_config_and_its_splits() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "prom.yaml",
        "index_id: prom\nmetrics:\n  sort_labels: [job]\n  time_bucket: 15m\nindexing_settings:\n  commit_timeout_secs: 10\n",
    );
    let bucket: i64 = 1_699_999_200;
    let split = |id: &str, min: &str, max: &str| {
        json!({
            "split_id": id, "num_docs": 5000, "create_timestamp": bucket + 900,
            "time_range_start": bucket, "time_range_end": bucket + 899,
            "time_bucket_start": bucket, "sort_key_min": min, "sort_key_max": max,
            "key_level": 0, "num_merge_ops": 0, "node_id": id,
        })
    };
    // Three nodes' fresh splits of one closed bucket, each over the whole key space.
    let input = json!([
        split("node-a", "0161", "017a01"),
        split("node-b", "0162", "017901"),
        split("node-c", "0160", "017b01"),
    ]);
    write(dir.path(), "splits.json", &input.to_string());
    let now = (bucket + 3600).to_string();
    let plan = |scope: &str| {
        let output = shale(
            &[
                "plan",
                "--policy",
                "prom.yaml",
                "--splits",
                "splits.json",
                "--now",
                &now,
                "--scope",
                scope,
            ],
            dir.path(),
        );
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        serde_json::from_str::<serde_json::Value>(&stdout(&output)).unwrap()
    };
    // Cluster scope: one locality merge of the bucket's three splits.
    let cluster = plan("cluster");
    let ops = cluster["operations"].as_array().unwrap();
    assert_eq!(ops.len(), 1, "{cluster}");
    assert_eq!(ops[0]["kind"], "locality");
    assert_eq!(ops[0]["split_ids"].as_array().unwrap().len(), 3);
    // Node-local scope: each node's lone split has nothing to merge with, so it is rewritten
    // alone into level 1 (one locality operation each).
    assert_eq!(
        plan("node_local")["operations"],
        json!([
            {"kind": "locality", "split_ids": ["node-a"]},
            {"kind": "locality", "split_ids": ["node-b"]},
            {"kind": "locality", "split_ids": ["node-c"]},
        ])
    );
}
