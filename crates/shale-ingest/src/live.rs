//! The samples of metrics shards that are acknowledged but not yet in a published split,
//! kept in memory so that PromQL answers with a sample as soon as its write is acknowledged,
//! whatever the index's commit timeout.
//!
//! Each entry is a WAL record of a metrics shard, known by its position. The router adds a
//! record when it is appended (before the write is acknowledged), and again — idempotently —
//! when a shard is served from its WAL at start. A reader passes the checkpoint of the index
//! as it listed its splits, and gets only the samples of records after it in each shard: a
//! record is either in a listed split or read here, never both, never neither.
//!
//! When a pipeline publishes through a position, the records up to it are kept for
//! [`RETAIN_AFTER_PUBLISH`] more (a reader that listed splits just before the publish still
//! finds them here), then dropped (checked at every insert, publish and `stats`). A reader whose checkpoint is older than what was dropped
//! gets [`LiveError::Stale`] instead of an answer with a gap.
//!
//! Memory is bounded by the node's `live_samples_max_bytes`: a record that would pass it is
//! not kept (it becomes visible when its split is published, and the shard is asked to cut
//! its batch early); published records waiting out their retention go first.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use shale_metrics::{Labels, Matcher, Sample, SeriesDelete, SeriesSamples, METRIC_NAME_LABEL};
use shale_types::SourceCheckpoint;

/// How long the records of a publish stay readable after it.
pub const RETAIN_AFTER_PUBLISH: Duration = Duration::from_secs(30);

/// Estimated bytes of one kept sample (position, timestamp, value).
const SAMPLE_BYTES: usize = 24;
/// Estimated bytes of a kept series beside its label strings.
const SERIES_BYTES: usize = 96;
/// Estimated bytes of one label pair beside its strings.
const PAIR_BYTES: usize = 48;
/// Estimated bytes of a kept record's entry.
const RECORD_BYTES: usize = 48;

/// Why a read of the in-memory samples cannot answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LiveError {
    /// The reader's checkpoint predates records already dropped from memory: it listed its
    /// splits before a publish more than [`RETAIN_AFTER_PUBLISH`] ago.
    #[error(
        "shard {queue} no longer holds the samples after position {checkpoint:?} (published \
         and dropped through {dropped}): the query's view of the index is too old; retry"
    )]
    Stale {
        /// The shard.
        queue: String,
        /// The reader's checkpoint of it.
        checkpoint: Option<u64>,
        /// Dropped through this position.
        dropped: u64,
    },
}

/// What the in-memory samples hold, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveStats {
    /// Estimated bytes.
    pub bytes: usize,
    /// Records (WAL positions) held.
    pub records: usize,
    /// Samples held.
    pub samples: usize,
    /// Series held (counted once per shard).
    pub series: usize,
}

/// The node's in-memory samples, by index and shard.
pub struct LiveSamples {
    max_bytes: usize,
    bytes: AtomicUsize,
    /// Index uid → its shards.
    indexes: RwLock<HashMap<String, Shards>>,
}

/// Queue → shard.
type Shards = HashMap<String, Arc<Mutex<ShardLive>>>;

/// One shard's records.
#[derive(Default)]
struct ShardLive {
    /// Position → the delete opstamp its record was acknowledged with.
    records: BTreeMap<u64, u64>,
    /// Series id → the series and its samples.
    series: HashMap<u64, SeriesLive>,
    /// Metric name → the ids of its series.
    names: HashMap<String, HashSet<u64>>,
    /// Published through this position.
    published: Option<u64>,
    /// Publishes whose records are still kept: (when, through), oldest first.
    retiring: VecDeque<(Instant, u64)>,
    /// Records through this position were dropped.
    dropped: Option<u64>,
    bytes: usize,
    samples: usize,
}

/// A series of a shard and its samples with their record's position, by position.
struct SeriesLive {
    labels: Labels,
    samples: Vec<(u64, Sample)>,
}

/// A series of a decoded record: one the shard holds (by id), or new.
enum SeriesKey {
    Held(u64),
    New(Labels),
}

/// A record decoded for a shard: its series and, in one vector, their samples.
#[derive(Default)]
struct Decoded {
    series: Vec<(SeriesKey, std::ops::Range<usize>)>,
    samples: Vec<Sample>,
}

