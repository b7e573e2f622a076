//! OTLP metrics as Prometheus series, named as Prometheus's own OTLP receiver names them (the
//! OpenTelemetry → Prometheus compatibility rules, with type and unit suffixes), so that
//! dashboards written for Prometheus find them:
//!
//! - metric names: characters outside `[a-zA-Z0-9:]` split the name into words joined by `_`;
//!   the unit becomes words (`s` → `seconds`, `By/s` → `bytes_per_second`, `{requests}` → none)
//!   appended unless already there; monotonic sums end in `_total`; gauges of unit `1` end in
//!   `_ratio`; a leading digit gets a `_` before it;
//! - label names: invalid characters become `_` (runs of `_` collapse; `__x__` keeps its
//!   outer underscores), a leading digit gets `key_` before it; two attributes that become one label have their values joined with `;`
//!   (in the order of their original keys);
//! - the resource: `service.namespace/service.name` (or `service.name`) is `job`,
//!   `service.instance.id` is `instance` (both win over point attributes of those names); its
//!   other attributes go to one `target_info` series (value 1, at the resource's latest
//!   point) per resource, not onto every series;
//! - histograms: `_bucket{le}` (cumulative counts, `le="+Inf"` last), `_sum`, `_count`;
//!   summaries: `{quantile}`, `_sum`, `_count`;
//! - exponential histograms: the same three series as explicit-bucket histograms, one
//!   `_bucket{le}` per exponential bucket (at most scale 3, i.e. 8 buckets per power of two,
//!   finer scales merged exactly; the zero bucket's `le` is its threshold), so that
//!   `histogram_quantile` works on them without native histograms;
//! - delta temporality (sums and histograms): stored as exported, each sample the increase
//!   over its interval, under the same names as cumulative points (as Prometheus's native
//!   delta ingestion does): `sum_over_time(x_total[1h])` is the increase over the hour;
//! - a point flagged "no recorded value" is a staleness marker.
//!
//! A metric whose name has no letter or digit is counted and reported (OTLP
//! `partial_success`), never dropped silently.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    exponential_histogram_data_point::Buckets, metric::Data, number_data_point,
    ExponentialHistogramDataPoint, HistogramDataPoint, NumberDataPoint, SummaryDataPoint,
};

use crate::{Labels, Sample, METRIC_NAME_LABEL, STALE_NAN_BITS};

/// The series of an OTLP export request, and what could not be stored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OtlpSeries {
    /// Series with their samples (one per data point, several per histogram or summary point).
    pub series: Vec<(Labels, Vec<Sample>)>,
    /// Data points not stored.
    pub rejected_points: u64,
    /// Why, one line per kind of refusal.
    pub reasons: Vec<String>,
    /// Type, description and unit of each metric family, as Prometheus's OTLP receiver
    /// records them (non-monotonic sums are gauges; exponential histograms histograms).
    pub metadata: Vec<shale_types::MetricMetadata>,
}

/// The kind of a metric, for its name's suffixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// A gauge (`_ratio` when its unit is `1`).
    Gauge,
    /// A monotonic sum (`_total`).
    Counter,
    /// A sum that may go down.
    UpDownCounter,
    /// A histogram or a summary.
    Distribution,
}

/// Prometheus's unit words for an OTLP (UCUM) unit.
fn unit_word(unit: &str) -> Option<&'static str> {
    Some(match unit {
        "d" => "days",
        "h" => "hours",
        "min" => "minutes",
        "s" => "seconds",
        "ms" => "milliseconds",
        "us" => "microseconds",
        "ns" => "nanoseconds",
        "By" => "bytes",
        "KiBy" => "kibibytes",
        "MiBy" => "mebibytes",
        "GiBy" => "gibibytes",
        "TiBy" => "tibibytes",
        "KBy" => "kilobytes",
        "MBy" => "megabytes",
        "GBy" => "gigabytes",
        "TBy" => "terabytes",
        "m" => "meters",
        "V" => "volts",
        "A" => "amperes",
        "J" => "joules",
        "W" => "watts",
        "g" => "grams",
        "Cel" => "celsius",
        "Hz" => "hertz",
        "1" => "",
        "%" => "percent",
        _ => return None,
    })
}

