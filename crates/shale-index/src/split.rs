//! Split building: parsed documents → Tantivy index in a scratch directory → split bundle.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use shale_types::sort_key::SortKey;
use shale_types::TimeRange;
use tantivy::indexer::{IndexWriterOptions, NoMergePolicy};
use tantivy::{Index, IndexWriter, TantivyDocument};

use crate::bundle::write_bundle;
use crate::doc_mapper::{DocMapper, ParsedDoc};
use crate::error::IndexError;
use crate::query::{any_value_tag, MAX_VALUES_PER_TAG_FIELD};

/// Smallest indexing heap per thread Tantivy accepts (15 MB); smaller budgets are raised to it.
pub const MIN_HEAP_BYTES_PER_THREAD: usize = 15_000_000;

/// A fresh split with more segments than this is merged into one segment before bundling.
pub const MAX_SEGMENTS_PER_SPLIT: usize = 8;

/// Bytes of documents a [`SplitBuilder`] indexes on one thread before it goes parallel: a
/// small split stays one segment in ingest order; a big batch (a backlog being drained) is
/// indexed on all the builder's threads.
pub const PARALLEL_AFTER_BYTES: u64 = 16 << 20;

/// Version of [`SplitStats`].
pub const SPLIT_STATS_VERSION: u32 = 1;

/// What a split holds, recorded in the bundle footer and in the Tantivy index's commit payload
/// (so that merges can combine the stats of their inputs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitStats {
    /// [`SPLIT_STATS_VERSION`].
    pub version: u32,
    /// Number of documents.
    pub num_docs: u64,
    /// Min and max timestamp, in seconds, when the index has a timestamp field and docs.
    pub time_range: Option<TimeRange>,
    /// `field:value` for every tag value present, or `field!` for tag fields with more than
    /// [`MAX_VALUES_PER_TAG_FIELD`] distinct values.
    pub tags: BTreeSet<String>,
    /// Sum of the documents' JSON sizes.
    pub uncompressed_docs_size_bytes: u64,
    /// Locality indexes: the smallest sort key of the documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort_key_min: Option<SortKey>,
    /// Locality indexes: the largest sort key of the documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort_key_max: Option<SortKey>,
    /// Locality indexes: the time bucket every document belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_bucket_start: Option<i64>,
    /// The smallest ingest opstamp of the documents (see [`BuiltSplit::min_doc_opstamp`]).
    #[serde(default)]
    pub min_doc_opstamp: u64,
}

/// A split bundle written to disk, and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltSplit {
    /// The bundle file.
    pub path: PathBuf,
    /// Number of documents.
    pub num_docs: u64,
    /// Min and max timestamp in seconds (`None` without timestamp field).
    pub time_range: Option<TimeRange>,
    /// Tags, see [`SplitStats::tags`].
    pub tags: BTreeSet<String>,
    /// Sum of the documents' JSON sizes.
    pub uncompressed_docs_size_bytes: u64,
    /// Size of the bundle file.
    pub size_bytes: u64,
    /// Byte range of the hot cache, footer JSON and trailer (to the end of the bundle): one
    /// range read gets everything needed to open the split.
    pub footer_offsets: (u64, u64),
    /// Locality indexes: the smallest sort key of the documents.
    pub sort_key_min: Option<SortKey>,
    /// Locality indexes: the largest sort key of the documents.
    pub sort_key_max: Option<SortKey>,
    /// Locality indexes: the time bucket of the documents.
    pub time_bucket_start: Option<i64>,
    /// The smallest ingest opstamp of the documents (0 without documents): delete tasks up to
    /// it reach none of them, so a fresh split is clean up to it.
    pub min_doc_opstamp: u64,
}

/// Collects tags with the per-field cardinality cap.
#[derive(Default, Debug)]
pub(crate) struct TagCollector {
    tags: BTreeSet<String>,
    counts: HashMap<String, usize>,
    saturated: HashSet<String>,
}

