//! Metrics compaction end to end on a real node (SQLite metastore, local storage): remote
//! writes in random order (one retried) into long-closed buckets are merged into level-1
//! splits whose key ranges do not overlap; every sample is kept exactly once, duplicates
//! collapse, PromQL answers the same before and after, and a one-series query opens one
//! split per bucket instead of many.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::TestNode;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use shale_config::NodeConfig;
use shale_metastore::ListSplitsQuery;
use shale_metrics::remote_write::{
    encode_remote_write, Label, ProtoSample, TimeSeries, WriteRequest,
};
use shale_types::{SplitMetadata, SplitState};

const INDEX: &str = "index_id: prom\nmetrics:\n  sort_labels: [job]\n  time_bucket: 15m\n  \
                     target_split_bytes: 8KB\nindexing_settings:\n  commit_timeout_secs: 1\n";
/// A bucket start (a multiple of 900 s) long past: every bucket of the test is closed.
const T0: i64 = 1_700_000_100;
const STEP_MS: i64 = 15_000;
const POINTS: i64 = 120; // 30 minutes: two buckets

fn label(name: &str, value: &str) -> Label {
    Label {
        name: name.into(),
        value: value.into(),
    }
}

/// The series: counters and gauges over 10 jobs and 12 instances.
fn series_labels(i: usize) -> Vec<Label> {
    let name = if i.is_multiple_of(2) {
        "requests_total"
    } else {
        "temperature"
    };
    vec![
        label("__name__", name),
        label("job", &format!("job-{}", i % 10)),
        label("instance", &format!("host-{i}")),
    ]
}

fn value(i: usize, point: i64) -> f64 {
    if i.is_multiple_of(2) {
        (point * (i as i64 % 7 + 1)) as f64
    } else {
        20.0 + ((i as i64 * 31 + point * 7) % 13) as f64 / 4.0
    }
}

/// Requests that together hold every sample once, cut by series and time in random order.
fn requests(rng: &mut StdRng, series: usize, count: usize) -> Vec<WriteRequest> {
    let mut pieces: Vec<(usize, i64)> = (0..series)
        .flat_map(|i| (0..POINTS / 10).map(move |chunk| (i, chunk)))
        .collect();
    pieces.shuffle(rng);
    let mut out: Vec<WriteRequest> = (0..count).map(|_| WriteRequest::default()).collect();
    for (n, (i, chunk)) in pieces.into_iter().enumerate() {
        let samples = (chunk * 10..chunk * 10 + 10)
            .map(|p| ProtoSample {
                value: value(i, p),
                timestamp: T0 * 1000 + p * STEP_MS,
            })
            .collect();
        out[n % count].timeseries.push(TimeSeries {
            labels: series_labels(i),
            samples,
            ..Default::default()
        });
    }
    out
}

/// A node config in `dir` with compaction on or off, the planner running every second.
fn compaction_config(dir: &std::path::Path, enabled: bool) -> NodeConfig {
    let mut config = common::config_in(dir);
    config.compaction.enabled = enabled;
    config.compaction.planner_interval_secs = 1;
    config
}

async fn write(node: &TestNode, request: &WriteRequest) {
    let resp = node
        .client
        .post(node.url("/prometheus/prom/api/v1/write?commit=force"))
        .header("Content-Encoding", "snappy")
        .body(encode_remote_write(request))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        204,
        "{}",
        resp.text().await.unwrap()
    );
}

async fn published(node: &TestNode) -> Vec<SplitMetadata> {
    let index = node.node.metastore.index_metadata("prom").await.unwrap();
    node.node
        .metastore
        .list_splits(
            ListSplitsQuery::for_index(index.index_uid).with_states(&[SplitState::Published]),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.split_metadata)
        .collect()
}

