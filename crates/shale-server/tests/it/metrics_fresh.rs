//! Fresh samples on a real node: a remote-written sample answers PromQL (queries, `series`,
//! `labels`, label values) as soon as the write is acknowledged, with an hour-long commit
//! timeout; once its split is published it is counted once, not twice; a restart reads the
//! unpublished samples back from the WAL; deletes reach them; `/metrics` shows their memory;
//! with `live_samples_max_bytes: 0` they wait for their split.

use crate::common;

use std::time::{Duration, Instant};

use common::TestNode;
use serde_json::Value;
use shale_metrics::remote_write::{Label, ProtoSample, TimeSeries, WriteRequest};

/// An hour-long commit timeout: nothing is published unless forced.
const INDEX: &str = "index_id: fresh\nmetrics:\n  sort_labels: [job]\n  time_bucket: 15m\n\
                     indexing_settings:\n  commit_timeout_secs: 3600\n";
/// A 15-minute bucket start (Unix seconds).
const T0: i64 = 1_780_084_800;

fn request(job: &str, points: std::ops::Range<i64>) -> WriteRequest {
    let label = |name: &str, value: &str| Label {
        name: name.into(),
        value: value.into(),
    };
    WriteRequest {
        timeseries: vec![TimeSeries {
            labels: vec![label("__name__", "up_total"), label("job", job)],
            samples: points
                .map(|p| ProtoSample {
                    value: p as f64,
                    timestamp: (T0 + p * 10) * 1000,
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn write(node: &TestNode, request: &WriteRequest, commit: &str) {
    let path = format!("/prometheus/fresh/api/v1/write?commit={commit}");
    let (status, text) = node.remote_write(&path, request).await;
    assert!(status < 300, "{status}: {text}");
}

/// `count_over_time(up_total[1h])` per job at T0 + 1 h, and the samples read from memory.
async fn counts(node: &TestNode) -> (Vec<(String, String)>, u64) {
    let resp = node
        .client
        .get(node.url("/prometheus/fresh/api/v1/query"))
        .query(&[
            ("query", "count_over_time(up_total[1h])".to_string()),
            ("time", (T0 + 3600).to_string()),
        ])
        .send()
        .await
        .unwrap();
    let live: u64 = resp
        .headers()
        .get("x-shale-live-samples")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("x-shale-live-samples");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "success", "{body}");
    (common::vector_by(&body, "job"), live)
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

async fn published_splits(node: &TestNode) -> usize {
    let (status, resp) = node
        .get("/api/v1/indexes/fresh/splits?split_states=Published")
        .await;
    assert_eq!(status, 200, "{resp}");
    resp["splits"].as_array().unwrap().len()
}

#[tokio::test]
async fn samples_answer_at_once_and_once_across_a_publish_and_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let node = TestNode::start_with(common::config_in(tmp.path())).await;
    node.create_index(INDEX).await;

    // Acknowledged, not published: PromQL and the metadata endpoints see it already.
    write(&node, &request("a", 0..6), "auto").await;
    assert_eq!(published_splits(&node).await, 0);
    assert_eq!(counts(&node).await, (pairs(&[("a", "6")]), 6));
    let (status, series) = node
        .get("/prometheus/fresh/api/v1/series?match[]=up_total")
        .await;
    assert_eq!(status, 200, "{series}");
    assert_eq!(series["data"][0]["job"], "a", "{series}");
    let (_, labels) = node.get("/prometheus/fresh/api/v1/labels").await;
    assert!(
        labels["data"].as_array().unwrap().contains(&"job".into()),
        "{labels}"
    );
    let (_, values) = node.get("/prometheus/fresh/api/v1/label/job/values").await;
    assert_eq!(values["data"], serde_json::json!(["a"]), "{values}");
    let metrics = node.metrics().await;
    assert!(
        node.metric_value("shale_metrics_live_samples").await >= 6,
        "{metrics}"
    );

    // Published: the same counts, read from the split alone (not also from memory).
    write(&node, &request("b", 0..3), "force").await;
    assert!(published_splits(&node).await >= 1);
    assert_eq!(counts(&node).await, (pairs(&[("a", "6"), ("b", "3")]), 0));

    // Some in a split, some in memory; a rewritten timestamp counts once (the later value).
    write(&node, &request("a", 5..9), "auto").await;
    assert_eq!(counts(&node).await, (pairs(&[("a", "9"), ("b", "3")]), 4));

    // A delete reaches the unpublished samples acknowledged before it.
    let resp = node
        .client
        .post(node.url("/prometheus/fresh/api/v1/admin/tsdb/delete_series"))
        .form(&[
            ("match[]", "up_total{job=\"a\"}".to_string()),
            ("start", (T0 + 70).to_string()),
            ("end", (T0 + 80).to_string()),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    assert_eq!(counts(&node).await, (pairs(&[("a", "7"), ("b", "3")]), 2));

    // A restart: what was acknowledged and not published is read back from the WAL.
    node.stop().await;
    let node = TestNode::start_with(common::config_in(tmp.path())).await;
    let expected = (pairs(&[("a", "7"), ("b", "3")]), 2);
    eventually("the unpublished samples read back", || async {
        counts(&node).await == expected
    })
    .await;
    // And published at last: still once.
    write(&node, &WriteRequest::default(), "force").await;
    assert_eq!(counts(&node).await, (pairs(&[("a", "7"), ("b", "3")]), 0));
}

#[tokio::test]
async fn off_they_wait_for_their_split() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    config.live_samples_max_bytes = 0;
    let node = TestNode::start_with(config).await;
    node.create_index(INDEX).await;
    write(&node, &request("a", 0..6), "auto").await;
    assert_eq!(counts(&node).await, (pairs(&[]), 0));
    write(&node, &request("b", 0..3), "force").await;
    assert_eq!(counts(&node).await, (pairs(&[("a", "6"), ("b", "3")]), 0));
}

/// Waits until `check` holds (the WAL is read back in the background after a start).
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not in 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