/// Prometheus's words for the unit after `/`.
fn per_unit_word(unit: &str) -> Option<&'static str> {
    Some(match unit {
        "s" => "second",
        "m" => "minute",
        "h" => "hour",
        "d" => "day",
        "w" => "week",
        "mo" => "month",
        "y" => "year",
        _ => return None,
    })
}

fn is_metric_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == ':'
}

/// `text` with characters outside `[a-zA-Z0-9:]` as `_`, runs of `_` as one, no leading `_`.
fn clean_unit(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let c = if is_metric_char(c) { c } else { '_' };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    out.trim_start_matches('_').to_string()
}

/// The main and "per" unit words of an OTLP unit (`By/s` → `bytes`, `per_second`); units in
/// braces (`{requests}`) are annotations and give no word.
fn unit_suffixes(unit: &str) -> (String, String) {
    let mut parts = unit.splitn(2, '/');
    let main = parts.next().unwrap_or("").trim();
    let per = parts.next().unwrap_or("").trim();
    let main = if main.is_empty() || main.contains(['{', '}']) {
        String::new()
    } else {
        unit_word(main)
            .map(str::to_string)
            .unwrap_or_else(|| main.to_string())
    };
    let per = if per.is_empty() || per.contains(['{', '}']) {
        String::new()
    } else {
        format!(
            "per_{}",
            per_unit_word(per)
                .map(str::to_string)
                .unwrap_or_else(|| per.to_string())
        )
    };
    (clean_unit(&main), clean_unit(&per))
}

/// The Prometheus name of an OTLP metric.
pub fn metric_name(name: &str, unit: &str, kind: MetricKind) -> String {
    let mut tokens: Vec<String> = name
        .split(|c: char| !is_metric_char(c))
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect();
    let (mut main, per) = unit_suffixes(unit);
    if tokens.contains(&main) {
        main.clear();
    }
    let per = if per == "per_" {
        String::new()
    } else {
        let per = per.trim_end_matches('_').to_string();
        if tokens.contains(&per) {
            String::new()
        } else {
            per
        }
    };
    if !per.is_empty() {
        main = main.trim_end_matches('_').to_string();
    }
    if !main.is_empty() {
        tokens.push(main);
    }
    if !per.is_empty() {
        tokens.push(per);
    }
    if kind == MetricKind::Counter {
        tokens.retain(|t| t != "total");
        tokens.push("total".to_string());
    }
    if unit == "1" && kind == MetricKind::Gauge {
        tokens.retain(|t| t != "ratio");
        tokens.push("ratio".to_string());
    }
    let name = tokens.join("_");
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        format!("_{name}")
    } else {
        name
    }
}

/// The Prometheus label name of an OTLP attribute key; `None` when nothing but `_` is left.
/// A reserved name (`__x__`) keeps its double underscores around its cleaned inside.
pub fn label_name(key: &str) -> Option<String> {
    let clean = |text: &str| {
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            let c = if c.is_ascii_alphanumeric() { c } else { '_' };
            if c == '_' && out.ends_with('_') {
                continue;
            }
            out.push(c);
        }
        out
    };
    let reserved = key.len() >= 4 && key.starts_with("__") && key.ends_with("__");
    let mut out = if reserved {
        format!("__{}__", clean(&key[2..key.len() - 2]))
    } else {
        clean(key)
    };
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert_str(0, "key_");
    }
    (out.chars().any(|c| c != '_')).then_some(out)
}

/// An attribute value as a label value.
fn value_text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        None => String::new(),
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => format_float(*d),
        Some(any_value::Value::BytesValue(bytes)) => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(bytes)
        }
        Some(other) => json_of(other).to_string(),
    }
}

fn json_of(value: &any_value::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        any_value::Value::StringValue(s) => J::String(s.clone()),
        any_value::Value::BoolValue(b) => J::Bool(*b),
        any_value::Value::IntValue(i) => J::from(*i),
        any_value::Value::DoubleValue(d) => J::from(*d),
        any_value::Value::BytesValue(bytes) => {
            use base64::Engine;
            J::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
        // An index into a profile's string table: meaningless in a metric, kept as a number.
        any_value::Value::StringValueStrindex(index) => J::from(*index),
        any_value::Value::ArrayValue(array) => J::Array(
            array
                .values
                .iter()
                .map(|v| v.value.as_ref().map(json_of).unwrap_or(J::Null))
                .collect(),
        ),
        any_value::Value::KvlistValue(list) => J::Object(
            list.values
                .iter()
                .map(|kv| {
                    let value = kv
                        .value
                        .as_ref()
                        .and_then(|v| v.value.as_ref())
                        .map(json_of)
                        .unwrap_or(J::Null);
                    (kv.key.clone(), value)
                })
                .collect(),
        ),
    }
}

