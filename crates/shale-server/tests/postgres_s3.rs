//! The same binary on PostgreSQL + S3: a node whose metastore is a real PostgreSQL server and
//! whose splits live on a real S3-compatible server (both on loopback, started by the test
//! kit or by CI). Ingest, search, restart, delete.

mod common;

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
