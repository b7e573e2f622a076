//! Aggregations: Quickwit's `aggs` (Elasticsearch aggregation JSON) run on every split as
//! Tantivy's distributed aggregations. A leaf merges the intermediate results of its splits
//! and ships them to the root (postcard, base64 in the JSON of the internal API); the root
//! merges every leaf's and renders the final result once, so the result is that of one index
//! holding all the documents.
//!
//! The request is normalized first so that what Elasticsearch clients (Grafana among them)
//! send is accepted: `aggregations` for `aggs`, `meta` dropped, date histograms' legacy
//! `interval` and fixed-length `calendar_interval`s (minute, hour, day, week), `format`
//! ignored, `time_zone` as UTC, a fixed offset or a time zone name (its offset at the start
//! of the histogram's bounds), bounds given as strings or dates. Fields
//! are resolved as queries resolve them (undeclared fields of a dynamic index live in
//! `_dynamic`) and must be fast; anything else is an error naming what is wrong.

use base64::Engine;
use serde_json::{json, Map, Value};
use shale_index::DocMapper;
use tantivy::aggregation::agg_req::Aggregations;
use tantivy::aggregation::intermediate_agg_result::IntermediateAggregationResults;
use tantivy::aggregation::{AggContextParams, AggregationLimitsGuard};
use tantivy::tokenizer::TokenizerManager;

/// Most buckets an aggregation may return (as in Quickwit and Tantivy).
pub const MAX_BUCKETS: u32 = 65_000;
/// Memory an aggregation may use per split, in bytes.
pub const MAX_AGG_MEMORY: u64 = 500_000_000;

/// The limits every aggregation runs under.
pub fn limits() -> AggregationLimitsGuard {
    AggregationLimitsGuard::new(Some(MAX_AGG_MEMORY), Some(MAX_BUCKETS))
}

/// Limits of `memory_limit` bytes (the bucket limit as usual); clones share one counter.
pub fn limits_of(memory_limit: u64) -> AggregationLimitsGuard {
    AggregationLimitsGuard::new(Some(memory_limit), Some(MAX_BUCKETS))
}

/// The context aggregation collectors are built with.
pub fn context() -> AggContextParams {
    context_with(limits())
}

/// The context aggregation collectors are built with, under `limits`.
pub fn context_with(limits: AggregationLimitsGuard) -> AggContextParams {
    AggContextParams::new(limits, TokenizerManager::default())
}

/// Parses, normalizes and checks the `aggs` of a request against `doc_mapper`.
pub fn parse_aggs(doc_mapper: &DocMapper, aggs: &Value) -> Result<Aggregations, String> {
    let aggs = match aggs {
        // `aggs` in a query string arrives as a JSON string.
        Value::String(text) => serde_json::from_str::<Value>(text)
            .map_err(|err| format!("invalid aggregation request: `aggs` is not JSON: {err}"))?,
        other => other.clone(),
    };
    let Value::Object(mut aggs) = aggs else {
        return Err(
            "invalid aggregation request: `aggs` must be an object of named \
                    aggregations"
                .to_string(),
        );
    };
    let depth = agg_depth(&aggs);
    if depth > MAX_AGG_DEPTH {
        return Err(format!(
            "invalid aggregation request: aggregations nested {depth} deep, at most \
             {MAX_AGG_DEPTH} levels are allowed (the maximum aggregation depth: each level \
             multiplies the buckets, and the memory, of the one above)"
        ));
    }
    normalize_aggs(doc_mapper, &mut aggs, "")?;
    serde_json::from_value::<Aggregations>(Value::Object(aggs))
        .map_err(|err| format!("invalid aggregation request: {err}"))
}

/// The deepest aggregations may nest (`aggs` inside a bucket aggregation is a level).
pub const MAX_AGG_DEPTH: usize = 8;

/// How deep named aggregations nest (1: none has sub-aggregations), measured without
/// recursion.
fn agg_depth(aggs: &Map<String, Value>) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&Map<String, Value>, usize)> = vec![(aggs, 1)];
    while let Some((aggs, level)) = stack.pop() {
        deepest = deepest.max(level);
        for agg in aggs.values() {
            for key in ["aggs", "aggregations"] {
                if let Some(Value::Object(sub)) = agg.get(key) {
                    stack.push((sub, level + 1));
                }
            }
        }
    }
    deepest
}

