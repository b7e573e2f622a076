//! OpenTelemetry (OTLP) ingest, as Quickwit offers it: the configs of the `otel-logs-v0_9` and
//! `otel-traces-v0_9` indexes (and of the metrics index `otel-metrics-v0_9`), the decoding of OTLP export requests (protobuf or OTLP/JSON),
//! their conversion into those indexes' JSON documents (Quickwit's field names and values), and
//! the export responses. Pure functions: the HTTP handlers are in [`crate::otlp_api`].

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as OtlpValue;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{Map, Number, Value};
use shale_config::{ConfigError, IndexConfig};

/// The index OTLP logs go to by default (Quickwit's).
pub const OTEL_LOGS_INDEX_ID: &str = "otel-logs-v0_9";
/// The index OTLP metrics, Prometheus remote write and the Prometheus API use by default.
pub const OTEL_METRICS_INDEX_ID: &str = "otel-metrics-v0_9";

/// The `otel-metrics-v0_9` index config: a metrics index sorted by job and instance (what
/// OTLP's `service.namespace`/`service.name` and `service.instance.id` become), committed
/// every 10 s so that samples are queryable soon after they arrive.
const OTEL_METRICS_INDEX_CONFIG: &str = r#"
version: 0.9
index_id: otel-metrics-v0_9
metrics:
  sort_labels: [job, instance]
  time_bucket: 15m
indexing_settings:
  commit_timeout_secs: 10
"#;

/// The index OTLP traces go to by default (Quickwit's).
pub const OTEL_TRACES_INDEX_ID: &str = "otel-traces-v0_9";

/// Quickwit's `otel-logs-v0_9` index config (its `OTEL_LOGS_INDEX_CONFIG`), accepted as is.
const OTEL_LOGS_INDEX_CONFIG: &str = r#"
version: 0.8
index_id: otel-logs-v0_9
doc_mapping:
  mode: strict
  field_mappings:
    - name: timestamp_nanos
      type: datetime
      input_formats: [unix_timestamp]
      output_format: unix_timestamp_nanos
      indexed: false
      fast: true
      fast_precision: milliseconds
    - name: observed_timestamp_nanos
      type: datetime
      input_formats: [unix_timestamp]
      output_format: unix_timestamp_nanos
    - name: service_name
      type: text
      tokenizer: raw
      fast: true
    - name: severity_text
      type: text
      tokenizer: raw
      fast: true
    - name: severity_number
      type: u64
      fast: true
    - name: body
      type: json
      tokenizer: default
    - name: attributes
      type: json
      tokenizer: raw
      fast: true
    - name: dropped_attributes_count
      type: u64
      indexed: false
    - name: trace_id
      type: bytes
      input_format: hex
      output_format: hex
    - name: span_id
      type: bytes
      input_format: hex
      output_format: hex
    - name: trace_flags
      type: u64
      indexed: false
    - name: resource_attributes
      type: json
      tokenizer: raw
      fast: true
    - name: resource_dropped_attributes_count
      type: u64
      indexed: false
    - name: scope_name
      type: text
      indexed: false
    - name: scope_version
      type: text
      indexed: false
    - name: scope_attributes
      type: json
      indexed: false
    - name: scope_dropped_attributes_count
      type: u64
      indexed: false
  timestamp_field: timestamp_nanos
indexing_settings:
  commit_timeout_secs: 5
search_settings:
  default_search_fields: [body.message]
"#;

/// Quickwit's `otel-traces-v0_9` index config (its `OTEL_TRACES_INDEX_CONFIG`), accepted as is.
const OTEL_TRACES_INDEX_CONFIG: &str = r#"
version: 0.8
index_id: otel-traces-v0_9
doc_mapping:
  mode: strict
  field_mappings:
    - name: trace_id
      type: bytes
      input_format: hex
      output_format: hex
      fast: true
    - name: trace_state
      type: text
      indexed: false
    - name: service_name
      type: text
      tokenizer: raw
      fast: true
    - name: resource_attributes
      type: json
      tokenizer: raw
    - name: resource_dropped_attributes_count
      type: u64
      indexed: false
    - name: scope_name
      type: text
      indexed: false
    - name: scope_version
      type: text
      indexed: false
    - name: scope_attributes
      type: json
      indexed: false
    - name: scope_dropped_attributes_count
      type: u64
      indexed: false
    - name: span_id
      type: bytes
      input_format: hex
      output_format: hex
    - name: span_kind
      type: u64
    - name: span_name
      type: text
      tokenizer: raw
      fast: true
    - name: span_fingerprint
      type: text
      tokenizer: raw
    - name: span_start_timestamp_nanos
      type: datetime
      input_formats: [unix_timestamp]
      output_format: unix_timestamp_nanos
      indexed: false
      fast: true
      fast_precision: milliseconds
    - name: span_end_timestamp_nanos
      type: datetime
      input_formats: [unix_timestamp]
      output_format: unix_timestamp_nanos
      indexed: false
      fast: false
    - name: span_duration_millis
      type: u64
      indexed: false
      fast: true
    - name: span_attributes
      type: json
      tokenizer: raw
      fast: true
    - name: span_dropped_attributes_count
      type: u64
      indexed: false
    - name: span_dropped_events_count
      type: u64
      indexed: false
    - name: span_dropped_links_count
      type: u64
      indexed: false
    - name: span_status
      type: json
      indexed: true
    - name: parent_span_id
      type: bytes
      input_format: hex
      output_format: hex
      indexed: false
    - name: is_root
      type: bool
      indexed: true
      stored: false
    - name: events
      type: array<json>
      tokenizer: raw
      fast: true
    - name: event_names
      type: array<text>
      tokenizer: default
      record: position
      stored: false
    - name: links
      type: array<json>
      tokenizer: raw
  timestamp_field: span_start_timestamp_nanos
