//! Merging splits into one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use shale_types::sort_key::SortKey;
use shale_types::TimeRange;
use tantivy::directory::{MmapDirectory, OwnedBytes};
use tantivy::fastfield::{write_alive_bitset, AliveBitSet};
use tantivy::{BitSet, Index};

use shale_types::DeleteTask;

use crate::bundle::open_split;
use crate::deletes::segment_deletes;
use crate::doc_mapper::DocMapper;
use crate::error::IndexError;
use crate::split::{
    bundle_index, commit_stats, default_bundle_path, split_stats, writer_for, SplitStats,
    TagCollector, MIN_HEAP_BYTES_PER_THREAD, SPLIT_STATS_VERSION,
};

/// Merges the indexes of several splits (same doc mapping) into one split bundle, written as
/// `{output_scratch_dir}.split` (the scratch directory is removed afterwards).
///
/// The output's stats combine the inputs' (recorded in their commit payloads): time ranges are
/// united, uncompressed sizes summed, tags united (with the per-field cap). An input without
/// recorded stats (not built by Shale) contributes its time range read from the timestamp fast
/// column, an `any value` marker for every tag field, and 0 bytes.
pub fn merge_splits(
    doc_mapper: &DocMapper,
    inputs: &[Index],
    output_scratch_dir: &Path,
) -> Result<crate::BuiltSplit, IndexError> {
    let bundle_path = default_bundle_path(output_scratch_dir)?;
    merge_splits_to(doc_mapper, inputs, output_scratch_dir, &bundle_path)
}

/// [`merge_splits`] over bundle files.
pub fn merge_split_files(
    doc_mapper: &DocMapper,
    bundle_paths: &[PathBuf],
    output_scratch_dir: &Path,
) -> Result<crate::BuiltSplit, IndexError> {
    let inputs = bundle_paths
        .iter()
        .map(|path| open_split(path))
        .collect::<Result<Vec<_>, _>>()?;
    merge_splits(doc_mapper, &inputs, output_scratch_dir)
}

/// Like [`merge_splits`], writing the bundle to `bundle_path`.
pub fn merge_splits_to(
    doc_mapper: &DocMapper,
    inputs: &[Index],
    output_scratch_dir: &Path,
    bundle_path: &Path,
) -> Result<crate::BuiltSplit, IndexError> {
    let no_deletes = vec![Vec::new(); inputs.len()];
    merge_splits_with_deletes(
        doc_mapper,
        inputs,
        &no_deletes,
        output_scratch_dir,
        bundle_path,
    )?
    .ok_or_else(|| IndexError::InvalidArgument("the inputs hold no document".to_string()))
}

/// [`merge_splits_with_deletes`] over bundle files, writing `{output_scratch_dir}.split`.
pub fn merge_split_files_with_deletes(
    doc_mapper: &DocMapper,
    bundle_paths: &[PathBuf],
    deletes: &[Vec<DeleteTask>],
    output_scratch_dir: &Path,
) -> Result<Option<crate::BuiltSplit>, IndexError> {
    let inputs = bundle_paths
        .iter()
        .map(|path| open_split(path))
        .collect::<Result<Vec<_>, _>>()?;
    let bundle_path = default_bundle_path(output_scratch_dir)?;
    merge_splits_with_deletes(
        doc_mapper,
        &inputs,
        deletes,
        output_scratch_dir,
        &bundle_path,
    )
}

