//! The Elasticsearch `_bulk` body: `shale_server::elastic::parse_bulk_body` (what the handler
//! calls) on arbitrary bytes, with and without an index in the URL; the documents of the
//! items are parsed by the representative index's doc mapper, as ingest does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shale_server::elastic::parse_bulk_body;

fuzz_target!(|data: &[u8]| {
    let body = bytes::Bytes::copy_from_slice(data);
    for default_index in [None, Some("fuzz-logs")] {
        match parse_bulk_body(&body, default_index) {
            Ok(items) => {
                for item in items {
                    match item.outcome {
                        Ok(doc) => {
                            let _ = shale_fuzz::doc_mapper().parse_doc(&doc);
                        }
                        Err((status, kind, reason)) => {
                            assert!((400..600).contains(&status));
                            assert!(!kind.is_empty() && !reason.is_empty());
                        }
                    }
                }
            }
            Err(err) => {
                assert_eq!(err.status.as_u16(), 400);
                assert!(!err.reason.is_empty(), "an error without a message");
            }
        }
    }
});
