//! Split metadata: what the metastore records about each immutable split.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::sort_key::SortKey;
use crate::{DocMappingUid, IndexUid, NodeId, PartitionId, SourceId, SplitId, TimeRange};

/// The life cycle of a split in the metastore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SplitState {
    /// Being uploaded; invisible to search. Garbage if never published.
    Staged,
    /// Visible to search.
    Published,
    /// Replaced or deleted; its object is removed after a grace period.
    MarkedForDeletion,
}

impl SplitState {
    /// The name stored in the metastore and shown by the API.
    pub fn as_str(&self) -> &'static str {
        match self {
            SplitState::Staged => "Staged",
            SplitState::Published => "Published",
            SplitState::MarkedForDeletion => "MarkedForDeletion",
        }
    }

    /// Parses the stored name (case-insensitive, `_` and `-` ignored).
    pub fn parse(s: &str) -> Option<SplitState> {
        let norm: String = s
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .collect::<String>()
            .to_ascii_lowercase();
        match norm.as_str() {
            "staged" => Some(SplitState::Staged),
            "published" => Some(SplitState::Published),
            "markedfordeletion" => Some(SplitState::MarkedForDeletion),
            _ => None,
        }
    }
}

/// Whether a split may still be merged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SplitMaturity {
    /// Never merged again.
    #[default]
    Mature,
    /// Mergeable until `create_timestamp + maturation_period_secs`.
    Immature {
        /// Seconds after creation at which the split becomes mature.
        maturation_period_secs: u64,
    },
}

/// What the metastore knows about one split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SplitMetadata {
    /// ULID of the split; its object is `{split_id}.split`.
    pub split_id: SplitId,
    /// Index the split belongs to.
    pub index_uid: IndexUid,
    /// Source the documents came from.
    pub source_id: SourceId,
    /// Node that produced the split.
    pub node_id: NodeId,
    /// Partition of every document in the split.
    pub partition_id: PartitionId,
    /// Schema version of the split.
    pub doc_mapping_uid: DocMappingUid,
    /// Number of documents.
    pub num_docs: u64,
    /// Size of the split object in bytes.
    pub size_bytes: u64,
    /// Bytes of the documents as ingested (for write amplification figures).
    #[serde(default)]
    pub uncompressed_docs_size_bytes: u64,
    /// Seconds covered by the documents' timestamps, if the index has a timestamp field.
    pub time_range: Option<TimeRange>,
    /// `field:value` tags of the documents (for pruning), plus `field!` when too many values.
    #[serde(default)]
    pub tags: BTreeSet<String>,
    /// Seconds since epoch when the split was created.
    pub create_timestamp: i64,
    /// Mergeable or not.
    pub maturity: SplitMaturity,
    /// Number of merges that produced this split (0 for a split fresh from ingest).
    #[serde(default)]
    pub num_merge_ops: u32,
    /// Delete tasks up to this opstamp have been applied to the split.
    #[serde(default)]
    pub delete_opstamp: u64,
    /// Byte range of the bundle's hot cache and footer within the split object, to its end:
    /// what a reader fetches first to open the split by ranges.
    #[serde(default)]
    pub footer_offsets: (u64, u64),
    /// Locality indexes: start (seconds) of the time bucket holding every document; `None`
    /// for other indexes and for the bucket of documents without a timestamp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_bucket_start: Option<i64>,
    /// Locality indexes: the smallest sort key of the documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort_key_min: Option<SortKey>,
    /// Locality indexes: the largest sort key of the documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort_key_max: Option<SortKey>,
    /// Locality indexes: 0 while the split's key range may overlap others of its bucket
    /// (fresh splits, size-tiered merges), 1 once written by a locality merge (key ranges of
    /// the bucket's level-1 splits do not overlap).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub key_level: u8,
    /// Locality indexes: the sort fields the split's sort keys (`sort_key_min`/`max` and
    /// its documents' keys) were encoded with. A key range is comparable only with keys of
    /// the same fields; `None` for splits written before this was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort_fields: Option<Vec<String>>,
    /// The tag fields of the doc mapping the split was written with: its `tags` say
    /// nothing about other fields. `None` for splits written before this was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag_fields: Option<Vec<String>>,
    /// What the split object is: a Tantivy bundle (logs, traces) or a Parquet file of
    /// samples (metrics).
    #[serde(default, skip_serializing_if = "SplitFormat::is_tantivy")]
    pub format: SplitFormat,
    /// Metrics splits: the number of series (`num_docs` counts samples).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_series: Option<u64>,
}

/// The kind of object a split is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitFormat {
    /// A Tantivy index bundle, `{split_id}.split` (documents).
    #[default]
    Tantivy,
    /// A Parquet file of samples, `{split_id}.parquet` (metrics).
    Parquet,
}

impl SplitFormat {
    /// Whether this is the (default) Tantivy format.
    pub fn is_tantivy(&self) -> bool {
        *self == SplitFormat::Tantivy
    }
}

fn is_zero(level: &u8) -> bool {
    *level == 0
}

