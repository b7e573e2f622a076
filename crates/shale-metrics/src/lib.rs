//! The metrics data path's own concepts: series (label sets and their ids), samples, label
//! matchers, and the Parquet split that stores the samples of one time bucket sorted by
//! (metric name, sort labels, series id, timestamp), with its reader.
//!
//! Everything here is pure: bytes in, bytes out. The WAL, routing, the metastore and object
//! storage are shared with logs and live in their own crates.

pub mod column_cache;
mod labels;
mod matcher;
pub mod merge;
pub mod otlp;
pub mod promql_depth;
mod prune;
mod reader;
pub mod remote_write;
mod selector;
mod series_index;
mod split;
mod varint;
pub mod wal;

pub use labels::{
    last_per_timestamp, Labels, Sample, SeriesSamples, METRIC_NAME_LABEL, STALE_NAN_BITS,
};
pub use matcher::{MatchOp, Matcher};
pub use merge::{merge_splits, MergeCut, MergeStats, MergedOutput};
pub use prune::split_may_hold;
pub use reader::{
    label_names_from_footer, read_split, read_split_cached, read_split_ranges, read_split_with,
    FetchRange, RangeReader, ReadStats, SplitRead,
};
pub use selector::{apply_deletes, parse_selector, SeriesDelete};
pub use series_index::{SeriesIndex, MAX_INDEXED_SERIES};
pub use split::{
    bucket_start_ms, footer_offsets, series_sort_key, sort_key_kinds, MetricsSplitWriter,
    SortedSplitWriter, SplitSummary, MAX_METRIC_NAME_TAGS, SERIES_ID_COLUMN, TIMESTAMP_COLUMN,
    VALUE_COLUMN,
};

/// What can go wrong writing or reading a metrics split, or building a matcher.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The Parquet writer or reader failed.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// An Arrow array could not be built or read.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// The file is not a metrics split of this version (a column is missing or of another type).
    #[error("invalid metrics split: {0}")]
    InvalidSplit(String),
    /// A series selector does not parse.
    #[error("invalid series selector `{selector}`: {reason}")]
    InvalidSelector {
        /// The selector as given.
        selector: String,
        /// Why.
        reason: String,
    },
    /// A label matcher's regex does not compile.
    #[error("invalid regex `{regex}` in a label matcher: {reason}")]
    InvalidRegex {
        /// The regex as given.
        regex: String,
        /// Why it does not compile.
        reason: String,
    },
}
