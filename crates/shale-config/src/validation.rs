//! Parsing (YAML or JSON) and validation of index configs.

use std::collections::HashSet;

use serde::de::DeserializeOwned;

use crate::{
    parse_duration, ConfigError, DocMapping, FieldKind, FieldMapping, IndexConfig, PartitionKey,
    RetentionPolicy, Tokenizer, TokenizerKind,
};

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// Whether the first non-whitespace byte is `{` (JSON) rather than YAML.
pub(crate) fn looks_like_json(bytes: &[u8]) -> bool {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    bytes
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{')
}

/// Deserializes YAML or JSON, reporting the path of the offending key in the error.
pub(crate) fn deserialize_with_path<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ConfigError> {
    let is_json = looks_like_json(bytes);
    let result = if is_json {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        serde_path_to_error::deserialize(&mut de).map_err(|err| {
            let path = err.path().to_string();
            (path, err.into_inner().to_string())
        })
    } else {
        serde_path_to_error::deserialize(serde_yaml::Deserializer::from_slice(bytes)).map_err(
            |err| {
                let path = err.path().to_string();
                (path, err.into_inner().to_string())
            },
        )
    };
    result.map_err(|(mut path, mut message)| {
        // A nested value (the merge policy) names its offending key between markers.
        let marker = crate::merge_policy::SUBFIELD_MARKER;
        if let Some((_, rest)) = message.split_once(marker) {
            if let Some((sub, tail)) = rest.split_once(marker) {
                if !sub.is_empty() {
                    path = format!("{path}.{sub}");
                }
                message = tail.to_string();
            }
        }
        // serde_yaml prefixes its messages with (part of) the path: keep ours only.
        if let Some((head, tail)) = message.split_once(": ") {
            if !head.contains(' ') && (path.starts_with(head) || head == ".") {
                message = tail.to_string();
            }
        }
        // serde_yaml leaves the position out for some errors (a key on the first line):
        // point at the first line holding the unknown key.
        if !message.contains(" line ") {
            if let Some(line) = unknown_key_line(bytes, &message) {
                message = format!("{message} at line {line}");
            }
        }
        if path == "." || path.is_empty() {
            ConfigError::Parse(message)
        } else {
            let context = field_mapping_context(bytes, is_json, &path).unwrap_or_default();
            ConfigError::Parse(format!("`{path}`{context}: {message}"))
        }
    })
}

/// The 1-based line of the first key named like the unknown field of `message`, if any.
fn unknown_key_line(bytes: &[u8], message: &str) -> Option<usize> {
    let rest = message.strip_prefix("unknown field `")?;
    let key = &rest[..rest.find('`')?];
    let text = std::str::from_utf8(bytes).ok()?;
    let quoted = format!("\"{key}\"");
    text.lines()
        .position(|line| {
            let line = line.trim_start().trim_start_matches("- ").trim_start();
            [key, quoted.as_str()].iter().any(|k| {
                line.strip_prefix(k)
                    .is_some_and(|after| after.trim_start().starts_with(':'))
            })
        })
        .map(|index| index + 1)
}

/// For errors inside `doc_mapping.field_mappings[i]`, names the field mapping (serde loses the
/// path inside the flattened type options, so the name helps find the culprit).
fn field_mapping_context(bytes: &[u8], is_json: bool, path: &str) -> Option<String> {
    let rest = path.strip_prefix("doc_mapping.field_mappings[")?;
    let index: usize = rest[..rest.find(']')?].parse().ok()?;
    let value: serde_json::Value = if is_json {
        serde_json::from_slice(bytes).ok()?
    } else {
        serde_yaml::from_slice(bytes).ok()?
    };
    let name = value
        .get("doc_mapping")?
        .get("field_mappings")?
        .get(index)?
        .get("name")?
        .as_str()?;
    Some(format!(" (field `{name}`)"))
}

impl IndexConfig {
    /// Parses an index config, as JSON if its first non-space byte is `{`, else as YAML, then
    /// [validates](IndexConfig::validate) it. Errors name the offending field.
    pub fn parse(bytes: &[u8]) -> Result<IndexConfig, ConfigError> {
        let config: IndexConfig = deserialize_with_path(bytes)?;
        // `doc_mapping` may be left out only by a metrics index.
        #[derive(serde::Deserialize)]
        struct Sections {
            doc_mapping: Option<serde::de::IgnoredAny>,
            metrics: Option<serde::de::IgnoredAny>,
        }
        if let Ok(Sections {
            doc_mapping: None,
            metrics: None,
        }) = deserialize_with_path::<Sections>(bytes)
        {
            return Err(invalid(
                "doc_mapping",
                "missing: an index of documents needs a doc mapping (a metrics index has a \
                 `metrics` section instead)",
            ));
        }
        config.validate()?;
        let mut config = config;
        config.derive_metrics_merge_policy();
        Ok(config)
    }

    /// A metrics index merges with the locality policy its `metrics` section implies (unless
    /// merges are off with `no_merge`): written into `indexing_settings.merge_policy`, where
    /// the planner, the merge workers and the indexers read it.
    pub fn derive_metrics_merge_policy(&mut self) {
        if let Some(metrics) = &self.metrics {
            if self.indexing_settings.merge_policy != crate::MergePolicyConfig::NoMerge {
                self.indexing_settings.merge_policy =
                    crate::MergePolicyConfig::Locality(metrics.locality_config());
            }
        }
    }

    /// Checks the config; the error names the first invalid field.
    ///
    /// The timestamp field must be a `datetime` field with `fast: true`, as in Quickwit (it is
    /// not silently made fast: a config means what it says).
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_index_id(&self.index_id)?;
        if let Some(metrics) = &self.metrics {
            return self.validate_metrics(metrics);
        }
        self.doc_mapping.validate()?;
        let mapping = &self.doc_mapping;
        self.search_settings.validate_against(mapping)?;
        self.validate_indexing_settings()?;
        let settings = &self.indexing_settings;
        if let crate::MergePolicyConfig::Locality(locality) = &settings.merge_policy {
            // The sort fields must be fast fields of a supported type, and a timestamp field
            // must exist (it makes the time buckets).
            locality
                .sort_field_types(mapping)
                .map_err(|err| invalid(err.field, err.message))?;
        }
        self.compaction.validate()?;
        if let Some(window) = &self.time_travel_retention {
            parse_duration(window).map_err(|err| match err {
                ConfigError::Invalid { message, .. } => invalid("time_travel_retention", message),
                other => other,
            })?;
        }
        if let Some(retention) = &self.retention {
            retention.period_secs()?;
            retention.schedule()?;
            if self.doc_mapping.timestamp_field.is_none() {
                return Err(invalid(
                    "retention",
                    "a retention policy needs a timestamp field: set \
                     `doc_mapping.timestamp_field`",
                ));
            }
        }
        Ok(())
    }
}

