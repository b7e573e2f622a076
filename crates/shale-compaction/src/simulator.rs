//! The cluster simulator behind `shale simulate`: what a merge policy and a scope mode do to a
//! cluster's splits over days, in seconds, deterministically (same config and seed, same
//! result).
//!
//! Time advances in ticks of `tick_secs`. At tick `t` the clock reads
//! `start + (t + 1) × tick_secs`; then:
//!
//! 1. splits whose maturation period is over become mature;
//! 2. nodes depart, `departures_per_day` spread evenly over the ticks, each a random live node
//!    (seeded), replaced at once by a node with a new id, so the node count stays constant;
//! 3. every live node commits one split of `docs_per_split` documents covering the tick's
//!    seconds, created now, with the policy's maturity;
//! 4. every `plan_every` ticks, each merge scope that received splits is planned: the policy
//!    runs on the scope's immature splits and every operation it emits is applied, again and
//!    again until it emits none. A merged split unites its inputs' time ranges and sums their
//!    documents and bytes, has `num_merge_ops` = max + 1, is created now (as in Quickwit) and
//!    gets its maturity from the policy.
//!
//! Scopes are [`SplitMetadata::merge_scope`]'s: in `node_local` mode each node has its own
//! scope, and when a node departs its scope is never planned again — its immature splits are
//! **orphaned**. In `cluster` mode all nodes share one scope. Planning calls
//! [`MergePolicy::merge_positions`], the code behind [`crate::policy::plan`], per scope.
//!
//! Every tick records the total number of splits, the immature ones, the orphaned ones, the
//! splits a query over the last hour (`[now − 3600, now]`) would open, the merges and the bytes
//! they wrote, and the write amplification so far
//! (`(bytes ingested + bytes written by merges) / bytes ingested`; a split's size is
//! `num_docs × bytes_per_doc`).
//!
//! The simulation holds only the immature splits of live scopes; everything else is counted.
//!
//! With `searchers > 0`, searchers are simulated too (module `searchers`): every
//! `query_every` ticks a query over every existing split is placed on them with the cluster's
//! placement code, under churn; the summary reports placement balance and cache hit rates.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use serde::Serialize;
use shale_types::{IndexUid, MergeScope, SplitMaturity, SplitMetadata, TimeRange};

use crate::policy::{MergePolicy, SplitOrder};

pub mod locality;
mod searchers;

/// How far above the mean a simulated searcher may be loaded (as in the cluster).
const MAX_PLACEMENT_IMBALANCE: f64 = 0.2;

/// The mean of `values` (0 for none).
fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, count) = values.fold((0.0, 0usize), |(sum, count), v| (sum + v, count + 1));
    if count == 0 {
        0.0
    } else {
        sum / count as f64
    }
}

/// Most ticks a simulation may run (the per-tick tables are this long).
pub const MAX_TICKS: u64 = 100_000_000;

/// What to simulate.
#[derive(Clone, Debug, PartialEq)]
pub struct SimulationConfig {
    /// Live nodes at any time.
    pub nodes: usize,
    /// Ticks to simulate.
    pub ticks: u64,
    /// Seconds per tick.
    pub tick_secs: u64,
    /// Documents in each split a node commits.
    pub docs_per_split: u64,
    /// Bytes per document (a split's size is `num_docs × bytes_per_doc`).
    pub bytes_per_doc: u64,
    /// Ticks between planning rounds.
    pub plan_every: u64,
    /// `node_local` scopes (Quickwit) instead of `cluster` scopes.
    pub node_local: bool,
    /// Nodes replaced per simulated day.
    pub departures_per_day: f64,
    /// Seed of the choice of departing nodes.
    pub seed: u64,
    /// Unix time at which the simulation starts.
    pub start_timestamp: i64,
    /// Searchers to place queries on (0: no search simulation).
    pub searchers: usize,
    /// Searchers replaced per simulated day.
    pub searcher_departures_per_day: f64,
    /// Ticks between simulated queries.
    pub query_every: u64,
}

impl Default for SimulationConfig {
    fn default() -> Self {
        SimulationConfig {
            nodes: 3,
            ticks: 60,
            tick_secs: 60,
            docs_per_split: 100_000,
            bytes_per_doc: 300,
            plan_every: 1,
            node_local: false,
            departures_per_day: 0.0,
            seed: 0,
            start_timestamp: 1_767_225_600, // 2026-01-01T00:00:00Z
            searchers: 0,
            searcher_departures_per_day: 0.0,
            query_every: 60,
        }
    }
}

