//! The series index of a metrics split: every series of the split in row order, with the
//! first row of its samples and its label values (as ids into one dictionary per label
//! column). A read decides its label matchers on the index alone — each matcher once per
//! distinct value, then per series by id — and decodes the timestamps and values of the
//! matching series' rows only: no label column is decoded, no row of another series.
//!
//! The index lives in the Parquet footer's key-value metadata (zstd, then base64: the
//! footer holds text), so it comes with the footer a reader fetches and caches anyway.
//! Splits written before it, or with more series than [`MAX_INDEXED_SERIES`], have none;
//! their reads rule rows out by the page index instead.

use std::collections::HashMap;
use std::io::Read;
use std::ops::Range;

use base64::Engine;

use crate::varint::{put_str, put_varint, ReadError, Reader};

/// A read of the binary form failed: the index is damaged (the only binary form this crate
/// reads into a [`MetricsError`]).
impl From<ReadError> for MetricsError {
    fn from(err: ReadError) -> Self {
        MetricsError::InvalidSplit(format!("series index: {err}"))
    }
}
use crate::{Labels, MatchOp, Matcher, MetricsError, METRIC_NAME_LABEL};

/// Key-value metadata: the series index.
pub(crate) const SERIES_INDEX_KEY: &str = "shale.metrics.series_index";

/// Splits with more series than this are written without an index (its share of the footer,
/// which a first read fetches whole, would outgrow what it saves).
pub const MAX_INDEXED_SERIES: usize = 1 << 18;

/// The encoding's version (its first byte).
const ENCODING_VERSION: u8 = 1;

/// Largest decoded index accepted (a damaged footer must not allocate without bound).
const MAX_DECODED_BYTES: u64 = 256 << 20;

/// zstd level of the encoded index.
const ZSTD_LEVEL: i32 = 3;

/// The series of one split, in row order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesIndex {
    /// The label columns: `__name__` first, then the split's other label columns.
    columns: Vec<String>,
    /// Per column, its distinct values (ids are positions).
    values: Vec<Vec<String>>,
    /// First row of each series, then the number of rows (`len = series + 1`).
    starts: Vec<u64>,
    /// Column-major: `keys[column * series + s]` is `id + 1` of the value of series `s`, 0
    /// when it lacks the label.
    keys: Vec<u32>,
}