impl TagCollector {
    /// Adds a `field:value` tag, or a `field!` marker (from a merged input).
    pub(crate) fn insert(&mut self, tag: &str) {
        if let Some(field) = tag.strip_suffix('!').filter(|f| !f.contains(':')) {
            if !self.saturated.contains(field) {
                self.saturate(field.to_string());
            }
            return;
        }
        let Some((field, _)) = tag.split_once(':') else {
            return;
        };
        if self.saturated.contains(field) || self.tags.contains(tag) {
            return;
        }
        self.tags.insert(tag.to_string());
        let count = self.counts.entry(field.to_string()).or_default();
        *count += 1;
        if *count > MAX_VALUES_PER_TAG_FIELD {
            self.saturate(field.to_string());
        }
    }

    fn saturate(&mut self, field: String) {
        let prefix = format!("{field}:");
        let values: Vec<String> = self
            .tags
            .range(prefix.clone()..)
            .take_while(|tag| tag.starts_with(&prefix))
            .cloned()
            .collect();
        for value in values {
            self.tags.remove(&value);
        }
        self.tags.insert(any_value_tag(&field));
        self.counts.remove(&field);
        self.saturated.insert(field);
    }

    pub(crate) fn into_tags(self) -> BTreeSet<String> {
        self.tags
    }
}

/// Builds one split: add parsed documents, then [`finish`](SplitBuilder::finish).
///
/// The scratch directory must be dedicated to this split: `finish` removes it once the bundle
/// is written. Timestamps are in seconds in [`BuiltSplit::time_range`] (the seconds of the
/// documents' timestamps as the fast column holds them, floored: see [`shale_types::time`]).
pub struct SplitBuilder {
    doc_mapper: Arc<DocMapper>,
    scratch_dir: PathBuf,
    index: Index,
    /// Always `Some` but while it is being replaced by a multi-threaded writer.
    writer: Option<IndexWriter<TantivyDocument>>,
    heap_bytes: usize,
    /// Threads to index on once [`PARALLEL_AFTER_BYTES`] have been added.
    max_threads: usize,
    parallel: bool,
    parallel_after_bytes: u64,
    num_docs: u64,
    time_range: Option<TimeRange>,
    tags: TagCollector,
    uncompressed_docs_size_bytes: u64,
    sort_key_min: Option<Vec<u8>>,
    sort_key_max: Option<Vec<u8>>,
    time_bucket_start: Option<i64>,
    min_doc_opstamp: Option<u64>,
}

impl std::fmt::Debug for SplitBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SplitBuilder")
            .field("scratch_dir", &self.scratch_dir)
            .field("num_docs", &self.num_docs)
            .finish()
    }
}

pub(crate) fn writer_for(
    index: &Index,
    heap_bytes: usize,
    num_threads: usize,
) -> Result<IndexWriter<TantivyDocument>, IndexError> {
    let num_threads = num_threads.max(1);
    let per_thread = (heap_bytes / num_threads).max(MIN_HEAP_BYTES_PER_THREAD);
    let options = IndexWriterOptions::builder()
        .num_worker_threads(num_threads)
        .memory_budget_per_thread(per_thread)
        .num_merge_threads(1)
        .build();
    let writer = index.writer_with_options(options)?;
    writer.set_merge_policy(Box::new(NoMergePolicy));
    Ok(writer)
}

impl SplitBuilder {
    /// Creates a Tantivy index in `scratch_dir` (created if needed; must not hold an index)
    /// with one indexing thread and `heap_bytes` of indexing memory.
    pub fn new(
        doc_mapper: Arc<DocMapper>,
        scratch_dir: &Path,
        heap_bytes: usize,
    ) -> Result<Self, IndexError> {
        Self::with_threads(doc_mapper, scratch_dir, heap_bytes, 1)
    }