/// The answers of a fixed set of queries (instant and range), and the splits each opened.
async fn answers(node: &TestNode) -> Vec<(String, Value, u64)> {
    let end = T0 + POINTS * STEP_MS / 1000;
    let queries = [
        format!(
            "query=sum by (job) (rate(requests_total[5m]))&time={}",
            T0 + 900
        ),
        format!("query=count_over_time(temperature[1h])&time={end}"),
        format!(
            "query=max_over_time(temperature{{job=\"job-3\"}}[10m])&time={}",
            T0 + 1200
        ),
        format!(
            "query=requests_total{{job=\"job-4\",instance=\"host-14\"}}&time={}",
            T0 + 300
        ),
        format!("query=sum by (job) (increase(requests_total[10m]))&start={T0}&end={end}&step=60"),
        format!(
            "query=temperature{{job=\"job-7\",instance=\"host-7\"}}&start={T0}&end={end}&step=15"
        ),
        format!("query=count(count_over_time({{__name__=~\".+\"}}[1h]))&time={end}"),
    ];
    let mut out = Vec::new();
    for query in queries {
        let path = if query.contains("&step=") {
            format!("/prometheus/prom/api/v1/query_range?{}", encode(&query))
        } else {
            format!("/prometheus/prom/api/v1/query?{}", encode(&query))
        };
        let resp = node.client.get(node.url(&path)).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let opened: u64 = resp.headers()["x-shale-splits-opened"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["status"], "success", "{query}: {body}");
        out.push((query, body["data"].clone(), opened));
    }
    out
}

/// `a=b&c=d` with each value form-encoded.
fn encode(query: &str) -> String {
    query
        .split('&')
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap();
            format!(
                "{name}={}",
                url::form_urlencoded::byte_serialize(value.as_bytes()).collect::<String>()
            )
        })
        .collect::<Vec<_>>()
        .join("&")
}

