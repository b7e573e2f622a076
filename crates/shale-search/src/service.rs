//! The search service: root (list, prune, fan out, merge) and leaf (search one split) in one
//! process. Leaf searches run on the blocking pool, bounded by a semaphore.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};
use prometheus::{register_histogram, register_int_counter, Histogram, IntCounter};
use shale_index::DocMapper;
use shale_metastore::{ListSplitsQuery, Metastore, MetastoreError};
use shale_storage::{IndexStorages, SplitCache, Storage};
use shale_types::{Split, SplitMetadata, SplitState};
use tantivy::collector::{Count, TopDocs};
use tantivy::query::{BooleanQuery, Occur, Query};
use tantivy::{DocAddress, Order, Searcher, TantivyDocument};
use tokio::sync::Semaphore;

use crate::request::{SearchRequest, SearchResponse, SortBy, SortOrder};

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

/// Registers the search metrics (so they are exported before the first search).
pub fn register_metrics() {
    LazyLock::force(&SEARCH_LATENCY);
    LazyLock::force(&SPLITS_SEARCHED);
    LazyLock::force(&SPLITS_PRUNED);
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
    /// The node already runs as many searches as it allows; retry later.
    #[error("too many concurrent searches: this node runs at most {limit} at once (max_concurrent_searches); retry later")]
    TooManyRequests {
        /// The node's limit.
        limit: usize,
    },
}

/// Why one split could not be searched.
#[derive(Debug)]
struct LeafError {
    message: String,
    /// Worth retrying later (the split cache was full).
    unavailable: bool,
}

impl<E: std::fmt::Display> From<E> for LeafError {
    fn from(err: E) -> Self {
        LeafError {
            message: err.to_string(),
            unavailable: false,
        }
    }
}

/// Largest `max_hits` (Quickwit's limit).
pub const MAX_HITS_LIMIT: usize = 10_000;
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

/// Opened splits kept in memory (bounded), keyed by split id.
const MAX_OPEN_SPLITS: usize = 512;

struct OpenSplit {
    searcher: Searcher,
    // Keeps the cache entry pinned while the split is open.
    _cached: Arc<shale_storage::CachedSplit>,
}

/// Splits kept open between searches, by split id.
type OpenSplits = Mutex<HashMap<String, Arc<OpenSplit>>>;

/// The search service of a node.
pub struct SearchService {
    metastore: Arc<dyn Metastore>,
    storages: IndexStorages,
    cache: Arc<SplitCache>,
    doc_mappers: Mutex<HashMap<String, Arc<DocMapper>>>,
    open_splits: Arc<OpenSplits>,
    leaf_permits: Arc<Semaphore>,
    search_permits: Arc<Semaphore>,
    max_concurrent_searches: usize,
}

/// What every split of a request is searched with.
struct Prepared {
    index: shale_metastore::IndexMetadata,
    doc_mapper: Arc<DocMapper>,
    query: Arc<dyn Query>,
    sort_by: SortBy,
}

/// A candidate hit from one split.
struct LeafHit {
    /// Sort key as a comparable i64 (timestamp micros) or f32 score bits.
    key: SortKey,
    split_ord: usize,
    doc: DocAddress,
}

#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
enum SortKey {
    Score(f32),
    Value(Option<i64>),
}

struct LeafResult {
    count: u64,
    hits: Vec<(SortKey, DocAddress)>,
}

