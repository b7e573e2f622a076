//! The merge worker: executes one claimed merge task, in named stages (each timed in
//! `shale_merge_stage_seconds`), mirroring the indexing pipeline:
//!
//! 1. **prepare**: the task's inputs must all still be Published splits of the same index
//!    incarnation;
//! 2. **download**: the inputs, through the split cache (which pins them while merging), or
//!    straight into scratch space when they would take more than half the cache;
//! 3. **merge**: Tantivy merges them into one split bundle — several when they add up to more
//!    than `compaction.max_split_bytes` — or, for a `locality` task, into level-1 splits cut at
//!    sort-key boundaries (`shale_index::locality_merge_split_files`), kept clear of the
//!    bucket's other level-1 splits. Every merge leaves out the documents of the delete tasks
//!    its inputs are not clean of (a `delete` task rewrites one split for just that); the
//!    doc count is checked against the inputs' minus the deleted;
//! 4. **upload**: the outputs are staged in the metastore and uploaded (durably);
//! 5. **publish**: ONE metastore transaction publishes the outputs and marks the inputs
//!    MarkedForDeletion, only if every input is still Published and this node still owns the
//!    task. If it refuses, the outputs are discarded once they can no longer be published: no
//!    document is ever lost or duplicated by a merge.
//!
//! The task's lease is renewed while the merge runs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shale_config::MergePolicyConfig;
use shale_index::{BuiltSplit, DocMapper, LocalityCut};
use shale_metastore::{IndexMetadata, ListSplitsQuery, MergeTask, MetastoreError};
use shale_storage::{CachedSplit, StorageRef};
use shale_types::sort_key::SortKey;
use shale_types::{
    new_ulid, now_unix_secs, DeleteTask, MergeKind, SplitFormat, SplitMetadata, SplitState,
};
use tracing::{info, warn};

use super::metrics::{self, stage};
use super::{CompactionEnv, CompactionError};
use crate::policy::index_merge_policy;

/// What a successful merge produced.
#[derive(Debug, Clone)]
pub struct MergeOutcome {
    /// The new splits (one for a plain merge, one or more for a locality merge).
    pub outputs: Vec<SplitMetadata>,
    /// Bytes of the inputs.
    pub bytes_read: u64,
    /// Bytes of the outputs.
    pub bytes_written: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Of which: downloading the inputs (through the cache).
    pub download: Duration,
    /// Of which: merging and bundling.
    pub merge: Duration,
    /// Of which: uploading the output and publishing it.
    pub upload_publish: Duration,
}

/// Executes a claimed task end to end, and records its outcome on the task (succeeded, or
/// failed — retried unless it can never succeed).
pub async fn execute_merge(
    env: &CompactionEnv,
    task: MergeTask,
) -> Result<MergeOutcome, CompactionError> {
    metrics::MERGES_RUNNING.inc();
    let renewal = spawn_lease_renewal(env, &task);
    let result = run_merge(env, &task).await;
    renewal.abort();
    metrics::MERGES_RUNNING.dec();
    match &result {
        Ok(outcome) => {
            metrics::MERGES_SUCCEEDED.inc();
            metrics::MERGE_BYTES_READ.inc_by(outcome.bytes_read);
            metrics::MERGE_BYTES_WRITTEN.inc_by(outcome.bytes_written);
            info!(
                task_id = %task.task_id,
                kind = %task.kind,
                inputs = task.split_ids.len(),
                outputs = outcome.outputs.len(),
                num_docs = outcome.outputs.iter().map(|s| s.num_docs).sum::<u64>(),
                elapsed_ms = outcome.elapsed.as_millis() as u64,
                "merge published"
            );
        }
        Err(err) => {
            metrics::MERGES_FAILED.inc();
            let retry = !matches!(err, CompactionError::Inapplicable { .. });
            warn!(task_id = %task.task_id, %err, retry, "merge failed");
            if let Err(fail_err) = env
                .metastore
                .fail_merge_task(
                    &task.task_id,
                    &env.worker_id,
                    &err.to_string(),
                    retry,
                    now_unix_secs(),
                )
                .await
            {
                warn!(task_id = %task.task_id, %fail_err, "could not record the merge failure");
            }
        }
    }
    result
}

