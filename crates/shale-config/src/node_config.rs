//! The node config: a YAML file in which every key is optional.
//!
//! ```yaml
//! version: 0.1                         # accepted and ignored
//! cluster_id: prod                     # default: shale-default-cluster
//! node_id: indexer-1                   # default: the host name, else `node-1`
//! advertise_address: 10.0.0.7:7280     # how other nodes reach this one; default: listen_address
//! roles: [indexer, searcher, compactor] # default: all three
//! listen_address: 0.0.0.0:7280         # default: 127.0.0.1:7280
//! grpc_listen_address: 0.0.0.0:4317    # OTLP/gRPC (logs, traces, metrics); default: off
//! data_dir: /var/lib/shale             # default: ./shale-data
//! metastore_uri: postgres://…          # default: sqlite://{data_dir}/metastore.db
//! default_index_root_uri: s3://bucket  # alias `storage_uri`; default: file://{data_dir}/indexes
//! wal_persist_policy: on-delay         # or on-append (fsync every append)
//! wal_persist_interval_secs: 5         # for on-delay
//! max_ingest_body_bytes: 10MiB         # integer or size with unit; default 10 MiB
//! split_cache_max_bytes: 10GiB         # default 10 GiB
//! range_cache_max_bytes: 512MiB        # memory for byte ranges of splits on S3; 0: download
//!                                      # whole splits into the split cache instead
//! partial_result_cache_max_bytes: 64MiB # what each split answered, per request shape;
//!                                      # 0: off
//! max_in_flight_ingest_bytes: 256MiB   # ingest bodies handled at once; more: 429
//! max_wal_memory_bytes: 2GiB           # WAL records not yet indexed; more: 429
//! live_samples_max_bytes: 512MiB       # acknowledged samples not yet in a published split,
//!                                      # kept for PromQL; 0: visible once published
//! metrics_column_cache_max_bytes: 256MiB # decoded timestamps and values of hot metrics
//!                                      # row groups; 0: off
//! max_concurrent_searches: 100         # searches at once; more: 429
//! query_memory_budget_bytes: 4GiB      # memory of the queries in flight (aggregations,
//!                                      # PromQL, SQL), shared; default: a quarter of RAM
//! indexer_threads: 4                   # Tantivy threads per split being built; default: cores
//! indexer_heap_bytes: 256MiB           # indexing memory per split being built (an index's
//!                                      # indexing_settings.resources.heap_size wins)
//! s3:
//!   endpoint: http://localhost:9000
//!   region: us-east-1
//!   access_key_id: …
//!   secret_access_key: …
//!   force_path_style: true
//!   allow_http: true
//!   max_retries: 10                    # retries of a failed request (default: 10 within 3 min)
//! cluster:
//!   heartbeat_interval_ms: 1000        # heartbeats (and refreshes of the cluster view)
//!   dead_after_ms: 5000                # no heartbeat for this long: dead for everyone
//!   leader_lease_ms: 4000              # the leader's lease, renewed every heartbeat
//!   cluster_secret: …                  # if set, internal calls must present it (else 401)
//! api_token: …                         # all rights; if set (or api_tokens), every call but
//!                                      # /health/* and the UI's static files needs a token
//! api_tokens:                          # scoped tokens (at least 8 characters each)
//!   - {token: …, role: reader}         # search, PromQL, SQL, listings, the UI's reads
//!   - {token: …, role: writer}         # ingest: NDJSON, _bulk, OTLP, remote write
//!   - {token: …, role: admin}          # everything
//! rest:
//!   cors_allow_origins: ["https://grafana.example.com"] # or ["*"]; default: none
//!   tls:                               # HTTPS on listen_address (and HTTPS between nodes)
//!     cert_path: /etc/shale/cert.pem   # PEM chain, leaf first; reloaded when it changes
//!     key_path: /etc/shale/key.pem     # PEM private key (PKCS#8, PKCS#1 or SEC1)
//!     ca_path: /etc/shale/ca.pem       # CA of client certs (and of peers' certs)
//!     verify_client_cert: true         # mutual TLS: clients need a cert signed by ca_path
//! grpc:
//!   tls: {cert_path: …, key_path: …, ca_path: …, verify_client_cert: false} # OTLP/gRPC
//! health_listen_address: 127.0.0.1:7281 # plaintext /health/livez and /health/readyz only;
//!                                      # default: off
//! enable_otlp_endpoint: true           # create the OTLP indexes at start (Quickwit's default)
//! compaction:
//!   scope: cluster                     # or node_local (Quickwit's behaviour)
//!   max_concurrent_merges: 1
//!   planner_interval_secs: 10
//!   merge_lease_secs: 300
//!   merge_max_attempts: 5
//!   janitor_interval_secs: 60
//!   deletion_grace_period_secs: 1920   # 32 min
//!   staged_split_timeout_secs: 3600
//! ```
//!
//! Overrides from environment variables or the command line are the binary's business: every
//! field is public.

use std::fmt;
use std::path::{Path, PathBuf};

use percent_encoding::{percent_encode, AsciiSet, CONTROLS};
use serde::{Deserialize, Serialize};

use crate::validation::deserialize_with_path;
use crate::ConfigError;

/// Default `listen_address`.
pub const DEFAULT_LISTEN_ADDRESS: &str = "127.0.0.1:7280";
/// Default `data_dir`.
pub const DEFAULT_DATA_DIR: &str = "./shale-data";
/// Default `wal_persist_interval_secs`.
pub const DEFAULT_WAL_PERSIST_INTERVAL_SECS: u64 = 5;
/// Default `max_ingest_body_bytes`: 10 MiB, Quickwit's content length limit.
pub const DEFAULT_MAX_INGEST_BODY_BYTES: u64 = 10 << 20;
/// Default `split_cache_max_bytes`: 10 GiB.
pub const DEFAULT_SPLIT_CACHE_MAX_BYTES: u64 = 10 << 30;
/// Default `range_cache_max_bytes`: 512 MiB.
pub const DEFAULT_RANGE_CACHE_MAX_BYTES: u64 = 512 << 20;
/// Default `partial_result_cache_max_bytes`: 64 MiB (Quickwit's partial request cache).
pub const DEFAULT_PARTIAL_RESULT_CACHE_MAX_BYTES: u64 = 64 << 20;
/// Default `max_in_flight_ingest_bytes`: 256 MiB.
pub const DEFAULT_MAX_IN_FLIGHT_INGEST_BYTES: u64 = 256 << 20;
/// Default `max_wal_memory_bytes`: 2 GiB, Quickwit's `max_queue_memory_usage`.
pub const DEFAULT_MAX_WAL_MEMORY_BYTES: u64 = 2 << 30;
/// Default `live_samples_max_bytes`: 512 MiB.
pub const DEFAULT_LIVE_SAMPLES_MAX_BYTES: u64 = 512 << 20;
/// Default `metrics_column_cache_max_bytes`: 256 MiB.
pub const DEFAULT_METRICS_COLUMN_CACHE_MAX_BYTES: u64 = 256 << 20;
/// Default `max_concurrent_searches`.
pub const DEFAULT_MAX_CONCURRENT_SEARCHES: usize = 100;
/// Default `indexer_heap_bytes`: 256 MiB per split being built.
pub const DEFAULT_INDEXER_HEAP_BYTES: u64 = 256 << 20;
/// Least `indexer_heap_bytes` per indexing thread (Tantivy's floor is 15 MB).
pub const MIN_INDEXER_HEAP_BYTES_PER_THREAD: u64 = 15_000_000;
/// Default `enable_otlp_endpoint`: on, as Quickwit's.
pub const DEFAULT_ENABLE_OTLP_ENDPOINT: bool = true;
/// Default `cluster_id`.
pub const DEFAULT_CLUSTER_ID: &str = "shale-default-cluster";

