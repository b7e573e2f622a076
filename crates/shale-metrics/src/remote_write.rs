//! Prometheus remote write 1.0 bodies: a snappy-compressed (block format) protobuf
//! `prometheus.WriteRequest`, decoded into series and samples.
//!
//! Every series is checked as Prometheus checks it: a metric name, label names of
//! `[a-zA-Z_][a-zA-Z0-9_]*`, no name twice, values valid UTF-8 (protobuf strings). A series
//! that fails is left out and counted with its reason, so the caller can store the others and
//! say what it refused. Native histograms (field 4) are not stored yet: they are counted.

use prost::Message;

use crate::{Labels, Sample, METRIC_NAME_LABEL};

/// `prometheus.WriteRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    /// The series and their samples.
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
    /// Type, help and unit of metric families.
    #[prost(message, repeated, tag = "3")]
    pub metadata: Vec<MetricMetadata>,
}

/// `prometheus.TimeSeries`.
#[derive(Clone, PartialEq, Message)]
pub struct TimeSeries {
    /// The labels, `__name__` included.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<ProtoSample>,
    /// Exemplars (not stored).
    #[prost(message, repeated, tag = "3")]
    pub exemplars: Vec<Exemplar>,
    /// Native histogram samples (not stored yet; counted as refused).
    #[prost(message, repeated, tag = "4")]
    pub histograms: Vec<NativeHistogram>,
}

/// `prometheus.Label`.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    /// The name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `prometheus.Sample`.
#[derive(Clone, Copy, PartialEq, Message)]
pub struct ProtoSample {
    /// The value.
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// `prometheus.Exemplar`.
#[derive(Clone, PartialEq, Message)]
pub struct Exemplar {
    /// Its labels (a trace id, usually).
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// The value.
    #[prost(double, tag = "2")]
    pub value: f64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "3")]
    pub timestamp: i64,
}

/// `prometheus.MetricMetadata`.
#[derive(Clone, PartialEq, Message)]
pub struct MetricMetadata {
    /// `prometheus.MetricMetadata.MetricType`: 0 unknown, 1 counter, 2 gauge, 3 histogram,
    /// 4 gauge histogram, 5 summary, 6 info, 7 state set.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    /// The metric family.
    #[prost(string, tag = "2")]
    pub metric_family_name: String,
    /// Its help text.
    #[prost(string, tag = "4")]
    pub help: String,
    /// Its unit.
    #[prost(string, tag = "5")]
    pub unit: String,
}

/// `prometheus.Histogram` (a native histogram sample): counted, its fields not decoded.
#[derive(Clone, Copy, PartialEq, Message)]
pub struct NativeHistogram {}

/// A decoded write request: the series to store and what was refused.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodedWrite {
    /// Valid series with their samples, in request order.
    pub series: Vec<(Labels, Vec<Sample>)>,
    /// Samples of the valid series.
    pub num_samples: u64,
    /// Series refused, with the first few reasons (`labels: why`).
    pub refused_series: u64,
    /// Native histogram samples, not stored.
    pub refused_histograms: u64,
    /// Up to ten reasons for refusals, for the response.
    pub reasons: Vec<String>,
    /// The metric metadata the request carried (Prometheus sends it in requests of its own).
    pub metadata: Vec<shale_types::MetricMetadata>,
}

/// Prometheus's name of a `prometheus.MetricMetadata.MetricType`.
fn metric_type_name(code: i32) -> &'static str {
    match code {
        1 => "counter",
        2 => "gauge",
        3 => "histogram",
        4 => "gaugehistogram",
        5 => "summary",
        6 => "info",
        7 => "stateset",
        _ => "unknown",
    }
}

/// Why a body is not a remote write request at all.
#[derive(Debug, thiserror::Error)]
pub enum RemoteWriteError {
    /// Not snappy block-compressed data.
    #[error("the body is not snappy-compressed (remote write 1.0 sends snappy block format): {0}")]
    Snappy(String),
    /// Not a `prometheus.WriteRequest`.
    #[error("the body is not a prometheus.WriteRequest protobuf: {0}")]
    Protobuf(String),
}

/// Decodes a remote write body (snappy block format around a protobuf `WriteRequest`).
pub fn decode_remote_write(body: &[u8]) -> Result<DecodedWrite, RemoteWriteError> {
    let raw = snap::raw::Decoder::new()
        .decompress_vec(body)
        .map_err(|err| RemoteWriteError::Snappy(err.to_string()))?;
    let request = WriteRequest::decode(raw.as_slice())
        .map_err(|err| RemoteWriteError::Protobuf(err.to_string()))?;
    Ok(convert(request))
}