fn spawn_lease_renewal(env: &CompactionEnv, task: &MergeTask) -> tokio::task::JoinHandle<()> {
    let metastore = env.metastore.clone();
    let node_id = env.worker_id.clone();
    let task_id = task.task_id.clone();
    let lease = env.config.merge_lease_secs.max(3);
    tokio::spawn(async move {
        let period = Duration::from_secs(lease / 3);
        loop {
            tokio::time::sleep(period).await;
            if let Err(err) = metastore
                .renew_merge_task_lease(&task_id, &node_id, lease, now_unix_secs())
                .await
            {
                warn!(%task_id, %err, "could not renew the merge lease");
            }
        }
    })
}

/// The inputs of a task, checked (prepare stage).
struct Prepared {
    index: IndexMetadata,
    inputs: Vec<SplitMetadata>,
    doc_mapper: DocMapper,
    storage: StorageRef,
    /// For a locality merge: how to cut its outputs.
    locality: Option<LocalityCut>,
    /// Per input, the delete tasks it is not clean of: the merge leaves their documents out.
    deletes: Vec<Vec<DeleteTask>>,
    /// The outputs are clean of every delete task up to this opstamp that an input was not.
    applied_opstamp: u64,
}

/// One merged split, and the key level it is published at.
struct MergedSplit {
    built: BuiltSplit,
    key_level: u8,
}

/// Downloaded inputs: cache pins, or files in the merge's own scratch directory.
struct Downloaded {
    paths: Vec<PathBuf>,
    _pins: Vec<Arc<CachedSplit>>,
    bytes_read: u64,
}

async fn prepare(env: &CompactionEnv, task: &MergeTask) -> Result<Prepared, CompactionError> {
    let inapplicable = |reason: String| CompactionError::Inapplicable {
        task_id: task.task_id.clone(),
        reason,
    };
    let index = env
        .metastore
        .index_metadata(&task.index_uid.index_id)
        .await?;
    if index.index_uid != task.index_uid {
        return Err(inapplicable("the index was deleted".to_string()));
    }
    let mut query =
        ListSplitsQuery::for_index(index.index_uid.clone()).with_states(&[SplitState::Published]);
    // Inputs are immature when planned; a split that matured since is still an input.
    query.partition_id = Some(task.scope.partition_id);
    let published: std::collections::HashMap<String, SplitMetadata> = env
        .metastore
        .list_splits(query)
        .await?
        .into_iter()
        .map(|s| (s.split_metadata.split_id.clone(), s.split_metadata))
        .collect();
    let mut inputs = Vec::with_capacity(task.split_ids.len());
    for split_id in &task.split_ids {
        match published.get(split_id) {
            Some(split) => inputs.push(split.clone()),
            None => {
                return Err(inapplicable(format!(
                    "input {split_id} is no longer published"
                )))
            }
        }
    }
    if inputs.len() < 2 && task.kind == MergeKind::Merge {
        return Err(inapplicable("fewer than two inputs".to_string()));
    }
    if inputs.iter().any(|split| split.format != inputs[0].format) {
        return Err(inapplicable(
            "the inputs are of several formats (Tantivy and Parquet)".to_string(),
        ));
    }
    // The inputs are read and written with the doc mapping version that wrote them (one
    // per task: merges never mix versions), not the index's current one.
    let uid = &inputs[0].doc_mapping_uid;
    if inputs.iter().any(|split| &split.doc_mapping_uid != uid) {
        return Err(inapplicable(
            "the inputs are of several doc mapping versions".to_string(),
        ));
    }
    let version_config = if uid == &index.index_config.doc_mapping.doc_mapping_uid {
        index.index_config.clone()
    } else {
        match env
            .metastore
            .doc_mapping_version(&index.index_uid, uid)
            .await?
        {
            Some(config) => config,
            None => {
                return Err(inapplicable(format!(
                    "doc mapping version {uid} of the inputs is not recorded (written before \
                     versions were kept)"
                )))
            }
        }
    };
    let config = &index.index_config;
    // Every merge applies the delete tasks its inputs are not clean of, those old enough to
    // leave the time-travel window: no merge brings a deleted document back, and a merge that
    // started before a task was created leaves its outputs unclean of it (search and a later
    // compaction apply it).
    let min_clean = inputs.iter().map(|s| s.delete_opstamp).min().unwrap_or(0);
    let applicable = super::deletes::purgeable_delete_tasks(
        env.metastore.as_ref(),
        &index,
        min_clean,
        now_unix_secs(),
    )
    .await?;
    let applied_opstamp = applicable.last().map_or(0, |task| task.opstamp);
    let deletes: Vec<Vec<DeleteTask>> = inputs
        .iter()
        .map(|split| {
            applicable
                .iter()
                .filter(|task| task.may_touch(split))
                .cloned()
                .collect()
        })
        .collect();
    // How a locality merge cuts its outputs is the version's (its sort fields encoded the
    // inputs' keys); the size targets are today's.
    let locality = match (task.kind, &version_config.indexing_settings.merge_policy) {
        (MergeKind::Merge | MergeKind::Delete, _) => None,
        (MergeKind::Locality, MergePolicyConfig::Locality(settings)) => {
            let bucket = inputs[0].time_bucket_start;
            if inputs.iter().any(|split| split.time_bucket_start != bucket) {
                return Err(inapplicable(
                    "the inputs of a locality merge are not of one time bucket".to_string(),
                ));
            }
            // The bucket's other level-1 splits: no level-1 output may overlap them.
            let fixed_ranges: Vec<(SortKey, SortKey)> = published
                .values()
                .filter(|split| {
                    split.key_level > 0
                        && split.time_bucket_start == bucket
                        && split.source_id == inputs[0].source_id
                        && split.doc_mapping_uid == inputs[0].doc_mapping_uid
                        && !task.split_ids.contains(&split.split_id)
                })
                .filter_map(|split| {
                    Some((split.sort_key_min.clone()?, split.sort_key_max.clone()?))
                })
                .collect();
            // No output above `compaction.max_split_bytes` (with headroom for the estimate).
            let cap = config.compaction.max_split_bytes / 10 * 9;
            Some(LocalityCut {
                target_num_docs: settings.target_num_docs(),
                target_bytes: Some(settings.target_split_bytes.map_or(cap, |t| t.min(cap))),
                fixed_ranges,
            })
        }
        (MergeKind::Locality, _) => {
            return Err(inapplicable(
                "a locality merge of an index whose merge policy is not `locality`".to_string(),
            ))
        }
    };
    let doc_mapper = if uid == &index.index_config.doc_mapping.doc_mapping_uid {
        DocMapper::for_index(config)?
    } else {
        DocMapper::for_older_version(&version_config)?
    };
    let storage = env
        .storages
        .for_index(index.index_id(), config.index_uri.as_deref())?;
    Ok(Prepared {
        index,
        inputs,
        doc_mapper,
        storage,
        locality,
        deletes,
        applied_opstamp,
    })
}

