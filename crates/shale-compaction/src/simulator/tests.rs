//! Simulator tests: the seed example, churn in both scopes, and a cross-check of the engine
//! against a naive reference that re-plans every split through [`crate::policy::plan`].

use std::collections::HashSet;

use serde_json::json;

use super::*;
use crate::policy::{merge_policy_from_config, plan, MergeOperation, NoMergePolicy};

fn stable_log(target: u64) -> std::sync::Arc<dyn MergePolicy> {
    merge_policy_from_config(&json!({"type": "stable_log"}), target).expect("policy")
}

fn config(nodes: usize, ticks: u64) -> SimulationConfig {
    SimulationConfig {
        nodes,
        ticks,
        ..SimulationConfig::default()
    }
}

#[test]
fn seed_example_three_nodes_thirteen_ticks() {
    let config = SimulationConfig {
        nodes: 3,
        ticks: 13,
        plan_every: 13,
        docs_per_split: 100_000,
        node_local: true,
        ..SimulationConfig::default()
    };
    let report = simulate(&config, stable_log(10_000_000).as_ref()).unwrap();
    let summary = &report.summary;
    // Per node: one merge of 12 splits (1.2 M docs) and the newest split left over.
    assert_eq!(summary.final_splits, 6);
    assert_eq!(summary.merges, 3);
    assert_eq!(summary.bytes_written_by_merges, 3 * 1_200_000 * 300);
    assert_eq!(summary.max_splits, 39);
    assert_eq!(summary.max_immature_splits, 39);
    assert_eq!(summary.orphaned_splits, 0);
    assert_eq!(summary.final_immature_splits, 6);
    assert_eq!(report.series.len(), 13);
    assert_eq!(report.series[11].total_splits, 36);
    assert_eq!(report.series[12].merges, 3);
    // (39 × 30 MB + 3 × 360 MB) / (39 × 30 MB)
    assert!((summary.write_amplification - (1.0 + 36.0 / 39.0)).abs() < 1e-9);
    // Cluster scope: the 39 splits form one scope; three merges of 12 leave three splits.
    let cluster = SimulationConfig {
        node_local: false,
        ..config
    };
    let report = simulate(&cluster, stable_log(10_000_000).as_ref()).unwrap();
    assert_eq!(report.summary.final_splits, 6);
    assert_eq!(report.summary.merges, 3);
}

#[test]
fn no_merge_keeps_every_split() {
    let report = simulate(&config(4, 50), &NoMergePolicy).unwrap();
    assert_eq!(report.summary.final_splits, 200);
    assert_eq!(report.summary.merges, 0);
    assert_eq!(report.summary.write_amplification, 1.0);
    assert_eq!(report.summary.final_immature_splits, 0);
    // A query over the last hour opens the splits of the last 60 one-minute ticks.
    assert_eq!(report.summary.last_hour_splits, 4 * 50);
    let report = simulate(&config(4, 100), &NoMergePolicy).unwrap();
    assert_eq!(report.summary.last_hour_splits, 4 * 60);
}

#[test]
fn limit_merge_bounds_write_amplification() {
    let policy = merge_policy_from_config(
        &json!({"type": "limit_merge", "max_merge_ops": 2, "merge_factor": 3, "max_merge_factor": 3}),
        10_000_000,
    )
    .unwrap();
    let config = SimulationConfig {
        docs_per_split: 1_000,
        ..config(5, 600)
    };
    let report = simulate(&config, policy.as_ref()).unwrap();
    assert!(report.summary.merges > 0);
    assert!(report.summary.write_amplification <= 3.0 + 1e-9);
}

#[test]
fn splits_mature_after_the_maturation_period() {
    let policy = merge_policy_from_config(
        &json!({"type": "stable_log", "maturation_period": "10m"}),
        10_000_000,
    )
    .unwrap();
    let report = simulate(&config(2, 30), policy.as_ref()).unwrap();
    // Splits of the last 10 minutes (10 ticks of 60 s) at most are immature.
    for row in &report.series {
        assert!(row.immature_splits <= 2 * 10, "{row:?}");
    }
}

