//! Shale's query language: `DocMapper::parse_query` on arbitrary strings, against the
//! representative index, then the parsed query searched on its splits (many failures only
//! show when the weight is built or the postings are read).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    // A line starting with `fields=a,b` names the search fields, as `search_field=` does.
    let (fields, query) = match query.strip_prefix("fields=") {
        Some(rest) => {
            let (fields, query) = rest.split_once('\n').unwrap_or((rest, ""));
            let fields: Vec<String> = fields.split(',').map(str::to_string).collect();
            (Some(fields), query)
        }
        None => (None, query),
    };
    shale_fuzz::check_query(query, fields.as_deref(), None, None);
});
