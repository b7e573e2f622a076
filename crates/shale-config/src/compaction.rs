//! An index's compaction settings (the top-level `compaction:` key of its config, a Shale
//! extension) and its time-travel window (`time_travel_retention:`).

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// Default `compaction.delete_ratio`.
pub const DEFAULT_DELETE_RATIO: f64 = 0.2;
/// Default `compaction.delete_bytes` (10 MB).
pub const DEFAULT_DELETE_BYTES: u64 = 10_000_000;
/// Default `compaction.small_split_count`.
pub const DEFAULT_SMALL_SPLIT_COUNT: usize = 10;
/// Default `compaction.max_split_bytes` (512 MiB).
pub const DEFAULT_MAX_SPLIT_BYTES: u64 = 512 << 20;

/// Automatic compaction of one index: the switch and the Milvus-style triggers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompactionSettings {
    /// Off: no automatic merge nor delete compaction of this index (manual compaction still
    /// runs).
    pub enabled: bool,
    /// A split is rewritten without its deleted documents once more than this fraction of
    /// its documents is deleted.
    pub delete_ratio: f64,
    /// … or once its deleted documents weigh more than this many bytes (as ingested).
    #[serde(deserialize_with = "crate::units::deserialize_byte_size")]
    pub delete_bytes: u64,
    /// When more than this many published splits of a merge scope are smaller than half the
    /// target, they are merged whatever the merge policy says.
    pub small_split_count: usize,
    /// No merge writes a split larger than this; bigger merges write several splits.
    #[serde(deserialize_with = "crate::units::deserialize_byte_size")]
    pub max_split_bytes: u64,
}

impl Default for CompactionSettings {
    fn default() -> Self {
        CompactionSettings {
            enabled: true,
            delete_ratio: DEFAULT_DELETE_RATIO,
            delete_bytes: DEFAULT_DELETE_BYTES,
            small_split_count: DEFAULT_SMALL_SPLIT_COUNT,
            max_split_bytes: DEFAULT_MAX_SPLIT_BYTES,
        }
    }
}

impl CompactionSettings {
    /// Whether every setting has its default (the key is then left out of the config).
    pub fn is_default(&self) -> bool {
        self == &CompactionSettings::default()
    }

    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field: &str, message: &str| ConfigError::Invalid {
            field: format!("compaction.{field}"),
            message: message.to_string(),
        };
        if !(self.delete_ratio > 0.0 && self.delete_ratio <= 1.0) {
            return Err(invalid("delete_ratio", "must be in (0, 1]"));
        }
        if self.delete_bytes == 0 {
            return Err(invalid("delete_bytes", "must be at least 1 byte"));
        }
        if self.max_split_bytes < 1_000_000 {
            return Err(invalid("max_split_bytes", "must be at least 1MB"));
        }
        Ok(())
    }
}
