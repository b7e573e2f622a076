//! SQL as the node plans it before reading any index: `plan_without_tables` (the nesting
//! bounds, DataFusion's parser, its planner and optimizer, on the SQL runtime's threads) on
//! arbitrary strings; deep inputs are seeds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(sql) = std::str::from_utf8(data) else {
        return;
    };
    // Errors are answers (unknown tables among them); only a crash fails.
    let _ = futures::executor::block_on(shale_sql::plan_without_tables(sql));
});
