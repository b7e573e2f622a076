//! Elasticsearch's search request, translated to Shale's: the query DSL (`query_string`,
//! `match`, `match_phrase`, `match_phrase_prefix`, `multi_match`, `term`, `terms`, `range`,
//! `exists`, `prefix`, `wildcard` with a trailing `*`, `regexp`, `bool`, `match_all`,
//! `match_none`) becomes a query in Shale's query language, so that everything a query string
//! gets — tag and key-range pruning, delete tasks, the same parser — applies; a range on the
//! timestamp field at the top of the query also bounds the time range, so splits outside it
//! are never opened. `sort` (strings, objects or arrays of either; `_doc` is index order),
//! `from`/`size`, `search_after` (a cursor: the total still counts every match) and `aggs`
//! are mapped; options Shale has no use
//! for (`highlight`, `docvalue_fields`, `script_fields`, `track_total_hits`, `analyze_wildcard`,
//! `boost`, …) are accepted and ignored. What cannot be expressed is an error naming it.

use serde::Deserialize;
use serde_json::{Map, Value};
use shale_index::DocMapper;
use tantivy::schema::FieldType;

use crate::request::SearchRequest;

/// Largest `from + size` (Elasticsearch's `index.max_result_window`).
pub const MAX_RESULT_WINDOW: usize = 10_000;

/// The body of an Elasticsearch `_search` (unknown keys are accepted and ignored).
#[derive(Clone, Debug, Default, Deserialize, serde::Serialize)]
pub struct EsSearchBody {
    /// The query DSL.
    #[serde(default)]
    pub query: Option<Value>,
    /// Hits returned (default 10).
    #[serde(default)]
    pub size: Option<Value>,
    /// Hits skipped.
    #[serde(default)]
    pub from: Option<Value>,
    /// Sort criteria.
    #[serde(default)]
    pub sort: Option<Value>,
    /// The `sort` values of the last hit of the previous page.
    #[serde(default)]
    pub search_after: Option<Vec<Value>>,
    /// Aggregations.
    #[serde(default, alias = "aggregations")]
    pub aggs: Option<Value>,
    /// `fields` to return beside `_source` (names or `{field, format}` objects).
    #[serde(default)]
    pub fields: Option<Value>,
    /// Source filtering: `false`, a list of fields, or `{includes, excludes}`.
    #[serde(default, rename = "_source")]
    pub source: Option<Value>,
}

/// A sort criterion as Elasticsearch clients see it.
#[derive(Clone, Debug, PartialEq)]
pub struct EsSort {
    /// Field name or `_score`.
    pub field: String,
    /// Ascending?
    pub ascending: bool,
    /// How a date's sort value is rendered and read back in `search_after`
    /// (`epoch_millis`, the default, or Quickwit's `epoch_nanos_int`).
    pub format: Option<String>,
}

/// An Elasticsearch search translated for one index.
#[derive(Clone, Debug)]
pub struct EsTranslated {
    /// Shale's request.
    pub request: SearchRequest,
    /// The sort criteria, to render hits' `sort` values.
    pub sort: Vec<EsSort>,
}

fn usize_param(value: &Option<Value>, name: &str, default: usize) -> Result<usize, String> {
    match value {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| format!("`{name}` must be a non-negative integer, got {n}")),
        Some(Value::String(s)) => s
            .trim()
            .parse()
            .map_err(|_| format!("`{name}` must be a non-negative integer, got `{s}`")),
        Some(other) => Err(format!(
            "`{name}` must be a non-negative integer, got {other}"
        )),
    }
}

/// Translates `body` (with `size`/`from` from the URL when given) for the index of
/// `doc_mapper`.
pub fn translate_search(
    body: &EsSearchBody,
    url_size: Option<usize>,
    url_from: Option<usize>,
    url_query: Option<&str>,
    doc_mapper: &DocMapper,
) -> Result<EsTranslated, String> {
    let size = match url_size {
        Some(size) => size,
        None => usize_param(&body.size, "size", 10)?,
    };
    let from = match url_from {
        Some(from) => from,
        None => usize_param(&body.from, "from", 0)?,
    };
    if from + size > MAX_RESULT_WINDOW {
        return Err(format!(
            "Result window is too large, from + size must be less than or equal to: \
             [{MAX_RESULT_WINDOW}] but was [{}]",
            from + size
        ));
    }
    let mut translator = Translator {
        doc_mapper,
        search_fields: None,
    };
    // The URL's `q` wins over a body query.
    let query = match (&body.query, url_query) {
        (_, Some(q)) if !q.trim().is_empty() => format!("({})", q.trim()),
        (Some(dsl), _) => translator.clause(dsl)?,
        _ => "*".to_string(),
    };
    let url_query_wins = url_query.is_some_and(|q| !q.trim().is_empty());
    let (start_timestamp, end_timestamp) = match &body.query {
        Some(dsl) if !url_query_wins => top_level_time_bounds(dsl, doc_mapper),
        _ => (None, None),
    };
    let sort = parse_sort(body.sort.as_ref())?;
    let sort_by = sort_by_string(&sort);
    let search_after = match &body.search_after {
        Some(after) => search_after_key(after, &sort, doc_mapper)?,
        None => None,
    };
    let request = SearchRequest {
        query,
        start_timestamp,
        end_timestamp,
        max_hits: size,
        start_offset: from,
        sort_by,
        search_field: translator.search_fields,
        as_of: None,
        aggs: body.aggs.clone(),
        search_after,
    };
    Ok(EsTranslated { request, sort })
}