indexing_settings:
  commit_timeout_secs: 5
search_settings:
  default_search_fields: [service_name, span_name, event_names]
"#;

/// The service name of a resource without a string `service.name` attribute (Quickwit's).
const UNKNOWN_SERVICE: &str = "unknown_service";
/// The span name of a span without one (Quickwit's).
const UNKNOWN_SPAN_NAME: &str = "unknown";

/// An OTLP signal Shale ingests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Log records (`ExportLogsServiceRequest`).
    Logs,
    /// Spans (`ExportTraceServiceRequest`).
    Traces,
    /// Metric data points (`ExportMetricsServiceRequest`), into a metrics index.
    Metrics,
}

impl Signal {
    /// The index a signal goes to unless the request names another.
    pub fn default_index_id(self) -> &'static str {
        match self {
            Signal::Logs => OTEL_LOGS_INDEX_ID,
            Signal::Traces => OTEL_TRACES_INDEX_ID,
            Signal::Metrics => OTEL_METRICS_INDEX_ID,
        }
    }

    /// The request header naming another index (Quickwit's).
    pub fn index_header(self) -> &'static str {
        match self {
            Signal::Logs => "qw-otel-logs-index",
            Signal::Traces => "qw-otel-traces-index",
            Signal::Metrics => "qw-otel-metrics-index",
        }
    }

    /// The config of the signal's default index.
    pub fn index_config(self) -> Result<IndexConfig, ConfigError> {
        IndexConfig::parse(match self {
            Signal::Logs => OTEL_LOGS_INDEX_CONFIG.as_bytes(),
            Signal::Traces => OTEL_TRACES_INDEX_CONFIG.as_bytes(),
            Signal::Metrics => OTEL_METRICS_INDEX_CONFIG.as_bytes(),
        })
    }

    /// `logs` or `traces`.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Logs => "logs",
            Signal::Traces => "traces",
            Signal::Metrics => "metrics",
        }
    }

    /// What a record of this signal is called in messages.
    pub(crate) fn record_name(self) -> &'static str {
        match self {
            Signal::Logs => "log record",
            Signal::Traces => "span",
            Signal::Metrics => "data point",
        }
    }

    /// The protobuf message an export request of this signal is.
    fn request_message(self) -> &'static str {
        match self {
            Signal::Logs => "ExportLogsServiceRequest",
            Signal::Traces => "ExportTraceServiceRequest",
            Signal::Metrics => "ExportMetricsServiceRequest",
        }
    }
}

/// How an OTLP/HTTP body is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Binary protobuf (`application/x-protobuf`), the default.
    Protobuf,
    /// OTLP/JSON (`application/json`).
    Json,
}

impl Encoding {
    /// The encoding a `Content-Type` names; none is protobuf.
    pub fn from_content_type(content_type: Option<&str>) -> Result<Encoding, OtlpError> {
        let Some(content_type) = content_type else {
            return Ok(Encoding::Protobuf);
        };
        let mime = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match mime.as_str() {
            "" | "application/x-protobuf" | "application/protobuf" => Ok(Encoding::Protobuf),
            "application/json" => Ok(Encoding::Json),
            _ => Err(OtlpError::UnsupportedContentType(content_type.to_string())),
        }
    }

    /// The `Content-Type` of a body in this encoding.
    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Protobuf => "application/x-protobuf",
            Encoding::Json => "application/json",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Encoding::Protobuf => "protobuf",
            Encoding::Json => "JSON",
        }
    }
}

/// Errors decoding an OTLP export request or encoding its response.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// The body is neither protobuf nor JSON.
    #[error(
        "unsupported content type `{0}`: OTLP/HTTP bodies are `application/x-protobuf` or \
         `application/json`"
    )]
    UnsupportedContentType(String),
    /// The body is not a valid export request.
    #[error("invalid OTLP {signal} request: the {encoding} body is not an {message}: {reason}")]
    Decode {
        /// `logs` or `traces`.
        signal: &'static str,
        /// `protobuf` or `JSON`.
        encoding: &'static str,
        /// The expected message.
        message: &'static str,
        /// The decoder's error.
        reason: String,
    },
    /// The response could not be encoded.
    #[error("could not encode the OTLP response: {0}")]
    Encode(String),
}

