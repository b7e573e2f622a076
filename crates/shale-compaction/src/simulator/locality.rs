//! The locality simulator behind `shale simulate` with a `locality` policy: what the policy
//! does to the splits of one index over hours or days, with keys.
//!
//! Every tick (one commit interval), each node commits one split per time bucket its
//! documents fall in. A document's key (its sort-field values, as one number of
//! `0..keys`) follows a Zipf law of exponent `key_skew` over keys shuffled by the seed (the
//! busy keys are spread over the key space, as service names are); a fraction `late_fraction`
//! of the documents is late, up to `late_max_secs` old. A split is modelled by its key
//! histogram, sampled with at most [`SAMPLED_GROUPS`] groups of documents per commit.
//!
//! Planning runs the real [`LocalityMergePolicy`]: its operations are applied at once, again
//! until it emits none. A plain merge unites its inputs; a locality merge cuts the keys of
//! its inputs into outputs of at most the target, level 1, except the keys inside the range
//! of a level-1 split of the bucket that is not an input (level 0) — as the merge worker does.
//!
//! Reported: splits, level-0 splits, merges and write amplification per tick; the splits a
//! query for one key over the last hour opens (keys sampled by the same law), against all
//! splits of the last hour; and per closed bucket, the splits a single-key query opens.

use std::collections::BTreeMap;

use serde::Serialize;
use shale_config::LocalityConfig;
use shale_types::sort_key::SortKey;
use shale_types::{MergeKind, SplitMetadata, TimeRange};

use super::{simulated_split, simulated_split_id, SimulationError, SplitMix64};
use crate::policy::{LocalityMergePolicy, MergePolicy};

/// Most document groups a commit is sampled with.
pub const SAMPLED_GROUPS: u64 = 2_000;

/// Keys sampled for the single-key query figures.
const QUERY_KEYS: usize = 50;

/// What to simulate.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalitySimulationConfig {
    /// Indexing nodes, each committing one split per bucket per tick.
    pub nodes: usize,
    /// Ticks to simulate.
    pub ticks: u64,
    /// Seconds per tick (the commit interval).
    pub tick_secs: u64,
    /// Documents each node commits per tick.
    pub docs_per_split: u64,
    /// Bytes per document.
    pub bytes_per_doc: u64,
    /// Ticks between planning rounds.
    pub plan_every: u64,
    /// Distinct keys (combinations of sort field values).
    pub keys: u32,
    /// Zipf exponent of the key frequencies (0: uniform).
    pub key_skew: f64,
    /// Fraction of late documents.
    pub late_fraction: f64,
    /// How old a late document may be, in seconds.
    pub late_max_secs: u64,
    /// Seed of the keys and timestamps.
    pub seed: u64,
    /// Unix time at which the simulation starts.
    pub start_timestamp: i64,
    /// Merge scope: each node's splits apart (`true`, Quickwit's) or every node's together.
    pub node_local: bool,
    /// Fraction of the keys replaced by new ones per hour (series churn: the live keys are a
    /// window of the key space sliding up by this fraction of `keys` each hour).
    pub churn_per_hour: f64,
}

impl Default for LocalitySimulationConfig {
    fn default() -> Self {
        LocalitySimulationConfig {
            nodes: 3,
            ticks: 60,
            tick_secs: 60,
            docs_per_split: 100_000,
            bytes_per_doc: 300,
            plan_every: 1,
            keys: 10_000,
            key_skew: 1.0,
            late_fraction: 0.05,
            late_max_secs: 3600,
            seed: 0,
            start_timestamp: 1_767_225_600,
            node_local: false,
            churn_per_hour: 0.0,
        }
    }
}

impl LocalitySimulationConfig {
    /// Checks every setting; the error names the setting.
    pub fn validate(&self) -> Result<(), SimulationError> {
        let invalid = |field: &'static str, message: &str| {
            Err(SimulationError::Invalid {
                field,
                message: message.to_string(),
            })
        };
        if self.nodes == 0 {
            return invalid("nodes", "must be at least 1");
        }
        if self.ticks == 0 || self.ticks > 10_000_000 {
            return invalid("ticks", "must be between 1 and 10000000");
        }
        if self.tick_secs == 0 || self.tick_secs > 86_400 {
            return invalid("tick_secs", "must be between 1 and 86400");
        }
        if self.docs_per_split == 0 || self.bytes_per_doc == 0 {
            return invalid("docs_per_split", "documents and bytes must be at least 1");
        }
        if self.plan_every == 0 {
            return invalid("plan_every", "must be at least 1");
        }
        if self.keys == 0 {
            return invalid("keys", "must be at least 1");
        }
        if !self.key_skew.is_finite() || self.key_skew < 0.0 {
            return invalid("key_skew", "must be a non-negative number");
        }
        if !(0.0..=1.0).contains(&self.late_fraction) {
            return invalid("late_fraction", "must be between 0 and 1");
        }
        if !self.churn_per_hour.is_finite() || !(0.0..=100.0).contains(&self.churn_per_hour) {
            return invalid("churn_per_hour", "must be between 0 and 100");
        }
        Ok(())
    }
}

