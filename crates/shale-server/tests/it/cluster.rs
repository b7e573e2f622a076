//! Membership and leadership on real nodes sharing one metastore: the cluster API, one leader
//! at a time, takeover when the leader leaves or dies, and a zombie incarnation fenced out.

use crate::common;

use std::time::{Duration, Instant};

use common::{config_in, TestNode};
use serde_json::Value;
use shale_config::{ClusterConfig, NodeConfig};

fn fast_cluster(dir: &std::path::Path, metastore_uri: &str, node_id: &str) -> NodeConfig {
    let mut config = config_in(&dir.join(node_id));
    config.node_id = node_id.to_string();
    config.metastore_uri = metastore_uri.to_string();
    config.default_index_root_uri = format!("file://{}/indexes", dir.display());
    config.cluster = ClusterConfig {
        heartbeat_interval_ms: 100,
        dead_after_ms: 600,
        leader_lease_ms: 500,
        ..ClusterConfig::default()
    };
    config
}

/// Nodes `a`, `b` and `c` on one metastore, once each sees the three live.
async fn three_nodes(dir: &std::path::Path, metastore: &str) -> [TestNode; 3] {
    let a = TestNode::start_with(fast_cluster(dir, metastore, "a")).await;
    let b = TestNode::start_with(fast_cluster(dir, metastore, "b")).await;
    let c = TestNode::start_with(fast_cluster(dir, metastore, "c")).await;
    for node in [&a, &b, &c] {
        wait_for("three live nodes", async || {
            node_ids(&cluster_state(node).await, "live_nodes").len() == 3
        })
        .await;
    }
    [a, b, c]
}

async fn cluster_state(node: &TestNode) -> Value {
    let (status, body) = node.get("/api/v1/cluster").await;
    assert_eq!(status, 200, "{body}");
    body
}

