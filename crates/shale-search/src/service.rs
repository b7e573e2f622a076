//! The root of a search: admission, page bounds, listing and pruning the splits, placing them
//! on the live searchers (rendezvous hashing on the split id, load-capped), fanning out the
//! leaf requests in parallel, retrying a failed leaf's splits on the next node of their
//! rendezvous order, merging counts and top hits, and fetching the page's documents. A split
//! that could not be searched anywhere is named in the response's `errors`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, LazyLock, RwLock};
use std::time::Instant;

use async_trait::async_trait;
use futures::stream::{FuturesUnordered, StreamExt};
use prometheus::{
    register_histogram, register_int_counter, register_int_counter_vec, Histogram, IntCounter,
    IntCounterVec,
};
use shale_cluster::placement::{place, Job};
use shale_index::DocMapper;
use shale_metastore::{IndexMetadata, ListSplitsQuery, Metastore, MetastoreError};
use shale_storage::{IndexStorages, SplitCache};
use shale_types::{DeleteTask, Split, SplitMetadata, SplitState};
use tantivy::aggregation::agg_req::Aggregations;
use tantivy::aggregation::intermediate_agg_result::IntermediateAggregationResults;
use tokio::sync::Semaphore;

use crate::leaf::{
    merge_hits, DocRef, FetchDocsRequest, FetchDocsResponse, Leaf, LeafError, LeafRequest,
    LeafResponse, PartialHit,
};
use crate::request::{HitMeta, SearchRequest, SearchResponse, SortBy};

static SEARCH_LATENCY: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        "shale_search_latency_seconds",
        "Latency of search requests.",
        vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
    )
    .expect("metric registered once")
});
static SPLITS_SEARCHED: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "shale_search_splits_searched_total",
        "Splits opened by searches."
    )
    .expect("metric registered once")
});
static SPLITS_PRUNED: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "shale_search_splits_pruned_total",
        "Splits skipped by time or tag pruning."
    )
    .expect("metric registered once")
});

/// Splits this node searched as a leaf (for any root).
pub static LEAF_SPLITS: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "shale_search_leaf_splits_total",
        "Splits searched by this node as a leaf, for any root."
    )
    .expect("metric registered once")
});

/// Splits a leaf only counted (no hit of theirs could enter the top k), by how: from the
/// split's metadata (a query matching all of it) or by running the query without collecting.
pub(crate) static ONLY_COUNTED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "shale_search_leaf_splits_only_counted_total",
        "Splits a leaf only counted because none of their hits could enter the top k, by how (`metadata`, `query`).",
        &["how"]
    )
    .expect("metric registered once")
});

/// Registers the search metrics (so they are exported before the first search).
pub fn register_metrics() {
    for how in ["metadata", "query"] {
        ONLY_COUNTED.with_label_values(&[how]);
    }
    for outcome in ["reused", "loaded"] {
        VIEWS.with_label_values(&[outcome]);
    }
    LazyLock::force(&crate::partial_cache::LOOKUPS);
    for outcome in ["hit", "miss"] {
        crate::partial_cache::LOOKUPS.with_label_values(&[outcome]);
    }
    LazyLock::force(&LEAF_SPLITS);
    LazyLock::force(&SEARCH_LATENCY);
    LazyLock::force(&SPLITS_SEARCHED);
    LazyLock::force(&SPLITS_PRUNED);
}

/// Whether `split` may hold documents of `[start, end)` (the metastore's time filter: a split
/// without a time range always may).
fn overlaps(split: &SplitMetadata, start: Option<i64>, end: Option<i64>) -> bool {
    split.time_range.is_none_or(|range| {
        start.is_none_or(|start| range.end >= start) && end.is_none_or(|end| range.start < end)
    })
}

/// The delete tasks among `tasks` that some of `splits` are not clean of (those that existed
/// at `as_of` for time travel): their documents are left out until a merge purges them.
fn pending(tasks: &[DeleteTask], splits: &[SplitMetadata], as_of: Option<i64>) -> Vec<DeleteTask> {
    let Some(min_clean) = splits.iter().map(|s| s.delete_opstamp).min() else {
        return Vec::new();
    };
    tasks
        .iter()
        .filter(|task| task.opstamp > min_clean)
        .filter(|task| as_of.is_none_or(|at| task.create_timestamp <= at))
        .filter(|task| splits.iter().any(|split| task.may_touch(split)))
        .cloned()
        .collect()
}

/// Search failures that fail the whole request (per-split failures go to `errors`).
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// No such index.
    #[error("index `{0}` not found")]
    IndexNotFound(String),
    /// The request is invalid (query syntax, unknown field, bad sort).
    #[error("{0}")]
    InvalidRequest(String),
    /// The metastore failed.
    #[error("{0}")]
    Metastore(MetastoreError),
    /// The index's storage or mapping cannot be used.
    #[error("{0}")]
    Internal(String),
    /// The node cannot serve the search now (e.g. its split cache is taken by splits in use);
    /// retry later.
    #[error("{0}")]
    Unavailable(String),
    /// The request's results would pass the node's query memory budget.
    #[error("{0}")]
    OverBudget(String),
    /// The node already runs as many searches as it allows; retry later.
    #[error("too many concurrent searches: this node runs at most {limit} at once (max_concurrent_searches); retry later")]
    TooManyRequests {
        /// The node's limit.
        limit: usize,
    },
}

