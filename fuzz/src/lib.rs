//! What the fuzz targets share: a representative index (every field type, dynamic mode,
//! default search fields, tags, field presence, a locality sort key), its doc mapper, and two
//! small splits of it — one written under the current doc mapping, one under an older one
//! whose fields have other types — to run parsed queries against, as a leaf does.

use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};
use shale_config::{IndexConfig, LocalityConfig, MergePolicyConfig};
use shale_index::{open_split, DocMapper, SplitBuilder};
use tantivy::collector::{Count, TopDocs};
use tantivy::query::{BooleanQuery, Occur, Query};
use tantivy::{Index, Order};

/// The representative index config (YAML, Quickwit's format).
pub const INDEX_CONFIG: &str = r#"
version: 0.9
index_id: fuzz-logs
doc_mapping:
  mode: dynamic
  dynamic_mapping:
    indexed: true
    stored: true
    tokenizer: default
    record: position
    expand_dots: true
    fast: true
  field_mappings:
    - name: timestamp
      type: datetime
      input_formats: [rfc3339, unix_timestamp, "%Y-%m-%d %H:%M:%S"]
      output_format: rfc3339
      fast: true
      fast_precision: milliseconds
    - {name: body, type: text, tokenizer: default, record: position, fieldnorms: true}
    - {name: title, type: text, tokenizer: en_stem}
    - {name: service, type: text, tokenizer: raw, fast: true}
    - {name: host, type: text, tokenizer: raw, fast: {normalizer: lowercase}}
    - {name: tenant_id, type: u64, fast: true}
    - {name: status, type: i64, fast: true}
    - {name: latency, type: f64, fast: true}
    - {name: retries, type: i64, indexed: false, fast: true}
    - {name: ok, type: bool, fast: true}
    - {name: client_ip, type: ip, fast: true}
    - {name: payload, type: bytes, fast: true}
    - {name: trace_id, type: bytes, input_format: hex, output_format: hex}
    - {name: attributes, type: json, fast: true}
    - {name: labels, type: array<text>, tokenizer: raw, fast: true}
    - {name: codes, type: array<i64>}
    - name: resource
      type: object
      field_mappings:
        - {name: region, type: text, tokenizer: raw, fast: true}
        - {name: zone, type: u64}
    - {name: everything, type: concatenate, concatenate_fields: [body, service], include_dynamic_fields: true}
  tag_fields: [tenant_id, service]
  timestamp_field: timestamp
  partition_key: hash_mod(tenant_id, 4)
  max_num_partitions: 10
  index_field_presence: true
  store_document_size: true
  store_source: true
search_settings:
  default_search_fields: [body, title, service]
"#;

/// The same index as an older doc mapping version had it: some fields have other types,
/// some are missing, some are new.
pub const OLDER_INDEX_CONFIG: &str = r#"
index_id: fuzz-logs
doc_mapping:
  mode: dynamic
  field_mappings:
    - {name: timestamp, type: datetime, input_formats: [rfc3339, unix_timestamp], fast: true}
    - {name: body, type: text}
    - {name: service, type: text, tokenizer: raw, fast: true}
    - {name: tenant_id, type: text, tokenizer: raw, fast: true}
    - {name: status, type: text, tokenizer: raw}
    - {name: latency, type: i64, fast: true}
    - {name: ok, type: text}
    - {name: client_ip, type: text, tokenizer: raw}
    - {name: attributes, type: text}
    - {name: old_only, type: u64, fast: true}
  tag_fields: [service]
  timestamp_field: timestamp
search_settings:
  default_search_fields: [body]
"#;

/// The representative index config, with a `locality` merge policy sorting by
/// `(service, host)` (set directly: index creation does not accept the policy yet).
pub fn index_config() -> IndexConfig {
    let mut config = IndexConfig::parse(INDEX_CONFIG.as_bytes()).expect("the fuzz index config");
    let settings = json!({"sort_fields": ["service", "host"], "time_bucket": "60m"});
    config.indexing_settings.merge_policy = MergePolicyConfig::Locality(
        LocalityConfig::parse(settings.as_object().expect("an object")).expect("locality"),
    );
    config
}

/// The doc mapper of [`index_config`], built once.
pub fn doc_mapper() -> &'static Arc<DocMapper> {
    static MAPPER: OnceLock<Arc<DocMapper>> = OnceLock::new();
    MAPPER.get_or_init(|| {
        Arc::new(DocMapper::for_index(&index_config()).expect("the fuzz doc mapper"))
    })
}

