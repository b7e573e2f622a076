//! SQL over metrics and log indexes (`POST /api/v1/_sql`, DataFusion): labels and fields are
//! columns, counts and sums are exact against what was written, time filters prune splits,
//! deleted series and documents are gone, answers come as JSON rows or Arrow IPC, and bad
//! queries are clear 400s.

use crate::common;

use common::TestNode;
use serde_json::{json, Value};
use shale_metrics::remote_write::{
    encode_remote_write, Label, ProtoSample, TimeSeries, WriteRequest,
};

/// A bucket start long past (seconds; a multiple of 900).
const T0: i64 = 1_700_000_100;

fn series(name: &str, job: &str, instance: &str, points: std::ops::Range<i64>) -> TimeSeries {
    let label = |name: &str, value: &str| Label {
        name: name.into(),
        value: value.into(),
    };
    TimeSeries {
        labels: vec![
            label("__name__", name),
            label("job", job),
            label("instance", instance),
        ],
        samples: points
            .map(|p| ProtoSample {
                value: p as f64,
                timestamp: (T0 + p * 60) * 1000,
            })
            .collect(),
        ..Default::default()
    }
}

async fn sql(node: &TestNode, query: &str) -> (u16, Value) {
    let resp = node
        .client
        .post(node.url("/api/v1/_sql"))
        .json(&json!({"query": query}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

#[tokio::test]
async fn sql_reads_metrics_indexes_with_labels_as_columns() {
    let node = TestNode::start().await;
    // Merges off: the test counts the splits of each bucket (closed buckets would be merged
    // into one meanwhile on a slow machine).
    node.create_index(
        "index_id: prom\nmetrics:\n  sort_labels: [job]\n\
         indexing_settings:\n  merge_policy:\n    type: no_merge\n",
    )
    .await;
    // Two 15-minute buckets: minutes 0..15 and 15..30, in two commits each.
    for range in [0..8, 8..15, 15..22, 22..30] {
        let request = WriteRequest {
            timeseries: vec![
                series("requests_total", "api", "a", range.clone()),
                series("requests_total", "api", "b", range.clone()),
                series("requests_total", "db", "c", range.clone()),
                series("temperature", "db", "c", range.clone()),
            ],
            ..Default::default()
        };
        let resp = node
            .client
            .post(node.url("/prometheus/prom/api/v1/write?commit=force"))
            .header("Content-Encoding", "snappy")
            .body(encode_remote_write(&request))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 204);
    }

    // Aggregates by a label column; exact counts and sums (values 0..29 per series).
    let (status, body) = sql(
        &node,
        "SELECT job, count(*) AS n, sum(value) AS total FROM prom \
         WHERE __name__ = 'requests_total' GROUP BY job ORDER BY job",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["rows"],
        json!([
            {"job": "api", "n": 60, "total": 870.0},
            {"job": "db", "n": 30, "total": 435.0},
        ])
    );
    let columns: Vec<&str> = body["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["job", "n", "total"]);

    // The table's columns: the metric name, every label, timestamp and value.
    let (_, body) = sql(
        &node,
        "SELECT * FROM prom ORDER BY timestamp, instance LIMIT 1",
    )
    .await;
    assert_eq!(
        body["rows"][0],
        json!({"__name__": "requests_total", "instance": "a", "job": "api",
               "timestamp": "2023-11-14T22:15:00Z", "value": 0.0}),
        "{body}"
    );

    // A time filter: only the first bucket's splits are read.
    let (status, body) = sql(
        &node,
        &format!(
            "SELECT count(*) AS n FROM prom WHERE timestamp >= to_timestamp({T0}) \
             AND timestamp < to_timestamp({})",
            T0 + 15 * 60
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rows"], json!([{"n": 4 * 15}]));
    assert_eq!(body["stats"]["splits_listed"], 2, "{body}");
    assert_eq!(body["stats"]["splits_opened"], 2, "{body}");

    // `=` on the name prunes by tags and key range; the answer is the same.
    let (_, body) = sql(
        &node,
        "SELECT max(value) AS m FROM prom WHERE __name__ = 'temperature' AND job = 'db'",
    )
    .await;
    assert_eq!(body["rows"], json!([{"m": 29.0}]));

    // Deleted series are gone from SQL as from PromQL.
    let resp = node
        .client
        .post(node.url("/prometheus/prom/api/v1/admin/tsdb/delete_series"))
        .form(&[("match[]", "requests_total{instance=\"b\"}")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    let (_, body) = sql(
        &node,
        "SELECT DISTINCT instance FROM prom WHERE job = 'api' ORDER BY instance",
    )
    .await;
    assert_eq!(body["rows"], json!([{"instance": "a"}]));

    // Arrow IPC.
    let resp = node
        .client
        .post(node.url("/api/v1/_sql"))
        .json(&json!({"query": "SELECT value FROM prom WHERE job = 'db'", "format": "arrow"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "application/vnd.apache.arrow.stream"
    );
    let bytes = resp.bytes().await.unwrap();
    let reader =
        arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
    let rows: usize = reader.map(|batch| batch.unwrap().num_rows()).sum();
    assert_eq!(rows, 60);

    // Clear errors.
    let (status, body) = sql(&node, "SELECT * FROM nope").await;
    assert_eq!(status, 400);
    assert!(body["message"].as_str().unwrap().contains("nope"), "{body}");
    let (status, body) = sql(&node, "SELECT nope FROM prom").await;
    assert_eq!(status, 400, "{body}");
    for statement in [
        "DELETE FROM prom",
        "CREATE TABLE t (a INT)",
        "DROP TABLE prom",
    ] {
        let (status, body) = sql(&node, statement).await;
        assert_eq!(status, 400, "{statement}: {body}");
    }
    let (status, _) = sql(&node, "").await;
    assert_eq!(status, 400);
    node.stop().await;
}

/// The first row's `n` column of a JSON answer.
fn first_n(body: &Value) -> i64 {
    body["rows"][0]["n"]
        .as_i64()
        .unwrap_or_else(|| panic!("no n in {body}"))
}

/// Log indexes are tables too: a column per declared field (typed), `_source`, counts exact
/// past one search's 10 000 hits, time filters prune splits, deletes apply.
#[tokio::test]
async fn sql_reads_log_indexes_with_fields_as_columns() {
    let node = TestNode::start().await;
    node.create_index(common::LOGS_INDEX).await;
    const TS: i64 = 1_700_000_000;
    node.ingest("logs", &common::log_docs(0, 12_000, TS, "api"), "force")
        .await;
    node.ingest(
        "logs",
        &common::log_docs(12_000, 13_000, TS, "web"),
        "force",
    )
    .await;

    let (status, body) = sql(&node, "SELECT count(*) AS n FROM logs").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(first_n(&body), 25_000, "{body}");
    assert_eq!(body["stats"]["documents"], 25_000);

    let (_, body) = sql(
        &node,
        "SELECT service, count(*) AS n FROM logs GROUP BY service ORDER BY service",
    )
    .await;
    assert_eq!(
        body["rows"],
        json!([{"service": "api", "n": 12_000}, {"service": "web", "n": 13_000}]),
        "{body}"
    );
    // Typed columns: a u64, a timestamp.
    let (_, body) = sql(&node, "SELECT count(*) AS n FROM logs WHERE status = 200").await;
    assert_eq!(first_n(&body), 5_000, "{body}");
    let (status, body) = sql(
        &node,
        "SELECT status, message, timestamp FROM logs WHERE doc_id = 'api-7'",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rows"][0]["status"], 202, "{body}");
    assert_eq!(
        body["rows"][0]["message"],
        "request 7 handled by api quick brown fox"
    );
    assert!(
        body["rows"][0]["timestamp"]
            .as_str()
            .unwrap()
            .starts_with("2023-11-14T22:13:27"),
        "{body}"
    );
    let columns: Vec<&str> = body["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["status", "message", "timestamp"]);
    // A time range: exact, and only the split holding it is searched.
    let (_, body) = sql(
        &node,
        &format!(
            "SELECT count(*) AS n FROM logs WHERE timestamp >= to_timestamp({}) AND timestamp < to_timestamp({})",
            TS + 100,
            TS + 200
        ),
    )
    .await;
    assert_eq!(first_n(&body), 100, "{body}");
    assert_eq!(body["stats"]["documents"], 100, "{body}");
    assert_eq!(body["stats"]["splits_opened"], 1, "{body}");
    // The whole document.
    let (_, body) = sql(&node, "SELECT _source FROM logs WHERE doc_id = 'web-12001'").await;
    let source: Value = serde_json::from_str(body["rows"][0]["_source"].as_str().unwrap()).unwrap();
    assert_eq!(source["host"], "host-1"); // 12001 % 3
                                          // A LIMIT reads no more than it needs.
    let (_, body) = sql(&node, "SELECT doc_id FROM logs LIMIT 5").await;
    assert_eq!(body["num_rows"], 5, "{body}");
    assert!(body["stats"]["documents"].as_u64().unwrap() <= 5, "{body}");

    // Deleted documents are gone at once.
    let (status, body) = node
        .post(
            "/api/v1/logs/delete-tasks",
            json!({"query": "service:web AND status:201"}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, body) = sql(
        &node,
        "SELECT count(*) AS n FROM logs WHERE service = 'web'",
    )
    .await;
    assert_eq!(first_n(&body), 13_000 - 2_600, "{body}");

    // Clear errors.
    let (status, body) = sql(&node, "SELECT nope FROM logs").await;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("nope"), "{body}");
    node.stop().await;
}