async fn download(
    env: &CompactionEnv,
    prepared: &Prepared,
    scratch: &std::path::Path,
) -> Result<Downloaded, CompactionError> {
    let bytes_read: u64 = prepared.inputs.iter().map(|s| s.size_bytes).sum();
    let mut paths = Vec::with_capacity(prepared.inputs.len());
    let mut pins = Vec::new();
    let local: Option<Vec<PathBuf>> = prepared
        .inputs
        .iter()
        .map(|split| prepared.storage.local_path(&split.object_key()))
        .collect();
    if let Some(local) = local {
        // Files of a local storage are read where they lie: nothing copied.
        paths = local;
    } else if bytes_read <= env.cache.max_bytes() / 2 {
        for split in &prepared.inputs {
            let pin = env
                .cache
                .get_split(prepared.storage.as_ref(), &split.split_id, split.size_bytes)
                .await?;
            paths.push(pin.split_file());
            pins.push(pin);
        }
    } else {
        // Too big for the cache: the merge keeps its own copies, deleted with its scratch.
        let dir = scratch.join("inputs");
        std::fs::create_dir_all(&dir)?;
        for split in &prepared.inputs {
            let path = dir.join(split.object_key());
            prepared
                .storage
                .get_to_file(&split.object_key(), &path)
                .await?;
            paths.push(path);
        }
    }
    Ok(Downloaded {
        paths,
        _pins: pins,
        bytes_read,
    })
}

