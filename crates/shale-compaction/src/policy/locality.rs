//! The `locality` policy: which splits of one merge scope to merge, bucket by bucket, so that a
//! bucket no longer written to ends as level-1 splits whose sort-key ranges do not overlap
//! (the plan and its reasons: `docs/design/locality-compaction.md`). A pure function of the
//! split metadata and the time; the merge worker cuts the outputs at key boundaries.
//!
//! - Splits merge only with splits of the same time bucket (`time_bucket_start`).
//! - A bucket is *active* until `close_delay_secs` after its end. There, level-0 splits merge
//!   size-tiered (by number of merges: `merge_factor` to `max_merge_factor` splits of one tier),
//!   for at most `max_merge_ops − 2` operations, keeping two for what follows.
//! - In a *closed* bucket, every level-0 split with budget left merges with the level-1
//!   splits (with budget left) inside the key envelope of those level-0 splits — one locality
//!   merge whose outputs are level 1. Late data arriving later does the same, once its splits
//!   stop arriving for `quiet_secs` (two commit timeouts and 5 s) or ten of them wait: a
//!   locality merge rewrites the level-1 splits it overlaps, so late splits are batched.
//! - Closed buckets are planned newest first, then active buckets newest first.
//! - No split takes part in more than `max_merge_ops` merges: that is the only maturity; the
//!   time-based maturation period only bounds what the planner reads.

use std::collections::BTreeMap;

use shale_config::LocalityConfig;
use shale_types::{MergeKind, SplitMaturity, SplitMetadata};

use super::MergePolicy;

/// Fewest level-0 splits of one tier merged in an active bucket.
const TIER_MERGE_FACTOR: usize = 10;
/// Most level-0 splits of one tier merged in an active bucket.
const TIER_MAX_MERGE_FACTOR: usize = 12;

/// The `locality` merge policy.
#[derive(Clone, Debug)]
pub struct LocalityMergePolicy {
    config: LocalityConfig,
    close_delay_secs: i64,
    quiet_secs: i64,
}

impl LocalityMergePolicy {
    /// The policy for an index whose indexers commit every `commit_timeout_secs`: a bucket is
    /// closed two commit timeouts plus a minute after its end (its last fresh splits are in).
    pub fn new(config: LocalityConfig, commit_timeout_secs: u64) -> Self {
        let close_delay_secs = i64::try_from(commit_timeout_secs)
            .unwrap_or(i64::MAX / 4)
            .saturating_mul(2)
            .saturating_add(60);
        let commit = i64::try_from(commit_timeout_secs).unwrap_or(i64::MAX / 4);
        LocalityMergePolicy {
            config,
            close_delay_secs,
            quiet_secs: commit.saturating_mul(2).saturating_add(5),
        }
    }

    fn ops_left(&self, split: &SplitMetadata) -> u32 {
        self.config
            .max_merge_ops
            .saturating_sub(split.num_merge_ops)
    }

    fn is_closed(&self, bucket_start: Option<i64>, now: i64) -> bool {
        match bucket_start {
            // Documents without a timestamp keep coming: their bucket never closes.
            None => false,
            Some(start) => {
                start
                    .saturating_add(self.config.time_bucket_secs as i64)
                    .saturating_add(self.close_delay_secs)
                    <= now
            }
        }
    }

    /// The locality merge of a closed bucket, if it has one at `now`.
    fn locality_merge(
        &self,
        splits: &[&SplitMetadata],
        bucket: &[usize],
        now: i64,
    ) -> Option<Vec<usize>> {
        let keyed = |pos: &usize| {
            let split = splits[*pos];
            match (&split.sort_key_min, &split.sort_key_max) {
                (Some(min), Some(max)) if self.ops_left(split) > 0 => Some((*pos, min, max)),
                _ => None,
            }
        };
        let level0: Vec<_> = bucket
            .iter()
            .filter(|pos| splits[**pos].key_level == 0)
            .filter_map(keyed)
            .collect();
        // Fresh splits still arriving (late data): wait until they stop or enough wait.
        let newest = level0
            .iter()
            .map(|(pos, _, _)| splits[*pos].create_timestamp)
            .max()?;
        if level0.len() < TIER_MERGE_FACTOR && newest.saturating_add(self.quiet_secs) > now {
            return None;
        }
        let low = level0.iter().map(|(_, min, _)| *min).min()?;
        let high = level0.iter().map(|(_, _, max)| *max).max()?;
        let mut inputs: Vec<usize> = level0.iter().map(|(pos, _, _)| *pos).collect();
        let level1: Vec<_> = bucket
            .iter()
            .filter(|pos| splits[**pos].key_level > 0)
            .filter_map(keyed)
            .collect();
        let overlapping: Vec<usize> = level1
            .iter()
            .filter(|(_, min, max)| *min <= high && low <= *max)
            .map(|(pos, _, _)| *pos)
            .collect();
        if overlapping.is_empty() && inputs.len() == 1 {
            // A lone fresh split in a gap joins its nearest level-1 neighbour (below, else
            // above) rather than staying level 0.
            let below = level1
                .iter()
                .filter(|(_, _, max)| *max < low)
                .max_by_key(|(_, _, max)| *max);
            let above = level1
                .iter()
                .filter(|(_, min, _)| *min > high)
                .min_by_key(|(_, min, _)| *min);
            inputs.extend(below.or(above).map(|(pos, _, _)| *pos));
        }
        inputs.extend(overlapping);
        if inputs.len() < 2 {
            return None;
        }
        inputs.sort_by(|a, b| {
            (&splits[*a].sort_key_min, &splits[*a].split_id)
                .cmp(&(&splits[*b].sort_key_min, &splits[*b].split_id))
        });
        Some(inputs)
    }

