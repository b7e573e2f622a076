//! The local split cache: directories on local disk holding fetched splits, within a byte
//! budget that is never exceeded, evicted least-recently-used first. A split is fetched once
//! even when many searches ask for it at the same time. The cache starts empty: its directory
//! is wiped at open.
//!
//! Budget: a fetch first reserves the split's size. Splits in use ("pinned" by a
//! [`CachedSplit`] handle) are never evicted, so when the budget is taken by pinned splits a
//! fetch asks the holders of idle pins to let go (the [pressure
//! handler](SplitCache::set_pressure_handler)), then waits for space up to a timeout and fails
//! with [`StorageError::CacheFull`] — it never overshoots. A split larger than the whole
//! budget fails at once with [`StorageError::CacheTooSmall`].

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{io_err, StorageError, StorageResult};

/// Name of a split's object inside its cache directory (see [`SplitCache::get_split`]).
pub const SPLIT_FILE_NAME: &str = "split.bundle";

/// How often a waiting fetch asks the pressure handlers again.
const PRESSURE_RETRY: Duration = Duration::from_millis(50);

/// How long a fetch waits for pinned splits to be released by default.
pub const DEFAULT_CACHE_WAIT: Duration = Duration::from_secs(10);

/// A pinned cached split: its directory stays on disk, and is not evicted, while this handle
/// (or a clone of its `Arc`) lives.
#[derive(Debug)]
pub struct CachedSplit {
    path: PathBuf,
    key: String,
    id: u64,
    size: u64,
    shared: Arc<Shared>,
}

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

impl Drop for CachedSplit {
    fn drop(&mut self) {
        let orphan = {
            let mut inner = self.shared.lock();
            match inner.entries.get_mut(&self.key) {
                Some(entry) if entry.id == self.id => {
                    entry.pins -= 1;
                    false
                }
                // Removed from the cache while pinned: its bytes are released now.
                _ => {
                    inner.detached_bytes -= self.size;
                    true
                }
            }
        };
        if orphan {
            let _ = std::fs::remove_dir_all(&self.path);
        }
        self.shared.space_freed.notify_waiters();
    }
}

struct Entry {
    id: u64,
    path: PathBuf,
    size: u64,
    last_used: u64,
    pins: usize,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    in_flight: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
    /// Bytes of the entries.
    used_bytes: u64,
    /// Bytes reserved by fetches in progress.
    reserved_bytes: u64,
    /// Bytes of entries removed while pinned, until their last pin is dropped.
    detached_bytes: u64,
    clock: u64,
    next_id: u64,
}

impl Inner {
    fn total(&self) -> u64 {
        self.used_bytes + self.reserved_bytes + self.detached_bytes
    }
}

/// Called when the budget is taken by pinned splits; should drop the pins it holds idle.
pub type PressureHandler = Arc<dyn Fn() + Send + Sync>;

