//! Elasticsearch's read API under `/api/v1/_elastic`, enough for Elasticsearch clients and
//! Grafana's Elasticsearch data source: `/` (cluster info), `_cluster/health`,
//! `{index}/_search` and `_search`, `{index}/_count`, `_msearch`, `_field_caps`,
//! `_mapping`, `_cat/indices` and `_resolve/index`. Index expressions are comma lists of
//! names and `*` patterns (`-pattern` excludes, `_all` is everything); a named index that
//! does not exist is a 404 `index_not_found_exception` unless `ignore_unavailable=true`, a
//! pattern matching nothing an empty result. Searches are translated by
//! [`shale_search::elastic`] and run as one search over every matching index. Options Shale
//! has no use for are accepted and ignored, so that clients sending them work.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use shale_config::glob_match;
use shale_index::DocMapper;
use shale_metastore::{IndexMetadata, ListSplitsQuery};
use shale_search::elastic::{
    es_types, field_types, is_date_field, translate_search, EsSearchBody, EsSort, EsTranslated,
};
use shale_search::leaf::SortValue;
use shale_search::{HitMeta, SearchError, SearchResponse};
use shale_types::SplitState;

use crate::elastic::EsError;
use crate::http::{read_body, ApiError, ApiQuery, AppState};

/// The Elasticsearch version Shale answers as (what Quickwit answers; Grafana and the
/// official clients accept it).
const ES_VERSION: &str = "7.17.0";

type EsResult<T> = Result<T, EsError>;

fn bad_request(reason: impl Into<String>) -> EsError {
    EsError::bad_request("illegal_argument_exception", reason)
}

fn index_not_found(index: &str) -> EsError {
    EsError {
        status: StatusCode::NOT_FOUND,
        kind: "index_not_found_exception",
        reason: format!("no such index [{index}]"),
        retry_after_secs: None,
    }
}

impl From<SearchError> for EsError {
    fn from(err: SearchError) -> Self {
        match &err {
            SearchError::IndexNotFound(index) => index_not_found(index),
            SearchError::InvalidRequest(message) => {
                crate::metrics::count_if_depth_limit(message);
                bad_request(message.clone())
            }
            _ => EsError::from(ApiError::from(err)),
        }
    }
}

/// `GET|HEAD /api/v1/_elastic[/]`: who answers.
pub async fn cluster_info(State(state): State<AppState>) -> Json<Value> {
    let config = &state.node.config;
    Json(json!({
        "name": config.node_id,
        "cluster_name": config.cluster_id,
        "cluster_uuid": config.cluster_id,
        "version": {
            "distribution": "shale",
            "number": ES_VERSION,
            "build_flavor": "default",
            "build_type": "shale",
            "build_hash": env!("CARGO_PKG_VERSION"),
            "build_date": "2026-01-01T00:00:00Z",
            "build_snapshot": false,
            "lucene_version": "8.11.1",
            "minimum_wire_compatibility_version": "6.8.0",
            "minimum_index_compatibility_version": "6.0.0-beta1",
        },
        "tagline": "You Know, for Search",
    }))
}

/// `GET /api/v1/_elastic/_cluster/health`: green while the node is ready (`wait_for_status`
/// and other options are accepted: there is nothing to wait for).
pub async fn cluster_health(State(state): State<AppState>) -> Response {
    let ready = state.node.metastore.list_indexes().await.is_ok();
    let status = if ready { "green" } else { "red" };
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        Json(json!({
            "cluster_name": state.node.config.cluster_id,
            "status": status,
            "timed_out": false,
            "number_of_nodes": 1,
            "number_of_data_nodes": 1,
            "active_primary_shards": 0,
            "active_shards": 0,
            "relocating_shards": 0,
            "initializing_shards": 0,
            "unassigned_shards": 0,
            "delayed_unassigned_shards": 0,
            "number_of_pending_tasks": 0,
            "number_of_in_flight_fetch": 0,
            "task_max_waiting_in_queue_millis": 0,
            "active_shards_percent_as_number": 100.0,
        })),
    )
        .into_response()
}

/// The indexes an index expression names, sorted by id. A named index that does not exist
/// is an error unless `ignore_unavailable`.
async fn resolve_indexes(
    state: &AppState,
    expression: Option<&str>,
    ignore_unavailable: bool,
) -> EsResult<Vec<IndexMetadata>> {
    let all = state
        .node
        .metastore
        .list_indexes()
        .await
        .map_err(|err| EsError::from(ApiError::from(err)))?;
    let expression = expression.unwrap_or("").trim();
    // Wildcards and `_all` expand to document indexes only: a metrics index is searched
    // with PromQL (named explicitly, it gets that answer).
    let documents = |i: &&IndexMetadata| i.index_config.metrics.is_none();
    let mut include: BTreeSet<String> = BTreeSet::new();
    let mut exclude: Vec<String> = Vec::new();
    let terms: Vec<&str> = expression
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    if terms.is_empty() {
        include.extend(
            all.iter()
                .filter(documents)
                .map(|i| i.index_id().to_string()),
        );
    }
    for term in terms {
        if let Some(excluded) = term.strip_prefix('-') {
            exclude.push(excluded.to_string());
            continue;
        }
        if term == "_all" || term == "*" {
            include.extend(
                all.iter()
                    .filter(documents)
                    .map(|i| i.index_id().to_string()),
            );
        } else if term.contains('*') {
            include.extend(
                all.iter()
                    .filter(documents)
                    .map(IndexMetadata::index_id)
                    .filter(|id| glob_match(term, id))
                    .map(str::to_string),
            );
        } else if all.iter().any(|i| i.index_id() == term) {
            include.insert(term.to_string());
        } else if !ignore_unavailable {
            return Err(index_not_found(term));
        }
    }
    Ok(all
        .into_iter()
        .filter(|i| include.contains(i.index_id()))
        .filter(|i| !exclude.iter().any(|p| glob_match(p, i.index_id())))
        .collect())
}

