//! The partial-result cache of a leaf: what one split answered (count, best hits,
//! intermediate aggregations) to one request shape. Splits are immutable, so an entry is
//! never invalidated: everything that can change a split's answer is in its key — the split,
//! the index's doc mapping and search settings, the query, sort, search-after cursor and
//! aggregations, the request's time range clipped to the split's (a range covering the
//! whole split is the same as none, so a dashboard's sliding window reuses its older
//! splits), and the delete tasks applied to the split (time travel picks its tasks, so
//! `as_of` is covered by them). An entry computed for the best `k` hits also answers any
//! smaller `k` (paging forward reuses the deeper entry). Bounded in bytes, least recently
//! used first out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use prometheus::{register_int_counter_vec, IntCounterVec};
use serde::Serialize;
use shale_metastore::IndexMetadata;
use shale_types::{DeleteTask, SplitMetadata};

use crate::leaf::{LeafSplitResult, SortKey};
use crate::request::SearchRequest;

/// Lookups by outcome (`hit`, `miss`).
pub(crate) static LOOKUPS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "shale_search_partial_cache_lookups_total",
        "Lookups in the leaf's partial-result cache (one per split searched), by outcome.",
        &["outcome"]
    )
    .expect("metric registered once")
});

/// What shapes every split's answer to a request (serialized once per leaf request).
#[derive(Serialize)]
struct RequestParts<'a> {
    index_uid: String,
    doc_mapping_uid: String,
    search_settings: serde_json::Value,
    query: &'a str,
    search_field: &'a Option<Vec<String>>,
    sort_by: &'a Option<String>,
    aggs: &'a Option<serde_json::Value>,
    search_after: &'a Option<SortKey>,
}

/// What shapes one split's answer besides the request's parts.
#[derive(Serialize)]
struct SplitParts<'a> {
    split_id: &'a str,
    start: Option<i64>,
    end: Option<i64>,
    delete_opstamps: Vec<u64>,
}

/// The part of the cache keys that `request` on `index` gives every split: computed once per
/// leaf request, then completed by [`key`] for each split.
pub(crate) fn request_key(index: &IndexMetadata, request: &SearchRequest) -> String {
    let parts = RequestParts {
        index_uid: index.index_uid.to_string(),
        doc_mapping_uid: index.index_config.doc_mapping.doc_mapping_uid.to_string(),
        search_settings: serde_json::to_value(&index.index_config.search_settings)
            .unwrap_or_default(),
        query: &request.query,
        search_field: &request.search_field,
        sort_by: &request.sort_by,
        aggs: &request.aggs,
        search_after: &request.search_after,
    };
    serde_json::to_string(&parts).unwrap_or_default()
}

/// The cache key of `split` for `request` (whose [`request_key`] is `request_key`) with
/// `tasks` (the delete tasks applied to it).
pub(crate) fn key(
    request_key: &str,
    request: &SearchRequest,
    split: &SplitMetadata,
    tasks: &[DeleteTask],
) -> String {
    // Bounds that cut nothing of the split are dropped: the answer is the same without them.
    let (start, end) = match &split.time_range {
        Some(range) => (
            request.start_timestamp.filter(|start| *start > range.start),
            request.end_timestamp.filter(|end| *end <= range.end),
        ),
        None => (request.start_timestamp, request.end_timestamp),
    };
    let parts = SplitParts {
        split_id: &split.split_id,
        start,
        end,
        delete_opstamps: tasks.iter().map(|task| task.opstamp).collect(),
    };
    // Two whole JSON objects: the split's ends where the request's begins.
    let mut key = serde_json::to_string(&parts).unwrap_or_default();
    key.push_str(request_key);
    key
}

struct Entry {
    result: LeafSplitResult,
    /// The `k` it was computed for.
    k: usize,
    bytes: u64,
}

/// The cache (see the module's documentation).
pub struct PartialResultCache {
    max_bytes: u64,
    entries: Mutex<lru::LruCache<String, Entry>>,
    bytes: AtomicU64,
}