#[test]
fn same_seed_same_result() {
    let config = SimulationConfig {
        node_local: true,
        departures_per_day: 200.0,
        seed: 7,
        ..config(6, 1_000)
    };
    let policy = stable_log(10_000_000);
    let first = simulate(&config, policy.as_ref()).unwrap();
    let second = simulate(&config, policy.as_ref()).unwrap();
    assert_eq!(first, second);
    assert!(first.summary.departures >= 138);
}

#[test]
fn invalid_settings_are_named() {
    let policy = stable_log(10_000_000);
    let field = |config: SimulationConfig| match simulate(&config, policy.as_ref()) {
        Err(SimulationError::Invalid { field, .. }) => field,
        Ok(_) => "ok",
    };
    assert_eq!(field(config(0, 1)), "nodes");
    assert_eq!(field(config(1, 0)), "ticks");
    assert_eq!(
        field(SimulationConfig {
            plan_every: 0,
            ..config(1, 1)
        }),
        "plan_every"
    );
    assert_eq!(
        field(SimulationConfig {
            tick_secs: 0,
            ..config(1, 1)
        }),
        "tick_secs"
    );
    assert_eq!(
        field(SimulationConfig {
            departures_per_day: -1.0,
            ..config(1, 1)
        }),
        "departures_per_day"
    );
    assert_eq!(
        field(SimulationConfig {
            docs_per_split: 0,
            ..config(1, 1)
        }),
        "docs_per_split"
    );
}

#[test]
fn series_csv_has_a_header_and_a_line_per_tick() {
    let report = simulate(&config(2, 3), stable_log(10_000_000).as_ref()).unwrap();
    let csv = series_csv(&report.series);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 4);
    assert!(lines[0].starts_with("tick,timestamp,total_splits,immature_splits,orphaned_splits"));
    assert_eq!(lines[1], "0,1767225660,2,2,0,0,2,0,0,1.0000");
}

/// Churn over three simulated days: in `node_local` every departure strands the departed
/// node's immature splits for good; in `cluster` scope they keep merging.
#[test]
fn churn_orphans_splits_in_node_local_scope_only() {
    let policy = stable_log(10_000_000);
    let base = SimulationConfig {
        nodes: 20,
        ticks: 3 * 24 * 60,
        docs_per_split: 10_000,
        departures_per_day: 24.0,
        seed: 1,
        ..SimulationConfig::default()
    };
    let node_local = simulate(
        &SimulationConfig {
            node_local: true,
            ..base.clone()
        },
        policy.as_ref(),
    )
    .unwrap();
    let cluster = simulate(&base, policy.as_ref()).unwrap();
    assert_eq!(node_local.summary.departures, 72);
    assert_eq!(cluster.summary.departures, 72);
    fn day(report: &SimulationReport, day: usize) -> &TickStats {
        &report.series[day * 24 * 60 - 1]
    }
    // Orphans pile up with departures in node_local, day after day (those orphaned more than
    // 48 h ago have matured since, so the immature orphans level off); never in cluster scope.
    let orphans: Vec<u64> = (1..=3)
        .map(|d| day(&node_local, d).orphaned_splits)
        .collect();
    let orphaned: Vec<u64> = (1..=3)
        .map(|d| day(&node_local, d).orphaned_splits_total)
        .collect();
    assert!(orphans.iter().all(|&n| n > 100), "{orphans:?}");
    assert!(orphans[0] < orphans[1], "{orphans:?}");
    assert!(
        orphaned[0] < orphaned[1] && orphaned[1] < orphaned[2],
        "{orphaned:?}"
    );
    assert!(cluster
        .series
        .iter()
        .all(|row| row.orphaned_splits == 0 && row.orphaned_splits_total == 0));
    // node_local's split count grows with departures; cluster's stays within a bounded margin
    // of the data volume (every mature split there holds the 10 M docs target).
    let splits: Vec<u64> = (1..=3).map(|d| day(&node_local, d).total_splits).collect();
    let cluster_splits: Vec<u64> = (1..=3).map(|d| day(&cluster, d).total_splits).collect();
    assert!(splits[0] < splits[1] && splits[1] < splits[2], "{splits:?}");
    let docs_per_tick = base.nodes as u64 * base.docs_per_split;
    for row in &cluster.series {
        let minimum = (row.tick + 1) * docs_per_tick / 10_000_000;
        assert!(row.total_splits <= minimum + 50, "{row:?}");
        assert!(row.immature_splits < 50, "{row:?}");
    }
    let last = node_local.series.last().expect("series");
    assert!(last.total_splits > (last.tick + 1) * docs_per_tick / 10_000_000 + 500);
    assert!(node_local.summary.final_splits > 5 * cluster.summary.final_splits);
    assert!(node_local.summary.max_last_hour_splits > 5 * cluster.summary.max_last_hour_splits);
    println!(
        "node_local {:?}\ncluster {:?}",
        node_local.summary, cluster.summary
    );
    println!("splits by day: node_local {splits:?}, cluster {cluster_splits:?}");
}

