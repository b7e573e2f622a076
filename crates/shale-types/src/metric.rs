//! Metric metadata: what Prometheus remote write and OTLP say about a metric family besides
//! its samples (its type, help text and unit), answered by the Prometheus `metadata` API.

use serde::{Deserialize, Serialize};

/// The type, help and unit of a metric family of a metrics index.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MetricMetadata {
    /// The family name (`http_requests_total`, or `http_latency_seconds` for the
    /// `_bucket`/`_sum`/`_count` series of a histogram).
    pub metric_family: String,
    /// Prometheus's type name: `counter`, `gauge`, `histogram`, `gaugehistogram`, `summary`,
    /// `info`, `stateset` or `unknown`.
    pub metric_type: String,
    /// The help text (OTLP: the description).
    pub help: String,
    /// The unit (empty when none).
    pub unit: String,
}
