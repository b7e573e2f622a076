//! A real node (SQLite or PostgreSQL metastore, local or S3 storage) served on a free
//! loopback port, and a small HTTP client for it.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use shale_config::NodeConfig;
use shale_server::Node;

pub struct TestNode {
    pub node: Arc<Node>,
    pub base: String,
    pub client: reqwest::Client,
    pub data_dir: PathBuf,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
    _tmp: Option<tempfile::TempDir>,
}

pub fn config_in(dir: &std::path::Path) -> NodeConfig {
    NodeConfig {
        node_id: "test-node".to_string(),
        split_cache_max_bytes: 1 << 30,
        ..NodeConfig::with_data_dir(dir)
    }
}

/// `config` with its splits in a fresh bucket of the test S3 server (`None`, and a skipped
/// test, when there is none outside CI), downloaded whole into the split cache rather than
/// read by ranges when `whole_splits`.
pub fn on_s3(mut config: NodeConfig, whole_splits: bool) -> Option<NodeConfig> {
    let (endpoint, bucket) = shale_testkit::s3::test_bucket()?;
    config.default_index_root_uri = format!("s3://{bucket}/indexes");
    config.s3.endpoint = Some(endpoint);
    config.s3.region = Some("us-east-1".into());
    config.s3.access_key_id = Some(shale_testkit::s3::ACCESS_KEY.into());
    config.s3.secret_access_key = Some(shale_testkit::s3::SECRET_KEY.into());
    config.s3.force_path_style = true;
    config.s3.allow_http = true;
    if whole_splits {
        config.range_cache_max_bytes = 0;
    }
    Some(config)
}

impl TestNode {
    /// A node with embedded defaults in a fresh temp dir.
    pub async fn start() -> TestNode {
        let tmp = tempfile::tempdir().unwrap();
        let config = config_in(tmp.path());
        let mut node = TestNode::start_with(config).await;
        node._tmp = Some(tmp);
        node
    }

    /// A node in a temporary directory whose partial-result cache is off: every search is
    /// computed.
    pub async fn start_uncached() -> TestNode {
        let tmp = tempfile::tempdir().unwrap();
        let mut config = config_in(tmp.path());
        config.partial_result_cache_max_bytes = 0;
        let mut node = TestNode::start_with(config).await;
        node._tmp = Some(tmp);
        node
    }

    pub async fn start_with(mut config: NodeConfig) -> TestNode {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        config.listen_address = addr.to_string();
        let data_dir = config.data_dir.clone();
        let node = Node::start(config).await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn({
            let node = node.clone();
            async move {
                shale_server::serve(node, listener, async {
                    let _ = rx.await;
                })
                .await
                .unwrap();
            }
        });
        TestNode {
            node,
            base: format!("http://{addr}"),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap(),
            data_dir,
            shutdown: Some(tx),
            server: Some(server),
            _tmp: None,
        }
    }

    /// Keeps `tmp` (the node's data dir) until the node stops.
    pub fn keep_dir(&mut self, tmp: tempfile::TempDir) {
        self._tmp = Some(tmp);
    }

