//! The benchmark corpus: realistic log documents of about 300 bytes (timestamp, service,
//! level, host, trace_id, message drawn from a varied vocabulary), deterministic per seed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// First timestamp of the corpus: 2025-12-01T00:00:00Z.
pub const T0: i64 = 1_764_547_200;
/// Seconds the corpus' timestamps span.
pub const SPAN_SECS: i64 = 6 * 3600;

/// The index every benchmark uses.
pub const INDEX_YAML: &str = r#"
version: 0.8
index_id: bench-logs
doc_mapping:
  mode: lenient
  field_mappings:
    - name: timestamp
      type: datetime
      input_formats: [rfc3339]
      fast: true
      fast_precision: milliseconds
    - name: service
      type: text
      tokenizer: raw
      fast: true
    - name: level
      type: text
      tokenizer: raw
    - name: host
      type: text
      tokenizer: raw
    - name: trace_id
      type: text
      tokenizer: raw
    - name: message
      type: text
      tokenizer: default
      record: position
  timestamp_field: timestamp
  tag_fields: [service]
indexing_settings:
  commit_timeout_secs: 30
search_settings:
  default_search_fields: [message]
"#;

/// The services of the corpus.
pub const SERVICES: [&str; 12] = [
    "checkout",
    "cart",
    "payment",
    "auth",
    "search",
    "catalog",
    "shipping",
    "email",
    "frontend",
    "recommendation",
    "ads",
    "inventory",
];
/// The words messages are made of (a few of them per message).
pub const WORDS: [&str; 64] = [
    "request",
    "response",
    "user",
    "session",
    "timeout",
    "connection",
    "refused",
    "database",
    "query",
    "cache",
    "miss",
    "hit",
    "latency",
    "retry",
    "failed",
    "succeeded",
    "order",
    "payment",
    "token",
    "expired",
    "invalid",
    "upstream",
    "downstream",
    "service",
    "unavailable",
    "handler",
    "started",
    "completed",
    "processing",
    "queue",
    "message",
    "consumer",
    "producer",
    "partition",
    "offset",
    "commit",
    "rollback",
    "transaction",
    "lock",
    "acquired",
    "released",
    "memory",
    "pressure",
    "garbage",
    "collection",
    "thread",
    "pool",
    "exhausted",
    "socket",
    "closed",
    "reset",
    "peer",
    "certificate",
    "verify",
    "header",
    "missing",
    "payload",
    "large",
    "rate",
    "limit",
    "exceeded",
    "shard",
    "replica",
    "leader",
];

/// One log document of about 300 bytes.
pub fn gen_doc(rng: &mut StdRng, i: usize, n: usize) -> String {
    let ts = T0 + (i as i64 * SPAN_SECS) / n as i64;
    let millis = rng.random_range(0..1000);
    let timestamp = time::OffsetDateTime::from_unix_timestamp(ts)
        .map(|t| t + time::Duration::milliseconds(millis))
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default();
    let level = match rng.random_range(0..100) {
        0..=69 => "INFO",
        70..=84 => "DEBUG",
        85..=94 => "WARN",
        _ => "ERROR",
    };
    let service = SERVICES[rng.random_range(0..SERVICES.len())];
    let host = format!("{service}-{:02}.prod.internal", rng.random_range(0..40));
    let trace_id = format!("{:016x}{:016x}", rng.random::<u64>(), rng.random::<u64>());
    let mut message = String::with_capacity(200);
    let words = rng.random_range(14..26);
    for w in 0..words {
        if w > 0 {
            message.push(' ');
        }
        if rng.random_range(0..8) == 0 {
            message.push_str(&format!("id={}", rng.random_range(0..100_000)));
        } else {
            message.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        }
    }
    json!({
        "timestamp": timestamp,
        "service": service,
        "level": level,
        "host": host,
        "trace_id": trace_id,
        "message": message,
    })
    .to_string()
}

/// `n` documents spread over [`SPAN_SECS`] from [`T0`].
pub fn generate(n: usize, seed: u64) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|i| gen_doc(&mut rng, i, n)).collect()
}
