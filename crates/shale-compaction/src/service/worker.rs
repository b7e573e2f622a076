//! The merge worker: executes one claimed merge task. Downloads the inputs through the split
//! cache, merges them with Tantivy, uploads the output, then publishes it in ONE metastore
//! transaction that marks the inputs MarkedForDeletion only if every input is still Published
//! and this node still owns the task. If that transaction refuses, the output is discarded:
//! no document is ever lost or duplicated by a merge. The task's lease is renewed while the
//! merge runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shale_index::DocMapper;
use shale_metastore::{ListSplitsQuery, MergeTask, MetastoreError};
use shale_types::{new_ulid, now_unix_secs, SplitMetadata};
use tracing::{info, warn};

use super::metrics;
use super::{CompactionEnv, CompactionError};
use crate::policy::index_merge_policy;

/// What a successful merge produced.
#[derive(Debug, Clone)]
pub struct MergeOutcome {
    /// The new split.
    pub output: SplitMetadata,
    /// Bytes of the inputs.
    pub bytes_read: u64,
    /// Bytes of the output.
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
                inputs = task.split_ids.len(),
                output = %outcome.output.split_id,
                num_docs = outcome.output.num_docs,
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
                    &env.node_id,
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
    let node_id = env.node_id.clone();
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

async fn run_merge(env: &CompactionEnv, task: &MergeTask) -> Result<MergeOutcome, CompactionError> {
    let started = Instant::now();
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
    let published: std::collections::HashMap<String, SplitMetadata> = env
        .metastore
        .list_splits(ListSplitsQuery::for_index(index.index_uid.clone()))
        .await?
        .into_iter()
        .filter(|s| s.split_state == shale_types::SplitState::Published)
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
    if inputs.len() < 2 {
        return Err(inapplicable("fewer than two inputs".to_string()));
    }
    let config = &index.index_config;
    let doc_mapper = DocMapper::new(&config.doc_mapping, &config.search_settings)?;
    let policy = index_merge_policy(&config.indexing_settings);
    let storage = env
        .storages
        .for_index(index.index_id(), config.index_uri.as_deref())?;

    // Download (through the cache; the handles pin the files while we merge).
    let download_started = Instant::now();
    let mut handles = Vec::with_capacity(inputs.len());
    let mut bytes_read = 0;
    for split in &inputs {
        handles.push(
            env.cache
                .get_split(storage.as_ref(), &split.split_id, split.size_bytes)
                .await?,
        );
        bytes_read += split.size_bytes;
    }
    let paths: Vec<std::path::PathBuf> = handles.iter().map(|h| h.split_file()).collect();
    let download = download_started.elapsed();
    let merge_started = Instant::now();
    std::fs::create_dir_all(&env.scratch_dir)?;
    let scratch = tempfile::Builder::new()
        .prefix("merge-")
        .tempdir_in(&env.scratch_dir)?;
    let output_dir = scratch.path().join("output");
    let built = tokio::task::spawn_blocking(move || {
        shale_index::merge_split_files(&doc_mapper, &paths, &output_dir)
    })
    .await??;
    drop(handles);
    let merge = merge_started.elapsed();

    let first = &inputs[0];
    let num_merge_ops = inputs.iter().map(|s| s.num_merge_ops).max().unwrap_or(0) + 1;
    let now = now_unix_secs();
    let output = SplitMetadata {
        split_id: new_ulid(),
        index_uid: index.index_uid.clone(),
        source_id: first.source_id.clone(),
        node_id: env.node_id.clone(),
        partition_id: first.partition_id,
        doc_mapping_uid: first.doc_mapping_uid.clone(),
        num_docs: built.num_docs,
        size_bytes: built.size_bytes,
        uncompressed_docs_size_bytes: built.uncompressed_docs_size_bytes,
        time_range: built.time_range,
        tags: built.tags.clone(),
        create_timestamp: now,
        maturity: policy.split_maturity(built.num_docs, num_merge_ops),
        num_merge_ops,
        delete_opstamp: inputs.iter().map(|s| s.delete_opstamp).min().unwrap_or(0),
        footer_offsets: built.footer_offsets,
    };
    let expected_docs: u64 = inputs.iter().map(|s| s.num_docs).sum();
    if output.num_docs != expected_docs {
        return Err(CompactionError::Policy(format!(
            "merge produced {} documents from inputs holding {expected_docs}",
            output.num_docs
        )));
    }

    let upload_started = Instant::now();
    env.metastore
        .stage_splits(&index.index_uid, vec![output.clone()])
        .await?;
    let object_key = output.object_key();
    let publish = async {
        storage.put_file(&object_key, &built.path).await?;
        let replaced: Vec<String> = inputs.iter().map(|s| s.split_id.clone()).collect();
        env.metastore
            .publish_merge(
                &index.index_uid,
                &task.task_id,
                &env.node_id,
                std::slice::from_ref(&output.split_id),
                &replaced,
                now_unix_secs(),
            )
            .await
            .map_err(CompactionError::from)
    }
    .await;
    if let Err(err) = publish {
        // Discard the output once it can no longer be published. If the publish did commit
        // (an error after the commit), the output is Published and stays.
        let marked = env
            .metastore
            .mark_staged_splits_for_deletion(
                &index.index_uid,
                std::slice::from_ref(&output.split_id),
            )
            .await;
        if matches!(&marked, Ok(marked) if marked.contains(&output.split_id)) {
            let _ = storage.delete(&object_key).await;
            let _ = env
                .metastore
                .delete_splits(&index.index_uid, std::slice::from_ref(&output.split_id))
                .await;
        }
        return Err(match err {
            CompactionError::Metastore(MetastoreError::FailedPrecondition(reason)) => {
                inapplicable(reason)
            }
            other => other,
        });
    }
    Ok(MergeOutcome {
        bytes_written: output.size_bytes,
        output,
        bytes_read,
        elapsed: started.elapsed(),
        download,
        merge,
        upload_publish: upload_started.elapsed(),
    })
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
                &env.node_id,
                env.config.merge_lease_secs,
                now_unix_secs(),
                None,
                own_scope.as_deref(),
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
