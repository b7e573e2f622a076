//! Policy tests. The cases of Quickwit's own tests for `StableLogMergePolicy`,
//! `ConstWriteAmplificationMergePolicy` and `NopMergePolicy` (inputs and expected outputs) are
//! reproduced here, plus Shale's edge cases and randomized properties.

use std::collections::{BTreeSet, HashMap};

use serde_json::json;
use shale_types::{IndexUid, MergeScope, SplitMaturity, SplitMetadata, TimeRange};

use super::*;

const NOW: i64 = 1_700_000_000;

fn index_uid() -> IndexUid {
    IndexUid {
        index_id: "test-index".to_string(),
        incarnation: "01HZZZZZZZZZZZZZZZZZZZZZZZ".to_string(),
    }
}

pub(crate) fn split(
    split_id: &str,
    num_docs: u64,
    time_range: Option<(i64, i64)>,
) -> SplitMetadata {
    SplitMetadata {
        split_id: split_id.to_string(),
        index_uid: index_uid(),
        source_id: "source".to_string(),
        node_id: "node".to_string(),
        partition_id: 0,
        doc_mapping_uid: "mapping".to_string(),
        num_docs,
        size_bytes: num_docs * 100,
        uncompressed_docs_size_bytes: num_docs * 100,
        time_range: time_range.map(|(start, end)| TimeRange { start, end }),
        tags: BTreeSet::new(),
        create_timestamp: NOW,
        maturity: SplitMaturity::Immature {
            maturation_period_secs: DEFAULT_MATURATION_PERIOD_SECS,
        },
        num_merge_ops: 0,
        delete_opstamp: 0,
        footer_offsets: (0, 0),
        time_bucket_start: None,
        sort_key_min: None,
        sort_key_max: None,
        key_level: 0,
        sort_fields: None,
        tag_fields: None,
        format: Default::default(),
        num_series: None,
    }
}

/// Quickwit's test fixture: `split_{ord:02}` ids, one shared time range, created now, maturity
/// from the policy.
fn create_splits(policy: &dyn MergePolicy, num_docs: &[u64]) -> Vec<SplitMetadata> {
    num_docs
        .iter()
        .enumerate()
        .map(|(ord, &docs)| {
            let mut split = split(
                &format!("split_{ord:02}"),
                docs,
                Some((1630563067, 1630564067)),
            );
            split.maturity = policy.split_maturity(docs, 0);
            split
        })
        .collect()
}

fn stable_log() -> StableLogMergePolicy {
    StableLogMergePolicy::new(StableLogConfig::default(), 10_000_000)
}

fn ids(op: &MergeOperation) -> Vec<&str> {
    op.split_ids.iter().map(String::as_str).collect()
}

/// Splits left out of every operation.
fn remaining<'a>(splits: &'a [SplitMetadata], ops: &[MergeOperation]) -> Vec<&'a SplitMetadata> {
    let merged: BTreeSet<&str> = ops
        .iter()
        .flat_map(|op| op.split_ids.iter().map(String::as_str))
        .collect();
    splits
        .iter()
        .filter(|split| !merged.contains(split.split_id.as_str()))
        .collect()
}

fn levels_in_given_order(
    policy: &StableLogMergePolicy,
    splits: &[SplitMetadata],
) -> Vec<std::ops::Range<usize>> {
    let refs: Vec<&SplitMetadata> = splits.iter().collect();
    let order: Vec<usize> = (0..splits.len()).collect();
    policy.levels(&refs, &order)
}

// ---------------------------------------------------------------------------------------------
// stable_log: Quickwit's cases.

#[test]
fn stable_log_split_maturity() {
    let policy = stable_log();
    assert_eq!(
        policy.split_maturity(9_000_000, 0),
        SplitMaturity::Immature {
            maturation_period_secs: 48 * 3600
        }
    );
    assert_eq!(policy.split_maturity(10_000_001, 0), SplitMaturity::Mature);
    assert_eq!(policy.split_maturity(10_000_000, 0), SplitMaturity::Mature);
    assert_eq!(
        policy.split_maturity(9_999_999, 7),
        SplitMaturity::Immature {
            maturation_period_secs: 48 * 3600
        }
    );
}

#[test]
fn stable_log_levels() {
    let policy = stable_log();
    assert!(levels_in_given_order(&policy, &[]).is_empty());
    let splits = create_splits(&policy, &[100_000, 100_000, 100_000, 800_000, 900_000]);
    assert_eq!(levels_in_given_order(&policy, &splits), vec![0..3, 3..5]);
    let splits = create_splits(
        &policy,
        &[
            100_000, 100_000, 100_000, 100_000, 100_000, 100_000, 100_000, 100_000, 800_000,
            1_600_000,
        ],
    );
    assert_eq!(levels_in_given_order(&policy, &splits), vec![0..8, 8..10]);
    // Not sorted by size: a smaller split after a bigger one stays in the bigger one's level.
    let splits = create_splits(
        &policy,
        &[
            100_000, 100_000, 100_000, 100_000, 100_000, 100_000, 100_000, 100_000, 800_000,
            100_000, 1_600_000,
        ],
    );
    assert_eq!(levels_in_given_order(&policy, &splits), vec![0..8, 8..11]);
}

