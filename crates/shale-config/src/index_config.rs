//! The index config: its shape (serde) and validation.

use serde::{Deserialize, Serialize};

/// Default `indexing_settings.commit_timeout_secs`.
pub const DEFAULT_COMMIT_TIMEOUT_SECS: u64 = 60;
/// Default `indexing_settings.split_num_docs_target`.
pub const DEFAULT_SPLIT_NUM_DOCS_TARGET: u64 = 10_000_000;
/// Default `doc_mapping.max_num_partitions`.
pub const DEFAULT_MAX_NUM_PARTITIONS: u32 = 200;

/// Error in an index or node config; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The document could not be parsed as YAML or JSON, or has the wrong shape.
    #[error("failed to parse config: {0}")]
    Parse(String),
    /// A field has an invalid value.
    #[error("invalid config: `{field}`: {message}")]
    Invalid {
        /// Dotted path of the field, e.g. `doc_mapping.timestamp_field`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// A Quickwit-compatible index config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexConfig {
    /// Accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<serde_json::Value>,
    /// `^[a-zA-Z][a-zA-Z0-9._-]{2,254}$`.
    pub index_id: String,
    /// Where the index's splits live; defaults to `{default storage}/{index_id}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_uri: Option<String>,
    /// How documents are mapped to fields (absent for a metrics index).
    #[serde(default)]
    pub doc_mapping: DocMapping,
    /// Present for a metrics index: it holds time series (Prometheus remote write, OTLP
    /// metrics) in Parquet splits, queried with PromQL, instead of documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsSettings>,
    /// When splits are cut, and how they are merged.
    #[serde(default)]
    pub indexing_settings: IndexingSettings,
    /// Quickwit's ingest settings: accepted and kept (see [`IndexConfig::inert_keys`]).
    #[serde(default, skip_serializing_if = "IngestSettings::is_default")]
    pub ingest_settings: IngestSettings,
    /// Search defaults.
    #[serde(default)]
    pub search_settings: SearchSettings,
    /// Data retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionPolicy>,
    /// Automatic compaction: the switch and the delete, small-split and size triggers.
    #[serde(default, skip_serializing_if = "crate::CompactionSettings::is_default")]
    pub compaction: crate::CompactionSettings,
    /// How far back `as_of` searches may look (e.g. `1h`): replaced splits and deleted
    /// documents are kept that long. Absent or `0s`: time travel is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_travel_retention: Option<String>,
}

/// Quickwit's `ingest_settings`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestSettings {
    /// Quickwit's minimum number of shards of the index. Shale opens
    /// `min_shards_per_index` (node config) shards per index, more as the ingest rate grows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_shards: Option<u64>,
    /// Quickwit's switch to skip validation at ingest. Shale always validates documents
    /// before acknowledging them, so that bad ones are reported and never reach the WAL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validate_docs: Option<bool>,
}

impl IngestSettings {
    pub(crate) fn is_default(&self) -> bool {
        self == &IngestSettings::default()
    }
}

impl IndexConfig {
    /// The keys of Quickwit's index config this config sets that Shale accepts (so Quickwit
    /// configs keep working) but that change nothing in Shale, each with why: to be logged
    /// when an index is created or updated.
    pub fn inert_keys(&self) -> Vec<(&'static str, &'static str)> {
        let settings = &self.indexing_settings;
        let mut keys = Vec::new();
        if settings.parquet_merge_policy.is_some() {
            keys.push((
                "indexing_settings.parquet_merge_policy",
                "Shale has no Parquet (metrics) splits yet",
            ));
        }
        if settings.parquet_indexing.is_some() {
            keys.push((
                "indexing_settings.parquet_indexing",
                "Shale has no Parquet (metrics) splits yet",
            ));
        }
        if settings.resources.max_merge_write_throughput.is_some() {
            keys.push((
                "indexing_settings.resources.max_merge_write_throughput",
                "deprecated in Quickwit; merges are not throttled",
            ));
        }
        if self.ingest_settings.min_shards.is_some() {
            keys.push((
                "ingest_settings.min_shards",
                "shards per index follow the node config's min_shards_per_index and the ingest rate",
            ));
        }
        if self.ingest_settings.validate_docs.is_some() {
            keys.push((
                "ingest_settings.validate_docs",
                "documents are always validated before they are acknowledged",
            ));
        }
        keys
    }

