//! The time filter of a search: `start <= timestamp < end` on the timestamp fast column,
//! without scanning the whole column.
//!
//! Tantivy's range query on a fast field checks every value of the column in the range of
//! documents it is asked about, and a time range intersected with a term asks about nearly
//! all of them. Logs arrive roughly in time order, so a split's documents are too: here each
//! segment's column is summarized once, per block of [`BLOCK_DOCS`] documents, by the lowest
//! and highest timestamp in the block. A search then skips the blocks outside its range,
//! takes every document of a block inside it without reading a value, and checks values only
//! in the blocks the range's ends cut. Summaries are kept per segment (segments are
//! immutable, their ids unique) in a process-wide table bounded in bytes.
//!
//! The answer is exactly the range query's: a block's bounds are exact, and a cut block is
//! checked value by value. A split whose documents are not in time order (sorted by another
//! key) gains nothing but loses little: its blocks all overlap the range and are checked as
//! the range query would. A multi-valued timestamp column is left to the range query.

use std::collections::HashMap;
use std::ops::{Bound, Range, RangeInclusive};
use std::sync::{Arc, Mutex, OnceLock};

use tantivy::columnar::{Column, ColumnIndex};
use tantivy::index::SegmentId;
use tantivy::query::{
    AllScorer, ConstScorer, EmptyScorer, EnableScoring, Explanation, Query, RangeQuery, Scorer,
    Weight,
};
use tantivy::schema::Field;
use tantivy::{DateTime, DocId, DocSet, Score, SegmentReader, Term, TERMINATED};

/// Documents per summarized block.
pub const BLOCK_DOCS: u32 = 1024;

/// Bytes of summaries kept for all segments; past it the table starts over.
const MAX_SUMMARY_BYTES: usize = 64 << 20;

/// `start <= timestamp < end` on the timestamp field `field` (see the module docs).
#[derive(Clone, Debug)]
pub struct TimeFilterQuery {
    field: Field,
    lower: Bound<DateTime>,
    upper: Bound<DateTime>,
}

impl TimeFilterQuery {
    /// The documents of `field` (a fast datetime field) between `lower` and `upper`.
    pub fn new(field: Field, lower: Bound<DateTime>, upper: Bound<DateTime>) -> Self {
        TimeFilterQuery {
            field,
            lower,
            upper,
        }
    }

    /// The same filter as Tantivy's range query (the fallback, and the reference in tests).
    pub fn as_range_query(&self) -> RangeQuery {
        let term = |dt: &DateTime| Term::from_field_date(self.field, *dt);
        RangeQuery::new(self.lower.as_ref().map(term), self.upper.as_ref().map(term))
    }

    /// The inclusive range of column values the bounds allow; `None` when none.
    fn value_range(&self) -> Option<RangeInclusive<DateTime>> {
        let nanos = |dt: &DateTime| dt.into_timestamp_nanos();
        let start = match &self.lower {
            Bound::Included(dt) => nanos(dt),
            Bound::Excluded(dt) => nanos(dt).checked_add(1)?,
            Bound::Unbounded => i64::MIN,
        };
        let end = match &self.upper {
            Bound::Included(dt) => nanos(dt),
            Bound::Excluded(dt) => nanos(dt).checked_sub(1)?,
            Bound::Unbounded => i64::MAX,
        };
        (start <= end)
            .then(|| DateTime::from_timestamp_nanos(start)..=DateTime::from_timestamp_nanos(end))
    }
}

impl Query for TimeFilterQuery {
    fn weight(&self, enable_scoring: EnableScoring<'_>) -> tantivy::Result<Box<dyn Weight>> {
        let field_name = enable_scoring
            .schema()
            .get_field_name(self.field)
            .to_string();
        Ok(Box::new(TimeFilterWeight {
            field_name,
            range: self.value_range(),
            fallback: self.as_range_query().weight(enable_scoring)?,
        }))
    }
}

struct TimeFilterWeight {
    field_name: String,
    range: Option<RangeInclusive<DateTime>>,
    /// Tantivy's range query, for a column this filter does not summarize.
    fallback: Box<dyn Weight>,
}

