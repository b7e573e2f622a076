//! The local split cache: directories on local disk holding fetched splits, bounded in bytes,
//! evicted least-recently-used first. A split is fetched once even when many searches ask for
//! it at the same time. The cache starts empty: its directory is wiped at open.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::{io_err, StorageResult};

/// A cached split's local directory. Entries in use are never evicted.
#[derive(Debug)]
pub struct CachedSplit {
    path: PathBuf,
}

/// Name of a split's object inside its cache directory (see [`SplitCache::get_split`]).
pub const SPLIT_FILE_NAME: &str = "split.bundle";

impl CachedSplit {
    /// The directory holding the split's files.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The split object (bundle) fetched by [`SplitCache::get_split`].
    pub fn split_file(&self) -> PathBuf {
        self.path.join(SPLIT_FILE_NAME)
    }
}

struct Entry {
    handle: Arc<CachedSplit>,
    size: u64,
    last_used: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    in_flight: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
    total_bytes: u64,
    clock: u64,
}

/// A bounded, LRU cache of split directories.
pub struct SplitCache {
    dir: PathBuf,
    max_bytes: u64,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for SplitCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SplitCache")
            .field("dir", &self.dir)
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

impl SplitCache {
    /// Opens (and empties) a cache in `dir` holding at most `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64) -> StorageResult<SplitCache> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|err| io_err(dir, err))?;
        }
        std::fs::create_dir_all(dir).map_err(|err| io_err(dir, err))?;
        Ok(SplitCache {
            dir: dir.to_path_buf(),
            max_bytes,
            inner: Mutex::new(Inner::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the map inconsistent (no await inside).
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lookup(&self, key: &str) -> Option<Arc<CachedSplit>> {
        let mut inner = self.lock();
        inner.clock += 1;
        let clock = inner.clock;
        inner.entries.get_mut(key).map(|entry| {
            entry.last_used = clock;
            entry.handle.clone()
        })
    }

    /// Returns the cached directory of `key`, calling `fetch(dir)` to fill a fresh directory
    /// on a miss; `fetch` returns the number of bytes it wrote.
    pub async fn get_or_fetch<F, Fut>(&self, key: &str, fetch: F) -> StorageResult<Arc<CachedSplit>>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: Future<Output = StorageResult<u64>>,
    {
        if let Some(handle) = self.lookup(key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(handle);
        }
        let key_lock = self
            .lock()
            .in_flight
            .entry(key.to_string())
            .or_default()
            .clone();
        let _guard = key_lock.lock().await;
        if let Some(handle) = self.lookup(key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(handle);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let tmp = self.dir.join(format!("{key}.fetching"));
        let final_dir = self.dir.join(key);
        let _ = tokio::fs::remove_dir_all(&tmp).await;
        tokio::fs::create_dir_all(&tmp)
            .await
            .map_err(|err| io_err(&tmp, err))?;
        let size = match fetch(tmp.clone()).await {
            Ok(size) => size,
            Err(err) => {
                let _ = tokio::fs::remove_dir_all(&tmp).await;
                self.lock().in_flight.remove(key);
                return Err(err);
            }
        };
        let _ = tokio::fs::remove_dir_all(&final_dir).await;
        tokio::fs::rename(&tmp, &final_dir)
            .await
            .map_err(|err| io_err(&final_dir, err))?;
        let handle = Arc::new(CachedSplit { path: final_dir });
        let evicted = {
            let mut inner = self.lock();
            inner.clock += 1;
            let clock = inner.clock;
            inner.total_bytes += size;
            inner.entries.insert(
                key.to_string(),
                Entry {
                    handle: handle.clone(),
                    size,
                    last_used: clock,
                },
            );
            inner.in_flight.remove(key);
            self.evict(&mut inner)
        };
        for dir in evicted {
            let _ = tokio::fs::remove_dir_all(&dir).await;
        }
        Ok(handle)
    }

    /// The split `{split_id}.split` of `storage`, downloaded on a miss.
    pub async fn get_split(
        &self,
        storage: &crate::Storage,
        split_id: &str,
    ) -> StorageResult<Arc<CachedSplit>> {
        let key = shale_types::split_object_key(split_id);
        self.get_or_fetch(split_id, |dir| async move {
            storage.get_to_file(&key, &dir.join(SPLIT_FILE_NAME)).await
        })
        .await
    }

    /// Drops least-recently-used entries not in use until under budget; returns their dirs.
    fn evict(&self, inner: &mut Inner) -> Vec<PathBuf> {
        let mut evicted = Vec::new();
        while inner.total_bytes > self.max_bytes {
            let victim = inner
                .entries
                .iter()
                .filter(|(_, e)| Arc::strong_count(&e.handle) == 1)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            let Some(victim) = victim else { break };
            if let Some(entry) = inner.entries.remove(&victim) {
                inner.total_bytes -= entry.size;
                evicted.push(entry.handle.path.clone());
            }
        }
        evicted
    }

    /// Forgets `key` (e.g. after its split was deleted).
    pub async fn remove(&self, key: &str) {
        let removed = {
            let mut inner = self.lock();
            let removed = inner.entries.remove(key);
            if let Some(entry) = &removed {
                inner.total_bytes -= entry.size;
            }
            removed
        };
        if let Some(entry) = removed {
            let _ = tokio::fs::remove_dir_all(&entry.handle.path).await;
        }
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> u64 {
        self.lock().total_bytes
    }

    /// Number of splits held.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (hits, misses) since open.
    pub fn hit_miss(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    async fn fill(dir: PathBuf, n: usize) -> StorageResult<u64> {
        std::fs::write(dir.join("data"), vec![1u8; n]).unwrap();
        Ok(n as u64)
    }

    #[tokio::test]
    async fn caches_evicts_lru_and_fetches_once() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Arc::new(SplitCache::open(&tmp.path().join("cache"), 250).unwrap());
        let fetches = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let cache = cache.clone();
            let fetches = fetches.clone();
            tasks.push(tokio::spawn(async move {
                cache
                    .get_or_fetch("a", |dir| {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        fill(dir, 100)
                    })
                    .await
                    .unwrap()
                    .path()
                    .to_path_buf()
            }));
        }
        for task in tasks {
            assert!(task.await.unwrap().join("data").exists());
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        drop(cache.get_or_fetch("b", |d| fill(d, 100)).await.unwrap());
        // touch a so b is the LRU
        drop(cache.get_or_fetch("a", |d| fill(d, 100)).await.unwrap());
        drop(cache.get_or_fetch("c", |d| fill(d, 100)).await.unwrap());
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.size_bytes(), 200);
        assert!(!tmp.path().join("cache/b").exists());
        assert!(tmp.path().join("cache/a").exists());
        // an entry in use is not evicted
        let held = cache.get_or_fetch("a", |d| fill(d, 100)).await.unwrap();
        drop(cache.get_or_fetch("d", |d| fill(d, 100)).await.unwrap());
        assert!(held.path().join("data").exists());
        assert_eq!(cache.hit_miss().1, 4);
    }
}