fn node_ids(state: &Value, key: &str) -> Vec<String> {
    state[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node_id"].as_str().unwrap().to_string())
        .collect()
}

/// Waits until the open shards (of every index) are on exactly the nodes `expected` (sorted).
/// Open shards only: under a loaded machine a node can be declared dead for a moment, and the
/// leader then closes its shard and opens another once it is back.
async fn wait_open_shards_on(node: &TestNode, expected: &[&str]) {
    wait_for("open shards on the indexers", async || {
        let shards = node.node.metastore.list_shards(None).await.unwrap();
        let mut nodes: Vec<String> = shards
            .iter()
            .filter(|s| s.state == shale_metastore::ShardState::Open)
            .map(|s| s.node_id.clone())
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes == expected
    })
    .await;
}

async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_single_node_is_a_cluster_of_one_and_leads_it() {
    let node = TestNode::start().await;
    let state = cluster_state(&node).await;
    assert_eq!(state["cluster_id"], "shale-default-cluster");
    assert_eq!(state["self_node_id"], "test-node");
    assert_eq!(node_ids(&state, "live_nodes"), ["test-node"]);
    assert!(state["dead_nodes"].as_array().unwrap().is_empty());
    let me = &state["live_nodes"][0];
    assert_eq!(me["is_leader"], true);
    assert_eq!(me["generation"], 1);
    assert_eq!(
        me["roles"],
        serde_json::json!(["indexer", "searcher", "compactor"])
    );
    assert_eq!(state["leader"]["node_id"], "test-node");
    node.stop().await;
}

#[tokio::test]
async fn one_leader_at_a_time_and_a_takeover_when_it_leaves_or_dies() {
    let tmp = tempfile::tempdir().unwrap();
    let metastore = format!("sqlite://{}/metastore.db", tmp.path().display());
    let [a, b, c] = three_nodes(tmp.path(), &metastore).await;
    let leaders = |nodes: [&TestNode; 3]| {
        nodes
            .iter()
            .filter(|n| n.node.membership.leadership().is_some())
            .count()
    };
    assert_eq!(leaders([&a, &b, &c]), 1);
    assert!(
        a.node.membership.leadership().is_some(),
        "the first node leads"
    );

    // A graceful stop gives the lease up: another node leads at once.
    a.stop().await;
    wait_for("a new leader after a graceful stop", async || {
        b.node.membership.leadership().is_some() || c.node.membership.leadership().is_some()
    })
    .await;
    let (survivor, other) = if b.node.membership.leadership().is_some() {
        (b, c)
    } else {
        (c, b)
    };
    let leadership = survivor.node.membership.leadership().unwrap();
    let token = leadership.fencing_token;
    wait_for("a declared dead", async || {
        node_ids(&cluster_state(&other).await, "dead_nodes") == ["a"]
    })
    .await;
    // It left with a last heartbeat at the epoch: its heartbeat age is unknown (null), not
    // the time since 1970; the live nodes' ages are small.
    let state = cluster_state(&other).await;
    assert_eq!(state["dead_nodes"][0]["last_heartbeat_ms"], 0, "{state}");
    assert!(
        state["dead_nodes"][0]["heartbeat_age_ms"].is_null(),
        "{state}"
    );
    for live in state["live_nodes"].as_array().unwrap() {
        let age = live["heartbeat_age_ms"].as_i64().unwrap();
        assert!(age < 60_000, "{state}");
    }

    // The leader dies without a word (its heartbeats and renewals stop): the other node takes
    // over once the lease lapses, with a higher fencing token.
    let started = Instant::now();
    survivor.node.halt().await;
    wait_for("a takeover after the leader died", async || {
        other.node.membership.leadership().is_some()
    })
    .await;
    let takeover = started.elapsed();
    assert!(takeover < Duration::from_secs(10), "{takeover:?}");
    let new_token = other.node.membership.leadership().unwrap().fencing_token;
    assert!(new_token > token);
    // The dead leader's fenced writes are refused from now on.
    let err = leadership
        .metastore
        .create_index(
            shale_config::IndexConfig::parse(b"index_id: stale-leader\ndoc_mapping: {}\n").unwrap(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("fenced"), "{err}");
    let state = cluster_state(&other).await;
    assert_eq!(
        state["leader"]["node_id"],
        other.node.config.node_id.as_str()
    );
    other.stop().await;
    drop(survivor);
}

#[tokio::test]
async fn a_restart_under_the_same_id_fences_the_old_incarnation_out() {
    let tmp = tempfile::tempdir().unwrap();
    let metastore = format!("sqlite://{}/metastore.db", tmp.path().display());
    let old = TestNode::start_with(fast_cluster(tmp.path(), &metastore, "n")).await;
    assert_eq!(old.node.membership.identity().generation, 1);
    let node_metastore = old.node.membership.node_metastore();
    // The same node id registers again (its restart, while the old process still runs).
    old.node
        .metastore
        .register_node("shale-default-cluster", "n", "127.0.0.1:1", &[], 0)
        .await
        .unwrap();
    wait_for("the old incarnation to notice", async || {
        old.node.membership.is_superseded()
    })
    .await;
    assert!(old.node.membership.leadership().is_none());
    // Its writes are refused.
    let err = node_metastore
        .create_index(
            shale_config::IndexConfig::parse(b"index_id: zombie\ndoc_mapping: {}\n").unwrap(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("fenced"), "{err}");
    old.stop().await;
}

/// Any node takes ingest for any index: documents go to a shard of the receiving node, or
/// are forwarded to an open shard elsewhere; every document is then found through every node.
#[tokio::test]
async fn ingest_through_any_node_is_routed_to_the_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let metastore = format!("sqlite://{}/metastore.db", tmp.path().display());
    let secret = |mut config: NodeConfig, roles: &str| {
        config.cluster.cluster_secret = Some("s3cret-between-nodes".to_string());
        // No takeover is tested here: slower failure detection keeps a loaded CI machine
        // from declaring a node dead between two heartbeats.
        config.cluster.dead_after_ms = 3_000;
        config.cluster.leader_lease_ms = 2_000;
        config.roles = shale_config::Role::parse_list(roles).unwrap();
        config
    };
    let a = TestNode::start_with(secret(
        fast_cluster(tmp.path(), &metastore, "a"),
        "indexer,searcher,compactor",
    ))
    .await;
    let b = TestNode::start_with(secret(
        fast_cluster(tmp.path(), &metastore, "b"),
        "indexer,searcher",
    ))
    .await;
    // c hosts no shard: it forwards everything.
    let c = TestNode::start_with(secret(
        fast_cluster(tmp.path(), &metastore, "c"),
        "searcher",
    ))
    .await;
    wait_for("three live nodes", async || {
        node_ids(&cluster_state(&c).await, "live_nodes").len() == 3
    })
    .await;
    a.create_index(common::LOGS_INDEX).await;
    // Two shards (min_shards_per_index), on the two indexers.
    wait_open_shards_on(&a, &["a", "b"]).await;
    for (i, node) in [&a, &b, &c].into_iter().enumerate() {
        let response = node
            .ingest(
                "logs",
                &common::log_docs(i * 100, 100, 1_700_000_000, "api"),
                "force",
            )
            .await;
        assert_eq!(response["num_ingested_docs"], 100, "{response}");
    }
    // A bad document is reported by the node that received it, the rest are routed.
    let mut mixed = common::log_docs(1000, 3, 1_700_000_000, "api");
    mixed.push_str("{\"timestamp\": \"not a date\"}\n");
    let response = c.ingest("logs", &mixed, "force").await;
    assert_eq!(response["num_ingested_docs"], 3);
    assert_eq!(response["num_rejected_docs"], 1);
    for node in [&a, &b, &c] {
        assert_eq!(node.count("logs", "*").await, 303);
    }
    // The internal API wants the secret.
    let (status, body) = a.post("/internal/v1/control/round", String::new()).await;
    assert_eq!(status, 401, "{body}");
    for node in [a, b, c] {
        node.stop().await;
    }
}

/// A search through any node places the splits on every live searcher, and gives the same
/// answer; when a searcher dies its splits are searched elsewhere, and nothing is dropped.
#[tokio::test]
async fn searches_fan_out_to_every_searcher_and_survive_a_dead_one() {
    let tmp = tempfile::tempdir().unwrap();
    let metastore = format!("sqlite://{}/metastore.db", tmp.path().display());
    let [a, b, c] = three_nodes(tmp.path(), &metastore).await;
    let no_merge = common::LOGS_INDEX.replace(
        "  commit_timeout_secs: 1\n",
        "  commit_timeout_secs: 1\n  merge_policy:\n    type: no_merge\n",
    );
    a.create_index(&no_merge).await;
    for batch in 0..9 {
        let node = [&a, &b, &c][batch % 3];
        node.ingest(
            "logs",
            &common::log_docs(batch * 50, 50, 1_700_000_000, "api"),
            "force",
        )
        .await;
    }
    // Aggregations merged across nodes are those of all the documents: log_docs gives
    // status 200 + i % 5 and host-(i % 3) for i in 0..450.
    let request = serde_json::json!({"query": "*", "max_hits": 30, "start_offset": 5,
        "aggs": {"status": {"terms": {"field": "status", "order": {"_key": "asc"}},
                            "aggs": {"hosts": {"cardinality": {"field": "status"}}}},
                 "per_min": {"date_histogram": {"field": "timestamp", "fixed_interval": "1m"}}}});
    let reference = a.search("logs", request.clone()).await;
    assert_eq!(reference["num_hits"], 450, "{reference}");
    let aggs = &reference["aggregations"];
    let status_counts: Vec<(u64, u64)> = aggs["status"]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["key"].as_f64().unwrap() as u64,
                b["doc_count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        status_counts,
        vec![(200, 90), (201, 90), (202, 90), (203, 90), (204, 90)],
        "{aggs}"
    );
    let per_min: Vec<u64> = aggs["per_min"]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["doc_count"].as_u64().unwrap())
        .collect();
    assert_eq!(per_min.iter().sum::<u64>(), 450, "{aggs}");
    assert!(reference["num_splits_searched"].as_u64().unwrap() >= 9);
    assert!(
        reference["num_nodes"].as_u64().unwrap() >= 2,
        "splits spread over the searchers: {reference}"
    );
    for node in [&b, &c] {
        let response = node.search("logs", request.clone()).await;
        assert_eq!(response["hits"], reference["hits"]);
        assert_eq!(response["num_hits"], reference["num_hits"]);
        assert_eq!(response["aggregations"], reference["aggregations"]);
    }
    // c dies: its splits are searched elsewhere, the answer is complete.
    c.kill().await;
    for _ in 0..5 {
        let response = a.search("logs", request.clone()).await;
        assert_eq!(response["num_hits"], 450, "{response}");
        assert_eq!(response["hits"], reference["hits"]);
        assert_eq!(response["aggregations"], reference["aggregations"]);
        assert!(
            response["errors"].as_array().unwrap().is_empty(),
            "{response}"
        );
    }
    for node in [a, b] {
        node.stop().await;
    }
}

/// A delete through any node applies at once on every node, spares what any indexer
/// acknowledges after it, and a manual compaction started anywhere runs on the cluster.
#[tokio::test]
async fn deletes_and_manual_compactions_work_across_the_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    let metastore = format!("sqlite://{}/metastore.db", tmp.path().display());
    let config = |node_id: &str, roles: &str| {
        let mut config = fast_cluster(tmp.path(), &metastore, node_id);
        config.cluster.dead_after_ms = 3_000;
        config.cluster.leader_lease_ms = 2_000;
        config.compaction.planner_interval_secs = 1;
        config.roles = shale_config::Role::parse_list(roles).unwrap();
        config
    };
    let a = TestNode::start_with(config("a", "indexer,searcher,compactor")).await;
    let b = TestNode::start_with(config("b", "indexer,searcher,compactor")).await;
    let c = TestNode::start_with(config("c", "searcher")).await;
    wait_for("three live nodes", async || {
        node_ids(&cluster_state(&c).await, "live_nodes").len() == 3
    })
    .await;
    let index = common::LOGS_INDEX.replace(
        "  commit_timeout_secs: 1\n",
        "  commit_timeout_secs: 1\n  merge_policy:\n    type: no_merge\n",
    );
    a.create_index(&index).await;
    wait_open_shards_on(&a, &["a", "b"]).await;
    for (i, node) in [&a, &b, &c].into_iter().enumerate() {
        node.ingest(
            "logs",
            &common::log_docs(i * 100, 100, 1_700_000_000, "api"),
            "force",
        )
        .await;
    }
    // 30 ERROR documents, on splits of both indexers.
    let (status, task) = c
        .post(
            "/api/v1/logs/delete-tasks",
            serde_json::json!({"query": "level:ERROR"}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{task}");
    for node in [&a, &b, &c] {
        assert_eq!(node.count("logs", "level:ERROR").await, 0);
        assert_eq!(node.count("logs", "*").await, 270);
    }
    // Both indexers stamp what they acknowledge from now on: these are not deleted.
    a.ingest(
        "logs",
        &common::log_docs(1000, 100, 1_700_000_000, "late"),
        "force",
    )
    .await;
    b.ingest(
        "logs",
        &common::log_docs(2000, 100, 1_700_000_000, "late"),
        "force",
    )
    .await;
    for node in [&a, &b, &c] {
        assert_eq!(node.count("logs", "level:ERROR").await, 20);
    }
    // A manual compaction asked of the searcher node runs on the compactors (`force`: the
    // splits of a `no_merge` index are mature).
    let (status, started) = c
        .post(
            "/api/v1/indexes/logs/compact",
            r#"{"force": true}"#.to_string(),
        )
        .await;
    assert_eq!(status, 200, "{started}");
    let id = started["compaction_id"].as_str().unwrap().to_string();
    let mut done = serde_json::Value::Null;
    wait_for("the compaction to complete", async || {
        let (_, status) = c
            .get(&format!("/api/v1/indexes/logs/compactions/{id}"))
            .await;
        done = status.clone();
        status["state"] == "completed"
    })
    .await;
    assert_eq!(done["splits_after"], 1, "{done}");
    for node in [&a, &b, &c] {
        assert_eq!(node.count("logs", "*").await, 470);
        assert_eq!(node.count("logs", "level:ERROR").await, 20);
    }
    for node in [a, b, c] {
        node.stop().await;
    }
}

/// The reproduced defect: a forwarded `wait_for` batch that was appended on the remote shard
/// and then met a stopping pipeline came back as a 500 and was re-sent to another shard, so
/// it was indexed twice. Now the entry node answers that the outcome is unknown and sends
/// it nowhere else; the batch is published once, by the shard that has it.
#[tokio::test]
async fn a_forwarded_batch_whose_outcome_is_unknown_is_never_sent_to_another_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let metastore = format!("sqlite://{}/metastore.db", tmp.path().display());
    let config = |node_id: &str, roles: &str| {
        let mut config = fast_cluster(tmp.path(), &metastore, node_id);
        config.cluster.dead_after_ms = 3_000;
        config.cluster.leader_lease_ms = 2_000;
        config.roles = shale_config::Role::parse_list(roles).unwrap();
        config
    };
    let a = TestNode::start_with(config("a", "indexer,searcher,compactor")).await;
    let b = TestNode::start_with(config("b", "indexer,searcher")).await;
    // c hosts no shard: it forwards everything.
    let c = TestNode::start_with(config("c", "searcher")).await;
    wait_for("three live nodes", async || {
        node_ids(&cluster_state(&c).await, "live_nodes").len() == 3
    })
    .await;
    // A long commit timeout: a `wait_for` batch waits in the pipeline.
    a.create_index(
        &common::LOGS_INDEX.replace("commit_timeout_secs: 1", "commit_timeout_secs: 60"),
    )
    .await;
    wait_open_shards_on(&a, &["a", "b"]).await;
    // c must know both shards before it forwards.
    c.node.sync_shards().await.unwrap();
    let appended = |node: &TestNode| {
        let router = node.node.router.clone();
        async move {
            router
                .shard_statuses()
                .await
                .iter()
                .map(|s| s.next_position)
                .sum::<u64>()
        }
    };

    let url = c.url("/api/v1/logs/ingest?commit=wait_for");
    let body = common::log_docs(0, 50, 1_700_000_000, "api");
    let client = c.client.clone();
    let request = tokio::spawn(async move {
        let response = client.post(url).body(body).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap())
    });
    // The batch lands in one shard's WAL, and waits for its commit there.
    let mut holder = None;
    wait_for("the batch appended to a shard", async || {
        for node in [&a, &b] {
            if appended(node).await > 0 {
                holder = Some(node.node.clone());
                return true;
            }
        }
        false
    })
    .await;
    let holder = holder.unwrap();
    let other = if holder.config.node_id == "a" { &b } else { &a };
    // Its pipeline stops before the commit.
    holder.router.stop().await;
    let (status, body) = request.await.unwrap();
    assert_eq!(status, 502, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("may or may not have been ingested"),
        "the client is told the outcome is unknown: {body}"
    );
    assert_eq!(
        appended(other).await,
        0,
        "the batch was not sent to the other shard"
    );
    // Once the holder serves its shard again, the batch is published, once.
    holder.sync_shards().await.unwrap();
    let holder_node = if holder.config.node_id == "a" { &a } else { &b };
    let response = holder_node
        .ingest(
            "logs",
            &common::log_docs(50, 1, 1_700_000_100, "api"),
            "force",
        )
        .await;
    assert_eq!(response["num_ingested_docs"], 1, "{response}");
    wait_for("the batch published once", async || {
        c.count("logs", "*").await == 51
    })
    .await;
    for node in [a, b, c] {
        node.stop().await;
    }
}