impl Decoded {
    /// The record `bytes` decoded against `shard` (series it holds are not built again);
    /// `None` if it does not decode.
    fn of(shard: &ShardLive, bytes: &[u8]) -> Option<Decoded> {
        let mut decoded = Decoded::default();
        shale_metrics::wal::visit_record(bytes, |pairs, samples| {
            let id = Labels::series_id_of(pairs);
            let key = match shard.series.get(&id) {
                Some(held) if held.labels.same_pairs(pairs) => SeriesKey::Held(id),
                _ => SeriesKey::New(Labels::new(
                    pairs
                        .iter()
                        .map(|(name, value)| (name.to_string(), value.to_string())),
                )),
            };
            decoded.push(shard, key, samples);
        })
        .ok()?;
        Some(decoded)
    }

    fn push(&mut self, shard: &ShardLive, key: SeriesKey, samples: &[Sample]) {
        if samples.is_empty() {
            return;
        }
        let key = match key {
            SeriesKey::New(labels) => match shard.series.get(&labels.series_id()) {
                Some(held) if held.labels == labels => SeriesKey::Held(labels.series_id()),
                _ => SeriesKey::New(labels),
            },
            held => held,
        };
        let at = self.samples.len();
        self.samples.extend_from_slice(samples);
        self.series.push((key, at..self.samples.len()));
    }

    /// What keeping it costs.
    fn bytes(&self) -> usize {
        RECORD_BYTES
            + self.samples.len() * SAMPLE_BYTES
            + self
                .series
                .iter()
                .map(|(key, _)| match key {
                    SeriesKey::Held(_) => 0,
                    SeriesKey::New(labels) => labels_bytes(labels),
                })
                .sum::<usize>()
    }
}

impl LiveSamples {
    /// Keeps up to `max_bytes` (0: nothing is kept; samples are visible once published).
    pub fn new(max_bytes: u64) -> Self {
        LiveSamples {
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            bytes: AtomicUsize::new(0),
            indexes: RwLock::new(HashMap::new()),
        }
    }

    /// Whether samples are kept at all.
    pub fn enabled(&self) -> bool {
        self.max_bytes > 0
    }

    /// Starts keeping the records of shard `queue` of `index_uid` published after
    /// `published`.
    pub fn serve(&self, index_uid: &str, queue: &str, published: Option<u64>) {
        if !self.enabled() {
            return;
        }
        let mut indexes = self.indexes.write().unwrap_or_else(|p| p.into_inner());
        let shard = indexes
            .entry(index_uid.to_string())
            .or_default()
            .entry(queue.to_string())
            .or_default();
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        if shard.published < published {
            shard.published = published;
            if let Some(through) = published {
                let freed = shard.drop_through(through);
                self.bytes.fetch_sub(freed, Ordering::AcqRel);
            }
        }
    }

    /// Forgets shard `queue` of `index_uid` (dropped, or its index deleted).
    pub fn forget(&self, index_uid: &str, queue: &str) {
        let mut indexes = self.indexes.write().unwrap_or_else(|p| p.into_inner());
        let Some(shards) = indexes.get_mut(index_uid) else {
            return;
        };
        if let Some(shard) = shards.remove(queue) {
            let bytes = shard.lock().unwrap_or_else(|p| p.into_inner()).bytes;
            self.bytes.fetch_sub(bytes, Ordering::AcqRel);
        }
        if shards.is_empty() {
            indexes.remove(index_uid);
        }
    }

    fn shard(&self, index_uid: &str, queue: &str) -> Option<Arc<Mutex<ShardLive>>> {
        self.indexes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(index_uid)?
            .get(queue)
            .cloned()
    }

    /// Keeps the record at `position` of a served shard: its series, acknowledged with the
    /// delete opstamp `opstamp`. False when it is not kept because memory is short (the
    /// caller should have the shard cut its batch); true when kept, or when there is nothing
    /// to keep (already held, already published, shard not served, keeping off). The
    /// product keeps encoded records ([`LiveSamples::insert_encoded`]); tests compare both.
    #[cfg(test)]
    fn insert(
        &self,
        index_uid: &str,
        queue: &str,
        position: u64,
        opstamp: u64,
        series: Vec<(Labels, Vec<Sample>)>,
    ) -> bool {
        let Some(shard) = self.shard(index_uid, queue) else {
            return true;
        };
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        let mut record = Decoded::default();
        for (labels, samples) in series {
            record.push(&shard, SeriesKey::New(labels), &samples);
        }
        self.keep(&mut shard, position, opstamp, record)
    }

