//! The merge policy config — typed, in one place — as Quickwit writes it under
//! `indexing_settings.merge_policy`:
//!
//! ```yaml
//! merge_policy:
//!   type: stable_log          # or `default`; `limit_merge`; `no_merge`; `locality`
//!   min_level_num_docs: 100000
//!   merge_factor: 10
//!   max_merge_factor: 12
//!   maturation_period: 48h
//! ```
//!
//! `limit_merge` takes `merge_factor`, `max_merge_factor`, `max_merge_ops` (4),
//! `maturation_period`, `max_finalize_merge_operations` (0) and `max_finalize_split_num_docs`
//! (none). Unknown keys are rejected, as Quickwit does, and every error names its field.
//!
//! [`MergePolicyConfig::split_maturity`] is the one rule for the maturity of a fresh or merged
//! split: ingest, the merge planner and the merge workers all call it.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Map, Value};
use shale_types::SplitMaturity;

/// Default `min_level_num_docs`.
pub const DEFAULT_MIN_LEVEL_NUM_DOCS: u64 = 100_000;
/// Default `merge_factor`.
pub const DEFAULT_MERGE_FACTOR: usize = 10;
/// Default `max_merge_factor`.
pub const DEFAULT_MAX_MERGE_FACTOR: usize = 12;
/// Default `max_merge_ops` (`limit_merge`).
pub const DEFAULT_MAX_MERGE_OPS: u32 = 4;
/// Default `maturation_period`: 48 hours.
pub const DEFAULT_MATURATION_PERIOD_SECS: u64 = 48 * 3600;

/// An invalid merge policy config; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {message}")]
pub struct PolicyConfigError {
    /// The offending field, e.g. `merge_policy.merge_factor`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl PolicyConfigError {
    /// The message for a serde error: the field below `merge_policy` between markers, so
    /// that the config parser can name the full path (`indexing_settings.merge_policy.x`).
    fn to_serde_message(&self) -> String {
        let sub = self
            .field
            .strip_prefix(FIELD)
            .unwrap_or(&self.field)
            .trim_start_matches('.');
        format!("{SUBFIELD_MARKER}{sub}{SUBFIELD_MARKER}{}", self.message)
    }

    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        PolicyConfigError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// `stable_log` settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StableLogConfig {
    /// Splits under this many documents all belong to the first level.
    pub min_level_num_docs: u64,
    /// Fewest splits in a merge (unless the merge reaches the docs target).
    pub merge_factor: usize,
    /// Most splits in a merge.
    pub max_merge_factor: usize,
    /// A split is mature this long after its creation.
    pub maturation_period_secs: u64,
}

impl Default for StableLogConfig {
    fn default() -> Self {
        StableLogConfig {
            min_level_num_docs: DEFAULT_MIN_LEVEL_NUM_DOCS,
            merge_factor: DEFAULT_MERGE_FACTOR,
            max_merge_factor: DEFAULT_MAX_MERGE_FACTOR,
            maturation_period_secs: DEFAULT_MATURATION_PERIOD_SECS,
        }
    }
}

/// `limit_merge` settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitMergeConfig {
    /// Fewest splits in a merge (unless the merge reaches the docs target).
    pub merge_factor: usize,
    /// Most splits in a merge.
    pub max_merge_factor: usize,
    /// A split made by this many merges is mature: no byte is rewritten more often.
    pub max_merge_ops: u32,
    /// A split is mature this long after its creation.
    pub maturation_period_secs: u64,
    /// Most finalize merges when a stream of splits ends (0: none).
    pub max_finalize_merge_operations: usize,
    /// Splits with more documents than this are left out of finalize merges.
    pub max_finalize_split_num_docs: Option<u64>,
}

impl Default for LimitMergeConfig {
    fn default() -> Self {
        LimitMergeConfig {
            merge_factor: DEFAULT_MERGE_FACTOR,
            max_merge_factor: DEFAULT_MAX_MERGE_FACTOR,
            max_merge_ops: DEFAULT_MAX_MERGE_OPS,
            maturation_period_secs: DEFAULT_MATURATION_PERIOD_SECS,
            max_finalize_merge_operations: 0,
            max_finalize_split_num_docs: None,
        }
    }
}