    /// An index config as the metastore stored it. Configs stored before unknown keys were
    /// refused may carry keys of `indexing_settings` that no longer parse: they are dropped
    /// (they never had an effect) rather than making the index unreadable.
    pub fn from_stored_json(json: &str) -> Result<IndexConfig, serde_json::Error> {
        let mut config = Self::from_stored_json_as_is(json)?;
        // Metrics indexes stored before they merged get their derived merge policy.
        config.derive_metrics_merge_policy();
        Ok(config)
    }

    fn from_stored_json_as_is(json: &str) -> Result<IndexConfig, serde_json::Error> {
        match serde_json::from_str(json) {
            Ok(config) => Ok(config),
            Err(strict) => {
                let mut value: serde_json::Value = serde_json::from_str(json)?;
                let Some(settings) = value
                    .get_mut("indexing_settings")
                    .and_then(|s| s.as_object_mut())
                else {
                    return Err(strict);
                };
                const KNOWN: [&str; 8] = [
                    "commit_timeout_secs",
                    "split_num_docs_target",
                    "merge_policy",
                    "resources",
                    "docstore_compression_level",
                    "docstore_blocksize",
                    "parquet_merge_policy",
                    "parquet_indexing",
                ];
                settings.retain(|key, _| KNOWN.contains(&key.as_str()));
                if let Some(resources) = settings
                    .get_mut("resources")
                    .and_then(|r| r.as_object_mut())
                {
                    resources
                        .retain(|key, _| key == "heap_size" || key == "max_merge_write_throughput");
                }
                serde_json::from_value(value).map_err(|_| strict)
            }
        }
    }

    /// The time-travel window in seconds (0 when off). Validated configs always parse.
    pub fn time_travel_retention_secs(&self) -> i64 {
        self.time_travel_retention
            .as_deref()
            .and_then(|text| crate::parse_duration(text).ok())
            .map_or(0, |secs| i64::try_from(secs).unwrap_or(i64::MAX))
    }

    /// `as_of` (Unix seconds) if it is inside this index's time-travel window at `now`, else
    /// why not, in words for the user.
    pub fn check_as_of(&self, as_of: i64, now: i64) -> Result<i64, String> {
        let retention = self.time_travel_retention_secs();
        if retention == 0 {
            return Err(format!(
                "time travel is off for index `{}`: `as_of` needs `time_travel_retention` in its \
                 config",
                self.index_id
            ));
        }
        if as_of < now - retention || as_of > now {
            return Err(format!(
                "as_of {as_of} is outside the time-travel window of index `{}`: [{}, {now}] \
                 (time_travel_retention: {})",
                self.index_id,
                now - retention,
                self.time_travel_retention.as_deref().unwrap_or_default()
            ));
        }
        Ok(as_of)
    }
}

/// The doc mapping.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocMapping {
    /// Identity of this mapping version; assigned by the metastore, changes on update.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub doc_mapping_uid: String,
    /// The declared fields.
    #[serde(default)]
    pub field_mappings: Vec<FieldMapping>,
    /// What to do with undeclared fields.
    #[serde(default)]
    pub mode: Mode,
    /// Datetime field used for time pruning and sort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp_field: Option<String>,
    /// Fields whose values are recorded per split for pruning.
    #[serde(default)]
    pub tag_fields: Vec<String>,
    /// `field`, `hash_mod(field, N)` or `hash_mod((a,b,c), N)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_key: Option<String>,
    /// Partitions beyond this count share one catch-all partition id.
    #[serde(default = "default_max_num_partitions")]
    pub max_num_partitions: u32,
    /// Keep the original JSON document in the `_source` stored field.
    #[serde(default)]
    pub store_source: bool,
    /// Custom tokenizers, usable by name in text and json fields.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokenizers: Vec<TokenizerConfig>,
    /// Options of undeclared fields in `dynamic` mode (only allowed in that mode; see
    /// [`DocMapping::dynamic_options`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_mapping: Option<DynamicMapping>,
    /// Record which fields each document has, so that `field:*` and `exists` work on fields
    /// that are not fast.
    #[serde(default)]
    pub index_field_presence: bool,
    /// Keep each document's size in bytes in the `_doc_length` fast field (for aggregations).
    #[serde(default, alias = "document_length")]
    pub store_document_size: bool,
}

impl Default for DocMapping {
    fn default() -> Self {
        DocMapping {
            doc_mapping_uid: String::new(),
            field_mappings: Vec::new(),
            mode: Mode::default(),
            timestamp_field: None,
            tag_fields: Vec::new(),
            partition_key: None,
            max_num_partitions: DEFAULT_MAX_NUM_PARTITIONS,
            store_source: false,
            tokenizers: Vec::new(),
            dynamic_mapping: None,
            index_field_presence: false,
            store_document_size: false,
        }
    }
}

