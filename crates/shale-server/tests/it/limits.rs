//! Bounded resources and honest failures: every limit of a node answers with a clear JSON
//! error (429 + `Retry-After` when a retry can succeed), a bulk request into several indexes
//! gives each item its own status, a panicking handler is a JSON 500, and the split cache
//! budget holds while searching.

use crate::common;

use std::time::{Duration, Instant};

use common::{config_in, log_docs, TestNode, LOGS_INDEX};
use serde_json::{json, Value};

const T0: i64 = 1_700_000_000;

async fn raw_post(node: &TestNode, path: &str, body: String) -> (u16, Option<String>, Value) {
    let resp = node
        .client
        .post(node.url(path))
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (
        status,
        retry_after,
        resp.json().await.unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn max_hits_and_start_offset_are_bounded() {
    let node = TestNode::start().await;
    node.create_index(LOGS_INDEX).await;
    node.ingest("logs", &log_docs(0, 10, T0, "api"), "force")
        .await;
    for (request, needle) in [
        (
            json!({"query": "*", "max_hits": 10_001}),
            "max value for max_hits is 10_000, but got 10001",
        ),
        (
            json!({"query": "*", "start_offset": 10_001}),
            "max value for start_offset is 10_000, but got 10001",
        ),
        (
            json!({"query": "*", "max_hits": u64::MAX}),
            "max value for max_hits is 10_000",
        ),
    ] {
        let (status, body) = node.post("/api/v1/logs/search", request.to_string()).await;
        assert_eq!(status, 400, "{request}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(needle), "{request}: {message}");
    }
    let (status, body) = node
        .get("/api/v1/logs/search?query=*&max_hits=99999999999999999999999")
        .await;
    assert_eq!(status, 400, "{body}");
    let response = node
        .search(
            "logs",
            json!({"query": "*", "max_hits": 10_000, "start_offset": 10_000}),
        )
        .await;
    assert_eq!(response["num_hits"], 10);
    assert!(response["hits"].as_array().unwrap().is_empty());
    let response = node
        .search("logs", json!({"query": "*", "max_hits": 10_000}))
        .await;
    assert_eq!(response["hits"].as_array().unwrap().len(), 10);
    node.stop().await;
}

#[tokio::test]
async fn concurrent_searches_beyond_the_limit_get_a_429() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config_in(tmp.path());
    config.max_concurrent_searches = 2;
    let node = TestNode::start_with(config).await;
    node.create_index(LOGS_INDEX).await;
    node.ingest("logs", &log_docs(0, 10, T0, "api"), "force")
        .await;
    // Two searches in progress (their permits held here).
    let held = node
        .node
        .search
        .search_permits()
        .clone()
        .try_acquire_many_owned(2)
        .unwrap();
    let (status, retry_after, body) = raw_post(
        &node,
        "/api/v1/logs/search",
        json!({"query": "*"}).to_string(),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("max_concurrent_searches"),
        "{body}"
    );
    drop(held);
    assert_eq!(node.count("logs", "*").await, 10);
    node.stop().await;
}

#[tokio::test]
async fn ingest_beyond_the_in_flight_bytes_gets_a_429_and_nothing_is_ingested() {
    let node = TestNode::start().await;
    node.create_index(LOGS_INDEX).await;
    let permits = node.node.router.in_flight_permits().clone();
    let all = permits.available_permits() as u32;
    let held = permits.try_acquire_many_owned(all).unwrap();
    let (status, retry_after, body) = raw_post(
        &node,
        "/api/v1/logs/ingest?commit=force",
        log_docs(0, 5, T0, "api"),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("max_in_flight_ingest_bytes"),
        "{body}"
    );
    // A bulk request is refused as a whole, before anything is accepted.
    let bulk = format!(
        "{}\n{}\n",
        json!({"index": {"_index": "logs"}}),
        json!({"timestamp": T0, "service": "api", "message": "x"})
    );
    let (status, retry_after, _) = raw_post(&node, "/api/v1/_elastic/_bulk", bulk).await;
    assert_eq!((status, retry_after.as_deref()), (429, Some("1")));
    drop(held);
    node.ingest("logs", &log_docs(0, 5, T0, "api"), "force")
        .await;
    assert_eq!(node.count("logs", "*").await, 5);
    node.stop().await;
}

/// With an index that commits every 2 s.
fn slow_commit_index(index_id: &str) -> String {
    LOGS_INDEX
        .replace("index_id: logs", &format!("index_id: {index_id}"))
        .replace("commit_timeout_secs: 1", "commit_timeout_secs: 2")
}

#[tokio::test]
async fn a_full_wal_refuses_ingest_until_indexing_catches_up() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config_in(tmp.path());
    config.max_wal_memory_bytes = 1;
    let node = TestNode::start_with(config).await;
    node.create_index(&slow_commit_index("logs")).await;
    node.ingest("logs", &log_docs(0, 5, T0, "api"), "auto")
        .await;
    let (status, retry_after, body) =
        raw_post(&node, "/api/v1/logs/ingest", log_docs(5, 5, T0, "api")).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(
        body["message"].as_str().unwrap().contains("WAL full"),
        "{body}"
    );
    // Once the first batch is published (WAL truncated), ingest is accepted again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, body) = raw_post(
            &node,
            "/api/v1/logs/ingest?commit=wait_for",
            log_docs(5, 5, T0, "api"),
        )
        .await;
        if status == 200 {
            assert_eq!(body["num_ingested_docs"], 5);
            break;
        }
        assert_eq!(status, 429, "{body}");
        assert!(Instant::now() < deadline, "ingest never accepted again");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(node.count("logs", "*").await, 10);
    node.stop().await;
}

