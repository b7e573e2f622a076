//! The byte-range cache: the parts of remote split objects that searches read, kept in memory
//! within a byte budget, least-recently-used first out.
//!
//! Objects are cut into aligned chunks of [`RANGE_CHUNK_BYTES`]. A read asks for the chunks
//! covering its range; the missing ones are fetched with one ranged GET per run of
//! consecutive missing chunks (runs in parallel), so a read costs at most one round trip and
//! a second read of the same bytes none. Cached objects are immutable (split objects are
//! never rewritten), so entries never go stale.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::{Storage, StorageError, StorageResult};

/// Size of the aligned chunks objects are cached by.
pub const RANGE_CHUNK_BYTES: u64 = 64 * 1024;

/// A chunk: (object URI, chunk index).
type ChunkKey = (Arc<str>, u64);

#[derive(Default)]
struct Inner {
    chunks: HashMap<ChunkKey, (u64, Bytes)>,
    /// Last-use clock → chunk, oldest first.
    order: BTreeMap<u64, ChunkKey>,
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
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let object: Arc<str> = Arc::from(format!("{}/{name}", storage.uri()));
        let first = range.start / RANGE_CHUNK_BYTES;
        let last = (range.end - 1) / RANGE_CHUNK_BYTES;
        let mut chunks: Vec<Option<Bytes>> = {
            let mut inner = self.lock();
            (first..=last)
                .map(|index| inner.touch(&(object.clone(), index)))
                .collect()
        };
        // Runs of consecutive missing chunks, each fetched with one GET.
        let mut runs: Vec<Range<u64>> = Vec::new();
        for (offset, chunk) in chunks.iter().enumerate() {
            if chunk.is_some() {
                continue;
            }
            let index = first + offset as u64;
            match runs.last_mut() {
                Some(run) if run.end == index => run.end = index + 1,
                _ => runs.push(index..index + 1),
            }
        }
        let hit: u64 = chunks.iter().flatten().map(|c| c.len() as u64).sum();
        self.hit_bytes.fetch_add(hit, Ordering::Relaxed);
        let fetched = futures::future::try_join_all(runs.iter().map(|run| {
            let bytes = run.start * RANGE_CHUNK_BYTES..(run.end * RANGE_CHUNK_BYTES).min(object_len);
            storage.get_range(name, bytes)
        }))
        .await?;
        for (run, bytes) in runs.iter().zip(fetched) {
            self.record_fetch(bytes.len() as u64);
            let mut inner = self.lock();
            for index in run.clone() {
                let start = ((index - run.start) * RANGE_CHUNK_BYTES) as usize;
                let end = (start + RANGE_CHUNK_BYTES as usize).min(bytes.len());
                if start > end {
                    return Err(StorageError::ObjectStore(format!(
                        "object `{name}` is shorter than its recorded {object_len} bytes"
                    )));
                }
                let chunk = bytes.slice(start..end);
                inner.insert(object.clone(), index, chunk.clone(), self.max_bytes);
                chunks[(index - first) as usize] = Some(chunk);
            }
        }
        // The requested bytes out of the chunks: zero-copy when they lie in one.
        let start_in_first = (range.start - first * RANGE_CHUNK_BYTES) as usize;
        let len = (range.end - range.start) as usize;
        if first == last {
            let chunk = chunks.pop().flatten().unwrap_or_default();
            if start_in_first + len > chunk.len() {
                return Err(StorageError::ObjectStore(format!(
                    "object `{name}` is shorter than its recorded {object_len} bytes"
                )));
            }
            return Ok(chunk.slice(start_in_first..start_in_first + len));
        }
        let mut out = Vec::with_capacity(len);
        for (offset, chunk) in chunks.iter().enumerate() {
            let chunk = chunk.as_deref().unwrap_or_default();
            let from = if offset == 0 { start_in_first } else { 0 };
            let want = (len - out.len()).min(chunk.len().saturating_sub(from));
            out.extend_from_slice(&chunk[from..from + want]);
        }
        if out.len() != len {
            return Err(StorageError::ObjectStore(format!(
                "object `{name}` is shorter than its recorded {object_len} bytes"
            )));
        }
        Ok(Bytes::from(out))
    }
}

impl Inner {
    /// The chunk if cached, marked as just used.
    fn touch(&mut self, key: &ChunkKey) -> Option<Bytes> {
        self.clock += 1;
        let clock = self.clock;
        let (last_used, bytes) = self.chunks.get_mut(key)?;
        self.order.remove(last_used);
        *last_used = clock;
        self.order.insert(clock, key.clone());
        Some(bytes.clone())
    }

    fn insert(&mut self, object: Arc<str>, index: u64, bytes: Bytes, max_bytes: u64) {
        let size = bytes.len() as u64;
        if size > max_bytes {
            return;
        }
        let key = (object, index);
        if let Some((last_used, old)) = self.chunks.remove(&key) {
            self.order.remove(&last_used);
            self.used_bytes -= old.len() as u64;
        }
        while self.used_bytes + size > max_bytes {
            let Some((_, victim)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, old)) = self.chunks.remove(&victim) {
                self.used_bytes -= old.len() as u64;
            }
        }
        self.clock += 1;
        self.order.insert(self.clock, key.clone());
        self.chunks.insert(key, (self.clock, bytes));
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
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("obj"), &data).unwrap();
        let len = data.len() as u64;
        let cache = RangeCache::new(3 * RANGE_CHUNK_BYTES);

        // Across three chunks: one GET.
        let got = cache.read(&storage, "obj", len, 60_000..140_000).await.unwrap();
        assert_eq!(got.as_ref(), &data[60_000..140_000]);
        assert_eq!(cache.fetches(), 1);
        assert_eq!(cache.fetched_bytes(), 3 * RANGE_CHUNK_BYTES);

        // Inside a cached chunk: no GET.
        let got = cache.read(&storage, "obj", len, 70_000..70_010).await.unwrap();
        assert_eq!(got.as_ref(), &data[70_000..70_010]);
        assert_eq!(cache.fetches(), 1);

        // The tail (a short last chunk): one more GET, and the oldest chunk goes.
        let got = cache.read(&storage, "obj", len, 299_000..len).await.unwrap();
        assert_eq!(got.as_ref(), &data[299_000..]);
        assert_eq!(cache.fetches(), 2);
        assert!(cache.used_bytes() <= 3 * RANGE_CHUNK_BYTES);

        // Out of bounds is an error, not a short read.
        assert!(cache.read(&storage, "obj", len, 10..len + 1).await.is_err());
        assert!(cache
            .read(&storage, "obj", len, 5..5)
            .await
            .unwrap()
            .is_empty());
    }
}