/// Merges `inputs` without the documents that `deletes[i]` (the delete tasks input `i` is not
/// clean of) delete; `None` when no document is left (nothing is written then). Inputs with
/// deleted documents contribute their share of uncompressed bytes, and the output's time range
/// is read back from what is left.
pub fn merge_splits_with_deletes(
    doc_mapper: &DocMapper,
    inputs: &[Index],
    deletes: &[Vec<DeleteTask>],
    output_scratch_dir: &Path,
    bundle_path: &Path,
) -> Result<Option<crate::BuiltSplit>, IndexError> {
    if inputs.is_empty() {
        return Err(IndexError::InvalidArgument(
            "merge_splits needs at least one input split".to_string(),
        ));
    }
    if deletes.len() != inputs.len() {
        return Err(IndexError::InvalidArgument(format!(
            "{} delete lists for {} inputs",
            deletes.len(),
            inputs.len()
        )));
    }
    for (i, input) in inputs.iter().enumerate() {
        if &input.schema() != doc_mapper.schema() {
            return Err(IndexError::InvalidArgument(format!(
                "input split #{i} has a different schema than the doc mapping"
            )));
        }
    }
    let mut time_range: Option<TimeRange> = None;
    let mut tags = TagCollector::default();
    let mut uncompressed_docs_size_bytes = 0u64;
    let mut sort_key_min: Option<SortKey> = None;
    let mut sort_key_max: Option<SortKey> = None;
    let mut buckets = BTreeSet::new();
    let mut min_doc_opstamp: Option<u64> = None;
    let mut segments = Vec::new();
    let mut filters = Vec::new();
    let mut num_deleted = 0u64;
    let mut num_alive = 0u64;
    for (input, tasks) in inputs.iter().zip(deletes) {
        let stats = match split_stats(input)? {
            Some(stats) => stats,
            None => stats_from_index(doc_mapper, input)?,
        };
        let input_deletes = segment_deletes(doc_mapper, input, tasks)?;
        let input_docs: u64 = input_deletes.iter().map(|s| u64::from(s.max_doc)).sum();
        let input_deleted: u64 = input_deletes.iter().map(|s| u64::from(s.num_deleted)).sum();
        num_deleted += input_deleted;
        num_alive += input_docs - input_deleted;
        for segment in input_deletes {
            segments.push(segment.segment);
            filters.push(segment.alive);
        }
        sort_key_min = sort_key_min.into_iter().chain(stats.sort_key_min).min();
        sort_key_max = sort_key_max.into_iter().chain(stats.sort_key_max).max();
        buckets.insert(stats.time_bucket_start);
        if let Some(range) = stats.time_range {
            time_range = Some(time_range.map_or(range, |current| current.union(&range)));
        }
        for tag in &stats.tags {
            tags.insert(tag);
        }
        min_doc_opstamp = min_doc_opstamp
            .into_iter()
            .chain([stats.min_doc_opstamp])
            .min();
        uncompressed_docs_size_bytes += crate::locality_merge::share(
            stats.uncompressed_docs_size_bytes,
            input_docs - input_deleted,
            input_docs,
        );
    }
    if num_alive == 0 {
        return Ok(None);
    }

    let merged = merge_filtered(doc_mapper, &segments, filters, output_scratch_dir)?;
    let num_docs: u64 = merged
        .searchable_segment_metas()?
        .iter()
        .map(|meta| u64::from(meta.num_docs()))
        .sum();
    if num_deleted > 0 {
        // What is left may cover less time than the inputs did.
        time_range = stats_from_index(doc_mapper, &merged)?.time_range;
    }
    let stats = SplitStats {
        version: SPLIT_STATS_VERSION,
        num_docs,
        time_range,
        tags: tags.into_tags(),
        uncompressed_docs_size_bytes,
        sort_key_min,
        sort_key_max,
        // Inputs of one bucket keep it; a merge across buckets (not a locality merge) has none.
        time_bucket_start: match buckets.len() {
            1 => buckets.into_iter().next().flatten(),
            _ => None,
        },
        min_doc_opstamp: min_doc_opstamp.unwrap_or(0),
    };
    bundle_merged(&merged, output_scratch_dir, stats, bundle_path).map(Some)
}

/// Merges `segments`, keeping the documents `filters` select in each (`None`: every one),
/// into a new index in `output_dir`, sorted as the doc mapping says.
pub(crate) fn merge_filtered(
    doc_mapper: &DocMapper,
    segments: &[tantivy::Segment],
    filters: Vec<Option<AliveBitSet>>,
    output_dir: &Path,
) -> Result<Index, IndexError> {
    std::fs::create_dir_all(output_dir).map_err(|err| IndexError::io(output_dir, err))?;
    let directory = MmapDirectory::open(output_dir)
        .map_err(|err| IndexError::io(output_dir, std::io::Error::other(err.to_string())))?;
    Ok(tantivy::indexer::merge_filtered_segments(
        segments,
        doc_mapper.index_settings(),
        filters,
        directory,
    )?)
}

