//! Tests of the doc mapper, queries, and split building, opening and merging.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{json, Value};
use shale_config::{IndexConfig, Mode};
use shale_types::sort_key::SortKey;
use shale_types::TimeRange;
use tantivy::collector::{Count, TopDocs};
use tantivy::query::Query;
use tantivy::schema::{DateTimePrecision, FieldType, IndexRecordOption};
use tantivy::{Index, TantivyDocument};

use crate::*;

const CONFIG: &str = r#"
index_id: test-logs
doc_mapping:
  mode: dynamic
  field_mappings:
    - name: timestamp
      type: datetime
      input_formats: [rfc3339, unix_timestamp]
      fast: true
      fast_precision: milliseconds
    - name: tenant_id
      type: u64
      fast: true
    - name: severity
      type: text
      tokenizer: raw
      fast: true
    - name: body
      type: text
    - name: latency
      type: f64
      fast: true
    - name: status
      type: i64
    - name: ok
      type: bool
    - name: resource
      type: json
    - name: hidden
      type: text
      stored: false
    - name: codes
      type: array<i64>
  tag_fields: [tenant_id, severity]
  timestamp_field: timestamp
  partition_key: hash_mod(tenant_id, 4)
search_settings:
  default_search_fields: [body]
"#;

fn config_with(mode: Mode, store_source: bool) -> IndexConfig {
    let mut config = IndexConfig::parse(CONFIG.as_bytes()).unwrap();
    config.doc_mapping.mode = mode;
    config.doc_mapping.store_source = store_source;
    config
}

fn mapper_with(mode: Mode, store_source: bool) -> DocMapper {
    let config = config_with(mode, store_source);
    DocMapper::new(&config.doc_mapping, &config.search_settings).unwrap()
}

fn mapper() -> DocMapper {
    mapper_with(Mode::Dynamic, false)
}

fn parse(mapper: &DocMapper, doc: Value) -> Result<ParsedDoc, DocParsingError> {
    mapper.parse_doc(doc.to_string().as_bytes())
}

const T0: i64 = 1_700_000_000;

/// Deterministic test document `i`.
fn test_doc(i: i64) -> Value {
    let timestamp = if i % 2 == 0 {
        json!(tantivy::DateTime::from_timestamp_secs(T0 + i)
            .into_utc()
            .format(&tantivy::time::format_description::well_known::Rfc3339)
            .unwrap())
    } else {
        json!(T0 + i)
    };
    let body = if i % 10 == 0 {
        "the quick brown fox".to_string()
    } else {
        format!("lazy dog number {i}")
    };
    let severity = ["INFO", "WARN", "ERROR"][(i % 3) as usize];
    json!({
        "timestamp": timestamp,
        "tenant_id": i % 5,
        "severity": severity,
        "body": body,
        "latency": i as f64 / 10.0,
        "status": 200 + (i % 4) * 100,
        "ok": i % 2 == 0,
        "resource": {"region": if i % 4 == 0 { "eu" } else { "us" }, "host": format!("h{}", i % 7)},
        "service": if i % 2 == 0 { "api" } else { "web" },
    })
}

fn count(index: &Index, query: &dyn Query) -> usize {
    let reader = index.reader().unwrap();
    reader.searcher().search(query, &Count).unwrap()
}

fn count_query(mapper: &DocMapper, index: &Index, query: &str) -> usize {
    let query = mapper
        .parse_query(query, None)
        .unwrap_or_else(|err| panic!("{query}: {err}"));
    count(index, &*query)
}