impl SimulationConfig {
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
        if self.ticks == 0 || self.ticks > MAX_TICKS {
            return invalid("ticks", "must be between 1 and 100000000");
        }
        if self.tick_secs == 0 || self.tick_secs > i64::MAX as u64 / MAX_TICKS {
            return invalid("tick_secs", "must be between 1 and 92233720368");
        }
        if self.docs_per_split == 0 {
            return invalid("docs_per_split", "must be at least 1");
        }
        if self
            .docs_per_split
            .checked_mul(self.bytes_per_doc)
            .is_none()
        {
            return invalid("bytes_per_doc", "split size overflows");
        }
        if self.bytes_per_doc == 0 {
            return invalid("bytes_per_doc", "must be at least 1");
        }
        if self.plan_every == 0 {
            return invalid("plan_every", "must be at least 1");
        }
        if !self.departures_per_day.is_finite() || self.departures_per_day < 0.0 {
            return invalid("departures_per_day", "must be a non-negative number");
        }
        if !self.searcher_departures_per_day.is_finite() || self.searcher_departures_per_day < 0.0 {
            return invalid(
                "searcher_departures_per_day",
                "must be a non-negative number",
            );
        }
        if self.query_every == 0 {
            return invalid("query_every", "must be at least 1");
        }
        Ok(())
    }

    /// `cluster` or `node_local`.
    pub fn scope_name(&self) -> &'static str {
        if self.node_local {
            "node_local"
        } else {
            "cluster"
        }
    }
}

/// An invalid simulation setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimulationError {
    /// A setting is out of range.
    #[error("`{field}`: {message}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// Why.
        message: String,
    },
}

/// The state of the cluster at the end of one tick.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TickStats {
    /// Tick number, from 0.
    pub tick: u64,
    /// The clock at the end of the tick (Unix seconds).
    pub timestamp: i64,
    /// Published splits.
    pub total_splits: u64,
    /// Splits not yet mature.
    pub immature_splits: u64,
    /// Immature splits whose scope is planned by no one anymore.
    pub orphaned_splits: u64,
    /// Splits orphaned so far, including those that have matured since.
    pub orphaned_splits_total: u64,
    /// Splits a query over `[now − 3600, now]` would open.
    pub last_hour_splits: u64,
    /// Merges applied during the tick.
    pub merges: u64,
    /// Bytes written by those merges.
    pub merge_bytes_written: u64,
    /// Write amplification so far.
    pub write_amplification: f64,
}

/// The figures of a whole simulation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimulationSummary {
    /// `cluster` or `node_local`.
    pub scope: &'static str,
    /// Live nodes.
    pub nodes: usize,
    /// Ticks simulated.
    pub ticks: u64,
    /// Seconds simulated.
    pub simulated_secs: u64,
    /// Nodes replaced.
    pub departures: u64,
    /// Splits at the end.
    pub final_splits: u64,
    /// Most splits at the end of any tick.
    pub max_splits: u64,
    /// Immature splits at the end.
    pub final_immature_splits: u64,
    /// Most immature splits at the end of any tick.
    pub max_immature_splits: u64,
    /// Orphaned splits at the end.
    pub orphaned_splits: u64,
    /// Most orphaned splits at the end of any tick.
    pub max_orphaned_splits: u64,
    /// Splits orphaned over the whole run (they never merged again, whether or not they have
    /// matured since).
    pub orphaned_splits_total: u64,
    /// Splits a query over the last hour would open, at the end.
    pub last_hour_splits: u64,
    /// Most splits a query over the last hour would open, at the end of any tick.
    pub max_last_hour_splits: u64,
    /// Splits committed by nodes.
    pub splits_ingested: u64,
    /// Documents committed by nodes.
    pub docs_ingested: u64,
    /// Bytes committed by nodes.
    pub bytes_ingested: u64,
    /// Merges applied.
    pub merges: u64,
    /// Bytes written by merges.
    pub bytes_written_by_merges: u64,
    /// `(bytes ingested + bytes written by merges) / bytes ingested`.
    pub write_amplification: f64,
    /// Simulated queries (0 without searchers).
    pub queries: u64,
    /// Mean number of splits a query opened.
    pub mean_query_splits: f64,
    /// Searchers replaced.
    pub searcher_departures: u64,
    /// Mean over the queries of the most work (documents) on one searcher over the mean.
    pub mean_placement_balance: f64,
    /// Worst placement balance of a query.
    pub max_placement_balance: f64,
    /// Mean over the queries of the fraction of splits found in their searcher's cache.
    pub mean_cache_hit_rate: f64,
    /// Lowest cache hit rate of a query after the first.
    pub min_cache_hit_rate: f64,
    /// Mean over the queries of the cache hit rate among splits an earlier query opened.
    pub mean_cache_affinity: f64,
    /// Lowest such rate of a query.
    pub min_cache_affinity: f64,
    /// Calls to the merge policy.
    pub policy_calls: u64,
}