/// The state at the end of one tick.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LocalityTickStats {
    /// Tick number, from 0.
    pub tick: u64,
    /// The clock at the end of the tick.
    pub timestamp: i64,
    /// Splits.
    pub total_splits: u64,
    /// Level-0 (overlapping) splits.
    pub level0_splits: u64,
    /// Splits a query over the last hour opens without key pruning.
    pub last_hour_splits: u64,
    /// Mean splits a single-key query over the last hour opens.
    pub last_hour_key_query_splits: f64,
    /// Merges applied during the tick.
    pub merges: u64,
    /// Write amplification so far.
    pub write_amplification: f64,
}

/// The figures of a whole locality simulation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LocalitySummary {
    /// Indexing nodes.
    pub nodes: usize,
    /// Ticks simulated.
    pub ticks: u64,
    /// Seconds simulated.
    pub simulated_secs: u64,
    /// Distinct keys.
    pub keys: u32,
    /// Zipf exponent.
    pub key_skew: f64,
    /// Fraction of late documents.
    pub late_fraction: f64,
    /// `node_local` or `cluster`.
    pub scope: &'static str,
    /// Splits at the end.
    pub final_splits: u64,
    /// Level-0 splits at the end.
    pub final_level0_splits: u64,
    /// Splits a query over the last hour opens without key pruning, at the end.
    pub last_hour_splits: u64,
    /// Mean splits a single-key query over the last hour opens, at the end.
    pub last_hour_key_query_splits: f64,
    /// Over the closed buckets at the end: mean splits a single-key query opens per bucket.
    pub key_query_splits_per_bucket: f64,
    /// The worst bucket's mean.
    pub max_key_query_splits_per_bucket: f64,
    /// Over the closed buckets: mean splits per bucket.
    pub splits_per_closed_bucket: f64,
    /// Over the closed buckets: mean ⌈bucket documents / target⌉ (the floor the policy aims at).
    pub ideal_splits_per_closed_bucket: f64,
    /// Splits committed.
    pub splits_ingested: u64,
    /// Documents committed.
    pub docs_ingested: u64,
    /// Merges applied, of which locality merges.
    pub merges: u64,
    /// Locality merges applied.
    pub locality_merges: u64,
    /// Bytes written by merges.
    pub bytes_written_by_merges: u64,
    /// `(bytes ingested + bytes written by merges) / bytes ingested`.
    pub write_amplification: f64,
    /// Most merges any document went through.
    pub max_merge_ops: u32,
}

/// The per-tick series and the summary.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LocalityReport {
    /// One entry per tick.
    pub series: Vec<LocalityTickStats>,
    /// The whole run.
    pub summary: LocalitySummary,
}

/// A simulated split: its metadata and its documents per key.
struct SimSplit {
    meta: SplitMetadata,
    keys: BTreeMap<u32, u64>,
}

/// The key bytes of key `k` in a fresh split (a key plus a timestamp part).
fn doc_key(k: u32) -> SortKey {
    let mut bytes = k.to_be_bytes().to_vec();
    bytes.push(0x01);
    SortKey(bytes)
}

/// The widened range of a level-1 split owning keys `first..=last`.
fn owned_range(first: u32, last: u32) -> (SortKey, SortKey) {
    let mut high = last.to_be_bytes().to_vec();
    high.push(0xFF);
    (SortKey(first.to_be_bytes().to_vec()), SortKey(high))
}

fn contains(split: &SplitMetadata, k: u32) -> bool {
    match (&split.sort_key_min, &split.sort_key_max) {
        (Some(min), Some(max)) => *min <= doc_key(k) && doc_key(k) <= *max,
        _ => true,
    }
}

/// Runs a locality simulation of `policy_config` (see the module docs).
pub fn simulate_locality(
    config: &LocalitySimulationConfig,
    policy_config: &LocalityConfig,
) -> Result<LocalityReport, SimulationError> {
    simulate_locality_with_progress(config, policy_config, &mut |_| {})
}

