//! `shale plan` and `shale simulate`, run as a user would: the binary on fixture files, with
//! exact stdout and exit codes.

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

#[test]
fn simulate_reproduces_the_seed_example() {
    let dir = tempfile::tempdir().unwrap();
    let output = shale(
        &[
            "simulate",
            "--nodes",
            "3",
            "--ticks",
            "13",
            "--plan-every",
            "13",
            "--docs-per-split",
            "100000",
            "--scope",
            "node_local",
            "--out",
            "sim",
        ],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let summary: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("sim/summary.json")).unwrap())
            .unwrap();
    // Per node: one merge of 12 splits (1.2 M docs) and one split left over.
    assert_eq!(summary["final_splits"], 6);
    assert_eq!(summary["merges"], 3);
    assert_eq!(summary["bytes_written_by_merges"], 3 * 1_200_000 * 300);
    assert_eq!(summary["max_splits"], 39);
    assert_eq!(summary["orphaned_splits"], 0);
    assert_eq!(summary["scope"], "node_local");
    assert_eq!(summary["policy"], "stable_log");
    let printed: Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(printed, summary);
    let csv = std::fs::read_to_string(dir.path().join("sim/series.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 14);
    assert!(lines[0].starts_with("tick,timestamp,total_splits,immature_splits,orphaned_splits"));
    assert!(
        lines[13].starts_with("12,1767226380,6,6,0,0,6,3,1080000000,"),
        "{}",
        lines[13]
    );
    let png = std::fs::read(dir.path().join("sim/plot.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");

    let output = shale(&["simulate", "--nodes", "0", "--ticks", "3"], dir.path());
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("--nodes: must be at least 1"),
        "{}",
        stderr(&output)
    );
}
