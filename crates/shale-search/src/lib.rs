//! Search: the root lists the Published splits of an index (those of the time range) from
//! the metastore, prunes them by the tag terms a query requires (before any split is opened),
//! places them on the live searchers by rendezvous hashing, fans out leaf requests (each leaf
//! searches its splits through its local split cache, or by byte ranges of remote splits), retries failed splits elsewhere,
//! merges the top hits and fetches the page. Every response says how many splits were opened,
//! how many were pruned and how many nodes served it.

pub mod aggs;
pub mod elastic;
pub mod leaf;
pub mod partial_cache;
mod remote;
mod request;
mod service;

pub use request::{
    HitMeta, SearchRequest, SearchResponse, SortBy, SortField, SortOrder, MAX_SORT_FIELDS,
};
pub use service::{
    register_metrics, IndexView, LocalNodes, NodeCallError, SearchError, SearchNodes,
    SearchService, LOCAL_NODE, MAX_HITS_LIMIT, MAX_PLACEMENT_IMBALANCE,
};