/// [`simulate_locality`], calling `progress` with the number of ticks done after each tick.
pub fn simulate_locality_with_progress(
    config: &LocalitySimulationConfig,
    policy_config: &LocalityConfig,
    progress: &mut dyn FnMut(u64),
) -> Result<LocalityReport, SimulationError> {
    config.validate()?;
    let policy = LocalityMergePolicy::new(policy_config.clone(), config.tick_secs);
    let mut rng = SplitMix64::new(config.seed);
    // Zipf weights by rank; rank r is key `perm[r]`.
    let mut perm: Vec<u32> = (0..config.keys).collect();
    for i in (1..perm.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        perm.swap(i, j);
    }
    let mut cdf = Vec::with_capacity(perm.len());
    let mut total_weight = 0.0;
    for rank in 0..perm.len() {
        total_weight += 1.0 / ((rank + 1) as f64).powf(config.key_skew);
        cdf.push(total_weight);
    }
    let sample_rank = |rng: &mut SplitMix64| {
        let x = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total_weight;
        perm[cdf.partition_point(|&c| c < x).min(perm.len() - 1)]
    };
    // Churn: the live keys at time `ts` are `offset(ts) .. offset(ts) + keys`.
    let churn_offset = |ts: i64| -> u32 {
        let hours = (ts - config.start_timestamp).max(0) as f64 / 3600.0;
        (config.churn_per_hour * hours * f64::from(config.keys)).min(f64::from(u32::MAX / 2)) as u32
    };
    let sample_key =
        |rng: &mut SplitMix64, ts: i64| sample_rank(rng).saturating_add(churn_offset(ts));
    // Query keys: ranks drawn once; each query asks for the key of that rank live at the
    // query's time.
    let query_ranks: Vec<u32> = (0..QUERY_KEYS).map(|_| sample_rank(&mut rng)).collect();
    let bucket_secs = policy_config.time_bucket_secs as i64;
    let target = policy_config.target_num_docs();
    let groups = config.docs_per_split.min(SAMPLED_GROUPS);
    let mut splits: Vec<SimSplit> = Vec::new();
    let mut next_split = 0u64;
    let mut series = Vec::with_capacity(config.ticks as usize);
    let (mut merges, mut locality_merges, mut merge_bytes, mut ingested_bytes) = (0, 0, 0, 0);
    let mut splits_ingested = 0;
    let mut max_ops = 0;
    let mut now = config.start_timestamp;
    for tick in 0..config.ticks {
        let tick_start = config.start_timestamp + (tick * config.tick_secs) as i64;
        now = tick_start + config.tick_secs as i64;
        let mut tick_merges = 0;
        // Commits: one split per (node, bucket).
        for node in 0..config.nodes {
            let mut by_bucket: BTreeMap<i64, (BTreeMap<u32, u64>, i64, i64)> = BTreeMap::new();
            for group in 0..groups {
                // Spread the documents over the groups exactly.
                let docs = config.docs_per_split / groups
                    + u64::from(group < config.docs_per_split % groups);
                let draw = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                let late = draw < config.late_fraction;
                let age = if late {
                    config.tick_secs + rng.below(config.late_max_secs.max(1))
                } else {
                    rng.below(config.tick_secs)
                };
                let ts = now - 1 - age as i64;
                let bucket = policy_config.bucket_start(ts);
                let key = sample_key(&mut rng, ts);
                let entry = by_bucket.entry(bucket).or_insert((BTreeMap::new(), ts, ts));
                *entry.0.entry(key).or_default() += docs;
                entry.1 = entry.1.min(ts);
                entry.2 = entry.2.max(ts);
            }
            for (bucket, (keys, start, end)) in by_bucket {
                next_split += 1;
                let num_docs: u64 = keys.values().sum();
                let size = num_docs * config.bytes_per_doc;
                let mut meta = simulated_split(
                    simulated_split_id(next_split),
                    super::simulated_node_id(node as u64),
                    num_docs,
                    size,
                    TimeRange { start, end },
                    now,
                );
                meta.time_bucket_start = Some(bucket);
                meta.maturity = policy.split_maturity(num_docs, 0);
                set_range(&mut meta, &keys, 0);
                ingested_bytes += size;
                splits_ingested += 1;
                splits.push(SimSplit { meta, keys });
            }
        }
        // Planning.
        if (tick + 1).is_multiple_of(config.plan_every) {
            loop {
                // Every split, mature ones included (the node's planner adds the level-1
                // splits of a bucket with late data, whatever their maturity), by scope:
                // each node's apart in node_local scope.
                let mut scopes: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
                for (i, split) in splits.iter().enumerate() {
                    let scope = if config.node_local {
                        split.meta.node_id.as_str()
                    } else {
                        ""
                    };
                    scopes.entry(scope).or_default().push(i);
                }
                let mut planned: Vec<(Vec<usize>, MergeKind)> = Vec::new();
                for candidates in scopes.values() {
                    let refs: Vec<&SplitMetadata> =
                        candidates.iter().map(|&i| &splits[i].meta).collect();
                    for op in policy.merge_positions(&refs, now) {
                        let kind = policy.operation_kind(&refs, &op, now);
                        planned.push((op.iter().map(|&pos| candidates[pos]).collect(), kind));
                    }
                }
                if planned.is_empty() {
                    break;
                }
                let mut consumed = vec![false; splits.len()];
                let mut outputs = Vec::new();
                for (inputs, kind) in planned {
                    for &i in &inputs {
                        consumed[i] = true;
                    }
                    let made = merge(
                        &splits,
                        &inputs,
                        kind,
                        target,
                        now,
                        &mut next_split,
                        &policy,
                    );
                    merges += 1;
                    tick_merges += 1;
                    if kind == MergeKind::Locality {
                        locality_merges += 1;
                    }
                    merge_bytes += made.iter().map(|s| s.meta.size_bytes).sum::<u64>();
                    max_ops =
                        max_ops.max(made.iter().map(|s| s.meta.num_merge_ops).max().unwrap_or(0));
                    outputs.extend(made);
                }
                let mut consumed = consumed.into_iter();
                splits.retain(|_| !consumed.next().unwrap_or(false));
                splits.extend(outputs);
            }
        }
        let last_hour: Vec<&SplitMetadata> = splits
            .iter()
            .map(|s| &s.meta)
            .filter(|m| {
                m.time_range
                    .is_some_and(|r| r.intersects(Some(now - 3600), Some(now)))
            })
            .collect();
        let key_query = query_ranks
            .iter()
            .map(|&rank| {
                let k = rank.saturating_add(churn_offset(now));
                last_hour.iter().filter(|m| contains(m, k)).count() as f64
            })
            .sum::<f64>()
            / query_ranks.len() as f64;
        series.push(LocalityTickStats {
            tick,
            timestamp: now,
            total_splits: splits.len() as u64,
            level0_splits: splits.iter().filter(|s| s.meta.key_level == 0).count() as u64,
            last_hour_splits: last_hour.len() as u64,
            last_hour_key_query_splits: key_query,
            merges: tick_merges,
            write_amplification: wa(ingested_bytes, merge_bytes),
        });
        progress(tick + 1);
    }
    // Closed buckets at the end: how many splits a single-key query opens in each.
    let mut buckets: BTreeMap<i64, Vec<&SimSplit>> = BTreeMap::new();
    for split in &splits {
        if let Some(bucket) = split.meta.time_bucket_start {
            if bucket + bucket_secs + 2 * config.tick_secs as i64 + 60 <= now {
                buckets.entry(bucket).or_default().push(split);
            }
        }
    }
    let per_bucket: Vec<(f64, f64, f64)> = buckets
        .iter()
        .map(|(bucket, members)| {
            // The keys of those ranks live in the bucket.
            let offset = churn_offset(*bucket);
            let opened = query_ranks
                .iter()
                .map(|&rank| {
                    let k = rank.saturating_add(offset);
                    members.iter().filter(|s| contains(&s.meta, k)).count() as f64
                })
                .sum::<f64>()
                / query_ranks.len() as f64;
            let docs: u64 = members.iter().map(|s| s.meta.num_docs).sum();
            (
                opened,
                members.len() as f64,
                docs.div_ceil(target.max(1)) as f64,
            )
        })
        .collect();
    let last = series.last().cloned();
    let summary = LocalitySummary {
        nodes: config.nodes,
        ticks: config.ticks,
        simulated_secs: config.ticks * config.tick_secs,
        keys: config.keys,
        key_skew: config.key_skew,
        late_fraction: config.late_fraction,
        scope: if config.node_local {
            "node_local"
        } else {
            "cluster"
        },
        final_splits: splits.len() as u64,
        final_level0_splits: splits.iter().filter(|s| s.meta.key_level == 0).count() as u64,
        last_hour_splits: last.as_ref().map_or(0, |row| row.last_hour_splits),
        last_hour_key_query_splits: last
            .as_ref()
            .map_or(0.0, |row| row.last_hour_key_query_splits),
        key_query_splits_per_bucket: super::mean(per_bucket.iter().map(|b| b.0)),
        max_key_query_splits_per_bucket: per_bucket.iter().map(|b| b.0).fold(0.0, f64::max),
        splits_per_closed_bucket: super::mean(per_bucket.iter().map(|b| b.1)),
        ideal_splits_per_closed_bucket: super::mean(per_bucket.iter().map(|b| b.2)),
        splits_ingested,
        docs_ingested: ingested_bytes / config.bytes_per_doc,
        merges,
        locality_merges,
        bytes_written_by_merges: merge_bytes,
        write_amplification: wa(ingested_bytes, merge_bytes),
        max_merge_ops: max_ops,
    };
    Ok(LocalityReport { series, summary })
}

