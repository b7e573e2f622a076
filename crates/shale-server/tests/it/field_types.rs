//! Field types and text analysis as Quickwit defines them: `json` fields and dynamic mode
//! (search, sort and aggregate on their sub-fields), `bytes` (base64 or hex), `ip` (exact,
//! range and CIDR queries, IPv4 and IPv6), datetime `output_format`, `fieldnorms`, built-in
//! and custom tokenizers; configs using them the way Quickwit's tutorial configs do are
//! accepted; what is wrong in a config is a 400 naming the field.

use crate::common;

use common::TestNode;
use serde_json::{json, Value};

const TYPES_INDEX: &str = r#"
version: 0.8
index_id: types
doc_mapping:
  mode: dynamic
  tokenizers:
    - name: prefixes
      type: ngram
      min_gram: 2
      max_gram: 5
      prefix_only: true
      filters: [lower_caser]
    - name: words_folded
      type: simple
      filters: [remove_long, lower_caser, ascii_folding]
  field_mappings:
    - name: ts
      type: datetime
      fast: true
      input_formats: ["%Y-%m-%d %H:%M:%S", unix_timestamp]
      output_format: unix_timestamp_millis
      fast_precision: milliseconds
    - name: title
      type: text
      tokenizer: prefixes
      record: position
    - name: body
      type: text
      tokenizer: en_stem
      record: position
      fieldnorms: true
    - name: city
      type: text
      tokenizer: words_folded
    - name: attributes
      type: json
      tokenizer: raw
      fast: true
    - name: trace_id
      type: bytes
      fast: true
    - name: digest
      type: bytes
      input_format: hex
      output_format: hex
    - name: client_ip
      type: array<ip>
      fast: true
    - name: events
      type: array<json>
      tokenizer: raw
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 1
"#;

fn docs() -> Vec<Value> {
    vec![
        json!({"ts": "2024-01-02 03:04:05", "title": "Quickwit", "body": "running dogs",
               "city": "Zürich", "attributes": {"user": "bob", "latency": 120, "region": "eu"},
               "trace_id": "AAECAwQFBgcICQoLDA0ODw==", "digest": "deadbeef",
               "client_ip": "10.1.2.3", "events": [{"name": "start"}, {"name": "stop"}],
               "service": "api", "latency_ms": 5}),
        json!({"ts": 1704164646, "title": "Tantivy", "body": "a dog ran",
               "city": "Zurich", "attributes": {"user": "alice", "latency": 80, "region": "us"},
               "trace_id": "AQEBAQ==", "client_ip": ["10.2.0.1", "192.168.0.7"],
               "service": "web", "latency_ms": 50}),
        json!({"ts": 1704164647, "title": "Elastic", "body": "cats sleep",
               "city": "Geneva", "attributes": {"user": "carol", "latency": 300, "region": "eu"},
               "client_ip": "2001:db8::1", "service": "api", "latency_ms": 7}),
    ]
}

