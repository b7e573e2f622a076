//! `stable_log`: Quickwit's `StableLogMergePolicy`, reproduced decision for decision.
//!
//! 1. Fewer than two splits: nothing to do.
//! 2. Mature splits are set aside: recorded as mature, past their maturation period
//!    (`create_timestamp + period <= now`), or holding `split_num_docs_target` documents or more.
//! 3. The others are sorted by time-range end, latest first (no time range sorts last), then by
//!    number of documents, fewest first, then by split id.
//! 4. Levels are cut along that order: the first level's bound is
//!    `max(3 × docs of the first split, min_level_num_docs)`; a split whose docs reach the
//!    current bound (`>=`) opens a new level whose bound is 3 × its docs.
//! 5. Levels are visited from the last (the largest splits) to the first, and each gives at
//!    most one operation: a candidate grown backwards from the level's end, one split at a time,
//!    until it holds `max_merge_factor` splits or `split_num_docs_target` documents (the split
//!    that reaches the target is kept). A candidate with fewer than `merge_factor` splits that
//!    stays under the target is dropped; so is one of a single split.
//!
//! Each operation lists its splits in the sorted order of step 3, and operations come in the
//! order the levels are visited. Where Quickwit would panic (an immature split that already
//! holds the target number of docs), the split is simply set aside as mature.

use std::cmp::Ordering;
use std::ops::Range;

use shale_types::{SplitMaturity, SplitMetadata};

use super::{MergePolicy, SplitOrder, StableLogConfig};

/// Quickwit's `StableLogMergePolicy` (see the module docs).
#[derive(Clone, Debug)]
pub struct StableLogMergePolicy {
    config: StableLogConfig,
    split_num_docs_target: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CandidateSize {
    /// Not worth a merge.
    TooSmall,
    /// Worth a merge; more splits may still be added.
    Valid,
    /// Worth a merge; adding one more split would make it too big.
    Full,
}

/// Latest time-range end first (no time range last), then fewest docs, then split id.
pub fn cmp_by_reverse_time_end(left: &SplitMetadata, right: &SplitMetadata) -> Ordering {
    let left_end = left.time_range.map(|range| range.end);
    let right_end = right.time_range.map(|range| range.end);
    right_end
        .cmp(&left_end)
        .then_with(|| left.num_docs.cmp(&right.num_docs))
        .then_with(|| left.split_id.cmp(&right.split_id))
}

impl StableLogMergePolicy {
    /// A policy with `config` for splits of `split_num_docs_target` documents.
    pub fn new(config: StableLogConfig, split_num_docs_target: u64) -> Self {
        StableLogMergePolicy {
            config,
            split_num_docs_target,
        }
    }

    /// The settings.
    pub fn config(&self) -> &StableLogConfig {
        &self.config
    }

    /// The docs target: splits this big are mature.
    pub fn split_num_docs_target(&self) -> u64 {
        self.split_num_docs_target
    }

    /// Cuts `sorted` (positions into `splits`, in policy order) into levels, as ranges of
    /// `sorted`. Empty ranges are kept, as Quickwit keeps them (they never yield a merge).
    pub(crate) fn levels(&self, splits: &[&SplitMetadata], sorted: &[usize]) -> Vec<Range<usize>> {
        let Some(&first) = sorted.first() else {
            return Vec::new();
        };
        let mut levels = Vec::new();
        let mut level_start = 0;
        let mut level_bound = splits[first]
            .num_docs
            .saturating_mul(3)
            .max(self.config.min_level_num_docs);
        for (ord, &pos) in sorted.iter().enumerate() {
            let num_docs = splits[pos].num_docs;
            if num_docs >= level_bound {
                levels.push(level_start..ord);
                level_start = ord;
                level_bound = num_docs.saturating_mul(3);
            }
        }
        levels.push(level_start..sorted.len());
        levels
    }

    fn candidate_size(&self, num_splits: usize, num_docs: u64) -> CandidateSize {
        if num_splits <= 1 {
            return CandidateSize::TooSmall;
        }
        if num_splits >= self.config.max_merge_factor {
            return CandidateSize::Full;
        }
        if num_docs >= self.split_num_docs_target {
            return CandidateSize::Full;
        }
        if num_splits < self.config.merge_factor {
            return CandidateSize::TooSmall;
        }
        CandidateSize::Valid
    }

    /// The merge candidate of one level, as a range of `sorted`.
    fn level_candidate(
        &self,
        splits: &[&SplitMetadata],
        sorted: &[usize],
        level: Range<usize>,
    ) -> Option<Range<usize>> {
        let end = level.end;
        let mut start = end;
        let mut num_docs: u64 = 0;
        for ord in level.rev() {
            if self.candidate_size(end - start, num_docs) == CandidateSize::Full {
                break;
            }
            start = ord;
            num_docs = num_docs.saturating_add(splits[sorted[ord]].num_docs);
        }
        if self.candidate_size(end - start, num_docs) == CandidateSize::TooSmall {
            return None;
        }
        Some(start..end)
    }
}

impl MergePolicy for StableLogMergePolicy {
    fn merge_positions(&self, splits: &[&SplitMetadata], now: i64) -> Vec<Vec<usize>> {
        if splits.len() < 2 {
            return Vec::new();
        }
        let mut sorted: Vec<usize> = (0..splits.len())
            .filter(|&pos| !self.is_mature(splits[pos], now))
            .collect();
        // Adaptive: linear when the caller keeps its splits in `planning_order`.
        sorted.sort_by(|&left, &right| cmp_by_reverse_time_end(splits[left], splits[right]));
        let mut operations = Vec::new();
        for level in self.levels(splits, &sorted).into_iter().rev() {
            // Levels are disjoint and visited from the last, so removing a candidate (as
            // Quickwit does) never shifts the levels still to visit: no need to remove it.
            if let Some(candidate) = self.level_candidate(splits, &sorted, level) {
                operations.push(sorted[candidate].to_vec());
            }
        }
        operations
    }

    fn split_maturity(&self, num_docs: u64, _num_merge_ops: u32) -> SplitMaturity {
        self.config
            .split_maturity(self.split_num_docs_target, num_docs)
    }

    fn is_mature(&self, split: &SplitMetadata, now: i64) -> bool {
        split.is_mature(now) || split.num_docs >= self.split_num_docs_target
    }

    fn planning_order(&self) -> Option<SplitOrder> {
        Some(cmp_by_reverse_time_end)
    }
}
