//! A cluster of `shale run` processes on one PostgreSQL metastore and one S3-compatible bucket
//! (both from the test kit), with short heartbeat, liveness and lease periods, for the tests
//! that kill nodes.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Heartbeat period of the test clusters.
pub const HEARTBEAT_MS: u64 = 200;
/// A node silent this long is dead.
pub const DEAD_AFTER_MS: u64 = 1500;
/// The leader's lease.
pub const LEASE_MS: u64 = 1000;
/// Seconds between planning rounds.
pub const PLANNER_SECS: u64 = 1;

/// A cluster of `shale run` processes.
pub struct Cluster {
    tmp: tempfile::TempDir,
    config: String,
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
    /// Extra environment of each node's process.
    envs: Vec<Vec<(String, String)>>,
    client: reqwest::Client,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Cluster {
    /// `n` nodes `n0`…, in merge `scope` (`cluster` or `node_local`); `None` when PostgreSQL
    /// or S3 cannot be had outside CI.
    pub async fn start(n: usize, scope: &str) -> Option<Cluster> {
        Self::start_with_env(n, scope, &[]).await
    }

    /// Like [`Cluster::start`], node `i` running with the environment variables of the
    /// entries `(i, name, value)` of `envs`.
    pub async fn start_with_env(
        n: usize,
        scope: &str,
        envs: &[(usize, &str, &str)],
    ) -> Option<Cluster> {
        let pg = shale_testkit::postgres::test_database_url().await?;
        Self::start_on(n, scope, envs, &pg).await
    }

    /// Like [`Cluster::start_with_env`], on the metastore at `pg` (a PostgreSQL URL).
    pub async fn start_on(
        n: usize,
        scope: &str,
        envs: &[(usize, &str, &str)],
        pg: &str,
    ) -> Option<Cluster> {
        let (endpoint, bucket) = shale_testkit::s3::test_bucket()?;
        let tmp = tempfile::tempdir().expect("temp dir");
        let config = format!(
            "cluster_id: test-cluster
metastore_uri: {pg}
default_index_root_uri: s3://{bucket}/indexes
s3:
  endpoint: {endpoint}
  region: us-east-1
  access_key_id: {access}
  secret_access_key: {secret}
  force_path_style: true
  allow_http: true
cluster:
  heartbeat_interval_ms: {HEARTBEAT_MS}
  dead_after_ms: {DEAD_AFTER_MS}
  leader_lease_ms: {LEASE_MS}
  cluster_secret: test-cluster-secret
compaction:
  scope: {scope}
  planner_interval_secs: {PLANNER_SECS}
  janitor_interval_secs: 1
  deletion_grace_period_secs: 1
  merge_lease_secs: 60
",
            access = shale_testkit::s3::ACCESS_KEY,
            secret = shale_testkit::s3::SECRET_KEY,
        );
        let mut cluster = Cluster {
            tmp,
            config,
            ports: (0..n).map(|_| shale_testkit::free_port()).collect(),
            children: (0..n).map(|_| None).collect(),
            envs: (0..n)
                .map(|i| {
                    envs.iter()
                        .filter(|(node, _, _)| *node == i)
                        .map(|(_, name, value)| (name.to_string(), value.to_string()))
                        .collect()
                })
                .collect(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("http client"),
        };
        for i in 0..n {
            cluster.start_node(i);
        }
        for i in 0..n {
            cluster.wait_ready(i).await;
        }
        cluster.wait_live(n).await;
        Some(cluster)
    }

    /// The data dir of node `i`.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.tmp.path().join(format!("n{i}"))
    }

    /// Starts (or restarts, same id and data dir) node `i`.
    pub fn start_node(&mut self, i: usize) {
        let config_path = self.tmp.path().join(format!("n{i}.yaml"));
        std::fs::write(&config_path, &self.config).expect("write node config");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.tmp.path().join(format!("n{i}.log")))
            .expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_shale"))
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .arg("--node-id")
            .arg(format!("n{i}"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.ports[i]))
            .arg("--data-dir")
            .arg(self.data_dir(i))
            .env("SHALE_LOG", "warn")
            .envs(self.envs[i].iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn shale run");
        self.children[i] = Some(child);
    }

    /// Kills node `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.children[i].take() {
            child.kill().expect("SIGKILL");
            let _ = child.wait();
        }
    }

    /// Whether node `i` runs.
    pub fn is_running(&self, i: usize) -> bool {
        self.children[i].is_some()
    }

    /// `http://127.0.0.1:PORT` of node `i`.
    pub fn base(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i])
    }

    /// The log of node `i` (for failure messages).
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.tmp.path().join(format!("n{i}.log"))).unwrap_or_default()
    }

    /// Waits until node `i` answers `/health/readyz`.
    pub async fn wait_ready(&self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(resp) = self
                .client
                .get(format!("{}/health/readyz", self.base(i)))
                .send()
                .await
            {
                if resp.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("node n{i} did not become ready:\n{}", self.log(i));
    }

    /// Waits until a running node sees `n` live nodes.
    pub async fn wait_live(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(state) = self.any_state().await {
                if state["live_nodes"].as_array().map_or(0, Vec::len) == n {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "never saw {n} live nodes");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `GET /api/v1/cluster` of node `i`.
    pub async fn state(&self, i: usize) -> Option<Value> {
        let resp = self
            .client
            .get(format!("{}/api/v1/cluster", self.base(i)))
            .send()
            .await
            .ok()?;
        resp.json().await.ok()
    }

    /// The cluster state as the first running node sees it.
    pub async fn any_state(&self) -> Option<Value> {
        for i in 0..self.ports.len() {
            if self.is_running(i) {
                if let Some(state) = self.state(i).await {
                    return Some(state);
                }
            }
        }
        None
    }

    /// The index of the node that leads, as running nodes see it.
    pub async fn leader(&self) -> Option<usize> {
        let state = self.any_state().await?;
        let leader = state["leader"]["node_id"].as_str()?;
        leader.strip_prefix('n')?.parse().ok()
    }

    /// POSTs `body` to `path` of node `i`; returns the status and the JSON answer.
    pub async fn post(&self, i: usize, path: &str, body: String) -> (u16, Value) {
        let request = self
            .client
            .post(format!("{}{path}", self.base(i)))
            .body(body);
        Self::answer(request).await
    }

    /// GETs `path` of node `i`.
    pub async fn get(&self, i: usize, path: &str) -> (u16, Value) {
        Self::answer(self.client.get(format!("{}{path}", self.base(i)))).await
    }

    /// Sends `request`: the status and the JSON answer (status 0 when it got no answer).
    async fn answer(request: reqwest::RequestBuilder) -> (u16, Value) {
        match request.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                (status, resp.json().await.unwrap_or(Value::Null))
            }
            Err(err) => (0, json!({ "message": err.to_string() })),
        }
    }

    /// Searches `index` through node `i`; the status and the answer.
    pub async fn search(&self, i: usize, index: &str, request: Value) -> (u16, Value) {
        self.post(i, &format!("/api/v1/{index}/search"), request.to_string())
            .await
    }

    /// Creates an index through node `i`.
    pub async fn create_index(&self, i: usize, yaml: &str) {
        let (status, body) = self.post(i, "/api/v1/indexes", yaml.to_string()).await;
        assert_eq!(status, 200, "create index: {body}");
    }

    /// Ingests NDJSON through node `i`.
    pub async fn ingest(
        &self,
        i: usize,
        index: &str,
        ndjson: String,
        commit: &str,
    ) -> (u16, Value) {
        self.post(
            i,
            &format!("/api/v1/{index}/ingest?commit={commit}"),
            ndjson,
        )
        .await
    }

    /// The published splits of `index`, through node `i`.
    pub async fn published_splits(&self, i: usize, index: &str) -> Vec<Value> {
        let (_, body) = self
            .get(
                i,
                &format!("/api/v1/indexes/{index}/splits?split_states=Published"),
            )
            .await;
        body["splits"].as_array().cloned().unwrap_or_default()
    }
}

/// NDJSON documents `{"ts", "doc_id", "body"}` with ids `{prefix}-{i}`.
pub fn docs(prefix: &str, range: std::ops::Range<usize>, ts: i64) -> (Vec<String>, String) {
    let ids: Vec<String> = range.map(|i| format!("{prefix}-{i}")).collect();
    let body = ids
        .iter()
        .map(|id| json!({"ts": ts, "doc_id": id, "body": "cluster payload"}).to_string() + "\n")
        .collect();
    (ids, body)
}
