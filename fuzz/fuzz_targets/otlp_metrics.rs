//! OTLP metrics export bodies (protobuf): translated to Prometheus series by
//! `shale_metrics::otlp::translate`, then written as a metrics split and read back exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = ExportMetricsServiceRequest::decode(data) else {
        return;
    };
    let translated = shale_metrics::otlp::translate(&request);
    assert_eq!(translated.rejected_points == 0, translated.reasons.is_empty());
    for (labels, _) in &translated.series {
        assert!(
            shale_metrics::remote_write::is_valid_metric_name(labels.metric_name()),
            "an invalid metric name: {labels:?}"
        );
        for (name, _) in labels.iter() {
            assert!(
                shale_metrics::remote_write::is_valid_label_name(name),
                "an invalid label name: {name:?}"
            );
        }
    }
    shale_fuzz::metrics_round_trip(&translated.series);
});
