//! Placement of split searches on searchers: rendezvous (highest random weight) hashing on the
//! split id, so that a split keeps going to the same node — whose cache holds it — as long as
//! that node lives, and only the splits of a departed node move. A load cap keeps any node from
//! getting much more than its share: a split skips the nodes already loaded above the mean by
//! more than `max_imbalance`. Pure functions.

use std::hash::{Hash, Hasher};

use siphasher::sip::SipHasher13;

/// The weight of `node` for `split_id` (rendezvous hashing).
fn weight(split_id: &str, node: &str) -> u64 {
    let mut hasher = SipHasher13::new_with_keys(0x5348_414c_4550_4c41, 0x4345_4d45_4e54_0001);
    split_id.hash(&mut hasher);
    node.hash(&mut hasher);
    hasher.finish()
}

/// `nodes` ordered by decreasing rendezvous weight for `split_id` (as indexes into `nodes`).
pub fn rendezvous_order(split_id: &str, nodes: &[String]) -> Vec<usize> {
    let mut order: Vec<(u64, usize)> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| (weight(split_id, node), i))
        .collect();
    order.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    order.into_iter().map(|(_, i)| i).collect()
}

/// One split to place, with its cost (e.g. its number of documents or bytes).
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// The split.
    pub split_id: String,
    /// Its cost; only relative costs matter.
    pub cost: u64,
}

/// Where a split goes: the chosen node first, then the others in rendezvous order (where to
/// retry if the chosen one fails).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Indexes into the `nodes` given to [`place`], chosen first.
    pub nodes: Vec<usize>,
}

/// Places `jobs` on `nodes` (returned in the order of `jobs`). A job goes to the first node in
/// its rendezvous order whose load stays within `(1 + max_imbalance) × mean load`, or that has
/// no job yet (so that a job bigger than the cap still has a place); jobs are placed biggest
/// first.
pub fn place(jobs: &[Job], nodes: &[String], max_imbalance: f64) -> Vec<Placement> {
    if nodes.is_empty() {
        return jobs
            .iter()
            .map(|_| Placement { nodes: Vec::new() })
            .collect();
    }
    let total: u64 = jobs.iter().map(|job| job.cost.max(1)).sum();
    let mean = total as f64 / nodes.len() as f64;
    let mut loads = vec![0u64; nodes.len()];
    let mut by_cost: Vec<usize> = (0..jobs.len()).collect();
    by_cost.sort_by(|&a, &b| {
        jobs[b]
            .cost
            .cmp(&jobs[a].cost)
            .then_with(|| jobs[a].split_id.cmp(&jobs[b].split_id))
    });
    let cap = (mean * (1.0 + max_imbalance)).ceil() as u64;
    let mut placements = vec![Placement { nodes: Vec::new() }; jobs.len()];
    for job_index in by_cost {
        let job = &jobs[job_index];
        let cost = job.cost.max(1);
        let order = rendezvous_order(&job.split_id, nodes);
        let chosen = order
            .iter()
            .copied()
            .find(|&node| loads[node] == 0 || loads[node].saturating_add(cost) <= cap)
            .unwrap_or_else(|| {
                // Every node is at its cap (rounding): take the least loaded.
                (0..nodes.len())
                    .min_by_key(|&node| (loads[node], node))
                    .unwrap_or(0)
            });
        loads[chosen] += cost;
        let mut ordered = vec![chosen];
        ordered.extend(order.into_iter().filter(|&node| node != chosen));
        placements[job_index] = Placement { nodes: ordered };
    }
    placements
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("searcher-{i}")).collect()
    }

    fn jobs(n: usize) -> Vec<Job> {
        (0..n)
            .map(|i| Job {
                split_id: format!("split-{i:04}"),
                cost: 1,
            })
            .collect()
    }

    #[test]
    fn placement_is_balanced_within_the_bound() {
        for (num_jobs, num_nodes) in [(60, 3), (1000, 7), (50, 10), (5, 3)] {
            let placements = place(&jobs(num_jobs), &nodes(num_nodes), 0.2);
            let mut loads = vec![0usize; num_nodes];
            for placement in &placements {
                assert_eq!(placement.nodes.len(), num_nodes);
                loads[placement.nodes[0]] += 1;
            }
            let mean = num_jobs as f64 / num_nodes as f64;
            let max = *loads.iter().max().unwrap() as f64;
            assert!(
                max <= (mean * 1.2).ceil(),
                "{num_jobs}/{num_nodes}: {loads:?}"
            );
        }
    }

    #[test]
    fn mixed_costs_stay_within_the_bound_unless_one_job_is_bigger() {
        // Fresh splits of 10 000 docs and merged ones of 100 000, as a log index has.
        let jobs: Vec<Job> = (0..200)
            .map(|i| Job {
                split_id: format!("split-{i:04}"),
                cost: if i % 10 == 0 { 100_000 } else { 10_000 },
            })
            .collect();
        let total: u64 = jobs.iter().map(|j| j.cost).sum();
        for num_nodes in [3, 7, 10, 30] {
            let placements = place(&jobs, &nodes(num_nodes), 0.2);
            let mut loads = vec![0u64; num_nodes];
            for (placement, job) in placements.iter().zip(&jobs) {
                loads[placement.nodes[0]] += job.cost;
            }
            let mean = total as f64 / num_nodes as f64;
            let bound = (mean * 1.2).ceil().max(100_000.0);
            let max = *loads.iter().max().unwrap() as f64;
            assert!(max <= bound, "{num_nodes} nodes: {loads:?}");
        }
        // A job bigger than the cap still gets a node, alone.
        let big = [
            Job {
                split_id: "big".into(),
                cost: 1_000_000,
            },
            Job {
                split_id: "small".into(),
                cost: 1,
            },
        ];
        let placements = place(&big, &nodes(2), 0.2);
        assert_ne!(placements[0].nodes[0], placements[1].nodes[0]);
    }

    #[test]
    fn a_departing_node_moves_only_its_splits() {
        let before_nodes = nodes(5);
        let jobs = jobs(500);
        // Without a load cap, placement is pure rendezvous: stable under churn.
        let before = place(&jobs, &before_nodes, f64::INFINITY);
        let mut after_nodes = before_nodes.clone();
        let departed = after_nodes.remove(2);
        let after = place(&jobs, &after_nodes, f64::INFINITY);
        for (b, a) in before.iter().zip(&after) {
            let was = &before_nodes[b.nodes[0]];
            let is = &after_nodes[a.nodes[0]];
            if *was != departed {
                assert_eq!(was, is, "a split of a live node moved");
            }
        }
        // With the load cap, most splits stay too.
        let capped_before = place(&jobs, &before_nodes, 0.2);
        let capped_after = place(&jobs, &after_nodes, 0.2);
        let stayed = capped_before
            .iter()
            .zip(&capped_after)
            .filter(|(b, a)| before_nodes[b.nodes[0]] == after_nodes[a.nodes[0]])
            .count();
        assert!(stayed >= 300, "only {stayed} of 500 splits stayed");
    }

    #[test]
    fn the_same_inputs_give_the_same_placement() {
        let a = place(&jobs(100), &nodes(4), 0.2);
        let b = place(&jobs(100), &nodes(4), 0.2);
        assert_eq!(a, b);
        assert!(place(&jobs(3), &[], 0.2).iter().all(|p| p.nodes.is_empty()));
    }
}