    /// Stops serving and drops the node's pipelines; returns the temp dir to reuse.
    pub async fn stop(mut self) -> Option<tempfile::TempDir> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        self.node.shutdown().await;
        self.node.wal.persist().await.unwrap();
        self.node.release_data_dir();
        self._tmp.take()
    }

    /// Dies as a crashed process would: stops serving and working at once, without leaving
    /// the cluster (the others see it dead after `dead_after_ms`).
    pub async fn kill(mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
            let _ = server.await;
        }
        self.node.halt().await;
    }

    /// The Prometheus text of `GET /metrics`.
    pub async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The value of one series of `/metrics` (`name{label="value"}` as printed), 0 if absent.
    pub async fn metric_value(&self, series: &str) -> u64 {
        let prefix = format!("{series} ");
        self.metrics()
            .await
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    }

    /// Posts a Prometheus remote-write request to `path`; the status and the answer's text.
    pub async fn remote_write(
        &self,
        path: &str,
        request: &shale_metrics::remote_write::WriteRequest,
    ) -> (u16, String) {
        let resp = self
            .client
            .post(self.url(path))
            .header("Content-Encoding", "snappy")
            .header("Content-Type", "application/x-protobuf")
            .body(shale_metrics::remote_write::encode_remote_write(request))
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self.client.get(self.url(path)).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn post(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let (status, text) = self.post_text(path, body).await;
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Posts `body` and reads the answer as text, without parsing it (for answers whose
    /// parsed form would weigh on the memory a test measures).
    pub async fn post_text(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, String) {
        let resp = self
            .client
            .post(self.url(path))
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap_or_default())
    }

    pub async fn put(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let resp = self
            .client
            .put(self.url(path))
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        let resp = self.client.delete(self.url(path)).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn create_index(&self, yaml: &str) -> Value {
        let (status, body) = self.post("/api/v1/indexes", yaml.to_string()).await;
        assert_eq!(status, 200, "create index failed: {body}");
        body
    }

    pub async fn ingest(&self, index: &str, ndjson: &str, commit: &str) -> Value {
        let (status, body) = self
            .post(
                &format!("/api/v1/{index}/ingest?commit={commit}"),
                ndjson.to_string(),
            )
            .await;
        assert_eq!(status, 200, "ingest failed: {body}");
        body
    }

    pub async fn search(&self, index: &str, request: Value) -> Value {
        let (status, body) = self
            .post(&format!("/api/v1/{index}/search"), request.to_string())
            .await;
        assert_eq!(status, 200, "search {request} failed: {body}");
        body
    }

    pub async fn count(&self, index: &str, query: &str) -> u64 {
        self.search(index, json!({"query": query, "max_hits": 0}))
            .await["num_hits"]
            .as_u64()
            .unwrap()
    }
}

/// A log index: timestamp, service (tag), level, host, trace_id, message; 1 s commit timeout.
pub const LOGS_INDEX: &str = r#"
version: 0.8
index_id: logs
doc_mapping:
  mode: lenient
  field_mappings:
    - name: timestamp
      type: datetime
      input_formats: [rfc3339, unix_timestamp]
      fast: true
      fast_precision: milliseconds
    - name: service
      type: text
      tokenizer: raw
      fast: true
    - name: level
      type: text
      tokenizer: raw
    - name: host
      type: text
      tokenizer: raw
    - name: status
      type: u64
      fast: true
    - name: message
      type: text
      tokenizer: default
      record: position
    - name: doc_id
      type: text
      tokenizer: raw
  timestamp_field: timestamp
  tag_fields: [service]
indexing_settings:
  commit_timeout_secs: 1
search_settings:
  default_search_fields: [message]
"#;

/// `n` log documents starting at `ts0` seconds, one per second, services cycling.
/// The (value of `label`, value) pairs of a PromQL instant vector answer, sorted.
pub fn vector_by(body: &Value, label: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = body["data"]["result"]
        .as_array()
        .unwrap_or_else(|| panic!("no vector in {body}"))
        .iter()
        .map(|r| {
            (
                r["metric"][label].as_str().unwrap_or_default().to_string(),
                r["value"][1].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

pub fn log_docs(start: usize, n: usize, ts0: i64, service: &str) -> String {
    let mut out = String::new();
    for i in start..start + n {
        let level = if i % 10 == 0 { "ERROR" } else { "INFO" };
        out.push_str(
            &json!({
                "timestamp": ts0 + i as i64,
                "service": service,
                "level": level,
                "host": format!("host-{}", i % 3),
                "status": 200 + (i % 5) as u64,
                "message": format!("request {i} handled by {service} quick brown fox"),
                "doc_id": format!("{service}-{i}"),
            })
            .to_string(),
        );
        out.push('\n');
    }
    out
}

/// Stages a copy (new id) of the first split of `index_id` and uploads `object` as its object,
/// as an upload whose publish never came would leave them. Returns the staged split's
/// metadata and the index's storage.
pub async fn stage_orphan(
    node: &TestNode,
    index_id: &str,
    object: &[u8],
) -> (shale_types::SplitMetadata, shale_storage::StorageRef) {
    let meta = node.node.metastore.index_metadata(index_id).await.unwrap();
    let uid = meta.index_uid.clone();
    let mut orphan = node
        .node
        .metastore
        .list_splits(shale_metastore::ListSplitsQuery::for_index(uid.clone()))
        .await
        .unwrap()[0]
        .split_metadata
        .clone();
    orphan.split_id = shale_types::new_ulid();
    node.node
        .metastore
        .stage_splits(&uid, vec![orphan.clone()])
        .await
        .unwrap();
    let storage = node.node.index_storage(&meta).unwrap();
    storage
        .put_bytes(&orphan.object_key(), object.to_vec())
        .await
        .unwrap();
    (orphan, storage)
}

/// Whether `python3` can import `module` (a client the test drives). When it cannot, the
/// test is skipped outside CI; in CI (`CI` set) that is a failure, since `.ci/run` installs
/// it.
pub fn python_module_installed(module: &str) -> bool {
    let installed = std::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install the Python module `{module}` (.ci/run does)"
        );
        eprintln!("skipped: the Python module `{module}` is not installed");
    }
    installed
}