impl Weight for TimeFilterWeight {
    fn scorer(&self, reader: &SegmentReader, boost: Score) -> tantivy::Result<Box<dyn Scorer>> {
        let Some(range) = self.range.clone() else {
            return Ok(Box::new(EmptyScorer));
        };
        let Some(column) = reader
            .fast_fields()
            .column_opt::<DateTime>(&self.field_name)?
        else {
            return self.fallback.scorer(reader, boost);
        };
        let full = match &column.index {
            ColumnIndex::Full => true,
            ColumnIndex::Optional(_) => false,
            ColumnIndex::Empty { .. } => return Ok(Box::new(EmptyScorer)),
            ColumnIndex::Multivalued(_) => return self.fallback.scorer(reader, boost),
        };
        if *range.start() > column.max_value() || *range.end() < column.min_value() {
            return Ok(Box::new(EmptyScorer));
        }
        if full && *range.start() <= column.min_value() && column.max_value() <= *range.end() {
            return Ok(Box::new(ConstScorer::new(
                AllScorer::new(reader.max_doc()),
                boost,
            )));
        }
        let summary = summary(reader.segment_id(), &self.field_name, &column);
        let docset = BlockRangeDocSet::new(column, range, &summary);
        Ok(Box::new(ConstScorer::new(docset, boost)))
    }

    fn explain(&self, reader: &SegmentReader, doc: DocId) -> tantivy::Result<Explanation> {
        let mut scorer = self.scorer(reader, 1.0)?;
        if scorer.seek(doc) != doc {
            return Err(tantivy::TantivyError::InvalidArgument(format!(
                "document {doc} does not match"
            )));
        }
        Ok(Explanation::new("TimeFilter", scorer.score()))
    }
}

/// The lowest and highest value of each block of a segment's column; `None` for a block
/// without values.
type Summary = Vec<Option<(DateTime, DateTime)>>;

/// Summaries by segment and field.
struct Summaries {
    by_segment: HashMap<(SegmentId, String), Arc<Summary>>,
    bytes: usize,
}

fn summaries() -> &'static Mutex<Summaries> {
    static SUMMARIES: OnceLock<Mutex<Summaries>> = OnceLock::new();
    SUMMARIES.get_or_init(|| {
        Mutex::new(Summaries {
            by_segment: HashMap::new(),
            bytes: 0,
        })
    })
}

/// The summary of `column` (the field `field_name` of segment `segment`), computed on first
/// use.
fn summary(segment: SegmentId, field_name: &str, column: &Column<DateTime>) -> Arc<Summary> {
    let key = (segment, field_name.to_string());
    if let Some(found) = summaries()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .by_segment
        .get(&key)
    {
        return found.clone();
    }
    let computed = Arc::new(summarize(column));
    let bytes = computed.len() * std::mem::size_of::<Option<(DateTime, DateTime)>>() + 64;
    let mut table = summaries().lock().unwrap_or_else(|p| p.into_inner());
    if table.bytes + bytes > MAX_SUMMARY_BYTES {
        table.by_segment.clear();
        table.bytes = 0;
    }
    if table.by_segment.insert(key, computed.clone()).is_none() {
        table.bytes += bytes;
    }
    computed
}

/// Reads the whole column once: the bounds of each block of documents.
fn summarize(column: &Column<DateTime>) -> Summary {
    let num_docs = column.num_docs();
    let mut values = vec![DateTime::MIN; BLOCK_DOCS as usize];
    (0..num_docs.div_ceil(BLOCK_DOCS))
        .map(|block| {
            let docs = block * BLOCK_DOCS..((block + 1) * BLOCK_DOCS).min(num_docs);
            let rows = column.index.docid_range_to_rowids(docs);
            let values = &mut values[..(rows.end - rows.start) as usize];
            if values.is_empty() {
                return None;
            }
            column.values.get_range(u64::from(rows.start), values);
            let mut bounds = (values[0], values[0]);
            for &value in values.iter() {
                if value < bounds.0 {
                    bounds.0 = value;
                }
                if value > bounds.1 {
                    bounds.1 = value;
                }
            }
            Some(bounds)
        })
        .collect()
}

/// A run of documents the filter may match: all of them (`whole`) or those whose value is in
/// range.
#[derive(Clone, Debug, PartialEq)]
struct Run {
    docs: Range<DocId>,
    whole: bool,
}

/// The documents of the blocks overlapping the range, in order (see the module docs).
struct BlockRangeDocSet {
    column: Column<DateTime>,
    range: RangeInclusive<DateTime>,
    runs: Vec<Run>,
    /// The run the current document is in (`runs.len()` once terminated).
    run: usize,
    doc: DocId,
    /// In a run that is not whole: its matches from the current one on, and where we are.
    matches: Vec<DocId>,
    position: usize,
    size_hint: u32,
}

