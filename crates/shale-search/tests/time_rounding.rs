//! A time window answers the same whichever way it is computed: split pruning, the time
//! filter on the timestamp column and the partial-result cache (which takes a window covering
//! a whole split for no window) all floor timestamps to the second, before 1970 too, and at
//! the very ends of the nanosecond range.

use std::sync::Arc;

use shale_config::IndexConfig;
use shale_index::{DocMapper, SplitBuilder};
use shale_metastore::{IndexMetadata, Metastore};
use shale_search::{SearchRequest, SearchService};
use shale_storage::{IndexStorages, SplitCache, StorageResolver};
use shale_types::SplitMetadata;

struct Node {
    search: SearchService,
    metastore: Arc<dyn Metastore>,
    storages: IndexStorages,
    index: IndexMetadata,
    _tmp: tempfile::TempDir,
}

/// A search service (with a partial-result cache) over an index whose timestamp field `ts`
/// has `precision`, holding one split of `docs`.
async fn node_with(precision: &str, docs: &[serde_json::Value]) -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let metastore: Arc<dyn Metastore> =
        shale_metastore::recording::RecordingMetastore::sqlite_in(tmp.path())
            .await
            .unwrap();
    let yaml = format!(
        "index_id: logs\ndoc_mapping:\n  field_mappings:\n    - {{name: ts, type: datetime, fast: true, fast_precision: {precision}}}\n    - {{name: body, type: text}}\n  timestamp_field: ts\nsearch_settings:\n  default_search_fields: [body]\n"
    );
    let config = IndexConfig::parse(yaml.as_bytes()).unwrap();
    let index = metastore.create_index(config).await.unwrap();
    let storages = IndexStorages::new(
        StorageResolver::default(),
        format!("file://{}", tmp.path().join("indexes").display()),
    );
    let cache = Arc::new(SplitCache::open(&tmp.path().join("cache"), 1 << 24).unwrap());
    let search = SearchService::new(metastore.clone(), storages.clone(), cache, 2, 10);
    search.set_partial_result_cache(1 << 20);
    let node = Node {
        search,
        metastore,
        storages,
        index,
        _tmp: tmp,
    };
    node.publish("s1", docs).await;
    node
}

impl Node {
    /// Builds a split of `docs` and publishes it as ingest does.
    async fn publish(&self, split_id: &str, docs: &[serde_json::Value]) -> SplitMetadata {
        let mapper = Arc::new(DocMapper::for_index(&self.index.index_config).unwrap());
        let scratch = self._tmp.path().join("scratch").join(split_id);
        let mut builder = SplitBuilder::new(mapper.clone(), &scratch, 15_000_000).unwrap();
        for doc in docs {
            builder
                .add(mapper.parse_doc(doc.to_string().as_bytes()).unwrap())
                .unwrap();
        }
        let built = builder.finish().unwrap();
        let mut split =
            shale_metastore::conformance::split_metadata(&self.index.index_uid, split_id);
        split.doc_mapping_uid = self.index.index_config.doc_mapping.doc_mapping_uid.clone();
        split.num_docs = built.num_docs;
        split.size_bytes = built.size_bytes;
        split.time_range = built.time_range;
        split.footer_offsets = built.footer_offsets;
        let storage = self
            .storages
            .for_index("logs", self.index.index_config.index_uri.as_deref())
            .unwrap();
        storage
            .put_file(&split.object_key(), &built.path)
            .await
            .unwrap();
        self.metastore
            .stage_splits(&self.index.index_uid, vec![split.clone()])
            .await
            .unwrap();
        self.metastore
            .publish_splits(&self.index.index_uid, &[split_id.to_string()], &[], None)
            .await
            .unwrap();
        split
    }

    async fn count(&self, start: Option<i64>, end: Option<i64>) -> u64 {
        let request = SearchRequest {
            query: "*".into(),
            start_timestamp: start,
            end_timestamp: end,
            max_hits: 10,
            ..Default::default()
        };
        let response = self.search.search("logs", request).await.unwrap();
        assert!(response.errors.is_empty(), "{:?}", response.errors);
        response.num_hits
    }
}

