//! The series a PromQL query reads, from a metrics index's published Parquet splits.
//!
//! A selector lists the splits whose time range meets its window, skips those whose
//! metric-name tags cannot hold a matching name or whose sort-key range cannot hold the
//! selector's leading `=` values (metric name, then the index's sort labels in order), reads
//! the others (each object once per
//! query, kept for the query's other selectors) and merges a series' samples across splits:
//! of two samples with one timestamp, the later split's wins (the last written value, as
//! within a split). What was listed, pruned and opened is counted for the response.
//!
//! On a cluster, the splits are read where they are placed: each goes to the live searcher
//! that rendezvous hashing ranks first for it (as for log searches, so its object is in that
//! node's cache), which reads it and answers its matching series through the internal API
//! (`/internal/v1/metrics/select`); this node merges them and finishes the query. A leaf that
//! fails or does not answer has its splits read here instead.
//!
//! A query without time travel also reads the samples acknowledged but not yet in a
//! published split ([`shale_ingest::LiveSamples`]): from the records after the checkpoint of
//! the index view it listed its splits from, so that each sample is read once, from a split
//! or from memory. They come from this node and, on a cluster, from every other live
//! indexer (`/internal/v1/metrics/live`); they are merged as the newest split.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use shale_metastore::{ListSplitsQuery, Metastore};
use shale_metrics::{Labels, MatchOp, Matcher, Sample, SeriesSamples};
use shale_promql::{PromqlError, SeriesSource};
use shale_storage::StorageRef;
use shale_types::{IndexUid, SplitMetadata, SplitState};

/// How long another indexer has to answer with its unpublished samples.
const LIVE_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What a query's selectors did with splits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// Splits listed by time range (for every selector).
    pub splits_listed: u64,
    /// Of those, skipped by their metric names.
    pub splits_pruned: u64,
    /// Distinct split objects read.
    pub splits_opened: u64,
    /// Row groups of the splits read / skipped by statistics and bloom filters.
    pub row_groups_read: u64,
    /// Row groups skipped.
    pub row_groups_pruned: u64,
    /// Calls to other nodes that read splits placed on them.
    pub leaf_calls: u64,
    /// Samples read from memory (acknowledged, not yet in a published split).
    pub live_samples: u64,
    /// Calls to other indexers for theirs.
    pub live_calls: u64,
}

/// The published splits of one metrics index, read for one query.
pub struct SplitSource {
    metastore: Arc<dyn Metastore>,
    storage: StorageRef,
    index_uid: IndexUid,
    /// The splits this query read here, by id (counted once however many selectors read
    /// them).
    opened: Mutex<std::collections::HashSet<String>>,
    stats: Mutex<SourceStats>,
    /// The other searchers, when this node is part of a cluster.
    leaves: Option<Leaves>,
    /// The index's delete tasks (`delete_series`), read once per query.
    deletes: tokio::sync::OnceCell<Vec<shale_metrics::SeriesDelete>>,
    /// Whether splits and row groups are ruled out before reading (off: every split of the
    /// window is read whole — the same answers, for checking pruning).
    prune: bool,
    /// Time travel: the index as it was at the end of this second (Unix seconds): the
    /// splits published then, and the delete tasks that existed then.
    as_of: Option<i64>,
    /// The index as it is now, kept by the search service while its version holds: the
    /// splits and delete tasks of a query without time travel (else read from the
    /// metastore).
    view: Option<Arc<shale_search::IndexView>>,
    /// This node's samples not yet in published splits (none: only published samples).
    live: Option<Arc<shale_ingest::LiveSamples>>,
}

/// How a query reaches the other searchers of its cluster.
#[derive(Clone)]
pub struct Leaves {
    /// The cluster view.
    pub membership: Arc<shale_cluster::Membership>,
    /// The internal API client.
    pub client: crate::internal::InternalClient,
}

/// A selector to evaluate on some splits, sent to the node they are placed on.
#[derive(Debug, Serialize, Deserialize)]
pub struct SelectRequest {
    /// The index the splits belong to.
    pub index_uid: IndexUid,
    /// The splits.
    pub splits: Vec<SplitMetadata>,
    /// The matchers, as (label, operator `=`/`!=`/`=~`/`!~`, value).
    pub matchers: Vec<(String, String, String)>,
    /// First millisecond of the window.
    pub start_ms: i64,
    /// Last millisecond of the window (inclusive).
    pub end_ms: i64,
    /// Whether row groups are ruled out before decoding.
    #[serde(default = "pruning_on")]
    pub prune: bool,
}

