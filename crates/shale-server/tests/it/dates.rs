//! Datetime input formats as Quickwit parses them: `iso8601` needs an offset,
//! `unix_timestamp` guesses seconds/millis/micros/nanos from the magnitude, strptime formats;
//! documents that match none are rejected with the formats named, the rest indexed.

use crate::common;

use common::TestNode;
use serde_json::json;

const INDEX: &str = r#"
index_id: dated
doc_mapping:
  mode: lenient
  field_mappings:
    - name: ts
      type: datetime
      input_formats: [iso8601, "%Y-%m-%d %H:%M:%S", "%d/%b/%Y:%H:%M:%S %z", unix_timestamp]
      fast: true
      fast_precision: milliseconds
    - {name: id, type: u64, fast: true}
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 1
"#;

#[tokio::test]
async fn datetime_input_formats() {
    let node = TestNode::start().await;
    node.create_index(INDEX).await;
    // All the same instant: 2024-01-02T03:04:05Z.
    let good = [
        json!("2024-01-02T04:04:05+01:00"),
        json!("2024-01-02 03:04:05"),
        json!("02/Jan/2024:03:04:05 +0000"),
        json!(1_704_164_645),
        json!(1_704_164_645_000i64),
        json!(1_704_164_645_000_000i64),
        json!(1_704_164_645_000_000_000i64),
        json!("1704164645"),
    ];
    let bad = [
        json!("2024-01-02T03:04:05"),
        json!("2024/01/02"),
        json!("yesterday"),
    ];
    let mut body = String::new();
    for (i, ts) in good.iter().chain(&bad).enumerate() {
        body.push_str(&json!({"ts": ts, "id": i}).to_string());
        body.push('\n');
    }
    let resp = node.ingest("dated", &body, "force").await;
    assert_eq!(resp["num_ingested_docs"], good.len(), "{resp}");
    assert_eq!(resp["num_rejected_docs"], bad.len(), "{resp}");
    let failures = resp["parse_failures"].as_array().unwrap();
    assert!(
        failures[0]["message"]
            .as_str()
            .unwrap()
            .contains("%Y-%m-%d %H:%M:%S"),
        "{resp}"
    );
    // Every good document landed on the same second.
    let hits = node
        .search(
            "dated",
            json!({"query": "*", "start_timestamp": 1_704_164_645, "end_timestamp": 1_704_164_646, "max_hits": 0}),
        )
        .await;
    assert_eq!(hits["num_hits"], good.len());
    // An unknown format or strptime directive is refused at index creation, naming the field.
    let (status, body) = node
        .post(
            "/api/v1/indexes",
            INDEX
                .replace("index_id: dated", "index_id: wrong")
                .replace("%d/%b/%Y", "%d/%Q/%Y"),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("%Q") && message.contains("field_mappings[0]"),
        "{message}"
    );
    node.stop().await;
}
