//! The leaf side of search: what one node does for the root of a search. It searches the
//! splits it is given — each fetched through the local split cache, or, on remote storage
//! with a range cache, opened from its hot cache and read by byte ranges ([`crate::remote`]);
//! kept open between searches (closed when the cache needs room) — and returns the count and
//! its best `k` partial hits (sort key and document address, no document); then it fetches
//! the documents of the page the root picked. A split that fails is reported, never dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};
use shale_index::{DocMapper, MapperInputs};
use shale_metastore::IndexMetadata;
use shale_storage::{IndexStorages, RangeCache, SplitCache, Storage, StorageRef};
use shale_types::time::micros_of_nanos;
use shale_types::{DeleteTask, SplitMetadata};
use tantivy::aggregation::agg_req::Aggregations;
use tantivy::aggregation::intermediate_agg_result::IntermediateAggregationResults;
use tantivy::aggregation::DistributedAggregationCollector;
use tantivy::collector::{
    Collector, Count, SegmentCollector, SegmentSortKeyComputer, SortKeyComputer, TopDocs,
};
use tantivy::query::{BooleanQuery, Occur, Query, TermQuery};
use tantivy::{DocAddress, Order, Searcher, TantivyDocument};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::request::{SearchRequest, SortBy, SortField, SortOrder};

/// One sort value of a hit: a score, a fast-field value (datetimes in microseconds), or
/// nothing (the document has no value: it sorts last in either direction).
#[derive(Clone, Debug, PartialEq, PartialOrd, Serialize, Deserialize)]
pub enum SortValue {
    /// No value.
    Null,
    /// Unsigned integers.
    U64(u64),
    /// Booleans (they order as 0 and 1 among numbers).
    Bool(bool),
    /// Signed integers and datetimes (microseconds).
    I64(i64),
    /// Floats and scores.
    F64(f64),
    /// Text.
    Str(String),
    /// Bytes.
    Bytes(Vec<u8>),
}

impl SortValue {
    fn from_owned(value: tantivy::schema::OwnedValue) -> SortValue {
        use tantivy::schema::OwnedValue as V;
        match value {
            V::U64(v) => SortValue::U64(v),
            V::I64(v) => SortValue::I64(v),
            V::F64(v) => SortValue::F64(v),
            V::Bool(v) => SortValue::Bool(v),
            V::Date(v) => SortValue::I64(micros_of_nanos(v.into_timestamp_nanos())),
            V::Str(v) => SortValue::Str(v),
            V::Bytes(v) => SortValue::Bytes(v),
            _ => SortValue::Null,
        }
    }

    /// The order of two numbers of any numeric variants, exact for integers; `None` unless
    /// both are numbers.
    fn numeric_cmp(&self, other: &SortValue) -> Option<std::cmp::Ordering> {
        let int = |v: &SortValue| match v {
            SortValue::U64(v) => Some(i128::from(*v)),
            SortValue::I64(v) => Some(i128::from(*v)),
            SortValue::Bool(v) => Some(i128::from(*v)),
            _ => None,
        };
        let float = |v: &SortValue| match v {
            SortValue::U64(v) => Some(*v as f64),
            SortValue::I64(v) => Some(*v as f64),
            SortValue::Bool(v) => Some(f64::from(u8::from(*v))),
            SortValue::F64(v) => Some(*v),
            _ => None,
        };
        match (int(self), int(other)) {
            (Some(a), Some(b)) => Some(a.cmp(&b)),
            _ => float(self)?.partial_cmp(&float(other)?),
        }
    }

    /// Order of two values of one criterion, best first for `order`; `Null` always last.
    fn compare(&self, other: &SortValue, order: SortOrder) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        match (self, other) {
            (SortValue::Null, SortValue::Null) => Ordering::Equal,
            (SortValue::Null, _) => Ordering::Greater,
            (_, SortValue::Null) => Ordering::Less,
            (a, b) => {
                // Numbers compare by value whatever their column type (a json field may hold
                // integers in one split and floats in another).
                let natural = a
                    .numeric_cmp(b)
                    .or_else(|| a.partial_cmp(b))
                    .unwrap_or(Ordering::Equal);
                match order {
                    SortOrder::Asc => natural,
                    SortOrder::Desc => natural.reverse(),
                }
            }
        }
    }
}

/// The sort values of a hit, one per criterion of the request's [`SortBy`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SortKey(pub Vec<SortValue>);

/// A hit without its document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartialHit {
    /// Its sort value.
    pub key: SortKey,
    /// Where the document is.
    pub doc: DocRef,
}

/// The address of a document in a split (stable: every node that opens the split finds it
/// there).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DocRef {
    /// The split.
    pub split_id: String,
    /// The Tantivy segment.
    pub segment_ord: u32,
    /// The document in the segment.
    pub doc_id: u32,
}

/// A leaf search request: some splits of an index, the user's request, how many hits to
/// return.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LeafRequest {
    /// The index (config included, so the leaf needs no metastore read).
    pub index: IndexMetadata,
    /// The user's request (query, time range, sort).
    pub request: SearchRequest,
    /// The splits to search.
    pub splits: Vec<SplitMetadata>,
    /// Hits to return (the root's `start_offset + max_hits`).
    pub k: usize,
    /// The delete tasks some of the splits are not clean of: the documents they delete are
    /// not hits.
    #[serde(default)]
    pub delete_tasks: Vec<DeleteTask>,
}

/// A split the leaf could not search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SplitFailure {
    /// The split.
    pub split_id: String,
    /// Why.
    pub message: String,
    /// The split cache was full or the object store did not answer (another node may do
    /// better, or later): a search failing on every split for this answers 503.
    pub unavailable: bool,
}

/// What a leaf found.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LeafResponse {
    /// Matching documents in the splits searched.
    pub num_hits: u64,
    /// The best `k` of them, best first.
    pub hits: Vec<PartialHit>,
    /// The splits that could not be searched (their hits are not counted).
    pub failed_splits: Vec<SplitFailure>,
    /// The intermediate aggregation results of the splits searched (see
    /// [`crate::aggs::encode`]), when the request has aggregations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediate_aggs: Option<String>,
    /// Elasticsearch's count error bounds of the splits searched (see
    /// [`crate::aggs::term_count_errors`]), summed.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub term_count_errors: crate::aggs::TermCountErrors,
}

/// Documents to fetch for the page.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FetchDocsRequest {
    /// The index.
    pub index: IndexMetadata,
    /// The splits the documents are in.
    pub splits: Vec<SplitMetadata>,
    /// The documents, in page order.
    pub docs: Vec<DocRef>,
}

/// The fetched documents, as JSON, in request order.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FetchDocsResponse {
    /// The documents.
    pub docs: Vec<serde_json::Value>,
}

/// Errors of a leaf request as a whole (per-split errors are in [`LeafResponse`]).
#[derive(Debug, thiserror::Error)]
pub enum LeafError {
    /// The request cannot be run (query, sort, mapping).
    #[error("{0}")]
    InvalidRequest(String),
    /// Something failed.
    #[error("{0}")]
    Internal(String),
    /// The results the request would hold pass the node's query memory budget.
    #[error("{0}")]
    OverBudget(String),
}

/// What every split of a request is searched with.
pub(crate) struct Prepared {
    pub(crate) doc_mapper: Arc<DocMapper>,
    pub(crate) query: Arc<dyn Query>,
    pub(crate) sort_by: SortBy,
    pub(crate) aggs: Option<Aggregations>,
}

/// How many more splits read by ranges than local splits are searched at once (their cold
/// searches wait on the object store, not the CPU).
const REMOTE_PERMITS_FACTOR: usize = 4;

/// Opened splits kept in memory (bounded), keyed by split id.
const MAX_OPEN_SPLITS: usize = 512;