/// The documents of an export request.
#[derive(Debug, Default)]
pub struct Documents {
    /// One JSON document per record that could be converted, in request order.
    pub docs: Vec<Bytes>,
    /// Records that could not be converted (invalid trace or span ids).
    pub num_rejected: u64,
    /// Why the first rejected record was rejected; empty when none was.
    pub error_message: String,
}

impl Documents {
    fn push(&mut self, doc: Result<Map<String, Value>, String>) {
        match doc {
            Ok(doc) => self.docs.push(Bytes::from(Value::Object(doc).to_string())),
            Err(message) => {
                if self.num_rejected == 0 {
                    self.error_message = message;
                }
                self.num_rejected += 1;
            }
        }
    }
}

/// Decodes an export request of `signal` and converts it into documents; `now_nanos` is the
/// observed time of log records that carry none.
pub fn decode_documents(
    signal: Signal,
    encoding: Encoding,
    body: &[u8],
    now_nanos: u64,
) -> Result<Documents, OtlpError> {
    let decode_error = |reason: String| OtlpError::Decode {
        signal: signal.name(),
        encoding: encoding.name(),
        message: signal.request_message(),
        reason,
    };
    Ok(match (signal, encoding) {
        (Signal::Logs, Encoding::Protobuf) => log_documents(
            ExportLogsServiceRequest::decode(body).map_err(|e| decode_error(e.to_string()))?,
            now_nanos,
        ),
        (Signal::Logs, Encoding::Json) => log_documents(
            serde_json::from_slice(body).map_err(|e| decode_error(e.to_string()))?,
            now_nanos,
        ),
        (Signal::Traces, Encoding::Protobuf) => span_documents(
            ExportTraceServiceRequest::decode(body).map_err(|e| decode_error(e.to_string()))?,
        ),
        (Signal::Traces, Encoding::Json) => {
            span_documents(serde_json::from_slice(body).map_err(|e| decode_error(e.to_string()))?)
        }
        (Signal::Metrics, _) => {
            return Err(decode_error(
                "metrics are decoded with `decode_metrics`".to_string(),
            ))
        }
    })
}

/// Decodes an OTLP metrics export request and translates it into Prometheus series (as
/// Prometheus's own OTLP receiver names and labels them).
pub fn decode_metrics(
    encoding: Encoding,
    body: &[u8],
) -> Result<shale_metrics::otlp::OtlpSeries, OtlpError> {
    let decode_error = |reason: String| OtlpError::Decode {
        signal: Signal::Metrics.name(),
        encoding: encoding.name(),
        message: Signal::Metrics.request_message(),
        reason,
    };
    let request: ExportMetricsServiceRequest = match encoding {
        Encoding::Protobuf => {
            ExportMetricsServiceRequest::decode(body).map_err(|e| decode_error(e.to_string()))?
        }
        Encoding::Json => serde_json::from_slice(body).map_err(|e| decode_error(e.to_string()))?,
    };
    Ok(shale_metrics::otlp::translate(&request))
}

/// The export response of `signal` in `encoding`: a partial success when records were
/// rejected, an empty response otherwise (as the OTLP specification asks).
pub fn encode_response(
    signal: Signal,
    encoding: Encoding,
    num_rejected: u64,
    error_message: &str,
) -> Result<Vec<u8>, OtlpError> {
    let rejected = i64::try_from(num_rejected).unwrap_or(i64::MAX);
    let partial = num_rejected > 0 || !error_message.is_empty();
    let encoded = match signal {
        Signal::Logs => encode(
            encoding,
            &ExportLogsServiceResponse {
                partial_success: partial.then(|| ExportLogsPartialSuccess {
                    rejected_log_records: rejected,
                    error_message: error_message.to_string(),
                }),
            },
        ),
        Signal::Traces => encode(
            encoding,
            &ExportTraceServiceResponse {
                partial_success: partial.then(|| ExportTracePartialSuccess {
                    rejected_spans: rejected,
                    error_message: error_message.to_string(),
                }),
            },
        ),
        Signal::Metrics => encode(
            encoding,
            &ExportMetricsServiceResponse {
                partial_success: partial.then(|| ExportMetricsPartialSuccess {
                    rejected_data_points: rejected,
                    error_message: error_message.to_string(),
                }),
            },
        ),
    };
    encoded.map_err(OtlpError::Encode)
}

fn encode<M: Message + serde::Serialize>(
    encoding: Encoding,
    message: &M,
) -> Result<Vec<u8>, String> {
    match encoding {
        Encoding::Protobuf => Ok(message.encode_to_vec()),
        Encoding::Json => {
            // An unset message field is left out rather than `null`.
            let mut value = serde_json::to_value(message).map_err(|err| err.to_string())?;
            if let Value::Object(fields) = &mut value {
                fields.retain(|_, field| !field.is_null());
            }
            serde_json::to_vec(&value).map_err(|err| err.to_string())
        }
    }
}