/// Default `metrics.time_bucket`.
pub const DEFAULT_METRICS_TIME_BUCKET: &str = "15m";

/// The `metrics` section of a metrics index.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    /// The label keys that follow the metric name in the sort key of the splits' rows (e.g.
    /// `[service, host]`): a selector on them reads few row groups, and compaction keeps a
    /// series' samples together along them.
    #[serde(default)]
    pub sort_labels: Vec<String>,
    /// The time window of a split (e.g. `15m`, `1h`): a split never holds samples of two
    /// buckets. Must divide an hour.
    #[serde(default = "default_metrics_time_bucket")]
    pub time_bucket: String,
    /// Locality compaction writes splits of at most about this many bytes (capped by
    /// `compaction.max_split_bytes`): a closed bucket ends as ⌈its bytes / this⌉ splits.
    #[serde(
        default = "default_metrics_target_split_bytes",
        deserialize_with = "crate::units::deserialize_byte_size"
    )]
    pub target_split_bytes: u64,
    /// No sample is rewritten by more merges than this.
    #[serde(default = "default_metrics_max_merge_ops")]
    pub max_merge_ops: u32,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            sort_labels: Vec::new(),
            time_bucket: default_metrics_time_bucket(),
            target_split_bytes: default_metrics_target_split_bytes(),
            max_merge_ops: default_metrics_max_merge_ops(),
        }
    }
}

/// Default `metrics.target_split_bytes` (256 MiB).
pub const DEFAULT_METRICS_TARGET_SPLIT_BYTES: u64 = 256 << 20;

fn default_metrics_target_split_bytes() -> u64 {
    DEFAULT_METRICS_TARGET_SPLIT_BYTES
}

fn default_metrics_max_merge_ops() -> u32 {
    crate::locality::DEFAULT_LOCALITY_MAX_MERGE_OPS
}

/// The sort fields recorded on metrics splits: the metric name, the sort labels, the series
/// id (the key their rows are sorted by, before the timestamp).
pub const METRICS_NAME_FIELD: &str = "__name__";
/// The last sort field of a metrics split (see [`METRICS_NAME_FIELD`]).
pub const METRICS_SERIES_ID_FIELD: &str = "__series_id__";

fn default_metrics_time_bucket() -> String {
    DEFAULT_METRICS_TIME_BUCKET.to_string()
}

impl MetricsSettings {
    /// The time bucket in seconds (validated configs always parse; 15 min otherwise).
    pub fn time_bucket_secs(&self) -> u64 {
        crate::parse_duration(&self.time_bucket).unwrap_or(15 * 60)
    }

    /// The sort fields of the index's splits: `__name__`, the sort labels, `__series_id__`.
    pub fn sort_fields(&self) -> Vec<String> {
        std::iter::once(METRICS_NAME_FIELD.to_string())
            .chain(self.sort_labels.iter().cloned())
            .chain([METRICS_SERIES_ID_FIELD.to_string()])
            .collect()
    }

    /// The locality merge policy a metrics index merges with, derived from this section.
    pub fn locality_config(&self) -> crate::LocalityConfig {
        crate::LocalityConfig {
            sort_fields: self.sort_fields(),
            time_bucket_secs: self.time_bucket_secs(),
            target_split_num_docs: None,
            target_split_bytes: Some(self.target_split_bytes),
            max_merge_ops: self.max_merge_ops,
        }
    }
}

impl DocMapping {
    /// The options of undeclared fields: `dynamic_mapping`, or its defaults.
    pub fn dynamic_options(&self) -> DynamicMapping {
        self.dynamic_mapping.clone().unwrap_or_default()
    }
}

/// A custom tokenizer (Quickwit's `doc_mapping.tokenizers`): a base tokenizer and filters.
/// Unknown keys are refused by [`TokenizerKind`], which receives every key but these.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenizerConfig {
    /// The name fields refer to.
    pub name: String,
    /// The base tokenizer.
    #[serde(flatten)]
    pub kind: TokenizerKind,
    /// Filters applied to its tokens, in order.
    #[serde(default)]
    pub filters: Vec<TokenFilter>,
}

