//! Opening splits that live on remote object storage without downloading them: one ranged
//! GET for the split's hot cache and footer, then Tantivy's reads go by ranges through the
//! node's [`RangeCache`]. Tantivy reads synchronously on the search's blocking thread; each
//! read that misses the hot cache hands its GET to the async runtime and waits for it. Before
//! a search, [`warm`] issues the reads the search will need in parallel.

use std::collections::HashSet;
use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use shale_index::{BundleDirectory, RangeRead};
use shale_storage::{RangeCache, StorageRef};
use shale_types::SplitMetadata;
use tantivy::aggregation::agg_req::Aggregations;
use tantivy::directory::OwnedBytes;
use tantivy::query::Query;
use tantivy::schema::IndexRecordOption;
use tantivy::{ReloadPolicy, Searcher, Term};

use crate::request::{SortBy, SortField};

/// How much of a split's end is read when its metadata does not say where the footer starts.
const BLIND_TAIL_BYTES: u64 = 64 * 1024;

/// Byte ranges of one split object, read through the range cache.
#[derive(Debug)]
struct StorageRanges {
    storage: StorageRef,
    name: String,
    /// The object's key in the range cache.
    key: String,
    len: u64,
    cache: Arc<RangeCache>,
    runtime: tokio::runtime::Handle,
}

/// `bytes::Bytes` as the backing of Tantivy's `OwnedBytes`.
struct SharedBytes(bytes::Bytes);

impl std::ops::Deref for SharedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

// SAFETY: `Bytes` points at a heap (or static) buffer that does not move when the `Bytes`
// value moves, and stays alive (reference-counted) as long as the value does.
unsafe impl stable_deref_trait::StableDeref for SharedBytes {}

