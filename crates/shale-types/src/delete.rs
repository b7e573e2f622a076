//! Delete tasks: "delete the documents matching this query", numbered per index by an
//! increasing *opstamp*.
//!
//! Which documents a delete task reaches is decided per document, not per split: every
//! document carries the highest opstamp its node knew when it acknowledged it (its *ingest
//! opstamp*, a hidden fast field). Task `o` deletes the matching documents whose ingest opstamp
//! is below `o` — exactly those acknowledged before the task was created — wherever they are.
//! A split records the opstamp it is clean up to ([`SplitMetadata::delete_opstamp`]): tasks
//! up to it have nothing left to delete in it.
//!
//! [`SplitMetadata::delete_opstamp`]: crate::SplitMetadata::delete_opstamp

use serde::{Deserialize, Serialize};

use crate::{IndexUid, SplitMetadata};

/// What a delete task deletes (Quickwit's request shape): the documents matching `query`
/// (searching `search_field`, or the index's default search fields, for terms without a
/// field), within `[start_timestamp, end_timestamp)` when given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteQuery {
    /// Query in the index's query language.
    pub query: String,
    /// Fields searched by terms without a field (a list, or a comma-separated string).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::field_list"
    )]
    pub search_field: Option<Vec<String>>,
    /// Inclusive lower bound on the timestamp field, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<i64>,
    /// Exclusive upper bound on the timestamp field, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_timestamp: Option<i64>,
    /// Metrics indexes: the exact window, inclusive milliseconds (Prometheus's `start` and
    /// `end`); `start_timestamp`/`end_timestamp` then hold it widened to whole seconds. The
    /// query holds the series selectors, one per line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_range_ms: Option<(i64, i64)>,
}

/// A delete task as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteTask {
    /// The index.
    pub index_uid: IndexUid,
    /// Position of the task in the index's delete history (1, 2, …).
    pub opstamp: u64,
    /// Seconds since epoch when the task was created.
    pub create_timestamp: i64,
    /// What it deletes.
    pub delete_query: DeleteQuery,
    /// The index's default search fields when the task was created: the fields its terms
    /// without a field search (unless the query names `search_field`), whatever the index's
    /// settings become later. `None` only for tasks recorded before bindings existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_search_fields: Option<Vec<String>>,
    /// The doc mapping the task was created (and validated) under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc_mapping_uid: Option<String>,
}

impl DeleteTask {
    /// The fields its terms without a field search, as bound when it was created: the
    /// request's `search_field`, else the index's default search fields of that day. `None`
    /// (the index's current defaults) only for tasks recorded before bindings existed.
    pub fn search_fields(&self) -> Option<&[String]> {
        self.delete_query
            .search_field
            .as_deref()
            .or(self.default_search_fields.as_deref())
    }

    /// Whether the task may delete documents of `split`: the split is not clean of it yet and
    /// their time ranges meet.
    pub fn may_touch(&self, split: &SplitMetadata) -> bool {
        self.opstamp > split.delete_opstamp
            && split.time_range.is_none_or(|range| {
                range.intersects(
                    self.delete_query.start_timestamp,
                    self.delete_query.end_timestamp,
                )
            })
    }
}
