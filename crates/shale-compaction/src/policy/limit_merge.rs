//! `limit_merge`: Quickwit's `ConstWriteAmplificationMergePolicy`. No document is rewritten
//! more than `max_merge_ops` times, so write amplification is bounded whatever the split sizes.
//!
//! * Mature splits are set aside: recorded as mature, past their maturation period, made by
//!   `max_merge_ops` merges or more, or holding `split_num_docs_target` documents or more.
//! * The others are grouped by `num_merge_ops`; only splits of one group merge together.
//!   Groups are visited by increasing `num_merge_ops` (Quickwit visits them in hash-map order).
//! * Within a group, splits are sorted oldest first (`create_timestamp`, then split id) and
//!   taken greedily from the front: up to `max_merge_factor` splits, stopping early at the
//!   split that brings the merge to `split_num_docs_target` documents. A merge of fewer than
//!   `merge_factor` splits that stays under the target is not made, and the group is done.
//! * Finalize merges (when a stream of splits ends, if `max_finalize_merge_operations > 0`):
//!   splits over `max_finalize_split_num_docs` are left out too, the rest are sorted youngest
//!   first (then by split id) regardless of `num_merge_ops`, and at most
//!   `max_finalize_merge_operations` merges of `min(3, max_merge_factor)` to `max_merge_factor`
//!   splits are taken greedily from the front.
//!
//! A fresh or merged split is mature once made by `max_merge_ops` merges or holding the docs
//! target; otherwise it is immature for `maturation_period`.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use shale_types::{SplitMaturity, SplitMetadata};

use super::{LimitMergeConfig, MergePolicy};

/// Fewest splits in a finalize merge.
const FINALIZE_MIN_MERGE_FACTOR: usize = 3;

/// Quickwit's `ConstWriteAmplificationMergePolicy` (see the module docs).
#[derive(Clone, Debug)]
pub struct LimitMergePolicy {
    config: LimitMergeConfig,
    split_num_docs_target: u64,
}

impl LimitMergePolicy {
    /// A policy with `config` for splits of `split_num_docs_target` documents.
    pub fn new(config: LimitMergeConfig, split_num_docs_target: u64) -> Self {
        LimitMergePolicy {
            config,
            split_num_docs_target,
        }
    }

    /// The settings.
    pub fn config(&self) -> &LimitMergeConfig {
        &self.config
    }

    /// How many splits from the front of `sorted` make the next merge, if any.
    fn next_merge_len(
        &self,
        splits: &[&SplitMetadata],
        sorted: &[usize],
        merge_factor_range: &RangeInclusive<usize>,
    ) -> Option<usize> {
        let mut num_splits = 0;
        let mut num_docs: u64 = 0;
        for &pos in sorted.iter().take(*merge_factor_range.end()) {
            num_docs = num_docs.saturating_add(splits[pos].num_docs);
            num_splits += 1;
            if num_docs >= self.split_num_docs_target {
                break;
            }
        }
        if num_docs < self.split_num_docs_target && num_splits < *merge_factor_range.start() {
            return None;
        }
        // Quickwit asserts here; a merge of one split is no merge.
        (num_splits >= 2).then_some(num_splits)
    }

    fn greedy_merges(
        &self,
        splits: &[&SplitMetadata],
        mut sorted: &[usize],
        merge_factor_range: RangeInclusive<usize>,
        max_operations: usize,
        operations: &mut Vec<Vec<usize>>,
    ) {
        let mut count = 0;
        while count < max_operations {
            let Some(len) = self.next_merge_len(splits, sorted, &merge_factor_range) else {
                break;
            };
            operations.push(sorted[..len].to_vec());
            sorted = &sorted[len..];
            count += 1;
        }
    }
}

impl MergePolicy for LimitMergePolicy {
    fn merge_positions(&self, splits: &[&SplitMetadata], now: i64) -> Vec<Vec<usize>> {
        let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (pos, split) in splits.iter().enumerate() {
            if !self.is_mature(split, now) {
                groups.entry(split.num_merge_ops).or_default().push(pos);
            }
        }
        let mut operations = Vec::new();
        for group in groups.values_mut() {
            group.sort_by(|&left, &right| {
                let (left, right) = (splits[left], splits[right]);
                left.create_timestamp
                    .cmp(&right.create_timestamp)
                    .then_with(|| left.split_id.cmp(&right.split_id))
            });
            let range = self.config.merge_factor..=self.config.max_merge_factor;
            self.greedy_merges(splits, group, range, usize::MAX, &mut operations);
        }
        operations
    }

    fn finalize_positions(&self, splits: &[&SplitMetadata], now: i64) -> Vec<Vec<usize>> {
        if self.config.max_finalize_merge_operations == 0 {
            return Vec::new();
        }
        let mut young: Vec<usize> = (0..splits.len())
            .filter(|&pos| {
                let split = splits[pos];
                let too_big = self
                    .config
                    .max_finalize_split_num_docs
                    .is_some_and(|max| split.num_docs > max);
                !too_big && !self.is_mature(split, now)
            })
            .collect();
        young.sort_by(|&left, &right| {
            let (left, right) = (splits[left], splits[right]);
            right
                .create_timestamp
                .cmp(&left.create_timestamp)
                .then_with(|| left.split_id.cmp(&right.split_id))
        });
        let min_merge_factor = FINALIZE_MIN_MERGE_FACTOR.min(self.config.max_merge_factor);
        let mut operations = Vec::new();
        self.greedy_merges(
            splits,
            &young,
            min_merge_factor..=self.config.max_merge_factor,
            self.config.max_finalize_merge_operations,
            &mut operations,
        );
        operations
    }

    fn split_maturity(&self, num_docs: u64, num_merge_ops: u32) -> SplitMaturity {
        self.config
            .split_maturity(self.split_num_docs_target, num_docs, num_merge_ops)
    }

    fn is_mature(&self, split: &SplitMetadata, now: i64) -> bool {
        split.is_mature(now)
            || split.num_merge_ops >= self.config.max_merge_ops
            || split.num_docs >= self.split_num_docs_target
    }
}
