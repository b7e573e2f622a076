//! Cluster bookkeeping kept in the metastore, the only shared truth of a cluster: node
//! membership (registration with a generation, heartbeats), named leases (the leader's, with a
//! fencing token), the shards of each (index, source), and the fences that writes present.
//!
//! Times are milliseconds since the epoch from the caller's clock; a node is live while
//! `now - last_heartbeat < dead_after` (see [`NodeRecord::is_live`]).

use serde::{Deserialize, Serialize};
use shale_types::IndexUid;

/// One incarnation of a node: its id and the generation it got when it registered. A restart
/// under the same id is a new generation, and the old one is fenced out.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeIdentity {
    /// The node id.
    pub node_id: String,
    /// The registration it belongs to.
    pub generation: u64,
}

impl std::fmt::Display for NodeIdentity {
    /// `node_id#generation`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.node_id, self.generation)
    }
}

/// A node as registered in the metastore.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The cluster.
    pub cluster_id: String,
    /// The node id.
    pub node_id: String,
    /// Its current generation.
    pub generation: u64,
    /// `host:port` other nodes reach it at.
    pub advertise_address: String,
    /// `indexer`, `searcher`, `compactor`.
    pub roles: Vec<String>,
    /// When this generation registered.
    pub started_at_ms: i64,
    /// Its last heartbeat.
    pub last_heartbeat_ms: i64,
    /// What the node reports about itself with its heartbeats (shards, running merges, …).
    pub info: serde_json::Value,
}

impl NodeRecord {
    /// Whether the node heartbeated less than `dead_after_ms` before `now_ms`.
    pub fn is_live(&self, now_ms: i64, dead_after_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_heartbeat_ms) < dead_after_ms as i64
    }

    /// Its current incarnation.
    pub fn identity(&self) -> NodeIdentity {
        NodeIdentity {
            node_id: self.node_id.clone(),
            generation: self.generation,
        }
    }

    /// Whether it has `role`.
    pub fn has_role(&self, role: &str) -> bool {
        self.roles.iter().any(|r| r == role)
    }
}

/// A named lease and its holder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The cluster.
    pub cluster_id: String,
    /// The lease's name (`leader`).
    pub name: String,
    /// Who holds it.
    pub holder: NodeIdentity,
    /// Grows whenever the holder changes; leader writes present it (see [`Fence::Leader`]).
    pub fencing_token: u64,
    /// When it lapses unless renewed.
    pub expires_at_ms: i64,
}

/// The name of the leader lease.
pub const LEADER_LEASE: &str = "leader";

/// What a fenced write presents; the metastore refuses the write (`FailedPrecondition`),
/// changing nothing, when the fence no longer holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fence {
    /// The writer holds the cluster's leader lease with this token, unexpired when the write
    /// runs.
    Leader {
        /// The cluster.
        cluster_id: String,
        /// The leader's incarnation.
        holder: NodeIdentity,
        /// The token the writer got when it acquired the lease.
        fencing_token: u64,
    },
    /// The writer is this generation of this node (no restart has superseded it).
    Node {
        /// The cluster.
        cluster_id: String,
        /// The writer.
        identity: NodeIdentity,
    },
}

/// Whether a shard accepts documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ShardState {
    /// Documents are routed to it.
    Open,
    /// No new documents; its node publishes what its WAL holds, then deletes it.
    Closed,
}

impl ShardState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ShardState::Open => "Open",
            ShardState::Closed => "Closed",
        }
    }

    /// The state named `name`.
    pub fn parse(name: &str) -> Option<ShardState> {
        match name {
            "Open" => Some(ShardState::Open),
            "Closed" => Some(ShardState::Closed),
            _ => None,
        }
    }
}

/// Identifies a shard.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ShardKey {
    /// The index.
    pub index_uid: IndexUid,
    /// The source.
    pub source_id: String,
    /// The shard id (a ULID).
    pub shard_id: String,
}

impl ShardKey {
    /// The name of the shard's WAL queue (and of its checkpoint partition):
    /// `{index_uid}/{source_id}/{shard_id}`.
    pub fn queue_name(&self) -> String {
        format!("{}/{}/{}", self.index_uid, self.source_id, self.shard_id)
    }
}

/// A shard of an (index, source), hosted by one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// Which shard.
    #[serde(flatten)]
    pub key: ShardKey,
    /// The node whose WAL holds it.
    pub node_id: String,
    /// Open or closed.
    pub state: ShardState,
    /// Seconds since epoch.
    pub create_timestamp: i64,
    /// Seconds since epoch of the last state change.
    pub update_timestamp: i64,
}
