//! The locality merge: m sorted splits of one time bucket in, n sorted splits out, cut at
//! sort-key boundaries so that the outputs' key ranges do not overlap.
//!
//! Every input segment is sorted by the hidden sort key (`_sk`: sort field values, then
//! timestamp descending), so the documents of one sort-field *prefix* (one combination of
//! sort field values) are contiguous in each segment. The merge
//!
//! 1. reads each segment's runs of equal prefix from its `_sk` column (no stored field read);
//! 2. walks the prefixes of all inputs in key order and packs them into outputs of at most
//!    the target size, never splitting one prefix, and never letting a level-1 output reach into
//!    a *fixed* range (the key range of a level-1 split of the bucket that is not an input):
//!    prefixes inside a fixed range go to level-0 outputs of their own;
//! 3. writes each output with one Tantivy `merge_filtered_segments` over the segments that
//!    hold its documents, with an alive bitset selecting their doc-id ranges, into a target
//!    sorted the same way.
//!
//! Rows are conserved: every live input document is in exactly one output. A level-1 output
//! records its key range widened to whole prefixes (`[first prefix, last prefix ++ 0xFF]`):
//! the range it owns, which any document with one of those sort field values falls in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use shale_types::sort_key::{self, SortKey};
use shale_types::{DeleteTask, TimeRange};
use tantivy::directory::OwnedBytes;
use tantivy::fastfield::{write_alive_bitset, AliveBitSet};
use tantivy::{BitSet, Index, Segment, SegmentReader};

use crate::bundle::open_split;
use crate::doc_mapper::{DocMapper, SORT_KEY_FIELD_NAME};
use crate::error::IndexError;
use crate::split::{split_stats, SplitStats, TagCollector, SPLIT_STATS_VERSION};
use crate::BuiltSplit;

/// How to cut the outputs of a locality merge.
#[derive(Clone, Debug)]
pub struct LocalityCut {
    /// Most documents of an output (a single prefix with more documents is not split).
    pub target_num_docs: u64,
    /// Or at least this many bytes, estimated from the inputs' bytes per document.
    pub target_bytes: Option<u64>,
    /// Key ranges (inclusive) of the bucket's level-1 splits that are not inputs: no level-1
    /// output may overlap them.
    pub fixed_ranges: Vec<(SortKey, SortKey)>,
}

/// One output of a locality merge.
#[derive(Debug)]
pub struct LocalityOutput {
    /// The written split bundle.
    pub built: BuiltSplit,
    /// 1, or 0 for documents whose keys fall in a fixed range (they stay overlapping).
    pub key_level: u8,
}

/// A run of documents of one prefix in one segment: doc ids `[start, end)`.
struct Run {
    segment: usize,
    start: u32,
    end: u32,
    live_docs: u64,
}

/// One planned output: the prefixes `[first, last]` (inclusive) and its level.
struct Group {
    prefixes: Vec<Vec<u8>>,
    key_level: u8,
}