/// The reproduced defect: a delete task answered 200 before a node it could not reach had
/// advanced its opstamp; that node went on stamping new documents below the task, which then
/// deleted them. Now the answer waits until such a node's stamp lease has lapsed (from then
/// it refuses appends until it learns of the task), so what any node acknowledges after the
/// answer is never deleted by it.
#[tokio::test]
async fn a_delete_waits_for_the_nodes_it_cannot_reach_and_spares_what_they_acknowledge_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let metastore = format!("sqlite://{}/metastore.db", tmp.path().display());
    let mut a_config = fast_cluster(tmp.path(), &metastore, "a");
    a_config.cluster.dead_after_ms = 3_000;
    a_config.cluster.leader_lease_ms = 2_000;
    let a = TestNode::start_with(a_config).await;
    // b refreshes what it knows only every 2 s, and a cannot call it (its advertised address
    // is closed): a delete cannot reach b in time but by waiting.
    let mut b_config = fast_cluster(tmp.path(), &metastore, "b");
    b_config.cluster.heartbeat_interval_ms = 2_000;
    b_config.cluster.dead_after_ms = 10_000;
    b_config.cluster.leader_lease_ms = 8_000;
    b_config.advertise_address = Some(format!("127.0.0.1:{}", shale_testkit::free_port()));
    let b = TestNode::start_with(b_config).await;
    wait_for("two live nodes", async || {
        node_ids(&cluster_state(&a).await, "live_nodes").len() == 2
    })
    .await;
    a.create_index(common::LOGS_INDEX).await;
    wait_for("an open shard on b", async || {
        b.node.sync_shards().await.unwrap();
        !b.node
            .router
            .open_shards_of(
                &a.node
                    .metastore
                    .index_metadata("logs")
                    .await
                    .unwrap()
                    .index_uid,
            )
            .await
            .is_empty()
    })
    .await;
    // b hosts a shard: what it is sent lands there.
    let before = common::log_docs(0, 30, 1_700_000_000, "api");
    assert_eq!(
        b.ingest("logs", &before, "force").await["num_ingested_docs"],
        30
    );
    let (status, task) = a
        .post(
            "/api/v1/logs/delete-tasks",
            serde_json::json!({"query": "service:api"}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{task}");
    // At once after the answer, b takes more documents the task would match.
    let after = common::log_docs(100, 30, 1_700_000_000, "api");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let response = b
            .client
            .post(b.url("/api/v1/logs/ingest?commit=force"))
            .body(after.clone())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        if status == 200 {
            assert_eq!(body["num_ingested_docs"], 30, "{body}");
            break;
        }
        // Refused while b cannot confirm the delete history: retryable, nothing appended.
        assert_eq!(status, 503, "{body}");
        assert!(
            Instant::now() < deadline,
            "b never took the documents: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for("the later documents searchable", async || {
        a.count("logs", "*").await == 30
    })
    .await;
    assert_eq!(
        a.count("logs", "service:api").await,
        30,
        "what b acknowledged after the delete answered is not deleted"
    );
    for node in [a, b] {
        node.stop().await;
    }
}