#[test]
fn stable_log_not_enough_splits() {
    let policy = stable_log();
    let splits = create_splits(&policy, &[100; 7]);
    assert!(policy.operations(&splits, NOW).is_empty());
}

#[test]
fn stable_log_just_enough_splits_for_a_merge() {
    let policy = stable_log();
    let splits = create_splits(&policy, &[100; 10]);
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    assert_eq!(
        ids(&ops[0]),
        [
            "split_00", "split_01", "split_02", "split_03", "split_04", "split_05", "split_06",
            "split_07", "split_08", "split_09"
        ]
    );
    assert!(remaining(&splits, &ops).is_empty());
}

#[test]
fn stable_log_many_splits_on_same_level() {
    let policy = stable_log();
    let splits = create_splits(&policy, &[100; 13]);
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    // Built backwards from the level's end: the first split in policy order is left over.
    assert_eq!(
        ids(&ops[0]),
        [
            "split_01", "split_02", "split_03", "split_04", "split_05", "split_06", "split_07",
            "split_08", "split_09", "split_10", "split_11", "split_12"
        ]
    );
    let left: Vec<&str> = remaining(&splits, &ops)
        .iter()
        .map(|split| split.split_id.as_str())
        .collect();
    assert_eq!(left, ["split_00"]);
}

#[test]
fn stable_log_splits_below_min_level() {
    let policy = stable_log();
    let splits = create_splits(
        &policy,
        &[
            100, 1000, 10_000, 10_000, 10_000, 10_000, 10_000, 40_000, 40_000, 40_000,
        ],
    );
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    let mut merged = ids(&ops[0]);
    merged.sort();
    assert_eq!(
        merged,
        [
            "split_00", "split_01", "split_02", "split_03", "split_04", "split_05", "split_06",
            "split_07", "split_08", "split_09"
        ]
    );
}

#[test]
fn stable_log_splits_above_min_level() {
    let policy = stable_log();
    let splits = create_splits(
        &policy,
        &[
            100_000, 1_000_000, 1_000_000, 1_000_000, 1_000_000, 1_000_000, 1_000_000, 1_000_000,
        ],
    );
    assert!(policy.operations(&splits, NOW).is_empty());
}

#[test]
fn stable_log_split_at_target_is_ignored() {
    let policy = stable_log();
    let splits = create_splits(
        &policy,
        &[
            100_000, 100_000, 100_000, 100_000, 100_000, 10_000_000, 100_000, 100_000, 100_000,
            100_000, 100_000,
        ],
    );
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    let left = remaining(&splits, &ops);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].num_docs, 10_000_000);
}

#[test]
fn stable_log_splits_too_large_are_ignored() {
    let policy = stable_log();
    let splits = create_splits(&policy, &[9_999_999, 10_000_000]);
    assert!(policy.operations(&splits, NOW).is_empty());
}

#[test]
fn stable_log_entire_level_reaches_target() {
    let policy = stable_log();
    let splits = create_splits(&policy, &[5_000_000, 5_000_000]);
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].split_ids.len(), 2);
}

#[test]
fn stable_log_last_merge_can_have_a_lower_merge_factor() {
    let policy = stable_log();
    let splits = create_splits(&policy, &[9_999_997, 9_999_998, 9_999_999]);
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    assert_eq!(ids(&ops[0]), ["split_01", "split_02"]);
    let left = remaining(&splits, &ops);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].num_docs, 9_999_997);
}

#[test]
fn stable_log_no_merge_with_only_one_split() {
    let policy = stable_log();
    let splits = create_splits(&policy, &[9_999_999]);
    assert!(policy.operations(&splits, NOW).is_empty());
}

/// Quickwit panics on an immature split already at the target; Shale sets it aside.
#[test]
fn stable_log_immature_split_over_target_is_set_aside() {
    let policy = stable_log();
    let mut splits = create_splits(&policy, &[100; 10]);
    let mut big = split("big", 11_000_000, Some((1630563067, 1630564067)));
    big.maturity = SplitMaturity::Immature {
        maturation_period_secs: 3600,
    };
    splits.push(big);
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    assert!(!ops[0].split_ids.contains(&"big".to_string()));
}

// ---------------------------------------------------------------------------------------------
// stable_log: edge cases of the spec.

#[test]
fn stable_log_sorts_by_time_end_descending_then_docs_then_id() {
    let policy = stable_log();
    // Same docs: latest end first; no time range last; ties broken by docs, then id.
    let splits = vec![
        split("a", 100, Some((0, 10))),
        split("b", 100, None),
        split("c", 100, Some((0, 30))),
        split("d", 50, Some((0, 20))),
        split("e", 100, Some((0, 20))),
        split("f", 100, Some((5, 20))),
        split("g", 100, None),
        split("h", 10, None),
        split("i", 100, Some((0, 40))),
        split("j", 100, Some((0, 0))),
    ];
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    assert_eq!(
        ids(&ops[0]),
        ["i", "c", "d", "e", "f", "a", "j", "h", "b", "g"]
    );
}