/// Merges the split bundles at `bundle_paths` (one time bucket, sorted by the sort key) into
/// level-1 splits cut by `cut`; bundles are written in `scratch_dir` as `out-{i}.split`.
///
/// `deletes[i]` are the delete tasks input `i` is not clean of: the documents they delete are
/// left out of every output. Also returns how many were left out.
pub fn locality_merge_split_files(
    doc_mapper: &DocMapper,
    bundle_paths: &[PathBuf],
    deletes: &[Vec<DeleteTask>],
    scratch_dir: &Path,
    cut: &LocalityCut,
) -> Result<(Vec<LocalityOutput>, u64), IndexError> {
    if deletes.len() != bundle_paths.len() {
        return Err(IndexError::InvalidArgument(format!(
            "{} delete lists for {} inputs",
            deletes.len(),
            bundle_paths.len()
        )));
    }
    let kinds = doc_mapper.sort_field_types().ok_or_else(|| {
        IndexError::InvalidArgument("a locality merge needs an index with sort fields".to_string())
    })?;
    let inputs = bundle_paths
        .iter()
        .map(|path| open_split(path))
        .collect::<Result<Vec<Index>, _>>()?;
    for (i, input) in inputs.iter().enumerate() {
        if &input.schema() != doc_mapper.schema() {
            return Err(IndexError::InvalidArgument(format!(
                "input split #{i} has a different schema than the doc mapping"
            )));
        }
    }
    // Inputs' stats: tags and uncompressed bytes (outputs get a share), the common bucket.
    let mut tags = TagCollector::default();
    let mut uncompressed_bytes = 0u64;
    let mut buckets = BTreeSet::new();
    let mut input_bytes = 0u64;
    let mut min_doc_opstamp: Option<u64> = None;
    // Every input segment, with what the delete tasks leave alive in it.
    let mut segment_deletes = Vec::new();
    for ((input, path), tasks) in inputs.iter().zip(bundle_paths).zip(deletes) {
        input_bytes += std::fs::metadata(path)
            .map_err(|err| IndexError::io(path, err))?
            .len();
        let stats = split_stats(input)?.ok_or_else(|| {
            IndexError::InvalidArgument(format!(
                "split `{}` has no recorded stats: not a locality split",
                path.display()
            ))
        })?;
        buckets.insert(stats.time_bucket_start);
        for tag in &stats.tags {
            tags.insert(tag);
        }
        let input_deletes = crate::deletes::segment_deletes(doc_mapper, input, tasks)?;
        let input_docs: u64 = input_deletes.iter().map(|s| u64::from(s.max_doc)).sum();
        let input_deleted: u64 = input_deletes.iter().map(|s| u64::from(s.num_deleted)).sum();
        uncompressed_bytes += share(
            stats.uncompressed_docs_size_bytes,
            input_docs - input_deleted,
            input_docs,
        );
        min_doc_opstamp = min_doc_opstamp
            .into_iter()
            .chain([stats.min_doc_opstamp])
            .min();
        segment_deletes.extend(input_deletes);
    }
    if buckets.len() > 1 {
        return Err(IndexError::InvalidArgument(format!(
            "a locality merge takes splits of one time bucket, these have {}",
            buckets.len()
        )));
    }
    let time_bucket_start = buckets.into_iter().next().flatten();
    let tags = tags.into_tags();

    let num_deleted: u64 = segment_deletes
        .iter()
        .map(|segment| u64::from(segment.num_deleted))
        .sum();
    // Readers that see only what the delete tasks leave alive.
    let readers = segment_deletes
        .iter()
        .map(|segment| segment.reader())
        .collect::<Result<Vec<SegmentReader>, _>>()?;
    let segments: Vec<Segment> = segment_deletes
        .into_iter()
        .map(|segment| segment.segment)
        .collect();

    // 1. Runs of equal prefix, per segment; their doc counts per prefix.
    let mut runs_by_prefix: BTreeMap<Vec<u8>, Vec<Run>> = BTreeMap::new();
    for (segment, reader) in readers.iter().enumerate() {
        for (prefix, run) in prefix_runs(reader, segment, &kinds)? {
            runs_by_prefix.entry(prefix).or_default().push(run);
        }
    }
    let total_docs: u64 = runs_by_prefix
        .values()
        .flatten()
        .map(|run| run.live_docs)
        .sum();

    // 2. Group prefixes into outputs.
    let mut target = cut.target_num_docs.max(1);
    if let (Some(bytes), true) = (cut.target_bytes, total_docs > 0) {
        let bytes_per_doc = (input_bytes / total_docs).max(1);
        target = target.min((bytes / bytes_per_doc).max(1));
    }
    let fixed: Vec<(Vec<u8>, Vec<u8>)> = cut
        .fixed_ranges
        .iter()
        .map(|(min, max)| Ok((prefix_of(&kinds, &min.0)?, prefix_of(&kinds, &max.0)?)))
        .collect::<Result<_, IndexError>>()?;
    let groups = group_prefixes(&runs_by_prefix, &fixed, target);

    // 3. One filtered merge per output.
    let mut outputs = Vec::with_capacity(groups.len());
    for (i, group) in groups.into_iter().enumerate() {
        let mut selected: BTreeMap<usize, BitSet> = BTreeMap::new();
        let mut num_docs = 0u64;
        for prefix in &group.prefixes {
            for run in runs_by_prefix.get(prefix).into_iter().flatten() {
                let reader = &readers[run.segment];
                let bits = selected
                    .entry(run.segment)
                    .or_insert_with(|| BitSet::with_max_value(reader.max_doc()));
                for doc in run.start..run.end {
                    if reader.is_deleted(doc) {
                        continue;
                    }
                    bits.insert(doc);
                }
                num_docs += run.live_docs;
            }
        }
        if num_docs == 0 {
            // Every document of these prefixes was deleted.
            continue;
        }
        let mut output_segments = Vec::with_capacity(selected.len());
        let mut filters = Vec::with_capacity(selected.len());
        for (segment, bits) in selected {
            output_segments.push(segments[segment].clone());
            // A segment wholly in this output, with nothing deleted, needs no filter (the
            // merge then reads it as `merge_indices` would).
            if bits.len() == readers[segment].max_doc() as usize {
                filters.push(None);
                continue;
            }
            let mut bytes = Vec::new();
            write_alive_bitset(&bits, &mut bytes)
                .map_err(|err| IndexError::io(scratch_dir, err))?;
            filters.push(Some(AliveBitSet::open(OwnedBytes::new(bytes))));
        }
        let output_dir = scratch_dir.join(format!("out-{i}"));
        let merged =
            crate::merge::merge_filtered(doc_mapper, &output_segments, filters, &output_dir)?;
        let (mut sort_key_min, mut sort_key_max, time_range) = output_ranges(doc_mapper, &merged)?;
        if group.key_level > 0 {
            // A level-1 split owns whole prefixes: its range is widened to them (from the
            // first prefix alone to just above the last), so that a fresh split holding one of
            // its prefixes overlaps it, whatever the timestamps.
            if let (Some(first), Some(last)) = (group.prefixes.first(), group.prefixes.last()) {
                sort_key_min = Some(SortKey(first.clone()));
                sort_key_max = Some(SortKey(sort_key::prefix_upper_bound(last)));
            }
        }
        let stats = SplitStats {
            version: SPLIT_STATS_VERSION,
            num_docs,
            time_range,
            // The inputs' tags: a superset of the output's (pruning by tags stays correct).
            tags: tags.clone(),
            uncompressed_docs_size_bytes: share(uncompressed_bytes, num_docs, total_docs),
            sort_key_min,
            sort_key_max,
            time_bucket_start,
            min_doc_opstamp: min_doc_opstamp.unwrap_or(0),
        };
        let bundle_path = scratch_dir.join(format!("out-{i}.split"));
        let built = crate::merge::bundle_merged(&merged, &output_dir, stats, &bundle_path)?;
        outputs.push(LocalityOutput {
            built,
            key_level: group.key_level,
        });
    }
    Ok((outputs, num_deleted))
}

