//! The REST API end to end on a real node (SQLite metastore, splits on local disk).

use crate::common;

use common::{log_docs, TestNode, LOGS_INDEX};
use serde_json::json;

const T0: i64 = 1_700_000_000;

#[tokio::test]
async fn index_lifecycle_and_config_errors() {
    let node = TestNode::start().await;
    let created = node.create_index(LOGS_INDEX).await;
    assert!(created["index_uid"].as_str().unwrap().starts_with("logs:"));
    assert!(!created["index_config"]["doc_mapping"]["doc_mapping_uid"]
        .as_str()
        .unwrap()
        .is_empty());

    // duplicate
    let (status, body) = node.post("/api/v1/indexes", LOGS_INDEX.to_string()).await;
    assert_eq!(status, 400);
    assert!(
        body["message"].as_str().unwrap().contains("already exists"),
        "{body}"
    );

    // invalid index id, named in the message
    let bad = LOGS_INDEX.replace("index_id: logs", "index_id: 1bad");
    let (status, body) = node.post("/api/v1/indexes", bad).await;
    assert_eq!(status, 400);
    assert!(
        body["message"].as_str().unwrap().contains("index_id"),
        "{body}"
    );

    // merge policy: an unknown type, a bad parameter or a bad retention schedule is a 400
    // naming the field, and nothing is created
    for (bad, field) in [
        (
            "indexing_settings:\n  merge_policy:\n    type: fancy\n",
            "indexing_settings.merge_policy.type",
        ),
        (
            "indexing_settings:\n  merge_policy:\n    type: limit_merge\n    max_merge_ops: -1\n",
            "indexing_settings.merge_policy.max_merge_ops",
        ),
        (
            "retention:\n  period: 30 days\n  schedule: sometimes\n",
            "retention.schedule",
        ),
    ] {
        let config = LOGS_INDEX
            .replace("index_id: logs", "index_id: policy-test")
            .replace("indexing_settings:\n  commit_timeout_secs: 1\n", "")
            + bad;
        let (status, body) = node.post("/api/v1/indexes", config).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains(field),
            "{bad}: {body}"
        );
    }
    let (status, _) = node.get("/api/v1/indexes/policy-test").await;
    assert_eq!(status, 404);

    // JSON config accepted too
    let json_config = json!({
        "version": "0.8",
        "index_id": "other-index",
        "doc_mapping": {"field_mappings": [{"name": "body", "type": "text"}]}
    });
    let (status, body) = node.post("/api/v1/indexes", json_config.to_string()).await;
    assert_eq!(status, 200, "{body}");

    let (status, list) = node.get("/api/v1/indexes").await;
    assert_eq!(status, 200);
    // With the OpenTelemetry indexes every node creates at start (as Quickwit's).
    let mut ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|index| index["index_config"]["index_id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids.len(), 5, "{ids:?}");
    assert!(ids.contains(&"other-index"), "{ids:?}");
    assert!(ids.contains(&"otel-logs-v0_9") && ids.contains(&"otel-traces-v0_9"));
    assert!(ids.contains(&"otel-metrics-v0_9"), "{ids:?}");

    let (status, body) = node.get("/api/v1/indexes/nope").await;
    assert_eq!(status, 404);
    assert!(body["message"].as_str().unwrap().contains("nope"));

    let (status, _) = node.delete("/api/v1/indexes/other-index").await;
    assert_eq!(status, 200);
    let (status, _) = node.get("/api/v1/indexes/other-index").await;
    assert_eq!(status, 404);
    node.stop().await;
}