/// Base tokenizers of custom tokenizers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TokenizerKind {
    /// Splits on anything that is not alphanumeric.
    Simple,
    /// All n-grams of `min_gram` to `max_gram` characters (only prefixes with
    /// `prefix_only`).
    Ngram {
        /// Shortest gram.
        min_gram: usize,
        /// Longest gram.
        max_gram: usize,
        /// Only grams starting at the beginning of the text.
        #[serde(default)]
        prefix_only: bool,
    },
    /// The matches of a regular expression.
    Regex {
        /// The regular expression.
        pattern: String,
    },
    /// Detects each value's language: Chinese, Japanese and Korean text is split into
    /// characters, other languages into words.
    Multilang,
    /// Words of source code: split on non-alphanumerics, case changes and digit runs.
    SourceCode,
}

/// Token filters of custom tokenizers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenFilter {
    /// Drops tokens of 255 bytes or more.
    RemoveLong,
    /// Lowercases.
    LowerCaser,
    /// Folds accented and other non-ASCII characters to ASCII.
    AsciiFolding,
}

fn default_max_num_partitions() -> u32 {
    DEFAULT_MAX_NUM_PARTITIONS
}

/// What to do with fields that are not declared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Undeclared fields are ignored.
    Lenient,
    /// Undeclared fields are an error.
    Strict,
    /// Undeclared fields are indexed in a catch-all JSON field.
    #[default]
    Dynamic,
}

/// One declared field.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldMapping {
    /// Field name.
    pub name: String,
    /// Type and type-specific options.
    pub kind: FieldKind,
    /// Declared as Quickwit's `array<T>`: every field may hold several values anyway, but the
    /// values of this one are always shown as an array, even a single one.
    pub array: bool,
}

impl FieldMapping {
    /// A field of type `kind` (not declared as an array).
    pub fn new(name: impl Into<String>, kind: FieldKind) -> Self {
        FieldMapping {
            name: name.into(),
            kind,
            array: false,
        }
    }
}

impl<'de> Deserialize<'de> for FieldMapping {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut map = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
        let name = match map.remove("name") {
            Some(serde_json::Value::String(name)) => name,
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "invalid field name {other}: a string is expected"
                )))
            }
            None => return Err(D::Error::missing_field("name")),
        };
        let mut array = false;
        if let Some(serde_json::Value::String(kind)) = map.get_mut("type") {
            if let Some(inner) = kind
                .strip_prefix("array<")
                .and_then(|k| k.strip_suffix('>'))
            {
                *kind = inner.to_string();
                array = true;
            }
        }
        let kind = FieldKind::deserialize(serde_json::Value::Object(map))
            .map_err(|err| D::Error::custom(format!("field `{name}`: {err}")))?;
        Ok(FieldMapping { name, kind, array })
    }
}

impl Serialize for FieldMapping {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let options = serde_json::to_value(&self.kind).map_err(S::Error::custom)?;
        let mut out = serde_json::Map::new();
        out.insert(
            "name".to_string(),
            serde_json::Value::String(self.name.clone()),
        );
        if let serde_json::Value::Object(options) = options {
            for (key, mut value) in options {
                if key == "type" && self.array {
                    if let serde_json::Value::String(kind) = &value {
                        value = serde_json::Value::String(format!("array<{kind}>"));
                    }
                }
                out.insert(key, value);
            }
        }
        out.serialize(serializer)
    }
}

/// The type of a field and its options.
///
/// Quickwit's `array<T>` types are this type with [`FieldMapping::array`] set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum FieldKind {
    /// Full-text or raw string.
    Text(TextOptions),
    /// Signed integer.
    I64(NumericOptions),
    /// Unsigned integer.
    U64(NumericOptions),
    /// Float.
    F64(NumericOptions),
    /// Boolean.
    Bool(NumericOptions),
    /// Date and time.
    Datetime(DatetimeOptions),
    /// Arbitrary JSON object.
    Json(JsonOptions),
    /// Binary data, base64 (or hex) in documents.
    Bytes(BytesOptions),
    /// IPv4 or IPv6 address.
    Ip(NumericOptions),
    /// An object whose keys are fields of their own (`parent.child` in queries).
    Object(ObjectOptions),
    /// A search-only text field indexing the values of other fields (and optionally of the
    /// undeclared ones) as text, with its own tokenizer.
    Concatenate(ConcatenateOptions),
}