/// Largest `max_hits` (Quickwit's limit).
pub const MAX_HITS_LIMIT: usize = 10_000;

/// Index views a root keeps (all dropped when one more is needed).
const MAX_INDEX_VIEWS: usize = 1024;
/// Largest `start_offset` (Quickwit's limit).
pub const MAX_START_OFFSET: usize = 10_000;

/// Rejects requests whose page would be unbounded, with Quickwit's messages.
fn validate_page(request: &SearchRequest) -> Result<(), SearchError> {
    if request.max_hits > MAX_HITS_LIMIT {
        return Err(SearchError::InvalidRequest(format!(
            "Invalid argument: max value for max_hits is 10_000, but got {}",
            request.max_hits
        )));
    }
    if request.start_offset > MAX_START_OFFSET {
        return Err(SearchError::InvalidRequest(format!(
            "Invalid argument: max value for start_offset is 10_000, but got {}",
            request.start_offset
        )));
    }
    Ok(())
}

/// How far above the mean load a searcher may be given splits.
pub const MAX_PLACEMENT_IMBALANCE: f64 = 0.2;

/// A failed call to a node.
#[derive(Debug, thiserror::Error)]
pub enum NodeCallError {
    /// The call failed (the node, the network or the work): another node may serve it.
    #[error("{0}")]
    Failed(String),
    /// The node refused: the results would pass its query memory budget.
    #[error("{0}")]
    OverBudget(String),
}

impl From<LeafError> for NodeCallError {
    fn from(err: LeafError) -> Self {
        match err {
            LeafError::OverBudget(message) => NodeCallError::OverBudget(message),
            other => NodeCallError::Failed(other.to_string()),
        }
    }
}

/// The searchers a root can use: this node's leaf and, in a cluster, the others'.
#[async_trait]
pub trait SearchNodes: Send + Sync {
    /// The live searchers' ids, in a stable order.
    fn searchers(&self) -> Vec<String>;

    /// Runs a leaf search on `node`.
    async fn leaf_search(
        &self,
        node: &str,
        request: LeafRequest,
    ) -> Result<LeafResponse, NodeCallError>;

    /// Fetches documents on `node`.
    async fn fetch_docs(
        &self,
        node: &str,
        request: FetchDocsRequest,
    ) -> Result<FetchDocsResponse, NodeCallError>;
}

/// A single node: its own leaf is the only searcher.
pub struct LocalNodes {
    leaf: Arc<Leaf>,
}

/// The id [`LocalNodes`] gives its only searcher.
pub const LOCAL_NODE: &str = "local";

#[async_trait]
impl SearchNodes for LocalNodes {
    fn searchers(&self) -> Vec<String> {
        vec![LOCAL_NODE.to_string()]
    }

    async fn leaf_search(
        &self,
        _node: &str,
        request: LeafRequest,
    ) -> Result<LeafResponse, NodeCallError> {
        self.leaf.search(request).await.map_err(NodeCallError::from)
    }

    async fn fetch_docs(
        &self,
        _node: &str,
        request: FetchDocsRequest,
    ) -> Result<FetchDocsResponse, NodeCallError> {
        self.leaf
            .fetch_docs(request)
            .await
            .map_err(NodeCallError::from)
    }
}

/// The search service of a node: the root of the searches it receives, and its leaf.
pub struct SearchService {
    metastore: Arc<dyn Metastore>,
    leaf: Arc<Leaf>,
    nodes: RwLock<Arc<dyn SearchNodes>>,
    search_permits: Arc<Semaphore>,
    max_concurrent_searches: usize,
    /// Whether splits are pruned by sort-key range (locality indexes); on unless turned off
    /// to compare (results never depend on it, only the splits opened).
    key_pruning: std::sync::atomic::AtomicBool,
    /// What this root knows of each index it searched, valid while its version holds.
    views: std::sync::Mutex<HashMap<String, Arc<IndexView>>>,
}

/// An index as a root saw it at one version: its metadata (with the checkpoints its splits
/// cover), its Published splits and its delete tasks. A search checks the index's version (one read of one row)
/// and, while it holds, lists, prunes and applies deletes from here. When the version moved,
/// the view is brought up to date from the changes alone ([`Metastore::index_changes`]).
/// PromQL reads its metrics indexes through the same views ([`SearchService::index_view`]).
pub struct IndexView {
    version: shale_metastore::IndexVersion,
    index: IndexMetadata,
    /// By split id (the order searches list them in).
    splits: BTreeMap<String, Arc<SplitMetadata>>,
    delete_tasks: Vec<DeleteTask>,
}

impl IndexView {
    /// The index's metadata, with the checkpoints of the view's splits (what a reader of
    /// the shards' unpublished samples starts after).
    pub fn index(&self) -> &IndexMetadata {
        &self.index
    }