#[tokio::test]
async fn ingest_reports_bad_documents_and_indexes_the_rest() {
    let node = TestNode::start().await;
    node.create_index(LOGS_INDEX).await;
    let mut body = log_docs(0, 50, T0, "api");
    body.push_str("{not json\n");
    body.push_str(&json!({"service": "api", "message": "no timestamp"}).to_string());
    body.push('\n');
    body.push_str(&json!({"timestamp": "yesterday", "message": "bad ts"}).to_string());
    body.push('\n');
    body.push_str(&json!({"timestamp": T0, "status": "not-a-number", "message": "x"}).to_string());
    body.push('\n');
    let response = node.ingest("logs", &body, "force").await;
    assert_eq!(response["num_docs_for_processing"], 54);
    assert_eq!(response["num_ingested_docs"], 50);
    assert_eq!(response["num_rejected_docs"], 4);
    let failures = response["parse_failures"].as_array().unwrap();
    assert_eq!(failures.len(), 4);
    assert_eq!(failures[0]["doc_index"], 50);
    assert!(failures[1]["message"]
        .as_str()
        .unwrap()
        .contains("timestamp"));
    assert!(failures[3]["message"].as_str().unwrap().contains("status"));
    assert_eq!(node.count("logs", "*").await, 50);

    // unknown index, body too large, bad commit value
    let (status, body) = node.post("/api/v1/nope/ingest", "{}\n").await;
    assert_eq!(status, 404);
    assert!(body["message"].as_str().unwrap().contains("nope"));
    let huge = "x".repeat(11 * 1024 * 1024);
    let (status, body) = node.post("/api/v1/logs/ingest", huge).await;
    assert_eq!(status, 413);
    assert!(body["message"].as_str().unwrap().contains("limit"));
    let (status, body) = node.post("/api/v1/logs/ingest?commit=maybe", "{}\n").await;
    assert_eq!(status, 400);
    assert!(body["message"].as_str().unwrap().contains("commit"));
    node.stop().await;
}

#[tokio::test]
async fn search_queries_sorting_paging_and_pruning() {
    let node = TestNode::start().await;
    node.create_index(LOGS_INDEX).await;
    // three splits: api (0..100), db (100..200), web (200..300); each 100 s apart
    node.ingest("logs", &log_docs(0, 100, T0, "api"), "force")
        .await;
    node.ingest("logs", &log_docs(100, 100, T0, "db"), "force")
        .await;
    node.ingest("logs", &log_docs(200, 100, T0, "web"), "force")
        .await;

    assert_eq!(node.count("logs", "*").await, 300);
    assert_eq!(node.count("logs", "level:ERROR").await, 30);
    assert_eq!(node.count("logs", "fox").await, 300);
    assert_eq!(node.count("logs", "\"handled by db\"").await, 100);
    assert_eq!(node.count("logs", "\"db handled\"").await, 0);
    assert_eq!(node.count("logs", "status:[201 TO 202]").await, 120);
    assert_eq!(node.count("logs", "level:ERROR AND host:host-0").await, 10);
    assert_eq!(node.count("logs", "service:api OR service:web").await, 200);
    assert_eq!(node.count("logs", "fox AND NOT level:INFO").await, 30);

    // time range: [T0+50, T0+150) -> 100 docs; one split pruned (web)
    let resp = node
        .search(
            "logs",
            json!({"query": "*", "start_timestamp": T0 + 50, "end_timestamp": T0 + 150, "max_hits": 0}),
        )
        .await;
    assert_eq!(resp["num_hits"], 100);
    assert_eq!(resp["num_splits_searched"], 2);
    assert_eq!(resp["num_splits_pruned"], 1);

    // tag pruning: only the db split is opened
    let resp = node
        .search(
            "logs",
            json!({"query": "service:db AND level:ERROR", "max_hits": 5}),
        )
        .await;
    assert_eq!(resp["num_hits"], 10);
    assert_eq!(resp["num_splits_searched"], 1);
    assert_eq!(resp["num_splits_pruned"], 2);
    assert_eq!(resp["hits"].as_array().unwrap().len(), 5);
    assert!(resp["hits"][0]["service"] == "db");

    // sort: default is timestamp desc, paging with start_offset
    let resp = node
        .search(
            "logs",
            json!({"query": "*", "max_hits": 3, "start_offset": 1}),
        )
        .await;
    let ids: Vec<&str> = resp["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["doc_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["web-298", "web-297", "web-296"]);
    let resp = node
        .search(
            "logs",
            json!({"query": "*", "max_hits": 2, "sort_by": "timestamp:asc"}),
        )
        .await;
    assert_eq!(resp["hits"][0]["doc_id"], "api-0");
    assert_eq!(resp["hits"][1]["doc_id"], "api-1");
    // GET form; Quickwit's mini-language: `-field` ascending, `+field` descending.
    let (status, resp) = node
        .get("/api/v1/logs/search?query=service:web&max_hits=1&sort_by=-timestamp")
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["num_hits"], 100);
    assert_eq!(resp["hits"][0]["doc_id"], "web-200");
    let (_, resp) = node
        .get("/api/v1/logs/search?query=service:web&max_hits=1&sort_by=%2Btimestamp")
        .await;
    assert_eq!(resp["hits"][0]["doc_id"], "web-299");
    let (status, resp) = node
        .get("/api/v1/logs/search?query=host-1&search_field=host,level&max_hits=0&start_timestamp=1700000000")
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["num_hits"], 100);
    let (status, resp) = node.get("/api/v1/logs/search?query=*&max_hits=lots").await;
    assert_eq!(status, 400, "{resp}");
    assert!(resp["message"].as_str().is_some(), "{resp}");
    // search_field
    let resp = node
        .search(
            "logs",
            json!({"query": "host-1", "search_field": "host", "max_hits": 0}),
        )
        .await;
    assert_eq!(resp["num_hits"], 100);

    // errors
    let (status, body) = node
        .post(
            "/api/v1/logs/search",
            json!({"query": "message:(unclosed"}).to_string(),
        )
        .await;
    assert_eq!(status, 400);
    assert!(!body["message"].as_str().unwrap().is_empty());
    let (status, body) = node
        .post(
            "/api/v1/logs/search",
            json!({"query": "nosuchfield:x"}).to_string(),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = node.get("/api/v1/nope/search?query=*").await;
    assert_eq!(status, 404);
    node.stop().await;
}