impl SearchService {
    /// A search service fetching splits through `cache`, running at most
    /// `max_concurrent_searches` searches (more are refused with
    /// [`SearchError::TooManyRequests`]) and `max_concurrent_leaf_searches` split searches at
    /// once. Splits it keeps open are released when the cache needs room.
    pub fn new(
        metastore: Arc<dyn Metastore>,
        storages: IndexStorages,
        cache: Arc<SplitCache>,
        max_concurrent_leaf_searches: usize,
        max_concurrent_searches: usize,
    ) -> Self {
        let open_splits: Arc<OpenSplits> = Arc::new(Mutex::new(HashMap::new()));
        let weak = Arc::downgrade(&open_splits);
        cache.add_pressure_handler(Arc::new(move || {
            if let Some(open) = weak.upgrade() {
                // Drop the splits no search is using: their cache pins go with them.
                open.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|_, split| Arc::strong_count(split) > 1);
            }
        }));
        let max_concurrent_searches = max_concurrent_searches.max(1);
        SearchService {
            metastore,
            storages,
            cache,
            doc_mappers: Mutex::new(HashMap::new()),
            open_splits,
            leaf_permits: Arc::new(Semaphore::new(max_concurrent_leaf_searches.max(1))),
            search_permits: Arc::new(Semaphore::new(max_concurrent_searches)),
            max_concurrent_searches,
        }
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

    /// The split cache.
    pub fn cache(&self) -> &Arc<SplitCache> {
        &self.cache
    }

    /// Runs `request` on `index_id`.
    pub async fn search(
        &self,
        index_id: &str,
        request: SearchRequest,
    ) -> Result<SearchResponse, SearchError> {
        let started = Instant::now();
        let _permit = self.admit()?;
        let _timer = SEARCH_LATENCY.start_timer();
        let prepared = self.prepare(index_id, &request).await?;
        let (index, doc_mapper) = (&prepared.index, &prepared.doc_mapper);

        // Root: list (only the splits overlapping the time range) and prune before opening
        // anything.
        let mut query = ListSplitsQuery::for_index(index.index_uid.clone())
            .with_states(&[SplitState::Published]);
        query.time_range_start = request.start_timestamp;
        query.time_range_end = request.end_timestamp;
        let time_filtered = query.time_range_start.is_some() || query.time_range_end.is_some();
        let published = self
            .metastore
            .list_splits(query)
            .await
            .map_err(SearchError::Metastore)?;
        // Splits the metastore left out by time range count as pruned too.
        let pruned_by_time = if time_filtered {
            let total = self
                .metastore
                .count_splits(
                    ListSplitsQuery::for_index(index.index_uid.clone())
                        .with_states(&[SplitState::Published]),
                )
                .await
                .map_err(SearchError::Metastore)?;
            (total as usize).saturating_sub(published.len())
        } else {
            0
        };
        let candidates: Vec<SplitMetadata> = published
            .into_iter()
            .map(|s: Split| s.split_metadata)
            .collect();
        let (splits, pruned) = prune(candidates, &request, doc_mapper);
        let num_splits_pruned = pruned + pruned_by_time;
        self.execute(&prepared, &request, splits, num_splits_pruned, started)
            .await
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
        let prepared = self.prepare(index_id, &request).await?;
        let (splits, num_splits_pruned) = prune(splits, &request, &prepared.doc_mapper);
        self.execute(&prepared, &request, splits, num_splits_pruned, started)
            .await
    }