fn build_split(
    mapper: &Arc<DocMapper>,
    dir: &std::path::Path,
    docs: impl Iterator<Item = Value>,
) -> BuiltSplit {
    let mut builder = SplitBuilder::new(mapper.clone(), dir, 50_000_000).unwrap();
    for doc in docs {
        builder.add(parse(mapper, doc).unwrap()).unwrap();
    }
    builder.finish().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Schema

#[test]
fn schema_per_type() {
    let mapper = mapper_with(Mode::Dynamic, true);
    let schema = mapper.schema();
    let entry = |name: &str| {
        schema
            .get_field_entry(schema.get_field(name).unwrap())
            .clone()
    };

    match entry("severity").field_type() {
        FieldType::Str(options) => {
            let indexing = options.get_indexing_options().unwrap();
            assert_eq!(indexing.tokenizer(), "raw");
            assert_eq!(
                indexing.index_option(),
                IndexRecordOption::WithFreqsAndPositions
            );
            assert!(options.is_stored());
            assert_eq!(options.get_fast_field_tokenizer_name(), Some("raw"));
        }
        other => panic!("{other:?}"),
    }
    match entry("body").field_type() {
        FieldType::Str(options) => {
            assert_eq!(
                options.get_indexing_options().unwrap().tokenizer(),
                "default"
            );
            assert!(!options.is_fast());
        }
        other => panic!("{other:?}"),
    }
    assert!(!entry("hidden").is_stored());
    assert!(
        matches!(entry("tenant_id").field_type(), FieldType::U64(o) if o.is_fast() && o.is_indexed() && o.is_stored())
    );
    assert!(matches!(entry("status").field_type(), FieldType::I64(o) if !o.is_fast()));
    assert!(matches!(entry("latency").field_type(), FieldType::F64(o) if o.is_fast()));
    assert!(matches!(entry("ok").field_type(), FieldType::Bool(_)));
    assert!(matches!(entry("codes").field_type(), FieldType::I64(_)));
    match entry("timestamp").field_type() {
        FieldType::Date(options) => {
            assert!(options.is_fast() && options.is_indexed() && options.is_stored());
            assert_eq!(options.get_precision(), DateTimePrecision::Milliseconds);
        }
        other => panic!("{other:?}"),
    }
    match entry("resource").field_type() {
        FieldType::JsonObject(options) => {
            assert!(options.is_stored() && options.is_indexed());
            assert!(options.is_expand_dots_enabled());
        }
        other => panic!("{other:?}"),
    }
    match entry(DYNAMIC_FIELD_NAME).field_type() {
        FieldType::JsonObject(options) => {
            assert!(options.is_stored() && options.is_indexed() && options.is_fast());
        }
        other => panic!("{other:?}"),
    }
    assert!(entry(SOURCE_FIELD_NAME).is_stored());
    assert!(!entry(SOURCE_FIELD_NAME).is_indexed());

    assert_eq!(mapper.timestamp_field_name(), Some("timestamp"));
    assert_eq!(mapper.default_search_fields(), ["body"]);
    assert_eq!(mapper.tag_fields(), ["tenant_id", "severity"]);

    // No `_dynamic` / `_source` unless asked for.
    let strict = mapper_with(Mode::Strict, false);
    assert!(strict.schema().get_field(DYNAMIC_FIELD_NAME).is_err());
    assert!(strict.schema().get_field(SOURCE_FIELD_NAME).is_err());
}

#[test]
fn without_default_search_fields_a_bare_term_needs_a_field() {
    let mut config = config_with(Mode::Dynamic, false);
    config.search_settings.default_search_fields.clear();
    let mapper = DocMapper::new(&config.doc_mapping, &config.search_settings).unwrap();
    assert!(mapper.default_search_fields().is_empty());
    let err = mapper.parse_query("fox", None).err().unwrap().to_string();
    assert!(err.contains("requires a default search field"), "{err}");
    // A named field, a search field, `*`: fine.
    assert!(mapper.parse_query("body:fox", None).is_ok());
    assert!(mapper
        .parse_query("fox", Some(&["body".to_string()]))
        .is_ok());
    assert!(mapper.parse_query("*", None).is_ok());
}

#[test]
fn invalid_mapping_is_rejected() {
    let mut config = config_with(Mode::Dynamic, false);
    config.doc_mapping.timestamp_field = Some("nope".into());
    let err = DocMapper::new(&config.doc_mapping, &config.search_settings).unwrap_err();
    assert!(
        err.to_string().contains("doc_mapping.timestamp_field"),
        "{err}"
    );
    let mut config = config_with(Mode::Dynamic, false);
    config.search_settings.default_search_fields = vec!["body.nope".into()];
    let err = DocMapper::new(&config.doc_mapping, &config.search_settings).unwrap_err();
    assert!(
        err.to_string().contains("default_search_fields[0]"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Parsing

#[test]
fn parse_doc_success() {
    let mapper = mapper();
    let json = test_doc(2).to_string();
    let parsed = mapper.parse_doc(json.as_bytes()).unwrap();
    assert_eq!(parsed.num_bytes, json.len());
    assert_eq!(parsed.timestamp_micros, Some((T0 + 2) * 1_000_000));
    assert!(parsed.partition_id < 4);
    let mut tags = parsed.tags.clone();
    tags.sort();
    assert_eq!(tags, ["severity:ERROR", "tenant_id:2"]);

    // Same tenant, same partition; partitions spread over 4 values.
    let other = parse(&mapper, test_doc(7)).unwrap();
    assert_eq!(other.partition_id, parsed.partition_id);
    let partitions: BTreeSet<u64> = (0..50)
        .map(|i| parse(&mapper, test_doc(i)).unwrap().partition_id)
        .collect();
    assert!(partitions.len() > 1 && partitions.iter().all(|p| *p < 4));

    // No partition key: 0.
    let mut config = config_with(Mode::Dynamic, false);
    config.doc_mapping.partition_key = None;
    let plain = DocMapper::new(&config.doc_mapping, &config.search_settings).unwrap();
    assert_eq!(parse(&plain, test_doc(3)).unwrap().partition_id, 0);
}

#[test]
fn numeric_strings_are_coerced() {
    let mapper = mapper();
    let parsed = parse(
        &mapper,
        json!({"timestamp": "2024-01-02T03:04:05Z", "tenant_id": "42", "status": " -7 ",
               "latency": "1.5", "ok": "true", "codes": [1, "2", 3.0]}),
    )
    .unwrap();
    let rendered = mapper.doc_to_json(&parsed.doc);
    assert_eq!(rendered["tenant_id"], json!(42));
    assert_eq!(rendered["status"], json!(-7));
    assert_eq!(rendered["latency"], json!(1.5));
    assert_eq!(rendered["ok"], json!(true));
    assert_eq!(rendered["codes"], json!([1, 2, 3]));
    assert!(parsed.tags.contains(&"tenant_id:42".to_string()));
}

#[track_caller]
fn assert_error(result: Result<ParsedDoc, DocParsingError>, expected: &str) -> DocParsingError {
    let err = result.expect_err("document should be rejected");
    assert!(
        err.to_string().contains(expected),
        "expected `{expected}` in `{err}`"
    );
    err
}

#[test]
fn parse_doc_errors() {
    let mapper = mapper();
    let ts = "2024-01-02T03:04:05Z";

    let big = format!("{{\"body\": \"{}\"}}", "x".repeat(MAX_DOC_BYTES));
    let err = assert_error(
        mapper.parse_doc(big.as_bytes()),
        "over the 10485760 bytes limit",
    );
    assert!(matches!(err, DocParsingError::TooLarge { .. }));

    assert_eq!(
        mapper.parse_doc(b"[1, 2]").unwrap_err(),
        DocParsingError::NotAnObject
    );
    assert_eq!(
        mapper.parse_doc(b"42").unwrap_err(),
        DocParsingError::NotAnObject
    );
    assert_error(mapper.parse_doc(b"{\"body\": "), "malformed JSON: EOF");
    assert_error(mapper.parse_doc(b"not json"), "malformed JSON");
    assert_error(mapper.parse_doc(b"  "), "malformed JSON: empty document");
    assert_error(mapper.parse_doc(b"{\"a\": 1} trailing"), "malformed JSON");

    // Wrong type: an error in every mode.
    for mode in [Mode::Lenient, Mode::Strict, Mode::Dynamic] {
        let mapper = mapper_with(mode, false);
        let err = assert_error(
            parse(&mapper, json!({"timestamp": ts, "status": "abc"})),
            "field `status`: expected an i64, got the string \"abc\"",
        );
        assert_eq!(err.field(), Some("status"));
    }
    assert_error(
        parse(&mapper, json!({"timestamp": ts, "tenant_id": -1})),
        "field `tenant_id`: expected a u64, got the number `-1`",
    );
    assert_error(
        parse(&mapper, json!({"timestamp": ts, "status": 1.5})),
        "field `status`: expected an i64, got the number `1.5`",
    );
    assert_error(
        parse(&mapper, json!({"timestamp": ts, "body": 42})),
        "field `body`: expected a string, got the number `42`",
    );
    assert_error(
        parse(&mapper, json!({"timestamp": ts, "body": {"a": 1}})),
        "field `body`: expected a string, got an object",
    );
    assert_error(
        parse(&mapper, json!({"timestamp": ts, "ok": "yes"})),
        "field `ok`: expected a boolean",
    );
    assert_error(
        parse(&mapper, json!({"timestamp": ts, "resource": "eu"})),
        "field `resource`: expected a JSON object",
    );
    assert_error(
        parse(&mapper, json!({"timestamp": ts, "codes": [[1]]})),
        "field `codes`: nested arrays are not supported",
    );
    assert_error(
        parse(&mapper, json!({"timestamp": ts, "latency": "fast"})),
        "field `latency`: expected an f64",
    );

    // Strict mode rejects undeclared fields.
    let strict = mapper_with(Mode::Strict, false);
    let err = assert_error(
        parse(&strict, json!({"timestamp": ts, "service": "api"})),
        "field `service` is not declared in the doc mapping (mode: strict)",
    );
    assert_eq!(err.field(), Some("service"));

    // Timestamp.
    let err = assert_error(
        parse(&mapper, json!({"body": "no time"})),
        "timestamp field `timestamp` is missing",
    );
    assert!(matches!(err, DocParsingError::MissingTimestamp { .. }));
    assert_error(
        parse(&mapper, json!({"timestamp": null})),
        "timestamp field `timestamp` is missing",
    );
    let err = assert_error(
        parse(&mapper, json!({"timestamp": "yesterday"})),
        "timestamp field `timestamp`: cannot parse `yesterday` as a datetime with input formats [rfc3339, unix_timestamp]",
    );
    assert!(matches!(err, DocParsingError::InvalidTimestamp { .. }));
    assert_error(
        parse(&mapper, json!({"timestamp": true})),
        "timestamp field `timestamp`: expected a datetime string or number",
    );
}

#[test]
fn modes_handle_undeclared_fields() {
    let doc = json!({"timestamp": 1_700_000_000, "body": "hello", "service": "api",
                     "nested": {"k": [1, 2]}});
    let lenient = mapper_with(Mode::Lenient, false);
    let parsed = parse(&lenient, doc.clone()).unwrap();
    let rendered = lenient.doc_to_json(&parsed.doc);
    assert_eq!(
        rendered,
        json!({"timestamp": "2023-11-14T22:13:20Z", "body": "hello"})
    );

    let dynamic = mapper_with(Mode::Dynamic, false);
    let parsed = parse(&dynamic, doc.clone()).unwrap();
    let rendered = dynamic.doc_to_json(&parsed.doc);
    assert_eq!(
        rendered,
        json!({"timestamp": "2023-11-14T22:13:20Z", "body": "hello", "service": "api",
               "nested": {"k": [1, 2]}})
    );
}

#[test]
fn doc_to_json_round_trip() {
    let mapper = mapper_with(Mode::Dynamic, true);
    let doc = json!({
        "timestamp": "2024-01-02T03:04:05.123Z",
        "tenant_id": 3,
        "severity": "WARN",
        "body": "a message",
        "latency": 12.5,
        "status": 404,
        "ok": false,
        "resource": {"region": "eu", "tags": ["a", "b"], "n": 1},
        "hidden": "not stored",
        "codes": [7],
        "extra": {"user": "bob", "id": 12},
        "labels": ["x", "y"],
    });
    let parsed = parse(&mapper, doc.clone()).unwrap();
    let rendered = mapper.doc_to_json(&parsed.doc);
    let mut expected = doc.clone();
    let object = expected.as_object_mut().unwrap();
    object.remove("hidden");
    // `codes` is an `array<i64>`: one value stays an array.
    object.insert("_source".into(), doc.clone());
    assert_eq!(rendered, expected);

    // Round trip through a split's doc store too.
    let dir = tempfile::tempdir().unwrap();
    let mapper = Arc::new(mapper);
    let split = build_split(&mapper, &dir.path().join("s"), std::iter::once(doc));
    let index = open_split(&split.path).unwrap();
    let searcher = index.reader().unwrap().searcher();
    let (_, address) = searcher
        .search(
            &tantivy::query::AllQuery,
            &TopDocs::with_limit(1).order_by_score(),
        )
        .unwrap()[0];
    let stored: TantivyDocument = searcher.doc(address).unwrap();
    assert_eq!(mapper.doc_to_json(&stored), expected);
}

// ---------------------------------------------------------------------------------------------
// Queries

#[test]
fn required_tag_terms_are_conservative() {
    let mapper = mapper();
    let terms = |q: &str| mapper.required_tag_terms(q);
    let pairs = |v: &[(&str, &str)]| {
        Some(
            v.iter()
                .map(|(f, v)| (f.to_string(), v.to_string()))
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(terms("tenant_id:42"), pairs(&[("tenant_id", "42")]));
    assert_eq!(terms("tenant_id:042"), pairs(&[("tenant_id", "42")]));
    assert_eq!(
        terms("tenant_id:1 AND severity:ERROR AND body:boom"),
        pairs(&[("severity", "ERROR"), ("tenant_id", "1")])
    );
    // Implicit AND (Quickwit's default operator), `+`, grouping and boosts.
    assert_eq!(
        terms("severity:ERROR timeout"),
        pairs(&[("severity", "ERROR")])
    );
    assert_eq!(terms("+severity:ERROR"), pairs(&[("severity", "ERROR")]));
    assert_eq!(
        terms("(tenant_id:1 AND body:x) AND severity:\"ERROR\"^2"),
        pairs(&[("severity", "ERROR"), ("tenant_id", "1")])
    );
    assert_eq!(
        terms("tenant_id:1 AND (severity:WARN OR severity:ERROR)"),
        pairs(&[("tenant_id", "1")])
    );
    // Nothing known.
    for query in [
        "*",
        "",
        "boom",
        "tenant_id:1 OR tenant_id:2",
        "NOT tenant_id:1",
        "-tenant_id:1 body:x",
        "severity:ERR*",
        "tenant_id:[1 TO 3]",
        "tenant_id: IN [1 2]",
        "body:hello",
        "status:200",
        "tenant_id:abc",
        "tenant_id:(1",
    ] {
        assert_eq!(terms(query), None, "{query}");
    }
}

#[test]
fn split_tag_matching() {
    let tags: BTreeSet<String> = ["tenant_id:1", "tenant_id:2", "severity!"]
        .into_iter()
        .map(String::from)
        .collect();
    let req = |f: &str, v: &str| (f.to_string(), v.to_string());
    assert!(split_may_match_tags(&tags, &[]));
    assert!(split_may_match_tags(&tags, &[req("tenant_id", "1")]));
    assert!(!split_may_match_tags(&tags, &[req("tenant_id", "3")]));
    assert!(split_may_match_tags(&tags, &[req("severity", "anything")]));
    assert!(!split_may_match_tags(
        &tags,
        &[req("severity", "x"), req("tenant_id", "9")]
    ));
    assert!(!split_may_match_tags(&tags, &[req("host", "a")]));
}

#[test]
fn query_errors() {
    let mapper = mapper_with(Mode::Strict, false);
    let err = mapper
        .parse_query("nope:1", None)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("nope"), "{err}");
    let err = mapper
        .parse_query("status:abc", None)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("status:abc"), "{err}");
    let err = mapper
        .parse_query("body:(a", None)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("syntax error"), "{err}");
    let err = mapper
        .parse_query("a", Some(&["nope".to_string()]))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("unknown search field `nope`"), "{err}");
    // Without a timestamp field there is no time filter.
    let mut config = config_with(Mode::Strict, false);
    config.doc_mapping.timestamp_field = None;
    let no_ts = DocMapper::new(&config.doc_mapping, &config.search_settings).unwrap();
    assert!(no_ts.time_range_query(Some(0), Some(1)).is_none());
    assert!(mapper.time_range_query(None, None).is_none());
}

/// Found by fuzzing: a search field (`search_field=`, Elasticsearch's `default_field`) with a
/// NUL inside a json path made Tantivy's query parser panic; it is refused like a field name.
#[test]
fn search_fields_with_control_characters_are_refused() {
    let mapper = mapper();
    for field in [
        ".\0\0\0ibutes",
        "resource.\0region",
        "undeclared\0",
        "body\u{1}",
    ] {
        let err = mapper
            .parse_query("eu", Some(&[field.to_string()]))
            .err()
            .unwrap_or_else(|| panic!("{field:?} accepted"))
            .to_string();
        assert!(err.contains("control character"), "{field:?}: {err}");
    }
    assert!(mapper
        .parse_query("eu", Some(&["resource.region".to_string()]))
        .is_ok());
}

// ---------------------------------------------------------------------------------------------
// Splits

/// A [`RangeRead`] over a local bundle file that logs what it reads.
#[derive(Debug)]
struct LoggedRanges {
    bytes: Vec<u8>,
    reads: std::sync::Mutex<Vec<std::ops::Range<u64>>>,
}

impl RangeRead for LoggedRanges {
    fn read(&self, range: std::ops::Range<u64>) -> std::io::Result<tantivy::directory::OwnedBytes> {
        self.reads.lock().unwrap().push(range.clone());
        Ok(tantivy::directory::OwnedBytes::new(
            self.bytes[range.start as usize..range.end as usize].to_vec(),
        ))
    }
}

impl LoggedRanges {
    fn bytes_read(&self) -> u64 {
        self.reads
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.end - r.start)
            .sum()
    }
}

#[test]
fn a_split_opens_from_its_hot_cache_and_reads_the_rest_by_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let mapper = Arc::new(mapper());
    let split = build_split(
        &mapper,
        &dir.path().join("01REMOTE"),
        (0..20_000).map(test_doc),
    );
    let bytes = std::fs::read(&split.path).unwrap();
    let len = bytes.len() as u64;
    let (tail_start, tail_end) = split.footer_offsets;
    assert_eq!(tail_end, len);
    let tail = bytes[tail_start as usize..].to_vec();
    // The trailer says how much of the tail the footer needs; the recorded tail holds more.
    assert!(BundleDirectory::tail_needed(&tail).unwrap() <= tail.len() as u64);
    let ranges = Arc::new(LoggedRanges {
        bytes: bytes.clone(),
        reads: Default::default(),
    });
    let bundle = BundleDirectory::open_remote(
        "01REMOTE.split",
        tantivy::directory::OwnedBytes::new(tail),
        tail_start,
        len,
        ranges.clone(),
    )
    .unwrap();
    assert!(bundle.hot_bytes() > 0);
    assert!(
        bundle.hot_bytes() < len / 20,
        "hot cache {} of {len}",
        bundle.hot_bytes()
    );
    let remote = open_bundle(bundle).unwrap();
    let searcher = remote
        .reader_builder()
        .reload_policy(tantivy::ReloadPolicy::Manual)
        .try_into()
        .unwrap()
        .searcher();
    assert_eq!(
        ranges.bytes_read(),
        0,
        "opening a split reads only its hot cache: {:?}",
        ranges.reads.lock().unwrap()
    );

    // A term query with the top 10 by timestamp and the documents: the same answer as the
    // mapped split, reading a small part of it.
    let local = open_split(&split.path).unwrap();
    let local_searcher = local.reader().unwrap().searcher();
    let query = mapper.parse_query("severity:ERROR", None).unwrap();
    let top = || {
        (
            Count,
            TopDocs::with_limit(10)
                .order_by_fast_field::<tantivy::DateTime>("timestamp", tantivy::Order::Desc),
        )
    };
    let (remote_count, remote_top) = searcher.search(&*query, &top()).unwrap();
    let (local_count, local_top) = local_searcher.search(&*query, &top()).unwrap();
    assert_eq!(remote_count, 6666);
    assert_eq!(remote_count, local_count);
    assert_eq!(remote_top, local_top);
    for (_, address) in &remote_top {
        let remote_doc: TantivyDocument = searcher.doc(*address).unwrap();
        let local_doc: TantivyDocument = local_searcher.doc(*address).unwrap();
        assert_eq!(
            mapper.doc_to_json(&remote_doc),
            mapper.doc_to_json(&local_doc)
        );
    }
    let read = ranges.bytes_read();
    assert!(read > 0);
    assert!(read < len / 2, "read {read} of {len} bytes");
    eprintln!(
        "hot cache and footer {} bytes, query read {read} of {len}",
        len - tail_start
    );
}