struct OpenSplit {
    searcher: Searcher,
    /// Read by byte ranges from remote storage (else mapped: from the split cache, or in
    /// place for a local storage).
    by_ranges: bool,
    /// What searches of a split read by ranges have warmed.
    warmed: crate::remote::Warmed,
    // Keeps the cache entry pinned while the split is open (none when read by ranges).
    _cached: Option<Arc<shale_storage::CachedSplit>>,
}

/// Splits kept open between searches, by split id.
type OpenSplits = Mutex<HashMap<String, Arc<OpenSplit>>>;

/// The leaf searcher of a node.
pub struct Leaf {
    storages: IndexStorages,
    cache: Arc<SplitCache>,
    doc_mappers: Mutex<HashMap<String, Arc<DocMapper>>>,
    /// Per doc mapping, a one-document in-memory index on which aggregations are tried
    /// before a search runs, so that a request Tantivy refuses is a 400, not split failures.
    agg_validation: Mutex<HashMap<String, Searcher>>,
    open_splits: Arc<OpenSplits>,
    permits: Arc<Semaphore>,
    /// Split searches at once (`permits`' size).
    max_concurrent: usize,
    /// Bounds the searches of splits read by ranges ([`REMOTE_PERMITS_FACTOR`] × `permits`).
    remote_permits: Arc<Semaphore>,
    /// The fields found in each split (immutable, so cached by split id).
    split_fields: Mutex<HashMap<String, Arc<Vec<SplitField>>>>,
    /// When set, splits on remote storage are read by ranges through it, not downloaded.
    ranges: Mutex<Option<Arc<RangeCache>>>,
    /// What each split answered to each request shape.
    partial_results: Mutex<Arc<crate::partial_cache::PartialResultCache>>,
    /// With a memory budget: the limits every split aggregation on this node shares (one
    /// counter: concurrent aggregations together stay under it), and the budget's share it
    /// holds for them.
    agg_limits: Mutex<
        Option<(
            tantivy::aggregation::AggregationLimitsGuard,
            shale_types::memory::Reservation,
        )>,
    >,
    /// With a memory budget: what each request's aggregation results are reserved from.
    budget: Mutex<Option<shale_types::memory::MemoryBudget>>,
}

/// A field found in a split — a schema field or a path inside a json field (undeclared fields
/// of a dynamic index included, without the `_dynamic.` prefix) — with one of its value types.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SplitField {
    /// The name queries use.
    pub name: String,
    /// The type of its values (a json path may have several, one entry each).
    pub typ: tantivy::schema::Type,
    /// Has an inverted index (searchable).
    pub indexed: bool,
    /// Has a column (aggregatable, sortable).
    pub fast: bool,
}

/// Most splits whose field lists are kept.
const MAX_SPLIT_FIELD_LISTS: usize = 8192;

impl Leaf {
    /// A leaf fetching splits through `cache`, searching at most `max_concurrent` splits (and
    /// downloading at most as many) at once.
    pub fn new(storages: IndexStorages, cache: Arc<SplitCache>, max_concurrent: usize) -> Self {
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
        Leaf {
            storages,
            cache,
            doc_mappers: Mutex::new(HashMap::new()),
            agg_validation: Mutex::new(HashMap::new()),
            open_splits,
            permits: Arc::new(Semaphore::new(max_concurrent.max(1))),
            max_concurrent: max_concurrent.max(1),
            remote_permits: Arc::new(Semaphore::new(
                max_concurrent.max(1) * REMOTE_PERMITS_FACTOR,
            )),
            split_fields: Mutex::new(HashMap::new()),
            ranges: Mutex::new(None),
            partial_results: Mutex::new(Arc::new(crate::partial_cache::PartialResultCache::new(0))),
            agg_limits: Mutex::new(None),
            budget: Mutex::new(None),
        }
    }

    /// Makes split aggregations share half of `budget` (held from it for the node's life):
    /// Tantivy's aggregation limits count every aggregation running on this node against one
    /// counter, so concurrent requests share the memory instead of each having its own.
    pub fn set_memory_budget(&self, budget: &shale_types::memory::MemoryBudget) {
        *self.budget.lock().unwrap_or_else(|p| p.into_inner()) = Some(budget.clone());
        let share = budget.total() / 2;
        let limits = crate::aggs::limits_of(share);
        let held = match budget.try_reserve(share) {
            Ok(held) => held,
            // Nothing else holds the budget when the node starts: a second call finds its
            // own share held and keeps it.
            Err(_) => return,
        };
        *self.agg_limits.lock().unwrap_or_else(|p| p.into_inner()) = Some((limits, held));
    }