/// The zstd levels `docstore_compression_level` accepts (zstd's fast levels up to its
/// highest).
const DOCSTORE_ZSTD_LEVELS: std::ops::RangeInclusive<i32> = -7..=22;
/// The block sizes `docstore_blocksize` accepts: from 1 KiB to 64 MiB (a fetched document
/// costs the decompression of its whole block).
const DOCSTORE_BLOCKSIZES: std::ops::RangeInclusive<u64> = 1024..=64 * 1024 * 1024;

impl IndexConfig {
    /// The checks of `indexing_settings` every index shares.
    fn validate_indexing_settings(&self) -> Result<(), ConfigError> {
        let settings = &self.indexing_settings;
        if settings.commit_timeout_secs < 1 {
            return Err(invalid(
                "indexing_settings.commit_timeout_secs",
                "must be at least 1",
            ));
        }
        if settings.split_num_docs_target < 1 {
            return Err(invalid(
                "indexing_settings.split_num_docs_target",
                "must be at least 1",
            ));
        }
        settings.heap_size_bytes()?;
        if let Some(level) = settings.docstore_compression_level {
            if !DOCSTORE_ZSTD_LEVELS.contains(&level) {
                return Err(invalid(
                    "indexing_settings.docstore_compression_level",
                    format!(
                        "{level} is not a zstd level: expected {} to {} (higher compresses \
                         more and indexes slower)",
                        DOCSTORE_ZSTD_LEVELS.start(),
                        DOCSTORE_ZSTD_LEVELS.end()
                    ),
                ));
            }
        }
        if let Some(blocksize) = settings.docstore_blocksize {
            if !DOCSTORE_BLOCKSIZES.contains(&blocksize) {
                return Err(invalid(
                    "indexing_settings.docstore_blocksize",
                    format!(
                        "{blocksize} bytes: expected {} to {} bytes",
                        DOCSTORE_BLOCKSIZES.start(),
                        DOCSTORE_BLOCKSIZES.end()
                    ),
                ));
            }
        }
        settings
            .merge_policy
            .validate()
            .map_err(|err| invalid(format!("indexing_settings.{}", err.field), err.message))?;
        Ok(())
    }

