//! The same binary on PostgreSQL + S3: a node whose metastore is a real PostgreSQL server and
//! whose splits live on a real S3-compatible server (both on loopback, started by the test
//! kit or by CI). Ingest, search, restart, delete; splits on S3 read by byte ranges.

use crate::common;

use common::{log_docs, TestNode, LOGS_INDEX};
use serde_json::json;

#[tokio::test]
async fn ingest_and_search_on_postgres_and_s3() {
    let Some(pg_url) = shale_testkit::postgres::test_database_url().await else {
        return;
    };
    let Some((endpoint, bucket)) = shale_testkit::s3::test_bucket() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let make_config = || {
        let mut config = common::config_in(tmp.path());
        config.metastore_uri = pg_url.clone();
        config.default_index_root_uri = format!("s3://{bucket}/indexes");
        config.s3.endpoint = Some(endpoint.clone());
        config.s3.region = Some("us-east-1".into());
        config.s3.access_key_id = Some(shale_testkit::s3::ACCESS_KEY.into());
        config.s3.secret_access_key = Some(shale_testkit::s3::SECRET_KEY.into());
        config.s3.force_path_style = true;
        config.s3.allow_http = true;
        config
    };
    let node = TestNode::start_with(make_config()).await;
    node.create_index(LOGS_INDEX).await;
    node.ingest("logs", &log_docs(0, 500, 1_700_000_000, "api"), "force")
        .await;
    node.ingest("logs", &log_docs(500, 500, 1_700_000_000, "db"), "wait_for")
        .await;
    assert_eq!(node.count("logs", "*").await, 1000);
    assert_eq!(node.count("logs", "service:db AND level:ERROR").await, 50);
    let resp = node
        .search(
            "logs",
            json!({"query": "\"request 777 handled\"", "max_hits": 1}),
        )
        .await;
    assert_eq!(resp["num_hits"], 1);
    assert_eq!(resp["hits"][0]["doc_id"], "db-777");

    // The split objects are on S3.
    let storage =
        shale_storage::StorageResolver::new(shale_server::node::s3_options(&make_config()))
            .resolve(&format!("s3://{bucket}/indexes/logs"))
            .unwrap();
    let objects = storage.list().await.unwrap();
    assert_eq!(objects.len(), 2, "{objects:?}");
    assert!(objects.iter().all(|o| o.ends_with(".split")));

    // A restart (fresh cache) reads everything back from PostgreSQL and S3.
    node.stop().await;
    let node = TestNode::start_with(make_config()).await;
    assert_eq!(node.count("logs", "*").await, 1000);
    let (status, _) = node.delete("/api/v1/indexes/logs").await;
    assert_eq!(status, 200);
    assert!(storage.list().await.unwrap().is_empty());
    node.stop().await;
}

