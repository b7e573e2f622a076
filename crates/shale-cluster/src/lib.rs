//! Cluster mode: membership, leader election and the control plane's decisions, with the
//! metastore as the only shared truth.
//!
//! * [`membership`]: registration with a generation, heartbeats, the cluster view, the
//!   leader lease and the fenced metastore handle of the leader.
//! * [`control`]: what the leader does each round that is not compaction: requeue the merges
//!   of dead workers, close the shards of dead indexers and open the shards each index needs.
//! * [`placement`]: rendezvous hashing of splits onto searchers, load-capped.

#![warn(missing_docs)]

pub mod control;
pub mod membership;
pub mod placement;

pub use membership::{
    now_ms, sync_clock, ClusterError, ClusterView, InfoProvider, Leadership, Membership,
};
