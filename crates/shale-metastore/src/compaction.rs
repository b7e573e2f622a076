//! Manual compactions: an operator's request to compact an index now ("merge everything
//! eligible down to the target and apply every pending delete"), recorded so that its state
//! survives restarts and can be polled while any node runs its merges.
//!
//! Life cycle: `pending` (recorded) → `executing` (the leader planned its merge tasks, each
//! carrying the compaction's id) → `completed` when they all succeeded, `failed` when one
//! failed for good. A compaction with nothing to do completes at once.

use serde::{Deserialize, Serialize};
use shale_types::IndexUid;

/// The state of a manual compaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompactionState {
    /// Recorded; not planned yet.
    Pending,
    /// Its merges are planned and running.
    Executing,
    /// Every merge succeeded.
    Completed,
    /// A merge failed for good (or the compaction could not be planned).
    Failed,
}

impl CompactionState {
    /// Every state.
    pub const ALL: [CompactionState; 4] = [
        CompactionState::Pending,
        CompactionState::Executing,
        CompactionState::Completed,
        CompactionState::Failed,
    ];

    /// The state's name, as stored and serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            CompactionState::Pending => "pending",
            CompactionState::Executing => "executing",
            CompactionState::Completed => "completed",
            CompactionState::Failed => "failed",
        }
    }

    /// The state named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        CompactionState::ALL
            .into_iter()
            .find(|state| state.as_str() == name)
    }

    /// Whether the compaction is over.
    pub fn is_finished(self) -> bool {
        matches!(self, CompactionState::Completed | CompactionState::Failed)
    }
}

/// What a manual compaction covers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionRequest {
    /// Only splits whose time range reaches at or after this second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<i64>,
    /// Only splits whose time range starts before this second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_timestamp: Option<i64>,
    /// Include mature splits (below the size cap) too.
    #[serde(default)]
    pub force: bool,
}

/// How far a manual compaction got.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionProgress {
    /// Merge tasks planned.
    pub total: u64,
    /// Of which succeeded.
    pub completed: u64,
    /// Of which failed for good.
    pub failed: u64,
    /// Published splits in its range when it was planned.
    pub splits_before: u64,
    /// Published splits in its range when it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub splits_after: Option<u64>,
    /// Bytes of the splits its merges read.
    pub bytes_read: u64,
    /// Bytes of the splits its merges wrote (known once finished).
    pub bytes_written: u64,
}

/// A manual compaction as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    /// A ULID.
    pub compaction_id: String,
    /// The index.
    pub index_uid: IndexUid,
    /// Where it is.
    pub state: CompactionState,
    /// What was asked.
    pub request: CompactionRequest,
    /// Plan counts, splits and bytes.
    pub progress: CompactionProgress,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Seconds since epoch when it was requested.
    pub create_timestamp: i64,
    /// When its merges were planned.
    pub start_timestamp: Option<i64>,
    /// When it completed or failed.
    pub finish_timestamp: Option<i64>,
    /// Last change.
    pub update_timestamp: i64,
}