/// Deterministic documents of the representative index, all in one time bucket.
pub fn sample_docs() -> Vec<Value> {
    const T0: i64 = 1_700_000_000 - 1_700_000_000 % 3600;
    (0..12i64)
        .map(|i| {
            let body = ["the quick brown fox", "lazy dog jumps", "error: disk full", "GET /api/v1 200"]
                [(i % 4) as usize];
            let service = ["api", "web", "db"][(i % 3) as usize];
            let client_ip = if i % 2 == 0 {
                format!("10.0.0.{i}")
            } else {
                format!("2001:db8::{i}")
            };
            json!({
                "timestamp": T0 + i * 60,
                "body": body,
                "title": "Running servers",
                "service": service,
                "host": format!("Host-{}", i % 5),
                "tenant_id": i % 4,
                "status": 200 + (i % 4) * 100,
                "latency": i as f64 / 3.0,
                "retries": i % 3,
                "ok": i % 2 == 0,
                "client_ip": client_ip,
                "payload": "aGVsbG8=",
                "trace_id": format!("{i:032x}"),
                "attributes": {"user": {"id": i, "name": format!("user{i}")}, "region": "eu", "ratio": 0.5},
                "labels": ["a", format!("l{i}")],
                "codes": [i, -i],
                "resource": {"region": "eu-west", "zone": i % 3},
                "undeclared": format!("dyn {i}"),
                "nested": {"deep": {"value": i}},
            })
        })
        .collect()
}

/// A split opened from its bundle, and the directory holding the bundle.
pub struct OpenSplit {
    /// The split's index.
    pub index: Index,
    _dir: tempfile::TempDir,
}

/// `docs` indexed by `mapper` into a split, opened.
fn build_split(mapper: &Arc<DocMapper>, docs: &[Value]) -> OpenSplit {
    let dir = tempfile::tempdir().expect("a scratch dir");
    let mut builder = SplitBuilder::new(mapper.clone(), &dir.path().join("scratch"), 30_000_000)
        .expect("builder");
    for doc in docs {
        let parsed = mapper
            .parse_doc(doc.to_string().as_bytes())
            .expect("a sample document parses");
        builder.add(parsed).expect("indexed");
    }
    let split = builder.finish().expect("a split");
    let index = open_split(&split.path).expect("the split opens");
    OpenSplit { index, _dir: dir }
}

/// A split of the representative index.
pub fn split() -> &'static Index {
    static SPLIT: OnceLock<OpenSplit> = OnceLock::new();
    &SPLIT
        .get_or_init(|| build_split(doc_mapper(), &sample_docs()))
        .index
}

/// A split written under [`OLDER_INDEX_CONFIG`], and the current doc mapper bound to its
/// schema (as a leaf searches a split of an older doc mapping version).
pub fn older_split() -> &'static (OpenSplit, DocMapper) {
    static SPLIT: OnceLock<(OpenSplit, DocMapper)> = OnceLock::new();
    SPLIT.get_or_init(|| {
        let config = IndexConfig::parse(OLDER_INDEX_CONFIG.as_bytes()).expect("older config");
        let older = Arc::new(DocMapper::for_index(&config).expect("older doc mapper"));
        let docs: Vec<Value> = sample_docs()
            .into_iter()
            .map(|mut doc| {
                let object = doc.as_object_mut().expect("an object");
                for key in ["tenant_id", "status", "ok", "client_ip"] {
                    let text = object[key].to_string();
                    object.insert(key.to_string(), Value::String(text));
                }
                object.insert("attributes".to_string(), json!("flat text"));
                object.insert("latency".to_string(), json!(3));
                object.insert("old_only".to_string(), json!(7));
                doc
            })
            .collect();
        let split = build_split(&older, &docs);
        let mapper = doc_mapper().with_schema(split.index.schema());
        (split, mapper)
    })
}

/// Runs `query` on `index` as a leaf does: the count with the top hits by score, by the
/// timestamp column and by a raw-text column. Errors are fine; panics are not.
pub fn search(index: &Index, query: &dyn Query) {
    let searcher = index.reader().expect("a reader").searcher();
    let _ = searcher.search(query, &(Count, TopDocs::with_limit(5).order_by_score()));
    let _ = searcher.search(
        query,
        &TopDocs::with_limit(5).order_by_fast_field::<tantivy::DateTime>("timestamp", Order::Desc),
    );
    let _ = searcher.search(
        query,
        &TopDocs::with_limit(3).order_by_string_fast_field("service", Order::Asc),
    );
}

/// Parses `query` (with `search_fields`) and the time bounds as the leaf does, with the
/// current doc mapper and with the older split's, and searches both splits; also derives
/// the tag terms and the sort-key filter the root prunes with. Errors must carry a message.
pub fn check_query(
    query: &str,
    search_fields: Option<&[String]>,
    start: Option<i64>,
    end: Option<i64>,
) {
    let mapper = doc_mapper();
    let _ = mapper.required_tag_terms(query);
    let _ = mapper.sort_key_filter(query);
    let with_time = |mapper: &DocMapper, user: Box<dyn Query>| -> Box<dyn Query> {
        match mapper.time_range_query(start, end) {
            Some(range) => Box::new(BooleanQuery::new(vec![
                (Occur::Must, user),
                (Occur::Must, range),
            ])),
            None => user,
        }
    };
    match mapper.parse_query(query, search_fields) {
        Ok(parsed) => {
            let parsed = with_time(mapper, parsed);
            search(split(), &*parsed);
            let (older_split, older_mapper) = older_split();
            if let Ok(older) = older_mapper.parse_query(query, search_fields) {
                search(&older_split.index, &*with_time(older_mapper, older));
            }
        }
        Err(err) => assert!(!err.to_string().is_empty(), "an error without a message"),
    }
}