#[test]
fn stable_log_operations_come_from_the_highest_level_first() {
    let policy = stable_log();
    let mut splits = Vec::new();
    // Newest: 10 small splits (level 0); older: 10 splits of 200k docs (a new level).
    for i in 0..10 {
        splits.push(split(&format!("small-{i}"), 1_000, Some((0, 1_000 + i))));
    }
    for i in 0..10 {
        splits.push(split(&format!("big-{i}"), 200_000, Some((0, 100 + i))));
    }
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 2);
    assert_eq!(
        ids(&ops[0]),
        [
            "big-9", "big-8", "big-7", "big-6", "big-5", "big-4", "big-3", "big-2", "big-1",
            "big-0"
        ]
    );
    assert_eq!(
        ids(&ops[1]),
        [
            "small-9", "small-8", "small-7", "small-6", "small-5", "small-4", "small-3", "small-2",
            "small-1", "small-0"
        ]
    );
}

#[test]
fn stable_log_level_bound_is_inclusive() {
    let policy = stable_log();
    // First bound: max(3 × 40_000, 100_000) = 120_000. A split of exactly 120_000 opens a level.
    let mut splits: Vec<SplitMetadata> = (0..9)
        .map(|i| split(&format!("s{i}"), 40_000, Some((0, 100 - i))))
        .collect();
    splits.push(split("edge", 120_000, Some((0, 50))));
    assert!(policy.operations(&splits, NOW).is_empty());
    // One doc less and it joins the first level: ten splits, one merge.
    splits[9].num_docs = 119_999;
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].split_ids.len(), 10);
    // The first bound is at least min_level_num_docs.
    let splits: Vec<SplitMetadata> = [10, 10, 10, 10, 10, 10, 10, 10, 10, 99_999]
        .iter()
        .enumerate()
        .map(|(i, &docs)| split(&format!("t{i}"), docs, Some((0, 100 - i as i64))))
        .collect();
    assert_eq!(policy.operations(&splits, NOW)[0].split_ids.len(), 10);
}

#[test]
fn stable_log_target_reached_mid_level_keeps_the_split_that_reaches_it() {
    let policy = stable_log();
    let splits: Vec<SplitMetadata> = (0..6)
        .map(|i| split(&format!("s{i}"), 3_000_000, Some((0, 100 - i))))
        .collect();
    // Backwards: 3M, 6M, 9M, 12M >= 10M: four splits, though under merge_factor.
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    assert_eq!(ids(&ops[0]), ["s2", "s3", "s4", "s5"]);
}

#[test]
fn stable_log_candidate_stops_at_max_merge_factor() {
    let policy = stable_log();
    let splits: Vec<SplitMetadata> = (0..30)
        .map(|i| split(&format!("s{i:02}"), 100, Some((0, 100 - i))))
        .collect();
    // One operation per level per call, even with 30 splits on the level.
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].split_ids.len(), 12);
    assert_eq!(ops[0].split_ids[0], "s18");
    assert_eq!(ops[0].split_ids[11], "s29");
}

#[test]
fn stable_log_maturation_period_boundary() {
    let policy = stable_log();
    let period = 48 * 3600;
    let splits: Vec<SplitMetadata> = (0..10)
        .map(|i| {
            let mut split = split(&format!("s{i}"), 100, Some((0, 100 - i)));
            split.create_timestamp = NOW - period;
            split
        })
        .collect();
    // create + period == now: mature (`<=`), nothing to merge.
    assert!(policy.operations(&splits, NOW).is_empty());
    assert_eq!(policy.operations(&splits, NOW - 1).len(), 1);
    // An explicit `Mature` always wins.
    let mut splits = splits;
    for split in &mut splits {
        split.create_timestamp = NOW;
    }
    assert_eq!(policy.operations(&splits, NOW).len(), 1);
    splits[3].maturity = SplitMaturity::Mature;
    assert!(policy.operations(&splits, NOW).is_empty());
    // Splits without a time range mature like the others.
    let splits: Vec<SplitMetadata> = (0..10)
        .map(|i| split(&format!("n{i}"), 100, None))
        .collect();
    assert_eq!(policy.operations(&splits, NOW).len(), 1);
    assert!(policy
        .operations(&splits, NOW + DEFAULT_MATURATION_PERIOD_SECS as i64)
        .is_empty());
}

#[test]
fn stable_log_result_does_not_depend_on_input_order() {
    let policy = stable_log();
    let mut rng = SplitMix(7);
    for round in 0..200 {
        let mut splits = random_splits(&mut rng, round);
        let expected = policy.operations(&splits, NOW);
        rng.shuffle(&mut splits);
        assert_eq!(policy.operations(&splits, NOW), expected, "round {round}");
    }
}