fn pruning_on() -> bool {
    true
}

/// A selector to evaluate on another indexer's samples not yet in published splits.
#[derive(Debug, Serialize, Deserialize)]
pub struct LiveRequest {
    /// The index.
    pub index_uid: IndexUid,
    /// The checkpoint of the splits the query reads: the records after it are wanted.
    pub checkpoint: shale_types::SourceCheckpoint,
    /// The matchers, as in [`SelectRequest`].
    pub matchers: Vec<(String, String, String)>,
    /// First millisecond of the window.
    pub start_ms: i64,
    /// Last millisecond of the window (inclusive).
    pub end_ms: i64,
    /// The index's delete tasks as the query sees them.
    pub delete_tasks: Vec<shale_types::DeleteTask>,
}

/// An indexer's answer: its matching series.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct LiveResponse {
    /// Series with samples as (timestamp ms, IEEE bits of the value), by timestamp.
    pub series: Vec<WireSeries>,
}

/// Reads the matching samples of `live` for a [`LiveRequest`] (an indexer's side).
pub fn read_live(
    live: &shale_ingest::LiveSamples,
    request: &LiveRequest,
) -> Result<LiveResponse, ReadLiveError> {
    let matchers = wire_matchers(&request.matchers).map_err(ReadLiveError::Invalid)?;
    let deletes = request
        .delete_tasks
        .iter()
        .map(shale_metrics::SeriesDelete::from_task)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| ReadLiveError::Invalid(err.to_string()))?;
    let series = live.select(
        &request.index_uid.to_string(),
        &request.checkpoint,
        &matchers,
        request.start_ms,
        request.end_ms,
        &deletes,
    )?;
    Ok(LiveResponse {
        series: series.iter().map(to_wire).collect(),
    })
}

/// Why an indexer could not read its samples for a [`LiveRequest`].
#[derive(Debug, thiserror::Error)]
pub enum ReadLiveError {
    /// The request does not parse.
    #[error("invalid live request: {0}")]
    Invalid(String),
    /// The query's view of the index is older than what memory still holds.
    #[error("{0}")]
    Stale(#[from] shale_ingest::LiveError),
}

fn to_wire(series: &SeriesSamples) -> WireSeries {
    (
        series
            .labels
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        series
            .samples
            .iter()
            .map(|p| (p.timestamp_ms, p.value.to_bits()))
            .collect(),
    )
}

fn from_wire((pairs, samples): WireSeries) -> SeriesSamples {
    SeriesSamples {
        labels: Labels::new(pairs),
        samples: samples
            .into_iter()
            .map(|(timestamp_ms, bits)| Sample {
                timestamp_ms,
                value: f64::from_bits(bits),
            })
            .collect(),
    }
}

/// A leaf's answer: per split, its matching series with samples as (timestamp, value bits).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SelectResponse {
    /// One entry per split of the request.
    pub splits: Vec<SplitSeries>,
}

/// A series between nodes: its labels, and its samples as (timestamp ms, IEEE bits of the
/// value) so that NaN payloads (staleness markers) cross unchanged.
pub type WireSeries = (Vec<(String, String)>, Vec<(i64, u64)>);

/// The matching series of one split.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SplitSeries {
    /// The split.
    pub split_id: String,
    /// Series: labels and samples as (timestamp ms, IEEE bits of the value).
    pub series: Vec<WireSeries>,
    /// Row groups of the split.
    pub row_groups: u64,
    /// Row groups read.
    pub row_groups_read: u64,
}

fn op_name(op: MatchOp) -> &'static str {
    match op {
        MatchOp::Equal => "=",
        MatchOp::NotEqual => "!=",
        MatchOp::Regex => "=~",
        MatchOp::NotRegex => "!~",
    }
}

/// The matchers of a request, built again (regexes compiled) on the leaf.
pub fn request_matchers(request: &SelectRequest) -> Result<Vec<Matcher>, String> {
    wire_matchers(&request.matchers)
}