/// A parsed `merge_policy` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergePolicyConfig {
    /// `type: no_merge`.
    NoMerge,
    /// `type: limit_merge`.
    LimitMerge(LimitMergeConfig),
    /// `type: stable_log` (or `default`).
    StableLog(StableLogConfig),
    /// `type: locality`: sorted splits per time bucket merged into non-overlapping key ranges
    /// (refused at index creation until it is built through).
    Locality(crate::locality::LocalityConfig),
}

impl Default for MergePolicyConfig {
    fn default() -> Self {
        MergePolicyConfig::StableLog(StableLogConfig::default())
    }
}

const FIELD: &str = "merge_policy";

/// Delimits, in a serde error message, the path of the offending key below the value being
/// deserialized (see `validation::deserialize_with_path`).
pub(crate) const SUBFIELD_MARKER: char = '\u{1}';

impl StableLogConfig {
    /// Maturity of a split of `num_docs` documents: mature at the docs target, else immature
    /// for the maturation period.
    pub fn split_maturity(&self, split_num_docs_target: u64, num_docs: u64) -> SplitMaturity {
        if num_docs >= split_num_docs_target {
            return SplitMaturity::Mature;
        }
        SplitMaturity::Immature {
            maturation_period_secs: self.maturation_period_secs,
        }
    }
}

impl LimitMergeConfig {
    /// Maturity of a split of `num_docs` documents made by `num_merge_ops` merges: mature once
    /// made by `max_merge_ops` merges (so with `max_merge_ops: 0` every split is born mature)
    /// or at the docs target, else immature for the maturation period.
    pub fn split_maturity(
        &self,
        split_num_docs_target: u64,
        num_docs: u64,
        num_merge_ops: u32,
    ) -> SplitMaturity {
        if num_merge_ops >= self.max_merge_ops || num_docs >= split_num_docs_target {
            return SplitMaturity::Mature;
        }
        SplitMaturity::Immature {
            maturation_period_secs: self.maturation_period_secs,
        }
    }
}

impl MergePolicyConfig {
    /// Parses a `merge_policy` block; `null` (absent) means the default, `stable_log`.
    pub fn parse(value: &Value) -> Result<Self, PolicyConfigError> {
        let object = match value {
            Value::Null => return Ok(MergePolicyConfig::default()),
            Value::Object(object) => object,
            _ => {
                return Err(PolicyConfigError::new(
                    FIELD,
                    "expected an object with a `type`, e.g. `{type: stable_log}`",
                ))
            }
        };
        let kind = match object.get("type") {
            Some(Value::String(kind)) => kind.as_str(),
            Some(_) => {
                return Err(PolicyConfigError::new(
                    format!("{FIELD}.type"),
                    "expected a string: `stable_log`, `limit_merge` or `no_merge`",
                ))
            }
            None => {
                return Err(PolicyConfigError::new(
                    format!("{FIELD}.type"),
                    "missing: `stable_log`, `limit_merge` or `no_merge`",
                ))
            }
        };
        let config = match kind {
            "stable_log" | "default" => {
                check_keys(
                    object,
                    &[
                        "min_level_num_docs",
                        "merge_factor",
                        "max_merge_factor",
                        "maturation_period",
                    ],
                )?;
                let defaults = StableLogConfig::default();
                MergePolicyConfig::StableLog(StableLogConfig {
                    min_level_num_docs: get_u64(object, "min_level_num_docs")?
                        .unwrap_or(defaults.min_level_num_docs),
                    merge_factor: get_usize(object, "merge_factor")?
                        .unwrap_or(defaults.merge_factor),
                    max_merge_factor: get_usize(object, "max_merge_factor")?
                        .unwrap_or(defaults.max_merge_factor),
                    maturation_period_secs: get_duration(object, "maturation_period")?
                        .unwrap_or(defaults.maturation_period_secs),
                })
            }
            "limit_merge" => {
                check_keys(
                    object,
                    &[
                        "merge_factor",
                        "max_merge_factor",
                        "max_merge_ops",
                        "maturation_period",
                        "max_finalize_merge_operations",
                        "max_finalize_split_num_docs",
                    ],
                )?;
                let defaults = LimitMergeConfig::default();
                let max_merge_ops = match get_u64(object, "max_merge_ops")? {
                    None => defaults.max_merge_ops,
                    Some(ops) => u32::try_from(ops).map_err(|_| {
                        PolicyConfigError::new(format!("{FIELD}.max_merge_ops"), "too large")
                    })?,
                };
                MergePolicyConfig::LimitMerge(LimitMergeConfig {
                    merge_factor: get_usize(object, "merge_factor")?
                        .unwrap_or(defaults.merge_factor),
                    max_merge_factor: get_usize(object, "max_merge_factor")?
                        .unwrap_or(defaults.max_merge_factor),
                    max_merge_ops,
                    maturation_period_secs: get_duration(object, "maturation_period")?
                        .unwrap_or(defaults.maturation_period_secs),
                    max_finalize_merge_operations: get_usize(
                        object,
                        "max_finalize_merge_operations",
                    )?
                    .unwrap_or(defaults.max_finalize_merge_operations),
                    max_finalize_split_num_docs: get_u64(object, "max_finalize_split_num_docs")?,
                })
            }
            "no_merge" => {
                check_keys(object, &[])?;
                MergePolicyConfig::NoMerge
            }
            "locality" => {
                MergePolicyConfig::Locality(crate::locality::LocalityConfig::parse(object)?)
            }
            other => {
                return Err(PolicyConfigError::new(
                    format!("{FIELD}.type"),
                    format!("unknown merge policy `{other}` (stable_log, limit_merge or no_merge)"),
                ))
            }
        };
        config.validate()?;
        Ok(config)
    }