/// Options of a `concatenate` field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcatenateOptions {
    /// Free text shown in the config only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The declared fields whose values are indexed (text, numbers, booleans, json leaves).
    #[serde(default)]
    pub concatenate_fields: Vec<String>,
    /// Also index the values of undeclared fields (dynamic mode).
    #[serde(default)]
    pub include_dynamic_fields: bool,
    /// Tokenizer of the indexed values.
    #[serde(default)]
    pub tokenizer: Tokenizer,
    /// What the inverted index records.
    #[serde(default)]
    pub record: IndexRecord,
    /// Record field lengths (for BM25 scoring).
    #[serde(default)]
    pub fieldnorms: bool,
}

/// Options of an `object` field. Other keys (Quickwit configs may set `fast`, `stored` or
/// `indexed` on an object) are accepted and ignored: the options of its fields apply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObjectOptions {
    /// Free text shown in the config only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The object's fields.
    pub field_mappings: Vec<FieldMapping>,
}

fn default_true() -> bool {
    true
}

/// Whether a text or json field has a fast (columnar) column, and how its strings are
/// normalized there. Written `fast: true|false` or, as in Quickwit,
/// `fast: {normalizer: raw|lowercase}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastOption {
    /// The field has a fast column.
    pub enabled: bool,
    /// How strings are normalized in the column.
    pub normalizer: FastNormalizer,
}

/// Normalizers of fast text columns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FastNormalizer {
    /// The value as written.
    #[default]
    Raw,
    /// The value lowercased.
    Lowercase,
}

impl FastOption {
    /// Fast, keeping values as written.
    pub const RAW: FastOption = FastOption {
        enabled: true,
        normalizer: FastNormalizer::Raw,
    };

    /// The name of the fast-field tokenizer implementing the normalizer, when enabled.
    pub fn tokenizer_name(&self) -> Option<&'static str> {
        self.enabled.then_some(match self.normalizer {
            FastNormalizer::Raw => "raw",
            FastNormalizer::Lowercase => "lowercase",
        })
    }
}

impl From<bool> for FastOption {
    fn from(enabled: bool) -> Self {
        FastOption {
            enabled,
            normalizer: FastNormalizer::Raw,
        }
    }
}

impl Serialize for FastOption {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        if !self.enabled || self.normalizer == FastNormalizer::Raw {
            return serializer.serialize_bool(self.enabled);
        }
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry("normalizer", &self.normalizer)?;
        map.end()
    }
}

impl<'de> Deserialize<'de> for FastOption {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct FastObject {
            #[serde(default)]
            normalizer: FastNormalizer,
        }
        #[derive(Deserialize)]
        #[serde(
            untagged,
            expecting = "a boolean or an object like `{normalizer: raw|lowercase}`"
        )]
        enum Fast {
            Bool(bool),
            Object(FastObject),
        }
        Ok(match Fast::deserialize(deserializer)? {
            Fast::Bool(enabled) => enabled.into(),
            Fast::Object(object) => FastOption {
                enabled: true,
                normalizer: object.normalizer,
            },
        })
    }
}

/// Options of a `text` field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextOptions {
    /// Free text shown in the config only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Stored in the doc store (returned in hits).
    #[serde(default = "default_true")]
    pub stored: bool,
    /// Searchable.
    #[serde(default = "default_true")]
    pub indexed: bool,
    /// Columnar (for sort and aggregations), with an optional normalizer.
    #[serde(default)]
    pub fast: FastOption,
    /// A built-in tokenizer (`default`, `raw`, `raw_lowercase`, `lowercase`, `en_stem`,
    /// `whitespace`, `chinese_compatible`, `source_code_default`) or a custom one.
    #[serde(default)]
    pub tokenizer: Tokenizer,
    /// `basic`, `freq` or `position`.
    #[serde(default)]
    pub record: IndexRecord,
    /// Record field lengths (for BM25 scoring); off by default, as in Quickwit.
    #[serde(default)]
    pub fieldnorms: bool,
}

/// The tokenizer of a text or json field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Tokenizer {
    /// Split on non-alphanumerics, lowercase, drop long tokens.
    #[default]
    Default,
    /// The whole value is one token.
    Raw,
    /// The whole value, lowercased, is one token.
    RawLowercase,
    /// Words, lowercased, stemmed for English.
    EnStem,
    /// Split on whitespace.
    Whitespace,
    /// Words, with every Chinese, Japanese or Korean character a token of its own.
    ChineseCompatible,
    /// Words of source code (camelCase and snake_case split), lowercased.
    SourceCodeDefault,
    /// A custom tokenizer of `doc_mapping.tokenizers`.
    Custom(String),
}