fn flag(params: &HashMap<String, String>, name: &str) -> bool {
    params
        .get(name)
        .is_some_and(|v| v.is_empty() || v.eq_ignore_ascii_case("true"))
}

fn url_usize(params: &HashMap<String, String>, name: &str) -> EsResult<Option<usize>> {
    match params.get(name) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| {
            bad_request(format!(
                "`{name}` must be a non-negative integer, got `{v}`"
            ))
        }),
    }
}

/// What a search needs from the URL besides the body.
struct UrlSearchParams {
    size: Option<usize>,
    from: Option<usize>,
    q: Option<String>,
    sort: Option<String>,
    source_includes: Option<Vec<String>>,
    source_excludes: Option<Vec<String>>,
    ignore_unavailable: bool,
    /// Quickwit's `extra_filters`: comma-separated queries (query language) every hit must
    /// also match.
    extra_filters: Vec<String>,
}

impl UrlSearchParams {
    fn parse(params: &HashMap<String, String>) -> EsResult<Self> {
        let list = |name: &str| {
            params.get(name).map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
        };
        Ok(UrlSearchParams {
            size: url_usize(params, "size")?,
            from: url_usize(params, "from")?,
            q: params.get("q").cloned(),
            sort: params.get("sort").cloned(),
            source_includes: list("_source_includes"),
            source_excludes: list("_source_excludes"),
            ignore_unavailable: flag(params, "ignore_unavailable"),
            extra_filters: list("extra_filters").unwrap_or_default(),
        })
    }
}

/// One search, translated for every index it targets, run as one, rendered as
/// Elasticsearch renders a search response.
async fn run_search(
    state: &AppState,
    indexes: Vec<IndexMetadata>,
    mut body: EsSearchBody,
    url: &UrlSearchParams,
) -> EsResult<Value> {
    let started = Instant::now();
    if let Some(sort) = &url.sort {
        body.sort = Some(Value::Array(
            sort.split(',')
                .map(|s| Value::String(s.trim().to_string()))
                .collect(),
        ));
    }
    let mut targets = Vec::with_capacity(indexes.len());
    let mut mappers: HashMap<String, std::sync::Arc<DocMapper>> = HashMap::new();
    let mut sort: Vec<EsSort> = Vec::new();
    for index in &indexes {
        let mapper = state
            .node
            .search
            .leaf()
            .doc_mapper(index)
            .map_err(|err| EsError::from(ApiError::internal(err.to_string())))?;
        let EsTranslated {
            request,
            sort: index_sort,
        } = translate_search(&body, url.size, url.from, url.q.as_deref(), &mapper)
            .map_err(bad_request)?;
        let mut request = request;
        for filter in &url.extra_filters {
            request.query = format!("({}) AND ({filter})", request.query);
        }
        sort = index_sort;
        mappers.insert(index.index_id().to_string(), mapper);
        targets.push((index.index_id().to_string(), request));
    }
    let (size, from) = match targets.first() {
        Some((_, r)) => (r.max_hits, r.start_offset),
        None => (0, 0),
    };
    let _ = (size, from);
    let response = if targets.is_empty() {
        SearchResponse::default()
    } else {
        state.node.search.search_many(targets).await?
    };
    Ok(render_search(
        response, &sort, &mappers, &body, url, started,
    ))
}

/// A sort value as Elasticsearch renders it: dates in epoch milliseconds, or nanoseconds
/// with Quickwit's `format: epoch_nanos_int`.
fn sort_value_json(value: &SortValue, is_date: bool, format: Option<&str>) -> Value {
    match value {
        SortValue::Null => Value::Null,
        SortValue::U64(v) => json!(v),
        SortValue::Bool(v) => json!(v),
        SortValue::I64(v) if is_date && format == Some("epoch_nanos_int") => {
            json!(i128::from(*v) * 1000)
        }
        SortValue::I64(v) if is_date => json!(v.div_euclid(1000)),
        SortValue::I64(v) => json!(v),
        SortValue::F64(v) => json!(v),
        SortValue::Str(v) => json!(v),
        SortValue::Bytes(v) => json!(v),
    }
}

/// The value at a dotted path of a document.
fn lookup<'v>(doc: &'v Value, path: &str) -> Option<&'v Value> {
    if let Some(v) = doc.get(path) {
        return Some(v);
    }
    let mut current = doc;
    for part in path.split('.') {
        current = current.get(part)?;
    }
    Some(current)
}