/// The per-tick series and the summary of a simulation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimulationReport {
    /// One entry per tick.
    pub series: Vec<TickStats>,
    /// The figures of the whole run.
    pub summary: SimulationSummary,
}

/// Runs a simulation with `policy` (see the module docs).
pub fn simulate(
    config: &SimulationConfig,
    policy: &dyn MergePolicy,
) -> Result<SimulationReport, SimulationError> {
    simulate_with_progress(config, policy, &mut |_| {})
}

/// [`simulate`], calling `progress` with the number of ticks done after each tick.
pub fn simulate_with_progress(
    config: &SimulationConfig,
    policy: &dyn MergePolicy,
    progress: &mut dyn FnMut(u64),
) -> Result<SimulationReport, SimulationError> {
    config.validate()?;
    let mut engine = Engine::new(config, policy);
    let mut series = Vec::with_capacity(config.ticks as usize);
    for tick in 0..config.ticks {
        series.push(engine.tick(tick));
        progress(tick + 1);
    }
    Ok(engine.report(series))
}

/// The series as CSV, one line per tick, with a header.
pub fn series_csv(series: &[TickStats]) -> String {
    let mut csv = String::from(
        "tick,timestamp,total_splits,immature_splits,orphaned_splits,orphaned_splits_total,\
         last_hour_splits,merges,merge_bytes_written,write_amplification\n",
    );
    for row in series {
        // Writing to a String cannot fail.
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{:.4}",
            row.tick,
            row.timestamp,
            row.total_splits,
            row.immature_splits,
            row.orphaned_splits,
            row.orphaned_splits_total,
            row.last_hour_splits,
            row.merges,
            row.merge_bytes_written,
            row.write_amplification
        );
    }
    csv
}

/// SplitMix64: a tiny, fast, well-mixed generator; enough to pick departing nodes.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound > 0`).
    pub fn below(&mut self, bound: u64) -> u64 {
        // Multiply-shift: unbiased enough for picking nodes, and no division.
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }
}

/// The id of the `n`-th split (fixed width, so that ids sort like their numbers).
pub fn simulated_split_id(n: u64) -> String {
    format!("sim-{n:012}")
}

/// The id of the `n`-th node.
pub fn simulated_node_id(n: u64) -> String {
    format!("node-{n:06}")
}

/// A fresh split as the simulator makes them (one index, source, partition and doc mapping;
/// mature and never merged until the caller says otherwise).
pub fn simulated_split(
    split_id: String,
    node_id: String,
    num_docs: u64,
    size_bytes: u64,
    time_range: TimeRange,
    create_timestamp: i64,
) -> SplitMetadata {
    SplitMetadata {
        split_id,
        // Empty strings: cloning them costs no allocation.
        index_uid: IndexUid {
            index_id: String::new(),
            incarnation: String::new(),
        },
        source_id: String::new(),
        node_id,
        partition_id: 0,
        doc_mapping_uid: String::new(),
        num_docs,
        size_bytes,
        uncompressed_docs_size_bytes: size_bytes,
        time_range: Some(time_range),
        tags: BTreeSet::new(),
        create_timestamp,
        maturity: SplitMaturity::Mature,
        num_merge_ops: 0,
        delete_opstamp: 0,
        footer_offsets: (0, 0),
        time_bucket_start: None,
        sort_key_min: None,
        sort_key_max: None,
        key_level: 0,
        sort_fields: None,
        tag_fields: None,
        format: Default::default(),
        num_series: None,
    }
}