#[test]
fn build_open_and_search_a_split() {
    let dir = tempfile::tempdir().unwrap();
    let mapper = Arc::new(mapper());
    let scratch = dir.path().join("01SPLIT");
    let split = build_split(&mapper, &scratch, (0..1000).map(test_doc));

    assert_eq!(split.path, dir.path().join("01SPLIT.split"));
    assert!(!scratch.exists(), "scratch dir is removed");
    assert_eq!(split.num_docs, 1000);
    assert_eq!(
        split.time_range,
        Some(TimeRange {
            start: T0,
            end: T0 + 999
        })
    );
    let expected_tags: BTreeSet<String> = (0..5)
        .map(|t| format!("tenant_id:{t}"))
        .chain(["severity:INFO", "severity:WARN", "severity:ERROR"].map(String::from))
        .collect();
    assert_eq!(split.tags, expected_tags);
    let expected_bytes: u64 = (0..1000)
        .map(|i| test_doc(i).to_string().len() as u64)
        .sum();
    assert_eq!(split.uncompressed_docs_size_bytes, expected_bytes);
    let file_len = std::fs::metadata(&split.path).unwrap().len();
    assert_eq!(split.size_bytes, file_len);
    assert_eq!(split.footer_offsets.1, file_len);

    // The footer is self-describing.
    let bytes = std::fs::read(&split.path).unwrap();
    assert_eq!(&bytes[bytes.len() - 8..], b"SHALESPL");
    let footer = BundleFooter::parse_from_tail(&bytes[split.footer_offsets.0 as usize..]).unwrap();
    assert!(footer.files.iter().any(|f| f.name == "meta.json"));
    let stats = footer.metadata.clone().unwrap();
    assert_eq!(stats.num_docs, 1000);
    assert_eq!(stats.tags, split.tags);
    assert_eq!(
        BundleDirectory::open(&split.path).unwrap().footer(),
        &footer
    );

    let index = open_split(&split.path).unwrap();
    assert_eq!(index.searchable_segment_ids().unwrap().len(), 1);
    assert_eq!(split_stats(&index).unwrap(), Some(stats));
    let q = |query: &str| count_query(&mapper, &index, query);
    assert_eq!(q("*"), 1000);
    assert_eq!(q(""), 1000);
    assert_eq!(q("severity:ERROR"), 333);
    assert_eq!(q("severity:error"), 0, "raw tokenizer is case-sensitive");
    assert_eq!(q("tenant_id:3"), 200);
    assert_eq!(q("tenant_id:3 AND severity:ERROR"), 67);
    assert_eq!(q("tenant_id:3 severity:ERROR"), 67, "AND by default");
    assert_eq!(q("tenant_id:3 OR severity:ERROR"), 200 + 333 - 67);
    assert_eq!(q("body:\"quick brown\""), 100);
    assert_eq!(q("\"quick brown\""), 100, "default search field");
    assert_eq!(q("quick fox"), 100);
    assert_eq!(q("body:\"brown quick\""), 0);
    assert_eq!(q("status:[200 TO 299]"), 250);
    assert_eq!(q("status:[200 TO 400}"), 500);
    assert_eq!(q("latency:[10 TO 20]"), 101);
    assert_eq!(q("ok:true"), 500);
    assert_eq!(q("resource.region:eu"), 250);
    assert_eq!(q("resource.host:h3"), 143);
    assert_eq!(q("service:api"), 500, "undeclared fields route to _dynamic");
    assert_eq!(q("_dynamic.service:web"), 500);
    assert_eq!(q("NOT severity:INFO"), 666);
    let not_info = 200 - q("tenant_id:3 AND severity:INFO");
    assert_eq!(not_info, 133);
    assert_eq!(q("tenant_id:3 AND NOT severity:INFO"), not_info);
    assert_eq!(q("tenant_id:3 AND (NOT severity:INFO)"), not_info);
    assert_eq!(q("tenant_id:3 -severity:INFO"), not_info);
    assert_eq!(q("tenant_id:3 OR NOT severity:INFO"), 200 + 666 - not_info);
    assert_eq!(
        q("timestamp:[2023-11-14T22:13:20Z TO 2023-11-14T22:15:00Z}"),
        100
    );
    assert_eq!(
        count(
            &index,
            &*mapper
                .time_range_query(Some(T0 + 100), Some(T0 + 200))
                .unwrap()
        ),
        100
    );
    assert_eq!(
        count(
            &index,
            &*mapper.time_range_query(Some(T0 + 990), None).unwrap()
        ),
        10
    );
    assert_eq!(
        count(
            &index,
            &*mapper.time_range_query(None, Some(T0 + 10)).unwrap()
        ),
        10
    );
    assert_eq!(
        count(
            &index,
            &*mapper
                .time_range_query(Some(i64::MIN), Some(i64::MAX))
                .unwrap()
        ),
        1000
    );
    let search_fields = ["severity".to_string()];
    let query = mapper.parse_query("WARN", Some(&search_fields)).unwrap();
    assert_eq!(count(&index, &*query), 333);

    // Unpacked, the same index.
    let unpacked = dir.path().join("unpacked");
    unpack_split(&split.path, &unpacked).unwrap();
    let index = Index::open_in_dir(&unpacked).unwrap();
    assert_eq!(count_query(&mapper, &index, "severity:ERROR"), 333);
    assert_eq!(count_query(&mapper, &index, "body:\"quick brown\""), 100);
}

#[test]
fn tag_fields_with_many_values_become_any_value() {
    let dir = tempfile::tempdir().unwrap();
    let mapper = Arc::new(mapper());
    let docs = (0..1_100).map(|i| json!({"timestamp": T0, "tenant_id": i, "severity": "INFO"}));
    let split = build_split(&mapper, &dir.path().join("s"), docs);
    assert_eq!(
        split.tags,
        BTreeSet::from(["tenant_id!".to_string(), "severity:INFO".to_string()])
    );
    assert!(split_may_match_tags(
        &split.tags,
        &mapper.required_tag_terms("tenant_id:5000").unwrap()
    ));
    assert!(!split_may_match_tags(
        &split.tags,
        &mapper.required_tag_terms("severity:ERROR").unwrap()
    ));
}

#[test]
fn empty_split_and_multithreaded_builder() {
    let dir = tempfile::tempdir().unwrap();
    let mapper = Arc::new(mapper());
    let empty = SplitBuilder::new(mapper.clone(), &dir.path().join("empty"), 0)
        .unwrap()
        .finish()
        .unwrap();
    assert_eq!(empty.num_docs, 0);
    assert_eq!(empty.time_range, None);
    assert!(empty.tags.is_empty());
    assert_eq!(
        count_query(&mapper, &open_split(&empty.path).unwrap(), "*"),
        0
    );

    // A small batch stays on one thread: one segment, in ingest order.
    let mut builder =
        SplitBuilder::with_threads(mapper.clone(), &dir.path().join("small"), 40_000_000, 2)
            .unwrap();
    for i in 0..2_000 {
        builder.add(parse(&mapper, test_doc(i)).unwrap()).unwrap();
    }
    let split = builder.finish().unwrap();
    let index = open_split(&split.path).unwrap();
    assert_eq!(index.searchable_segment_ids().unwrap().len(), 1);
    assert_eq!(count_query(&mapper, &index, "*"), 2_000);

    // Past the threshold, the builder goes on with both threads: the first segment, then
    // one per thread; `finish` keeps them (few enough) and nothing is lost.
    let mut builder =
        SplitBuilder::with_threads(mapper.clone(), &dir.path().join("mt"), 40_000_000, 2)
            .unwrap()
            .parallel_after_bytes(50_000);
    for i in 0..2_000 {
        builder.add(parse(&mapper, test_doc(i)).unwrap()).unwrap();
    }
    assert_eq!(builder.num_docs(), 2_000);
    let split = builder.finish().unwrap();
    let index = open_split(&split.path).unwrap();
    assert_eq!(index.searchable_segment_ids().unwrap().len(), 3);
    assert_eq!(count_query(&mapper, &index, "*"), 2_000);
    assert_eq!(count_query(&mapper, &index, "severity:WARN"), 667);
}

#[test]
fn merging_splits() {
    let dir = tempfile::tempdir().unwrap();
    let mapper = Arc::new(mapper());
    let a = build_split(&mapper, &dir.path().join("a"), (0..600).map(test_doc));
    let b = build_split(
        &mapper,
        &dir.path().join("b"),
        (0..10).map(|i| {
            let mut doc = test_doc(5_000 + i);
            doc["tenant_id"] = json!(77);
            doc
        }),
    );
    let merged = merge_split_files(
        &mapper,
        &[a.path.clone(), b.path.clone()],
        &dir.path().join("m"),
    )
    .unwrap();
    assert_eq!(merged.path, dir.path().join("m.split"));
    assert_eq!(merged.num_docs, 610);
    assert_eq!(
        merged.time_range,
        Some(TimeRange {
            start: T0,
            end: T0 + 5_009
        })
    );
    assert_eq!(
        merged.uncompressed_docs_size_bytes,
        a.uncompressed_docs_size_bytes + b.uncompressed_docs_size_bytes
    );
    assert_eq!(merged.tags, a.tags.union(&b.tags).cloned().collect());
    let index = open_split(&merged.path).unwrap();
    assert_eq!(index.searchable_segment_ids().unwrap().len(), 1);
    assert_eq!(count_query(&mapper, &index, "tenant_id:77"), 10);
    assert_eq!(count_query(&mapper, &index, "severity:ERROR"), 200 + 4);
    assert_eq!(count_query(&mapper, &index, "body:\"quick brown\""), 61);
    assert_eq!(split_stats(&index).unwrap().unwrap().num_docs, 610);

    assert!(merge_splits(&mapper, &[], &dir.path().join("none")).is_err());
    let other = Arc::new(mapper_with(Mode::Strict, false));
    let err = merge_splits(
        &other,
        &[open_split(&a.path).unwrap()],
        &dir.path().join("x"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("different schema"), "{err}");
}

/// Every document of a split, rendered as JSON, in doc id order.
fn stored_docs(mapper: &DocMapper, index: &Index) -> Vec<Value> {
    let searcher = index.reader().unwrap().searcher();
    let mut docs = Vec::new();
    for (ord, segment) in searcher.segment_readers().iter().enumerate() {
        for doc_id in 0..segment.max_doc() {
            let doc: TantivyDocument = searcher
                .doc(tantivy::DocAddress::new(ord as u32, doc_id))
                .unwrap();
            docs.push(mapper.doc_to_json(&doc));
        }
    }
    docs.sort_by_key(|doc| doc.to_string());
    docs
}

/// Bytes of a split's document stores.
fn store_bytes(index: &Index) -> u64 {
    let searcher = index.reader().unwrap().searcher();
    searcher
        .segment_readers()
        .iter()
        .map(|segment| {
            segment
                .get_store_reader(1)
                .unwrap()
                .space_usage()
                .total()
                .get_bytes()
        })
        .sum()
}

#[test]
fn docstore_settings_shape_the_split_and_splits_of_any_settings_merge() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_with(Mode::Dynamic, false);
    config.indexing_settings.docstore_compression_level = None;
    config.indexing_settings.docstore_blocksize = None;
    let default_mapper = Arc::new(DocMapper::for_index(&config).unwrap());
    assert_eq!(
        default_mapper.docstore_settings(),
        DocStoreSettings::default()
    );
    let lz4 = Arc::new(
        DocMapper::for_index(&config)
            .unwrap()
            .with_docstore_settings(DocStoreSettings {
                zstd_level: None,
                blocksize: 16_384,
            }),
    );
    config.indexing_settings.docstore_compression_level = Some(8);
    config.indexing_settings.docstore_blocksize = Some(1_000_000);
    let zstd = Arc::new(DocMapper::for_index(&config).unwrap());
    assert_eq!(
        zstd.docstore_settings(),
        DocStoreSettings {
            zstd_level: Some(8),
            blocksize: 1_000_000
        }
    );

    let a = build_split(&lz4, &dir.path().join("a"), (0..3_000).map(test_doc));
    let b = build_split(&zstd, &dir.path().join("b"), (0..3_000).map(test_doc));
    let (a_index, b_index) = (open_split(&a.path).unwrap(), open_split(&b.path).unwrap());
    assert_eq!(
        a_index.settings().docstore_compression,
        tantivy::store::Compressor::Lz4
    );
    assert_eq!(
        b_index.settings().docstore_compression,
        tantivy::store::Compressor::Zstd(tantivy::store::ZstdCompressor {
            compression_level: Some(8)
        })
    );
    assert_eq!(b_index.settings().docstore_blocksize, 1_000_000);
    // The same documents, stored smaller, and read back the same.
    let (a_store, b_store) = (store_bytes(&a_index), store_bytes(&b_index));
    assert!(
        b_store * 2 < a_store,
        "zstd {b_store} vs lz4 {a_store} bytes"
    );
    let expected = stored_docs(&zstd, &a_index);
    assert_eq!(expected.len(), 3_000);
    assert_eq!(stored_docs(&zstd, &b_index), expected);

    // Splits written with either settings merge into one written with the mapper's.
    for (mapper, name) in [(&zstd, "mz"), (&lz4, "ml")] {
        let merged = merge_split_files(
            mapper,
            &[a.path.clone(), b.path.clone()],
            &dir.path().join(name),
        )
        .unwrap();
        let index = open_split(&merged.path).unwrap();
        assert_eq!(
            index.settings().docstore_compression,
            mapper.index_settings().docstore_compression
        );
        let docs = stored_docs(mapper, &index);
        assert_eq!(docs.len(), 6_000);
        let mut twice: Vec<Value> = expected
            .iter()
            .flat_map(|d| [d.clone(), d.clone()])
            .collect();
        twice.sort_by_key(|doc| doc.to_string());
        assert_eq!(docs, twice);
        assert_eq!(count_query(mapper, &index, "body:\"quick brown\""), 600);
    }
}