/// A float as Prometheus writes `le` and `quantile` values (`0.5`, `10`, `+Inf`).
pub fn format_float(value: f64) -> String {
    if value == f64::INFINITY {
        "+Inf".to_string()
    } else if value == f64::NEG_INFINITY {
        "-Inf".to_string()
    } else if value.is_nan() {
        "NaN".to_string()
    } else {
        format!("{value}")
    }
}

/// Label pairs from attributes: names translated, values of colliding names joined with `;`
/// in the order of the original keys.
fn attribute_labels(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    let mut by_key: Vec<(&str, String)> = attributes
        .iter()
        .map(|kv| (kv.key.as_str(), value_text(kv.value.as_ref())))
        .collect();
    by_key.sort_by(|a, b| a.0.cmp(b.0));
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (key, value) in by_key {
        let Some(name) = label_name(key) else {
            continue;
        };
        match out.get_mut(&name) {
            Some(existing) => {
                existing.push(';');
                existing.push_str(&value);
            }
            None => {
                out.insert(name, value);
            }
        }
    }
    out
}

/// The labels a resource gives every series (`job`, `instance`), and its other attributes.
fn resource_labels(
    attributes: &[KeyValue],
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let get = |key: &str| {
        attributes
            .iter()
            .find(|kv| kv.key == key)
            .map(|kv| value_text(kv.value.as_ref()))
    };
    let mut common = BTreeMap::new();
    if let Some(service) = get("service.name") {
        let job = match get("service.namespace") {
            Some(namespace) if !namespace.is_empty() => format!("{namespace}/{service}"),
            _ => service,
        };
        common.insert("job".to_string(), job);
    }
    if let Some(instance) = get("service.instance.id") {
        common.insert("instance".to_string(), instance);
    }
    let others: Vec<KeyValue> = attributes
        .iter()
        .filter(|kv| {
            !matches!(
                kv.key.as_str(),
                "service.name" | "service.namespace" | "service.instance.id"
            )
        })
        .cloned()
        .collect();
    (common, attribute_labels(&others))
}

fn timestamp_ms(time_unix_nano: u64) -> i64 {
    (time_unix_nano / 1_000_000) as i64
}

/// Collects series by labels, in order of first appearance.
#[derive(Default)]
struct Collector {
    index: std::collections::HashMap<Labels, usize>,
    out: OtlpSeries,
}

impl Collector {
    fn push(
        &mut self,
        name: &str,
        common: &BTreeMap<String, String>,
        attributes: &BTreeMap<String, String>,
        extra: Option<(&str, String)>,
        sample: Sample,
    ) {
        // The resource's `job` and `instance` win over point attributes of those names.
        let mut pairs: BTreeMap<String, String> = attributes.clone();
        pairs.extend(common.iter().map(|(k, v)| (k.clone(), v.clone())));
        if let Some((label, value)) = extra {
            pairs.insert(label.to_string(), value);
        }
        pairs.insert(METRIC_NAME_LABEL.to_string(), name.to_string());
        let labels = Labels::new(pairs);
        let index = match self.index.get(&labels) {
            Some(index) => *index,
            None => {
                self.out.series.push((labels.clone(), Vec::new()));
                self.index.insert(labels, self.out.series.len() - 1);
                self.out.series.len() - 1
            }
        };
        self.out.series[index].1.push(sample);
    }

    /// Records a family's metadata once per request (the last description wins).
    fn describe(&mut self, metadata: shale_types::MetricMetadata) {
        match self
            .out
            .metadata
            .iter_mut()
            .find(|m| m.metric_family == metadata.metric_family)
        {
            Some(existing) => *existing = metadata,
            None => self.out.metadata.push(metadata),
        }
    }