struct ScopeState {
    /// Immature splits (possibly matured since the last round), in the policy's order after
    /// each round. Boxed: a `SplitMetadata` is a few hundred bytes, and the scope's splits
    /// are re-sorted and filtered after every policy call.
    #[allow(clippy::vec_box)]
    candidates: Vec<Box<SplitMetadata>>,
    /// Live nodes writing to the scope.
    writers: usize,
    /// Received splits since it was last planned.
    dirty: bool,
}

struct Node {
    id: String,
    scope: usize,
}

struct Engine<'a> {
    config: &'a SimulationConfig,
    policy: &'a dyn MergePolicy,
    order: Option<SplitOrder>,
    fresh_maturity: SplitMaturity,
    rng: SplitMix64,
    departure_credit: f64,
    departures_per_tick: f64,
    last_hour_ticks: u64,
    scopes: Vec<ScopeState>,
    scope_ids: HashMap<MergeScope, usize>,
    dirty_scopes: Vec<usize>,
    nodes: Vec<Node>,
    next_node: u64,
    next_split: u64,
    now: i64,
    // Counters.
    total: u64,
    immature: u64,
    orphaned: u64,
    orphaned_total: u64,
    /// Existing immature splits by the tick at which they mature.
    maturing_at: Vec<u64>,
    /// Orphaned splits by the tick at which they mature.
    orphans_maturing_at: Vec<u64>,
    /// Existing splits by the tick in which their time range ends.
    ending_in: Vec<u64>,
    departures: u64,
    splits_ingested: u64,
    bytes_ingested: u64,
    merges: u64,
    merge_bytes: u64,
    policy_calls: u64,
    tick_merges: u64,
    tick_merge_bytes: u64,
    max_splits: u64,
    max_immature: u64,
    max_orphaned: u64,
    max_last_hour: u64,
    searchers: Option<searchers::Searchers>,
    queries: Vec<searchers::QueryStats>,
    /// Every existing split and its documents, kept only when searchers are simulated.
    existing: std::collections::BTreeMap<String, u64>,
}

impl<'a> Engine<'a> {
    fn new(config: &'a SimulationConfig, policy: &'a dyn MergePolicy) -> Self {
        let ticks = config.ticks as usize;
        let mut engine = Engine {
            config,
            policy,
            order: policy.planning_order(),
            fresh_maturity: policy.split_maturity(config.docs_per_split, 0),
            rng: SplitMix64::new(config.seed),
            departure_credit: 0.0,
            departures_per_tick: config.departures_per_day * config.tick_secs as f64 / 86_400.0,
            last_hour_ticks: 3_599 / config.tick_secs + 1,
            scopes: Vec::new(),
            scope_ids: HashMap::new(),
            dirty_scopes: Vec::new(),
            nodes: Vec::with_capacity(config.nodes),
            next_node: 0,
            next_split: 0,
            now: config.start_timestamp,
            total: 0,
            immature: 0,
            orphaned: 0,
            orphaned_total: 0,
            maturing_at: vec![0; ticks],
            orphans_maturing_at: vec![0; ticks],
            ending_in: vec![0; ticks],
            departures: 0,
            splits_ingested: 0,
            bytes_ingested: 0,
            merges: 0,
            merge_bytes: 0,
            policy_calls: 0,
            tick_merges: 0,
            tick_merge_bytes: 0,
            max_splits: 0,
            max_immature: 0,
            max_orphaned: 0,
            max_last_hour: 0,
            searchers: (config.searchers > 0).then(|| {
                searchers::Searchers::new(
                    config.searchers,
                    config.searcher_departures_per_day * config.tick_secs as f64 / 86_400.0,
                    config.seed,
                    MAX_PLACEMENT_IMBALANCE,
                )
            }),
            queries: Vec::new(),
            existing: std::collections::BTreeMap::new(),
        };
        for _ in 0..config.nodes {
            let node = engine.join();
            engine.nodes.push(node);
        }
        engine
    }

