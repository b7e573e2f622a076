//! Settings of the `locality` merge policy (under `indexing_settings.merge_policy`):
//!
//! ```yaml
//! merge_policy:
//!   type: locality
//!   sort_fields: [service, host]     # fast raw-text, u64, i64, bool or datetime fields
//!   time_bucket: 15m                 # divides an hour: 1m … 60m
//!   target_split_num_docs: 5000000   # and/or target_split_bytes: 2GiB
//!   max_merge_ops: 4
//! ```
//!
//! Parsed and validated here — on its own and against the doc mapping (the sort fields must
//! be columnar and comparable as stored; the index needs a timestamp field). Index creation
//! ([`IndexConfig::validate`](crate::IndexConfig::validate)) does not accept the policy yet:
//! key-range merges and pruning are being built (see `docs/design/locality-compaction.md`).

use serde_json::{json, Map, Value};
use shale_types::sort_key::SortFieldType;
use shale_types::SplitMaturity;

use crate::index_config::{DocMapping, FieldKind, Tokenizer};
use crate::merge_policy::{check_keys, format_duration, get_duration, get_u64, PolicyConfigError};

/// Default `time_bucket`: 15 minutes.
pub const DEFAULT_TIME_BUCKET_SECS: u64 = 15 * 60;
/// Default `target_split_num_docs` when neither target is set.
pub const DEFAULT_TARGET_SPLIT_NUM_DOCS: u64 = 5_000_000;
/// Default `max_merge_ops` of the locality policy.
pub const DEFAULT_LOCALITY_MAX_MERGE_OPS: u32 = 4;

const FIELD: &str = "merge_policy";

/// `locality` settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalityConfig {
    /// The key columns, most significant first.
    pub sort_fields: Vec<String>,
    /// Width of a time bucket, in seconds; divides 3600.
    pub time_bucket_secs: u64,
    /// A merge output holds at most this many documents.
    pub target_split_num_docs: Option<u64>,
    /// A merge output holds at most this many bytes.
    pub target_split_bytes: Option<u64>,
    /// No byte is rewritten by more merges than this.
    pub max_merge_ops: u32,
}

