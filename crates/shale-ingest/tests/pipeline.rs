//! The indexing pipeline on real parts (SQLite metastore, local storage, WAL on disk).

use std::sync::Arc;
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
        dead_letter_dir: tmp.path().join("dead-letters"),
        writer_heap_bytes: 20_000_000,
        writer_threads: 1,
        on_publish: None,
        live: Arc::new(shale_ingest::LiveSamples::new(0)),
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

/// Records accepted before an index update are indexed with the doc mapping they were
/// validated with (recorded in each record), records of the new mapping with the new one,
/// each into splits of its own version; a record that truly cannot be indexed (an old-format
/// record that no longer parses) is kept in the dead letters with its position, never
/// dropped silently, and the checkpoint moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_indexed_with_the_mapping_they_were_accepted_under() {
    let tmp = tempfile::tempdir().unwrap();
    let metastore = open_metastore(&format!("sqlite://{}/ms.db", tmp.path().display()))
        .await
        .unwrap();
    let v0 = metastore
        .create_index(IndexConfig::parse(INDEX.as_bytes()).unwrap())
        .await
        .unwrap();
    let uid0 = v0.index_config.doc_mapping.doc_mapping_uid.clone();
    // `code` appears as text; then becomes a u64: "abc" no longer parses.
    let with_code = |kind: &str| {
        IndexConfig::parse(
            format!("{INDEX}    - name: code\n      type: {kind}\n")
                .replace("  timestamp_field: ts\n", "")
                .replace("doc_mapping:\n", "doc_mapping:\n  timestamp_field: ts\n")
                .as_bytes(),
        )
        .unwrap()
    };
    let v1 = metastore
        .update_index_config(&v0.index_uid, with_code("text"))
        .await
        .unwrap();
    let uid1 = v1.index_config.doc_mapping.doc_mapping_uid.clone();
    let v2 = metastore
        .update_index_config(&v0.index_uid, with_code("u64"))
        .await
        .unwrap();
    let uid2 = v2.index_config.doc_mapping.doc_mapping_uid.clone();
    assert!(uid0 != uid1 && uid1 != uid2);

    let wal = Wal::open(&tmp.path().join("queues"), PersistPolicy::OnAppend)
        .await
        .unwrap();
    let queue = format!("{}/{INGEST_API_SOURCE_ID}/shard", v0.index_uid);
    wal.ensure_queue(&queue, None).await.unwrap();
    let doc = |i: i64, code: &str| {
        format!(
            r#"{{"ts": {}, "body": "doc {i}", "code": {code}}}"#,
            1_700_000_000 + i
        )
    };
    let old: Vec<String> = (0..5).map(|i| doc(i, r#""abc""#)).collect();
    let refs: Vec<&[u8]> = old.iter().map(|d| d.as_bytes()).collect();
    wal.append_with_prefix(
        &queue,
        &shale_ingest::opstamps::record_prefix(0, &uid1),
        &refs,
    )
    .await
    .unwrap();
    // An old-format record (no mapping recorded) that the current mapping refuses.
    wal.append(&queue, &[doc(5, r#""xyz""#).as_bytes()])
        .await
        .unwrap();
    let new: Vec<String> = (6..11).map(|i| doc(i, "7")).collect();
    let refs: Vec<&[u8]> = new.iter().map(|d| d.as_bytes()).collect();
    wal.append_with_prefix(
        &queue,
        &shale_ingest::opstamps::record_prefix(0, &uid2),
        &refs,
    )
    .await
    .unwrap();

    let current = metastore.index_metadata("backlog").await.unwrap();
    let storages = IndexStorages::new(
        StorageResolver::default(),
        format!("file://{}/indexes", tmp.path().display()),
    );
    let params = shale_ingest::router::pipeline_params(
        &current,
        storages.for_index("backlog", None).unwrap(),
    )
    .unwrap();
    let env = PipelineEnv {
        node_id: "n".into(),
        metastore: metastore.clone(),
        wal: wal.clone(),
        scratch_dir: tmp.path().join("indexing"),
        dead_letter_dir: tmp.path().join("dead-letters"),
        writer_heap_bytes: 20_000_000,
        writer_threads: 1,
        on_publish: None,
        live: Arc::new(shale_ingest::LiveSamples::new(0)),
    };
    let dead_before = shale_ingest::metrics::DEAD_LETTERS.get();
    let handle = spawn_pipeline(env, params, queue.clone(), None);
    handle.force_commit();
    tokio::time::timeout(Duration::from_secs(60), handle.wait_published(10))
        .await
        .expect("published in time")
        .unwrap();

    let splits = metastore
        .list_splits(
            ListSplitsQuery::for_index(v0.index_uid.clone()).with_states(&[SplitState::Published]),
        )
        .await
        .unwrap();
    let mut by_uid: Vec<(String, u64)> = splits
        .iter()
        .map(|s| {
            (
                s.split_metadata.doc_mapping_uid.clone(),
                s.split_metadata.num_docs,
            )
        })
        .collect();
    by_uid.sort();
    let mut expected = vec![(uid1.clone(), 5), (uid2.clone(), 5)];
    expected.sort();
    assert_eq!(
        by_uid, expected,
        "each record under the mapping it was accepted with"
    );
    assert_eq!(shale_ingest::metrics::DEAD_LETTERS.get() - dead_before, 1);
    let dead = std::fs::read_dir(tmp.path().join("dead-letters"))
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
        .collect::<String>();
    let lines: Vec<serde_json::Value> = dead
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{dead}");
    assert_eq!(lines[0]["position"], 5);
    assert!(lines[0]["document"].as_str().unwrap().contains("xyz"));
    assert!(!lines[0]["error"].as_str().unwrap().is_empty());
    let meta = metastore.index_metadata("backlog").await.unwrap();
    assert_eq!(
        meta.checkpoint(INGEST_API_SOURCE_ID).position(&queue),
        Some(10)
    );
}
