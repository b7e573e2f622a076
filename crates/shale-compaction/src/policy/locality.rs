//! The `locality` policy: which splits of one merge scope to merge, bucket by bucket, so that a
//! bucket no longer written to ends as level-1 splits whose sort-key ranges do not overlap
//! (the plan and its reasons: `docs/design/locality-compaction.md`). A pure function of the
//! split metadata and the time; the merge worker cuts the outputs at key boundaries.
//!
//! - Splits merge only with splits of the same time bucket (`time_bucket_start`).
//! - A bucket is *active* until the event-time watermark (the newest document time of the
//!   scope's splits, at most `now`) is `close_delay_secs` past its end — or the clock is and
//!   the bucket got no split for `quiet_secs` (ingest stopped). There, level-0 splits merge
//!   size-tiered (by number of merges: `merge_factor` to `max_merge_factor` splits of one tier),
//!   for at most `max_merge_ops − 2` operations, keeping two for what follows.
//! - In a *closed* bucket, every level-0 split with budget left merges with the level-1
//!   splits (with budget left) inside the key envelope of those level-0 splits — one locality
//!   merge whose outputs are level 1 — once the bucket's inflow has settled: no fresh split in
//!   the last `quiet_secs` (two commit timeouts and 5 s), or fresh splits of that period weigh
//!   at most a tenth of the level-0 documents *and* the level-0 documents weigh at least as
//!   much as the level-1 documents they would rewrite. So a bucket closes into level 1 when
//!   its on-time data stops, while a trickle of late data is batched (size-tiered meanwhile)
//!   until it stops, instead of rewriting the level-1 splits for every late commit.
//!   A lone level-0 split with nothing to join is rewritten alone, so a closed bucket ends
//!   with no level-0 split.
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

    /// The event-time watermark of a scope: the newest document time its splits hold, but
    /// never past `now` (documents from the future do not close buckets). A bucket closes when
    /// the watermark passes it, so that a backfill replayed in time order closes its buckets
    /// as it goes, as live ingest does.
    fn watermark(splits: &[&SplitMetadata], now: i64) -> i64 {
        splits
            .iter()
            .filter_map(|split| split.time_range.map(|range| range.end))
            .max()
            .map_or(now, |end| end.min(now))
    }

    /// Whether the bucket of `members` is closed: the watermark passed its end by the close
    /// delay, or the clock did and no split of it was made for `quiet_secs` (ingest stopped:
    /// the watermark no longer moves).
    fn is_closed(
        &self,
        splits: &[&SplitMetadata],
        members: &[usize],
        watermark: i64,
        now: i64,
    ) -> bool {
        let Some(start) = members
            .first()
            .and_then(|pos| splits[*pos].time_bucket_start)
        else {
            // Documents without a timestamp keep coming: their bucket never closes.
            return false;
        };
        let closes_at = start
            .saturating_add(self.config.time_bucket_secs as i64)
            .saturating_add(self.close_delay_secs);
        let quiet = members.iter().all(|pos| {
            splits[*pos]
                .create_timestamp
                .saturating_add(self.quiet_secs)
                <= now
        });
        closes_at <= watermark || (closes_at <= now && quiet)
    }

    /// The locality merge of a closed bucket, if it has one at `now`.
    fn locality_merge(
        &self,
        splits: &[&SplitMetadata],
        bucket: &[usize],
        now: i64,
    ) -> Option<Vec<usize>> {
        let ranged = |pos: &usize| {
            let split = splits[*pos];
            match (&split.sort_key_min, &split.sort_key_max) {
                (Some(min), Some(max)) => Some((*pos, min, max)),
                _ => None,
            }
        };
        let level1: Vec<_> = bucket
            .iter()
            .filter(|pos| splits[**pos].key_level > 0)
            .filter_map(ranged)
            .collect();
        // Level-1 splits out of budget stay as they are: fresh splits overlapping them can
        // never join level 1 (they stay level 0, size-tiered).
        let (level1, spent): (Vec<_>, Vec<_>) = level1
            .into_iter()
            .partition(|(pos, _, _)| self.ops_left(splits[*pos]) > 0);
        let level0: Vec<_> = bucket
            .iter()
            .filter(|pos| splits[**pos].key_level == 0 && self.ops_left(splits[**pos]) > 0)
            .filter_map(ranged)
            .filter(|(_, min, max)| {
                !spent
                    .iter()
                    .any(|(_, spent_min, spent_max)| *min <= *spent_max && *spent_min <= *max)
            })
            .collect();
        let low = level0.iter().map(|(_, min, _)| *min).min()?;
        let high = level0.iter().map(|(_, _, max)| *max).max()?;
        let mut inputs: Vec<usize> = level0.iter().map(|(pos, _, _)| *pos).collect();
        let overlapping: Vec<usize> = level1
            .iter()
            .filter(|(_, min, max)| *min <= high && low <= *max)
            .map(|(pos, _, _)| *pos)
            .collect();
        // When to merge. A bucket without level-1 splits yet has just closed: its level-0
        // splits go to level 1 at once. Later (late data), only once the bucket's inflow
        // stopped (no level-0 split made in the last `quiet_secs`), or when what arrived
        // recently is at most a tenth of what waits and what waits weighs at least as much
        // as the level-1 documents it would rewrite.
        let has_level1 = bucket.iter().any(|pos| splits[*pos].key_level > 0);
        let docs = |positions: &mut dyn Iterator<Item = usize>| -> u64 {
            positions.map(|pos| splits[pos].num_docs).sum()
        };
        let level0_docs = docs(&mut level0.iter().map(|(pos, _, _)| *pos));
        let recent_docs = docs(&mut level0.iter().map(|(pos, _, _)| *pos).filter(|pos| {
            splits[*pos]
                .create_timestamp
                .saturating_add(self.quiet_secs)
                > now
        }));
        let rewritten_docs = docs(&mut overlapping.iter().copied());
        let settled = !has_level1
            || recent_docs == 0
            || (recent_docs.saturating_mul(10) <= level0_docs && level0_docs >= rewritten_docs);
        if !settled {
            return None;
        }
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
        // A lone level-0 split with nothing to join (the bucket's only split, or level-1
        // neighbours out of budget) is rewritten alone into level 1: a closed bucket ends with
        // no level-0 split, and one bigger than the target is cut to size.
        if inputs.is_empty() {
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
        let watermark = Self::watermark(splits, now);
        let mut order: Vec<(bool, Option<i64>)> = buckets
            .iter()
            .map(|(bucket, members)| (self.is_closed(splits, members, watermark, now), *bucket))
            .collect();
        order.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
        let mut operations = Vec::new();
        for (closed, bucket) in order {
            let members = &buckets[&bucket];
            match closed
                .then(|| self.locality_merge(splits, members, now))
                .flatten()
            {
                Some(locality) => operations.push(locality),
                // Active buckets, and closed ones whose fresh splits still wait: size-tiered.
                None => operations.extend(self.tiered_merges(splits, members)),
            }
        }
        operations
    }

    /// The locality merge of a closed bucket is a locality merge (level-1 outputs); the
    /// size-tiered merges of fresh splits are plain ones (one level-0 output).
    fn operation_kind(
        &self,
        splits: &[&SplitMetadata],
        positions: &[usize],
        now: i64,
    ) -> MergeKind {
        let Some(&first) = positions.first() else {
            return MergeKind::Merge;
        };
        let bucket = splits[first].time_bucket_start;
        let members: Vec<usize> = (0..splits.len())
            .filter(|&pos| splits[pos].time_bucket_start == bucket)
            .collect();
        if !self.is_closed(splits, &members, Self::watermark(splits, now), now) {
            return MergeKind::Merge;
        }
        match self.locality_merge(splits, &members, now) {
            Some(locality) if locality == positions => MergeKind::Locality,
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
        // Alone in its bucket, it is rewritten alone into level 1 (a locality merge).
        assert_eq!(ids(&policy(), &lone[3..], LATER), [["fresh"]]);
        let alone: Vec<&SplitMetadata> = lone[3..].iter().collect();
        assert_eq!(
            policy().operation_kind(&alone, &[0], LATER),
            MergeKind::Locality
        );
        // So is one whose only neighbours are out of budget, and nothing else of the bucket.
        let spent_neighbours = vec![
            keyed("l1-spent", 0, 0, 9, 1, 4),
            keyed("fresh", 0, 50, 60, 0, 0),
        ];
        assert_eq!(ids(&policy(), &spent_neighbours, LATER), [["fresh"]]);
        // Not while its bucket is active.
        assert!(ids(&policy(), &lone[3..], 10).is_empty());
        // Late splits still arriving wait (policy(): 2 s commits, so 9 s of quiet)...
        let mut late = splits.clone();
        late[4].create_timestamp = LATER - 3;
        assert!(ids(&policy(), &late, LATER).is_empty());
        assert_eq!(ids(&policy(), &late, LATER + 9).len(), 1);
        // ... and when many pour in, they merge size-tiered among themselves meanwhile.
        late.extend((0..8).map(|i| {
            let mut split = keyed(&format!("late-{i}"), 0, 13, 13, 0, 0);
            split.create_timestamp = LATER;
            split
        }));
        let operations = policy().operations(&late, LATER);
        assert_eq!(operations.len(), 1);
        assert_eq!(operations[0].split_ids.len(), 10);
        assert_eq!(operations[0].kind, MergeKind::Merge, "{operations:?}");
        // A bucket whose recent inflow is small next to what waits merges into level 1.
        let mut settled: Vec<SplitMetadata> = (0..3)
            .map(|i| {
                let mut split = keyed(&format!("old-{i}"), 0, 0, 200, 0, 0);
                split.num_docs = 50_000;
                split
            })
            .collect();
        let mut trickle = keyed("trickle", 0, 5, 6, 0, 0);
        trickle.create_timestamp = LATER;
        settled.push(trickle);
        // Data of the current bucket moves the watermark past bucket 0, which closes although
        // it still receives splits.
        let current_bucket = LATER - LATER % BUCKET;
        settled.push(keyed("current", current_bucket, 0, 1, 0, 0));
        let operations = policy().operations(&settled, LATER);
        assert_eq!(operations.len(), 1);
        assert_eq!(operations[0].split_ids.len(), 4);
        assert_eq!(operations[0].kind, MergeKind::Locality);
        // But late data too small for the level-1 splits it would rewrite waits to stop.
        let mut big_level1 = keyed("l1-big", 0, 0, 200, 1, 1);
        big_level1.num_docs = 10_000_000;
        settled.push(big_level1);
        assert!(policy().operations(&settled, LATER).is_empty());
        assert_eq!(policy().operations(&settled, LATER + 9).len(), 1);
        // Merges of closed buckets are locality merges, of active ones plain merges.
        let refs: Vec<&SplitMetadata> = lone.iter().collect();
        assert_eq!(
            policy().operation_kind(&refs, &[1, 3], LATER),
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
                // One input only for a lone level-0 split rewritten into level 1.
                assert!(
                    op.len() >= 2 || by_id[op[0].as_str()].key_level == 0,
                    "{op:?}"
                );
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