/// The documents of an `otel-logs-v0_9` index, one per log record (Quickwit's conversion).
pub fn log_documents(request: ExportLogsServiceRequest, now_nanos: u64) -> Documents {
    let mut documents = Documents::default();
    for resource_logs in request.resource_logs {
        let resource = ResourceFields::new(resource_logs.resource);
        for scope_logs in resource_logs.scope_logs {
            let scope = ScopeFields::new(scope_logs.scope);
            for record in scope_logs.log_records {
                documents.push(log_document(record, &resource, &scope, now_nanos));
            }
        }
    }
    documents
}

/// The documents of an `otel-traces-v0_9` index, one per span (Quickwit's conversion).
pub fn span_documents(request: ExportTraceServiceRequest) -> Documents {
    let mut documents = Documents::default();
    for resource_spans in request.resource_spans {
        let resource = ResourceFields::new(resource_spans.resource);
        for scope_spans in resource_spans.scope_spans {
            let scope = ScopeFields::new(scope_spans.scope);
            for span in scope_spans.spans {
                documents.push(span_document(span, &resource, &scope));
            }
        }
    }
    documents
}

/// What every record of a resource carries.
struct ResourceFields {
    service_name: String,
    attributes: Map<String, Value>,
    dropped_attributes_count: u32,
}

impl ResourceFields {
    fn new(resource: Option<Resource>) -> Self {
        let resource = resource.unwrap_or_default();
        let mut attributes = attributes_to_json(resource.attributes);
        // `service.name` leaves the attributes whatever its type; only a string names it.
        let service_name = match attributes.remove("service.name") {
            Some(Value::String(name)) => name,
            _ => UNKNOWN_SERVICE.to_string(),
        };
        ResourceFields {
            service_name,
            attributes,
            dropped_attributes_count: resource.dropped_attributes_count,
        }
    }

    fn insert_into(&self, doc: &mut Map<String, Value>) {
        doc.insert("service_name".into(), self.service_name.clone().into());
        insert_map(doc, "resource_attributes", &self.attributes);
        insert_count(
            doc,
            "resource_dropped_attributes_count",
            self.dropped_attributes_count,
        );
    }
}

/// What every record of an instrumentation scope carries.
struct ScopeFields {
    name: Option<String>,
    version: Option<String>,
    attributes: Map<String, Value>,
    dropped_attributes_count: u32,
}

impl ScopeFields {
    fn new(scope: Option<InstrumentationScope>) -> Self {
        let scope = scope.unwrap_or_default();
        ScopeFields {
            name: Some(scope.name).filter(|name| !name.is_empty()),
            version: Some(scope.version).filter(|version| !version.is_empty()),
            attributes: attributes_to_json(scope.attributes),
            dropped_attributes_count: scope.dropped_attributes_count,
        }
    }

    fn insert_into(&self, doc: &mut Map<String, Value>) {
        if let Some(name) = &self.name {
            doc.insert("scope_name".into(), name.clone().into());
        }
        if let Some(version) = &self.version {
            doc.insert("scope_version".into(), version.clone().into());
        }
        insert_map(doc, "scope_attributes", &self.attributes);
        insert_count(
            doc,
            "scope_dropped_attributes_count",
            self.dropped_attributes_count,
        );
    }
}

fn log_document(
    record: LogRecord,
    resource: &ResourceFields,
    scope: &ScopeFields,
    now_nanos: u64,
) -> Result<Map<String, Value>, String> {
    // Without an observed time, this node is the first to observe the record; without an
    // event time, the observed time is the record's time.
    let observed_nanos = match record.observed_time_unix_nano {
        0 => now_nanos,
        nanos => nanos,
    };
    let timestamp_nanos = match record.time_unix_nano {
        0 => observed_nanos,
        nanos => nanos,
    };
    // All-zero ids are absent ids.
    let trace_id = optional_id(&record.trace_id, 16, "trace_id", "log record")?;
    let span_id = optional_id(&record.span_id, 8, "span_id", "log record")?;
    let mut doc = Map::new();
    doc.insert("timestamp_nanos".into(), timestamp_nanos.into());
    doc.insert("observed_timestamp_nanos".into(), observed_nanos.into());
    if !record.severity_text.is_empty() {
        doc.insert("severity_text".into(), record.severity_text.into());
    }
    doc.insert("severity_number".into(), record.severity_number.into());
    if let Some(body) = record.body.and_then(body_to_json) {
        doc.insert("body".into(), body);
    }
    insert_map(
        &mut doc,
        "attributes",
        &attributes_to_json(record.attributes),
    );
    insert_count(
        &mut doc,
        "dropped_attributes_count",
        record.dropped_attributes_count,
    );
    if let Some(trace_id) = trace_id {
        doc.insert("trace_id".into(), trace_id.into());
    }
    if let Some(span_id) = span_id {
        doc.insert("span_id".into(), span_id.into());
    }
    doc.insert("trace_flags".into(), record.flags.into());
    resource.insert_into(&mut doc);
    scope.insert_into(&mut doc);
    Ok(doc)
}