impl SplitMetadata {
    /// Whether the split will never be merged again at `now` (seconds).
    pub fn is_mature(&self, now: i64) -> bool {
        match self.maturity {
            SplitMaturity::Mature => true,
            SplitMaturity::Immature {
                maturation_period_secs,
            } => {
                self.create_timestamp
                    .saturating_add(maturation_period_secs as i64)
                    <= now
            }
        }
    }

    /// The second at which the split becomes mature (`None` if already mature by construction).
    pub fn maturity_timestamp(&self) -> i64 {
        match self.maturity {
            SplitMaturity::Mature => 0,
            SplitMaturity::Immature {
                maturation_period_secs,
            } => self
                .create_timestamp
                .saturating_add(maturation_period_secs as i64),
        }
    }

    /// The merge scope of this split; `node_local` adds the node id, as Quickwit does.
    pub fn merge_scope(&self, node_local: bool) -> MergeScope {
        MergeScope {
            node_id: node_local.then(|| self.node_id.clone()),
            index_uid: self.index_uid.clone(),
            source_id: self.source_id.clone(),
            partition_id: self.partition_id,
            doc_mapping_uid: self.doc_mapping_uid.clone(),
        }
    }

    /// Whether the split's sort-key range was encoded with `sort_fields` (and can be compared
    /// with keys built from them).
    pub fn keys_encoded_with(&self, sort_fields: &[String]) -> bool {
        self.sort_fields.as_deref() == Some(sort_fields)
    }

    /// The object key of the split in the index's storage.
    pub fn object_key(&self) -> String {
        match self.format {
            SplitFormat::Tantivy => split_object_key(&self.split_id),
            SplitFormat::Parquet => format!("{}.parquet", self.split_id),
        }
    }
}

/// The object key of a split: `{split_id}.split`.
pub fn split_object_key(split_id: &str) -> String {
    format!("{split_id}.split")
}

/// A split and its state in the metastore.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Split {
    /// Staged, Published or MarkedForDeletion.
    pub split_state: SplitState,
    /// Seconds since epoch of the last state change.
    pub update_timestamp: i64,
    /// Seconds since epoch of publication.
    pub publish_timestamp: Option<i64>,
    /// The split's metadata (flattened into the same JSON object, as Quickwit's API does).
    #[serde(flatten)]
    pub split_metadata: SplitMetadata,
}

impl std::fmt::Display for MergeScope {
    /// `source/partition/doc_mapping_uid`, then `@node` in `node_local` mode.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.source_id, self.partition_id, self.doc_mapping_uid
        )?;
        if let Some(node_id) = &self.node_id {
            write!(f, "@{node_id}")?;
        }
        Ok(())
    }
}

/// The key inside which splits may be merged together.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MergeScope {
    /// Set in `node_local` mode only.
    pub node_id: Option<NodeId>,
    /// Index.
    pub index_uid: IndexUid,
    /// Source.
    pub source_id: SourceId,
    /// Partition.
    pub partition_id: PartitionId,
    /// Schema version.
    pub doc_mapping_uid: DocMappingUid,
}

/// What a merge does with its inputs, decided by the merge policy when it plans it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum MergeKind {
    /// The inputs become one split (kept at the inputs' key level).
    #[default]
    Merge,
    /// A locality merge: the inputs (one time bucket) are rewritten as level-1 splits of at
    /// most the target size, cut at sort-key boundaries, whose key ranges do not overlap.
    Locality,
    /// A delete compaction: one split rewritten without the documents its pending delete
    /// tasks delete (no output when none is left).
    Delete,
}

impl MergeKind {
    /// The kind's name, as stored and serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            MergeKind::Merge => "merge",
            MergeKind::Locality => "locality",
            MergeKind::Delete => "delete",
        }
    }

    /// The kind named `name` (as produced by [`MergeKind::as_str`]).
    pub fn parse(name: &str) -> Option<Self> {
        [MergeKind::Merge, MergeKind::Locality, MergeKind::Delete]
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }
}

/// Why a merge task was planned.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum MergeTrigger {
    /// The index's merge policy.
    #[default]
    Policy,
    /// More than `small_split_count` splits of a scope under half the target size.
    SmallSplits,
    /// A split's deleted documents exceed `delete_ratio` of it.
    DeleteRatio,
    /// A split's deleted documents exceed `delete_bytes`.
    DeleteBytes,
    /// A manual compaction.
    Manual,
}

impl MergeTrigger {
    /// Every trigger.
    pub const ALL: [MergeTrigger; 5] = [
        MergeTrigger::Policy,
        MergeTrigger::SmallSplits,
        MergeTrigger::DeleteRatio,
        MergeTrigger::DeleteBytes,
        MergeTrigger::Manual,
    ];

    /// The trigger's name, as stored, serialized and used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            MergeTrigger::Policy => "policy",
            MergeTrigger::SmallSplits => "small_splits",
            MergeTrigger::DeleteRatio => "delete_ratio",
            MergeTrigger::DeleteBytes => "delete_bytes",
            MergeTrigger::Manual => "manual",
        }
    }

    /// The trigger named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        MergeTrigger::ALL
            .into_iter()
            .find(|trigger| trigger.as_str() == name)
    }
}

impl std::fmt::Display for MergeTrigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for MergeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