/// Elasticsearch's sort, as a list of criteria (`_doc` is index order). Fields and `_doc` sort
/// ascending by default, `_score` descending. An ascending `_doc` after another criterion is
/// dropped: it is the tie-break every search has.
pub fn parse_sort(sort: Option<&Value>) -> Result<Vec<EsSort>, String> {
    let mut criteria = Vec::new();
    let Some(sort) = sort else {
        return Ok(criteria);
    };
    let items: Vec<&Value> = match sort {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    let mut push = |field: &str, order: Option<&str>, format: Option<&str>| -> Result<(), String> {
        let ascending = match order.map(str::to_ascii_lowercase).as_deref() {
            None => field != "_score",
            Some("asc") => true,
            Some("desc") => false,
            Some(other) => {
                return Err(format!(
                    "invalid sort order `{other}` for `{field}`: asc or desc"
                ))
            }
        };
        if field == "_doc" && ascending && !criteria.is_empty() {
            return Ok(());
        }
        criteria.push(EsSort {
            field: field.to_string(),
            ascending,
            format: format.map(str::to_string),
        });
        Ok(())
    };
    for item in items {
        match item {
            Value::String(s) => match s.split_once(':') {
                Some((field, order)) => push(field, Some(order), None)?,
                None => push(s, None, None)?,
            },
            Value::Object(map) => {
                // The keys of one object lose their order in parsing: a `_doc` among them
                // is the tie-break, so it goes last.
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by_key(|(field, _)| field.as_str() == "_doc");
                for (field, spec) in entries {
                    match spec {
                        Value::String(order) => push(field, Some(order), None)?,
                        Value::Object(options) => push(
                            field,
                            options.get("order").and_then(Value::as_str),
                            options.get("format").and_then(Value::as_str),
                        )?,
                        other => {
                            return Err(format!("invalid sort for `{field}`: {other}"));
                        }
                    }
                }
            }
            other => return Err(format!("invalid sort: {other}")),
        }
    }
    Ok(criteria)
}

/// The `sort_by` of Shale's request for `sort` (Quickwit's mini-language: `-field` is
/// ascending).
fn sort_by_string(sort: &[EsSort]) -> Option<String> {
    if sort.is_empty() {
        return None;
    }
    Some(
        sort.iter()
            .map(|s| {
                if s.field == "_score" {
                    "_score".to_string()
                } else if s.field == "_doc" {
                    format!("_doc:{}", if s.ascending { "asc" } else { "desc" })
                } else if s.ascending {
                    format!("-{}", s.field)
                } else {
                    s.field.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// The cursor of `search_after` (the previous page's last `sort` values) in the leaf's
/// terms: numbers of the field's type (numeric strings accepted), dates in microseconds (the
/// values are epoch milliseconds, or nanoseconds with `format: epoch_nanos_int`).
fn search_after_key(
    after: &[Value],
    sort: &[EsSort],
    doc_mapper: &DocMapper,
) -> Result<Option<crate::leaf::SortKey>, String> {
    use crate::leaf::{SortKey, SortValue};
    if after.is_empty() {
        return Ok(None);
    }
    let default_sort;
    let sort = if sort.is_empty() {
        default_sort = match doc_mapper.timestamp_field_name() {
            Some(ts) => vec![EsSort {
                field: ts.to_string(),
                ascending: false,
                format: None,
            }],
            None => vec![EsSort {
                field: "_score".to_string(),
                ascending: false,
                format: None,
            }],
        };
        &default_sort
    } else {
        sort
    };
    if after.len() != sort.len() {
        return Err(format!(
            "search_after has {} value(s) but sort has {}",
            after.len(),
            sort.len()
        ));
    }
    let number = |value: &Value, field: &str| -> Result<SortValue, String> {
        let parsed;
        let n = match value {
            Value::Number(n) => n,
            Value::String(s) => {
                parsed = serde_json::from_str::<serde_json::Number>(s.trim()).map_err(|_| {
                    format!("search_after value `{s}` for `{field}` is not a number")
                })?;
                &parsed
            }
            Value::Bool(b) => return Ok(SortValue::U64(u64::from(*b))),
            other => {
                return Err(format!(
                    "search_after value {other} for `{field}` is not a number"
                ))
            }
        };
        Ok(if let Some(v) = n.as_u64() {
            SortValue::U64(v)
        } else if let Some(v) = n.as_i64() {
            SortValue::I64(v)
        } else {
            SortValue::F64(n.as_f64().unwrap_or(f64::NAN))
        })
    };
    let mut key = Vec::with_capacity(after.len());
    for (value, criterion) in after.iter().zip(sort) {
        let field = criterion.field.as_str();
        let sort_value = if value.is_null() {
            SortValue::Null
        } else if field == "_score" || field == "_doc" {
            number(value, field)?
        } else if is_date(doc_mapper, field) {
            let nanos = criterion.format.as_deref() == Some("epoch_nanos_int");
            let micros = match number(value, field)? {
                SortValue::U64(v) => i128::from(v),
                SortValue::I64(v) => i128::from(v),
                SortValue::F64(v) => v as i128,
                _ => 0,
            };
            let micros = if nanos { micros / 1000 } else { micros * 1000 };
            SortValue::I64(micros.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64)
        } else {
            match (field_type(doc_mapper, field), value) {
                (Some(FieldType::Str(_)), Value::String(s)) => SortValue::Str(s.clone()),
                (Some(FieldType::Str(_)), other) => SortValue::Str(other.to_string()),
                (_, Value::String(s)) => {
                    number(value, field).unwrap_or_else(|_| SortValue::Str(s.clone()))
                }
                _ => number(value, field)?,
            }
        };
        key.push(sort_value);
    }
    Ok(Some(SortKey(key)))
}

struct Translator<'a> {
    doc_mapper: &'a DocMapper,
    search_fields: Option<Vec<String>>,
}

/// A query that matches nothing.
const MATCH_NONE: &str = "(* AND NOT *)";

/// `(?i)` when a `prefix`, `wildcard` or `regexp` spec asks for `case_insensitive`.
fn case_flag(spec: &Value) -> &'static str {
    match spec.get("case_insensitive") {
        Some(Value::Bool(true)) => "(?i)",
        _ => "",
    }
}

fn as_object<'v>(value: &'v Value, what: &str) -> Result<&'v Map<String, Value>, String> {
    value
        .as_object()
        .ok_or_else(|| format!("`{what}` must be an object, got {value}"))
}

/// The single `field: spec` entry of a leaf clause (`boost` and `_name` beside it are
/// ignored).
fn single_field<'v>(body: &'v Value, clause: &str) -> Result<(&'v str, &'v Value), String> {
    let map = as_object(body, clause)?;
    let mut entries = map
        .iter()
        .filter(|(k, _)| k.as_str() != "boost" && k.as_str() != "_name");
    match (entries.next(), entries.next()) {
        (Some((field, spec)), None) => Ok((field.as_str(), spec)),
        _ => Err(format!("`{clause}` must name exactly one field")),
    }
}

/// Quotes a value for the query language.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Escapes `text` so that it matches itself in a regular expression of the query language.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~\"<>@/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Escapes the query language's special characters in a field name.
fn escape_field(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    for c in field.chars() {
        if "+^`:{}\"'[]()!\\* ".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn field_type<'m>(doc_mapper: &'m DocMapper, field: &str) -> Option<&'m FieldType> {
    let schema = doc_mapper.schema();
    schema
        .find_field(field)
        .map(|(f, _)| schema.get_field_entry(f).field_type())
}

fn is_date(doc_mapper: &DocMapper, field: &str) -> bool {
    matches!(field_type(doc_mapper, field), Some(FieldType::Date(_)))
}

/// Whether `field` is a datetime field of `doc_mapper` (its sort values render as epoch
/// milliseconds).
pub fn is_date_field(doc_mapper: &DocMapper, field: &str) -> bool {
    is_date(doc_mapper, field)
}

/// Elasticsearch's type names for a column type (text is both `keyword` and `text`, as
/// Quickwit lists it).
pub fn es_types(typ: tantivy::schema::Type) -> &'static [&'static str] {
    use tantivy::schema::Type;
    match typ {
        Type::Str => &["keyword", "text"],
        Type::U64 | Type::I64 => &["long"],
        Type::F64 => &["double"],
        Type::Bool => &["boolean"],
        Type::Date => &["date_nanos"],
        Type::Bytes => &["binary"],
        Type::IpAddr => &["ip"],
        _ => &[],
    }
}