// ---------------------------------------------------------------------------------------------
// Cross-check: the engine (scopes kept apart, only immature splits held, counters) against a
// naive reference that keeps every split and plans them all through `plan` each round.

fn reference(config: &SimulationConfig, policy: &dyn MergePolicy) -> Vec<TickStats> {
    let tick_secs = config.tick_secs as i64;
    let mut rng = SplitMix64::new(config.seed);
    let mut next_node = 0;
    let mut next_split = 0;
    let mut new_node = || {
        next_node += 1;
        simulated_node_id(next_node)
    };
    let mut nodes: Vec<String> = (0..config.nodes).map(|_| new_node()).collect();
    let mut departed: HashSet<String> = HashSet::new();
    let mut splits: Vec<SplitMetadata> = Vec::new();
    let mut credit = 0.0;
    let per_tick = config.departures_per_day * config.tick_secs as f64 / 86_400.0;
    let (mut ingested, mut merge_bytes, mut orphaned_total) = (0u64, 0u64, 0u64);
    let mut series = Vec::new();
    for tick in 0..config.ticks {
        let start = config.start_timestamp + tick as i64 * tick_secs;
        let now = start + tick_secs;
        credit += per_tick;
        while credit >= 1.0 {
            credit -= 1.0;
            let slot = rng.below(nodes.len() as u64) as usize;
            let replacement = new_node();
            let gone = std::mem::replace(&mut nodes[slot], replacement);
            if config.node_local {
                orphaned_total += splits
                    .iter()
                    .filter(|s| s.node_id == gone && !s.is_mature(now))
                    .count() as u64;
            }
            departed.insert(gone);
        }
        for node in &nodes {
            next_split += 1;
            let size = config.docs_per_split * config.bytes_per_doc;
            let mut split = simulated_split(
                simulated_split_id(next_split),
                node.clone(),
                config.docs_per_split,
                size,
                TimeRange {
                    start,
                    end: now - 1,
                },
                now,
            );
            split.maturity = policy.split_maturity(config.docs_per_split, 0);
            ingested += size;
            splits.push(split);
        }
        let mut merges = 0;
        let mut tick_bytes = 0;
        if (tick + 1).is_multiple_of(config.plan_every) {
            loop {
                let candidates: Vec<SplitMetadata> = splits
                    .iter()
                    .filter(|s| !policy.is_mature(s, now))
                    .filter(|s| !config.node_local || !departed.contains(&s.node_id))
                    .cloned()
                    .collect();
                let planned = plan(&candidates, policy, config.node_local, now);
                if planned.is_empty() {
                    break;
                }
                let operations: Vec<MergeOperation> =
                    planned.into_iter().flat_map(|(_, ops)| ops).collect();
                for op in operations {
                    let inputs: Vec<SplitMetadata> = op
                        .split_ids
                        .iter()
                        .map(|id| {
                            let pos = splits.iter().position(|s| &s.split_id == id).unwrap();
                            splits.remove(pos)
                        })
                        .collect();
                    next_split += 1;
                    let docs = inputs.iter().map(|s| s.num_docs).sum();
                    let bytes = inputs.iter().map(|s| s.size_bytes).sum();
                    let ops = inputs.iter().map(|s| s.num_merge_ops).max().unwrap() + 1;
                    let range = TimeRange {
                        start: inputs
                            .iter()
                            .map(|s| s.time_range.unwrap().start)
                            .min()
                            .unwrap(),
                        end: inputs
                            .iter()
                            .map(|s| s.time_range.unwrap().end)
                            .max()
                            .unwrap(),
                    };
                    let mut merged = simulated_split(
                        simulated_split_id(next_split),
                        inputs[0].node_id.clone(),
                        docs,
                        bytes,
                        range,
                        now,
                    );
                    merged.maturity = policy.split_maturity(docs, ops);
                    merged.num_merge_ops = ops;
                    splits.push(merged);
                    merges += 1;
                    tick_bytes += bytes;
                    merge_bytes += bytes;
                }
            }
        }
        let immature = |s: &&SplitMetadata| !s.is_mature(now);
        series.push(TickStats {
            tick,
            timestamp: now,
            total_splits: splits.len() as u64,
            immature_splits: splits.iter().filter(immature).count() as u64,
            orphaned_splits: splits
                .iter()
                .filter(immature)
                .filter(|s| config.node_local && departed.contains(&s.node_id))
                .count() as u64,
            orphaned_splits_total: orphaned_total,
            last_hour_splits: splits
                .iter()
                .filter(|s| s.time_range.unwrap().end >= now - 3600)
                .count() as u64,
            merges,
            merge_bytes_written: tick_bytes,
            write_amplification: (ingested + merge_bytes) as f64 / ingested as f64,
        });
    }
    series
}