    fn reject(&mut self, points: usize, reason: String) {
        if points == 0 {
            return;
        }
        self.out.rejected_points += points as u64;
        if !self.out.reasons.contains(&reason) {
            self.out.reasons.push(reason);
        }
    }
}

fn no_recorded_value(flags: u32) -> bool {
    flags & 1 == 1
}

fn stale() -> f64 {
    f64::from_bits(STALE_NAN_BITS)
}

fn number_value(point: &NumberDataPoint) -> f64 {
    if no_recorded_value(point.flags) {
        return stale();
    }
    match point.value {
        Some(number_data_point::Value::AsDouble(v)) => v,
        Some(number_data_point::Value::AsInt(v)) => v as f64,
        None => 0.0,
    }
}

/// The series of an export request.
pub fn translate(request: &ExportMetricsServiceRequest) -> OtlpSeries {
    let mut collector = Collector::default();
    for resource_metrics in &request.resource_metrics {
        let resource_attributes = resource_metrics
            .resource
            .as_ref()
            .map(|r| r.attributes.as_slice())
            .unwrap_or(&[]);
        let (common, others) = resource_labels(resource_attributes);
        let mut latest_ms: Option<i64> = None;
        for scope_metrics in &resource_metrics.scope_metrics {
            for metric in &scope_metrics.metrics {
                let Some(data) = &metric.data else {
                    continue;
                };
                let (kind, points) = match data {
                    Data::Gauge(g) => (MetricKind::Gauge, g.data_points.len()),
                    Data::Sum(s) if s.is_monotonic => (MetricKind::Counter, s.data_points.len()),
                    Data::Sum(s) => (MetricKind::UpDownCounter, s.data_points.len()),
                    Data::Histogram(h) => (MetricKind::Distribution, h.data_points.len()),
                    Data::Summary(s) => (MetricKind::Distribution, s.data_points.len()),
                    Data::ExponentialHistogram(h) => {
                        (MetricKind::Distribution, h.data_points.len())
                    }
                };
                let name = metric_name(&metric.name, &metric.unit, kind);
                if !crate::remote_write::is_valid_metric_name(&name) {
                    collector.reject(
                        points,
                        format!(
                            "metric {:?}: no Prometheus name can be made of it (it needs a \
                             letter or a digit)",
                            metric.name
                        ),
                    );
                    continue;
                }
                let metric_type = match data {
                    Data::Gauge(_) => "gauge",
                    Data::Sum(s) if s.is_monotonic => "counter",
                    Data::Sum(_) => "gauge",
                    Data::Histogram(_) | Data::ExponentialHistogram(_) => "histogram",
                    Data::Summary(_) => "summary",
                };
                collector.describe(shale_types::MetricMetadata {
                    metric_family: name.clone(),
                    metric_type: metric_type.to_string(),
                    help: metric.description.clone(),
                    unit: metric.unit.clone(),
                });
                let mut seen = |ms: i64| latest_ms = Some(latest_ms.map_or(ms, |l| l.max(ms)));
                match data {
                    Data::Gauge(gauge) => {
                        for point in &gauge.data_points {
                            let ms = timestamp_ms(point.time_unix_nano);
                            seen(ms);
                            let value = number_value(point);
                            let attributes = attribute_labels(&point.attributes);
                            collector.push(&name, &common, &attributes, None, sample(ms, value));
                        }
                    }
                    Data::Sum(sum) => {
                        for point in &sum.data_points {
                            let ms = timestamp_ms(point.time_unix_nano);
                            seen(ms);
                            let attributes = attribute_labels(&point.attributes);
                            collector.push(
                                &name,
                                &common,
                                &attributes,
                                None,
                                sample(ms, number_value(point)),
                            );
                        }
                    }
                    Data::Histogram(histogram) => {
                        for point in &histogram.data_points {
                            seen(timestamp_ms(point.time_unix_nano));
                            push_histogram(&mut collector, &name, &common, point);
                        }
                    }
                    Data::Summary(summary) => {
                        for point in &summary.data_points {
                            seen(timestamp_ms(point.time_unix_nano));
                            push_summary(&mut collector, &name, &common, point);
                        }
                    }
                    Data::ExponentialHistogram(histogram) => {
                        for point in &histogram.data_points {
                            seen(timestamp_ms(point.time_unix_nano));
                            push_exponential_histogram(&mut collector, &name, &common, point);
                        }
                    }
                }
            }
        }
        // One `target_info` per resource with attributes beyond the service's identity.
        if let (Some(ms), false) = (latest_ms, others.is_empty()) {
            collector.push("target_info", &common, &others, None, sample(ms, 1.0));
        }
    }
    collector.out
}

