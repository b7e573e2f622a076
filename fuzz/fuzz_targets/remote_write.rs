//! Prometheus remote write bodies: `decode_remote_write` on arbitrary bytes (snappy, then
//! protobuf), and the protobuf layer directly (mutations of compressed bytes rarely
//! decompress); what decodes is written as a metrics split and read back exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use shale_metrics::remote_write::{convert, decode_remote_write, WriteRequest};

fuzz_target!(|data: &[u8]| {
    if let Err(err) = decode_remote_write(data) {
        assert!(!err.to_string().is_empty(), "an error without a message");
    }
    let Ok(request) = WriteRequest::decode(data) else {
        return;
    };
    let decoded = convert(request);
    assert_eq!(
        decoded.num_samples,
        decoded.series.iter().map(|(_, s)| s.len() as u64).sum::<u64>()
    );
    shale_fuzz::metrics_round_trip(&decoded.series);
});
