//! Whether a split may hold documents a query matches, from its metadata alone: its time
//! range, the tag values it records, and (locality indexes) its sort-key range. Searches
//! skip the splits that cannot ([`SplitPruner::may_match`]); delete tasks that cannot reach a
//! split are passed over without rewriting it.

use shale_types::SplitMetadata;

use crate::{split_may_match_tags, DocMapper, KeyFilter};

/// The metadata test of one query against splits.
#[derive(Debug, Clone)]
pub struct SplitPruner {
    start_timestamp: Option<i64>,
    end_timestamp: Option<i64>,
    required_tags: Vec<(String, String)>,
    current_doc_mapping_uid: String,
    sort_fields: Option<Vec<String>>,
    key_filter: Option<KeyFilter>,
}

impl SplitPruner {
    /// The test of `query` over `[start_timestamp, end_timestamp)`, for splits of the index
    /// of `doc_mapper`; with `key_pruning`, sort-key ranges are used too.
    pub fn new(
        doc_mapper: &DocMapper,
        query: &str,
        start_timestamp: Option<i64>,
        end_timestamp: Option<i64>,
        key_pruning: bool,
    ) -> SplitPruner {
        SplitPruner {
            start_timestamp,
            end_timestamp,
            required_tags: doc_mapper.required_tag_terms(query).unwrap_or_default(),
            current_doc_mapping_uid: doc_mapper.doc_mapping().doc_mapping_uid.clone(),
            sort_fields: doc_mapper.sort_field_names(),
            key_filter: if key_pruning {
                doc_mapper.sort_key_filter(query)
            } else {
                None
            },
        }
    }

    /// Whether `split` may hold a matching document.
    pub fn may_match(&self, split: &SplitMetadata) -> bool {
        let in_time = split
            .time_range
            .is_none_or(|range| range.intersects(self.start_timestamp, self.end_timestamp));
        if !in_time {
            return false;
        }
        // A split's tags speak only for the tag fields of the mapping that wrote it.
        let required: Vec<(String, String)> = self
            .required_tags
            .iter()
            .filter(|(field, _)| match &split.tag_fields {
                Some(tag_fields) => tag_fields.contains(field),
                None => split.doc_mapping_uid == self.current_doc_mapping_uid,
            })
            .cloned()
            .collect();
        if !split_may_match_tags(&split.tags, &required) {
            return false;
        }
        // A key range compares only with keys of the sort fields that encoded it.
        match (
            &self.key_filter,
            &split.sort_key_min,
            &split.sort_key_max,
            &self.sort_fields,
        ) {
            (Some(filter), Some(min), Some(max), Some(fields))
                if split.keys_encoded_with(fields) =>
            {
                filter.may_match(min, max)
            }
            _ => true,
        }
    }
}
