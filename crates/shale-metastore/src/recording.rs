//! A [`Metastore`] wrapper that records the split queries it is asked (`testing` feature), so
//! tests can check what a component reads from a real backend — e.g. that the merge planner
//! asks only for immature Published splits, or that a search root reads an index's splits
//! again only when the index changed, and then only the changed ones.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use shale_config::{IndexConfig, IndexTemplate};
use shale_types::{
    CheckpointDelta, IndexUid, MetricMetadata, SourceId, Split, SplitId, SplitMetadata,
};

use crate::{
    Fence, IndexMetadata, Lease, ListSplitsQuery, MergeTask, MergeTaskState, Metastore,
    MetastoreResult, NewMergeTask, NodeIdentity, NodeRecord, Shard, ShardKey, SplitStats,
};

/// Delegates to `inner`, recording every [`Metastore::list_splits`] query and every
/// [`Metastore::index_changes`] call.
pub struct RecordingMetastore {
    inner: Arc<dyn Metastore>,
    queries: Mutex<Vec<ListSplitsQuery>>,
    changes: Mutex<Vec<ChangesRead>>,
}

/// One [`Metastore::index_changes`] call, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangesRead {
    /// The version the caller had (`None`: no view).
    pub since: Option<u64>,
    /// Whether every Published split was returned ([`crate::SplitChanges::All`]).
    pub whole: bool,
    /// How many split rows were returned.
    pub num_splits: usize,
}

