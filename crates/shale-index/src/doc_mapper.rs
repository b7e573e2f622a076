//! The doc mapper: a doc mapping turned into a Tantivy schema, a fast JSON → document parser
//! and the way back (stored document → JSON hit).

use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Number, Value};
use shale_config::{
    BinaryFormat, DateInputFormat, DocMapping, FastPrecision, FieldKind, IndexConfig, IndexRecord,
    IndexingSettings, LocalityConfig, MergePolicyConfig, Mode, PartitionKey, SearchSettings,
};
use shale_types::sort_key::{self, SortFieldType, SortValue};
use tantivy::schema::document::{ReferenceValue, ReferenceValueLeaf};
use tantivy::schema::{
    DateOptions, DateTimePrecision, Field, IndexRecordOption, IpAddrOptions, JsonObjectOptions,
    NumericOptions, Schema, TextFieldIndexing, TextOptions, Value as _, FAST, INDEXED, STORED,
};
use tantivy::{DateTime, IndexSettings, IndexSortByField, Order, TantivyDocument};

use crate::date::{format_rfc3339, parse_datetime};
use crate::error::{DocParsingError, IndexError};

/// Largest accepted document, in bytes (as in Quickwit).
pub const MAX_DOC_BYTES: usize = 10 * 1024 * 1024;

/// Name of the catch-all JSON field holding undeclared fields in `dynamic` mode.
pub const DYNAMIC_FIELD_NAME: &str = "_dynamic";

/// Name of the stored field holding the original document when `store_source` is set.
pub const SOURCE_FIELD_NAME: &str = "_source";

/// Name of the indexed field recording which fields a document has
/// (`index_field_presence`): one hash per path present, objects included.
pub const FIELD_PRESENCE_FIELD_NAME: &str = "_field_presence";

/// Name of the fast field holding each document's size in bytes (`store_document_size`).
pub const DOC_LENGTH_FIELD_NAME: &str = "_doc_length";

/// A document parsed by [`DocMapper::parse_doc`], ready for a [`SplitBuilder`](crate::SplitBuilder).
#[derive(Debug)]
pub struct ParsedDoc {
    /// The Tantivy document.
    pub doc: TantivyDocument,
    /// The timestamp field's value in microseconds as its fast column holds it (floored to the
    /// field's precision), when the index has one.
    pub timestamp_micros: Option<i64>,
    /// The partition from the doc mapping's `partition_key`, 0 when there is none. Callers cap
    /// the number of distinct partitions by mapping overflow to
    /// [`OTHER_PARTITION_ID`](crate::OTHER_PARTITION_ID).
    pub partition_id: u64,
    /// `field:value` for every value of every tag field.
    pub tags: Vec<String>,
    /// Size of the JSON document.
    pub num_bytes: usize,
    /// Locality indexes: the document's sort key (see [`shale_types::sort_key`]).
    pub sort_key: Option<Vec<u8>>,
    /// Locality indexes: the start of the document's time bucket (`None` without timestamp).
    pub time_bucket_start: Option<i64>,
    /// The document's ingest opstamp: the last delete opstamp its node knew when it
    /// acknowledged it (0 from [`DocMapper::parse_doc`]; the ingest path sets it). Delete
    /// tasks with a greater opstamp reach the document, later ones do not.
    pub opstamp: u64,
}

/// The hidden fast bytes field holding the sort key of a locality index's documents; the
/// splits of such an index are sorted by it.
pub const SORT_KEY_FIELD_NAME: &str = "_sk";

/// The hidden fast u64 field holding every document's ingest opstamp (see
/// [`ParsedDoc::opstamp`]).
pub const OPSTAMP_FIELD_NAME: &str = "_opstamp";

/// The sort key of a locality index: where its values come from.
#[derive(Clone, Debug)]
struct SortKeySpec {
    /// The hidden [`SORT_KEY_FIELD_NAME`] field.
    field: Field,
    /// The sort fields, most significant first, with their types.
    sources: Vec<(Field, SortFieldType)>,
    /// The policy's settings (time buckets).
    locality: LocalityConfig,
}

/// Type of a declared field, as the parser needs it.
#[derive(Clone, Debug)]
enum MappedKind {
    Text,
    I64,
    U64,
    F64,
    Bool,
    /// Input formats, output format, fast column precision.
    Datetime(Vec<DateInputFormat>, Option<String>, DateTimePrecision),
    Json,
    Bytes(BinaryFormat, BinaryFormat),
    Ip,
    /// Computed from other fields (see [`ConcatField`]); documents cannot set it.
    Concatenate,
}

/// A `concatenate` field: the values of its source fields, indexed as text.
#[derive(Clone, Debug)]
struct ConcatField {
    field: Field,
    sources: Vec<String>,
    include_dynamic: bool,
}

#[derive(Clone, Debug)]
struct MappedField {
    name: String,
    field: Field,
    kind: MappedKind,
    is_tag: bool,
    is_timestamp: bool,
    /// Declared `array<T>`: shown as an array in hits, even with one value.
    array: bool,
}

/// Maps JSON documents to Tantivy documents according to a doc mapping; see the crate docs.
#[derive(Clone)]
pub struct DocMapper {
    doc_mapping: DocMapping,
    schema: Schema,
    fields: Vec<MappedField>,
    by_name: HashMap<String, usize>,
    /// Index into `fields` of the timestamp field.
    timestamp: Option<usize>,
    dynamic_field: Option<Field>,
    source_field: Option<Field>,
    /// `index_field_presence`: the hashes of the paths each document has.
    presence_field: Option<Field>,
    /// `store_document_size`: each document's size in bytes.
    doc_length_field: Option<Field>,
    /// The `concatenate` fields.
    concat_fields: Vec<ConcatField>,
    default_search_fields: Vec<String>,
    partition_key: Option<PartitionKey>,
    sort_key: Option<SortKeySpec>,
    /// The hidden [`OPSTAMP_FIELD_NAME`] field.
    opstamp_field: Field,
    /// Built-in and custom tokenizers, for documents and queries alike.
    tokenizers: tantivy::tokenizer::TokenizerManager,
    /// A mapper over the schema of an older doc mapping ([`DocMapper::with_schema`]): query
    /// terms on fields that schema lacks match nothing instead of being an error.
    pub(crate) older_schema: bool,
    /// The `parent.child` paths of `object` fields: documents' nested objects under them
    /// are walked into their leaf fields, and hits are nested back.
    object_paths: std::collections::HashSet<String>,
    /// How the splits' document stores are written (compression, block size).
    docstore: DocStoreSettings,
}

/// How a split's document store is written: its blocks of documents and their compression
/// (the index's `docstore_compression_level` and `docstore_blocksize`, else the defaults
/// below). A split records its compression, so splits written with other settings stay
/// readable and merge with any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DocStoreSettings {
    /// The zstd level of the blocks; `None`: LZ4.
    pub zstd_level: Option<i32>,
    /// Bytes of documents per compressed block.
    pub blocksize: usize,
}