    /// Keeps the encoded metrics records `records` ([`shale_metrics::wal`]) appended to a
    /// served shard from `first` on, acknowledged with the delete opstamp `opstamp` (a record
    /// that does not decode is left to the pipeline's dead letters). A series the shard
    /// holds already costs no allocation. False when one was not kept for lack of memory.
    pub fn insert_encoded(
        &self,
        index_uid: &str,
        queue: &str,
        first: u64,
        opstamp: u64,
        records: &[impl AsRef<[u8]>],
    ) -> bool {
        let Some(shard) = self.shard(index_uid, queue) else {
            return true;
        };
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        let mut all_kept = true;
        for (position, record) in (first..).zip(records) {
            if let Some(decoded) = Decoded::of(&shard, record.as_ref()) {
                all_kept &= self.keep(&mut shard, position, opstamp, decoded);
            }
        }
        all_kept
    }

    /// Keeps a decoded record in `shard` if it is new and memory allows.
    fn keep(&self, shard: &mut ShardLive, position: u64, opstamp: u64, record: Decoded) -> bool {
        let freed = shard.retire_due(Instant::now());
        self.bytes.fetch_sub(freed, Ordering::AcqRel);
        if shard.published.is_some_and(|p| position <= p) || shard.records.contains_key(&position) {
            return true;
        }
        let needed = record.bytes();
        if self.bytes.load(Ordering::Acquire) + needed > self.max_bytes {
            // Published records waiting out their retention go first.
            if let Some(through) = shard.published {
                let freed = shard.drop_through(through);
                shard.retiring.clear();
                self.bytes.fetch_sub(freed, Ordering::AcqRel);
            }
            if self.bytes.load(Ordering::Acquire) + needed > self.max_bytes {
                crate::metrics::LIVE_SAMPLES_NOT_KEPT.inc_by(record.samples.len() as u64);
                return false;
            }
        }
        let added = shard.add(position, opstamp, record);
        self.bytes.fetch_add(added, Ordering::AcqRel);
        true
    }

    /// Keeps what the WAL queue of a served shard holds from `from` on (a shard served at
    /// start: its acknowledged records not yet published), in batches off the async workers.
    pub(crate) async fn load_from_wal(
        self: Arc<Self>,
        wal: Arc<crate::Wal>,
        index_uid: String,
        queue: String,
        mut from: u64,
    ) -> Result<(), crate::WalError> {
        const BATCH_RECORDS: usize = 256;
        const BATCH_BYTES: usize = 64 << 20;
        loop {
            if self.shard(&index_uid, &queue).is_none() {
                return Ok(()); // forgotten meanwhile
            }
            let records = wal.read(&queue, from, BATCH_RECORDS, BATCH_BYTES).await?;
            let Some(&(last, _)) = records.last() else {
                return Ok(());
            };
            from = last + 1;
            let live = self.clone();
            let (index_uid, queue) = (index_uid.clone(), queue.clone());
            let loaded = tokio::task::spawn_blocking(move || {
                records.iter().all(|(position, record)| {
                    let record = crate::opstamps::decode_record(record);
                    live.insert_encoded(
                        &index_uid,
                        &queue,
                        *position,
                        record.opstamp,
                        &[record.json],
                    )
                })
            })
            .await;
            if !matches!(loaded, Ok(true)) {
                return Ok(()); // memory is short: the rest becomes visible when published
            }
        }
    }

    /// Shard `queue` published its records through `through`: they are dropped once
    /// [`RETAIN_AFTER_PUBLISH`] has passed (checked at every publish).
    pub fn published(&self, index_uid: &str, queue: &str, through: u64) {
        let Some(shard) = self.shard(index_uid, queue) else {
            return;
        };
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        shard.published = shard.published.max(Some(through));
        shard.retiring.push_back((now, through));
        let freed = shard.retire_due(now);
        self.bytes.fetch_sub(freed, Ordering::AcqRel);
    }