#[test]
fn stable_log_properties() {
    let config = StableLogConfig {
        min_level_num_docs: 100_000,
        merge_factor: 4,
        max_merge_factor: 6,
        maturation_period_secs: 3600,
    };
    let policy = StableLogMergePolicy::new(config, 10_000_000);
    let mut rng = SplitMix(42);
    for round in 0..300 {
        let splits = random_splits(&mut rng, round);
        let ops = policy.operations(&splits, NOW);
        check_common_properties(&policy, &splits, &ops);
        let by_id: HashMap<&str, &SplitMetadata> =
            splits.iter().map(|s| (s.split_id.as_str(), s)).collect();
        for op in &ops {
            assert!(op.split_ids.len() <= 6);
            if op.split_ids.len() < 4 {
                let docs: u64 = op
                    .split_ids
                    .iter()
                    .map(|id| by_id[id.as_str()].num_docs)
                    .sum();
                // The first split in policy order is the last one added.
                let last_added = by_id[op.split_ids[0].as_str()].num_docs;
                assert!(docs >= 10_000_000);
                assert!(docs - last_added < 10_000_000);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// stable_log: Quickwit's planner simulations, with its bounds on the number of splits.

/// Docs at which each level starts for a growth factor (Quickwit's test helper, re-derived).
fn level_starts(config: &StableLogConfig, target: u64, growth: u64) -> Vec<u64> {
    let mut starts = vec![1];
    let mut level_end = config.min_level_num_docs;
    while level_end < target {
        starts.push(level_end);
        level_end *= growth;
    }
    starts.push(target);
    starts
}

fn max_num_splits(config: &StableLogConfig, num_docs: u64, levels: &[u64], sorted: bool) -> u64 {
    if num_docs == 0 {
        return 0;
    }
    let (&head, tail) = levels.split_first().expect("levels");
    if num_docs < head {
        return 0;
    }
    let merge_factor = config.merge_factor as u64;
    let saturation = if sorted {
        head * (merge_factor - 1)
    } else {
        head + (merge_factor - 2)
    };
    if tail.is_empty() || num_docs <= saturation {
        return num_docs.div_ceil(head);
    }
    merge_factor - 1 + max_num_splits(config, num_docs - saturation, tail, sorted)
}

fn max_num_splits_worst_case(policy: &StableLogMergePolicy, num_docs: u64) -> u64 {
    let levels = level_starts(policy.config(), policy.split_num_docs_target(), 3);
    max_num_splits(policy.config(), num_docs, &levels, false)
}

fn max_num_splits_ideal_case(policy: &StableLogMergePolicy, num_docs: u64) -> u64 {
    let merge_factor = policy.config().merge_factor as u64;
    let levels = level_starts(
        policy.config(),
        policy.split_num_docs_target(),
        merge_factor,
    );
    max_num_splits(policy.config(), num_docs, &levels, true)
}

#[test]
fn stable_log_split_count_bounds() {
    let policy = stable_log();
    for (docs, expected) in [
        (99, 9),
        (1_000_000, 27),
        (2_000_000, 36),
        (3_000_000, 36),
        (4_000_000, 36),
        (5_000_000, 45),
        (7_000_000, 45),
        (10_000_000, 45),
        (20_000_000, 54),
        (100_000_000, 63),
        (1_000_000_000, 153),
    ] {
        assert_eq!(max_num_splits_worst_case(&policy, docs), expected, "{docs}");
    }
    for (docs, expected) in [
        (1_000_000, 18),
        (99, 9),
        (2_000_000, 20),
        (3_000_000, 21),
        (4_000_000, 22),
        (5_000_000, 23),
        (7_000_000, 25),
        (10_000_000, 27),
        (100_000_000, 37),
        (1_000_000_000, 127),
    ] {
        assert_eq!(max_num_splits_ideal_case(&policy, docs), expected, "{docs}");
    }
}

/// Quickwit's merge planner test harness: splits arrive one at a time (split `i` covers
/// `[1000 i, 1000 i + 999]`); after each, the policy runs and its merges are applied (merged
/// split: docs summed, time range united, `num_merge_ops` max + 1, maturity from the policy)
/// until it emits nothing; `check` then sees every split. With `finalize`, the finalize merges
/// run once at the end. Returns the final splits.
fn simulate_planner(
    policy: &dyn MergePolicy,
    batch_num_docs: &[u64],
    finalize: bool,
    check: impl Fn(&[SplitMetadata]),
) -> Vec<SplitMetadata> {
    let mut all: Vec<SplitMetadata> = Vec::new();
    let mut next_id = 0u64;
    let mut now = NOW;
    let mut new_split = |docs: u64, range: (i64, i64), ops: u32, now: i64| {
        next_id += 1;
        let mut split = split(&format!("{next_id:08}"), docs, Some(range));
        split.num_merge_ops = ops;
        split.create_timestamp = now;
        split.maturity = policy.split_maturity(docs, ops);
        split
    };
    let apply = |all: &mut Vec<SplitMetadata>,
                 ops: Vec<MergeOperation>,
                 new_split: &mut dyn FnMut(u64, (i64, i64), u32, i64) -> SplitMetadata,
                 now: i64| {
        for op in ops {
            let inputs: Vec<SplitMetadata> = op
                .split_ids
                .iter()
                .map(|id| {
                    let pos = all.iter().position(|s| &s.split_id == id).expect("input");
                    all.swap_remove(pos)
                })
                .collect();
            let docs = inputs.iter().map(|s| s.num_docs).sum();
            let start = inputs
                .iter()
                .filter_map(|s| s.time_range)
                .map(|r| r.start)
                .min();
            let end = inputs
                .iter()
                .filter_map(|s| s.time_range)
                .map(|r| r.end)
                .max();
            let merge_ops = inputs.iter().map(|s| s.num_merge_ops).max().unwrap_or(0) + 1;
            let range = (start.unwrap_or(0), end.unwrap_or(0));
            all.push(new_split(docs, range, merge_ops, now));
        }
    };
    for (ord, &docs) in batch_num_docs.iter().enumerate() {
        now += 1;
        let first = ord as i64 * 1_000;
        all.push(new_split(docs, (first, first + 999), 0, now));
        loop {
            let young: Vec<SplitMetadata> = all
                .iter()
                .filter(|s| !policy.is_mature(s, now))
                .cloned()
                .collect();
            let ops = policy.operations(&young, now);
            if ops.is_empty() {
                break;
            }
            apply(&mut all, ops, &mut new_split, now);
        }
        check(&all);
    }
    if finalize {
        let young: Vec<SplitMetadata> = all
            .iter()
            .filter(|s| !policy.is_mature(s, now))
            .cloned()
            .collect();
        let ops = policy.finalize_operations(&young, now);
        apply(&mut all, ops, &mut new_split, now);
    }
    all
}

fn total_docs(splits: &[SplitMetadata]) -> u64 {
    splits.iter().map(|s| s.num_docs).sum()
}

#[test]
fn stable_log_planner_edge_case() {
    let policy = stable_log();
    simulate_planner(&policy, &[11; 19], false, |splits| {
        assert!(splits.len() as u64 <= max_num_splits_worst_case(&policy, total_docs(splits)));
    });
}

#[test]
fn stable_log_planner_ideal_case() {
    let policy = stable_log();
    simulate_planner(&policy, &[10_000; 1_000], false, |splits| {
        assert!(splits.len() as u64 <= max_num_splits_ideal_case(&policy, total_docs(splits)));
    });
}

#[test]
fn stable_log_planner_bug_case() {
    let policy = stable_log();
    let batch = [11, 11, 11, 11, 11, 11, 310_000, 11, 11, 11, 11, 11, 11, 11];
    simulate_planner(&policy, &batch, false, |splits| {
        assert!(splits.len() as u64 <= max_num_splits_worst_case(&policy, total_docs(splits)));
    });
}

#[test]
fn stable_log_planner_adversarial() {
    let policy = stable_log();
    let mut rng = SplitMix(2024);
    let choices = [11, 1_990, 10_000, 50_000, 310_000];
    for _ in 0..20 {
        let len = 1 + rng.below(400) as usize;
        let batch: Vec<u64> = (0..len).map(|_| choices[rng.below(5) as usize]).collect();
        simulate_planner(&policy, &batch, false, |splits| {
            assert!(
                splits.len() as u64 <= max_num_splits_worst_case(&policy, total_docs(splits)),
                "{batch:?}"
            );
        });
    }
}

// ---------------------------------------------------------------------------------------------
// limit_merge: Quickwit's cases (its test config: max_merge_ops 3, merge_factor 3,
// max_merge_factor 5, maturation 1h, no finalize merges).

fn limit_merge_for_test() -> LimitMergeConfig {
    LimitMergeConfig {
        merge_factor: 3,
        max_merge_factor: 5,
        max_merge_ops: 3,
        maturation_period_secs: 3600,
        max_finalize_merge_operations: 0,
        max_finalize_split_num_docs: None,
    }
}

fn limit_merge_split(policy: &LimitMergePolicy, id: &str, docs: u64, ops: u32) -> SplitMetadata {
    let mut split = split(id, docs, None);
    split.num_merge_ops = ops;
    split.maturity = policy.split_maturity(docs, ops);
    split
}

#[test]
fn limit_merge_split_maturity() {
    let policy = LimitMergePolicy::new(limit_merge_for_test(), 10_000_000);
    assert_eq!(
        policy.split_maturity(9_000_000, 0),
        SplitMaturity::Immature {
            maturation_period_secs: 3600
        }
    );
    assert_eq!(policy.split_maturity(10_000_001, 0), SplitMaturity::Mature);
    assert_eq!(policy.split_maturity(9_000_000, 3), SplitMaturity::Mature);
}

#[test]
fn limit_merge_empty_and_single() {
    let policy = LimitMergePolicy::new(limit_merge_for_test(), 10_000_000);
    assert!(policy.operations(&[], NOW).is_empty());
    let mut single = split("01GE1R0KBFQHJ76030RYRAS8QA", 1, None);
    single.create_timestamp = 1665000000;
    single.maturity = policy.split_maturity(1, 0);
    single.num_merge_ops = 4;
    assert!(policy.operations(&[single], NOW).is_empty());
}

#[test]
fn limit_merge_simple() {
    let policy = LimitMergePolicy::new(limit_merge_for_test(), 10_000_000);
    let splits: Vec<SplitMetadata> = (0..3)
        .map(|i| limit_merge_split(&policy, &format!("split-{i}"), 1_000, 1))
        .collect();
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].split_ids.len(), 3);
}

#[test]
fn limit_merge_max_merge_factor() {
    let policy = LimitMergePolicy::new(limit_merge_for_test(), 10_000_000);
    let splits: Vec<SplitMetadata> = (0..5 + 3 - 1)
        .map(|i| limit_merge_split(&policy, &format!("split-{i}"), 1_000, 1))
        .collect();
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].split_ids.len(), 5);
}

