//! The byte-range cache: the parts of remote split objects that searches read, kept in memory
//! within a byte budget, least-recently-used first out.
//!
//! Objects are cached by aligned chunks of [`RANGE_CHUNK_BYTES`]. A read whose chunks are all
//! cached is served at once ([`RangeCache::cached`], no I/O). Otherwise the missing chunks of
//! the aligned [`RANGE_FETCH_BYTES`] windows covering the read are fetched — one ranged GET per
//! run of consecutive missing chunks, runs in parallel — so that a read costs at most one
//! round trip, and the reads Tantivy makes next to it (a term dictionary's footer, then its
//! FST, then its term infos) usually none. Cached objects are immutable (split objects are
//! never rewritten), so entries never go stale.
//!
//! The budget counts the bytes actually kept alive: each chunk is its own allocation (copied
//! out of the GET's response), so evicting a chunk frees it even if its neighbours stay.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::{Storage, StorageError, StorageResult};

/// Size of the aligned chunks objects are cached by.
pub const RANGE_CHUNK_BYTES: u64 = 64 * 1024;
/// Size of the aligned windows a missed read fetches (what of them is not cached yet).
pub const RANGE_FETCH_BYTES: u64 = 512 * 1024;

#[derive(Default)]
struct Inner {
    /// Object key → chunk index → (last use, bytes).
    objects: HashMap<Arc<str>, HashMap<u64, (u64, Bytes)>>,
    /// Last use → chunk, oldest first.
    order: BTreeMap<u64, (Arc<str>, u64)>,
    used_bytes: u64,
    clock: u64,
}

/// A bounded in-memory cache of chunks of remote objects.
pub struct RangeCache {
    max_bytes: u64,
    inner: Mutex<Inner>,
    fetched_bytes: AtomicU64,
    fetches: AtomicU64,
    hit_bytes: AtomicU64,
}

impl std::fmt::Debug for RangeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangeCache")
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

fn short(name: &str, object_len: u64) -> StorageError {
    StorageError::ObjectStore(format!(
        "object `{name}` is shorter than its recorded {object_len} bytes"
    ))
}

impl RangeCache {
    /// A cache holding at most `max_bytes` of chunks.
    pub fn new(max_bytes: u64) -> RangeCache {
        RangeCache {
            max_bytes,
            inner: Mutex::new(Inner::default()),
            fetched_bytes: AtomicU64::new(0),
            fetches: AtomicU64::new(0),
            hit_bytes: AtomicU64::new(0),
        }
    }

    /// The key object `name` of `storage` is cached under.
    pub fn object_key(storage: &dyn Storage, name: &str) -> String {
        format!("{}/{name}", storage.uri())
    }

    /// The byte budget.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Bytes fetched from object storage so far (by reads that missed).
    pub fn fetched_bytes(&self) -> u64 {
        self.fetched_bytes.load(Ordering::Relaxed)
    }

