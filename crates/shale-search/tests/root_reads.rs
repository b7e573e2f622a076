//! What the search root reads from the metastore: per search, only the index's version
//! (one row); the index's metadata, Published splits and delete tasks are read again only
//! when a write changed that version — then listed whole, once, and filtered by time range
//! in memory.

use std::sync::Arc;

use shale_config::IndexConfig;
use shale_metastore::recording::RecordingMetastore;
use shale_metastore::Metastore;
use shale_search::{SearchRequest, SearchService};
use shale_storage::{IndexStorages, SplitCache, StorageResolver};
use shale_types::SplitState;

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

    // The first search lists the index's Published splits, all of them, once.
    let response = search.search("logs", request(1_700_000_000)).await.unwrap();
    assert_eq!(response.num_hits, 0);
    let queries = recording.take_queries();
    assert_eq!(queries.len(), 1, "{queries:?}");
    assert_eq!(queries[0].index_uid.as_ref(), Some(&index.index_uid));
    assert_eq!(queries[0].split_states, [SplitState::Published]);
    assert_eq!(queries[0].time_range_start, None);
    assert_eq!(queries[0].time_range_end, None);

    // Other searches of the unchanged index list nothing.
    search.search("logs", request(1_700_010_000)).await.unwrap();
    search.search("logs", request(1_700_020_000)).await.unwrap();
    assert!(recording.take_queries().is_empty());

    // A write to the index (a delete task) raises its version: the next search lists again.
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
    assert_eq!(recording.take_queries().len(), 1);
    search.search("logs", request(1_700_000_000)).await.unwrap();
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
    let again = metastore.create_index(config).await.unwrap();
    search.search("logs", request(1_700_000_000)).await.unwrap();
    let queries = recording.take_queries();
    assert_eq!(queries.len(), 1);
    assert_eq!(queries[0].index_uid.as_ref(), Some(&again.index_uid));
}