impl SeriesIndex {
    /// Series in the index.
    pub fn num_series(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// The rows (over the whole file) of series `s`.
    pub fn rows(&self, s: usize) -> Range<u64> {
        self.starts[s]..self.starts[s + 1]
    }

    /// Heap bytes the index holds (what a cache of it accounts).
    pub fn heap_bytes(&self) -> usize {
        let strings: usize = self
            .values
            .iter()
            .flatten()
            .chain(&self.columns)
            .map(|v| v.len() + std::mem::size_of::<String>())
            .sum();
        strings + self.starts.len() * 8 + self.keys.len() * 4
    }

    /// The value id (+1, 0 = missing) of column `c` for series `s`.
    fn key(&self, c: usize, s: usize) -> u32 {
        self.keys[c * self.num_series() + s]
    }

    /// The labels of series `s`.
    pub fn labels(&self, s: usize) -> Labels {
        Labels::new((0..self.columns.len()).filter_map(|c| {
            let key = self.key(c, s);
            let value = self.values[c].get(key.checked_sub(1)? as usize)?;
            Some((self.columns[c].clone(), value.clone()))
        }))
    }

    /// The series every matcher matches, in row order. A matcher on a label without a
    /// column matches as on a missing label.
    pub fn matching(&self, matchers: &[Matcher]) -> Vec<usize> {
        let n = self.num_series();
        let mut candidates = 0..n;
        // Series are sorted by metric name first: `__name__="x"` is one contiguous run.
        if let Some(c) = self.columns.iter().position(|c| c == METRIC_NAME_LABEL) {
            for matcher in matchers {
                if matcher.name == METRIC_NAME_LABEL && matcher.op == MatchOp::Equal {
                    let names = &self.values[c];
                    let Some(id) = names.iter().position(|v| *v == matcher.value) else {
                        return Vec::new();
                    };
                    let target = id as u32 + 1;
                    let column = &self.keys[c * n..(c + 1) * n];
                    let name_of = |s: usize| -> &str {
                        match column[s].checked_sub(1) {
                            Some(id) => names.get(id as usize).map_or("", String::as_str),
                            None => "",
                        }
                    };
                    // The first series whose name is not below the wanted one.
                    let (mut first, mut high) = (0, n);
                    while first < high {
                        let mid = first + (high - first) / 2;
                        if name_of(mid) < matcher.value.as_str() {
                            first = mid + 1;
                        } else {
                            high = mid;
                        }
                    }
                    let end = first
                        + column[first..]
                            .iter()
                            .take_while(|&&key| key == target)
                            .count();
                    candidates = first..end;
                    break;
                }
            }
        }
        let mut decided: Vec<(usize, Vec<bool>, bool)> = Vec::new();
        for matcher in matchers {
            match self.columns.iter().position(|c| *c == matcher.name) {
                Some(c) => decided.push((
                    c,
                    self.values[c]
                        .iter()
                        .map(|v| matcher.matches_value(v))
                        .collect(),
                    matcher.matches_missing(),
                )),
                None if matcher.matches_missing() => {}
                None => return Vec::new(),
            }
        }
        candidates
            .filter(|&s| {
                decided.iter().all(
                    |(c, per_value, missing)| match self.key(*c, s).checked_sub(1) {
                        None => *missing,
                        Some(id) => per_value.get(id as usize).copied().unwrap_or(false),
                    },
                )
            })
            .collect()
    }

    /// The index as key-value metadata text: the binary form, zstd, base64.
    pub(crate) fn encode(&self) -> Result<String, MetricsError> {
        let mut out = vec![ENCODING_VERSION];
        put_varint(&mut out, self.columns.len() as u64);
        for (column, values) in self.columns.iter().zip(&self.values) {
            put_str(&mut out, column);
            put_varint(&mut out, values.len() as u64);
            for value in values {
                put_str(&mut out, value);
            }
        }
        put_varint(&mut out, self.num_series() as u64);
        let mut previous = 0;
        for &start in &self.starts {
            put_varint(&mut out, start - previous);
            previous = start;
        }
        for &key in &self.keys {
            put_varint(&mut out, u64::from(key));
        }
        let compressed = zstd::bulk::compress(&out, ZSTD_LEVEL)
            .map_err(|err| MetricsError::InvalidSplit(format!("series index: {err}")))?;
        Ok(base64::engine::general_purpose::STANDARD_NO_PAD.encode(compressed))
    }

    /// The index from its key-value metadata text; every count is checked against the bytes
    /// left, so a damaged index is an error, never a panic or an unbounded allocation.
    pub(crate) fn decode(text: &str) -> Result<SeriesIndex, MetricsError> {
        let invalid = |what: &str| MetricsError::InvalidSplit(format!("series index: {what}"));
        let compressed = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(text)
            .map_err(|_| invalid("not base64"))?;
        let mut bytes = Vec::new();
        zstd::stream::read::Decoder::new(compressed.as_slice())
            .map_err(|_| invalid("not zstd"))?
            .take(MAX_DECODED_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|_| invalid("not zstd"))?;
        if bytes.len() as u64 > MAX_DECODED_BYTES {
            return Err(invalid("too large"));
        }
        let mut at = Reader::new(&bytes);
        if at.byte()? != ENCODING_VERSION {
            return Err(invalid("unknown encoding version"));
        }
        let num_columns = at.count()?;
        let mut columns = Vec::with_capacity(num_columns);
        let mut values = Vec::with_capacity(num_columns);
        for _ in 0..num_columns {
            columns.push(at.string()?);
            let n = at.count()?;
            let mut column = Vec::with_capacity(n);
            for _ in 0..n {
                column.push(at.string()?);
            }
            values.push(column);
        }
        let num_series = at.count()?;
        let mut starts = Vec::with_capacity(num_series + 1);
        let mut row = 0u64;
        for _ in 0..=num_series {
            row = row
                .checked_add(at.varint()?)
                .ok_or_else(|| invalid("row overflow"))?;
            starts.push(row);
        }
        let num_keys = num_columns
            .checked_mul(num_series)
            .filter(|&n| n <= at.left())
            .ok_or_else(|| invalid("truncated"))?;
        let mut keys = Vec::with_capacity(num_keys);
        for k in 0..num_keys {
            let key = at.varint()?;
            let limit = values[k / num_series.max(1)].len() as u64;
            if key > limit {
                return Err(invalid("value id out of range"));
            }
            keys.push(key as u32);
        }
        Ok(SeriesIndex {
            columns,
            values,
            starts,
            keys,
        })
    }
}

/// Builds the index of a split as its series are written, in row order.
#[derive(Debug)]
pub(crate) struct SeriesIndexBuilder {
    columns: Vec<String>,
    ids: Vec<HashMap<String, u32>>,
    values: Vec<Vec<String>>,
    starts: Vec<u64>,
    /// Row-major while building: the keys of each series, one per column.
    keys: Vec<u32>,
}

impl SeriesIndexBuilder {
    /// A builder for a split whose label columns (after `__name__`) are `label_columns`.
    pub(crate) fn new(label_columns: &[String]) -> SeriesIndexBuilder {
        let columns: Vec<String> = std::iter::once(METRIC_NAME_LABEL.to_string())
            .chain(label_columns.iter().cloned())
            .collect();
        SeriesIndexBuilder {
            ids: vec![HashMap::new(); columns.len()],
            values: vec![Vec::new(); columns.len()],
            columns,
            starts: Vec::new(),
            keys: Vec::new(),
        }
    }