fn to_wire_matchers(matchers: &[Matcher]) -> Vec<(String, String, String)> {
    matchers
        .iter()
        .map(|m| (m.name.clone(), op_name(m.op).to_string(), m.value.clone()))
        .collect()
}

/// Matchers sent as (label, operator, value), built again (regexes compiled).
fn wire_matchers(matchers: &[(String, String, String)]) -> Result<Vec<Matcher>, String> {
    matchers
        .iter()
        .map(|(name, op, value)| {
            let op = match op.as_str() {
                "=" => MatchOp::Equal,
                "!=" => MatchOp::NotEqual,
                "=~" => MatchOp::Regex,
                "!~" => MatchOp::NotRegex,
                other => return Err(format!("unknown matcher operator `{other}`")),
            };
            Matcher::new(name, op, value).map_err(|err| err.to_string())
        })
        .collect()
}

/// Reads `splits` from `storage` for `matchers` over the window (the leaf's side): each
/// split's series as they cross to the node that asked.
pub async fn read_splits(
    storage: &StorageRef,
    splits: &[SplitMetadata],
    matchers: &[Matcher],
    start_ms: i64,
    end_ms: i64,
    prune: bool,
) -> Result<Vec<SplitSeries>, String> {
    let reads = futures::future::try_join_all(
        splits
            .iter()
            .map(|split| read_one(storage, split, matchers, start_ms, end_ms, prune)),
    )
    .await?;
    Ok(splits
        .iter()
        .zip(reads)
        .map(|(split, read)| SplitSeries {
            split_id: split.split_id.clone(),
            row_groups: read.row_groups,
            row_groups_read: read.row_groups_read,
            series: read.series.iter().map(to_wire).collect(),
        })
        .collect())
}

/// One split's matching series, decoded (read here, or received from a leaf).
struct SplitRead {
    /// Row groups of the split.
    row_groups: u64,
    /// Row groups read.
    row_groups_read: u64,
    /// The matching series.
    series: Vec<SeriesSamples>,
}

impl From<SplitSeries> for SplitRead {
    fn from(wire: SplitSeries) -> Self {
        SplitRead {
            row_groups: wire.row_groups,
            row_groups_read: wire.row_groups_read,
            series: wire.series.into_iter().map(from_wire).collect(),
        }
    }
}

/// One split's matching series, read by byte ranges (the footer once per node, then the
/// bloom filters and pages the read needs) and decoded on the blocking pool, so that a
/// query's splits decode in parallel and off the async workers.
async fn read_one(
    storage: &StorageRef,
    split: &SplitMetadata,
    matchers: &[Matcher],
    start_ms: i64,
    end_ms: i64,
    prune: bool,
) -> Result<SplitRead, String> {
    let matchers = matchers.to_vec();
    let key = split.split_id.clone();
    let fetch = shale_storage::blocking_range_fetcher(storage.clone(), split.object_key());
    let reader = shale_metrics::RangeReader::new(split.size_bytes, fetch);
    let runtime = tokio::runtime::Handle::current();
    // On the blocking pool: the decoding, and on a local storage the reads of the file too.
    let read = tokio::task::spawn_blocking(move || {
        runtime.block_on(shale_metrics::read_split_ranges(
            &key, reader, &matchers, start_ms, end_ms, prune,
        ))
    })
    .await
    .map_err(|err| format!("reading a split failed: {err}"))?
    .map_err(|err| format!("split {}: {err}", split.split_id))?;
    Ok(SplitRead {
        row_groups: read.stats.row_groups as u64,
        row_groups_read: read.stats.row_groups_read as u64,
        series: read.series,
    })
}

impl SplitSource {
    /// A source over the splits of `index_uid` in `storage`.
    pub fn new(metastore: Arc<dyn Metastore>, storage: StorageRef, index_uid: IndexUid) -> Self {
        SplitSource {
            metastore,
            storage,
            index_uid,
            opened: Mutex::new(std::collections::HashSet::new()),
            stats: Mutex::new(SourceStats::default()),
            leaves: None,
            deletes: tokio::sync::OnceCell::new(),
            prune: true,
            as_of: None,
            view: None,
            live: None,
        }
    }

    /// Also reads the samples not yet in published splits: `live` (this node's) and, on a
    /// cluster, those of the other live indexers.
    pub fn with_live(mut self, live: Arc<shale_ingest::LiveSamples>) -> Self {
        self.live = Some(live);
        self
    }