    /// The checks of a metrics index: its `metrics` section, and no key that only documents
    /// have.
    fn validate_metrics(&self, metrics: &crate::MetricsSettings) -> Result<(), ConfigError> {
        let mut mapping = self.doc_mapping.clone();
        mapping.doc_mapping_uid.clear();
        if mapping != crate::DocMapping::default() {
            return Err(invalid(
                "doc_mapping",
                "a metrics index has no doc mapping (its rows are samples: metric name, \
                 labels, timestamp, value); remove `doc_mapping` or the `metrics` section",
            ));
        }
        if self.search_settings != crate::SearchSettings::default() {
            return Err(invalid(
                "search_settings",
                "a metrics index is queried with PromQL; search settings do not apply",
            ));
        }
        match &self.indexing_settings.merge_policy {
            // Merges on (the default), or off.
            crate::MergePolicyConfig::NoMerge => {}
            policy if *policy == crate::MergePolicyConfig::default() => {}
            // As written back by `parse` (the derived policy), possibly of older settings.
            crate::MergePolicyConfig::Locality(locality)
                if locality.sort_fields == metrics.sort_fields() => {}
            _ => {
                return Err(invalid(
                    "indexing_settings.merge_policy",
                    "a metrics index merges with locality compaction set by its `metrics` \
                     section (`time_bucket`, `target_split_bytes`, `max_merge_ops`); leave \
                     `merge_policy` out, or set `no_merge` to turn merges off",
                ));
            }
        }
        if metrics.target_split_bytes == 0 {
            return Err(invalid("metrics.target_split_bytes", "must be at least 1"));
        }
        if metrics.max_merge_ops == 0 {
            return Err(invalid(
                "metrics.max_merge_ops",
                "must be at least 1: fresh splits are always merged once",
            ));
        }
        self.validate_indexing_settings()?;
        self.compaction.validate()?;
        let bucket = parse_duration(&metrics.time_bucket).map_err(|err| match err {
            ConfigError::Invalid { message, .. } => invalid("metrics.time_bucket", message),
            other => other,
        })?;
        if !(60..=3600).contains(&bucket) || 3600 % bucket != 0 {
            return Err(invalid(
                "metrics.time_bucket",
                format!(
                    "must divide an hour and be at least a minute (e.g. `5m`, `15m`, `1h`), \
                     got `{}`",
                    metrics.time_bucket
                ),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, label) in metrics.sort_labels.iter().enumerate() {
            let field = format!("metrics.sort_labels[{i}]");
            let mut chars = label.chars();
            let valid = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(invalid(
                    field,
                    format!("`{label}` is not a label name (`[a-zA-Z_][a-zA-Z0-9_]*`)"),
                ));
            }
            if label.starts_with("__") {
                return Err(invalid(
                    field,
                    format!(
                        "`{label}`: names starting with `__` are reserved (the metric name \
                         always leads the sort key)"
                    ),
                ));
            }
            if !seen.insert(label) {
                return Err(invalid(field, format!("`{label}` is listed twice")));
            }
        }
        if metrics.sort_labels.len() > 8 {
            return Err(invalid(
                "metrics.sort_labels",
                "at most 8 sort labels (the sort key leads with the metric name)",
            ));
        }
        if let Some(retention) = &self.retention {
            retention.period_secs()?;
            retention.schedule()?;
        }
        Ok(())
    }
}

pub(crate) fn validate_index_id(index_id: &str) -> Result<(), ConfigError> {
    let mut chars = index_id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !first_ok || !rest_ok || !(3..=255).contains(&index_id.len()) {
        return Err(invalid(
            "index_id",
            format!(
                "`{index_id}` is invalid: must match `^[a-zA-Z][a-zA-Z0-9._-]{{2,254}}$` (3 to \
                 255 characters, starting with a letter)"
            ),
        ));
    }
    Ok(())
}

fn validate_field_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("field name is empty".to_string());
    }
    if name.starts_with('_') {
        return Err(format!(
            "field name `{name}` starts with `_`, which is reserved for internal fields"
        ));
    }
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || matches!(c, '@' | '$'));
    let rest_ok =
        chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '@' | '$' | '_' | '-' | '.' | '/'));
    if !first_ok || !rest_ok || name.len() > 255 {
        return Err(format!(
            "field name `{name}` is invalid: must start with a letter, `@` or `$` and contain only \
             letters, digits and `@$_-./` (at most 255 characters)"
        ));
    }
    Ok(())
}

