//! Merge policies: which splits of one merge scope to merge together, decided from split
//! metadata and a clock value passed in. Nothing here does I/O or reads the time.
//!
//! | `type` | policy | semantics |
//! |---|---|---|
//! | `stable_log` (alias `default`) | [`StableLogMergePolicy`] | Quickwit's `StableLogMergePolicy`, exactly |
//! | `limit_merge` | [`LimitMergePolicy`] | Quickwit's `ConstWriteAmplificationMergePolicy`: no byte rewritten more than `max_merge_ops` times |
//! | `no_merge` | [`NoMergePolicy`] | never merges; every split is born mature |
//! | `locality` | [`LocalityMergePolicy`] | per time bucket: size-tiered while the bucket is written, then merges into non-overlapping sort-key ranges |
//!
//! The config is Quickwit's (`indexing_settings.merge_policy` plus
//! `indexing_settings.split_num_docs_target`), parsed by [`MergePolicyConfig::parse`] with
//! errors naming the field. [`plan`] groups splits by [`MergeScope`] and asks the policy for
//! each scope; the node's planner, `shale plan` and the simulator all go through it.

mod limit_merge;
mod locality;
mod no_merge;
mod small_splits;
mod stable_log;

#[cfg(test)]
mod tests;

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use shale_types::{MergeKind, MergeScope, SplitId, SplitMaturity, SplitMetadata};

pub use limit_merge::LimitMergePolicy;
pub use locality::LocalityMergePolicy;
pub use no_merge::NoMergePolicy;
pub use shale_config::{
    LimitMergeConfig, MergePolicyConfig, PolicyConfigError, StableLogConfig,
    DEFAULT_MATURATION_PERIOD_SECS, DEFAULT_MAX_MERGE_FACTOR, DEFAULT_MAX_MERGE_OPS,
    DEFAULT_MERGE_FACTOR, DEFAULT_MIN_LEVEL_NUM_DOCS,
};
pub use small_splits::{small_split_operations, small_split_target};
pub use stable_log::StableLogMergePolicy;

/// One merge: the ids of the splits to merge, in the order the policy produced them, and
/// what the merge does with them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeOperation {
    /// Ids of the input splits (at least two, but one for the locality rewrite of a lone
    /// level-0 split).
    pub split_ids: Vec<SplitId>,
    /// `merge` (one output) or `locality` (level-1 outputs cut at sort-key boundaries);
    /// shown only for `locality`, so that other policies' plans read as Quickwit's.
    #[serde(default, skip_serializing_if = "is_plain_merge")]
    pub kind: MergeKind,
}

fn is_plain_merge(kind: &MergeKind) -> bool {
    *kind == MergeKind::Merge
}

/// The order in which a policy considers splits (see [`MergePolicy::planning_order`]).
pub type SplitOrder = fn(&SplitMetadata, &SplitMetadata) -> Ordering;

/// A merge policy: a pure function of one merge scope's splits and the time.
///
/// Implementors provide [`merge_positions`](MergePolicy::merge_positions) (operations as
/// positions into the input, which costs no allocation of ids); [`operations`](MergePolicy::operations)
/// is derived from it, so both always agree.
pub trait MergePolicy: Send + Sync + fmt::Debug {
    /// The operations for one merge scope's splits (the caller has grouped them by scope and
    /// kept the Published ones), each as positions into `splits`, in the policy's order.
    /// Mature splits are never part of an operation.
    fn merge_positions(&self, splits: &[&SplitMetadata], now: i64) -> Vec<Vec<usize>>;

    /// Maturity of a fresh or merged split with `num_docs` documents made by `num_merge_ops`
    /// merges.
    fn split_maturity(&self, num_docs: u64, num_merge_ops: u32) -> SplitMaturity;

    /// Whether the policy sets `split` aside at `now`: its recorded maturity says so (mature,
    /// or its maturation period is over), or the policy's own limits do (e.g. it already has
    /// `split_num_docs_target` documents).
    fn is_mature(&self, split: &SplitMetadata, now: i64) -> bool {
        split.is_mature(now)
    }

    /// Merges to run when a stream of splits ends for good (Quickwit's "finalize" merges,
    /// run when an indexing pipeline finishes), as positions into `splits`. None by default.
    fn finalize_positions(&self, _splits: &[&SplitMetadata], _now: i64) -> Vec<Vec<usize>> {
        Vec::new()
    }

    /// The order in which the policy considers splits, if it has one. Results never depend on
    /// the input order; a caller that plans the same scope again and again (the simulator) may
    /// keep its splits in this order so that the policy's own sort finds them already sorted.
    fn planning_order(&self) -> Option<SplitOrder> {
        None
    }