    /// Lists splits and delete tasks from `view` (the index as it is now) rather than from
    /// the metastore, unless the query travels in time.
    pub fn with_view(mut self, view: Arc<shale_search::IndexView>) -> Self {
        self.view = Some(view);
        self
    }

    /// The view to list from: set, and no time travel.
    fn current_view(&self) -> Option<&shale_search::IndexView> {
        self.view.as_deref().filter(|_| self.as_of.is_none())
    }

    /// Reads the index as it was at `as_of` (Unix seconds, checked against its time-travel
    /// window by the caller).
    pub fn as_of(mut self, as_of: Option<i64>) -> Self {
        self.as_of = as_of;
        self
    }

    /// Reads every split of a selector's window, every row group (for checking pruning).
    pub fn without_pruning(mut self) -> Self {
        self.prune = false;
        self
    }

    /// Reads splits placed on other live searchers there.
    pub fn with_leaves(mut self, leaves: Leaves) -> Self {
        self.leaves = Some(leaves);
        self
    }

    /// The splits of `splits` to read on each other node (by node address), rendezvous
    /// placement over the live searchers; the rest is read here.
    fn placement(&self, splits: &[SplitMetadata]) -> (Vec<usize>, HashMap<String, Vec<usize>>) {
        let mut remote: HashMap<String, Vec<usize>> = HashMap::new();
        let Some(leaves) = &self.leaves else {
            return ((0..splits.len()).collect(), remote);
        };
        let view = leaves.membership.view();
        let me = view.self_identity.node_id.clone();
        let mut searchers: Vec<String> = view
            .live_with_role(shale_config::Role::Searcher)
            .map(|n| n.node_id.clone())
            .collect();
        searchers.sort();
        let mut local = Vec::new();
        for (i, split) in splits.iter().enumerate() {
            let first = shale_cluster::placement::rendezvous_order(&split.split_id, &searchers)
                .first()
                .map(|&n| searchers[n].clone());
            match first
                .filter(|node| *node != me)
                .and_then(|node| view.node(&node).cloned())
            {
                Some(node) => remote.entry(node.advertise_address).or_default().push(i),
                None => local.push(i),
            }
        }
        (local, remote)
    }

    /// Asks the leaf at `address` to read its splits.
    async fn call_leaf(
        &self,
        address: &str,
        request: &SelectRequest,
    ) -> Result<SelectResponse, String> {
        let Some(leaves) = &self.leaves else {
            return Err("no cluster".to_string());
        };
        let body = serde_json::to_vec(request).map_err(|err| err.to_string())?;
        let value = leaves
            .client
            .post(
                address,
                "/internal/v1/metrics/select",
                body.into(),
                std::time::Duration::from_secs(60),
                true,
            )
            .await
            .map_err(|err| err.to_string())?;
        serde_json::from_value(value).map_err(|err| err.to_string())
    }

    /// Reads one split here.
    async fn read_here(
        &self,
        split: &SplitMetadata,
        matchers: &[Matcher],
        start_ms: i64,
        end_ms: i64,
    ) -> Result<SplitRead, PromqlError> {
        let first = self
            .opened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(split.split_id.clone());
        if first {
            self.stats
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .splits_opened += 1;
        }
        read_one(&self.storage, split, matchers, start_ms, end_ms, self.prune)
            .await
            .map_err(PromqlError::Source)
    }