/// Checks and converts the series of a decoded request.
pub fn convert(request: WriteRequest) -> DecodedWrite {
    let mut out = DecodedWrite {
        metadata: request
            .metadata
            .iter()
            .filter(|m| is_valid_metric_name(&m.metric_family_name))
            .map(|m| shale_types::MetricMetadata {
                metric_family: m.metric_family_name.clone(),
                metric_type: metric_type_name(m.r#type).to_string(),
                help: m.help.clone(),
                unit: m.unit.clone(),
            })
            .collect(),
        ..DecodedWrite::default()
    };
    for series in request.timeseries {
        out.refused_histograms += series.histograms.len() as u64;
        if series.samples.is_empty() {
            continue;
        }
        match check_labels(&series.labels) {
            Ok(labels) => {
                out.num_samples += series.samples.len() as u64;
                let samples = series
                    .samples
                    .iter()
                    .map(|s| Sample {
                        timestamp_ms: s.timestamp,
                        value: s.value,
                    })
                    .collect();
                out.series.push((labels, samples));
            }
            Err(reason) => {
                out.refused_series += 1;
                if out.reasons.len() < 10 {
                    out.reasons.push(reason);
                }
            }
        }
    }
    if out.refused_histograms > 0 && out.reasons.len() < 10 {
        out.reasons.push(format!(
            "{} native histogram samples: not supported yet, send classic histograms",
            out.refused_histograms
        ));
    }
    out
}

/// Whether `name` is a valid Prometheus label name.
pub fn is_valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `name` is a valid Prometheus metric name.
pub fn is_valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn check_labels(labels: &[Label]) -> Result<Labels, String> {
    let describe = || {
        let pairs: Vec<String> = labels
            .iter()
            .map(|l| format!("{}={:?}", l.name, l.value))
            .collect();
        format!("{{{}}}", pairs.join(", "))
    };
    let mut seen = std::collections::HashSet::new();
    for label in labels {
        if !is_valid_label_name(&label.name) {
            return Err(format!(
                "{}: invalid label name {:?}",
                describe(),
                label.name
            ));
        }
        if !seen.insert(label.name.as_str()) {
            return Err(format!(
                "{}: label {:?} given twice",
                describe(),
                label.name
            ));
        }
    }
    let parsed = Labels::new(labels.iter().map(|l| (l.name.clone(), l.value.clone())));
    let name = parsed.metric_name();
    if name.is_empty() {
        return Err(format!(
            "{}: no metric name (`{METRIC_NAME_LABEL}`)",
            describe()
        ));
    }
    if !is_valid_metric_name(name) {
        return Err(format!("{}: invalid metric name {name:?}", describe()));
    }
    Ok(parsed)
}

/// Encodes a request as a remote write sender does (for tests and benchmarks).
pub fn encode_remote_write(request: &WriteRequest) -> Vec<u8> {
    let raw = request.encode_to_vec();
    snap::raw::Encoder::new()
        .compress_vec(&raw)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(name: &str, value: &str) -> Label {
        Label {
            name: name.to_string(),
            value: value.to_string(),
        }
    }

    fn series(labels: Vec<Label>, samples: &[(i64, f64)]) -> TimeSeries {
        TimeSeries {
            labels,
            samples: samples
                .iter()
                .map(|(t, v)| ProtoSample {
                    timestamp: *t,
                    value: *v,
                })
                .collect(),
            exemplars: Vec::new(),
            histograms: Vec::new(),
        }
    }

    #[test]
    fn valid_series_are_kept_and_invalid_ones_counted() {
        let request = WriteRequest {
            timeseries: vec![
                series(
                    vec![label("__name__", "up"), label("job", "api")],
                    &[(1_000, 1.0), (2_000, 0.0)],
                ),
                series(vec![label("job", "api")], &[(1_000, 1.0)]),
                series(
                    vec![label("__name__", "up"), label("1bad", "x")],
                    &[(1_000, 1.0)],
                ),
                series(
                    vec![label("__name__", "up"), label("a", "x"), label("a", "y")],
                    &[(1_000, 1.0)],
                ),
                series(vec![label("__name__", "bad-name")], &[(1_000, 1.0)]),
            ],
            metadata: Vec::new(),
        };
        let decoded = decode_remote_write(&encode_remote_write(&request)).expect("decodes");
        assert_eq!(decoded.series.len(), 1);
        assert_eq!(decoded.num_samples, 2);
        assert_eq!(decoded.refused_series, 4);
        assert_eq!(decoded.reasons.len(), 4);
        assert!(
            decoded.reasons[0].contains("no metric name"),
            "{:?}",
            decoded.reasons
        );
        assert!(decoded.reasons[1].contains("invalid label name \"1bad\""));
        assert!(decoded.reasons[2].contains("given twice"));
        assert!(decoded.reasons[3].contains("invalid metric name"));
        let (labels, samples) = &decoded.series[0];
        assert_eq!(labels.get("job"), Some("api"));
        assert_eq!(
            samples[1],
            Sample {
                timestamp_ms: 2_000,
                value: 0.0
            }
        );
    }

    #[test]
    fn bodies_that_are_not_remote_write_are_errors() {
        let err = decode_remote_write(b"{\"json\": true}").expect_err("not snappy");
        assert!(err.to_string().contains("snappy"), "{err}");
        let not_proto = snap::raw::Encoder::new()
            .compress_vec(&[0xFF, 0xFF, 0xFF])
            .expect("compresses");
        let err = decode_remote_write(&not_proto).expect_err("not protobuf");
        assert!(err.to_string().contains("WriteRequest"), "{err}");
    }
}
