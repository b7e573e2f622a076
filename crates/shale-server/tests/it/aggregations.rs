//! Aggregations through the search API: the results merged across splits are exactly those
//! of one Tantivy index holding the same documents (built here, beside the node), for every
//! kind Quickwit documents, nested ones included; Elasticsearch's spellings Grafana sends are
//! accepted; bad aggregation JSON is a 400 naming what is wrong.

use crate::common;

use common::TestNode;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use shale_config::IndexConfig;
use shale_index::DocMapper;
use tantivy::aggregation::AggregationCollector;
use tantivy::TantivyDocument;

const INDEX: &str = r#"
version: 0.8
index_id: web
doc_mapping:
  mode: lenient
  field_mappings:
    - name: timestamp
      type: datetime
      fast: true
      fast_precision: milliseconds
    - name: service
      type: text
      tokenizer: raw
      fast: true
    - name: host
      type: text
      tokenizer: raw
      fast: true
    - name: level
      type: text
      tokenizer: raw
    - name: status
      type: u64
      fast: true
    - name: latency
      type: i64
      fast: true
    - name: bytes
      type: f64
      fast: true
    - name: attributes
      type: json
      tokenizer: raw
      fast: true
  timestamp_field: timestamp
indexing_settings:
  commit_timeout_secs: 1
  merge_policy:
    type: no_merge
search_settings:
  default_search_fields: [level]
"#;

/// 3 hours from this instant (a Monday, 10:00 UTC).
const T0: i64 = 1_700_474_400;