    /// The samples of `index_uid` in `[start_ms, end_ms]` of the series `matchers` select,
    /// from the records after `checkpoint` in each shard, without those `deletes` remove
    /// (a delete applies to records acknowledged before it). Series sorted by labels; per
    /// series, by timestamp, one sample per timestamp (the later record's).
    pub fn select(
        &self,
        index_uid: &str,
        checkpoint: &SourceCheckpoint,
        matchers: &[Matcher],
        start_ms: i64,
        end_ms: i64,
        deletes: &[SeriesDelete],
    ) -> Result<Vec<SeriesSamples>, LiveError> {
        let shards: Vec<(String, Arc<Mutex<ShardLive>>)> = {
            let indexes = self.indexes.read().unwrap_or_else(|p| p.into_inner());
            let Some(shards) = indexes.get(index_uid) else {
                return Ok(Vec::new());
            };
            let mut shards: Vec<_> = shards.iter().map(|(q, s)| (q.clone(), s.clone())).collect();
            shards.sort_by(|a, b| a.0.cmp(&b.0));
            shards
        };
        let mut merged: HashMap<Labels, Vec<Sample>> = HashMap::new();
        let mut order: Vec<Labels> = Vec::new();
        for (queue, shard) in shards {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let after = checkpoint.position(&queue);
            if let Some(dropped) = shard.dropped.filter(|&d| after.is_none_or(|a| a < d)) {
                return Err(LiveError::Stale {
                    queue,
                    checkpoint: after,
                    dropped,
                });
            }
            shard.select(
                after,
                matchers,
                start_ms,
                end_ms,
                deletes,
                |labels, samples| match merged.get_mut(labels) {
                    Some(existing) => existing.extend(samples),
                    None => {
                        order.push(labels.clone());
                        merged.insert(labels.clone(), samples.collect());
                    }
                },
            );
        }
        order.sort();
        Ok(order
            .into_iter()
            .filter_map(|labels| {
                let samples = merged.remove(&labels)?;
                Some(SeriesSamples {
                    labels,
                    samples: shale_metrics::last_per_timestamp(samples),
                })
            })
            .collect())
    }

    /// What is held now (after letting go of what is due).
    pub fn stats(&self) -> LiveStats {
        let indexes = self.indexes.read().unwrap_or_else(|p| p.into_inner());
        let mut stats = LiveStats::default();
        let now = Instant::now();
        for shard in indexes.values().flat_map(HashMap::values) {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let freed = shard.retire_due(now);
            self.bytes.fetch_sub(freed, Ordering::AcqRel);
            stats.bytes += shard.bytes;
            stats.records += shard.records.len();
            stats.samples += shard.samples;
            stats.series += shard.series.len();
        }
        stats
    }
}

fn labels_bytes(labels: &Labels) -> usize {
    SERIES_BYTES
        + labels
            .iter()
            .map(|(n, v)| n.len() + v.len() + PAIR_BYTES)
            .sum::<usize>()
}

impl ShardLive {
    /// Adds a decoded record; returns the bytes added.
    fn add(&mut self, position: u64, opstamp: u64, record: Decoded) -> usize {
        let mut added = RECORD_BYTES;
        self.records.insert(position, opstamp);
        for (key, range) in record.series {
            let samples = &record.samples[range];
            let kept = match key {
                SeriesKey::Held(id) => match self.series.get_mut(&id) {
                    Some(held) => &mut held.samples,
                    None => continue,
                },
                SeriesKey::New(labels) => {
                    let id = labels.series_id();
                    match self.series.get(&id) {
                        // Another series with this id (a 2⁻⁶⁴ collision): not kept, so never
                        // mixed with it; visible once published.
                        Some(held) if held.labels != labels => continue,
                        // Twice in one record.
                        Some(_) => {}
                        None => {
                            added += labels_bytes(&labels);
                            match self.names.get_mut(labels.metric_name()) {
                                Some(ids) => {
                                    ids.insert(id);
                                }
                                None => {
                                    let name = labels.metric_name().to_string();
                                    self.names.insert(name, HashSet::from([id]));
                                }
                            }
                            self.series.insert(
                                id,
                                SeriesLive {
                                    labels,
                                    samples: Vec::new(),
                                },
                            );
                        }
                    }
                    match self.series.get_mut(&id) {
                        Some(held) => &mut held.samples,
                        None => continue,
                    }
                }
            };
            added += samples.len() * SAMPLE_BYTES;
            self.samples += samples.len();
            // Records arrive in position order but for concurrent appends and a rebuild
            // from the WAL: keep each series by position.
            let at = kept.partition_point(|&(p, _)| p <= position);
            let with_position = samples.iter().map(|&s| (position, s));
            if at == kept.len() {
                kept.extend(with_position);
            } else {
                kept.splice(at..at, with_position);
            }
        }
        self.bytes += added;
        added
    }