    /// Like [`new`](SplitBuilder::new), going on with `num_threads` indexing threads sharing
    /// `heap_bytes` (at least [`MIN_HEAP_BYTES_PER_THREAD`] each) once
    /// [`PARALLEL_AFTER_BYTES`] of documents have been added on one.
    pub fn with_threads(
        doc_mapper: Arc<DocMapper>,
        scratch_dir: &Path,
        heap_bytes: usize,
        num_threads: usize,
    ) -> Result<Self, IndexError> {
        std::fs::create_dir_all(scratch_dir).map_err(|err| IndexError::io(scratch_dir, err))?;
        let mut index = Index::builder()
            .schema(doc_mapper.schema().clone())
            .settings(doc_mapper.index_settings())
            .create_in_dir(scratch_dir)?;
        index.set_tokenizers(doc_mapper.tokenizer_manager().clone());
        index.set_fast_field_tokenizers(crate::tokenizers::fast_field_tokenizers());
        let writer = writer_for(&index, heap_bytes, 1)?;
        Ok(SplitBuilder {
            doc_mapper,
            scratch_dir: scratch_dir.to_path_buf(),
            index,
            writer: Some(writer),
            heap_bytes,
            max_threads: num_threads.max(1),
            parallel: num_threads <= 1,
            parallel_after_bytes: PARALLEL_AFTER_BYTES,
            num_docs: 0,
            time_range: None,
            tags: TagCollector::default(),
            uncompressed_docs_size_bytes: 0,
            sort_key_min: None,
            sort_key_max: None,
            time_bucket_start: None,
            min_doc_opstamp: None,
        })
    }

    /// Adds a document parsed by this builder's [`DocMapper`]. Documents of a locality index
    /// must all belong to one time bucket (the indexer keeps a builder per bucket).
    pub fn add(&mut self, doc: ParsedDoc) -> Result<(), IndexError> {
        if let Some(key) = &doc.sort_key {
            if self.num_docs > 0 && self.time_bucket_start != doc.time_bucket_start {
                return Err(IndexError::InvalidArgument(format!(
                    "a split holds one time bucket: {:?}, not {:?}",
                    self.time_bucket_start, doc.time_bucket_start
                )));
            }
            self.time_bucket_start = doc.time_bucket_start;
            if self.sort_key_min.as_ref().is_none_or(|min| key < min) {
                self.sort_key_min = Some(key.clone());
            }
            if self.sort_key_max.as_ref().is_none_or(|max| key > max) {
                self.sort_key_max = Some(key.clone());
            }
        }
        let mut tantivy_doc = doc.doc;
        tantivy_doc.add_u64(self.doc_mapper.opstamp_field(), doc.opstamp);
        self.min_doc_opstamp = Some(
            self.min_doc_opstamp
                .map_or(doc.opstamp, |m| m.min(doc.opstamp)),
        );
        self.writer_mut()?.add_document(tantivy_doc)?;
        self.num_docs += 1;
        self.uncompressed_docs_size_bytes += doc.num_bytes as u64;
        if !self.parallel && self.uncompressed_docs_size_bytes >= self.parallel_after_bytes {
            self.go_parallel()?;
        }
        if let Some(micros) = doc.timestamp_micros {
            let secs = shale_types::time::secs_of_micros(micros);
            self.time_range = Some(match self.time_range {
                None => TimeRange {
                    start: secs,
                    end: secs,
                },
                Some(range) => TimeRange {
                    start: range.start.min(secs),
                    end: range.end.max(secs),
                },
            });
        }
        for tag in &doc.tags {
            self.tags.insert(tag);
        }
        Ok(())
    }

    /// Goes parallel after `bytes` of documents instead of [`PARALLEL_AFTER_BYTES`].
    pub fn parallel_after_bytes(mut self, bytes: u64) -> Self {
        self.parallel_after_bytes = bytes;
        self
    }