#[test]
fn limit_merge_older_first() {
    let policy = LimitMergePolicy::new(limit_merge_for_test(), 10_000_000);
    let mut splits: Vec<SplitMetadata> = (0..5)
        .map(|i| {
            let mut split = limit_merge_split(&policy, &format!("split-{i}"), 1_000, 1);
            split.create_timestamp = NOW + i;
            split
        })
        .collect();
    SplitMix(3).shuffle(&mut splits);
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    assert_eq!(
        ids(&ops[0]),
        ["split-0", "split-1", "split-2", "split-3", "split-4"]
    );
}

#[test]
fn limit_merge_target_num_docs() {
    let policy = LimitMergePolicy::new(limit_merge_for_test(), 10_000_000);
    let docs = 10_000_000u64.div_ceil(3);
    let splits: Vec<SplitMetadata> = (0..4)
        .map(|i| limit_merge_split(&policy, &format!("split-{i}"), docs, 1))
        .collect();
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].split_ids.len(), 3);
}

#[test]
fn limit_merge_groups_by_num_merge_ops() {
    let policy = LimitMergePolicy::new(limit_merge_for_test(), 10_000_000);
    let mut splits = Vec::new();
    for i in 0..2 {
        splits.push(limit_merge_split(&policy, &format!("a{i}"), 10, 0));
        splits.push(limit_merge_split(&policy, &format!("b{i}"), 10, 1));
        splits.push(limit_merge_split(&policy, &format!("c{i}"), 10, 2));
    }
    // Two of each: no group reaches merge_factor.
    assert!(policy.operations(&splits, NOW).is_empty());
    splits.push(limit_merge_split(&policy, "b2", 10, 1));
    splits.push(limit_merge_split(&policy, "a2", 10, 0));
    let ops = policy.operations(&splits, NOW);
    assert_eq!(ops.len(), 2);
    assert_eq!(ids(&ops[0]), ["a0", "a1", "a2"]);
    assert_eq!(ids(&ops[1]), ["b0", "b1", "b2"]);
    // Splits made by max_merge_ops merges never merge again.
    let done: Vec<SplitMetadata> = (0..5)
        .map(|i| limit_merge_split(&policy, &format!("d{i}"), 10, 3))
        .collect();
    assert!(policy.operations(&done, NOW).is_empty());
}

