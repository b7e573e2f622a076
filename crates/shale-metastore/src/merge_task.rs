//! Merge tasks: the merges the planner decided on, recorded in the metastore so that any node
//! can claim and run them.
//!
//! Life cycle: [`Metastore::create_merge_tasks`](crate::Metastore::create_merge_tasks) records
//! tasks as `Pending`; a worker claims one
//! ([`claim_merge_task`](crate::Metastore::claim_merge_task)), which makes it `Running` under a
//! lease it renews while merging; then it either publishes the output
//! ([`publish_merge`](crate::Metastore::publish_merge), `Succeeded`) or reports a failure
//! ([`fail_merge_task`](crate::Metastore::fail_merge_task): back to `Pending` for a retry, or
//! `Failed`). A `Running` task whose lease expired can be claimed again by any node.
//!
//! Invariant: a split is an input of at most one *live* (`Pending` or `Running`) task.

use serde::{Deserialize, Serialize};
use shale_types::{IndexUid, MergeKind, MergeScope, MergeTrigger, SplitId};

/// The state of a [`MergeTask`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum MergeTaskState {
    /// Waiting for a worker to claim it.
    Pending,
    /// Claimed by a worker, which holds a lease on it.
    Running,
    /// Its output was published and its inputs marked for deletion.
    Succeeded,
    /// Given up: its inputs changed, or it failed too many times.
    Failed,
}

impl MergeTaskState {
    /// Every state, in life-cycle order.
    pub const ALL: [MergeTaskState; 4] = [
        MergeTaskState::Pending,
        MergeTaskState::Running,
        MergeTaskState::Succeeded,
        MergeTaskState::Failed,
    ];

    /// The state's name, as stored and serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            MergeTaskState::Pending => "Pending",
            MergeTaskState::Running => "Running",
            MergeTaskState::Succeeded => "Succeeded",
            MergeTaskState::Failed => "Failed",
        }
    }

    /// The state named `name` (as produced by [`MergeTaskState::as_str`]).
    pub fn parse(name: &str) -> Option<Self> {
        MergeTaskState::ALL
            .into_iter()
            .find(|state| state.as_str() == name)
    }

    /// Whether a task in this state holds its input splits (`Pending` or `Running`).
    pub fn is_live(self) -> bool {
        matches!(self, MergeTaskState::Pending | MergeTaskState::Running)
    }
}

impl std::fmt::Display for MergeTaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A merge of splits of one index, as stored in the metastore.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeTask {
    /// A ULID: tasks sort by creation time.
    pub task_id: String,
    /// The index whose splits are merged.
    pub index_uid: IndexUid,
    /// The merge scope of the inputs; with a node id in `node_local` mode.
    pub scope: MergeScope,
    /// The input splits, in the order the merge policy produced them.
    pub split_ids: Vec<SplitId>,
    /// What the merge does with them.
    #[serde(default)]
    pub kind: MergeKind,
    /// Why it was planned.
    #[serde(default)]
    pub trigger: MergeTrigger,
    /// The manual compaction it belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_id: Option<String>,
    /// Where the task is in its life cycle.
    pub state: MergeTaskState,
    /// The node holding the lease while `Running`; afterwards the node that last held it
    /// (`None` while `Pending`).
    pub lease_owner: Option<String>,
    /// When the lease expires (seconds since epoch), while `Running`.
    pub lease_expires_at: Option<i64>,
    /// How many times the task was claimed.
    pub attempts: u32,
    /// Claims allowed before the task is given up.
    pub max_attempts: u32,
    /// The (first) split the merge produced, once `Succeeded` (`None` if it produced none).
    pub output_split_id: Option<SplitId>,
    /// Every split the merge produced, once `Succeeded` (a locality merge may cut several).
    #[serde(default)]
    pub output_split_ids: Vec<SplitId>,
    /// The last failure, if any.
    pub error: Option<String>,
    /// Seconds since epoch.
    pub create_timestamp: i64,
    /// Seconds since epoch of the last state or lease change.
    pub update_timestamp: i64,
}

impl MergeTask {
    /// Whether the task holds its input splits (`Pending` or `Running`).
    pub fn is_live(&self) -> bool {
        self.state.is_live()
    }
}

/// A merge task to create, as planned by a merge policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewMergeTask {
    /// The merge scope of the inputs.
    pub scope: MergeScope,
    /// The input splits, in the policy's order; at least one, no duplicates.
    pub split_ids: Vec<SplitId>,
    /// What the merge does with them.
    #[serde(default)]
    pub kind: MergeKind,
    /// Why it is planned.
    #[serde(default)]
    pub trigger: MergeTrigger,
    /// The manual compaction it belongs to, if any.
    #[serde(default)]
    pub compaction_id: Option<String>,
}

impl NewMergeTask {
    /// A (plain) merge of `split_ids` in `scope`, planned by the merge policy.
    pub fn new(scope: MergeScope, split_ids: Vec<SplitId>) -> Self {
        NewMergeTask {
            scope,
            split_ids,
            kind: MergeKind::Merge,
            trigger: MergeTrigger::Policy,
            compaction_id: None,
        }
    }

    /// The same task, planned by `trigger`.
    pub fn with_trigger(mut self, trigger: MergeTrigger) -> Self {
        self.trigger = trigger;
        self
    }

    /// The same task, part of the manual compaction `compaction_id`.
    pub fn with_compaction(mut self, compaction_id: impl Into<String>) -> Self {
        self.trigger = MergeTrigger::Manual;
        self.compaction_id = Some(compaction_id.into());
        self
    }

    /// The same task, doing a merge of `kind`.
    pub fn with_kind(mut self, kind: MergeKind) -> Self {
        self.kind = kind;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_names() {
        for state in MergeTaskState::ALL {
            assert_eq!(MergeTaskState::parse(state.as_str()), Some(state));
            let json = serde_json::to_string(&state).expect("serialize");
            assert_eq!(json, format!("\"{state}\""));
        }
        assert_eq!(MergeTaskState::parse("pending"), None);
        let live: Vec<_> = MergeTaskState::ALL
            .into_iter()
            .filter(|state| state.is_live())
            .collect();
        assert_eq!(live, [MergeTaskState::Pending, MergeTaskState::Running]);
    }
}