impl Tokenizer {
    /// The name configs and Tantivy's tokenizer manager use.
    pub fn name(&self) -> &str {
        match self {
            Tokenizer::Default => "default",
            Tokenizer::Raw => "raw",
            Tokenizer::RawLowercase => "raw_lowercase",
            Tokenizer::EnStem => "en_stem",
            Tokenizer::Whitespace => "whitespace",
            Tokenizer::ChineseCompatible => "chinese_compatible",
            Tokenizer::SourceCodeDefault => "source_code_default",
            Tokenizer::Custom(name) => name,
        }
    }

    /// The names of the built-in tokenizers.
    pub const BUILT_IN: [&'static str; 8] = [
        "default",
        "raw",
        "raw_lowercase",
        "lowercase",
        "en_stem",
        "whitespace",
        "chinese_compatible",
        "source_code_default",
    ];
}

impl TryFrom<String> for Tokenizer {
    type Error = String;

    fn try_from(name: String) -> Result<Self, String> {
        Ok(match name.as_str() {
            "default" => Tokenizer::Default,
            "raw" => Tokenizer::Raw,
            "raw_lowercase" | "lowercase" => Tokenizer::RawLowercase,
            "en_stem" => Tokenizer::EnStem,
            "whitespace" => Tokenizer::Whitespace,
            "chinese_compatible" => Tokenizer::ChineseCompatible,
            "source_code_default" | "source_code" => Tokenizer::SourceCodeDefault,
            "" => return Err("empty tokenizer name".to_string()),
            _ => Tokenizer::Custom(name),
        })
    }
}

impl From<Tokenizer> for String {
    fn from(tokenizer: Tokenizer) -> String {
        tokenizer.name().to_string()
    }
}

/// Encoding of binary values in documents and hits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BinaryFormat {
    /// Base64 (standard alphabet, padded).
    #[default]
    Base64,
    /// Hexadecimal.
    Hex,
}

/// Options of a `bytes` field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BytesOptions {
    /// Free text shown in the config only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Stored in the doc store.
    #[serde(default = "default_true")]
    pub stored: bool,
    /// Searchable (exact value).
    #[serde(default = "default_true")]
    pub indexed: bool,
    /// Columnar.
    #[serde(default)]
    pub fast: bool,
    /// How documents encode the value.
    #[serde(default)]
    pub input_format: BinaryFormat,
    /// How hits encode the value.
    #[serde(default)]
    pub output_format: BinaryFormat,
}

/// What the inverted index records per term.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexRecord {
    /// Doc ids only.
    Basic,
    /// Doc ids and term frequencies.
    Freq,
    /// Doc ids, frequencies and positions (needed for phrase queries).
    #[default]
    Position,
}

/// Options of numeric and boolean fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumericOptions {
    /// Free text shown in the config only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Stored in the doc store.
    #[serde(default = "default_true")]
    pub stored: bool,
    /// Searchable.
    #[serde(default = "default_true")]
    pub indexed: bool,
    /// Columnar.
    #[serde(default)]
    pub fast: bool,
}

/// Input formats accepted by datetime fields (Quickwit's names), or a strptime format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DateInputFormat {
    /// `2024-01-02T03:04:05Z`.
    Rfc3339,
    /// ISO 8601, with an offset (`2024-01-02T03:04:05+01:00`, `20240102T030405Z`).
    Iso8601,
    /// A number of seconds (or milli/micro/nanoseconds, guessed from magnitude as Quickwit does).
    UnixTimestamp,
    /// A strptime format such as `%Y-%m-%d %H:%M:%S` (UTC unless it has `%z`).
    Strptime(String),
}

/// The strptime directives a [`DateInputFormat::Strptime`] may use.
pub const STRPTIME_DIRECTIVES: &str = "YymdeHMSfzZbhBaAjTFDRs%";

impl DateInputFormat {
    /// The format's name as written in a config.
    pub fn name(&self) -> &str {
        match self {
            DateInputFormat::Rfc3339 => "rfc3339",
            DateInputFormat::Iso8601 => "iso8601",
            DateInputFormat::UnixTimestamp => "unix_timestamp",
            DateInputFormat::Strptime(format) => format,
        }
    }