    fn writer_mut(&mut self) -> Result<&mut IndexWriter<TantivyDocument>, IndexError> {
        self.writer.as_mut().ok_or_else(writer_lost)
    }

    /// Flushes what the single-threaded writer holds as one segment and goes on with a writer
    /// on `max_threads` threads sharing the heap.
    fn go_parallel(&mut self) -> Result<(), IndexError> {
        self.parallel = true;
        if let Some(mut writer) = self.writer.take() {
            writer.commit()?;
            writer.wait_merging_threads()?;
        }
        self.writer = Some(writer_for(&self.index, self.heap_bytes, self.max_threads)?);
        Ok(())
    }

    /// Documents added so far.
    pub fn num_docs(&self) -> u64 {
        self.num_docs
    }

    /// Sum of the JSON sizes of the documents added so far.
    pub fn uncompressed_docs_size_bytes(&self) -> u64 {
        self.uncompressed_docs_size_bytes
    }

    /// The doc mapper.
    pub fn doc_mapper(&self) -> &Arc<DocMapper> {
        &self.doc_mapper
    }

    /// Commits (merging the segments into one only past [`MAX_SEGMENTS_PER_SPLIT`]) and
    /// writes the bundle next to the scratch directory, as `{scratch_dir}.split`
    /// (`/tmp/x/01ABC` → `/tmp/x/01ABC.split`); the scratch directory is then removed.
    pub fn finish(self) -> Result<BuiltSplit, IndexError> {
        let bundle_path = default_bundle_path(&self.scratch_dir)?;
        self.finish_to(&bundle_path)
    }

    /// Like [`finish`](SplitBuilder::finish), writing the bundle to `bundle_path`.
    pub fn finish_to(self, bundle_path: &Path) -> Result<BuiltSplit, IndexError> {
        let SplitBuilder {
            scratch_dir,
            index,
            writer,
            num_docs,
            time_range,
            tags,
            uncompressed_docs_size_bytes,
            sort_key_min,
            sort_key_max,
            time_bucket_start,
            min_doc_opstamp,
            ..
        } = self;
        let stats = SplitStats {
            version: SPLIT_STATS_VERSION,
            num_docs,
            time_range,
            tags: tags.into_tags(),
            uncompressed_docs_size_bytes,
            sort_key_min: sort_key_min.map(SortKey),
            sort_key_max: sort_key_max.map(SortKey),
            time_bucket_start,
            min_doc_opstamp: min_doc_opstamp.unwrap_or(0),
        };
        let mut writer = writer.ok_or_else(writer_lost)?;
        writer.commit()?;
        // A fresh split keeps the segments its writer flushed (merging them would cost about
        // as much as indexing, and compaction merges splits later anyway), unless there are
        // so many that searching it would suffer.
        let segment_ids = index.searchable_segment_ids()?;
        if segment_ids.len() > MAX_SEGMENTS_PER_SPLIT {
            writer.merge(&segment_ids).wait()?;
        }
        commit_stats(&mut writer, &stats)?;
        writer.wait_merging_threads()?;
        bundle_index(&index, &scratch_dir, stats, bundle_path)
    }
}

/// The error of a builder whose switch to a multi-threaded writer failed.
fn writer_lost() -> IndexError {
    IndexError::InvalidArgument("the split builder lost its writer after an error".to_string())
}

/// `{dir}.split` next to `dir`.
pub(crate) fn default_bundle_path(scratch_dir: &Path) -> Result<PathBuf, IndexError> {
    let name = scratch_dir.file_name().ok_or_else(|| {
        IndexError::InvalidArgument(format!(
            "scratch directory `{}` has no name",
            scratch_dir.display()
        ))
    })?;
    let mut bundle_name = name.to_os_string();
    bundle_name.push(".split");
    Ok(scratch_dir.with_file_name(bundle_name))
}