    /// Drops the records of the publishes whose retention is over at `now`; returns the
    /// bytes freed.
    fn retire_due(&mut self, now: Instant) -> usize {
        let mut due = None;
        while let Some(&(at, through)) = self.retiring.front() {
            if now.duration_since(at) < RETAIN_AFTER_PUBLISH {
                break;
            }
            due = Some(through);
            self.retiring.pop_front();
        }
        due.map_or(0, |through| self.drop_through(through))
    }

    /// Drops the records through `through`; returns the bytes freed.
    fn drop_through(&mut self, through: u64) -> usize {
        if self
            .records
            .first_key_value()
            .is_none_or(|(&p, _)| p > through)
        {
            self.dropped = self.dropped.max(Some(through));
            return 0;
        }
        let dropped_records = match through.checked_add(1) {
            Some(next) => {
                let kept = self.records.split_off(&next);
                std::mem::replace(&mut self.records, kept)
            }
            None => std::mem::take(&mut self.records),
        };
        let mut freed = dropped_records.len() * RECORD_BYTES;
        let mut samples = 0;
        let mut gone_series = Vec::new();
        for (id, held) in self.series.iter_mut() {
            let gone = held.samples.partition_point(|&(p, _)| p <= through);
            if gone > 0 {
                held.samples.drain(..gone);
                samples += gone;
                freed += gone * SAMPLE_BYTES;
            }
            if held.samples.is_empty() {
                gone_series.push(*id);
            }
        }
        for id in gone_series {
            if let Some(held) = self.series.remove(&id) {
                freed += labels_bytes(&held.labels);
                let name = held.labels.metric_name();
                if let Some(ids) = self.names.get_mut(name) {
                    ids.remove(&id);
                    if ids.is_empty() {
                        self.names.remove(name);
                    }
                }
            }
        }
        self.samples -= samples;
        self.bytes = self.bytes.saturating_sub(freed);
        self.dropped = self.dropped.max(Some(through));
        freed
    }

