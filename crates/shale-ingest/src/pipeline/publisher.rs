//! The publisher stage: publishes the uploaded splits together with the checkpoint delta of
//! the WAL positions they cover, in ONE metastore transaction, then truncates the WAL. A
//! crash before the transaction replays the records; after it, they are never replayed: a
//! document is published exactly once.

use std::sync::Arc;

use shale_metastore::Metastore;
use shale_types::{CheckpointDelta, IndexUid, INGEST_API_SOURCE_ID};
use tokio::sync::{watch, Notify};
use tracing::info;

use super::uploader::UploadedBatch;
use super::StepError;
use crate::metrics;
use crate::wal::Wal;

/// The publisher of one shard's pipeline; owns the shard's checkpoint.
pub(super) struct Publisher {
    pub(super) index_uid: IndexUid,
    pub(super) queue: String,
    pub(super) metastore: Arc<dyn Metastore>,
    pub(super) wal: Arc<Wal>,
    /// Last published position of the shard.
    pub(super) checkpoint: Option<u64>,
    pub(super) published_tx: watch::Sender<Option<u64>>,
    pub(super) on_publish: Option<Arc<Notify>>,
    /// Told what is published, so that it lets those samples go.
    pub(super) live: Arc<crate::LiveSamples>,
}

impl Publisher {
    /// Publishes the batch with its checkpoint delta, then truncates the WAL.
    pub(super) async fn publish(&mut self, batch: UploadedBatch) -> Result<(), StepError> {
        let split_ids: Vec<String> = batch.splits.iter().map(|m| m.split_id.clone()).collect();
        let delta =
            CheckpointDelta::single(self.queue.clone(), self.checkpoint, batch.last_position);
        self.metastore
            .publish_splits(
                &self.index_uid,
                &split_ids,
                &[],
                Some((INGEST_API_SOURCE_ID.to_string(), delta)),
            )
            .await?;
        metrics::SPLITS_PUBLISHED.inc_by(split_ids.len() as u64);
        info!(
            index = %self.index_uid,
            queue = %self.queue,
            splits = split_ids.len(),
            num_docs = batch.splits.iter().map(|m| m.num_docs).sum::<u64>(),
            last_position = batch.last_position,
            "published splits"
        );
        self.checkpoint = Some(batch.last_position);
        self.published_tx.send_replace(self.checkpoint);
        self.live.published(
            &self.index_uid.to_string(),
            &self.queue,
            batch.last_position,
        );
        if let (Some(listener), false) = (&self.on_publish, split_ids.is_empty()) {
            listener.notify_one();
        }
        self.wal.truncate(&self.queue, batch.last_position).await?;
        Ok(())
    }
}
