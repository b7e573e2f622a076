//! More of the Elasticsearch API under `/api/v1/_elastic`: scroll (`scroll=` then
//! `_search/scroll`), `_stats`, `DELETE {indexes}`, Quickwit's `extra_filters`, `q` over a
//! body query, `zero_terms_query`, and `prefix`/`wildcard`/`regexp` on undeclared fields.

use crate::common;

use common::TestNode;
use serde_json::{json, Value};

async fn es(node: &TestNode, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
    let resp = node
        .client
        .request(method, node.url(&format!("/api/v1/_elastic/{path}")))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn total(resp: &Value) -> u64 {
    resp["hits"]["total"]["value"].as_u64().unwrap_or(u64::MAX)
}

#[tokio::test]
async fn scroll_stats_delete_and_query_forms() {
    let node = TestNode::start().await;
    for id in ["events", "events-b"] {
        node.create_index(&format!(
            "index_id: {id}\ndoc_mapping:\n  mode: dynamic\n  dynamic_mapping:\n    tokenizer: raw\n  field_mappings:\n    - name: n\n      type: u64\n      fast: true\n    - name: title\n      type: text\n"
        ))
        .await;
    }
    let docs: Vec<String> = (0..25)
        .map(|i| {
            json!({"n": i, "type": if i % 5 == 0 { "PushEvent" } else { "WatchEvent" },
                   "login": format!("user{i}"), "title": "hello world"})
            .to_string()
        })
        .collect();
    node.ingest("events", &docs[..15].join("\n"), "force").await;
    node.ingest("events", &docs[15..].join("\n"), "force").await;
    node.ingest("events-b", &docs[..3].join("\n"), "force")
        .await;
    let post = reqwest::Method::POST;

    // Scroll: pages of 10 sorted by n, then an empty page; the total every time.
    let (status, first) = es(
        &node,
        post.clone(),
        "events/_search?scroll=1m&size=10",
        json!({"sort": [{"n": "asc"}], "aggs": {"t": {"terms": {"field": "type"}}}}),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["aggregations"]["t"]["buckets"][0]["doc_count"], 20);
    let mut seen: Vec<u64> = first["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["_source"]["n"].as_u64().unwrap())
        .collect();
    let mut id = first["_scroll_id"].as_str().unwrap().to_string();
    for expected in [10, 5, 0] {
        let (status, page) = es(
            &node,
            post.clone(),
            "_search/scroll",
            json!({"scroll": "1m", "scroll_id": id}),
        )
        .await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(total(&page), 25);
        let hits = page["hits"]["hits"].as_array().unwrap();
        assert_eq!(hits.len(), expected, "{page}");
        seen.extend(hits.iter().map(|h| h["_source"]["n"].as_u64().unwrap()));
        id = page["_scroll_id"].as_str().unwrap().to_string();
    }
    assert_eq!(
        seen,
        (0..25).collect::<Vec<u64>>(),
        "every document once, in order"
    );
    let (status, body) = es(
        &node,
        post.clone(),
        "_search/scroll",
        json!({"scroll_id": "garbage"}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["type"], "search_context_missing_exception");
    let (status, body) = es(&node, post.clone(), "events/_search?scroll=31m", json!({})).await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["reason"]
            .as_str()
            .unwrap()
            .contains("1800 secs"),
        "{body}"
    );
    let (status, _) = es(
        &node,
        post.clone(),
        "events/_search?scroll=1m&allow_partial_search_results=false",
        json!({}),
    )
    .await;
    assert_eq!(status, 400);

    // _stats: per index and for all; segments are splits.
    let (status, stats) = es(&node, reqwest::Method::GET, "events*/_stats", json!({})).await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["indices"]["events"]["primaries"]["docs"]["count"], 25);
    assert_eq!(stats["indices"]["events"]["total"]["segments"]["count"], 2);
    assert_eq!(stats["_all"]["total"]["docs"]["count"], 28);
    assert!(
        stats["_all"]["primaries"]["store"]["size_in_bytes"]
            .as_u64()
            .unwrap()
            > 0
    );

    // extra_filters, q over the body, zero_terms_query.
    let (_, resp) = es(
        &node,
        post.clone(),
        "events/_search?extra_filters=type:PushEvent,n:>4",
        json!({"query": {"match_all": {}}}),
    )
    .await;
    assert_eq!(total(&resp), 4, "{resp}");
    let (_, resp) = es(
        &node,
        post.clone(),
        "events/_search?q=type:PushEvent",
        json!({"query": {"term": {"type": "nothing"}}}),
    )
    .await;
    assert_eq!(total(&resp), 5, "{resp}");
    let (_, resp) = es(
        &node,
        post.clone(),
        "events/_search",
        json!({"query": {"match": {"title": {"query": ", ", "zero_terms_query": "all"}}}}),
    )
    .await;
    assert_eq!(total(&resp), 25, "{resp}");

    // prefix, wildcard and regexp on an undeclared field.
    for (query, expected) in [
        (json!({"prefix": {"login": {"value": "user1"}}}), 11),
        (json!({"wildcard": {"login": {"value": "user?"}}}), 10),
        (json!({"regexp": {"type": {"value": "Push.*"}}}), 5),
    ] {
        let (status, resp) = es(
            &node,
            post.clone(),
            "events/_search",
            json!({"query": query}),
        )
        .await;
        assert_eq!(status, 200, "{query}: {resp}");
        assert_eq!(total(&resp), expected, "{query}");
    }
    // minimum_should_match: k of n should clauses; more than there are matches nothing.
    for (minimum, expected) in [(json!(1), 6), (json!(2), 1), (json!(3), 0), (json!(-10), 6)] {
        let (_, resp) = es(
            &node,
            post.clone(),
            "events/_search",
            json!({"query": {"bool": {"should": [
                {"term": {"type": "PushEvent"}}, {"term": {"login": "user5"}}, {"term": {"n": 1}}
            ], "minimum_should_match": minimum}}}),
        )
        .await;
        assert_eq!(
            total(&resp),
            expected,
            "minimum_should_match {minimum}: {resp}"
        );
    }
    // Terms are exact; `case_insensitive` relaxes case; `analyzer: raw` takes the text whole.
    for (query, expected) in [
        (json!({"term": {"type": "pushevent"}}), 0),
        (
            json!({"term": {"type": {"value": "pushevent", "case_insensitive": true}}}),
            5,
        ),
        (
            json!({"match_phrase_prefix": {"title": {"query": "hello wor", "analyzer": "raw"}}}),
            0,
        ),
        (
            json!({"match_phrase_prefix": {"title": {"query": "hello wor"}}}),
            25,
        ),
        (
            json!({"match_bool_prefix": {"title": {"query": "nothing wor"}}}),
            25,
        ),
    ] {
        let (status, resp) = es(
            &node,
            post.clone(),
            "events/_search",
            json!({"query": query}),
        )
        .await;
        assert_eq!(status, 200, "{query}: {resp}");
        assert_eq!(total(&resp), expected, "{query}");
    }
    let (status, _) = es(
        &node,
        post.clone(),
        "events/_search",
        json!({"query": {"match_phrase_prefix": {"title": {"query": "hel", "analyzer": "nope"}}}}),
    )
    .await;
    assert_eq!(status, 400, "unknown analyzer");
    let (status, _) = es(
        &node,
        post.clone(),
        "events/_search",
        json!({"query": {"query_string": {"query": "PushEvent", "fields": "type"}}}),
    )
    .await;
    assert_eq!(status, 400, "`fields` must be an array");

    // DELETE: all or nothing without ignore_unavailable.
    let delete = reqwest::Method::DELETE;
    let (status, _) = es(&node, delete.clone(), "events-b,nope", json!({})).await;
    assert_eq!(status, 404);
    let (status, _) = node.get("/api/v1/indexes/events-b").await;
    assert_eq!(status, 200, "nothing deleted");
    let (status, body) = es(
        &node,
        delete.clone(),
        "events-b,nope?ignore_unavailable=true",
        json!({}),
    )
    .await;
    assert_eq!((status, body), (200, json!({"acknowledged": true})));
    let (status, _) = node.get("/api/v1/indexes/events-b").await;
    assert_eq!(status, 404);
    let (status, _) = es(&node, delete, "events-b", json!({})).await;
    assert_eq!(status, 404);
}

/// `search_after` is a cursor: every page has the full total, pages chain without gaps or
/// repeats (ties broken by the second criterion), cursors may be strings or out of the
/// column's range; `_doc` sorts by index order.
#[tokio::test]
async fn search_after_cursor_and_doc_order() {
    let node = TestNode::start().await;
    node.create_index(
        "index_id: cursor\ndoc_mapping:\n  mode: dynamic\n  timestamp_field: ts\n  field_mappings:\n    - name: ts\n      type: datetime\n      fast: true\n    - name: n\n      type: u64\n      fast: true\n    - name: g\n      type: i64\n      fast: true\n",
    )
    .await;
    // 30 documents in 3 splits; g repeats (ties), n is unique.
    for part in 0..3u64 {
        let docs: Vec<String> = (part * 10..part * 10 + 10)
            .map(|n| {
                json!({"ts": 1_700_000_000 + n as i64, "n": n, "g": (n % 4) as i64 - 1}).to_string()
            })
            .collect();
        node.ingest("cursor", &docs.join("\n"), "force").await;
    }
    let post = reqwest::Method::POST;
    let sources = |resp: &Value| -> Vec<u64> {
        resp["hits"]["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["_source"]["n"].as_u64().unwrap())
            .collect()
    };

    // Chained pages by (g desc, n asc): all 30 once, in order, total 30 on every page.
    let mut seen = Vec::new();
    let mut after: Option<Value> = None;
    loop {
        let mut body = json!({"size": 7, "sort": [{"g": "desc"}, {"n": "asc"}]});
        if let Some(after) = &after {
            body["search_after"] = after.clone();
        }
        let (status, page) = es(&node, post.clone(), "cursor/_search", body).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(total(&page), 30, "{page}");
        let hits = page["hits"]["hits"].as_array().unwrap();
        if hits.is_empty() {
            break;
        }
        after = Some(hits.last().unwrap()["sort"].clone());
        seen.extend(sources(&page));
    }
    let mut expected: Vec<u64> = (0..30).collect();
    expected.sort_by_key(|n| (std::cmp::Reverse(n % 4), *n));
    assert_eq!(seen, expected);

    // A negative cursor on a u64 column: everything is after it; a string cursor is read as
    // the field's type; a cursor past every value leaves no hits but the total.
    let (_, page) = es(
        &node,
        post.clone(),
        "cursor/_search",
        json!({"size": 2, "sort": [{"n": "asc"}], "search_after": [-10]}),
    )
    .await;
    assert_eq!(sources(&page), vec![0, 1], "{page}");
    let (_, page) = es(
        &node,
        post.clone(),
        "cursor/_search",
        json!({"size": 2, "sort": [{"n": "asc"}], "search_after": ["27"]}),
    )
    .await;
    assert_eq!(sources(&page), vec![28, 29], "{page}");
    let (_, page) = es(
        &node,
        post.clone(),
        "cursor/_search",
        json!({"size": 2, "sort": [{"n": "asc"}], "search_after": [18_000_000_000_000_000_000u64]}),
    )
    .await;
    assert_eq!(total(&page), 30);
    assert!(sources(&page).is_empty(), "{page}");

    // Dates: epoch milliseconds by default, nanoseconds with `epoch_nanos_int`.
    let (_, page) = es(
        &node,
        post.clone(),
        "cursor/_search",
        json!({"size": 3, "sort": [{"ts": "asc"}], "search_after": [1_700_000_025_000i64]}),
    )
    .await;
    assert_eq!(sources(&page), vec![26, 27, 28], "{page}");
    assert_eq!(
        page["hits"]["hits"][0]["sort"],
        json!([1_700_000_026_000i64])
    );
    let (_, page) = es(
        &node,
        post.clone(),
        "cursor/_search",
        json!({"size": 1, "sort": [{"ts": {"order": "desc", "format": "epoch_nanos_int"}}],
               "search_after": [1_700_000_005_000_000_000i64]}),
    )
    .await;
    assert_eq!(sources(&page), vec![4], "{page}");
    assert_eq!(
        page["hits"]["hits"][0]["sort"],
        json!([1_700_000_004_000_000_000i64])
    );

    // A cursor with the wrong number of values is a 400.
    let (status, page) = es(
        &node,
        post.clone(),
        "cursor/_search",
        json!({"sort": [{"n": "asc"}], "search_after": [1, 2]}),
    )
    .await;
    assert_eq!(status, 400, "{page}");

    // `_doc`: index order, first or last documents (splits in id order).
    let (_, first) = es(
        &node,
        post.clone(),
        "cursor/_search",
        json!({"size": 30, "sort": {"_doc": {}}}),
    )
    .await;
    let (_, last) = es(
        &node,
        post.clone(),
        "cursor/_search",
        json!({"size": 30, "sort": {"_doc": {"order": "desc"}}}),
    )
    .await;
    let mut reversed = sources(&last);
    reversed.reverse();
    assert_eq!(sources(&first), reversed);
    let mut sorted = sources(&first);
    sorted.sort_unstable();
    assert_eq!(sorted, (0..30).collect::<Vec<u64>>());
    // Within a split, documents keep their ingest order.
    let first = sources(&first);
    assert!(
        first.windows(2).filter(|w| w[0] + 1 != w[1]).count() <= 2,
        "{first:?}"
    );
}

/// `_field_caps` lists what the splits hold: undeclared fields and json paths with each
/// value type they took, narrowed by field patterns, time bounds and an `index_filter`.
#[tokio::test]
async fn field_caps_from_the_splits() {
    let node = TestNode::start().await;
    node.create_index(
        "index_id: caps\ndoc_mapping:\n  mode: dynamic\n  dynamic_mapping:\n    fast: true\n  timestamp_field: ts\n  tag_fields: [team]\n  field_mappings:\n    - name: ts\n      type: datetime\n      fast: true\n    - name: team\n      type: text\n      tokenizer: raw\n    - name: attrs\n      type: json\n",
    )
    .await;
    node.ingest(
        "caps",
        &[
            json!({"ts": 1_600_000_000, "team": "a", "nested": {"code": 3, "label": "x"}, "attrs": {"k": "v"}}),
            json!({"ts": 1_600_000_001, "team": "a", "score": 5}),
        ]
        .map(|d| d.to_string())
        .join("\n"),
        "force",
    )
    .await;
    node.ingest(
        "caps",
        &json!({"ts": 1_700_000_000, "team": "b", "score": -5.5, "late": true}).to_string(),
        "force",
    )
    .await;
    let get = reqwest::Method::GET;
    let post = reqwest::Method::POST;
    let (status, caps) = es(&node, get.clone(), "caps/_field_caps", Value::Null).await;
    assert_eq!(status, 200, "{caps}");
    let fields = &caps["fields"];
    assert_eq!(
        fields["nested.code"]["long"]["aggregatable"], true,
        "{caps}"
    );
    assert_eq!(fields["nested.label"]["keyword"]["searchable"], true);
    assert_eq!(fields["nested.label"]["text"]["type"], "text");
    assert_eq!(fields["attrs.k"]["keyword"]["type"], "keyword");
    assert_eq!(fields["score"]["long"]["type"], "long");
    assert_eq!(fields["score"]["double"]["type"], "double");
    assert_eq!(fields["ts"]["date_nanos"]["aggregatable"], true);
    assert_eq!(fields["late"]["boolean"]["type"], "boolean");
    assert!(fields.get("_dynamic").is_none() && fields.get("_field_presence").is_none());

    // Only the second split is in the time range.
    let (_, caps) = es(
        &node,
        get.clone(),
        "caps/_field_caps?start_timestamp=1650000000&fields=score,nested.*",
        Value::Null,
    )
    .await;
    assert!(caps["fields"].get("nested.code").is_none(), "{caps}");
    assert!(caps["fields"]["score"].get("long").is_none(), "{caps}");
    assert_eq!(caps["fields"]["score"]["double"]["type"], "double");

    // An index_filter on a tag prunes the first split; a bad one is a 400.
    let (status, caps) = es(
        &node,
        post.clone(),
        "caps/_field_caps?fields=*",
        json!({"index_filter": {"term": {"team": "b"}}}),
    )
    .await;
    assert_eq!(status, 200, "{caps}");
    assert!(caps["fields"].get("nested.code").is_none(), "{caps}");
    assert_eq!(caps["fields"]["late"]["boolean"]["searchable"], true);
    // Across indexes, `indices` lists those holding a field returned.
    node.create_index("index_id: other\ndoc_mapping:\n  mode: dynamic\n")
        .await;
    node.ingest("other", &json!({"x": 1}).to_string(), "force")
        .await;
    let (_, caps) = es(
        &node,
        get.clone(),
        "_field_caps?fields=nested.*",
        Value::Null,
    )
    .await;
    assert_eq!(caps["indices"], json!(["caps"]), "{caps}");
    let (_, caps) = es(&node, get.clone(), "_field_caps?fields=x,late", Value::Null).await;
    assert_eq!(caps["indices"], json!(["caps", "other"]), "{caps}");
    assert_eq!(
        caps["fields"]["x"]["long"]["indices"],
        json!(["other"]),
        "{caps}"
    );
    for bad in [
        json!({"index_filter": {}}),
        json!({"index_filter": {"nope": {"a": 1}}}),
    ] {
        let (status, body) = es(&node, post.clone(), "caps/_field_caps", bad).await;
        assert_eq!(status, 400, "{body}");
    }
}