    /// Size-tiered merges of the level-0 splits of an active bucket.
    fn tiered_merges(&self, splits: &[&SplitMetadata], bucket: &[usize]) -> Vec<Vec<usize>> {
        let mut tiers: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for &pos in bucket {
            let split = splits[pos];
            if split.key_level == 0 && self.ops_left(split) > 2 {
                tiers.entry(split.num_merge_ops).or_default().push(pos);
            }
        }
        let mut operations = Vec::new();
        for (_, mut tier) in tiers {
            tier.sort_by(|a, b| {
                (splits[*a].create_timestamp, &splits[*a].split_id)
                    .cmp(&(splits[*b].create_timestamp, &splits[*b].split_id))
            });
            let mut rest = tier.as_slice();
            while rest.len() >= TIER_MERGE_FACTOR {
                let take = rest.len().min(TIER_MAX_MERGE_FACTOR);
                operations.push(rest[..take].to_vec());
                rest = &rest[take..];
            }
        }
        operations
    }
}

impl MergePolicy for LocalityMergePolicy {
    fn merge_positions(&self, splits: &[&SplitMetadata], now: i64) -> Vec<Vec<usize>> {
        let mut buckets: BTreeMap<Option<i64>, Vec<usize>> = BTreeMap::new();
        for (pos, split) in splits.iter().enumerate() {
            buckets
                .entry(split.time_bucket_start)
                .or_default()
                .push(pos);
        }
        // Closed buckets newest first, then active ones newest first (no-timestamp last).
        let mut order: Vec<(bool, Option<i64>)> = buckets
            .keys()
            .map(|bucket| (self.is_closed(*bucket, now), *bucket))
            .collect();
        order.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
        let mut operations = Vec::new();
        for (closed, bucket) in order {
            let members = &buckets[&bucket];
            if closed {
                operations.extend(self.locality_merge(splits, members, now));
            } else {
                operations.extend(self.tiered_merges(splits, members));
            }
        }
        operations
    }

    /// A merge in a closed bucket is a locality merge (level-1 outputs); a merge in an active
    /// bucket is a size-tiered one (one level-0 output).
    fn operation_kind(
        &self,
        splits: &[&SplitMetadata],
        positions: &[usize],
        now: i64,
    ) -> MergeKind {
        match positions.first() {
            Some(&pos) if self.is_closed(splits[pos].time_bucket_start, now) => MergeKind::Locality,
            _ => MergeKind::Merge,
        }
    }

    fn split_maturity(&self, _num_docs: u64, num_merge_ops: u32) -> SplitMaturity {
        self.config.split_maturity(num_merge_ops)
    }

