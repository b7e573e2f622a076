//! The uploader stage: describes the finished splits (metadata, maturity by the index's merge
//! policy), records them as Staged in the metastore, then uploads their objects. A Staged
//! split is invisible; an upload whose publish never comes is garbage-collected by the
//! janitor.

use std::path::PathBuf;
use std::sync::Arc;

use shale_config::MergePolicyConfig;
use shale_metastore::Metastore;
use shale_storage::StorageRef;
use shale_types::{
    new_ulid, now_unix_secs, IndexUid, SplitFormat, SplitMetadata, INGEST_API_SOURCE_ID,
};

use super::indexer::FinishedBatch;
use super::StepError;
use crate::metrics;

/// Staged and uploaded splits, ready to publish with the WAL positions they cover.
pub(super) struct UploadedBatch {
    pub(super) splits: Vec<SplitMetadata>,
    pub(super) last_position: u64,
    /// Holds the bundles until the batch is published.
    pub(super) _scratch: tempfile::TempDir,
}

/// The uploader of one shard's pipeline.
pub(super) struct Uploader {
    pub(super) node_id: String,
    pub(super) index_uid: IndexUid,
    pub(super) merge_policy: MergePolicyConfig,
    pub(super) split_num_docs_target: u64,
    pub(super) metastore: Arc<dyn Metastore>,
    pub(super) storage: StorageRef,
}

impl Uploader {
    /// Stages the batch's splits, then uploads their objects (durably).
    pub(super) async fn upload(&self, batch: FinishedBatch) -> Result<UploadedBatch, StepError> {
        let now = now_unix_secs();
        // The splits are of the mapping their documents were accepted under.
        let doc_mapper = batch.doc_mapper.clone();
        let doc_mapping_uid = doc_mapper.doc_mapping().doc_mapping_uid.clone();
        let sort_fields = doc_mapper.sort_field_names();
        let tag_fields = doc_mapper.tag_fields().to_vec();
        let splits: Vec<(SplitMetadata, PathBuf)> = batch
            .splits
            .into_iter()
            .map(|finished| {
                let (partition_id, split) = (finished.partition_id, finished.built);
                let maturity =
                    self.merge_policy
                        .split_maturity(self.split_num_docs_target, split.num_docs, 0);
                let meta = SplitMetadata {
                    split_id: new_ulid(),
                    index_uid: self.index_uid.clone(),
                    source_id: INGEST_API_SOURCE_ID.to_string(),
                    node_id: self.node_id.clone(),
                    partition_id,
                    doc_mapping_uid: doc_mapping_uid.clone(),
                    num_docs: split.num_docs,
                    size_bytes: split.size_bytes,
                    uncompressed_docs_size_bytes: split.uncompressed_docs_size_bytes,
                    time_range: split.time_range,
                    tags: split.tags,
                    create_timestamp: now,
                    maturity,
                    num_merge_ops: 0,
                    // Delete tasks up to the oldest document's opstamp reach none of them.
                    delete_opstamp: split.min_doc_opstamp,
                    footer_offsets: split.footer_offsets,
                    time_bucket_start: split.time_bucket_start,
                    sort_key_min: split.sort_key_min,
                    sort_key_max: split.sort_key_max,
                    key_level: 0,
                    sort_fields: match finished.format {
                        SplitFormat::Tantivy => sort_fields.clone(),
                        SplitFormat::Parquet => finished.sort_fields.clone(),
                    },
                    tag_fields: Some(match finished.format {
                        SplitFormat::Tantivy => tag_fields.clone(),
                        SplitFormat::Parquet => vec![shale_metrics::METRIC_NAME_LABEL.to_string()],
                    }),
                    format: finished.format,
                    num_series: finished.num_series,
                };
                (meta, split.path)
            })
            .collect();
        if !splits.is_empty() {
            let metas: Vec<SplitMetadata> = splits.iter().map(|(m, _)| m.clone()).collect();
            self.metastore.stage_splits(&self.index_uid, metas).await?;
            for (meta, path) in &splits {
                let bytes = self.storage.put_file(&meta.object_key(), path).await?;
                metrics::SPLIT_BYTES_WRITTEN.inc_by(bytes);
            }
        }
        Ok(UploadedBatch {
            splits: splits.into_iter().map(|(meta, _)| meta).collect(),
            last_position: batch.last_position,
            _scratch: batch.scratch,
        })
    }
}