async fn hits(node: &TestNode, request: Value) -> Vec<Value> {
    node.search("types", request).await["hits"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test]
async fn json_bytes_ip_dates_and_tokenizers() {
    let node = TestNode::start().await;
    node.create_index(TYPES_INDEX).await;
    let ndjson: String = docs().iter().map(|d| format!("{d}\n")).collect();
    let ingested = node.ingest("types", &ndjson, "force").await;
    assert_eq!(ingested["num_ingested_docs"], 3, "{ingested}");

    let count = |q: &'static str| {
        let node = &node;
        async move { node.count("types", q).await }
    };
    // json fields: the same query syntax inside them.
    assert_eq!(count("attributes.user:bob").await, 1);
    assert_eq!(count("attributes.region:eu").await, 2);
    assert_eq!(count("attributes.latency:[100 TO 400]").await, 2);
    assert_eq!(count("events.name:stop").await, 1);
    // Dynamic mode: undeclared fields are searchable by their names.
    assert_eq!(count("service:api").await, 2);
    assert_eq!(count("latency_ms:>=7").await, 2);
    // Sorting on fast json sub-fields and dynamic fields.
    let by_latency = hits(
        &node,
        json!({"query": "*", "sort_by": "-attributes.latency"}),
    )
    .await;
    let users: Vec<&str> = by_latency
        .iter()
        .map(|h| h["attributes"]["user"].as_str().unwrap())
        .collect();
    assert_eq!(users, ["alice", "bob", "carol"]);
    let by_dynamic = hits(&node, json!({"query": "*", "sort_by": "latency_ms"})).await;
    assert_eq!(by_dynamic[0]["latency_ms"], 50);
    // Aggregations on them.
    let aggs = node
        .search(
            "types",
            json!({"query": "*", "max_hits": 0, "aggs": {
                "regions": {"terms": {"field": "attributes.region", "order": {"_key": "asc"}}},
                "services": {"terms": {"field": "service", "order": {"_key": "asc"}}},
                "latency": {"max": {"field": "attributes.latency"}}}}),
        )
        .await["aggregations"]
        .clone();
    let keys = |name: &str| -> Vec<(String, u64)> {
        aggs[name]["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["key"].as_str().unwrap().to_string(),
                    b["doc_count"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(
        keys("regions"),
        [("eu".to_string(), 2), ("us".to_string(), 1)]
    );
    assert_eq!(
        keys("services"),
        [("api".to_string(), 2), ("web".to_string(), 1)]
    );
    assert_eq!(aggs["latency"]["value"], 300.0);

    // bytes: base64 in queries and hits; hex when configured.
    assert_eq!(count("trace_id:AAECAwQFBgcICQoLDA0ODw==").await, 1);
    // Query values as Quickwit reads them: hex first, base64 with or without padding, `!`
    // forcing base64; sets too.
    assert_eq!(count("trace_id:000102030405060708090a0b0c0d0e0f").await, 1);
    assert_eq!(count("trace_id:AAECAwQFBgcICQoLDA0ODw").await, 1);
    assert_eq!(count("trace_id:01010101").await, 1);
    assert_eq!(count("trace_id:!AQEBAQ").await, 1);
    assert_eq!(
        count("trace_id:IN [000102030405060708090a0b0c0d0e0f AQEBAQ==]").await,
        2
    );
    assert_eq!(count("digest:deadbeef").await, 1);
    let first = &hits(&node, json!({"query": "attributes.user:bob"})).await[0];
    assert_eq!(first["trace_id"], "AAECAwQFBgcICQoLDA0ODw==");
    assert_eq!(first["digest"], "deadbeef");
    // `array<T>` fields come back as arrays, even with a single value (as in Quickwit).
    assert_eq!(first["client_ip"], json!(["10.1.2.3"]));
    assert_eq!(
        first["events"],
        json!([{"name": "start"}, {"name": "stop"}])
    );
    assert_eq!(first["title"], "Quickwit");
    // Datetime output format: epoch milliseconds, as configured.
    assert_eq!(first["ts"], 1_704_164_645_000i64);

    // ip: exact, CIDR, range, IPv6.
    assert_eq!(count("client_ip:10.1.2.3").await, 1);
    assert_eq!(count("client_ip:10.0.0.0/8").await, 2);
    assert_eq!(count("client_ip:192.168.0.0/16").await, 1);
    assert_eq!(count("client_ip:[10.1.0.0 TO 10.1.255.255]").await, 1);
    assert_eq!(count("client_ip:\"2001:db8::/32\"").await, 1);
    assert_eq!(count("client_ip:\"2001:db8::1\"").await, 1);

    // Tokenizers: English stemming, ASCII folding, n-gram prefixes.
    assert_eq!(count("body:run").await, 1);
    assert_eq!(count("body:dog").await, 2);
    assert_eq!(count("city:zurich").await, 2);
    assert_eq!(count("title:qu").await, 1);
    assert_eq!(count("title:tant").await, 1);
    assert_eq!(count("title:wit").await, 0);

    // Bad values are reported per document, naming the field.
    let (status, body) = node
        .post(
            "/api/v1/types/ingest?commit=force",
            "{\"ts\": 1704164648, \"trace_id\": \"not base64!\"}\n{\"ts\": 1704164649, \"client_ip\": \"300.1.1.1\"}\n",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["num_rejected_docs"], 2, "{body}");
    let failures = body["parse_failures"].to_string();
    assert!(
        failures.contains("trace_id") && failures.contains("client_ip"),
        "{failures}"
    );
}

#[tokio::test]
async fn tutorial_style_configs_are_accepted_and_bad_ones_named() {
    let node = TestNode::start().await;
    // Traces, as Quickwit's OpenTelemetry tutorial maps them: bytes ids, json attributes,
    // array<json> events, seconds output, partitioned by service.
    let traces = r#"
version: 0.8
index_id: traces
doc_mapping:
  mode: lenient
  field_mappings:
    - {name: trace_id, type: bytes}
    - {name: service_name, type: text, tokenizer: raw}
    - {name: span_start_timestamp_secs, type: datetime, indexed: true, fast: true,
       fast_precision: seconds, input_formats: [unix_timestamp], output_format: unix_timestamp_secs}
    - {name: span_attributes, type: json, tokenizer: raw}
    - {name: span_status, type: json, indexed: false}
    - {name: events, type: array<json>, tokenizer: raw}
  timestamp_field: span_start_timestamp_secs
  partition_key: service_name
  max_num_partitions: 100
search_settings:
  default_search_fields: []
"#;
    node.create_index(traces).await;
    node.ingest(
        "traces",
        &format!(
            "{}\n",
            json!({"trace_id": "AAECAwQFBgcICQoLDA0ODw==", "service_name": "api",
                   "span_start_timestamp_secs": 1_700_000_000, "span_attributes": {"http.method": "GET"},
                   "span_status": {"code": 1}, "events": [{"name": "e"}]})
        ),
        "force",
    )
    .await;
    let hit = &node
        .search(
            "traces",
            json!({"query": "span_attributes.http.method:GET"}),
        )
        .await["hits"][0];
    assert_eq!(hit["span_start_timestamp_secs"], 1_700_000_000);
    assert_eq!(hit["trace_id"], "AAECAwQFBgcICQoLDA0ODw==");
    // Wikipedia-style text with field norms, and a multilingual tokenizer.
    let wiki = r#"
version: 0.8
index_id: wiki
doc_mapping:
  tokenizers:
    - {name: multilang, type: multilang}
  field_mappings:
    - {name: title, type: text, tokenizer: multilang, record: position, stored: true, fieldnorms: true}
    - {name: body, type: text, tokenizer: multilang, record: position, stored: true, fieldnorms: true}
    - {name: url, type: text, tokenizer: raw}
search_settings:
  default_search_fields: [title, body]
"#;
    node.create_index(wiki).await;
    node.ingest(
        "wiki",
        "{\"title\": \"Grande roue\", \"body\": \"La grande roue de Paris\", \"url\": \"a\"}\n\
         {\"title\": \"北京\", \"body\": \"我爱北京天安门\", \"url\": \"b\"}\n",
        "force",
    )
    .await;
    assert_eq!(node.count("wiki", "roue").await, 1);
    assert_eq!(node.count("wiki", "body:北京").await, 1);
    assert_eq!(node.count("wiki", "天安门").await, 1);

    // Config errors name the field.
    for (yaml, needle) in [
        (
            "index_id: bad1\ndoc_mapping:\n  field_mappings:\n    - {name: t, type: text, tokenizer: nope}\n",
            "unknown tokenizer `nope`",
        ),
        (
            "index_id: bad2\ndoc_mapping:\n  field_mappings:\n    - {name: t, type: text}\n  tag_fields: [t]\n",
            "tag_fields[0]",
        ),
        (
            "index_id: bad3\ndoc_mapping:\n  field_mappings:\n    - {name: d, type: datetime, output_format: weird}\n",
            "output_format",
        ),
        (
            "index_id: bad4\ndoc_mapping:\n  tokenizers:\n    - {name: g, type: ngram, min_gram: 3, max_gram: 2}\n",
            "tokenizers[0]",
        ),
        (
            "index_id: bad5\ndoc_mapping:\n  tokenizers:\n    - {name: r, type: regex, pattern: \"(\"}\n",
            "tokenizers",
        ),
        (
            "index_id: bad6\ndoc_mapping:\n  field_mappings:\n    - {name: b, type: bytes, input_format: base32}\n",
            "field_mappings[0]",
        ),
    ] {
        let (status, body) = node.post("/api/v1/indexes", yaml.to_string()).await;
        assert_eq!(status, 400, "{yaml}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{yaml}: `{message}` lacks {needle}");
    }
}

#[tokio::test]
async fn object_fields() {
    let node = TestNode::start().await;
    node.create_index(
        r#"
version: 0.8
index_id: objects
doc_mapping:
  mode: strict
  field_mappings:
    - {name: ts, type: datetime, fast: true}
    - name: resource
      type: object
      field_mappings:
        - {name: service, type: text, tokenizer: raw, fast: true}
        - {name: latency, type: u64, fast: true}
        - name: host
          type: object
          field_mappings:
            - {name: name, type: text, tokenizer: raw}
    - name: spans
      type: array<object>
      field_mappings:
        - {name: op, type: text, tokenizer: raw}
  timestamp_field: ts
  tag_fields: [resource.service]
"#,
    )
    .await;
    let docs = [
        json!({"ts": 1_700_000_000, "resource": {"service": "api", "latency": 12, "host": {"name": "h1"}},
               "spans": [{"op": "read"}, {"op": "write"}]}),
        json!({"ts": 1_700_000_001, "resource.service": "web", "resource": {"latency": 40}}),
        json!({"ts": 1_700_000_002, "resource": {"service": "api", "latency": 3}}),
    ];
    let ndjson: String = docs.iter().map(|d| format!("{d}\n")).collect();
    let ingested = node.ingest("objects", &ndjson, "force").await;
    assert_eq!(ingested["num_ingested_docs"], 3, "{ingested}");
    assert_eq!(node.count("objects", "resource.service:api").await, 2);
    assert_eq!(node.count("objects", "resource.service:web").await, 1);
    assert_eq!(node.count("objects", "resource.host.name:h1").await, 1);
    assert_eq!(node.count("objects", "spans.op:write").await, 1);
    assert_eq!(node.count("objects", "resource.latency:>10").await, 2);
    // Hits come back nested, as they were sent.
    let hits = node
        .search(
            "objects",
            json!({"query": "*", "sort_by": "-resource.latency"}),
        )
        .await["hits"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        hits[0],
        json!({"ts": "2023-11-14T22:13:22Z", "resource": {"service": "api", "latency": 3}})
    );
    assert_eq!(hits[1]["resource"]["host"]["name"], "h1");
    assert_eq!(hits[1]["spans"]["op"], json!(["read", "write"]));
    // A tag inside an object prunes splits.
    let resp = node
        .search("objects", json!({"query": "resource.service:nope"}))
        .await;
    assert_eq!(resp["num_splits_pruned"], 1, "{resp}");
    // Strict mode: an undeclared key inside an object is refused, naming its path.
    let (_, body) = node
        .post(
            "/api/v1/objects/ingest",
            "{\"ts\": 1700000003, \"resource\": {\"nope\": 1}}\n",
        )
        .await;
    assert_eq!(body["num_rejected_docs"], 1, "{body}");
    assert!(body.to_string().contains("resource.nope"), "{body}");
    // An empty object is a config error.
    let (status, body) = node
        .post(
            "/api/v1/indexes",
            "index_id: bad-object\ndoc_mapping:\n  field_mappings:\n    - {name: o, type: object, field_mappings: []}\n",
        )
        .await;
    assert_eq!(status, 400, "{body}");
}
