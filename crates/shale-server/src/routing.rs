//! Ingest routing: any node accepts documents for any index, validates them (per-document
//! errors are answered by the node that received them), and hands the valid ones to an open
//! shard of the index — a shard of its own first, else the next one in round-robin order
//! among the open shards of live nodes, through the internal API. If that shard's node
//! refuses before the batch reached its WAL (shard closed meanwhile, node down, an error
//! answer that says nothing was appended), the batch goes to the next shard. If the batch
//! may be in that WAL (no answer, the pipeline stopped while the batch waited for its
//! commit, the WAL could not sync it), it is NOT sent again — it would be indexed twice —
//! and the client is told the outcome is unknown. The answer comes once the owning node has
//! persisted the batch under the requested commit mode.
//!
//! When an index has no open shard yet (just created), the leader is asked to run a control
//! round (allocate shards) — inline when this node leads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use shale_cluster::control::{control_round, ShardSettings};
use shale_cluster::Membership;
use shale_index::DocMapper;
use shale_ingest::{validate, CommitMode, IngestError, IngestOutcome, IngestRouter};
use shale_metastore::{IndexMetadata, Metastore, MetastoreError, Shard, ShardKey, ShardState};
use shale_types::{IndexUid, MetricMetadata};
use tokio::sync::RwLock;
use tracing::{debug, warn};

use crate::internal::InternalClient;

/// What a delivery carries besides the WAL records.
enum Payload {
    /// JSON documents, validated with `doc_mapper` (and parsed, for the first local attempt).
    Docs {
        doc_mapper: Arc<DocMapper>,
        parsed: Option<Vec<shale_index::ParsedDoc>>,
    },
    /// Metrics records.
    Samples,
}

/// Routes ingest requests to shards.
pub struct IngestDispatcher {
    metastore: Arc<dyn Metastore>,
    router: Arc<IngestRouter>,
    membership: Arc<Membership>,
    client: InternalClient,
    shard_settings: ShardSettings,
    /// The shards table as last read (refreshed every heartbeat, and on demand).
    shards: RwLock<Vec<Shard>>,
    /// Indexes by id, as last read.
    indexes: RwLock<HashMap<String, IndexMetadata>>,
    mappers: Mutex<HashMap<String, Arc<DocMapper>>>,
    /// Metric metadata this node wrote to the metastore, so that only changes are written.
    metric_metadata: Mutex<HashMap<(IndexUid, String), MetricMetadata>>,
    next: AtomicUsize,
}

impl IngestDispatcher {
    /// A dispatcher for the node whose shards `router` hosts.
    pub fn new(
        metastore: Arc<dyn Metastore>,
        router: Arc<IngestRouter>,
        membership: Arc<Membership>,
        client: InternalClient,
        shard_settings: ShardSettings,
    ) -> Self {
        IngestDispatcher {
            metastore,
            router,
            membership,
            client,
            shard_settings,
            shards: RwLock::new(Vec::new()),
            indexes: RwLock::new(HashMap::new()),
            mappers: Mutex::new(HashMap::new()),
            metric_metadata: Mutex::new(HashMap::new()),
            next: AtomicUsize::new(0),
        }
    }

    /// Replaces the cached shards table and indexes.
    pub async fn refresh(&self, shards: Vec<Shard>, indexes: &[IndexMetadata]) {
        *self.shards.write().await = shards;
        *self.indexes.write().await = indexes
            .iter()
            .map(|index| (index.index_id().to_string(), index.clone()))
            .collect();
    }

    async fn reload(&self) -> Result<(), MetastoreError> {
        let shards = self.metastore.list_shards(None).await?;
        let indexes = self.metastore.list_indexes().await?;
        self.refresh(shards, &indexes).await;
        Ok(())
    }

    async fn index(&self, index_id: &str) -> Result<IndexMetadata, IngestError> {
        if let Some(index) = self.indexes.read().await.get(index_id) {
            return Ok(index.clone());
        }
        match self.metastore.index_metadata(index_id).await {
            Ok(index) => {
                self.indexes
                    .write()
                    .await
                    .insert(index_id.to_string(), index.clone());
                Ok(index)
            }
            Err(MetastoreError::NotFound { .. }) => {
                Err(IngestError::IndexNotFound(index_id.to_string()))
            }
            Err(err) => Err(err.into()),
        }
    }