#[tokio::test]
async fn elasticsearch_bulk_reports_per_item_status() {
    let node = TestNode::start().await;
    node.create_index(LOGS_INDEX).await;
    let doc =
        |i: i64| json!({"timestamp": T0 + i, "service": "es", "message": format!("bulk {i}")});
    let mut body = String::new();
    for line in [
        json!({"index": {"_index": "logs", "_id": "1"}}),
        doc(1),
        json!({"create": {"_index": "logs"}}),
        doc(2),
        json!({"index": {"_index": "missing-index"}}),
        doc(3),
        json!({"index": {"_index": "logs"}}),
        json!({"service": "es", "message": "no timestamp"}),
        json!({"delete": {"_index": "logs", "_id": "1"}}),
    ] {
        body.push_str(&line.to_string());
        body.push('\n');
    }
    let (status, resp) = node
        .post("/api/v1/_elastic/_bulk?refresh=wait_for", body)
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["errors"], true);
    let items = resp["items"].as_array().unwrap();
    assert_eq!(items.len(), 5);
    assert_eq!(items[0]["index"]["status"], 201);
    assert_eq!(items[0]["index"]["_id"], "1");
    assert_eq!(items[1]["create"]["status"], 201);
    assert_eq!(items[2]["index"]["status"], 404);
    assert_eq!(
        items[2]["index"]["error"]["type"],
        "index_not_found_exception"
    );
    assert_eq!(items[3]["index"]["status"], 400);
    assert!(items[3]["index"]["error"]["reason"]
        .as_str()
        .unwrap()
        .contains("timestamp"));
    assert_eq!(items[4]["delete"]["status"], 400);
    assert_eq!(node.count("logs", "bulk").await, 2);

    // the index-scoped form
    let body = format!("{}\n{}\n", json!({"index": {}}), doc(4));
    let (status, resp) = node
        .post("/api/v1/_elastic/logs/_bulk?refresh=true", body)
        .await;
    assert_eq!(status, 200);
    assert_eq!(resp["errors"], false);
    assert_eq!(node.count("logs", "bulk").await, 3);

    // Blank lines are not counted (Quickwit's numbering).
    let (status, resp) = node.post("/api/v1/_elastic/_bulk", "\n  \n{oops\n").await;
    assert_eq!(status, 400);
    assert_eq!(resp["error"]["type"], "illegal_argument_exception");
    assert!(
        resp["error"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("Malformed action/metadata line [1]"),
        "{resp}"
    );
    assert_eq!(resp["status"], 400);
    node.stop().await;
}

