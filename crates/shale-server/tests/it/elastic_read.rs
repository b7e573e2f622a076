//! Elasticsearch's read API as its clients use it: cluster info, health, mappings and field
//! capabilities, `_cat/indices`, `_resolve/index`, `_search` with the query DSL over index
//! patterns, `_count`, and `_msearch` with the requests Grafana's Elasticsearch data source
//! sends (fixtures in `tests/fixtures/grafana`), checked against the documents ingested.

use crate::common;

use common::{log_docs, TestNode, LOGS_INDEX};
use serde_json::{json, Value};

/// 2023-11-14T22:13:20Z.
const T0: i64 = 1_700_000_000;
const N: usize = 300;

/// The log index with `level` and `host` fast (Grafana aggregates on them).
fn index_config(index_id: &str) -> String {
    LOGS_INDEX
        .replace("index_id: logs", &format!("index_id: {index_id}"))
        .replace(
            "    - name: level\n      type: text\n      tokenizer: raw\n",
            "    - name: level\n      type: text\n      tokenizer: raw\n      fast: true\n",
        )
        .replace(
            "    - name: host\n      type: text\n      tokenizer: raw\n",
            "    - name: host\n      type: text\n      tokenizer: raw\n      fast: true\n",
        )
}

/// A node with `logs-a` holding N docs (one per second from T0, services api/web/db by
/// thirds, three splits), and `logs-b` holding 30 more after them.
async fn node_with_logs() -> TestNode {
    let node = TestNode::start().await;
    node.create_index(&index_config("logs-a")).await;
    node.create_index(&index_config("logs-b")).await;
    for (i, service) in ["api", "web", "db"].into_iter().enumerate() {
        node.ingest("logs-a", &log_docs(i * 100, 100, T0, service), "force")
            .await;
    }
    node.ingest("logs-b", &log_docs(N, 30, T0, "batch"), "force")
        .await;
    node
}