    fn doc_mapper(&self, index: &IndexMetadata) -> Result<Arc<DocMapper>, IngestError> {
        let key = format!(
            "{}/{}",
            index.index_uid, index.index_config.doc_mapping.doc_mapping_uid
        );
        let mut mappers = self.mappers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mapper) = mappers.get(&key) {
            return Ok(mapper.clone());
        }
        let mapper = Arc::new(DocMapper::for_index(&index.index_config)?);
        mappers.insert(key, mapper.clone());
        Ok(mapper)
    }

    /// The open shards of `index` on live nodes, this node's first, then the others from the
    /// next round-robin position.
    async fn candidates(&self, index: &IndexMetadata) -> Vec<Shard> {
        let view = self.membership.view();
        let me = &view.self_identity.node_id;
        let mut open: Vec<Shard> = self
            .shards
            .read()
            .await
            .iter()
            .filter(|s| s.key.index_uid == index.index_uid && s.state == ShardState::Open)
            .filter(|s| &s.node_id == me || view.is_node_live(&s.node_id))
            .cloned()
            .collect();
        // The shards this node serves are its own, even if the cached table lags.
        for key in self.router.open_shards_of(&index.index_uid).await {
            if !open.iter().any(|s| s.key == key) {
                open.push(Shard {
                    key,
                    node_id: me.clone(),
                    state: ShardState::Open,
                    create_timestamp: 0,
                    update_timestamp: 0,
                });
            }
        }
        let (mut local, mut remote): (Vec<Shard>, Vec<Shard>) =
            open.drain(..).partition(|s| &s.node_id == me);
        if !remote.is_empty() {
            let start = self.next.fetch_add(1, Ordering::Relaxed) % remote.len();
            remote.rotate_left(start);
        }
        local.extend(remote);
        local
    }

    /// Asks the leader to allocate shards now (inline when this node leads).
    async fn allocate(&self) -> Result<(), IngestError> {
        if let Some(leadership) = self.membership.leadership() {
            control_round(
                leadership.metastore.as_ref(),
                &self.membership.view(),
                self.shard_settings,
            )
            .await?;
            return Ok(());
        }
        let view = self.membership.view();
        let Some(leader) = view.leader_node() else {
            return Ok(());
        };
        if let Err(err) = self.client.control_round(&leader.advertise_address).await {
            warn!(%err, leader = %leader.node_id, "could not ask the leader to allocate shards");
        }
        Ok(())
    }

    /// Refuses an index whose storage cannot be reached lately (its documents could not
    /// be published).
    fn check_storage(&self, index: &IndexMetadata) -> Result<(), IngestError> {
        match self
            .router
            .storages()
            .unreachable(index.index_id(), index.index_config.index_uri.as_deref())
        {
            Some(unreachable) => Err(IngestError::StorageUnavailable(format!(
                "{unreachable}; nothing was ingested"
            ))),
            None => Ok(()),
        }
    }

    /// Validates `docs` for `index_id` and hands the valid ones to a shard.
    pub async fn ingest(
        &self,
        index_id: &str,
        docs: Vec<Bytes>,
        commit: CommitMode,
    ) -> Result<IngestOutcome, IngestError> {
        let index = self.index(index_id).await?;
        self.check_storage(&index)?;
        if index.index_config.metrics.is_some() {
            return Err(IngestError::WrongIndexKind(format!(
                "`{index_id}` is a metrics index: it takes samples (Prometheus remote write at \
                 /prometheus/{index_id}/api/v1/write, OTLP metrics), not documents"
            )));
        }
        let doc_mapper = self.doc_mapper(&index)?;
        let validated = validate(doc_mapper.clone(), docs).await?;
        let payload = Payload::Docs {
            doc_mapper,
            parsed: Some(validated.parsed),
        };
        self.deliver(index_id, index, &validated.raw, payload, commit)
            .await?;
        Ok(validated.outcome)
    }

    /// Hands metrics records (see `shale_metrics::wal`) to a shard of the metrics index
    /// `index_id`.
    pub async fn ingest_samples(
        &self,
        index_id: &str,
        records: Vec<Bytes>,
        commit: CommitMode,
    ) -> Result<(), IngestError> {
        let index = self.index(index_id).await?;
        self.check_storage(&index)?;
        if index.index_config.metrics.is_none() {
            return Err(IngestError::WrongIndexKind(format!(
                "`{index_id}` is not a metrics index: samples go to an index whose config has \
                 a `metrics` section"
            )));
        }
        self.deliver(index_id, index, &records, Payload::Samples, commit)
            .await
    }

    /// Records the metric metadata (type, help, unit) a write carried for the metrics index
    /// `index_id`; what this node already wrote unchanged is not written again.
    pub async fn record_metric_metadata(
        &self,
        index_id: &str,
        metadata: &[MetricMetadata],
    ) -> Result<(), IngestError> {
        if metadata.is_empty() {
            return Ok(());
        }
        let index = self.index(index_id).await?;
        if index.index_config.metrics.is_none() {
            return Err(IngestError::WrongIndexKind(format!(
                "`{index_id}` is not a metrics index"
            )));
        }
        let uid = index.index_uid;
        let changed: Vec<MetricMetadata> = {
            let written = self
                .metric_metadata
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            metadata
                .iter()
                .filter(|m| written.get(&(uid.clone(), m.metric_family.clone())) != Some(*m))
                .cloned()
                .collect()
        };
        if changed.is_empty() {
            return Ok(());
        }
        self.metastore
            .upsert_metric_metadata(&uid, &changed)
            .await?;
        let mut written = self
            .metric_metadata
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Bounded: a node seeing an unbounded number of families forgets and rewrites.
        if written.len() > 100_000 {
            written.clear();
        }
        for m in changed {
            written.insert((uid.clone(), m.metric_family.clone()), m);
        }
        Ok(())
    }

    /// Hands validated records to a shard of `index`: this node's first, else the next open
    /// one; a shard that refuses before anything reached its WAL passes them to the next.
    async fn deliver(
        &self,
        index_id: &str,
        index: IndexMetadata,
        raw: &[Bytes],
        mut payload: Payload,
        commit: CommitMode,
    ) -> Result<(), IngestError> {
        let mut candidates = self.candidates(&index).await;
        if candidates.is_empty() {
            self.allocate().await?;
            self.reload().await?;
            // The index may have been deleted meanwhile.
            let index = self.index(index_id).await?;
            candidates = self.candidates(&index).await;
        }
        if candidates.is_empty() {
            return Err(IngestError::NoShardAvailable {
                index_id: index_id.to_string(),
                reason: "it has no open shard on a live indexer".to_string(),
            });
        }
        let me = self.membership.identity().node_id.clone();
        let mut last_error = String::new();
        for shard in &candidates {
            let attempt = if shard.node_id == me {
                self.append_locally(&shard.key, raw, &mut payload, commit)
                    .await
            } else {
                let address = self
                    .membership
                    .view()
                    .node(&shard.node_id)
                    .map(|n| n.advertise_address.clone());
                match address {
                    Some(address) => {
                        self.client
                            .ingest(
                                &address,
                                &shard.key,
                                raw,
                                matches!(payload, Payload::Samples),
                                commit,
                            )
                            .await
                    }
                    None => Err(IngestError::ShardNotOpen(shard.key.queue_name())),
                }
            };
            match attempt {
                Ok(()) => return Ok(()),
                // Limits and bad input are the answer; other failures try the next shard.
                Err(
                    err @ (IngestError::RateLimited(_)
                    | IngestError::IndexNotFound(_)
                    | IngestError::WrongIndexKind(_)),
                ) => return Err(err),
                // The documents are (or may be) in that shard's WAL: never send them to another
                // shard, they would be indexed twice.
                Err(err) if !err.nothing_appended() => return Err(err),
                Err(err) => {
                    debug!(shard = %shard.key.queue_name(), node = %shard.node_id, %err, "shard failed; trying the next one");
                    last_error = err.to_string();
                }
            }
        }
        // Our view of the shards may be stale: refresh it for the next request.
        if let Err(err) = self.reload().await {
            warn!(%err, "could not reload the shards table");
        }
        Err(IngestError::NoShardAvailable {
            index_id: index_id.to_string(),
            reason: format!("every open shard failed (last: {last_error})"),
        })
    }

    /// Appends records to the shard `key` of this node.
    async fn append_locally(
        &self,
        key: &ShardKey,
        raw: &[Bytes],
        payload: &mut Payload,
        commit: CommitMode,
    ) -> Result<(), IngestError> {
        let shard_mapper = self.ensure_local_shard(key).await?;
        match payload {
            Payload::Docs { doc_mapper, parsed } => {
                // The parsed documents go to the first local attempt; a retry re-parses.
                let docs = match parsed.take() {
                    Some(docs) => docs,
                    None => validate(doc_mapper.clone(), raw.to_vec()).await?.parsed,
                };
                // The records carry the mapping they were validated with: they are indexed
                // with it, even if the shard's pipeline moved to a newer one meanwhile.
                self.router
                    .append(
                        key,
                        raw,
                        docs,
                        &doc_mapper.doc_mapping().doc_mapping_uid,
                        commit,
                    )
                    .await
            }
            Payload::Samples => {
                let uid = shard_mapper.doc_mapping().doc_mapping_uid.clone();
                self.router.append(key, raw, Vec::new(), &uid, commit).await
            }
        }
    }

    /// The internal API's side: appends validated documents to a shard this node hosts,
    /// serving it first if the shards table says it is this node's and open (it was just
    /// allocated). With `samples`, the records are metrics records, appended as they are.
    pub async fn ingest_into_local_shard(
        &self,
        key: &ShardKey,
        docs: Vec<Bytes>,
        samples: bool,
        commit: CommitMode,
    ) -> Result<IngestOutcome, IngestError> {
        let doc_mapper = self.ensure_local_shard(key).await?;
        let index = self.index(&key.index_uid.index_id).await?;
        if index.index_config.metrics.is_some() != samples {
            return Err(IngestError::WrongIndexKind(format!(
                "index `{}` does not take {}",
                key.index_uid.index_id,
                if samples { "samples" } else { "documents" }
            )));
        }
        if samples {
            let num = docs.len();
            self.router
                .append(
                    key,
                    &docs,
                    Vec::new(),
                    &doc_mapper.doc_mapping().doc_mapping_uid,
                    commit,
                )
                .await?;
            return Ok(IngestOutcome {
                results: vec![None; num],
                num_ingested: num,
                num_rejected: 0,
            });
        }
        let validated = validate(doc_mapper.clone(), docs).await?;
        self.router
            .append(
                key,
                &validated.raw,
                validated.parsed,
                &doc_mapper.doc_mapping().doc_mapping_uid,
                commit,
            )
            .await?;
        Ok(validated.outcome)
    }

    /// The doc mapper of the open shard `key` of this node, serving the shard first if the
    /// shards table says it is this node's and open (allocated since the last sync).
    async fn ensure_local_shard(&self, key: &ShardKey) -> Result<Arc<DocMapper>, IngestError> {
        if let Some(mapper) = self.router.open_shard_mapper(key).await {
            return Ok(mapper);
        }
        let _sync = self.router.sync_lock().await;
        if let Some(mapper) = self.router.open_shard_mapper(key).await {
            return Ok(mapper);
        }
        let me = &self.membership.identity().node_id;
        let shards = self.metastore.list_shards(Some(&key.index_uid)).await?;
        let assigned = shards
            .iter()
            .any(|s| &s.key == key && &s.node_id == me && s.state == ShardState::Open);
        if !assigned {
            return Err(IngestError::ShardNotOpen(key.queue_name()));
        }
        let index = self.index(&key.index_uid.index_id).await?;
        if index.index_uid != key.index_uid {
            return Err(IngestError::ShardNotOpen(key.queue_name()));
        }
        self.router.serve_shard(&index, key, true).await?;
        self.router
            .open_shard_mapper(key)
            .await
            .ok_or_else(|| IngestError::ShardNotOpen(key.queue_name()))
    }
}
