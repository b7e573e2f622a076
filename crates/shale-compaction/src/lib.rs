//! Compaction: which splits to merge, and what that does to a cluster over time.
//!
//! * [`policy`]: the merge policies — pure functions of `(splits, now)`, no I/O, no clock —
//!   (`stable_log`, Quickwit's `StableLogMergePolicy` exactly; `limit_merge`, Quickwit's
//!   `ConstWriteAmplificationMergePolicy`; `no_merge`), their Quickwit-compatible config, and
//!   [`policy::plan`], which groups splits by merge scope and asks the policy. The node's
//!   planner, `shale plan` and the simulator all call this same code.
//! * [`simulator`]: a deterministic cluster simulator (`shale simulate`): nodes commit splits
//!   tick after tick, come and go, and planning rounds apply what the policy emits, in
//!   `cluster` or `node_local` scope.
//! * [`service`]: compaction at run time on a node — the planner recording merge tasks in the
//!   metastore, workers merging and publishing atomically, the janitor. The only module here
//!   that does I/O.

#![warn(missing_docs)]

pub mod policy;
pub mod service;
pub mod simulator;

pub use policy::{
    index_merge_policy, merge_policy_from_config, plan, MergeOperation, MergePolicy,
    MergePolicyConfig, PolicyConfigError,
};