#[test]
fn engine_matches_the_naive_reference() {
    let stable_small = merge_policy_from_config(
        &json!({"type": "stable_log", "maturation_period": "3h", "merge_factor": 3,
                "max_merge_factor": 5, "min_level_num_docs": 1000}),
        60_000,
    )
    .unwrap();
    let limit = merge_policy_from_config(
        &json!({"type": "limit_merge", "maturation_period": "2h", "merge_factor": 3,
                "max_merge_factor": 4, "max_merge_ops": 3}),
        50_000,
    )
    .unwrap();
    let default = stable_log(10_000_000);
    let policies: [&dyn MergePolicy; 3] = [stable_small.as_ref(), limit.as_ref(), default.as_ref()];
    for (p, policy) in policies.into_iter().enumerate() {
        for node_local in [false, true] {
            for (plan_every, departures, docs) in [(1, 100.0, 1_000), (7, 300.0, 700), (1, 0.0, 90)]
            {
                let config = SimulationConfig {
                    nodes: 4,
                    ticks: 400,
                    tick_secs: 60,
                    docs_per_split: docs,
                    plan_every,
                    node_local,
                    departures_per_day: departures,
                    seed: 11,
                    ..SimulationConfig::default()
                };
                let engine = simulate(&config, policy).unwrap();
                let expected = reference(&config, policy);
                for (got, want) in engine.series.iter().zip(&expected) {
                    assert_eq!(got, want, "policy {p}, {config:?}");
                }
            }
        }
    }
}