/// A role a node plays in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Hosts shards: WAL and indexing pipelines.
    Indexer,
    /// Searches splits for the roots of searches.
    Searcher,
    /// Runs merges.
    Compactor,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 3] = [Role::Indexer, Role::Searcher, Role::Compactor];

    /// The role's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Indexer => "indexer",
            Role::Searcher => "searcher",
            Role::Compactor => "compactor",
        }
    }

    /// Parses a comma-separated list (`indexer,searcher`); errors name the unknown role.
    pub fn parse_list(text: &str) -> Result<Vec<Role>, ConfigError> {
        let mut roles = Vec::new();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let role = Role::ALL
                .into_iter()
                .find(|role| role.as_str() == name)
                .ok_or_else(|| ConfigError::Invalid {
                    field: "roles".to_string(),
                    message: format!("unknown role `{name}` (indexer, searcher or compactor)"),
                })?;
            if !roles.contains(&role) {
                roles.push(role);
            }
        }
        Ok(roles)
    }
}

/// Membership and control-plane settings.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Milliseconds between heartbeats (and refreshes of the cluster view).
    pub heartbeat_interval_ms: u64,
    /// A node with no heartbeat for this long is dead for everyone.
    pub dead_after_ms: u64,
    /// Length of the leader lease, renewed at every heartbeat.
    pub leader_lease_ms: u64,
    /// Ingest rate one shard is expected to take; the leader opens more shards of an index
    /// (up to one per live indexer) when its rate exceeds this per open shard.
    pub shard_throughput_bytes_per_sec: u64,
    /// Open shards every index keeps on distinct live indexers (fewer if there are fewer
    /// indexers), so that ingest goes on through another shard when a node dies.
    pub min_shards_per_index: usize,
    /// Shared secret of the internal API; never serialized.
    #[serde(skip_serializing)]
    pub cluster_secret: Option<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            heartbeat_interval_ms: 1000,
            dead_after_ms: 5000,
            leader_lease_ms: 4000,
            shard_throughput_bytes_per_sec: 5 << 20,
            min_shards_per_index: 2,
            cluster_secret: None,
        }
    }
}

impl fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("heartbeat_interval_ms", &self.heartbeat_interval_ms)
            .field("dead_after_ms", &self.dead_after_ms)
            .field("leader_lease_ms", &self.leader_lease_ms)
            .field(
                "shard_throughput_bytes_per_sec",
                &self.shard_throughput_bytes_per_sec,
            )
            .field("min_shards_per_index", &self.min_shards_per_index)
            .field(
                "cluster_secret",
                &self.cluster_secret.as_ref().map(|_| crate::REDACTED),
            )
            .finish()
    }
}

/// When the WAL is flushed to disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WalPersistPolicy {
    /// fsync at most every `wal_persist_interval_secs` (a crash may lose that much).
    #[default]
    OnDelay,
    /// fsync after every append (durable, slower).
    OnAppend,
}

/// S3-compatible object store settings; unset values fall back to the AWS environment.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// Endpoint URL, for MinIO, R2, … (`None`: AWS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Access key id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<String>,
    /// Secret access key; never serialized nor printed by `Debug`.
    #[serde(default, skip_serializing)]
    pub secret_access_key: Option<String>,
    /// Use `endpoint/bucket/key` URLs instead of `bucket.endpoint/key`.
    #[serde(default)]
    pub force_path_style: bool,
    /// Allow a plain `http://` endpoint.
    #[serde(default)]
    pub allow_http: bool,
    /// Retries of a failed request (`None`: the client's default, 10 within 3 minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<usize>,
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field("force_path_style", &self.force_path_style)
            .field("allow_http", &self.allow_http)
            .field("max_retries", &self.max_retries)
            .finish()
    }
}