async fn merge(
    prepared: Prepared,
    downloaded: &Downloaded,
    scratch: &std::path::Path,
    task: &MergeTask,
) -> Result<(Prepared, Vec<MergedSplit>), CompactionError> {
    let paths = downloaded.paths.clone();
    let scratch = scratch.to_path_buf();
    let Prepared {
        index,
        inputs,
        doc_mapper,
        storage,
        locality,
        deletes,
        applied_opstamp,
    } = prepared;
    // Plain merges keep the inputs' level (a size-tiered merge of fresh splits stays level 0).
    let plain_level = inputs.iter().map(|s| s.key_level).min().unwrap_or(0);
    let max_split_bytes = index.index_config.compaction.max_split_bytes;
    let (doc_mapper, locality, deletes, merged) = tokio::task::spawn_blocking(move || {
        let merged = (|| -> Result<(u64, Vec<MergedSplit>), shale_index::IndexError> {
            // With the documents the delete tasks took out, to check the outputs' count.
            let (outputs, deleted) = match &locality {
                Some(cut) => {
                    let (outputs, deleted) = shale_index::locality_merge_split_files(
                        &doc_mapper,
                        &paths,
                        &deletes,
                        &scratch.join("outputs"),
                        cut,
                    )?;
                    let outputs = outputs
                        .into_iter()
                        .map(|output| MergedSplit {
                            built: output.built,
                            key_level: output.key_level,
                        })
                        .collect();
                    (outputs, deleted)
                }
                None => {
                    let (outputs, deleted) = shale_index::merge_split_files_capped(
                        &doc_mapper,
                        &paths,
                        &deletes,
                        &scratch.join("outputs"),
                        max_split_bytes,
                    )?;
                    // Outputs cut by size overlap in key range: level 0.
                    let level = if outputs.len() > 1 { 0 } else { plain_level };
                    let outputs = outputs
                        .into_iter()
                        .map(|built| MergedSplit {
                            built,
                            key_level: level,
                        })
                        .collect();
                    (outputs, deleted)
                }
            };
            Ok((deleted, outputs))
        })();
        (doc_mapper, locality, deletes, merged)
    })
    .await?;
    let (deleted, merged) = merged?;
    let expected_docs: u64 = inputs.iter().map(|s| s.num_docs).sum::<u64>()
        - deleted.min(inputs.iter().map(|s| s.num_docs).sum::<u64>());
    let produced: u64 = merged.iter().map(|m| m.built.num_docs).sum();
    if produced != expected_docs || (merged.is_empty() && expected_docs > 0) {
        return Err(CompactionError::Inapplicable {
            task_id: task.task_id.clone(),
            reason: format!(
                "merge produced {produced} documents in {} splits from inputs holding {expected_docs} \
                 once {deleted} deleted ones are left out",
                merged.len()
            ),
        });
    }
    Ok((
        Prepared {
            index,
            inputs,
            doc_mapper,
            storage,
            locality,
            deletes,
            applied_opstamp,
        },
        merged,
    ))
}

/// An output's metadata: scope of the inputs, maturity by the index's merge policy.
fn output_metadata(
    env: &CompactionEnv,
    prepared: &Prepared,
    built: &BuiltSplit,
    key_level: u8,
    kind: MergeKind,
) -> SplitMetadata {
    let first = &prepared.inputs[0];
    // A delete compaction rewrites one split without merging it with another: not a merge op.
    let merge_ops_added = u32::from(kind != MergeKind::Delete);
    let num_merge_ops = prepared
        .inputs
        .iter()
        .map(|s| s.num_merge_ops)
        .max()
        .unwrap_or(0)
        + merge_ops_added;
    let policy = index_merge_policy(&prepared.index.index_config.indexing_settings);
    SplitMetadata {
        split_id: new_ulid(),
        index_uid: prepared.index.index_uid.clone(),
        source_id: first.source_id.clone(),
        node_id: env.node_id.clone(),
        partition_id: first.partition_id,
        doc_mapping_uid: first.doc_mapping_uid.clone(),
        num_docs: built.num_docs,
        size_bytes: built.size_bytes,
        uncompressed_docs_size_bytes: built.uncompressed_docs_size_bytes,
        time_range: built.time_range,
        tags: built.tags.clone(),
        create_timestamp: now_unix_secs(),
        maturity: policy.split_maturity(built.num_docs, num_merge_ops),
        num_merge_ops,
        // Each input is now clean up to the tasks applied, or further if it already was.
        delete_opstamp: prepared
            .inputs
            .iter()
            .map(|s| s.delete_opstamp.max(prepared.applied_opstamp))
            .min()
            .unwrap_or(0),
        footer_offsets: built.footer_offsets,
        time_bucket_start: built.time_bucket_start,
        sort_key_min: built.sort_key_min.clone(),
        sort_key_max: built.sort_key_max.clone(),
        key_level,
        // The inputs' layout carries over (their keys and tags are copied, not recomputed).
        sort_fields: common(prepared.inputs.iter().map(|s| &s.sort_fields)),
        tag_fields: common(prepared.inputs.iter().map(|s| &s.tag_fields)),
        format: Default::default(),
        num_series: None,
    }
}

