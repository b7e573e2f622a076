//! Delete tasks inside a split: the query matching what a set of tasks deletes, and the
//! alive bitset of every segment once they are applied.
//!
//! Task `o` deletes the documents that match its query, fall in its time range, and have an
//! ingest opstamp (the hidden [`OPSTAMP_FIELD_NAME`](crate::OPSTAMP_FIELD_NAME) field) below
//! `o` — the documents acknowledged before the task was created. Search excludes them (until
//! a merge purges them); merges write only the documents left alive.

use std::ops::Bound;

use shale_types::DeleteTask;
use tantivy::directory::OwnedBytes;
use tantivy::fastfield::{write_alive_bitset, AliveBitSet};
use tantivy::query::{BooleanQuery, EnableScoring, Occur, Query, RangeQuery};
use tantivy::{BitSet, Index, Segment, SegmentReader, Term};

use crate::doc_mapper::DocMapper;
use crate::error::IndexError;

impl DocMapper {
    /// The documents `task` deletes: its query, within its time range, ingested before it.
    pub fn delete_task_query(&self, task: &DeleteTask) -> Result<Box<dyn Query>, IndexError> {
        let query = &task.delete_query;
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = vec![(
            Occur::Must,
            self.parse_query(&query.query, task.search_fields())?,
        )];
        if let Some(range) = self.time_range_query(query.start_timestamp, query.end_timestamp) {
            clauses.push((Occur::Must, range));
        }
        clauses.push((
            Occur::Must,
            Box::new(RangeQuery::new(
                Bound::Unbounded,
                Bound::Excluded(Term::from_field_u64(self.opstamp_field(), task.opstamp)),
            )),
        ));
        Ok(Box::new(BooleanQuery::new(clauses)))
    }

    /// The documents any of `tasks` deletes; `None` without tasks.
    pub fn deletes_query(
        &self,
        tasks: &[DeleteTask],
    ) -> Result<Option<Box<dyn Query>>, IndexError> {
        match tasks {
            [] => Ok(None),
            [task] => Ok(Some(self.delete_task_query(task)?)),
            tasks => {
                let clauses = tasks
                    .iter()
                    .map(|task| Ok((Occur::Should, self.delete_task_query(task)?)))
                    .collect::<Result<Vec<_>, IndexError>>()?;
                Ok(Some(Box::new(BooleanQuery::new(clauses))))
            }
        }
    }

    /// `query` without the documents `tasks` delete.
    pub fn without_deleted(
        &self,
        query: Box<dyn Query>,
        tasks: &[DeleteTask],
    ) -> Result<Box<dyn Query>, IndexError> {
        Ok(match self.deletes_query(tasks)? {
            None => query,
            Some(deleted) => crate::exclusion::guard_exclusions(Box::new(BooleanQuery::new(vec![
                (Occur::Must, query),
                (Occur::MustNot, deleted),
            ]))),
        })
    }
}

/// A segment with the documents a set of delete tasks leaves alive.
pub struct SegmentDeletes {
    /// The segment.
    pub segment: Segment,
    /// Its documents (deleted ones included).
    pub max_doc: u32,
    /// Alive documents once the tasks are applied; `None` when they delete nothing here.
    pub alive: Option<AliveBitSet>,
    /// Documents the tasks delete here.
    pub num_deleted: u32,
}

impl SegmentDeletes {
    /// A reader of the segment that sees only the documents left alive.
    pub fn reader(&self) -> Result<SegmentReader, IndexError> {
        Ok(SegmentReader::open_with_custom_alive_set(
            &self.segment,
            self.alive.clone(),
        )?)
    }
}

/// For every segment of `index` (a split of `doc_mapper`'s index), what `tasks` leave alive.
pub fn segment_deletes(
    doc_mapper: &DocMapper,
    index: &Index,
    tasks: &[DeleteTask],
) -> Result<Vec<SegmentDeletes>, IndexError> {
    let query = doc_mapper.deletes_query(tasks)?;
    let weight = match &query {
        Some(query) => {
            Some(query.weight(EnableScoring::disabled_from_schema(doc_mapper.schema()))?)
        }
        None => None,
    };
    let mut out = Vec::new();
    for segment in index.searchable_segments()? {
        let reader = SegmentReader::open(&segment)?;
        let max_doc = reader.max_doc();
        let mut alive = None;
        let mut num_deleted = 0u32;
        if let Some(weight) = &weight {
            let mut bits = BitSet::with_max_value_and_full(max_doc);
            weight.for_each_no_score(&reader, &mut |docs| {
                for &doc in docs {
                    if bits.contains(doc) {
                        bits.remove(doc);
                        num_deleted += 1;
                    }
                }
            })?;
            // Documents the segment itself already deleted stay deleted.
            if let Some(own) = reader.alive_bitset() {
                for doc in 0..max_doc {
                    if own.is_deleted(doc) && bits.contains(doc) {
                        bits.remove(doc);
                    }
                }
            }
            if num_deleted > 0 {
                let mut bytes = Vec::new();
                write_alive_bitset(&bits, &mut bytes).map_err(tantivy::TantivyError::from)?;
                alive = Some(AliveBitSet::open(OwnedBytes::new(bytes)));
            }
        }
        out.push(SegmentDeletes {
            segment,
            max_doc,
            alive,
            num_deleted,
        });
    }
    Ok(out)
}

/// How many documents of `index` `tasks` delete.
pub fn count_deleted(
    doc_mapper: &DocMapper,
    index: &Index,
    tasks: &[DeleteTask],
) -> Result<u64, IndexError> {
    let Some(query) = doc_mapper.deletes_query(tasks)? else {
        return Ok(0);
    };
    let searcher = index.reader()?.searcher();
    Ok(query.count(&searcher)? as u64)
}
