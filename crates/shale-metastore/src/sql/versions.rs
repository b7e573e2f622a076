//! Index versions answered from memory while this process is the database's only writer.
//!
//! A search asks for its index's version before anything else (to know whether its view
//! still holds). When every write to the database goes through this process, the versions
//! can only change when one of its own write transactions ends: each end raises a counter,
//! and a version read from the database stays good until the counter moves. So while the
//! process is alone, a search with nothing written since reads no row at all. Which process
//! is alone is the backend's business (SQLite: [`crate::sqlite`]'s users file); on
//! PostgreSQL other nodes write, so versions are always read.
//!
//! A write acknowledged before a search began raised the counter before that search looked:
//! a version kept from before it is not used, exactly as if it had been read again. A write
//! transaction dropped before it ended (its caller cancelled) may still commit after it is
//! dropped, so for a while after one, nothing kept is used.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::IndexVersion;

/// How long nothing kept is used after a write transaction was dropped before it ended.
const AFTER_ABANDONED_WRITE: Duration = Duration::from_secs(5);

/// Whether this process is the database's only writer, asked before every kept version is
/// used and after every write transaction ends (it must be cheap: no query).
pub(crate) type Alone = Box<dyn Fn() -> bool + Send + Sync>;

/// Index versions kept between writes (see the module docs).
pub(crate) struct VersionCache {
    alone: Alone,
    /// Raised when a write transaction ends (committed, rolled back or dropped).
    writes: AtomicU64,
    /// Until when nothing kept is used (a write transaction was abandoned).
    distrust_until: Mutex<Option<Instant>>,
    /// By index id: the version, and the count of writes before it was read.
    kept: Mutex<HashMap<String, (IndexVersion, u64)>>,
}

impl VersionCache {
    /// A cache used while `alone` says this process is the only writer.
    pub(crate) fn new(alone: Alone) -> Self {
        VersionCache {
            alone,
            writes: AtomicU64::new(0),
            distrust_until: Mutex::new(None),
            kept: Mutex::new(HashMap::new()),
        }
    }

    /// Called when a write transaction ends, before its caller hears of it; `abandoned` when
    /// it was dropped before it committed or rolled back.
    pub(crate) fn write_ended(&self, abandoned: bool) {
        // The check itself matters, not its answer: a backend that learns there that
        // another process may think itself alone tells that process before this write is
        // acknowledged (SQLite: joining a replaced users file).
        let _ = (self.alone)();
        if abandoned {
            *self
                .distrust_until
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + AFTER_ABANDONED_WRITE);
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
    }

    /// The count of writes to give [`VersionCache::keep`] with a version read after this
    /// call; `None` when versions must not be kept now.
    pub(crate) fn before_read(&self) -> Option<u64> {
        if !(self.alone)() {
            return None;
        }
        let distrust = *self
            .distrust_until
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if distrust.is_some_and(|until| Instant::now() < until) {
            return None;
        }
        Some(self.writes.load(Ordering::SeqCst))
    }

    /// The version of `index_id` kept and still good, if any.
    pub(crate) fn get(&self, index_id: &str) -> Option<IndexVersion> {
        let writes = self.before_read()?;
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        match kept.get(index_id) {
            Some((version, at)) if *at == writes => Some(version.clone()),
            _ => None,
        }
    }

    /// Keeps `version` of `index_id`, read after [`VersionCache::before_read`] gave `writes`.
    pub(crate) fn keep(&self, index_id: &str, version: IndexVersion, writes: u64) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: versions of indexes no longer searched do not pile up.
        if kept.len() >= 4096 && !kept.contains_key(index_id) {
            kept.clear();
        }
        kept.insert(index_id.to_string(), (version, writes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn version(v: u64) -> IndexVersion {
        static UID: std::sync::OnceLock<shale_types::IndexUid> = std::sync::OnceLock::new();
        IndexVersion {
            index_uid: UID
                .get_or_init(|| shale_types::IndexUid::new("logs"))
                .clone(),
            version: v,
        }
    }

    #[test]
    fn a_kept_version_holds_until_a_write_ends_or_the_process_is_not_alone() {
        let alone = Arc::new(AtomicBool::new(true));
        let flag = alone.clone();
        let cache = VersionCache::new(Box::new(move || flag.load(Ordering::SeqCst)));
        assert_eq!(cache.get("logs"), None);
        let writes = cache.before_read().unwrap();
        cache.keep("logs", version(3), writes);
        assert_eq!(cache.get("logs"), Some(version(3)));
        assert_eq!(cache.get("other"), None);

        // A write ending anywhere makes every kept version unusable.
        cache.write_ended(false);
        assert_eq!(cache.get("logs"), None);

        // A version read while a write ended is not used either.
        let writes = cache.before_read().unwrap();
        cache.write_ended(false);
        cache.keep("logs", version(4), writes);
        assert_eq!(cache.get("logs"), None);

        let writes = cache.before_read().unwrap();
        cache.keep("logs", version(5), writes);
        assert_eq!(cache.get("logs"), Some(version(5)));
        // Another process joined: nothing kept is used, nothing is kept.
        alone.store(false, Ordering::SeqCst);
        assert_eq!(cache.get("logs"), None);
        assert_eq!(cache.before_read(), None);
    }

    #[test]
    fn an_abandoned_write_stops_the_use_of_kept_versions_for_a_while() {
        let cache = VersionCache::new(Box::new(|| true));
        let writes = cache.before_read().unwrap();
        cache.keep("logs", version(1), writes);
        cache.write_ended(true);
        assert_eq!(cache.before_read(), None);
        assert_eq!(cache.get("logs"), None);
    }
}
