//! Index and node configuration.
//!
//! * **Index configs** are Quickwit-compatible (YAML or JSON, `version` accepted and ignored):
//!   doc mapping, partition key, indexing settings (with the typed [`MergePolicyConfig`]),
//!   search settings and retention. [`IndexConfig::parse`] deserializes and
//!   [validates](IndexConfig::validate); every error names the offending field
//!   (`doc_mapping.timestamp_field`, `doc_mapping.field_mappings[2]`, …).
//! * **Partition keys** ([`PartitionKey`]): `field`, `hash_mod(field, N)`,
//!   `hash_mod((a, b, c), N)`, hashed with SipHash for deterministic routing.
//! * **Node configs** ([`NodeConfig`]): a YAML file where every key is optional.
//! * **Units**: [`parse_duration`] (`90 days`) and [`parse_byte_size`] (`10MiB`).

#![warn(missing_docs)]

mod compaction;
mod index_config;
mod layout;
mod locality;
mod merge_policy;
mod node_config;
mod partition;
mod redact;
mod template;
mod units;
mod validation;

pub use validation::{RetentionSchedule, DATE_OUTPUT_FORMATS};

pub use compaction::{
    CompactionSettings, DEFAULT_DELETE_BYTES, DEFAULT_DELETE_RATIO, DEFAULT_MAX_SPLIT_BYTES,
    DEFAULT_SMALL_SPLIT_COUNT,
};
pub use index_config::*;
pub use locality::{
    LocalityConfig, DEFAULT_LOCALITY_MAX_MERGE_OPS, DEFAULT_TARGET_SPLIT_NUM_DOCS,
    DEFAULT_TIME_BUCKET_SECS,
};
pub use merge_policy::{
    format_duration, LimitMergeConfig, MergePolicyConfig, PolicyConfigError, StableLogConfig,
    DEFAULT_MATURATION_PERIOD_SECS, DEFAULT_MAX_MERGE_FACTOR, DEFAULT_MAX_MERGE_OPS,
    DEFAULT_MERGE_FACTOR, DEFAULT_MIN_LEVEL_NUM_DOCS,
};
pub use node_config::{
    default_advertise_address, ApiToken, ClusterConfig, CompactionConfig, GrpcConfig, NodeConfig,
    RestConfig, Role, S3Config, ScopeMode, TlsConfig, TokenRole, WalPersistPolicy,
    DEFAULT_CLUSTER_ID, DEFAULT_DATA_DIR, DEFAULT_ENABLE_OTLP_ENDPOINT, DEFAULT_LISTEN_ADDRESS,
    DEFAULT_LIVE_SAMPLES_MAX_BYTES, DEFAULT_MAX_CONCURRENT_SEARCHES, DEFAULT_MAX_INGEST_BODY_BYTES,
    DEFAULT_MAX_IN_FLIGHT_INGEST_BYTES, DEFAULT_MAX_WAL_MEMORY_BYTES,
    DEFAULT_METRICS_COLUMN_CACHE_MAX_BYTES, DEFAULT_SPLIT_CACHE_MAX_BYTES,
    DEFAULT_WAL_PERSIST_INTERVAL_SECS,
};
pub use partition::{PartitionKey, OTHER_PARTITION_ID};
pub use redact::{redact_uri, scrub, uri_secrets, REDACTED};
pub use template::{glob_match, select_template, IndexTemplate};
pub use units::{parse_byte_size, parse_duration};

#[cfg(test)]
mod tests;
