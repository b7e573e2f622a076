//! One index whose storage cannot be reached (an S3 endpoint where nothing listens) does not
//! keep the node from starting and serving its other indexes: the broken index's searches
//! and ingests answer 503 naming its storage, and the janitor keeps trying it.

use crate::common;

use std::time::Instant;

use common::{TestNode, LOGS_INDEX};
use serde_json::json;

const T0: i64 = 1_700_000_000;

/// An index like `logs`, named `remote`, whose splits live on S3.
fn remote_index() -> String {
    LOGS_INDEX.replace(
        "index_id: logs",
        "index_id: remote\nindex_uri: s3://bucket/x",
    )
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_with_an_unreachable_index_storage_serves_its_other_indexes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    config.s3.endpoint = Some(format!("http://127.0.0.1:{}", closed_port()));
    config.s3.region = Some("us-east-1".into());
    config.s3.access_key_id = Some("test".into());
    config.s3.secret_access_key = Some("test".into());
    config.s3.force_path_style = true;
    config.s3.allow_http = true;
    // Refused connections fail at once instead of after the client's 10 retries.
    config.s3.max_retries = Some(1);

    // A first run creates both indexes; the broken one is left with a split this node
    // staged (as a crash during an upload would leave it), which a start cleans up.
    let node = TestNode::start_with(config.clone()).await;
    node.create_index(LOGS_INDEX).await;
    node.create_index(&remote_index()).await;
    node.ingest("logs", &common::log_docs(0, 10, T0, "api"), "force")
        .await;
    let logs = node.node.metastore.index_metadata("logs").await.unwrap();
    let remote = node.node.metastore.index_metadata("remote").await.unwrap();
    let mut staged = node
        .node
        .metastore
        .list_splits(shale_metastore::ListSplitsQuery::for_index(
            logs.index_uid.clone(),
        ))
        .await
        .unwrap()[0]
        .split_metadata
        .clone();
    staged.split_id = shale_types::new_ulid();
    staged.index_uid = remote.index_uid.clone();
    node.node
        .metastore
        .stage_splits(&remote.index_uid, vec![staged])
        .await
        .unwrap();
    node.stop().await;

    // The node starts, and serves the healthy index.
    let started = Instant::now();
    let node = TestNode::start_with(config).await;
    eprintln!("started in {:?}", started.elapsed());
    node.ingest("logs", &common::log_docs(10, 5, T0 + 10, "api"), "force")
        .await;
    assert_eq!(node.count("logs", "*").await, 15);

    // The broken index answers 503, naming its storage.
    let (status, body) = node
        .post(
            "/api/v1/remote/search",
            json!({"query": "*", "max_hits": 0}).to_string(),
        )
        .await;
    assert_eq!(status, 503, "search of the unreachable index: {body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("s3://bucket/x") && message.contains("cannot be reached"),
        "{message}"
    );
    let (status, body) = node
        .post(
            "/api/v1/remote/ingest?commit=force",
            common::log_docs(0, 3, T0, "api"),
        )
        .await;
    assert_eq!(status, 503, "ingest into the unreachable index: {body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("s3://bucket/x")),
        "{body}"
    );

    // The janitor goes on with the other indexes and keeps the broken one for later.
    let report = node.node.run_janitor().await.unwrap();
    assert_eq!(report.unreachable_indexes, vec![remote.index_uid.clone()]);
    assert_eq!(node.count("logs", "*").await, 15);
    node.stop().await;
}