    /// The format named `name`, or a strptime format (it has a `%`), checked.
    pub fn parse(name: &str) -> Result<DateInputFormat, String> {
        match name {
            "rfc3339" => Ok(DateInputFormat::Rfc3339),
            "iso8601" => Ok(DateInputFormat::Iso8601),
            "unix_timestamp" => Ok(DateInputFormat::UnixTimestamp),
            format if format.contains('%') => {
                let mut chars = format.chars();
                while let Some(c) = chars.next() {
                    if c != '%' {
                        continue;
                    }
                    match chars.next() {
                        Some(d) if STRPTIME_DIRECTIVES.contains(d) => {}
                        Some(d) => {
                            return Err(format!(
                                "unsupported strptime directive `%{d}` in `{format}` (supported: \
                                 %Y %y %m %d %e %H %M %S %f %z %Z %b %h %B %a %A %j %T %F %D %R \
                                 %s %%)"
                            ))
                        }
                        None => return Err(format!("`{format}` ends with a lone `%`")),
                    }
                }
                Ok(DateInputFormat::Strptime(format.to_string()))
            }
            other => Err(format!(
                "unknown input format `{other}`: expected rfc3339, iso8601, unix_timestamp or a \
                 strptime format such as `%Y-%m-%d %H:%M:%S`"
            )),
        }
    }
}

impl Serialize for DateInputFormat {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for DateInputFormat {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        DateInputFormat::parse(&name).map_err(serde::de::Error::custom)
    }
}

/// Precision of a datetime fast field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FastPrecision {
    /// Seconds.
    #[default]
    Seconds,
    /// Milliseconds.
    Milliseconds,
    /// Microseconds.
    Microseconds,
    /// Nanoseconds.
    Nanoseconds,
}

/// Options of a `datetime` field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatetimeOptions {
    /// Free text shown in the config only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Formats tried in order.
    #[serde(default = "default_input_formats")]
    pub input_formats: Vec<DateInputFormat>,
    /// How hits render the value: `rfc3339` (default), `iso8601`, `unix_timestamp_secs`,
    /// `unix_timestamp_millis`, `unix_timestamp_micros`, `unix_timestamp_nanos`, or a
    /// strptime format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_format: Option<String>,
    /// Precision kept in the fast field.
    #[serde(default)]
    pub fast_precision: FastPrecision,
    /// Stored in the doc store.
    #[serde(default = "default_true")]
    pub stored: bool,
    /// Searchable.
    #[serde(default = "default_true")]
    pub indexed: bool,
    /// Columnar.
    #[serde(default)]
    pub fast: bool,
}

fn default_input_formats() -> Vec<DateInputFormat> {
    vec![DateInputFormat::Rfc3339, DateInputFormat::UnixTimestamp]
}

/// Options of a `json` field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonOptions {
    /// Free text shown in the config only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Stored in the doc store.
    #[serde(default = "default_true")]
    pub stored: bool,
    /// Searchable.
    #[serde(default = "default_true")]
    pub indexed: bool,
    /// Columnar, with an optional normalizer for string values.
    #[serde(default)]
    pub fast: FastOption,
    /// Tokenizer for string values.
    #[serde(default)]
    pub tokenizer: Tokenizer,
    /// What the inverted index records.
    #[serde(default)]
    pub record: IndexRecord,
    /// Record field lengths (for BM25 scoring); off by default, as in Quickwit.
    #[serde(default)]
    pub fieldnorms: bool,
    /// Dotted keys are expanded into objects unless this is `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expand_dots: Option<bool>,
}

/// How undeclared fields are indexed in `dynamic` mode (Quickwit's `dynamic_mapping`): the
/// options of the catch-all json field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DynamicMapping {
    /// Free text shown in the config only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Stored in the doc store (returned in hits).
    #[serde(default = "default_true")]
    pub stored: bool,
    /// Searchable.
    #[serde(default = "default_true")]
    pub indexed: bool,
    /// Columnar (sort, aggregations, range queries), with an optional normalizer.
    #[serde(default = "default_fast_raw")]
    pub fast: FastOption,
    /// Tokenizer of string values.
    #[serde(default)]
    pub tokenizer: Tokenizer,
    /// What the inverted index records.
    #[serde(default)]
    pub record: IndexRecord,
    /// Record field lengths (for BM25 scoring).
    #[serde(default)]
    pub fieldnorms: bool,
    /// Dotted keys (`a.b`) are objects: `{"a.b": 1}` is searched as `a.b`, like
    /// `{"a": {"b": 1}}` (on by default; off, the dot is part of the key).
    #[serde(default = "default_true")]
    pub expand_dots: bool,
}

fn default_fast_raw() -> FastOption {
    FastOption::RAW
}

impl Default for DynamicMapping {
    fn default() -> Self {
        DynamicMapping {
            description: None,
            stored: true,
            indexed: true,
            fast: FastOption::RAW,
            tokenizer: Tokenizer::Default,
            record: IndexRecord::Position,
            fieldnorms: false,
            expand_dots: true,
        }
    }
}