struct Shared {
    inner: Mutex<Inner>,
    space_freed: tokio::sync::Notify,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SplitCache")
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // No await happens under this lock, and every update is complete before it is
        // released, so a poisoned lock still guards consistent data.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A bounded, LRU cache of split directories.
pub struct SplitCache {
    dir: PathBuf,
    max_bytes: u64,
    wait: Duration,
    shared: Arc<Shared>,
    pressure: Mutex<Vec<PressureHandler>>,
    hits: AtomicU64,
    misses: AtomicU64,
    downloaded_bytes: AtomicU64,
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
            wait: DEFAULT_CACHE_WAIT,
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner::default()),
                space_freed: tokio::sync::Notify::new(),
            }),
            pressure: Mutex::new(Vec::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            downloaded_bytes: AtomicU64::new(0),
        })
    }

    /// Sets how long a fetch waits for pinned splits to be released before failing.
    pub fn with_wait_timeout(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Registers a handler called when pinned splits fill the budget (e.g. the search
    /// service dropping the splits it keeps open but is not using).
    pub fn add_pressure_handler(&self, handler: PressureHandler) {
        self.pressure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(handler);
    }

    /// Alias of [`SplitCache::add_pressure_handler`].
    pub fn set_pressure_handler(&self, handler: PressureHandler) {
        self.add_pressure_handler(handler);
    }

    /// The byte budget.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    fn pin(&self, key: &str) -> Option<Arc<CachedSplit>> {
        let mut inner = self.shared.lock();
        inner.clock += 1;
        let clock = inner.clock;
        let entry = inner.entries.get_mut(key)?;
        entry.last_used = clock;
        entry.pins += 1;
        Some(Arc::new(CachedSplit {
            path: entry.path.clone(),
            key: key.to_string(),
            id: entry.id,
            size: entry.size,
            shared: self.shared.clone(),
        }))
    }

    /// Returns the cached directory of `key`, pinned, calling `fetch(dir)` to fill a fresh
    /// directory on a miss. `size` is the number of bytes the fetch will write (reserved
    /// first); `fetch` returns the number it wrote, which may not exceed `size`.
    pub async fn get_or_fetch<F, Fut>(
        &self,
        key: &str,
        size: u64,
        fetch: F,
    ) -> StorageResult<Arc<CachedSplit>>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: Future<Output = StorageResult<u64>>,
    {
        if let Some(handle) = self.pin(key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(handle);
        }
        let key_lock = self
            .shared
            .lock()
            .in_flight
            .entry(key.to_string())
            .or_default()
            .clone();
        let _guard = key_lock.lock().await;
        if let Some(handle) = self.pin(key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(handle);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let result = self.fetch_reserved(key, size, fetch).await;
        self.shared.lock().in_flight.remove(key);
        result
    }

    async fn fetch_reserved<F, Fut>(
        &self,
        key: &str,
        size: u64,
        fetch: F,
    ) -> StorageResult<Arc<CachedSplit>>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: Future<Output = StorageResult<u64>>,
    {
        self.reserve(key, size).await?;
        let tmp = self.dir.join(format!("{key}.fetching"));
        let final_dir = self.dir.join(key);
        let fetched = async {
            let _ = tokio::fs::remove_dir_all(&tmp).await;
            tokio::fs::create_dir_all(&tmp)
                .await
                .map_err(|err| io_err(&tmp, err))?;
            let written = fetch(tmp.clone()).await?;
            if written > size {
                return Err(StorageError::ObjectStore(format!(
                    "split `{key}` is {written} bytes, more than the {size} its metadata says"
                )));
            }
            let _ = tokio::fs::remove_dir_all(&final_dir).await;
            tokio::fs::rename(&tmp, &final_dir)
                .await
                .map_err(|err| io_err(&final_dir, err))?;
            Ok(written)
        }
        .await;
        let written = match fetched {
            Ok(written) => written,
            Err(err) => {
                self.shared.lock().reserved_bytes -= size;
                self.shared.space_freed.notify_waiters();
                let _ = tokio::fs::remove_dir_all(&tmp).await;
                return Err(err);
            }
        };
        let id = {
            let mut inner = self.shared.lock();
            inner.reserved_bytes -= size;
            inner.clock += 1;
            inner.next_id += 1;
            let (clock, id) = (inner.clock, inner.next_id);
            inner.used_bytes += written;
            inner.entries.insert(
                key.to_string(),
                Entry {
                    id,
                    path: final_dir.clone(),
                    size: written,
                    last_used: clock,
                    pins: 1,
                },
            );
            id
        };
        if written < size {
            self.shared.space_freed.notify_waiters();
        }
        Ok(Arc::new(CachedSplit {
            path: final_dir,
            key: key.to_string(),
            id,
            size: written,
            shared: self.shared.clone(),
        }))
    }

    /// Reserves `size` bytes, evicting unpinned entries, asking holders of idle pins to
    /// release them and waiting for space up to the timeout.
    async fn reserve(&self, key: &str, size: u64) -> StorageResult<()> {
        if size > self.max_bytes {
            return Err(StorageError::CacheTooSmall {
                split: key.to_string(),
                size,
                max_bytes: self.max_bytes,
            });
        }
        let deadline = tokio::time::Instant::now() + self.wait;
        let mut asked = false;
        loop {
            let notified = self.shared.space_freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let evicted = {
                let mut inner = self.shared.lock();
                let evicted = evict_for(&mut inner, size, self.max_bytes);
                if inner.total() + size <= self.max_bytes {
                    inner.reserved_bytes += size;
                    Some(evicted)
                } else {
                    for dir in &evicted {
                        let _ = std::fs::remove_dir_all(dir);
                    }
                    None
                }
            };
            if let Some(evicted) = evicted {
                for dir in evicted {
                    let _ = tokio::fs::remove_dir_all(&dir).await;
                }
                return Ok(());
            }
            // Ask the holders of idle pins to let go, then retry at once; afterwards, wait for
            // a pin to be dropped, asking again now and then (a split may become idle without
            // dropping a pin, e.g. kept open after its search ended).
            if !asked && self.ask_for_room() {
                asked = true;
                continue;
            }
            asked = false;
            let now = tokio::time::Instant::now();
            if now >= deadline {
                let inner = self.shared.lock();
                return Err(StorageError::CacheFull {
                    split: key.to_string(),
                    size,
                    max_bytes: self.max_bytes,
                    pinned_bytes: inner.total(),
                    waited: self.wait,
                });
            }
            let wake = deadline.min(now + PRESSURE_RETRY);
            let _ = tokio::time::timeout_at(wake, notified).await;
        }
    }

    /// Calls the pressure handlers; whether there are any.
    fn ask_for_room(&self) -> bool {
        let handlers: Vec<PressureHandler> = self
            .pressure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        for handler in &handlers {
            handler();
        }
        !handlers.is_empty()
    }

    /// The split `{split_id}.split` of `storage` (`size_bytes` long), downloaded on a miss.
    pub async fn get_split(
        &self,
        storage: &dyn crate::Storage,
        split_id: &str,
        size_bytes: u64,
    ) -> StorageResult<Arc<CachedSplit>> {
        let key = shale_types::split_object_key(split_id);
        let downloaded = &self.downloaded_bytes;
        self.get_or_fetch(split_id, size_bytes, |dir| async move {
            let size = storage
                .get_to_file(&key, &dir.join(SPLIT_FILE_NAME))
                .await?;
            downloaded.fetch_add(size, Ordering::Relaxed);
            Ok(size)
        })
        .await
    }

    /// Forgets `key` (e.g. after its split was deleted). A pinned entry's files stay until
    /// its last pin is dropped.
    pub async fn remove(&self, key: &str) {
        let removed = {
            let mut inner = self.shared.lock();
            match inner.entries.remove(key) {
                Some(entry) => {
                    inner.used_bytes -= entry.size;
                    if entry.pins > 0 {
                        inner.detached_bytes += entry.size;
                        None
                    } else {
                        Some(entry.path)
                    }
                }
                None => None,
            }
        };
        if let Some(path) = removed {
            let _ = tokio::fs::remove_dir_all(&path).await;
            self.shared.space_freed.notify_waiters();
        }
    }

    /// Bytes held or reserved (never more than the budget).
    pub fn size_bytes(&self) -> u64 {
        self.shared.lock().total()
    }

    /// Number of splits held.
    pub fn len(&self) -> usize {
        self.shared.lock().entries.len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counts a hit served above the cache: a reader kept open on a split this cache holds
    /// (pinned), so the split was local without a lookup.
    pub fn record_hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes of split objects downloaded by [`SplitCache::get_split`] since open.
    pub fn downloaded_bytes(&self) -> u64 {
        self.downloaded_bytes.load(Ordering::Relaxed)
    }

    /// (hits, misses) since open.
    pub fn hit_miss(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }
}

/// Removes least-recently-used unpinned entries until `size` more bytes fit (or none is left
/// to remove); returns their directories, to delete.
fn evict_for(inner: &mut Inner, size: u64, max_bytes: u64) -> Vec<PathBuf> {
    let mut evicted = Vec::new();
    while inner.total() + size > max_bytes {
        let victim = inner
            .entries
            .iter()
            .filter(|(_, e)| e.pins == 0)
            .min_by_key(|(_, e)| e.last_used)
            .map(|(k, _)| k.clone());
        let Some(victim) = victim else { break };
        if let Some(entry) = inner.entries.remove(&victim) {
            inner.used_bytes -= entry.size;
            evicted.push(entry.path);
        }
    }
    evicted
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
                    .get_or_fetch("a", 100, |dir| {
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
        drop(
            cache
                .get_or_fetch("b", 100, |d| fill(d, 100))
                .await
                .unwrap(),
        );
        // touch a so b is the LRU
        drop(
            cache
                .get_or_fetch("a", 100, |d| fill(d, 100))
                .await
                .unwrap(),
        );
        drop(
            cache
                .get_or_fetch("c", 100, |d| fill(d, 100))
                .await
                .unwrap(),
        );
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.size_bytes(), 200);
        assert!(!tmp.path().join("cache/b").exists());
        assert!(tmp.path().join("cache/a").exists());
        // an entry in use is not evicted
        let held = cache
            .get_or_fetch("a", 100, |d| fill(d, 100))
            .await
            .unwrap();
        drop(
            cache
                .get_or_fetch("d", 100, |d| fill(d, 100))
                .await
                .unwrap(),
        );
        assert!(held.path().join("data").exists());
        assert_eq!(cache.hit_miss().1, 4);
    }

    #[tokio::test]
    async fn pinned_splits_never_push_the_cache_over_budget() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Arc::new(
            SplitCache::open(&tmp.path().join("cache"), 250)
                .unwrap()
                .with_wait_timeout(Duration::from_secs(5)),
        );
        let a = cache
            .get_or_fetch("a", 100, |d| fill(d, 100))
            .await
            .unwrap();
        let b = cache
            .get_or_fetch("b", 100, |d| fill(d, 100))
            .await
            .unwrap();
        // c does not fit while a and b are pinned: it waits, and gets in once a is released.
        let waiter = {
            let cache = cache.clone();
            tokio::spawn(async move {
                let c = cache.get_or_fetch("c", 100, |d| fill(d, 100)).await;
                (c.map(|c| c.path().to_path_buf()), cache.size_bytes())
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiter.is_finished(), "c must wait for space");
        assert_eq!(cache.size_bytes(), 200);
        drop(a);
        let (c, size_after) = waiter.await.unwrap();
        assert!(c.unwrap().join("data").exists());
        assert!(size_after <= 250);
        assert!(!tmp.path().join("cache/a").exists(), "a was evicted for c");
        drop(b);
        assert!(cache.size_bytes() <= 250);
    }

    #[tokio::test]
    async fn a_full_cache_fails_cleanly_after_waiting_and_asks_for_idle_pins() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = SplitCache::open(&tmp.path().join("cache"), 150)
            .unwrap()
            .with_wait_timeout(Duration::from_millis(300));
        let held = cache
            .get_or_fetch("a", 100, |d| fill(d, 100))
            .await
            .unwrap();
        let err = cache
            .get_or_fetch("b", 100, |d| fill(d, 100))
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::CacheFull { .. }), "{err}");
        assert!(err.to_string().contains("split cache"), "{err}");
        assert_eq!(cache.size_bytes(), 100);
        // Larger than the whole budget: fails at once.
        let err = cache
            .get_or_fetch("huge", 151, |d| fill(d, 151))
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::CacheTooSmall { .. }), "{err}");
        // A pressure handler holding an idle pin releases it: the fetch then succeeds.
        let slot: Arc<Mutex<Option<Arc<CachedSplit>>>> = Arc::new(Mutex::new(Some(held)));
        let released = slot.clone();
        cache.set_pressure_handler(Arc::new(move || {
            released.lock().unwrap().take();
        }));
        let b = cache
            .get_or_fetch("b", 100, |d| fill(d, 100))
            .await
            .unwrap();
        assert!(b.path().join("data").exists());
        assert!(slot.lock().unwrap().is_none());
        assert_eq!(cache.size_bytes(), 100);
    }

    #[tokio::test]
    async fn removing_a_pinned_split_keeps_its_bytes_counted_until_released() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = SplitCache::open(&tmp.path().join("cache"), 200).unwrap();
        let held = cache
            .get_or_fetch("a", 100, |d| fill(d, 100))
            .await
            .unwrap();
        cache.remove("a").await;
        assert!(held.path().join("data").exists());
        assert_eq!(cache.size_bytes(), 100);
        let path = held.path().to_path_buf();
        drop(held);
        assert!(!path.exists());
        assert_eq!(cache.size_bytes(), 0);
    }
}