fn sample(timestamp_ms: i64, value: f64) -> Sample {
    Sample {
        timestamp_ms,
        value,
    }
}

/// A point's time (ms), its attribute labels, and how its values are stored (a staleness
/// marker when it has no recorded value).
fn point_context(
    time_unix_nano: u64,
    attributes: &[KeyValue],
    flags: u32,
) -> (i64, BTreeMap<String, String>, impl Fn(f64) -> f64) {
    let stale = no_recorded_value(flags);
    (
        timestamp_ms(time_unix_nano),
        attribute_labels(attributes),
        move |v: f64| if stale { self::stale() } else { v },
    )
}

/// The `_sum` (when given) and `_count` series of a histogram or summary point.
fn push_sum_and_count(
    collector: &mut Collector,
    name: &str,
    common: &BTreeMap<String, String>,
    attributes: &BTreeMap<String, String>,
    ms: i64,
    sum: Option<f64>,
    count: f64,
) {
    if let Some(sum) = sum {
        collector.push(
            &format!("{name}_sum"),
            common,
            attributes,
            None,
            sample(ms, sum),
        );
    }
    collector.push(
        &format!("{name}_count"),
        common,
        attributes,
        None,
        sample(ms, count),
    );
}

fn push_histogram(
    collector: &mut Collector,
    name: &str,
    common: &BTreeMap<String, String>,
    point: &HistogramDataPoint,
) {
    let (ms, attributes, value) =
        point_context(point.time_unix_nano, &point.attributes, point.flags);
    push_sum_and_count(
        collector,
        name,
        common,
        &attributes,
        ms,
        point.sum.map(&value),
        value(point.count as f64),
    );
    let bucket = format!("{name}_bucket");
    let mut cumulative = 0u64;
    for (i, bound) in point.explicit_bounds.iter().enumerate() {
        cumulative += point.bucket_counts.get(i).copied().unwrap_or(0);
        collector.push(
            &bucket,
            common,
            &attributes,
            Some(("le", format_float(*bound))),
            sample(ms, value(cumulative as f64)),
        );
    }
    collector.push(
        &bucket,
        common,
        &attributes,
        Some(("le", "+Inf".to_string())),
        sample(ms, value(point.count as f64)),
    );
}

/// The finest scale exponential buckets are kept at: 2^(1/8) between bounds, about 9 %.
const MAX_EXPONENTIAL_SCALE: i32 = 3;

/// The upper bound of exponential bucket `index` at `scale`: `2^((index + 1) / 2^scale)`.
fn exponential_upper_bound(index: i64, scale: i32) -> f64 {
    if scale <= 0 {
        ((index + 1) as f64 * f64::from(1u32 << (-scale).min(31))).exp2()
    } else {
        ((index + 1) as f64 / f64::from(1u32 << scale)).exp2()
    }
}

/// The counts of `buckets` by index at the scale reduced by `shift` (exact: a bucket at a
/// coarser scale is the union of `2^shift` adjacent finer ones).
fn downscaled(buckets: Option<&Buckets>, shift: u32) -> BTreeMap<i64, u64> {
    let mut out = BTreeMap::new();
    if let Some(buckets) = buckets {
        for (k, count) in buckets.bucket_counts.iter().enumerate() {
            let index = (i64::from(buckets.offset) + k as i64) >> shift.min(63);
            *out.entry(index).or_insert(0) += count;
        }
    }
    out
}