/// The configuration of one node, defaults resolved. `Debug` and serialization never show a
/// secret: the metastore URI's password and the S3 secret key are redacted.
#[derive(Clone, PartialEq, Eq, Serialize)]
pub struct NodeConfig {
    /// The cluster this node belongs to (nodes sharing a metastore may form several).
    pub cluster_id: String,
    /// This node's id in the cluster.
    pub node_id: String,
    /// `host:port` other nodes reach this node's API at; `None`: derived from
    /// `listen_address` (see [`NodeConfig::advertise_address`]).
    pub advertise_address: Option<String>,
    /// What the node does.
    pub roles: Vec<Role>,
    /// `host:port` the REST API listens on.
    pub listen_address: String,
    /// `host:port` of the OTLP/gRPC services (logs, traces, metrics); `None`: not served.
    pub grpc_listen_address: Option<String>,
    /// `host:port` of a plaintext listener serving only `/health/livez` and
    /// `/health/readyz` (for probes when the REST API wants client certs); `None`: off.
    pub health_listen_address: Option<String>,
    /// Local directory for the WAL, the split cache, scratch space and the default SQLite
    /// metastore and file storage.
    pub data_dir: PathBuf,
    /// `sqlite://…` or `postgres://…` (serialized with its password redacted).
    #[serde(serialize_with = "serialize_redacted_uri")]
    pub metastore_uri: String,
    /// Where indexes' splits live by default (`file://…` or `s3://bucket/prefix`).
    #[serde(serialize_with = "serialize_redacted_uri")]
    pub default_index_root_uri: String,
    /// When the WAL is fsynced.
    pub wal_persist_policy: WalPersistPolicy,
    /// fsync interval for [`WalPersistPolicy::OnDelay`].
    pub wal_persist_interval_secs: u64,
    /// Largest accepted ingest request body.
    pub max_ingest_body_bytes: u64,
    /// Size of the local split cache.
    pub split_cache_max_bytes: u64,
    /// Memory for the byte ranges of splits on remote storage that searches read (splits
    /// there are opened from their hot cache and read by ranges); 0 downloads them whole
    /// into the split cache instead.
    pub range_cache_max_bytes: u64,
    /// Memory for what each split answered to each request shape (splits are immutable, so
    /// a repeated or paged search reuses it); 0 turns the cache off.
    pub partial_result_cache_max_bytes: u64,
    /// Bytes of ingest requests handled at once; beyond, requests get a 429.
    pub max_in_flight_ingest_bytes: u64,
    /// Bytes of WAL records not yet in published splits; beyond, ingest gets a 429.
    pub max_wal_memory_bytes: u64,
    /// Memory for the acknowledged samples of metrics indexes not yet in a published split,
    /// which PromQL reads with the splits; 0 keeps none (samples are visible once published).
    pub live_samples_max_bytes: u64,
    /// Memory for the decoded timestamps and values of hot metrics row groups, which answer
    /// PromQL selectors without fetching or decoding pages; 0 turns the cache off.
    pub metrics_column_cache_max_bytes: u64,
    /// Searches run at once; beyond, searches get a 429.
    pub max_concurrent_searches: usize,
    /// Memory the queries in flight may hold together (search aggregations, PromQL, SQL);
    /// a query that would pass it is refused before taking the memory.
    pub query_memory_budget_bytes: u64,
    /// Tantivy indexing threads per split being built (default: the number of cores).
    pub indexer_threads: usize,
    /// Indexing memory per split being built, shared by its threads (an index's
    /// `indexing_settings.resources.heap_size` overrides it).
    pub indexer_heap_bytes: u64,
    /// Object store settings.
    pub s3: S3Config,
    /// Membership and control-plane settings.
    pub cluster: ClusterConfig,
    /// Compaction and garbage collection settings.
    pub compaction: CompactionConfig,
    /// When set, every REST call but `/health/*` must present it (`Authorization: Bearer …`,
    /// or Elasticsearch clients' `ApiKey` / basic-auth password); else a 401.
    pub api_token: Option<String>,
    /// Scoped tokens: each grants one [`TokenRole`] (`api_token` is an admin token).
    pub api_tokens: Vec<ApiToken>,
    /// REST listener settings (CORS, TLS).
    pub rest: RestConfig,
    /// OTLP/gRPC listener settings (TLS).
    pub grpc: GrpcConfig,
    /// Create the OpenTelemetry indexes (`otel-logs-v0_9`, `otel-traces-v0_9`) at start when
    /// missing (Quickwit's `indexer.enable_otlp_endpoint`).
    pub enable_otlp_endpoint: bool,
}

fn serialize_redacted_uri<S: serde::Serializer>(
    uri: &str,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&crate::redact_uri(uri))
}

impl fmt::Debug for NodeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeConfig")
            .field("cluster_id", &self.cluster_id)
            .field("node_id", &self.node_id)
            .field("advertise_address", &self.advertise_address)
            .field("roles", &self.roles)
            .field("listen_address", &self.listen_address)
            .field("grpc_listen_address", &self.grpc_listen_address)
            .field("health_listen_address", &self.health_listen_address)
            .field("data_dir", &self.data_dir)
            .field("metastore_uri", &crate::redact_uri(&self.metastore_uri))
            .field(
                "default_index_root_uri",
                &crate::redact_uri(&self.default_index_root_uri),
            )
            .field("wal_persist_policy", &self.wal_persist_policy)
            .field("wal_persist_interval_secs", &self.wal_persist_interval_secs)
            .field("max_ingest_body_bytes", &self.max_ingest_body_bytes)
            .field("split_cache_max_bytes", &self.split_cache_max_bytes)
            .field("range_cache_max_bytes", &self.range_cache_max_bytes)
            .field(
                "partial_result_cache_max_bytes",
                &self.partial_result_cache_max_bytes,
            )
            .field(
                "max_in_flight_ingest_bytes",
                &self.max_in_flight_ingest_bytes,
            )
            .field("max_wal_memory_bytes", &self.max_wal_memory_bytes)
            .field("live_samples_max_bytes", &self.live_samples_max_bytes)
            .field(
                "metrics_column_cache_max_bytes",
                &self.metrics_column_cache_max_bytes,
            )
            .field("max_concurrent_searches", &self.max_concurrent_searches)
            .field("query_memory_budget_bytes", &self.query_memory_budget_bytes)
            .field("indexer_threads", &self.indexer_threads)
            .field("indexer_heap_bytes", &self.indexer_heap_bytes)
            .field("s3", &self.s3)
            .field("cluster", &self.cluster)
            .field("compaction", &self.compaction)
            .field(
                "api_token",
                &self.api_token.as_ref().map(|_| crate::REDACTED),
            )
            .field("api_tokens", &self.api_tokens)
            .field("rest", &self.rest)
            .field("grpc", &self.grpc)
            .field("enable_otlp_endpoint", &self.enable_otlp_endpoint)
            .finish()
    }
}

impl NodeConfig {
    /// The config as YAML, secrets redacted (for `shale run --print-config`).
    pub fn to_redacted_yaml(&self) -> String {
        let mut value = match serde_json::to_value(self) {
            Ok(value) => value,
            Err(err) => return format!("# cannot render the config: {err}\n"),
        };
        if self.s3.secret_access_key.is_some() {
            value["s3"]["secret_access_key"] = serde_json::Value::from(crate::REDACTED);
        }
        if self.cluster.cluster_secret.is_some() {
            value["cluster"]["cluster_secret"] = serde_json::Value::from(crate::REDACTED);
        }
        if self.api_token.is_some() {
            value["api_token"] = serde_json::Value::from(crate::REDACTED);
        }
        if let Some(tokens) = value["api_tokens"].as_array_mut() {
            for token in tokens {
                token["token"] = serde_json::Value::from(crate::REDACTED);
            }
        }
        serde_yaml::to_string(&value)
            .unwrap_or_else(|err| format!("# cannot render the config: {err}\n"))
    }
}

/// What a scoped API token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenRole {
    /// Reads: search, PromQL, SQL, field caps, listings, the UI's reads.
    Reader,
    /// Ingest: NDJSON, `_bulk`, OTLP (HTTP and gRPC), Prometheus remote write.
    Writer,
    /// Everything: reads, ingest, index and template changes, delete tasks, compaction.
    Admin,
}