fn span_document(
    span: Span,
    resource: &ResourceFields,
    scope: &ScopeFields,
) -> Result<Map<String, Value>, String> {
    let trace_id = required_id(&span.trace_id, 16, "trace_id", "span")?;
    let span_id = required_id(&span.span_id, 8, "span_id", "span")?;
    let parent_span_id = if span.parent_span_id.is_empty() {
        None
    } else {
        Some(required_id(
            &span.parent_span_id,
            8,
            "parent_span_id",
            "span",
        )?)
    };
    let links = span
        .links
        .into_iter()
        .map(link_to_json)
        .collect::<Result<Vec<Value>, String>>()?;
    let span_name = if span.name.is_empty() {
        UNKNOWN_SPAN_NAME.to_string()
    } else {
        span.name
    };
    let mut doc = Map::new();
    doc.insert("trace_id".into(), trace_id.into());
    if !span.trace_state.is_empty() {
        doc.insert("trace_state".into(), span.trace_state.into());
    }
    resource.insert_into(&mut doc);
    scope.insert_into(&mut doc);
    doc.insert("span_id".into(), span_id.into());
    if span.kind > 0 {
        doc.insert("span_kind".into(), span.kind.into());
    }
    // Service, kind and name separated by NUL, as Quickwit's span fingerprints.
    doc.insert(
        "span_fingerprint".into(),
        format!(
            "{}\u{0}{}\u{0}{span_name}",
            resource.service_name, span.kind
        )
        .into(),
    );
    doc.insert("span_name".into(), span_name.into());
    doc.insert(
        "span_start_timestamp_nanos".into(),
        span.start_time_unix_nano.into(),
    );
    doc.insert(
        "span_end_timestamp_nanos".into(),
        span.end_time_unix_nano.into(),
    );
    let duration_nanos = span
        .end_time_unix_nano
        .saturating_sub(span.start_time_unix_nano);
    doc.insert(
        "span_duration_millis".into(),
        (duration_nanos / 1_000_000).into(),
    );
    insert_map(
        &mut doc,
        "span_attributes",
        &attributes_to_json(span.attributes),
    );
    insert_count(
        &mut doc,
        "span_dropped_attributes_count",
        span.dropped_attributes_count,
    );
    insert_count(
        &mut doc,
        "span_dropped_events_count",
        span.dropped_events_count,
    );
    insert_count(
        &mut doc,
        "span_dropped_links_count",
        span.dropped_links_count,
    );
    // Only `ok` and `error` are recorded (an unset status is left out); only an error keeps
    // its message.
    match span.status {
        Some(status) if status.code == 1 => {
            doc.insert("span_status".into(), serde_json::json!({"code": "ok"}));
        }
        Some(status) if status.code == 2 => {
            let mut span_status = Map::new();
            span_status.insert("code".into(), "error".into());
            if !status.message.is_empty() {
                span_status.insert("message".into(), status.message.into());
            }
            doc.insert("span_status".into(), Value::Object(span_status));
        }
        _ => {}
    }
    doc.insert("is_root".into(), parent_span_id.is_none().into());
    if let Some(parent_span_id) = parent_span_id {
        doc.insert("parent_span_id".into(), parent_span_id.into());
    }
    if !span.events.is_empty() {
        let names: Vec<Value> = span
            .events
            .iter()
            .map(|event| event.name.clone().into())
            .collect();
        let events: Vec<Value> = span.events.into_iter().map(event_to_json).collect();
        doc.insert("events".into(), events.into());
        doc.insert("event_names".into(), names.into());
    }
    if !links.is_empty() {
        doc.insert("links".into(), links.into());
    }
    Ok(doc)
}

fn event_to_json(event: Event) -> Value {
    let mut json = Map::new();
    json.insert("event_timestamp_nanos".into(), event.time_unix_nano.into());
    json.insert("event_name".into(), event.name.into());
    insert_map(
        &mut json,
        "event_attributes",
        &attributes_to_json(event.attributes),
    );
    insert_count(
        &mut json,
        "event_dropped_attributes_count",
        event.dropped_attributes_count,
    );
    Value::Object(json)
}

fn link_to_json(link: Link) -> Result<Value, String> {
    let mut json = Map::new();
    json.insert(
        "link_trace_id".into(),
        required_id(&link.trace_id, 16, "link trace_id", "span")?.into(),
    );
    if !link.trace_state.is_empty() {
        json.insert("link_trace_state".into(), link.trace_state.into());
    }
    json.insert(
        "link_span_id".into(),
        required_id(&link.span_id, 8, "link span_id", "span")?.into(),
    );
    insert_map(
        &mut json,
        "link_attributes",
        &attributes_to_json(link.attributes),
    );
    insert_count(
        &mut json,
        "link_dropped_attributes_count",
        link.dropped_attributes_count,
    );
    Ok(Value::Object(json))
}

fn insert_map(doc: &mut Map<String, Value>, key: &str, map: &Map<String, Value>) {
    if !map.is_empty() {
        doc.insert(key.into(), Value::Object(map.clone()));
    }
}