/// An exponential histogram point as `_bucket{le}` (cumulative, negative buckets first, then
/// the zero bucket, then positive ones, `+Inf` last), `_sum` and `_count`.
fn push_exponential_histogram(
    collector: &mut Collector,
    name: &str,
    common: &BTreeMap<String, String>,
    point: &ExponentialHistogramDataPoint,
) {
    let (ms, attributes, value) =
        point_context(point.time_unix_nano, &point.attributes, point.flags);
    push_sum_and_count(
        collector,
        name,
        common,
        &attributes,
        ms,
        point.sum.map(&value),
        value(point.count as f64),
    );
    let scale = point.scale.min(MAX_EXPONENTIAL_SCALE);
    let shift = (point.scale - scale) as u32;
    let negative = downscaled(point.negative.as_ref(), shift);
    let positive = downscaled(point.positive.as_ref(), shift);
    let bucket = format!("{name}_bucket");
    let mut cumulative = 0u64;
    let mut push = |collector: &mut Collector, le: f64, count: u64| {
        cumulative += count;
        collector.push(
            &bucket,
            common,
            &attributes,
            Some(("le", format_float(le))),
            sample(ms, value(cumulative as f64)),
        );
    };
    // Negative bucket `i` holds values in [-base^(i+1), -base^i): its upper bound is -base^i,
    // rising as the index falls.
    for (index, count) in negative.iter().rev() {
        push(
            collector,
            -exponential_upper_bound(index - 1, scale),
            *count,
        );
    }
    if point.zero_count > 0 || !negative.is_empty() {
        push(collector, point.zero_threshold.max(0.0), point.zero_count);
    }
    for (index, count) in &positive {
        push(collector, exponential_upper_bound(*index, scale), *count);
    }
    collector.push(
        &bucket,
        common,
        &attributes,
        Some(("le", "+Inf".to_string())),
        sample(ms, value(point.count as f64)),
    );
}