/// The value every item has, or `None` when they differ.
fn common<'a, T: PartialEq + Clone + 'a>(
    mut items: impl Iterator<Item = &'a Option<T>>,
) -> Option<T> {
    let first = items.next()?.clone();
    items.all(|item| *item == first).then_some(first).flatten()
}

async fn upload(
    env: &CompactionEnv,
    prepared: &Prepared,
    outputs: &[SplitMetadata],
    merged: &[MergedSplit],
) -> Result<(), CompactionError> {
    env.metastore
        .stage_splits(&prepared.index.index_uid, outputs.to_vec())
        .await?;
    for (output, merged) in outputs.iter().zip(merged) {
        prepared
            .storage
            .put_file(&output.object_key(), &merged.built.path)
            .await?;
    }
    Ok(())
}

async fn publish(
    env: &CompactionEnv,
    prepared: &Prepared,
    outputs: &[SplitMetadata],
    task: &MergeTask,
) -> Result<(), CompactionError> {
    let index_uid = &prepared.index.index_uid;
    let replaced: Vec<String> = prepared.inputs.iter().map(|s| s.split_id.clone()).collect();
    let output_ids: Vec<String> = outputs.iter().map(|s| s.split_id.clone()).collect();
    let published = env
        .metastore
        .publish_merge(
            index_uid,
            &task.task_id,
            &env.worker_id,
            &output_ids,
            &replaced,
            now_unix_secs(),
        )
        .await;
    let Err(err) = published else {
        return Ok(());
    };
    // Discard the outputs once they can no longer be published. If the publish did commit (an
    // error after the commit), the outputs are Published and stay.
    let marked = env
        .metastore
        .mark_staged_splits_for_deletion(index_uid, &output_ids)
        .await;
    if let Ok(marked) = marked {
        for output in outputs.iter().filter(|s| marked.contains(&s.split_id)) {
            let _ = prepared.storage.delete(&output.object_key()).await;
        }
        if !marked.is_empty() {
            let _ = env.metastore.delete_splits(index_uid, &marked).await;
        }
    }
    Err(match err {
        MetastoreError::FailedPrecondition(reason) => CompactionError::Inapplicable {
            task_id: task.task_id.clone(),
            reason,
        },
        other => other.into(),
    })
}

/// The stages, one after the other.
async fn run_merge(env: &CompactionEnv, task: &MergeTask) -> Result<MergeOutcome, CompactionError> {
    let started = Instant::now();
    let (prepared, _) = stage("prepare", prepare(env, task)).await;
    let prepared = prepared?;
    if prepared.inputs[0].format == SplitFormat::Parquet {
        return run_metrics_merge(env, task, prepared, started).await;
    }
    std::fs::create_dir_all(&env.scratch_dir)?;
    let scratch = tempfile::Builder::new()
        .prefix("merge-")
        .tempdir_in(&env.scratch_dir)?;
    let (downloaded, download_time) =
        stage("download", download(env, &prepared, scratch.path())).await;
    let downloaded = downloaded?;
    let (merged, merge_time) =
        stage("merge", merge(prepared, &downloaded, scratch.path(), task)).await;
    let (prepared, merged) = merged?;
    let bytes_read = downloaded.bytes_read;
    drop(downloaded);
    let outputs: Vec<SplitMetadata> = merged
        .iter()
        .map(|m| output_metadata(env, &prepared, &m.built, m.key_level, task.kind))
        .collect();
    let (uploaded, upload_time) = stage("upload", upload(env, &prepared, &outputs, &merged)).await;
    uploaded?;
    let (published, publish_time) = stage("publish", publish(env, &prepared, &outputs, task)).await;
    published?;
    Ok(MergeOutcome {
        bytes_written: outputs.iter().map(|s| s.size_bytes).sum(),
        outputs,
        bytes_read,
        elapsed: started.elapsed(),
        download: download_time,
        merge: merge_time,
        upload_publish: upload_time + publish_time,
    })
}