    fn tick(&mut self, tick: u64) -> TickStats {
        let t = tick as usize;
        let tick_secs = self.config.tick_secs as i64;
        let tick_start = self.config.start_timestamp + tick as i64 * tick_secs;
        self.now = tick_start + tick_secs;
        self.tick_merges = 0;
        self.tick_merge_bytes = 0;
        // 1. Maturity.
        self.immature -= self.maturing_at[t];
        self.orphaned -= self.orphans_maturing_at[t];
        // 2. Departures.
        self.departure_credit += self.departures_per_tick;
        while self.departure_credit >= 1.0 {
            self.departure_credit -= 1.0;
            self.replace_random_node();
        }
        // 3. Commits.
        let time_range = TimeRange {
            start: tick_start,
            end: self.now - 1,
        };
        for slot in 0..self.nodes.len() {
            let size = self.config.docs_per_split * self.config.bytes_per_doc;
            let mut split = simulated_split(
                self.new_split_id(),
                self.nodes[slot].id.clone(),
                self.config.docs_per_split,
                size,
                time_range,
                self.now,
            );
            split.maturity = self.fresh_maturity;
            self.splits_ingested += 1;
            self.bytes_ingested += size;
            let scope = self.nodes[slot].scope;
            self.add_split(scope, split);
        }
        // Merges only lower the counts: the peaks of the tick are before planning.
        self.max_splits = self.max_splits.max(self.total);
        self.max_immature = self.max_immature.max(self.immature);
        // 4. Planning.
        if (tick + 1).is_multiple_of(self.config.plan_every) {
            let dirty = std::mem::take(&mut self.dirty_scopes);
            for scope in dirty {
                self.plan_scope(scope);
            }
        }
        // 5. Searchers and a query.
        if let Some(searchers) = &mut self.searchers {
            searchers.tick();
            if (tick + 1).is_multiple_of(self.config.query_every) {
                let splits: Vec<(String, u64)> = self
                    .existing
                    .iter()
                    .map(|(id, docs)| (id.clone(), *docs))
                    .collect();
                // A query over no split says nothing about placement or caches.
                if let Some(stats) = searchers.query(&splits) {
                    self.queries.push(stats);
                }
            }
        }
        self.stats(tick)
    }

    fn stats(&mut self, tick: u64) -> TickStats {
        let t = tick as usize;
        let first = (tick + 1).saturating_sub(self.last_hour_ticks) as usize;
        let last_hour: u64 = self.ending_in[first..=t].iter().sum();
        self.max_splits = self.max_splits.max(self.total);
        self.max_immature = self.max_immature.max(self.immature);
        self.max_orphaned = self.max_orphaned.max(self.orphaned);
        self.max_last_hour = self.max_last_hour.max(last_hour);
        TickStats {
            tick,
            timestamp: self.now,
            total_splits: self.total,
            immature_splits: self.immature,
            orphaned_splits: self.orphaned,
            orphaned_splits_total: self.orphaned_total,
            last_hour_splits: last_hour,
            merges: self.tick_merges,
            merge_bytes_written: self.tick_merge_bytes,
            write_amplification: self.write_amplification(),
        }
    }

    fn write_amplification(&self) -> f64 {
        if self.bytes_ingested == 0 {
            return 1.0;
        }
        (self.bytes_ingested + self.merge_bytes) as f64 / self.bytes_ingested as f64
    }

    fn report(self, series: Vec<TickStats>) -> SimulationReport {
        let summary = SimulationSummary {
            scope: self.config.scope_name(),
            nodes: self.config.nodes,
            ticks: self.config.ticks,
            simulated_secs: self.config.ticks * self.config.tick_secs,
            departures: self.departures,
            final_splits: self.total,
            max_splits: self.max_splits,
            final_immature_splits: self.immature,
            max_immature_splits: self.max_immature,
            orphaned_splits: self.orphaned,
            max_orphaned_splits: self.max_orphaned,
            orphaned_splits_total: self.orphaned_total,
            last_hour_splits: series.last().map_or(0, |row| row.last_hour_splits),
            max_last_hour_splits: self.max_last_hour,
            splits_ingested: self.splits_ingested,
            docs_ingested: self.splits_ingested * self.config.docs_per_split,
            bytes_ingested: self.bytes_ingested,
            merges: self.merges,
            bytes_written_by_merges: self.merge_bytes,
            write_amplification: self.write_amplification(),
            queries: self.queries.len() as u64,
            mean_query_splits: mean(self.queries.iter().map(|q| q.splits as f64)),
            searcher_departures: self.searchers.as_ref().map_or(0, |s| s.departures),
            mean_placement_balance: mean(self.queries.iter().map(|q| q.balance)),
            max_placement_balance: self.queries.iter().map(|q| q.balance).fold(0.0, f64::max),
            mean_cache_hit_rate: mean(self.queries.iter().skip(1).map(|q| q.cache_hit_rate)),
            min_cache_hit_rate: self
                .queries
                .iter()
                .skip(1)
                .map(|q| q.cache_hit_rate)
                .fold(f64::INFINITY, f64::min)
                .min(1.0),
            mean_cache_affinity: mean(self.queries.iter().filter_map(|q| q.cache_affinity)),
            min_cache_affinity: self
                .queries
                .iter()
                .filter_map(|q| q.cache_affinity)
                .fold(f64::INFINITY, f64::min)
                .min(1.0),
            policy_calls: self.policy_calls,
        };
        SimulationReport { series, summary }
    }