/// `part` of `total` in proportion to `num / denom`.
pub(crate) fn share(total: u64, num: u64, denom: u64) -> u64 {
    if denom == 0 {
        return 0;
    }
    ((u128::from(total) * u128::from(num)) / u128::from(denom)) as u64
}

fn prefix_of(kinds: &[sort_key::SortFieldType], key: &[u8]) -> Result<Vec<u8>, IndexError> {
    let len = sort_key::prefix_len(kinds, key)
        .map_err(|err| IndexError::InvalidArgument(err.to_string()))?;
    Ok(key[..len].to_vec())
}

/// The runs of equal prefix of one segment, in doc-id order; errors if the segment is not
/// sorted by its key (it was not written by a locality index).
fn prefix_runs(
    reader: &SegmentReader,
    segment: usize,
    kinds: &[sort_key::SortFieldType],
) -> Result<Vec<(Vec<u8>, Run)>, IndexError> {
    let column = reader
        .fast_fields()
        .bytes(SORT_KEY_FIELD_NAME)?
        .ok_or_else(|| {
            IndexError::InvalidArgument("a split of a locality index has no sort key".to_string())
        })?;
    // The dictionary, streamed once in ordinal order: the prefix of every ordinal (as an
    // index into `prefixes`). Looking keys up one by one would cost a block decode each.
    let mut prefixes: Vec<Vec<u8>> = Vec::new();
    let mut prefix_of_ord: Vec<u32> = Vec::new();
    let mut stream = column
        .dictionary()
        .stream()
        .map_err(|err| IndexError::io(Path::new(SORT_KEY_FIELD_NAME), err))?;
    while stream.advance() {
        let key = stream.key();
        let len = sort_key::prefix_len(kinds, key)
            .map_err(|err| IndexError::InvalidArgument(err.to_string()))?;
        if prefixes
            .last()
            .is_none_or(|last| last.as_slice() != &key[..len])
        {
            prefixes.push(key[..len].to_vec());
        }
        prefix_of_ord.push((prefixes.len() - 1) as u32);
    }
    let mut runs: Vec<(Vec<u8>, Run)> = Vec::new();
    let mut last_ord: Option<u64> = None;
    let mut current: Option<u32> = None;
    let ords = column.ords();
    for doc in 0..reader.max_doc() {
        let ord = ords.first(doc);
        if ord.is_some() && last_ord.is_some() && ord < last_ord {
            return Err(IndexError::InvalidArgument(
                "a split segment is not sorted by its sort key".to_string(),
            ));
        }
        last_ord = ord;
        // Documents without a key (none in a locality index) sort as the empty prefix.
        let prefix = ord.and_then(|ord| prefix_of_ord.get(ord as usize).copied());
        let live = u64::from(!reader.is_deleted(doc));
        match runs.last_mut() {
            Some((_, run)) if doc > 0 && prefix == current => {
                run.end = doc + 1;
                run.live_docs += live;
            }
            _ => {
                let bytes = prefix.map_or_else(Vec::new, |p| prefixes[p as usize].clone());
                runs.push((
                    bytes,
                    Run {
                        segment,
                        start: doc,
                        end: doc + 1,
                        live_docs: live,
                    },
                ));
            }
        }
        current = prefix;
    }
    // A prefix appearing in two runs of one segment means the segment is not sorted.
    let distinct: BTreeSet<&[u8]> = runs.iter().map(|(prefix, _)| prefix.as_slice()).collect();
    if distinct.len() != runs.len() {
        return Err(IndexError::InvalidArgument(
            "a split segment is not sorted by its sort key".to_string(),
        ));
    }
    Ok(runs)
}