/// The merge of metrics splits (Parquet): the inputs are read into memory oldest first, merged
/// by `shale_metrics::merge_splits` (a sorted k-way merge that collapses duplicate samples,
/// the later split's winning), and the outputs uploaded and published like Tantivy outputs.
/// The outputs' ids carry the time of the newest input, so that readers, which let the later
/// split win a shared timestamp, still rank them below splits written after those inputs.
async fn run_metrics_merge(
    env: &CompactionEnv,
    task: &MergeTask,
    prepared: Prepared,
    started: Instant,
) -> Result<MergeOutcome, CompactionError> {
    let inapplicable = |reason: String| CompactionError::Inapplicable {
        task_id: task.task_id.clone(),
        reason,
    };
    let sort_fields = match common(prepared.inputs.iter().map(|s| &s.sort_fields)) {
        Some(fields) if fields.len() >= 2 => fields,
        _ => {
            return Err(inapplicable(
                "the inputs were written with different sort labels".to_string(),
            ))
        }
    };
    let sort_labels = sort_fields[1..sort_fields.len() - 1].to_vec();
    // Oldest first, each with the delete tasks it is not clean of (they apply in the merge).
    let mut order: Vec<usize> = (0..prepared.inputs.len()).collect();
    order.sort_by(|a, b| {
        prepared.inputs[*a]
            .split_id
            .cmp(&prepared.inputs[*b].split_id)
    });
    let inputs: Vec<SplitMetadata> = order.iter().map(|&i| prepared.inputs[i].clone()).collect();
    let deletes: Vec<Vec<shale_metrics::SeriesDelete>> = order
        .iter()
        .map(|&i| {
            prepared.deletes[i]
                .iter()
                .map(shale_metrics::SeriesDelete::from_task)
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()
        .map_err(|err| inapplicable(format!("a delete task of the index: {err}")))?;

    let download = async {
        let mut bytes = Vec::with_capacity(inputs.len());
        for split in &inputs {
            bytes.push(prepared.storage.get_bytes(&split.object_key()).await?);
        }
        Ok::<_, CompactionError>(bytes)
    };
    let (downloaded, download_time) = stage("download", download).await;
    let downloaded = downloaded?;
    let bytes_read: u64 = downloaded.iter().map(|b| b.len() as u64).sum();

    let cap = prepared.index.index_config.compaction.max_split_bytes / 10 * 9;
    let cut = match &prepared.locality {
        Some(locality) => shale_metrics::MergeCut {
            target_bytes: locality.target_bytes,
            fixed_ranges: locality
                .fixed_ranges
                .iter()
                .map(|(min, max)| (min.0.clone(), max.0.clone()))
                .collect(),
            locality: true,
            plain_level: 0,
        },
        None => shale_metrics::MergeCut {
            target_bytes: Some(cap.max(1)),
            fixed_ranges: Vec::new(),
            locality: false,
            plain_level: inputs.iter().map(|s| s.key_level).min().unwrap_or(0),
        },
    };
    let merge = async {
        let labels = sort_labels.clone();
        tokio::task::spawn_blocking(move || {
            shale_metrics::merge_splits(&downloaded, &labels, &cut, &deletes)
        })
        .await?
        .map_err(|err| CompactionError::Metrics(err.to_string()))
    };
    let (merged, merge_time) = stage("merge", merge).await;
    let (mut outputs, stats) = merged?;
    let expected: u64 = inputs.iter().map(|s| s.num_docs).sum();
    if stats.samples_in != expected
        || stats.samples_out + stats.duplicates + stats.deleted != expected
    {
        return Err(inapplicable(format!(
            "merge read {} samples and wrote {} ({} duplicates, {} deleted) from inputs \
             holding {expected}",
            stats.samples_in, stats.samples_out, stats.duplicates, stats.deleted
        )));
    }
    // Several plain outputs (cut by size) may overlap later fresh splits: they stay level 0.
    if !cut_is_locality(&prepared) && outputs.len() > 1 {
        for output in &mut outputs {
            output.key_level = 0;
        }
    }
    let newest = inputs
        .last()
        .map(|s| s.split_id.clone())
        .unwrap_or_default();
    let first = &prepared.inputs[0];
    let num_merge_ops = prepared
        .inputs
        .iter()
        .map(|s| s.num_merge_ops)
        .max()
        .unwrap_or(0)
        + 1;
    let policy = index_merge_policy(&prepared.index.index_config.indexing_settings);
    let metadata: Vec<SplitMetadata> = outputs
        .iter()
        .map(|output| SplitMetadata {
            split_id: shale_types::new_ulid_at_time_of(&newest).unwrap_or_else(new_ulid),
            index_uid: prepared.index.index_uid.clone(),
            source_id: first.source_id.clone(),
            node_id: env.node_id.clone(),
            partition_id: first.partition_id,
            doc_mapping_uid: first.doc_mapping_uid.clone(),
            num_docs: output.summary.num_samples,
            size_bytes: output.bytes.len() as u64,
            uncompressed_docs_size_bytes: output.summary.num_samples * 16,
            time_range: output.summary.time_range_secs(),
            tags: output.summary.name_tags(),
            create_timestamp: now_unix_secs(),
            maturity: policy.split_maturity(output.summary.num_samples, num_merge_ops),
            num_merge_ops,
            // Each input is now clean up to the tasks applied, or further if it already was.
            delete_opstamp: prepared
                .inputs
                .iter()
                .map(|s| s.delete_opstamp.max(prepared.applied_opstamp))
                .min()
                .unwrap_or(0),
            footer_offsets: shale_metrics::footer_offsets(&output.bytes),
            time_bucket_start: first.time_bucket_start,
            sort_key_min: output
                .key_range
                .as_ref()
                .map(|(min, _)| SortKey(min.clone())),
            sort_key_max: output
                .key_range
                .as_ref()
                .map(|(_, max)| SortKey(max.clone())),
            key_level: output.key_level,
            sort_fields: Some(sort_fields.clone()),
            tag_fields: common(prepared.inputs.iter().map(|s| &s.tag_fields)),
            format: SplitFormat::Parquet,
            num_series: Some(output.summary.num_series),
        })
        .collect();
    let upload = async {
        env.metastore
            .stage_splits(&prepared.index.index_uid, metadata.clone())
            .await?;
        for (split, output) in metadata.iter().zip(outputs) {
            prepared
                .storage
                .put_bytes(&split.object_key(), output.bytes)
                .await?;
        }
        Ok::<_, CompactionError>(())
    };
    let (uploaded, upload_time) = stage("upload", upload).await;
    uploaded?;
    let (published, publish_time) =
        stage("publish", publish(env, &prepared, &metadata, task)).await;
    published?;
    Ok(MergeOutcome {
        bytes_written: metadata.iter().map(|s| s.size_bytes).sum(),
        outputs: metadata,
        bytes_read,
        elapsed: started.elapsed(),
        download: download_time,
        merge: merge_time,
        upload_publish: upload_time + publish_time,
    })
}

fn cut_is_locality(prepared: &Prepared) -> bool {
    prepared.locality.is_some()
}

/// Keeps a pool of at most `max_concurrent_merges` merges busy with tasks claimed from the
/// metastore. `wake` is notified when new tasks may be available.
pub(crate) async fn worker_loop(
    env: Arc<CompactionEnv>,
    wake: Arc<tokio::sync::Notify>,
    wake_planner: Arc<tokio::sync::Notify>,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(
        env.config.max_concurrent_merges.max(1),
    ));
    // node_local: a node merges only its own splits (tasks scoped to its id).
    let own_scope =
        (env.config.scope == shale_config::ScopeMode::NodeLocal).then(|| env.node_id.clone());
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let claimed = env
            .metastore
            .claim_merge_task(
                &env.worker_id,
                env.config.merge_lease_secs,
                now_unix_secs(),
                None,
                own_scope.as_deref(),
                // Automatic compaction off on this node: manual compactions only.
                !env.config.enabled,
            )
            .await;
        match claimed {
            Ok(Some(task)) => {
                let env = env.clone();
                let wake_planner = wake_planner.clone();
                tokio::spawn(async move {
                    let _ = execute_merge(&env, task).await;
                    drop(permit);
                    // Publishing changed the splits: plan again.
                    wake_planner.notify_one();
                });
            }
            Ok(None) => {
                drop(permit);
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
            Err(err) => {
                drop(permit);
                warn!(%err, "cannot claim merge tasks");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}
