//! Search: lists the Published splits of an index from the metastore, prunes them by time
//! range and by the tag terms a query requires (before any split is opened), searches the rest
//! concurrently (each fetched through the local split cache), and merges the top hits.
//! Every response says how many splits were opened and how many were pruned.

mod request;
mod service;

pub use request::{SearchRequest, SearchResponse, SortBy, SortOrder};
pub use service::{register_metrics, SearchError, SearchService};
