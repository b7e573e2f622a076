//! Queries Quickwit rejects are 400s with a message, not 200s without hits.

use crate::common;

use common::TestNode;
use serde_json::json;

const INDEX: &str = r#"
index_id: typed
doc_mapping:
  mode: strict
  field_mappings:
    - {name: timestamp, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: level, type: text, tokenizer: raw}
    - {name: message, type: text}
    - {name: status, type: u64, fast: true}
    - {name: delta, type: i64}
    - {name: ok, type: bool}
  timestamp_field: timestamp
indexing_settings:
  commit_timeout_secs: 1
"#;

#[tokio::test]
async fn malformed_and_mistyped_queries_are_400s() {
    let node = TestNode::start().await;
    node.create_index(INDEX).await;
    let docs: String = (0..10)
        .map(|i| {
            json!({"timestamp": 1_700_000_000 + i, "level": if i % 2 == 0 { "ERROR" } else { "INFO" },
                   "message": format!("quick fox {i}"), "status": 200 + i, "delta": i - 5, "ok": i % 2 == 0})
            .to_string()
                + "\n"
        })
        .collect();
    node.ingest("typed", &docs, "force").await;
    for (query, hits) in [
        ("level:ERROR", 5),
        ("status:[200 TO 204]", 5),
        ("delta:[-5 TO -1]", 5),
        ("ok:true", 5),
        ("message:quick AND NOT level:INFO", 5),
        ("*", 10),
    ] {
        assert_eq!(node.count("typed", query).await, hits, "{query}");
    }
    for (query, needle) in [
        ("level:ERROR AND", ""),
        ("AND AND", ""),
        ("status:abc", "status:abc"),
        ("ok:maybe", "ok:maybe"),
        ("delta:[1 TO x]", "delta"),
        ("message:(quick", ""),
        ("nosuchfield:x", "nosuchfield"),
        // No default search fields and no `search_field`: a bare term says so.
        ("quick", "default search field"),
        // Field names with NUL bytes (found by fuzzing: they panicked inside Tantivy).
        ("\u{0}:x.y>=", "control character"),
        ("s,\u{0}:v1AND", "control character"),
        ("level:a OR \u{1}b:c", "control character"),
    ] {
        let (status, body) = node
            .post(
                "/api/v1/typed/search",
                json!({"query": query, "max_hits": 0}).to_string(),
            )
            .await;
        assert_eq!(status, 400, "`{query}`: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(needle), "`{query}`: {message}");
    }
    // Errors name the field, the value and what was expected, never Rust internals.
    for (query, needles) in [
        (
            "status:abc",
            &["`abc`", "field `status`", "expected an unsigned integer"][..],
        ),
        (
            "delta:[1 TO x]",
            &["`x`", "field `delta`", "expected an integer"],
        ),
        (
            "delta:1.5",
            &["`1.5`", "field `delta`", "expected an integer"],
        ),
        ("ok:maybe", &["`maybe`", "field `ok`", "`true` or `false`"]),
        ("status:IN [200 2x]", &["`2x`", "field `status`"]),
        (
            "timestamp:[2020-13-01 TO *]",
            &["`2020-13-01`", "field `timestamp`", "RFC 3339", "%Y-%m-%d"],
        ),
        ("timestamp:yesterday", &["`yesterday`", "Unix timestamp"]),
    ] {
        let (status, body) = node
            .post(
                "/api/v1/typed/search",
                json!({"query": query, "max_hits": 0}).to_string(),
            )
            .await;
        assert_eq!(status, 400, "`{query}`: {body}");
        let message = body["message"].as_str().unwrap();
        for needle in needles {
            assert!(message.contains(needle), "`{query}`: {message}");
        }
        assert!(!message.contains("Error {"), "`{query}`: {message}");
        assert!(!message.contains("ParseIntError"), "`{query}`: {message}");
    }
    // Valid dates in each of Quickwit's query formats still match.
    for query in [
        "timestamp:[2023-11-14T22:13:20Z TO *]",
        "timestamp:[2023-11-14 TO *]",
        "timestamp:[1699999999 TO *]",
    ] {
        assert_eq!(node.count("typed", query).await, 10, "{query}");
    }
    // A bare term with a search field is fine.
    let (status, body) = node
        .post(
            "/api/v1/typed/search",
            json!({"query": "quick", "search_field": "message", "max_hits": 0}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["num_hits"], 10);
    node.stop().await;
}