    /// What the operation `positions` (one of [`merge_positions`](MergePolicy::merge_positions)'
    /// results for the same `splits` and `now`) does: a plain merge unless the policy says so.
    fn operation_kind(
        &self,
        _splits: &[&SplitMetadata],
        _positions: &[usize],
        _now: i64,
    ) -> MergeKind {
        MergeKind::Merge
    }

    /// The operations for one merge scope's splits, each's ids in the policy's order,
    /// operations in the order the policy returns them.
    fn operations(&self, splits: &[SplitMetadata], now: i64) -> Vec<MergeOperation> {
        let refs: Vec<&SplitMetadata> = splits.iter().collect();
        let positions = self.merge_positions(&refs, now);
        with_kinds(self, &refs, positions, now)
    }

    /// [`finalize_positions`](MergePolicy::finalize_positions) as operations.
    fn finalize_operations(&self, splits: &[SplitMetadata], now: i64) -> Vec<MergeOperation> {
        let refs: Vec<&SplitMetadata> = splits.iter().collect();
        to_operations(&refs, self.finalize_positions(&refs, now))
    }
}

/// Turns positions into (plain) operations carrying split ids.
pub fn to_operations(splits: &[&SplitMetadata], positions: Vec<Vec<usize>>) -> Vec<MergeOperation> {
    positions
        .into_iter()
        .map(|op| MergeOperation {
            split_ids: op.iter().map(|&pos| splits[pos].split_id.clone()).collect(),
            kind: MergeKind::Merge,
        })
        .collect()
}

/// Turns positions into operations carrying split ids and the kind `policy` gives them.
pub fn with_kinds<P: MergePolicy + ?Sized>(
    policy: &P,
    splits: &[&SplitMetadata],
    positions: Vec<Vec<usize>>,
    now: i64,
) -> Vec<MergeOperation> {
    positions
        .into_iter()
        .map(|op| MergeOperation {
            kind: policy.operation_kind(splits, &op, now),
            split_ids: op.iter().map(|&pos| splits[pos].split_id.clone()).collect(),
        })
        .collect()
}

/// Groups `splits` by merge scope (adding `node_id` to the scope when `node_local`) and asks
/// `policy` for each scope's operations. Scopes come sorted; scopes without operations are
/// left out. The caller passes Published splits only.
pub fn plan(
    splits: &[SplitMetadata],
    policy: &dyn MergePolicy,
    node_local: bool,
    now: i64,
) -> Vec<(MergeScope, Vec<MergeOperation>)> {
    let mut scopes: BTreeMap<MergeScope, Vec<&SplitMetadata>> = BTreeMap::new();
    for split in splits {
        scopes
            .entry(split.merge_scope(node_local))
            .or_default()
            .push(split);
    }
    scopes
        .into_iter()
        .filter_map(|(scope, members)| {
            let positions = policy.merge_positions(&members, now);
            let operations = with_kinds(policy, &members, positions, now);
            (!operations.is_empty()).then_some((scope, operations))
        })
        .collect()
}

/// Parses a raw `merge_policy` block (as written by a user, e.g. for `shale plan`) and builds
/// the policy for splits of `split_num_docs_target` documents.
pub fn merge_policy_from_config(
    merge_policy: &serde_json::Value,
    split_num_docs_target: u64,
) -> Result<Arc<dyn MergePolicy>, PolicyConfigError> {
    let config = MergePolicyConfig::parse(merge_policy)?;
    Ok(build_policy(&config, split_num_docs_target))
}

/// The policy of an index, from its (typed, validated) indexing settings.
pub fn index_merge_policy(settings: &shale_config::IndexingSettings) -> Arc<dyn MergePolicy> {
    match &settings.merge_policy {
        // A bucket closes a few commit timeouts after its end.
        MergePolicyConfig::Locality(config) => Arc::new(LocalityMergePolicy::new(
            config.clone(),
            settings.commit_timeout_secs,
        )),
        other => build_policy(other, settings.split_num_docs_target),
    }
}

/// The policy described by `config` for splits of `split_num_docs_target` documents.
pub fn build_policy(
    config: &MergePolicyConfig,
    split_num_docs_target: u64,
) -> Arc<dyn MergePolicy> {
    match config {
        MergePolicyConfig::NoMerge => Arc::new(NoMergePolicy),
        MergePolicyConfig::LimitMerge(config) => {
            Arc::new(LimitMergePolicy::new(config.clone(), split_num_docs_target))
        }
        MergePolicyConfig::StableLog(config) => Arc::new(StableLogMergePolicy::new(
            config.clone(),
            split_num_docs_target,
        )),
        MergePolicyConfig::Locality(config) => Arc::new(LocalityMergePolicy::new(
            config.clone(),
            shale_config::DEFAULT_COMMIT_TIMEOUT_SECS,
        )),
    }
}