fn wa(ingested: u64, written: u64) -> f64 {
    if ingested == 0 {
        1.0
    } else {
        (ingested + written) as f64 / ingested as f64
    }
}

/// Sets a split's key range from its keys (level 1: widened to the keys it owns).
fn set_range(meta: &mut SplitMetadata, keys: &BTreeMap<u32, u64>, level: u8) {
    let (Some(first), Some(last)) = (keys.keys().next(), keys.keys().next_back()) else {
        return;
    };
    let (min, max) = if level > 0 {
        owned_range(*first, *last)
    } else {
        (doc_key(*first), doc_key(*last))
    };
    meta.sort_key_min = Some(min);
    meta.sort_key_max = Some(max);
    meta.key_level = level;
}

/// Applies one operation to `splits[inputs]`, as the merge worker would.
fn merge(
    splits: &[SimSplit],
    inputs: &[usize],
    kind: MergeKind,
    target: u64,
    now: i64,
    next_split: &mut u64,
    policy: &LocalityMergePolicy,
) -> Vec<SimSplit> {
    let mut keys: BTreeMap<u32, u64> = BTreeMap::new();
    let mut time_range: Option<TimeRange> = None;
    let mut ops = 0;
    for &i in inputs {
        for (k, n) in &splits[i].keys {
            *keys.entry(*k).or_default() += n;
        }
        if let Some(range) = splits[i].meta.time_range {
            time_range = Some(time_range.map_or(range, |acc| acc.union(&range)));
        }
        ops = ops.max(splits[i].meta.num_merge_ops);
    }
    let first = &splits[inputs[0]].meta;
    let bucket = first.time_bucket_start;
    let mut output = |keys: BTreeMap<u32, u64>, level: u8| {
        *next_split += 1;
        let num_docs: u64 = keys.values().sum();
        let bytes_per_doc = first.size_bytes / first.num_docs.max(1);
        let mut meta = simulated_split(
            simulated_split_id(*next_split),
            first.node_id.clone(),
            num_docs,
            num_docs * bytes_per_doc.max(1),
            time_range.unwrap_or(TimeRange {
                start: now,
                end: now,
            }),
            now,
        );
        meta.time_bucket_start = bucket;
        meta.num_merge_ops = ops + 1;
        meta.maturity = policy.split_maturity(num_docs, ops + 1);
        set_range(&mut meta, &keys, level);
        SimSplit { meta, keys }
    };
    if kind == MergeKind::Merge {
        let level = inputs
            .iter()
            .map(|&i| splits[i].meta.key_level)
            .min()
            .unwrap_or(0);
        return vec![output(keys, level)];
    }
    // The bucket's other level-1 splits: keys inside their ranges stay level 0.
    let fixed: Vec<(u32, u32)> = splits
        .iter()
        .enumerate()
        .filter(|(i, s)| {
            s.meta.key_level > 0 && s.meta.time_bucket_start == bucket && !inputs.contains(i)
        })
        .filter_map(|(_, s)| Some((*s.keys.keys().next()?, *s.keys.keys().next_back()?)))
        .collect();
    let mut made = Vec::new();
    let mut open: BTreeMap<u32, u64> = BTreeMap::new();
    let mut open_class: Option<(Option<usize>, usize)> = None;
    let mut open_docs = 0u64;
    for (k, n) in keys {
        let class = (
            fixed.iter().position(|(lo, hi)| *lo <= k && k <= *hi),
            fixed.iter().filter(|(_, hi)| *hi < k).count(),
        );
        let cut = match open_class {
            None => false,
            Some(c) => c != class || (open_docs > 0 && open_docs + n > target),
        };
        if cut {
            let level = if open_class.and_then(|c| c.0).is_some() {
                0
            } else {
                1
            };
            made.push(output(std::mem::take(&mut open), level));
            open_docs = 0;
        }
        open_class = Some(class);
        open.insert(k, n);
        open_docs += n;
    }
    if !open.is_empty() {
        let level = if open_class.and_then(|c| c.0).is_some() {
            0
        } else {
            1
        };
        made.push(output(open, level));
    }
    made
}