impl BlockRangeDocSet {
    fn new(column: Column<DateTime>, range: RangeInclusive<DateTime>, summary: &Summary) -> Self {
        let num_docs = column.num_docs();
        let mut runs: Vec<Run> = Vec::new();
        for (block, bounds) in summary.iter().enumerate() {
            let Some((low, high)) = bounds else { continue };
            if high < range.start() || low > range.end() {
                continue;
            }
            let whole = matches!(column.index, ColumnIndex::Full)
                && range.start() <= low
                && high <= range.end();
            let start = block as u32 * BLOCK_DOCS;
            let docs = start..(start + BLOCK_DOCS).min(num_docs);
            match runs.last_mut() {
                Some(last) if last.whole && whole && last.docs.end == docs.start => {
                    last.docs.end = docs.end
                }
                _ => runs.push(Run { docs, whole }),
            }
        }
        let size_hint = runs.iter().map(|run| run.docs.len() as u32).sum();
        let mut docset = BlockRangeDocSet {
            column,
            range,
            runs,
            run: 0,
            doc: TERMINATED,
            matches: Vec::new(),
            position: 0,
            size_hint,
        };
        docset.enter(0, 0);
        docset
    }

    /// Goes to the first match at or after `target` in run `run` or the ones after it.
    fn enter(&mut self, mut run: usize, target: DocId) -> DocId {
        while let Some(current) = self.runs.get(run) {
            let from = current.docs.start.max(target);
            if from < current.docs.end {
                if current.whole {
                    self.run = run;
                    self.doc = from;
                    return from;
                }
                self.matches.clear();
                self.column.get_docids_for_value_range(
                    self.range.clone(),
                    from..current.docs.end,
                    &mut self.matches,
                );
                if let Some(&first) = self.matches.first() {
                    self.run = run;
                    self.position = 0;
                    self.doc = first;
                    return first;
                }
            }
            run += 1;
        }
        self.run = self.runs.len();
        self.doc = TERMINATED;
        TERMINATED
    }
}

impl DocSet for BlockRangeDocSet {
    fn advance(&mut self) -> DocId {
        let Some(current) = self.runs.get(self.run) else {
            return TERMINATED;
        };
        if current.whole {
            if self.doc + 1 < current.docs.end {
                self.doc += 1;
                return self.doc;
            }
        } else if self.position + 1 < self.matches.len() {
            self.position += 1;
            self.doc = self.matches[self.position];
            return self.doc;
        }
        let next = current.docs.end;
        self.enter(self.run + 1, next)
    }

    fn seek(&mut self, target: DocId) -> DocId {
        if self.doc >= target {
            return self.doc;
        }
        let Some(current) = self.runs.get(self.run) else {
            return TERMINATED;
        };
        if target < current.docs.end {
            if current.whole {
                self.doc = target;
                return target;
            }
            let skip = self.matches[self.position..].partition_point(|&doc| doc < target);
            if self.position + skip < self.matches.len() {
                self.position += skip;
                self.doc = self.matches[self.position];
                return self.doc;
            }
        }
        // The first run ending after the target.
        let run = self.run + self.runs[self.run..].partition_point(|run| run.docs.end <= target);
        self.enter(run, target)
    }

    fn doc(&self) -> DocId {
        self.doc
    }

    fn size_hint(&self) -> u32 {
        self.size_hint
    }