#[test]
fn limit_merge_properties() {
    let policy = LimitMergePolicy::new(limit_merge_for_test(), 10_000_000);
    let mut rng = SplitMix(99);
    for round in 0..300 {
        let mut splits = random_splits(&mut rng, round);
        let ops = policy.operations(&splits, NOW);
        check_common_properties(&policy, &splits, &ops);
        let by_id: HashMap<&str, &SplitMetadata> =
            splits.iter().map(|s| (s.split_id.as_str(), s)).collect();
        for op in &ops {
            assert!(op.split_ids.len() <= 5);
            let inputs: Vec<&SplitMetadata> =
                op.split_ids.iter().map(|id| by_id[id.as_str()]).collect();
            if inputs.len() < 3 {
                let docs: u64 = inputs.iter().map(|s| s.num_docs).sum();
                let last = inputs.last().expect("op").num_docs;
                assert!(docs >= 10_000_000);
                assert!(docs - last < 10_000_000);
            }
            let merge_ops: BTreeSet<u32> = inputs.iter().map(|s| s.num_merge_ops).collect();
            assert_eq!(merge_ops.len(), 1);
            assert!(*merge_ops.first().expect("ops") < 3);
        }
        rng.shuffle(&mut splits);
        assert_eq!(policy.operations(&splits, NOW), ops);
    }
}

#[test]
fn limit_merge_planner_simulation() {
    let config = limit_merge_for_test();
    let policy = LimitMergePolicy::new(config, 10_000_000);
    let finals = simulate_planner(&policy, &[1; 1_211], false, |splits| {
        let mut per_level: HashMap<u32, usize> = HashMap::new();
        for split in splits {
            assert!(split.num_merge_ops <= 3);
            *per_level.entry(split.num_merge_ops).or_default() += 1;
        }
        for level in 0..3 {
            assert!(per_level.get(&level).copied().unwrap_or(0) < 3);
        }
    });
    assert_eq!(finals.len(), 49);
}

fn limit_merge_with_finalize(
    max_finalize: usize,
    max_finalize_docs: Option<u64>,
) -> LimitMergePolicy {
    let config = LimitMergeConfig {
        merge_factor: 10,
        max_merge_factor: 10,
        max_finalize_merge_operations: max_finalize,
        max_finalize_split_num_docs: max_finalize_docs,
        ..limit_merge_for_test()
    };
    LimitMergePolicy::new(config, 10_000_000)
}

#[test]
fn limit_merge_finalize() {
    let ones = vec![1; 9 + 90 + 900];
    for (max_finalize, expected) in [(0, 27), (1, 18), (2, 9), (3, 3)] {
        let policy = limit_merge_with_finalize(max_finalize, None);
        let finals = simulate_planner(&policy, &ones, true, |_| {});
        assert_eq!(
            finals.len(),
            expected,
            "max_finalize_merge_operations {max_finalize}"
        );
    }
    let policy = limit_merge_with_finalize(1, None);
    assert_eq!(simulate_planner(&policy, &[1; 6], true, |_| {}).len(), 1);
    assert_eq!(simulate_planner(&policy, &[1; 3], true, |_| {}).len(), 1);
    assert_eq!(simulate_planner(&policy, &[1; 2], true, |_| {}).len(), 2);
    // The youngest splits are merged first.
    let finals = simulate_planner(&policy, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], true, |_| {});
    let mut docs: Vec<u64> = finals.iter().map(|s| s.num_docs).collect();
    docs.sort();
    assert_eq!(docs, [11, 55]);
}