fn docs(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<Value> {
    let services = ["api", "web", "db", "cache", "auth"];
    let regions = ["eu", "us", "ap"];
    (0..n)
        .map(|_| {
            let service = services[rng.random_range(0..services.len())];
            let status = [200u64, 200, 200, 201, 404, 500][rng.random_range(0..6)];
            let mut doc = json!({
                "timestamp": T0 + rng.random_range(0..3 * 3600),
                "service": service,
                "host": format!("host-{}", rng.random_range(0..40)),
                "level": if rng.random_bool(0.1) { "ERROR" } else { "INFO" },
                "status": status,
                "latency": rng.random_range(1..2_000i64),
                // Integer-valued floats: their sums are exact in any order.
                "bytes": f64::from(rng.random_range(0..100_000u32)),
            });
            if rng.random_bool(0.8) {
                doc["attributes"] = json!({
                    "region": regions[rng.random_range(0..regions.len())],
                    "tier": rng.random_range(1..4u64),
                });
            }
            doc
        })
        .collect()
}

/// The aggregations of one in-memory Tantivy index holding `docs`, for `query`.
fn reference(config: &IndexConfig, docs: &[Value], query: &str, aggs: &Value) -> Value {
    let mapper = DocMapper::for_index(config).unwrap();
    let index = tantivy::Index::create_in_ram(mapper.schema().clone());
    let mut writer: tantivy::IndexWriter<TantivyDocument> =
        index.writer_with_num_threads(1, 50_000_000).unwrap();
    for doc in docs {
        let parsed = mapper.parse_doc(doc.to_string().as_bytes()).unwrap();
        writer.add_document(parsed.doc).unwrap();
    }
    writer.commit().unwrap();
    let searcher = index.reader().unwrap().searcher();
    let parsed_aggs = shale_search::aggs::parse_aggs(&mapper, aggs).unwrap();
    let query = mapper.parse_query(query, None).unwrap();
    let collector = AggregationCollector::from_aggs(parsed_aggs, shale_search::aggs::context());
    let results = searcher.search(query.as_ref(), &collector).unwrap();
    serde_json::to_value(results).unwrap()
}

/// Equal JSON; floats that are not integers may differ in their last bit (percentile
/// sketches interpolate the same buckets with operations in another order); counts, keys,
/// sums and everything else must be identical.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x != y => {
            let (Some(x), Some(y)) = (x.as_f64(), y.as_f64()) else {
                return false;
            };
            x.fract() != 0.0 && ((x - y) / y).abs() < 1e-12
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn cases() -> Vec<(&'static str, Value)> {
    vec![
        ("*", json!({"services": {"terms": {"field": "service"}}})),
        (
            "*",
            json!({"services": {"terms": {"field": "service", "size": 3, "order": {"_key": "asc"}},
                "aggs": {"avg_latency": {"avg": {"field": "latency"}}}}}),
        ),
        (
            "*",
            json!({"per_10m": {"date_histogram": {"field": "timestamp", "fixed_interval": "10m",
                "extended_bounds": {"min": (T0 - 3600) * 1000, "max": (T0 + 4 * 3600) * 1000}}}}),
        ),
        (
            "level:ERROR",
            json!({"per_30m": {"date_histogram": {"field": "timestamp", "fixed_interval": "30m",
                "min_doc_count": 1},
                "aggs": {"by_service": {"terms": {"field": "service", "size": 10},
                    "aggs": {"p": {"percentiles": {"field": "latency", "percents": [50, 95, 99]}}}}}}}),
        ),
        (
            "*",
            json!({"latency_histo": {"histogram": {"field": "latency", "interval": 100}}}),
        ),
        (
            "*",
            json!({"status_ranges": {"range": {"field": "status", "ranges": [
                {"to": 300}, {"from": 300, "to": 500}, {"from": 500}]}}}),
        ),
        (
            "*",
            json!({
                "avg": {"avg": {"field": "latency"}},
                "min": {"min": {"field": "latency"}},
                "max": {"max": {"field": "bytes"}},
                "sum": {"sum": {"field": "bytes"}},
                "stats": {"stats": {"field": "latency"}},
                "count": {"value_count": {"field": "status"}},
                "hosts": {"cardinality": {"field": "host"}},
                "pct": {"percentiles": {"field": "latency"}},
                "ext": {"extended_stats": {"field": "status"}},
            }),
        ),
        (
            "service:api OR service:db",
            json!({"regions": {"terms": {"field": "attributes.region"},
                "aggs": {"tiers": {"terms": {"field": "attributes.tier"}},
                         "bytes": {"stats": {"field": "bytes"}}}}}),
        ),
        (
            "*",
            json!({"hosts": {"terms": {"field": "host", "size": 5, "order": {"max_latency": "desc"}},
                "aggs": {"max_latency": {"max": {"field": "latency"}}}}}),
        ),
    ]
}

#[tokio::test]
async fn aggregations_across_splits_equal_one_index() {
    let node = TestNode::start().await;
    node.create_index(INDEX).await;
    let config = IndexConfig::parse(INDEX.as_bytes()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut all = Vec::new();
    for _ in 0..6 {
        let batch = docs(&mut rng, 500);
        let ndjson: String = batch.iter().map(|d| format!("{d}\n")).collect();
        node.ingest("web", &ndjson, "force").await;
        all.extend(batch);
    }
    let probe = node
        .search("web", json!({"query": "*", "max_hits": 0}))
        .await;
    assert_eq!(probe["num_hits"], 3000);
    assert!(probe["num_splits_searched"].as_u64().unwrap() >= 6);
    assert!(probe.get("aggregations").is_none());

    for (query, aggs) in cases() {
        let response = node
            .search(
                "web",
                json!({"query": query, "max_hits": 0, "aggs": aggs.clone()}),
            )
            .await;
        let expected = reference(&config, &all, query, &aggs);
        assert!(
            same(&response["aggregations"], &expected),
            "aggregation {aggs} on `{query}` differs from one index:\n{}\n{expected}",
            response["aggregations"]
        );
    }

    // Hits and aggregations together, and an empty time range: empty buckets, no error.
    let response = node
        .search(
            "web",
            json!({"query": "*", "max_hits": 3, "start_timestamp": 0, "end_timestamp": 10,
                   "aggs": {"s": {"terms": {"field": "service"}}, "a": {"avg": {"field": "latency"}}}}),
        )
        .await;
    assert_eq!(response["num_hits"], 0);
    assert_eq!(response["aggregations"]["s"]["buckets"], json!([]));
    assert_eq!(response["aggregations"]["a"]["value"], Value::Null);
}

#[tokio::test]
async fn elasticsearch_spellings_of_date_histograms() {
    let node = TestNode::start().await;
    node.create_index(INDEX).await;
    let config = IndexConfig::parse(INDEX.as_bytes()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut all = Vec::new();
    for _ in 0..3 {
        let batch = docs(&mut rng, 300);
        let ndjson: String = batch.iter().map(|d| format!("{d}\n")).collect();
        node.ingest("web", &ndjson, "force").await;
        all.extend(batch);
    }
    let node = &node;
    let histogram = |aggs: Value| async move {
        node.search("web", json!({"query": "*", "max_hits": 0, "aggs": aggs}))
            .await["aggregations"]["h"]["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["key"].as_f64().unwrap() as i64,
                    b["doc_count"].as_u64().unwrap(),
                )
            })
            .collect::<Vec<(i64, u64)>>()
    };
    // Grafana: legacy `interval`, `format: epoch_millis`, bounds as strings, `meta`.
    let grafana = histogram(json!({"h": {"date_histogram": {
        "field": "timestamp", "interval": "1h", "min_doc_count": 0, "format": "epoch_millis",
        "extended_bounds": {"min": (T0 * 1000).to_string(), "max": ((T0 + 3 * 3600) * 1000).to_string()}},
        "meta": {"panel": 1}}}))
    .await;
    let plain = histogram(json!({"h": {"date_histogram": {
        "field": "timestamp", "fixed_interval": "1h"}}}))
    .await;
    assert_eq!(&grafana[..3], &plain[..]);
    assert_eq!(grafana.len(), 4, "extended bounds add the empty last hour");
    assert_eq!(grafana[0].0, T0 * 1000);
    assert_eq!(plain.iter().map(|b| b.1).sum::<u64>(), 900);

    // Daily buckets in UTC+02:00 start at 22:00 UTC; the documents (10:00-13:00 UTC) fall
    // in the local day that began at 22:00 UTC the evening before.
    let local = histogram(json!({"h": {"date_histogram": {
        "field": "timestamp", "calendar_interval": "day", "time_zone": "+02:00"}}}))
    .await;
    assert_eq!(local, vec![((T0 - 12 * 3600) * 1000, 900)]);
    // A zone name, as Grafana sends it: Europe/Paris is at +01:00 in November.
    let paris = histogram(json!({"h": {"date_histogram": {
        "field": "timestamp", "fixed_interval": "1d", "time_zone": "Europe/Paris",
        "extended_bounds": {"min": T0 * 1000, "max": (T0 + 3600) * 1000}}}}))
    .await;
    assert_eq!(paris, vec![((T0 - 11 * 3600) * 1000, 900)]);
    // Weeks start on Monday (T0 is a Monday at 10:00).
    let weekly = histogram(json!({"h": {"date_histogram": {
        "field": "timestamp", "calendar_interval": "1w"}}}))
    .await;
    assert_eq!(weekly, vec![((T0 - 10 * 3600) * 1000, 900)]);

    // `aggregations` as the key of sub-aggregations, as Elasticsearch allows.
    let aggs = json!({"h": {"date_histogram": {"field": "timestamp", "fixed_interval": "1h"},
        "aggregations": {"s": {"terms": {"field": "service"}}}}});
    let response = node
        .search("web", json!({"query": "*", "max_hits": 0, "aggs": aggs}))
        .await;
    let expected = reference(
        &config,
        &all,
        "*",
        &json!({"h": {"date_histogram": {"field": "timestamp", "fixed_interval": "1h"},
            "aggs": {"s": {"terms": {"field": "service"}}}}}),
    );
    assert!(same(&response["aggregations"], &expected));
}

#[tokio::test]
async fn bad_aggregations_are_400_naming_the_problem() {
    let node = TestNode::start().await;
    node.create_index(INDEX).await;
    let cases = [
        (json!({"x": {"terms": {"field": "nope"}}}), "`nope`"),
        (
            json!({"x": {"avg": {"field": "level"}}}),
            "not a fast field",
        ),
        (json!({"x": {"bogus": {"field": "status"}}}), "bogus"),
        (
            json!({"x": {"date_histogram": {"field": "timestamp"}}}),
            "fixed_interval",
        ),
        (
            json!({"x": {"date_histogram": {"field": "timestamp", "calendar_interval": "1M"}}}),
            "1M",
        ),
        (
            json!({"x": {"date_histogram": {"field": "timestamp", "fixed_interval": "1h",
                "time_zone": "Mars/Olympus"}}}),
            "Mars/Olympus",
        ),
        (
            json!({"x": {"terms": {"field": "service"}, "avg": {"field": "latency"}}}),
            "exactly one type",
        ),
        (
            json!({"x": {"histogram": {"field": "latency", "interval": 0}}}),
            "interval",
        ),
        (
            json!({"x": {"percentiles": {"field": "latency", "percents": [150]}}}),
            "between 0.0 and 100.0",
        ),
        (json!(["not", "an", "object"]), "object"),
        // Found by the `aggs` fuzz target: Tantivy's range collector panicked on no range.
        (
            json!({"x": {"range": {"field": "latency", "ranges": []}}}),
            "ranges",
        ),
        (json!({"x": {"range": {"field": "latency"}}}), "ranges"),
    ];
    for (aggs, needle) in cases {
        let (status, body) = node
            .post(
                "/api/v1/web/search",
                json!({"query": "*", "aggs": aggs}).to_string(),
            )
            .await;
        assert_eq!(status, 400, "{aggs}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(needle),
            "{aggs}: message `{message}` does not mention {needle}"
        );
    }
}

/// `multi_terms`: one bucket per combination of values, counted exactly (checked against
/// the documents), ordered by count or key, with sub-aggregations and `sum_other_doc_count`.
#[tokio::test]
async fn multi_terms_buckets_are_combinations() {
    let node = TestNode::start().await;
    node.create_index(INDEX).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut all = Vec::new();
    for _ in 0..3 {
        let batch = docs(&mut rng, 200);
        let ndjson: String = batch.iter().map(|d| format!("{d}\n")).collect();
        node.ingest("web", &ndjson, "force").await;
        all.extend(batch);
    }
    let mut expected: std::collections::BTreeMap<(String, u64), (u64, i64)> =
        std::collections::BTreeMap::new();
    for doc in &all {
        let key = (
            doc["service"].as_str().unwrap().to_string(),
            doc["status"].as_u64().unwrap(),
        );
        let entry = expected.entry(key).or_default();
        entry.0 += 1;
        entry.1 = entry.1.max(doc["latency"].as_i64().unwrap());
    }
    let response = node
        .search(
            "web",
            json!({"query": "*", "max_hits": 0, "aggs": {"combo": {"multi_terms": {
                "terms": [{"field": "service"}, {"field": "status"}],
                "order": {"_key": "asc"}, "size": 100},
                "aggs": {"slowest": {"max": {"field": "latency"}}}}}}),
        )
        .await;
    let buckets = response["aggregations"]["combo"]["buckets"]
        .as_array()
        .unwrap_or_else(|| panic!("{response}"));
    let got: Vec<((String, u64), (u64, i64))> = buckets
        .iter()
        .map(|b| {
            (
                (
                    b["key"][0].as_str().unwrap().to_string(),
                    b["key"][1].as_f64().unwrap() as u64,
                ),
                (
                    b["doc_count"].as_u64().unwrap(),
                    b["slowest"]["value"].as_f64().unwrap() as i64,
                ),
            )
        })
        .collect();
    assert_eq!(got, expected.clone().into_iter().collect::<Vec<_>>());
    assert_eq!(
        buckets[0]["key_as_string"],
        format!("{}|{}", got[0].0 .0, got[0].0 .1)
    );
    assert_eq!(response["aggregations"]["combo"]["sum_other_doc_count"], 0);

    // By count (the default), top 3: the largest combinations, the rest counted as other.
    let response = node
        .search(
            "web",
            json!({"query": "*", "max_hits": 0, "aggs": {"combo": {"multi_terms": {
                "terms": [{"field": "service"}, {"field": "status"}], "size": 3}}}}),
        )
        .await;
    let counts: Vec<u64> = response["aggregations"]["combo"]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["doc_count"].as_u64().unwrap())
        .collect();
    let mut all_counts: Vec<u64> = expected.values().map(|v| v.0).collect();
    all_counts.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(counts, all_counts[..3]);
    assert_eq!(
        response["aggregations"]["combo"]["sum_other_doc_count"],
        600 - counts.iter().sum::<u64>()
    );

    // One field is not a combination.
    let status = node
        .client
        .post(node.url("/api/v1/web/search"))
        .json(&json!({"query": "*", "aggs": {"c": {"multi_terms": {"terms": [{"field": "service"}]}}}}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 400);
}

/// `composite` on undeclared fields of a dynamic index: sources name fields as the documents
/// do, pages follow `after_key`, a missing value is a `null` key with `missing_bucket`.
#[tokio::test]
async fn composite_aggregations_on_dynamic_fields() {
    let node = TestNode::start().await;
    node.create_index(
        "version: 0.8\nindex_id: dyn\ndoc_mapping:\n  mode: dynamic\n  field_mappings: []\n",
    )
    .await;
    let docs = [
        json!({"host": "a", "name": "x", "response": 10}),
        json!({"host": "a", "name": "x", "response": 120}),
        json!({"host": "b", "name": "y", "response": 60}),
        json!({"name": "x", "response": 5}),
    ];
    for half in docs.chunks(2) {
        let ndjson: String = half.iter().map(|d| format!("{d}\n")).collect();
        node.ingest("dyn", &ndjson, "force").await;
    }
    let sources = json!([
        {"host": {"terms": {"field": "host", "missing_bucket": true}}},
        {"name": {"terms": {"field": "name"}}},
        {"response": {"histogram": {"field": "response", "interval": 50}}}
    ]);
    let response = node
        .search(
            "dyn",
            json!({"query": "*", "max_hits": 0, "aggs": {"c": {"composite": {"size": 3, "sources": sources}}}}),
        )
        .await;
    let buckets = &response["aggregations"]["c"]["buckets"];
    assert_eq!(
        buckets,
        &json!([
            {"key": {"host": null, "name": "x", "response": 0.0}, "doc_count": 1},
            {"key": {"host": "a", "name": "x", "response": 0.0}, "doc_count": 1},
            {"key": {"host": "a", "name": "x", "response": 100.0}, "doc_count": 1},
        ]),
        "{response}"
    );
    let after = response["aggregations"]["c"]["after_key"].clone();
    assert!(after.is_object(), "{response}");
    let response = node
        .search(
            "dyn",
            json!({"query": "*", "max_hits": 0, "aggs": {"c": {"composite": {"size": 3, "sources": sources, "after": after}}}}),
        )
        .await;
    assert_eq!(
        response["aggregations"]["c"]["buckets"],
        json!([{"key": {"host": "b", "name": "y", "response": 50.0}, "doc_count": 1}]),
        "{response}"
    );
}

/// `doc_count_error_upper_bound` of a `terms` aggregation is Elasticsearch's: per split that
/// returned `split_size` buckets, the count of its last one (a term it cut may have had that
/// many documents), summed over splits; 0 for a split that returned fewer.
#[tokio::test]
async fn terms_count_error_bounds_are_elasticsearchs() {
    let node = TestNode::start().await;
    node.create_index(
        "version: 0.8\nindex_id: names\ndoc_mapping:\n  mode: dynamic\n  field_mappings: []\n",
    )
    .await;
    for names in [
        &["anna", "bert", "carl", "dora", "emil"][..],
        &["emil", "emil", "fred", "gert", "hugo"][..],
    ] {
        let ndjson: String = names
            .iter()
            .map(|n| format!("{}\n", json!({"name": n})))
            .collect();
        node.ingest("names", &ndjson, "force").await;
    }
    let terms = |split_size: u32| {
        json!({"query": "*", "max_hits": 0, "aggs": {"names": {"terms": {
            "field": "name", "size": 1, "split_size": split_size}}}})
    };
    // Each split returns one bucket: 1 (a name of the first split) + 2 (emil) = 3.
    let response = node.search("names", terms(1)).await;
    let names = &response["aggregations"]["names"];
    assert_eq!(names["doc_count_error_upper_bound"], 3, "{response}");
    assert_eq!(names["sum_other_doc_count"], 8, "{response}");
    // The first split returns all its 5 names (as many as split_size: 1 counts), the second
    // its 4 (fewer: 0).
    let response = node.search("names", terms(5)).await;
    let names = &response["aggregations"]["names"];
    assert_eq!(
        names["buckets"],
        json!([{"key": "emil", "doc_count": 3}]),
        "{response}"
    );
    assert_eq!(names["doc_count_error_upper_bound"], 1, "{response}");
    assert_eq!(names["sum_other_doc_count"], 7, "{response}");
    // Every split returns all its terms: no error.
    let response = node.search("names", terms(10)).await;
    assert_eq!(
        response["aggregations"]["names"]["doc_count_error_upper_bound"], 0,
        "{response}"
    );
}
