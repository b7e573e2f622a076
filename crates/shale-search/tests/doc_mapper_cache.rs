//! The leaf builds an index's doc mapper once per version of everything the mapper is built
//! from, not per doc mapping uid: a config that changes any of it, keeping the uid, is searched
//! with a mapper of its own.

use std::sync::Arc;

use shale_config::IndexConfig;
use shale_metastore::Metastore;
use shale_search::leaf::Leaf;
use shale_storage::{IndexStorages, SplitCache, StorageResolver};

const CONFIG: &str = "index_id: logs\ndoc_mapping:\n  field_mappings:\n    - {name: ts, type: datetime, fast: true}\n    - {name: body, type: text}\n  timestamp_field: ts\nsearch_settings:\n  default_search_fields: [body]\n";

#[tokio::test]
async fn a_config_update_that_keeps_the_doc_mapping_uid_applies_to_the_next_search() {
    let tmp = tempfile::tempdir().unwrap();
    let metastore: Arc<dyn Metastore> =
        shale_metastore::recording::RecordingMetastore::sqlite_in(tmp.path())
            .await
            .unwrap();
    let index = metastore
        .create_index(IndexConfig::parse(CONFIG.as_bytes()).unwrap())
        .await
        .unwrap();
    let storages = IndexStorages::new(
        StorageResolver::default(),
        format!("file://{}", tmp.path().join("indexes").display()),
    );
    let cache = Arc::new(SplitCache::open(&tmp.path().join("cache"), 1 << 20).unwrap());
    let leaf = Leaf::new(storages, cache, 2);

    let before = leaf.doc_mapper(&index).unwrap();
    assert!(before.field("level").is_none());
    // The same mapper while nothing changes.
    assert!(Arc::ptr_eq(&before, &leaf.doc_mapper(&index).unwrap()));

    // Another field, under the same uid and default search fields: searches know it now.
    let mut with_level = index.clone();
    with_level.index_config.doc_mapping.field_mappings.push(
        serde_json::from_value(serde_json::json!({"name": "level", "type": "text"})).unwrap(),
    );
    let after = leaf.doc_mapper(&with_level).unwrap();
    assert!(after.field("level").is_some());
    assert!(after.parse_query("level:ERROR", None).is_ok());

    // Document store settings (an indexing setting the mapper writes splits with).
    let mut blocks = index.clone();
    blocks.index_config.indexing_settings.docstore_blocksize = Some(4096);
    assert_eq!(
        leaf.doc_mapper(&blocks)
            .unwrap()
            .docstore_settings()
            .blocksize,
        4096
    );
    assert_ne!(before.docstore_settings().blocksize, 4096);
}