/// A bulk request whose items go to several indexes never fails as a whole once some items
/// were accepted: the refused index's items get their own status (here a 429 from the full
/// WAL), the accepted ones 201.
#[tokio::test]
async fn bulk_into_several_indexes_gives_each_item_its_own_status() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config_in(tmp.path());
    config.max_wal_memory_bytes = 1;
    let node = TestNode::start_with(config).await;
    node.create_index(&slow_commit_index("first")).await;
    node.create_index(&slow_commit_index("second")).await;
    let doc = |i: usize| json!({"timestamp": T0, "service": "api", "message": format!("doc {i}")});
    let bulk: String = [
        json!({"index": {"_index": "first", "_id": "1"}}),
        doc(1),
        json!({"create": {"_index": "second", "_id": "2"}}),
        doc(2),
        json!({"index": {"_index": "first", "_id": "3"}}),
        doc(3),
    ]
    .iter()
    .map(|line| format!("{line}\n"))
    .collect();
    let (status, _, body) = raw_post(&node, "/api/v1/_elastic/_bulk", bulk).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["errors"], true);
    let items = body["items"].as_array().unwrap();
    assert_eq!(items[0]["index"]["status"], 201, "{body}");
    assert_eq!(items[2]["index"]["status"], 201, "{body}");
    assert_eq!(items[1]["create"]["status"], 429, "{body}");
    assert_eq!(
        items[1]["create"]["error"]["type"],
        "es_rejected_execution_exception"
    );
    assert_eq!(items[1]["create"]["_id"], "2");
    // The accepted items are indexed, the refused one is not.
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.count("first", "*").await < 2 {
        assert!(Instant::now() < deadline, "accepted items never published");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(node.count("second", "*").await, 0);
    node.stop().await;
}

#[tokio::test]
async fn a_panicking_handler_is_a_json_500_and_the_server_survives() {
    use shale_server::auth::{Access, ApiRoutes};
    let node = TestNode::start().await;
    let routes = shale_server::http::with_middleware(
        ApiRoutes::new()
            .get("/boom", Access::Public, || async {
                if std::env::var_os("NEVER_SET_IN_TESTS").is_none() {
                    panic!("kaboom in a handler");
                }
                "unreachable"
            })
            .get("/ok", Access::Public, || async { "fine" }),
    );
    let router =
        shale_server::auth::guard(routes, shale_server::http::AppState::new(node.node.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    let client = reqwest::Client::new();
    let resp = client
        .get(format!("http://{addr}/boom"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 500);
    let body: Value = resp.json().await.unwrap();
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("internal error"), "{message}");
    assert!(message.contains("kaboom in a handler"), "{message}");
    assert!(!message.contains("WAL"), "{message}");
    let resp = client
        .get(format!("http://{addr}/ok"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.text().await.unwrap(), "fine");
    node.stop().await;
}

/// The split cache never holds more than its budget: a search over more splits than fit
/// releases the splits it no longer needs as it goes, and a split larger than the whole cache
/// is a clean 503, not a crash or an overshoot. (Splits on S3, downloaded whole: local splits
/// are mapped in place and never enter the cache.)
#[tokio::test]
async fn searches_stay_within_the_split_cache_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(s3_config) = common::on_s3(config_in(tmp.path()), true) else {
        return;
    };
    // Learn the size of one split first.
    let probe = TestNode::start().await;
    probe.create_index(LOGS_INDEX).await;
    probe
        .ingest("logs", &log_docs(0, 200, T0, "api"), "force")
        .await;
    let (_, splits) = probe.get("/api/v1/indexes/logs/splits").await;
    let split_size = splits["splits"][0]["size_bytes"].as_u64().unwrap();
    probe.stop().await;

    let mut config = s3_config;
    // Room for about three splits.
    config.split_cache_max_bytes = split_size * 3 + split_size / 2;
    let node = TestNode::start_with(config).await;
    node.create_index(LOGS_INDEX).await;
    for batch in 0..8 {
        node.ingest(
            "logs",
            &log_docs(batch * 200, 200, T0 + batch as i64 * 10, "api"),
            "force",
        )
        .await;
    }
    let cache = node.node.search.cache().clone();
    for _ in 0..3 {
        let response = node
            .search("logs", json!({"query": "*", "max_hits": 5}))
            .await;
        assert_eq!(response["num_hits"], 1600, "{response}");
        assert_eq!(response["num_splits_searched"], 8);
        assert!(
            response["errors"].as_array().unwrap().is_empty(),
            "{response}"
        );
        assert!(cache.size_bytes() <= cache.max_bytes());
    }

    // A cache smaller than one split: a clear error, never an overshoot.
    let tmp = tempfile::tempdir().unwrap();
    let Some(mut config) = common::on_s3(config_in(tmp.path()), true) else {
        return;
    };
    config.split_cache_max_bytes = split_size / 2;
    let node = TestNode::start_with(config).await;
    node.create_index(LOGS_INDEX).await;
    node.ingest("logs", &log_docs(0, 200, T0, "api"), "force")
        .await;
    let (status, body) = node
        .post("/api/v1/logs/search", json!({"query": "*"}).to_string())
        .await;
    assert!(status == 500 || status == 503, "{status}: {body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("larger than the whole split cache"),
        "{body}"
    );
    assert_eq!(node.node.search.cache().size_bytes(), 0);
    node.stop().await;
}