/// Indexing settings: every key of Quickwit's `indexing_settings`, nothing else.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexingSettings {
    /// A split is cut at the latest this long after its first document.
    #[serde(default = "default_commit_timeout_secs")]
    pub commit_timeout_secs: u64,
    /// A split is cut when it holds this many documents; splits this big are mature.
    #[serde(default = "default_split_num_docs_target")]
    pub split_num_docs_target: u64,
    /// The merge policy (typed; validated when the config is parsed).
    #[serde(default)]
    pub merge_policy: crate::MergePolicyConfig,
    /// Quickwit's `resources`: the indexing memory of each split being built.
    #[serde(default, skip_serializing_if = "IndexingResources::is_default")]
    pub resources: IndexingResources,
    /// The zstd level of the splits' document stores (Quickwit's key); unset: Shale's
    /// default, chosen by measurement (README, split format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docstore_compression_level: Option<i32>,
    /// Bytes of documents per compressed block of the document store (Quickwit's key);
    /// bigger blocks compress better and make fetching one document slower.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docstore_blocksize: Option<u64>,
    /// Quickwit's merge policy of Parquet (metrics) splits. Accepted and kept; Shale has no
    /// metrics splits yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parquet_merge_policy: Option<serde_json::Value>,
    /// Quickwit's Parquet (metrics) indexing settings. Accepted and kept; Shale has no
    /// metrics splits yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parquet_indexing: Option<serde_json::Value>,
}

/// Quickwit's `indexing_settings.resources`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexingResources {
    /// `"1GB"`, `"512MiB"` or a number of bytes (see [`IndexingSettings::heap_size_bytes`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_size: Option<serde_json::Value>,
    /// Deprecated in Quickwit (a node-wide limit replaced it); accepted, not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_merge_write_throughput: Option<serde_json::Value>,
}

impl IndexingResources {
    fn is_default(&self) -> bool {
        self == &IndexingResources::default()
    }
}

impl IndexingSettings {
    /// Quickwit's `resources.heap_size` (`"1GB"`, `"512MiB"` or bytes): the indexing memory of
    /// each split being built, when set. At least 15 MB.
    pub fn heap_size_bytes(&self) -> Result<Option<u64>, ConfigError> {
        let field = "indexing_settings.resources.heap_size";
        let invalid = |message: String| ConfigError::Invalid {
            field: field.to_string(),
            message,
        };
        let Some(value) = &self.resources.heap_size else {
            return Ok(None);
        };
        let bytes = match value {
            serde_json::Value::Number(n) => n
                .as_u64()
                .ok_or_else(|| invalid(format!("`{n}` is not a byte size")))?,
            serde_json::Value::String(text) => {
                crate::units::parse_byte_size(text).map_err(|err| match err {
                    ConfigError::Invalid { message, .. } => invalid(message),
                    other => other,
                })?
            }
            other => return Err(invalid(format!("`{other}` is not a byte size"))),
        };
        if bytes < 15_000_000 {
            return Err(invalid(format!(
                "{bytes} bytes is below Tantivy's 15 MB indexing floor"
            )));
        }
        Ok(Some(bytes))
    }
}

fn default_commit_timeout_secs() -> u64 {
    DEFAULT_COMMIT_TIMEOUT_SECS
}
fn default_split_num_docs_target() -> u64 {
    DEFAULT_SPLIT_NUM_DOCS_TARGET
}

impl Default for IndexingSettings {
    fn default() -> Self {
        IndexingSettings {
            commit_timeout_secs: DEFAULT_COMMIT_TIMEOUT_SECS,
            split_num_docs_target: DEFAULT_SPLIT_NUM_DOCS_TARGET,
            merge_policy: crate::MergePolicyConfig::default(),
            resources: IndexingResources::default(),
            docstore_compression_level: None,
            docstore_blocksize: None,
            parquet_merge_policy: None,
            parquet_indexing: None,
        }
    }
}

/// Search settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSettings {
    /// Fields searched by a query term without a field.
    #[serde(default)]
    pub default_search_fields: Vec<String>,
}

/// Retention policy: splits whose time range ends before `now - period` are deleted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionPolicy {
    /// e.g. `90 days`, `12 hours`.
    pub period: String,
    /// e.g. `daily`, `hourly`.
    #[serde(default = "default_retention_schedule")]
    pub schedule: String,
}

fn default_retention_schedule() -> String {
    "hourly".to_string()
}