    /// A reservation for one request's results (none without a budget).
    pub(crate) fn results_reservation(&self) -> Option<shale_types::memory::Reservation> {
        self.budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|budget| budget.try_reserve(0).ok())
    }

    /// The context split aggregations are built with: the node-wide shared limits when there
    /// is a budget.
    fn agg_context(&self) -> tantivy::aggregation::AggContextParams {
        match &*self.agg_limits.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((limits, _)) => crate::aggs::context_with(limits.clone()),
            None => crate::aggs::context(),
        }
    }

    /// Where the indexes' splits live.
    pub fn storages(&self) -> &IndexStorages {
        &self.storages
    }

    /// Keeps what each split answered to each request shape, in at most `max_bytes` (0: off;
    /// the default). Replaces the cache, and drops what it held.
    pub fn set_partial_result_cache(&self, max_bytes: u64) {
        *self
            .partial_results
            .lock()
            .unwrap_or_else(|p| p.into_inner()) =
            Arc::new(crate::partial_cache::PartialResultCache::new(max_bytes));
    }

    /// The partial-result cache.
    pub fn partial_results(&self) -> Arc<crate::partial_cache::PartialResultCache> {
        self.partial_results
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads splits on remote storage by byte ranges through `ranges` (`None`: downloads them
    /// whole into the split cache). Local splits are always mapped whole.
    pub fn set_range_cache(&self, ranges: Option<Arc<RangeCache>>) {
        *self.ranges.lock().unwrap_or_else(|p| p.into_inner()) = ranges;
    }

    /// The range cache, if remote splits are read by ranges.
    pub fn range_cache(&self) -> Option<Arc<RangeCache>> {
        self.ranges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The range cache splits of `storage` are read through, if they are read by ranges
    /// (remote storage and a range cache set).
    fn ranges_for(&self, storage: &StorageRef) -> Option<Arc<RangeCache>> {
        self.range_cache().filter(|_| !storage.is_local())
    }

    /// The split cache.
    pub fn cache(&self) -> &Arc<SplitCache> {
        &self.cache
    }

    /// The doc mapper of `index`, cached per index and [`MapperInputs`]: everything the mapper
    /// is built from (an index update may change some, such as the default search fields,
    /// without changing the doc mapping's uid).
    pub fn doc_mapper(&self, index: &IndexMetadata) -> Result<Arc<DocMapper>, LeafError> {
        let inputs = MapperInputs::of(&index.index_config);
        let key = format!("{}/{}", index.index_uid, inputs.key());
        let mut mappers = self.doc_mappers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mapper) = mappers.get(&key) {
            return Ok(mapper.clone());
        }
        let mapper = Arc::new(
            DocMapper::from_inputs(inputs).map_err(|err| LeafError::Internal(err.to_string()))?,
        );
        mappers.insert(key, mapper.clone());
        Ok(mapper)
    }

    /// Runs `aggs` on an empty document of `index`'s schema and renders the result: any
    /// error Tantivy raises for the request itself (bad interval, bad ranges, percentiles out
    /// of bounds, too many buckets) shows here, before a split is searched.
    pub(crate) fn validate_aggs(
        &self,
        index: &IndexMetadata,
        doc_mapper: &DocMapper,
        aggs: &Aggregations,
    ) -> Result<(), LeafError> {
        // The schema is the mapper's: keyed as the mapper is.
        let key = format!(
            "{}/{}",
            index.index_uid,
            MapperInputs::of(&index.index_config).key()
        );
        let searcher = {
            let mut table = self
                .agg_validation
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match table.get(&key) {
                Some(searcher) => searcher.clone(),
                None => {
                    let searcher = empty_searcher(doc_mapper)
                        .map_err(|err| LeafError::Internal(err.to_string()))?;
                    table.insert(key, searcher.clone());
                    searcher
                }
            }
        };
        let collector =
            DistributedAggregationCollector::from_aggs(aggs.clone(), crate::aggs::context());
        let results = searcher
            .search(&tantivy::query::AllQuery, &collector)
            .map_err(|err| {
                LeafError::InvalidRequest(format!("invalid aggregation request: {err}"))
            })?;
        crate::aggs::finalize(aggs.clone(), results, &Default::default())
            .map_err(LeafError::InvalidRequest)?;
        Ok(())
    }

    /// The doc mapper, query (with the time filter) and sort of `request` on `index`.
    pub(crate) fn prepare(
        &self,
        index: &IndexMetadata,
        request: &SearchRequest,
    ) -> Result<Prepared, LeafError> {
        let doc_mapper = self.doc_mapper(index)?;
        let sort_by = match &request.sort_by {
            Some(s) => SortBy::parse(s).map_err(LeafError::InvalidRequest)?,
            None => match doc_mapper.timestamp_field_name() {
                Some(ts) => SortBy::field(ts, SortOrder::Desc),
                None => SortBy::score(),
            },
        };
        let mut sort_by = sort_by;
        // A trailing ascending `_doc` is the tie-break every search already has, and
        // nothing after `_doc` can matter (addresses are unique).
        if sort_by.fields.len() > 1
            && sort_by.fields.last() == Some(&SortField::Doc(SortOrder::Asc))
        {
            sort_by.fields.pop();
        }
        if let Some(pos) = sort_by
            .fields
            .iter()
            .position(|c| matches!(c, SortField::Doc(_)))
        {
            sort_by.fields.truncate(pos + 1);
        }
        for criterion in &mut sort_by.fields {
            let SortField::Field { field, .. } = criterion else {
                continue;
            };
            // A declared field, a path in a json field, or an undeclared field of a dynamic
            // index (in `_dynamic`).
            let schema = doc_mapper.schema();
            let mut name = field.clone();
            if schema.find_field(&name).is_none() && doc_mapper.dynamic_field().is_some() {
                name = format!("{}.{field}", shale_index::DYNAMIC_FIELD_NAME);
            }
            let entry = schema
                .find_field(&name)
                .map(|(f, _)| schema.get_field_entry(f))
                .ok_or_else(|| {
                    LeafError::InvalidRequest(format!(
                        "cannot sort by `{field}`: no such field in the doc mapping"
                    ))
                })?;
            if !entry.is_fast() {
                return Err(LeafError::InvalidRequest(format!(
                    "cannot sort by `{field}`: it is not a fast field (set `fast: true`)"
                )));
            }
            *field = name;
        }
        let user_query = doc_mapper
            .parse_query(&request.query, request.search_field.as_deref())
            .map_err(|err| LeafError::InvalidRequest(err.to_string()))?;
        let query: Box<dyn Query> =
            match doc_mapper.time_range_query(request.start_timestamp, request.end_timestamp) {
                Some(range) => Box::new(BooleanQuery::new(vec![
                    (Occur::Must, user_query),
                    (Occur::Must, range),
                ])),
                None => user_query,
            };
        let aggs = match &request.aggs {
            Some(aggs) => Some(
                crate::aggs::parse_aggs(&doc_mapper, aggs).map_err(LeafError::InvalidRequest)?,
            ),
            None => None,
        };
        Ok(Prepared {
            doc_mapper,
            query: Arc::from(query),
            sort_by,
            aggs,
        })
    }

    /// Searches the request's splits concurrently; returns the count and the best `k` hits.
    pub async fn search(&self, request: LeafRequest) -> Result<LeafResponse, LeafError> {
        let prepared = self.prepare(&request.index, &request.request)?;
        let index = &request.index;
        let storage = self
            .storages
            .for_index(index.index_id(), index.index_config.index_uri.as_deref())
            .map_err(|err| LeafError::Internal(err.to_string()))?;
        let k = request.k;
        let error_plan = prepared
            .aggs
            .as_ref()
            .and_then(crate::aggs::term_error_plan)
            .map(Arc::new);
        let partial_results = self.partial_results();
        // What the request's aggregation results take, held from the node's budget until
        // the response is built.
        let mut held = self.results_reservation();
        // Top k by the timestamp field, without aggregations: the splits are visited in the
        // order of their time ranges (newest first for a descending sort) and a split whose
        // range cannot hold a hit better than the current k-th is only counted — from its
        // metadata when the query matches everything in it, else without collecting hits.
        let time_order = time_ordered(&prepared, &request);
        let mut order: Vec<&SplitMetadata> = request.splits.iter().collect();
        if let Some(sort_order) = time_order {
            let range = |split: &SplitMetadata| {
                split
                    .time_range
                    .map_or((i64::MIN, i64::MAX), |r| (r.start, r.end))
            };
            order.sort_by(|a, b| match sort_order {
                SortOrder::Desc => range(b).1.cmp(&range(a).1),
                SortOrder::Asc => range(a).0.cmp(&range(b).0),
            });
        }
        // Without hits to find nor aggregations, every split is only counted.
        let count_all = k == 0 && prepared.aggs.is_none();
        let match_all = matches!(request.request.query.trim(), "" | "*");
        // Counting a split without its hits is cheap for a lone term (its document frequency)
        // or for everything (the split's metadata); any other query counts by visiting every
        // match, as its search does, so holding splits back only to count them later saves
        // no work and loses the cores' parallelism (measured: a boolean query 1.6-2x slower).
        let cheap_count = match_all
            || (request.delete_tasks.is_empty()
                && prepared.query.downcast_ref::<TermQuery>().is_some());
        // Splits in flight: local splits one per core when counting is cheap (searching them
        // is CPU work: more at once only delays the newest, whose hits decide what the others
        // need), remote ones as many as may wait on the object store at once; a split is
        // launched, and decided, only once one before it has finished.
        let window = match (time_order, self.ranges_for(&storage)) {
            (None, _) => usize::MAX,
            (Some(_), Some(_)) => self.max_concurrent * REMOTE_PERMITS_FACTOR,
            (Some(_), None) if cheap_count => std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .min(self.max_concurrent),
            (Some(_), None) => usize::MAX,
        };
        let request_key = crate::partial_cache::request_key(&request.index, &request.request);
        let timestamp_field = prepared
            .doc_mapper
            .timestamp_field_name()
            .map(str::to_string);
        let mut pending = order.into_iter();
        let mut futures = FuturesUnordered::new();
        let mut response = LeafResponse::default();
        let mut merged_aggs: Option<IntermediateAggregationResults> = None;
        crate::service::LEAF_SPLITS.inc_by(request.splits.len() as u64);
        loop {
            // Launch splits while the window has room; each decides at launch whether it can
            // still enter the top k.
            while futures.len() < window {
                let Some(split) = pending.next() else { break };
                let tasks: Vec<DeleteTask> = request
                    .delete_tasks
                    .iter()
                    .filter(|task| task.may_touch(split))
                    .cloned()
                    .collect();
                let query: Arc<dyn Query> = if tasks.is_empty() {
                    prepared.query.clone()
                } else {
                    match prepared
                        .doc_mapper
                        .without_deleted(prepared.query.box_clone(), &tasks)
                    {
                        Ok(query) => Arc::from(query),
                        Err(err) => {
                            return Err(LeafError::Internal(format!(
                                "a delete task of index `{}` no longer parses: {err}",
                                request.index.index_id()
                            )))
                        }
                    }
                };
                let count_only = count_all
                    || time_order.is_some_and(|sort_order| {
                        cannot_improve(split, sort_order, &response.hits, k)
                    });
                let cache_key =
                    crate::partial_cache::key(&request_key, &request.request, split, &tasks);
                // A split written under an older doc mapping has its own field ids: its query
                // is built against its schema once it is open.
                let older = (split.doc_mapping_uid
                    != request.index.index_config.doc_mapping.doc_mapping_uid)
                    .then(|| OlderMapping {
                        current: prepared.doc_mapper.clone(),
                        request: request.request.clone(),
                        tasks: tasks.clone(),
                    });
                let partial_results = partial_results.clone();
                let storage = storage.clone();
                let timestamp_field = timestamp_field.clone();
                if count_only {
                    let whole = match_all
                        && tasks.is_empty()
                        && older.is_none()
                        && !cuts(&request.request, split);
                    futures.push(Box::pin(async move {
                        if whole {
                            crate::service::ONLY_COUNTED
                                .with_label_values(&["metadata"])
                                .inc();
                            return (split, Ok(LeafSplitResult::count(split.num_docs)));
                        }
                        crate::service::ONLY_COUNTED
                            .with_label_values(&["query"])
                            .inc();
                        if let Some(cached) = partial_results.get(&cache_key, 0) {
                            return (split, Ok(cached));
                        }
                        let result = self
                            .count_split(&storage, split, query, older, timestamp_field)
                            .await;
                        if let Ok(result) = &result {
                            partial_results.put(cache_key, 0, result);
                        }
                        (split, result)
                    })
                        as std::pin::Pin<
                            Box<dyn std::future::Future<Output = _> + Send + '_>,
                        >);
                    continue;
                }
                let sort_by = prepared.sort_by.clone();
                let after = request.request.search_after.clone();
                let aggs = prepared.aggs.clone();
                let error_plan = error_plan.clone();
                futures.push(Box::pin(async move {
                    if let Some(cached) = partial_results.get(&cache_key, k) {
                        return (split, Ok(cached));
                    }
                    let result = self
                        .search_split(
                            &storage,
                            split,
                            query,
                            older,
                            sort_by,
                            after,
                            timestamp_field,
                            k,
                            aggs,
                            error_plan,
                        )
                        .await;
                    if let Ok(result) = &result {
                        partial_results.put(cache_key, k, result);
                    }
                    (split, result)
                }));
            }
            let Some((split, result)) = futures.next().await else {
                break;
            };
            match result {
                Ok(LeafSplitResult {
                    count,
                    hits,
                    aggs,
                    term_errors,
                }) => {
                    crate::aggs::add_term_count_errors(
                        &mut response.term_count_errors,
                        &term_errors,
                    );
                    if let Some(aggs) = aggs {
                        crate::aggs::reserve_results(&mut held, &aggs, false)
                            .map_err(LeafError::OverBudget)?;
                        match merged_aggs.as_mut() {
                            None => merged_aggs = Some(aggs),
                            Some(merged) => merged.merge_fruits(aggs).map_err(|err| {
                                LeafError::Internal(format!("merging aggregations: {err}"))
                            })?,
                        }
                    }
                    response.num_hits += count;
                    let mut hits: Vec<PartialHit> = hits
                        .into_iter()
                        .map(|(key, doc)| PartialHit {
                            key,
                            doc: DocRef {
                                split_id: split.split_id.clone(),
                                segment_ord: doc.segment_ord,
                                doc_id: doc.doc_id,
                            },
                        })
                        .collect();
                    sort_hits(&mut hits, &prepared.sort_by);
                    response.hits = merge_hits(
                        std::mem::take(&mut response.hits),
                        hits,
                        k,
                        &prepared.sort_by,
                    );
                }
                Err((message, unavailable)) => response.failed_splits.push(SplitFailure {
                    split_id: split.split_id.clone(),
                    message,
                    unavailable,
                }),
            }
        }
        if prepared.aggs.is_some() {
            let merged = merged_aggs.unwrap_or_default();
            let encoded = crate::aggs::encode(&merged).map_err(LeafError::Internal)?;
            drop(merged);
            if let Some(held) = held.as_mut() {
                held.force_grow(encoded.len() as u64);
            }
            response.intermediate_aggs = Some(encoded);
        }
        Ok(response)
    }

    /// Fetches the documents of `request`, rendered as JSON, in order.
    pub async fn fetch_docs(
        &self,
        request: FetchDocsRequest,
    ) -> Result<FetchDocsResponse, LeafError> {
        let index = &request.index;
        let doc_mapper = self.doc_mapper(index)?;
        let storage = self
            .storages
            .for_index(index.index_id(), index.index_config.index_uri.as_deref())
            .map_err(|err| LeafError::Internal(err.to_string()))?;
        let metas: HashMap<&str, &SplitMetadata> = request
            .splits
            .iter()
            .map(|s| (s.split_id.as_str(), s))
            .collect();
        let mut opened: HashMap<String, Arc<OpenSplit>> = HashMap::new();
        for doc in &request.docs {
            if opened.contains_key(&doc.split_id) {
                continue;
            }
            let meta = metas.get(doc.split_id.as_str()).ok_or_else(|| {
                LeafError::InvalidRequest(format!("split {} is not in the request", doc.split_id))
            })?;
            let open = self
                .open_split(&storage, meta)
                .await
                .map_err(|(message, _)| LeafError::Internal(message))?;
            opened.insert(doc.split_id.clone(), open);
        }
        let docs = request.docs.clone();
        let current_uid = index.index_config.doc_mapping.doc_mapping_uid.clone();
        // Documents of splits of an older doc mapping are rendered with their own schema.
        let older: HashMap<String, Arc<DocMapper>> = opened
            .iter()
            .filter(|(id, _)| {
                metas
                    .get(id.as_str())
                    .is_some_and(|m| m.doc_mapping_uid != current_uid)
            })
            .map(|(id, open)| {
                (
                    id.clone(),
                    Arc::new(doc_mapper.with_schema(open.searcher.schema().clone())),
                )
            })
            .collect();
        let mut by_split: HashMap<String, Vec<(usize, DocRef)>> = HashMap::new();
        for (position, doc) in docs.into_iter().enumerate() {
            by_split
                .entry(doc.split_id.clone())
                .or_default()
                .push((position, doc));
        }
        let render = |open: &OpenSplit, mapper: &DocMapper, docs: Vec<(usize, DocRef)>| {
            docs.into_iter()
                .map(|(position, doc)| {
                    open.searcher
                        .doc::<TantivyDocument>(DocAddress::new(doc.segment_ord, doc.doc_id))
                        .map(|d| (position, mapper.doc_to_json(&d)))
                        .map_err(|err| err.to_string())
                })
                .collect::<Result<Vec<_>, String>>()
        };
        let mut rendered: Vec<Option<serde_json::Value>> = vec![None; request.docs.len()];
        let mut place = |docs: Vec<(usize, serde_json::Value)>| {
            for (position, doc) in docs {
                rendered[position] = Some(doc);
            }
        };
        // Documents of splits on local disk are read from memory-mapped files, a page of them
        // in well under a millisecond: on this thread, without waking another for it (a
        // multi-threaded runtime lends this worker's other tasks to another thread meanwhile).
        let in_place = opened.values().all(|open| !open.by_ranges)
            && tokio::runtime::Handle::try_current().is_ok_and(|runtime| {
                runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
            });
        if in_place {
            tokio::task::block_in_place(|| {
                for (split_id, docs) in by_split {
                    let mapper = older.get(&split_id).unwrap_or(&doc_mapper);
                    place(render(&opened[&split_id], mapper, docs).map_err(LeafError::Internal)?);
                }
                Ok::<_, LeafError>(())
            })?;
        } else {
            // One blocking task per split, all at once (a split read by ranges waits on the
            // object store for each document block it lacks).
            let tasks = by_split.into_iter().map(|(split_id, docs)| {
                let open = opened[&split_id].clone();
                let mapper = older.get(&split_id).unwrap_or(&doc_mapper).clone();
                tokio::task::spawn_blocking(move || render(&open, &mapper, docs))
            });
            for task in futures::future::join_all(tasks).await {
                place(
                    task.map_err(|err| LeafError::Internal(err.to_string()))?
                        .map_err(LeafError::Internal)?,
                );
            }
        }
        let docs = rendered
            .into_iter()
            .map(|doc| doc.ok_or_else(|| LeafError::Internal("a document was lost".into())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(FetchDocsResponse { docs })
    }

    /// Opens a split (through the cache) or returns it from the open-split table. The error
    /// says whether the split cache was full.
    async fn open_split(
        &self,
        storage: &StorageRef,
        split: &SplitMetadata,
    ) -> Result<Arc<OpenSplit>, (String, bool)> {
        if let Some(open) = self
            .open_splits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&split.split_id)
        {
            // An open split pins its cache entry: it is a cache hit that needed no lookup.
            if open._cached.is_some() {
                self.cache.record_hit();
            }
            return Ok(open.clone());
        }
        let open = match self.ranges_for(storage) {
            Some(ranges) => Arc::new(OpenSplit {
                searcher: crate::remote::open_remote_split(storage.clone(), split, ranges).await?,
                by_ranges: true,
                warmed: Default::default(),
                _cached: None,
            }),
            None => match storage.local_path(&split.object_key()) {
                // A local split is mapped where it lies: no copy, so no cache budget spent
                // and nothing written (a full disk does not stop searches).
                Some(path) => Self::open_local_split(path).await?,
                None => self.open_cached_split(storage.as_ref(), split).await?,
            },
        };
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

    /// Opens a split file of a local storage in place.
    async fn open_local_split(path: std::path::PathBuf) -> Result<Arc<OpenSplit>, (String, bool)> {
        let searcher = tokio::task::spawn_blocking(move || -> Result<Searcher, String> {
            let index = shale_index::open_split(&path).map_err(|err| err.to_string())?;
            let reader = index.reader().map_err(|err| err.to_string())?;
            Ok(reader.searcher())
        })
        .await
        .map_err(|err| (err.to_string(), false))?
        .map_err(|err| (err, false))?;
        Ok(Arc::new(OpenSplit {
            searcher,
            by_ranges: false,
            warmed: Default::default(),
            _cached: None,
        }))
    }

    /// Opens a split downloaded whole into the split cache.
    async fn open_cached_split(
        &self,
        storage: &dyn Storage,
        split: &SplitMetadata,
    ) -> Result<Arc<OpenSplit>, (String, bool)> {
        let cached = self
            .cache
            .get_split(storage, &split.split_id, split.size_bytes)
            .await
            .map_err(|err| {
                let unavailable = err.is_transient();
                (err.to_string(), unavailable)
            })?;
        let path = cached.split_file();
        let searcher = tokio::task::spawn_blocking(move || -> Result<Searcher, String> {
            let index = shale_index::open_split(&path).map_err(|err| err.to_string())?;
            let reader = index.reader().map_err(|err| err.to_string())?;
            Ok(reader.searcher())
        })
        .await
        .map_err(|err| (err.to_string(), false))?
        .map_err(|err| (err, false))?;
        Ok(Arc::new(OpenSplit {
            searcher,
            by_ranges: false,
            warmed: Default::default(),
            _cached: Some(cached),
        }))
    }

    #[allow(clippy::too_many_arguments)]
    async fn search_split(
        &self,
        storage: &StorageRef,
        split: &SplitMetadata,
        query: Arc<dyn Query>,
        older: Option<OlderMapping>,
        sort_by: SortBy,
        after: Option<SortKey>,
        timestamp_field: Option<String>,
        k: usize,
        aggs: Option<Aggregations>,
        error_plan: Option<Arc<crate::aggs::TermErrorPlan>>,
    ) -> Result<LeafSplitResult, (String, bool)> {
        let (_permit, open, query) = self.open_with_query(storage, split, query, older).await?;
        let context = self.agg_context();
        tokio::task::spawn_blocking(move || {
            if open.by_ranges {
                let fields = crate::remote::fast_fields_read(
                    &sort_by,
                    timestamp_field.as_deref(),
                    aggs.as_ref(),
                );
                crate::remote::warm(&open.searcher, query.as_ref(), &fields, &open.warmed);
            }
            let aggs = aggs.map(|aggs| DistributedAggregationCollector::from_aggs(aggs, context));
            let mut result = run_leaf(
                &open.searcher,
                query.as_ref(),
                &sort_by,
                after.as_ref(),
                timestamp_field.as_deref(),
                k,
                aggs,
            )?;
            if let (Some(plan), Some(aggs)) = (&error_plan, &result.aggs) {
                result.term_errors = crate::aggs::term_count_errors(plan, aggs);
            }
            Ok(result)
        })
        .await
        .map_err(|err| (err.to_string(), false))?
        .map_err(|err| (err, false))
    }

    /// Waits for a permit, opens `split` and gives the query to run on it (against its own
    /// schema if it was written under an older doc mapping). The permit bounds downloads as
    /// well as searches; splits read by ranges mostly wait on the object store when cold, so
    /// more of them run at once.
    async fn open_with_query(
        &self,
        storage: &StorageRef,
        split: &SplitMetadata,
        query: Arc<dyn Query>,
        older: Option<OlderMapping>,
    ) -> Result<(OwnedSemaphorePermit, Arc<OpenSplit>, Arc<dyn Query>), (String, bool)> {
        let permits = if self.ranges_for(storage).is_some() {
            &self.remote_permits
        } else {
            &self.permits
        };
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|err| (err.to_string(), false))?;
        let open = self.open_split(storage, split).await?;
        let query = match older {
            Some(older) => older.query_for(&open.searcher),
            None => query,
        };
        Ok((permit, open, query))
    }

    /// Counts the matches of `query` in `split`, collecting no hit (Tantivy's per-segment
    /// count: a term's document frequency when nothing is deleted).
    async fn count_split(
        &self,
        storage: &StorageRef,
        split: &SplitMetadata,
        query: Arc<dyn Query>,
        older: Option<OlderMapping>,
        timestamp_field: Option<String>,
    ) -> Result<LeafSplitResult, (String, bool)> {
        let (_permit, open, query) = self.open_with_query(storage, split, query, older).await?;
        tokio::task::spawn_blocking(move || {
            if open.by_ranges {
                let fields = crate::remote::fast_fields_read(
                    &SortBy::score(),
                    timestamp_field.as_deref(),
                    None,
                );
                crate::remote::warm(&open.searcher, query.as_ref(), &fields, &open.warmed);
            }
            query
                .count(&open.searcher)
                .map(|count| LeafSplitResult::count(count as u64))
                .map_err(|err| format!("counting in split: {err}"))
        })
        .await
        .map_err(|err| (err.to_string(), false))?
        .map_err(|err| (err, false))
    }

    /// The fields of `splits` of `index` (json paths included), merged: one entry per name and
    /// type, searchable or aggregatable if it is in any split. Internal fields are left out.
    pub async fn list_fields(
        &self,
        index: &IndexMetadata,
        splits: &[SplitMetadata],
    ) -> Result<Vec<SplitField>, LeafError> {
        let storage = self
            .storages
            .for_index(index.index_id(), index.index_config.index_uri.as_deref())
            .map_err(|err| LeafError::Internal(err.to_string()))?;
        let mut futures = FuturesUnordered::new();
        for split in splits {
            let storage = storage.clone();
            futures.push(async move { self.split_fields(&storage, split).await });
        }
        let mut merged: std::collections::BTreeMap<(String, tantivy::schema::Type), (bool, bool)> =
            std::collections::BTreeMap::new();
        while let Some(fields) = futures.next().await {
            for field in fields?.iter() {
                let entry = merged
                    .entry((field.name.clone(), field.typ))
                    .or_insert((false, false));
                entry.0 |= field.indexed;
                entry.1 |= field.fast;
            }
        }
        Ok(merged
            .into_iter()
            .map(|((name, typ), (indexed, fast))| SplitField {
                name,
                typ,
                indexed,
                fast,
            })
            .collect())
    }

    /// The fields of one split (cached).
    async fn split_fields(
        &self,
        storage: &StorageRef,
        split: &SplitMetadata,
    ) -> Result<Arc<Vec<SplitField>>, LeafError> {
        if let Some(fields) = self
            .split_fields
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&split.split_id)
        {
            return Ok(fields.clone());
        }
        let _permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|err| LeafError::Internal(err.to_string()))?;
        let open = self
            .open_split(storage, split)
            .await
            .map_err(|(message, _)| LeafError::Internal(message))?;
        let fields = tokio::task::spawn_blocking(move || -> tantivy::Result<Vec<SplitField>> {
            let mut out = Vec::new();
            for segment in open.searcher.segment_readers() {
                for field in segment.fields_metadata()? {
                    let name = match field
                        .field_name
                        .strip_prefix(shale_index::DYNAMIC_FIELD_NAME)
                        .and_then(|rest| rest.strip_prefix('.'))
                    {
                        Some(path) => path.to_string(),
                        None if field.field_name.starts_with('_') => continue,
                        None => field.field_name.clone(),
                    };
                    if field.typ == tantivy::schema::Type::Json {
                        continue;
                    }
                    out.push(SplitField {
                        name,
                        typ: field.typ,
                        indexed: field.is_indexed(),
                        fast: field.is_fast(),
                    });
                }
            }
            Ok(out)
        })
        .await
        .map_err(|err| LeafError::Internal(err.to_string()))?
        .map_err(|err| LeafError::Internal(err.to_string()))?;
        let fields = Arc::new(fields);
        let mut table = self.split_fields.lock().unwrap_or_else(|p| p.into_inner());
        if table.len() >= MAX_SPLIT_FIELD_LISTS {
            table.clear();
        }
        table.insert(split.split_id.clone(), fields.clone());
        Ok(fields)
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
}

/// What rebuilding a request's query for a split of an older doc mapping takes.
struct OlderMapping {
    current: Arc<DocMapper>,
    request: SearchRequest,
    tasks: Vec<DeleteTask>,
}

impl OlderMapping {
    /// The request's query (time filter and deletes included) against the split's own
    /// schema. A query the older mapping cannot express (a field it lacks) matches nothing
    /// there: the request was checked against the current mapping.
    fn query_for(&self, searcher: &Searcher) -> Arc<dyn Query> {
        let mapper = self.current.with_schema(searcher.schema().clone());
        let build = || -> Result<Box<dyn Query>, shale_index::IndexError> {
            let user =
                mapper.parse_query(&self.request.query, self.request.search_field.as_deref())?;
            let query: Box<dyn Query> = match mapper
                .time_range_query(self.request.start_timestamp, self.request.end_timestamp)
            {
                Some(range) => Box::new(BooleanQuery::new(vec![
                    (Occur::Must, user),
                    (Occur::Must, range),
                ])),
                None => user,
            };
            if self.tasks.is_empty() {
                Ok(query)
            } else {
                mapper.without_deleted(query, &self.tasks)
            }
        };
        match build() {
            Ok(query) => Arc::from(query),
            Err(_) => Arc::new(tantivy::query::EmptyQuery),
        }
    }
}

/// A searcher over one empty document of `doc_mapper`'s schema, in memory.
fn empty_searcher(doc_mapper: &DocMapper) -> tantivy::Result<Searcher> {
    let mut index = tantivy::Index::create_in_ram(doc_mapper.schema().clone());
    index.set_tokenizers(doc_mapper.tokenizer_manager().clone());
    index.set_fast_field_tokenizers(shale_index::fast_field_tokenizers());
    let mut writer: tantivy::IndexWriter<TantivyDocument> =
        index.writer_with_num_threads(1, 15_000_000)?;
    writer.add_document(TantivyDocument::default())?;
    writer.commit()?;
    Ok(index.reader()?.searcher())
}

/// What one split gave: its count, its best hits, its aggregations.
#[derive(Clone)]
pub(crate) struct LeafSplitResult {
    pub(crate) count: u64,
    pub(crate) hits: Vec<(SortKey, DocAddress)>,
    pub(crate) aggs: Option<IntermediateAggregationResults>,
    /// Elasticsearch's count error bounds of its `terms` aggregations.
    pub(crate) term_errors: crate::aggs::TermCountErrors,
}

impl LeafSplitResult {
    /// A split only counted.
    pub(crate) fn count(count: u64) -> Self {
        LeafSplitResult {
            count,
            hits: Vec::new(),
            aggs: None,
            term_errors: Default::default(),
        }
    }

    /// About the memory it takes (the partial-result cache's measure).
    pub(crate) fn estimated_bytes(&self) -> u64 {
        let hits: usize = self
            .hits
            .iter()
            .map(|(key, _)| {
                std::mem::size_of::<(SortKey, DocAddress)>()
                    + key.0.len() * std::mem::size_of::<SortValue>()
                    + key
                        .0
                        .iter()
                        .map(|value| match value {
                            SortValue::Str(text) => text.len(),
                            SortValue::Bytes(bytes) => bytes.len(),
                            _ => 0,
                        })
                        .sum::<usize>()
            })
            .sum();
        // Aggregations: the heap their nested maps hold.
        let aggs = self.aggs.as_ref().map_or(0, |aggs| {
            shale_types::heap::estimated_heap_bytes(aggs) as usize
        });
        (std::mem::size_of::<Self>() + hits + aggs + self.term_errors.len() * 64) as u64
    }
}

fn run_leaf(
    searcher: &Searcher,
    query: &dyn Query,
    sort_by: &SortBy,
    after: Option<&SortKey>,
    timestamp_field: Option<&str>,
    k: usize,
    aggs: Option<DistributedAggregationCollector>,
) -> Result<LeafSplitResult, String> {
    use tantivy::collector::sort_key::SortByErasedType;
    let err = |e: tantivy::TantivyError| e.to_string();
    let result = |count: usize, hits, aggs| LeafSplitResult {
        count: count as u64,
        hits,
        aggs,
        term_errors: Default::default(),
    };
    if k == 0 {
        let (count, aggs) = searcher.search(query, &(Count, aggs)).map_err(err)?;
        return Ok(result(count, Vec::new(), aggs));
    }
    // The count and the aggregations cover every match; only the top-k skips the documents
    // at or before the cursor.
    fn collect<C: Collector>(
        searcher: &Searcher,
        query: &dyn Query,
        top: C,
        after: Option<(&SortKey, &SortBy)>,
        aggs: Option<DistributedAggregationCollector>,
    ) -> tantivy::Result<(usize, C::Fruit, Option<IntermediateAggregationResults>)> {
        match after {
            Some((key, sort_by)) => {
                let top = AfterKey {
                    inner: top,
                    sort_by: sort_by.clone(),
                    after: key.clone(),
                };
                searcher.search(query, &(Count, top, aggs))
            }
            None => searcher.search(query, &(Count, top, aggs)),
        }
    }
    let after = after.map(|key| (key, sort_by));
    let order_of = |order: &SortOrder| match order {
        SortOrder::Asc => Order::Asc,
        SortOrder::Desc => Order::Desc,
    };
    let erased = |criterion: &SortField| match criterion {
        SortField::Score | SortField::Doc(_) => {
            (LenientSort(SortByErasedType::for_score()), Order::Desc)
        }
        SortField::Field { field, order } => (
            LenientSort(SortByErasedType::for_field(field)),
            order_of(order),
        ),
    };
    match sort_by.fields.as_slice() {
        [SortField::Doc(order)] => {
            let collector = DocOrderTop { k, order: *order };
            let (count, top, aggs) =
                collect(searcher, query, collector, after, aggs).map_err(err)?;
            let hits = top
                .into_iter()
                .map(|doc| (SortKey(vec![SortValue::U64(doc_position(doc))]), doc))
                .collect();
            Ok(result(count, hits, aggs))
        }
        [SortField::Score] => {
            let collector = TopDocs::with_limit(k).order_by_score();
            let (count, top, aggs) =
                collect(searcher, query, collector, after, aggs).map_err(err)?;
            let hits = top
                .into_iter()
                .map(|(score, doc)| (SortKey(vec![SortValue::F64(f64::from(score))]), doc))
                .collect();
            Ok(result(count, hits, aggs))
        }
        // The common case, typed: newest (or oldest) first.
        [SortField::Field { field, order }] if Some(field.as_str()) == timestamp_field => {
            let collector = TopDocs::with_limit(k)
                .order_by_fast_field::<tantivy::DateTime>(field, order_of(order));
            let (count, top, aggs) =
                collect(searcher, query, collector, after, aggs).map_err(err)?;
            let hits = top
                .into_iter()
                .map(|(value, doc)| {
                    let value = value.map_or(SortValue::Null, |v| {
                        SortValue::I64(micros_of_nanos(v.into_timestamp_nanos()))
                    });
                    (SortKey(vec![value]), doc)
                })
                .collect();
            Ok(result(count, hits, aggs))
        }
        [first] => {
            let collector = TopDocs::with_limit(k).order_by(erased(first));
            let (count, top, aggs) =
                collect(searcher, query, collector, after, aggs).map_err(err)?;
            let hits = top
                .into_iter()
                .map(|(value, doc)| (SortKey(vec![SortValue::from_owned(value)]), doc))
                .collect();
            Ok(result(count, hits, aggs))
        }
        [first, SortField::Doc(order)] => {
            let collector =
                TopDocs::with_limit(k).order_by((erased(first), (SortByDoc, order_of(order))));
            let (count, top, aggs) =
                collect(searcher, query, collector, after, aggs).map_err(err)?;
            let hits = top
                .into_iter()
                .map(|((a, _), doc)| {
                    let position = SortValue::U64(doc_position(doc));
                    (SortKey(vec![SortValue::from_owned(a), position]), doc)
                })
                .collect();
            Ok(result(count, hits, aggs))
        }
        [first, second] => {
            let collector = TopDocs::with_limit(k).order_by((erased(first), erased(second)));
            let (count, top, aggs) =
                collect(searcher, query, collector, after, aggs).map_err(err)?;
            let hits = top
                .into_iter()
                .map(|((a, b), doc)| {
                    (
                        SortKey(vec![SortValue::from_owned(a), SortValue::from_owned(b)]),
                        doc,
                    )
                })
                .collect();
            Ok(result(count, hits, aggs))
        }
        other => Err(format!("cannot sort by {} criteria", other.len())),
    }
}

/// Tantivy's type-erased sort, except that a segment without the column (no document of the
/// split has the field) sorts as if every value were missing instead of failing the split.
struct LenientSort(tantivy::collector::sort_key::SortByErasedType);

/// [`LenientSort`] on one segment.
struct LenientChild(Option<ErasedChild>);

impl LenientSort {
    fn child(&self, segment: &tantivy::SegmentReader) -> tantivy::Result<LenientChild> {
        if let tantivy::collector::sort_key::SortByErasedType::Field(name) = &self.0 {
            if segment.fast_fields().u64_lenient(name)?.is_none() {
                return Ok(LenientChild(None));
            }
        }
        Ok(LenientChild(Some(
            self.0.segment_sort_key_computer(segment)?,
        )))
    }
}

impl SortKeyComputer for LenientSort {
    type SortKey = tantivy::schema::OwnedValue;
    type Child = LenientChild;
    type Comparator = tantivy::collector::sort_key::NaturalComparator;

    fn requires_scoring(&self) -> bool {
        self.0.requires_scoring()
    }

    fn segment_sort_key_computer(
        &self,
        segment_reader: &tantivy::SegmentReader,
    ) -> tantivy::Result<LenientChild> {
        self.child(segment_reader)
    }
}

impl SegmentSortKeyComputer for LenientChild {
    type SortKey = tantivy::schema::OwnedValue;
    type SegmentSortKey = Option<u64>;
    type SegmentComparator = tantivy::collector::sort_key::NaturalComparator;

    fn segment_sort_key(&mut self, doc: tantivy::DocId, score: tantivy::Score) -> Option<u64> {
        match &mut self.0 {
            Some(child) => child.segment_sort_key(doc, score),
            None => None,
        }
    }

    fn convert_segment_sort_key(&self, sort_key: Option<u64>) -> tantivy::schema::OwnedValue {
        match &self.0 {
            Some(child) => child.convert_segment_sort_key(sort_key),
            None => tantivy::schema::OwnedValue::Null,
        }
    }
}

/// Sorts by document id within a segment (`_doc` as a second criterion; the leaf orders the
/// hits of different segments by their full address).
#[derive(Clone, Copy, Debug)]
struct SortByDoc;

impl SortKeyComputer for SortByDoc {
    type SortKey = u64;
    type Child = SortByDoc;
    type Comparator = tantivy::collector::sort_key::NaturalComparator;

    fn segment_sort_key_computer(
        &self,
        _segment_reader: &tantivy::SegmentReader,
    ) -> tantivy::Result<SortByDoc> {
        Ok(SortByDoc)
    }
}

impl SegmentSortKeyComputer for SortByDoc {
    type SortKey = u64;
    type SegmentSortKey = u64;
    type SegmentComparator = tantivy::collector::sort_key::NaturalComparator;

    fn segment_sort_key(&mut self, doc: tantivy::DocId, _score: tantivy::Score) -> u64 {
        u64::from(doc)
    }

    fn convert_segment_sort_key(&self, sort_key: u64) -> u64 {
        sort_key
    }
}

/// A document's position in its split (segment, then document), as a `_doc` sort value.
fn doc_position(doc: DocAddress) -> u64 {
    (u64::from(doc.segment_ord) << 32) | u64::from(doc.doc_id)
}

/// The first (ascending) or last (descending) `k` matches in index order, best first.
struct DocOrderTop {
    k: usize,
    order: SortOrder,
}

/// [`DocOrderTop`] on one segment: documents arrive in increasing order.
struct DocOrderTopSegment {
    segment: tantivy::SegmentOrdinal,
    k: usize,
    order: SortOrder,
    docs: std::collections::VecDeque<tantivy::DocId>,
}

impl Collector for DocOrderTop {
    type Fruit = Vec<DocAddress>;
    type Child = DocOrderTopSegment;

    fn for_segment(
        &self,
        segment_local_id: tantivy::SegmentOrdinal,
        _segment: &tantivy::SegmentReader,
    ) -> tantivy::Result<Self::Child> {
        Ok(DocOrderTopSegment {
            segment: segment_local_id,
            k: self.k,
            order: self.order,
            docs: std::collections::VecDeque::new(),
        })
    }

    fn requires_scoring(&self) -> bool {
        false
    }

    fn merge_fruits(&self, segment_fruits: Vec<Vec<DocAddress>>) -> tantivy::Result<Self::Fruit> {
        let mut all: Vec<DocAddress> = segment_fruits.into_iter().flatten().collect();
        all.sort_by_key(|doc| doc_position(*doc));
        if self.order == SortOrder::Desc {
            all.reverse();
        }
        all.truncate(self.k);
        Ok(all)
    }
}

impl SegmentCollector for DocOrderTopSegment {
    type Fruit = Vec<DocAddress>;

    fn collect(&mut self, doc: tantivy::DocId, _score: tantivy::Score) {
        match self.order {
            SortOrder::Asc if self.docs.len() < self.k => self.docs.push_back(doc),
            SortOrder::Asc => {}
            SortOrder::Desc => {
                if self.docs.len() == self.k {
                    self.docs.pop_front();
                }
                self.docs.push_back(doc);
            }
        }
    }

    fn harvest(self) -> Vec<DocAddress> {
        let segment = self.segment;
        self.docs
            .into_iter()
            .map(|doc| DocAddress::new(segment, doc))
            .collect()
    }
}

/// Wraps a top-k collector so that it only sees the documents whose sort key comes strictly
/// after a cursor (`search_after`), in the request's order.
struct AfterKey<C> {
    inner: C,
    sort_by: SortBy,
    after: SortKey,
}

type ErasedChild = <tantivy::collector::sort_key::SortByErasedType as SortKeyComputer>::Child;

/// [`AfterKey`] on one segment: the sort values of each document are computed from the
/// fast fields (or its score) and compared with the cursor.
struct AfterKeySegment<S> {
    inner: S,
    criteria: Vec<(CriterionValue, SortOrder)>,
    after: SortKey,
}

/// How a segment computes one criterion's sort value of a document.
enum CriterionValue {
    Score,
    Doc(tantivy::SegmentOrdinal),
    Field(LenientChild),
}

impl<C: Collector> Collector for AfterKey<C> {
    type Fruit = C::Fruit;
    type Child = AfterKeySegment<C::Child>;

    fn for_segment(
        &self,
        segment_local_id: tantivy::SegmentOrdinal,
        segment: &tantivy::SegmentReader,
    ) -> tantivy::Result<Self::Child> {
        let inner = self.inner.for_segment(segment_local_id, segment)?;
        let mut criteria = Vec::with_capacity(self.sort_by.fields.len());
        for criterion in &self.sort_by.fields {
            criteria.push(match criterion {
                SortField::Score => (CriterionValue::Score, SortOrder::Desc),
                SortField::Doc(order) => (CriterionValue::Doc(segment_local_id), *order),
                SortField::Field { field, order } => (
                    CriterionValue::Field(
                        LenientSort(tantivy::collector::sort_key::SortByErasedType::for_field(
                            field,
                        ))
                        .child(segment)?,
                    ),
                    *order,
                ),
            });
        }
        Ok(AfterKeySegment {
            inner,
            criteria,
            after: self.after.clone(),
        })
    }

    fn requires_scoring(&self) -> bool {
        self.inner.requires_scoring()
            || self
                .sort_by
                .fields
                .iter()
                .any(|c| matches!(c, SortField::Score))
    }

    fn merge_fruits(
        &self,
        segment_fruits: Vec<<Self::Child as SegmentCollector>::Fruit>,
    ) -> tantivy::Result<Self::Fruit> {
        self.inner.merge_fruits(segment_fruits)
    }
}

impl<S: SegmentCollector> SegmentCollector for AfterKeySegment<S> {
    type Fruit = S::Fruit;

    fn collect(&mut self, doc: tantivy::DocId, score: tantivy::Score) {
        use std::cmp::Ordering;
        for (i, (computer, order)) in self.criteria.iter_mut().enumerate() {
            let value = match computer {
                CriterionValue::Score => SortValue::F64(f64::from(score)),
                CriterionValue::Doc(segment) => {
                    SortValue::U64(doc_position(DocAddress::new(*segment, doc)))
                }
                CriterionValue::Field(computer) => {
                    let key = computer.segment_sort_key(doc, score);
                    SortValue::from_owned(computer.convert_segment_sort_key(key))
                }
            };
            let Some(cursor) = self.after.0.get(i) else {
                return;
            };
            match value.compare(cursor, *order) {
                Ordering::Less => return,
                Ordering::Greater => {
                    self.inner.collect(doc, score);
                    return;
                }
                Ordering::Equal => {}
            }
        }
        // Tied with the cursor on every criterion: already returned.
    }

    fn harvest(self) -> Self::Fruit {
        self.inner.harvest()
    }
}

/// Sorts hits best first; ties broken by split id, segment and doc, so that pages are the
/// same whichever nodes served them.
/// The direction of a top-k search by the index's timestamp field alone — the searches whose
/// splits can be visited in time order and skipped — or `None`.
fn time_ordered(prepared: &Prepared, request: &LeafRequest) -> Option<SortOrder> {
    if prepared.aggs.is_some() || request.k == 0 {
        return None;
    }
    let timestamp = prepared.doc_mapper.timestamp_field_name()?;
    match prepared.sort_by.fields.first()? {
        SortField::Field { field, order } if field == timestamp => Some(*order),
        _ => None,
    }
}

/// Whether no document of `split` can sort before the k-th of `hits` (the best hits so far,
/// best first) by the timestamp, in `order`: its time range lies strictly behind it.
fn cannot_improve(split: &SplitMetadata, order: SortOrder, hits: &[PartialHit], k: usize) -> bool {
    let (Some(range), Some(kth)) = (split.time_range, k.checked_sub(1).and_then(|i| hits.get(i)))
    else {
        return false;
    };
    // Datetimes sort in microseconds; a split's range is in whole seconds, its end included.
    let Some(SortValue::I64(kth_micros)) = kth.key.0.first() else {
        return false;
    };
    let kth_micros = i128::from(*kth_micros);
    match order {
        SortOrder::Desc => (i128::from(range.end) + 1) * 1_000_000 <= kth_micros,
        SortOrder::Asc => i128::from(range.start) * 1_000_000 > kth_micros,
    }
}

/// Whether the request's time bounds leave out part of `split` (or may: it has no range).
fn cuts(request: &SearchRequest, split: &SplitMetadata) -> bool {
    match split.time_range {
        Some(range) => {
            request
                .start_timestamp
                .is_some_and(|start| start > range.start)
                || request.end_timestamp.is_some_and(|end| end <= range.end)
        }
        None => request.start_timestamp.is_some() || request.end_timestamp.is_some(),
    }
}

pub(crate) fn sort_hits(hits: &mut [PartialHit], sort_by: &SortBy) {
    hits.sort_by(|a, b| compare_hits(a, b, sort_by));
}

/// Merges two lists sorted by [`sort_hits`], keeping the first `k`.
pub(crate) fn merge_hits(
    a: Vec<PartialHit>,
    b: Vec<PartialHit>,
    k: usize,
    sort_by: &SortBy,
) -> Vec<PartialHit> {
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

/// Best first, criterion by criterion, then by split id, segment and doc.
pub(crate) fn compare_hits(a: &PartialHit, b: &PartialHit, sort_by: &SortBy) -> std::cmp::Ordering {
    let mut ordering = std::cmp::Ordering::Equal;
    fn address(hit: &PartialHit) -> (&str, u32, u32) {
        (&hit.doc.split_id, hit.doc.segment_ord, hit.doc.doc_id)
    }
    for (i, criterion) in sort_by.fields.iter().enumerate() {
        let order = match criterion {
            SortField::Score => SortOrder::Desc,
            SortField::Field { order, .. } => *order,
            SortField::Doc(order) => {
                let natural = address(a).cmp(&address(b));
                return match order {
                    SortOrder::Asc => natural,
                    SortOrder::Desc => natural.reverse(),
                };
            }
        };
        let (Some(x), Some(y)) = (a.key.0.get(i), b.key.0.get(i)) else {
            break;
        };
        ordering = x.compare(y, order);
        if ordering != std::cmp::Ordering::Equal {
            break;
        }
    }
    ordering.then_with(|| {
        (&a.doc.split_id, a.doc.segment_ord, a.doc.doc_id).cmp(&(
            &b.doc.split_id,
            b.doc.segment_ord,
            b.doc.doc_id,
        ))
    })
}
