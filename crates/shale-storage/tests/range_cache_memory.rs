//! `range_cache_max_bytes` bounds the memory the range cache keeps alive, not only the bytes
//! it counts: measured with a counting global allocator while reads scattered over a large
//! object fill and churn the cache.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

use shale_storage::{LocalStorage, RangeCache, RANGE_CHUNK_BYTES, RANGE_FETCH_BYTES};

/// Counts the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn the_cache_keeps_no_more_memory_alive_than_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalStorage::open(dir.path()).unwrap();
    // 64 MiB object, 4 MiB budget.
    let len: u64 = 64 * 1024 * 1024;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.path().join("obj"), &data).unwrap();
    let budget = 64 * RANGE_CHUNK_BYTES;
    let cache = RangeCache::new(budget);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let baseline = LIVE.load(Ordering::Relaxed);
    let mut peak: i64 = 0;
    // A search pattern that keeps one chunk of each fetched window hot: a small read in a
    // new window fetches the whole window (8 chunks), then reads of the first chunk of the
    // last 48 windows keep those chunks recently used while the other chunks are evicted.
    // Sliced chunks would keep 48 windows of 512 KiB (24 MiB) alive for a 4 MiB budget.
    let window = RANGE_FETCH_BYTES;
    let read = |start: u64| {
        let got = runtime
            .block_on(cache.read(&storage, "obj", len, start..start + 100))
            .unwrap();
        assert_eq!(got.as_ref(), &data[start as usize..start as usize + 100]);
    };
    for w in 0..(len / window) {
        read(w * window + 10);
        for hot in w.saturating_sub(47)..=w {
            read(hot * window + 20);
        }
        peak = peak.max(LIVE.load(Ordering::Relaxed) - baseline);
    }
    assert!(cache.used_bytes() <= budget, "the count stays in budget");
    assert_eq!(cache.fetches(), len / window, "one GET per window");
    // The budget, plus the bookkeeping (maps, keys) and the runtime: well under one more
    // budget.
    assert!(
        peak < 2 * budget as i64,
        "the cache keeps {peak} bytes alive for a budget of {budget}"
    );
}