    async fn execute(
        &self,
        prepared: &Prepared,
        request: &SearchRequest,
        splits: Vec<SplitMetadata>,
        num_splits_pruned: usize,
        started: Instant,
    ) -> Result<SearchResponse, SearchError> {
        let Prepared {
            index,
            doc_mapper,
            query,
            sort_by,
        } = prepared;
        let storage = self
            .storages
            .for_index(index.index_id(), index.index_config.index_uri.as_deref())
            .map_err(|err| SearchError::Internal(err.to_string()))?;
        let k = request.start_offset.saturating_add(request.max_hits);
        let mut leaf_futures = FuturesUnordered::new();
        for (ord, split) in splits.iter().enumerate() {
            let query = query.clone();
            let sort_by = sort_by.clone();
            let storage = storage.clone();
            leaf_futures.push(async move {
                let result = self
                    .leaf_search(storage.as_ref(), split, query, sort_by, k)
                    .await;
                (ord, result)
            });
        }
        let mut num_hits = 0u64;
        let mut errors = Vec::new();
        let mut unavailable = false;
        // The best `k` hits so far, sorted; only the splits holding one of them stay open
        // (pinned in the cache) until their documents are fetched.
        let mut top: Vec<LeafHit> = Vec::new();
        let mut searchers: HashMap<usize, Arc<OpenSplit>> = HashMap::new();
        while let Some((ord, result)) = leaf_futures.next().await {
            match result {
                Ok((open, leaf)) => {
                    num_hits += leaf.count;
                    if leaf.hits.is_empty() {
                        continue;
                    }
                    let mut hits: Vec<LeafHit> = leaf
                        .hits
                        .into_iter()
                        .map(|(key, doc)| LeafHit {
                            key,
                            split_ord: ord,
                            doc,
                        })
                        .collect();
                    sort_candidates(&mut hits, sort_by);
                    top = merge_top(std::mem::take(&mut top), hits, k, sort_by);
                    searchers.insert(ord, open);
                    let needed: HashSet<usize> = top.iter().map(|hit| hit.split_ord).collect();
                    searchers.retain(|ord, _| needed.contains(ord));
                }
                Err(err) => {
                    unavailable |= err.unavailable;
                    errors.push(format!("split {}: {}", splits[ord].split_id, err.message));
                }
            }
        }
        drop(leaf_futures);
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
        let page: Vec<LeafHit> = top
            .into_iter()
            .skip(request.start_offset)
            .take(request.max_hits)
            .collect();
        let mapper = doc_mapper.clone();
        let hits = tokio::task::spawn_blocking(move || {
            page.iter()
                .map(|hit| {
                    let searcher = &searchers[&hit.split_ord].searcher;
                    searcher
                        .doc::<TantivyDocument>(hit.doc)
                        .map(|doc| mapper.doc_to_json(&doc))
                        .map_err(|err| err.to_string())
                })
                .collect::<Result<Vec<_>, String>>()
        })
        .await
        .map_err(|err| SearchError::Internal(err.to_string()))?
        .map_err(SearchError::Internal)?;
        SPLITS_SEARCHED.inc_by(splits.len() as u64);
        SPLITS_PRUNED.inc_by(num_splits_pruned as u64);
        Ok(SearchResponse {
            num_hits,
            hits,
            elapsed_time_micros: started.elapsed().as_micros() as u64,
            errors,
            num_splits_searched: splits.len(),
            num_splits_pruned,
        })
    }

    /// Resolves the index, its doc mapper, the query (with the time filter) and the sort.
    async fn prepare(
        &self,
        index_id: &str,
        request: &SearchRequest,
    ) -> Result<Prepared, SearchError> {
        validate_page(request)?;
        let index = match self.metastore.index_metadata(index_id).await {
            Ok(index) => index,
            Err(MetastoreError::NotFound { .. }) => {
                return Err(SearchError::IndexNotFound(index_id.to_string()))
            }
            Err(err) => return Err(SearchError::Metastore(err)),
        };
        let doc_mapper = self.doc_mapper(&index)?;
        let sort_by = match &request.sort_by {
            Some(s) => SortBy::parse(s).map_err(SearchError::InvalidRequest)?,
            None => match doc_mapper.timestamp_field_name() {
                Some(ts) => SortBy::Field {
                    field: ts.to_string(),
                    order: SortOrder::Desc,
                },
                None => SortBy::Score,
            },
        };
        if let SortBy::Field { field, .. } = &sort_by {
            if doc_mapper.timestamp_field_name() != Some(field.as_str()) {
                return Err(SearchError::InvalidRequest(format!(
                    "cannot sort by `{field}`: only the timestamp field or `_score` can be sorted on"
                )));
            }
        }
        let user_query = doc_mapper
            .parse_query(&request.query, request.search_field.as_deref())
            .map_err(|err| SearchError::InvalidRequest(err.to_string()))?;
        let query: Box<dyn Query> =
            match doc_mapper.time_range_query(request.start_timestamp, request.end_timestamp) {
                Some(range) => Box::new(BooleanQuery::new(vec![
                    (Occur::Must, user_query),
                    (Occur::Must, range),
                ])),
                None => user_query,
            };
        Ok(Prepared {
            index,
            doc_mapper,
            query: Arc::from(query),
            sort_by,
        })
    }