    /// Its Published splits that may hold data of `[start, end)` (Unix seconds; the
    /// metastore's time filter: a split without a time range always may), by split id.
    pub fn splits_overlapping(&self, start: Option<i64>, end: Option<i64>) -> Vec<SplitMetadata> {
        self.splits
            .values()
            .filter(|split| overlaps(split, start, end))
            .map(|split| SplitMetadata::clone(split))
            .collect()
    }

    /// The index's delete tasks.
    pub fn delete_tasks(&self) -> &[DeleteTask] {
        &self.delete_tasks
    }

    /// Its splits that may hold documents of the request's time range (the metastore's time
    /// filter: a split without a time range always may).
    fn splits_of(&self, request: &SearchRequest) -> Vec<SplitMetadata> {
        self.splits_overlapping(request.start_timestamp, request.end_timestamp)
    }

    /// The highest opstamp of its delete tasks (0 without any).
    fn last_delete_opstamp(&self) -> u64 {
        self.delete_tasks
            .iter()
            .map(|task| task.opstamp)
            .max()
            .unwrap_or(0)
    }

    /// The view `changes` lead to from `base` (the view they were asked against, if any).
    fn apply(base: Option<&IndexView>, changes: shale_metastore::IndexChanges) -> IndexView {
        let shale_metastore::IndexChanges {
            version,
            index,
            splits,
            delete_tasks,
        } = changes;
        match splits {
            // Changes since no view are the whole index: they are never asked for that way,
            // but apply to an empty view all the same.
            shale_metastore::SplitChanges::Since(rows) => {
                let mut splits = base.map(|base| base.splits.clone()).unwrap_or_default();
                for row in rows {
                    if row.split_state == SplitState::Published {
                        let split = Arc::new(row.split_metadata);
                        splits.insert(split.split_id.clone(), split);
                    } else {
                        splits.remove(&row.split_metadata.split_id);
                    }
                }
                let mut tasks = base
                    .map(|base| base.delete_tasks.clone())
                    .unwrap_or_default();
                tasks.extend(delete_tasks);
                IndexView {
                    version,
                    index,
                    splits,
                    delete_tasks: tasks,
                }
            }
            shale_metastore::SplitChanges::All(all) => IndexView {
                version,
                index,
                splits: all
                    .into_iter()
                    .map(|split| (split.split_id.clone(), Arc::new(split)))
                    .collect(),
                delete_tasks,
            },
        }
    }
}

/// Index views used as they were or loaded again, by outcome.
static VIEWS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "shale_search_index_views_total",
        "Searches whose index view (metadata, Published splits, delete tasks) was current (`reused`), brought up to date from the changes since its version (`refreshed`) or read whole from the metastore (`loaded`).",
        &["outcome"]
    )
    .expect("metric registered once")
});