impl FieldMapping {
    /// Whether the field is searchable.
    pub fn is_indexed(&self) -> bool {
        match &self.kind {
            FieldKind::Text(o) => o.indexed,
            FieldKind::I64(o) | FieldKind::U64(o) | FieldKind::F64(o) | FieldKind::Bool(o) => {
                o.indexed
            }
            FieldKind::Datetime(o) => o.indexed,
            FieldKind::Json(o) => o.indexed,
            FieldKind::Bytes(o) => o.indexed,
            FieldKind::Ip(o) => o.indexed,
            FieldKind::Concatenate(_) => true,
            FieldKind::Object(_) => false,
        }
    }

    /// Whether the field is stored (returned in hits).
    pub fn is_stored(&self) -> bool {
        match &self.kind {
            FieldKind::Text(o) => o.stored,
            FieldKind::I64(o) | FieldKind::U64(o) | FieldKind::F64(o) | FieldKind::Bool(o) => {
                o.stored
            }
            FieldKind::Datetime(o) => o.stored,
            FieldKind::Json(o) => o.stored,
            FieldKind::Bytes(o) => o.stored,
            FieldKind::Ip(o) => o.stored,
            FieldKind::Object(_) | FieldKind::Concatenate(_) => false,
        }
    }

    /// Whether the field is a fast (columnar) field.
    pub fn is_fast(&self) -> bool {
        match &self.kind {
            FieldKind::Text(o) => o.fast.enabled,
            FieldKind::I64(o) | FieldKind::U64(o) | FieldKind::F64(o) | FieldKind::Bool(o) => {
                o.fast
            }
            FieldKind::Datetime(o) => o.fast,
            FieldKind::Json(o) => o.fast.enabled,
            FieldKind::Bytes(o) => o.fast,
            FieldKind::Ip(o) => o.fast,
            FieldKind::Object(_) | FieldKind::Concatenate(_) => false,
        }
    }