/// 1000 nodes × 7 simulated days in both scopes; run with
/// `cargo test --release -p shale-compaction -- --ignored --nocapture thousand`.
#[test]
#[ignore = "a benchmark: run in release mode"]
fn thousand_nodes_for_a_week() {
    let policy = stable_log(10_000_000);
    for node_local in [false, true] {
        let config = SimulationConfig {
            nodes: 1_000,
            ticks: 7 * 24 * 60,
            docs_per_split: 100_000,
            node_local,
            departures_per_day: 24.0,
            seed: 1,
            ..SimulationConfig::default()
        };
        let started = std::time::Instant::now();
        let report = simulate(&config, policy.as_ref()).unwrap();
        println!(
            "{}: {:.1} s {:?}",
            config.scope_name(),
            started.elapsed().as_secs_f64(),
            report.summary
        );
    }
}

#[test]
fn searchers_get_balanced_placements_and_keep_their_caches_under_churn() {
    // Enough splits for 10 searchers: 30 nodes, an hour, small targets.
    let base = SimulationConfig {
        nodes: 30,
        ticks: 60,
        docs_per_split: 10_000,
        searchers: 10,
        query_every: 6,
        ..SimulationConfig::default()
    };
    let policy = stable_log(100_000);
    let steady = simulate(&base, policy.as_ref()).unwrap();
    let summary = &steady.summary;
    assert_eq!(summary.queries, 10);
    assert!(summary.max_placement_balance <= 1.3 + 1e-9, "{summary:?}");
    // Every query opens more splits than there are searchers; new splits (fresh and merged)
    // miss once, the others hit the searcher that opened them before.
    assert!(summary.mean_query_splits > 10.0, "{summary:?}");
    assert!(summary.mean_cache_hit_rate >= 0.5, "{summary:?}");
    assert!(summary.mean_cache_hit_rate < 1.0, "{summary:?}");
    // A split an earlier query opened mostly goes back to the same searcher: without churn only
    // the load cap moves some (about one in ten with ten splits a searcher here).
    assert!(summary.mean_cache_affinity >= 0.8, "{summary:?}");
    let churn = SimulationConfig {
        searcher_departures_per_day: 24.0 * 5.0,
        ..base.clone()
    };
    let churned = simulate(&churn, policy.as_ref()).unwrap();
    let with_churn = &churned.summary;
    assert_eq!(with_churn.searcher_departures, 5);
    assert!(
        with_churn.max_placement_balance <= 1.3 + 1e-9,
        "{with_churn:?}"
    );
    assert!(
        with_churn.mean_cache_hit_rate < summary.mean_cache_hit_rate,
        "churn can only cost cache hits: {with_churn:?} vs {summary:?}"
    );
    assert!(
        with_churn.mean_cache_affinity < summary.mean_cache_affinity,
        "{with_churn:?} vs {summary:?}"
    );
    // No searchers, no queries.
    let none = simulate(&config(3, 10), policy.as_ref()).unwrap();
    assert_eq!(none.summary.queries, 0);
}

#[test]
fn progress_is_reported_after_every_tick_and_changes_nothing() {
    let mut done = Vec::new();
    let report =
        simulate_with_progress(&config(2, 5), &NoMergePolicy, &mut |ticks| done.push(ticks))
            .unwrap();
    assert_eq!(done, [1, 2, 3, 4, 5]);
    assert_eq!(report, simulate(&config(2, 5), &NoMergePolicy).unwrap());

    let policy = shale_config::MetricsSettings::default().locality_config();
    let locality = locality::LocalitySimulationConfig {
        nodes: 1,
        ticks: 3,
        docs_per_split: 100,
        keys: 10,
        ..Default::default()
    };
    let mut done = Vec::new();
    let report = locality::simulate_locality_with_progress(&locality, &policy, &mut |ticks| {
        done.push(ticks)
    })
    .unwrap();
    assert_eq!(done, [1, 2, 3]);
    assert_eq!(report.series.len(), 3);
}
