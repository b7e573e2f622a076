//! The heap estimate that aggregation results are reserved by (`shale_types::heap`) is at or
//! above the heap they really hold, measured with a counting allocator, for the shapes that
//! weigh most: nested `terms` (a table per bucket), wide `terms`, histograms with
//! sub-aggregations and metric sketches. What the root reserves for their rendering (the
//! final results, then their JSON) is checked the same way.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

use serde_json::json;
use tantivy::aggregation::agg_req::Aggregations;
use tantivy::aggregation::DistributedAggregationCollector;
use tantivy::query::AllQuery;
use tantivy::schema::{Schema, FAST, STRING};
use tantivy::{doc, Index};

/// Bytes allocated and not yet freed, by the whole process.
static LIVE: AtomicI64 = AtomicI64::new(0);
/// The most `LIVE` has been since it was last reset.
static PEAK: AtomicI64 = AtomicI64::new(0);

fn grew(by: i64) {
    let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size() as i64);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size as i64 - layout.size() as i64);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What `make` returns, the heap it leaves held and the most it held on the way.
fn measured<T>(make: impl FnOnce() -> T) -> (T, u64, u64) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let value = make();
    let after = LIVE.load(Ordering::Relaxed);
    let peak = PEAK.load(Ordering::Relaxed);
    (
        value,
        (after - before).max(0) as u64,
        (peak - before).max(0) as u64,
    )
}

fn decoded_again(
    encoded: &str,
) -> tantivy::aggregation::intermediate_agg_result::IntermediateAggregationResults {
    shale_search::aggs::decode(encoded).unwrap()
}

#[test]
fn the_estimate_covers_what_aggregation_results_hold() {
    let mut schema = Schema::builder();
    let service = schema.add_text_field("service", STRING | FAST);
    let status = schema.add_i64_field("status", FAST);
    let latency = schema.add_f64_field("latency", FAST);
    let ts = schema.add_i64_field("ts", FAST);
    let index = Index::create_in_ram(schema.build());
    let mut writer = index.writer_with_num_threads(1, 50_000_000).unwrap();
    for i in 0..3_000i64 {
        writer
            .add_document(doc!(
                service => format!("s{i}"),
                status => i,
                latency => (i % 97) as f64 * 1.5,
                ts => i * 60,
            ))
            .unwrap();
    }
    writer.commit().unwrap();
    let searcher = index.reader().unwrap().searcher();

    let mut nested = json!({"terms": {"field": "service", "size": 10000}});
    for level in 0..7 {
        let field = ["status", "service"][level % 2];
        nested = json!({"terms": {"field": field, "size": 10000}, "aggs": {"inner": nested}});
    }
    let shapes = [
        ("8 levels of terms", json!({"a": nested})),
        (
            "wide terms",
            json!({"a": {"terms": {"field": "service", "size": 10000}}}),
        ),
        (
            "histogram of terms with stats",
            json!({"a": {"histogram": {"field": "ts", "interval": 600},
                "aggs": {"b": {"terms": {"field": "status", "size": 100},
                    "aggs": {"c": {"stats": {"field": "latency"}}}}}}}),
        ),
        (
            "percentiles and cardinality per term",
            json!({"a": {"terms": {"field": "service", "size": 10000},
                "aggs": {"p": {"percentiles": {"field": "latency"}},
                         "c": {"cardinality": {"field": "status"}}}}}),
        ),
    ];
    for (what, request) in shapes {
        let aggs: Aggregations = serde_json::from_value(request).unwrap();
        let collector =
            DistributedAggregationCollector::from_aggs(aggs.clone(), shale_search::aggs::context());
        let results = searcher.search(&AllQuery, &collector).unwrap();
        let encoded = shale_search::aggs::encode(&results).unwrap();
        drop(results);
        // Decoded as the root decodes a leaf's: the heap that value holds.
        let (decoded, held, _) = measured(|| shale_search::aggs::decode(&encoded).unwrap());
        let estimate = shale_search::aggs::estimated_heap_bytes(&decoded);
        eprintln!("{what}: held {held} B, estimated {estimate} B");
        assert!(
            estimate >= held,
            "{what}: estimated {estimate} B under the {held} B held"
        );
        assert!(
            estimate <= 4 * held.max(1 << 16),
            "{what}: estimated {estimate} B, far over the {held} B held"
        );
        // Rendering (the final results, then their JSON) takes at most what the root
        // reserves for it besides the results.
        let (_, _, rendering) = measured(|| {
            shale_search::aggs::finalize(aggs, decoded, &Default::default())
                .unwrap()
                .to_string()
                .len()
        });
        eprintln!("{what}: rendering peaked {rendering} B over the start");
        let reserved = shale_search::aggs::estimated_bytes_with_rendering(&decoded_again(&encoded));
        assert!(
            reserved >= held + rendering,
            "{what}: rendering peaked at {rendering} B over the {held} B held, past the \
             {reserved} B reserved"
        );
    }
}