    /// Maturity of a fresh (`num_merge_ops == 0`) or merged split of `num_docs` documents, for
    /// an index whose splits target `split_num_docs_target` documents. The one rule every
    /// component uses.
    pub fn split_maturity(
        &self,
        split_num_docs_target: u64,
        num_docs: u64,
        num_merge_ops: u32,
    ) -> SplitMaturity {
        match self {
            MergePolicyConfig::NoMerge => SplitMaturity::Mature,
            MergePolicyConfig::LimitMerge(config) => {
                config.split_maturity(split_num_docs_target, num_docs, num_merge_ops)
            }
            MergePolicyConfig::StableLog(config) => {
                config.split_maturity(split_num_docs_target, num_docs)
            }
            MergePolicyConfig::Locality(config) => config.split_maturity(num_merge_ops),
        }
    }

    /// The config in Quickwit's shape (every key written, durations as `2days`).
    pub fn to_json(&self) -> Value {
        match self {
            MergePolicyConfig::NoMerge => json!({"type": "no_merge"}),
            MergePolicyConfig::StableLog(config) => json!({
                "type": "stable_log",
                "min_level_num_docs": config.min_level_num_docs,
                "merge_factor": config.merge_factor,
                "max_merge_factor": config.max_merge_factor,
                "maturation_period": format_duration(config.maturation_period_secs),
            }),
            MergePolicyConfig::LimitMerge(config) => {
                let mut value = json!({
                    "type": "limit_merge",
                    "merge_factor": config.merge_factor,
                    "max_merge_factor": config.max_merge_factor,
                    "max_merge_ops": config.max_merge_ops,
                    "maturation_period": format_duration(config.maturation_period_secs),
                });
                if config.max_finalize_merge_operations > 0 {
                    value["max_finalize_merge_operations"] =
                        json!(config.max_finalize_merge_operations);
                }
                if let Some(max_docs) = config.max_finalize_split_num_docs {
                    value["max_finalize_split_num_docs"] = json!(max_docs);
                }
                value
            }
            MergePolicyConfig::Locality(config) => config.to_json(),
        }
    }