#[test]
fn limit_merge_finalize_max_num_docs() {
    let policy = limit_merge_with_finalize(3, Some(999_999));
    let finals = simulate_planner(
        &policy,
        &[999_999, 1_000_000, 999_999, 999_999],
        true,
        |_| {},
    );
    let mut docs: Vec<u64> = finals.iter().map(|s| s.num_docs).collect();
    docs.sort();
    assert_eq!(docs, [1_000_000, 999_999 * 3]);
}

#[test]
fn limit_merge_finalize_order_is_youngest_first() {
    let policy = limit_merge_with_finalize(1, None);
    let splits: Vec<SplitMetadata> = (0..12)
        .map(|i| {
            let mut split = limit_merge_split(&policy, &format!("s{i:02}"), 1, (i % 3) as u32);
            split.create_timestamp = NOW - 100 + i;
            split
        })
        .collect();
    let ops = policy.finalize_operations(&splits, NOW);
    assert_eq!(ops.len(), 1);
    assert_eq!(
        ids(&ops[0]),
        ["s11", "s10", "s09", "s08", "s07", "s06", "s05", "s04", "s03", "s02"]
    );
    // Regular policies have no finalize merges.
    assert!(stable_log().finalize_operations(&splits, NOW).is_empty());
}

// ---------------------------------------------------------------------------------------------
// no_merge.