    fn cost(&self) -> u64 {
        u64::from(self.size_hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tantivy::collector::Count;
    use tantivy::schema::{DateOptions, DateTimePrecision, Schema, FAST, STRING};
    use tantivy::{doc, Index, IndexWriter};

    /// An index of one segment whose documents have the timestamps `secs` (in this order;
    /// `None` for a document without one), with a `tag` of `i % 3`.
    fn index(secs: &[Option<i64>]) -> (Index, Field, Field) {
        let mut builder = Schema::builder();
        let ts = builder.add_date_field(
            "ts",
            DateOptions::from(FAST).set_precision(DateTimePrecision::Seconds),
        );
        let tag = builder.add_text_field("tag", STRING);
        let index = Index::create_in_ram(builder.build());
        let mut writer: IndexWriter = index.writer_with_num_threads(1, 20_000_000).unwrap();
        for (i, secs) in secs.iter().enumerate() {
            let mut doc = doc!(tag => (i % 3).to_string());
            if let Some(secs) = secs {
                doc.add_date(ts, DateTime::from_timestamp_secs(*secs));
            }
            writer.add_document(doc).unwrap();
        }
        writer.commit().unwrap();
        (index, ts, tag)
    }

    fn bound(secs: Option<i64>, inclusive: bool) -> Bound<DateTime> {
        match secs {
            None => Bound::Unbounded,
            Some(secs) if inclusive => Bound::Included(DateTime::from_timestamp_secs(secs)),
            Some(secs) => Bound::Excluded(DateTime::from_timestamp_secs(secs)),
        }
    }

    /// The documents matching `query`, in order.
    fn docs(index: &Index, query: &dyn Query) -> Vec<DocId> {
        let searcher = index.reader().unwrap().searcher();
        let weight = query
            .weight(EnableScoring::disabled_from_searcher(&searcher))
            .unwrap();
        let mut scorer = weight.scorer(searcher.segment_reader(0), 1.0).unwrap();
        let mut out = Vec::new();
        let mut doc = scorer.doc();
        while doc != TERMINATED {
            out.push(doc);
            doc = scorer.advance();
        }
        out
    }

    /// Same documents, same counts (alone and under a tag) as Tantivy's range query, for
    /// ordered, shuffled and sparse timestamps and every kind of bound.
    #[test]
    fn matches_what_the_range_query_matches() {
        let n = 5 * BLOCK_DOCS as i64 + 77;
        let ordered: Vec<Option<i64>> = (0..n).map(|i| Some(1_000 + i / 3)).collect();
        // Mostly ordered, with stragglers from far away in every block.
        let stragglers: Vec<Option<i64>> = (0..n)
            .map(|i| {
                Some(if i % 97 == 0 {
                    1_000 + (i * 7919) % n
                } else {
                    1_000 + i
                })
            })
            .collect();
        let shuffled: Vec<Option<i64>> = (0..n).map(|i| Some(1_000 + (i * 7919) % n)).collect();
        let sparse: Vec<Option<i64>> = (0..n)
            .map(|i| (i % 5 != 0 && !(1200..3400).contains(&i)).then_some(1_000 + i))
            .collect();
        let bounds = [
            (Some(1_100), Some(1_200)),
            (Some(1_000), Some(1_000 + n)),
            (Some(2_000), None),
            (None, Some(1_500)),
            (Some(1_500), Some(1_500)),
            (Some(4_000), Some(4_200)),
            (Some(90_000), None),
            (None, Some(0)),
            (Some(1_000 + 1_030), Some(1_000 + 3 * 1_024 + 5)),
        ];
        for (name, secs) in [
            ("ordered", &ordered),
            ("stragglers", &stragglers),
            ("shuffled", &shuffled),
            ("sparse", &sparse),
        ] {
            let (index, ts, tag) = index(secs);
            let searcher = index.reader().unwrap().searcher();
            for (start, end) in bounds {
                for inclusive_end in [false, true] {
                    let filter =
                        TimeFilterQuery::new(ts, bound(start, true), bound(end, inclusive_end));
                    let range = filter.as_range_query();
                    assert_eq!(
                        docs(&index, &filter),
                        docs(&index, &range),
                        "{name} {start:?}..{end:?} inclusive end {inclusive_end}"
                    );
                    let under_tag = |query: Box<dyn Query>| {
                        let tag_query = tantivy::query::TermQuery::new(
                            Term::from_field_text(tag, "1"),
                            tantivy::schema::IndexRecordOption::Basic,
                        );
                        let both = tantivy::query::BooleanQuery::intersection(vec![
                            Box::new(tag_query),
                            query,
                        ]);
                        searcher.search(&both, &Count).unwrap()
                    };
                    assert_eq!(
                        under_tag(Box::new(filter.clone())),
                        under_tag(Box::new(range)),
                        "{name} {start:?}..{end:?} under a tag"
                    );
                }
            }
        }
    }

    /// Seeking lands on the first match at or after the target, in whole and cut blocks
    /// alike, and past the end terminates.
    #[test]
    fn seeks_to_the_first_match_at_or_after_the_target() {
        let n = 4 * BLOCK_DOCS as i64;
        let secs: Vec<Option<i64>> = (0..n).map(Some).collect();
        let (index, ts, _) = index(&secs);
        // Cuts block 0 (from 500), takes blocks 1 and 2 whole, cuts block 3 (to 3500).
        let filter = TimeFilterQuery::new(ts, bound(Some(500), true), bound(Some(3_500), false));
        let searcher = index.reader().unwrap().searcher();
        let weight = filter
            .weight(EnableScoring::disabled_from_searcher(&searcher))
            .unwrap();
        let reader = searcher.segment_reader(0);
        for (target, expected) in [
            (0, 500),
            (500, 500),
            (501, 501),
            (1_500, 1_500),
            (3_499, 3_499),
            (3_500, TERMINATED),
            (TERMINATED, TERMINATED),
        ] {
            let mut scorer = weight.scorer(reader, 1.0).unwrap();
            assert_eq!(scorer.seek(target), expected, "seek({target})");
        }
        let mut scorer = weight.scorer(reader, 1.0).unwrap();
        assert_eq!(scorer.seek(1_023), 1_023);
        assert_eq!(scorer.advance(), 1_024);
        assert_eq!(scorer.seek(3_000), 3_000);
        assert_eq!(scorer.advance(), 3_001);
        assert_eq!(weight.count(reader).unwrap(), 3_000);
    }
}
