//! OTLP/HTTP export bodies: `shale_server::otlp::decode_documents` on arbitrary bytes as
//! protobuf logs and traces (and as OTLP/JSON when the body looks like JSON), the documents
//! parsed by the doc mapper of the default OTel index, and the response encoded; the same
//! bytes as a metrics export (`decode_metrics`, protobuf and OTLP/JSON), translated into
//! Prometheus series, and its response.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use shale_index::DocMapper;
use shale_server::otlp::{decode_documents, decode_metrics, encode_response, Encoding, Signal};

/// The doc mapper of a documents signal's default index (`None` for metrics).
fn mapper(signal: Signal) -> Option<&'static DocMapper> {
    static LOGS: OnceLock<DocMapper> = OnceLock::new();
    static TRACES: OnceLock<DocMapper> = OnceLock::new();
    let cell = match signal {
        Signal::Logs => &LOGS,
        Signal::Traces => &TRACES,
        Signal::Metrics => return None,
    };
    Some(cell.get_or_init(|| {
        DocMapper::for_index(&signal.index_config().expect("the OTel index config"))
            .expect("the OTel doc mapper")
    }))
}

fuzz_target!(|data: &[u8]| {
    let json = data.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let encodings: &[Encoding] = if json {
        &[Encoding::Protobuf, Encoding::Json]
    } else {
        &[Encoding::Protobuf]
    };
    for &encoding in encodings {
        match decode_metrics(encoding, data) {
            Ok(series) => {
                encode_response(
                    Signal::Metrics,
                    encoding,
                    series.rejected_points,
                    &series.reasons.join("; "),
                )
                .expect("a response encodes");
            }
            Err(err) => assert!(!err.to_string().is_empty(), "an error without a message"),
        }
    }
    for signal in [Signal::Logs, Signal::Traces] {
        let Some(mapper) = mapper(signal) else {
            continue;
        };
        for &encoding in encodings {
            match decode_documents(signal, encoding, data, 1_700_000_000_000_000_000) {
                Ok(documents) => {
                    for doc in &documents.docs {
                        let _ = mapper.parse_doc(doc);
                    }
                    encode_response(
                        signal,
                        encoding,
                        documents.num_rejected,
                        &documents.error_message,
                    )
                    .expect("a response encodes");
                }
                Err(err) => assert!(!err.to_string().is_empty(), "an error without a message"),
            }
        }
    }
});
