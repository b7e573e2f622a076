//! What the search root reads from the metastore: per search, only the index's version
//! (one row); the index's metadata, Published splits and delete tasks are read whole once,
//! then again only when a write changed that version — and then only what changed — and
//! filtered by time range in memory.

use std::sync::Arc;

use shale_config::IndexConfig;
use shale_metastore::recording::{ChangesRead, RecordingMetastore};
use shale_metastore::Metastore;
use shale_search::{SearchRequest, SearchService};
use shale_storage::{IndexStorages, SplitCache, StorageResolver};

fn request(start: i64) -> SearchRequest {
    SearchRequest {
        query: "*".into(),
        start_timestamp: Some(start),
        end_timestamp: Some(start + 3600),
        max_hits: 10,
        ..Default::default()
    }
}

#[tokio::test]
async fn search_reads_the_splits_again_only_when_the_index_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let recording = RecordingMetastore::sqlite_in(tmp.path()).await.unwrap();
    let metastore: Arc<dyn Metastore> = recording.clone();
    let config = IndexConfig::parse(
        b"index_id: logs\ndoc_mapping:\n  field_mappings:\n    - {name: ts, type: datetime, fast: true}\n    - {name: body, type: text}\n  timestamp_field: ts\nsearch_settings:\n  default_search_fields: [body]\n",
    )
    .unwrap();
    let index = metastore.create_index(config).await.unwrap();
    let storages = IndexStorages::new(
        StorageResolver::default(),
        format!("file://{}", tmp.path().join("indexes").display()),
    );
    let cache = Arc::new(SplitCache::open(&tmp.path().join("cache"), 1 << 20).unwrap());
    let search = SearchService::new(metastore.clone(), storages, cache, 2, 10);

    let whole = |num_splits| ChangesRead {
        since: None,
        whole: true,
        num_splits,
    };
    // The first search reads the index whole, once, and lists no splits by time range.
    let response = search.search("logs", request(1_700_000_000)).await.unwrap();
    assert_eq!(response.num_hits, 0);
    assert_eq!(recording.take_changes(), [whole(0)]);
    assert!(recording.take_queries().is_empty());

    // Other searches of the unchanged index read nothing more.
    search.search("logs", request(1_700_010_000)).await.unwrap();
    search.search("logs", request(1_700_020_000)).await.unwrap();
    assert!(recording.take_changes().is_empty());
    assert!(recording.take_queries().is_empty());

    // A split published: the next search reads that split's row, and only it.
    let before = metastore.index_version("logs").await.unwrap();
    let mut split = shale_metastore::conformance::split_metadata(&index.index_uid, "s1");
    // Outside the searched time range: pruned, so its (absent) object is never opened.
    split.time_range = Some(shale_types::TimeRange { start: 0, end: 10 });
    metastore
        .stage_splits(&index.index_uid, vec![split])
        .await
        .unwrap();
    metastore
        .publish_splits(&index.index_uid, &["s1".to_string()], &[], None)
        .await
        .unwrap();
    let changes = recording.take_changes();
    assert!(changes.is_empty());
    let response = search.search("logs", request(1_700_000_000)).await.unwrap();
    assert_eq!(response.num_hits, 0);
    assert_eq!(
        recording.take_changes(),
        [ChangesRead {
            since: Some(before.version),
            whole: false,
            num_splits: 1,
        }]
    );
    metastore
        .mark_splits_for_deletion(&index.index_uid, &["s1".to_string()])
        .await
        .unwrap();
    search.search("logs", request(1_700_000_000)).await.unwrap();
    let changes = recording.take_changes();
    assert_eq!(changes.len(), 1);
    assert_eq!((changes[0].whole, changes[0].num_splits), (false, 1));

    // A write to the index (a delete task) raises its version: the next search reads the
    // changes, which hold no split.
    let before = metastore.index_version("logs").await.unwrap();
    let delete: shale_types::DeleteQuery =
        serde_json::from_value(serde_json::json!({"query": "body:secret"})).unwrap();
    metastore
        .create_delete_task(&index.index_uid, delete, 1_700_000_000)
        .await
        .unwrap();
    let after = metastore.index_version("logs").await.unwrap();
    assert!(after.version > before.version);
    search.search("logs", request(1_700_000_000)).await.unwrap();
    let changes = recording.take_changes();
    assert_eq!(changes.len(), 1);
    assert_eq!((changes[0].whole, changes[0].num_splits), (false, 0));
    search.search("logs", request(1_700_000_000)).await.unwrap();
    assert!(recording.take_changes().is_empty());
    assert!(recording.take_queries().is_empty());

    // An index deleted and created again under the same id is a new index to the root.
    metastore.delete_index(&index.index_uid).await.unwrap();
    assert!(matches!(
        search.search("logs", request(1_700_000_000)).await,
        Err(shale_search::SearchError::IndexNotFound(_))
    ));
    let config = IndexConfig::parse(
        b"index_id: logs\ndoc_mapping:\n  field_mappings:\n    - {name: ts, type: datetime, fast: true}\n    - {name: body, type: text}\n  timestamp_field: ts\nsearch_settings:\n  default_search_fields: [body]\n",
    )
    .unwrap();
    metastore.create_index(config).await.unwrap();
    search.search("logs", request(1_700_000_000)).await.unwrap();
    let changes = recording.take_changes();
    assert_eq!(changes.len(), 1);
    assert!(changes[0].whole, "{changes:?}");
}
