//! Series and samples: a series is identified by its labels (`__name__` included), kept
//! sorted by name; its id is a SipHash of them, the same on every node and version.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use siphasher::sip::SipHasher13;

/// The label holding a series' metric name.
pub const METRIC_NAME_LABEL: &str = "__name__";

/// The bits of Prometheus's staleness marker (a NaN that says "the series ended here"); other
/// NaNs are values.
pub const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// The labels of a series: unique names, sorted, none with an empty value (Prometheus treats
/// an empty value as an absent label).
///
/// Shared and hashed once: a clone is a reference count, hashing writes the precomputed
/// [`Labels::series_id`], equality first compares pointers — a query evaluator keys its maps
/// by label sets at every step, and these make that cheap.
#[derive(Clone)]
pub struct Labels {
    pairs: Arc<[(String, String)]>,
    hash: u64,
}

impl Default for Labels {
    fn default() -> Self {
        Labels::from_sorted(Vec::new())
    }
}

impl PartialEq for Labels {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.pairs, &other.pairs)
            || (self.hash == other.hash && self.pairs == other.pairs)
    }
}

impl Eq for Labels {}

impl Hash for Labels {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialOrd for Labels {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Labels {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.pairs, &other.pairs) {
            return std::cmp::Ordering::Equal;
        }
        self.pairs.cmp(&other.pairs)
    }
}

impl std::fmt::Debug for Labels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Labels").field(&&*self.pairs).finish()
    }
}

impl Serialize for Labels {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.pairs.as_ref().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Labels::new(Vec::<(String, String)>::deserialize(
            deserializer,
        )?))
    }
}

impl Labels {
    /// The labels of `pairs`, sorted; of two pairs with one name the last is kept; pairs with
    /// an empty value are dropped.
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Labels {
        let mut pairs: Vec<(String, String)> = pairs.into_iter().collect();
        // Stable: among equal names the later pair stays after the earlier one.
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(String, String)> = Vec::with_capacity(pairs.len());
        for pair in pairs {
            match out.last_mut() {
                Some(last) if last.0 == pair.0 => *last = pair,
                _ => out.push(pair),
            }
        }
        out.retain(|(_, value)| !value.is_empty());
        Labels::from_sorted(out)
    }

    /// Labels from pairs already sorted, unique and without empty values.
    fn from_sorted(pairs: Vec<(String, String)>) -> Labels {
        let hash = series_id_of(&pairs);
        Labels {
            pairs: pairs.into(),
            hash,
        }
    }

    /// The value of label `name`, if the series has it.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()
            .map(|i| self.pairs[i].1.as_str())
    }

    /// The metric name (`__name__`), empty when the series has none.
    pub fn metric_name(&self) -> &str {
        self.get(METRIC_NAME_LABEL).unwrap_or("")
    }

    /// The pairs, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// The number of labels.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether the series has no label.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The series id: a SipHash-1-3 (fixed keys) of the sorted pairs. Two series with equal
    /// labels have equal ids everywhere; ids of different series collide with probability
    /// 2⁻⁶⁴ per pair, and readers group samples by labels, not by id.
    pub fn series_id(&self) -> u64 {
        self.hash
    }

    /// The series id `pairs` would have as labels, when they are sorted by name, unique and
    /// without an empty value (as [`Labels::iter`] gives them): no allocation.
    pub fn series_id_of(pairs: &[(&str, &str)]) -> u64 {
        series_id_of(pairs)
    }

    /// Whether these are exactly `pairs` (sorted as [`Labels::iter`] gives them).
    pub fn same_pairs(&self, pairs: &[(&str, &str)]) -> bool {
        self.pairs.len() == pairs.len()
            && self
                .pairs
                .iter()
                .zip(pairs)
                .all(|((n, v), (pn, pv))| n == pn && v == pv)
    }

    /// The labels but `__name__` (what a function like `rate` returns).
    pub fn without_name(&self) -> Labels {
        if self.get(METRIC_NAME_LABEL).is_none() {
            return self.clone();
        }
        Labels::from_sorted(
            self.pairs
                .iter()
                .filter(|(n, _)| n != METRIC_NAME_LABEL)
                .cloned()
                .collect(),
        )
    }
}

/// The SipHash-1-3 (fixed keys) of sorted pairs: [`Labels::series_id`].
fn series_id_of(pairs: &[(impl AsRef<str>, impl AsRef<str>)]) -> u64 {
    let mut hasher = SipHasher13::new_with_keys(0x5348_414c_455f_4d45, 0x5452_4943_535f_4944);
    for (name, value) in pairs {
        hasher.write(name.as_ref().as_bytes());
        hasher.write_u8(0xFF);
        hasher.write(value.as_ref().as_bytes());
        hasher.write_u8(0xFF);
    }
    hasher.finish()
}

/// One sample: milliseconds since the Unix epoch and a value (bit-exact, NaNs included).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// Whether the sample is Prometheus's staleness marker.
    pub fn is_stale(&self) -> bool {
        self.value.to_bits() == STALE_NAN_BITS
    }
}

/// `samples` sorted by timestamp, one per timestamp: of samples with one timestamp, the one
/// that came last (the sort is stable), as a later write replaces an earlier one.
pub fn last_per_timestamp(mut samples: Vec<Sample>) -> Vec<Sample> {
    samples.sort_by_key(|s| s.timestamp_ms);
    let mut out: Vec<Sample> = Vec::with_capacity(samples.len());
    for sample in samples {
        match out.last_mut() {
            Some(last) if last.timestamp_ms == sample.timestamp_ms => *last = sample,
            _ => out.push(sample),
        }
    }
    out
}

/// A series and some of its samples, in timestamp order.
#[derive(Clone, Debug, PartialEq)]
pub struct SeriesSamples {
    /// The series.
    pub labels: Labels,
    /// Its samples, by increasing timestamp, one per timestamp.
    pub samples: Vec<Sample>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        Labels::new(pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())))
    }

    #[test]
    fn labels_are_sorted_unique_and_empty_values_dropped() {
        let l = labels(&[("job", "a"), ("__name__", "up"), ("job", "b"), ("x", "")]);
        assert_eq!(
            l.iter().collect::<Vec<_>>(),
            vec![("__name__", "up"), ("job", "b")]
        );
        assert_eq!(l.metric_name(), "up");
        assert_eq!(l.get("x"), None);
        assert_eq!(
            l.without_name().iter().collect::<Vec<_>>(),
            vec![("job", "b")]
        );
    }

    #[test]
    fn series_ids_depend_on_labels_only() {
        let a = labels(&[("__name__", "up"), ("job", "a")]);
        let b = labels(&[("job", "a"), ("__name__", "up")]);
        assert_eq!(a.series_id(), b.series_id());
        // Pairs are delimited: moving a byte between name and value changes the id.
        assert_ne!(
            labels(&[("ab", "c")]).series_id(),
            labels(&[("a", "bc")]).series_id()
        );
        // Pinned: the id is part of the split format.
        assert_eq!(a.series_id(), 0x5ac0_fac9_00c9_88b3);
    }
}
