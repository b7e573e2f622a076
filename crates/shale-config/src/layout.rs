//! What shapes the physical layout of an index's splits, beyond the settings that only steer
//! indexing: the doc mapping (schema, tag fields, partition key, …) and, for a `locality`
//! index, the sort fields its sort keys are encoded with. Two configs that differ in any of
//! them write splits that must not be merged, pruned or read as one another's: the metastore
//! gives such an update a new `doc_mapping_uid`.

use crate::{IndexConfig, MergePolicyConfig};

impl IndexConfig {
    /// The sort fields of a `locality` index (`None` for other merge policies).
    pub fn sort_fields(&self) -> Option<&[String]> {
        match &self.indexing_settings.merge_policy {
            MergePolicyConfig::Locality(locality) => Some(&locality.sort_fields),
            _ => None,
        }
    }

    /// Whether splits written under `self` and under `other` have the same layout: the same
    /// doc mapping (its uid aside) and the same sort fields.
    pub fn same_split_layout(&self, other: &IndexConfig) -> bool {
        let mapping = |config: &IndexConfig| {
            let mut doc_mapping = config.doc_mapping.clone();
            doc_mapping.doc_mapping_uid.clear();
            doc_mapping
        };
        mapping(self) == mapping(other) && self.sort_fields() == other.sort_fields()
    }
}

#[cfg(test)]
mod tests {
    use crate::IndexConfig;

    fn config(policy: &str, tags: &str) -> IndexConfig {
        let yaml = format!(
            "index_id: logs\n\
             doc_mapping:\n  timestamp_field: ts\n  tag_fields: {tags}\n  field_mappings:\n    \
             - {{name: ts, type: datetime, fast: true}}\n    \
             - {{name: service, type: text, tokenizer: raw, fast: true}}\n    \
             - {{name: host, type: text, tokenizer: raw, fast: true}}\n\
             indexing_settings:\n  commit_timeout_secs: 5\n  merge_policy: {policy}\n"
        );
        IndexConfig::parse(yaml.as_bytes()).expect("valid config")
    }

    #[test]
    fn sort_fields_and_doc_mapping_shape_the_layout_other_settings_do_not() {
        let by_service = config("{type: locality, sort_fields: [service]}", "[]");
        let mut other_uid = by_service.clone();
        other_uid.doc_mapping.doc_mapping_uid = "01OTHER".to_string();
        assert!(by_service.same_split_layout(&other_uid));
        let mut other_timeout = by_service.clone();
        other_timeout.indexing_settings.commit_timeout_secs = 60;
        assert!(by_service.same_split_layout(&other_timeout));
        let by_host = config("{type: locality, sort_fields: [host]}", "[]");
        assert!(!by_service.same_split_layout(&by_host));
        assert_eq!(by_host.sort_fields(), Some(&["host".to_string()][..]));
        let stable = config("{type: stable_log}", "[]");
        assert!(!by_service.same_split_layout(&stable));
        assert_eq!(stable.sort_fields(), None);
        assert!(!stable.same_split_layout(&config("{type: stable_log}", "[service]")));
    }
}