impl DocStoreSettings {
    /// The zstd level when an index sets none (see the README's split format figures).
    pub const DEFAULT_ZSTD_LEVEL: Option<i32> = DEFAULT_DOCSTORE_ZSTD_LEVEL;
    /// The block size when an index sets none.
    pub const DEFAULT_BLOCKSIZE: usize = DEFAULT_DOCSTORE_BLOCKSIZE;

    /// The settings of an index config.
    pub fn of(settings: &shale_config::IndexingSettings) -> Self {
        DocStoreSettings {
            zstd_level: settings
                .docstore_compression_level
                .or(Self::DEFAULT_ZSTD_LEVEL),
            blocksize: settings
                .docstore_blocksize
                .map_or(Self::DEFAULT_BLOCKSIZE, |b| b as usize),
        }
    }

    fn compressor(&self) -> tantivy::store::Compressor {
        match self.zstd_level {
            Some(level) => tantivy::store::Compressor::Zstd(tantivy::store::ZstdCompressor {
                compression_level: Some(level),
            }),
            None => tantivy::store::Compressor::Lz4,
        }
    }
}

impl Default for DocStoreSettings {
    fn default() -> Self {
        DocStoreSettings {
            zstd_level: Self::DEFAULT_ZSTD_LEVEL,
            blocksize: Self::DEFAULT_BLOCKSIZE,
        }
    }
}

/// Chosen by measurement (`shale-bench split-format`, README): zstd level 3 on 64 KB blocks.
const DEFAULT_DOCSTORE_ZSTD_LEVEL: Option<i32> = Some(3);
const DEFAULT_DOCSTORE_BLOCKSIZE: usize = 65_536;

impl fmt::Debug for DocMapper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocMapper")
            .field("doc_mapping", &self.doc_mapping)
            .field("default_search_fields", &self.default_search_fields)
            .finish()
    }
}

fn record_option(record: IndexRecord) -> IndexRecordOption {
    match record {
        IndexRecord::Basic => IndexRecordOption::Basic,
        IndexRecord::Freq => IndexRecordOption::WithFreqs,
        IndexRecord::Position => IndexRecordOption::WithFreqsAndPositions,
    }
}

/// Applies a field config's `stored`, `indexed` and `fast` flags to Tantivy options (each
/// options type has the three setters, with no common trait).
macro_rules! with_flags {
    ($options:expr, $config:expr) => {{
        let mut options = $options;
        if $config.stored {
            options = options.set_stored();
        }
        if $config.indexed {
            options = options.set_indexed();
        }
        if $config.fast {
            options = options.set_fast();
        }
        options
    }};
}

fn numeric_options(stored: bool, indexed: bool, fast: bool) -> NumericOptions {
    let mut options = NumericOptions::default();
    if stored {
        options = options.set_stored();
    }
    if indexed {
        options = options.set_indexed();
    }
    if fast {
        options = options.set_fast();
    }
    options
}

pub(crate) fn date_precision(precision: FastPrecision) -> DateTimePrecision {
    match precision {
        FastPrecision::Seconds => DateTimePrecision::Seconds,
        FastPrecision::Milliseconds => DateTimePrecision::Milliseconds,
        FastPrecision::Microseconds => DateTimePrecision::Microseconds,
        FastPrecision::Nanoseconds => DateTimePrecision::Nanoseconds,
    }
}

/// Tantivy options of a json field (declared, or the catch-all of dynamic mode).
struct JsonFieldOptions<'a> {
    stored: bool,
    indexed: bool,
    /// The fast-field tokenizer (normalizer), when fast.
    fast: Option<&'a str>,
    tokenizer: &'a str,
    record: IndexRecordOption,
    fieldnorms: bool,
    expand_dots: bool,
}

fn json_options(o: JsonFieldOptions<'_>) -> JsonObjectOptions {
    let mut options = JsonObjectOptions::default();
    if o.expand_dots {
        options = options.set_expand_dots_enabled();
    }
    if o.stored {
        options = options.set_stored();
    }
    if o.indexed {
        options = options.set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(o.tokenizer)
                .set_index_option(o.record)
                .set_fieldnorms(o.fieldnorms),
        );
    }
    if let Some(normalizer) = o.fast {
        options = options.set_fast(normalizer);
    }
    options
}

