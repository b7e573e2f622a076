//! Node wiring: opens the metastore, the WAL, the storage and the split cache from a
//! [`NodeConfig`], starts the ingest router (and its indexing pipelines) and the search
//! service, and owns index lifecycle operations that touch several of them.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use shale_cluster::control::{control_round, ShardSettings};
use shale_cluster::{ClusterError, Membership};
use shale_compaction::service::PlanningContext;
use shale_compaction::service::{CompactionEnv, CompactionError, CompactionService, JanitorReport};
use shale_config::{IndexConfig, NodeConfig, Role, WalPersistPolicy};
use shale_ingest::{IngestLimits, IngestRouter, PersistPolicy, PipelineEnv, Wal};
use shale_metastore::Shard;
use shale_metastore::{open_metastore, IndexMetadata, ListSplitsQuery, Metastore, MetastoreError};
use shale_search::SearchService;
use shale_storage::{IndexStorages, RangeCache, S3Options, SplitCache, StorageResolver};
use shale_types::{DeleteQuery, DeleteTask, Split, SplitState};

use crate::distributed::ClusterNodes;
use crate::internal::InternalClient;
use crate::routing::IngestDispatcher;
use tracing::{info, warn};

/// Errors starting a node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Metastore unavailable.
    #[error("metastore: {0}")]
    Metastore(#[from] MetastoreError),
    /// WAL unavailable.
    #[error("WAL: {0}")]
    Wal(#[from] shale_ingest::WalError),
    /// Storage unavailable.
    #[error("storage: {0}")]
    Storage(#[from] shale_storage::StorageError),
    /// Ingest router failed to start.
    #[error("ingest: {0}")]
    Ingest(#[from] shale_ingest::IngestError),
    /// Joining the cluster failed.
    #[error("{0}")]
    Cluster(#[from] ClusterError),
    /// The request is invalid (a 400 for the API).
    #[error("{0}")]
    InvalidRequest(String),
    /// Something else went wrong.
    #[error("{0}")]
    Internal(String),
    /// Another process holds the data directory.
    #[error(
        "data directory {data_dir} is in use by {holder}: one node per data directory (stop it, \
         or give this one another --data-dir)"
    )]
    DataDirInUse {
        /// The directory.
        data_dir: String,
        /// Who holds it, as it wrote in the lock file.
        holder: String,
    },
    /// Local directories.
    #[error("data dir {path}: {source}")]
    Io {
        /// Path involved.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
}

/// A running node's services.
pub struct Node {
    /// Resolved configuration.
    pub config: NodeConfig,
    /// The metastore.
    pub metastore: Arc<dyn Metastore>,
    /// Where each index's splits live.
    pub storages: IndexStorages,
    /// Hosts this node's shards (WAL queues and indexing pipelines).
    pub router: Arc<IngestRouter>,
    /// Routes ingest requests to shards, here or on other nodes.
    pub dispatcher: Arc<IngestDispatcher>,
    /// Searches splits.
    pub search: Arc<SearchService>,
    /// The WAL.
    pub wal: Arc<Wal>,
    /// The acknowledged samples of this node's metrics shards not yet in published splits,
    /// which PromQL reads with the splits.
    pub live: Arc<shale_ingest::LiveSamples>,
    /// Merge planner and workers.
    pub compaction: CompactionService,
    /// This node's membership in its cluster (a cluster of one by default).
    pub membership: Arc<Membership>,
    /// Calls to the other nodes.
    pub client: InternalClient,
    /// The memory the node's queries in flight share (`query_memory_budget_bytes`).
    pub memory_budget: shale_types::memory::MemoryBudget,
    /// The data directory's lock, held while the node lives (or until released).
    data_dir_lock: std::sync::Mutex<Option<crate::data_dir::DataDirLock>>,
    /// What the heartbeats report of the records not published yet (see
    /// `IngestRouter::pending_delete_opstamps`), refreshed by the shard loop.
    pending_report: Arc<std::sync::Mutex<serde_json::Value>>,
    background: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

async fn janitor_loop(node: std::sync::Weak<Node>) {
    loop {
        let interval = match node.upgrade() {
            Some(node) => {
                match node.run_janitor().await {
                    Ok(_) | Err(CompactionError::NotLeader) => {}
                    Err(err) => warn!(%err, "janitor round failed"),
                }
                node.config.compaction.janitor_interval_secs.max(1)
            }
            None => return,
        };
        tokio::time::sleep(Duration::from_secs(interval)).await;
    }
}

/// The leader's control rounds (dead workers' merges, shards), one per heartbeat.
async fn control_loop(node: std::sync::Weak<Node>) {
    loop {
        let interval = match node.upgrade() {
            Some(node) => {
                if let Some(leadership) = node.membership.leadership() {
                    let view = node.membership.view();
                    if let Err(err) = control_round(
                        leadership.metastore.as_ref(),
                        &view,
                        shard_settings(&node.config),
                    )
                    .await
                    {
                        warn!(%err, "control round failed");
                    }
                }
                node.config.cluster.heartbeat_interval_ms
            }
            None => return,
        };
        tokio::time::sleep(Duration::from_millis(interval)).await;
    }
}

/// How long what a node knows of the delete history holds after a heartbeat (see
/// `shale_ingest::opstamps`): the liveness threshold, at least five heartbeats and 5 s, so
/// that a loaded node does not refuse ingest between two heartbeats.
pub fn delete_stamp_lease(config: &NodeConfig) -> Duration {
    let cluster = &config.cluster;
    Duration::from_millis(
        cluster
            .dead_after_ms
            .max(5 * cluster.heartbeat_interval_ms)
            .max(5_000),
    )
}

/// Extra time a delete waits past the stamp lease of a node it could not reach (clock
/// offsets measured within a round trip, the time between a heartbeat's stamp and its send).
const DELETE_STAMP_MARGIN_MS: i64 = 1_000;

/// The leader's shard sizing, from the node config.
pub fn shard_settings(config: &NodeConfig) -> ShardSettings {
    ShardSettings {
        throughput_bytes_per_sec: config.cluster.shard_throughput_bytes_per_sec as f64,
        min_shards_per_index: config.cluster.min_shards_per_index,
    }
}

/// The first wait before the staged splits of an index whose storage failed at start are
/// cleaned again; doubled at each failure, up to [`MAX_CLEANUP_RETRY`].
const FIRST_CLEANUP_RETRY: Duration = Duration::from_secs(10);
/// The longest wait between two cleanups of an index whose storage fails.
const MAX_CLEANUP_RETRY: Duration = Duration::from_secs(600);

/// Cleans, with a growing backoff until its storage answers, the staged splits left by a
/// crash in the indexes whose storage failed at start (`indexes`); each success records the
/// index's storage as reachable again (on every node, leader or not).
async fn staged_cleanup_loop(node: std::sync::Weak<Node>, mut indexes: Vec<String>) {
    let mut wait = FIRST_CLEANUP_RETRY;
    while !indexes.is_empty() {
        tokio::time::sleep(wait).await;
        let Some(node) = node.upgrade() else {
            return;
        };
        let mut failed = Vec::new();
        for index_id in indexes {
            let index = match node.metastore.index_metadata(&index_id).await {
                Ok(index) => index,
                Err(MetastoreError::NotFound { .. }) => continue,
                Err(err) => {
                    warn!(index_id, %err, "cannot read the index to clean its staged splits");
                    failed.push(index_id);
                    continue;
                }
            };
            // The storage is asked first: the splits may be gone from the rows already
            // (marked before their objects failed to go, then deleted by the janitor).
            let cleaned = match node.index_storage(&index) {
                Ok(storage) => match storage.probe("shale-node-probe").await {
                    Ok(()) => node.clean_staged_splits_of(&index).await,
                    Err(err) => Err(err.into()),
                },
                Err(err) => Err(err.into()),
            };
            match cleaned {
                Ok(()) => {
                    info!(
                        index_id,
                        "the index's storage answers again: staged splits cleaned"
                    );
                    node.storages
                        .mark_reachable(index.index_id(), index.index_config.index_uri.as_deref());
                }
                Err(err) => {
                    warn!(index_id, %err, retry_in = ?wait.saturating_mul(2).min(MAX_CLEANUP_RETRY), "cannot clean the index's staged splits yet");
                    if let NodeError::Storage(err) = &err {
                        node.storages.mark_unreachable(
                            index.index_id(),
                            index.index_config.index_uri.as_deref(),
                            &err.to_string(),
                        );
                    }
                    failed.push(index_id);
                }
            }
        }
        indexes = failed;
        wait = wait.saturating_mul(2).min(MAX_CLEANUP_RETRY);
    }
}

/// Follows the shards table, one round per heartbeat.
async fn shard_sync_loop(node: std::sync::Weak<Node>) {
    loop {
        let interval = match node.upgrade() {
            Some(node) => {
                if let Err(err) = node.sync_shards().await {
                    warn!(%err, "shard synchronization failed");
                }
                node.config.cluster.heartbeat_interval_ms
            }
            None => return,
        };
        tokio::time::sleep(Duration::from_millis(interval)).await;
    }
}

/// What this node knows of the delete history, one round per heartbeat, on its own (a shard
/// synchronization may wait for a pipeline): catches up with a delete whose call did not
/// reach this node, confirms what it knows for the stamp lease, and records what the next
/// heartbeats report of the records not published yet.
async fn delete_stamp_loop(node: std::sync::Weak<Node>) {
    loop {
        let interval = match node.upgrade() {
            Some(node) => {
                let since = node.membership.last_heartbeat_sent();
                if let Err(err) = node.router.refresh_delete_opstamps(since).await {
                    warn!(%err, "could not refresh the delete opstamps");
                }
                node.report_pending_stamps().await;
                node.config.cluster.heartbeat_interval_ms
            }
            None => return,
        };
        tokio::time::sleep(Duration::from_millis(interval)).await;
    }
}

/// The planner's context: the leader's fenced handle and the live nodes, while this node leads.
fn planning_context(membership: &Arc<Membership>) -> PlanningContext {
    let membership = Arc::downgrade(membership);
    Arc::new(move || {
        let membership = membership.upgrade()?;
        let leadership = membership.leadership()?;
        let live = membership
            .view()
            .live_nodes()
            .map(|node| node.node_id.clone())
            .collect();
        Some((leadership.metastore, live))
    })
}

fn ensure_dir(path: &Path) -> Result<(), NodeError> {
    std::fs::create_dir_all(path).map_err(|source| NodeError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Maps node settings to storage options.
pub fn s3_options(config: &NodeConfig) -> S3Options {
    let s3 = &config.s3;
    S3Options {
        endpoint: s3.endpoint.clone(),
        region: s3.region.clone(),
        access_key_id: s3.access_key_id.clone(),
        secret_access_key: s3.secret_access_key.clone(),
        force_path_style: Some(s3.force_path_style || s3.endpoint.is_some()),
        allow_http: Some(s3.allow_http),
        max_retries: s3.max_retries,
    }
}

impl Node {
    /// Starts a node: everything it needs is opened, leftovers of a crash are cleaned, and
    /// every index's pipelines resume from their checkpoints.
    pub async fn start(config: NodeConfig) -> Result<Arc<Node>, NodeError> {
        let lock = crate::data_dir::DataDirLock::acquire(&config.data_dir)?;
        Self::start_locked(config, lock).await
    }

    /// [`Node::start`] with the data directory already locked (the caller took the lock
    /// before anything else, e.g. before binding its listen socket).
    pub async fn start_locked(
        config: NodeConfig,
        lock: crate::data_dir::DataDirLock,
    ) -> Result<Arc<Node>, NodeError> {
        crate::allocator::limit_arenas();
        // Every metric family is scraped from the start, at zero.
        crate::metrics::register_all();
        let has_tokens = config.api_token.is_some() || !config.api_tokens.is_empty();
        if has_tokens && config.cluster.cluster_secret.is_none() {
            tracing::warn!(
                "API tokens are set but cluster.cluster_secret is not: the internal API is off \
                 (every internal call answers 403), so this node cannot work with other nodes; \
                 set a cluster secret on every node of a cluster"
            );
        }
        ensure_dir(&config.data_dir)?;
        let metastore = open_metastore(&config.metastore_uri).await?;
        let resolver = StorageResolver::new(s3_options(&config));
        // Fail fast on an unusable storage URI.
        resolver.resolve(&config.default_index_root_uri)?;
        let storages = IndexStorages::new(resolver, config.default_index_root_uri.clone());
        let policy = match config.wal_persist_policy {
            WalPersistPolicy::OnAppend => PersistPolicy::OnAppend,
            WalPersistPolicy::OnDelay => {
                PersistPolicy::OnDelay(Duration::from_secs(config.wal_persist_interval_secs))
            }
        };
        let wal = Wal::open(&config.data_dir.join("queues"), policy).await?;
        let scratch_dir = config.data_dir.join("indexing");
        if scratch_dir.exists() {
            // Scratch of a previous run: its batches are rebuilt from the WAL.
            let _ = std::fs::remove_dir_all(&scratch_dir);
        }
        ensure_dir(&scratch_dir)?;
        let cache = Arc::new(SplitCache::open(
            &config.data_dir.join("split-cache"),
            config.split_cache_max_bytes,
        )?);
        let merge_scratch = config.data_dir.join("merging");
        if merge_scratch.exists() {
            let _ = std::fs::remove_dir_all(&merge_scratch);
        }
        let membership = Membership::join(
            metastore.clone(),
            &config.cluster_id,
            &config.node_id,
            &config.advertise_address(),
            &config.roles,
            config.cluster.clone(),
        )
        .await?;
        // This incarnation's writes are refused once a newer one registers.
        let node_metastore = membership.node_metastore();
        let compaction = CompactionService::start(
            CompactionEnv {
                node_id: config.node_id.clone(),
                worker_id: membership.identity().to_string(),
                metastore: node_metastore.clone(),
                storages: storages.clone(),
                cache: cache.clone(),
                scratch_dir: merge_scratch,
                config: config.compaction.clone(),
                delete_counts: Default::default(),
            },
            planning_context(&membership),
            config.roles.contains(&Role::Compactor),
        );
        let env = PipelineEnv {
            node_id: config.node_id.clone(),
            metastore: node_metastore,
            wal: wal.clone(),
            scratch_dir,
            dead_letter_dir: config.data_dir.join("dead-letters"),
            writer_heap_bytes: usize::try_from(config.indexer_heap_bytes).unwrap_or(usize::MAX),
            writer_threads: config.indexer_threads,
            on_publish: Some(compaction.planner_notify()),
            live: Arc::new(shale_ingest::LiveSamples::new(
                config.live_samples_max_bytes,
            )),
        };
        shale_metrics::column_cache::set_column_cache_bytes(
            usize::try_from(config.metrics_column_cache_max_bytes).unwrap_or(usize::MAX),
        );
        let live = env.live.clone();
        let router = Arc::new(
            IngestRouter::new(
                env,
                storages.clone(),
                IngestLimits {
                    max_in_flight_bytes: config.max_in_flight_ingest_bytes,
                    max_wal_memory_bytes: config.max_wal_memory_bytes,
                },
            )
            .with_delete_stamp_lease(delete_stamp_lease(&config)),
        );
        let client = InternalClient::with_tls(
            config.cluster.cluster_secret.clone(),
            config.rest.tls.as_ref(),
        )
        .map_err(|err| NodeError::Internal(err.to_string()))?;
        let dispatcher = Arc::new(IngestDispatcher::new(
            metastore.clone(),
            router.clone(),
            membership.clone(),
            client.clone(),
            shard_settings(&config),
        ));
        let pending_report = Arc::new(std::sync::Mutex::new(serde_json::Value::Null));
        {
            let router = router.clone();
            let pending_report = pending_report.clone();
            membership.set_info_provider(Arc::new(move || {
                let pending = pending_report
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                serde_json::json!({
                    "ingest_bytes_per_sec": router.take_ingest_rates(),
                    "pending_delete_opstamps": pending,
                })
            }));
        }
        let search = Arc::new(SearchService::new(
            metastore.clone(),
            storages.clone(),
            cache,
            std::thread::available_parallelism().map_or(2, |n| n.get()) * 2,
            config.max_concurrent_searches,
        ));
        search.set_partial_result_cache(config.partial_result_cache_max_bytes);
        if config.range_cache_max_bytes > 0 {
            search.set_range_cache(Some(Arc::new(RangeCache::new(
                config.range_cache_max_bytes,
            ))));
        }
        search.set_nodes(Arc::new(ClusterNodes::new(
            membership.clone(),
            search.leaf().clone(),
            client.clone(),
        )));
        let memory_budget =
            shale_types::memory::MemoryBudget::new(config.query_memory_budget_bytes);
        search.set_memory_budget(memory_budget.clone());
        let node = Node {
            search,
            router,
            dispatcher,
            client,
            memory_budget,
            config,
            metastore,
            storages,
            wal,
            live,
            compaction,
            membership: membership.clone(),
            data_dir_lock: std::sync::Mutex::new(Some(lock)),
            pending_report,
            background: std::sync::Mutex::new(Vec::new()),
        };
        let uncleaned = node.clean_staged_splits().await?;
        if node.config.enable_otlp_endpoint {
            // Before the first control round, which allocates their shards.
            node.create_otel_indexes().await?;
        }
        if let Some(leadership) = membership.leadership() {
            // Shards for every index before serving (a cluster of one leads at once).
            if let Err(err) = control_round(
                leadership.metastore.as_ref(),
                &membership.view(),
                shard_settings(&node.config),
            )
            .await
            {
                warn!(%err, "first control round failed");
            }
        }
        node.router
            .refresh_delete_opstamps(membership.last_heartbeat_sent())
            .await?;
        node.sync_shards().await?;
        let node = Arc::new(node);
        let heartbeat = membership.start();
        let janitor = tokio::spawn(janitor_loop(Arc::downgrade(&node)));
        let cleanup = tokio::spawn(staged_cleanup_loop(Arc::downgrade(&node), uncleaned));
        let control = tokio::spawn(control_loop(Arc::downgrade(&node)));
        let shard_sync = tokio::spawn(shard_sync_loop(Arc::downgrade(&node)));
        let delete_stamps = tokio::spawn(delete_stamp_loop(Arc::downgrade(&node)));
        let zombie_guard = {
            let node = Arc::downgrade(&node);
            let mut superseded = membership.subscribe_superseded();
            tokio::spawn(async move {
                while superseded.changed().await.is_ok() {
                    if *superseded.borrow() {
                        if let Some(node) = node.upgrade() {
                            warn!("a newer incarnation of this node registered: stopping its work");
                            node.stop_background().await;
                        }
                        return;
                    }
                }
            })
        };
        if let Ok(mut background) = node.background.lock() {
            background.extend([
                heartbeat,
                janitor,
                cleanup,
                control,
                shard_sync,
                delete_stamps,
                zombie_guard,
            ]);
        }
        info!(identity = %membership.identity(), cluster_id = %node.config.cluster_id, "node started");
        Ok(node)
    }

    /// One janitor round now; deleted splits are also forgotten by the search service.
    pub async fn run_janitor(&self) -> Result<JanitorReport, CompactionError> {
        self.run_janitor_at(shale_types::now_unix_secs()).await
    }

    /// One janitor round as if it were `now` (seconds since epoch); only the leader runs it.
    pub async fn run_janitor_at(&self, now: i64) -> Result<JanitorReport, CompactionError> {
        let leadership = self
            .membership
            .leadership()
            .ok_or(CompactionError::NotLeader)?;
        let mut report = self
            .compaction
            .janitor()
            .round(&leadership.metastore, now)
            .await?;
        report.purged_delete_tasks = self.purge_delete_tasks(&leadership.metastore, now).await?;
        for split_id in &report.deleted_split_ids {
            self.search.forget_split(split_id);
        }
        Ok(report)
    }

    /// Records, for the next heartbeats, the lowest delete opstamp of the records this node
    /// holds and has not published, per index, with the time of the reading.
    async fn report_pending_stamps(&self) {
        let at_ms = shale_types::clock::now_ms();
        let lowest = self.router.pending_delete_opstamps().await;
        let by_index: serde_json::Map<String, serde_json::Value> = lowest
            .into_iter()
            .map(|(index_uid, stamp)| (index_uid.to_string(), serde_json::json!(stamp)))
            .collect();
        *self
            .pending_report
            .lock()
            .unwrap_or_else(|p| p.into_inner()) =
            serde_json::json!({ "at_ms": at_ms, "lowest": by_index });
    }

    /// Forgets the delete tasks every record of their index is past (see
    /// `shale_compaction::service::delete_purge_limit`): those older than the index's
    /// time-travel window, once each node holding unpublished records of the index reported,
    /// after the task was acknowledged, only records stamped above it — and every split is
    /// clean of it (checked by the metastore). Returns how many were forgotten.
    async fn purge_delete_tasks(
        &self,
        metastore: &Arc<dyn Metastore>,
        now: i64,
    ) -> Result<usize, CompactionError> {
        let last = metastore.last_delete_opstamps().await?;
        if last.is_empty() {
            return Ok(0);
        }
        let view = self.membership.view();
        let acknowledged_within_ms = i64::try_from(delete_stamp_lease(&self.config).as_millis())
            .unwrap_or(i64::MAX)
            + DELETE_STAMP_MARGIN_MS;
        let shards = metastore.list_shards(None).await?;
        let mut purged = 0;
        for index_uid in last.keys() {
            let index = match metastore.index_metadata(&index_uid.index_id).await {
                Ok(index) if &index.index_uid == index_uid => index,
                Ok(_) | Err(MetastoreError::NotFound { .. }) => continue,
                Err(err) => return Err(err.into()),
            };
            let tasks = metastore.list_delete_tasks(index_uid, 0).await?;
            if tasks.len() < 2 {
                continue;
            }
            // Every node holding a shard of the index, open or draining, and what it said.
            let holders: std::collections::BTreeSet<&str> = shards
                .iter()
                .filter(|shard| &shard.key.index_uid == index_uid)
                .map(|shard| shard.node_id.as_str())
                .collect();
            let reports: Vec<Option<shale_compaction::service::PendingStamps>> = holders
                .into_iter()
                .map(|node_id| {
                    let node = view.node(node_id).filter(|node| view.is_live(node))?;
                    let report = &node.info["pending_delete_opstamps"];
                    Some(shale_compaction::service::PendingStamps {
                        reported_at_ms: report["at_ms"].as_i64()?,
                        lowest: report["lowest"][index_uid.to_string()].as_u64(),
                    })
                })
                .collect();
            let Some(limit) = shale_compaction::service::delete_purge_limit(
                &tasks,
                now,
                index.index_config.time_travel_retention_secs(),
                acknowledged_within_ms,
                &reports,
            ) else {
                continue;
            };
            // Splits marked for deletion before the time-travel window no search sees.
            let marked_since = now - index.index_config.time_travel_retention_secs();
            let forgotten = metastore
                .purge_delete_tasks(index_uid, limit, marked_since)
                .await?;
            if forgotten > 0 {
                info!(index = %index_uid, forgotten, up_to = limit, "delete tasks applied everywhere forgotten");
            }
            purged += forgotten;
        }
        Ok(purged)
    }

    /// Stops the node's background work (pipelines, compaction, janitor, membership) and
    /// gives up the leader lease, so that another node takes over at once.
    pub async fn shutdown(&self) {
        self.stop_background().await;
        self.membership.leave().await;
    }

    /// Stops everything at once, as a crash would: no lease is given up, no heartbeat is
    /// sent any more (the others see this node die after `dead_after_ms`).
    pub async fn halt(&self) {
        self.stop_background().await;
        // A crashed process's lock goes with it.
        self.release_data_dir();
    }

    /// Releases the data directory's lock (once stopped: another node may then open it).
    pub fn release_data_dir(&self) {
        self.data_dir_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    async fn stop_background(&self) {
        if let Ok(mut background) = self.background.lock() {
            for task in background.drain(..) {
                task.abort();
            }
        }
        self.router.stop().await;
        self.compaction.stop();
    }

    /// Creates the OpenTelemetry indexes (`otel-logs-v0_9`, `otel-traces-v0_9`, and the
    /// metrics index `otel-metrics-v0_9`) that do not exist yet, as Quickwit does at start. Idempotent: an index created meanwhile by another
    /// node is fine. Their shards come with the next control round.
    async fn create_otel_indexes(&self) -> Result<(), NodeError> {
        for signal in [
            crate::otlp::Signal::Logs,
            crate::otlp::Signal::Traces,
            crate::otlp::Signal::Metrics,
        ] {
            let index_id = signal.default_index_id();
            match self.metastore.index_metadata(index_id).await {
                Ok(_) => continue,
                Err(MetastoreError::NotFound { .. }) => {}
                Err(err) => return Err(err.into()),
            }
            let config = signal.index_config().map_err(|err| {
                NodeError::Internal(format!("the {index_id} index config is invalid: {err}"))
            })?;
            shale_index::DocMapper::for_index(&config).map_err(|err| {
                NodeError::Internal(format!("the {index_id} doc mapping is invalid: {err}"))
            })?;
            self.storages
                .for_index(&config.index_id, config.index_uri.as_deref())?;
            match self.metastore.create_index(config).await {
                Ok(_) => info!(index_id, "created the OpenTelemetry index"),
                Err(MetastoreError::AlreadyExists { .. }) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(())
    }

    /// Deletes the splits this node staged but never published (it crashed mid-commit).
    /// An index whose storage fails keeps its splits (the janitor deletes them once they are
    /// stale and the storage answers, and this node tries again with a backoff) and is
    /// recorded as unreachable: one unreachable storage does not keep the node from serving
    /// the other indexes.
    /// Returns the ids of those indexes, cleaned later by `staged_cleanup_loop`.
    async fn clean_staged_splits(&self) -> Result<Vec<String>, NodeError> {
        let mut failed = Vec::new();
        for index in self.metastore.list_indexes().await? {
            match self.clean_staged_splits_of(&index).await {
                Ok(()) => {}
                Err(NodeError::Storage(err)) => {
                    warn!(
                        index = %index.index_uid,
                        %err,
                        "cannot delete the splits staged before a crash: the index's storage \
                         fails; its searches and ingests answer unavailable until the janitor \
                         reaches it"
                    );
                    self.storages.mark_unreachable(
                        index.index_id(),
                        index.index_config.index_uri.as_deref(),
                        &err.to_string(),
                    );
                    failed.push(index.index_id().to_string());
                }
                Err(err) => return Err(err),
            }
        }
        Ok(failed)
    }

    /// [`Node::clean_staged_splits`] of one index.
    async fn clean_staged_splits_of(&self, index: &IndexMetadata) -> Result<(), NodeError> {
        let staged: Vec<Split> = self
            .metastore
            .list_splits(
                ListSplitsQuery::for_index(index.index_uid.clone())
                    .with_states(&[SplitState::Staged]),
            )
            .await?
            .into_iter()
            .filter(|s| s.split_metadata.node_id == self.config.node_id)
            .collect();
        if staged.is_empty() {
            return Ok(());
        }
        let storage = self.index_storage(index)?;
        let ids: Vec<String> = staged
            .iter()
            .map(|split| split.split_metadata.split_id.clone())
            .collect();
        // Mark first (only those still Staged): once marked, no late publish can
        // succeed, so deleting the objects is safe.
        let ids = self
            .metastore
            .mark_staged_splits_for_deletion(&index.index_uid, &ids)
            .await?;
        for split in &staged {
            if ids.contains(&split.split_metadata.split_id) {
                storage.delete(&split.split_metadata.object_key()).await?;
            }
        }
        self.metastore.delete_splits(&index.index_uid, &ids).await?;
        info!(index = %index.index_uid, count = ids.len(), "deleted staged splits left by a crash");
        Ok(())
    }

    /// The storage of an index.
    pub fn index_storage(
        &self,
        index: &IndexMetadata,
    ) -> Result<shale_storage::StorageRef, shale_storage::StorageError> {
        self.storages
            .for_index(index.index_id(), index.index_config.index_uri.as_deref())
    }

    /// Follows the shards table: serves this node's open shards, drains its closed ones and
    /// deletes them once drained (an indexer's job; other nodes host no shard).
    pub async fn sync_shards(&self) -> Result<(), NodeError> {
        // Read and act under the router's sync lock: never on a read older than a shard
        // served meanwhile.
        let _sync = self.router.sync_lock().await;
        let shards = self.metastore.list_shards(None).await?;
        let indexes = self.metastore.list_indexes().await?;
        self.dispatcher.refresh(shards.clone(), &indexes).await;
        if !self.config.roles.contains(&Role::Indexer) {
            return Ok(());
        }
        let me = &self.config.node_id;
        let mine: Vec<Shard> = shards.into_iter().filter(|s| &s.node_id == me).collect();
        let retired = self.router.sync_shards(&mine, &indexes).await?;
        if !retired.is_empty() {
            self.membership
                .node_metastore()
                .delete_shards(&retired)
                .await?;
        }
        Ok(())
    }

    /// Creates an index and has its first shards allocated.
    pub async fn create_index(&self, config: IndexConfig) -> Result<IndexMetadata, NodeError> {
        // Build its doc mapper once (tokenizers, locality keys): what cannot be built is
        // refused before anything is recorded.
        shale_index::DocMapper::for_index(&config)
            .map_err(|err| NodeError::InvalidRequest(err.to_string()))?;
        log_inert_keys(&config);
        // Resolve its storage before recording anything.
        self.storages
            .for_index(&config.index_id, config.index_uri.as_deref())?;
        let index = self.metastore.create_index(config).await?;
        if let Some(leadership) = self.membership.leadership() {
            control_round(
                leadership.metastore.as_ref(),
                &self.membership.view(),
                shard_settings(&self.config),
            )
            .await?;
        } else if let Some(leader) = self.membership.view().leader_node() {
            if let Err(err) = self.client.control_round(&leader.advertise_address).await {
                warn!(%err, "could not ask the leader to allocate the new index's shards");
            }
        }
        if let Err(err) = self.sync_shards().await {
            warn!(%err, "shard synchronization after index creation failed");
        }
        Ok(index)
    }

    /// Ingests `docs` into `index_id`. A missing index whose id matches an index template is
    /// created from the template first, as Quickwit does on ingest and `_bulk`.
    pub async fn ingest(
        &self,
        index_id: &str,
        docs: Vec<bytes::Bytes>,
        commit: shale_ingest::CommitMode,
    ) -> Result<shale_ingest::IngestOutcome, shale_ingest::IngestError> {
        match self.dispatcher.ingest(index_id, docs.clone(), commit).await {
            Err(shale_ingest::IngestError::IndexNotFound(missing)) => {
                match self.create_index_from_template(index_id).await {
                    Ok(true) => self.dispatcher.ingest(index_id, docs, commit).await,
                    Ok(false) => Err(shale_ingest::IngestError::IndexNotFound(missing)),
                    Err(err) => Err(shale_ingest::IngestError::Internal(format!(
                        "creating index `{index_id}` from its index template failed: {err}"
                    ))),
                }
            }
            other => other,
        }
    }

    /// Ingests metrics records (`shale_metrics::wal`) into the metrics index `index_id`.
    pub async fn ingest_samples(
        &self,
        index_id: &str,
        records: Vec<bytes::Bytes>,
        commit: shale_ingest::CommitMode,
    ) -> Result<(), shale_ingest::IngestError> {
        self.dispatcher
            .ingest_samples(index_id, records, commit)
            .await
    }

    /// Records the metric metadata a write carried for the metrics index `index_id`.
    pub async fn record_metric_metadata(
        &self,
        index_id: &str,
        metadata: &[shale_types::MetricMetadata],
    ) -> Result<(), shale_ingest::IngestError> {
        self.dispatcher
            .record_metric_metadata(index_id, metadata)
            .await
    }

    /// Creates `index_id` from the index template its id matches (the highest priority),
    /// if any. True when the index exists afterwards (created here or concurrently).
    pub async fn create_index_from_template(&self, index_id: &str) -> Result<bool, NodeError> {
        let templates = self.metastore.list_index_templates().await?;
        let Some(template) = shale_config::select_template(&templates, index_id) else {
            return Ok(false);
        };
        let config = template.index_config(index_id);
        config
            .validate()
            .map_err(|err| NodeError::InvalidRequest(err.to_string()))?;
        info!(index_id, template_id = %template.template_id, "creating index from template");
        match self.create_index(config).await {
            Ok(_) => Ok(true),
            Err(NodeError::Metastore(MetastoreError::AlreadyExists { .. })) => Ok(true),
            Err(err) => Err(err),
        }
    }

    /// Updates the config of `index_id` (Quickwit's `PUT /api/v1/indexes/{id}`): search
    /// settings, retention, indexing settings including the merge policy, compaction
    /// settings and the doc mapping (a new `doc_mapping_uid`; splits of older mappings stay
    /// searchable and are never merged with newer ones). The index id and `index_uri` cannot
    /// change. When the merge policy or the split size target changes, the maturity of the
    /// published splits is recomputed under the new policy, so splits published under
    /// `no_merge` start merging once a merging policy is set. The shards' pipelines restart
    /// with the new config, indexing what is not published yet with it.
    pub async fn update_index(
        &self,
        index_id: &str,
        mut config: IndexConfig,
    ) -> Result<IndexMetadata, NodeError> {
        let current = self.metastore.index_metadata(index_id).await?;
        if config.index_id != index_id {
            return Err(NodeError::InvalidRequest(format!(
                "the index id cannot change (from `{index_id}` to `{}`)",
                config.index_id
            )));
        }
        match (&config.index_uri, &current.index_config.index_uri) {
            (None, _) => config.index_uri = current.index_config.index_uri.clone(),
            (Some(new), old) if Some(new) != old.as_ref() => {
                return Err(NodeError::InvalidRequest(format!(
                    "index_uri cannot change (it is `{}`)",
                    old.as_deref().unwrap_or("the default storage")
                )))
            }
            _ => {}
        }
        shale_index::DocMapper::for_index(&config)
            .map_err(|err| NodeError::InvalidRequest(err.to_string()))?;
        log_inert_keys(&config);
        let old_settings = current.index_config.indexing_settings.clone();
        let updated = self
            .membership
            .node_metastore()
            .update_index_config(&current.index_uid, config)
            .await?;
        let new_settings = &updated.index_config.indexing_settings;
        if new_settings.merge_policy != old_settings.merge_policy
            || new_settings.split_num_docs_target != old_settings.split_num_docs_target
        {
            let policy = shale_compaction::policy::index_merge_policy(new_settings);
            let published = self
                .metastore
                .list_splits(
                    shale_metastore::ListSplitsQuery::for_index(updated.index_uid.clone())
                        .with_states(&[shale_types::SplitState::Published]),
                )
                .await?;
            let changed: Vec<shale_types::SplitMetadata> = published
                .into_iter()
                .filter_map(|split| {
                    let mut metadata = split.split_metadata;
                    let maturity = policy.split_maturity(metadata.num_docs, metadata.num_merge_ops);
                    (maturity != metadata.maturity).then(|| {
                        metadata.maturity = maturity;
                        metadata
                    })
                })
                .collect();
            let num_changed = self
                .membership
                .node_metastore()
                .update_split_maturities(&updated.index_uid, &changed)
                .await?;
            info!(
                index_id,
                num_changed, "split maturities follow the new merge policy"
            );
            self.compaction.planner_notify().notify_one();
        }
        info!(
            index_id,
            doc_mapping_uid = %updated.index_config.doc_mapping.doc_mapping_uid,
            "index config updated"
        );
        if let Err(err) = self.sync_shards().await {
            warn!(%err, "shard synchronization after the index update failed");
        }
        Ok(updated)
    }

    /// Creates a delete task on `index_id` and returns it once it applies: every node hosting
    /// an open shard of the index stamps the documents it acknowledges from then on with the
    /// task's opstamp or a later one (the task does not reach them), and every search leaves
    /// out what it deletes. An unparsable query or an empty time range is refused before
    /// anything is recorded.
    pub async fn create_delete_task(
        &self,
        index_id: &str,
        delete_query: DeleteQuery,
    ) -> Result<DeleteTask, NodeError> {
        let index = self.metastore.index_metadata(index_id).await?;
        if index.index_config.metrics.is_some() {
            return Err(NodeError::InvalidRequest(format!(
                "`{index_id}` is a metrics index: delete its series with \
                 `POST /prometheus/{index_id}/api/v1/admin/tsdb/delete_series`"
            )));
        }
        if delete_query.time_range_ms.is_some() {
            return Err(NodeError::InvalidRequest(
                "`time_range_ms` is for metrics indexes; use start_timestamp and end_timestamp"
                    .to_string(),
            ));
        }
        if let (Some(start), Some(end)) = (delete_query.start_timestamp, delete_query.end_timestamp)
        {
            if start >= end {
                return Err(NodeError::InvalidRequest(format!(
                    "invalid time range: start_timestamp ({start}) must be before end_timestamp \
                     ({end})"
                )));
            }
        }
        let doc_mapper = shale_index::DocMapper::for_index(&index.index_config)
            .map_err(|err| NodeError::Internal(err.to_string()))?;
        doc_mapper
            .parse_query(&delete_query.query, delete_query.search_field.as_deref())
            .map_err(|err| NodeError::InvalidRequest(format!("invalid delete query: {err}")))?;
        self.record_delete_task(&index, delete_query).await
    }

    /// Records a delete task and returns it once it applies (see [`Node::create_delete_task`]).
    async fn record_delete_task(
        &self,
        index: &IndexMetadata,
        delete_query: DeleteQuery,
    ) -> Result<DeleteTask, NodeError> {
        let task = self
            .membership
            .node_metastore()
            .create_delete_task(&index.index_uid, delete_query, shale_types::now_unix_secs())
            .await?;
        self.advance_delete_opstamps(&task).await?;
        info!(
            index_id = index.index_id(),
            opstamp = task.opstamp,
            "delete task created"
        );
        // The planner checks the delete triggers at once.
        self.compaction.planner_notify().notify_one();
        Ok(task)
    }

    /// Deletes the samples of the series `selectors` match within `[start_ms, end_ms]` from
    /// the metrics index `index_id` (Prometheus's `delete_series`): a delete task, hidden
    /// from queries once this returns and purged by delete compaction. Samples acknowledged
    /// after it are not deleted.
    pub async fn delete_series(
        &self,
        index_id: &str,
        selectors: &[String],
        start_ms: i64,
        end_ms: i64,
    ) -> Result<DeleteTask, NodeError> {
        let index = self.metastore.index_metadata(index_id).await?;
        if index.index_config.metrics.is_none() {
            return Err(NodeError::InvalidRequest(format!(
                "`{index_id}` is not a metrics index: delete documents with a delete task"
            )));
        }
        if selectors.is_empty() {
            return Err(NodeError::InvalidRequest(
                "no match[] parameter: say which series to delete".to_string(),
            ));
        }
        for selector in selectors {
            shale_metrics::parse_selector(selector)
                .map_err(|err| NodeError::InvalidRequest(err.to_string()))?;
        }
        if start_ms > end_ms {
            return Err(NodeError::InvalidRequest(format!(
                "invalid time range: start ({start_ms} ms) is after end ({end_ms} ms)"
            )));
        }
        let delete_query = DeleteQuery {
            query: selectors.join("\n"),
            search_field: None,
            start_timestamp: Some(start_ms.div_euclid(1000)),
            end_timestamp: Some(end_ms.div_euclid(1000).saturating_add(1)),
            time_range_ms: Some((start_ms, end_ms)),
        };
        self.record_delete_task(&index, delete_query).await
    }

    /// Makes sure no node stamps documents it acknowledges from now on below the task's
    /// opstamp: this node at once; every other node with a heartbeat younger than the stamp
    /// lease is called, and for each that does not confirm, the answer waits until its lease
    /// has lapsed (it refuses appends from then until it reaches the metastore again and
    /// learns of the task). Nodes without such a heartbeat cannot be stamping (their lease
    /// lapsed), whatever they do.
    async fn advance_delete_opstamps(&self, task: &DeleteTask) -> Result<(), NodeError> {
        self.router
            .delete_opstamps()
            .advance(&task.index_uid, task.opstamp)
            .await;
        let lease_ms =
            i64::try_from(delete_stamp_lease(&self.config).as_millis()).unwrap_or(i64::MAX);
        let nodes = self.metastore.list_nodes(&self.config.cluster_id).await?;
        let now = shale_types::clock::now_ms();
        let calls = nodes
            .into_iter()
            .filter(|node| node.node_id != self.config.node_id)
            .map(|node| (node.last_heartbeat_ms.saturating_add(lease_ms + DELETE_STAMP_MARGIN_MS), node))
            .filter(|(lapses_at, _)| *lapses_at > now)
            .map(|(lapses_at, node)| async move {
                match self
                    .client
                    .advance_delete_opstamp(&node.advertise_address, &task.index_uid, task.opstamp)
                    .await
                {
                    Ok(()) => None,
                    Err(err) => {
                        warn!(%err, node = %node.node_id, "could not advance the delete opstamp: waiting for its stamp lease to lapse");
                        Some(lapses_at)
                    }
                }
            });
        let lapses_at = futures::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .max();
        if let Some(lapses_at) = lapses_at {
            let wait = lapses_at
                .saturating_sub(shale_types::clock::now_ms())
                .max(0);
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
        Ok(())
    }

    /// Records a manual compaction of `index_id` and wakes the planner (the leader's plans
    /// it); returns it at once, `pending`.
    pub async fn start_compaction(
        &self,
        index_id: &str,
        request: shale_metastore::CompactionRequest,
    ) -> Result<shale_metastore::Compaction, NodeError> {
        let index = self.metastore.index_metadata(index_id).await?;
        if let (Some(start), Some(end)) = (request.start_timestamp, request.end_timestamp) {
            if start >= end {
                return Err(NodeError::InvalidRequest(format!(
                    "invalid time range: start_timestamp ({start}) must be before end_timestamp \
                     ({end})"
                )));
            }
        }
        let compaction = self
            .membership
            .node_metastore()
            .create_compaction(&index.index_uid, request, shale_types::now_unix_secs())
            .await?;
        info!(index_id, compaction_id = %compaction.compaction_id, "manual compaction requested");
        self.compaction.planner_notify().notify_one();
        Ok(compaction)
    }

    /// Deletes an index: stops its pipelines, drops its WAL, its metastore rows and its split
    /// objects. Returns the deleted splits.
    pub async fn delete_index(&self, index_id: &str) -> Result<Vec<Split>, NodeError> {
        let index = self.metastore.index_metadata(index_id).await?;
        self.router.remove_index(&index.index_uid).await?;
        let splits = self.metastore.delete_index(&index.index_uid).await?;
        let storage = self.index_storage(&index)?;
        for split in &splits {
            if let Err(err) = storage.delete(&split.split_metadata.object_key()).await {
                warn!(%err, split_id = %split.split_metadata.split_id, "failed to delete split object");
            }
            self.search.forget_split(&split.split_metadata.split_id);
            self.search
                .cache()
                .remove(&split.split_metadata.split_id)
                .await;
        }
        Ok(splits)
    }
}

/// Notes the keys of Quickwit's index config that `config` sets and that Shale accepts
/// without acting on them.
fn log_inert_keys(config: &IndexConfig) {
    for (key, why) in config.inert_keys() {
        info!(index_id = %config.index_id, key, "index config key accepted for Quickwit compatibility, no effect: {why}");
    }
}