impl TokenRole {
    /// The role's name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenRole::Reader => "reader",
            TokenRole::Writer => "writer",
            TokenRole::Admin => "admin",
        }
    }
}

/// One scoped API token. `Debug` and `--print-config` never show the token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiToken {
    /// The secret a client presents.
    pub token: String,
    /// What it grants.
    pub role: TokenRole,
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiToken")
            .field("token", &crate::REDACTED)
            .field("role", &self.role)
            .finish()
    }
}

/// Settings of the REST listener (Quickwit's `rest` section).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestConfig {
    /// Origins whose pages may call the API from a browser (CORS), or `*` for any; empty:
    /// none (a cross-site request that changes something is refused either way).
    #[serde(default)]
    pub cors_allow_origins: Vec<String>,
    /// HTTPS on the REST listener; also makes calls to other nodes use HTTPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
}

/// Settings of the OTLP/gRPC listener (Quickwit's `grpc` section).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcConfig {
    /// TLS on `grpc_listen_address`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
}

/// TLS of a listener: the node's certificate and key (PEM files, reloaded when they change)
/// and, for mutual TLS, the CA that client certificates must chain to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert_path: PathBuf,
    /// PEM private key of the leaf certificate.
    pub key_path: PathBuf,
    /// PEM CA certificates: roots of client certificates (and, for `rest`, of other nodes').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_path: Option<PathBuf>,
    /// Mutual TLS: a client must present a certificate that chains to `ca_path`.
    #[serde(default)]
    pub verify_client_cert: bool,
}

impl TlsConfig {
    /// Checks the paths are given and that client verification has its CA; errors name
    /// the key under `section` (e.g. `rest.tls`).
    pub fn validate(&self, section: &str) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: &str| ConfigError::Invalid {
            field: format!("{section}.{key}"),
            message: message.to_string(),
        };
        if self.cert_path.as_os_str().is_empty() {
            return Err(invalid("cert_path", "must not be empty"));
        }
        if self.key_path.as_os_str().is_empty() {
            return Err(invalid("key_path", "must not be empty"));
        }
        if self
            .ca_path
            .as_ref()
            .is_some_and(|path| path.as_os_str().is_empty())
        {
            return Err(invalid("ca_path", "must not be empty when given"));
        }
        if self.verify_client_cert && self.ca_path.is_none() {
            return Err(invalid(
                "verify_client_cert",
                "needs `ca_path` (the CA that client certificates must chain to)",
            ));
        }
        Ok(())
    }
}

/// Which splits may merge together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeMode {
    /// `(index, source, partition, doc mapping)`: splits of every node merge together, so
    /// splits of departed nodes keep being compacted.
    #[default]
    Cluster,
    /// Adds the node id, as Quickwit does: a node merges only its own splits.
    NodeLocal,
}

/// Compaction, janitor and retention settings of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompactionConfig {
    /// Off: this node plans no automatic merge nor delete compaction (when it leads) and runs
    /// none (manual compactions still run).
    pub enabled: bool,
    /// Merge scope mode.
    pub scope: ScopeMode,
    /// Merges this node runs at once (0 disables merge execution on this node).
    pub max_concurrent_merges: usize,
    /// Seconds between planning rounds (a round also follows every publish).
    pub planner_interval_secs: u64,
    /// Lease of a claimed merge task; renewed while the merge runs.
    pub merge_lease_secs: u64,
    /// Attempts before a merge task is given up.
    pub merge_max_attempts: u32,
    /// Seconds between janitor rounds.
    pub janitor_interval_secs: u64,
    /// Objects of MarkedForDeletion splits are deleted this long after (default 32 min), so
    /// searches that listed them before still complete.
    pub deletion_grace_period_secs: u64,
    /// Staged splits older than this are garbage (their upload never got published).
    pub staged_split_timeout_secs: u64,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            enabled: true,
            scope: ScopeMode::Cluster,
            max_concurrent_merges: 1,
            planner_interval_secs: 10,
            merge_lease_secs: 300,
            merge_max_attempts: 5,
            janitor_interval_secs: 60,
            deletion_grace_period_secs: 32 * 60,
            staged_split_timeout_secs: 3600,
        }
    }
}

/// The file as written: every key optional.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeConfigFile {
    #[serde(default)]
    #[allow(dead_code)]
    version: Option<serde_json::Value>,
    #[serde(default)]
    cluster_id: Option<String>,
    #[serde(default)]
    node_id: Option<String>,
    #[serde(default)]
    advertise_address: Option<String>,
    #[serde(default)]
    roles: Option<Vec<Role>>,
    #[serde(default)]
    listen_address: Option<String>,
    #[serde(default)]
    grpc_listen_address: Option<String>,
    #[serde(default)]
    data_dir: Option<PathBuf>,
    #[serde(default)]
    metastore_uri: Option<String>,
    #[serde(default, alias = "storage_uri")]
    default_index_root_uri: Option<String>,
    #[serde(default)]
    wal_persist_policy: Option<WalPersistPolicy>,
    #[serde(default)]
    wal_persist_interval_secs: Option<u64>,
    #[serde(default)]
    max_ingest_body_bytes: Option<ByteSize>,
    #[serde(default)]
    split_cache_max_bytes: Option<ByteSize>,
    #[serde(default)]
    range_cache_max_bytes: Option<ByteSize>,
    #[serde(default)]
    partial_result_cache_max_bytes: Option<ByteSize>,
    #[serde(default)]
    max_in_flight_ingest_bytes: Option<ByteSize>,
    #[serde(default)]
    max_wal_memory_bytes: Option<ByteSize>,
    #[serde(default)]
    live_samples_max_bytes: Option<ByteSize>,
    #[serde(default)]
    metrics_column_cache_max_bytes: Option<ByteSize>,
    #[serde(default)]
    max_concurrent_searches: Option<usize>,
    #[serde(default)]
    query_memory_budget_bytes: Option<ByteSize>,
    #[serde(default)]
    indexer_threads: Option<usize>,
    #[serde(default)]
    indexer_heap_bytes: Option<ByteSize>,
    #[serde(default)]
    s3: Option<S3Config>,
    #[serde(default)]
    cluster: Option<ClusterConfig>,
    #[serde(default)]
    compaction: Option<CompactionConfig>,
    #[serde(default)]
    api_token: Option<String>,
    #[serde(default)]
    api_tokens: Vec<ApiToken>,
    #[serde(default)]
    rest: Option<RestConfig>,
    #[serde(default)]
    grpc: Option<GrpcConfig>,
    #[serde(default)]
    health_listen_address: Option<String>,
    #[serde(default)]
    enable_otlp_endpoint: Option<bool>,
}