    /// Calls `found` with each matching series and its samples after `after` in the window.
    fn select(
        &self,
        after: Option<u64>,
        matchers: &[Matcher],
        start_ms: i64,
        end_ms: i64,
        deletes: &[SeriesDelete],
        mut found: impl FnMut(&Labels, &mut dyn Iterator<Item = Sample>),
    ) {
        let name_matchers: Vec<&Matcher> = matchers
            .iter()
            .filter(|m| m.name == METRIC_NAME_LABEL)
            .collect();
        let exact_name = name_matchers.iter().find_map(|m| m.required_value());
        let names: Vec<&HashSet<u64>> = match exact_name {
            Some(name) => self.names.get(name).into_iter().collect(),
            None => self
                .names
                .iter()
                .filter(|(name, _)| name_matchers.iter().all(|m| m.matches_value(name)))
                .map(|(_, ids)| ids)
                .collect(),
        };
        for held in names
            .into_iter()
            .flatten()
            .filter_map(|id| self.series.get(id))
        {
            let (labels, kept) = (&held.labels, &held.samples);
            if !matchers.iter().all(|m| m.matches(labels)) {
                continue;
            }
            let from = after.map_or(0, |a| kept.partition_point(|&(p, _)| p <= a));
            let applying: Vec<&SeriesDelete> = deletes
                .iter()
                .filter(|d| d.matches_series(labels))
                .collect();
            let mut samples = kept[from..]
                .iter()
                .filter(|(_, s)| start_ms <= s.timestamp_ms && s.timestamp_ms <= end_ms)
                .filter(|(position, s)| {
                    applying.is_empty() || {
                        let opstamp = self.records.get(position).copied().unwrap_or(0);
                        !applying
                            .iter()
                            .any(|d| d.opstamp > opstamp && d.covers(s.timestamp_ms))
                    }
                })
                .map(|(_, s)| *s)
                .peekable();
            if samples.peek().is_some() {
                found(labels, &mut samples);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shale_metrics::MatchOp;

    fn series(name: &str, job: &str, samples: &[(i64, f64)]) -> (Labels, Vec<Sample>) {
        (
            Labels::new([
                ("__name__".to_string(), name.to_string()),
                ("job".to_string(), job.to_string()),
            ]),
            samples
                .iter()
                .map(|&(timestamp_ms, value)| Sample {
                    timestamp_ms,
                    value,
                })
                .collect(),
        )
    }

    fn checkpoint(queue: &str, position: Option<u64>) -> SourceCheckpoint {
        let mut checkpoint = SourceCheckpoint::default();
        if let Some(position) = position {
            checkpoint.per_partition.insert(queue.to_string(), position);
        }
        checkpoint
    }

    fn values(found: &[SeriesSamples]) -> Vec<(String, Vec<(i64, f64)>)> {
        found
            .iter()
            .map(|s| {
                (
                    s.labels.get("job").unwrap_or_default().to_string(),
                    s.samples
                        .iter()
                        .map(|s| (s.timestamp_ms, s.value))
                        .collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_reader_gets_the_records_after_its_checkpoint_once() {
        let live = LiveSamples::new(1 << 20);
        live.serve("idx", "q", None);
        assert!(live.insert("idx", "q", 0, 0, vec![series("up", "a", &[(1000, 1.0)])]));
        assert!(live.insert("idx", "q", 1, 0, vec![series("up", "a", &[(2000, 2.0)])]));
        // Out of order (a rebuild from the WAL), and again (idempotent).
        assert!(live.insert("idx", "q", 2, 0, vec![series("up", "b", &[(1000, 5.0)])]));
        assert!(live.insert("idx", "q", 1, 0, vec![series("up", "a", &[(2000, 2.0)])]));
        let up = [Matcher::equal("__name__", "up")];
        let all = live
            .select("idx", &checkpoint("q", None), &up, 0, 10_000, &[])
            .expect("select");
        assert_eq!(
            values(&all),
            [
                ("a".to_string(), vec![(1000, 1.0), (2000, 2.0)]),
                ("b".to_string(), vec![(1000, 5.0)])
            ]
        );
        // A reader whose splits hold position 0 reads the rest only.
        let after = live
            .select("idx", &checkpoint("q", Some(0)), &up, 0, 10_000, &[])
            .expect("select");
        assert_eq!(
            values(&after),
            [
                ("a".to_string(), vec![(2000, 2.0)]),
                ("b".to_string(), vec![(1000, 5.0)])
            ]
        );
        // Window and matchers.
        let job_b = [
            Matcher::new("job", MatchOp::Regex, "b|c").expect("matcher"),
            Matcher::new("__name__", MatchOp::Regex, "u.").expect("matcher"),
        ];
        let b = live
            .select("idx", &checkpoint("q", None), &job_b, 0, 1000, &[])
            .expect("select");
        assert_eq!(values(&b), [("b".to_string(), vec![(1000, 5.0)])]);
        let stats = live.stats();
        assert_eq!((stats.records, stats.samples, stats.series), (3, 3, 2));
    }

    #[test]
    fn published_records_stay_readable_then_go_and_an_old_reader_is_told() {
        let live = LiveSamples::new(1 << 20);
        live.serve("idx", "q", None);
        live.insert("idx", "q", 0, 0, vec![series("up", "a", &[(1000, 1.0)])]);
        live.insert("idx", "q", 1, 0, vec![series("up", "a", &[(2000, 2.0)])]);
        live.published("idx", "q", 0);
        let up = [Matcher::equal("__name__", "up")];
        // A reader that listed its splits before the publish still gets position 0.
        let before = live
            .select("idx", &checkpoint("q", None), &up, 0, 10_000, &[])
            .expect("select");
        assert_eq!(before[0].samples.len(), 2);
        // Records already published are not taken again.
        assert!(live.insert("idx", "q", 0, 0, vec![series("up", "z", &[(1, 1.0)])]));
        assert_eq!(live.stats().series, 1);
        // Dropped (the retention is over): an older reader is told, a newer one answered.
        let freed = {
            let shard = live.shard("idx", "q").expect("shard");
            let mut shard = shard.lock().expect("lock");
            shard.drop_through(0)
        };
        live.bytes.fetch_sub(freed, Ordering::AcqRel);
        let err = live
            .select("idx", &checkpoint("q", None), &up, 0, 10_000, &[])
            .expect_err("stale");
        assert!(matches!(err, LiveError::Stale { dropped: 0, .. }));
        let after = live
            .select("idx", &checkpoint("q", Some(0)), &up, 0, 10_000, &[])
            .expect("select");
        assert_eq!(values(&after), [("a".to_string(), vec![(2000, 2.0)])]);
        live.forget("idx", "q");
        assert_eq!(live.stats(), LiveStats::default());
        assert_eq!(live.bytes.load(Ordering::Acquire), 0);
    }

    #[test]
    fn the_later_record_wins_a_timestamp_and_deletes_reach_older_records_only() {
        let live = LiveSamples::new(1 << 20);
        live.serve("idx", "q", None);
        live.insert(
            "idx",
            "q",
            0,
            3,
            vec![series("up", "a", &[(1000, 1.0), (2000, 2.0)])],
        );
        live.insert(
            "idx",
            "q",
            1,
            7,
            vec![series("up", "a", &[(1000, 9.0), (3000, 3.0)])],
        );
        let delete = SeriesDelete {
            opstamp: 5,
            sets: vec![vec![Matcher::equal("job", "a")]],
            start_ms: 0,
            end_ms: 10_000,
        };
        let up = [Matcher::equal("__name__", "up")];
        let found = live
            .select("idx", &checkpoint("q", None), &up, 0, 10_000, &[delete])
            .expect("select");
        // Record 0 (opstamp 3) is deleted; record 1 (opstamp 7, after the delete) is not.
        assert_eq!(
            values(&found),
            [("a".to_string(), vec![(1000, 9.0), (3000, 3.0)])]
        );
    }

    #[test]
    fn encoded_records_are_kept_as_decoded_ones_a_series_twice_included() {
        let records: Vec<Vec<u8>> = vec![
            shale_metrics::wal::encode_record(&[
                series("up", "a", &[(1000, 1.0)]),
                series("up", "b", &[(1000, 2.0)]),
                series("up", "a", &[(2000, 3.0)]),
            ]),
            shale_metrics::wal::encode_record(&[series("up", "a", &[(3000, 4.0)])]),
        ];
        let encoded = LiveSamples::new(1 << 20);
        encoded.serve("idx", "q", None);
        assert!(encoded.insert_encoded("idx", "q", 0, 0, &records));
        let decoded = LiveSamples::new(1 << 20);
        decoded.serve("idx", "q", None);
        for (position, record) in records.iter().enumerate() {
            let series = shale_metrics::wal::decode_record(record).expect("a record");
            assert!(decoded.insert("idx", "q", position as u64, 0, series));
        }
        let up = [Matcher::equal("__name__", "up")];
        let read = |live: &LiveSamples| {
            values(
                &live
                    .select("idx", &checkpoint("q", None), &up, 0, 10_000, &[])
                    .expect("select"),
            )
        };
        assert_eq!(read(&encoded), read(&decoded));
        assert_eq!(
            read(&encoded),
            [
                ("a".to_string(), vec![(1000, 1.0), (2000, 3.0), (3000, 4.0)]),
                ("b".to_string(), vec![(1000, 2.0)])
            ]
        );
        assert_eq!(encoded.stats(), decoded.stats());
        assert_eq!(encoded.stats().series, 2);
    }

    #[test]
    fn memory_is_bounded_and_published_records_go_first() {
        let one = series("up", "a", &[(1000, 1.0)]);
        let size = RECORD_BYTES + SAMPLE_BYTES + labels_bytes(&one.0);
        let live = LiveSamples::new((2 * size + RECORD_BYTES + SAMPLE_BYTES) as u64);
        live.serve("idx", "q", None);
        assert!(live.insert("idx", "q", 0, 0, vec![one.clone()]));
        assert!(live.insert("idx", "q", 1, 0, vec![series("up", "b", &[(1, 1.0)])]));
        assert!(!live.insert("idx", "q", 2, 0, vec![series("up", "c", &[(1, 1.0)])]));
        live.published("idx", "q", 0);
        // Making room drops the published record 0.
        assert!(live.insert("idx", "q", 3, 0, vec![series("up", "c", &[(1, 1.0)])]));
        assert_eq!(live.stats().records, 2);
        assert!(live.bytes.load(Ordering::Acquire) <= live.max_bytes);
        // Off: nothing kept.
        let off = LiveSamples::new(0);
        off.serve("idx", "q", None);
        assert!(off.insert("idx", "q", 0, 0, vec![one]));
        assert_eq!(off.stats(), LiveStats::default());
    }
}