/// Elasticsearch's type name, searchability and aggregatability of every user field of
/// `mapper`'s schema (`keyword` for raw-tokenized text, `text` otherwise; JSON fields are
/// `object`).
pub fn field_types(mapper: &DocMapper) -> Vec<(String, &'static str, bool, bool)> {
    let schema = mapper.schema();
    let mut out = Vec::new();
    for (_, entry) in schema.fields() {
        let name = entry.name();
        if name.starts_with('_') {
            continue;
        }
        let (types, searchable, aggregatable): (&[&'static str], bool, bool) =
            match entry.field_type() {
                FieldType::Str(options) => {
                    let indexing = options.get_indexing_options();
                    let raw = indexing.is_some_and(|i| i.tokenizer() == "raw");
                    let types: &[&'static str] = if raw { &["keyword"] } else { &["text"] };
                    (types, indexing.is_some(), options.is_fast())
                }
                FieldType::U64(o) | FieldType::I64(o) => (&["long"], o.is_indexed(), o.is_fast()),
                FieldType::F64(o) => (&["double"], o.is_indexed(), o.is_fast()),
                FieldType::Bool(o) => (&["boolean"], o.is_indexed(), o.is_fast()),
                FieldType::Date(o) => (&["date"], o.is_indexed(), o.is_fast()),
                FieldType::Bytes(o) => (&["binary"], o.is_indexed(), o.is_fast()),
                FieldType::IpAddr(o) => (&["ip"], o.is_indexed(), o.is_fast()),
                FieldType::JsonObject(o) => (
                    &["object"],
                    o.get_text_indexing_options().is_some(),
                    o.is_fast(),
                ),
                _ => continue,
            };
        for ty in types {
            out.push((name.to_string(), *ty, searchable, aggregatable));
        }
    }
    out
}

/// A date given as epoch milliseconds (number or numeric string, or seconds with `format:
/// epoch_second`) or as an RFC 3339 date, rendered as RFC 3339.
fn date_value(value: &Value, format: Option<&str>) -> Result<String, String> {
    // A custom (Java) pattern among the formats: `yyyy/MM/dd HH:mm:ss`.
    if let (Some(formats), Value::String(text)) = (format, value) {
        let is_named = |pattern: &str| pattern.chars().all(|c| c.is_ascii_lowercase() || c == '_');
        for pattern in formats.split("||").map(str::trim) {
            if is_named(pattern) {
                continue;
            }
            if let Some(nanos) = shale_index::parse_with_java_format(text.trim(), pattern) {
                let dt = time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
                    .map_err(|err| format!("date {value} out of range: {err}"))?;
                return dt
                    .format(&time::format_description::well_known::Rfc3339)
                    .map_err(|err| err.to_string());
            }
        }
        // Only custom patterns, and none matched: the date is refused, as Elasticsearch and
        // Quickwit refuse it (date math from `now` needs no format).
        let text = text.trim();
        if !text.starts_with("now") && !formats.split("||").map(str::trim).any(is_named) {
            return Err(format!(
                "failed to parse date field [{text}] with format [{formats}]"
            ));
        }
    }
    let seconds = matches!(format, Some(f) if f.split("||").any(|f| f == "epoch_second"));
    let unit: i128 = if seconds { 1_000_000_000 } else { 1_000_000 };
    let nanos = match value {
        Value::Number(n) => n
            .as_i64()
            .map(|n| i128::from(n) * unit)
            .or_else(|| n.as_f64().map(|f| (f * unit as f64) as i128)),
        Value::String(s) => {
            let s = s.trim();
            s.parse::<i64>()
                .ok()
                .map(|n| i128::from(n) * unit)
                .or_else(|| s.parse::<f64>().ok().map(|f| (f * unit as f64) as i128))
        }
        _ => None,
    };
    if let Some(nanos) = nanos {
        let dt = time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
            .map_err(|err| format!("date {value} out of range: {err}"))?;
        return dt
            .format(&time::format_description::well_known::Rfc3339)
            .map_err(|err| err.to_string());
    }
    let Value::String(text) = value else {
        return Err(format!("invalid date {value}"));
    };
    let text = text.trim();
    if text.starts_with("now") {
        return date_math(text);
    }
    if time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).is_ok() {
        return Ok(text.to_string());
    }
    // A date without time (`2024-01-31`) or without offset: UTC.
    if text.len() == 10 {
        return Ok(format!("{text}T00:00:00Z"));
    }
    let with_zone = format!("{text}Z");
    if time::OffsetDateTime::parse(&with_zone, &time::format_description::well_known::Rfc3339)
        .is_ok()
    {
        return Ok(with_zone);
    }
    Err(format!(
        "invalid date `{text}`: use RFC 3339 (2024-01-31T12:00:00Z) or epoch milliseconds"
    ))
}

/// `now`, `now-15m`, `now+1d`, `now-1h/h` (the rounding is to the unit's start).
fn date_math(text: &str) -> Result<String, String> {
    let err = || format!("invalid date math `{text}`: use now, now-15m, now-1h, now-7d");
    let now = time::OffsetDateTime::now_utc();
    let rest = &text[3..];
    let (expr, round) = match rest.split_once('/') {
        Some((expr, round)) => (expr, Some(round)),
        None => (rest, None),
    };
    let mut at = now;
    if !expr.is_empty() {
        let (sign, amount) = match expr.chars().next() {
            Some('-') => (-1i64, &expr[1..]),
            Some('+') => (1, &expr[1..]),
            _ => return Err(err()),
        };
        let digits = amount.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let unit = &amount[digits.len()..];
        let n: i64 = digits.parse().map_err(|_| err())?;
        let secs = match unit {
            "s" => 1,
            "m" => 60,
            "h" | "H" => 3_600,
            "d" => 86_400,
            "w" => 7 * 86_400,
            _ => return Err(err()),
        };
        at += time::Duration::seconds(sign * n * secs);
    }
    if let Some(round) = round {
        let unit = match round {
            "s" => 1,
            "m" => 60,
            "h" | "H" => 3_600,
            "d" => 86_400,
            _ => return Err(err()),
        };
        let secs = at.unix_timestamp().div_euclid(unit) * unit;
        at = time::OffsetDateTime::from_unix_timestamp(secs).map_err(|_| err())?;
    }
    at.format(&time::format_description::well_known::Rfc3339)
        .map_err(|e| e.to_string())
}

/// A bound of a range on `field`, in the query language.
fn range_value(
    doc_mapper: &DocMapper,
    field: &str,
    value: &Value,
    format: Option<&str>,
) -> Result<String, String> {
    if is_date(doc_mapper, field) {
        return date_value(value, format);
    }
    match value {
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::String(s) if !s.is_empty() && !s.contains(char::is_whitespace) => Ok(s.clone()),
        other => Err(format!(
            "invalid range bound {other} on `{field}` (a number, a date, or a word)"
        )),
    }
}

/// A term of `field`, in the query language (dates normalized, text quoted).
fn term_value(doc_mapper: &DocMapper, field: &str, value: &Value) -> Result<String, String> {
    if is_date(doc_mapper, field) {
        return Ok(quote(&date_value(value, None)?));
    }
    match value {
        Value::String(s) => Ok(quote(s)),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(format!("invalid value {other} for `{field}`")),
    }
}

/// The options object of a clause.
type Options<'v> = Option<&'v Map<String, Value>>;

/// The string of a `match`-like query: the value itself or its `query` key.
fn query_text<'v>(spec: &'v Value, clause: &str) -> Result<(String, Options<'v>), String> {
    match spec {
        Value::String(s) => Ok((s.clone(), None)),
        Value::Number(n) => Ok((n.to_string(), None)),
        Value::Bool(b) => Ok((b.to_string(), None)),
        Value::Object(options) => match options.get("query") {
            Some(Value::String(s)) => Ok((s.clone(), Some(options))),
            Some(Value::Number(n)) => Ok((n.to_string(), Some(options))),
            Some(Value::Bool(b)) => Ok((b.to_string(), Some(options))),
            _ => Err(format!("`{clause}` needs a `query`")),
        },
        other => Err(format!("invalid `{clause}`: {other}")),
    }
}

fn is_and(operator: Option<&Value>) -> Result<bool, String> {
    match operator
        .and_then(Value::as_str)
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("or") => Ok(false),
        Some("and") => Ok(true),
        Some(other) => Err(format!("invalid operator `{other}`: and or or")),
    }
}