    /// The type name used in configs (`text`, `i64`, …).
    pub fn type_name(&self) -> &'static str {
        match &self.kind {
            FieldKind::Text(_) => "text",
            FieldKind::I64(_) => "i64",
            FieldKind::U64(_) => "u64",
            FieldKind::F64(_) => "f64",
            FieldKind::Bool(_) => "bool",
            FieldKind::Datetime(_) => "datetime",
            FieldKind::Json(_) => "json",
            FieldKind::Bytes(_) => "bytes",
            FieldKind::Ip(_) => "ip",
            FieldKind::Object(_) => "object",
            FieldKind::Concatenate(_) => "concatenate",
        }
    }
}

impl DocMapping {
    /// The declared field named `name`, if any: a top-level field, or `parent.child` inside
    /// `object` fields.
    pub fn field_mapping(&self, name: &str) -> Option<&FieldMapping> {
        fn find<'a>(mappings: &'a [FieldMapping], path: &str) -> Option<&'a FieldMapping> {
            if let Some(found) = mappings.iter().find(|f| f.name == path) {
                return Some(found);
            }
            path.match_indices('.').find_map(|(dot, _)| {
                let (head, rest) = (&path[..dot], &path[dot + 1..]);
                match mappings.iter().find(|f| f.name == head).map(|f| &f.kind) {
                    Some(FieldKind::Object(object)) => find(&object.field_mappings, rest),
                    _ => None,
                }
            })
        }
        find(&self.field_mappings, name)
    }

    /// Every declared field but objects, with `parent.child` names for the fields of
    /// `object` fields, in declaration order.
    pub fn leaf_field_mappings(&self) -> Vec<FieldMapping> {
        // The leaves of an `array<object>` are arrays.
        fn walk(
            mappings: &[FieldMapping],
            prefix: &str,
            in_array: bool,
            out: &mut Vec<FieldMapping>,
        ) {
            for mapping in mappings {
                let name = format!("{prefix}{}", mapping.name);
                let array = in_array || mapping.array;
                match &mapping.kind {
                    FieldKind::Object(object) => {
                        walk(&object.field_mappings, &format!("{name}."), array, out)
                    }
                    kind => out.push(FieldMapping {
                        name,
                        kind: kind.clone(),
                        array,
                    }),
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.field_mappings, "", false, &mut out);
        out
    }

    /// The `parent.child` paths of the `object` fields.
    pub fn object_paths(&self) -> Vec<String> {
        fn walk(mappings: &[FieldMapping], prefix: &str, out: &mut Vec<String>) {
            for mapping in mappings {
                if let FieldKind::Object(object) = &mapping.kind {
                    let name = format!("{prefix}{}", mapping.name);
                    out.push(name.clone());
                    walk(&object.field_mappings, &format!("{name}."), out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.field_mappings, "", &mut out);
        out
    }

    /// The parsed `partition_key`, or `None` when the index has none.
    pub fn partition_key(&self) -> Result<Option<PartitionKey>, ConfigError> {
        match self.partition_key.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(expr) => PartitionKey::parse(expr).map(Some),
        }
    }

    /// Whether `path` names a declared field, or a path inside a declared `json` field
    /// (`resource.service` when `resource` is a json field).
    fn has_field_path(&self, path: &str) -> bool {
        if self.field_mapping(path).is_some() {
            return true;
        }
        path.match_indices('.').any(|(dot, _)| {
            matches!(
                self.field_mapping(&path[..dot]).map(|f| &f.kind),
                Some(FieldKind::Json(_))
            )
        })
    }

    /// Checks field names, the timestamp field, tag fields and the partition key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn check_names(mappings: &[FieldMapping], path: &str) -> Result<(), ConfigError> {
            let mut names = HashSet::new();
            for (i, field_mapping) in mappings.iter().enumerate() {
                let field = format!("{path}[{i}].name");
                validate_field_name(&field_mapping.name)
                    .map_err(|message| invalid(&field, message))?;
                if !names.insert(field_mapping.name.as_str()) {
                    return Err(invalid(
                        field,
                        format!("field `{}` is declared twice", field_mapping.name),
                    ));
                }
                if let FieldKind::Object(object) = &field_mapping.kind {
                    if object.field_mappings.is_empty() {
                        return Err(invalid(
                            format!("{path}[{i}].field_mappings"),
                            format!("object field `{}` has no fields", field_mapping.name),
                        ));
                    }
                    check_names(
                        &object.field_mappings,
                        &format!("{path}[{i}].field_mappings"),
                    )?;
                }
            }
            Ok(())
        }
        check_names(&self.field_mappings, "doc_mapping.field_mappings")?;
        if self.dynamic_mapping.is_some() && self.mode != crate::Mode::Dynamic {
            return Err(invalid(
                "doc_mapping.dynamic_mapping",
                "`dynamic_mapping` is only allowed with `mode: dynamic`",
            ));
        }
        if let Some(timestamp_field) = &self.timestamp_field {
            let field = "doc_mapping.timestamp_field";
            match self.field_mapping(timestamp_field) {
                None => {
                    return Err(invalid(
                        field,
                        format!("no field named `{timestamp_field}` in field_mappings"),
                    ))
                }
                Some(FieldMapping {
                    kind: FieldKind::Datetime(options),
                    ..
                }) => {
                    if !options.fast {
                        return Err(invalid(
                            field,
                            format!(
                                "timestamp field `{timestamp_field}` must be a fast field: set \
                                 `fast: true` on it"
                            ),
                        ));
                    }
                }
                Some(other) => {
                    return Err(invalid(
                        field,
                        format!(
                            "timestamp field `{timestamp_field}` must be of type `datetime`, not \
                             `{}`",
                            other.type_name()
                        ),
                    ))
                }
            }
        }
        let mut tokenizer_names = HashSet::new();
        for (i, tokenizer) in self.tokenizers.iter().enumerate() {
            let field = format!("doc_mapping.tokenizers[{i}]");
            if Tokenizer::BUILT_IN.contains(&tokenizer.name.as_str()) {
                return Err(invalid(
                    format!("{field}.name"),
                    format!("`{}` is a built-in tokenizer", tokenizer.name),
                ));
            }
            if tokenizer.name.is_empty() || !tokenizer_names.insert(tokenizer.name.as_str()) {
                return Err(invalid(
                    format!("{field}.name"),
                    format!("tokenizer `{}` is empty or declared twice", tokenizer.name),
                ));
            }
            if let TokenizerKind::Ngram {
                min_gram, max_gram, ..
            } = tokenizer.kind
            {
                if min_gram == 0 || min_gram > max_gram {
                    return Err(invalid(
                        field,
                        format!(
                            "ngram needs 1 <= min_gram <= max_gram, got {min_gram} and {max_gram}"
                        ),
                    ));
                }
            }
        }
        for (i, field_mapping) in self.leaf_field_mappings().iter().enumerate() {
            if let FieldKind::Datetime(o) = &field_mapping.kind {
                if let Some(format) = &o.output_format {
                    if !DATE_OUTPUT_FORMATS.contains(&format.as_str()) && !format.contains('%') {
                        return Err(invalid(
                            format!("doc_mapping.field_mappings[{i}].output_format"),
                            format!(
                                "unknown output format `{format}`: one of {} or a strptime \
                                 format",
                                DATE_OUTPUT_FORMATS.join(", ")
                            ),
                        ));
                    }
                }
            }
            if let FieldKind::Concatenate(o) = &field_mapping.kind {
                if o.concatenate_fields.is_empty() && !o.include_dynamic_fields {
                    return Err(invalid(
                        format!("doc_mapping.field_mappings[{i}].concatenate_fields"),
                        format!(
                            "concatenate field `{}` concatenates nothing: list fields in \
                             `concatenate_fields` or set `include_dynamic_fields`",
                            field_mapping.name
                        ),
                    ));
                }
                if o.include_dynamic_fields && self.mode != crate::Mode::Dynamic {
                    return Err(invalid(
                        format!("doc_mapping.field_mappings[{i}].include_dynamic_fields"),
                        "`include_dynamic_fields` needs `mode: dynamic`",
                    ));
                }
                for (j, source) in o.concatenate_fields.iter().enumerate() {
                    let field = format!("doc_mapping.field_mappings[{i}].concatenate_fields[{j}]");
                    match self.field_mapping(source).map(|f| &f.kind) {
                        None => {
                            return Err(invalid(
                                field,
                                format!("no field named `{source}` in field_mappings"),
                            ))
                        }
                        Some(
                            FieldKind::Concatenate(_)
                            | FieldKind::Object(_)
                            | FieldKind::Bytes(_)
                            | FieldKind::Ip(_)
                            | FieldKind::Datetime(_),
                        ) => {
                            return Err(invalid(
                                field,
                                format!(
                                    "`{source}` cannot be concatenated: concatenate text, \
                                     numeric, boolean and json fields"
                                ),
                            ))
                        }
                        Some(_) => {}
                    }
                }
            }
            let tokenizer = match &field_mapping.kind {
                FieldKind::Text(o) => &o.tokenizer,
                FieldKind::Json(o) => &o.tokenizer,
                FieldKind::Concatenate(o) => &o.tokenizer,
                _ => continue,
            };
            if let Tokenizer::Custom(name) = tokenizer {
                if !tokenizer_names.contains(name.as_str()) {
                    return Err(invalid(
                        format!("doc_mapping.field_mappings[{i}].tokenizer"),
                        format!(
                            "unknown tokenizer `{name}` for field `{}`: declare it in \
                             doc_mapping.tokenizers or use a built-in one ({})",
                            field_mapping.name,
                            Tokenizer::BUILT_IN.join(", ")
                        ),
                    ));
                }
            }
        }
        for (i, tag_field) in self.tag_fields.iter().enumerate() {
            let field = format!("doc_mapping.tag_fields[{i}]");
            let Some(field_mapping) = self.field_mapping(tag_field) else {
                return Err(invalid(
                    field,
                    format!("no field named `{tag_field}` in field_mappings"),
                ));
            };
            if let FieldKind::Concatenate(_) = &field_mapping.kind {
                return Err(invalid(
                    field,
                    format!("tag field `{tag_field}` is a concatenate field"),
                ));
            }
            if let FieldKind::Text(options) = &field_mapping.kind {
                if options.tokenizer != Tokenizer::Raw {
                    return Err(invalid(
                        field,
                        format!(
                            "tag field `{tag_field}` is tokenized (tokenizer `{}`): a text tag \
                             field needs `tokenizer: raw`",
                            options.tokenizer.name()
                        ),
                    ));
                }
            }
            if !matches!(
                field_mapping.kind,
                FieldKind::Text(_) | FieldKind::I64(_) | FieldKind::U64(_)
            ) {
                return Err(invalid(
                    field,
                    format!(
                        "tag field `{tag_field}` is of type `{}`: tag fields must be raw text, \
                         i64 or u64 (as in Quickwit)",
                        field_mapping.type_name()
                    ),
                ));
            }
        }
        if let Some(key) = self.partition_key()? {
            for name in key.fields() {
                if !self.has_field_path(name) {
                    return Err(invalid(
                        "doc_mapping.partition_key",
                        format!("no field named `{name}` in field_mappings"),
                    ));
                }
            }
        }
        if self.max_num_partitions < 1 {
            return Err(invalid(
                "doc_mapping.max_num_partitions",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// Tag fields whose values can be compared with query terms verbatim: text fields with the
    /// `raw` tokenizer, and integer and boolean fields.
    pub fn is_exact_tag_field(&self, name: &str) -> bool {
        self.tag_fields.iter().any(|t| t == name)
            && match self.field_mapping(name).map(|f| &f.kind) {
                Some(FieldKind::Text(options)) => options.tokenizer == Tokenizer::Raw,
                Some(FieldKind::I64(_) | FieldKind::U64(_)) => true,
                _ => false,
            }
    }
}

/// The named output formats of datetime fields.
pub const DATE_OUTPUT_FORMATS: [&str; 6] = [
    "rfc3339",
    "iso8601",
    "unix_timestamp_secs",
    "unix_timestamp_millis",
    "unix_timestamp_micros",
    "unix_timestamp_nanos",
];

/// A parsed retention `schedule`: when the janitor evaluates the retention policy.
#[derive(Clone, Debug)]
pub struct RetentionSchedule(cron::Schedule);

impl RetentionSchedule {
    /// The first evaluation time strictly after `now` (seconds since epoch), if any.
    pub fn next_after(&self, now: i64) -> Option<i64> {
        let now = chrono::DateTime::<chrono::Utc>::from_timestamp(now, 0)?;
        self.0.after(&now).next().map(|next| next.timestamp())
    }
}

impl RetentionPolicy {
    /// The parsed `schedule`: `hourly`, `daily`, `weekly`, `monthly`, `yearly` (or with `@`),
    /// or a cron expression with seconds (`sec min hour day-of-month month day-of-week
    /// [year]`, e.g. `0 30 2 * * *` for 02:30:00 UTC every day), as Quickwit accepts.
    pub fn schedule(&self) -> Result<RetentionSchedule, ConfigError> {
        let text = self.schedule.trim();
        let expression = if !text.is_empty() && text.chars().all(|c| c.is_ascii_alphabetic()) {
            format!("@{text}")
        } else {
            text.to_string()
        };
        expression
            .parse::<cron::Schedule>()
            .map(RetentionSchedule)
            .map_err(|err| {
                invalid(
                    "retention.schedule",
                    format!(
                        "`{}` is not a schedule: {err} (use hourly, daily, weekly, monthly, \
                         yearly, or a cron expression with seconds such as `0 0 * * * *`)",
                        self.schedule
                    ),
                )
            })
    }

    /// The retention period in seconds (`90 days` → 7 776 000).
    pub fn period_secs(&self) -> Result<u64, ConfigError> {
        let secs = parse_duration(&self.period).map_err(|err| match err {
            ConfigError::Invalid { message, .. } => invalid("retention.period", message),
            other => other,
        })?;
        if secs == 0 {
            return Err(invalid("retention.period", "must be longer than 0 seconds"));
        }
        Ok(secs)
    }
}

impl crate::SearchSettings {
    /// Checks the default search fields against the doc mapping: each is a declared indexed
    /// field, a path inside an indexed json field, or (dynamic mode, dynamic fields indexed)
    /// an undeclared field.
    pub fn validate_against(&self, mapping: &DocMapping) -> Result<(), ConfigError> {
        for (i, name) in self.default_search_fields.iter().enumerate() {
            let field = format!("search_settings.default_search_fields[{i}]");
            // A declared field, a path inside a declared json field, or (dynamic mode) an
            // undeclared field.
            let json_parent = name.match_indices('.').find_map(|(dot, _)| {
                match mapping.field_mapping(&name[..dot]).map(|f| &f.kind) {
                    Some(FieldKind::Json(o)) => Some(o.indexed),
                    _ => None,
                }
            });
            let declared_prefix = name
                .match_indices('.')
                .any(|(dot, _)| mapping.field_mapping(&name[..dot]).is_some());
            let indexed = match (mapping.field_mapping(name), json_parent) {
                (Some(field_mapping), _) => field_mapping.is_indexed(),
                (None, Some(indexed)) => indexed,
                (None, None) if mapping.mode == crate::Mode::Dynamic && !declared_prefix => {
                    mapping.dynamic_options().indexed
                }
                (None, None) => {
                    return Err(invalid(
                        field,
                        format!("unknown default search field `{name}`"),
                    ));
                }
            };
            if !indexed {
                return Err(invalid(
                    field,
                    format!("default search field `{name}` is not indexed"),
                ));
            }
        }
        Ok(())
    }
}