#[test]
fn bad_bundles_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.split");
    std::fs::write(&path, b"definitely not a split bundle").unwrap();
    let err = open_split(&path).unwrap_err().to_string();
    assert!(
        err.contains("bad magic") && err.contains("bad.split"),
        "{err}"
    );
    std::fs::write(&path, b"").unwrap();
    assert!(open_split(&path).is_err());
    let mut truncated = b"{\"version\":1,\"files\":[]}".to_vec();
    truncated.extend_from_slice(&1000u64.to_le_bytes());
    truncated.extend_from_slice(b"SHALESPL");
    std::fs::write(&path, &truncated).unwrap();
    let err = open_split(&path).unwrap_err().to_string();
    assert!(err.contains("footer length"), "{err}");
    let err = open_split(&dir.path().join("missing.split"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.split"), "{err}");
}

#[test]
fn types_are_thread_safe() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    fn assert_send<T: Send + 'static>() {}
    assert_send_sync::<DocMapper>();
    assert_send_sync::<IndexError>();
    assert_send_sync::<DocParsingError>();
    assert_send_sync::<BundleDirectory>();
    assert_send::<SplitBuilder>();
    assert_send::<ParsedDoc>();
}

// --- Locality indexes: sorted splits with key ranges and one time bucket ---

/// A locality index's config (index creation refuses the policy for now: set directly).
fn locality_config() -> IndexConfig {
    let mut config = IndexConfig::parse(
        br#"
index_id: sorted
doc_mapping:
  timestamp_field: ts
  field_mappings:
    - {name: ts, type: datetime, fast: true, input_formats: [unix_timestamp]}
    - {name: service, type: text, tokenizer: raw, fast: true}
    - {name: host, type: text, tokenizer: raw, fast: true}
    - {name: message, type: text}
"#,
    )
    .expect("config");
    let settings = json!({"sort_fields": ["service", "host"], "time_bucket": "15m"});
    config.indexing_settings.merge_policy = shale_config::MergePolicyConfig::Locality(
        shale_config::LocalityConfig::parse(settings.as_object().expect("object"))
            .expect("settings"),
    );
    config
}

/// (service, host, ts) of every document of a split, in doc id order per segment.
fn sorted_rows(index: &Index) -> Vec<Vec<(String, String, i64)>> {
    let searcher = index.reader().expect("reader").searcher();
    searcher
        .segment_readers()
        .iter()
        .map(|segment| {
            let text = |name: &str| {
                segment
                    .fast_fields()
                    .str(name)
                    .expect("column")
                    .expect("str")
            };
            let (service, host) = (text("service"), text("host"));
            let ts = segment.fast_fields().date("ts").expect("ts");
            segment
                .doc_ids_alive()
                .map(|doc| {
                    let read = |column: &tantivy::columnar::StrColumn| {
                        let ord = column.ords().first(doc).expect("a value");
                        let mut out = String::new();
                        column.ord_to_str(ord, &mut out).expect("term");
                        out
                    };
                    let secs = ts.first(doc).expect("ts").into_timestamp_secs();
                    (read(&service), read(&host), secs)
                })
                .collect()
        })
        .collect()
}

#[test]
fn locality_splits_are_sorted_by_key_then_recent_first_and_record_their_key_range() {
    let config = locality_config();
    let mapper = Arc::new(DocMapper::for_index(&config).expect("mapper"));
    assert!(mapper.schema().get_field(SORT_KEY_FIELD_NAME).is_ok());
    assert!(mapper.index_settings().sort_by_field.is_some());
    // A bucket start: a multiple of 15 minutes.
    let bucket: i64 = 1_700_000_100;
    assert_eq!(bucket % 900, 0);
    let dir = tempfile::tempdir().unwrap();
    let mut builder = SplitBuilder::new(mapper.clone(), &dir.path().join("s"), 50_000_000).unwrap();
    let mut expected = Vec::new();
    // Pseudo-random order: services and hosts interleaved, timestamps shuffled.
    for i in 0..500i64 {
        let service = format!("svc-{}", (i * 7) % 5);
        let host = format!("host-{}", (i * 13) % 11);
        let ts = bucket + (i * 37) % 900;
        let doc = json!({"ts": ts, "service": service, "host": host, "message": format!("m{i}")});
        let parsed = mapper.parse_doc(doc.to_string().as_bytes()).unwrap();
        assert_eq!(parsed.time_bucket_start, Some(bucket));
        builder.add(parsed).unwrap();
        expected.push((service, host, ts));
    }
    // A document of another bucket does not belong in this split.
    let late = json!({"ts": bucket - 1, "service": "svc-0", "host": "h", "message": "late"});
    let err = builder
        .add(mapper.parse_doc(late.to_string().as_bytes()).unwrap())
        .expect_err("another bucket");
    assert!(err.to_string().contains("one time bucket"), "{err}");
    let built = builder.finish().unwrap();
    assert_eq!(built.num_docs, 500);
    assert_eq!(built.time_bucket_start, Some(bucket));
    let index = open_split(&built.path).unwrap();
    let rows: Vec<(String, String, i64)> = sorted_rows(&index).concat();
    // Sorted by service, host, then timestamp descending.
    expected.sort_by(|a, b| (&a.0, &a.1, b.2).cmp(&(&b.0, &b.1, a.2)));
    assert_eq!(rows, expected);
    // The recorded key range is the first and last document's key.
    let kinds = mapper.sort_field_types().expect("locality");
    let decode = |key: &Option<shale_types::sort_key::SortKey>| {
        let key = key.as_ref().expect("a key range");
        shale_types::sort_key::decode(&kinds, &key.0).expect("decodes")
    };
    let text = |s: &str| shale_types::sort_key::SortValue::Text(s.to_string());
    let first = &expected[0];
    let last = &expected[expected.len() - 1];
    assert_eq!(
        decode(&built.sort_key_min),
        (
            vec![text(&first.0), text(&first.1)],
            Some(first.2 * 1_000_000)
        )
    );
    assert_eq!(
        decode(&built.sort_key_max),
        (vec![text(&last.0), text(&last.1)], Some(last.2 * 1_000_000))
    );
    // The footer keeps the range: a merge of two splits unites them and stays sorted.
    let mut second = SplitBuilder::new(mapper.clone(), &dir.path().join("t"), 50_000_000).unwrap();
    for (service, host) in [("a-first", "h"), ("zz-last", "h")] {
        let doc = json!({"ts": bucket + 5, "service": service, "host": host, "message": "x"});
        second
            .add(mapper.parse_doc(doc.to_string().as_bytes()).unwrap())
            .unwrap();
    }
    let second = second.finish().unwrap();
    let merged = merge_split_files(
        &mapper,
        &[built.path.clone(), second.path.clone()],
        &dir.path().join("m"),
    )
    .unwrap();
    assert_eq!(merged.num_docs, 502);
    assert_eq!(merged.time_bucket_start, Some(bucket));
    assert_eq!(merged.sort_key_min, second.sort_key_min);
    assert_eq!(merged.sort_key_max, second.sort_key_max);
    let merged_rows = sorted_rows(&open_split(&merged.path).unwrap());
    assert_eq!(merged_rows.len(), 1, "one segment");
    let services: Vec<&str> = merged_rows[0].iter().map(|r| r.0.as_str()).collect();
    assert_eq!(services.first(), Some(&"a-first"));
    assert_eq!(services.last(), Some(&"zz-last"));
    assert!(merged_rows[0]
        .windows(2)
        .all(|w| (&w[0].0, &w[0].1) <= (&w[1].0, &w[1].1)));
}

#[test]
fn other_indexes_have_no_sort_key() {
    let mapper = DocMapper::for_index(&config_with(Mode::Dynamic, false)).expect("mapper");
    assert!(mapper.schema().get_field(SORT_KEY_FIELD_NAME).is_err());
    assert!(mapper.index_settings().sort_by_field.is_none());
    assert!(mapper.sort_field_types().is_none());
    let parsed = parse(&mapper, test_doc(1)).unwrap();
    assert_eq!((parsed.sort_key, parsed.time_bucket_start), (None, None));
}

/// Builds a split of `bucket` with one document per `(service, host, ts, id)`.
fn locality_split(
    mapper: &Arc<DocMapper>,
    dir: &std::path::Path,
    name: &str,
    docs: &[(String, String, i64, u64)],
) -> crate::BuiltSplit {
    // Small heap: several segments per split, as ingest makes them.
    let mut builder = SplitBuilder::new(mapper.clone(), &dir.join(name), 15_000_000).unwrap();
    for (service, host, ts, id) in docs {
        let doc = json!({"ts": ts, "service": service, "host": host, "message": format!("id{id}")});
        builder
            .add(mapper.parse_doc(doc.to_string().as_bytes()).unwrap())
            .unwrap();
    }
    builder.finish().unwrap()
}

/// `(service, host)` → document ids (from the stored message) of a split, and its rows.
fn ids_of(path: &std::path::Path) -> Vec<u64> {
    let index = open_split(path).unwrap();
    let searcher = index.reader().unwrap().searcher();
    let message = index.schema().get_field("message").unwrap();
    let mut ids = Vec::new();
    for (ord, segment) in searcher.segment_readers().iter().enumerate() {
        for doc in segment.doc_ids_alive() {
            let stored: TantivyDocument = searcher
                .doc(tantivy::DocAddress::new(ord as u32, doc))
                .unwrap();
            let text = stored
                .get_first(message)
                .and_then(|v| tantivy::schema::Value::as_str(&v).map(str::to_string));
            ids.push(text.unwrap()[2..].parse().unwrap());
        }
    }
    ids
}

#[test]
fn a_locality_merge_cuts_sorted_outputs_at_key_boundaries_and_conserves_rows() {
    use rand::{Rng, SeedableRng};
    let config = locality_config();
    let mapper = Arc::new(DocMapper::for_index(&config).expect("mapper"));
    let kinds = mapper.sort_field_types().unwrap();
    let bucket: i64 = 1_700_000_100;
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let mut next_id = 0u64;
    let mut paths = Vec::new();
    let mut all_ids = Vec::new();
    for s in 0..4 {
        let docs: Vec<(String, String, i64, u64)> = (0..1500)
            .map(|_| {
                next_id += 1;
                let service = format!("svc-{:02}", rng.random_range(0..12));
                let host = format!("host-{}", rng.random_range(0..7));
                (service, host, bucket + rng.random_range(0..900), next_id)
            })
            .collect();
        all_ids.extend(docs.iter().map(|d| d.3));
        paths.push(locality_split(&mapper, dir.path(), &format!("in{s}"), &docs).path);
    }
    let cut = crate::LocalityCut {
        target_num_docs: 1000,
        target_bytes: None,
        fixed_ranges: Vec::new(),
    };
    let (outputs, _) = crate::locality_merge_split_files(
        &mapper,
        &paths,
        &vec![Vec::new(); paths.len()],
        &dir.path().join("m"),
        &cut,
    )
    .unwrap();
    assert!(
        outputs.len() >= 5,
        "6000 docs cut at ~1000: {}",
        outputs.len()
    );
    let mut merged_ids = Vec::new();
    let mut prefixes_seen: Vec<std::collections::BTreeSet<(String, String)>> = Vec::new();
    for output in &outputs {
        assert_eq!(output.key_level, 1);
        assert_eq!(output.built.time_bucket_start, Some(bucket));
        assert!(output.built.num_docs <= 1000, "{}", output.built.num_docs);
        let ids = ids_of(&output.built.path);
        assert_eq!(ids.len() as u64, output.built.num_docs);
        merged_ids.extend(ids);
        let rows = sorted_rows(&open_split(&output.built.path).unwrap());
        assert_eq!(rows.len(), 1, "one segment per output");
        let rows = &rows[0];
        assert!(rows
            .windows(2)
            .all(|w| (&w[0].0, &w[0].1, w[1].2) <= (&w[1].0, &w[1].1, w[0].2)));
        prefixes_seen.push(rows.iter().map(|r| (r.0.clone(), r.1.clone())).collect());
        // The range is widened to whole prefixes: from the first (service, host) alone to
        // just above the last.
        let text = |s: &str| shale_types::sort_key::SortValue::Text(s.to_string());
        let (first, last) = (&rows[0], &rows[rows.len() - 1]);
        let prefix = |row: &(String, String, i64)| {
            let mut out = Vec::new();
            shale_types::sort_key::push_value(&mut out, kinds[0], &text(&row.0));
            shale_types::sort_key::push_value(&mut out, kinds[1], &text(&row.1));
            out
        };
        assert_eq!(output.built.sort_key_min.as_ref().unwrap().0, prefix(first));
        assert_eq!(
            output.built.sort_key_max.as_ref().unwrap().0,
            shale_types::sort_key::prefix_upper_bound(&prefix(last))
        );
    }
    // Ranges do not overlap, and no (service, host) is in two outputs.
    for pair in outputs.windows(2) {
        assert!(pair[0].built.sort_key_max < pair[1].built.sort_key_min);
    }
    let total: usize = prefixes_seen.iter().map(|p| p.len()).sum();
    let union: std::collections::BTreeSet<_> = prefixes_seen.into_iter().flatten().collect();
    assert_eq!(total, union.len(), "a prefix lives in one output");
    merged_ids.sort_unstable();
    all_ids.sort_unstable();
    assert_eq!(merged_ids, all_ids, "every row exactly once");

    // A fixed level-1 range (a split that is not an input): its keys go to a level-0 output
    // and no level-1 output overlaps it.
    let fixed_min = shale_types::sort_key::encode(
        &kinds,
        &[
            shale_types::sort_key::SortValue::Text("svc-05".into()),
            shale_types::sort_key::SortValue::Text("host-0".into()),
        ],
        Some(0),
    );
    let fixed_max = shale_types::sort_key::encode(
        &kinds,
        &[
            shale_types::sort_key::SortValue::Text("svc-06".into()),
            shale_types::sort_key::SortValue::Text("host-9".into()),
        ],
        Some(0),
    );
    let cut = crate::LocalityCut {
        target_num_docs: 1000,
        target_bytes: None,
        fixed_ranges: vec![(SortKey(fixed_min.clone()), SortKey(fixed_max.clone()))],
    };
    let (outputs, _) = crate::locality_merge_split_files(
        &mapper,
        &paths,
        &vec![Vec::new(); paths.len()],
        &dir.path().join("f"),
        &cut,
    )
    .unwrap();
    let mut level0 = 0;
    let mut total_docs = 0;
    for output in &outputs {
        let (min, max) = (
            output.built.sort_key_min.as_ref().unwrap(),
            output.built.sort_key_max.as_ref().unwrap(),
        );
        total_docs += output.built.num_docs;
        let overlaps = min.0 <= fixed_max && fixed_min <= max.0;
        if output.key_level == 0 {
            level0 += output.built.num_docs;
            assert!(overlaps);
        } else {
            assert!(!overlaps, "a level-1 output overlaps the fixed range");
        }
    }
    assert!(level0 > 0);
    assert_eq!(total_docs, 6000);
}