impl SearchService {
    /// A search service fetching splits through `cache`, running at most
    /// `max_concurrent_searches` searches as a root (more are refused with
    /// [`SearchError::TooManyRequests`]) and `max_concurrent_leaf_searches` split searches
    /// at once as a leaf. Alone until [`SearchService::set_nodes`] gives it other searchers.
    pub fn new(
        metastore: Arc<dyn Metastore>,
        storages: IndexStorages,
        cache: Arc<SplitCache>,
        max_concurrent_leaf_searches: usize,
        max_concurrent_searches: usize,
    ) -> Self {
        let leaf = Arc::new(Leaf::new(storages, cache, max_concurrent_leaf_searches));
        let max_concurrent_searches = max_concurrent_searches.max(1);
        SearchService {
            metastore,
            nodes: RwLock::new(Arc::new(LocalNodes { leaf: leaf.clone() })),
            leaf,
            search_permits: Arc::new(Semaphore::new(max_concurrent_searches)),
            max_concurrent_searches,
            key_pruning: std::sync::atomic::AtomicBool::new(true),
            views: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Uses `nodes` as the searchers of the searches this node roots.
    pub fn set_nodes(&self, nodes: Arc<dyn SearchNodes>) {
        *self.nodes.write().unwrap_or_else(|p| p.into_inner()) = nodes;
    }

    fn nodes(&self) -> Arc<dyn SearchNodes> {
        self.nodes.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// This node's leaf.
    pub fn leaf(&self) -> &Arc<Leaf> {
        &self.leaf
    }

    /// The split cache.
    pub fn cache(&self) -> &Arc<SplitCache> {
        self.leaf.cache()
    }

    /// Reads splits on remote storage by byte ranges through `ranges` (see
    /// [`Leaf::set_range_cache`]).
    pub fn set_range_cache(&self, ranges: Option<Arc<shale_storage::RangeCache>>) {
        self.leaf.set_range_cache(ranges);
    }

    /// Keeps what each split answered to each request shape in at most `max_bytes` (see
    /// [`Leaf::set_partial_result_cache`]).
    pub fn set_partial_result_cache(&self, max_bytes: u64) {
        self.leaf.set_partial_result_cache(max_bytes);
    }

    /// Makes this node's aggregations share half of `budget` (see
    /// [`Leaf::set_memory_budget`]).
    pub fn set_memory_budget(&self, budget: shale_types::memory::MemoryBudget) {
        self.leaf.set_memory_budget(&budget);
    }

    /// Number of splits kept open between searches.
    pub fn num_open_splits(&self) -> usize {
        self.leaf.num_open_splits()
    }

    /// Forgets an open split (its object was deleted).
    pub fn forget_split(&self, split_id: &str) {
        self.leaf.forget_split(split_id);
    }

    /// The semaphore admitting searches (one permit per search in progress).
    pub fn search_permits(&self) -> &Arc<Semaphore> {
        &self.search_permits
    }

    fn admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, SearchError> {
        self.search_permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| SearchError::TooManyRequests {
                limit: self.max_concurrent_searches,
            })
    }

    /// The current view of `index_id` (see [`IndexView`]): what a reader of the index as it
    /// is now lists its splits and delete tasks from, without reading them again while the
    /// index's version holds.
    pub async fn index_view(&self, index_id: &str) -> Result<Arc<IndexView>, SearchError> {
        self.view(index_id).await
    }

    /// The current view of `index_id`: the one kept if the index's version still holds, else
    /// brought up to date by the changes since its version (the whole index when there is no
    /// view). The changes are read in one snapshot of the metastore, so the view is exactly
    /// that of the version they come with.
    async fn view(&self, index_id: &str) -> Result<Arc<IndexView>, SearchError> {
        let not_found = |err: MetastoreError| match err {
            MetastoreError::NotFound { .. } => SearchError::IndexNotFound(index_id.to_string()),
            err => SearchError::Metastore(err),
        };
        let version = self
            .metastore
            .index_version(index_id)
            .await
            .map_err(not_found)?;
        let kept = self
            .views
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(index_id)
            .cloned();
        if let Some(view) = kept.as_ref().filter(|view| view.version == version) {
            VIEWS.with_label_values(&["reused"]).inc();
            return Ok(view.clone());
        }
        let base = kept.filter(|view| view.version.index_uid == version.index_uid);
        let changes = self
            .metastore
            .index_changes(
                index_id,
                base.as_ref().map(|view| &view.version),
                base.as_ref().map_or(0, |view| view.last_delete_opstamp()),
            )
            .await
            .map_err(not_found)?;
        let outcome = match changes.splits {
            shale_metastore::SplitChanges::All(_) => "loaded",
            shale_metastore::SplitChanges::Since(_) => "refreshed",
        };
        VIEWS.with_label_values(&[outcome]).inc();
        let view = Arc::new(IndexView::apply(base.as_deref(), changes));
        let mut views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: an index searched once does not stay forever (it is read again if needed).
        if views.len() >= MAX_INDEX_VIEWS && !views.contains_key(index_id) {
            views.clear();
        }
        // A concurrent search may have kept a newer view of the same index meanwhile.
        let newer_kept = views.get(index_id).is_some_and(|kept| {
            kept.version.index_uid == view.version.index_uid
                && kept.version.version > view.version.version
        });
        if !newer_kept {
            views.insert(index_id.to_string(), view.clone());
        }
        Ok(view)
    }

    /// The view of the index and its doc mapper; the request is checked (page bounds, query,
    /// sort) before anything is searched.
    async fn prepare(
        &self,
        index_id: &str,
        request: &SearchRequest,
    ) -> Result<(Arc<IndexView>, Arc<DocMapper>, SortBy, Option<Aggregations>), SearchError> {
        validate_page(request)?;
        let view = self.view(index_id).await?;
        let index = &view.index;
        if index.index_config.metrics.is_some() {
            return Err(SearchError::InvalidRequest(format!(
                "`{index_id}` is a metrics index: query it with PromQL at \
                 /prometheus/{index_id}/api/v1/query"
            )));
        }
        let prepared = self.leaf.prepare(index, request).map_err(|err| match err {
            LeafError::InvalidRequest(message) => SearchError::InvalidRequest(message),
            LeafError::Internal(message) => SearchError::Internal(message),
            LeafError::OverBudget(message) => SearchError::OverBudget(message),
        })?;
        if let Some(aggs) = &prepared.aggs {
            self.leaf
                .validate_aggs(index, &prepared.doc_mapper, aggs)
                .map_err(|err| match err {
                    LeafError::InvalidRequest(message) => SearchError::InvalidRequest(message),
                    LeafError::Internal(message) => SearchError::Internal(message),
                    LeafError::OverBudget(message) => SearchError::OverBudget(message),
                })?;
        }
        Ok((view, prepared.doc_mapper, prepared.sort_by, prepared.aggs))
    }

    /// Runs `request` on `index_id`.
    pub async fn search(
        &self,
        index_id: &str,
        request: SearchRequest,
    ) -> Result<SearchResponse, SearchError> {
        let _permit = self.admit()?;
        let _timer = SEARCH_LATENCY.start_timer();
        self.search_admitted(index_id, request, true).await
    }

    /// Runs one request per index (the same search translated for each index's mapping) as
    /// one search: counts summed, hits merged by their sort values and paged once,
    /// aggregations merged before they are rendered. Every request must have the same sort
    /// and page; an index pattern matching several indexes is searched this way.
    pub async fn search_many(
        &self,
        targets: Vec<(String, SearchRequest)>,
    ) -> Result<SearchResponse, SearchError> {
        let started = Instant::now();
        let _permit = self.admit()?;
        let _timer = SEARCH_LATENCY.start_timer();
        let Some((first_index, first)) = targets.first().cloned() else {
            return Ok(SearchResponse::default());
        };
        if targets.len() == 1 {
            return self.search_admitted(&first_index, first, true).await;
        }
        let (start_offset, max_hits) = (first.start_offset, first.max_hits);
        let k = start_offset.saturating_add(max_hits);
        let calls = targets
            .into_iter()
            .map(|(index_id, mut request)| async move {
                request.start_offset = 0;
                request.max_hits = k;
                self.search_admitted(&index_id, request, false).await
            });
        let responses = futures::future::try_join_all(calls).await?;
        let (_, doc_mapper, sort_by, aggs) = self.prepare(&first_index, &first).await?;
        drop(doc_mapper);
        let mut merged = SearchResponse::default();
        let mut hits: Vec<(PartialHit, serde_json::Value, String)> = Vec::new();
        let mut merged_aggs = IntermediateAggregationResults::default();
        let mut held = self.leaf.results_reservation();
        let mut term_errors = crate::aggs::TermCountErrors::new();
        for response in responses {
            crate::aggs::add_term_count_errors(&mut term_errors, &response.term_count_errors);
            merged.num_hits += response.num_hits;
            merged.errors.extend(response.errors);
            merged.num_splits_searched += response.num_splits_searched;
            merged.num_splits_pruned += response.num_splits_pruned;
            merged.num_nodes = merged.num_nodes.max(response.num_nodes);
            if let Some(intermediate) = response.intermediate_aggs {
                crate::aggs::reserve_results(&mut held, &intermediate, false)
                    .map_err(SearchError::OverBudget)?;
                merged_aggs
                    .merge_fruits(intermediate)
                    .map_err(|err| SearchError::Internal(format!("merging aggregations: {err}")))?;
            }
            for (doc, meta) in response.hits.into_iter().zip(response.hit_meta) {
                hits.push((
                    PartialHit {
                        key: meta.key,
                        doc: meta.doc,
                    },
                    doc,
                    meta.index_id,
                ));
            }
        }
        hits.sort_by(|a, b| crate::leaf::compare_hits(&a.0, &b.0, &sort_by));
        for (hit, doc, index_id) in hits.into_iter().skip(start_offset).take(max_hits) {
            merged.hits.push(doc);
            merged.hit_meta.push(HitMeta {
                key: hit.key,
                doc: hit.doc,
                index_id,
            });
        }
        if let Some(aggs) = aggs {
            crate::aggs::reserve_results(&mut held, &merged_aggs, true)
                .map_err(SearchError::OverBudget)?;
            merged.aggregations = Some(
                crate::aggs::finalize(aggs, merged_aggs, &term_errors)
                    .map_err(SearchError::InvalidRequest)?,
            );
        }
        merged.elapsed_time_micros = started.elapsed().as_micros() as u64;
        Ok(merged)
    }

    /// [`SearchService::search`] once admitted; with `finalize_aggs` false the merged
    /// intermediate aggregation results are returned instead of the rendered ones.
    async fn search_admitted(
        &self,
        index_id: &str,
        request: SearchRequest,
        finalize_aggs: bool,
    ) -> Result<SearchResponse, SearchError> {
        let started = Instant::now();
        let (view, doc_mapper, sort_by, aggs) = self.prepare(index_id, &request).await?;
        let index = &view.index;
        // An index whose storage cannot be reached is answered at once, not after the
        // object store's retries on each split.
        if let Some(unreachable) = self
            .leaf
            .storages()
            .unreachable(index.index_id(), index.index_config.index_uri.as_deref())
        {
            return Err(SearchError::Unavailable(unreachable));
        }

        let as_of = match request.as_of {
            Some(as_of) => Some(check_as_of(index, as_of, shale_types::now_unix_secs())?),
            None => None,
        };
        if as_of.is_none() {
            // The view's splits overlapping the time range (those left out count as pruned),
            // pruned before anything is opened; its delete tasks.
            let candidates = view.splits_of(&request);
            let pruned_by_time = view.splits.len() - candidates.len();
            let (splits, pruned) = prune(candidates, &request, &doc_mapper, self.key_pruning());
            let delete_tasks = pending(&view.delete_tasks, &splits, None);
            return self
                .execute(
                    index,
                    &request,
                    &sort_by,
                    aggs,
                    finalize_aggs,
                    splits,
                    delete_tasks,
                    pruned + pruned_by_time,
                    started,
                )
                .await;
        }
        // Time travel lists (only the splits overlapping the time range) the splits
        // published then, replaced since or not, and prunes them before opening anything.
        let mut query = ListSplitsQuery::for_index(index.index_uid.clone())
            .with_states(&[SplitState::Published]);
        query.visible_at = as_of;
        query.time_range_start = request.start_timestamp;
        query.time_range_end = request.end_timestamp;
        let time_filtered = query.time_range_start.is_some() || query.time_range_end.is_some();
        // Splits the metastore leaves out by time range count as pruned too: the count of
        // all of them is read at the same time as the listing.
        let count_all = async {
            if !time_filtered {
                return Ok(None);
            }
            let mut all = ListSplitsQuery::for_index(index.index_uid.clone())
                .with_states(&[SplitState::Published]);
            all.visible_at = as_of;
            self.metastore.count_splits(all).await.map(Some)
        };
        let (published, total) = tokio::try_join!(self.metastore.list_splits(query), count_all)
            .map_err(SearchError::Metastore)?;
        let pruned_by_time =
            total.map_or(0, |total| (total as usize).saturating_sub(published.len()));
        let candidates: Vec<SplitMetadata> = published
            .into_iter()
            .map(|s: Split| s.split_metadata)
            .collect();
        let (splits, pruned) = prune(candidates, &request, &doc_mapper, self.key_pruning());
        let delete_tasks = self.pending_delete_tasks(index, &splits, as_of).await?;
        self.execute(
            index,
            &request,
            &sort_by,
            aggs,
            finalize_aggs,
            splits,
            delete_tasks,
            pruned + pruned_by_time,
            started,
        )
        .await
    }

    /// The delete tasks some of `splits` are not clean of (those that existed at `as_of`
    /// for time travel): their documents are left out of the results until a merge purges
    /// them.
    async fn pending_delete_tasks(
        &self,
        index: &IndexMetadata,
        splits: &[SplitMetadata],
        as_of: Option<i64>,
    ) -> Result<Vec<DeleteTask>, SearchError> {
        let Some(min_clean) = splits.iter().map(|s| s.delete_opstamp).min() else {
            return Ok(Vec::new());
        };
        let tasks = self
            .metastore
            .list_delete_tasks(&index.index_uid, min_clean)
            .await
            .map_err(SearchError::Metastore)?;
        Ok(pending(&tasks, splits, as_of))
    }

    /// Turns pruning by sort-key range on or off (it is on by default). Off, a search of a
    /// locality index opens every split of its time range; its results are the same.
    pub fn set_key_pruning(&self, on: bool) {
        self.key_pruning
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    fn key_pruning(&self) -> bool {
        self.key_pruning.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The fields found in the splits of `index_id` that `request` would search (its time
    /// range, tags and key ranges prune them as for a search; its query is validated but
    /// not run): Elasticsearch's `_field_caps`.
    pub async fn list_fields(
        &self,
        index_id: &str,
        request: &SearchRequest,
    ) -> Result<Vec<crate::leaf::SplitField>, SearchError> {
        let (view, doc_mapper, _, _) = self.prepare(index_id, request).await?;
        let candidates = view.splits_of(request);
        let (splits, _) = prune(candidates, request, &doc_mapper, self.key_pruning());
        self.leaf
            .list_fields(&view.index, &splits)
            .await
            .map_err(|err| match err {
                LeafError::InvalidRequest(message) => SearchError::InvalidRequest(message),
                LeafError::Internal(message) => SearchError::Internal(message),
                LeafError::OverBudget(message) => SearchError::OverBudget(message),
            })
    }

    /// Runs `request` on `splits` (listed earlier by the caller, e.g. before a merge replaced
    /// them) instead of the currently published ones; they are pruned as usual.
    pub async fn search_splits(
        &self,
        index_id: &str,
        request: SearchRequest,
        splits: Vec<SplitMetadata>,
    ) -> Result<SearchResponse, SearchError> {
        let started = Instant::now();
        let _permit = self.admit()?;
        let (view, doc_mapper, sort_by, aggs) = self.prepare(index_id, &request).await?;
        let (splits, num_splits_pruned) = prune(splits, &request, &doc_mapper, self.key_pruning());
        let delete_tasks = pending(&view.delete_tasks, &splits, None);
        self.execute(
            &view.index,
            &request,
            &sort_by,
            aggs,
            true,
            splits,
            delete_tasks,
            num_splits_pruned,
            started,
        )
        .await
    }

    /// Places the splits, fans out, retries, merges, fetches the page.
    #[allow(clippy::too_many_arguments)]
    async fn execute(
        &self,
        index: &IndexMetadata,
        request: &SearchRequest,
        sort_by: &SortBy,
        aggs: Option<Aggregations>,
        finalize_aggs: bool,
        splits: Vec<SplitMetadata>,
        delete_tasks: Vec<DeleteTask>,
        num_splits_pruned: usize,
        started: Instant,
    ) -> Result<SearchResponse, SearchError> {
        let nodes = self.nodes();
        let searchers = nodes.searchers();
        if searchers.is_empty() && !splits.is_empty() {
            return Err(SearchError::Unavailable(
                "no live searcher in the cluster".to_string(),
            ));
        }
        let k = request.start_offset.saturating_add(request.max_hits);
        let jobs: Vec<Job> = splits
            .iter()
            .map(|s| Job {
                split_id: s.split_id.clone(),
                cost: s.num_docs.max(1),
            })
            .collect();
        let placements = place(&jobs, &searchers, MAX_PLACEMENT_IMBALANCE);
        // attempt[i]: which node of split i's placement order is tried next.
        let mut attempt = vec![0usize; splits.len()];
        let mut served_by: Vec<Option<usize>> = vec![None; splits.len()];
        let mut failures: BTreeMap<usize, String> = BTreeMap::new();
        let mut pending: Vec<usize> = (0..splits.len()).collect();
        let mut num_hits = 0u64;
        let mut unavailable = false;
        let mut top: Vec<PartialHit> = Vec::new();
        let mut merged_aggs = IntermediateAggregationResults::default();
        // What the leaves' aggregation results and their rendering take, held from the
        // node's budget until the response is built.
        let mut held = self.leaf.results_reservation();
        let mut term_errors = crate::aggs::TermCountErrors::new();
        let by_id: HashMap<&str, usize> = splits
            .iter()
            .enumerate()
            .map(|(i, s)| (s.split_id.as_str(), i))
            .collect();
        while !pending.is_empty() {
            let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for split in pending.drain(..) {
                if let Some(&node) = placements[split].nodes.get(attempt[split]) {
                    groups.entry(node).or_default().push(split);
                }
            }
            let mut calls = FuturesUnordered::new();
            for (node, group) in groups {
                let group_splits: Vec<SplitMetadata> =
                    group.iter().map(|&i| splits[i].clone()).collect();
                let leaf_request = LeafRequest {
                    index: index.clone(),
                    request: request.clone(),
                    delete_tasks: delete_tasks
                        .iter()
                        .filter(|task| group_splits.iter().any(|split| task.may_touch(split)))
                        .cloned()
                        .collect(),
                    splits: group_splits,
                    k,
                };
                let nodes = nodes.clone();
                let node_id = searchers[node].clone();
                calls.push(async move {
                    let result = nodes.leaf_search(&node_id, leaf_request).await;
                    (node, group, result)
                });
            }
            while let Some((node, group, result)) = calls.next().await {
                let retry = |split: usize,
                             message: String,
                             attempt: &mut Vec<usize>,
                             failures: &mut BTreeMap<usize, String>,
                             pending: &mut Vec<usize>| {
                    attempt[split] += 1;
                    failures.insert(split, message);
                    if attempt[split] < placements[split].nodes.len() {
                        pending.push(split);
                    }
                };
                match result {
                    Ok(response) => {
                        let failed: HashSet<&str> = response
                            .failed_splits
                            .iter()
                            .map(|f| f.split_id.as_str())
                            .collect();
                        for &split in &group {
                            if !failed.contains(splits[split].split_id.as_str()) {
                                served_by[split] = Some(node);
                                failures.remove(&split);
                            }
                        }
                        for failure in &response.failed_splits {
                            unavailable |= failure.unavailable;
                            if let Some(&split) = by_id.get(failure.split_id.as_str()) {
                                retry(
                                    split,
                                    format!("on {}: {}", searchers[node], failure.message),
                                    &mut attempt,
                                    &mut failures,
                                    &mut pending,
                                );
                            }
                        }
                        crate::aggs::add_term_count_errors(
                            &mut term_errors,
                            &response.term_count_errors,
                        );
                        if let Some(encoded) = &response.intermediate_aggs {
                            let leaf_aggs = crate::aggs::decode(encoded).map_err(|err| {
                                SearchError::Internal(format!(
                                    "aggregations from {}: {err}",
                                    searchers[node]
                                ))
                            })?;
                            crate::aggs::reserve_results(&mut held, &leaf_aggs, false)
                                .map_err(SearchError::OverBudget)?;
                            merged_aggs.merge_fruits(leaf_aggs).map_err(|err| {
                                SearchError::Internal(format!("merging aggregations: {err}"))
                            })?;
                        }
                        num_hits += response.num_hits;
                        top = merge_hits(std::mem::take(&mut top), response.hits, k, sort_by);
                    }
                    Err(NodeCallError::OverBudget(message)) => {
                        return Err(SearchError::OverBudget(message));
                    }
                    Err(err) => {
                        for &split in &group {
                            retry(
                                split,
                                format!("on {}: {err}", searchers[node]),
                                &mut attempt,
                                &mut failures,
                                &mut pending,
                            );
                        }
                    }
                }
            }
        }
        let errors: Vec<String> = failures
            .iter()
            .map(|(&split, message)| format!("split {}: {message}", splits[split].split_id))
            .collect();
        // Partial failures are reported with the hits of the other splits; when every split
        // failed there is no result to give.
        if !splits.is_empty() && errors.len() == splits.len() {
            let summary = format!(
                "search failed on all {} splits: {}",
                splits.len(),
                errors[0]
            );
            return Err(if unavailable {
                SearchError::Unavailable(summary)
            } else {
                SearchError::Internal(summary)
            });
        }
        let page: Vec<PartialHit> = top
            .into_iter()
            .skip(request.start_offset)
            .take(request.max_hits)
            .collect();
        let hits = self
            .fetch_page(
                &nodes,
                &searchers,
                index,
                &splits,
                &by_id,
                &served_by,
                &placements,
                &page,
            )
            .await?;
        let hit_meta: Vec<HitMeta> = page
            .iter()
            .map(|hit| HitMeta {
                key: hit.key.clone(),
                doc: hit.doc.clone(),
                index_id: index.index_id().to_string(),
            })
            .collect();
        if aggs.is_some() && finalize_aggs {
            // The final results, then their JSON.
            crate::aggs::reserve_results(&mut held, &merged_aggs, true)
                .map_err(SearchError::OverBudget)?;
        }
        let (aggregations, intermediate_aggs) = match aggs {
            Some(aggs) if finalize_aggs => (
                Some(
                    crate::aggs::finalize(aggs, merged_aggs, &term_errors)
                        .map_err(SearchError::InvalidRequest)?,
                ),
                None,
            ),
            Some(_) => (None, Some(merged_aggs)),
            None => (None, None),
        };
        let num_nodes = served_by.iter().flatten().collect::<HashSet<_>>().len();
        SPLITS_SEARCHED.inc_by(splits.len() as u64);
        SPLITS_PRUNED.inc_by(num_splits_pruned as u64);
        Ok(SearchResponse {
            num_hits,
            hits,
            elapsed_time_micros: started.elapsed().as_micros() as u64,
            errors,
            num_splits_searched: splits.len(),
            num_splits_pruned,
            num_nodes,
            aggregations,
            hit_meta,
            intermediate_aggs,
            term_count_errors: term_errors,
        })
    }

    /// Fetches the page's documents from the nodes that searched their splits (falling back
    /// to the other nodes of each split's order), in page order.
    #[allow(clippy::too_many_arguments)]
    async fn fetch_page(
        &self,
        nodes: &Arc<dyn SearchNodes>,
        searchers: &[String],
        index: &IndexMetadata,
        splits: &[SplitMetadata],
        by_id: &HashMap<&str, usize>,
        served_by: &[Option<usize>],
        placements: &[shale_cluster::placement::Placement],
        page: &[PartialHit],
    ) -> Result<Vec<serde_json::Value>, SearchError> {
        let mut docs: Vec<Option<serde_json::Value>> = vec![None; page.len()];
        // For each page position, the nodes to try, best first.
        let orders: Vec<Vec<usize>> = page
            .iter()
            .map(|hit| {
                let split = by_id[hit.doc.split_id.as_str()];
                let mut order: Vec<usize> = served_by[split].into_iter().collect();
                order.extend(
                    placements[split]
                        .nodes
                        .iter()
                        .copied()
                        .filter(|&n| Some(n) != served_by[split]),
                );
                order
            })
            .collect();
        let mut round = 0;
        loop {
            let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for (position, order) in orders.iter().enumerate() {
                if docs[position].is_none() {
                    if let Some(&node) = order.get(round) {
                        groups.entry(node).or_default().push(position);
                    }
                }
            }
            if groups.is_empty() {
                break;
            }
            let mut calls = FuturesUnordered::new();
            for (node, positions) in groups {
                let refs: Vec<DocRef> = positions.iter().map(|&p| page[p].doc.clone()).collect();
                let needed: HashSet<&str> = refs.iter().map(|d| d.split_id.as_str()).collect();
                let request = FetchDocsRequest {
                    index: index.clone(),
                    splits: splits
                        .iter()
                        .filter(|s| needed.contains(s.split_id.as_str()))
                        .cloned()
                        .collect(),
                    docs: refs,
                };
                let nodes = nodes.clone();
                let node_id = searchers[node].clone();
                calls.push(async move {
                    let result = nodes.fetch_docs(&node_id, request).await;
                    (positions, result)
                });
            }
            let mut last_error = None;
            while let Some((positions, result)) = calls.next().await {
                match result {
                    Ok(response) if response.docs.len() == positions.len() => {
                        for (position, doc) in positions.into_iter().zip(response.docs) {
                            docs[position] = Some(doc);
                        }
                    }
                    Ok(_) => {
                        last_error =
                            Some("a node returned the wrong number of documents".to_string())
                    }
                    Err(err) => last_error = Some(err.to_string()),
                }
            }
            round += 1;
            if docs.iter().all(Option::is_some) {
                break;
            }
            if round > searchers.len() {
                return Err(SearchError::Internal(format!(
                    "could not fetch the page's documents: {}",
                    last_error.unwrap_or_default()
                )));
            }
        }
        docs.into_iter()
            .map(|doc| {
                doc.ok_or_else(|| {
                    SearchError::Internal("could not fetch the page's documents".to_string())
                })
            })
            .collect()
    }
}

/// `as_of` if it is inside the index's time-travel window at `now`, else why not.
fn check_as_of(index: &IndexMetadata, as_of: i64, now: i64) -> Result<i64, SearchError> {
    index
        .index_config
        .check_as_of(as_of, now)
        .map_err(SearchError::InvalidRequest)
}

/// Drops the splits that cannot match: time range outside the request's, missing a tag
/// term the query requires, or (locality indexes, with `key_pruning`) a sort-key range the
/// query's keys miss.
/// Returns the kept splits and the number pruned.
fn prune(
    splits: Vec<SplitMetadata>,
    request: &SearchRequest,
    doc_mapper: &DocMapper,
    key_pruning: bool,
) -> (Vec<SplitMetadata>, usize) {
    let total = splits.len();
    let pruner = shale_index::SplitPruner::new(
        doc_mapper,
        &request.query,
        request.start_timestamp,
        request.end_timestamp,
        key_pruning,
    );
    let kept: Vec<SplitMetadata> = splits
        .into_iter()
        .filter(|split| pruner.may_match(split))
        .collect();
    let pruned = total - kept.len();
    (kept, pruned)
}