    /// Quickwit's validation: `max_merge_factor` must be at least `merge_factor`.
    pub fn validate(&self) -> Result<(), PolicyConfigError> {
        let (merge_factor, max_merge_factor) = match self {
            MergePolicyConfig::NoMerge => return Ok(()),
            MergePolicyConfig::Locality(config) => return config.validate(),
            MergePolicyConfig::LimitMerge(config) => (config.merge_factor, config.max_merge_factor),
            MergePolicyConfig::StableLog(config) => (config.merge_factor, config.max_merge_factor),
        };
        if max_merge_factor < merge_factor {
            return Err(PolicyConfigError::new(
                format!("{FIELD}.max_merge_factor"),
                format!("must be at least `merge_factor` ({merge_factor}), got {max_merge_factor}"),
            ));
        }
        Ok(())
    }

    /// The `type` name of this policy.
    pub fn type_name(&self) -> &'static str {
        match self {
            MergePolicyConfig::NoMerge => "no_merge",
            MergePolicyConfig::LimitMerge(_) => "limit_merge",
            MergePolicyConfig::StableLog(_) => "stable_log",
            MergePolicyConfig::Locality(_) => "locality",
        }
    }
}

impl Serialize for MergePolicyConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for MergePolicyConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        MergePolicyConfig::parse(&value)
            .map_err(|err| serde::de::Error::custom(err.to_serde_message()))
    }
}

/// Writes a duration as Quickwit does (`2days`, `1h 30m`, `45s`).
pub fn format_duration(secs: u64) -> String {
    if secs == 0 {
        return "0s".to_string();
    }
    let days = secs / 86_400;
    let hours = secs % 86_400 / 3_600;
    let minutes = secs % 3_600 / 60;
    let seconds = secs % 60;
    let mut parts = Vec::new();
    if days > 0 {
        parts.push(format!("{days}day{}", if days > 1 { "s" } else { "" }));
    }
    for (value, unit) in [(hours, "h"), (minutes, "m"), (seconds, "s")] {
        if value > 0 {
            parts.push(format!("{value}{unit}"));
        }
    }
    parts.join(" ")
}

pub(crate) fn check_keys(
    object: &Map<String, Value>,
    allowed: &[&str],
) -> Result<(), PolicyConfigError> {
    let mut unknown: Vec<&str> = object
        .keys()
        .map(String::as_str)
        .filter(|key| *key != "type" && !allowed.contains(key))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    unknown.sort_unstable();
    let expected = if allowed.is_empty() {
        "none but `type`".to_string()
    } else {
        allowed
            .iter()
            .map(|key| format!("`{key}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(PolicyConfigError::new(
        format!("{FIELD}.{}", unknown[0]),
        format!(
            "unknown key{} {} for this policy type (expected: {expected})",
            if unknown.len() > 1 { "s" } else { "" },
            unknown
                .iter()
                .map(|key| format!("`{key}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ))
}

pub(crate) fn get_u64(
    object: &Map<String, Value>,
    key: &str,
) -> Result<Option<u64>, PolicyConfigError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or_else(|| {
            PolicyConfigError::new(
                format!("{FIELD}.{key}"),
                format!("expected an unsigned integer, got {value}"),
            )
        }),
    }
}

fn get_usize(object: &Map<String, Value>, key: &str) -> Result<Option<usize>, PolicyConfigError> {
    get_u64(object, key)?
        .map(|value| {
            usize::try_from(value)
                .map_err(|_| PolicyConfigError::new(format!("{FIELD}.{key}"), "too large"))
        })
        .transpose()
}

pub(crate) fn get_duration(
    object: &Map<String, Value>,
    key: &str,
) -> Result<Option<u64>, PolicyConfigError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => crate::parse_duration(text).map(Some).map_err(|err| {
            let message = match err {
                crate::ConfigError::Invalid { message, .. } => message,
                other => other.to_string(),
            };
            PolicyConfigError::new(format!("{FIELD}.{key}"), message)
        }),
        Some(value) => Err(PolicyConfigError::new(
            format!("{FIELD}.{key}"),
            format!("expected a duration such as \"48h\" or \"2 days\", got {value}"),
        )),
    }
}