/// A random query over the locality test index's fields.
fn random_query(rng: &mut rand::rngs::StdRng, depth: u32) -> String {
    use rand::Rng;
    let service = |rng: &mut rand::rngs::StdRng| format!("svc-{}", rng.random_range(0..6));
    let host = |rng: &mut rand::rngs::StdRng| format!("h-{}", rng.random_range(0..4));
    if depth == 0 || rng.random_range(0..3) == 0 {
        return match rng.random_range(0..11) {
            0 | 1 => format!("service:{}", service(rng)),
            2 => format!("host:{}", host(rng)),
            3 => format!("service:IN [{} {}]", service(rng), service(rng)),
            4 | 5 => {
                // Bounds in order (an inverted range trips an overflow check inside Tantivy's
                // fast-field range in debug builds).
                let (a, b) = (service(rng), service(rng));
                let (low, high) = if a <= b { (a, b) } else { (b, a) };
                if rng.random_range(0..2) == 0 {
                    format!("service:[{low} TO {high}]")
                } else {
                    format!("service:{{{low} TO {high}]")
                }
            }
            6 => format!("host:[{} TO *]", host(rng)),
            7 => format!("-service:{}", service(rng)),
            8 => "service:svc*".to_string(),
            9 => format!("message:m{}", rng.random_range(0..5)),
            _ => format!("service:\"{}\"", service(rng)),
        };
    }
    let a = random_query(rng, depth - 1);
    let b = random_query(rng, depth - 1);
    match rng.random_range(0..4) {
        0 => format!("({a}) OR ({b})"),
        1 => format!("{a} {b}"),
        2 => format!("({a}) AND NOT ({b})"),
        _ => format!("({a}) AND ({b})"),
    }
}

#[test]
fn key_filters_never_exclude_a_matching_document_and_prune_what_they_can() {
    use rand::{Rng, SeedableRng};
    use tantivy::collector::DocSetCollector;
    let config = locality_config();
    let mapper = Arc::new(DocMapper::for_index(&config).expect("mapper"));
    let bucket: i64 = 1_700_000_100;
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let docs: Vec<(String, String, i64, u64)> = (0..800)
        .map(|i| {
            let service = format!("svc-{}", rng.random_range(0..6));
            let host = format!("h-{}", rng.random_range(0..4));
            (service, host, bucket + rng.random_range(0..900), i % 5)
        })
        .collect();
    let built = locality_split(&mapper, dir.path(), "s", &docs);
    let index = open_split(&built.path).unwrap();
    let searcher = index.reader().unwrap().searcher();
    let mut constrained = 0;
    for _ in 0..600 {
        let query = random_query(&mut rng, 3);
        let filter = mapper.sort_key_filter(&query);
        let Some(filter) = filter else { continue };
        constrained += 1;
        let parsed = mapper
            .parse_query(&query, Some(&["message".to_string()]))
            .unwrap();
        let matches = searcher.search(&parsed, &DocSetCollector).unwrap();
        for address in matches {
            let segment = searcher.segment_reader(address.segment_ord);
            let column = segment
                .fast_fields()
                .bytes(SORT_KEY_FIELD_NAME)
                .unwrap()
                .unwrap();
            let ord = column.ords().first(address.doc_id).unwrap();
            let mut key = Vec::new();
            column.ord_to_bytes(ord, &mut key).unwrap();
            let key = SortKey(key);
            assert!(
                filter.may_match(&key, &key),
                "`{query}` matches a document its key filter excludes"
            );
        }
    }
    assert!(
        constrained > 150,
        "most random queries constrain the key: {constrained}"
    );

    // What the filters prune, on splits holding one service each.
    let kinds = mapper.sort_field_types().unwrap();
    let key = |service: &str, host: &str| {
        SortKey(shale_types::sort_key::encode(
            &kinds,
            &[
                shale_types::sort_key::SortValue::Text(service.into()),
                shale_types::sort_key::SortValue::Text(host.into()),
            ],
            Some(1),
        ))
    };
    let split_of = |service: &str| (key(service, "a"), key(service, "z"));
    let may_match = |query: &str, service: &str| {
        let (min, max) = split_of(service);
        mapper
            .sort_key_filter(query)
            .is_none_or(|filter| filter.may_match(&min, &max))
    };
    assert!(may_match("service:b", "b"));
    assert!(!may_match("service:b", "c"));
    assert!(!may_match("service:b AND host:x", "c"));
    assert!(may_match("service:b AND host:x", "b"));
    assert!(may_match("service:a OR service:c", "c"));
    assert!(!may_match("service:a OR service:c", "b"));
    assert!(!may_match("service:IN [a c]", "b"));
    assert!(!may_match("service:[c TO e]", "b"));
    assert!(may_match("service:[c TO e]", "d"));
    assert!(!may_match("service:{c TO e}", "e"));
    assert!(!may_match("(service:a OR service:b) AND message:x", "c"));
    // Nothing to prune on: a negation, a non-leading field alone, a disjunction with one.
    assert!(mapper.sort_key_filter("-service:b").is_none());
    assert!(mapper.sort_key_filter("host:x").is_none());
    assert!(mapper.sort_key_filter("service:a OR message:x").is_none());
    assert!(mapper.sort_key_filter("service:a*").is_none());
    // A leading field and the next one, combined into one prefix.
    let (min, max) = (key("b", "x"), key("b", "x"));
    let filter = mapper.sort_key_filter("host:y AND service:b").unwrap();
    assert!(!filter.may_match(&min, &max));
}

// ---------------------------------------------------------------------------------------------
// Deletes

fn delete_task(
    opstamp: u64,
    query: &str,
    start: Option<i64>,
    end: Option<i64>,
) -> shale_types::DeleteTask {
    shale_types::DeleteTask {
        index_uid: shale_types::IndexUid::new("test-logs"),
        opstamp,
        create_timestamp: 0,
        delete_query: shale_types::DeleteQuery {
            query: query.to_string(),
            search_field: None,
            start_timestamp: start,
            end_timestamp: end,
            time_range_ms: None,
        },
        default_search_fields: None,
        doc_mapping_uid: None,
    }
}

/// A split of `test_doc(0..n)` whose document `i` was ingested at opstamp `opstamp_of(i)`.
fn split_with_opstamps(
    mapper: &Arc<DocMapper>,
    dir: &std::path::Path,
    range: std::ops::Range<i64>,
    opstamp_of: impl Fn(i64) -> u64,
) -> BuiltSplit {
    let mut builder = SplitBuilder::new(mapper.clone(), dir, 15_000_000).unwrap();
    for i in range {
        let mut doc = parse(mapper, test_doc(i)).unwrap();
        doc.opstamp = opstamp_of(i);
        builder.add(doc).unwrap();
    }
    builder.finish().unwrap()
}

#[test]
fn a_delete_task_reaches_only_documents_ingested_before_it_within_its_time_range() {
    let dir = tempfile::tempdir().unwrap();
    let mapper = Arc::new(mapper());
    // Documents 0..100 ingested knowing no task, 100..200 knowing task 1, 200..300 task 2.
    let split = split_with_opstamps(&mapper, &dir.path().join("s"), 0..300, |i| (i / 100) as u64);
    assert_eq!(split.min_doc_opstamp, 0);
    let index = open_split(&split.path).unwrap();
    let errors_below = |end: i64| (0..end).filter(|i| i % 3 == 2).count() as u64;
    // Task 2 reaches what was ingested before it: documents 0..200.
    let task = delete_task(2, "severity:ERROR", None, None);
    assert_eq!(
        count_deleted(&mapper, &index, std::slice::from_ref(&task)).unwrap(),
        errors_below(200)
    );
    // Task 1: documents 0..100 only; task 3: all of them.
    assert_eq!(
        count_deleted(
            &mapper,
            &index,
            &[delete_task(1, "severity:ERROR", None, None)]
        )
        .unwrap(),
        errors_below(100)
    );
    assert_eq!(
        count_deleted(
            &mapper,
            &index,
            &[delete_task(3, "severity:ERROR", None, None)]
        )
        .unwrap(),
        errors_below(300)
    );
    // Within a time range: documents 0..50 (timestamps T0 + i).
    assert_eq!(
        count_deleted(
            &mapper,
            &index,
            &[delete_task(3, "severity:ERROR", Some(T0), Some(T0 + 50))]
        )
        .unwrap(),
        errors_below(50)
    );
    // Two tasks: their union.
    let both = [task, delete_task(3, "tenant_id:1", None, None)];
    let union = (0..300)
        .filter(|i| (i % 3 == 2 && *i < 200) || i % 5 == 1)
        .count() as u64;
    assert_eq!(count_deleted(&mapper, &index, &both).unwrap(), union);
    // A search without the deleted documents.
    let query = mapper
        .without_deleted(mapper.parse_query("*", None).unwrap(), &both)
        .unwrap();
    assert_eq!(count(&index, &*query), 300 - union as usize);
    // An unparsable task is an error, not "delete nothing".
    assert!(count_deleted(&mapper, &index, &[delete_task(3, "body:(", None, None)]).is_err());
}

#[test]
fn merges_leave_out_what_delete_tasks_delete() {
    let dir = tempfile::tempdir().unwrap();
    let mapper = Arc::new(mapper());
    let a = split_with_opstamps(&mapper, &dir.path().join("a"), 0..300, |_| 0);
    let b = split_with_opstamps(&mapper, &dir.path().join("b"), 300..600, |_| 5);
    let task = delete_task(4, "severity:ERROR", None, None);
    // `a` is not clean of task 4; `b` (ingested after it) is.
    let merged = merge_split_files_with_deletes(
        &mapper,
        &[a.path.clone(), b.path.clone()],
        &[vec![task.clone()], vec![]],
        &dir.path().join("m"),
    )
    .unwrap()
    .expect("documents left");
    let errors_in_a = (0..300).filter(|i| i % 3 == 2).count();
    assert_eq!(merged.num_docs as usize, 600 - errors_in_a);
    assert_eq!(merged.min_doc_opstamp, 0);
    let index = open_split(&merged.path).unwrap();
    assert_eq!(count_query(&mapper, &index, "severity:ERROR"), 100);
    assert_eq!(count_query(&mapper, &index, "*"), 600 - errors_in_a);
    // Bytes shrink with the documents.
    assert!(
        merged.uncompressed_docs_size_bytes
            < a.uncompressed_docs_size_bytes + b.uncompressed_docs_size_bytes
    );

    // The time range is what is left: delete the first 100 seconds of `a`.
    let early = delete_task(4, "*", Some(T0), Some(T0 + 100));
    let merged = merge_split_files_with_deletes(
        &mapper,
        std::slice::from_ref(&a.path),
        &[vec![early]],
        &dir.path().join("m2"),
    )
    .unwrap()
    .expect("documents left");
    assert_eq!(merged.num_docs, 200);
    assert_eq!(merged.time_range.unwrap().start, T0 + 100);

    // Everything deleted: no output at all.
    let all = delete_task(4, "*", None, None);
    assert!(merge_split_files_with_deletes(
        &mapper,
        std::slice::from_ref(&a.path),
        &[vec![all]],
        &dir.path().join("m3"),
    )
    .unwrap()
    .is_none());
}