/// Records `stats` in a merged index and writes its bundle to `bundle_path`.
pub(crate) fn bundle_merged(
    merged: &Index,
    output_dir: &Path,
    stats: SplitStats,
    bundle_path: &Path,
) -> Result<crate::BuiltSplit, IndexError> {
    let mut writer = writer_for(merged, MIN_HEAP_BYTES_PER_THREAD, 1)?;
    commit_stats(&mut writer, &stats)?;
    writer.wait_merging_threads()?;
    bundle_index(merged, output_dir, stats, bundle_path)
}

/// Stats of an index without recorded stats: time range from the timestamp fast column,
/// "any value" for every tag field.
fn stats_from_index(doc_mapper: &DocMapper, index: &Index) -> Result<SplitStats, IndexError> {
    let reader = index.reader()?;
    let searcher = reader.searcher();
    let mut time_range: Option<TimeRange> = None;
    if let Some(name) = doc_mapper.timestamp_field_name() {
        for segment in searcher.segment_readers() {
            if segment.num_docs() == 0 {
                continue;
            }
            let column = segment.fast_fields().date(name)?;
            let range = TimeRange {
                start: crate::date::floor_secs(column.min_value()),
                end: crate::date::floor_secs(column.max_value()),
            };
            time_range = Some(time_range.map_or(range, |current| current.union(&range)));
        }
    }
    Ok(SplitStats {
        version: SPLIT_STATS_VERSION,
        num_docs: searcher.num_docs(),
        time_range,
        tags: doc_mapper
            .tag_fields()
            .iter()
            .map(|field| crate::query::any_value_tag(field))
            .collect(),
        uncompressed_docs_size_bytes: 0,
        sort_key_min: None,
        sort_key_max: None,
        time_bucket_start: None,
        min_doc_opstamp: 0,
    })
}

