//! Source checkpoints: for each partition of a source (a WAL shard for the ingest API), the
//! last position whose documents are in a published split. A split and the checkpoint delta
//! it covers are published in one metastore transaction; that is what makes ingestion
//! exactly-once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The checkpoint of one source: partition (shard) id → last published position (inclusive).
/// A partition absent from the map is at the beginning.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceCheckpoint {
    /// Partition id → last consumed position.
    pub per_partition: BTreeMap<String, u64>,
}

/// The positions one split covers in one partition: `(from, to]`, `from = None` meaning the
/// beginning of the partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionDelta {
    /// Position the stored checkpoint must be at (`None`: partition never checkpointed).
    pub from: Option<u64>,
    /// New position, inclusive.
    pub to: u64,
}

/// Positions consumed by a split, per partition.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointDelta {
    /// Partition id → range consumed.
    pub per_partition: BTreeMap<String, PartitionDelta>,
}

/// A checkpoint delta that does not start where the stored checkpoint ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("checkpoint delta for partition `{partition}` starts at {delta_from:?} but the checkpoint is at {current:?}")]
pub struct CheckpointError {
    /// The partition at fault.
    pub partition: String,
    /// Where the stored checkpoint is.
    pub current: Option<u64>,
    /// Where the delta starts.
    pub delta_from: Option<u64>,
}

impl CheckpointDelta {
    /// A delta for one partition.
    pub fn single(partition: impl Into<String>, from: Option<u64>, to: u64) -> Self {
        let mut per_partition = BTreeMap::new();
        per_partition.insert(partition.into(), PartitionDelta { from, to });
        CheckpointDelta { per_partition }
    }

    /// Whether the delta is empty (merges publish with an empty delta).
    pub fn is_empty(&self) -> bool {
        self.per_partition.is_empty()
    }
}

impl SourceCheckpoint {
    /// The position of `partition`, `None` if at the beginning.
    pub fn position(&self, partition: &str) -> Option<u64> {
        self.per_partition.get(partition).copied()
    }

    /// Applies `delta`, failing (and changing nothing) unless every partition's delta starts
    /// where this checkpoint is.
    pub fn try_apply(&mut self, delta: &CheckpointDelta) -> Result<(), CheckpointError> {
        for (partition, d) in &delta.per_partition {
            let current = self.position(partition);
            if current != d.from || d.from.is_some_and(|from| d.to < from) {
                return Err(CheckpointError {
                    partition: partition.clone(),
                    current,
                    delta_from: d.from,
                });
            }
        }
        for (partition, d) in &delta.per_partition {
            self.per_partition.insert(partition.clone(), d.to);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_must_start_where_checkpoint_ends() {
        let mut cp = SourceCheckpoint::default();
        cp.try_apply(&CheckpointDelta::single("s1", None, 9))
            .unwrap();
        assert_eq!(cp.position("s1"), Some(9));
        let err = cp
            .try_apply(&CheckpointDelta::single("s1", Some(5), 12))
            .unwrap_err();
        assert_eq!(err.current, Some(9));
        assert_eq!(cp.position("s1"), Some(9));
        cp.try_apply(&CheckpointDelta::single("s1", Some(9), 20))
            .unwrap();
        assert_eq!(cp.position("s1"), Some(20));
        assert!(cp
            .try_apply(&CheckpointDelta::single("s2", Some(0), 3))
            .is_err());
    }
}