/// Records `stats` as the payload of a (possibly empty) commit.
pub(crate) fn commit_stats(
    writer: &mut IndexWriter<TantivyDocument>,
    stats: &SplitStats,
) -> Result<(), IndexError> {
    let payload = serde_json::to_string(stats)
        .map_err(|err| IndexError::InvalidArgument(format!("cannot serialize stats: {err}")))?;
    let mut prepared = writer.prepare_commit()?;
    prepared.set_payload(&payload);
    prepared.commit()?;
    Ok(())
}

/// The stats recorded in an index's last commit payload, if any.
pub fn split_stats(index: &Index) -> Result<Option<SplitStats>, IndexError> {
    let metas = index.load_metas()?;
    Ok(metas
        .payload
        .as_deref()
        .and_then(|payload| serde_json::from_str(payload).ok()))
}

/// Writes the bundle of the committed index in `index_dir`, then removes `index_dir`.
pub(crate) fn bundle_index(
    index: &Index,
    index_dir: &Path,
    stats: SplitStats,
    bundle_path: &Path,
) -> Result<BuiltSplit, IndexError> {
    let metas = index.load_metas()?;
    let mut files: Vec<String> = metas
        .list_segment_files()
        .into_iter()
        .filter(|path| index_dir.join(path).is_file())
        .filter_map(|path| path.to_str().map(str::to_string))
        .collect();
    files.sort();
    files.push("meta.json".to_string());
    let written = write_bundle(index_dir, &files, &stats, bundle_path)?;
    std::fs::remove_dir_all(index_dir).map_err(|err| IndexError::io(index_dir, err))?;
    tracing::debug!(
        bundle = %bundle_path.display(),
        num_docs = stats.num_docs,
        size_bytes = written.size_bytes,
        num_files = files.len(),
        "split bundle written"
    );
    Ok(BuiltSplit {
        path: bundle_path.to_path_buf(),
        num_docs: stats.num_docs,
        time_range: stats.time_range,
        tags: stats.tags,
        uncompressed_docs_size_bytes: stats.uncompressed_docs_size_bytes,
        size_bytes: written.size_bytes,
        footer_offsets: written.footer_offsets,
        sort_key_min: stats.sort_key_min,
        sort_key_max: stats.sort_key_max,
        time_bucket_start: stats.time_bucket_start,
        min_doc_opstamp: stats.min_doc_opstamp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_cardinality_is_capped() {
        let mut tags = TagCollector::default();
        for i in 0..MAX_VALUES_PER_TAG_FIELD {
            tags.insert(&format!("host:h{i}"));
            tags.insert(&format!("host:h{i}"));
        }
        tags.insert("tenant:a");
        let snapshot = tags.tags.clone();
        assert_eq!(snapshot.len(), MAX_VALUES_PER_TAG_FIELD + 1);
        tags.insert("host:one-too-many");
        tags.insert("host:h1");
        tags.insert("tenant:b");
        let tags = tags.into_tags();
        assert_eq!(
            tags,
            ["host!", "tenant:a", "tenant:b"]
                .into_iter()
                .map(String::from)
                .collect()
        );
    }

    #[test]
    fn any_value_marker_from_inputs_saturates() {
        let mut tags = TagCollector::default();
        tags.insert("host:a");
        tags.insert("host!");
        tags.insert("host:b");
        assert_eq!(tags.into_tags(), BTreeSet::from(["host!".to_string()]));
    }

    #[test]
    fn bundle_path_is_next_to_the_scratch_dir() {
        assert_eq!(
            default_bundle_path(Path::new("/tmp/x/01ABC")).unwrap(),
            PathBuf::from("/tmp/x/01ABC.split")
        );
        assert_eq!(
            default_bundle_path(Path::new("/tmp/x/v1.2")).unwrap(),
            PathBuf::from("/tmp/x/v1.2.split")
        );
        assert!(default_bundle_path(Path::new("/")).is_err());
    }
}