    /// Only the merge budget makes a split mature here: late data must still be able to join
    /// a bucket's level-1 splits after the maturation period.
    fn is_mature(&self, split: &SplitMetadata, _now: i64) -> bool {
        self.ops_left(split) == 0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use serde_json::json;
    use shale_types::sort_key::SortKey;

    use super::*;
    use crate::policy::tests::split;

    const BUCKET: i64 = 900;
    /// Well after the buckets of the tests closed.
    const LATER: i64 = 100_000;

    fn policy() -> LocalityMergePolicy {
        let settings =
            json!({"sort_fields": ["service"], "time_bucket": "15m", "max_merge_ops": 4});
        let config = LocalityConfig::parse(settings.as_object().expect("object")).expect("valid");
        LocalityMergePolicy::new(config, 2)
    }

    /// A split of bucket `bucket` covering keys `[min, max]`, at `level`, made by `ops` merges.
    fn keyed(id: &str, bucket: i64, min: u8, max: u8, level: u8, ops: u32) -> SplitMetadata {
        let mut split = split(id, 1000, Some((bucket, bucket + BUCKET - 1)));
        split.time_bucket_start = Some(bucket);
        split.sort_key_min = Some(SortKey(vec![min]));
        split.sort_key_max = Some(SortKey(vec![max]));
        split.key_level = level;
        split.num_merge_ops = ops;
        // Made as the bucket ended.
        split.create_timestamp = bucket + BUCKET;
        split
    }

    fn ids(policy: &LocalityMergePolicy, splits: &[SplitMetadata], now: i64) -> Vec<Vec<String>> {
        policy
            .operations(splits, now)
            .into_iter()
            .map(|op| op.split_ids)
            .collect()
    }

    #[test]
    fn a_closed_bucket_merges_its_fresh_splits_with_the_level_1_splits_they_overlap() {
        let splits = vec![
            keyed("l1-a", 0, 0, 9, 1, 1),
            keyed("l1-b", 0, 10, 19, 1, 1),
            keyed("l1-c", 0, 20, 29, 1, 1),
            keyed("l1-d", 0, 30, 39, 1, 4), // no budget left: never an input
            keyed("fresh-1", 0, 12, 14, 0, 0),
            keyed("fresh-2", 0, 16, 22, 0, 0),
        ];
        assert_eq!(
            ids(&policy(), &splits, LATER),
            [["l1-b", "fresh-1", "fresh-2", "l1-c"]]
        );
        // Without fresh splits a closed bucket is done.
        assert!(ids(&policy(), &splits[..4], LATER).is_empty());
        // One fresh split alone in its bucket's gap joins its nearest level-1 neighbour.
        let lone = vec![
            keyed("l1-low", 0, 0, 9, 1, 1),
            keyed("l1-near", 0, 20, 29, 1, 1),
            keyed("l1-high", 0, 70, 79, 1, 1),
            keyed("fresh", 0, 50, 60, 0, 0),
        ];
        assert_eq!(ids(&policy(), &lone, LATER), [["l1-near", "fresh"]]);
        // Alone in its bucket, it stays as it is (rewriting it would only relabel it).
        assert!(ids(&policy(), &lone[3..], LATER).is_empty());
        // Late splits still arriving wait (policy(): 2 s commits, so 9 s of quiet), unless
        // ten of them wait already.
        let mut late = splits.clone();
        late[4].create_timestamp = LATER - 3;
        assert!(ids(&policy(), &late, LATER).is_empty());
        assert_eq!(ids(&policy(), &late, LATER + 9).len(), 1);
        late.extend((0..8).map(|i| {
            let mut split = keyed(&format!("late-{i}"), 0, 13, 13, 0, 0);
            split.create_timestamp = LATER;
            split
        }));
        assert_eq!(ids(&policy(), &late, LATER)[0].len(), 12);
        // Merges of closed buckets are locality merges, of active ones plain merges.
        let refs: Vec<&SplitMetadata> = lone.iter().collect();
        assert_eq!(
            policy().operation_kind(&refs, &[0, 3], LATER),
            MergeKind::Locality
        );
        assert_eq!(
            policy().operation_kind(&refs, &[0, 3], 10),
            MergeKind::Merge
        );
    }

    #[test]
    fn an_active_bucket_merges_fresh_splits_size_tiered_keeping_two_operations() {
        let now = BUCKET + 30; // bucket 0 is closed, bucket 900 still active
        let mut splits: Vec<SplitMetadata> = (0..23)
            .map(|i| keyed(&format!("f{i:02}"), BUCKET, 0, 255, 0, 0))
            .collect();
        splits.push(keyed("tier1", BUCKET, 0, 255, 0, 1));
        // Two merges already: no budget for tiering (two operations kept).
        splits.extend((0..12).map(|i| keyed(&format!("t2-{i:02}"), BUCKET, 0, 255, 0, 2)));
        let operations = ids(&policy(), &splits, now);
        assert_eq!(operations.len(), 2, "{operations:?}");
        assert_eq!(operations[0].len(), 12);
        assert_eq!(operations[1].len(), 11);
        assert!(operations.iter().flatten().all(|id| id.starts_with('f')));
        // Once the bucket closes, everything left goes into one locality merge.
        let closing = ids(&policy(), &splits, LATER);
        assert_eq!(closing.len(), 1);
        assert_eq!(closing[0].len(), splits.len());
    }

    #[test]
    fn closed_buckets_come_first_newest_first_then_active_ones() {
        let mut splits = Vec::new();
        for bucket in [0, BUCKET, 2 * BUCKET, 3 * BUCKET] {
            for i in 0..10 {
                splits.push(keyed(&format!("b{bucket}-{i}"), bucket, i, i + 5, 0, 0));
            }
        }
        let now = 2 * BUCKET + 200; // buckets 0 and 900 closed, 1800 and 2700 active
        let buckets: Vec<String> = ids(&policy(), &splits, now)
            .iter()
            .map(|op| op[0].split('-').next().unwrap_or_default().to_string())
            .collect();
        assert_eq!(buckets, ["b900", "b0", "b2700", "b1800"]);
    }

    #[test]
    fn random_splits_never_merge_across_buckets_nor_beyond_their_budget() {
        let policy = policy();
        let mut state = 11u64;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % n
        };
        for round in 0..200 {
            // Fresh splits anywhere; level-1 splits of a bucket on disjoint ranges, as the
            // policy leaves them.
            let mut splits: Vec<SplitMetadata> = (0..30)
                .map(|i| {
                    let bucket = next(4) as i64 * BUCKET;
                    let min = next(200) as u8;
                    let max = min.saturating_add(next(50) as u8);
                    keyed(
                        &format!("r{round}-f{i}"),
                        bucket,
                        min,
                        max,
                        0,
                        next(3) as u32,
                    )
                })
                .collect();
            for bucket in 0..4 {
                for slot in 0..12u8 {
                    if next(2) == 0 {
                        let ops = 1 + next(4) as u32;
                        let id = format!("r{round}-b{bucket}-l{slot}");
                        let (min, max) = (slot * 20, slot * 20 + 15);
                        splits.push(keyed(&id, bucket * BUCKET, min, max, 1, ops));
                    }
                }
            }
            let now = next(5) as i64 * BUCKET + 100;
            let by_id: std::collections::HashMap<&str, &SplitMetadata> =
                splits.iter().map(|s| (s.split_id.as_str(), s)).collect();
            let mut used = HashSet::new();
            for op in ids(&policy, &splits, now) {
                assert!(op.len() >= 2);
                let bucket = by_id[op[0].as_str()].time_bucket_start;
                for id in &op {
                    let split = by_id[id.as_str()];
                    assert_eq!(split.time_bucket_start, bucket, "merge across buckets");
                    assert!(split.num_merge_ops < 4, "merged beyond max_merge_ops");
                    assert!(used.insert(id.clone()), "{id} in two operations");
                }
                // A locality merge's outputs span its inputs' keys: no level-1 split of the
                // bucket that could still merge is left inside that span.
                let inputs: Vec<&SplitMetadata> = op.iter().map(|id| by_id[id.as_str()]).collect();
                if inputs.iter().any(|s| s.key_level == 1) {
                    let low = inputs.iter().filter_map(|s| s.sort_key_min.clone()).min();
                    let high = inputs.iter().filter_map(|s| s.sort_key_max.clone()).max();
                    for other in splits.iter().filter(|s| {
                        s.time_bucket_start == bucket
                            && s.key_level == 1
                            && s.num_merge_ops < 4
                            && !op.contains(&s.split_id)
                    }) {
                        let overlaps = other.sort_key_min <= high && low <= other.sort_key_max;
                        assert!(!overlaps, "{} left inside {op:?}", other.split_id);
                    }
                }
            }
        }
    }

    #[test]
    fn a_locality_block_builds_this_policy() {
        let built = crate::policy::merge_policy_from_config(
            &json!({"type": "locality", "sort_fields": ["service"], "max_merge_ops": 2}),
            1000,
        )
        .expect("valid block");
        assert_eq!(built.split_maturity(10, 2), SplitMaturity::Mature);
        assert!(format!("{built:?}").contains("LocalityMergePolicy"));
    }

    #[test]
    fn only_the_merge_budget_makes_a_split_mature() {
        let policy = policy();
        assert_eq!(policy.split_maturity(10, 4), SplitMaturity::Mature);
        assert!(matches!(
            policy.split_maturity(10, 3),
            SplitMaturity::Immature { .. }
        ));
        let old = keyed("old", 0, 0, 1, 1, 1);
        assert!(!policy.is_mature(&old, i64::MAX / 2));
        assert!(policy.is_mature(&keyed("spent", 0, 0, 1, 1, 4), 0));
    }
}