#[test]
fn a_locality_merge_leaves_out_deleted_documents() {
    let config = locality_config();
    let mapper = Arc::new(DocMapper::for_index(&config).expect("mapper"));
    let bucket: i64 = 1_700_000_100;
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    let mut all_ids = Vec::new();
    for s in 0..3u64 {
        let docs: Vec<(String, String, i64, u64)> = (0..400)
            .map(|i| {
                let id = s * 1000 + i;
                (
                    format!("svc-{}", i % 4),
                    format!("host-{}", i % 3),
                    bucket + (i as i64 % 900),
                    id,
                )
            })
            .collect();
        all_ids.extend(docs.iter().map(|d| d.3));
        paths.push(locality_split(&mapper, dir.path(), &format!("in{s}"), &docs).path);
    }
    let task = shale_types::DeleteTask {
        index_uid: shale_types::IndexUid::new("sorted"),
        opstamp: 1,
        create_timestamp: 0,
        delete_query: shale_types::DeleteQuery {
            query: "service:svc-1".to_string(),
            ..Default::default()
        },
        default_search_fields: None,
        doc_mapping_uid: None,
    };
    let cut = crate::LocalityCut {
        target_num_docs: 300,
        target_bytes: None,
        fixed_ranges: Vec::new(),
    };
    // Inputs 0 and 1 are not clean of the task, input 2 is.
    let (outputs, _) = crate::locality_merge_split_files(
        &mapper,
        &paths,
        &[vec![task.clone()], vec![task], vec![]],
        &dir.path().join("m"),
        &cut,
    )
    .unwrap();
    let mut kept: Vec<u64> = outputs.iter().flat_map(|o| ids_of(&o.built.path)).collect();
    kept.sort();
    let mut expected: Vec<u64> = all_ids
        .into_iter()
        .filter(|id| id / 1000 == 2 || (id % 1000) % 4 != 1)
        .collect();
    expected.sort();
    assert_eq!(kept, expected);
    let total: u64 = outputs.iter().map(|o| o.built.num_docs).sum();
    assert_eq!(total as usize, expected.len());
}

#[test]
fn a_capped_merge_writes_several_outputs_none_over_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let mapper = Arc::new(mapper());
    let paths: Vec<std::path::PathBuf> = (0..3)
        .map(|s| {
            split_with_opstamps(
                &mapper,
                &dir.path().join(format!("in{s}")),
                s * 2000..(s + 1) * 2000,
                |_| 0,
            )
            .path
        })
        .collect();
    let total: u64 = paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    let cap = total / 2;
    let task = delete_task(1, "tenant_id:1", None, None);
    let (outputs, deleted) = merge_split_files_capped(
        &mapper,
        &paths,
        &[vec![task.clone()], vec![], vec![task]],
        &dir.path().join("m"),
        cap,
    )
    .unwrap();
    assert!(outputs.len() >= 2, "{} outputs", outputs.len());
    for output in &outputs {
        assert!(output.size_bytes <= cap, "{} > {cap}", output.size_bytes);
        let index = open_split(&output.path).unwrap();
        assert_eq!(count_query(&mapper, &index, "*") as u64, output.num_docs);
    }
    // Every document once, but those deleted in inputs 0 and 2.
    let expected = (0..6000)
        .filter(|i| !(i % 5 == 1 && (i / 2000) != 1))
        .count() as u64;
    assert_eq!(outputs.iter().map(|o| o.num_docs).sum::<u64>(), expected);
    assert_eq!(deleted, 6000 - expected);
    let mut ranges: Vec<TimeRange> = outputs.iter().map(|o| o.time_range.unwrap()).collect();
    ranges.sort_by_key(|r| r.start);
    assert_eq!(ranges.first().unwrap().start, T0);
    assert_eq!(ranges.last().unwrap().end, T0 + 5999);
    // Under the cap: one output.
    let (single, _) = merge_split_files_capped(
        &mapper,
        &paths,
        &[vec![], vec![], vec![]],
        &dir.path().join("one"),
        total * 2,
    )
    .unwrap();
    assert_eq!(single.len(), 1);
    assert_eq!(single[0].num_docs, 6000);
}

// ---------------------------------------------------------------------------------------------
// dynamic_mapping, index_field_presence, store_document_size, default search fields

fn mapper_of(yaml: &str) -> Result<DocMapper, IndexError> {
    let config: IndexConfig = serde_yaml::from_str(yaml).map_err(|err| {
        IndexError::from(shale_config::ConfigError::Invalid {
            field: "yaml".to_string(),
            message: err.to_string(),
        })
    })?;
    config.validate().map_err(IndexError::from)?;
    DocMapper::for_index(&config)
}

fn split_of(yaml: &str, docs: Vec<Value>) -> (Arc<DocMapper>, Index, tempfile::TempDir) {
    let mapper = Arc::new(mapper_of(yaml).unwrap_or_else(|err| panic!("{err}")));
    let dir = tempfile::tempdir().unwrap();
    let split = build_split(&mapper, &dir.path().join("01SPLIT"), docs.into_iter());
    let index = open_split(&split.path).unwrap();
    (mapper, index, dir)
}

#[test]
fn dynamic_mapping_sets_the_options_of_undeclared_fields() {
    let docs = vec![
        json!({"msg": "Connection Reset by peer", "code": 7}),
        json!({"msg": "connection refused", "code": 9}),
    ];
    // Raw tokenizer: the whole value is one term, case kept.
    let (mapper, index, _dir) = split_of(
        "index_id: raw\ndoc_mapping:\n  dynamic_mapping:\n    tokenizer: raw\n    record: basic\n",
        docs.clone(),
    );
    let q = |query: &str| count_query(&mapper, &index, query);
    assert_eq!(q("msg:connection"), 0, "raw: no word terms");
    assert_eq!(q("msg:\"connection refused\""), 1);
    assert_eq!(q("code:7"), 1);

    // Default: words, lowercased, positions (phrases work).
    let (mapper, index, _dir) = split_of("index_id: words\ndoc_mapping: {}\n", docs.clone());
    let q = |query: &str| count_query(&mapper, &index, query);
    assert_eq!(q("msg:connection"), 2);
    assert_eq!(q("msg:\"reset by peer\""), 1);

    // Not indexed: undeclared fields are kept (returned) but not searchable.
    let (mapper, index, _dir) = split_of(
        "index_id: hidden\ndoc_mapping:\n  dynamic_mapping:\n    indexed: false\n    fast: false\n",
        docs.clone(),
    );
    let err = mapper
        .parse_query("msg:connection", None)
        .expect_err("refused");
    assert!(err.to_string().contains("not declared as indexed"), "{err}");
    let reader = index.reader().unwrap();
    let searcher = reader.searcher();
    let doc: TantivyDocument = searcher.doc(tantivy::DocAddress::new(0, 0)).unwrap();
    assert_eq!(mapper.doc_to_json(&doc)["code"], json!(7));

    // A lowercase normalizer lowercases the fast column (aggregations, sorts) only.
    let (mapper, index, _dir) = split_of(
        "index_id: norm\ndoc_mapping:\n  field_mappings:\n    - name: level\n      type: text\n      tokenizer: raw\n      fast:\n        normalizer: lowercase\n",
        vec![json!({"level": "ERROR"}), json!({"level": "Error"}), json!({"level": "info"})],
    );
    assert_eq!(
        count_query(&mapper, &index, "level:ERROR"),
        1,
        "terms keep case"
    );
    let reader = index.reader().unwrap();
    let searcher = reader.searcher();
    let column = searcher
        .segment_reader(0)
        .fast_fields()
        .str("level")
        .unwrap()
        .unwrap();
    let mut values = Vec::new();
    let mut term = String::new();
    for ord in 0..column.num_terms() as u64 {
        column.ord_to_str(ord, &mut term).unwrap();
        values.push(term.clone());
    }
    assert_eq!(values, ["error", "info"]);

    // dynamic_mapping needs dynamic mode.
    let err = mapper_of(
        "index_id: strict\ndoc_mapping:\n  mode: strict\n  dynamic_mapping:\n    tokenizer: raw\n",
    )
    .expect_err("refused");
    assert!(
        err.to_string()
            .contains("only allowed with `mode: dynamic`"),
        "{err}"
    );
}

#[test]
fn field_presence_finds_fields_that_are_not_fast() {
    let yaml = r#"
index_id: nested
doc_mapping:
  index_field_presence: true
  field_mappings:
    - name: json_text
      type: json
    - name: json_fast
      type: json
      fast: true
    - name: object_multi
      type: object
      field_mappings:
        - name: object_text_field
          type: text
        - name: object_fast_field
          type: u64
          fast: true
    - name: text_raw
      type: text
      tokenizer: raw
"#;
    let docs = vec![
        json!({"json_text": {"field_a": "hello", "field_b": "world"}}),
        json!({"json_text": {"field_a": "hi"}}),
        json!({"json_fast": {"field_c": 1}}),
        json!({"object_multi": {"object_text_field": "multi hello"}}),
        json!({"object_multi": {"object_fast_field": 1}}),
        json!({"object_multi": {"object_fast_field": 2}}),
        json!({"text_raw": "indexed-with-raw-tokenizer-dashes"}),
        json!({"text_raw": null, "dyn": {"a.b": "x"}}),
        json!({"dyn": {"a": {"c": []}}}),
    ];
    let (mapper, index, _dir) = split_of(yaml, docs);
    let q = |query: &str| count_query(&mapper, &index, query);
    assert_eq!(q("json_text:*"), 2);
    assert_eq!(q("json_text.field_a:*"), 2);
    assert_eq!(q("json_text.field_b:*"), 1);
    assert_eq!(q("json_fast:*"), 1);
    assert_eq!(q("json_fast.field_c:*"), 1);
    assert_eq!(q("json_fast.doesnotexist:*"), 0);
    assert_eq!(q("object_multi:*"), 3);
    assert_eq!(q("object_multi.object_text_field:*"), 1);
    assert_eq!(q("object_multi.object_fast_field:*"), 2);
    assert_eq!(q("object_multi.doesnotexist:*"), 0);
    assert_eq!(q("text_raw:*"), 1, "null is absent");
    assert_eq!(q("doesnotexist:*"), 0);
    assert_eq!(q("dyn:*"), 1, "empty arrays are absent");
    assert_eq!(q("dyn.a.b:*"), 1, "dotted keys are paths");
    assert_eq!(q("NOT json_text:*"), 7);
    assert_eq!(q("json_text:* AND json_text.field_b:*"), 1);
}

#[test]
fn document_size_is_a_fast_field_and_not_in_hits() {
    let docs = vec![json!({"a": 1}), json!({"message": "hello world"})];
    let sizes: Vec<u64> = docs.iter().map(|d| d.to_string().len() as u64).collect();
    let (mapper, index, _dir) = split_of(
        "index_id: len\ndoc_mapping:\n  store_document_size: true\n",
        docs,
    );
    let reader = index.reader().unwrap();
    let searcher = reader.searcher();
    let segment = searcher.segment_reader(0);
    let column = segment.fast_fields().u64(DOC_LENGTH_FIELD_NAME).unwrap();
    let stored: Vec<u64> = (0..2).filter_map(|doc| column.first(doc)).collect();
    assert_eq!(stored, sizes);
    let doc: TantivyDocument = searcher.doc(tantivy::DocAddress::new(0, 0)).unwrap();
    assert_eq!(mapper.doc_to_json(&doc), json!({"a": 1}));
}