/// PromQL on a cluster: the splits of a metrics index are read by the searchers they are
/// placed on, the node asked merges their series and finishes the query; the answer is the
/// one a single node gives, and a dead searcher's splits are read by the node asked.
#[tokio::test]
async fn promql_selectors_run_on_the_leaves_the_splits_are_placed_on() {
    use shale_metrics::remote_write::{
        encode_remote_write, Label, ProtoSample, TimeSeries, WriteRequest,
    };
    let dir = tempfile::tempdir().unwrap();
    let metastore = format!("sqlite://{}/shared.db", dir.path().display());
    let [a, b, c] = three_nodes(dir.path(), &metastore).await;
    let (status, body) = a
        .post(
            "/api/v1/indexes",
            // Merges off: the test counts the 12 fresh splits.
            "index_id: cluster-metrics\nmetrics:\n  sort_labels: [host]\nindexing_settings:\n  merge_policy:\n    type: no_merge\n",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // 12 commits of 3 series: 12 splits, spread over the three searchers by placement.
    let t0: i64 = 1_780_084_800_000;
    for i in 0..12i64 {
        let request = WriteRequest {
            timeseries: ["h1", "h2", "h3"]
                .iter()
                .map(|host| TimeSeries {
                    labels: vec![
                        Label {
                            name: "__name__".into(),
                            value: "requests_total".into(),
                        },
                        Label {
                            name: "host".into(),
                            value: host.to_string(),
                        },
                    ],
                    samples: vec![ProtoSample {
                        value: (i * 10) as f64,
                        timestamp: t0 + i * 15_000,
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let resp = a
            .client
            .post(a.url("/prometheus/cluster-metrics/api/v1/write?commit=force"))
            .header("Content-Encoding", "snappy")
            .body(encode_remote_write(&request))
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status().as_u16(),
            204,
            "{}",
            resp.text().await.unwrap()
        );
    }
    let query = |node: &TestNode, q: &'static str| {
        let client = node.client.clone();
        let url = node.url("/prometheus/cluster-metrics/api/v1/query");
        async move {
            let resp = client
                .get(url)
                .query(&[("query", q), ("time", &((t0 + 165_000) / 1000).to_string())])
                .send()
                .await
                .unwrap();
            let calls: u64 = resp.headers()["x-shale-leaf-calls"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let opened: u64 = resp.headers()["x-shale-splits-opened"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let body: Value = resp.json().await.unwrap();
            (calls, opened, body)
        }
    };
    let (calls, opened, body) = query(&b, "sum(increase(requests_total[3m]))").await;
    assert!(calls >= 1, "no split was read on another node");
    assert_eq!(opened, 12);
    assert_eq!(body["status"], "success", "{body}");
    // 3 series, each 0 → 110: no extrapolation before a first sample of 0 (a counter does
    // not go below zero), none after the last (at the evaluation time): 110 each.
    let total: f64 = body["data"]["result"][0]["value"][1]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let (_, _, raw) = query(&b, "requests_total").await;
    assert_eq!(raw["data"]["result"].as_array().unwrap().len(), 3, "{raw}");
    for series in raw["data"]["result"].as_array().unwrap() {
        assert_eq!(series["value"][1], "110", "{raw}");
    }
    assert_eq!(total, 330.0);
    // The same on another node, and once a searcher is dead: its splits are read here.
    let (_, _, same) = query(&c, "sum(increase(requests_total[3m]))").await;
    assert_eq!(same["data"]["result"], body["data"]["result"]);
    c.kill().await;
    let (_, opened, after) = query(&a, "sum(increase(requests_total[3m]))").await;
    assert_eq!(opened, 12);
    assert_eq!(after["data"]["result"], body["data"]["result"]);
    a.stop().await;
    b.stop().await;
}

/// Metrics compaction across nodes: remote write spread over three nodes leaves every series
/// in each node's fresh splits of a bucket; cluster-scope locality merges gather each closed
/// bucket into level-1 splits whose ranges do not overlap, so a one-series query opens one
/// split per bucket — with the same answers.
#[tokio::test]
async fn metrics_splits_of_every_node_merge_into_one_per_bucket() {
    use shale_metrics::remote_write::{
        encode_remote_write, Label, ProtoSample, TimeSeries, WriteRequest,
    };
    let dir = tempfile::tempdir().unwrap();
    let metastore = format!("sqlite://{}/shared.db", dir.path().display());
    let config = |id: &str, compaction: bool| {
        let mut config = fast_cluster(dir.path(), &metastore, id);
        config.compaction.enabled = compaction;
        config.compaction.planner_interval_secs = 1;
        config
    };
    let mut nodes = Vec::new();
    for id in ["a", "b", "c"] {
        nodes.push(TestNode::start_with(config(id, false)).await);
    }
    for node in &nodes {
        wait_for("three live nodes", async || {
            node_ids(&cluster_state(node).await, "live_nodes").len() == 3
        })
        .await;
    }
    let (status, body) = nodes[0]
        .post(
            "/api/v1/indexes",
            "index_id: spread\nmetrics:\n  sort_labels: [job]\nindexing_settings:\n  commit_timeout_secs: 1\n",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Two closed buckets; each request (to a node in turn) holds every series' next minute.
    let t0: i64 = 1_780_084_800_000;
    let label = |name: &str, value: String| Label {
        name: name.into(),
        value,
    };
    for minute in 0..30i64 {
        let request = WriteRequest {
            timeseries: (0..40)
                .map(|s| TimeSeries {
                    labels: vec![
                        label("__name__", "cpu_seconds_total".into()),
                        label("job", format!("job-{}", s % 4)),
                        label("instance", format!("host-{s}")),
                    ],
                    samples: (0..4)
                        .map(|i| ProtoSample {
                            value: (minute * 4 + i) as f64,
                            timestamp: t0 + minute * 60_000 + i * 15_000,
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let node = &nodes[minute as usize % 3];
        let resp = node
            .client
            .post(node.url("/prometheus/spread/api/v1/write?commit=force"))
            .header("Content-Encoding", "snappy")
            .body(encode_remote_write(&request))
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status().as_u16(),
            204,
            "{}",
            resp.text().await.unwrap()
        );
    }
    let one_series = |node: &TestNode| {
        let client = node.client.clone();
        let url = node.url("/prometheus/spread/api/v1/query_range");
        async move {
            let resp = client
                .get(url)
                .query(&[
                    (
                        "query",
                        "rate(cpu_seconds_total{job=\"job-1\",instance=\"host-5\"}[5m])",
                    ),
                    ("start", &(t0 / 1000).to_string()),
                    ("end", &(t0 / 1000 + 1800).to_string()),
                    ("step", "30"),
                ])
                .send()
                .await
                .unwrap();
            let opened: u64 = resp.headers()["x-shale-splits-opened"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body["status"], "success", "{body}");
            (opened, body["data"].clone())
        }
    };
    let (opened_before, answer) = one_series(&nodes[1]).await;
    let splits = |node: &TestNode| {
        let client = node.client.clone();
        let url = node.url("/api/v1/indexes/spread/splits?split_states=Published");
        async move {
            let body: Value = client.get(url).send().await.unwrap().json().await.unwrap();
            body["splits"].as_array().unwrap().clone()
        }
    };
    let before = splits(&nodes[0]).await;
    let writers: std::collections::BTreeSet<&str> = before
        .iter()
        .map(|s| s["node_id"].as_str().unwrap())
        .collect();
    // Shards are placed on some of the nodes: writes to the others are forwarded.
    assert!(writers.len() >= 2, "splits from several nodes: {writers:?}");
    assert!(
        opened_before >= 20,
        "{opened_before} splits before compaction"
    );
    // Restart the nodes with compaction on (the leader plans for the cluster).
    for node in nodes.drain(..) {
        node.stop().await;
    }
    for id in ["a", "b", "c"] {
        nodes.push(TestNode::start_with(config(id, true)).await);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let after = loop {
        let list = splits(&nodes[0]).await;
        if list.len() == 2 && list.iter().all(|s| s["key_level"] == 1) {
            break list;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not gathered: {} splits, levels {:?}",
            list.len(),
            list.iter()
                .map(|s| s["key_level"].clone())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    };
    let samples =
        |list: &[Value]| -> u64 { list.iter().map(|s| s["num_docs"].as_u64().unwrap()).sum() };
    assert_eq!(samples(&after), samples(&before));
    assert_eq!(samples(&after), 30 * 40 * 4);
    let (opened_after, same) = one_series(&nodes[2]).await;
    assert_eq!(opened_after, 2, "one split per bucket");
    assert_eq!(same, answer);
    eprintln!(
        "one-series query over 30 min: {opened_before} splits opened before, {opened_after} after \
         ({}x fewer)",
        opened_before / opened_after.max(1)
    );
    for node in nodes {
        node.stop().await;
    }
}

/// Fresh samples across a cluster: samples acknowledged by three indexers and not published
/// yet (an hour-long commit timeout) answer a PromQL query on any node — its own from memory,
/// the others' through the internal API — and once published they are counted once.
#[tokio::test]
async fn promql_reads_every_indexer_s_unpublished_samples() {
    use shale_metrics::remote_write::{Label, ProtoSample, TimeSeries, WriteRequest};
    let dir = tempfile::tempdir().unwrap();
    let metastore = format!("sqlite://{}/shared.db", dir.path().display());
    let nodes = three_nodes(dir.path(), &metastore).await;
    let (status, body) = nodes[0]
        .post(
            "/api/v1/indexes",
            "index_id: live\nmetrics:\n  sort_labels: [job]\nindexing_settings:\n  commit_timeout_secs: 3600\n",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    wait_open_shards_on(&nodes[0], &["a", "b", "c"]).await;
    let t0: i64 = 1_780_084_800_000;
    async fn write(node: &TestNode, t0: i64, job: String, points: i64, commit: &str) {
        let request = WriteRequest {
            timeseries: (0..points.min(1))
                .map(|_| TimeSeries {
                    labels: vec![
                        Label {
                            name: "__name__".into(),
                            value: "jobs_total".into(),
                        },
                        Label {
                            name: "job".into(),
                            value: job.clone(),
                        },
                    ],
                    samples: (0..points)
                        .map(|i| ProtoSample {
                            value: i as f64,
                            timestamp: t0 + i * 15_000,
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let path = format!("/prometheus/live/api/v1/write?commit={commit}");
        let (status, text) = node.remote_write(&path, &request).await;
        assert_eq!(status, 204, "{text}");
    }
    for (i, node) in nodes.iter().enumerate() {
        write(node, t0, format!("job-{i}"), 4 + i as i64, "auto").await;
    }
    let total = 4 + 5 + 6;
    let held: Vec<usize> = nodes.iter().map(|n| n.node.live.stats().samples).collect();
    assert_eq!(held.iter().sum::<usize>(), total, "{held:?}");
    assert!(held[0] < total, "every write landed on a: {held:?}");
    let query = |node: &TestNode| {
        let client = node.client.clone();
        let url = node.url("/prometheus/live/api/v1/query");
        async move {
            let resp = client
                .get(url)
                .query(&[
                    ("query", "count_over_time(jobs_total[1h])".to_string()),
                    ("time", ((t0 + 3_600_000) / 1000).to_string()),
                    ("stats", "all".to_string()),
                ])
                .send()
                .await
                .unwrap();
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body["status"], "success", "{body}");
            (
                common::vector_by(&body, "job"),
                body["data"]["stats"]["live"].clone(),
            )
        }
    };
    let expected: Vec<(String, String)> = (0..3)
        .map(|i| (format!("job-{i}"), (4 + i).to_string()))
        .collect();
    for node in &nodes {
        let (counts, live) = query(node).await;
        assert_eq!(counts, expected);
        assert_eq!(live["samples"], total, "{live}");
        assert_eq!(live["indexerCalls"], 2, "{live}");
    }
    // Published on every node: the same counts, none read from memory.
    for node in &nodes {
        write(node, t0, String::new(), 0, "force").await;
    }
    for node in &nodes {
        let (counts, live) = query(node).await;
        assert_eq!(counts, expected);
        assert_eq!(live["samples"], 0, "{live}");
    }
    for node in nodes {
        node.stop().await;
    }
}