fn insert_count(doc: &mut Map<String, Value>, key: &str, count: u32) {
    if count != 0 {
        doc.insert(key.into(), count.into());
    }
}

/// An id of `len` bytes as lowercase hex; an id of the wrong length rejects the record.
fn required_id(bytes: &[u8], len: usize, field: &str, record: &str) -> Result<String, String> {
    if bytes.len() != len {
        return Err(format!(
            "invalid {record}: `{field}` must be {len} bytes, got {}",
            bytes.len()
        ));
    }
    Ok(hex(bytes))
}

/// Like [`required_id`], but an empty or all-zero id is no id.
fn optional_id(
    bytes: &[u8],
    len: usize,
    field: &str,
    record: &str,
) -> Result<Option<String>, String> {
    if bytes.iter().all(|byte| *byte == 0) {
        return Ok(None);
    }
    required_id(bytes, len, field, record).map(Some)
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    out
}

/// OTLP attributes as a JSON object: keys kept as they are (`http.method` stays one key),
/// attributes with an empty key or no value left out, a repeated key's last value kept.
fn attributes_to_json(attributes: Vec<KeyValue>) -> Map<String, Value> {
    let mut map = Map::new();
    for attribute in attributes {
        if attribute.key.is_empty() {
            continue;
        }
        if let Some(value) = attribute
            .value
            .and_then(|value| value.value)
            .and_then(value_to_json)
        {
            map.insert(attribute.key, value);
        }
    }
    map
}

/// An OTLP value as JSON; bytes and non-finite doubles have no JSON form and are left out
/// (Quickwit leaves them out too).
fn value_to_json(value: OtlpValue) -> Option<Value> {
    match value {
        OtlpValue::StringValue(string) => Some(Value::String(string)),
        OtlpValue::BoolValue(boolean) => Some(Value::Bool(boolean)),
        OtlpValue::IntValue(int) => Some(Value::Number(int.into())),
        OtlpValue::DoubleValue(double) => Number::from_f64(double).map(Value::Number),
        OtlpValue::ArrayValue(array) => Some(Value::Array(
            array
                .values
                .into_iter()
                .filter_map(|value| value.value.and_then(value_to_json))
                .collect(),
        )),
        OtlpValue::KvlistValue(list) => Some(Value::Object(
            list.values
                .into_iter()
                .filter_map(|kv| {
                    let value = kv.value.and_then(|value| value.value)?;
                    Some((kv.key, value_to_json(value)?))
                })
                .collect(),
        )),
        // A string-table reference (profiles) means nothing without its table.
        OtlpValue::BytesValue(_) | OtlpValue::StringValueStrindex(_) => None,
    }
}