/// Groups the prefixes (in key order) into outputs of at most `target` documents (packed
/// greedily); a prefix inside a fixed range goes to a level-0 group of that range.
fn group_prefixes(
    runs_by_prefix: &BTreeMap<Vec<u8>, Vec<Run>>,
    fixed: &[(Vec<u8>, Vec<u8>)],
    target: u64,
) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    // ((fixed range the group is in, fixed ranges below it), docs so far) of the open group.
    let mut open: Option<((Option<usize>, usize), u64)> = None;
    for (prefix, runs) in runs_by_prefix {
        let docs: u64 = runs.iter().map(|run| run.live_docs).sum();
        if docs == 0 {
            continue;
        }
        // Which fixed range the prefix is in, and how many lie wholly below it: an output
        // never spans a fixed range, even one no input document falls in.
        let inside = fixed
            .iter()
            .position(|(min, max)| min.as_slice() <= prefix.as_slice() && prefix <= max);
        let below = fixed
            .iter()
            .filter(|(_, max)| max.as_slice() < prefix.as_slice())
            .count();
        let class = (inside, below);
        // An output never grows past the target, unless one prefix alone is bigger.
        let start_new = match open {
            None => true,
            Some((open_class, open_docs)) => {
                open_class != class || (open_docs > 0 && open_docs.saturating_add(docs) > target)
            }
        };
        if start_new {
            groups.push(Group {
                prefixes: Vec::new(),
                key_level: if inside.is_some() { 0 } else { 1 },
            });
            open = Some((class, 0));
        }
        if let (Some(group), Some((_, open_docs))) = (groups.last_mut(), open.as_mut()) {
            group.prefixes.push(prefix.clone());
            *open_docs += docs;
        }
    }
    groups
}

/// An output's min and max sort key, and its time range.
type OutputRanges = (Option<SortKey>, Option<SortKey>, Option<TimeRange>);

/// The min and max sort key of a merged (sorted, single-segment) index, and its time range.
pub(crate) fn output_ranges(
    doc_mapper: &DocMapper,
    index: &Index,
) -> Result<OutputRanges, IndexError> {
    let reader = index.reader()?;
    let searcher = reader.searcher();
    let mut min: Option<Vec<u8>> = None;
    let mut max: Option<Vec<u8>> = None;
    let mut time_range: Option<TimeRange> = None;
    for segment in searcher.segment_readers() {
        if segment.num_docs() == 0 {
            continue;
        }
        // Sorted: the first and last live documents hold the extreme keys.
        if let Some(column) = segment.fast_fields().bytes(SORT_KEY_FIELD_NAME)? {
            let mut alive = segment.doc_ids_alive();
            let first = alive.next();
            let last = alive.last().or(first);
            for (doc, is_min) in first
                .into_iter()
                .map(|d| (d, true))
                .chain(last.map(|d| (d, false)))
            {
                let Some(ord) = column.ords().first(doc) else {
                    continue;
                };
                let mut key = Vec::new();
                column
                    .ord_to_bytes(ord, &mut key)
                    .map_err(|err| IndexError::io(Path::new(SORT_KEY_FIELD_NAME), err))?;
                if is_min {
                    if min.as_ref().is_none_or(|min| key < *min) {
                        min = Some(key);
                    }
                } else if max.as_ref().is_none_or(|max| key > *max) {
                    max = Some(key);
                }
            }
        }
        if let Some(name) = doc_mapper.timestamp_field_name() {
            let column = segment.fast_fields().date(name)?;
            if column.values.num_vals() > 0 {
                let range = TimeRange {
                    start: crate::date::floor_secs(column.min_value()),
                    end: crate::date::floor_secs(column.max_value()),
                };
                time_range = Some(time_range.map_or(range, |current| current.union(&range)));
            }
        }
    }
    Ok((min.map(SortKey), max.map(SortKey), time_range))
}