#[tokio::test]
async fn splits_listing_health_and_metrics() {
    let node = TestNode::start().await;
    node.create_index(LOGS_INDEX).await;
    node.ingest("logs", &log_docs(0, 10, T0, "api"), "force")
        .await;
    let (status, resp) = node.get("/api/v1/indexes/logs/splits").await;
    assert_eq!(status, 200);
    let splits = resp["splits"].as_array().unwrap();
    assert_eq!(splits.len(), 1);
    let split = &splits[0];
    assert_eq!(split["split_state"], "Published");
    assert_eq!(split["num_docs"], 10);
    assert_eq!(split["time_range"]["start"], T0);
    assert_eq!(split["time_range"]["end"], T0 + 9);
    assert_eq!(split["node_id"], "test-node");
    assert!(split["tags"]
        .as_array()
        .unwrap()
        .contains(&json!("service:api")));
    let (_, resp) = node
        .get("/api/v1/indexes/logs/splits?split_states=Staged")
        .await;
    assert_eq!(resp["splits"].as_array().unwrap().len(), 0);
    let (status, _) = node
        .get("/api/v1/indexes/logs/splits?split_states=bogus")
        .await;
    assert_eq!(status, 400);
    let (_, resp) = node
        .get(&format!(
            "/api/v1/indexes/logs/splits?start_timestamp={}",
            T0 + 100
        ))
        .await;
    assert_eq!(resp["splits"].as_array().unwrap().len(), 0);

    assert_eq!(node.get("/health/livez").await.0, 200);
    assert_eq!(node.get("/health/readyz").await.0, 200);
    let text = node.metrics().await;
    for name in [
        "shale_ingest_docs_total",
        "shale_ingest_bytes_total",
        "shale_splits{index=\"logs\",state=\"Published\"} 1",
        "shale_wal_disk_bytes",
        "shale_search_latency_seconds_bucket",
    ] {
        assert!(text.contains(name), "metric {name} missing:\n{text}");
    }
    node.stop().await;
}

#[tokio::test]
async fn documents_acknowledged_in_the_wal_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let node = TestNode::start_with(common::config_in(tmp.path())).await;
    node.create_index(&LOGS_INDEX.replace("commit_timeout_secs: 1", "commit_timeout_secs: 3600"))
        .await;
    node.ingest("logs", &log_docs(0, 40, T0, "api"), "force")
        .await;
    // in the WAL only (commit timeout 1 h)
    let resp = node
        .ingest("logs", &log_docs(40, 60, T0, "api"), "auto")
        .await;
    assert_eq!(resp["num_ingested_docs"], 60);
    assert_eq!(node.count("logs", "*").await, 40);
    node.stop().await;

    let node = TestNode::start_with(common::config_in(tmp.path())).await;
    assert_eq!(node.count("logs", "*").await, 40);
    // a forced commit publishes the replayed WAL records, exactly once
    node.ingest("logs", &log_docs(100, 1, T0, "api"), "force")
        .await;
    assert_eq!(node.count("logs", "*").await, 101);
    let resp = node
        .search("logs", json!({"query": "doc_id:api-50", "max_hits": 10}))
        .await;
    assert_eq!(resp["num_hits"], 1);
    node.stop().await;
}

