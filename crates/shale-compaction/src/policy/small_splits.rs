//! Milvus' small-split rule, on top of every merge policy but `no_merge`: when more than
//! `small_split_count` splits of one merge scope (and, for a locality index, one time bucket
//! and level 0) are smaller than half the target, they are merged together at once, whatever
//! the policy would wait for. A pure function of split metadata, like the policies.

use std::collections::BTreeMap;

use shale_config::{IndexingSettings, MergePolicyConfig};
use shale_types::{MergeScope, SplitId, SplitMetadata};

/// The split size (documents) the small-split rule measures against: the policy's target;
/// `None` for `no_merge` (the rule is off).
pub fn small_split_target(settings: &IndexingSettings) -> Option<u64> {
    match &settings.merge_policy {
        MergePolicyConfig::NoMerge => None,
        MergePolicyConfig::Locality(config) => Some(config.target_num_docs()),
        _ => Some(settings.split_num_docs_target),
    }
}

/// The merges the rule asks for among `splits` (the candidates: Published, immature, in no
/// live task), one per group with more than `small_split_count` small splits, oldest first.
pub fn small_split_operations(
    splits: &[SplitMetadata],
    target_num_docs: u64,
    small_split_count: usize,
    node_local: bool,
) -> Vec<(MergeScope, Vec<SplitId>)> {
    let mut groups: BTreeMap<(MergeScope, Option<i64>), Vec<&SplitMetadata>> = BTreeMap::new();
    for split in splits {
        // Level-1 splits own disjoint key ranges: a plain merge of two could cover a third.
        if split.num_docs.saturating_mul(2) < target_num_docs && split.key_level == 0 {
            groups
                .entry((split.merge_scope(node_local), split.time_bucket_start))
                .or_default()
                .push(split);
        }
    }
    groups
        .into_iter()
        .filter(|(_, small)| small.len() > small_split_count && small.len() >= 2)
        .map(|((scope, _), mut small)| {
            small.sort_by_key(|split| {
                (
                    split.time_range.map(|range| range.start),
                    split.split_id.clone(),
                )
            });
            (
                scope,
                small
                    .into_iter()
                    .map(|split| split.split_id.clone())
                    .collect(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shale_types::{IndexUid, SplitMaturity, TimeRange};

    fn split(id: &str, num_docs: u64, partition: u64) -> SplitMetadata {
        SplitMetadata {
            split_id: id.to_string(),
            index_uid: IndexUid {
                index_id: "logs".into(),
                incarnation: "01".into(),
            },
            source_id: "src".into(),
            node_id: "n1".into(),
            partition_id: partition,
            doc_mapping_uid: "dm".into(),
            num_docs,
            size_bytes: num_docs * 100,
            uncompressed_docs_size_bytes: num_docs * 200,
            time_range: Some(TimeRange {
                start: num_docs as i64,
                end: num_docs as i64,
            }),
            tags: Default::default(),
            create_timestamp: 0,
            maturity: SplitMaturity::Immature {
                maturation_period_secs: 3600,
            },
            num_merge_ops: 0,
            delete_opstamp: 0,
            footer_offsets: (0, 0),
            time_bucket_start: None,
            sort_key_min: None,
            sort_key_max: None,
            key_level: 0,
            sort_fields: None,
            tag_fields: None,
            format: Default::default(),
            num_series: None,
        }
    }

    #[test]
    fn more_than_the_count_of_small_splits_in_a_scope_are_merged() {
        // Target 1000: under 500 documents is small.
        let mut splits: Vec<SplitMetadata> = (0..4)
            .map(|i| split(&format!("s{i}"), 100 + i, 0))
            .collect();
        splits.push(split("big", 500, 0));
        // Another partition: its own scope, only 2 small splits.
        splits.push(split("p1a", 10, 1));
        splits.push(split("p1b", 10, 1));
        // Exactly the count: nothing.
        assert!(small_split_operations(&splits, 1000, 4, false).is_empty());
        // Above it: the four small splits of partition 0, oldest first; `big` is not small.
        let ops = small_split_operations(&splits, 1000, 3, false);
        assert_eq!(ops.len(), 1);
        assert_eq!(ops[0].0.partition_id, 0);
        assert_eq!(ops[0].1, ["s0", "s1", "s2", "s3"]);
        let ops = small_split_operations(&splits, 1000, 1, false);
        assert_eq!(ops.len(), 2);
    }

    #[test]
    fn level_one_splits_and_other_buckets_stay_apart() {
        let mut splits: Vec<SplitMetadata> =
            (0..3).map(|i| split(&format!("a{i}"), 10, 0)).collect();
        for (i, split) in splits.iter_mut().enumerate() {
            split.time_bucket_start = Some(if i == 0 { 0 } else { 900 });
        }
        let mut level_one = split("l1", 10, 0);
        level_one.time_bucket_start = Some(900);
        level_one.key_level = 1;
        splits.push(level_one);
        let ops = small_split_operations(&splits, 1000, 1, false);
        assert_eq!(ops.len(), 1);
        assert_eq!(ops[0].1, ["a1", "a2"]);
    }

    #[test]
    fn no_merge_turns_the_rule_off() {
        let settings = IndexingSettings {
            merge_policy: MergePolicyConfig::NoMerge,
            ..IndexingSettings::default()
        };
        assert_eq!(small_split_target(&settings), None);
        let settings = IndexingSettings::default();
        assert_eq!(
            small_split_target(&settings),
            Some(settings.split_num_docs_target)
        );
    }
}