/// Splits on S3 are searched without being downloaded: a fresh node opens each from its hot
/// cache and reads by ranges only what the queries touch — with the same answers as a node
/// that downloads whole splits.
#[tokio::test]
async fn splits_on_s3_are_read_by_ranges_not_downloaded() {
    let Some((endpoint, bucket)) = shale_testkit::s3::test_bucket() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let make_config = |range_cache_max_bytes: u64| {
        let mut config = common::config_in(tmp.path());
        config.default_index_root_uri = format!("s3://{bucket}/indexes");
        config.s3.endpoint = Some(endpoint.clone());
        config.s3.access_key_id = Some(shale_testkit::s3::ACCESS_KEY.into());
        config.s3.secret_access_key = Some(shale_testkit::s3::SECRET_KEY.into());
        config.range_cache_max_bytes = range_cache_max_bytes;
        config
    };
    let node = TestNode::start_with(make_config(64 << 20)).await;
    node.create_index(
        &LOGS_INDEX.replace("commit_timeout_secs: 1\n", "commit_timeout_secs: 600\n"),
    )
    .await;
    // 200 000 documents in 2 splits of 100 000 (about 12 MB: many fetch windows per file).
    // The commit timeout is long and every fourth batch commits, so that the layout does not
    // depend on the machine's load (a loaded machine would cut more, smaller splits, and each
    // split adds its hot cache and dictionaries to what a query reads).
    for batch in 0..8 {
        let service = if batch < 4 { "api" } else { "db" };
        let commit = if batch % 4 == 3 { "force" } else { "auto" };
        node.ingest(
            "logs",
            &log_docs(batch * 25_000, 25_000, 1_700_000_000, service),
            commit,
        )
        .await;
    }
    node.stop().await;

    let storage =
        shale_storage::StorageResolver::new(shale_server::node::s3_options(&make_config(0)))
            .resolve(&format!("s3://{bucket}/indexes/logs"))
            .unwrap();
    let mut split_bytes = 0;
    for name in storage.list().await.unwrap() {
        split_bytes += storage.get_bytes(&name).await.unwrap().len() as u64;
    }

    let queries = [
        json!({"query": "level:ERROR", "max_hits": 5, "sort_by": "timestamp"}),
        json!({"query": "\"request 131337 handled\"", "max_hits": 1}),
        json!({"query": "service:db AND status:203", "max_hits": 3, "sort_by": "-timestamp"}),
        json!({"query": "*", "max_hits": 0,
               "aggs": {"per_status": {"terms": {"field": "status"}}}}),
    ];

    // By ranges. A selective first query reads a small part of the splits.
    let node = TestNode::start_with(make_config(64 << 20)).await;
    let ranges = node.node.search.leaf().range_cache().unwrap();
    let first = answers(&node, &queries[..1]).await;
    let first_fetched = ranges.fetched_bytes();
    eprintln!(
        "the first query fetched {first_fetched} of {split_bytes} split bytes ({} splits) in {} GETs",
        storage.list().await.unwrap().len(),
        ranges.fetches()
    );
    assert!(first_fetched > 0);
    assert!(
        first_fetched < split_bytes / 2,
        "the first query fetched {first_fetched} of {split_bytes} split bytes"
    );
    let by_ranges = answers(&node, &queries).await;
    assert_eq!(by_ranges[..1], first[..]);
    assert_eq!(by_ranges[0]["num_hits"], 20_000);
    assert_eq!(by_ranges[0]["hits"][0]["doc_id"], "db-199990");
    assert_eq!(by_ranges[1]["hits"][0]["doc_id"], "db-131337");
    assert_eq!(by_ranges[2]["num_hits"], 20_000);
    assert_eq!(by_ranges[2]["hits"][0]["doc_id"], "db-100003");
    // Nothing was downloaded whole.
    assert_eq!(node.node.search.cache().downloaded_bytes(), 0);
    let fetched = ranges.fetched_bytes();
    // Prometheus shows it.
    let metrics = node.metrics().await;
    assert!(
        metrics.contains(&format!(
            "shale_range_cache{{stat=\"fetched_bytes\"}} {fetched}"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("shale_split_cache{stat=\"downloaded_bytes\"} 0"));
    // Again: served from memory.
    assert_eq!(answers(&node, &queries).await, by_ranges);
    assert_eq!(ranges.fetched_bytes(), fetched);
    node.stop().await;

    // Whole splits: the same answers, every split downloaded.
    let node = TestNode::start_with(make_config(0)).await;
    assert_eq!(answers(&node, &queries).await, by_ranges);
    assert!(node.node.search.leaf().range_cache().is_none());
    assert_eq!(node.node.search.cache().downloaded_bytes(), split_bytes);
    node.stop().await;
}

/// The responses to `queries` on index `logs`, without their timings.
async fn answers(node: &TestNode, queries: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for query in queries {
        let mut resp = node.search("logs", query.clone()).await;
        resp.as_object_mut().unwrap().remove("elapsed_time_micros");
        out.push(resp);
    }
    out
}
