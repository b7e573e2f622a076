//! `shale simulate`, run as a user would: the seed example of issue 3 through the binary, and
//! its output files.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn shale(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shale"))
        .args(args)
        .current_dir(dir)
        .env("SHALE_LOG", "warn")
        .output()
        .expect("run shale")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
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

#[test]
fn simulate_models_keys_and_buckets_with_the_locality_policy() {
    let dir = tempfile::tempdir().unwrap();
    let run = |late: &str, out: &str| {
        let output = shale(
            &[
                "simulate",
                "--policy",
                "locality",
                "--nodes",
                "2",
                "--ticks",
                "400",
                "--tick-secs",
                "10",
                "--docs-per-split",
                "1000",
                "--keys",
                "5000",
                "--key-skew",
                "1.1",
                "--late-fraction",
                late,
                "--out",
                out,
            ],
            dir.path(),
        );
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let summary: Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(out).join("summary.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(summary["policy"], "locality");
        summary
    };
    // Without late data every closed bucket ends as one split (its documents are far below
    // the 5 M target), which a single-key query opens alone.
    let on_time = run("0", "on-time");
    assert_eq!(on_time["splits_per_closed_bucket"], 1.0);
    assert_eq!(on_time["key_query_splits_per_bucket"], 1.0);
    assert!(on_time["write_amplification"].as_f64().unwrap() <= 4.0);
    assert!(on_time["max_merge_ops"].as_u64().unwrap() <= 4);
    // With late data, buckets still receiving it hold size-tiered fresh splits too; no
    // document goes through more than max_merge_ops merges.
    let late = run("0.05", "late");
    assert!(late["max_merge_ops"].as_u64().unwrap() <= 4);
    assert!(
        late["key_query_splits_per_bucket"].as_f64().unwrap()
            <= late["splits_per_closed_bucket"].as_f64().unwrap()
    );
    let csv = std::fs::read_to_string(dir.path().join("late/series.csv")).unwrap();
    assert_eq!(csv.lines().count(), 401);
    assert!(csv.starts_with("tick,timestamp,total_splits,level0_splits,"));
}

/// `--signal metrics`: node-local scope leaves a series in every node's splits of a bucket,
/// cluster scope gathers it into one; with churn, new series keep the same picture.
#[test]
fn simulate_metrics_compares_node_local_and_cluster_scopes() {
    let dir = tempfile::tempdir().unwrap();
    let output = shale(
        &[
            "simulate",
            "--signal",
            "metrics",
            "--nodes",
            "3",
            "--series",
            "2000",
            "--scrape-interval-secs",
            "10",
            "--tick-secs",
            "30",
            "--ticks",
            "300",
            "--churn-per-hour",
            "0.2",
            "--out",
            "metrics",
        ],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let summary: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("metrics/summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["signal"], "metrics");
    let runs = summary["runs"].as_array().unwrap();
    let by_scope = |scope: &str| {
        runs.iter()
            .find(|run| run["scope"] == scope)
            .unwrap_or_else(|| panic!("no {scope} run: {summary}"))
    };
    // Every node's split of a closed bucket holds the series: one per node.
    assert_eq!(by_scope("node_local")["key_query_splits_per_bucket"], 3.0);
    assert_eq!(by_scope("cluster")["key_query_splits_per_bucket"], 1.0);
    assert!(
        by_scope("cluster")["last_hour_key_query_splits"]
            .as_f64()
            .unwrap()
            < by_scope("node_local")["last_hour_key_query_splits"]
                .as_f64()
                .unwrap()
    );
    let table = stdout(&output);
    assert!(
        table.contains("node_local") && table.contains("cluster"),
        "{table}"
    );
}