/// Keeps only the dotted paths `includes` (and their parents).
fn include_paths(doc: &Value, includes: &[String]) -> Value {
    let mut out = Value::Object(Map::new());
    for path in includes {
        let Some(value) = lookup(doc, path) else {
            continue;
        };
        let mut target = &mut out;
        let parts: Vec<&str> = path.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            let Value::Object(map) = target else { break };
            if i == parts.len() - 1 {
                map.insert(part.to_string(), value.clone());
                break;
            }
            target = map
                .entry(part.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
        }
    }
    out
}

/// Removes the dotted paths `excludes`.
fn exclude_paths(doc: &mut Value, excludes: &[String]) {
    for path in excludes {
        let parts: Vec<&str> = path.split('.').collect();
        let mut target = &mut *doc;
        for (i, part) in parts.iter().enumerate() {
            let Value::Object(map) = target else { break };
            if i == parts.len() - 1 {
                map.remove(*part);
                break;
            }
            match map.get_mut(*part) {
                Some(next) => target = next,
                None => break,
            }
        }
    }
}

fn render_search(
    response: SearchResponse,
    sort: &[EsSort],
    mappers: &HashMap<String, std::sync::Arc<DocMapper>>,
    body: &EsSearchBody,
    url: &UrlSearchParams,
    started: Instant,
) -> Value {
    // `_source`: false, a list of fields, or {includes, excludes}, overridden by the URL.
    let (mut includes, mut excludes, mut show_source) = (None, None, true);
    match &body.source {
        Some(Value::Bool(false)) => show_source = false,
        Some(Value::String(field)) => includes = Some(vec![field.clone()]),
        Some(Value::Array(fields)) => {
            includes = Some(
                fields
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect(),
            )
        }
        Some(Value::Object(spec)) => {
            let list = |key: &str| {
                spec.get(key).map(|v| match v {
                    Value::String(s) => vec![s.clone()],
                    Value::Array(items) => items
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect(),
                    _ => Vec::new(),
                })
            };
            includes = list("includes");
            excludes = list("excludes");
        }
        _ => {}
    }
    if url.source_includes.is_some() {
        includes = url.source_includes.clone();
    }
    if url.source_excludes.is_some() {
        excludes = url.source_excludes.clone();
    }
    let requested_fields: Vec<String> = match &body.fields {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|item| match item {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("field").and_then(Value::as_str).map(str::to_string),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let by_score = sort.first().is_none_or(|s| s.field == "_score");
    let hits: Vec<Value> = response
        .hits
        .into_iter()
        .zip(response.hit_meta)
        .map(|(doc, meta)| {
            let HitMeta {
                key,
                doc: address,
                index_id,
            } = meta;
            let mapper = mappers.get(&index_id);
            let mut hit = Map::new();
            hit.insert("_index".into(), json!(index_id));
            hit.insert(
                "_id".into(),
                json!(format!(
                    "{}:{:08x}:{:08x}",
                    address.split_id, address.segment_ord, address.doc_id
                )),
            );
            let score = if by_score && !sort.is_empty() {
                key.0.first().map(|v| sort_value_json(v, false, None))
            } else {
                None
            };
            hit.insert("_score".into(), score.unwrap_or(Value::Null));
            if !requested_fields.is_empty() {
                let mut fields = Map::new();
                for field in &requested_fields {
                    if let Some(value) = lookup(&doc, field) {
                        let values = match value {
                            Value::Array(items) => items.clone(),
                            other => vec![other.clone()],
                        };
                        fields.insert(field.clone(), Value::Array(values));
                    }
                }
                hit.insert("fields".into(), Value::Object(fields));
            }
            if show_source {
                let mut source = match &includes {
                    Some(includes) => include_paths(&doc, includes),
                    None => doc,
                };
                if let Some(excludes) = &excludes {
                    exclude_paths(&mut source, excludes);
                }
                hit.insert("_source".into(), source);
            }
            if !sort.is_empty() {
                let values: Vec<Value> = sort
                    .iter()
                    .zip(&key.0)
                    .map(|(s, v)| {
                        let is_date = mapper.is_some_and(|m| is_date_field(m, &s.field));
                        sort_value_json(v, is_date, s.format.as_deref())
                    })
                    .collect();
                hit.insert("sort".into(), Value::Array(values));
            }
            Value::Object(hit)
        })
        .collect();
    let failed = response.errors.len();
    let mut out = json!({
        "took": started.elapsed().as_millis() as u64,
        "timed_out": false,
        "_shards": {
            "total": response.num_splits_searched,
            "successful": response.num_splits_searched.saturating_sub(failed),
            "skipped": 0,
            "failed": failed,
        },
        "hits": {
            "total": {"value": response.num_hits, "relation": "eq"},
            "max_score": Value::Null,
            "hits": hits,
        },
    });
    if let Some(aggregations) = response.aggregations {
        out["aggregations"] = aggregations;
    }
    out
}

/// Parses a search body (empty means `{}`).
fn parse_body(bytes: &[u8]) -> EsResult<EsSearchBody> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(EsSearchBody::default());
    }
    serde_json::from_slice(bytes).map_err(|err| {
        EsError::bad_request("parse_exception", format!("invalid search body: {err}"))
    })
}

