//! The Quickwit search, ingest and index API as a table of request/response cases
//! (`tests/fixtures/api_cases.json`), run in order against one node holding 300 log
//! documents in three splits (services api/web/db by hundreds, one per second from
//! 2023-11-14T22:13:20Z, every tenth an ERROR, status 200 + i % 5, host-(i % 3)).
//!
//! A case names its request (`method`, `path`, `body` as JSON or raw text), the expected
//! `status`, and checks on the JSON response by JSON pointer: `expect` (equal), `len`
//! (array length) and `contains` (the string contains). Every failing case is reported.

use crate::common;

use common::{log_docs, TestNode, LOGS_INDEX};
use serde_json::Value;

const T0: i64 = 1_700_000_000;

#[tokio::test]
async fn quickwit_api_cases() {
    let node = TestNode::start().await;
    node.create_index(LOGS_INDEX).await;
    for (i, service) in ["api", "web", "db"].into_iter().enumerate() {
        node.ingest("logs", &log_docs(i * 100, 100, T0, service), "force")
            .await;
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/api_cases.json");
    let cases: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(cases.len() >= 60, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let method: reqwest::Method = case["method"].as_str().unwrap().parse().unwrap();
        let mut request = node
            .client
            .request(method, node.url(case["path"].as_str().unwrap()));
        match &case["body"] {
            Value::Null => {}
            Value::String(text) => request = request.body(text.clone()),
            json => {
                request = request
                    .header("content-type", "application/json")
                    .body(json.to_string())
            }
        }
        let resp = request.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        let mut problems = Vec::new();
        if Some(u64::from(status)) != case["status"].as_u64() {
            problems.push(format!("status {status}, expected {}", case["status"]));
        }
        if let Some(expect) = case["expect"].as_object() {
            for (pointer, expected) in expect {
                let actual = body.pointer(pointer);
                let equal = match (actual, expected) {
                    (Some(Value::Number(a)), Value::Number(e)) => a.as_f64() == e.as_f64(),
                    (Some(a), e) => a == e,
                    (None, _) => false,
                };
                if !equal {
                    problems.push(format!("{pointer} is {actual:?}, expected {expected}"));
                }
            }
        }
        if let Some(lens) = case["len"].as_object() {
            for (pointer, expected) in lens {
                let actual = body
                    .pointer(pointer)
                    .and_then(Value::as_array)
                    .map(Vec::len);
                if actual.map(|n| n as u64) != expected.as_u64() {
                    problems.push(format!(
                        "{pointer} has length {actual:?}, expected {expected}"
                    ));
                }
            }
        }
        if let Some(contains) = case["contains"].as_object() {
            for (pointer, needle) in contains {
                let actual = body.pointer(pointer).and_then(Value::as_str);
                if !actual.is_some_and(|a| a.contains(needle.as_str().unwrap())) {
                    problems.push(format!(
                        "{pointer} is {actual:?}, expected to contain {needle}"
                    ));
                }
            }
        }
        if !problems.is_empty() {
            failures.push(format!("{name}: {} — response {body}", problems.join("; ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    node.stop().await;
}