#[test]
fn no_merge_never_merges() {
    let policy = NoMergePolicy;
    let splits = create_splits(&policy, &[1; 100]);
    assert!(splits.iter().all(|s| s.maturity == SplitMaturity::Mature));
    assert!(policy.is_mature(&splits[0], NOW));
    let mut immature = splits.clone();
    for split in &mut immature {
        split.maturity = SplitMaturity::Immature {
            maturation_period_secs: 3600,
        };
    }
    assert!(policy.operations(&immature, NOW).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Config.

fn parse(value: serde_json::Value) -> Result<MergePolicyConfig, PolicyConfigError> {
    MergePolicyConfig::parse(&value)
}

#[test]
fn config_defaults_and_spellings() {
    assert_eq!(
        parse(serde_json::Value::Null).unwrap(),
        MergePolicyConfig::default()
    );
    assert_eq!(
        parse(json!({"type": "stable_log"})).unwrap(),
        MergePolicyConfig::StableLog(StableLogConfig::default())
    );
    assert_eq!(
        parse(json!({"type": "default"})).unwrap(),
        MergePolicyConfig::StableLog(StableLogConfig::default())
    );
    assert_eq!(
        parse(json!({"type": "no_merge"})).unwrap(),
        MergePolicyConfig::NoMerge
    );
    assert_eq!(
        parse(json!({"type": "limit_merge"})).unwrap(),
        MergePolicyConfig::LimitMerge(LimitMergeConfig::default())
    );
    assert_eq!(
        parse(json!({
            "type": "stable_log", "min_level_num_docs": 1000, "merge_factor": 4,
            "max_merge_factor": 6, "maturation_period": "2 days"
        }))
        .unwrap(),
        MergePolicyConfig::StableLog(StableLogConfig {
            min_level_num_docs: 1000,
            merge_factor: 4,
            max_merge_factor: 6,
            maturation_period_secs: 2 * 86_400,
        })
    );
    assert_eq!(
        parse(json!({
            "type": "limit_merge", "max_merge_ops": 5, "merge_factor": 3, "max_merge_factor": 5,
            "maturation_period": "1h", "max_finalize_merge_operations": 2,
            "max_finalize_split_num_docs": 1000
        }))
        .unwrap(),
        MergePolicyConfig::LimitMerge(LimitMergeConfig {
            merge_factor: 3,
            max_merge_factor: 5,
            max_merge_ops: 5,
            maturation_period_secs: 3600,
            max_finalize_merge_operations: 2,
            max_finalize_split_num_docs: Some(1000),
        })
    );
    let policy = merge_policy_from_config(&json!({"type": "no_merge"}), 10).unwrap();
    assert_eq!(policy.split_maturity(1, 0), SplitMaturity::Mature);
}

#[test]
fn config_errors_name_the_field() {
    let field = |value| parse(value).unwrap_err().field;
    assert_eq!(field(json!("stable_log")), "merge_policy");
    assert_eq!(field(json!({"merge_factor": 3})), "merge_policy.type");
    assert_eq!(field(json!({"type": 3})), "merge_policy.type");
    assert_eq!(field(json!({"type": "tiered"})), "merge_policy.type");
    assert_eq!(
        field(json!({"type": "stable_log", "merge_factor": -1})),
        "merge_policy.merge_factor"
    );
    assert_eq!(
        field(json!({"type": "stable_log", "merge_factor": "ten"})),
        "merge_policy.merge_factor"
    );
    assert_eq!(
        field(json!({"type": "stable_log", "maturation_period": "48"})),
        "merge_policy.maturation_period"
    );
    assert_eq!(
        field(json!({"type": "stable_log", "maturation_period": 3600})),
        "merge_policy.maturation_period"
    );
    assert_eq!(
        field(json!({"type": "stable_log", "merge_factor": 13})),
        "merge_policy.max_merge_factor"
    );
    assert_eq!(
        field(json!({"type": "no_merge", "merge_factor": 3})),
        "merge_policy.merge_factor"
    );
    let err = parse(json!({"type": "stable_log", "max_merge_ops": 3, "zeta": 1})).unwrap_err();
    assert_eq!(err.field, "merge_policy.max_merge_ops");
    assert!(err.message.contains("`max_merge_ops`, `zeta`"), "{err}");
    assert!(err
        .to_string()
        .starts_with("`merge_policy.max_merge_ops`: unknown keys"));
}

// ---------------------------------------------------------------------------------------------
// plan(): scope grouping.

#[test]
fn plan_groups_by_scope_in_scope_order() {
    let policy = stable_log();
    let mut splits = Vec::new();
    for node in ["n2", "n1"] {
        for partition in [1u64, 0] {
            for i in 0..10 {
                let mut split = split(&format!("{node}-p{partition}-{i}"), 100, Some((0, 100 - i)));
                split.node_id = node.to_string();
                split.partition_id = partition;
                splits.push(split);
            }
        }
    }
    // Cluster scope: one scope per partition, nodes mixed.
    let planned = plan(&splits, &policy, false, NOW);
    assert_eq!(planned.len(), 2);
    assert_eq!(planned[0].0.partition_id, 0);
    assert_eq!(planned[0].0.node_id, None);
    assert_eq!(planned[1].0.partition_id, 1);
    assert_eq!(planned[0].1[0].split_ids.len(), 12);
    // node_local: one scope per node and partition, sorted by node then partition.
    let planned = plan(&splits, &policy, true, NOW);
    let scopes: Vec<(Option<&str>, u64)> = planned
        .iter()
        .map(|(scope, _)| (scope.node_id.as_deref(), scope.partition_id))
        .collect();
    assert_eq!(
        scopes,
        [
            (Some("n1"), 0),
            (Some("n1"), 1),
            (Some("n2"), 0),
            (Some("n2"), 1)
        ]
    );
    assert_eq!(ids(&planned[0].1[0])[0], "n1-p0-0");
    // Different doc mappings never merge; scopes without operations are left out.
    splits.truncate(15);
    for (i, split) in splits.iter_mut().enumerate() {
        split.partition_id = 0;
        if i >= 5 {
            split.doc_mapping_uid = "other".to_string();
        }
    }
    let planned: Vec<(MergeScope, Vec<MergeOperation>)> = plan(&splits, &policy, false, NOW);
    assert_eq!(planned.len(), 1);
    assert_eq!(planned[0].0.doc_mapping_uid, "other");
    assert_eq!(planned[0].1[0].split_ids.len(), 10);
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// A small deterministic generator (SplitMix64), so randomized tests replay exactly.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// Quickwit's proptest split strategy, re-derived: merge ops 0..5, time ranges growing with
/// them, docs anywhere below the target or around powers of ten; immature.
fn random_splits(rng: &mut SplitMix, round: usize) -> Vec<SplitMetadata> {
    let len = rng.below(100) as usize;
    (0..len)
        .map(|i| {
            let num_merge_ops = rng.below(5) as u32;
            let start = 1_664_000_000 + rng.below(1_000_000) as i64;
            let delta = 100 + rng.below(20) as i64;
            let end = start + delta * 10i64.pow(num_merge_ops);
            let num_docs = if rng.below(2) == 0 {
                1 + rng.below(10_000_000 - 1)
            } else {
                let power = 10u64.pow(1 + rng.below(4) as u32);
                (power + rng.below(4)).saturating_sub(2).max(1)
            };
            let mut split = split(&format!("r{round}-{i:03}"), num_docs, Some((start, end)));
            split.num_merge_ops = num_merge_ops;
            split.create_timestamp = NOW - rng.below(3000) as i64;
            split.maturity = SplitMaturity::Immature {
                maturation_period_secs: 3600,
            };
            split
        })
        .collect()
}

/// What every policy guarantees: no split lost or repeated, at least two per operation (but
/// a locality rewrite of a lone split),
/// no mature split merged.
fn check_common_properties(
    policy: &dyn MergePolicy,
    splits: &[SplitMetadata],
    ops: &[MergeOperation],
) {
    let by_id: HashMap<&str, &SplitMetadata> =
        splits.iter().map(|s| (s.split_id.as_str(), s)).collect();
    let mut seen = BTreeSet::new();
    for op in ops {
        assert!(
            op.split_ids.len() >= 2 || op.kind == MergeKind::Locality,
            "{op:?}"
        );
        for id in &op.split_ids {
            assert!(seen.insert(id.clone()), "{id} twice");
            let split = by_id.get(id.as_str()).expect("known split");
            assert!(!policy.is_mature(split, NOW));
        }
    }
}
