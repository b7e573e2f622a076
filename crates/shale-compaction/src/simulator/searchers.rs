//! Searchers in the simulator: every `query_every` ticks a query opens every existing split,
//! placed on the searchers by the cluster's own placement code (rendezvous hashing, load-capped). Searchers
//! come and go (`searcher_departures_per_day`, each replaced by a new one with an empty
//! cache). Each query records the placement balance (most documents to search on one searcher
//! over the mean) and the cache hit rate (splits placed on a searcher that searched them before).

use std::collections::{HashMap, HashSet};

use shale_cluster::placement::{place, Job};

use super::SplitMix64;

/// Figures of one query.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct QueryStats {
    /// Splits the query opened.
    pub(crate) splits: usize,
    /// Most work (documents to search) on one searcher over the mean.
    pub(crate) balance: f64,
    /// Fraction of the splits placed on a searcher whose cache holds them.
    pub(crate) cache_hit_rate: f64,
    /// The same among the splits an earlier query opened (new splits, fresh or merged, miss
    /// wherever they go); `None` when every split is new.
    pub(crate) cache_affinity: Option<f64>,
}

pub(crate) struct Searchers {
    ids: Vec<String>,
    caches: HashMap<String, HashSet<String>>,
    /// Splits some earlier query opened.
    seen: HashSet<String>,
    next_id: u64,
    rng: SplitMix64,
    departure_credit: f64,
    departures_per_tick: f64,
    pub(crate) departures: u64,
    max_imbalance: f64,
}

impl Searchers {
    pub(crate) fn new(
        count: usize,
        departures_per_tick: f64,
        seed: u64,
        max_imbalance: f64,
    ) -> Self {
        let mut searchers = Searchers {
            ids: Vec::with_capacity(count),
            caches: HashMap::new(),
            seen: HashSet::new(),
            next_id: 0,
            rng: SplitMix64::new(seed ^ 0x5EA4_C4E5),
            departure_credit: 0.0,
            departures_per_tick,
            departures: 0,
            max_imbalance,
        };
        for _ in 0..count {
            let id = searchers.new_id();
            searchers.ids.push(id);
        }
        searchers
    }

    fn new_id(&mut self) -> String {
        self.next_id += 1;
        format!("searcher-{:06}", self.next_id)
    }

    /// Departures of this tick: each departed searcher (and its cache) is replaced by a new one.
    pub(crate) fn tick(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        self.departure_credit += self.departures_per_tick;
        while self.departure_credit >= 1.0 {
            self.departure_credit -= 1.0;
            let slot = self.rng.below(self.ids.len() as u64) as usize;
            let id = self.new_id();
            let departed = std::mem::replace(&mut self.ids[slot], id);
            self.caches.remove(&departed);
            self.departures += 1;
        }
    }

    /// Places a query over `splits` (id, cost) and records what each searcher caches; `None`
    /// when there is no split or no searcher.
    pub(crate) fn query(&mut self, splits: &[(String, u64)]) -> Option<QueryStats> {
        if splits.is_empty() || self.ids.is_empty() {
            return None;
        }
        let mut nodes = self.ids.clone();
        nodes.sort();
        let jobs: Vec<Job> = splits
            .iter()
            .map(|(id, cost)| Job {
                split_id: id.clone(),
                cost: *cost,
            })
            .collect();
        let placements = place(&jobs, &nodes, self.max_imbalance);
        let mut load = vec![0u64; nodes.len()];
        let mut hits = 0usize;
        let mut known = 0usize;
        for (placement, (split_id, cost)) in placements.iter().zip(splits) {
            let Some(&node) = placement.nodes.first() else {
                continue;
            };
            load[node] += cost;
            if !self.seen.insert(split_id.clone()) {
                known += 1;
            }
            let cache = self.caches.entry(nodes[node].clone()).or_default();
            if !cache.insert(split_id.clone()) {
                hits += 1;
            }
        }
        let mean = splits.iter().map(|(_, cost)| *cost).sum::<u64>() as f64 / nodes.len() as f64;
        let max = load.iter().copied().max().unwrap_or(0) as f64;
        Some(QueryStats {
            splits: splits.len(),
            balance: max / mean,
            cache_hit_rate: hits as f64 / splits.len() as f64,
            cache_affinity: (known > 0).then(|| hits as f64 / known as f64),
        })
    }
}