impl RecordingMetastore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Metastore>) -> Self {
        RecordingMetastore {
            inner,
            queries: Mutex::new(Vec::new()),
            changes: Mutex::new(Vec::new()),
        }
    }

    /// A recording metastore over a fresh SQLite file `metastore.db` in `dir`.
    pub async fn sqlite_in(dir: &std::path::Path) -> MetastoreResult<Arc<RecordingMetastore>> {
        let path = dir.join("metastore.db");
        let sqlite = crate::SqliteMetastore::open(&path.display().to_string()).await?;
        Ok(Arc::new(RecordingMetastore::new(Arc::new(sqlite))))
    }

    /// The `list_splits` queries asked so far, and forgets them.
    pub fn take_queries(&self) -> Vec<ListSplitsQuery> {
        std::mem::take(&mut *self.queries.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The `index_changes` calls made so far, and forgets them.
    pub fn take_changes(&self) -> Vec<ChangesRead> {
        std::mem::take(&mut *self.changes.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[async_trait]
impl Metastore for RecordingMetastore {
    async fn create_index(&self, index_config: IndexConfig) -> MetastoreResult<IndexMetadata> {
        self.inner.create_index(index_config).await
    }
    async fn index_metadata(&self, index_id: &str) -> MetastoreResult<IndexMetadata> {
        self.inner.index_metadata(index_id).await
    }
    async fn index_metadata_without_checkpoints(
        &self,
        index_id: &str,
    ) -> MetastoreResult<IndexMetadata> {
        self.inner
            .index_metadata_without_checkpoints(index_id)
            .await
    }
    async fn index_version(&self, index_id: &str) -> MetastoreResult<crate::IndexVersion> {
        self.inner.index_version(index_id).await
    }
    async fn index_changes(
        &self,
        index_id: &str,
        since: Option<&crate::IndexVersion>,
        delete_opstamp_gt: u64,
    ) -> MetastoreResult<crate::IndexChanges> {
        let changes = self
            .inner
            .index_changes(index_id, since, delete_opstamp_gt)
            .await?;
        let (whole, num_splits) = match &changes.splits {
            crate::SplitChanges::All(splits) => (true, splits.len()),
            crate::SplitChanges::Since(splits) => (false, splits.len()),
        };
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ChangesRead {
                since: since.map(|since| since.version),
                whole,
                num_splits,
            });
        Ok(changes)
    }
    async fn list_indexes(&self) -> MetastoreResult<Vec<IndexMetadata>> {
        self.inner.list_indexes().await
    }
    async fn update_index_config(
        &self,
        index_uid: &IndexUid,
        index_config: IndexConfig,
    ) -> MetastoreResult<IndexMetadata> {
        self.inner
            .update_index_config(index_uid, index_config)
            .await
    }
    async fn update_split_maturities(
        &self,
        index_uid: &IndexUid,
        splits: &[SplitMetadata],
    ) -> MetastoreResult<usize> {
        self.inner.update_split_maturities(index_uid, splits).await
    }
    async fn delete_index(&self, index_uid: &IndexUid) -> MetastoreResult<Vec<Split>> {
        self.inner.delete_index(index_uid).await
    }
    async fn stage_splits(
        &self,
        index_uid: &IndexUid,
        splits: Vec<SplitMetadata>,
    ) -> MetastoreResult<()> {
        self.inner.stage_splits(index_uid, splits).await
    }
    async fn publish_splits(
        &self,
        index_uid: &IndexUid,
        staged: &[SplitId],
        replaced: &[SplitId],
        checkpoint_delta: Option<(SourceId, CheckpointDelta)>,
    ) -> MetastoreResult<()> {
        self.inner
            .publish_splits(index_uid, staged, replaced, checkpoint_delta)
            .await
    }
    async fn list_splits(&self, query: ListSplitsQuery) -> MetastoreResult<Vec<Split>> {
        self.queries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(query.clone());
        self.inner.list_splits(query).await
    }
    async fn count_splits(&self, query: ListSplitsQuery) -> MetastoreResult<u64> {
        self.inner.count_splits(query).await
    }
    async fn mark_splits_for_deletion(
        &self,
        index_uid: &IndexUid,
        split_ids: &[SplitId],
    ) -> MetastoreResult<()> {
        self.inner
            .mark_splits_for_deletion(index_uid, split_ids)
            .await
    }
    async fn mark_staged_splits_for_deletion(
        &self,
        index_uid: &IndexUid,
        split_ids: &[SplitId],
    ) -> MetastoreResult<Vec<SplitId>> {
        self.inner
            .mark_staged_splits_for_deletion(index_uid, split_ids)
            .await
    }
    async fn split_stats(&self, now: i64) -> MetastoreResult<Vec<SplitStats>> {
        self.inner.split_stats(now).await
    }
    async fn delete_splits(
        &self,
        index_uid: &IndexUid,
        split_ids: &[SplitId],
    ) -> MetastoreResult<()> {
        self.inner.delete_splits(index_uid, split_ids).await
    }
    async fn create_merge_tasks(
        &self,
        index_uid: &IndexUid,
        tasks: Vec<NewMergeTask>,
        max_attempts: u32,
    ) -> MetastoreResult<Vec<MergeTask>> {
        self.inner
            .create_merge_tasks(index_uid, tasks, max_attempts)
            .await
    }
    async fn claim_merge_task(
        &self,
        node_id: &str,
        lease_secs: u64,
        now: i64,
        index_uid: Option<&IndexUid>,
        scope_node: Option<&str>,
        manual_only: bool,
    ) -> MetastoreResult<Option<MergeTask>> {
        self.inner
            .claim_merge_task(node_id, lease_secs, now, index_uid, scope_node, manual_only)
            .await
    }
    async fn release_merge_tasks(
        &self,
        task_ids: &[String],
        reason: &str,
        now: i64,
    ) -> MetastoreResult<Vec<String>> {
        self.inner.release_merge_tasks(task_ids, reason, now).await
    }
    async fn renew_merge_task_lease(
        &self,
        task_id: &str,
        node_id: &str,
        lease_secs: u64,
        now: i64,
    ) -> MetastoreResult<()> {
        self.inner
            .renew_merge_task_lease(task_id, node_id, lease_secs, now)
            .await
    }
    async fn publish_merge(
        &self,
        index_uid: &IndexUid,
        task_id: &str,
        node_id: &str,
        output: &[SplitId],
        replaced: &[SplitId],
        now: i64,
    ) -> MetastoreResult<()> {
        self.inner
            .publish_merge(index_uid, task_id, node_id, output, replaced, now)
            .await
    }
    async fn fail_merge_task(
        &self,
        task_id: &str,
        node_id: &str,
        error: &str,
        retry: bool,
        now: i64,
    ) -> MetastoreResult<MergeTask> {
        self.inner
            .fail_merge_task(task_id, node_id, error, retry, now)
            .await
    }
    async fn list_merge_tasks(
        &self,
        index_uid: Option<&IndexUid>,
        states: &[MergeTaskState],
        limit: Option<usize>,
    ) -> MetastoreResult<Vec<MergeTask>> {
        self.inner.list_merge_tasks(index_uid, states, limit).await
    }
    async fn delete_merge_tasks(&self, finished_before: i64) -> MetastoreResult<usize> {
        self.inner.delete_merge_tasks(finished_before).await
    }
    async fn requeue_merge_tasks(
        &self,
        lease_owners: &[String],
        now: i64,
    ) -> MetastoreResult<Vec<String>> {
        self.inner.requeue_merge_tasks(lease_owners, now).await
    }
    fn with_fence(&self, fence: Fence) -> Arc<dyn Metastore> {
        self.inner.with_fence(fence)
    }
    async fn register_node(
        &self,
        cluster_id: &str,
        node_id: &str,
        advertise_address: &str,
        roles: &[String],
        now_ms: i64,
    ) -> MetastoreResult<NodeRecord> {
        self.inner
            .register_node(cluster_id, node_id, advertise_address, roles, now_ms)
            .await
    }
    async fn heartbeat_node(
        &self,
        cluster_id: &str,
        identity: &NodeIdentity,
        info: serde_json::Value,
        now_ms: i64,
    ) -> MetastoreResult<()> {
        self.inner
            .heartbeat_node(cluster_id, identity, info, now_ms)
            .await
    }
    async fn clock_ms(&self) -> MetastoreResult<i64> {
        self.inner.clock_ms().await
    }
    async fn list_nodes(&self, cluster_id: &str) -> MetastoreResult<Vec<NodeRecord>> {
        self.inner.list_nodes(cluster_id).await
    }
    async fn forget_nodes(
        &self,
        cluster_id: &str,
        heartbeat_before_ms: i64,
    ) -> MetastoreResult<usize> {
        self.inner
            .forget_nodes(cluster_id, heartbeat_before_ms)
            .await
    }
    async fn acquire_lease(
        &self,
        cluster_id: &str,
        name: &str,
        holder: &NodeIdentity,
        ttl_ms: u64,
        now_ms: i64,
    ) -> MetastoreResult<Option<Lease>> {
        self.inner
            .acquire_lease(cluster_id, name, holder, ttl_ms, now_ms)
            .await
    }
    async fn release_lease(
        &self,
        cluster_id: &str,
        name: &str,
        holder: &NodeIdentity,
    ) -> MetastoreResult<()> {
        self.inner.release_lease(cluster_id, name, holder).await
    }
    async fn get_lease(&self, cluster_id: &str, name: &str) -> MetastoreResult<Option<Lease>> {
        self.inner.get_lease(cluster_id, name).await
    }
    async fn list_shards(&self, index_uid: Option<&IndexUid>) -> MetastoreResult<Vec<Shard>> {
        self.inner.list_shards(index_uid).await
    }
    async fn open_shards(&self, shards: Vec<(ShardKey, String)>) -> MetastoreResult<Vec<Shard>> {
        self.inner.open_shards(shards).await
    }
    async fn close_shards(&self, keys: &[ShardKey]) -> MetastoreResult<()> {
        self.inner.close_shards(keys).await
    }
    async fn delete_shards(&self, keys: &[ShardKey]) -> MetastoreResult<()> {
        self.inner.delete_shards(keys).await
    }
    async fn create_delete_task(
        &self,
        index_uid: &IndexUid,
        delete_query: shale_types::DeleteQuery,
        now: i64,
    ) -> MetastoreResult<shale_types::DeleteTask> {
        self.inner
            .create_delete_task(index_uid, delete_query, now)
            .await
    }
    async fn doc_mapping_version(
        &self,
        index_uid: &IndexUid,
        doc_mapping_uid: &str,
    ) -> MetastoreResult<Option<IndexConfig>> {
        self.inner
            .doc_mapping_version(index_uid, doc_mapping_uid)
            .await
    }

    async fn list_delete_tasks(
        &self,
        index_uid: &IndexUid,
        opstamp_gt: u64,
    ) -> MetastoreResult<Vec<shale_types::DeleteTask>> {
        self.inner.list_delete_tasks(index_uid, opstamp_gt).await
    }
    async fn purge_delete_tasks(
        &self,
        index_uid: &IndexUid,
        up_to: u64,
        marked_since: i64,
    ) -> MetastoreResult<usize> {
        self.inner
            .purge_delete_tasks(index_uid, up_to, marked_since)
            .await
    }
    async fn advance_split_delete_opstamps(
        &self,
        index_uid: &IndexUid,
        splits: &[(SplitMetadata, u64)],
    ) -> MetastoreResult<usize> {
        self.inner
            .advance_split_delete_opstamps(index_uid, splits)
            .await
    }
    async fn last_delete_opstamps(
        &self,
    ) -> MetastoreResult<std::collections::BTreeMap<IndexUid, u64>> {
        self.inner.last_delete_opstamps().await
    }
    async fn create_index_template(&self, template: IndexTemplate) -> MetastoreResult<()> {
        self.inner.create_index_template(template).await
    }
    async fn update_index_template(&self, template: IndexTemplate) -> MetastoreResult<()> {
        self.inner.update_index_template(template).await
    }
    async fn index_template(&self, template_id: &str) -> MetastoreResult<IndexTemplate> {
        self.inner.index_template(template_id).await
    }
    async fn list_index_templates(&self) -> MetastoreResult<Vec<IndexTemplate>> {
        self.inner.list_index_templates().await
    }
    async fn delete_index_templates(&self, template_ids: &[String]) -> MetastoreResult<()> {
        self.inner.delete_index_templates(template_ids).await
    }
    async fn upsert_metric_metadata(
        &self,
        index_uid: &IndexUid,
        metadata: &[MetricMetadata],
    ) -> MetastoreResult<()> {
        self.inner.upsert_metric_metadata(index_uid, metadata).await
    }
    async fn list_metric_metadata(
        &self,
        index_uid: &IndexUid,
    ) -> MetastoreResult<Vec<MetricMetadata>> {
        self.inner.list_metric_metadata(index_uid).await
    }
    async fn create_compaction(
        &self,
        index_uid: &IndexUid,
        request: crate::CompactionRequest,
        now: i64,
    ) -> MetastoreResult<crate::Compaction> {
        self.inner.create_compaction(index_uid, request, now).await
    }
    async fn list_compactions(
        &self,
        index_uid: Option<&IndexUid>,
        states: &[crate::CompactionState],
    ) -> MetastoreResult<Vec<crate::Compaction>> {
        self.inner.list_compactions(index_uid, states).await
    }
    async fn update_compaction(&self, compaction: &crate::Compaction) -> MetastoreResult<()> {
        self.inner.update_compaction(compaction).await
    }
}
