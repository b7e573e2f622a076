//! Split pruning from metadata alone: whether a metrics split may hold a series that a set of
//! matchers selects, by its metric-name tags and its sort-key range. Queries (PromQL, SQL)
//! skip the splits for which this is false without reading them.

use shale_types::SplitMetadata;

use crate::{Matcher, METRIC_NAME_LABEL};

/// Whether `split` may hold a series every matcher accepts (false: it certainly does not).
pub fn split_may_hold(split: &SplitMetadata, matchers: &[Matcher]) -> bool {
    name_tags_may_hold(split, matchers) && key_range_may_hold(split, matchers)
}

/// Whether a split with these tags may hold a series whose name the matchers accept.
fn name_tags_may_hold(split: &SplitMetadata, matchers: &[Matcher]) -> bool {
    let recorded = split
        .tag_fields
        .as_ref()
        .is_some_and(|fields| fields.iter().any(|f| f == METRIC_NAME_LABEL));
    let overflow = format!("{METRIC_NAME_LABEL}!");
    if !recorded || split.tags.contains(&overflow) {
        return true;
    }
    let prefix = format!("{METRIC_NAME_LABEL}:");
    let names: Vec<&str> = split
        .tags
        .iter()
        .filter_map(|tag| tag.strip_prefix(&prefix))
        .collect();
    matchers
        .iter()
        .filter(|m| m.name == METRIC_NAME_LABEL)
        .all(|m| names.iter().any(|name| m.matches_value(name)))
}

/// Whether a split's sort-key range may hold a series the matchers accept: the key prefix the
/// `=` matchers fix (the metric name, then the sort labels in order, up to the first label
/// without one) must fall within the split's `[sort_key_min, sort_key_max]`.
fn key_range_may_hold(split: &SplitMetadata, matchers: &[Matcher]) -> bool {
    use shale_types::sort_key::{prefix_upper_bound, push_value, SortFieldType, SortValue};
    let (Some(fields), Some(min), Some(max)) =
        (&split.sort_fields, &split.sort_key_min, &split.sort_key_max)
    else {
        return true;
    };
    let mut prefix = Vec::new();
    // The last field is the series id: never fixed by a matcher.
    for field in fields.iter().take(fields.len().saturating_sub(1)) {
        let Some(value) = matchers
            .iter()
            .find(|m| m.op == crate::MatchOp::Equal && &m.name == field)
            .map(|m| m.value.as_str())
        else {
            break;
        };
        let value = if value.is_empty() {
            SortValue::Missing
        } else {
            SortValue::Text(value.to_string())
        };
        push_value(&mut prefix, SortFieldType::Text, &value);
    }
    if prefix.is_empty() {
        return true;
    }
    let upper = prefix_upper_bound(&prefix);
    min.0 < upper && max.0 >= prefix
}
