//! More of the Elasticsearch API under `/api/v1/_elastic`: scroll (`scroll=` then
//! `_search/scroll`), `_stats`, `DELETE {indexes}`, Quickwit's `extra_filters`, `q` over a
//! body query, `zero_terms_query`, and `prefix`/`wildcard`/`regexp` on undeclared fields.

mod common;

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