impl PartialResultCache {
    /// A cache holding at most `max_bytes` (0: nothing is kept).
    pub fn new(max_bytes: u64) -> Self {
        LazyLock::force(&LOOKUPS);
        for outcome in ["hit", "miss"] {
            LOOKUPS.with_label_values(&[outcome]);
        }
        PartialResultCache {
            max_bytes,
            entries: Mutex::new(lru::LruCache::unbounded()),
            bytes: AtomicU64::new(0),
        }
    }

    /// Bytes held (an estimate of the entries' memory).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, lru::LruCache<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer for `key` with the best `k` hits, if an entry computed for at least `k`
    /// hits (or holding every match) is there.
    pub(crate) fn get(&self, key: &str, k: usize) -> Option<LeafSplitResult> {
        if self.max_bytes == 0 {
            return None;
        }
        let found = {
            let mut entries = self.lock();
            entries
                .get(key)
                .filter(|entry| entry.k >= k || entry.result.count <= entry.k as u64)
                .map(|entry| {
                    let mut result = entry.result.clone();
                    result.hits.truncate(k);
                    result
                })
        };
        LOOKUPS
            .with_label_values(&[if found.is_some() { "hit" } else { "miss" }])
            .inc();
        found
    }

    /// Keeps `result`, computed for the best `k` hits, under `key` (unless an entry computed
    /// for more hits is there), then evicts the least recently used entries beyond the bound.
    pub(crate) fn put(&self, key: String, k: usize, result: &LeafSplitResult) {
        if self.max_bytes == 0 {
            return;
        }
        let bytes = result.estimated_bytes() + key.len() as u64 + 64;
        if bytes > self.max_bytes / 4 {
            return; // one entry never takes a quarter of the cache
        }
        let mut entries = self.lock();
        if entries.peek(&key).is_some_and(|entry| entry.k >= k) {
            return;
        }
        if let Some(old) = entries.put(
            key,
            Entry {
                result: result.clone(),
                k,
                bytes,
            },
        ) {
            self.bytes.fetch_sub(old.bytes, Ordering::Relaxed);
        }
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        while self.bytes.load(Ordering::Relaxed) > self.max_bytes {
            match entries.pop_lru() {
                Some((_, old)) => {
                    self.bytes.fetch_sub(old.bytes, Ordering::Relaxed);
                }
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leaf::SortValue;
    use tantivy::DocAddress;

    fn result(count: u64, hits: usize) -> LeafSplitResult {
        LeafSplitResult {
            count,
            hits: (0..hits)
                .map(|i| {
                    (
                        SortKey(vec![SortValue::I64(-(i as i64))]),
                        DocAddress::new(0, i as u32),
                    )
                })
                .collect(),
            aggs: None,
            term_errors: Default::default(),
        }
    }

    #[test]
    fn a_deeper_entry_answers_a_shallower_request_not_the_reverse() {
        let cache = PartialResultCache::new(1 << 20);
        cache.put("a".into(), 20, &result(100, 20));
        let hit = cache.get("a", 10).expect("a shallower request is answered");
        assert_eq!(hit.count, 100);
        assert_eq!(hit.hits.len(), 10);
        assert!(cache.get("a", 40).is_none(), "40 hits need a deeper search");
        // An entry holding every match answers any depth.
        cache.put("b".into(), 20, &result(5, 5));
        assert_eq!(cache.get("b", 1000).unwrap().hits.len(), 5);
        // A shallower result never replaces a deeper one.
        cache.put("a".into(), 5, &result(100, 5));
        assert_eq!(cache.get("a", 20).unwrap().hits.len(), 20);
    }

    #[test]
    fn it_stays_within_its_bytes_least_recently_used_out() {
        let one = result(10, 10).estimated_bytes() + 64 + 1;
        let cache = PartialResultCache::new(one * 4);
        for key in ["a", "b", "c", "d"] {
            cache.put(key.into(), 10, &result(10, 10));
        }
        assert!(cache.get("a", 10).is_some()); // a is now the most recent
        cache.put("e".into(), 10, &result(10, 10));
        assert!(cache.bytes() <= one * 4);
        assert!(cache.get("b", 10).is_none(), "the least recently used went");
        assert!(cache.get("a", 10).is_some());
        assert!(cache.get("e", 10).is_some());
        let off = PartialResultCache::new(0);
        off.put("a".into(), 10, &result(10, 10));
        assert!(off.get("a", 10).is_none() && off.is_empty());
    }
}