impl LocalityConfig {
    /// Parses the keys of a `type: locality` block (`type` itself excluded) and checks them.
    pub fn parse(object: &Map<String, Value>) -> Result<Self, PolicyConfigError> {
        check_keys(
            object,
            &[
                "sort_fields",
                "time_bucket",
                "target_split_num_docs",
                "target_split_bytes",
                "max_merge_ops",
            ],
        )?;
        let sort_fields = match object.get("sort_fields") {
            None | Some(Value::Null) => {
                return Err(PolicyConfigError::new(
                    format!("{FIELD}.sort_fields"),
                    "missing: the key columns, e.g. `[service, host]`",
                ))
            }
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    item.as_str().map(str::to_string).ok_or_else(|| {
                        PolicyConfigError::new(
                            format!("{FIELD}.sort_fields[{i}]"),
                            format!("expected a field name, got {item}"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(PolicyConfigError::new(
                    format!("{FIELD}.sort_fields"),
                    format!("expected a list of field names, got {other}"),
                ))
            }
        };
        let target_split_bytes = match object.get("target_split_bytes") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(crate::parse_byte_size(text).map_err(|err| {
                PolicyConfigError::new(format!("{FIELD}.target_split_bytes"), err.to_string())
            })?),
            Some(_) => get_u64(object, "target_split_bytes")?,
        };
        let max_merge_ops = match get_u64(object, "max_merge_ops")? {
            None => DEFAULT_LOCALITY_MAX_MERGE_OPS,
            Some(ops) => u32::try_from(ops).map_err(|_| {
                PolicyConfigError::new(format!("{FIELD}.max_merge_ops"), "too large")
            })?,
        };
        let config = LocalityConfig {
            sort_fields,
            time_bucket_secs: get_duration(object, "time_bucket")?
                .unwrap_or(DEFAULT_TIME_BUCKET_SECS),
            target_split_num_docs: get_u64(object, "target_split_num_docs")?,
            target_split_bytes,
            max_merge_ops,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks what does not depend on the doc mapping.
    pub fn validate(&self) -> Result<(), PolicyConfigError> {
        if self.sort_fields.is_empty() {
            return Err(PolicyConfigError::new(
                format!("{FIELD}.sort_fields"),
                "needs at least one field",
            ));
        }
        for (i, name) in self.sort_fields.iter().enumerate() {
            if self.sort_fields[..i].contains(name) {
                return Err(PolicyConfigError::new(
                    format!("{FIELD}.sort_fields[{i}]"),
                    format!("`{name}` is listed twice"),
                ));
            }
        }
        let bucket = self.time_bucket_secs;
        if bucket == 0
            || !bucket.is_multiple_of(60)
            || bucket > 3600
            || !3600u64.is_multiple_of(bucket)
        {
            return Err(PolicyConfigError::new(
                format!("{FIELD}.time_bucket"),
                format!(
                    "must be a whole number of minutes that divides an hour (1m, 2m, 3m, 4m, 5m, \
                     6m, 10m, 12m, 15m, 20m, 30m or 60m), got {}",
                    format_duration(bucket)
                ),
            ));
        }
        if self.target_split_num_docs == Some(0) {
            return Err(PolicyConfigError::new(
                format!("{FIELD}.target_split_num_docs"),
                "must be at least 1",
            ));
        }
        if self.target_split_bytes == Some(0) {
            return Err(PolicyConfigError::new(
                format!("{FIELD}.target_split_bytes"),
                "must be at least 1",
            ));
        }
        if self.max_merge_ops == 0 {
            return Err(PolicyConfigError::new(
                format!("{FIELD}.max_merge_ops"),
                "must be at least 1: level-0 splits are always merged once",
            ));
        }
        Ok(())
    }

    /// Maturity of a split made by `num_merge_ops` merges: mature once its bytes have been
    /// rewritten `max_merge_ops` times. (The maturation period only bounds what the planner
    /// reads; late data still joins older level-1 splits with budget left.)
    pub fn split_maturity(&self, num_merge_ops: u32) -> SplitMaturity {
        if num_merge_ops >= self.max_merge_ops {
            return SplitMaturity::Mature;
        }
        SplitMaturity::Immature {
            maturation_period_secs: crate::DEFAULT_MATURATION_PERIOD_SECS,
        }
    }

    /// The document target of a merge output (the default when only a byte target is set is
    /// no document limit).
    pub fn target_num_docs(&self) -> u64 {
        match (self.target_split_num_docs, self.target_split_bytes) {
            (Some(docs), _) => docs,
            (None, Some(_)) => u64::MAX,
            (None, None) => DEFAULT_TARGET_SPLIT_NUM_DOCS,
        }
    }

    /// Checks the sort fields against the doc mapping and returns their types, in order. The
    /// error names the offending field, from the root of the index config.
    pub fn sort_field_types(
        &self,
        doc_mapping: &DocMapping,
    ) -> Result<Vec<SortFieldType>, PolicyConfigError> {
        if doc_mapping.timestamp_field.is_none() {
            return Err(PolicyConfigError::new(
                "doc_mapping.timestamp_field",
                "locality compaction cuts splits by time bucket: the index needs a timestamp \
                 field",
            ));
        }
        self.sort_fields
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let field = format!("indexing_settings.{FIELD}.sort_fields[{i}]");
                let Some(mapping) = doc_mapping.field_mapping(name) else {
                    return Err(PolicyConfigError::new(
                        field,
                        format!("no field named `{name}` in field_mappings"),
                    ));
                };
                if !mapping.is_fast() {
                    return Err(PolicyConfigError::new(
                        field,
                        format!("sort field `{name}` must be a fast field: set `fast: true` on it"),
                    ));
                }
                match &mapping.kind {
                    FieldKind::Text(options) if options.tokenizer == Tokenizer::Raw => {
                        Ok(SortFieldType::Text)
                    }
                    FieldKind::Text(_) => Err(PolicyConfigError::new(
                        field,
                        format!(
                            "sort field `{name}` is tokenized: a text sort field needs \
                             `tokenizer: raw`"
                        ),
                    )),
                    FieldKind::U64(_) => Ok(SortFieldType::U64),
                    FieldKind::I64(_) => Ok(SortFieldType::I64),
                    FieldKind::Bool(_) => Ok(SortFieldType::Bool),
                    FieldKind::Datetime(_) => Ok(SortFieldType::DateTime),
                    other => Err(PolicyConfigError::new(
                        field,
                        format!(
                            "sort field `{name}` is of type `{}`: sort fields must be raw text, \
                             u64, i64, bool or datetime",
                            match other {
                                FieldKind::F64(_) => "f64",
                                _ => "json",
                            }
                        ),
                    )),
                }
            })
            .collect()
    }

    /// The start of the time bucket holding `timestamp_secs` (buckets are aligned on the
    /// epoch, so on hours).
    pub fn bucket_start(&self, timestamp_secs: i64) -> i64 {
        let width = self.time_bucket_secs.max(1) as i64;
        timestamp_secs.div_euclid(width) * width
    }

    /// The settings in Quickwit's shape.
    pub fn to_json(&self) -> Value {
        let mut value = json!({
            "type": "locality",
            "sort_fields": self.sort_fields,
            "time_bucket": format_duration(self.time_bucket_secs),
            "max_merge_ops": self.max_merge_ops,
        });
        if let Some(docs) = self.target_split_num_docs {
            value["target_split_num_docs"] = json!(docs);
        }
        if let Some(bytes) = self.target_split_bytes {
            value["target_split_bytes"] = json!(bytes);
        }
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IndexConfig;

    fn parse(yaml: &str) -> Result<LocalityConfig, PolicyConfigError> {
        let value: Value = serde_yaml::from_str(yaml).expect("yaml");
        let object = value.as_object().expect("object").clone();
        LocalityConfig::parse(&object)
    }

    fn field_of(yaml: &str) -> String {
        parse(yaml).expect_err(yaml).field
    }

    #[test]
    fn settings_parse_with_defaults_and_round_trip() {
        let config = parse("sort_fields: [service, host]\ntime_bucket: 15m\n").expect("valid");
        assert_eq!(config.sort_fields, ["service", "host"]);
        assert_eq!(config.time_bucket_secs, 900);
        assert_eq!(config.max_merge_ops, 4);
        assert_eq!(config.target_num_docs(), DEFAULT_TARGET_SPLIT_NUM_DOCS);
        let sized =
            parse("sort_fields: [a]\ntarget_split_bytes: 2GiB\nmax_merge_ops: 2\n").expect("ok");
        assert_eq!(sized.target_split_bytes, Some(2 << 30));
        assert_eq!(sized.target_num_docs(), u64::MAX);
        assert_eq!(sized.time_bucket_secs, DEFAULT_TIME_BUCKET_SECS);
        let back = sized.to_json();
        let object = back.as_object().expect("object");
        let mut without_type = object.clone();
        without_type.remove("type");
        assert_eq!(LocalityConfig::parse(&without_type).expect("again"), sized);
    }

    #[test]
    fn bad_settings_name_their_field() {
        assert_eq!(field_of("time_bucket: 15m\n"), "merge_policy.sort_fields");
        assert_eq!(field_of("sort_fields: []\n"), "merge_policy.sort_fields");
        assert_eq!(
            field_of("sort_fields: [a, 3]\n"),
            "merge_policy.sort_fields[1]"
        );
        assert_eq!(
            field_of("sort_fields: [a, b, a]\n"),
            "merge_policy.sort_fields[2]"
        );
        for bucket in ["7m", "90s", "2h", "0s", "45m"] {
            assert_eq!(
                field_of(&format!("sort_fields: [a]\ntime_bucket: {bucket}\n")),
                "merge_policy.time_bucket",
                "{bucket}"
            );
        }
        for bucket in ["1m", "5m", "12m", "20m", "30m", "60m", "1h"] {
            parse(&format!("sort_fields: [a]\ntime_bucket: {bucket}\n")).expect(bucket);
        }
        assert_eq!(
            field_of("sort_fields: [a]\ntarget_split_num_docs: 0\n"),
            "merge_policy.target_split_num_docs"
        );
        assert_eq!(
            field_of("sort_fields: [a]\nmax_merge_ops: 0\n"),
            "merge_policy.max_merge_ops"
        );
        assert_eq!(
            field_of("sort_fields: [a]\nmerge_factor: 10\n"),
            "merge_policy.merge_factor"
        );
    }

    fn doc_mapping(extra: &str) -> DocMapping {
        let yaml = format!(
            "index_id: logs\ndoc_mapping:\n  field_mappings:\n\
             \x20   - {{name: ts, type: datetime, fast: true}}\n\
             \x20   - {{name: service, type: text, tokenizer: raw, fast: true}}\n\
             \x20   - {{name: message, type: text, fast: true}}\n\
             \x20   - {{name: host, type: text, tokenizer: raw}}\n\
             \x20   - {{name: code, type: u64, fast: true}}\n\
             \x20   - {{name: latency, type: f64, fast: true}}\n\
             \x20   - {{name: ok, type: bool, fast: true}}\n\
             {extra}"
        );
        IndexConfig::parse(yaml.as_bytes())
            .expect("index config")
            .doc_mapping
    }

    #[test]
    fn sort_fields_are_checked_against_the_doc_mapping() {
        let mapping = doc_mapping("  timestamp_field: ts\n");
        let types = |fields: &str| {
            parse(&format!("sort_fields: {fields}\n"))
                .expect("settings")
                .sort_field_types(&mapping)
        };
        assert_eq!(
            types("[service, code, ok, ts]").expect("valid"),
            [
                SortFieldType::Text,
                SortFieldType::U64,
                SortFieldType::Bool,
                SortFieldType::DateTime
            ]
        );
        for (fields, field, words) in [
            ("[nope]", "sort_fields[0]", "no field named `nope`"),
            ("[service, message]", "sort_fields[1]", "tokenizer: raw"),
            ("[host]", "sort_fields[0]", "fast: true"),
            ("[latency]", "sort_fields[0]", "`f64`"),
        ] {
            let err = types(fields).expect_err(fields);
            assert_eq!(err.field, format!("indexing_settings.merge_policy.{field}"));
            assert!(err.message.contains(words), "{fields}: {}", err.message);
        }
        let no_timestamp = doc_mapping("");
        let err = parse("sort_fields: [service]\n")
            .expect("settings")
            .sort_field_types(&no_timestamp)
            .expect_err("no timestamp field");
        assert_eq!(err.field, "doc_mapping.timestamp_field");
    }

    #[test]
    fn buckets_are_aligned_on_the_hour_including_before_the_epoch() {
        let config = parse("sort_fields: [a]\ntime_bucket: 15m\n").expect("valid");
        assert_eq!(config.bucket_start(3600 + 899), 3600);
        assert_eq!(config.bucket_start(3600 + 900), 4500);
        assert_eq!(config.bucket_start(0), 0);
        assert_eq!(config.bucket_start(-1), -900);
    }
}