/// A byte size written as an integer or a string with a unit (`10MiB`).
struct ByteSize(u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::units::deserialize_byte_size(deserializer).map(ByteSize)
    }
}

/// The host name, from the kernel, `/etc/hostname` or `$HOSTNAME`.
fn hostname() -> Option<String> {
    let candidates = [
        std::fs::read_to_string("/proc/sys/kernel/hostname").ok(),
        std::fs::read_to_string("/etc/hostname").ok(),
        std::env::var("HOSTNAME").ok(),
    ];
    candidates
        .into_iter()
        .flatten()
        .map(|name| name.trim().to_string())
        .find(|name| !name.is_empty())
}

fn default_node_id() -> String {
    hostname().unwrap_or_else(|| "node-1".to_string())
}

/// The address other nodes reach a node listening on `listen_address` at: the same, with
/// the host name instead of an unspecified host (`0.0.0.0`, `[::]`).
pub fn default_advertise_address(listen_address: &str) -> String {
    match listen_address.rsplit_once(':') {
        Some(("0.0.0.0" | "[::]" | "::" | "", port)) => {
            format!(
                "{}:{port}",
                hostname().unwrap_or_else(|| "127.0.0.1".to_string())
            )
        }
        _ => listen_address.to_string(),
    }
}

fn display_dir(dir: &Path) -> String {
    dir.display().to_string().trim_end_matches('/').to_string()
}

/// Bytes escaped in a `sqlite://` URI's path: those a URI parser would take for the end of
/// the path (`?`, `#`) or for an escape (`%`), and those not allowed in a URI (controls,
/// spaces and the like; bytes above ASCII are always escaped).
const URI_PATH_ESCAPED: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b']')
    .add(b'\\')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// `dir` percent-encoded for the path of a `sqlite://` URI (without its trailing `/`); the
/// SQLite metastore decodes it back to `dir`.
fn uri_path(dir: &Path) -> String {
    percent_encode(dir.as_os_str().as_encoded_bytes(), URI_PATH_ESCAPED)
        .to_string()
        .trim_end_matches('/')
        .to_string()
}