impl RangeRead for StorageRanges {
    fn read(&self, range: Range<u64>) -> io::Result<OwnedBytes> {
        // Cached: no trip through the runtime.
        if let Some(bytes) = self.cache.cached(&self.key, self.len, range.clone()) {
            return Ok(OwnedBytes::new(SharedBytes(bytes)));
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let storage = self.storage.clone();
        let cache = self.cache.clone();
        let name = self.name.clone();
        let len = self.len;
        self.runtime.spawn(async move {
            let _ = tx.send(cache.read(storage.as_ref(), &name, len, range).await);
        });
        let bytes = rx
            .recv()
            .map_err(|_| io::Error::other("the runtime stopped during a split read"))?
            .map_err(|err| io::Error::other(err.to_string()))?;
        Ok(OwnedBytes::new(SharedBytes(bytes)))
    }
}

/// Opens `split` of `storage` by ranges and returns its searcher. Must run inside the async
/// runtime (it fetches the tail there and opens the index on a blocking thread).
pub(crate) async fn open_remote_split(
    storage: StorageRef,
    split: &SplitMetadata,
    cache: Arc<RangeCache>,
) -> Result<Searcher, (String, bool)> {
    let name = shale_types::split_object_key(&split.split_id);
    let len = split.size_bytes;
    let (footer_start, footer_end) = split.footer_offsets;
    let tail_start = if footer_end == len && footer_start < footer_end {
        footer_start
    } else {
        len.saturating_sub(BLIND_TAIL_BYTES)
    };
    let mut tail = storage
        .get_range(&name, tail_start..len)
        .await
        .map_err(|err| (err.to_string(), err.is_transient()))?;
    cache.record_fetch(tail.len() as u64);
    let mut tail_start = tail_start;
    let needed = BundleDirectory::tail_needed(&tail).map_err(|err| (err.to_string(), false))?;
    if needed > tail.len() as u64 {
        tail_start = len.checked_sub(needed).ok_or_else(|| {
            (
                format!("split `{name}` has a footer longer than itself"),
                false,
            )
        })?;
        tail = storage
            .get_range(&name, tail_start..len)
            .await
            .map_err(|err| (err.to_string(), err.is_transient()))?;
        cache.record_fetch(tail.len() as u64);
    }
    let ranges = Arc::new(StorageRanges {
        key: RangeCache::object_key(storage.as_ref(), &name),
        storage,
        name: name.clone(),
        len,
        cache,
        runtime: tokio::runtime::Handle::current(),
    });
    tokio::task::spawn_blocking(move || -> Result<Searcher, String> {
        let bundle = BundleDirectory::open_remote(
            &name,
            OwnedBytes::new(SharedBytes(tail)),
            tail_start,
            len,
            ranges,
        )
        .map_err(|err| err.to_string())?;
        let index = shale_index::open_bundle(bundle).map_err(|err| err.to_string())?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(|err| err.to_string())?;
        Ok(reader.searcher())
    })
    .await
    .map_err(|err| (err.to_string(), false))?
    .map_err(|err| (err, false))
}

/// Most reads a warm-up runs at once.
const WARM_PARALLELISM: usize = 16;

/// Most warm-up keys remembered per split (then forgotten all at once).
const MAX_WARMED_KEYS: usize = 4096;

/// What has been warmed on one split: terms (with or without positions) and columns.
#[derive(Debug, Default)]
pub(crate) struct Warmed(Mutex<HashSet<Vec<u8>>>);

impl Warmed {
    /// Marks `key` warmed; whether it was not yet.
    fn first_time(&self, key: Vec<u8>) -> bool {
        let mut keys = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if keys.len() >= MAX_WARMED_KEYS {
            keys.clear();
        }
        keys.insert(key)
    }
}

/// Before `query` runs on a split read by ranges: reads, in parallel, what the search would
/// otherwise read one after the other — each queried term's dictionary entry and postings
/// (positions too when the query needs them) in every segment, and the columns of
/// `fast_fields` (sort, time range, aggregations) — so that the search finds them in the range
/// cache: a few round trips per split instead of one per read. What `warmed` says was warmed
/// before is skipped (a repeated query costs nothing more). Errors are left for the search to
/// meet and report. Runs on a blocking thread.
pub(crate) fn warm(
    searcher: &Searcher,
    query: &dyn Query,
    fast_fields: &[String],
    warmed: &Warmed,
) {
    let mut terms: Vec<(Term, bool)> = Vec::new();
    query.query_terms(&mut |term, positions| {
        let mut key = vec![b't', u8::from(positions)];
        key.extend_from_slice(&term.field().field_id().to_le_bytes());
        key.extend_from_slice(term.serialized_value_bytes());
        if warmed.first_time(key) {
            terms.push((term.clone(), positions));
        }
    });
    let fast_fields: Vec<&String> = fast_fields
        .iter()
        .filter(|field| warmed.first_time([b"f".as_slice(), field.as_bytes()].concat()))
        .collect();
    type Job<'a> = Box<dyn FnOnce() + Send + 'a>;
    let mut jobs: Vec<Job<'_>> = Vec::new();
    for segment in searcher.segment_readers() {
        for (term, positions) in &terms {
            jobs.push(Box::new(move || {
                let Ok(inverted) = segment.inverted_index(term.field()) else {
                    return;
                };
                if let Ok(Some(info)) = inverted.get_term_info(term) {
                    let option = if *positions {
                        IndexRecordOption::WithFreqsAndPositions
                    } else {
                        IndexRecordOption::Basic
                    };
                    let _ = inverted.read_postings_from_terminfo(&info, option);
                }
            }));
        }
        for field in &fast_fields {
            jobs.push(Box::new(move || {
                if let Ok(handles) = segment.fast_fields().dynamic_column_handles(field) {
                    for handle in handles {
                        let _ = handle.open();
                    }
                }
            }));
        }
    }
    match jobs.len() {
        0 => {}
        1 => jobs.into_iter().for_each(|job| job()),
        n => {
            let jobs = Mutex::new(jobs);
            let next = || jobs.lock().unwrap_or_else(|p| p.into_inner()).pop();
            std::thread::scope(|scope| {
                for _ in 0..WARM_PARALLELISM.min(n) {
                    scope.spawn(|| {
                        while let Some(job) = next() {
                            job();
                        }
                    });
                }
            });
        }
    }
}

/// The fast fields a search reads columns of: its sort fields, the timestamp field (time
/// ranges) and the fields its aggregations use.
pub(crate) fn fast_fields_read(
    sort_by: &SortBy,
    timestamp_field: Option<&str>,
    aggs: Option<&Aggregations>,
) -> Vec<String> {
    let mut fields: Vec<String> = sort_by
        .fields
        .iter()
        .filter_map(|field| match field {
            SortField::Field { field, .. } => Some(field.clone()),
            _ => None,
        })
        .collect();
    fields.extend(timestamp_field.map(str::to_string));
    if let Some(aggs) = aggs {
        fields.extend(tantivy::aggregation::agg_req::get_fast_field_names(aggs));
    }
    fields.sort();
    fields.dedup();
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use shale_storage::LocalStorage;
    use tantivy::collector::Count;

    const CONFIG: &str = "index_id: remote-test\ndoc_mapping:\n  field_mappings:\n    - name: body\n      type: text\n";

    /// A split of `n` documents uploaded to a local storage (read by ranges all the same),
    /// with its metadata.
    async fn uploaded_split(dir: &std::path::Path, n: usize) -> (StorageRef, SplitMetadata) {
        let config = shale_config::IndexConfig::parse(CONFIG.as_bytes()).unwrap();
        let mapper = Arc::new(shale_index::DocMapper::for_index(&config).unwrap());
        let mut builder =
            shale_index::SplitBuilder::new(mapper.clone(), &dir.join("01SPLIT"), 50_000_000)
                .unwrap();
        for i in 0..n {
            let doc = format!(r#"{{"body": "word{} common"}}"#, i % 10);
            builder
                .add(mapper.parse_doc(doc.as_bytes()).unwrap())
                .unwrap();
        }
        let built = builder.finish().unwrap();
        let storage: StorageRef = Arc::new(LocalStorage::open(&dir.join("store")).unwrap());
        storage
            .put_file(&shale_types::split_object_key("01SPLIT"), &built.path)
            .await
            .unwrap();
        let split = SplitMetadata {
            split_id: "01SPLIT".into(),
            index_uid: shale_types::IndexUid::new("remote-test"),
            source_id: "s".into(),
            node_id: "n".into(),
            partition_id: 0,
            doc_mapping_uid: "d".into(),
            num_docs: n as u64,
            size_bytes: built.size_bytes,
            uncompressed_docs_size_bytes: 0,
            time_range: None,
            tags: Default::default(),
            create_timestamp: 0,
            maturity: shale_types::SplitMaturity::Mature,
            num_merge_ops: 0,
            delete_opstamp: 0,
            footer_offsets: built.footer_offsets,
            time_bucket_start: None,
            sort_key_min: None,
            sort_key_max: None,
            key_level: 0,
            sort_fields: None,
            tag_fields: None,
            format: Default::default(),
            num_series: None,
        };
        (storage, split)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_split_opens_by_ranges_with_or_without_recorded_footer_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let (storage, split) = uploaded_split(dir.path(), 30_000).await;
        let query = || {
            let config = shale_config::IndexConfig::parse(CONFIG.as_bytes()).unwrap();
            shale_index::DocMapper::for_index(&config)
                .unwrap()
                .parse_query("body:word3", None)
                .unwrap()
        };
        for offsets in [split.footer_offsets, (0, 0)] {
            let cache = Arc::new(RangeCache::new(64 << 20));
            let split = SplitMetadata {
                footer_offsets: offsets,
                ..split.clone()
            };
            let searcher = open_remote_split(storage.clone(), &split, cache.clone())
                .await
                .unwrap();
            // Opening took one GET when the offsets are known, at most two without.
            let opening_gets = cache.fetches();
            assert!(opening_gets <= if offsets == (0, 0) { 2 } else { 1 });
            let query = query();
            let count = tokio::task::spawn_blocking(move || {
                let warmed = Warmed::default();
                warm(&searcher, query.as_ref(), &[], &warmed);
                searcher.search(query.as_ref(), &Count).unwrap()
            })
            .await
            .unwrap();
            assert_eq!(count, 3_000);
            // The postings and dictionary came by ranges (the split fits one fetch window).
            assert!(cache.fetches() > opening_gets);
        }
    }
}