#[tokio::test]
async fn half_a_second_before_1970_is_in_the_second_before_it_and_the_cache_agrees() {
    let node = node_with(
        "seconds",
        &[serde_json::json!({"ts": "1969-12-31T23:59:59.500Z", "body": "early"})],
    )
    .await;
    // The window of the second before 1970 covers the whole split: the cache keeps its answer
    // as the answer to `*`, which must still be the document.
    let window = node.count(Some(-1), Some(0)).await;
    assert_eq!(node.count(None, None).await, 1);
    // That window holds the document, the next second does not.
    assert_eq!(window, 1);
    assert_eq!(node.count(Some(-1), Some(0)).await, 1);
    assert_eq!(node.count(Some(0), Some(1)).await, 0);
    assert_eq!(node.count(Some(-1), None).await, 1);
    assert_eq!(node.count(None, Some(0)).await, 1);
    assert_eq!(node.count(None, Some(-1)).await, 0);
}

#[tokio::test]
async fn sub_second_precisions_before_1970_agree_with_the_split_time_range() {
    for (precision, ts) in [
        // Finer than the precision: the column holds the unit below, in second -2.
        ("milliseconds", "1969-12-31T23:59:58.9995Z"),
        ("microseconds", "1969-12-31T23:59:58.9999995Z"),
        // The column is exact; the split's time range must not truncate the microseconds.
        ("nanoseconds", "1969-12-31T23:59:58.999999999Z"),
    ] {
        let node = node_with(precision, &[serde_json::json!({"ts": ts, "body": "early"})]).await;
        assert_eq!(node.count(Some(-2), Some(-1)).await, 1, "{precision}");
        assert_eq!(node.count(None, None).await, 1, "{precision}");
        assert_eq!(node.count(Some(-1), Some(0)).await, 0, "{precision}");
        assert_eq!(node.count(None, None).await, 1, "{precision}");
    }
}

#[tokio::test]
async fn the_last_nanosecond_of_the_range_is_in_its_second_and_the_cache_agrees() {
    // i64::MAX nanoseconds after the epoch: second 9223372036, and the window's end, second
    // 9223372037, is past the end of the range.
    let node = node_with(
        "nanoseconds",
        &[serde_json::json!({"ts": "2262-04-11T23:47:16.854775807Z", "body": "last"})],
    )
    .await;
    let second = i64::MAX.div_euclid(1_000_000_000);
    // The window of its second covers the whole split: cached, it answers `*` too.
    let window = node.count(Some(second), Some(second + 1)).await;
    assert_eq!(node.count(None, None).await, 1);
    assert_eq!(window, 1);
    assert_eq!(node.count(None, Some(second + 1)).await, 1);
    assert_eq!(node.count(None, Some(second)).await, 0);
    assert_eq!(node.count(Some(second + 1), None).await, 0);
    assert_eq!(node.count(Some(i64::MAX), None).await, 0);
    assert_eq!(node.count(None, Some(i64::MAX)).await, 1);
}

#[tokio::test]
async fn the_first_nanosecond_of_the_range_is_in_its_second() {
    // i64::MIN nanoseconds: in second -9223372037, whose start is before the range.
    let node = node_with(
        "nanoseconds",
        &[serde_json::json!({"ts": "1677-09-21T00:12:43.145224192Z", "body": "first"})],
    )
    .await;
    let second = i64::MIN.div_euclid(1_000_000_000);
    assert_eq!(node.count(Some(second), Some(second + 1)).await, 1);
    assert_eq!(node.count(None, None).await, 1);
    assert_eq!(node.count(Some(i64::MIN), Some(second + 1)).await, 1);
    assert_eq!(node.count(None, Some(second)).await, 0);
    assert_eq!(node.count(Some(second + 1), None).await, 0);
}