/// Normalizes a map of named aggregations in place; `path` names the parent for messages.
fn normalize_aggs(
    doc_mapper: &DocMapper,
    aggs: &mut Map<String, Value>,
    path: &str,
) -> Result<(), String> {
    for (name, agg) in aggs.iter_mut() {
        let here = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        let Value::Object(agg) = agg else {
            return Err(format!(
                "invalid aggregation request: aggregation `{here}` must be an object"
            ));
        };
        agg.remove("meta");
        if let Some(sub) = agg.remove("aggregations") {
            agg.insert("aggs".to_string(), sub);
        }
        if agg.contains_key("multi_terms") {
            multi_terms_as_nested_terms(agg, &here)?;
        }
        if let Some(sub) = agg.get_mut("aggs") {
            let Value::Object(sub) = sub else {
                return Err(format!(
                    "invalid aggregation request: `aggs` of `{here}` must be an object"
                ));
            };
            normalize_aggs(doc_mapper, sub, &here)?;
        }
        let kinds: Vec<String> = agg.keys().filter(|k| *k != "aggs").cloned().collect();
        if kinds.len() != 1 {
            return Err(format!(
                "invalid aggregation request: aggregation `{here}` must have exactly one type \
                 (e.g. `terms`, `date_histogram`, `avg`), found {}",
                if kinds.is_empty() {
                    "none".to_string()
                } else {
                    kinds
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ));
        }
        let kind = kinds[0].clone();
        let Some(Value::Object(body)) = agg.get_mut(&kind) else {
            return Err(format!(
                "invalid aggregation request: `{kind}` of aggregation `{here}` must be an object"
            ));
        };
        if let Some(field) = body.get("field") {
            let Value::String(field) = field else {
                return Err(format!(
                    "invalid aggregation request: `field` of aggregation `{here}` must be a string"
                ));
            };
            let resolved = resolve_field(doc_mapper, field, &here)?;
            body.insert("field".to_string(), Value::String(resolved));
        }
        match kind.as_str() {
            "composite" => resolve_composite_sources(doc_mapper, body, &here)?,
            "date_histogram" => normalize_date_histogram(body, &here)?,
            "histogram" => {
                for bounds in ["extended_bounds", "hard_bounds"] {
                    normalize_bounds(body, bounds, &here)?;
                }
            }
            // Tantivy's range collector indexes its first range (a panic with none).
            "range" | "date_range"
                if body
                    .get("ranges")
                    .and_then(Value::as_array)
                    .is_none_or(|ranges| ranges.is_empty()) =>
            {
                return Err(format!(
                    "invalid aggregation request: `{kind}` aggregation `{here}` needs \
                     `ranges`: a list of at least one range"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Resolves the `field` of each of a `composite` aggregation's `sources` (`[{name: {terms:
/// {field, …}}}, …]`) as that of any other aggregation.
fn resolve_composite_sources(
    doc_mapper: &DocMapper,
    body: &mut Map<String, Value>,
    here: &str,
) -> Result<(), String> {
    let Some(Value::Array(sources)) = body.get_mut("sources") else {
        return Ok(());
    };
    for source in sources.iter_mut().filter_map(Value::as_object_mut) {
        for (name, kinds) in source.iter_mut() {
            let at = format!("{here}.sources.{name}");
            for source_body in kinds
                .as_object_mut()
                .into_iter()
                .flat_map(|k| k.values_mut())
            {
                let Some(source_body) = source_body.as_object_mut() else {
                    continue;
                };
                if let Some(Value::String(field)) = source_body.get("field") {
                    let resolved = resolve_field(doc_mapper, field, &at)?;
                    source_body.insert("field".to_string(), Value::String(resolved));
                }
            }
        }
    }
    Ok(())
}

/// The schema name of an aggregated field, which must exist and be fast.
fn resolve_field(doc_mapper: &DocMapper, field: &str, agg: &str) -> Result<String, String> {
    let schema = doc_mapper.schema();
    let mut name = field.to_string();
    if schema.find_field(&name).is_none() && doc_mapper.dynamic_field().is_some() {
        name = format!("{}.{field}", shale_index::DYNAMIC_FIELD_NAME);
    }
    let Some((schema_field, _)) = schema.find_field(&name) else {
        return Err(format!(
            "invalid aggregation request: aggregation `{agg}` is on field `{field}`, which is \
             not in the doc mapping"
        ));
    };
    if !schema.get_field_entry(schema_field).is_fast() {
        return Err(format!(
            "invalid aggregation request: aggregation `{agg}` is on field `{field}`, which is \
             not a fast field (set `fast: true` in its mapping)"
        ));
    }
    Ok(name)
}

/// Length in milliseconds of the calendar intervals that have a fixed length in UTC, and the
/// offset that aligns their buckets as Elasticsearch does (weeks start on Monday; 1970-01-01
/// was a Thursday).
fn calendar_interval(interval: &str) -> Option<(&'static str, Option<&'static str>)> {
    match interval {
        "1s" | "second" => Some(("1s", None)),
        "1m" | "minute" => Some(("1m", None)),
        "1h" | "hour" => Some(("1h", None)),
        "1d" | "day" => Some(("1d", None)),
        "1w" | "week" => Some(("7d", Some("4d"))),
        _ => None,
    }
}

/// Whether `interval` is a fixed interval (`30s`, `5m`, `1h`, `2d`, `100ms`).
fn is_fixed_interval(interval: &str) -> bool {
    let digits = interval.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &interval[digits.len()..];
    !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit())
        && matches!(unit, "ms" | "s" | "m" | "h" | "d")
}

fn normalize_date_histogram(body: &mut Map<String, Value>, agg: &str) -> Result<(), String> {
    // Elasticsearch's rendering hints: the keys are epoch milliseconds either way.
    body.remove("format");
    let text = |value: &Value| value.as_str().map(str::to_string);
    let mut offset_ms = match body.remove("offset") {
        None => 0,
        Some(value) => {
            let offset = text(&value).ok_or_else(|| {
                format!("invalid aggregation request: `offset` of `{agg}` must be a string")
            })?;
            parse_signed_duration_ms(&offset).ok_or_else(|| {
                format!(
                    "invalid aggregation request: `offset` `{offset}` of `{agg}` is not a \
                     duration such as `1h` or `-30m`"
                )
            })?
        }
    };
    let mut fixed = body.remove("fixed_interval").and_then(|v| text(&v));
    for key in ["calendar_interval", "interval"] {
        let Some(value) = body.remove(key) else {
            continue;
        };
        let interval = text(&value).ok_or_else(|| {
            format!("invalid aggregation request: `{key}` of `{agg}` must be a string")
        })?;
        if key == "interval"
            && is_fixed_interval(&interval)
            && calendar_interval(&interval).is_none()
        {
            fixed = Some(interval);
            continue;
        }
        match calendar_interval(&interval) {
            Some((length, align)) => {
                fixed = Some(length.to_string());
                if let Some(align) = align {
                    offset_ms += parse_signed_duration_ms(align).unwrap_or(0);
                }
            }
            None => {
                return Err(format!(
                    "invalid aggregation request: {key} `{interval}` of `{agg}` is not \
                     supported: months, quarters and years have no fixed length; use \
                     `fixed_interval` (e.g. `30d`)"
                ))
            }
        }
    }
    let Some(fixed) = fixed else {
        return Err(format!(
            "invalid aggregation request: date_histogram `{agg}` needs `fixed_interval` \
             (e.g. `1h`)"
        ));
    };
    let interval_ms = parse_signed_duration_ms(&fixed)
        .filter(|ms| *ms > 0)
        .ok_or_else(|| {
            format!(
                "invalid aggregation request: fixed_interval `{fixed}` of `{agg}` is not a \
                 duration such as `30s`, `1m`, `1h` or `1d`"
            )
        })?;
    if let Some(zone) = body.remove("time_zone") {
        let zone = text(&zone).ok_or_else(|| {
            format!("invalid aggregation request: `time_zone` of `{agg}` must be a string")
        })?;
        let reference_ms = ["extended_bounds", "hard_bounds"]
            .iter()
            .find_map(|key| body.get(*key)?.get("min").and_then(bound_ms));
        let zone_offset_ms = parse_time_zone_ms(&zone)
            .or_else(|| named_zone_offset_ms(&zone, reference_ms))
            .ok_or_else(|| {
                format!(
                    "invalid aggregation request: time_zone `{zone}` of `{agg}` is neither \
                     UTC, a fixed offset such as `+02:00`, nor a time zone name such as \
                     `Europe/Paris`"
                )
            })?;
        // Buckets start at local boundaries: shift the grid by minus the zone's offset.
        offset_ms -= zone_offset_ms;
    }
    body.insert("fixed_interval".to_string(), Value::String(fixed));
    let offset_ms = offset_ms.rem_euclid(interval_ms);
    if offset_ms != 0 {
        body.insert(
            "offset".to_string(),
            Value::String(format!("{offset_ms}ms")),
        );
    }
    for bounds in ["extended_bounds", "hard_bounds"] {
        normalize_bounds(body, bounds, agg)?;
    }
    Ok(())
}

/// `min`/`max` of histogram bounds as numbers: numeric strings and RFC 3339 dates (as epoch
/// milliseconds) are accepted, as Elasticsearch does.
fn normalize_bounds(body: &mut Map<String, Value>, key: &str, agg: &str) -> Result<(), String> {
    let Some(Value::Object(bounds)) = body.get_mut(key) else {
        return Ok(());
    };
    for end in ["min", "max"] {
        let Some(value) = bounds.get_mut(end) else {
            continue;
        };
        if let Value::String(text) = value {
            let number = text
                .trim()
                .parse::<f64>()
                .ok()
                .or_else(|| {
                    time::OffsetDateTime::parse(
                        text.trim(),
                        &time::format_description::well_known::Rfc3339,
                    )
                    .ok()
                    .map(|dt| (dt.unix_timestamp_nanos() / 1_000_000) as f64)
                })
                .ok_or_else(|| {
                    format!(
                        "invalid aggregation request: `{key}.{end}` of `{agg}` is neither a \
                         number nor a date: `{text}`"
                    )
                })?;
            *value = serde_json::Number::from_f64(number)
                .map(Value::Number)
                .unwrap_or(Value::Null);
        }
    }
    Ok(())
}

/// Milliseconds of `[+-]<n><unit>` (`ms`, `s`, `m`, `h`, `d`).
fn parse_signed_duration_ms(text: &str) -> Option<i64> {
    let text = text.trim();
    let (sign, rest) = match text.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, text.strip_prefix('+').unwrap_or(text)),
    };
    let digits = rest.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &rest[digits.len()..];
    let n: i64 = digits.parse().ok()?;
    let per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(per).map(|ms| sign * ms)
}

/// The offset from UTC of a time zone given as UTC or a fixed offset (`+02:00`, `-0530`,
/// `+01`), in milliseconds.
fn parse_time_zone_ms(zone: &str) -> Option<i64> {
    let zone = zone.trim();
    if matches!(
        zone.to_ascii_lowercase().as_str(),
        "utc" | "z" | "gmt" | "etc/utc" | "etc/gmt" | "universal" | "zulu"
    ) {
        return Some(0);
    }
    let zone = zone
        .strip_prefix("UTC")
        .or_else(|| zone.strip_prefix("GMT"))
        .unwrap_or(zone);
    let (sign, rest) = match zone.chars().next()? {
        '+' => (1, &zone[1..]),
        '-' => (-1, &zone[1..]),
        _ => return None,
    };
    let digits: String = rest.chars().filter(|c| *c != ':').collect();
    if !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let (hours, minutes) = match digits.len() {
        1 | 2 => (digits.parse::<i64>().ok()?, 0),
        4 => (
            digits[..2].parse::<i64>().ok()?,
            digits[2..].parse::<i64>().ok()?,
        ),
        _ => return None,
    };
    if hours > 18 || minutes > 59 {
        return None;
    }
    Some(sign * (hours * 3_600_000 + minutes * 60_000))
}

/// A histogram bound in epoch milliseconds (number, numeric string or RFC 3339 date).
fn bound_ms(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_f64().map(|f| f as i64),
        Value::String(text) => text
            .trim()
            .parse::<f64>()
            .ok()
            .map(|f| f as i64)
            .or_else(|| {
                time::OffsetDateTime::parse(
                    text.trim(),
                    &time::format_description::well_known::Rfc3339,
                )
                .ok()
                .map(|dt| (dt.unix_timestamp_nanos() / 1_000_000) as i64)
            }),
        _ => None,
    }
}

/// The UTC offset of the IANA time zone `name` (`Europe/Paris`) at `at_ms` (the start of
/// the histogram's bounds, else now), in milliseconds. Buckets use this one offset: across a
/// daylight-saving change inside the range, they keep the offset of its start.
fn named_zone_offset_ms(name: &str, at_ms: Option<i64>) -> Option<i64> {
    let zone = jiff::tz::TimeZone::get(name).ok()?;
    let at = match at_ms {
        Some(ms) => jiff::Timestamp::from_millisecond(ms).ok()?,
        None => jiff::Timestamp::now(),
    };
    Some(i64::from(zone.to_offset(at).seconds()) * 1000)
}

/// Names the nested `terms` level a `multi_terms` aggregation became; what follows the prefix
/// is its options (size, order, min_doc_count) as JSON, read back when the result is
/// flattened.
const MULTI_TERMS_LEVEL: &str = "__shale_multi_terms__";

/// Buckets created per level of a `multi_terms` rewritten as nested `terms`, by number of
/// fields (the product stays under Tantivy's bucket limit).
fn multi_terms_level_size(fields: usize) -> u64 {
    match fields {
        0..=2 => 200,
        3 => 34,
        _ => 12,
    }
}

/// Rewrites a `multi_terms` aggregation (not in Tantivy) as nested `terms` aggregations, one
/// level per field, the innermost holding the sub-aggregations; [`finalize`] flattens the
/// result back into buckets keyed by the list of values. Each field contributes its top
/// [`multi_terms_level_size`] values.
fn multi_terms_as_nested_terms(agg: &mut Map<String, Value>, here: &str) -> Result<(), String> {
    let invalid =
        |what: &str| format!("invalid aggregation request: `multi_terms` of `{here}` {what}");
    let Some(Value::Object(body)) = agg.remove("multi_terms") else {
        return Err(invalid("must be an object"));
    };
    let Some(Value::Array(terms)) = body.get("terms") else {
        return Err(invalid("needs `terms`, a list of `{\"field\": …}`"));
    };
    if terms.len() < 2 {
        return Err(invalid("needs at least two `terms`"));
    }
    let size = match body.get("size") {
        None => 10,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| invalid("`size` must be a positive integer"))?,
    };
    let min_doc_count = match body.get("min_doc_count") {
        None => 1,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| invalid("`min_doc_count` must be a non-negative integer"))?,
    };
    let (order_key, ascending) = match body.get("order") {
        None => ("_count".to_string(), false),
        Some(Value::Object(order)) if order.len() == 1 => {
            let (key, direction) = order.iter().next().ok_or_else(|| invalid("bad order"))?;
            if key != "_key" && key != "_count" {
                return Err(invalid("can only be ordered by `_key` or `_count`"));
            }
            let ascending = match direction.as_str() {
                Some("asc") => true,
                Some("desc") => false,
                _ => return Err(invalid("order must be `asc` or `desc`")),
            };
            (key.clone(), ascending)
        }
        Some(_) => {
            return Err(invalid(
                "`order` must be one `{\"_key\"|\"_count\": \"asc\"|\"desc\"}`",
            ))
        }
    };
    let options = json!({
        "size": size,
        "min_doc_count": min_doc_count,
        "order": order_key,
        "asc": ascending,
    });
    let level_size = multi_terms_level_size(terms.len());
    let sub_aggs = agg.remove("aggs");
    // Innermost first.
    let mut nested: Option<Value> = None;
    for term in terms.iter().rev() {
        let Some(field) = term.get("field").and_then(Value::as_str) else {
            return Err(invalid("needs a `field` in each of its `terms`"));
        };
        let mut terms_body = json!({"field": field, "size": level_size});
        if let Some(missing) = term.get("missing") {
            terms_body["missing"] = missing.clone();
        }
        let mut level = Map::new();
        level.insert("terms".to_string(), terms_body);
        match nested.take() {
            Some(inner) => {
                level.insert(
                    "aggs".to_string(),
                    json!({ format!("{MULTI_TERMS_LEVEL}{options}"): inner }),
                );
            }
            None => {
                if let Some(sub) = &sub_aggs {
                    level.insert("aggs".to_string(), sub.clone());
                }
            }
        }
        nested = Some(Value::Object(level));
    }
    if let Some(Value::Object(outer)) = nested {
        agg.extend(outer);
    }
    Ok(())
}

/// Flattens, in a final aggregation result, the nested `terms` a `multi_terms` became.
fn flatten_multi_terms(value: &mut Value) {
    let Value::Object(map) = value else {
        return;
    };
    for (_, result) in map.iter_mut() {
        let Some(Value::Array(buckets)) = result.get_mut("buckets") else {
            continue;
        };
        let options = buckets.iter().find_map(|bucket| {
            bucket.as_object()?.keys().find_map(|key| {
                key.strip_prefix(MULTI_TERMS_LEVEL)
                    .and_then(|o| serde_json::from_str::<Value>(o).ok())
                    .map(|o| (key.clone(), o))
            })
        });
        for bucket in buckets.iter_mut() {
            flatten_multi_terms(bucket);
        }
        let Some((_, options)) = options else {
            continue;
        };
        let mut combos = Vec::new();
        let mut other = result
            .get("sum_other_doc_count")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        if let Some(Value::Array(buckets)) = result.get("buckets") {
            collect_combos(buckets, &mut Vec::new(), &mut combos, &mut other);
        }
        let size = options["size"].as_u64().unwrap_or(10) as usize;
        let min_doc_count = options["min_doc_count"].as_u64().unwrap_or(1);
        let by_key = options["order"] == "_key";
        let ascending = options["asc"].as_bool().unwrap_or(false);
        combos.retain(|(_, count, _)| *count >= min_doc_count);
        combos.sort_by(|(ka, ca, _), (kb, cb, _)| {
            let keys = compare_keys(ka, kb);
            let ordering = if by_key {
                keys
            } else {
                ca.cmp(cb).then(keys.reverse())
            };
            if ascending {
                ordering
            } else {
                ordering.reverse()
            }
        });
        for (_, count, _) in combos.iter().skip(size) {
            other += count;
        }
        combos.truncate(size);
        let buckets: Vec<Value> = combos
            .into_iter()
            .map(|(key, count, sub)| {
                let mut bucket = sub;
                let joined = key
                    .iter()
                    .map(|k| match k {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join("|");
                bucket.insert("key".to_string(), Value::Array(key));
                bucket.insert("key_as_string".to_string(), Value::String(joined));
                bucket.insert("doc_count".to_string(), json!(count));
                Value::Object(bucket)
            })
            .collect();
        *result = json!({
            "buckets": buckets,
            "doc_count_error_upper_bound": 0,
            "sum_other_doc_count": other,
        });
    }
}

/// One flattened `multi_terms` bucket: its key values, its count, its sub-aggregations.
type Combo = (Vec<Value>, u64, Map<String, Value>);

/// Walks nested `terms` buckets down to the innermost level, collecting one combination per
/// innermost bucket; the documents cut off at every level count as `other`.
fn collect_combos(
    buckets: &[Value],
    prefix: &mut Vec<Value>,
    out: &mut Vec<Combo>,
    other: &mut u64,
) {
    for bucket in buckets {
        let Some(map) = bucket.as_object() else {
            continue;
        };
        let key = map.get("key").cloned().unwrap_or(Value::Null);
        let inner = map
            .iter()
            .find(|(name, _)| name.starts_with(MULTI_TERMS_LEVEL))
            .map(|(_, v)| v);
        prefix.push(key);
        match inner {
            Some(inner) => {
                *other += inner
                    .get("sum_other_doc_count")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                if let Some(Value::Array(children)) = inner.get("buckets") {
                    collect_combos(children, prefix, out, other);
                }
            }
            None => {
                let count = map.get("doc_count").and_then(Value::as_u64).unwrap_or(0);
                let sub: Map<String, Value> = map
                    .iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "key" | "key_as_string" | "doc_count"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                out.push((prefix.clone(), count, sub));
            }
        }
        prefix.pop();
    }
}

/// Key lists in order: numbers by value, strings by bytes, numbers before strings.
fn compare_keys(a: &[Value], b: &[Value]) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    for (x, y) in a.iter().zip(b) {
        let ordering = match (x, y) {
            (Value::Number(x), Value::Number(y)) => x
                .as_f64()
                .partial_cmp(&y.as_f64())
                .unwrap_or(Ordering::Equal),
            (Value::Number(_), _) => Ordering::Less,
            (_, Value::Number(_)) => Ordering::Greater,
            (Value::String(x), Value::String(y)) => x.cmp(y),
            _ => Ordering::Equal,
        };
        if ordering != Ordering::Equal {
            return ordering;
        }
    }
    a.len().cmp(&b.len())
}

/// Intermediate results as sent between nodes.
pub fn encode(results: &IntermediateAggregationResults) -> Result<String, String> {
    let bytes = postcard::to_stdvec(results).map_err(|err| err.to_string())?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// Intermediate results sent by [`encode`].
pub fn decode(text: &str) -> Result<IntermediateAggregationResults, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|err| err.to_string())?;
    postcard::from_bytes(&bytes).map_err(|err| err.to_string())
}

/// Per top-level `terms` aggregation ordered by count, Elasticsearch's
/// `doc_count_error_upper_bound` summed over splits (see [`term_count_errors`]).
pub type TermCountErrors = std::collections::BTreeMap<String, u64>;

/// Adds `other` into `into`.
pub fn add_term_count_errors(into: &mut TermCountErrors, other: &TermCountErrors) {
    for (name, error) in other {
        *into.entry(name.clone()).or_default() += error;
    }
}

/// How to read Elasticsearch's `doc_count_error_upper_bound` off one split's results, for
/// each top-level `terms` aggregation ordered by count: built once per search by
/// [`term_error_plan`], applied per split by [`term_count_errors`].
pub struct TermErrorPlan {
    /// The `terms` aggregations: name, split size and `min_doc_count`.
    split_sizes: Vec<(String, u32, u64)>,
}

/// The plan for `aggs`, or `None` when no top-level `terms` aggregation is ordered by count.
pub fn term_error_plan(aggs: &Aggregations) -> Option<TermErrorPlan> {
    use tantivy::aggregation::agg_req::AggregationVariants;
    let mut split_sizes = Vec::new();
    for (name, agg) in aggs.iter() {
        let AggregationVariants::Terms(terms) = &agg.agg else {
            continue;
        };
        let by_count = terms
            .order
            .as_ref()
            .is_none_or(|order| *order == Default::default());
        let multi_terms = agg
            .sub_aggregation
            .keys()
            .any(|k| k.starts_with(MULTI_TERMS_LEVEL));
        if !by_count || multi_terms || terms.show_term_doc_count_error == Some(false) {
            continue;
        }
        let size = terms.size.unwrap_or(10);
        let split_size = terms
            .segment_size
            .unwrap_or(size.saturating_mul(10))
            .max(size);
        split_sizes.push((name.clone(), split_size, terms.min_doc_count.unwrap_or(1)));
    }
    (!split_sizes.is_empty()).then_some(TermErrorPlan { split_sizes })
}

/// One split's share of Elasticsearch's `doc_count_error_upper_bound` for each aggregation of
/// `plan`: when the split kept at least its `split_size` (`shard_size`, `segment_size`)
/// buckets, the count of the `split_size`-th largest of them (a term it cut may have had up to
/// that many documents), else 0. Tantivy's own bound counts the first bucket cut instead;
/// Elasticsearch and Quickwit use this one. Read in place: the split's results are neither
/// copied nor rendered.
pub fn term_count_errors(
    plan: &TermErrorPlan,
    split: &IntermediateAggregationResults,
) -> TermCountErrors {
    use tantivy::aggregation::intermediate_agg_result::{
        IntermediateAggregationResult, IntermediateBucketResult,
    };
    let mut errors = TermCountErrors::new();
    for (name, split_size, min_doc_count) in &plan.split_sizes {
        let split_size = *split_size as usize;
        let error = match split.get(name) {
            Some(IntermediateAggregationResult::Bucket(IntermediateBucketResult::Terms {
                buckets,
            })) => {
                let mut counts: Vec<u64> = buckets
                    .entries()
                    .iter()
                    .map(|(_, bucket)| bucket.doc_count)
                    .filter(|count| count >= min_doc_count)
                    .collect();
                if split_size == 0 || counts.len() < split_size {
                    0
                } else {
                    // The split_size-th largest count: the smallest of the buckets kept.
                    let (_, nth, _) =
                        counts.select_nth_unstable_by(split_size - 1, |a, b| b.cmp(a));
                    *nth
                }
            }
            _ => 0,
        };
        errors.insert(name.clone(), error);
    }
    errors
}

/// The heap `results` hold, estimated from their shape: the hash table of each level's named
/// results (slots of Tantivy's result type, four at least), the vectors of buckets (up to
/// twice their length after growth) and their keys, and for the variants not walked into
/// (ranges, composite, multi-terms, metric sketches) the generic estimate of
/// [`shale_types::heap`]. Checked against a counting allocator in the tests.
pub fn estimated_heap_bytes(results: &IntermediateAggregationResults) -> u64 {
    estimate(results).0
}

/// What rendering each bucket or named result takes at most (the final result's entry, then
/// its JSON object), in bytes; measured at about 700.
pub const RENDERED_BUCKET_BYTES: u64 = 1024;

/// The heap `results` hold ([`estimated_heap_bytes`]) and the most their rendering can take
/// ([`RENDERED_BUCKET_BYTES`] per bucket or named result, every bucket counted even those
/// the final `size` cuts).
pub fn estimated_bytes_with_rendering(results: &IntermediateAggregationResults) -> u64 {
    let (heap, nodes) = estimate(results);
    heap.saturating_add(nodes.saturating_mul(RENDERED_BUCKET_BYTES))
}

/// (heap bytes, buckets and named results).
fn estimate(results: &IntermediateAggregationResults) -> (u64, u64) {
    use tantivy::aggregation::intermediate_agg_result::{
        IntermediateAggregationResult, IntermediateBucketResult, IntermediateKey,
    };
    let slot = (std::mem::size_of::<String>()
        + std::mem::size_of::<IntermediateAggregationResult>()) as u64;
    let mut total = 0u64;
    let mut nodes = 0u64;
    // Iterative: the levels are bounded (MAX_AGG_DEPTH) but the walk costs no stack anyway.
    let mut pending: Vec<&IntermediateAggregationResults> = vec![results];
    while let Some(level) = pending.pop() {
        let names: Vec<&String> = level.keys().collect();
        if !names.is_empty() {
            // hashbrown: a power of two of slots, at least 4, at most 7/8 full; one control
            // byte per slot and 16 more.
            let slots = ((names.len() as u64 * 8).div_ceil(7))
                .next_power_of_two()
                .max(4);
            total += slots * (slot + 1) + 16;
        }
        nodes += names.len() as u64;
        for name in names {
            total += name.len() as u64;
            let Some(result) = level.get(name) else {
                continue;
            };
            match result {
                IntermediateAggregationResult::Bucket(IntermediateBucketResult::Terms {
                    buckets,
                }) => {
                    let entries = buckets.entries();
                    let entry = std::mem::size_of_val(
                        entries
                            .first()
                            .unwrap_or(&(IntermediateKey::Bool(false), Default::default())),
                    ) as u64;
                    // The vector (up to twice its length) and the key index of merges.
                    total += entries.len() as u64 * (2 * entry + 64);
                    nodes += entries.len() as u64;
                    for (key, bucket) in entries {
                        if let IntermediateKey::Str(text) = key {
                            total += text.len() as u64;
                        }
                        pending.push(&bucket.sub_aggregation);
                    }
                }
                IntermediateAggregationResult::Bucket(IntermediateBucketResult::Histogram {
                    buckets,
                    ..
                }) => {
                    total += 2 * std::mem::size_of_val(buckets.as_slice()) as u64;
                    nodes += buckets.len() as u64;
                    pending.extend(buckets.iter().map(|bucket| &bucket.sub_aggregation));
                }
                IntermediateAggregationResult::Bucket(IntermediateBucketResult::Filter {
                    sub_aggregations,
                    ..
                }) => pending.push(sub_aggregations),
                other => total += shale_types::heap::estimated_heap_bytes(other),
            }
        }
    }
    (total, nodes)
}

/// Holds what `results` take more in `held` (nothing without a budget) — their heap, and
/// with `rendering` what rendering them takes — or refuses with a message naming the budget.
pub fn reserve_results(
    held: &mut Option<shale_types::memory::Reservation>,
    results: &IntermediateAggregationResults,
    rendering: bool,
) -> Result<(), String> {
    let Some(held) = held.as_mut() else {
        return Ok(());
    };
    let bytes = if rendering {
        estimated_bytes_with_rendering(results)
    } else {
        estimated_heap_bytes(results)
    };
    held.try_grow(bytes).map_err(|err| {
        format!(
            "aggregation refused: its results need about {} MiB more and {err}; narrow the \
             query or the time range, lower the `size` of terms aggregations or nest fewer \
             levels",
            bytes.div_ceil(1 << 20)
        )
    })
}

/// The final, Elasticsearch-shaped result of merged intermediate results; `term_errors` (from
/// [`term_count_errors`], summed) replaces Tantivy's `doc_count_error_upper_bound`.
pub fn finalize(
    aggs: Aggregations,
    merged: IntermediateAggregationResults,
    term_errors: &TermCountErrors,
) -> Result<Value, String> {
    let results = merged
        .into_final_result(aggs, limits())
        .map_err(|err| format!("aggregation failed: {err}"))?;
    let mut value = serde_json::to_value(results).map_err(|err| err.to_string())?;
    flatten_multi_terms(&mut value);
    for (name, error) in term_errors {
        if let Some(agg) = value.get_mut(name).and_then(Value::as_object_mut) {
            if agg.contains_key("doc_count_error_upper_bound") {
                agg.insert("doc_count_error_upper_bound".to_string(), json!(error));
            }
        }
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_zones() {
        assert_eq!(parse_signed_duration_ms("1h"), Some(3_600_000));
        assert_eq!(parse_signed_duration_ms("-30m"), Some(-1_800_000));
        assert_eq!(parse_signed_duration_ms("1M"), None);
        assert_eq!(parse_time_zone_ms("UTC"), Some(0));
        assert_eq!(parse_time_zone_ms("+02:00"), Some(7_200_000));
        assert_eq!(parse_time_zone_ms("-0530"), Some(-19_800_000));
        assert_eq!(parse_time_zone_ms("Europe/Paris"), None);
        // 2024-01-15 (winter, +01:00) and 2024-07-15 (summer, +02:00).
        assert_eq!(
            named_zone_offset_ms("Europe/Paris", Some(1_705_276_800_000)),
            Some(3_600_000)
        );
        assert_eq!(
            named_zone_offset_ms("Europe/Paris", Some(1_721_001_600_000)),
            Some(7_200_000)
        );
        assert_eq!(named_zone_offset_ms("Mars/Olympus", None), None);
        assert!(is_fixed_interval("30s"));
        assert!(!is_fixed_interval("1M"));
        assert!(!is_fixed_interval("day"));
    }
}