/// Parses `aggs` as the leaf does (`shale_search::aggs::parse_aggs`: the depth limit, the
/// normalization, the field checks) for the representative index. With
/// `SHALE_FUZZ_AGGS_COLLECT` set (long runs), what parses is also collected on its split with
/// the node's limits, encoded and decoded as leaf and root exchange it, its heap estimated and
/// rendered: that step reaches Tantivy's collectors, whose panics on inputs `parse_aggs` does
/// not refuse yet are findings for a long run (the leaf contains them: a split search runs on
/// a task of its own), not for the CI smoke. Errors must carry a message; panics fail.
pub fn check_aggs(aggs: &Value) {
    use tantivy::aggregation::DistributedAggregationCollector;
    let parsed = match shale_search::aggs::parse_aggs(doc_mapper(), aggs) {
        Ok(parsed) => parsed,
        Err(message) => {
            assert!(!message.is_empty(), "an error without a message");
            return;
        }
    };
    static COLLECT: OnceLock<bool> = OnceLock::new();
    if !*COLLECT.get_or_init(|| std::env::var_os("SHALE_FUZZ_AGGS_COLLECT").is_some()) {
        return;
    }
    let searcher = split().reader().expect("a reader").searcher();
    let collector = DistributedAggregationCollector::from_aggs(
        parsed.clone(),
        shale_search::aggs::context(),
    );
    let Ok(results) = searcher.search(&tantivy::query::AllQuery, &collector) else {
        return;
    };
    let encoded = shale_search::aggs::encode(&results).expect("results encode");
    let decoded = shale_search::aggs::decode(&encoded).expect("encoded results decode");
    let _ = shale_search::aggs::estimated_bytes_with_rendering(&decoded);
    if let Some(plan) = shale_search::aggs::term_error_plan(&parsed) {
        let _ = shale_search::aggs::term_count_errors(&plan, &decoded);
    }
    if let Err(message) = shale_search::aggs::finalize(parsed, decoded, &Default::default()) {
        assert!(!message.is_empty(), "an error without a message");
    }
}

/// Writes `series` as one metrics split (sort label `job`), reads it back, and checks that
/// every series comes back with exactly its samples: one per timestamp, the last written
/// one, values bit for bit; and that a selector on one metric name returns exactly that
/// metric's series.
pub fn metrics_round_trip(series: &[(shale_metrics::Labels, Vec<shale_metrics::Sample>)]) {
    use std::collections::{BTreeMap, HashMap};

    use shale_metrics::{read_split, Matcher, MetricsSplitWriter};

    let mut expected: HashMap<&shale_metrics::Labels, BTreeMap<i64, u64>> = HashMap::new();
    let mut writer = MetricsSplitWriter::new(vec!["job".to_string()]);
    for (labels, samples) in series {
        writer.add(labels, samples.iter().copied());
        let entry = expected.entry(labels).or_default();
        for sample in samples {
            entry.insert(sample.timestamp_ms, sample.value.to_bits());
        }
    }
    expected.retain(|_, samples| !samples.is_empty());
    let (bytes, summary) = writer.finish().expect("a split of valid series is written");
    assert_eq!(summary.num_series, expected.len() as u64);
    let bytes = bytes::Bytes::from(bytes);
    let read = read_split(bytes.clone(), &[], i64::MIN, i64::MAX).expect("the split reads back");
    assert_eq!(read.series.len(), expected.len(), "every series reads back");
    for found in &read.series {
        let want = expected
            .get(&found.labels)
            .unwrap_or_else(|| panic!("a series that was not written: {:?}", found.labels));
        let got: BTreeMap<i64, u64> = found
            .samples
            .iter()
            .map(|s| (s.timestamp_ms, s.value.to_bits()))
            .collect();
        assert_eq!(got.len(), found.samples.len(), "one sample per timestamp");
        assert_eq!(&got, want, "the samples of {:?}", found.labels);
    }
    if let Some((labels, _)) = series.iter().find(|(labels, samples)| {
        !samples.is_empty() && !labels.metric_name().is_empty()
    }) {
        let name = labels.metric_name();
        let selected = read_split(bytes, &[Matcher::equal("__name__", name)], i64::MIN, i64::MAX)
            .expect("a selector reads");
        let want = expected.keys().filter(|l| l.metric_name() == name).count();
        assert_eq!(selected.series.len(), want, "the series of `{name}`");
    }
}