    fn doc_mapper(
        &self,
        index: &shale_metastore::IndexMetadata,
    ) -> Result<Arc<DocMapper>, SearchError> {
        let key = format!(
            "{}/{}",
            index.index_uid, index.index_config.doc_mapping.doc_mapping_uid
        );
        let mut mappers = self.doc_mappers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mapper) = mappers.get(&key) {
            return Ok(mapper.clone());
        }
        let mapper = Arc::new(
            DocMapper::new(
                &index.index_config.doc_mapping,
                &index.index_config.search_settings,
            )
            .map_err(|err| SearchError::Internal(err.to_string()))?,
        );
        mappers.insert(key, mapper.clone());
        Ok(mapper)
    }

    /// Opens a split (through the cache) or returns it from the open-split table.
    async fn open_split(
        &self,
        storage: &dyn Storage,
        split: &SplitMetadata,
    ) -> Result<Arc<OpenSplit>, LeafError> {
        if let Some(open) = self
            .open_splits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&split.split_id)
        {
            return Ok(open.clone());
        }
        let cached = self
            .cache
            .get_split(storage, &split.split_id, split.size_bytes)
            .await
            .map_err(|err| LeafError {
                unavailable: matches!(err, shale_storage::StorageError::CacheFull { .. }),
                message: err.to_string(),
            })?;
        let path = cached.split_file();
        let searcher = tokio::task::spawn_blocking(move || -> Result<Searcher, String> {
            let index = shale_index::open_split(&path).map_err(|err| err.to_string())?;
            let reader = index.reader().map_err(|err| err.to_string())?;
            Ok(reader.searcher())
        })
        .await
        .map_err(LeafError::from)?
        .map_err(LeafError::from)?;
        let open = Arc::new(OpenSplit {
            searcher,
            _cached: cached,
        });
        let mut table = self.open_splits.lock().unwrap_or_else(|p| p.into_inner());
        if table.len() >= MAX_OPEN_SPLITS {
            // Drop an arbitrary unused split; it is re-opened from the cache when needed.
            if let Some(victim) = table
                .iter()
                .find(|(_, s)| Arc::strong_count(s) == 1)
                .map(|(k, _)| k.clone())
            {
                table.remove(&victim);
            }
        }
        table.insert(split.split_id.clone(), open.clone());
        Ok(open)
    }

    /// Number of splits kept open between searches.
    pub fn num_open_splits(&self) -> usize {
        self.open_splits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Forgets an open split (its object was deleted).
    pub fn forget_split(&self, split_id: &str) {
        self.open_splits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(split_id);
    }

    async fn leaf_search(
        &self,
        storage: &dyn Storage,
        split: &SplitMetadata,
        query: Arc<dyn Query>,
        sort_by: SortBy,
        k: usize,
    ) -> Result<(Arc<OpenSplit>, LeafResult), LeafError> {
        // The permit bounds downloads as well as searches.
        let _permit = self
            .leaf_permits
            .clone()
            .acquire_owned()
            .await
            .map_err(LeafError::from)?;
        let open = self.open_split(storage, split).await?;
        let open_for_task = open.clone();
        let leaf = tokio::task::spawn_blocking(move || {
            run_leaf(&open_for_task.searcher, query.as_ref(), &sort_by, k)
        })
        .await
        .map_err(LeafError::from)?
        .map_err(LeafError::from)?;
        Ok((open, leaf))
    }
}