fn list(value: &Value) -> Vec<&Value> {
    match value {
        Value::Array(items) => items.iter().collect(),
        Value::Null => Vec::new(),
        other => vec![other],
    }
}

impl Translator<'_> {
    fn clause(&mut self, dsl: &Value) -> Result<String, String> {
        let map = as_object(dsl, "query")?;
        if map.len() != 1 {
            return Err(format!(
                "a query clause must have exactly one key, got {}",
                map.keys()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let Some((kind, body)) = map.iter().next() else {
            return Ok("*".to_string());
        };
        match kind.as_str() {
            "match_all" => Ok("*".to_string()),
            "match_none" => Ok(MATCH_NONE.to_string()),
            "bool" => self.bool_clause(body),
            "query_string" => self.query_string(body),
            "term" => {
                let (field, spec) = single_field(body, "term")?;
                let value = match spec {
                    Value::Object(options) => options
                        .get("value")
                        .ok_or_else(|| format!("`term` on `{field}` needs a `value`"))?,
                    other => other,
                };
                // A term is not analyzed: on text (a string that is not a number or a
                // boolean), the indexed term must equal it exactly, which a regex of the
                // escaped value checks without tokenizing it.
                if let Value::String(text) = value {
                    let plain = text.parse::<f64>().is_err() && text.parse::<bool>().is_err();
                    let tokens = self.doc_mapper.tokens(field, text);
                    // Tokenized as itself (raw text): a plain term, which tag pruning sees.
                    let as_is = tokens
                        .as_deref()
                        .is_some_and(|t| t.len() == 1 && t[0] == *text);
                    let exact = as_is && case_flag(spec).is_empty();
                    if plain && !text.is_empty() && tokens.is_some() && !exact {
                        return Ok(format!(
                            "{}:/{}{}/",
                            escape_field(field),
                            case_flag(spec),
                            regex_escape(text)
                        ));
                    }
                }
                Ok(format!(
                    "{}:{}",
                    escape_field(field),
                    term_value(self.doc_mapper, field, value)?
                ))
            }
            "terms" => {
                let (field, values) = single_field(body, "terms")?;
                let Value::Array(values) = values else {
                    return Err(format!("`terms` on `{field}` needs an array of values"));
                };
                if values.is_empty() {
                    return Ok(MATCH_NONE.to_string());
                }
                let terms = values
                    .iter()
                    .map(|v| term_value(self.doc_mapper, field, v))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(format!("{}:IN [{}]", escape_field(field), terms.join(" ")))
            }
            "range" => self.range(body),
            "exists" => {
                let map = as_object(body, "exists")?;
                let field = map
                    .get("field")
                    .and_then(Value::as_str)
                    .ok_or("`exists` needs a `field`")?;
                Ok(format!("{}:*", escape_field(field)))
            }
            "match" => {
                let (field, spec) = single_field(body, "match")?;
                let (text, options) = query_text(spec, "match")?;
                let and = is_and(options.and_then(|o| o.get("operator")))?;
                // Words the field's tokenizer drops entirely (punctuation) are no terms.
                let words: Vec<String> = text
                    .split_whitespace()
                    .filter(|w| {
                        self.doc_mapper
                            .tokens(field, w)
                            .is_none_or(|tokens| !tokens.is_empty())
                    })
                    .map(|w| format!("{}:{}", escape_field(field), quote(w)))
                    .collect();
                if words.is_empty() {
                    let all = options
                        .and_then(|o| o.get("zero_terms_query"))
                        .and_then(Value::as_str)
                        .is_some_and(|z| z.eq_ignore_ascii_case("all"));
                    return Ok(if all {
                        "*".to_string()
                    } else {
                        MATCH_NONE.to_string()
                    });
                }
                Ok(format!(
                    "({})",
                    words.join(if and { " AND " } else { " OR " })
                ))
            }
            "match_phrase" | "match_phrase_prefix" => {
                let (field, spec) = single_field(body, kind)?;
                let (text, options) = query_text(spec, kind)?;
                let slop = options
                    .and_then(|o| o.get("slop"))
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                // `analyzer: raw`: the text is one term, not analyzed; another analyzer must
                // be a tokenizer of the index (the field's own is used).
                let analyzer = options
                    .and_then(|o| o.get("analyzer"))
                    .and_then(Value::as_str);
                if let Some(name) = analyzer {
                    if self.doc_mapper.tokenizer_manager().get(name).is_none() {
                        return Err(format!("unknown analyzer `{name}` in `{kind}`"));
                    }
                }
                let raw = analyzer == Some("raw");
                if raw {
                    let suffix = if kind == "match_phrase_prefix" {
                        ".*"
                    } else {
                        ""
                    };
                    return Ok(format!(
                        "{}:/{}{suffix}/",
                        escape_field(field),
                        regex_escape(&text)
                    ));
                }
                let mut out = format!("{}:{}", escape_field(field), quote(&text));
                if kind == "match_phrase_prefix" {
                    out.push('*');
                } else if slop > 0 {
                    out.push_str(&format!("~{slop}"));
                }
                Ok(out)
            }
            "match_bool_prefix" => {
                // Every word a term, the last one a prefix; OR unless `operator: and`.
                let (field, spec) = single_field(body, "match_bool_prefix")?;
                let (text, options) = query_text(spec, "match_bool_prefix")?;
                let and = is_and(options.and_then(|o| o.get("operator")))?;
                let words: Vec<&str> = text.split_whitespace().collect();
                let Some((last, rest)) = words.split_last() else {
                    return Ok(MATCH_NONE.to_string());
                };
                let mut clauses: Vec<String> = rest
                    .iter()
                    .map(|w| format!("{}:{}", escape_field(field), quote(w)))
                    .collect();
                clauses.push(format!("{}:{}*", escape_field(field), quote(last)));
                Ok(format!(
                    "({})",
                    clauses.join(if and { " AND " } else { " OR " })
                ))
            }
            "multi_match" => {
                let map = as_object(body, "multi_match")?;
                let (text, _) = query_text(body, "multi_match")?;
                let fields: Vec<&str> = map
                    .get("fields")
                    .map(list)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(Value::as_str)
                    .collect();
                if fields.is_empty() {
                    return Err("`multi_match` needs `fields`".to_string());
                }
                let kind_name = map.get("type").and_then(Value::as_str);
                let phrase = matches!(kind_name, Some("phrase") | Some("phrase_prefix"));
                let phrase_suffix = match (kind_name, map.get("slop").and_then(Value::as_u64)) {
                    (Some("phrase_prefix"), _) => "*".to_string(),
                    (_, Some(slop)) if slop > 0 => format!("~{slop}"),
                    _ => String::new(),
                };
                let and = is_and(map.get("operator"))?;
                let per_field = fields
                    .iter()
                    .map(|f| {
                        // `field^2` boosts are ignored.
                        let f = f.split('^').next().unwrap_or(f);
                        if phrase {
                            format!("{}:{}{phrase_suffix}", escape_field(f), quote(&text))
                        } else {
                            let words: Vec<String> = text
                                .split_whitespace()
                                .map(|w| format!("{}:{}", escape_field(f), quote(w)))
                                .collect();
                            format!("({})", words.join(if and { " AND " } else { " OR " }))
                        }
                    })
                    .collect::<Vec<_>>();
                Ok(format!("({})", per_field.join(" OR ")))
            }
            "prefix" => {
                let (field, spec) = single_field(body, "prefix")?;
                let value = match spec {
                    Value::Object(o) => o.get("value").cloned().unwrap_or(Value::Null),
                    other => other.clone(),
                };
                let Value::String(value) = value else {
                    return Err(format!("`prefix` on `{field}` needs a string value"));
                };
                Ok(format!(
                    "{}:/{}{}.*/",
                    escape_field(field),
                    case_flag(spec),
                    regex_escape(&value)
                ))
            }
            "wildcard" => {
                let (field, spec) = single_field(body, "wildcard")?;
                let value = match spec {
                    Value::Object(o) => o
                        .get("value")
                        .or_else(|| o.get("wildcard"))
                        .cloned()
                        .unwrap_or(Value::Null),
                    other => other.clone(),
                };
                let Value::String(value) = value else {
                    return Err(format!("`wildcard` on `{field}` needs a string value"));
                };
                if value == "*" {
                    return Ok(format!("{}:*", escape_field(field)));
                }
                if !value.contains(['*', '?']) && case_flag(spec).is_empty() {
                    return Ok(format!("{}:{}", escape_field(field), quote(&value)));
                }
                let pattern: String = value
                    .chars()
                    .map(|c| match c {
                        '*' => ".*".to_string(),
                        '?' => ".".to_string(),
                        c => regex_escape(&c.to_string()),
                    })
                    .collect();
                Ok(format!(
                    "{}:/{}{pattern}/",
                    escape_field(field),
                    case_flag(spec)
                ))
            }
            "regexp" => {
                let (field, spec) = single_field(body, "regexp")?;
                let value = match spec {
                    Value::Object(o) => o.get("value").cloned().unwrap_or(Value::Null),
                    other => other.clone(),
                };
                let Value::String(value) = value else {
                    return Err(format!("`regexp` on `{field}` needs a string value"));
                };
                Ok(format!(
                    "{}:/{}{}/",
                    escape_field(field),
                    case_flag(spec),
                    value.replace('/', "\\/")
                ))
            }
            other => Err(format!("unsupported query clause `{other}`")),
        }
    }

    fn bool_clause(&mut self, body: &Value) -> Result<String, String> {
        let map = as_object(body, "bool")?;
        let mut required = Vec::new();
        for key in ["must", "filter"] {
            for clause in map.get(key).map(list).unwrap_or_default() {
                required.push(self.clause(clause)?);
            }
        }
        let mut excluded = Vec::new();
        for clause in map.get("must_not").map(list).unwrap_or_default() {
            excluded.push(self.clause(clause)?);
        }
        let mut should = Vec::new();
        for clause in map.get("should").map(list).unwrap_or_default() {
            should.push(self.clause(clause)?);
        }
        for key in map.keys() {
            if !matches!(
                key.as_str(),
                "must"
                    | "filter"
                    | "must_not"
                    | "should"
                    | "minimum_should_match"
                    | "boost"
                    | "_name"
            ) {
                return Err(format!("unknown key `{key}` in `bool`"));
            }
        }
        if !should.is_empty() {
            // Without must/filter one should clause must match; with them, should clauses
            // only score, unless minimum_should_match says otherwise.
            // Without must or filter clauses at least one should clause must match, whatever
            // a (negative or percentage) minimum_should_match computes to.
            let minimum = match map.get("minimum_should_match") {
                None => 0,
                Some(value) => minimum_should_match(value, should.len())?,
            }
            .max(usize::from(required.is_empty()));
            if minimum > should.len() {
                // More should clauses must match than there are: nothing matches.
                return Ok(MATCH_NONE.to_string());
            } else if minimum == should.len() {
                required.extend(should);
            } else if minimum == 1 {
                required.push(format!("({})", should.join(" OR ")));
            } else if minimum > 1 {
                // At least k of n: the disjunction of every k-subset's conjunction, while
                // that stays small.
                let combinations = k_subsets(should.len(), minimum, MAX_SHOULD_COMBINATIONS)
                    .ok_or_else(|| {
                        format!(
                            "minimum_should_match {minimum} of {} should clauses expands to more \
                             than {MAX_SHOULD_COMBINATIONS} combinations",
                            should.len()
                        )
                    })?;
                let alternatives: Vec<String> = combinations
                    .iter()
                    .map(|subset| {
                        let parts: Vec<String> =
                            subset.iter().map(|&i| format!("({})", should[i])).collect();
                        format!("({})", parts.join(" AND "))
                    })
                    .collect();
                required.push(format!("({})", alternatives.join(" OR ")));
            }
        }
        let mut out = if required.is_empty() {
            "*".to_string()
        } else {
            required
                .iter()
                .map(|c| format!("({c})"))
                .collect::<Vec<_>>()
                .join(" AND ")
        };
        for clause in excluded {
            out = format!("{out} AND NOT ({clause})");
        }
        Ok(format!("({out})"))
    }

    fn query_string(&mut self, body: &Value) -> Result<String, String> {
        let map = as_object(body, "query_string")?;
        let query = map
            .get("query")
            .and_then(Value::as_str)
            .ok_or("`query_string` needs a `query`")?;
        let mut fields: Vec<String> = Vec::new();
        if let Some(field) = map.get("default_field").and_then(Value::as_str) {
            if field != "*" {
                fields.push(field.to_string());
            }
        }
        if map.contains_key("default_field") && map.contains_key("fields") {
            return Err("`query_string` takes `default_field` or `fields`, not both".to_string());
        }
        if map.get("fields").is_some_and(|fields| !fields.is_array()) {
            return Err("`fields` of `query_string` must be an array of field names".to_string());
        }
        for field in map.get("fields").map(list).unwrap_or_default() {
            if let Some(field) = field.as_str() {
                fields.push(field.split('^').next().unwrap_or(field).to_string());
            }
        }
        // Lenient: fields that cannot hold values (a path under a field that is not an
        // object) are skipped instead of failing the query.
        if map.get("lenient").and_then(Value::as_bool) == Some(true) && fields.len() > 1 {
            let schema = self.doc_mapper.schema();
            fields.retain(|field| match schema.find_field(field) {
                Some((_, "")) => true,
                Some((f, _)) => matches!(
                    schema.get_field_entry(f).field_type(),
                    FieldType::JsonObject(_)
                ),
                None => self.doc_mapper.dynamic_field().is_some(),
            });
        }
        if !fields.is_empty() {
            match &self.search_fields {
                Some(existing) if *existing != fields => {
                    return Err(
                        "query_string clauses with different default fields in one search are \
                         not supported"
                            .to_string(),
                    )
                }
                _ => self.search_fields = Some(fields),
            }
        }
        let query = query.trim();
        if query.is_empty() || query == "*" {
            return Ok("*".to_string());
        }
        Ok(format!("({query})"))
    }

    fn range(&mut self, body: &Value) -> Result<String, String> {
        let (field, spec) = single_field(body, "range")?;
        let options = as_object(spec, "range")?;
        let format = options.get("format").and_then(Value::as_str);
        let bound = |key: &str| -> Result<Option<String>, String> {
            match options.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(value) => range_value(self.doc_mapper, field, value, format).map(Some),
            }
        };
        let include_lower = options
            .get("include_lower")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let include_upper = options
            .get("include_upper")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let (lower, lower_inclusive) = match (bound("gte")?, bound("gt")?, bound("from")?) {
            (Some(v), _, _) => (Some(v), true),
            (None, Some(v), _) => (Some(v), false),
            (None, None, Some(v)) => (Some(v), include_lower),
            _ => (None, true),
        };
        let (upper, upper_inclusive) = match (bound("lte")?, bound("lt")?, bound("to")?) {
            (Some(v), _, _) => (Some(v), true),
            (None, Some(v), _) => (Some(v), false),
            (None, None, Some(v)) => (Some(v), include_upper),
            _ => (None, true),
        };
        Ok(format!(
            "{}:{}{} TO {}{}",
            escape_field(field),
            if lower_inclusive && lower.is_some() {
                '['
            } else {
                '{'
            },
            lower.as_deref().unwrap_or("*"),
            upper.as_deref().unwrap_or("*"),
            if upper_inclusive && upper.is_some() {
                ']'
            } else {
                '}'
            },
        ))
    }
}

/// Most alternatives a `minimum_should_match` of k out of n may expand to.
const MAX_SHOULD_COMBINATIONS: usize = 256;

/// Every k-element subset of `0..n` in lexicographic order, or `None` if there are more
/// than `max`.
fn k_subsets(n: usize, k: usize, max: usize) -> Option<Vec<Vec<usize>>> {
    let mut out = Vec::new();
    let mut current: Vec<usize> = (0..k).collect();
    if k == 0 || k > n {
        return Some(out);
    }
    loop {
        if out.len() == max {
            return None;
        }
        out.push(current.clone());
        // Advance the rightmost index that can move.
        let mut i = k;
        loop {
            if i == 0 {
                return Some(out);
            }
            i -= 1;
            if current[i] < n - k + i {
                break;
            }
        }
        current[i] += 1;
        for j in i + 1..k {
            current[j] = current[j - 1] + 1;
        }
    }
}

fn minimum_should_match(value: &Value, num_should: usize) -> Result<usize, String> {
    let text = match value {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.trim().to_string(),
        other => return Err(format!("invalid minimum_should_match {other}")),
    };
    if let Some(percent) = text.strip_suffix('%') {
        let p: i64 = percent
            .parse()
            .map_err(|_| format!("invalid minimum_should_match `{text}`"))?;
        let n = (num_should as i64 * p.abs() / 100) as usize;
        return Ok(if p < 0 { num_should - n } else { n });
    }
    let n: i64 = text
        .parse()
        .map_err(|_| format!("invalid minimum_should_match `{text}`"))?;
    Ok(if n < 0 {
        num_should.saturating_sub(n.unsigned_abs() as usize)
    } else {
        n as usize
    })
}

/// The time range (seconds; start inclusive, end exclusive) that a range on the timestamp
/// field at the top of the query (itself, or a `must`/`filter` clause of a top-level `bool`)
/// implies; coarse, for split pruning only (the range itself stays in the query).
fn top_level_time_bounds(dsl: &Value, doc_mapper: &DocMapper) -> (Option<i64>, Option<i64>) {
    let Some(ts) = doc_mapper.timestamp_field_name() else {
        return (None, None);
    };
    let mut clauses: Vec<&Value> = vec![dsl];
    if let Some(bool_body) = dsl.get("bool") {
        for key in ["must", "filter"] {
            clauses.extend(bool_body.get(key).map(list).unwrap_or_default());
        }
    }
    let ranges: Vec<&Map<String, Value>> = clauses
        .into_iter()
        .filter_map(|clause| clause.get("range")?.get(ts)?.as_object())
        .collect();
    let mut start: Option<i64> = None;
    let mut end: Option<i64> = None;
    let secs = |value: &Value, format: Option<&str>| -> Option<f64> {
        let text = date_value(value, format).ok()?;
        let dt = time::OffsetDateTime::parse(&text, &time::format_description::well_known::Rfc3339)
            .ok()?;
        Some(dt.unix_timestamp_nanos() as f64 / 1e9)
    };
    for range in ranges {
        let format = range.get("format").and_then(Value::as_str);
        for key in ["gte", "gt", "from"] {
            if let Some(s) = range.get(key).and_then(|v| secs(v, format)) {
                let s = s.floor() as i64;
                start = Some(start.map_or(s, |x| x.max(s)));
            }
        }
        for key in ["lte", "lt", "to"] {
            if let Some(s) = range.get(key).and_then(|v| secs(v, format)) {
                let e = s.floor() as i64 + 1;
                end = Some(end.map_or(e, |x| x.min(e)));
            }
        }
    }
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mapper() -> DocMapper {
        let config = shale_config::IndexConfig::parse(
            br#"
version: 0.8
index_id: test-index
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, fast: true}
    - {name: service, type: text, tokenizer: raw, fast: true}
    - {name: message, type: text, record: position}
    - {name: status, type: u64, fast: true}
  timestamp_field: ts
"#,
        )
        .unwrap();
        DocMapper::for_index(&config).unwrap()
    }

    fn translate(body: Value) -> Result<EsTranslated, String> {
        let body: EsSearchBody = serde_json::from_value(body).unwrap();
        translate_search(&body, None, None, None, &mapper())
    }

    #[test]
    fn grafana_logs_query() {
        let t = translate(json!({
            "size": 500,
            "query": {"bool": {"filter": [
                {"range": {"ts": {"gte": 1668422437218u64, "lte": 1668422625668u64, "format": "epoch_millis"}}},
                {"query_string": {"analyze_wildcard": true, "query": "service:api"}}]}},
            "sort": {"_doc": {"order": "desc"}, "ts": {"order": "desc", "unmapped_type": "boolean"}},
            "docvalue_fields": ["ts"], "script_fields": {},
            "highlight": {"fields": {"*": {}}}
        }))
        .unwrap();
        assert_eq!(t.request.max_hits, 500);
        assert_eq!(t.request.sort_by.as_deref(), Some("ts,_doc:desc"));
        assert_eq!(t.request.start_timestamp, Some(1668422437));
        assert_eq!(t.request.end_timestamp, Some(1668422626));
        assert_eq!(
            t.request.query,
            "((ts:[2022-11-14T10:40:37.218Z TO 2022-11-14T10:43:45.668Z]) AND ((service:api)))"
        );
        // It parses for the index.
        mapper().parse_query(&t.request.query, None).unwrap();
    }

    #[test]
    fn custom_date_formats_and_lenient_fields() {
        let t = translate(json!({"query": {"range": {"ts": {
            "gte": "2015|02|01 T00:00:00.001999Z",
            "format": "yyyy|MM|dd 'T'HH:mm:ss.SSSSSS'Z'"}}}}))
        .unwrap();
        assert!(
            t.request.query.contains("2015-02-01T00:00:00.001999Z"),
            "{}",
            t.request.query
        );
        let t = translate(json!({"query": {"range": {"ts": {
            "lte": "01/02/2015", "format": "strict_date_optional_time||dd/MM/yyyy"}}}}))
        .unwrap();
        assert!(
            t.request.query.contains("2015-02-01T00:00:00Z"),
            "{}",
            t.request.query
        );
        // A date that matches none of the given patterns is refused, naming both; `now`
        // needs no pattern, and a named format keeps the usual forms.
        let Err(err) = translate(json!({"query": {"range": {"ts": {
            "gte": "2015-02-01", "format": "dd/MM/yyyy"}}}}))
        else {
            panic!("a date the format does not match was accepted");
        };
        assert!(
            err.contains("[2015-02-01]") && err.contains("[dd/MM/yyyy]"),
            "{err}"
        );
        assert!(translate(json!({"query": {"range": {"ts": {
            "gte": "now-1d", "format": "dd/MM/yyyy"}}}}))
        .is_ok());
        assert!(translate(json!({"query": {"range": {"ts": {
            "gte": "2015-02-01", "format": "strict_date_optional_time||dd/MM/yyyy"}}}}))
        .is_ok());
        // Lenient: a path under a field that is not an object is skipped.
        let t = translate(json!({"query": {"query_string": {
            "query": "x", "fields": ["service", "status.nope"], "lenient": true}}}))
        .unwrap();
        assert_eq!(t.request.search_field, Some(vec!["service".to_string()]));
        assert_eq!(
            shale_index::java_date_format_to_strptime("yyyy-MM-dd'T'HH:mm:ssXXX").as_deref(),
            Some("%Y-%m-%dT%H:%M:%S%z")
        );
    }

    #[test]
    fn minimum_should_match_expands_to_k_subsets() {
        assert_eq!(
            k_subsets(4, 2, 100).unwrap(),
            [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]
        );
        assert_eq!(k_subsets(3, 3, 100).unwrap(), [[0, 1, 2]]);
        assert!(k_subsets(30, 15, 256).is_none(), "too many");
        let q = |dsl: Value| translate(json!({"query": dsl})).map(|t| t.request.query);
        let two_of_three = q(json!({"bool": {
            "should": [{"term": {"a": 1}}, {"term": {"b": 2}}, {"term": {"c": 3}}],
            "minimum_should_match": 2}}))
        .unwrap();
        assert_eq!(
            two_of_three,
            "(((((a:1) AND (b:2)) OR ((a:1) AND (c:3)) OR ((b:2) AND (c:3)))))"
        );
        // The expansion means what it says (parsed by the index's query parser).
        mapper().parse_query(&two_of_three, None).unwrap();
    }

    #[test]
    fn clauses() {
        let q = |dsl: Value| translate(json!({"query": dsl})).unwrap().request.query;
        assert_eq!(q(json!({"match_all": {}})), "*");
        // Terms on text are exact (not analyzed): a regex of the escaped value, or a plain
        // term where the tokenizer keeps the value as it is (raw).
        assert_eq!(q(json!({"term": {"message": "A\"b"}})), r#"message:/A\"b/"#);
        assert_eq!(q(json!({"term": {"service": "a\"b"}})), r#"service:"a\"b""#);
        assert_eq!(q(json!({"term": {"status": 200}})), "status:200");
        assert_eq!(
            q(json!({"terms": {"status": [200, 404]}})),
            "status:IN [200 404]"
        );
        assert_eq!(
            q(json!({"match": {"message": {"query": "quick fox", "operator": "and"}}})),
            r#"(message:"quick" AND message:"fox")"#
        );
        assert_eq!(
            q(json!({"match_phrase": {"message": "quick fox"}})),
            r#"message:"quick fox""#
        );
        assert_eq!(
            q(json!({"range": {"status": {"gt": 200, "lt": 500}}})),
            "status:{200 TO 500}"
        );
        assert_eq!(q(json!({"exists": {"field": "status"}})), "status:*");
        assert_eq!(
            q(
                json!({"bool": {"should": [{"term": {"service": "a"}}, {"term": {"service": "b"}}],
                "must_not": {"term": {"status": 500}}}})
            ),
            r#"(((service:"a" OR service:"b")) AND NOT (status:500))"#
        );
        for dsl in [
            json!({"match_all": {}}),
            json!({"bool": {"must_not": [{"match_all": {}}]}}),
            json!({"prefix": {"service": "ap"}}),
            json!({"wildcard": {"service": {"value": "ap*"}}}),
            json!({"regexp": {"service": "a.*"}}),
            json!({"multi_match": {"query": "quick fox", "fields": ["message", "service^2"]}}),
            json!({"match_none": {}}),
        ] {
            let query = q(dsl.clone());
            mapper()
                .parse_query(&query, None)
                .unwrap_or_else(|e| panic!("{dsl} -> {query}: {e}"));
        }
        assert!(translate(json!({"query": {"fuzzy": {"service": "x"}}}))
            .unwrap_err()
            .contains("fuzzy"));
        assert!(translate(json!({"from": 9000, "size": 2000}))
            .unwrap_err()
            .contains("Result window is too large"));
    }

    #[test]
    fn sorts() {
        let s = |v: Value| parse_sort(Some(&v)).unwrap();
        let sort = |field: &str, ascending: bool| EsSort {
            field: field.into(),
            ascending,
            format: None,
        };
        assert_eq!(
            s(json!(["status", {"ts": "desc"}, "_doc"])),
            vec![sort("status", true), sort("ts", false)]
        );
        assert_eq!(s(json!("_score")), vec![sort("_score", false)]);
        assert_eq!(s(json!({"_doc": {}})), vec![sort("_doc", true)]);
        assert_eq!(s(json!([{"_doc": "desc"}])), vec![sort("_doc", false)]);
        assert_eq!(
            s(json!([{"ts": {"order": "asc", "format": "epoch_nanos_int"}}]))[0].format,
            Some("epoch_nanos_int".to_string())
        );
        assert_eq!(
            sort_by_string(&s(json!(["status", {"ts": "desc"}]))).unwrap(),
            "-status,ts"
        );
        assert_eq!(
            sort_by_string(&s(json!({"_doc": "desc"}))).unwrap(),
            "_doc:desc"
        );
    }
}