/// `GET|POST /api/v1/_elastic/{index}/_search`.
pub async fn search_index(
    State(state): State<AppState>,
    Path(index): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> EsResult<Json<Value>> {
    search_inner(state, Some(index), params, headers, body).await
}

/// `GET|POST /api/v1/_elastic/_search`: every index.
pub async fn search_all(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> EsResult<Json<Value>> {
    search_inner(state, None, params, headers, body).await
}

async fn search_inner(
    state: AppState,
    index: Option<String>,
    params: HashMap<String, String>,
    headers: HeaderMap,
    body: Body,
) -> EsResult<Json<Value>> {
    let bytes = read_body(&state, &headers, body).await?;
    let body = parse_body(&bytes)?;
    let url = UrlSearchParams::parse(&params)?;
    let scroll_ttl = match params.get("scroll") {
        Some(scroll) => {
            if params
                .get("allow_partial_search_results")
                .map(String::as_str)
                == Some("false")
            {
                return Err(bad_request(
                    "Invalid argument: Quickwit only supports scroll API with \
                     allow_partial_search_results set to true",
                ));
            }
            Some(scroll_ttl_secs(scroll)?)
        }
        None => None,
    };
    let indexes = resolve_indexes(&state, index.as_deref(), url.ignore_unavailable).await?;
    let mut response = run_search(&state, indexes, body.clone(), &url).await?;
    if let Some(ttl) = scroll_ttl {
        let size = url.size.or(value_usize(body.size.as_ref())).unwrap_or(10);
        let from = url.from.or(value_usize(body.from.as_ref())).unwrap_or(0);
        let mut params = params;
        for name in ["size", "from", "scroll", "allow_partial_search_results"] {
            params.remove(name);
        }
        let context = ScrollContext {
            index,
            body: EsSearchBody { aggs: None, ..body },
            params,
            from: from + size,
            size,
            expires_at: shale_types::now_unix_secs() + ttl,
        };
        response["_scroll_id"] = json!(context.encode()?);
    }
    Ok(Json(response))
}

/// Longest scroll keep-alive, as in Quickwit (30 minutes).
const MAX_SCROLL_TTL_SECS: i64 = 1800;

/// The keep-alive of `scroll=` (`30m`, `1h`, `90s`; Elasticsearch's `ms` too), in seconds.
fn scroll_ttl_secs(scroll: &str) -> EsResult<i64> {
    let scroll = scroll.trim();
    let secs = match scroll.strip_suffix("ms") {
        Some(millis) => millis
            .trim()
            .parse::<u64>()
            .map(|ms| ms.div_ceil(1000))
            .map_err(|_| bad_request(format!("invalid scroll keep-alive `{scroll}`")))?,
        None => shale_config::parse_duration(scroll)
            .map_err(|_| bad_request(format!("invalid scroll keep-alive `{scroll}`")))?,
    };
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    if secs > MAX_SCROLL_TTL_SECS {
        return Err(bad_request(format!(
            "Invalid argument: Quickwit only supports scroll TTL period up to \
             {MAX_SCROLL_TTL_SECS} secs"
        )));
    }
    Ok(secs)
}

fn value_usize(value: Option<&Value>) -> Option<usize> {
    match value? {
        Value::Number(n) => n.as_u64().map(|n| n as usize),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Where a scroll is: the search (index expression, body without aggregations, URL
/// parameters) and the next page. It travels inside the scroll id (URL-safe base64 of its
/// JSON), so any node of the cluster can continue a scroll and nothing is held in memory.
#[derive(serde::Serialize, serde::Deserialize)]
struct ScrollContext {
    index: Option<String>,
    body: EsSearchBody,
    params: HashMap<String, String>,
    from: usize,
    size: usize,
    /// Seconds since the epoch after which the scroll is gone.
    expires_at: i64,
}

impl ScrollContext {
    fn encode(&self) -> EsResult<String> {
        use base64::Engine as _;
        let json = serde_json::to_vec(self)
            .map_err(|err| EsError::from(ApiError::internal(err.to_string())))?;
        Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json))
    }

    fn decode(id: &str) -> EsResult<ScrollContext> {
        use base64::Engine as _;
        let missing = || {
            EsError::new(
                StatusCode::NOT_FOUND,
                "search_context_missing_exception",
                format!("No search context found for id [{id}]"),
            )
        };
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(id.trim())
            .map_err(|_| missing())?;
        serde_json::from_slice(&bytes).map_err(|_| missing())
    }
}

/// `GET|POST /api/v1/_elastic/_search/scroll`: the next page of a scroll (`scroll_id` in the
/// body or the URL; `scroll` renews the keep-alive). An expired or unknown id is a 404
/// `search_context_missing_exception`.
pub async fn scroll(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> EsResult<Json<Value>> {
    let bytes = read_body(&state, &headers, body).await?;
    let request: Value = if bytes.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(&bytes).map_err(|err| {
            EsError::bad_request("parse_exception", format!("invalid scroll body: {err}"))
        })?
    };
    let id = request
        .get("scroll_id")
        .and_then(Value::as_str)
        .or(params.get("scroll_id").map(String::as_str))
        .ok_or_else(|| bad_request("a scroll needs a `scroll_id`"))?
        .to_string();
    let mut context = ScrollContext::decode(&id)?;
    let now = shale_types::now_unix_secs();
    if now > context.expires_at {
        return Err(EsError::new(
            StatusCode::NOT_FOUND,
            "search_context_missing_exception",
            format!("No search context found for id [{id}]: its keep-alive expired"),
        ));
    }
    let renewed = request
        .get("scroll")
        .and_then(Value::as_str)
        .or(params.get("scroll").map(String::as_str));
    if let Some(scroll) = renewed {
        context.expires_at = now + scroll_ttl_secs(scroll)?;
    }
    let mut params = context.params.clone();
    params.insert("from".to_string(), context.from.to_string());
    params.insert("size".to_string(), context.size.to_string());
    let url = UrlSearchParams::parse(&params)?;
    let indexes = resolve_indexes(&state, context.index.as_deref(), url.ignore_unavailable).await?;
    let mut body = context.body.clone();
    body.from = None;
    body.size = None;
    let mut response = run_search(&state, indexes, body, &url).await?;
    context.from += context.size;
    response["_scroll_id"] = json!(context.encode()?);
    Ok(Json(response))
}

/// `GET|POST /api/v1/_elastic/{index}/_count`.
pub async fn count(
    State(state): State<AppState>,
    Path(index): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> EsResult<Json<Value>> {
    let bytes = read_body(&state, &headers, body).await?;
    let mut body = parse_body(&bytes)?;
    body.size = Some(json!(0));
    body.aggs = None;
    body.sort = None;
    let mut url = UrlSearchParams::parse(&params)?;
    url.size = Some(0);
    url.from = Some(0);
    url.sort = None;
    let indexes = resolve_indexes(&state, Some(&index), url.ignore_unavailable).await?;
    let response = run_search(&state, indexes, body, &url).await?;
    Ok(Json(json!({
        "count": response["hits"]["total"]["value"],
        "_shards": response["_shards"],
    })))
}

/// `POST /api/v1/_elastic/_msearch` (and `{index}/_msearch`): NDJSON header/body pairs; each
/// search answers in `responses`, in order, with its own status (a failed search does not
/// fail the others).
pub async fn msearch(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> EsResult<Json<Value>> {
    msearch_inner(state, None, params, headers, body).await
}

/// `POST /api/v1/_elastic/{index}/_msearch`: headers without `index` search `index`.
pub async fn msearch_index(
    State(state): State<AppState>,
    Path(index): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> EsResult<Json<Value>> {
    msearch_inner(state, Some(index), params, headers, body).await
}

async fn msearch_inner(
    state: AppState,
    default_index: Option<String>,
    params: HashMap<String, String>,
    headers: HeaderMap,
    body: Body,
) -> EsResult<Json<Value>> {
    let started = Instant::now();
    let bytes = read_body(&state, &headers, body).await?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| EsError::bad_request("parse_exception", "the body is not UTF-8"))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if !lines.len().is_multiple_of(2) {
        return Err(bad_request(
            "the _msearch body must be pairs of lines: a header, then a search body",
        ));
    }
    let url = UrlSearchParams::parse(&params)?;
    let mut searches = Vec::new();
    for (i, pair) in lines.chunks(2).enumerate() {
        let header: Value = serde_json::from_str(pair[0]).map_err(|err| {
            EsError::bad_request(
                "parse_exception",
                format!("invalid header of search {i}: {err}"),
            )
        })?;
        let index = match header.get("index") {
            Some(Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
            Some(Value::Array(items)) if !items.is_empty() => Some(
                items
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            _ => default_index.clone(),
        };
        let ignore_unavailable = header
            .get("ignore_unavailable")
            .and_then(Value::as_bool)
            .unwrap_or(url.ignore_unavailable);
        let body = parse_body(pair[1].as_bytes());
        searches.push((index, ignore_unavailable, body));
    }
    let runs = searches.into_iter().map(|(index, ignore_unavailable, body)| {
        let state = state.clone();
        let url = UrlSearchParams {
            size: None,
            from: None,
            q: None,
            sort: None,
            source_includes: url.source_includes.clone(),
            source_excludes: url.source_excludes.clone(),
            ignore_unavailable,
            extra_filters: url.extra_filters.clone(),
        };
        async move {
            let result = async {
                let body = body?;
                let indexes =
                    resolve_indexes(&state, index.as_deref(), ignore_unavailable).await?;
                run_search(&state, indexes, body, &url).await
            }
            .await;
            match result {
                Ok(mut response) => {
                    response["status"] = json!(200);
                    response
                }
                Err(err) => {
                    let status = err.status.as_u16();
                    let cause = json!({"type": err.kind, "reason": err.reason});
                    json!({
                        "error": {"root_cause": [cause], "type": err.kind, "reason": err.reason},
                        "status": status,
                    })
                }
            }
        }
    });
    let responses = futures::future::join_all(runs).await;
    Ok(Json(json!({
        "took": started.elapsed().as_millis() as u64,
        "responses": responses,
    })))
}

/// `GET|POST /api/v1/_elastic/{index}/_field_caps`: the fields found in the index's splits
/// (json paths and undeclared fields included, one entry per value type), narrowed by
/// `fields` patterns, Quickwit's `start_timestamp`/`end_timestamp` and a body's
/// `index_filter` (a query: it prunes splits by time range and tags as a search would).
pub async fn field_caps_index(
    State(state): State<AppState>,
    Path(index): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> EsResult<Json<Value>> {
    let bytes = read_body(&state, &headers, body).await?;
    field_caps_inner(state, Some(index), params, &bytes).await
}

/// `GET|POST /api/v1/_elastic/_field_caps`.
pub async fn field_caps_all(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> EsResult<Json<Value>> {
    let bytes = read_body(&state, &headers, body).await?;
    field_caps_inner(state, None, params, &bytes).await
}

/// A field's capabilities for one type: searchable, aggregatable, in which indexes.
type Caps = (bool, bool, Vec<String>);

/// The search request whose splits `_field_caps` lists: the body's `index_filter` (if any)
/// and the URL's time bounds.
fn field_caps_request(
    mapper: &DocMapper,
    params: &HashMap<String, String>,
    filter: Option<&Value>,
) -> EsResult<shale_search::SearchRequest> {
    let mut request = match filter {
        Some(filter) => {
            let body = EsSearchBody {
                query: Some(filter.clone()),
                size: Some(json!(0)),
                ..EsSearchBody::default()
            };
            translate_search(&body, Some(0), Some(0), None, mapper)
                .map_err(bad_request)?
                .request
        }
        None => shale_search::SearchRequest {
            query: "*".to_string(),
            ..shale_search::SearchRequest::default()
        },
    };
    request.max_hits = 0;
    let bound = |name: &str| -> EsResult<Option<i64>> {
        params
            .get(name)
            .map(|v| {
                v.trim().parse::<i64>().map_err(|_| {
                    bad_request(format!("`{name}` must be a Unix timestamp, got `{v}`"))
                })
            })
            .transpose()
    };
    if let Some(start) = bound("start_timestamp")? {
        request.start_timestamp = Some(request.start_timestamp.map_or(start, |s| s.max(start)));
    }
    if let Some(end) = bound("end_timestamp")? {
        request.end_timestamp = Some(request.end_timestamp.map_or(end, |e| e.min(end)));
    }
    Ok(request)
}

async fn field_caps_inner(
    state: AppState,
    index: Option<String>,
    params: HashMap<String, String>,
    body: &[u8],
) -> EsResult<Json<Value>> {
    let filter = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let body: Value = serde_json::from_slice(body)
            .map_err(|err| bad_request(format!("invalid JSON body: {err}")))?;
        match body.get("index_filter") {
            None | Some(Value::Null) => None,
            Some(Value::Object(map)) if map.is_empty() => {
                return Err(bad_request(
                    "`index_filter` must hold a query, got an empty object",
                ))
            }
            Some(filter) => Some(filter.clone()),
        }
    };
    let indexes = resolve_indexes(
        &state,
        index.as_deref(),
        flag(&params, "ignore_unavailable"),
    )
    .await?;
    let patterns: Vec<String> = params
        .get("fields")
        .map(|f| f.split(',').map(|s| s.trim().to_string()).collect())
        .unwrap_or_else(|| vec!["*".to_string()]);
    let mut fields: BTreeMap<String, BTreeMap<&'static str, Caps>> = BTreeMap::new();
    for index in &indexes {
        let mapper = state
            .node
            .search
            .leaf()
            .doc_mapper(index)
            .map_err(|err| EsError::from(ApiError::internal(err.to_string())))?;
        let request = field_caps_request(&mapper, &params, filter.as_ref())?;
        let found = state
            .node
            .search
            .list_fields(index.index_id(), &request)
            .await
            .map_err(EsError::from)?;
        let mut add = |name: String, ty: &'static str, searchable: bool, aggregatable: bool| {
            if !patterns.iter().any(|p| glob_match(p, &name)) {
                return;
            }
            let entry =
                fields
                    .entry(name)
                    .or_default()
                    .entry(ty)
                    .or_insert((false, false, Vec::new()));
            entry.0 |= searchable;
            entry.1 |= aggregatable;
            if !entry.2.iter().any(|i| i == index.index_id()) {
                entry.2.push(index.index_id().to_string());
            }
        };
        if found.is_empty() {
            // No split yet: the fields the doc mapping declares.
            for (name, ty, searchable, aggregatable) in field_types(&mapper) {
                if ty != "object" {
                    add(name, ty, searchable, aggregatable);
                }
            }
        }
        for field in found {
            for ty in es_types(field.typ) {
                add(field.name.clone(), ty, field.indexed, field.fast);
            }
        }
    }
    // As Quickwit: the indexes listed are those holding one of the fields returned.
    let index_ids: Vec<String> = fields
        .values()
        .flat_map(|types| types.values().flat_map(|caps| caps.2.iter().cloned()))
        .collect::<BTreeSet<String>>()
        .into_iter()
        .collect();
    let fields: Map<String, Value> = fields
        .into_iter()
        .map(|(name, types)| {
            let types: Map<String, Value> = types
                .into_iter()
                .map(|(ty, (searchable, aggregatable, in_indexes))| {
                    let mut caps = json!({
                        "type": ty,
                        "metadata_field": false,
                        "searchable": searchable,
                        "aggregatable": aggregatable,
                    });
                    if in_indexes.len() != index_ids.len() {
                        caps["indices"] = json!(in_indexes);
                    }
                    (ty.to_string(), caps)
                })
                .collect();
            (name, Value::Object(types))
        })
        .collect();
    Ok(Json(json!({"indices": index_ids, "fields": fields})))
}

/// `GET /api/v1/_elastic/{index}/_mapping` (and `_mapping`): each index's fields in
/// Elasticsearch's typeless mapping shape (what Grafana lists fields from).
pub async fn mapping_index(
    State(state): State<AppState>,
    Path(index): Path<String>,
) -> EsResult<Json<Value>> {
    mapping_inner(state, Some(index)).await
}

/// `GET /api/v1/_elastic/_mapping`.
pub async fn mapping_all(State(state): State<AppState>) -> EsResult<Json<Value>> {
    mapping_inner(state, None).await
}

async fn mapping_inner(state: AppState, index: Option<String>) -> EsResult<Json<Value>> {
    let indexes = resolve_indexes(&state, index.as_deref(), false).await?;
    let mut out = Map::new();
    for index in &indexes {
        let mapper = state
            .node
            .search
            .leaf()
            .doc_mapper(index)
            .map_err(|err| EsError::from(ApiError::internal(err.to_string())))?;
        let mut properties = Map::new();
        for (name, ty, _, _) in field_types(&mapper) {
            properties.insert(name, json!({"type": ty}));
        }
        out.insert(
            index.index_id().to_string(),
            json!({"mappings": {"properties": properties}}),
        );
    }
    Ok(Json(Value::Object(out)))
}

/// Bytes in Elasticsearch's `_cat` units (`272.4kb`).
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["b", "kb", "mb", "gb", "tb"];
    if bytes < 1024 {
        return format!("{bytes}b");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1}{}", UNITS[unit])
}

/// `GET /api/v1/_elastic/{index}/_stats`: documents, store size and segments (splits) per
/// index and for all of them, in Elasticsearch's shape.
pub async fn stats_index(
    State(state): State<AppState>,
    Path(index): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
) -> EsResult<Json<Value>> {
    stats_inner(state, Some(index), params).await
}

/// `GET /api/v1/_elastic/_stats`.
pub async fn stats_all(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
) -> EsResult<Json<Value>> {
    stats_inner(state, None, params).await
}

async fn stats_inner(
    state: AppState,
    index: Option<String>,
    params: HashMap<String, String>,
) -> EsResult<Json<Value>> {
    let indexes = resolve_indexes(
        &state,
        index.as_deref(),
        flag(&params, "ignore_unavailable"),
    )
    .await?;
    let section = |docs: u64, bytes: u64, segments: u64| {
        json!({
            "primaries": {"docs": {"count": docs, "deleted": 0}, "store": {"size_in_bytes": bytes}},
            "total": {
                "docs": {"count": docs, "deleted": 0},
                "store": {"size_in_bytes": bytes},
                "segments": {"count": segments},
            },
        })
    };
    let mut per_index = serde_json::Map::new();
    let (mut all_docs, mut all_bytes, mut all_segments) = (0, 0, 0);
    for index in &indexes {
        let splits = published_splits(&state, index).await?;
        let docs: u64 = splits.iter().map(|s| s.split_metadata.num_docs).sum();
        let bytes: u64 = splits.iter().map(|s| s.split_metadata.size_bytes).sum();
        let segments = splits.len() as u64;
        all_docs += docs;
        all_bytes += bytes;
        all_segments += segments;
        per_index.insert(index.index_id().to_string(), section(docs, bytes, segments));
    }
    Ok(Json(json!({
        "_shards": {"total": indexes.len(), "successful": indexes.len(), "failed": 0},
        "_all": section(all_docs, all_bytes, all_segments),
        "indices": per_index,
    })))
}

/// `DELETE /api/v1/_elastic/{indexes}`: deletes every index the expression names (comma
/// lists, globs); a named index that does not exist is a 404 and nothing is deleted, unless
/// `ignore_unavailable`.
pub async fn delete_indexes(
    State(state): State<AppState>,
    Path(index): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
) -> EsResult<Json<Value>> {
    let indexes =
        resolve_indexes(&state, Some(&index), flag(&params, "ignore_unavailable")).await?;
    for index in &indexes {
        state
            .node
            .delete_index(index.index_id())
            .await
            .map_err(|err| EsError::from(ApiError::from(err)))?;
    }
    Ok(Json(json!({"acknowledged": true})))
}

async fn published_splits(
    state: &AppState,
    index: &IndexMetadata,
) -> EsResult<Vec<shale_types::Split>> {
    state
        .node
        .metastore
        .list_splits(
            ListSplitsQuery::for_index(index.index_uid.clone())
                .with_states(&[SplitState::Published]),
        )
        .await
        .map_err(|err| EsError::from(ApiError::from(err)))
}

/// Per index: (documents, bytes of split files, bytes of ingested JSON).
async fn index_stats(state: &AppState, index: &IndexMetadata) -> EsResult<(u64, u64, u64)> {
    let splits = published_splits(state, index).await?;
    Ok(splits.iter().fold((0, 0, 0), |(docs, size, raw), split| {
        let m = &split.split_metadata;
        (
            docs + m.num_docs,
            size + m.size_bytes,
            raw + m.uncompressed_docs_size_bytes,
        )
    }))
}

/// `GET /api/v1/_elastic/_cat/indices[/{index}]`: JSON only, as in Quickwit (`format=json` is
/// required; `v`, `bytes` and sorts other than by index are 400s); `h` selects columns,
/// `health` filters.
pub async fn cat_indices_all(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
) -> EsResult<Response> {
    cat_indices_inner(state, None, params).await
}

/// `GET /api/v1/_elastic/_cat/indices/{index}`.
pub async fn cat_indices_index(
    State(state): State<AppState>,
    Path(index): Path<String>,
    ApiQuery(params): ApiQuery<HashMap<String, String>>,
) -> EsResult<Response> {
    cat_indices_inner(state, Some(index), params).await
}

async fn cat_indices_inner(
    state: AppState,
    index: Option<String>,
    params: HashMap<String, String>,
) -> EsResult<Response> {
    check_cat_params(&params)?;
    let indexes = resolve_indexes(&state, index.as_deref(), false).await?;
    let columns = [
        "health",
        "status",
        "index",
        "uuid",
        "pri",
        "rep",
        "docs.count",
        "docs.deleted",
        "store.size",
        "pri.store.size",
        "dataset.size",
    ];
    let wanted: Vec<String> = match params.get("h") {
        Some(h) => h
            .split(',')
            .map(|c| c.trim().to_string())
            .filter(|c| columns.contains(&c.as_str()))
            .collect(),
        None => columns.iter().map(|c| c.to_string()).collect(),
    };
    if params.get("health").is_some_and(|h| h != "green") {
        return Ok(Json(json!([])).into_response());
    }
    let mut rows = Vec::new();
    for index in &indexes {
        let (docs, size, raw) = index_stats(&state, index).await?;
        let all = json!({
            "health": "green",
            "status": "open",
            "index": index.index_id(),
            "uuid": index.index_uid.to_string(),
            "pri": "1",
            "rep": "1",
            "docs.count": docs.to_string(),
            "docs.deleted": "0",
            "store.size": human_bytes(size),
            "pri.store.size": human_bytes(size),
            "dataset.size": human_bytes(raw),
        });
        let row: Map<String, Value> = wanted
            .iter()
            .filter_map(|c| all.get(c).map(|v| (c.clone(), v.clone())))
            .collect();
        rows.push(Value::Object(row));
    }
    Ok(Json(Value::Array(rows)).into_response())
}

/// Quickwit's `_cat/indices` parameters: JSON output only, no `bytes` or `v`, sorted by index.
fn check_cat_params(params: &HashMap<String, String>) -> EsResult<()> {
    match params.get("format") {
        Some(format) if format.eq_ignore_ascii_case("json") => {}
        Some(format) => {
            return Err(bad_request(format!(
                "format `{format}` is not supported: only format=json is"
            )))
        }
        None => {
            return Err(bad_request(
                "only format=json is supported (add `?format=json`)".to_string(),
            ))
        }
    }
    for name in params.keys() {
        match name.as_str() {
            "format" | "h" | "health" | "s" => {}
            "bytes" | "v" => {
                return Err(bad_request(format!("parameter `{name}` is not supported")))
            }
            other => {
                return Err(bad_request(format!(
                    "unknown parameter `{other}`: _cat/indices takes format, h, health and s"
                )))
            }
        }
    }
    if let Some(sort) = params.get("s") {
        if sort != "index" && sort != "index:asc" {
            return Err(bad_request(format!(
                "parameter `s={sort}` is not supported: indexes are listed by name"
            )));
        }
    }
    Ok(())
}

/// `GET /api/v1/_elastic/_resolve/index/{pattern}`.
pub async fn resolve_index(
    State(state): State<AppState>,
    Path(pattern): Path<String>,
) -> EsResult<Json<Value>> {
    let indexes = resolve_indexes(&state, Some(&pattern), false).await?;
    let indices: Vec<Value> = indexes
        .iter()
        .map(|i| json!({"name": i.index_id(), "attributes": ["open"]}))
        .collect();
    Ok(Json(
        json!({"indices": indices, "aliases": [], "data_streams": []}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("logs-*", "logs-2024"));
        assert!(glob_match("*", "x"));
        assert!(glob_match("*-2", "gharchive-2"));
        assert!(glob_match("a*b*c", "aXbYc"));
        assert!(!glob_match("a*b*c", "aXbY"));
        assert!(!glob_match("logs", "logs-1"));
    }

    #[test]
    fn byte_units() {
        assert_eq!(human_bytes(512), "512b");
        assert_eq!(human_bytes(278_938), "272.4kb");
    }

    #[test]
    fn source_paths() {
        let doc = json!({"actor": {"id": 5, "login": "x"}, "id": 1, "app": {"name": "a"}});
        assert_eq!(
            include_paths(&doc, &["actor.id".to_string(), "id".to_string()]),
            json!({"actor": {"id": 5}, "id": 1})
        );
        let mut doc = doc;
        exclude_paths(&mut doc, &["actor".to_string(), "app.name".to_string()]);
        assert_eq!(doc, json!({"id": 1, "app": {}}));
    }
}
