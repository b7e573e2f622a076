//! The indexing pipeline on real parts (SQLite metastore, local storage, WAL on disk).

use std::time::Duration;

use shale_config::IndexConfig;
use shale_ingest::pipeline::{spawn_pipeline, PipelineEnv};
use shale_ingest::{PersistPolicy, Wal};
use shale_metastore::{open_metastore, ListSplitsQuery};
use shale_storage::{IndexStorages, StorageResolver};
use shale_types::{SplitState, INGEST_API_SOURCE_ID};

const INDEX: &str = r#"
index_id: backlog
doc_mapping:
  field_mappings:
    - name: ts
      type: datetime
      input_formats: [unix_timestamp]
      fast: true
    - name: body
      type: text
  timestamp_field: ts
"#;

/// A backlog in the WAL (a node restarting after an outage, or ingest outpacing indexing)
/// must still be cut into splits by the commit timeout, not indexed into one huge split, and
/// every record must be published exactly once with the checkpoint at the last position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_timeout_cuts_splits_while_a_backlog_is_drained() {
    let tmp = tempfile::tempdir().unwrap();
    let metastore = open_metastore(&format!("sqlite://{}/ms.db", tmp.path().display()))
        .await
        .unwrap();
    let index = metastore
        .create_index(IndexConfig::parse(INDEX.as_bytes()).unwrap())
        .await
        .unwrap();
    let storages = IndexStorages::new(
        StorageResolver::default(),
        format!("file://{}/indexes", tmp.path().display()),
    );
    let wal = Wal::open(&tmp.path().join("queues"), PersistPolicy::OnAppend)
        .await
        .unwrap();
    let queue = format!("{}/{INGEST_API_SOURCE_ID}/shard", index.index_uid);
    wal.ensure_queue(&queue, None).await.unwrap();
    let docs: Vec<String> = (0..40_000)
        .map(|i| format!(r#"{{"ts": {}, "body": "doc {i}"}}"#, 1_700_000_000 + i))
        .collect();
    for chunk in docs.chunks(5_000) {
        let refs: Vec<&[u8]> = chunk.iter().map(|d| d.as_bytes()).collect();
        wal.append(&queue, &refs).await.unwrap();
    }

    let mut params =
        shale_ingest::router::pipeline_params(&index, storages.for_index("backlog", None).unwrap())
            .unwrap();
    params.commit_timeout = Duration::from_millis(1);
    let env = PipelineEnv {
        node_id: "n".into(),
        metastore: metastore.clone(),
        wal: wal.clone(),
        scratch_dir: tmp.path().join("indexing"),
        writer_heap_bytes: 20_000_000,
        writer_threads: 1,
        on_publish: None,
    };
    let handle = spawn_pipeline(env, params, queue.clone(), None);
    tokio::time::timeout(Duration::from_secs(120), handle.wait_published(39_999))
        .await
        .expect("backlog published in time")
        .unwrap();

    let splits = metastore
        .list_splits(
            ListSplitsQuery::for_index(index.index_uid.clone())
                .with_states(&[SplitState::Published]),
        )
        .await
        .unwrap();
    assert!(
        splits.len() >= 3,
        "one split per read step expected, got {}",
        splits.len()
    );
    let total: u64 = splits.iter().map(|s| s.split_metadata.num_docs).sum();
    assert_eq!(total, 40_000);
    let meta = metastore.index_metadata("backlog").await.unwrap();
    assert_eq!(
        meta.checkpoint(INGEST_API_SOURCE_ID).position(&queue),
        Some(39_999)
    );
    // the WAL was truncated up to the checkpoint (the publisher truncates right after it
    // reports the publish, so give it a moment)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !wal.read(&queue, 0, 10, 1 << 20).await.unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the WAL was never truncated"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
