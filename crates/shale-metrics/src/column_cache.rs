//! Decoded timestamps and values of hot row groups, kept in memory by (split id, row group):
//! splits never change, so a row group decoded once answers every later selector of any of
//! its series without fetching or decoding a page. A row group is decoded whole and kept at
//! the second read of its split (the first reads only the pages it needs, so a split read
//! once costs no more than before); the least recently used go first past the byte budget.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

/// The decoded timestamp and value columns of one row group, in row order.
#[derive(Debug, Default)]
pub(crate) struct Columns {
    /// Milliseconds since the epoch.
    pub(crate) timestamps: Vec<i64>,
    /// Values.
    pub(crate) values: Vec<f64>,
}

impl Columns {
    fn bytes(&self) -> usize {
        self.timestamps.len() * 8 + self.values.len() * 8 + 64
    }
}

/// The default budget: 256 MiB.
pub const DEFAULT_COLUMN_CACHE_BYTES: usize = 256 << 20;

/// Splits read once (whose next read fills the cache) kept in memory at most.
const MAX_SEEN: usize = 65_536;

static BUDGET: AtomicUsize = AtomicUsize::new(DEFAULT_COLUMN_CACHE_BYTES);

static CACHE: LazyLock<Mutex<ColumnCache>> = LazyLock::new(|| Mutex::new(ColumnCache::default()));

/// Sets the memory of the cache of decoded columns (0 turns it off); what it holds beyond
/// goes at the next insert.
pub fn set_column_cache_bytes(bytes: usize) {
    BUDGET.store(bytes, Ordering::Relaxed);
}

/// What the cache holds: (row groups, bytes).
pub fn column_cache_usage() -> (usize, usize) {
    let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    (cache.entries.len(), cache.bytes)
}

#[derive(Default)]
struct ColumnCache {
    /// (split id, row group) → (columns, last use).
    entries: HashMap<(String, usize), (Arc<Columns>, u64)>,
    /// Splits read at least once.
    seen: std::collections::HashSet<String>,
    bytes: usize,
    clock: u64,
}

/// The cached columns of `row_groups` of split `key`, if every one is cached.
pub(crate) fn get_all(key: &str, row_groups: &[usize]) -> Option<Vec<Arc<Columns>>> {
    if BUDGET.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    cache.clock += 1;
    let now = cache.clock;
    let mut found = Vec::with_capacity(row_groups.len());
    for &group in row_groups {
        let (columns, used) = cache.entries.get_mut(&(key.to_string(), group))?;
        *used = now;
        found.push(columns.clone());
    }
    Some(found)
}

/// Whether the row groups of split `key` should be decoded whole and kept: it was read
/// before (this read is recorded either way).
pub(crate) fn admit(key: &str) -> bool {
    if BUDGET.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if cache.seen.contains(key) {
        return true;
    }
    if cache.seen.len() >= MAX_SEEN {
        cache.seen.clear();
    }
    cache.seen.insert(key.to_string());
    false
}

/// Keeps the decoded columns of row group `group` of split `key`, making room by dropping
/// the least recently used; returns them shared.
pub(crate) fn insert(key: &str, group: usize, columns: Columns) -> Arc<Columns> {
    let columns = Arc::new(columns);
    let budget = BUDGET.load(Ordering::Relaxed);
    CACHE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, group, columns.clone(), budget);
    columns
}

impl ColumnCache {
    /// Keeps `columns` within `budget` bytes (not at all if they alone pass it).
    fn insert(&mut self, key: &str, group: usize, columns: Arc<Columns>, budget: usize) {
        let size = columns.bytes();
        if size > budget {
            return;
        }
        if let Some((previous, _)) = self.entries.remove(&(key.to_string(), group)) {
            self.bytes -= previous.bytes();
        }
        while self.bytes + size > budget {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((evicted, _)) = self.entries.remove(&oldest) {
                self.bytes -= evicted.bytes();
            }
        }
        self.clock += 1;
        self.entries
            .insert((key.to_string(), group), (columns, self.clock));
        self.bytes += size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns(rows: usize) -> Columns {
        Columns {
            timestamps: (0..rows as i64).collect(),
            values: (0..rows).map(|v| v as f64).collect(),
        }
    }

    #[test]
    fn a_split_is_kept_from_its_second_read_and_the_least_recently_used_go_first() {
        // One budget for the whole test binary: the keys here are this test's own.
        let key = |n: usize| format!("column-cache-test-{n}");
        assert!(!admit(&key(1)), "first read: pages only");
        assert!(admit(&key(1)), "second read: decoded whole");
        assert!(get_all(&key(1), &[0]).is_none());
        insert(&key(1), 0, columns(10));
        insert(&key(1), 1, columns(10));
        let both = get_all(&key(1), &[0, 1]).expect("cached");
        assert_eq!(both[1].values[9], 9.0);
        assert!(get_all(&key(1), &[0, 2]).is_none(), "all or nothing");
        let (_, bytes) = column_cache_usage();
        assert!(bytes >= 2 * columns(10).bytes());
    }

    #[test]
    fn the_budget_holds_by_dropping_the_least_recently_used() {
        let one = columns(100).bytes();
        let mut cache = ColumnCache::default();
        cache.insert("a", 0, Arc::new(columns(100)), 2 * one);
        cache.insert("b", 0, Arc::new(columns(100)), 2 * one);
        // `a` used since: `b` goes.
        cache.clock += 1;
        let clock = cache.clock;
        if let Some((_, used)) = cache.entries.get_mut(&("a".to_string(), 0)) {
            *used = clock;
        }
        cache.insert("c", 0, Arc::new(columns(100)), 2 * one);
        let mut keys: Vec<&str> = cache.entries.keys().map(|(k, _)| k.as_str()).collect();
        keys.sort();
        assert_eq!(keys, ["a", "c"]);
        assert_eq!(cache.bytes, 2 * one);
        // Too big alone: not kept.
        cache.insert("d", 0, Arc::new(columns(1000)), 2 * one);
        assert_eq!(cache.entries.len(), 2);
    }
}