#[test]
fn default_search_fields_may_name_dynamic_and_json_paths() {
    let yaml = r#"
index_id: defaults
doc_mapping:
  field_mappings:
    - name: id
      type: u64
    - name: inner_json
      type: json
    - name: regular_field
      type: text
search_settings:
  default_search_fields: [regular_field, some_dynamic_field, inner_json.somefieldinjson]
"#;
    let docs = vec![
        json!({"id": 1, "some_dynamic_field": "hello"}),
        json!({"id": 2, "inner_json": {"somefieldinjson": "allo"}}),
        json!({"id": 3, "regular_field": "bonjour"}),
    ];
    let (mapper, index, _dir) = split_of(yaml, docs);
    let q = |query: &str| count_query(&mapper, &index, query);
    assert_eq!(q("hello"), 1);
    assert_eq!(q("allo"), 1);
    assert_eq!(q("bonjour"), 1);
    assert_eq!(q("hello OR bonjour"), 2);
    assert_eq!(q("hello AND bonjour"), 0);
    assert_eq!(q("id:2 OR bonjour"), 2);

    let refused = |yaml: &str| mapper_of(yaml).expect_err("refused").to_string();
    let err = refused(
        "index_id: fail1\ndoc_mapping:\n  mode: lenient\nsearch_settings:\n  default_search_fields: [regular_field]\n",
    );
    assert!(
        err.contains("unknown default search field `regular_field`"),
        "{err}"
    );
    let err = refused(
        "index_id: fail2\ndoc_mapping:\n  field_mappings:\n    - name: text\n      type: text\nsearch_settings:\n  default_search_fields: [text.inner]\n",
    );
    assert!(
        err.contains("unknown default search field `text.inner`"),
        "{err}"
    );
    let err = refused(
        "index_id: fail3\ndoc_mapping:\n  dynamic_mapping:\n    indexed: false\nsearch_settings:\n  default_search_fields: [some_field]\n",
    );
    assert!(
        err.contains("default search field `some_field` is not indexed"),
        "{err}"
    );
}

