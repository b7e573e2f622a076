//! Index and node configuration. Index configs are Quickwit-compatible (YAML or JSON, `version`
//! accepted and ignored): doc mapping, partition key, indexing settings (merge policy stored for
//! compaction), search settings and retention. Validation errors name the offending field.

mod index_config;

pub use index_config::*;