    /// Ranged GETs issued so far.
    pub fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }

    /// Bytes of reads served from the cache so far.
    pub fn hit_bytes(&self) -> u64 {
        self.hit_bytes.load(Ordering::Relaxed)
    }

    /// Bytes held now.
    pub fn used_bytes(&self) -> u64 {
        self.lock().used_bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every update is complete before the lock is released: a poisoned lock still guards
        // consistent data.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a ranged GET of `bytes` made outside the chunk cache (e.g. a split's footer).
    pub fn record_fetch(&self, bytes: u64) {
        self.fetches.fetch_add(1, Ordering::Relaxed);
        self.fetched_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes `range` of the object cached under `key` if every chunk of it is cached (no
    /// I/O); `None` otherwise or when the range is not inside `0..object_len`.
    pub fn cached(&self, key: &str, object_len: u64, range: Range<u64>) -> Option<Bytes> {
        if range.start > range.end || range.end > object_len {
            return None;
        }
        if range.is_empty() {
            return Some(Bytes::new());
        }
        let first = range.start / RANGE_CHUNK_BYTES;
        let last = (range.end - 1) / RANGE_CHUNK_BYTES;
        let chunks: Vec<Bytes> = {
            let mut inner = self.lock();
            let mut chunks = Vec::with_capacity((last - first + 1) as usize);
            for index in first..=last {
                chunks.push(inner.touch(key, index)?);
            }
            chunks
        };
        let bytes = assemble(&chunks, first, &range)?;
        self.hit_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Some(bytes)
    }

    /// Reads bytes `range` of object `name` of `storage`, `object_len` bytes long, through the
    /// cache.
    pub async fn read(
        &self,
        storage: &dyn Storage,
        name: &str,
        object_len: u64,
        range: Range<u64>,
    ) -> StorageResult<Bytes> {
        if range.start > range.end || range.end > object_len {
            return Err(StorageError::ObjectStore(format!(
                "range {range:?} is outside object `{name}` ({object_len} bytes)"
            )));
        }
        let key = Self::object_key(storage, name);
        if let Some(bytes) = self.cached(&key, object_len, range.clone()) {
            return Ok(bytes);
        }
        let key: Arc<str> = Arc::from(key);
        let first = range.start / RANGE_CHUNK_BYTES;
        let last = (range.end - 1) / RANGE_CHUNK_BYTES;
        // The aligned fetch windows around the read, within the object.
        let per_window = RANGE_FETCH_BYTES / RANGE_CHUNK_BYTES;
        let window_first = first / per_window * per_window;
        let object_last = (object_len - 1) / RANGE_CHUNK_BYTES;
        let window_last = ((last / per_window + 1) * per_window - 1).min(object_last);
        let mut chunks: Vec<Option<Bytes>> = {
            let inner = self.lock();
            let cached = inner.objects.get(&key);
            (window_first..=window_last)
                .map(|index| cached.and_then(|c| c.get(&index)).map(|(_, b)| b.clone()))
                .collect()
        };
        // Runs of consecutive missing chunks, each fetched with one GET.
        let mut runs: Vec<Range<u64>> = Vec::new();
        for (offset, chunk) in chunks.iter().enumerate() {
            if chunk.is_some() {
                continue;
            }
            let index = window_first + offset as u64;
            match runs.last_mut() {
                Some(run) if run.end == index => run.end = index + 1,
                _ => runs.push(index..index + 1),
            }
        }
        let fetched = futures::future::try_join_all(runs.iter().map(|run| {
            let bytes =
                run.start * RANGE_CHUNK_BYTES..(run.end * RANGE_CHUNK_BYTES).min(object_len);
            storage.get_range(name, bytes)
        }))
        .await?;
        for (run, bytes) in runs.iter().zip(fetched) {
            self.record_fetch(bytes.len() as u64);
            let mut inner = self.lock();
            for index in run.clone() {
                let start = ((index - run.start) * RANGE_CHUNK_BYTES) as usize;
                let end = (start + RANGE_CHUNK_BYTES as usize).min(bytes.len());
                if start >= end {
                    return Err(short(name, object_len));
                }
                // A copy: a slice would keep the whole fetched run alive for as long as any
                // of its chunks stays cached, so the budget would not bound the memory held.
                let chunk = Bytes::copy_from_slice(&bytes[start..end]);
                inner.insert(key.clone(), index, chunk.clone(), self.max_bytes);
                chunks[(index - window_first) as usize] = Some(chunk);
            }
        }
        let wanted: Vec<Bytes> = chunks
            [(first - window_first) as usize..=(last - window_first) as usize]
            .iter()
            .map(|chunk| chunk.clone().unwrap_or_default())
            .collect();
        assemble(&wanted, first, &range).ok_or_else(|| short(name, object_len))
    }
}

/// Bytes `range` out of consecutive `chunks`, the first being chunk `first`: zero-copy when
/// they lie in one chunk. `None` if the chunks are too short.
fn assemble(chunks: &[Bytes], first: u64, range: &Range<u64>) -> Option<Bytes> {
    let start_in_first = (range.start - first * RANGE_CHUNK_BYTES) as usize;
    let len = (range.end - range.start) as usize;
    if let [chunk] = chunks {
        return (start_in_first + len <= chunk.len())
            .then(|| chunk.slice(start_in_first..start_in_first + len));
    }
    let mut out = Vec::with_capacity(len);
    for (offset, chunk) in chunks.iter().enumerate() {
        let from = if offset == 0 { start_in_first } else { 0 };
        let want = (len - out.len()).min(chunk.len().saturating_sub(from));
        out.extend_from_slice(chunk.get(from..from + want)?);
    }
    (out.len() == len).then(|| Bytes::from(out))
}

impl Inner {
    /// Chunk `index` of object `key` if cached, marked as just used.
    fn touch(&mut self, key: &str, index: u64) -> Option<Bytes> {
        self.clock += 1;
        let clock = self.clock;
        let object = self.objects.get_key_value(key)?.0.clone();
        let (last_used, bytes) = self.objects.get_mut(key)?.get_mut(&index)?;
        let bytes = bytes.clone();
        let previous = std::mem::replace(last_used, clock);
        self.order.remove(&previous);
        self.order.insert(clock, (object, index));
        Some(bytes)
    }

    fn remove(&mut self, key: &str, index: u64) {
        if let Some(chunks) = self.objects.get_mut(key) {
            if let Some((last_used, old)) = chunks.remove(&index) {
                self.order.remove(&last_used);
                self.used_bytes -= old.len() as u64;
            }
            if chunks.is_empty() {
                self.objects.remove(key);
            }
        }
    }

    fn insert(&mut self, key: Arc<str>, index: u64, bytes: Bytes, max_bytes: u64) {
        let size = bytes.len() as u64;
        if size > max_bytes {
            return;
        }
        self.remove(&key, index);
        while self.used_bytes + size > max_bytes {
            let Some((_, (object, victim))) = self.order.pop_first() else {
                break;
            };
            self.remove(&object, victim);
        }
        self.clock += 1;
        self.order.insert(self.clock, (key.clone(), index));
        self.objects
            .entry(key)
            .or_default()
            .insert(index, (self.clock, bytes));
        self.used_bytes += size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalStorage;

    #[tokio::test]
    async fn reads_come_from_the_cache_the_second_time_and_the_budget_holds() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalStorage::open(dir.path()).unwrap();
        let data: Vec<u8> = (0..1_300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("obj"), &data).unwrap();
        let len = data.len() as u64;
        let cache = RangeCache::new(16 * RANGE_CHUNK_BYTES);
        let key = RangeCache::object_key(&storage, "obj");
        assert!(cache.cached(&key, len, 10..20).is_none());

        // A read fetches its aligned window (512 KiB) with one GET.
        let got = cache
            .read(&storage, "obj", len, 60_000..140_000)
            .await
            .unwrap();
        assert_eq!(got.as_ref(), &data[60_000..140_000]);
        assert_eq!(cache.fetches(), 1);
        assert_eq!(cache.fetched_bytes(), RANGE_FETCH_BYTES);

        // Elsewhere in the window: no GET, and served without I/O.
        let got = cache
            .read(&storage, "obj", len, 400_000..400_010)
            .await
            .unwrap();
        assert_eq!(got.as_ref(), &data[400_000..400_010]);
        assert_eq!(
            cache
                .cached(&key, len, 0..RANGE_FETCH_BYTES)
                .unwrap()
                .as_ref(),
            &data[..RANGE_FETCH_BYTES as usize]
        );
        assert_eq!(cache.fetches(), 1);

        // Across two windows, the first cached: one GET for the missing part of the second.
        let got = cache
            .read(&storage, "obj", len, 500_000..600_000)
            .await
            .unwrap();
        assert_eq!(got.as_ref(), &data[500_000..600_000]);
        assert_eq!(cache.fetches(), 2);
        assert_eq!(cache.fetched_bytes(), 2 * RANGE_FETCH_BYTES);

        // The tail (a short last window): one more GET, and the oldest chunks go.
        let got = cache
            .read(&storage, "obj", len, 1_299_000..len)
            .await
            .unwrap();
        assert_eq!(got.as_ref(), &data[1_299_000..]);
        assert_eq!(cache.fetches(), 3);
        assert!(cache.used_bytes() <= 16 * RANGE_CHUNK_BYTES);
        assert!(cache.cached(&key, len, 0..10).is_none(), "evicted");

        // Out of bounds is an error, not a short read.
        assert!(cache.read(&storage, "obj", len, 10..len + 1).await.is_err());
        assert!(cache
            .read(&storage, "obj", len, 5..5)
            .await
            .unwrap()
            .is_empty());
    }
}