impl NodeConfig {
    /// Parses a YAML (or JSON) node config; missing keys take their defaults. An empty file is
    /// the default config.
    pub fn from_yaml(bytes: &[u8]) -> Result<NodeConfig, ConfigError> {
        if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(NodeConfig::default());
        }
        let file: NodeConfigFile = deserialize_with_path(bytes)?;
        let data_dir = file
            .data_dir
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        let listen_address = file
            .listen_address
            .unwrap_or_else(|| DEFAULT_LISTEN_ADDRESS.to_string());
        let config = NodeConfig {
            cluster_id: file
                .cluster_id
                .unwrap_or_else(|| DEFAULT_CLUSTER_ID.to_string()),
            node_id: file.node_id.unwrap_or_else(default_node_id),
            advertise_address: file.advertise_address,
            roles: file.roles.unwrap_or_else(|| Role::ALL.to_vec()),
            listen_address,
            grpc_listen_address: file.grpc_listen_address,
            health_listen_address: file.health_listen_address,
            metastore_uri: file
                .metastore_uri
                .unwrap_or_else(|| Self::default_metastore_uri(&data_dir)),
            default_index_root_uri: file
                .default_index_root_uri
                .unwrap_or_else(|| Self::default_storage_uri(&data_dir)),
            data_dir,
            wal_persist_policy: file.wal_persist_policy.unwrap_or_default(),
            wal_persist_interval_secs: file
                .wal_persist_interval_secs
                .unwrap_or(DEFAULT_WAL_PERSIST_INTERVAL_SECS),
            max_ingest_body_bytes: file
                .max_ingest_body_bytes
                .map_or(DEFAULT_MAX_INGEST_BODY_BYTES, |size| size.0),
            split_cache_max_bytes: file
                .split_cache_max_bytes
                .map_or(DEFAULT_SPLIT_CACHE_MAX_BYTES, |size| size.0),
            range_cache_max_bytes: file
                .range_cache_max_bytes
                .map_or(DEFAULT_RANGE_CACHE_MAX_BYTES, |size| size.0),
            partial_result_cache_max_bytes: file
                .partial_result_cache_max_bytes
                .map_or(DEFAULT_PARTIAL_RESULT_CACHE_MAX_BYTES, |size| size.0),
            max_in_flight_ingest_bytes: file
                .max_in_flight_ingest_bytes
                .map_or(DEFAULT_MAX_IN_FLIGHT_INGEST_BYTES, |size| size.0),
            max_wal_memory_bytes: file
                .max_wal_memory_bytes
                .map_or(DEFAULT_MAX_WAL_MEMORY_BYTES, |size| size.0),
            live_samples_max_bytes: file
                .live_samples_max_bytes
                .map_or(DEFAULT_LIVE_SAMPLES_MAX_BYTES, |size| size.0),
            metrics_column_cache_max_bytes: file
                .metrics_column_cache_max_bytes
                .map_or(DEFAULT_METRICS_COLUMN_CACHE_MAX_BYTES, |size| size.0),
            max_concurrent_searches: file
                .max_concurrent_searches
                .unwrap_or(DEFAULT_MAX_CONCURRENT_SEARCHES),
            query_memory_budget_bytes: file
                .query_memory_budget_bytes
                .map_or_else(default_query_memory_budget_bytes, |size| size.0),
            indexer_threads: file.indexer_threads.unwrap_or_else(default_indexer_threads),
            indexer_heap_bytes: file
                .indexer_heap_bytes
                .map_or(DEFAULT_INDEXER_HEAP_BYTES, |size| size.0),
            s3: file.s3.unwrap_or_default(),
            cluster: file.cluster.unwrap_or_default(),
            compaction: file.compaction.unwrap_or_default(),
            api_token: file.api_token,
            api_tokens: file.api_tokens,
            rest: file.rest.unwrap_or_default(),
            grpc: file.grpc.unwrap_or_default(),
            enable_otlp_endpoint: file
                .enable_otlp_endpoint
                .unwrap_or(DEFAULT_ENABLE_OTLP_ENDPOINT),
        };
        config.validate()?;
        Ok(config)
    }

    /// The defaults, with everything derived from the data dir (metastore, storage) under
    /// `data_dir`.
    pub fn with_data_dir(data_dir: &Path) -> NodeConfig {
        NodeConfig {
            data_dir: data_dir.to_path_buf(),
            metastore_uri: Self::default_metastore_uri(data_dir),
            default_index_root_uri: Self::default_storage_uri(data_dir),
            ..NodeConfig::default()
        }
    }

    /// `sqlite://{data_dir}/metastore.db`, the data dir percent-encoded (see [`uri_path`]).
    pub fn default_metastore_uri(data_dir: &Path) -> String {
        format!("sqlite://{}/metastore.db", uri_path(data_dir))
    }

    /// `file://{data_dir}/indexes`, the data dir as it is (a `file://` URI's path is taken
    /// literally).
    pub fn default_storage_uri(data_dir: &Path) -> String {
        format!("file://{}/indexes", display_dir(data_dir))
    }

    /// The address other nodes reach this node at: `advertise_address`, else derived from
    /// `listen_address`.
    pub fn advertise_address(&self) -> String {
        self.advertise_address
            .clone()
            .unwrap_or_else(|| default_advertise_address(&self.listen_address))
    }

    /// Alias of `default_index_root_uri`.
    pub fn storage_uri(&self) -> &str {
        &self.default_index_root_uri
    }

    /// Checks values that defaults cannot fix; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            field: field.to_string(),
            message,
        };
        if self.node_id.trim().is_empty() {
            return Err(invalid("node_id", "must not be empty".to_string()));
        }
        if self.cluster_id.trim().is_empty() {
            return Err(invalid("cluster_id", "must not be empty".to_string()));
        }
        if self.roles.is_empty() {
            return Err(invalid(
                "roles",
                "at least one of indexer, searcher, compactor".to_string(),
            ));
        }
        if self.api_token.as_ref().is_some_and(|token| token.len() < 8) {
            return Err(invalid(
                "api_token",
                "must be at least 8 characters".to_string(),
            ));
        }
        for (i, token) in self.api_tokens.iter().enumerate() {
            if token.token.len() < 8 {
                return Err(invalid(
                    &format!("api_tokens[{i}].token"),
                    "must be at least 8 characters".to_string(),
                ));
            }
            let same = |other: &str| other == token.token;
            if self.api_token.as_deref().is_some_and(same)
                || self.api_tokens[..i].iter().any(|t| same(&t.token))
            {
                return Err(invalid(
                    &format!("api_tokens[{i}].token"),
                    "is given twice: each token grants one role".to_string(),
                ));
            }
        }
        for (i, origin) in self.rest.cors_allow_origins.iter().enumerate() {
            let authority = origin
                .strip_prefix("https://")
                .or_else(|| origin.strip_prefix("http://"));
            let ok = origin == "*"
                || authority.is_some_and(|authority| {
                    !authority.is_empty()
                        && authority
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b))
                });
            if !ok {
                return Err(invalid(
                    &format!("rest.cors_allow_origins[{i}]"),
                    format!("`{origin}` is not an origin (`https://host[:port]`, no path) or `*`"),
                ));
            }
        }
        let cluster = &self.cluster;
        if cluster.heartbeat_interval_ms < 10 {
            return Err(invalid(
                "cluster.heartbeat_interval_ms",
                "must be at least 10".to_string(),
            ));
        }
        if cluster.dead_after_ms <= cluster.heartbeat_interval_ms {
            return Err(invalid(
                "cluster.dead_after_ms",
                "must be longer than heartbeat_interval_ms".to_string(),
            ));
        }
        if cluster.leader_lease_ms <= cluster.heartbeat_interval_ms {
            return Err(invalid(
                "cluster.leader_lease_ms",
                "must be longer than heartbeat_interval_ms (the lease is renewed at every \
                 heartbeat)"
                    .to_string(),
            ));
        }
        let port_ok = self
            .listen_address
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(invalid(
                "listen_address",
                format!(
                    "`{}` is not `host:port` (e.g. `127.0.0.1:7280`)",
                    self.listen_address
                ),
            ));
        }
        if let Some(grpc) = &self.grpc_listen_address {
            let grpc_ok = grpc
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !grpc_ok || grpc == &self.listen_address {
                return Err(invalid(
                    "grpc_listen_address",
                    format!("`{grpc}` is not a `host:port` of its own (e.g. `127.0.0.1:4317`)"),
                ));
            }
        }
        if let Some(health) = &self.health_listen_address {
            let health_ok = health
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !health_ok
                || health == &self.listen_address
                || self.grpc_listen_address.as_ref() == Some(health)
            {
                return Err(invalid(
                    "health_listen_address",
                    format!("`{health}` is not a `host:port` of its own (e.g. `127.0.0.1:7281`)"),
                ));
            }
        }
        if let Some(tls) = &self.rest.tls {
            tls.validate("rest.tls")?;
        }
        if let Some(tls) = &self.grpc.tls {
            tls.validate("grpc.tls")?;
        }
        let advertise_address = self.advertise_address();
        let advertise_ok = advertise_address
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !advertise_ok {
            return Err(invalid(
                "advertise_address",
                format!("`{advertise_address}` is not `host:port` (e.g. `10.0.0.7:7280`)"),
            ));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty".to_string()));
        }
        if self.wal_persist_policy == WalPersistPolicy::OnDelay
            && self.wal_persist_interval_secs < 1
        {
            return Err(invalid(
                "wal_persist_interval_secs",
                "must be at least 1 with `wal_persist_policy: on-delay`".to_string(),
            ));
        }
        if self.max_ingest_body_bytes < 1 {
            return Err(invalid(
                "max_ingest_body_bytes",
                "must be at least 1".to_string(),
            ));
        }
        if self.max_in_flight_ingest_bytes < self.max_ingest_body_bytes {
            return Err(invalid(
                "max_in_flight_ingest_bytes",
                format!(
                    "must be at least max_ingest_body_bytes ({}), or no request could be \
                     admitted",
                    self.max_ingest_body_bytes
                ),
            ));
        }
        if self.max_concurrent_searches < 1 {
            return Err(invalid(
                "max_concurrent_searches",
                "must be at least 1".to_string(),
            ));
        }
        if self.query_memory_budget_bytes < MIN_QUERY_MEMORY_BUDGET_BYTES {
            return Err(invalid(
                "query_memory_budget_bytes",
                format!("must be at least {MIN_QUERY_MEMORY_BUDGET_BYTES} bytes (64 MiB)"),
            ));
        }
        if self.indexer_threads < 1 {
            return Err(invalid("indexer_threads", "must be at least 1".to_string()));
        }
        if self.indexer_heap_bytes < MIN_INDEXER_HEAP_BYTES_PER_THREAD * self.indexer_threads as u64
        {
            return Err(invalid(
                "indexer_heap_bytes",
                format!(
                    "must be at least {MIN_INDEXER_HEAP_BYTES_PER_THREAD} bytes per indexer \
                     thread ({} threads)",
                    self.indexer_threads
                ),
            ));
        }
        Ok(())
    }
}