async fn es(
    node: &TestNode,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = node
        .client
        .request(method, node.url(&format!("/api/v1/_elastic{path}")));
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let resp = request.send().await.unwrap();
    let status = resp.status().as_u16();
    assert_eq!(
        resp.headers()
            .get("x-elastic-product")
            .map(|v| v.to_str().unwrap().to_string())
            .as_deref(),
        Some("Elasticsearch"),
        "{path}"
    );
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn search(node: &TestNode, index: &str, body: Value) -> Value {
    let (status, resp) = es(
        node,
        reqwest::Method::POST,
        &format!("/{index}/_search"),
        Some(body.clone()),
    )
    .await;
    assert_eq!(status, 200, "{body}: {resp}");
    resp
}

fn total(resp: &Value) -> u64 {
    assert_eq!(resp["hits"]["total"]["relation"], "eq");
    resp["hits"]["total"]["value"].as_u64().unwrap()
}

/// Posts a Grafana fixture to `_msearch` as Grafana does and returns the responses.
async fn grafana(node: &TestNode, fixture: &str, content_type: Option<&str>) -> Vec<Value> {
    let path = format!(
        "{}/tests/fixtures/grafana/{fixture}",
        env!("CARGO_MANIFEST_DIR")
    );
    let body = std::fs::read_to_string(&path)
        .unwrap()
        .replace("$INDEX", "logs-a")
        .replace("$FROM", &(T0 * 1000).to_string())
        .replace("$TO", &((T0 + N as i64 - 1) * 1000).to_string());
    let mut request =
        node.client.post(node.url(
            "/api/v1/_elastic/_msearch?max_concurrent_shard_requests=5&ignore_throttled=false",
        ));
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    let resp = request.body(body).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{fixture}");
    let body: Value = resp.json().await.unwrap();
    let responses = body["responses"].as_array().unwrap().clone();
    for response in &responses {
        assert_eq!(response["status"], 200, "{fixture}: {response}");
    }
    responses
}

fn buckets(agg: &Value) -> &Vec<Value> {
    agg["buckets"].as_array().unwrap()
}

#[tokio::test]
async fn grafana_data_source_requests() {
    let node = node_with_logs().await;

    // Save & test: version, then the mapping must show the time field as a date.
    let (status, info) = es(&node, reqwest::Method::GET, "/", None).await;
    assert_eq!(status, 200);
    assert_eq!(info["version"]["number"], "7.17.0");
    assert!(!info["cluster_name"].as_str().unwrap().is_empty());
    let (status, mapping) = es(&node, reqwest::Method::GET, "/logs-*/_mapping", None).await;
    assert_eq!(status, 200, "{mapping}");
    assert_eq!(
        mapping["logs-a"]["mappings"]["properties"]["timestamp"]["type"],
        "date"
    );
    assert_eq!(
        mapping["logs-b"]["mappings"]["properties"]["service"]["type"],
        "keyword"
    );
    assert_eq!(
        mapping["logs-a"]["mappings"]["properties"]["message"]["type"],
        "text"
    );
    let (status, health) = es(
        &node,
        reqwest::Method::GET,
        "/_cluster/health?wait_for_status=yellow",
        None,
    )
    .await;
    assert_eq!((status, health["status"].as_str()), (200, Some("green")));

    // A graph split by service: 3 services (key order desc), 100 docs each, per minute.
    let [ts] = grafana(&node, "time_series.ndjson", Some("application/x-ndjson"))
        .await
        .try_into()
        .unwrap();
    assert_eq!(total(&ts), N as u64);
    let services = buckets(&ts["aggregations"]["3"]);
    let keys: Vec<&str> = services
        .iter()
        .map(|b| b["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["web", "db", "api"]);
    for service in services {
        let minutes = buckets(&service["2"]);
        let sum: u64 = minutes
            .iter()
            .map(|b| b["doc_count"].as_u64().unwrap())
            .sum();
        assert_eq!(sum, 100);
        // Grafana reads the bucket key as epoch milliseconds.
        let first = minutes[0]["key"].as_f64().unwrap() as i64;
        assert_eq!(first, (T0 - T0 % 60) * 1000);
    }

    // Two queries in one request, in order.
    let [max, min] = grafana(&node, "metrics_multi.ndjson", None)
        .await
        .try_into()
        .unwrap();
    assert_eq!(buckets(&max["aggregations"]["2"])[1]["1"]["value"], 204.0);
    assert_eq!(buckets(&min["aggregations"]["2"])[1]["1"]["value"], 200.0);

    // Logs: newest first, RFC 3339 timestamps, sort values in ms, a volume histogram.
    let [logs] = grafana(&node, "logs.ndjson", Some("application/json"))
        .await
        .try_into()
        .unwrap();
    let hits = logs["hits"]["hits"].as_array().unwrap();
    assert_eq!(hits.len(), N);
    assert_eq!(hits[0]["_index"], "logs-a");
    assert_eq!(hits[0]["_source"]["timestamp"], "2023-11-14T22:18:19Z");
    assert_eq!(
        hits[0]["fields"]["timestamp"],
        json!(["2023-11-14T22:18:19Z"])
    );
    // The sort values: the timestamp in epoch millis, then the `_doc` tie-break.
    assert_eq!(hits[0]["sort"][0], json!((T0 + 299) * 1000));
    assert_eq!(hits[0]["sort"].as_array().map(Vec::len), Some(2));
    assert!(hits[0]["_id"].as_str().is_some_and(|id| !id.is_empty()));
    let volume: u64 = buckets(&logs["aggregations"]["1"])
        .iter()
        .map(|b| b["doc_count"].as_u64().unwrap())
        .sum();
    assert_eq!(volume, N as u64);
    // Log context: the page after a hit, by its sort values.
    let after = search(
        &node,
        "logs-a",
        json!({"size": 3, "sort": [{"timestamp": {"order": "desc"}}, {"_doc": "desc"}],
               "search_after": hits[9]["sort"]}),
    )
    .await;
    let next: Vec<&Value> = after["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| &h["_source"]["doc_id"])
        .collect();
    let expected: Vec<&Value> = hits[10..13]
        .iter()
        .map(|h| &h["_source"]["doc_id"])
        .collect();
    assert_eq!(next, expected);

    let [raw] = grafana(&node, "raw_data.ndjson", None)
        .await
        .try_into()
        .unwrap();
    assert_eq!(raw["hits"]["hits"].as_array().unwrap().len(), N);

    // Logs volume by level: INFO then ERROR (every tenth document).
    let [levels] = grafana(&node, "logs_volume.ndjson", Some("application/x-ndjson"))
        .await
        .try_into()
        .unwrap();
    let levels = buckets(&levels["aggregations"]["2"]);
    let counts: Vec<(&str, u64)> = levels
        .iter()
        .map(|b| (b["key"].as_str().unwrap(), b["doc_count"].as_u64().unwrap()))
        .collect();
    assert_eq!(counts, [("INFO", 270), ("ERROR", 30)]);

    // Template variable values.
    let [terms] = grafana(&node, "get_terms.ndjson", None)
        .await
        .try_into()
        .unwrap();
    let hosts: Vec<&str> = buckets(&terms["aggregations"]["1"])
        .iter()
        .map(|b| b["key"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, ["host-0", "host-1", "host-2"]);

    // Annotations: the errors of the range.
    let [annotations] = grafana(&node, "annotations.ndjson", None)
        .await
        .try_into()
        .unwrap();
    assert_eq!(total(&annotations), 30);
    assert_eq!(annotations["hits"]["hits"].as_array().unwrap().len(), 30);
}

#[tokio::test]
async fn query_dsl_matches_the_query_language() {
    let node = node_with_logs().await;
    // Each DSL query against its Quickwit query-language twin on the same index.
    let cases = [
        (json!({"match_all": {}}), "*"),
        (json!({"term": {"service": "web"}}), "service:web"),
        (json!({"term": {"status": {"value": 203}}}), "status:203"),
        (
            json!({"terms": {"service": ["web", "db"]}}),
            "service:IN [web db]",
        ),
        (
            json!({"match": {"message": "request handled"}}),
            "message:request OR message:handled",
        ),
        (
            json!({"match": {"message": {"query": "web fox", "operator": "and"}}}),
            "message:web AND message:fox",
        ),
        (
            json!({"match_phrase": {"message": "by api quick"}}),
            "message:\"by api quick\"",
        ),
        (
            json!({"range": {"status": {"gte": 202, "lt": 204}}}),
            "status:[202 TO 204}",
        ),
        (
            json!({"range": {"timestamp": {"gte": (T0 + 10) * 1000, "lt": "2023-11-14T22:14:00Z"}}}),
            "timestamp:[2023-11-14T22:13:30Z TO 2023-11-14T22:14:00Z}",
        ),
        (json!({"exists": {"field": "status"}}), "*"),
        (
            json!({"bool": {"must": [{"term": {"level": "ERROR"}}],
                            "must_not": {"term": {"service": "db"}},
                            "should": [{"term": {"host": "host-0"}}]}}),
            "level:ERROR AND NOT service:db",
        ),
        (
            json!({"bool": {"should": [{"term": {"host": "host-0"}}, {"term": {"host": "host-1"}}]}}),
            "host:host-0 OR host:host-1",
        ),
        (
            json!({"bool": {"filter": [{"term": {"level": "ERROR"}}],
                            "should": [{"term": {"host": "host-0"}}, {"term": {"service": "api"}}],
                            "minimum_should_match": 1}}),
            "level:ERROR AND (host:host-0 OR service:api)",
        ),
        (json!({"prefix": {"doc_id": "web-1"}}), "service:web"),
        (
            json!({"wildcard": {"doc_id": "db-2?0"}}),
            "doc_id:IN [db-200 db-210 db-220 db-230 db-240 db-250 db-260 db-270 db-280 db-290]",
        ),
        (
            json!({"regexp": {"doc_id": "api-[0-9]"}}),
            "doc_id:IN [api-0 api-1 api-2 api-3 api-4 api-5 api-6 api-7 api-8 api-9]",
        ),
        (
            json!({"query_string": {"query": "level:ERROR AND service:api", "analyze_wildcard": true, "lenient": true}}),
            "level:ERROR AND service:api",
        ),
        (
            json!({"multi_match": {"query": "api", "fields": ["service", "message"]}}),
            "service:api OR message:api",
        ),
        (json!({"match_none": {}}), "NOT *"),
    ];
    for (dsl, twin) in cases {
        let resp = search(&node, "logs-a", json!({"query": dsl, "size": 0})).await;
        let expected = node.count("logs-a", twin).await;
        assert_eq!(total(&resp), expected, "{dsl} vs `{twin}`");
    }
    assert_eq!(
        node.count("logs-a", "message:request OR message:handled")
            .await,
        N as u64
    );

    // `q` in the URL, `size`/`from`, sort ascending by a field, `_source` filtering.
    let (status, resp) = es(
        &node,
        reqwest::Method::GET,
        "/logs-a/_search?q=service:db&size=2&from=1&sort=timestamp:asc&_source_includes=doc_id",
        None,
    )
    .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(total(&resp), 100);
    let docs: Vec<&Value> = resp["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| &h["_source"])
        .collect();
    assert_eq!(
        docs,
        [&json!({"doc_id": "db-201"}), &json!({"doc_id": "db-202"})]
    );

    // _count.
    let (status, count) = es(
        &node,
        reqwest::Method::POST,
        "/logs-a/_count",
        Some(json!({"query": {"term": {"level": "ERROR"}}})),
    )
    .await;
    assert_eq!((status, count["count"].as_u64()), (200, Some(30)));
}

#[tokio::test]
async fn index_patterns_and_errors() {
    let node = node_with_logs().await;
    // Patterns: both indexes, merged by sort value; exclusions; comma lists; all.
    let resp = search(
        &node,
        "logs-*",
        json!({"size": 5, "sort": [{"timestamp": "desc"}],
               "aggs": {"services": {"terms": {"field": "service", "order": {"_key": "asc"}}}}}),
    )
    .await;
    assert_eq!(total(&resp), (N + 30) as u64);
    let first = &resp["hits"]["hits"][0];
    assert_eq!(first["_index"], "logs-b");
    assert_eq!(first["_source"]["doc_id"], "batch-329");
    let services: Vec<(&str, u64)> = buckets(&resp["aggregations"]["services"])
        .iter()
        .map(|b| (b["key"].as_str().unwrap(), b["doc_count"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        services,
        [("api", 100), ("batch", 30), ("db", 100), ("web", 100)]
    );
    assert_eq!(
        total(&search(&node, "logs-*,-logs-b", json!({"size": 0})).await),
        N as u64
    );
    assert_eq!(
        total(&search(&node, "logs-b,logs-a", json!({"size": 0})).await),
        (N + 30) as u64
    );
    assert_eq!(
        total(&search(&node, "_all", json!({"size": 0})).await),
        (N + 30) as u64
    );
    let (status, all) = es(
        &node,
        reqwest::Method::POST,
        "/_search",
        Some(json!({"size": 0})),
    )
    .await;
    assert_eq!((status, total(&all)), (200, (N + 30) as u64));
    // A pattern matching nothing is an empty result; a missing named index a 404 unless
    // ignore_unavailable.
    assert_eq!(total(&search(&node, "nothing-*", json!({})).await), 0);
    let (status, err) = es(
        &node,
        reqwest::Method::POST,
        "/nope/_search",
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(err["error"]["type"], "index_not_found_exception");
    assert_eq!(err["status"], 404);
    let (status, _) = es(
        &node,
        reqwest::Method::POST,
        "/nope,logs-a/_search?ignore_unavailable=true",
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 200);

    // Bad requests are 400s in Elasticsearch's shape.
    for body in [
        json!({"query": {"fuzzy": {"service": "x"}}}),
        json!({"query": {"term": {"status": "abc"}}}),
        json!({"from": 9_995, "size": 10}),
        json!({"sort": [{"message": "asc"}]}),
        json!({"aggs": {"x": {"avg": {"field": "message"}}}}),
        json!({"query": {"match": {"message": "x"}, "term": {"level": "y"}}}),
    ] {
        let (status, err) = es(
            &node,
            reqwest::Method::POST,
            "/logs-a/_search",
            Some(body.clone()),
        )
        .await;
        assert_eq!(status, 400, "{body}: {err}");
        assert!(
            err["error"]["reason"]
                .as_str()
                .is_some_and(|r| !r.is_empty()),
            "{err}"
        );
    }
    // In _msearch a failing search has its own status; the others still answer.
    let body = format!(
        "{}\n{}\n{}\n{}\n",
        json!({"index": "nope"}),
        json!({"size": 0}),
        json!({"index": "logs-b"}),
        json!({"size": 0})
    );
    let resp: Value = node
        .client
        .post(node.url("/api/v1/_elastic/_msearch"))
        .body(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(resp["responses"][0]["status"], 404);
    assert_eq!(resp["responses"][1]["status"], 200);
    assert_eq!(resp["responses"][1]["hits"]["total"]["value"], 30);

    // Index listing endpoints.
    let (status, cat) = es(
        &node,
        reqwest::Method::GET,
        "/_cat/indices?format=json",
        None,
    )
    .await;
    assert_eq!(status, 200);
    let rows = cat.as_array().unwrap();
    // The OpenTelemetry indexes every node creates at start are listed too (as Quickwit's).
    assert_eq!(rows.len(), 4, "{cat}");
    assert_eq!(rows[0]["index"], "logs-a");
    assert_eq!(rows[0]["docs.count"], "300");
    assert_eq!(rows[1]["docs.count"], "30");
    assert_eq!(rows[0]["health"], "green");
    assert_eq!(rows[2]["index"], "otel-logs-v0_9");
    assert_eq!(rows[2]["docs.count"], "0");
    assert_eq!(rows[3]["index"], "otel-traces-v0_9");
    let (_, cat) = es(
        &node,
        reqwest::Method::GET,
        "/_cat/indices/logs-b?format=json&h=index,docs.count",
        None,
    )
    .await;
    assert_eq!(cat, json!([{"index": "logs-b", "docs.count": "30"}]));
    // JSON only, as in Quickwit: no text table, no `v` or `bytes`.
    for path in [
        "/_cat/indices/logs-b",
        "/_cat/indices?format=txt",
        "/_cat/indices?format=json&v=true",
        "/_cat/indices?format=json&bytes=b",
        "/_cat/indices?format=json&s=docs.count",
        "/_cat/indices?format=json&b=b",
    ] {
        let (status, err) = es(&node, reqwest::Method::GET, path, None).await;
        assert_eq!(status, 400, "{path}: {err}");
        assert_eq!(err["error"]["type"], "illegal_argument_exception", "{err}");
    }
    let (status, _) = es(
        &node,
        reqwest::Method::GET,
        "/_cat/indices?format=json&s=index",
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, resolved) = es(&node, reqwest::Method::GET, "/_resolve/index/logs-*", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        resolved,
        json!({"indices": [{"name": "logs-a", "attributes": ["open"]}, {"name": "logs-b", "attributes": ["open"]}],
               "aliases": [], "data_streams": []})
    );
    let (status, caps) = es(
        &node,
        reqwest::Method::GET,
        "/logs-*/_field_caps?fields=*",
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(caps["indices"], json!(["logs-a", "logs-b"]));
    assert_eq!(
        caps["fields"]["timestamp"]["date_nanos"]["aggregatable"],
        true
    );
    assert_eq!(caps["fields"]["status"]["long"]["searchable"], true);
    assert_eq!(caps["fields"]["message"]["text"]["aggregatable"], false);
    assert_eq!(caps["fields"]["service"]["keyword"]["type"], "keyword");
    let (status, _) = es(&node, reqwest::Method::GET, "/nope/_field_caps", None).await;
    assert_eq!(status, 404);
}
