//! The leader's control-plane round (compaction planning and the janitor run beside it, on
//! the leader only):
//!
//! 1. **Dead workers' merges**: the Running merge tasks whose lease owner is not a live
//!    incarnation (a dead node, or an older generation of a restarted one) go back to Pending
//!    at once, for a survivor to re-run — not when their lease would expire.
//! 2. **Shards** ([`plan_shards`], a pure function): the open shards of dead indexers are
//!    closed (their node publishes what it holds when it comes back); each index keeps
//!    `min_shards_per_index` open shards on distinct live indexers (fewer if there are fewer
//!    indexers), and more — up to one per live indexer — when its ingest rate exceeds
//!    `shard_throughput_bytes_per_sec` per open shard. New shards go to the live indexer with
//!    the fewest open shards, preferring one without a shard of that index.

use std::collections::{BTreeMap, HashMap, HashSet};

use shale_config::Role;
use shale_metastore::{MergeTaskState, Metastore, MetastoreResult, Shard, ShardKey, ShardState};
use shale_types::{IndexUid, INGEST_API_SOURCE_ID};
use tracing::info;

use crate::membership::ClusterView;

/// What the shards of the cluster need.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardPlan {
    /// Open shards to close (their node is dead).
    pub close: Vec<ShardKey>,
    /// Shards to open, with their node.
    pub open: Vec<(ShardKey, String)>,
}

/// Ingest rate of each index over the cluster, in bytes per second, from what the nodes
/// report with their heartbeats (`info.ingest_bytes_per_sec`: index uid → rate).
pub fn ingest_rates(view: &ClusterView) -> HashMap<String, f64> {
    let mut rates: HashMap<String, f64> = HashMap::new();
    for node in view.live_nodes() {
        if let Some(per_index) = node
            .info
            .get("ingest_bytes_per_sec")
            .and_then(|v| v.as_object())
        {
            for (index_uid, rate) in per_index {
                *rates.entry(index_uid.clone()).or_default() += rate.as_f64().unwrap_or(0.0);
            }
        }
    }
    rates
}

/// How the leader sizes shards.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShardSettings {
    /// Ingest rate one shard is expected to take.
    pub throughput_bytes_per_sec: f64,
    /// Open shards per index, on distinct indexers when there are enough.
    pub min_shards_per_index: usize,
}

/// Decides which shards to close and open (see the module docs). `new_shard_id` makes ids.
pub fn plan_shards(
    indexes: &[IndexUid],
    shards: &[Shard],
    view: &ClusterView,
    rates: &HashMap<String, f64>,
    settings: ShardSettings,
    mut new_shard_id: impl FnMut() -> String,
) -> ShardPlan {
    let shard_throughput_bytes_per_sec = settings.throughput_bytes_per_sec;
    let mut plan = ShardPlan::default();
    let indexers: Vec<String> = view
        .live_with_role(Role::Indexer)
        .map(|node| node.node_id.clone())
        .collect();
    let live: HashSet<&str> = indexers.iter().map(String::as_str).collect();
    // Open shards per live indexer (the load new shards are balanced on).
    let mut load: BTreeMap<String, usize> = indexers.iter().map(|n| (n.clone(), 0)).collect();
    let mut open_by_index: HashMap<&IndexUid, Vec<&Shard>> = HashMap::new();
    for shard in shards.iter().filter(|s| s.state == ShardState::Open) {
        if live.contains(shard.node_id.as_str()) {
            *load.entry(shard.node_id.clone()).or_default() += 1;
            open_by_index
                .entry(&shard.key.index_uid)
                .or_default()
                .push(shard);
        } else {
            plan.close.push(shard.key.clone());
        }
    }
    if indexers.is_empty() {
        return plan;
    }
    for index_uid in indexes {
        let open = open_by_index.get(index_uid).cloned().unwrap_or_default();
        let rate = rates.get(&index_uid.to_string()).copied().unwrap_or(0.0);
        let wanted_by_rate = if shard_throughput_bytes_per_sec > 0.0 {
            (rate / shard_throughput_bytes_per_sec).ceil() as usize
        } else {
            1
        };
        let wanted = wanted_by_rate
            .max(settings.min_shards_per_index)
            .clamp(1, indexers.len());
        let mut hosts: HashSet<String> = open.iter().map(|s| s.node_id.clone()).collect();
        for _ in open.len()..wanted {
            let node = load
                .iter()
                .min_by_key(|(node, count)| (hosts.contains(*node), **count, (*node).clone()))
                .map(|(node, _)| node.clone());
            let Some(node) = node else { break };
            *load.entry(node.clone()).or_default() += 1;
            hosts.insert(node.clone());
            plan.open.push((
                ShardKey {
                    index_uid: index_uid.clone(),
                    source_id: INGEST_API_SOURCE_ID.to_string(),
                    shard_id: new_shard_id(),
                },
                node,
            ));
        }
    }
    plan
}

