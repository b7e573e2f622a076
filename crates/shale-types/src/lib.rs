//! Vocabulary shared by every Shale crate: identifiers, split metadata, merge scopes,
//! checkpoints and time ranges. Nothing here does I/O; it is the common language of the
//! data path (ingest → index → storage/metastore → compaction → search).

mod checkpoint;
pub mod clock;
mod delete;
pub mod heap;
pub mod memory;
mod metric;
pub mod sort_key;
mod split;
pub mod time;

pub use checkpoint::{CheckpointDelta, CheckpointError, PartitionDelta, SourceCheckpoint};
pub use delete::{DeleteQuery, DeleteTask};
pub use metric::MetricMetadata;
pub use split::{
    split_object_key, MergeKind, MergeScope, MergeTrigger, Split, SplitFormat, SplitMaturity,
    SplitMetadata, SplitState,
};

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use ulid::Ulid;

/// Identifier of a split: a ULID rendered as a string.
pub type SplitId = String;
/// Identifier of a source of an index (`_ingest-api-source` for the ingest API).
pub type SourceId = String;
/// Identifier of a node of the cluster.
pub type NodeId = String;
/// Partition computed from the index's `partition_key` (0 when none).
pub type PartitionId = u64;
/// Identity of a doc mapping version (a ULID string).
pub type DocMappingUid = String;

/// The source every document sent through the ingest API belongs to (as in Quickwit).
pub const INGEST_API_SOURCE_ID: &str = "_ingest-api-source";

/// Returns a fresh ULID string, used for split ids and incarnations.
pub fn new_ulid() -> String {
    Ulid::new().to_string()
}

/// A fresh ULID string whose time part is the one of `id` (a ULID) rather than now: it sorts
/// with `id` among ids made at other times (random within the same millisecond). `None` when
/// `id` is not a ULID.
pub fn new_ulid_at_time_of(id: &str) -> Option<String> {
    let ms = Ulid::from_string(id).ok()?.timestamp_ms();
    let time = std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_millis(ms))?;
    Some(Ulid::from_datetime(time).to_string())
}

/// Seconds since the Unix epoch, now, on the cluster's clock (the metastore's: see
/// [`clock`]).
pub fn now_unix_secs() -> i64 {
    clock::now_unix_secs()
}

/// An index's unique id: its `index_id` plus a ULID incarnation, so that an index deleted and
/// re-created under the same id never mixes with its predecessor. Rendered `index_id:ULID`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IndexUid {
    /// The user-facing index id.
    pub index_id: String,
    /// The incarnation, a ULID.
    pub incarnation: String,
}

impl IndexUid {
    /// A new incarnation of `index_id`.
    pub fn new(index_id: impl Into<String>) -> Self {
        IndexUid {
            index_id: index_id.into(),
            incarnation: new_ulid(),
        }
    }
}

impl fmt::Display for IndexUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.index_id, self.incarnation)
    }
}

/// Error parsing an [`IndexUid`] from its `index_id:ULID` form.
#[derive(Debug, thiserror::Error)]
#[error("invalid index uid `{0}`: expected `index_id:ULID`")]
pub struct InvalidIndexUid(pub String);

impl FromStr for IndexUid {
    type Err = InvalidIndexUid;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (index_id, incarnation) = s
            .rsplit_once(':')
            .ok_or_else(|| InvalidIndexUid(s.to_string()))?;
        if index_id.is_empty() || Ulid::from_string(incarnation).is_err() {
            return Err(InvalidIndexUid(s.to_string()));
        }
        Ok(IndexUid {
            index_id: index_id.to_string(),
            incarnation: incarnation.to_string(),
        })
    }
}

impl Serialize for IndexUid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IndexUid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An inclusive time range in seconds since the epoch: the seconds of its timestamps, floored
/// (see [`time`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeRange {
    /// First second covered.
    pub start: i64,
    /// Last second covered (inclusive).
    pub end: i64,
}

impl TimeRange {
    /// Whether `self` and the half-open query window `[start, end)` can share a second.
    /// `None` bounds are unbounded.
    pub fn intersects(&self, start: Option<i64>, end_exclusive: Option<i64>) -> bool {
        if let Some(start) = start {
            if self.end < start {
                return false;
            }
        }
        if let Some(end) = end_exclusive {
            if self.start >= end {
                return false;
            }
        }
        true
    }

    /// The smallest range covering both.
    pub fn union(&self, other: &TimeRange) -> TimeRange {
        TimeRange {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

/// Deserializes a list of field names given as a JSON list or one comma-separated string
/// (`"a,b"`), as Quickwit's `search_field` parameters are (`serde(deserialize_with)`).
pub fn field_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(
        untagged,
        expecting = "a list of field names or a comma-separated string"
    )]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Option::<OneOrMany>::deserialize(d)? {
        None => None,
        Some(OneOrMany::One(s)) => Some(
            s.split(',')
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .map(str::to_string)
                .collect(),
        ),
        Some(OneOrMany::Many(v)) => Some(v),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_uid_round_trips() {
        let uid = IndexUid::new("my-logs");
        let parsed: IndexUid = uid.to_string().parse().unwrap();
        assert_eq!(parsed, uid);
        assert!("no-colon".parse::<IndexUid>().is_err());
        assert!("idx:not-a-ulid".parse::<IndexUid>().is_err());
    }

    #[test]
    fn time_range_intersection_is_half_open_on_the_query() {
        let r = TimeRange { start: 10, end: 20 };
        assert!(r.intersects(Some(20), None));
        assert!(!r.intersects(Some(21), None));
        assert!(!r.intersects(None, Some(10)));
        assert!(r.intersects(None, Some(11)));
        assert!(r.intersects(None, None));
    }
}