/// The hash recorded in [`FIELD_PRESENCE_FIELD_NAME`] for a field path (64-bit FNV-1a: stable
/// across versions and platforms, as it is written into splits).
pub fn field_presence_hash(path: &str) -> u64 {
    path.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Shortens long values quoted in error messages.
pub(crate) fn truncate_for_message(text: &str) -> String {
    const MAX: usize = 64;
    if text.len() <= MAX {
        return text.to_string();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `a string "abc"`, `the number 1.5`, … for error messages.
pub(crate) fn describe_value(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(flag) => format!("a boolean `{flag}`"),
        Value::Number(number) => format!("the number `{number}`"),
        Value::String(text) => format!("the string \"{}\"", truncate_for_message(text)),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

fn coerce_i64(value: &Value) -> Option<i64> {
    match value {
        Value::Number(number) => number.as_i64().or_else(|| {
            let float = number.as_f64()?;
            (float.fract() == 0.0 && float >= i64::MIN as f64 && float < i64::MAX as f64)
                .then_some(float as i64)
        }),
        Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

fn coerce_u64(value: &Value) -> Option<u64> {
    match value {
        Value::Number(number) => number.as_u64().or_else(|| {
            let float = number.as_f64()?;
            (float.fract() == 0.0 && float >= 0.0 && float < u64::MAX as f64)
                .then_some(float as u64)
        }),
        Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

fn coerce_f64(value: &Value) -> Option<f64> {
    match value {
        Value::Number(number) => number.as_f64(),
        Value::String(text) => text.trim().parse().ok().filter(|f: &f64| f.is_finite()),
        _ => None,
    }
}

fn coerce_bool(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(flag) => Some(*flag),
        Value::String(text) => match text.trim() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// Every part of an index config a [`DocMapper`] is built from: [`DocMapper::for_index`] reads
/// nothing else, so configs with equal inputs give equal mappers and [`key`](Self::key) keys a
/// cache of mappers (whatever an index update changes among them is a new key).
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct MapperInputs<'a> {
    doc_mapping: &'a DocMapping,
    search_settings: &'a SearchSettings,
    /// The merge policy (a `locality` one adds the sort key) and the document store settings.
    indexing_settings: &'a IndexingSettings,
    /// A metrics index (its `locality` sort fields are Parquet columns, not fields).
    metrics: bool,
}

impl<'a> MapperInputs<'a> {
    /// The inputs of `config`.
    pub fn of(config: &'a IndexConfig) -> Self {
        MapperInputs {
            doc_mapping: &config.doc_mapping,
            search_settings: &config.search_settings,
            indexing_settings: &config.indexing_settings,
            metrics: config.metrics.is_some(),
        }
    }

    /// The inputs serialized: equal keys, equal mappers.
    pub fn key(&self) -> String {
        // Plain data serializes; the debug form is as complete, should it ever not.
        serde_json::to_string(self).unwrap_or_else(|_| format!("{self:?}"))
    }
}

impl DocMapper {
    /// Builds the schema of a doc mapping (validated first).
    ///
    /// Field types map to Tantivy as follows: `text` → text field (tokenizer `default` or
    /// `raw`, `record` → [`IndexRecordOption`], `fast` → fast column of the raw value), `i64`,
    /// `u64`, `f64`, `bool` → numeric fields, `datetime` → date field (fast column precision
    /// from `fast_precision`), `json` → JSON field (dots in keys expanded). In `dynamic` mode a
    /// catch-all JSON field [`DYNAMIC_FIELD_NAME`] (stored, indexed, fast) receives undeclared
    /// fields; with `store_source` the original document is kept in [`SOURCE_FIELD_NAME`].
    pub fn new(
        doc_mapping: &DocMapping,
        search_settings: &SearchSettings,
    ) -> Result<DocMapper, IndexError> {
        Self::build(doc_mapping, search_settings, None)
    }

    /// The doc mapper of an index: [`new`](DocMapper::new), plus, when its merge policy is
    /// `locality`, the hidden sort key field ([`SORT_KEY_FIELD_NAME`]) its splits are sorted by
    /// and the time bucket of every document.
    pub fn for_index(config: &IndexConfig) -> Result<DocMapper, IndexError> {
        Self::from_inputs(MapperInputs::of(config))
    }

    /// The doc mapper of [`MapperInputs`] (what [`for_index`](DocMapper::for_index) builds).
    pub fn from_inputs(inputs: MapperInputs<'_>) -> Result<DocMapper, IndexError> {
        let locality = match &inputs.indexing_settings.merge_policy {
            // A metrics index's sort fields are columns of its Parquet splits, not fields.
            MergePolicyConfig::Locality(_) if inputs.metrics => None,
            MergePolicyConfig::Locality(locality) => Some(locality),
            _ => None,
        };
        let mut mapper = Self::build(inputs.doc_mapping, inputs.search_settings, locality)?;
        mapper.docstore = DocStoreSettings::of(inputs.indexing_settings);
        Ok(mapper)
    }

    /// The doc mapper of an older doc mapping version of an index (`config` as it was when
    /// that version was created): it reads and writes that version's splits exactly, and
    /// parses queries written against the current mapping leniently — terms on fields that
    /// version lacks match nothing.
    pub fn for_older_version(config: &IndexConfig) -> Result<DocMapper, IndexError> {
        let mut mapper = Self::for_index(config)?;
        mapper.older_schema = true;
        Ok(mapper)
    }

    fn build(
        doc_mapping: &DocMapping,
        search_settings: &SearchSettings,
        locality: Option<&LocalityConfig>,
    ) -> Result<DocMapper, IndexError> {
        doc_mapping.validate()?;
        let mut builder = Schema::builder();
        let leaf_mappings = doc_mapping.leaf_field_mappings();
        let mut fields = Vec::with_capacity(leaf_mappings.len());
        let mut concat_fields = Vec::new();
        for mapping in &leaf_mappings {
            let name = mapping.name.as_str();
            let (field, kind) = match &mapping.kind {
                FieldKind::Text(o) => {
                    let mut options = TextOptions::default();
                    if o.stored {
                        options = options.set_stored();
                    }
                    if o.indexed {
                        options = options.set_indexing_options(
                            TextFieldIndexing::default()
                                .set_tokenizer(o.tokenizer.name())
                                .set_index_option(record_option(o.record))
                                .set_fieldnorms(o.fieldnorms),
                        );
                    }
                    if let Some(normalizer) = o.fast.tokenizer_name() {
                        options = options.set_fast(normalizer);
                    }
                    (builder.add_text_field(name, options), MappedKind::Text)
                }
                FieldKind::I64(o) => (
                    builder.add_i64_field(name, numeric_options(o.stored, o.indexed, o.fast)),
                    MappedKind::I64,
                ),
                FieldKind::U64(o) => (
                    builder.add_u64_field(name, numeric_options(o.stored, o.indexed, o.fast)),
                    MappedKind::U64,
                ),
                FieldKind::F64(o) => (
                    builder.add_f64_field(name, numeric_options(o.stored, o.indexed, o.fast)),
                    MappedKind::F64,
                ),
                FieldKind::Bool(o) => (
                    builder.add_bool_field(name, numeric_options(o.stored, o.indexed, o.fast)),
                    MappedKind::Bool,
                ),
                FieldKind::Datetime(o) => {
                    let options = with_flags!(
                        DateOptions::default().set_precision(date_precision(o.fast_precision)),
                        o
                    );
                    let formats = if o.input_formats.is_empty() {
                        vec![DateInputFormat::Rfc3339, DateInputFormat::UnixTimestamp]
                    } else {
                        o.input_formats.clone()
                    };
                    (
                        builder.add_date_field(name, options),
                        MappedKind::Datetime(
                            formats,
                            o.output_format.clone(),
                            date_precision(o.fast_precision),
                        ),
                    )
                }
                FieldKind::Json(o) => (
                    builder.add_json_field(
                        name,
                        json_options(JsonFieldOptions {
                            stored: o.stored,
                            indexed: o.indexed,
                            fast: o.fast.tokenizer_name(),
                            tokenizer: o.tokenizer.name(),
                            record: record_option(o.record),
                            fieldnorms: o.fieldnorms,
                            expand_dots: o.expand_dots != Some(false),
                        }),
                    ),
                    MappedKind::Json,
                ),
                FieldKind::Bytes(o) => {
                    let options = with_flags!(tantivy::schema::BytesOptions::default(), o);
                    (
                        builder.add_bytes_field(name, options),
                        MappedKind::Bytes(o.input_format, o.output_format),
                    )
                }
                FieldKind::Concatenate(o) => {
                    let options = TextOptions::default().set_indexing_options(
                        TextFieldIndexing::default()
                            .set_tokenizer(o.tokenizer.name())
                            .set_index_option(record_option(o.record))
                            .set_fieldnorms(o.fieldnorms),
                    );
                    let field = builder.add_text_field(name, options);
                    concat_fields.push(ConcatField {
                        field,
                        sources: o.concatenate_fields.clone(),
                        include_dynamic: o.include_dynamic_fields,
                    });
                    (field, MappedKind::Concatenate)
                }
                FieldKind::Ip(o) => {
                    let options = with_flags!(IpAddrOptions::default(), o);
                    (builder.add_ip_addr_field(name, options), MappedKind::Ip)
                }
                // Objects are flattened into their leaves by `leaf_field_mappings`.
                FieldKind::Object(_) => continue,
            };
            fields.push(MappedField {
                name: name.to_string(),
                field,
                kind,
                is_tag: doc_mapping.tag_fields.iter().any(|t| t == name),
                is_timestamp: doc_mapping.timestamp_field.as_deref() == Some(name),
                array: mapping.array,
            });
        }
        let dynamic_field = (doc_mapping.mode == Mode::Dynamic).then(|| {
            let o = doc_mapping.dynamic_options();
            builder.add_json_field(
                DYNAMIC_FIELD_NAME,
                json_options(JsonFieldOptions {
                    stored: o.stored,
                    indexed: o.indexed,
                    fast: o.fast.tokenizer_name(),
                    tokenizer: o.tokenizer.name(),
                    record: record_option(o.record),
                    fieldnorms: o.fieldnorms,
                    expand_dots: o.expand_dots,
                }),
            )
        });
        let source_field = doc_mapping
            .store_source
            .then(|| builder.add_text_field(SOURCE_FIELD_NAME, STORED));
        let presence_field = doc_mapping
            .index_field_presence
            .then(|| builder.add_u64_field(FIELD_PRESENCE_FIELD_NAME, INDEXED));
        let doc_length_field = doc_mapping
            .store_document_size
            .then(|| builder.add_u64_field(DOC_LENGTH_FIELD_NAME, FAST));
        let sort_key = match locality {
            None => None,
            Some(locality) => {
                let kinds = locality.sort_field_types(doc_mapping).map_err(|err| {
                    IndexError::from(shale_config::ConfigError::Invalid {
                        field: err.field,
                        message: err.message,
                    })
                })?;
                let sources = locality
                    .sort_fields
                    .iter()
                    .zip(kinds)
                    .filter_map(|(name, kind)| {
                        fields
                            .iter()
                            .find(|mapped| &mapped.name == name)
                            .map(|mapped| (mapped.field, kind))
                    })
                    .collect();
                Some(SortKeySpec {
                    field: builder.add_bytes_field(SORT_KEY_FIELD_NAME, FAST),
                    sources,
                    locality: locality.clone(),
                })
            }
        };
        let opstamp_field = builder.add_u64_field(OPSTAMP_FIELD_NAME, FAST);
        let schema = builder.build();

        let by_name: HashMap<String, usize> = fields
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.clone(), i))
            .collect();
        let timestamp = fields.iter().position(|f| f.is_timestamp);

        // As in Quickwit: no implicit default search fields (a term without a field then
        // needs `search_field` in the request).
        search_settings.validate_against(doc_mapping)?;
        let default_search_fields = search_settings.default_search_fields.clone();

        let tokenizers = crate::tokenizers::tokenizer_manager(&doc_mapping.tokenizers)?;
        Ok(DocMapper {
            object_paths: doc_mapping.object_paths().into_iter().collect(),
            older_schema: false,
            tokenizers,
            partition_key: doc_mapping.partition_key()?,
            doc_mapping: doc_mapping.clone(),
            schema,
            fields,
            by_name,
            timestamp,
            dynamic_field,
            source_field,
            presence_field,
            doc_length_field,
            concat_fields,
            default_search_fields,
            sort_key,
            opstamp_field,
            docstore: DocStoreSettings::default(),
        })
    }

    /// This mapper over `schema`, the schema of a split written under an older doc mapping
    /// of the index: fields are resolved by name in it (fields it lacks are left out), so
    /// queries, time filters, delete filters and documents of that split use its own field
    /// ids.
    pub fn with_schema(&self, schema: Schema) -> DocMapper {
        let by_name_in = |name: &str| schema.get_field(name).ok();
        let mut fields = Vec::with_capacity(self.fields.len());
        for mapped in &self.fields {
            // A field whose type changed since is left out too: a term of the current type
            // on a field of another type would be meaningless (or refused by Tantivy).
            let same_type = |field: Field| {
                schema.get_field_entry(field).field_type().value_type()
                    == self
                        .schema
                        .get_field_entry(mapped.field)
                        .field_type()
                        .value_type()
            };
            if let Some(field) = by_name_in(&mapped.name).filter(|field| same_type(*field)) {
                fields.push(MappedField {
                    field,
                    ..mapped.clone()
                });
            }
        }
        let by_name: HashMap<String, usize> = fields
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.clone(), i))
            .collect();
        let timestamp = fields.iter().position(|f| f.is_timestamp);
        let default_search_fields = self
            .default_search_fields
            .iter()
            .filter(|name| by_name_in(name).is_some())
            .cloned()
            .collect();
        DocMapper {
            doc_mapping: self.doc_mapping.clone(),
            fields,
            by_name,
            timestamp,
            dynamic_field: by_name_in(DYNAMIC_FIELD_NAME),
            source_field: by_name_in(SOURCE_FIELD_NAME),
            presence_field: by_name_in(FIELD_PRESENCE_FIELD_NAME),
            doc_length_field: by_name_in(DOC_LENGTH_FIELD_NAME),
            concat_fields: self
                .concat_fields
                .iter()
                .filter_map(|concat| {
                    let name = self.schema.get_field_name(concat.field);
                    by_name_in(name).map(|field| ConcatField {
                        field,
                        ..concat.clone()
                    })
                })
                .collect(),
            default_search_fields,
            partition_key: self.partition_key.clone(),
            sort_key: None,
            opstamp_field: by_name_in(OPSTAMP_FIELD_NAME).unwrap_or(self.opstamp_field),
            tokenizers: self.tokenizers.clone(),
            older_schema: true,
            object_paths: self.object_paths.clone(),
            docstore: self.docstore,
            schema,
        }
    }

    /// The tokenizers of the index (built-in and custom): splits are written and queries
    /// parsed with them.
    pub fn tokenizer_manager(&self) -> &tantivy::tokenizer::TokenizerManager {
        &self.tokenizers
    }

    /// The hidden field of the documents' ingest opstamps.
    pub fn opstamp_field(&self) -> Field {
        self.opstamp_field
    }

    /// The settings of a split's Tantivy index: sorted by [`SORT_KEY_FIELD_NAME`] for a
    /// locality index, its document store as [`DocStoreSettings`] say.
    pub fn index_settings(&self) -> IndexSettings {
        IndexSettings {
            sort_by_field: self.sort_key.as_ref().map(|_| IndexSortByField {
                field: SORT_KEY_FIELD_NAME.to_string(),
                order: Order::Asc,
            }),
            docstore_compression: self.docstore.compressor(),
            docstore_blocksize: self.docstore.blocksize,
            ..IndexSettings::default()
        }
    }

    /// How this mapper's splits' document stores are written.
    pub fn docstore_settings(&self) -> DocStoreSettings {
        self.docstore
    }

    /// This mapper, writing document stores as `docstore` says.
    pub fn with_docstore_settings(mut self, docstore: DocStoreSettings) -> Self {
        self.docstore = docstore;
        self
    }

    /// The sort fields of a locality index (names and types), most significant first.
    pub fn sort_fields(&self) -> Option<Vec<(String, SortFieldType)>> {
        self.sort_key.as_ref().map(|spec| {
            spec.sources
                .iter()
                .map(|(field, kind)| (self.schema.get_field_name(*field).to_string(), *kind))
                .collect()
        })
    }

    /// The names of the sort fields of a locality index, most significant first: what its
    /// splits record as the fields their sort keys were encoded with.
    pub fn sort_field_names(&self) -> Option<Vec<String>> {
        self.sort_fields()
            .map(|fields| fields.into_iter().map(|(name, _)| name).collect())
    }

    /// The types of the sort fields of a locality index, most significant first.
    pub fn sort_field_types(&self) -> Option<Vec<SortFieldType>> {
        self.sort_key
            .as_ref()
            .map(|spec| spec.sources.iter().map(|(_, kind)| *kind).collect())
    }

    /// The sort key of a parsed document (its first value of each sort field, then its
    /// timestamp), for a locality index.
    fn sort_key_of(
        &self,
        spec: &SortKeySpec,
        doc: &TantivyDocument,
        micros: Option<i64>,
    ) -> Result<Vec<u8>, DocParsingError> {
        let mut key = Vec::with_capacity(32);
        for (field, kind) in &spec.sources {
            // One value per sort field: a document sorts at one place, and a split's key range
            // then bounds every value a query can match (pruning stays exact).
            if doc.get_all(*field).nth(1).is_some() {
                return Err(DocParsingError::InvalidValue {
                    field: self.schema.get_field_name(*field).to_string(),
                    message: "a sort field of a `locality` index takes one value, not an array"
                        .to_string(),
                });
            }
            let value = doc.get_first(*field);
            let value = match (kind, value) {
                (_, None) => SortValue::Missing,
                (SortFieldType::Text, Some(v)) => v
                    .as_str()
                    .map_or(SortValue::Missing, |t| SortValue::Text(t.to_string())),
                (SortFieldType::U64, Some(v)) => {
                    v.as_u64().map_or(SortValue::Missing, SortValue::U64)
                }
                (SortFieldType::I64, Some(v)) => {
                    v.as_i64().map_or(SortValue::Missing, SortValue::I64)
                }
                (SortFieldType::Bool, Some(v)) => {
                    v.as_bool().map_or(SortValue::Missing, SortValue::Bool)
                }
                (SortFieldType::DateTime, Some(v)) => {
                    v.as_datetime().map_or(SortValue::Missing, |d| {
                        SortValue::I64(crate::date::floor_micros(d))
                    })
                }
            };
            sort_key::push_value(&mut key, *kind, &value);
        }
        sort_key::push_timestamp(&mut key, micros);
        Ok(key)
    }

    /// The Tantivy schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The doc mapping this mapper was built from.
    pub fn doc_mapping(&self) -> &DocMapping {
        &self.doc_mapping
    }

    /// The timestamp field's name, when the index has one.
    pub fn timestamp_field_name(&self) -> Option<&str> {
        self.timestamp.map(|i| self.fields[i].name.as_str())
    }

    /// The timestamp field, when the index has one.
    pub fn timestamp_field(&self) -> Option<Field> {
        self.timestamp.map(|i| self.fields[i].field)
    }

    /// Fields searched by terms without a field: the configured ones, or else every indexed
    /// text field plus [`DYNAMIC_FIELD_NAME`] in dynamic mode.
    pub fn default_search_fields(&self) -> &[String] {
        &self.default_search_fields
    }

    /// The tag fields.
    pub fn tag_fields(&self) -> &[String] {
        &self.doc_mapping.tag_fields
    }

    /// The parsed partition key, if any.
    pub fn partition_key(&self) -> Option<&PartitionKey> {
        self.partition_key.as_ref()
    }

    /// `doc_mapping.max_num_partitions`.
    pub fn max_num_partitions(&self) -> u32 {
        self.doc_mapping.max_num_partitions
    }

    /// The catch-all JSON field, in dynamic mode.
    pub fn dynamic_field(&self) -> Option<Field> {
        self.dynamic_field
    }

    /// The `_source` field, with `store_source`.
    pub fn source_field(&self) -> Option<Field> {
        self.source_field
    }

    /// Parses one JSON document (an object of at most [`MAX_DOC_BYTES`]).
    ///
    /// Declared fields are type-checked: numeric fields accept numbers and numeric strings
    /// (`"42"`), `bool` accepts `true`/`false` and `"true"`/`"false"`, `text` requires strings,
    /// `json` objects, `datetime` is parsed with the field's `input_formats`. Arrays give
    /// multi-valued fields; `null` values are ignored. Undeclared fields are ignored (`lenient`),
    /// rejected (`strict`) or kept in [`DYNAMIC_FIELD_NAME`] (`dynamic`). When the index has a
    /// timestamp field the document must have one parsable value for it (an array of several is
    /// refused, naming the field).
    pub fn parse_doc(&self, json: &[u8]) -> Result<ParsedDoc, DocParsingError> {
        let num_bytes = json.len();
        if num_bytes > MAX_DOC_BYTES {
            return Err(DocParsingError::TooLarge {
                num_bytes,
                max_bytes: MAX_DOC_BYTES,
            });
        }
        match json.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{') => {}
            Some(_) => {
                // Distinguish `[1, 2]` (valid JSON, wrong shape) from garbage.
                return Err(
                    match serde_json::from_slice::<serde::de::IgnoredAny>(json) {
                        Ok(_) => DocParsingError::NotAnObject,
                        Err(err) => DocParsingError::InvalidJson(err.to_string()),
                    },
                );
            }
            None => return Err(DocParsingError::InvalidJson("empty document".to_string())),
        }
        let object: Map<String, Value> = serde_json::from_slice(json)
            .map_err(|err| DocParsingError::InvalidJson(err.to_string()))?;
        let mut doc = TantivyDocument::default();
        if let Some(presence_field) = self.presence_field {
            let mut hashes = Vec::new();
            self.present_paths(&object, "", &mut hashes);
            hashes.sort_unstable();
            hashes.dedup();
            for hash in hashes {
                doc.add_u64(presence_field, hash);
            }
        }
        if let Some(doc_length_field) = self.doc_length_field {
            doc.add_u64(doc_length_field, num_bytes as u64);
        }
        if !self.concat_fields.is_empty() {
            let mut texts = vec![Vec::new(); self.concat_fields.len()];
            self.concat_values(&object, "", &mut texts);
            for (concat, texts) in self.concat_fields.iter().zip(texts) {
                for text in texts {
                    doc.add_text(concat.field, text);
                }
            }
        }

        let partition_id = self
            .partition_key
            .as_ref()
            .map_or(0, |key| key.partition_id(&object));
        if let Some(source_field) = self.source_field {
            let text = std::str::from_utf8(json)
                .map_err(|err| DocParsingError::InvalidJson(err.to_string()))?;
            doc.add_text(source_field, text);
        }
        let mut tags = Vec::new();
        let mut timestamp: Option<DateTime> = None;
        let mut dynamic: Option<Map<String, Value>> = None;
        for (key, value) in object {
            self.add_entry(
                &mut doc,
                key,
                value,
                &mut tags,
                &mut timestamp,
                &mut dynamic,
            )?;
        }
        if let (Some(dynamic_field), Some(dynamic)) = (self.dynamic_field, dynamic) {
            doc.add_field_value(dynamic_field, &Value::Object(dynamic));
        }
        let timestamp_micros = match (self.timestamp, timestamp) {
            (None, _) => None,
            (Some(_), Some(timestamp)) => Some(crate::date::floor_micros(timestamp)),
            (Some(i), None) => {
                return Err(DocParsingError::MissingTimestamp {
                    field: self.fields[i].name.clone(),
                })
            }
        };
        let (sort_key, time_bucket_start) = match &self.sort_key {
            None => (None, None),
            Some(spec) => {
                let key = self.sort_key_of(spec, &doc, timestamp_micros)?;
                doc.add_bytes(spec.field, &key);
                let bucket = timestamp_micros.map(|micros| {
                    spec.locality
                        .bucket_start(shale_types::time::secs_of_micros(micros))
                });
                (Some(key), bucket)
            }
        };
        Ok(ParsedDoc {
            doc,
            timestamp_micros,
            partition_id,
            tags,
            num_bytes,
            sort_key,
            time_bucket_start,
            opstamp: 0,
        })
    }

    /// Adds to `hashes` the [`field_presence_hash`] of every path of `object` (under
    /// `prefix`) that holds a value (not null, not an empty string or array), and of the
    /// objects above it: `{"a": {"b": 1}}` has `a` and `a.b`; a dotted key `"a.b"` counts as `a` then `b`. In lenient mode, undeclared
    /// top-level fields are not indexed, so they are not present either.
    fn present_paths(&self, object: &Map<String, Value>, prefix: &str, hashes: &mut Vec<u64>) {
        fn has_value(value: &Value) -> bool {
            match value {
                Value::Null => false,
                Value::Array(items) => items.iter().any(has_value),
                Value::Object(entries) => entries.values().any(has_value),
                // As in Quickwit, an empty string is no value.
                Value::String(text) => !text.is_empty(),
                _ => true,
            }
        }
        for (key, value) in object {
            if !has_value(value) {
                continue;
            }
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            if prefix.is_empty() && self.doc_mapping.mode == Mode::Lenient {
                let top = key.split('.').next().unwrap_or(key);
                if self.doc_mapping.field_mapping(top).is_none()
                    && self.doc_mapping.field_mapping(key).is_none()
                {
                    continue;
                }
            }
            for (dot, _) in key.match_indices('.') {
                let ancestor = if prefix.is_empty() {
                    key[..dot].to_string()
                } else {
                    format!("{prefix}.{}", &key[..dot])
                };
                hashes.push(field_presence_hash(&ancestor));
            }
            hashes.push(field_presence_hash(&path));
            let mut walk = |value: &Value| {
                if let Value::Object(inner) = value {
                    self.present_paths(inner, &path, hashes);
                }
            };
            match value {
                Value::Array(items) => items.iter().for_each(&mut walk),
                other => walk(other),
            }
        }
    }

    /// Collects, per `concatenate` field, the values of `object` (under `prefix`) it indexes:
    /// those of its source fields (json leaves included) and, with `include_dynamic_fields`,
    /// those of undeclared fields. Strings as they are, numbers and booleans as written.
    fn concat_values(&self, object: &Map<String, Value>, prefix: &str, out: &mut [Vec<String>]) {
        fn leaves(value: &Value, out: &mut Vec<String>) {
            match value {
                Value::Null => {}
                Value::String(text) => out.push(text.clone()),
                Value::Number(number) => out.push(number.to_string()),
                Value::Bool(flag) => out.push(flag.to_string()),
                Value::Array(items) => items.iter().for_each(|item| leaves(item, out)),
                Value::Object(entries) => entries.values().for_each(|item| leaves(item, out)),
            }
        }
        for (key, value) in object {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            if self.by_name.contains_key(&path) {
                for (i, concat) in self.concat_fields.iter().enumerate() {
                    if concat.sources.contains(&path) {
                        leaves(value, &mut out[i]);
                    }
                }
                continue;
            }
            if self.object_paths.contains(&path) {
                let mut walk = |value: &Value| {
                    if let Value::Object(inner) = value {
                        self.concat_values(inner, &path, out);
                    }
                };
                match value {
                    Value::Array(items) => items.iter().for_each(&mut walk),
                    other => walk(other),
                }
                continue;
            }
            if self.doc_mapping.mode == Mode::Dynamic {
                for (i, concat) in self.concat_fields.iter().enumerate() {
                    if concat.include_dynamic {
                        leaves(value, &mut out[i]);
                    }
                }
            }
        }
    }

    /// The `index_field_presence` field, if the index has it.
    pub fn presence_field(&self) -> Option<Field> {
        self.presence_field
    }

    /// Adds the document entry `path: value`: a declared field, the content of an `object`
    /// field (walked into its fields), or an undeclared field (handled by the mode).
    fn add_entry(
        &self,
        doc: &mut TantivyDocument,
        path: String,
        value: Value,
        tags: &mut Vec<String>,
        timestamp: &mut Option<DateTime>,
        dynamic: &mut Option<Map<String, Value>>,
    ) -> Result<(), DocParsingError> {
        if value.is_null() {
            return Ok(());
        }
        if let Some(&i) = self.by_name.get(path.as_str()) {
            let mapped = &self.fields[i];
            return self.add_value(doc, mapped, &value, tags, timestamp);
        }
        if self.object_paths.contains(&path) {
            let objects = match value {
                Value::Object(object) => vec![object],
                Value::Array(items) => items
                    .into_iter()
                    .filter_map(|item| match item {
                        Value::Object(object) => Some(object),
                        _ => None,
                    })
                    .collect(),
                other => {
                    return Err(DocParsingError::InvalidValue {
                        field: path,
                        message: format!("expected an object, got {}", describe_value(&other)),
                    })
                }
            };
            for object in objects {
                for (key, value) in object {
                    self.add_entry(
                        doc,
                        format!("{path}.{key}"),
                        value,
                        tags,
                        timestamp,
                        dynamic,
                    )?;
                }
            }
            return Ok(());
        }
        match self.doc_mapping.mode {
            Mode::Lenient => {}
            Mode::Strict => return Err(DocParsingError::UnknownField { field: path }),
            Mode::Dynamic => {
                // Dots expand into objects in the dynamic field.
                dynamic.get_or_insert_with(Map::new).insert(path, value);
            }
        }
        Ok(())
    }

    /// Adds one (possibly array) value of a declared field.
    fn add_value(
        &self,
        doc: &mut TantivyDocument,
        mapped: &MappedField,
        value: &Value,
        tags: &mut Vec<String>,
        timestamp: &mut Option<DateTime>,
    ) -> Result<(), DocParsingError> {
        if let Value::Array(values) = value {
            for value in values {
                match value {
                    Value::Null => {}
                    Value::Array(_) => {
                        return Err(DocParsingError::InvalidValue {
                            field: mapped.name.clone(),
                            message: "nested arrays are not supported".to_string(),
                        })
                    }
                    _ => self.add_leaf(doc, mapped, value, tags, timestamp)?,
                }
            }
            Ok(())
        } else {
            self.add_leaf(doc, mapped, value, tags, timestamp)
        }
    }

    fn add_leaf(
        &self,
        doc: &mut TantivyDocument,
        mapped: &MappedField,
        value: &Value,
        tags: &mut Vec<String>,
        timestamp: &mut Option<DateTime>,
    ) -> Result<(), DocParsingError> {
        let wrong_type = |expected: &str| DocParsingError::InvalidValue {
            field: mapped.name.clone(),
            message: format!("expected {expected}, got {}", describe_value(value)),
        };
        let field = mapped.field;
        match &mapped.kind {
            MappedKind::Text => {
                let Value::String(text) = value else {
                    return Err(wrong_type("a string"));
                };
                doc.add_text(field, text);
                if mapped.is_tag {
                    tags.push(format!("{}:{text}", mapped.name));
                }
            }
            MappedKind::I64 => {
                let number = coerce_i64(value).ok_or_else(|| wrong_type("an i64"))?;
                doc.add_i64(field, number);
                if mapped.is_tag {
                    tags.push(format!("{}:{number}", mapped.name));
                }
            }
            MappedKind::U64 => {
                let number = coerce_u64(value).ok_or_else(|| wrong_type("a u64"))?;
                doc.add_u64(field, number);
                if mapped.is_tag {
                    tags.push(format!("{}:{number}", mapped.name));
                }
            }
            MappedKind::F64 => {
                let number = coerce_f64(value).ok_or_else(|| wrong_type("an f64"))?;
                doc.add_f64(field, number);
            }
            MappedKind::Bool => {
                let flag = coerce_bool(value).ok_or_else(|| wrong_type("a boolean"))?;
                doc.add_bool(field, flag);
                if mapped.is_tag {
                    tags.push(format!("{}:{flag}", mapped.name));
                }
            }
            MappedKind::Datetime(formats, _, precision) => {
                if mapped.is_timestamp && timestamp.is_some() {
                    // A split's time range and the time filter read one timestamp per
                    // document (Quickwit refuses several values for it too).
                    return Err(DocParsingError::InvalidTimestamp {
                        field: mapped.name.clone(),
                        message: "takes one value, not several".to_string(),
                    });
                }
                let datetime = parse_datetime(value, formats).map_err(|message| {
                    if mapped.is_timestamp {
                        DocParsingError::InvalidTimestamp {
                            field: mapped.name.clone(),
                            message,
                        }
                    } else {
                        DocParsingError::InvalidValue {
                            field: mapped.name.clone(),
                            message,
                        }
                    }
                })?;
                // The fast column holds the value floored to its precision (Tantivy would
                // truncate toward zero: before 1970 that is the next unit, not the one holding
                // the instant). Only such values change; the others keep their exact stored
                // value, Tantivy's truncation of them being the floor already.
                let floored = crate::date::floor_datetime(datetime, *precision);
                if floored == datetime.truncate(*precision) {
                    doc.add_date(field, datetime);
                } else {
                    doc.add_date(field, floored);
                }
                if mapped.is_timestamp {
                    *timestamp = Some(floored);
                }
            }
            MappedKind::Json => {
                if !value.is_object() {
                    return Err(wrong_type("a JSON object"));
                }
                doc.add_field_value(field, value);
            }
            MappedKind::Bytes(format, _) => {
                let Value::String(text) = value else {
                    return Err(wrong_type("a base64 or hex string"));
                };
                let bytes = decode_binary(text, *format).map_err(|message| {
                    DocParsingError::InvalidValue {
                        field: mapped.name.clone(),
                        message,
                    }
                })?;
                doc.add_bytes(field, &bytes);
            }
            MappedKind::Ip => {
                let Value::String(text) = value else {
                    return Err(wrong_type("an IP address string"));
                };
                let addr = parse_ip(text).ok_or_else(|| wrong_type("an IPv4 or IPv6 address"))?;
                doc.add_ip_addr(field, addr);
            }
            MappedKind::Concatenate => {
                return Err(DocParsingError::InvalidValue {
                    field: mapped.name.clone(),
                    message: "a concatenate field is computed from other fields: documents \
                              cannot set it"
                        .to_string(),
                })
            }
        }
        Ok(())
    }

    /// Renders a stored document as JSON: declared stored fields by name (a single value
    /// unwrapped, several as an array), datetimes as RFC 3339 strings, [`DYNAMIC_FIELD_NAME`]'s
    /// content flattened back to the top level, and the original document under `_source` when
    /// the index stores it.
    pub fn doc_to_json(&self, doc: &TantivyDocument) -> Value {
        let mut object = Map::new();
        for (field, value) in doc.field_values() {
            if Some(field) == self.dynamic_field {
                if let ReferenceValue::Object(entries) = value.as_value() {
                    for (key, value) in entries {
                        insert_multi(&mut object, key.to_string(), reference_to_json(value));
                    }
                }
                continue;
            }
            if Some(field) == self.source_field {
                if let Some(text) = value.as_str() {
                    let source = serde_json::from_str(text)
                        .unwrap_or_else(|_| Value::String(text.to_string()));
                    object.insert(SOURCE_FIELD_NAME.to_string(), source);
                }
                continue;
            }
            let entry = self.schema.get_field_entry(field);
            if !entry.is_stored() {
                // Present in freshly parsed documents, never in the doc store.
                continue;
            }
            let name = entry.name();
            let mapped = self.by_name.get(name).map(|&i| &self.fields[i]);
            let rendered = match mapped.map(|m| &m.kind) {
                Some(MappedKind::Datetime(_, Some(format), _)) => match value.as_datetime() {
                    Some(datetime) => crate::date::format_output(datetime, format),
                    None => reference_to_json(value),
                },
                Some(MappedKind::Bytes(_, format)) => match value.as_bytes() {
                    Some(bytes) => Value::String(encode_binary(bytes, *format)),
                    None => reference_to_json(value),
                },
                _ => reference_to_json(value),
            };
            let array = mapped.is_some_and(|m| m.array);
            match self.object_prefix(name) {
                Some(dot) => insert_nested(&mut object, name, dot, rendered, array),
                None => insert_value(&mut object, name.to_string(), rendered, array),
            }
        }
        Value::Object(object)
    }

    /// For a field of an `object` field (`parent.child`), the position of the dot after its
    /// outermost object.
    fn object_prefix(&self, name: &str) -> Option<usize> {
        if self.object_paths.is_empty() {
            return None;
        }
        name.match_indices('.')
            .map(|(dot, _)| dot)
            .find(|&dot| self.object_paths.contains(&name[..dot]))
    }

    /// The tokens `text` gives with the tokenizer of field `name` (a declared text or json
    /// field, a path inside a json field, or an undeclared field in dynamic mode); `None` when
    /// that field has no tokenizer (not text, not indexed, unknown).
    pub fn tokens(&self, name: &str, text: &str) -> Option<Vec<String>> {
        let (field, _) = self.schema.find_field(name).or_else(|| {
            let dynamic = self.dynamic_field?;
            Some((dynamic, name))
        })?;
        let indexing = match self.schema.get_field_entry(field).field_type() {
            tantivy::schema::FieldType::Str(options) => options.get_indexing_options()?,
            tantivy::schema::FieldType::JsonObject(options) => {
                options.get_text_indexing_options()?
            }
            _ => return None,
        };
        let mut analyzer = self.tokenizers.get(indexing.tokenizer())?;
        let mut stream = analyzer.token_stream(text);
        let mut tokens = Vec::new();
        while stream.advance() {
            tokens.push(stream.token().text.clone());
        }
        Some(tokens)
    }

    pub(crate) fn mapped_field_is_exact_tag(&self, name: &str) -> Option<TagKind> {
        let mapped = &self.fields[*self.by_name.get(name)?];
        if !mapped.is_tag {
            return None;
        }
        match mapped.kind {
            MappedKind::Text if self.doc_mapping.is_exact_tag_field(name) => Some(TagKind::Text),
            MappedKind::I64 => Some(TagKind::I64),
            MappedKind::U64 => Some(TagKind::U64),
            _ => None,
        }
    }
}

/// How a tag field's query terms are normalized to tag values.
#[derive(Clone, Copy, Debug)]
pub(crate) enum TagKind {
    Text,
    I64,
    U64,
}

/// An IPv4 (as IPv4-mapped IPv6) or IPv6 address.
pub(crate) fn parse_ip(text: &str) -> Option<std::net::Ipv6Addr> {
    match text.trim().parse::<std::net::IpAddr>().ok()? {
        std::net::IpAddr::V4(v4) => Some(v4.to_ipv6_mapped()),
        std::net::IpAddr::V6(v6) => Some(v6),
    }
}

/// Decodes a binary value written as base64 or hex.
fn decode_binary(text: &str, format: BinaryFormat) -> Result<Vec<u8>, String> {
    use base64::Engine;
    match format {
        BinaryFormat::Base64 => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|err| format!("expected base64: {err}")),
        BinaryFormat::Hex => {
            if !text.len().is_multiple_of(2) {
                return Err("expected hex: odd number of digits".to_string());
            }
            (0..text.len())
                .step_by(2)
                .map(|i| {
                    text.get(i..i + 2)
                        .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                        .ok_or_else(|| format!("expected hex: `{}`", truncate_for_message(text)))
                })
                .collect()
        }
    }
}

/// Encodes a binary value as base64 or hex.
fn encode_binary(bytes: &[u8], format: BinaryFormat) -> String {
    use base64::Engine;
    match format {
        BinaryFormat::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
        BinaryFormat::Hex => bytes.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// Inserts the value of the object field `name` (`parent.child.leaf`) nested under its
/// objects; `dot` ends the outermost object's name.
fn insert_nested(
    object: &mut Map<String, Value>,
    name: &str,
    dot: usize,
    value: Value,
    array: bool,
) {
    let (head, tail) = (&name[..dot], &name[dot + 1..]);
    let entry = object
        .entry(head.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    match entry {
        Value::Object(inner) => match tail.find('.') {
            Some(next) => insert_nested(inner, tail, next, value, array),
            None => insert_value(inner, tail.to_string(), value, array),
        },
        // A value already there (should not happen): keep this one flat.
        _ => insert_value(object, name.to_string(), value, array),
    }
}

/// Inserts a value of a field: as [`insert_multi`], and, for an `array<T>` field, as an array
/// from its first value on.
fn insert_value(object: &mut Map<String, Value>, key: String, value: Value, array: bool) {
    if array && !object.contains_key(&key) {
        object.insert(key, Value::Array(vec![value]));
    } else {
        insert_multi(object, key, value);
    }
}

/// Inserts `value` under `key`, turning repeated keys into arrays.
fn insert_multi(object: &mut Map<String, Value>, key: String, value: Value) {
    match object.get_mut(&key) {
        None => {
            object.insert(key, value);
        }
        Some(Value::Array(values)) => values.push(value),
        Some(existing) => {
            let first = existing.take();
            *existing = Value::Array(vec![first, value]);
        }
    }
}

/// Converts a stored Tantivy value to JSON.
fn reference_to_json<'a, V: tantivy::schema::Value<'a>>(value: V) -> Value {
    match value.as_value() {
        ReferenceValue::Leaf(leaf) => leaf_to_json(leaf),
        ReferenceValue::Array(values) => Value::Array(values.map(reference_to_json).collect()),
        ReferenceValue::Object(entries) => Value::Object(
            entries
                .map(|(key, value)| (key.to_string(), reference_to_json(value)))
                .collect(),
        ),
    }
}

fn leaf_to_json(leaf: ReferenceValueLeaf<'_>) -> Value {
    match leaf {
        ReferenceValueLeaf::Null => Value::Null,
        ReferenceValueLeaf::Str(text) | ReferenceValueLeaf::Facet(text) => {
            Value::String(text.to_string())
        }
        ReferenceValueLeaf::U64(number) => Value::from(number),
        ReferenceValueLeaf::I64(number) => Value::from(number),
        ReferenceValueLeaf::F64(number) => {
            Number::from_f64(number).map_or(Value::Null, Value::Number)
        }
        ReferenceValueLeaf::Bool(flag) => Value::Bool(flag),
        ReferenceValueLeaf::Date(datetime) => Value::String(format_rfc3339(datetime)),
        ReferenceValueLeaf::IpAddr(addr) => Value::String(match addr.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => addr.to_string(),
        }),
        ReferenceValueLeaf::PreTokStr(text) => Value::String(text.text),
        ReferenceValueLeaf::Bytes(bytes) | ReferenceValueLeaf::Custom(bytes) => {
            Value::String(encode_binary(bytes, BinaryFormat::Base64))
        }
    }
}