/// What a control round did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControlReport {
    /// Merge tasks of dead workers put back to Pending.
    pub requeued_tasks: Vec<String>,
    /// Shards closed and opened.
    pub shards: ShardPlan,
}

/// One control round by the leader, through its fenced metastore handle.
pub async fn control_round(
    leader_metastore: &dyn Metastore,
    view: &ClusterView,
    settings: ShardSettings,
) -> MetastoreResult<ControlReport> {
    let mut report = ControlReport::default();
    // 1. Merges held by incarnations that are not live.
    let live: HashSet<String> = view
        .live_nodes()
        .map(|n| n.identity().to_string())
        .collect();
    let running = leader_metastore
        .list_merge_tasks(None, &[MergeTaskState::Running], None)
        .await?;
    let orphaned: Vec<String> = running
        .iter()
        .filter_map(|task| task.lease_owner.clone())
        .filter(|owner| !live.contains(owner))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if !orphaned.is_empty() {
        report.requeued_tasks = leader_metastore
            .requeue_merge_tasks(&orphaned, shale_types::now_unix_secs())
            .await?;
        if !report.requeued_tasks.is_empty() {
            info!(tasks = report.requeued_tasks.len(), owners = ?orphaned, "requeued the merges of dead workers");
        }
    }
    // 2. Shards.
    let indexes: Vec<IndexUid> = leader_metastore
        .list_indexes()
        .await?
        .into_iter()
        .map(|index| index.index_uid)
        .collect();
    let shards = leader_metastore.list_shards(None).await?;
    let plan = plan_shards(
        &indexes,
        &shards,
        view,
        &ingest_rates(view),
        settings,
        shale_types::new_ulid,
    );
    if !plan.close.is_empty() {
        leader_metastore.close_shards(&plan.close).await?;
        info!(shards = ?plan.close, "closed the shards of dead indexers");
    }
    if !plan.open.is_empty() {
        leader_metastore.open_shards(plan.open.clone()).await?;
        info!(shards = ?plan.open, "opened shards");
    }
    report.shards = plan;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shale_metastore::{NodeIdentity, NodeRecord};

    fn node(id: &str, live: bool, roles: &[&str]) -> NodeRecord {
        NodeRecord {
            cluster_id: "c".into(),
            node_id: id.into(),
            generation: 1,
            advertise_address: format!("{id}:7280"),
            roles: roles.iter().map(|r| r.to_string()).collect(),
            started_at_ms: 0,
            last_heartbeat_ms: if live { 10_000 } else { 0 },
            info: serde_json::json!({}),
        }
    }

    fn view(nodes: Vec<NodeRecord>) -> ClusterView {
        ClusterView {
            cluster_id: "c".into(),
            self_identity: NodeIdentity {
                node_id: "a".into(),
                generation: 1,
            },
            nodes,
            observed_at_ms: 10_500,
            dead_after_ms: 5000,
            leader: None,
        }
    }

    fn shard(index: &IndexUid, id: &str, node: &str, state: ShardState) -> Shard {
        Shard {
            key: ShardKey {
                index_uid: index.clone(),
                source_id: INGEST_API_SOURCE_ID.into(),
                shard_id: id.into(),
            },
            node_id: node.into(),
            state,
            create_timestamp: 0,
            update_timestamp: 0,
        }
    }

    fn one_shard() -> ShardSettings {
        ShardSettings {
            throughput_bytes_per_sec: 5e6,
            min_shards_per_index: 1,
        }
    }

    #[test]
    fn indexes_keep_their_minimum_of_shards_on_distinct_indexers() {
        let logs = IndexUid::new("logs");
        let view = view(vec![
            node("a", true, &["indexer"]),
            node("b", true, &["indexer"]),
            node("c", true, &["indexer"]),
        ]);
        let settings = ShardSettings {
            throughput_bytes_per_sec: 5e6,
            min_shards_per_index: 2,
        };
        let plan = plan_shards(
            std::slice::from_ref(&logs),
            &[],
            &view,
            &HashMap::new(),
            settings,
            ids(),
        );
        assert_eq!(plan.open.len(), 2);
        assert_ne!(plan.open[0].1, plan.open[1].1);
        let lone = super::tests::view(vec![node("a", true, &["indexer"])]);
        let plan = plan_shards(&[logs], &[], &lone, &HashMap::new(), settings, ids());
        assert_eq!(plan.open.len(), 1, "clamped to the live indexers");
    }

    fn ids() -> impl FnMut() -> String {
        let mut next = 0;
        move || {
            next += 1;
            format!("new-{next}")
        }
    }

    #[test]
    fn every_index_gets_a_shard_on_the_least_loaded_live_indexer() {
        let logs = IndexUid::new("logs");
        let other = IndexUid::new("other");
        let view = view(vec![
            node("a", true, &["indexer", "searcher"]),
            node("b", true, &["indexer"]),
            node("c", true, &["searcher"]),
        ]);
        let shards = vec![shard(&logs, "s1", "a", ShardState::Open)];
        let plan = plan_shards(
            &[logs.clone(), other.clone()],
            &shards,
            &view,
            &HashMap::new(),
            one_shard(),
            ids(),
        );
        assert!(plan.close.is_empty());
        assert_eq!(plan.open.len(), 1);
        assert_eq!(plan.open[0].0.index_uid, other);
        assert_eq!(
            plan.open[0].1, "b",
            "a already hosts a shard; c is no indexer"
        );
    }

    #[test]
    fn shards_of_dead_indexers_are_closed_and_replaced() {
        let logs = IndexUid::new("logs");
        let view = view(vec![
            node("a", true, &["indexer"]),
            node("b", false, &["indexer"]),
        ]);
        let shards = vec![
            shard(&logs, "s1", "b", ShardState::Open),
            shard(&logs, "s0", "b", ShardState::Closed),
        ];
        let plan = plan_shards(
            std::slice::from_ref(&logs),
            &shards,
            &view,
            &HashMap::new(),
            one_shard(),
            ids(),
        );
        assert_eq!(plan.close, vec![shards[0].key.clone()]);
        assert_eq!(plan.open.len(), 1);
        assert_eq!(plan.open[0].1, "a");
    }

    #[test]
    fn a_high_ingest_rate_opens_more_shards_up_to_one_per_indexer() {
        let logs = IndexUid::new("logs");
        let view = view(vec![
            node("a", true, &["indexer"]),
            node("b", true, &["indexer"]),
            node("c", true, &["indexer"]),
        ]);
        let shards = vec![shard(&logs, "s1", "a", ShardState::Open)];
        let rates: HashMap<String, f64> = [(logs.to_string(), 12e6)].into();
        let plan = plan_shards(
            std::slice::from_ref(&logs),
            &shards,
            &view,
            &rates,
            one_shard(),
            ids(),
        );
        let mut nodes: Vec<&str> = plan.open.iter().map(|(_, n)| n.as_str()).collect();
        nodes.sort();
        assert_eq!(nodes, ["b", "c"]);
        let rates: HashMap<String, f64> = [(logs.to_string(), 100e6)].into();
        let plan = plan_shards(&[logs], &shards, &view, &rates, one_shard(), ids());
        assert_eq!(plan.open.len(), 2, "at most one shard per live indexer");
    }

    #[test]
    fn no_live_indexer_opens_nothing() {
        let logs = IndexUid::new("logs");
        let view = view(vec![node("s", true, &["searcher"])]);
        let plan = plan_shards(&[logs], &[], &view, &HashMap::new(), one_shard(), ids());
        assert_eq!(plan, ShardPlan::default());
    }
}
