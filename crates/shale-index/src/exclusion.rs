//! Exclusions (`MustNot` clauses) that tolerate the way Tantivy probes them.
//!
//! Tantivy's `Exclude` asks its exclusion set, for each candidate document, whether it holds
//! that document (`seek_danger(doc)`). The exclusion scorer starts positioned on its own first
//! match, which may lie past the first candidates: the first probes then seek *backwards*,
//! which `DocSet`'s contract forbids. Most scorers shrug it off; a phrase scorer asserts on it
//! (and an intersection holding one answers for the wrong document), so `x AND NOT "a b"` or a
//! delete task with a phrase could fail a search. [`guard_exclusions`] wraps every exclusion of
//! a query tree in a scorer that answers a backward probe from its position without moving.

use std::fmt;

use tantivy::query::{BooleanQuery, EnableScoring, Explanation, Occur, Query, Scorer, Weight};
use tantivy::{DocId, DocSet, Score, SeekDangerResult, SegmentReader, Term, TERMINATED};

/// `query` with every `MustNot` clause of its boolean queries (at any depth) guarded against
/// backward probes.
pub fn guard_exclusions(query: Box<dyn Query>) -> Box<dyn Query> {
    match query.downcast_ref::<BooleanQuery>() {
        Some(boolean) => {
            let clauses = boolean
                .clauses()
                .iter()
                .map(|(occur, sub)| {
                    let sub = guard_exclusions(sub.box_clone());
                    let sub: Box<dyn Query> = match occur {
                        Occur::MustNot if sub.downcast_ref::<ForwardOnly>().is_none() => {
                            Box::new(ForwardOnly(sub))
                        }
                        _ => sub,
                    };
                    (*occur, sub)
                })
                .collect();
            Box::new(BooleanQuery::new(clauses))
        }
        None => query,
    }
}

/// A query whose scorers answer a probe below their position without seeking backwards.
struct ForwardOnly(Box<dyn Query>);

impl Clone for ForwardOnly {
    fn clone(&self) -> Self {
        ForwardOnly(self.0.box_clone())
    }
}

impl fmt::Debug for ForwardOnly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Query for ForwardOnly {
    fn weight(&self, enable_scoring: EnableScoring<'_>) -> tantivy::Result<Box<dyn Weight>> {
        Ok(Box::new(ForwardOnlyWeight(self.0.weight(enable_scoring)?)))
    }

    fn query_terms<'a>(&'a self, visitor: &mut dyn FnMut(&'a Term, bool)) {
        self.0.query_terms(visitor)
    }
}

struct ForwardOnlyWeight(Box<dyn Weight>);

impl Weight for ForwardOnlyWeight {
    fn scorer(&self, reader: &SegmentReader, boost: Score) -> tantivy::Result<Box<dyn Scorer>> {
        Ok(Box::new(ForwardOnlyScorer {
            inner: self.0.scorer(reader, boost)?,
        }))
    }

    fn explain(&self, reader: &SegmentReader, doc: DocId) -> tantivy::Result<Explanation> {
        self.0.explain(reader, doc)
    }

    fn count(&self, reader: &SegmentReader) -> tantivy::Result<u32> {
        self.0.count(reader)
    }
}

/// Never leaves its inner scorer in `seek_danger`'s "invalid" state, and never seeks it
/// backwards: a probe is answered from the current position or by a forward `seek`.
struct ForwardOnlyScorer {
    inner: Box<dyn Scorer>,
}

impl DocSet for ForwardOnlyScorer {
    fn advance(&mut self) -> DocId {
        self.inner.advance()
    }

    fn seek(&mut self, target: DocId) -> DocId {
        let doc = self.inner.doc();
        if doc >= target {
            return doc;
        }
        self.inner.seek(target)
    }

    fn seek_danger(&mut self, target: DocId) -> SeekDangerResult {
        if target >= TERMINATED {
            return SeekDangerResult::SeekLowerBound(TERMINATED);
        }
        let doc = self.seek(target);
        if doc == target {
            SeekDangerResult::Found
        } else {
            // No match between the target and the (valid) position reached.
            SeekDangerResult::SeekLowerBound(doc)
        }
    }

    fn doc(&self) -> DocId {
        self.inner.doc()
    }

    fn size_hint(&self) -> u32 {
        self.inner.size_hint()
    }
}

impl Scorer for ForwardOnlyScorer {
    fn score(&mut self) -> Score {
        self.inner.score()
    }
}

#[cfg(test)]
mod tests {
    use tantivy::collector::Count;
    use tantivy::query::QueryParser;
    use tantivy::schema::{Schema, TEXT};
    use tantivy::{doc, Index};

    use super::*;

    /// The documents a phrase exclusion starts past: a backward probe, which failed a
    /// debug assertion inside the phrase scorer before.
    #[test]
    fn phrase_exclusions_are_probed_forward_only() {
        let mut schema = Schema::builder();
        let text = schema.add_text_field("text", TEXT);
        let index = Index::create_in_ram(schema.build());
        let mut writer = index
            .writer_with_num_threads(1, 15_000_000)
            .expect("writer");
        for i in 0..20 {
            let body = if i % 7 == 5 {
                "note seven here"
            } else {
                "note other"
            };
            writer.add_document(doc!(text => body)).expect("add");
        }
        writer.commit().expect("commit");
        let searcher = index.reader().expect("reader").searcher();
        let parser = QueryParser::for_index(&index, vec![text]);
        for query in [
            "+note -\"note seven\"",
            "+note -(+\"note seven\" +here)",
            "(+note -\"note seven\") other",
        ] {
            let parsed = guard_exclusions(parser.parse_query(query).expect("parses"));
            let count = searcher.search(parsed.as_ref(), &Count).expect("search");
            assert_eq!(count, 17, "{query}");
        }
    }
}
