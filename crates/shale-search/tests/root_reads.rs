//! The search root asks the metastore only for the Published splits overlapping the request's
//! time range, instead of listing every split of the index and filtering in memory.

use std::sync::Arc;

use shale_config::IndexConfig;
use shale_metastore::recording::RecordingMetastore;
use shale_metastore::Metastore;
use shale_search::{SearchRequest, SearchService};
use shale_storage::{IndexStorages, SplitCache, StorageResolver};
use shale_types::SplitState;

#[tokio::test]
async fn search_lists_only_the_splits_of_its_time_range() {
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
    let search = SearchService::new(metastore, storages, cache, 2, 10);
    let response = search
        .search(
            "logs",
            SearchRequest {
                query: "*".into(),
                start_timestamp: Some(1_700_000_000),
                end_timestamp: Some(1_700_003_600),
                max_hits: 10,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(response.num_hits, 0);
    let queries = recording.take_queries();
    assert_eq!(queries.len(), 1, "{queries:?}");
    assert_eq!(queries[0].index_uid.as_ref(), Some(&index.index_uid));
    assert_eq!(queries[0].split_states, [SplitState::Published]);
    assert_eq!(queries[0].time_range_start, Some(1_700_000_000));
    assert_eq!(queries[0].time_range_end, Some(1_700_003_600));
}