#[tokio::test]
async fn closed_buckets_compact_into_disjoint_level_one_splits_with_the_same_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let config = |enabled: bool| {
        let mut config = compaction_config(tmp.path(), enabled);
        config.compaction.max_concurrent_merges = 2;
        config
    };
    // 1. Ingest with compaction off: many small overlapping splits per bucket.
    let node = TestNode::start_with(config(false)).await;
    node.create_index(INDEX).await;
    let mut rng = StdRng::seed_from_u64(42);
    let series = 120;
    let requests = requests(&mut rng, series, 8);
    for request in &requests {
        write(&node, request).await;
    }
    // A retried request: its samples again, with the same values.
    write(&node, &requests[rng.random_range(0..requests.len())]).await;
    let before = published(&node).await;
    let expected_samples = series as u64 * POINTS as u64;
    let stored: u64 = before.iter().map(|s| s.num_docs).sum();
    assert!(stored > expected_samples, "the retry wrote duplicates");
    assert!(before.len() >= 16, "{} splits", before.len());
    let answers_before = answers(&node).await;
    node.stop().await;

    // 2. The same data dir with compaction on: the closed buckets are merged.
    let node = TestNode::start_with(config(true)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        let splits = published(&node).await;
        if splits.iter().all(|s| s.key_level == 1) {
            break splits;
        }
        assert!(
            Instant::now() < deadline,
            "not compacted: {:?}",
            splits
                .iter()
                .map(|s| (s.time_bucket_start, s.key_level, s.num_docs))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // Every sample once: the duplicates of the retry collapsed.
    assert_eq!(
        after.iter().map(|s| s.num_docs).sum::<u64>(),
        expected_samples
    );
    let mut by_bucket: BTreeMap<Option<i64>, Vec<&SplitMetadata>> = BTreeMap::new();
    for split in &after {
        by_bucket
            .entry(split.time_bucket_start)
            .or_default()
            .push(split);
    }
    assert_eq!(by_bucket.len(), 2, "two buckets");
    for (bucket, mut splits) in by_bucket {
        splits.sort_by(|a, b| a.sort_key_min.cmp(&b.sort_key_min));
        for pair in splits.windows(2) {
            assert!(
                pair[0].sort_key_max < pair[1].sort_key_min,
                "bucket {bucket:?}: overlapping level-1 key ranges"
            );
        }
        // Converged to about ⌈bucket bytes / target⌉ splits.
        let bytes: u64 = splits.iter().map(|s| s.size_bytes).sum();
        let ideal = bytes.div_ceil(8_000) as usize;
        assert!(
            splits.len() <= ideal + 1,
            "bucket {bucket:?}: {} splits for {bytes} bytes",
            splits.len()
        );
        assert!(splits.iter().all(|s| s.num_merge_ops >= 1));
    }
    // The same answers, opening fewer splits.
    let answers_after = answers(&node).await;
    for ((query, data_before, opened_before), (_, data_after, opened_after)) in
        answers_before.iter().zip(&answers_after)
    {
        assert_eq!(data_before, data_after, "{query}");
        assert!(
            opened_after <= opened_before,
            "{query}: {opened_after} > {opened_before}"
        );
    }
    // One series over both buckets: one split per bucket after, more before.
    let (_, _, one_series_before) = &answers_before[5];
    let (_, _, one_series_after) = &answers_after[5];
    assert_eq!(*one_series_after, 2);
    assert!(*one_series_before > 2, "{one_series_before}");

    // Late data for the compacted buckets, in two commits: new series and new samples of
    // old ones join their buckets' level-1 splits, which still do not overlap.
    let late = |from: usize, offset_ms: i64| WriteRequest {
        timeseries: (from..from + 30)
            .map(|i| TimeSeries {
                labels: series_labels(i),
                samples: vec![ProtoSample {
                    value: 1.0,
                    timestamp: T0 * 1000 + 7_000 + offset_ms,
                }],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    write(&node, &late(100, 0)).await; // 20 old series, 10 new ones
    write(&node, &late(200, 1)).await; // 30 new series
    let deadline = Instant::now() + Duration::from_secs(60);
    let settled = loop {
        let splits = published(&node).await;
        let stored: u64 = splits.iter().map(|s| s.num_docs).sum();
        if splits.iter().all(|s| s.key_level == 1) && stored == expected_samples + 60 {
            break splits;
        }
        assert!(
            Instant::now() < deadline,
            "late data never joined: {stored} samples"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let mut by_bucket: BTreeMap<Option<i64>, Vec<&SplitMetadata>> = BTreeMap::new();
    for split in &settled {
        by_bucket
            .entry(split.time_bucket_start)
            .or_default()
            .push(split);
    }
    for (bucket, mut splits) in by_bucket {
        splits.sort_by(|a, b| a.sort_key_min.cmp(&b.sort_key_min));
        for pair in splits.windows(2) {
            assert!(
                pair[0].sort_key_max < pair[1].sort_key_min,
                "bucket {bucket:?}: overlapping level-1 key ranges after late data"
            );
        }
    }
    node.stop().await;
}

/// An instant query's result, as (labels, value) pairs sorted.
async fn instant(node: &TestNode, query: &str, time: i64) -> Vec<(Value, String)> {
    let (status, body) = node
        .get(&format!(
            "/prometheus/prom/api/v1/query?{}",
            encode(&format!("query={query}&time={time}"))
        ))
        .await;
    assert_eq!(status, 200, "{query}: {body}");
    let mut out: Vec<(Value, String)> = body["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["metric"].clone(),
                r["value"][1].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort_by_key(|(labels, _)| labels.to_string());
    out
}

/// `delete_series` hides the selected samples at once (queries, `series`), keeps what is
/// written after it, and merges then delete compaction purge them from the splits.
#[tokio::test]
async fn delete_series_hides_at_once_and_compaction_purges() {
    let tmp = tempfile::tempdir().unwrap();
    let config = |enabled: bool| compaction_config(tmp.path(), enabled);
    let node = TestNode::start_with(config(false)).await;
    node.create_index(&format!("{INDEX}compaction:\n  delete_ratio: 0.01\n"))
        .await;
    let mut rng = StdRng::seed_from_u64(5);
    let series = 40;
    for request in requests(&mut rng, series, 4) {
        write(&node, &request).await;
    }
    let end = T0 + POINTS * STEP_MS / 1000;
    let count = |selector: &str| format!("count_over_time({selector}[1h])");
    let job3 = "temperature{job=\"job-3\"}";
    let before = instant(&node, &count(job3), end).await;
    assert_eq!(before.len(), 4, "{before:?}"); // host-3, -13, -23, -33 (odd series of job-3)
    assert!(before.iter().all(|(_, v)| v == "120"), "{before:?}");

    // Delete job-3's temperature over the first 10 minutes.
    let resp = node
        .client
        .post(node.url("/prometheus/prom/api/v1/admin/tsdb/delete_series"))
        .form(&[
            ("match[]", job3.to_string()),
            ("start", T0.to_string()),
            ("end", (T0 + 599).to_string()),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        204,
        "{}",
        resp.text().await.unwrap()
    );
    let after = instant(&node, &count(job3), end).await;
    assert!(
        after.iter().all(|(_, v)| v == "80"),
        "40 of 120 samples gone: {after:?}"
    );
    // Other series untouched.
    let others = instant(&node, &count("temperature{job=\"job-5\"}"), end).await;
    assert!(others.iter().all(|(_, v)| v == "120"), "{others:?}");
    // A whole series deleted is gone from the series API too.
    let resp = node
        .client
        .post(node.url("/prometheus/prom/api/v1/admin/tsdb/delete_series"))
        .form(&[("match[]", "temperature{instance=\"host-13\"}")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    let (_, found) = node
        .get(&format!(
            "/prometheus/prom/api/v1/series?{}",
            encode(&format!("match[]={job3}&start={T0}&end={end}"))
        ))
        .await;
    assert_eq!(found["data"].as_array().unwrap().len(), 3, "{found}");
    // Written after the delete, in its window: kept (the delete reaches what was
    // acknowledged before it).
    write(
        &node,
        &WriteRequest {
            timeseries: vec![TimeSeries {
                labels: series_labels(3),
                samples: vec![ProtoSample {
                    value: 99.0,
                    timestamp: (T0 + 300) * 1000 + 1,
                }],
                ..Default::default()
            }],
            ..Default::default()
        },
    )
    .await;
    let with_late = instant(&node, &count(job3), end).await;
    assert_eq!(with_late.len(), 3, "{with_late:?}");
    let host3 = with_late
        .iter()
        .find(|(labels, _)| labels["instance"] == "host-3")
        .unwrap();
    assert_eq!(host3.1, "81");
    // Errors in Prometheus's shape.
    let (status, body) = node
        .post("/prometheus/prom/api/v1/admin/tsdb/delete_series", "")
        .await;
    assert_eq!((status, &body["errorType"]), (400, &json!("bad_data")));
    let expected: Vec<Vec<(Value, String)>> = vec![
        instant(&node, &count(job3), end).await,
        instant(&node, "sum(count_over_time(temperature[1h]))", end).await,
        instant(&node, "sum(count_over_time(requests_total[1h]))", end).await,
    ];
    node.stop().await;

    // Merges apply the deletes: the splits no longer hold the deleted samples.
    let node = TestNode::start_with(config(true)).await;
    let deleted = 4 * 40 + 80;
    let total = series as u64 * POINTS as u64 + 1 - deleted;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let splits = published(&node).await;
        let stored: u64 = splits.iter().map(|s| s.num_docs).sum();
        if splits.iter().all(|s| s.key_level == 1) && stored == total {
            break;
        }
        assert!(Instant::now() < deadline, "stored {stored}, want {total}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let answers = vec![
        instant(&node, &count(job3), end).await,
        instant(&node, "sum(count_over_time(temperature[1h]))", end).await,
        instant(&node, "sum(count_over_time(requests_total[1h]))", end).await,
    ];
    assert_eq!(answers, expected);

    // A delete on compacted (level-1) splits: delete compaction rewrites them.
    let resp = node
        .client
        .post(node.url("/prometheus/prom/api/v1/admin/tsdb/delete_series"))
        .form(&[("match[]", "requests_total{job=\"job-4\"}")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    let job4 = 4 * POINTS as u64; // host-4, -14, -24, -34
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stored: u64 = published(&node).await.iter().map(|s| s.num_docs).sum();
        if stored == total - job4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stored {stored}, want {}",
            total - job4
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(instant(&node, "requests_total{job=\"job-4\"}", end)
        .await
        .is_empty());
    node.stop().await;
}

/// How many series `query` at `time` returns as the index was at `as_of`.
async fn past(node: &TestNode, query: &str, time: i64, as_of: i64) -> usize {
    let (status, body) = node
        .get(&format!(
            "/prometheus/prom/api/v1/query?{}&as_of={as_of}",
            encode(&format!("query={query}&time={time}"))
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    body["data"]["result"].as_array().unwrap().len()
}

/// The level of each published split, by bucket start, sorted.
async fn levels(node: &TestNode) -> Vec<(Option<i64>, u8)> {
    let mut levels: Vec<(Option<i64>, u8)> = published(node)
        .await
        .iter()
        .map(|s| (s.time_bucket_start, s.key_level))
        .collect();
    levels.sort();
    levels
}

/// One sample of each of `series` series at `time_ms`, as one request.
fn lone_request(series: usize, time_ms: i64) -> WriteRequest {
    WriteRequest {
        timeseries: (0..series)
            .map(|i| TimeSeries {
                labels: series_labels(i),
                samples: vec![ProtoSample {
                    value: value(i, 0),
                    timestamp: time_ms,
                }],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// A manual compaction of a metrics index turns every closed bucket into level-1 splits
/// (a bucket's lone split too), and time travel (`as_of`) answers as the index was before a
/// `delete_series` and before the compaction that replaced its splits; a lone split in a
/// closed bucket is rewritten into level 1 by automatic compaction too.
#[tokio::test]
async fn manual_compaction_and_time_travel_of_a_metrics_index() {
    let tmp = tempfile::tempdir().unwrap();
    let config = |enabled: bool| compaction_config(tmp.path(), enabled);
    let node = TestNode::start_with(config(false)).await;
    node.create_index(&format!("{INDEX}time_travel_retention: 1h\n"))
        .await;
    let mut rng = StdRng::seed_from_u64(7);
    let series = 40;
    for request in requests(&mut rng, series, 4) {
        write(&node, &request).await;
    }
    // A third bucket, an hour later, written once: its only split.
    write(&node, &lone_request(series, (T0 + 3600) * 1000)).await;
    let before = levels(&node).await;
    assert!(before.iter().all(|(_, level)| *level == 0), "{before:?}");
    let lone_bucket = before.last().unwrap().0;
    assert_eq!(before.iter().filter(|(b, _)| *b == lone_bucket).count(), 1);
    let splits_before = before.len();
    assert!(splits_before > 3, "{before:?}");

    let end = T0 + 3600;
    let job3 = "count_over_time(temperature{job=\"job-3\"}[2h])";
    let total = "sum(count_over_time({__name__=~\".+\"}[2h]))";
    let all_samples = (series as u64 * POINTS as u64 + series as u64).to_string();
    let at_start = instant(&node, job3, end).await;
    assert_eq!(at_start.len(), 4, "{at_start:?}");
    assert_eq!(instant(&node, total, end).await[0].1, all_samples);
    let as_of = shale_types::now_unix_secs();
    // A delete task made in a later second than `as_of`.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let resp = node
        .client
        .post(node.url("/prometheus/prom/api/v1/admin/tsdb/delete_series"))
        .form(&[("match[]", "temperature{job=\"job-3\"}")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    assert!(instant(&node, job3, end).await.is_empty());
    assert_eq!(
        past(&node, job3, end, as_of).await,
        4,
        "as_of sees the deleted series"
    );

    // A manual compaction (automatic compaction is off on this node).
    let (status, resp) = node
        .post("/api/v1/indexes/prom/compact", json!({}).to_string())
        .await;
    assert_eq!(status, 200, "{resp}");
    let id = resp["compaction_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let done = loop {
        let (_, resp) = node
            .get(&format!("/api/v1/indexes/prom/compactions/{id}"))
            .await;
        if resp["state"] == "completed" || resp["state"] == "failed" {
            break resp;
        }
        assert!(Instant::now() < deadline, "compaction stuck: {resp}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["splits_before"], splits_before as u64);
    let after = levels(&node).await;
    assert!(after.iter().all(|(_, level)| *level == 1), "{after:?}");
    assert_eq!(after.iter().filter(|(b, _)| *b == lone_bucket).count(), 1);
    // The delete is inside the time-travel window: the merges kept its samples, which
    // queries still leave out; the past still sees them, through the replaced splits.
    let stored: u64 = published(&node).await.iter().map(|s| s.num_docs).sum();
    assert_eq!(stored.to_string(), all_samples);
    assert!(instant(&node, job3, end).await.is_empty());
    assert_eq!(past(&node, job3, end, as_of).await, 4);
    assert_eq!(
        instant(&node, total, end).await[0].1,
        (series as u64 * POINTS as u64 + series as u64 - 4 * 120 - 4).to_string()
    );

    // Errors in Prometheus's shape.
    let (status, body) = node
        .get(&format!(
            "/prometheus/prom/api/v1/query?{}",
            encode(&format!("query=up&as_of={}", as_of - 7200))
        ))
        .await;
    assert_eq!(
        (status, &body["errorType"]),
        (400, &json!("bad_data")),
        "{body}"
    );
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("time-travel window"),
        "{body}"
    );
    node.create_index(&INDEX.replace("index_id: prom", "index_id: plain"))
        .await;
    let (status, body) = node
        .get(&format!(
            "/prometheus/plain/api/v1/query?{}",
            encode(&format!("query=up&as_of={as_of}"))
        ))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("time travel is off"),
        "{body}"
    );

    // Automatic compaction: a lone split of a closed bucket becomes level 1 too.
    write(&node, &lone_request(series, (T0 + 7200) * 1000)).await;
    node.stop().await;
    let node = TestNode::start_with(config(true)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let levels = levels(&node).await;
        if levels.iter().all(|(_, level)| *level == 1) {
            break;
        }
        assert!(Instant::now() < deadline, "{levels:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    node.stop().await;
}
