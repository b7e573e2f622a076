//! Aggregations (`aggs` of a search request, Elasticsearch's JSON as Quickwit takes it):
//! parsed for the representative index (the depth limit, the normalization, the field
//! checks), then collected on its split, exchanged, estimated and rendered as a search does;
//! deep inputs are seeds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(aggs) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    shale_fuzz::check_aggs(&aggs);
});