    fn new_split_id(&mut self) -> String {
        self.next_split += 1;
        simulated_split_id(self.next_split)
    }

    /// A new node: its scope is the merge scope of its splits.
    fn join(&mut self) -> Node {
        self.next_node += 1;
        let id = simulated_node_id(self.next_node);
        let template = simulated_split(
            String::new(),
            id.clone(),
            0,
            0,
            TimeRange { start: 0, end: 0 },
            0,
        );
        let key = template.merge_scope(self.config.node_local);
        let scope = match self.scope_ids.get(&key) {
            Some(&scope) => scope,
            None => {
                self.scopes.push(ScopeState {
                    candidates: Vec::new(),
                    writers: 0,
                    dirty: false,
                });
                self.scope_ids.insert(key, self.scopes.len() - 1);
                self.scopes.len() - 1
            }
        };
        self.scopes[scope].writers += 1;
        Node { id, scope }
    }

    fn replace_random_node(&mut self) {
        let slot = self.rng.below(self.nodes.len() as u64) as usize;
        // The replacement joins first, so that a cluster scope never goes without writers.
        let replacement = self.join();
        let departed = std::mem::replace(&mut self.nodes[slot], replacement);
        self.departures += 1;
        let scope = &mut self.scopes[departed.scope];
        scope.writers -= 1;
        if scope.writers > 0 {
            return;
        }
        // Nobody will ever plan this scope again: its immature splits are orphans.
        let candidates = std::mem::take(&mut scope.candidates);
        scope.dirty = false;
        for split in candidates {
            if !split.is_mature(self.now) {
                self.orphaned += 1;
                self.orphaned_total += 1;
                if let Some(tick) = self.maturity_tick(&split) {
                    self.orphans_maturing_at[tick] += 1;
                }
            }
        }
    }

    /// The tick at whose clock `split` is mature, if within the simulation.
    fn maturity_tick(&self, split: &SplitMetadata) -> Option<usize> {
        let SplitMaturity::Immature { .. } = split.maturity else {
            return None;
        };
        let since_start = split.maturity_timestamp() - self.config.start_timestamp;
        let tick_secs = self.config.tick_secs as i64;
        // Smallest t with start + (t + 1) × tick_secs >= maturity.
        let tick = (since_start + tick_secs - 1).div_euclid(tick_secs) - 1;
        usize::try_from(tick)
            .ok()
            .filter(|&tick| tick < self.maturing_at.len())
    }

    fn end_tick(&self, split: &SplitMetadata) -> usize {
        let end = split
            .time_range
            .map_or(self.config.start_timestamp, |r| r.end);
        let tick = (end - self.config.start_timestamp) / self.config.tick_secs as i64;
        tick.clamp(0, self.ending_in.len() as i64 - 1) as usize
    }

    /// Counts a new split and hands it to its scope if it is still to be merged.
    fn add_split(&mut self, scope: usize, split: SplitMetadata) {
        self.total += 1;
        if self.searchers.is_some() {
            self.existing.insert(split.split_id.clone(), split.num_docs);
        }
        let end_tick = self.end_tick(&split);
        self.ending_in[end_tick] += 1;
        if !split.is_mature(self.now) {
            self.immature += 1;
            if let Some(tick) = self.maturity_tick(&split) {
                self.maturing_at[tick] += 1;
            }
        }
        if !self.policy.is_mature(&split, self.now) {
            let state = &mut self.scopes[scope];
            state.candidates.push(Box::new(split));
            if !state.dirty {
                state.dirty = true;
                self.dirty_scopes.push(scope);
            }
        }
    }