#[test]
fn concatenate_fields_index_the_values_of_other_fields_with_their_own_tokenizer() {
    let yaml = r#"
index_id: concat
doc_mapping:
  field_mappings:
    - name: title
      type: text
    - name: code
      type: text
      tokenizer: raw
    - name: flag
      type: bool
    - name: count
      type: u64
    - name: ratio
      type: f64
    - name: attrs
      type: json
    - name: all_raw
      type: concatenate
      concatenate_fields: [title, code, flag, count, ratio, attrs]
      tokenizer: raw
      include_dynamic_fields: true
    - name: all_words
      type: concatenate
      concatenate_fields: [title, code, flag, count, ratio, attrs]
  dynamic_mapping:
    tokenizer: default
"#;
    let docs = vec![
        json!({"title": "Disk-Full", "code": "E-42"}),
        json!({"flag": true}),
        json!({"title": "true story"}),
        json!({"count": 42}),
        json!({"extra": "dynvalue", "extra_n": 9}),
        json!({"attrs": {"ok": false, "n": 10, "deep": {"s": "deepvalue"}}}),
        json!({"ratio": 1.5}),
        json!({"big": 9223372036854775808u64, "neg": -5}),
    ];
    let (mapper, index, _dir) = split_of(yaml, docs);
    let q = |query: &str| count_query(&mapper, &index, query);
    assert_eq!(q("all_raw:Disk-Full"), 1, "raw: the whole value");
    assert_eq!(q("all_raw:E-42"), 1);
    assert_eq!(q("all_words:disk"), 1, "default: words");
    assert_eq!(q("all_words:42"), 2, "the number and the word of E-42");
    assert_eq!(q("all_raw:42"), 1, "only the number is the whole value 42");
    assert_eq!(
        q("all_raw:true"),
        1,
        "the bool; `true story` is one raw value"
    );
    assert_eq!(q("all_words:true"), 2);
    assert_eq!(q("all_raw:dynvalue"), 1, "undeclared fields included");
    assert_eq!(q("all_raw:9"), 1);
    assert_eq!(q("all_words:dynvalue"), 0, "not included there");
    assert_eq!(q("all_raw:false"), 1, "json leaves");
    assert_eq!(q("all_raw:10"), 1);
    assert_eq!(q("all_words:deepvalue"), 1);
    assert_eq!(q("all_raw:1.5"), 1);
    assert_eq!(q("all_words:1.5"), 1);
    assert_eq!(q("all_raw:9223372036854775808"), 1);
    assert_eq!(q("all_raw:\"-5\""), 1);

    // Documents cannot set it; it is not returned.
    let err = mapper
        .parse_doc(br#"{"all_raw": "x"}"#)
        .expect_err("refused");
    assert!(err.to_string().contains("concatenate"), "{err}");
    let reader = index.reader().unwrap();
    let doc: TantivyDocument = reader
        .searcher()
        .doc(tantivy::DocAddress::new(0, 0))
        .unwrap();
    assert!(mapper.doc_to_json(&doc).get("all_raw").is_none());

    // Sources must be declared fields of a concatenable type.
    let refused = |extra: &str| {
        mapper_of(&format!(
            "index_id: concat\ndoc_mapping:\n  field_mappings:\n    - name: ts\n      type: datetime\n    - name: c\n      type: concatenate\n{extra}"
        ))
        .expect_err("refused")
        .to_string()
    };
    let err = refused("      concatenate_fields: [missing]\n");
    assert!(err.contains("no field named `missing`"), "{err}");
    let err = refused("      concatenate_fields: [ts]\n");
    assert!(err.contains("cannot be concatenated"), "{err}");
    let err = refused("      concatenate_fields: []\n");
    assert!(err.contains("concatenates nothing"), "{err}");
}

#[test]
fn regexes_work_on_json_paths_and_undeclared_fields() {
    let yaml = "index_id: regexes\ndoc_mapping:\n  field_mappings:\n    - name: attrs\n      type: json\n      tokenizer: raw\n  dynamic_mapping:\n    tokenizer: raw\n";
    let docs = vec![
        json!({"attrs": {"user": "jadonk"}, "actor": {"login": "jadonk"}, "type": "PushEvent"}),
        json!({"attrs": {"user": "jadenk"}, "actor": {"login": "teoz"}, "type": "WatchEvent"}),
        json!({"attrs": {"other": "jadonk"}, "actor": {"name": "jadonk"}, "type": "push.event"}),
    ];
    let (mapper, index, _dir) = split_of(yaml, docs);
    let q = |query: &str| count_query(&mapper, &index, query);
    assert_eq!(q("attrs.user:/jad.nk/"), 2);
    assert_eq!(q("attrs.user:/jado.*/"), 1);
    assert_eq!(q("actor.login:/jad.nk/"), 1, "only that path");
    assert_eq!(q("type:/.*Event/"), 2);
    assert_eq!(q("type:/push\\.event/"), 1);
    assert_eq!(q("type:/.*Event/ AND NOT actor.login:/te.*/"), 1);
    assert_eq!(q("actor.login:/te.*/ OR attrs.other:/j.*/"), 2);
    assert_eq!(q("missing.path:/.*/"), 0);
}

#[test]
fn datetime_values_in_queries_take_quickwits_formats() {
    let yaml = "index_id: dates\ndoc_mapping:\n  timestamp_field: ts\n  field_mappings:\n    - name: ts\n      type: datetime\n      fast: true\n      fast_precision: milliseconds\n";
    let docs = vec![
        json!({"ts": 1684993001}),
        json!({"ts": 1684993002}),
        json!({"ts": 1685000000}),
        json!({"ts": "2022-12-16T10:00:57.297Z"}),
    ];
    let (mapper, index, _dir) = split_of(yaml, docs);
    let q = |query: &str| count_query(&mapper, &index, query);
    assert_eq!(q("ts:>=2023/05/25"), 3);
    assert_eq!(q("ts:>=2023-05-25"), 3);
    assert_eq!(q("ts:>=1684993002 AND ts:<1685000000"), 1);
    assert_eq!(q("ts:1684993001"), 1);
    assert_eq!(q("-ts:1234567890 AND -ts:1684993001"), 3);
    assert_eq!(q("ts:[2023-05-25T05:36:41 TO 2023-05-25T05:36:42]"), 2);
    assert_eq!(q("ts:IN [1684993001 1685000000]"), 2);
    assert_eq!(
        q("ts:>=2022-12-16T10:00:57.000Z AND ts:<=2022-12-16T10:00:57.300Z"),
        1
    );
    assert!(mapper.parse_query("ts:>=yesterday", None).is_err());
}

#[test]
fn a_phrase_prefix_of_one_term_is_a_prefix_query() {
    let yaml = "index_id: prefixes\ndoc_mapping:\n  field_mappings:\n    - name: body\n      type: text\n    - name: code\n      type: text\n      tokenizer: raw\n";
    let docs = vec![
        json!({"body": "please pull", "code": "2024-01-01T00:13:00Z"}),
        json!({"body": "push it", "code": "2023-12-31"}),
        json!({"body": "nothing", "extra": "pineapple"}),
    ];
    let (mapper, index, _dir) = split_of(yaml, docs);
    let q = |query: &str| count_query(&mapper, &index, query);
    assert_eq!(q("body:\"p\"*"), 2);
    assert_eq!(q("body:\"pu\"*"), 2);
    assert_eq!(q("body:\"please pu\"*"), 1, "two terms: a phrase prefix");
    assert_eq!(q("code:\"2024-01-01\"*"), 1, "raw: one term");
    assert_eq!(q("extra:\"pine\"*"), 1, "undeclared fields too");
}

#[test]
fn terms_on_fast_only_fields_are_answered_from_the_column() {
    let yaml = "index_id: fastonly\ndoc_mapping:\n  field_mappings:\n    - name: text_fast\n      type: text\n      indexed: false\n      fast: true\n    - name: n\n      type: u64\n      indexed: false\n      fast: true\n";
    let docs = vec![
        json!({"text_fast": "fast-text-value-dashes", "n": 3}),
        json!({"text_fast": "fast text value whitespaces", "n": 4}),
    ];
    let (mapper, index, _dir) = split_of(yaml, docs);
    let q = |query: &str| count_query(&mapper, &index, query);
    assert_eq!(q("text_fast:fast-text-value-dashes"), 1);
    assert_eq!(q("text_fast:\"fast text value whitespaces\""), 1);
    assert_eq!(q("text_fast:fast"), 0, "the whole value, not words");
    assert_eq!(q("n:3"), 1);
    assert_eq!(q("n:[3 TO 4]"), 2);
}

#[test]
fn sets_on_fast_only_fields_and_empty_strings_in_presence() {
    let yaml = "index_id: fastset\ndoc_mapping:\n  index_field_presence: true\n  field_mappings:\n    - name: tag\n      type: text\n      indexed: false\n      fast: true\n";
    let docs = vec![
        json!({"tag": "abc-123"}),
        json!({"tag": "x"}),
        json!({"tag": ""}),
    ];
    let (mapper, index, _dir) = split_of(yaml, docs);
    let q = |query: &str| count_query(&mapper, &index, query);
    assert_eq!(q("tag:IN [abc-123 zzz]"), 1);
    assert_eq!(q("tag:IN [abc-123 x]"), 2);
    assert_eq!(q("tag:*"), 2, "an empty string is no value");
}

#[test]
fn wildcards_inside_terms() {
    let yaml = "index_id: wild\ndoc_mapping:\n  field_mappings:\n    - name: body\n      type: text\n    - name: code\n      type: text\n      tokenizer: raw\n";
    let docs = vec![
        json!({"body": "The Journal of unix", "code": "AB-12"}),
        json!({"body": "a journey", "code": "AB-123"}),
        json!({"body": "jour? maybe", "extra": "Sea Shell"}),
    ];
    let (mapper, index, _dir) = split_of(yaml, docs);
    let q = |query: &str| count_query(&mapper, &index, query);
    assert_eq!(q("body:Jou*al"), 1, "normalized by the tokenizer");
    assert_eq!(q("body:jour?al"), 1);
    assert_eq!(q("body:jou*"), 3);
    assert_eq!(q("body:j*r*"), 3, "a wildcard and a trailing prefix");
    assert_eq!(
        q("body:jour\\?"),
        1,
        "escaped: a literal `?`, dropped by the tokenizer"
    );
    assert_eq!(q("code:AB-1?"), 1, "raw: case kept");
    assert_eq!(q("code:ab-1?"), 0);
    assert_eq!(q("code:AB*3"), 1);
    assert_eq!(q("extra:s*ll"), 1, "undeclared fields too");
    assert_eq!(q("body:*nal"), 1, "a leading wildcard");
    assert_eq!(q("code:A*?*-*1*?*"), 2, "many wildcards in one term");
    assert_eq!(q("code:A*?*-*1*?*3"), 1);
    assert_eq!(
        q("extra:*?*?e*?*"),
        1,
        "many wildcards on an undeclared field"
    );
    assert_eq!(q("body:/jour.*/"), 3, "a regex of glob shape");
    assert_eq!(q("body:/jour(nal|ney)/"), 2, "any other regex");
    // Found by fuzzing: Tantivy's regex automaton took seconds to build for this term; the
    // glob automaton takes none.
    let slow = "GGGGs******************/******n**********?TT$TTTTTTTTTT*******deletes*******\
                ******GGG]GG?*GGGs*********TTTTTTTTT*******delet4s*************GGG]GG?*GGGGG";
    assert_eq!(q(&format!("body:{slow} code:{slow}")), 0);
}

#[test]
fn text_ranges_on_json_paths_use_the_normalized_column() {
    let yaml = "index_id: textrange\ndoc_mapping:\n  mode: dynamic\n  dynamic_mapping:\n    tokenizer: default\n    fast:\n      normalizer: lowercase\n  field_mappings:\n    - name: n\n      type: u64\n";
    let docs = vec![
        json!({"actor": {"login": "Alice-1"}, "n": 1}),
        json!({"actor": {"login": "hector"}, "n": 2}),
        json!({"actor": {"login": "Mallory x"}, "n": 3}),
        json!({"actor": {"login": "zed"}, "n": 4}),
        json!({"actor": {"login": 12}, "n": 5}),
    ];
    let (mapper, index, _dir) = split_of(yaml, docs);
    let q = |query: &str| count_query(&mapper, &index, query);
    assert_eq!(
        q("actor.login:[H TO Z]"),
        2,
        "whole values, lowercased bounds"
    );
    assert_eq!(q("actor.login:[h TO zz]"), 3);
    assert_eq!(q("actor.login:[Hector TO Zed}"), 2, "zed is excluded");
    assert_eq!(q("actor.login:{hector TO *]"), 2);
    assert_eq!(q("actor.login:[10 TO 20]"), 1, "numbers stay numbers");
}

/// Found by fuzzing: Tantivy types each bound of a json range by itself and panicked
/// searching `nested.deep.value:[1 TO %]` (a number and text).
#[test]
fn json_ranges_with_bounds_of_different_types() {
    let yaml =
        "index_id: jsonrange\ndoc_mapping:\n  mode: dynamic\n  dynamic_mapping:\n    fast: true\n";
    let docs = (0..5)
        .map(|i| json!({"nested": {"deep": {"value": i}}, "ratio": i as f64 / 2.0}))
        .collect();
    let (mapper, index, _dir) = split_of(yaml, docs);
    let q = |query: &str| count_query(&mapper, &index, query);
    let err = mapper
        .parse_query("nested.deep.value:[1 TO %]", None)
        .expect_err("refused");
    assert!(
        err.to_string()
            .contains("must be of one type: `1` is a number and `%` is text"),
        "{err}"
    );
    let err = mapper
        .parse_query("nested.deep.value:[2024-01-01T00:00:00Z TO 5]", None)
        .expect_err("refused");
    assert!(err.to_string().contains("is a date"), "{err}");
    assert_eq!(
        q("nested.deep.value:[1 TO 2.5]"),
        2,
        "an integer and a float"
    );
    assert_eq!(q("nested.deep.value:[1 TO 18446744073709551615]"), 4);
    assert_eq!(q("ratio:[0.5 TO 1]"), 2);
    assert_eq!(q("nested.deep.value:[1 TO 3]"), 3);
}

// ---------------------------------------------------------------------------------------------
// Time rounding: one rule (floor) for split time ranges, merges and the time filter

/// A mapper whose timestamp field `ts` has `precision` (`seconds`, …, `nanoseconds`).
fn ts_mapper(precision: &str) -> Arc<DocMapper> {
    let yaml = format!(
        "index_id: times\ndoc_mapping:\n  timestamp_field: ts\n  field_mappings:\n    - {{name: ts, type: datetime, fast: true, fast_precision: {precision}}}\n    - {{name: body, type: text}}\n"
    );
    Arc::new(mapper_of(&yaml).unwrap_or_else(|err| panic!("{err}")))
}

/// Documents of `split` in the window `[start, end)` (seconds), by the time filter.
fn in_window(mapper: &DocMapper, index: &Index, start: Option<i64>, end: Option<i64>) -> usize {
    match mapper.time_range_query(start, end) {
        Some(query) => count(index, &*query),
        None => count_query(mapper, index, "*"),
    }
}

#[test]
fn before_1970_a_timestamp_is_in_the_second_that_holds_it_at_every_precision() {
    for (precision, ts, second) in [
        ("seconds", "1969-12-31T23:59:59.500Z", -1),
        ("seconds", "1969-12-31T23:59:58Z", -2),
        ("milliseconds", "1969-12-31T23:59:59.999Z", -1),
        ("milliseconds", "1969-12-31T23:59:59.9995Z", -1),
        ("microseconds", "1969-12-31T23:59:58.000001Z", -2),
        ("nanoseconds", "1969-12-31T23:59:59.999999999Z", -1),
        ("seconds", "1970-01-01T00:00:00.500Z", 0),
    ] {
        let mapper = ts_mapper(precision);
        let dir = tempfile::tempdir().unwrap();
        let doc = json!({"ts": ts, "body": "early"});
        let parsed = parse(&mapper, doc.clone()).unwrap();
        assert_eq!(
            parsed.timestamp_micros.map(|m| m.div_euclid(1_000_000)),
            Some(second),
            "{precision} {ts}"
        );
        let split = build_split(&mapper, &dir.path().join("s"), [doc].into_iter());
        assert_eq!(
            split.time_range,
            Some(TimeRange {
                start: second,
                end: second
            }),
            "{precision} {ts}"
        );
        let index = open_split(&split.path).unwrap();
        let found = |start, end| in_window(&mapper, &index, start, end);
        assert_eq!(found(Some(second), Some(second + 1)), 1, "{precision} {ts}");
        assert_eq!(
            found(Some(second + 1), Some(second + 2)),
            0,
            "{precision} {ts}"
        );
        assert_eq!(found(Some(second - 1), Some(second)), 0, "{precision} {ts}");
        assert_eq!(found(None, Some(second + 1)), 1, "{precision} {ts}");
        assert_eq!(found(Some(second), None), 1, "{precision} {ts}");
        // A range query of the query language agrees.
        let start = format_second(second);
        let end = format_second(second + 1);
        assert_eq!(
            count_query(&mapper, &index, &format!("ts:[{start} TO {end}}}")),
            1,
            "{precision} {ts}"
        );
    }
}

fn format_second(second: i64) -> String {
    crate::date::format_rfc3339(tantivy::DateTime::from_timestamp_secs(second))
}

#[test]
fn a_merge_floors_the_time_range_of_what_is_left_as_a_new_split_does() {
    let mapper = ts_mapper("seconds");
    let dir = tempfile::tempdir().unwrap();
    let docs = [
        json!({"ts": "1969-12-31T23:59:58.500Z", "body": "first"}),
        json!({"ts": "1969-12-31T23:59:59.500Z", "body": "second"}),
        json!({"ts": "1970-01-01T00:00:01.500Z", "body": "late"}),
    ];
    let split = build_split(&mapper, &dir.path().join("s"), docs.into_iter());
    assert_eq!(split.time_range, Some(TimeRange { start: -2, end: 1 }));
    // Deleting a document makes the merge read the time range from the timestamp column.
    let merged = merge_split_files_with_deletes(
        &mapper,
        std::slice::from_ref(&split.path),
        &[vec![delete_task(1, "body:late", None, None)]],
        &dir.path().join("m"),
    )
    .unwrap()
    .expect("documents left");
    assert_eq!(merged.time_range, Some(TimeRange { start: -2, end: -1 }));
    let index = open_split(&merged.path).unwrap();
    assert_eq!(in_window(&mapper, &index, Some(-2), Some(-1)), 1);
    assert_eq!(in_window(&mapper, &index, Some(-1), Some(0)), 1);
    assert_eq!(in_window(&mapper, &index, Some(0), None), 0);
}

#[test]
fn a_locality_merge_floors_the_time_range_of_its_outputs() {
    let mut config = locality_config();
    for mapping in &mut config.doc_mapping.field_mappings {
        if let shale_config::FieldKind::Datetime(options) = &mut mapping.kind {
            options.fast_precision = shale_config::FastPrecision::Milliseconds;
        }
    }
    let mapper = Arc::new(DocMapper::for_index(&config).expect("mapper"));
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for (s, ts) in [(0, -0.25f64), (1, -1.75)] {
        let mut builder = SplitBuilder::new(
            mapper.clone(),
            &dir.path().join(format!("in{s}")),
            15_000_000,
        )
        .unwrap();
        let doc = json!({"ts": ts, "service": "svc", "host": "h", "message": "m"});
        builder
            .add(mapper.parse_doc(doc.to_string().as_bytes()).unwrap())
            .unwrap();
        let built = builder.finish().unwrap();
        assert_eq!(
            built.time_range.map(|r| r.start),
            Some(ts.floor() as i64),
            "{ts}"
        );
        paths.push(built.path);
    }
    let cut = crate::LocalityCut {
        target_num_docs: 300,
        target_bytes: None,
        fixed_ranges: Vec::new(),
    };
    let (outputs, _) = crate::locality_merge_split_files(
        &mapper,
        &paths,
        &[vec![], vec![]],
        &dir.path().join("m"),
        &cut,
    )
    .unwrap();
    assert_eq!(outputs.len(), 1);
    assert_eq!(
        outputs[0].built.time_range,
        Some(TimeRange { start: -2, end: -1 })
    );
}

#[test]
fn the_ends_of_the_nanosecond_range_are_in_their_seconds() {
    let mapper = ts_mapper("nanoseconds");
    let dir = tempfile::tempdir().unwrap();
    let docs = [
        json!({"ts": "2262-04-11T23:47:16.854775807Z", "body": "last"}),
        json!({"ts": "1677-09-21T00:12:43.145224192Z", "body": "first"}),
    ];
    let split = build_split(&mapper, &dir.path().join("s"), docs.into_iter());
    let (first, last) = (
        i64::MIN.div_euclid(1_000_000_000),
        i64::MAX.div_euclid(1_000_000_000),
    );
    assert_eq!(
        split.time_range,
        Some(TimeRange {
            start: first,
            end: last
        })
    );
    let index = open_split(&split.path).unwrap();
    let found = |start, end| in_window(&mapper, &index, start, end);
    // Windows whose bounds lie past the ends of the range, in seconds.
    assert_eq!(found(Some(last), Some(last + 1)), 1);
    assert_eq!(found(None, Some(last + 1)), 2);
    assert_eq!(found(None, Some(i64::MAX)), 2);
    assert_eq!(found(Some(last + 1), None), 0);
    assert_eq!(found(Some(i64::MAX), None), 0);
    assert_eq!(found(Some(first), Some(first + 1)), 1);
    assert_eq!(found(Some(i64::MIN), Some(first + 1)), 1);
    assert_eq!(found(Some(i64::MIN), None), 2);
    assert_eq!(found(None, Some(first)), 0);
    assert_eq!(found(None, Some(i64::MIN)), 0);
    // Merged, the range is the same.
    let merged = merge_split_files_with_deletes(
        &mapper,
        std::slice::from_ref(&split.path),
        &[vec![delete_task(1, "body:nothing", None, None)]],
        &dir.path().join("m"),
    )
    .unwrap()
    .expect("documents left");
    assert_eq!(merged.time_range, split.time_range);
}

#[test]
fn a_timestamp_field_with_several_values_is_refused_naming_the_field() {
    let mapper = ts_mapper("seconds");
    let several = json!({"ts": ["2024-01-01T00:00:00Z", "2024-06-01T00:00:00Z"], "body": "x"});
    let err = parse(&mapper, several).unwrap_err();
    assert_eq!(err.field(), Some("ts"), "{err}");
    assert!(err.to_string().contains("`ts`"), "{err}");
    assert!(err.to_string().contains("one value"), "{err}");
    // One value, in an array or not, is a timestamp.
    let one = parse(
        &mapper,
        json!({"ts": ["2024-01-01T00:00:00Z"], "body": "x"}),
    )
    .unwrap();
    assert_eq!(one.timestamp_micros, Some(1_704_067_200_000_000));
    let one = parse(
        &mapper,
        json!({"ts": [null, "2024-01-01T00:00:00Z"], "body": "x"}),
    )
    .unwrap();
    assert_eq!(one.timestamp_micros, Some(1_704_067_200_000_000));
    // Another datetime field may hold several values.
    let yaml = "index_id: times\ndoc_mapping:\n  timestamp_field: ts\n  field_mappings:\n    - {name: ts, type: datetime, fast: true}\n    - {name: seen, type: array<datetime>, fast: true}\n";
    let mapper = mapper_of(yaml).unwrap();
    let doc = json!({"ts": 1_704_067_200, "seen": [1_704_067_200, 1_704_067_201]});
    assert!(parse(&mapper, doc).is_ok());
}