fn push_summary(
    collector: &mut Collector,
    name: &str,
    common: &BTreeMap<String, String>,
    point: &SummaryDataPoint,
) {
    let (ms, attributes, value) =
        point_context(point.time_unix_nano, &point.attributes, point.flags);
    push_sum_and_count(
        collector,
        name,
        common,
        &attributes,
        ms,
        Some(value(point.sum)),
        value(point.count as f64),
    );
    for quantile in &point.quantile_values {
        collector.push(
            name,
            common,
            &attributes,
            Some(("quantile", format_float(quantile.quantile))),
            sample(ms, value(quantile.value)),
        );
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::metrics::v1::{
        metric, summary_data_point::ValueAtQuantile, AggregationTemporality, ExponentialHistogram,
        Gauge, Histogram, Metric, ResourceMetrics, ScopeMetrics, Sum, Summary,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;

    use super::*;

    #[test]
    fn metric_names_follow_prometheus() {
        let cases = [
            (
                "http.server.duration",
                "s",
                MetricKind::Distribution,
                "http_server_duration_seconds",
            ),
            (
                "requests.count",
                "1",
                MetricKind::Counter,
                "requests_count_total",
            ),
            (
                "memory.usage",
                "By",
                MetricKind::Gauge,
                "memory_usage_bytes",
            ),
            (
                "system.cpu.utilization",
                "1",
                MetricKind::Gauge,
                "system_cpu_utilization_ratio",
            ),
            (
                "net.io",
                "By/s",
                MetricKind::Gauge,
                "net_io_bytes_per_second",
            ),
            (
                "http.requests",
                "{requests}",
                MetricKind::Counter,
                "http_requests_total",
            ),
            ("3d.renders", "", MetricKind::Gauge, "_3d_renders"),
            (
                "total.requests_total",
                "",
                MetricKind::Counter,
                "requests_total",
            ),
            ("cpu.seconds", "s", MetricKind::Counter, "cpu_seconds_total"),
            (
                "queue.size",
                "{items}",
                MetricKind::UpDownCounter,
                "queue_size",
            ),
            (
                "disk.ops",
                "1/s",
                MetricKind::Counter,
                "disk_ops_per_second_total",
            ),
            ("weird", "foo bar", MetricKind::Gauge, "weird_foo_bar"),
        ];
        for (name, unit, kind, expected) in cases {
            assert_eq!(
                metric_name(name, unit, kind),
                expected,
                "{name} [{unit}] {kind:?}"
            );
        }
    }

    #[test]
    fn label_names_follow_prometheus() {
        assert_eq!(label_name("http.method").as_deref(), Some("http_method"));
        assert_eq!(label_name("123invalid").as_deref(), Some("key_123invalid"));
        assert_eq!(label_name("__reserved__").as_deref(), Some("__reserved__"));
        assert_eq!(label_name("a..b").as_deref(), Some("a_b"));
        assert_eq!(label_name("..."), None);
        assert_eq!(format_float(0.005), "0.005");
        assert_eq!(format_float(10.0), "10");
        assert_eq!(format_float(f64::INFINITY), "+Inf");
    }

    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.to_string(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }

    fn text(value: &str) -> Value {
        Value::StringValue(value.to_string())
    }

    fn request(metrics: Vec<Metric>) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(Resource {
                    attributes: vec![
                        kv("service.name", text("checkout")),
                        kv("service.namespace", text("shop")),
                        kv("service.instance.id", text("pod-1")),
                        kv("host.name", text("node-7")),
                    ],
                    ..Default::default()
                }),
                scope_metrics: vec![ScopeMetrics {
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn metric(name: &str, unit: &str, data: metric::Data) -> Metric {
        Metric {
            name: name.to_string(),
            unit: unit.to_string(),
            data: Some(data),
            ..Default::default()
        }
    }

    fn point(ms: u64, value: f64, attributes: Vec<KeyValue>) -> NumberDataPoint {
        NumberDataPoint {
            attributes,
            time_unix_nano: ms * 1_000_000,
            value: Some(number_data_point::Value::AsDouble(value)),
            ..Default::default()
        }
    }

    fn find<'a>(series: &'a OtlpSeries, labels: &str) -> &'a [Sample] {
        series
            .series
            .iter()
            .find(|(l, _)| {
                let text: Vec<String> = l.iter().map(|(n, v)| format!("{n}={v}")).collect();
                text.join(",") == labels
            })
            .map(|(_, s)| s.as_slice())
            .unwrap_or_else(|| panic!("no series {labels} in {:#?}", series.series))
    }

    #[test]
    fn every_kind_becomes_prometheus_series() {
        let series = translate(&request(vec![
            metric(
                "http.requests",
                "1",
                metric::Data::Sum(Sum {
                    data_points: vec![
                        point(1_000, 5.0, vec![kv("http.method", text("GET"))]),
                        point(2_000, 7.0, vec![kv("http.method", text("GET"))]),
                    ],
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    is_monotonic: true,
                }),
            ),
            metric(
                "queue.depth",
                "",
                metric::Data::Gauge(Gauge {
                    data_points: vec![NumberDataPoint {
                        flags: 1,
                        ..point(3_000, 0.0, vec![kv("job", text("ignored"))])
                    }],
                }),
            ),
            metric(
                "rpc.duration",
                "ms",
                metric::Data::Histogram(Histogram {
                    data_points: vec![HistogramDataPoint {
                        time_unix_nano: 2_000_000_000,
                        count: 6,
                        sum: Some(123.5),
                        bucket_counts: vec![1, 2, 3],
                        explicit_bounds: vec![10.0, 100.5],
                        ..Default::default()
                    }],
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                }),
            ),
            metric(
                "gc.pause",
                "s",
                metric::Data::Summary(Summary {
                    data_points: vec![SummaryDataPoint {
                        time_unix_nano: 2_000_000_000,
                        count: 4,
                        sum: 0.5,
                        quantile_values: vec![ValueAtQuantile {
                            quantile: 0.99,
                            value: 0.25,
                        }],
                        ..Default::default()
                    }],
                }),
            ),
            metric(
                "bytes.sent",
                "By",
                metric::Data::Sum(Sum {
                    data_points: vec![point(1_000, 1.0, vec![])],
                    aggregation_temporality: AggregationTemporality::Delta as i32,
                    is_monotonic: true,
                }),
            ),
        ]));
        let job = "instance=pod-1,job=shop/checkout";
        assert_eq!(
            find(
                &series,
                &format!("__name__=http_requests_total,http_method=GET,{job}")
            ),
            &[sample(1_000, 5.0), sample(2_000, 7.0)]
        );
        let stale = find(&series, &format!("__name__=queue_depth,{job}"));
        assert!(stale[0].is_stale(), "no recorded value: a staleness marker");
        assert_eq!(
            find(
                &series,
                &format!("__name__=rpc_duration_milliseconds_bucket,{job},le=10")
            ),
            &[sample(2_000, 1.0)]
        );
        assert_eq!(
            find(
                &series,
                &format!("__name__=rpc_duration_milliseconds_bucket,{job},le=100.5")
            ),
            &[sample(2_000, 3.0)]
        );
        assert_eq!(
            find(
                &series,
                &format!("__name__=rpc_duration_milliseconds_bucket,{job},le=+Inf")
            ),
            &[sample(2_000, 6.0)]
        );
        assert_eq!(
            find(
                &series,
                &format!("__name__=rpc_duration_milliseconds_sum,{job}")
            ),
            &[sample(2_000, 123.5)]
        );
        assert_eq!(
            find(
                &series,
                &format!("__name__=rpc_duration_milliseconds_count,{job}")
            ),
            &[sample(2_000, 6.0)]
        );
        assert_eq!(
            find(
                &series,
                &format!("__name__=gc_pause_seconds,{job},quantile=0.99")
            ),
            &[sample(2_000, 0.25)]
        );
        assert_eq!(
            find(&series, &format!("__name__=gc_pause_seconds_count,{job}")),
            &[sample(2_000, 4.0)]
        );
        assert_eq!(
            find(
                &series,
                &format!("__name__=target_info,host_name=node-7,{job}")
            ),
            &[sample(3_000, 1.0)],
            "the resource's other attributes, at its latest point"
        );
        assert_eq!(
            find(&series, &format!("__name__=bytes_sent_total,{job}")),
            &[sample(1_000, 1.0)],
            "a delta point is stored as exported"
        );
        assert_eq!(series.rejected_points, 0, "{:?}", series.reasons);
    }

    #[test]
    fn exponential_histograms_become_classic_buckets() {
        // Scale 4 (16 buckets per power of two) is merged to scale 3: positive buckets 15..=18
        // at scale 4 are 7, 8, 8, 9 at scale 3, bounds 2^(8/8), 2^(9/8), 2^(10/8).
        let series = translate(&request(vec![metric(
            "rpc.size",
            "By",
            metric::Data::ExponentialHistogram(ExponentialHistogram {
                data_points: vec![ExponentialHistogramDataPoint {
                    time_unix_nano: 5_000_000_000,
                    count: 15,
                    sum: Some(-1.5),
                    scale: 4,
                    zero_count: 2,
                    zero_threshold: 0.001,
                    positive: Some(Buckets {
                        offset: 15,
                        bucket_counts: vec![1, 2, 3, 4],
                    }),
                    negative: Some(Buckets {
                        offset: -1,
                        bucket_counts: vec![3],
                    }),
                    ..Default::default()
                }],
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
            }),
        )]));
        let job = "instance=pod-1,job=shop/checkout";
        let bucket = |le: &str| {
            find(
                &series,
                &format!("__name__=rpc_size_bytes_bucket,{job},le={le}"),
            )[0]
            .value
        };
        // The negative bucket -1 at scale 4 is -1 at scale 3: values in [-1, -2^(-1/8)).
        assert_eq!(bucket(&format_float(-(-0.125f64).exp2())), 3.0);
        assert_eq!(bucket("0.001"), 5.0, "the zero bucket");
        assert_eq!(
            bucket("2"),
            6.0,
            "scale-4 bucket 15 merged into scale-3 bucket 7"
        );
        assert_eq!(bucket(&format_float(1.125f64.exp2())), 11.0);
        assert_eq!(bucket(&format_float(1.25f64.exp2())), 15.0);
        assert_eq!(bucket("+Inf"), 15.0, "the point's count");
        assert_eq!(
            find(&series, &format!("__name__=rpc_size_bytes_count,{job}")),
            &[sample(5_000, 15.0)]
        );
        assert_eq!(
            find(&series, &format!("__name__=rpc_size_bytes_sum,{job}")),
            &[sample(5_000, -1.5)]
        );
        assert_eq!(series.rejected_points, 0);
    }

    #[test]
    fn colliding_attribute_names_join_their_values() {
        let series = translate(&request(vec![metric(
            "m",
            "",
            metric::Data::Gauge(Gauge {
                data_points: vec![point(
                    1_000,
                    1.0,
                    vec![
                        kv("a.b", text("x")),
                        kv("a_b", text("y")),
                        kv("n", Value::IntValue(3)),
                    ],
                )],
            }),
        )]));
        find(
            &series,
            "__name__=m,a_b=x;y,instance=pod-1,job=shop/checkout,n=3",
        );
    }
}
