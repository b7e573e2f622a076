//! The Elasticsearch `_search` body: deserialized as the server does, translated by
//! `shale_search::elastic::translate_search` for the representative index, then the
//! resulting query parsed and searched as a leaf would, its aggregations run as in the
//! `aggs` target.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shale_search::elastic::{translate_search, EsSearchBody};
use shale_search::SortBy;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = serde_json::from_slice::<EsSearchBody>(data) else {
        return;
    };
    let mapper = shale_fuzz::doc_mapper();
    match translate_search(&body, None, None, None, mapper) {
        Ok(translated) => {
            let request = translated.request;
            if let Some(sort_by) = &request.sort_by {
                let _ = SortBy::parse(sort_by);
            }
            shale_fuzz::check_query(
                &request.query,
                request.search_field.as_deref(),
                request.start_timestamp,
                request.end_timestamp,
            );
            if let Some(aggs) = &request.aggs {
                shale_fuzz::check_aggs(aggs);
            }
        }
        Err(message) => assert!(!message.is_empty(), "an error without a message"),
    }
});