/// The smallest `query_memory_budget_bytes`: 64 MiB.
pub const MIN_QUERY_MEMORY_BUDGET_BYTES: u64 = 64 << 20;

/// Default `query_memory_budget_bytes`: a quarter of the machine's memory (`MemTotal` of
/// `/proc/meminfo`), 2 GiB where it cannot be read.
pub fn default_query_memory_budget_bytes() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
        })
        .map(|kib| kib * 1024);
    total.map_or(2 << 30, |bytes| {
        (bytes / 4).max(MIN_QUERY_MEMORY_BUDGET_BYTES)
    })
}

/// Default `indexer_threads`: the number of cores.
pub fn default_indexer_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

impl Default for NodeConfig {
    fn default() -> Self {
        let data_dir = PathBuf::from(DEFAULT_DATA_DIR);
        NodeConfig {
            cluster_id: DEFAULT_CLUSTER_ID.to_string(),
            node_id: default_node_id(),
            advertise_address: None,
            roles: Role::ALL.to_vec(),
            listen_address: DEFAULT_LISTEN_ADDRESS.to_string(),
            grpc_listen_address: None,
            health_listen_address: None,
            metastore_uri: Self::default_metastore_uri(&data_dir),
            default_index_root_uri: Self::default_storage_uri(&data_dir),
            data_dir,
            wal_persist_policy: WalPersistPolicy::OnDelay,
            wal_persist_interval_secs: DEFAULT_WAL_PERSIST_INTERVAL_SECS,
            max_ingest_body_bytes: DEFAULT_MAX_INGEST_BODY_BYTES,
            split_cache_max_bytes: DEFAULT_SPLIT_CACHE_MAX_BYTES,
            range_cache_max_bytes: DEFAULT_RANGE_CACHE_MAX_BYTES,
            partial_result_cache_max_bytes: DEFAULT_PARTIAL_RESULT_CACHE_MAX_BYTES,
            max_in_flight_ingest_bytes: DEFAULT_MAX_IN_FLIGHT_INGEST_BYTES,
            max_wal_memory_bytes: DEFAULT_MAX_WAL_MEMORY_BYTES,
            live_samples_max_bytes: DEFAULT_LIVE_SAMPLES_MAX_BYTES,
            metrics_column_cache_max_bytes: DEFAULT_METRICS_COLUMN_CACHE_MAX_BYTES,
            max_concurrent_searches: DEFAULT_MAX_CONCURRENT_SEARCHES,
            query_memory_budget_bytes: default_query_memory_budget_bytes(),
            indexer_threads: default_indexer_threads(),
            indexer_heap_bytes: DEFAULT_INDEXER_HEAP_BYTES,
            s3: S3Config::default(),
            cluster: ClusterConfig::default(),
            compaction: CompactionConfig::default(),
            api_token: None,
            api_tokens: Vec::new(),
            rest: RestConfig::default(),
            grpc: GrpcConfig::default(),
            enable_otlp_endpoint: DEFAULT_ENABLE_OTLP_ENDPOINT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_default() {
        let config = NodeConfig::from_yaml(b"  \n").unwrap();
        assert_eq!(config, NodeConfig::default());
        assert_eq!(config.listen_address, "127.0.0.1:7280");
        assert_eq!(config.data_dir, PathBuf::from("./shale-data"));
        assert_eq!(config.metastore_uri, "sqlite://./shale-data/metastore.db");
        assert_eq!(config.default_index_root_uri, "file://./shale-data/indexes");
        assert_eq!(config.storage_uri(), "file://./shale-data/indexes");
        assert_eq!(config.wal_persist_policy, WalPersistPolicy::OnDelay);
        assert_eq!(config.wal_persist_interval_secs, 5);
        assert_eq!(config.max_ingest_body_bytes, 10 * 1024 * 1024);
        assert_eq!(config.split_cache_max_bytes, 10 * 1024 * 1024 * 1024);
        assert!(!config.node_id.is_empty());
        assert_eq!(config.s3, S3Config::default());
        assert!(config.enable_otlp_endpoint);
    }

    #[test]
    fn the_otlp_endpoint_can_be_disabled() {
        let config = NodeConfig::from_yaml(b"enable_otlp_endpoint: false").unwrap();
        assert!(!config.enable_otlp_endpoint);
        let err = NodeConfig::from_yaml(b"enable_otlp_endpoint: maybe")
            .unwrap_err()
            .to_string();
        assert!(err.contains("enable_otlp_endpoint"), "{err}");
    }

    #[test]
    fn the_otlp_grpc_address_is_off_unless_set_and_checked() {
        assert_eq!(
            NodeConfig::from_yaml(b"").unwrap().grpc_listen_address,
            None
        );
        let config = NodeConfig::from_yaml(b"grpc_listen_address: 0.0.0.0:4317").unwrap();
        assert_eq!(config.grpc_listen_address.as_deref(), Some("0.0.0.0:4317"));
        config.validate().unwrap();
        for bad in [
            "grpc_listen_address: 4317",
            "grpc_listen_address: 127.0.0.1:7280",
        ] {
            let err = NodeConfig::from_yaml(bad.as_bytes())
                .and_then(|c| c.validate())
                .unwrap_err()
                .to_string();
            assert!(err.contains("grpc_listen_address"), "{err}");
        }
    }

    #[test]
    fn tls_sections_and_the_health_listener() {
        let yaml = br#"
listen_address: 127.0.0.1:7280
grpc_listen_address: 127.0.0.1:4317
health_listen_address: 127.0.0.1:7281
rest:
  cors_allow_origins: ["*"]
  tls: {cert_path: /p/cert.pem, key_path: /p/key.pem, ca_path: /p/ca.pem, verify_client_cert: true}
grpc:
  tls: {cert_path: /p/cert.pem, key_path: /p/key.pem}
"#;
        let config = NodeConfig::from_yaml(yaml).unwrap();
        let rest = config.rest.tls.as_ref().unwrap();
        assert_eq!(rest.cert_path, PathBuf::from("/p/cert.pem"));
        assert_eq!(rest.ca_path.as_deref(), Some(Path::new("/p/ca.pem")));
        assert!(rest.verify_client_cert);
        let grpc = config.grpc.tls.as_ref().unwrap();
        assert!(!grpc.verify_client_cert && grpc.ca_path.is_none());
        assert_eq!(
            config.health_listen_address.as_deref(),
            Some("127.0.0.1:7281")
        );
        // What --print-config shows reads back as the same config.
        let printed = config.to_redacted_yaml();
        assert!(printed.contains("verify_client_cert: true"), "{printed}");
        let again = NodeConfig::from_yaml(printed.as_bytes()).unwrap();
        assert_eq!(again.rest, config.rest);
        assert_eq!(again.grpc, config.grpc);
        assert!(format!("{config:?}").contains("health_listen_address"));
        for (bad, needle) in [
            (
                "rest:\n  tls: {cert_path: c, key_path: k, verify_client_cert: true}",
                "rest.tls.verify_client_cert",
            ),
            (
                "rest:\n  tls: {cert_path: '', key_path: k}",
                "rest.tls.cert_path",
            ),
            (
                "grpc:\n  tls: {cert_path: c, key_path: ''}",
                "grpc.tls.key_path",
            ),
            (
                "grpc:\n  tls: {cert_path: c, key: k}",
                "unknown field `key`",
            ),
            ("rest:\n  tls: {cert_path: c}", "key_path"),
            ("health_listen_address: 7281", "health_listen_address"),
            (
                "health_listen_address: 127.0.0.1:7280",
                "health_listen_address",
            ),
        ] {
            let err = NodeConfig::from_yaml(bad.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn indexer_threads_and_heap() {
        let config = NodeConfig::from_yaml(b"").unwrap();
        assert!(config.indexer_threads >= 1);
        assert_eq!(config.indexer_heap_bytes, 256 << 20);
        let config =
            NodeConfig::from_yaml(b"indexer_threads: 3\nindexer_heap_bytes: 96MiB").unwrap();
        assert_eq!(config.indexer_threads, 3);
        assert_eq!(config.indexer_heap_bytes, 96 << 20);
        let err = NodeConfig::from_yaml(b"indexer_threads: 0")
            .unwrap_err()
            .to_string();
        assert!(err.contains("indexer_threads"), "{err}");
        // Tantivy needs 15 MB per indexing thread.
        let err = NodeConfig::from_yaml(b"indexer_threads: 4\nindexer_heap_bytes: 40MB")
            .unwrap_err()
            .to_string();
        assert!(err.contains("indexer_heap_bytes"), "{err}");
    }

    #[test]
    fn defaults_follow_data_dir() {
        let config = NodeConfig::from_yaml(b"data_dir: /var/lib/shale/\nnode_id: n1\n").unwrap();
        assert_eq!(config.node_id, "n1");
        assert_eq!(config.metastore_uri, "sqlite:///var/lib/shale/metastore.db");
        assert_eq!(
            config.default_index_root_uri,
            "file:///var/lib/shale/indexes"
        );
    }

    #[test]
    fn the_default_metastore_uri_escapes_the_data_dir() {
        let uri = |dir: &str| NodeConfig::default_metastore_uri(Path::new(dir));
        assert_eq!(uri("odd%41dir"), "sqlite://odd%2541dir/metastore.db");
        assert_eq!(uri("/a?b#c d/"), "sqlite:///a%3Fb%23c%20d/metastore.db");
        assert_eq!(uri("/données"), "sqlite:///donn%C3%A9es/metastore.db");
        assert_eq!(uri("./shale-data"), "sqlite://./shale-data/metastore.db");
        // The storage URI's path is taken literally.
        assert_eq!(
            NodeConfig::default_storage_uri(Path::new("odd%41dir")),
            "file://odd%41dir/indexes"
        );
    }

    #[test]
    fn full_config() {
        let yaml = br#"
version: 0.1
node_id: indexer-7
listen_address: 0.0.0.0:7281
data_dir: /data
metastore_uri: postgres://shale@db/shale
storage_uri: s3://bucket/indexes
wal_persist_policy: on-append
wal_persist_interval_secs: 2
max_ingest_body_bytes: 20MiB
split_cache_max_bytes: 1000000
s3:
  endpoint: http://localhost:9000
  region: us-east-1
  access_key_id: minio
  secret_access_key: minio123
  force_path_style: true
  allow_http: true
"#;
        let config = NodeConfig::from_yaml(yaml).unwrap();
        assert_eq!(config.node_id, "indexer-7");
        assert_eq!(config.listen_address, "0.0.0.0:7281");
        assert_eq!(config.metastore_uri, "postgres://shale@db/shale");
        assert_eq!(config.default_index_root_uri, "s3://bucket/indexes");
        assert_eq!(config.wal_persist_policy, WalPersistPolicy::OnAppend);
        assert_eq!(config.wal_persist_interval_secs, 2);
        assert_eq!(config.max_ingest_body_bytes, 20 << 20);
        assert_eq!(config.split_cache_max_bytes, 1_000_000);
        assert_eq!(config.s3.endpoint.as_deref(), Some("http://localhost:9000"));
        assert_eq!(config.s3.secret_access_key.as_deref(), Some("minio123"));
        assert!(config.s3.force_path_style && config.s3.allow_http);
        // The secret never leaks through Debug or serialization.
        assert!(!format!("{config:?}").contains("minio123"));
        assert!(!serde_json::to_string(&config).unwrap().contains("minio123"));
    }

    #[test]
    fn quickwit_name_for_the_storage_root() {
        let config = NodeConfig::from_yaml(b"default_index_root_uri: s3://b/p").unwrap();
        assert_eq!(config.default_index_root_uri, "s3://b/p");
    }

    #[test]
    fn unknown_keys_are_refused_in_every_section_with_their_line() {
        for (yaml, key, line) in [
            ("listen_adress: 1.2.3.4:80", "listen_adress", 1),
            ("node_id: n1\nlisten_adress: 1.2.3.4:80", "listen_adress", 2),
            (
                "node_id: n1\ncluster:\n  heartbeat_intervall_ms: 5",
                "heartbeat_intervall_ms",
                3,
            ),
            ("compaction:\n  planner_interval: 5", "planner_interval", 2),
            ("s3:\n  region: eu-west-1\n  regoin: eu-west-1", "regoin", 3),
        ] {
            let err = NodeConfig::from_yaml(yaml.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("unknown field `{key}`")),
                "{yaml}: {err}"
            );
            assert!(err.contains("expected"), "lists the valid keys: {err}");
            assert!(
                err.contains(&format!("line {line}")),
                "points to line {line}: {err}"
            );
        }
    }

    #[test]
    fn errors_name_the_key() {
        for (yaml, needle) in [
            ("listen_adress: 1.2.3.4:80", "listen_adress"),
            ("wal_persist_policy: sometimes", "wal_persist_policy"),
            ("max_ingest_body_bytes: lots", "max_ingest_body_bytes"),
            ("s3:\n  bucket: x", "s3"),
            ("listen_address: localhost", "listen_address"),
            ("node_id: ''", "node_id"),
            ("wal_persist_interval_secs: 0", "wal_persist_interval_secs"),
        ] {
            let err = NodeConfig::from_yaml(yaml.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{yaml}: {err}");
        }
    }
}