    /// The index's delete tasks: a split's samples they remove are left out of every answer
    /// until delete compaction has purged them.
    async fn deletes(&self) -> Result<&[shale_metrics::SeriesDelete], PromqlError> {
        let deletes = self
            .deletes
            .get_or_try_init(|| async {
                let tasks = match self.current_view() {
                    Some(view) => view.delete_tasks().to_vec(),
                    None => self
                        .metastore
                        .list_delete_tasks(&self.index_uid, 0)
                        .await
                        .map_err(|err| {
                            PromqlError::Source(format!("listing delete tasks: {err}"))
                        })?,
                };
                tasks
                    .iter()
                    .filter(|task| self.as_of.is_none_or(|at| task.create_timestamp <= at))
                    .map(|task| {
                        shale_metrics::SeriesDelete::from_task(task).map_err(|err| {
                            PromqlError::Source(format!(
                                "delete task {} of the index: {err}",
                                task.opstamp
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .await?;
        Ok(deletes)
    }

    /// The matching samples acknowledged after the view's checkpoint: this node's, then
    /// each other live indexer's (one that does not answer is left out, with a warning).
    async fn live_series(
        &self,
        matchers: &[Matcher],
        start_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<SeriesSamples>, PromqlError> {
        let (Some(live), Some(view)) = (&self.live, self.current_view()) else {
            return Ok(Vec::new());
        };
        let checkpoint = view
            .index()
            .checkpoint(shale_types::INGEST_API_SOURCE_ID)
            .clone();
        let deletes = self.deletes().await?;
        let mut series = live
            .select(
                &self.index_uid.to_string(),
                &checkpoint,
                matchers,
                start_ms,
                end_ms,
                deletes,
            )
            .map_err(|err| PromqlError::Unavailable(err.to_string()))?;
        if let Some(leaves) = &self.leaves {
            let cluster = leaves.membership.view();
            let me = cluster.self_identity.node_id.clone();
            let mut indexers: Vec<(String, String)> = cluster
                .live_with_role(shale_config::Role::Indexer)
                .filter(|node| node.node_id != me)
                .map(|node| (node.node_id.clone(), node.advertise_address.clone()))
                .collect();
            indexers.sort();
            let body = serde_json::to_vec(&LiveRequest {
                index_uid: self.index_uid.clone(),
                checkpoint,
                matchers: to_wire_matchers(matchers),
                start_ms,
                end_ms,
                delete_tasks: view.delete_tasks().to_vec(),
            })
            .map_err(|err| PromqlError::Source(err.to_string()))?;
            let calls = indexers.iter().map(|(node, address)| {
                let body = reqwest::Body::from(body.clone());
                async move {
                    let answer = leaves
                        .client
                        .post(
                            address,
                            "/internal/v1/metrics/live",
                            body,
                            LIVE_CALL_TIMEOUT,
                            true,
                        )
                        .await
                        .map_err(|err| match err {
                            // Its samples after the checkpoint are gone: answering without
                            // them would leave a gap.
                            crate::internal::InternalError::Status { status: 503, .. } => {
                                PromqlError::Unavailable(err.to_string())
                            }
                            err => PromqlError::Source(err.to_string()),
                        })
                        .and_then(|value| {
                            serde_json::from_value::<LiveResponse>(value)
                                .map_err(|err| PromqlError::Source(err.to_string()))
                        });
                    (node, answer)
                }
            });
            for (node, answer) in futures::future::join_all(calls).await {
                self.stats
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .live_calls += 1;
                match answer {
                    Ok(response) => series.extend(response.series.into_iter().map(from_wire)),
                    Err(err @ PromqlError::Unavailable(_)) => return Err(err),
                    Err(err) => tracing::warn!(
                        indexer = %node,
                        %err,
                        "an indexer did not answer with its unpublished samples: they are left out"
                    ),
                }
            }
        }
        self.stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .live_samples += series.iter().map(|s| s.samples.len() as u64).sum::<u64>();
        Ok(series)
    }

    /// What the selectors did so far.
    pub fn stats(&self) -> SourceStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait::async_trait]
impl SeriesSource for SplitSource {
    async fn select(
        &self,
        matchers: &[Matcher],
        start_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<SeriesSamples>, PromqlError> {
        let (start_s, end_s) = (
            start_ms.div_euclid(1000),
            end_ms.div_euclid(1000).saturating_add(1),
        );
        let listed: Vec<SplitMetadata> = match self.current_view() {
            Some(view) => view.splits_overlapping(Some(start_s), Some(end_s)),
            None => {
                let mut query = ListSplitsQuery::for_index(self.index_uid.clone())
                    .with_states(&[SplitState::Published]);
                query.visible_at = self.as_of;
                query.time_range_start = Some(start_s);
                query.time_range_end = Some(end_s);
                self.metastore
                    .list_splits(query)
                    .await
                    .map_err(|err| PromqlError::Source(format!("listing splits: {err}")))?
                    .into_iter()
                    .map(|split| split.split_metadata)
                    .collect()
            }
        };
        let mut splits: Vec<SplitMetadata> = listed
            .into_iter()
            .filter(|split| split.format == shale_types::SplitFormat::Parquet)
            .collect();
        // Oldest first: a later split's sample replaces an earlier one's at one timestamp.
        splits.sort_by(|a, b| a.split_id.cmp(&b.split_id));
        let listed = splits.len() as u64;
        if self.prune {
            splits.retain(|split| shale_metrics::split_may_hold(split, matchers));
        }
        {
            let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            stats.splits_listed += listed;
            stats.splits_pruned += listed - splits.len() as u64;
        }
        // Each split's series: read on the leaf it is placed on, else here.
        let mut results: Vec<Option<SplitRead>> = (0..splits.len()).map(|_| None).collect();
        let (local, remote) = self.placement(&splits);
        let calls = remote.into_iter().map(|(address, indexes)| {
            let request = SelectRequest {
                index_uid: self.index_uid.clone(),
                splits: indexes.iter().map(|&i| splits[i].clone()).collect(),
                matchers: to_wire_matchers(matchers),
                start_ms,
                end_ms,
                prune: self.prune,
            };
            async move {
                let answer = self.call_leaf(&address, &request).await;
                (address, indexes, answer)
            }
        });
        for (address, indexes, answer) in futures::future::join_all(calls).await {
            match answer {
                Ok(response) if response.splits.len() == indexes.len() => {
                    {
                        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
                        stats.splits_opened += indexes.len() as u64;
                        stats.leaf_calls += 1;
                    }
                    for (i, series) in indexes.into_iter().zip(response.splits) {
                        results[i] = Some(series.into());
                    }
                }
                Ok(_) | Err(_) => {
                    tracing::warn!(leaf = %address, "a leaf did not read its metrics splits: reading them here");
                    for i in indexes {
                        results[i] = Some(
                            self.read_here(&splits[i], matchers, start_ms, end_ms)
                                .await?,
                        );
                    }
                }
            }
        }
        // This node's share, read concurrently.
        let reads = futures::future::try_join_all(
            local
                .iter()
                .map(|&i| self.read_here(&splits[i], matchers, start_ms, end_ms)),
        )
        .await?;
        for (i, read) in local.into_iter().zip(reads) {
            results[i] = Some(read);
        }
        let deletes = self.deletes().await?;
        let mut merged: HashMap<Labels, Vec<Sample>> = HashMap::new();
        let mut order: Vec<Labels> = Vec::new();
        // In split order (oldest first): the later split's sample stays last.
        for (split, read) in splits.iter().zip(results) {
            let Some(read) = read else {
                continue;
            };
            // The delete tasks this split is not clean of yet.
            let pending: Vec<&shale_metrics::SeriesDelete> = deletes
                .iter()
                .filter(|d| d.opstamp > split.delete_opstamp)
                .collect();
            {
                let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
                stats.row_groups_read += read.row_groups_read;
                stats.row_groups_pruned += read.row_groups - read.row_groups_read;
            }
            for SeriesSamples {
                labels,
                mut samples,
            } in read.series
            {
                if !pending.is_empty() {
                    shale_metrics::apply_deletes(&pending, &labels, &mut samples);
                    if samples.is_empty() {
                        continue;
                    }
                }
                let samples = samples.into_iter();
                match merged.get_mut(&labels) {
                    Some(existing) => existing.extend(samples),
                    None => {
                        order.push(labels.clone());
                        merged.insert(labels, samples.collect());
                    }
                }
            }
        }
        // The samples not in published splits yet, as the newest split.
        for series in self.live_series(matchers, start_ms, end_ms).await? {
            match merged.get_mut(&series.labels) {
                Some(existing) => existing.extend(series.samples),
                None => {
                    order.push(series.labels.clone());
                    merged.insert(series.labels, series.samples);
                }
            }
        }
        let mut out = Vec::with_capacity(order.len());
        for labels in order {
            let Some(samples) = merged.remove(&labels) else {
                continue;
            };
            // Among samples of one timestamp the later split's (or memory's) is kept.
            out.push(SeriesSamples {
                labels,
                samples: shale_metrics::last_per_timestamp(samples),
            });
        }
        Ok(out)
    }
}

/// The label names of `series`, sorted.
pub fn label_names(series: &[SeriesSamples]) -> BTreeSet<String> {
    series
        .iter()
        .flat_map(|s| s.labels.iter().map(|(name, _)| name.to_string()))
        .collect()
}