/// A log record's body: a string becomes `{"message": …}`, anything else stays as it is.
fn body_to_json(body: AnyValue) -> Option<Value> {
    let value = body.value.and_then(value_to_json)?;
    Some(match value {
        Value::String(message) => serde_json::json!({ "message": message }),
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{ArrayValue, KeyValueList};
    use opentelemetry_proto::tonic::logs::v1::{ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status};
    use serde_json::json;

    fn value(value: OtlpValue) -> Option<AnyValue> {
        Some(AnyValue { value: Some(value) })
    }

    fn kv(key: &str, v: OtlpValue) -> KeyValue {
        KeyValue {
            key: key.to_string(),
            value: value(v),
            ..Default::default()
        }
    }

    fn string(s: &str) -> OtlpValue {
        OtlpValue::StringValue(s.to_string())
    }

    fn doc(bytes: &Bytes) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn the_index_configs_parse_and_map() {
        for signal in [Signal::Logs, Signal::Traces] {
            let config = signal.index_config().unwrap();
            assert_eq!(config.index_id, signal.default_index_id());
            shale_index::DocMapper::for_index(&config).unwrap();
        }
    }

    #[test]
    fn content_types() {
        use Encoding::*;
        assert_eq!(Encoding::from_content_type(None).unwrap(), Protobuf);
        for (header, expected) in [
            ("application/x-protobuf", Protobuf),
            ("Application/Protobuf", Protobuf),
            ("application/json; charset=utf-8", Json),
        ] {
            assert_eq!(Encoding::from_content_type(Some(header)).unwrap(), expected);
        }
        let err = Encoding::from_content_type(Some("text/plain")).unwrap_err();
        assert!(err.to_string().contains("text/plain"), "{err}");
    }

    #[test]
    fn values_become_json() {
        let attributes = vec![
            kv("", OtlpValue::BoolValue(true)),
            KeyValue {
                key: "no_value".to_string(),
                value: None,
                ..Default::default()
            },
            kv("s", string("x")),
            kv("b", OtlpValue::BoolValue(false)),
            kv("i", OtlpValue::IntValue(-3)),
            kv("d", OtlpValue::DoubleValue(1.5)),
            kv("nan", OtlpValue::DoubleValue(f64::NAN)),
            kv("bytes", OtlpValue::BytesValue(vec![1, 2])),
            kv(
                "a",
                OtlpValue::ArrayValue(ArrayValue {
                    values: vec![
                        AnyValue {
                            value: Some(OtlpValue::IntValue(1)),
                        },
                        AnyValue {
                            value: Some(string("two")),
                        },
                        AnyValue { value: None },
                    ],
                }),
            ),
            kv(
                "kv",
                OtlpValue::KvlistValue(KeyValueList {
                    values: vec![kv("inner", OtlpValue::IntValue(7))],
                }),
            ),
            kv("http.method", string("GET")),
        ];
        assert_eq!(
            Value::Object(attributes_to_json(attributes)),
            json!({
                "s": "x", "b": false, "i": -3, "d": 1.5, "a": [1, "two"],
                "kv": {"inner": 7}, "http.method": "GET"
            })
        );
        assert_eq!(
            body_to_json(AnyValue {
                value: Some(string("hello"))
            }),
            Some(json!({"message": "hello"}))
        );
        assert_eq!(
            body_to_json(AnyValue {
                value: Some(OtlpValue::IntValue(4))
            }),
            Some(json!(4))
        );
        assert_eq!(hex(&[0x00, 0xab, 0x7f]), "00ab7f");
    }

    fn log_request(records: Vec<LogRecord>) -> ExportLogsServiceRequest {
        ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: Some(Resource {
                    attributes: vec![
                        kv("service.name", string("checkout")),
                        kv("host.name", string("h1")),
                    ],
                    dropped_attributes_count: 2,
                    ..Default::default()
                }),
                scope_logs: vec![ScopeLogs {
                    scope: Some(InstrumentationScope {
                        name: "lib".to_string(),
                        version: "1.0".to_string(),
                        ..Default::default()
                    }),
                    log_records: records,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn log_records_become_quickwit_documents() {
        let record = LogRecord {
            time_unix_nano: 1_700_000_000_000_000_001,
            observed_time_unix_nano: 1_700_000_000_500_000_000,
            severity_number: 17,
            severity_text: "ERROR".to_string(),
            body: value(string("payment failed")),
            attributes: vec![kv("http.status_code", OtlpValue::IntValue(500))],
            dropped_attributes_count: 1,
            flags: 1,
            trace_id: vec![0xab; 16],
            span_id: vec![0x01; 8],
            ..Default::default()
        };
        let documents = log_documents(log_request(vec![record]), 42);
        assert_eq!(documents.num_rejected, 0);
        assert_eq!(
            doc(&documents.docs[0]),
            json!({
                "timestamp_nanos": 1_700_000_000_000_000_001u64,
                "observed_timestamp_nanos": 1_700_000_000_500_000_000u64,
                "service_name": "checkout",
                "severity_text": "ERROR",
                "severity_number": 17,
                "body": {"message": "payment failed"},
                "attributes": {"http.status_code": 500},
                "dropped_attributes_count": 1,
                "trace_id": "ab".repeat(16),
                "span_id": "01".repeat(8),
                "trace_flags": 1,
                "resource_attributes": {"host.name": "h1"},
                "resource_dropped_attributes_count": 2,
                "scope_name": "lib",
                "scope_version": "1.0",
            })
        );
    }

    #[test]
    fn log_record_defaults_and_rejections() {
        let bare = LogRecord {
            trace_id: vec![0; 16],
            ..Default::default()
        };
        let bad_trace = LogRecord {
            trace_id: vec![1; 3],
            ..Default::default()
        };
        let request = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: Some(Resource {
                    // A service name that is not a string names no service, and is dropped.
                    attributes: vec![kv("service.name", OtlpValue::IntValue(3))],
                    ..Default::default()
                }),
                scope_logs: vec![ScopeLogs {
                    log_records: vec![bare, bad_trace],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let documents = log_documents(request, 42);
        assert_eq!(documents.docs.len(), 1);
        assert_eq!(documents.num_rejected, 1);
        assert!(
            documents.error_message.contains("trace_id"),
            "{}",
            documents.error_message
        );
        assert_eq!(
            doc(&documents.docs[0]),
            json!({
                "timestamp_nanos": 42,
                "observed_timestamp_nanos": 42,
                "service_name": "unknown_service",
                "severity_number": 0,
                "trace_flags": 0,
            })
        );
    }

    fn span_request(spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", string("api"))],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn spans_become_quickwit_documents() {
        let root = Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: "GET /cart".to_string(),
            kind: 2,
            start_time_unix_nano: 1_000_000_001,
            end_time_unix_nano: 1_251_000_000,
            status: Some(Status {
                code: 2,
                message: "boom".to_string(),
            }),
            events: vec![Event {
                time_unix_nano: 1_100_000_000,
                name: "retry".to_string(),
                attributes: vec![kv("attempt", OtlpValue::IntValue(2))],
                dropped_attributes_count: 0,
            }],
            links: vec![Link {
                trace_id: vec![4; 16],
                span_id: vec![5; 8],
                trace_state: "k=v".to_string(),
                ..Default::default()
            }],
            dropped_links_count: 3,
            ..Default::default()
        };
        let child = Span {
            trace_id: vec![1; 16],
            span_id: vec![3; 8],
            parent_span_id: vec![2; 8],
            start_time_unix_nano: 10,
            end_time_unix_nano: 5,
            status: Some(Status {
                code: 1,
                message: "ignored".to_string(),
            }),
            ..Default::default()
        };
        let documents = span_documents(span_request(vec![root, child]));
        assert_eq!(documents.num_rejected, 0);
        assert_eq!(
            doc(&documents.docs[0]),
            json!({
                "trace_id": "01".repeat(16),
                "service_name": "api",
                "span_id": "02".repeat(8),
                "span_kind": 2,
                "span_name": "GET /cart",
                "span_fingerprint": "api\u{0}2\u{0}GET /cart",
                "span_start_timestamp_nanos": 1_000_000_001u64,
                "span_end_timestamp_nanos": 1_251_000_000u64,
                "span_duration_millis": 250,
                "span_dropped_links_count": 3,
                "span_status": {"code": "error", "message": "boom"},
                "is_root": true,
                "events": [{
                    "event_timestamp_nanos": 1_100_000_000u64,
                    "event_name": "retry",
                    "event_attributes": {"attempt": 2},
                }],
                "event_names": ["retry"],
                "links": [{
                    "link_trace_id": "04".repeat(16),
                    "link_trace_state": "k=v",
                    "link_span_id": "05".repeat(8),
                }],
            })
        );
        let child = doc(&documents.docs[1]);
        assert_eq!(child["span_name"], "unknown");
        assert_eq!(child["span_duration_millis"], 0);
        assert_eq!(child["span_status"], json!({"code": "ok"}));
        assert_eq!(child["is_root"], false);
        assert_eq!(child["parent_span_id"], "02".repeat(8));
        assert!(child.get("span_kind").is_none());
    }

    #[test]
    fn spans_with_invalid_ids_are_rejected() {
        let documents = span_documents(span_request(vec![
            Span {
                trace_id: vec![1; 15],
                span_id: vec![2; 8],
                ..Default::default()
            },
            Span {
                trace_id: vec![1; 16],
                span_id: vec![],
                ..Default::default()
            },
            Span {
                trace_id: vec![1; 16],
                span_id: vec![2; 8],
                ..Default::default()
            },
        ]));
        assert_eq!(documents.docs.len(), 1);
        assert_eq!(documents.num_rejected, 2);
        assert!(documents.error_message.contains("trace_id"));
    }

    #[test]
    fn json_and_protobuf_requests_decode_alike() {
        let request = span_request(vec![Span {
            trace_id: vec![0xaa; 16],
            span_id: vec![0xbb; 8],
            name: "op".to_string(),
            start_time_unix_nano: 1_700_000_000_000_000_000,
            end_time_unix_nano: 1_700_000_000_002_000_000,
            ..Default::default()
        }]);
        let from_proto = decode_documents(
            Signal::Traces,
            Encoding::Protobuf,
            &request.encode_to_vec(),
            0,
        )
        .unwrap();
        let json = json!({"resourceSpans": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "api"}}]},
            "scopeSpans": [{"spans": [{
                "traceId": "aa".repeat(16), "spanId": "bb".repeat(8), "name": "op",
                "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000002000000"
            }]}]
        }]});
        let from_json = decode_documents(
            Signal::Traces,
            Encoding::Json,
            json.to_string().as_bytes(),
            0,
        )
        .unwrap();
        assert_eq!(doc(&from_proto.docs[0]), doc(&from_json.docs[0]));
        assert_eq!(doc(&from_json.docs[0])["span_duration_millis"], 2);

        let err = decode_documents(Signal::Logs, Encoding::Protobuf, b"\xff\xff\xff", 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("ExportLogsServiceRequest"), "{err}");
        let err = decode_documents(Signal::Logs, Encoding::Json, b"{", 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("JSON"), "{err}");
    }

    #[test]
    fn responses_in_the_request_encoding() {
        let ok = encode_response(Signal::Logs, Encoding::Protobuf, 0, "").unwrap();
        assert_eq!(
            ExportLogsServiceResponse::decode(ok.as_slice()).unwrap(),
            ExportLogsServiceResponse::default()
        );
        let partial = encode_response(Signal::Traces, Encoding::Protobuf, 2, "bad ids").unwrap();
        let partial = ExportTraceServiceResponse::decode(partial.as_slice()).unwrap();
        let partial = partial.partial_success.unwrap();
        assert_eq!(
            (partial.rejected_spans, partial.error_message.as_str()),
            (2, "bad ids")
        );
        let ok = encode_response(Signal::Traces, Encoding::Json, 0, "").unwrap();
        assert_eq!(ok, b"{}");
        let json = encode_response(Signal::Logs, Encoding::Json, 1, "why").unwrap();
        let json: Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(json["partialSuccess"]["errorMessage"], "why", "{json}");
    }
}