/// Merges bundle files like [`merge_split_files_with_deletes`], into as many outputs as it
/// takes for none to exceed `max_output_bytes`: when what is left of the inputs (their bytes,
/// in proportion to the documents left) is larger, the documents are cut, in input order,
/// into `n` runs of about equal bytes, each merged into its own split, with 10 % headroom for
/// the estimate. Outputs are written in `scratch_dir` as `out-{i}.split`; none is written for
/// a run without documents. Also returns how many documents the delete tasks left out.
pub fn merge_split_files_capped(
    doc_mapper: &DocMapper,
    bundle_paths: &[PathBuf],
    deletes: &[Vec<DeleteTask>],
    scratch_dir: &Path,
    max_output_bytes: u64,
) -> Result<(Vec<crate::BuiltSplit>, u64), IndexError> {
    if deletes.len() != bundle_paths.len() {
        return Err(IndexError::InvalidArgument(format!(
            "{} delete lists for {} inputs",
            deletes.len(),
            bundle_paths.len()
        )));
    }
    let inputs = bundle_paths
        .iter()
        .map(|path| open_split(path))
        .collect::<Result<Vec<_>, _>>()?;
    // Every segment, what is left alive in it, and its bytes per document.
    let mut segments = Vec::new();
    let mut estimated_bytes = 0f64;
    for ((input, path), tasks) in inputs.iter().zip(bundle_paths).zip(deletes) {
        let size = std::fs::metadata(path)
            .map_err(|err| IndexError::io(path, err))?
            .len();
        let input_segments = segment_deletes(doc_mapper, input, tasks)?;
        let docs: u64 = input_segments.iter().map(|s| u64::from(s.max_doc)).sum();
        let bytes_per_doc = if docs == 0 {
            0.0
        } else {
            size as f64 / docs as f64
        };
        for segment in input_segments {
            estimated_bytes += bytes_per_doc * f64::from(segment.max_doc - segment.num_deleted);
            segments.push((segment, bytes_per_doc));
        }
    }
    // Documents the delete tasks leave out, for the caller to check the outputs against.
    let num_deleted: u64 = segments
        .iter()
        .map(|(segment, _)| u64::from(segment.num_deleted))
        .sum();
    let budget = max_output_bytes.max(1) as f64 * 0.9;
    let num_outputs = (estimated_bytes / budget).ceil().max(1.0) as usize;
    if num_outputs == 1 {
        let output_dir = scratch_dir.join("out-0");
        let bundle_path = scratch_dir.join("out-0.split");
        let output =
            merge_splits_with_deletes(doc_mapper, &inputs, deletes, &output_dir, &bundle_path)?;
        return Ok((output.into_iter().collect(), num_deleted));
    }
    // Input-wide stats every output shares (tags: a superset is correct for pruning).
    let mut tags = TagCollector::default();
    let mut buckets = BTreeSet::new();
    let mut min_doc_opstamp: Option<u64> = None;
    let mut uncompressed_bytes = 0u64;
    let mut total_docs = 0u64;
    for input in &inputs {
        let stats = match split_stats(input)? {
            Some(stats) => stats,
            None => stats_from_index(doc_mapper, input)?,
        };
        for tag in &stats.tags {
            tags.insert(tag);
        }
        buckets.insert(stats.time_bucket_start);
        min_doc_opstamp = min_doc_opstamp
            .into_iter()
            .chain([stats.min_doc_opstamp])
            .min();
        uncompressed_bytes += stats.uncompressed_docs_size_bytes;
        total_docs += stats.num_docs;
    }
    let tags = tags.into_tags();
    let time_bucket_start = match buckets.len() {
        1 => buckets.into_iter().next().flatten(),
        _ => None,
    };
    // Cut the live documents, in order, into runs of about `estimated_bytes / n`.
    let per_output = estimated_bytes / num_outputs as f64;
    let mut runs: Vec<Vec<(usize, BitSet)>> = vec![Vec::new(); num_outputs];
    let mut run = 0usize;
    let mut run_bytes = 0f64;
    for (ord, (segment, bytes_per_doc)) in segments.iter().enumerate() {
        let reader = segment.reader()?;
        for doc in 0..segment.max_doc {
            if reader.is_deleted(doc) {
                continue;
            }
            if run_bytes >= per_output && run + 1 < num_outputs {
                run += 1;
                run_bytes = 0.0;
            }
            let bits = match runs[run].last_mut() {
                Some((last, bits)) if *last == ord => bits,
                _ => {
                    runs[run].push((ord, BitSet::with_max_value(segment.max_doc)));
                    &mut runs[run].last_mut().expect("just pushed").1
                }
            };
            bits.insert(doc);
            run_bytes += bytes_per_doc;
        }
    }
    let mut outputs = Vec::new();
    for (i, run) in runs.into_iter().enumerate() {
        if run.is_empty() {
            continue;
        }
        let mut run_segments = Vec::with_capacity(run.len());
        let mut filters = Vec::with_capacity(run.len());
        let mut num_docs = 0u64;
        for (ord, bits) in run {
            let (segment, _) = &segments[ord];
            num_docs += bits.len() as u64;
            run_segments.push(segment.segment.clone());
            let mut bytes = Vec::new();
            write_alive_bitset(&bits, &mut bytes).map_err(tantivy::TantivyError::from)?;
            filters.push(Some(AliveBitSet::open(OwnedBytes::new(bytes))));
        }
        let output_dir = scratch_dir.join(format!("out-{i}"));
        let merged = merge_filtered(doc_mapper, &run_segments, filters, &output_dir)?;
        let (sort_key_min, sort_key_max, time_range) = if doc_mapper.sort_fields().is_some() {
            crate::locality_merge::output_ranges(doc_mapper, &merged)?
        } else {
            (
                None,
                None,
                stats_from_index(doc_mapper, &merged)?.time_range,
            )
        };
        let stats = SplitStats {
            version: SPLIT_STATS_VERSION,
            num_docs,
            time_range,
            tags: tags.clone(),
            uncompressed_docs_size_bytes: crate::locality_merge::share(
                uncompressed_bytes,
                num_docs,
                total_docs,
            ),
            sort_key_min,
            sort_key_max,
            time_bucket_start,
            min_doc_opstamp: min_doc_opstamp.unwrap_or(0),
        };
        let bundle_path = scratch_dir.join(format!("out-{i}.split"));
        outputs.push(bundle_merged(&merged, &output_dir, stats, &bundle_path)?);
    }
    Ok((outputs, num_deleted))
}
