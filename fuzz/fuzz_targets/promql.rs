//! PromQL as the node parses it: `parse_bounded` (the text bounds, the parser, the
//! expression's depth and its dismantling) on arbitrary strings; deep inputs are seeds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(expr) = shale_metrics::promql_depth::parse_bounded(query) {
        // What passed the bounds can be walked recursively (rendered) without trouble.
        let _ = expr.to_string();
    }
});