    /// Records a series whose rows start at `first_row`. Past [`MAX_INDEXED_SERIES`] the
    /// builder stops recording (the split gets no index).
    pub(crate) fn push(&mut self, labels: &Labels, first_row: u64) {
        if self.starts.len() > MAX_INDEXED_SERIES {
            return;
        }
        self.starts.push(first_row);
        if self.starts.len() > MAX_INDEXED_SERIES {
            self.keys = Vec::new();
            return;
        }
        for (c, column) in self.columns.iter().enumerate() {
            let key = match labels.get(column) {
                None => 0,
                Some(value) => match self.ids[c].get(value) {
                    Some(id) => id + 1,
                    None => {
                        let id = self.values[c].len() as u32;
                        self.ids[c].insert(value.to_string(), id);
                        self.values[c].push(value.to_string());
                        id + 1
                    }
                },
            };
            self.keys.push(key);
        }
    }

    /// The index of the split of `rows` rows, if it has at most [`MAX_INDEXED_SERIES`].
    pub(crate) fn finish(self, rows: u64) -> Option<SeriesIndex> {
        let n = self.starts.len();
        if n > MAX_INDEXED_SERIES {
            return None;
        }
        let width = self.columns.len();
        let mut keys = vec![0u32; self.keys.len()];
        for (s, row) in self.keys.chunks(width.max(1)).enumerate() {
            for (c, &key) in row.iter().enumerate() {
                keys[c * n + s] = key;
            }
        }
        let mut starts = self.starts;
        starts.push(rows);
        Some(SeriesIndex {
            columns: self.columns,
            values: self.values,
            starts,
            keys,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        Labels::new(pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())))
    }

    fn index() -> SeriesIndex {
        let mut builder = SeriesIndexBuilder::new(&["job".to_string(), "le".to_string()]);
        builder.push(&labels(&[("__name__", "a"), ("job", "x")]), 0);
        builder.push(&labels(&[("__name__", "b"), ("job", "x"), ("le", "1")]), 3);
        builder.push(&labels(&[("__name__", "b"), ("job", "y"), ("le", "2")]), 5);
        builder.push(&labels(&[("__name__", "c"), ("job", "y")]), 9);
        builder.finish(10).expect("an index")
    }

    #[test]
    fn matches_as_labels_do_and_round_trips() {
        let index = index();
        let decoded = SeriesIndex::decode(&index.encode().expect("encodes")).expect("decodes");
        assert_eq!(decoded, index);
        assert_eq!(index.rows(1), 3..5);
        assert_eq!(index.rows(3), 9..10);
        let m = |name: &str, op, value: &str| Matcher::new(name, op, value).expect("a matcher");
        assert_eq!(
            index.matching(&[m("__name__", MatchOp::Equal, "b")]),
            [1, 2]
        );
        assert_eq!(
            index.matching(&[
                m("__name__", MatchOp::Equal, "b"),
                m("job", MatchOp::Equal, "y")
            ]),
            [2]
        );
        assert_eq!(index.matching(&[m("le", MatchOp::Equal, "")]), [0, 3]);
        assert_eq!(
            index.matching(&[m("job", MatchOp::Regex, "x|y")]),
            [0, 1, 2, 3]
        );
        assert!(index
            .matching(&[m("__name__", MatchOp::Equal, "zz")])
            .is_empty());
        assert!(index.matching(&[m("nope", MatchOp::Equal, "v")]).is_empty());
        assert_eq!(
            index.matching(&[m("nope", MatchOp::NotEqual, "v")]).len(),
            4
        );
        assert_eq!(
            index.labels(1),
            labels(&[("__name__", "b"), ("job", "x"), ("le", "1")])
        );
    }

    #[test]
    fn damaged_indexes_are_errors() {
        let text = index().encode().expect("encodes");
        for cut in [0, 1, text.len() / 2, text.len() - 1] {
            assert!(SeriesIndex::decode(&text[..cut]).is_err(), "cut at {cut}");
        }
        assert!(SeriesIndex::decode("!!").is_err());
        // A count larger than the bytes left.
        let mut raw = vec![ENCODING_VERSION];
        put_varint(&mut raw, u64::MAX);
        let text = base64::engine::general_purpose::STANDARD_NO_PAD
            .encode(zstd::bulk::compress(&raw, 1).expect("compresses"));
        assert!(SeriesIndex::decode(&text).is_err());
    }
}
