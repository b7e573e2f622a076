//! `no_merge`: Quickwit's `NopMergePolicy`. Never merges; every split is born mature.

use shale_types::{SplitMaturity, SplitMetadata};

use super::MergePolicy;

/// Never merges (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoMergePolicy;

impl MergePolicy for NoMergePolicy {
    fn merge_positions(&self, _splits: &[&SplitMetadata], _now: i64) -> Vec<Vec<usize>> {
        Vec::new()
    }

    fn split_maturity(&self, _num_docs: u64, _num_merge_ops: u32) -> SplitMaturity {
        SplitMaturity::Mature
    }

    fn is_mature(&self, _split: &SplitMetadata, _now: i64) -> bool {
        true
    }
}