    /// Uncounts a split consumed by a merge.
    fn remove_split(&mut self, split: &SplitMetadata) {
        self.total -= 1;
        self.existing.remove(&split.split_id);
        let end_tick = self.end_tick(split);
        self.ending_in[end_tick] -= 1;
        if !split.is_mature(self.now) {
            self.immature -= 1;
            if let Some(tick) = self.maturity_tick(split) {
                self.maturing_at[tick] -= 1;
            }
        }
    }

    fn sort_candidates(&mut self, scope: usize) {
        if let Some(order) = self.order {
            self.scopes[scope]
                .candidates
                .sort_by(|left, right| order(left, right));
        }
    }

    /// Applies what the policy emits for `scope` until it emits nothing.
    fn plan_scope(&mut self, scope: usize) {
        let now = self.now;
        let policy = self.policy;
        {
            let state = &mut self.scopes[scope];
            state.dirty = false;
            if state.writers == 0 {
                return;
            }
            state
                .candidates
                .retain(|split| !policy.is_mature(split, now));
        }
        self.sort_candidates(scope);
        loop {
            let mut candidates = std::mem::take(&mut self.scopes[scope].candidates);
            let operations = {
                let refs: Vec<&SplitMetadata> = candidates.iter().map(|split| &**split).collect();
                policy.merge_positions(&refs, now)
            };
            self.policy_calls += 1;
            if operations.is_empty() {
                self.scopes[scope].candidates = candidates;
                return;
            }
            let mut consumed = vec![false; candidates.len()];
            let mut outputs: Vec<Box<SplitMetadata>> = Vec::new();
            for positions in &operations {
                let merged = self.merge(&candidates, positions, &mut consumed);
                if !policy.is_mature(&merged, now) {
                    outputs.push(Box::new(merged));
                }
            }
            // The splits left are still in order: drop the merged ones, insert the outputs.
            let mut consumed = consumed.into_iter();
            candidates.retain(|_| !consumed.next().unwrap_or(false));
            match self.order {
                Some(order) => {
                    for output in outputs {
                        let at = candidates.partition_point(|split| order(split, &output).is_lt());
                        candidates.insert(at, output);
                    }
                }
                None => candidates.extend(outputs),
            }
            self.scopes[scope].candidates = candidates;
        }
    }

    /// Merges the splits at `positions`: uncounts them, counts and returns the output.
    fn merge(
        &mut self,
        candidates: &[Box<SplitMetadata>],
        positions: &[usize],
        consumed: &mut [bool],
    ) -> SplitMetadata {
        let mut num_docs: u64 = 0;
        let mut size_bytes: u64 = 0;
        let mut num_merge_ops = 0;
        let mut time_range: Option<TimeRange> = None;
        for &pos in positions {
            let input = &candidates[pos];
            consumed[pos] = true;
            num_docs += input.num_docs;
            size_bytes += input.size_bytes;
            num_merge_ops = num_merge_ops.max(input.num_merge_ops);
            if let Some(range) = input.time_range {
                time_range = Some(match time_range {
                    None => range,
                    Some(acc) => TimeRange {
                        start: acc.start.min(range.start),
                        end: acc.end.max(range.end),
                    },
                });
            }
            self.remove_split(input);
        }
        let num_merge_ops = num_merge_ops + 1;
        let node_id = positions
            .first()
            .map_or_else(String::new, |&pos| candidates[pos].node_id.clone());
        let mut merged = simulated_split(
            self.new_split_id(),
            node_id,
            num_docs,
            size_bytes,
            time_range.unwrap_or(TimeRange {
                start: self.now,
                end: self.now,
            }),
            self.now,
        );
        merged.maturity = self.policy.split_maturity(num_docs, num_merge_ops);
        merged.num_merge_ops = num_merge_ops;
        self.merges += 1;
        self.merge_bytes += size_bytes;
        self.tick_merges += 1;
        self.tick_merge_bytes += size_bytes;
        // The output goes through the same accounting as a fresh split, but is not handed to
        // a scope here: the caller keeps it in the scope being planned.
        self.total += 1;
        if self.searchers.is_some() {
            self.existing
                .insert(merged.split_id.clone(), merged.num_docs);
        }
        let end_tick = self.end_tick(&merged);
        self.ending_in[end_tick] += 1;
        if !merged.is_mature(self.now) {
            self.immature += 1;
            if let Some(tick) = self.maturity_tick(&merged) {
                self.maturing_at[tick] += 1;
            }
        }
        merged
    }
}

#[cfg(test)]
mod tests;