#[tokio::test]
async fn partition_key_splits_documents_and_caps_partitions() {
    let node = TestNode::start().await;
    let config = LOGS_INDEX
        .replace("index_id: logs", "index_id: plogs")
        .replace(
            "  tag_fields: [service]",
            "  tag_fields: [service]\n  partition_key: service\n  max_num_partitions: 2",
        );
    node.create_index(&config).await;
    let mut body = log_docs(0, 30, T0, "api");
    body.push_str(&log_docs(30, 20, T0, "db"));
    body.push_str(&log_docs(50, 10, T0, "web"));
    node.ingest("plogs", &body, "force").await;
    let (_, resp) = node.get("/api/v1/indexes/plogs/splits").await;
    let splits = resp["splits"].as_array().unwrap();
    assert_eq!(splits.len(), 3, "{resp}");
    let mut by_docs: Vec<(u64, u64)> = splits
        .iter()
        .map(|s| {
            (
                s["num_docs"].as_u64().unwrap(),
                s["partition_id"].as_u64().unwrap(),
            )
        })
        .collect();
    by_docs.sort();
    // the third service overflows into the catch-all partition
    assert_eq!(by_docs[0], (10, u64::MAX));
    assert_eq!(by_docs[1].0, 20);
    assert_eq!(by_docs[2].0, 30);
    assert_ne!(by_docs[1].1, by_docs[2].1);
    // each split holds one service: tag pruning opens one split
    let resp = node
        .search("plogs", json!({"query": "service:db", "max_hits": 0}))
        .await;
    assert_eq!(resp["num_hits"], 20);
    assert_eq!(resp["num_splits_searched"], 1);
    node.stop().await;
}

#[tokio::test]
async fn staged_splits_left_by_a_crash_are_cleaned_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let node = TestNode::start_with(common::config_in(tmp.path())).await;
    node.create_index(LOGS_INDEX).await;
    node.ingest("logs", &log_docs(0, 5, T0, "api"), "force")
        .await;
    let (orphan, storage) = common::stage_orphan(&node, "logs", b"partial upload").await;
    node.stop().await;

    let node = TestNode::start_with(common::config_in(tmp.path())).await;
    let (_, resp) = node.get("/api/v1/indexes/logs/splits").await;
    let splits = resp["splits"].as_array().unwrap();
    assert_eq!(splits.len(), 1);
    assert_eq!(splits[0]["split_state"], "Published");
    assert!(!storage.exists(&orphan.object_key()).await.unwrap());
    assert_eq!(node.count("logs", "*").await, 5);
    node.stop().await;
}

/// Shards are synchronized with the shards table every heartbeat, while indexes are created
/// and their first documents arrive: a synchronization that read the table before a shard
/// was served must not close it (a 503 for the ingest) or drop its WAL queue as a deleted
/// index's (losing the acknowledged documents). Seen as a flaky 503 under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_synchronization_racing_index_creation_loses_nothing() {
    let node = TestNode::start().await;
    let syncing = {
        let node = node.node.clone();
        tokio::spawn(async move {
            loop {
                let _ = node.sync_shards().await;
                tokio::task::yield_now().await;
            }
        })
    };
    for i in 0..15 {
        let index = common::LOGS_INDEX.replace("index_id: logs", &format!("index_id: race-{i}"));
        node.create_index(&index).await;
        let (status, body) = node
            .post(
                &format!("/api/v1/race-{i}/ingest?commit=auto"),
                common::log_docs(0, 10, 1_700_000_000, "api"),
            )
            .await;
        assert_eq!(status, 200, "race-{i}: {body}");
    }
    syncing.abort();
    for i in 0..15 {
        let index = format!("race-{i}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while node.count(&index, "*").await != 10 {
            assert!(
                std::time::Instant::now() < deadline,
                "{index}: acknowledged documents lost"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    node.stop().await;
}