/// Drops the splits that cannot match: time range outside the request's, or missing a tag
/// term the query requires. Returns the kept splits and the number pruned.
fn prune(
    splits: Vec<SplitMetadata>,
    request: &SearchRequest,
    doc_mapper: &DocMapper,
) -> (Vec<SplitMetadata>, usize) {
    let total = splits.len();
    let required_tags = doc_mapper
        .required_tag_terms(&request.query)
        .unwrap_or_default();
    let kept: Vec<SplitMetadata> = splits
        .into_iter()
        .filter(|split| {
            split.time_range.is_none_or(|range| {
                range.intersects(request.start_timestamp, request.end_timestamp)
            })
        })
        .filter(|split| shale_index::split_may_match_tags(&split.tags, &required_tags))
        .collect();
    let pruned = total - kept.len();
    (kept, pruned)
}

fn run_leaf(
    searcher: &Searcher,
    query: &dyn Query,
    sort_by: &SortBy,
    k: usize,
) -> Result<LeafResult, String> {
    let err = |e: tantivy::TantivyError| e.to_string();
    if k == 0 {
        let count = searcher.search(query, &Count).map_err(err)?;
        return Ok(LeafResult {
            count: count as u64,
            hits: Vec::new(),
        });
    }
    match sort_by {
        SortBy::Score => {
            let (count, top) = searcher
                .search(query, &(Count, TopDocs::with_limit(k).order_by_score()))
                .map_err(err)?;
            Ok(LeafResult {
                count: count as u64,
                hits: top
                    .into_iter()
                    .map(|(score, doc)| (SortKey::Score(score), doc))
                    .collect(),
            })
        }
        SortBy::Field { field, order } => {
            let order = match order {
                SortOrder::Asc => Order::Asc,
                SortOrder::Desc => Order::Desc,
            };
            let collector =
                TopDocs::with_limit(k).order_by_fast_field::<tantivy::DateTime>(field, order);
            let (count, top) = searcher.search(query, &(Count, collector)).map_err(err)?;
            Ok(LeafResult {
                count: count as u64,
                hits: top
                    .into_iter()
                    .map(|(value, doc)| {
                        (
                            SortKey::Value(value.map(|v| v.into_timestamp_micros())),
                            doc,
                        )
                    })
                    .collect(),
            })
        }
    }
}

/// Merges two lists sorted by [`sort_candidates`]' order, keeping the first `k`.
fn merge_top(a: Vec<LeafHit>, b: Vec<LeafHit>, k: usize, sort_by: &SortBy) -> Vec<LeafHit> {
    let mut merged = Vec::with_capacity(k.min(a.len() + b.len()));
    let mut a = a.into_iter().peekable();
    let mut b = b.into_iter().peekable();
    while merged.len() < k {
        let take_a = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => compare_hits(x, y, sort_by) != std::cmp::Ordering::Greater,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_a { a.next() } else { b.next() };
        merged.extend(next);
    }
    merged
}

/// Orders candidates from all splits: best first; ties broken by split then doc, so pages
/// are stable.
fn sort_candidates(candidates: &mut [LeafHit], sort_by: &SortBy) {
    candidates.sort_by(|a, b| compare_hits(a, b, sort_by));
}

/// The order of [`sort_candidates`]: best first, then by split, segment and doc.
fn compare_hits(a: &LeafHit, b: &LeafHit, sort_by: &SortBy) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let primary = match (a.key, b.key) {
        (SortKey::Score(x), SortKey::Score(y)) => y.partial_cmp(&x).unwrap_or(Ordering::Equal),
        (SortKey::Value(x), SortKey::Value(y)) => {
            let desc = matches!(
                sort_by,
                SortBy::Field {
                    order: SortOrder::Desc,
                    ..
                }
            );
            match (x, y) {
                (Some(x), Some(y)) => {
                    if desc {
                        y.cmp(&x)
                    } else {
                        x.cmp(&y)
                    }
                }
                // Documents without a value come last either way.
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            }
        }
        _ => Ordering::Equal,
    };
    primary.then_with(|| {
        (a.split_ord, a.doc.segment_ord, a.doc.doc_id).cmp(&(
            b.split_ord,
            b.doc.segment_ord,
            b.doc.doc_id,
        ))
    })
}
