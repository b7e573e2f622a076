//! Doc mapping and split building, opening and merging, on Tantivy.
//!
//! * [`DocMapper`] turns a [`DocMapping`](shale_config::DocMapping) into a Tantivy schema,
//!   parses JSON documents into [`ParsedDoc`]s (type checks, coercion of numeric strings,
//!   datetime `input_formats`, timestamp, tags, partition id) on the ingest hot path, renders
//!   stored documents back as JSON hits ([`DocMapper::doc_to_json`]) and parses queries
//!   ([`DocMapper::parse_query`], AND by default as in Quickwit), time filters
//!   ([`DocMapper::time_range_query`], a [`TimeFilterQuery`] that skips the blocks of
//!   documents outside the range) and the tag terms a query requires
//!   ([`DocMapper::required_tag_terms`], checked against a split's tags with
//!   [`split_may_match_tags`]).
//! * [`SplitBuilder`] indexes parsed documents into a scratch directory and
//!   [`finish`](SplitBuilder::finish)es into a **split bundle**: one self-describing file (see
//!   [`bundle`]) plus a [`BuiltSplit`] summary (doc count, time range, tags, sizes).
//! * [`open_split`] opens a bundle as a read-only, memory-mapped Tantivy [`Index`](tantivy::Index)
//!   without unpacking it; [`unpack_split`] writes its files out instead. A bundle on object
//!   storage opens from its hot cache and footer alone ([`BundleDirectory::open_remote`],
//!   [`open_bundle`]) and is read by byte ranges after that.
//! * [`merge_splits`] merges splits of one doc mapping into a new bundle;
//!   [`merge_split_files_with_deletes`] and [`merge_split_files_capped`] leave out what delete
//!   tasks delete (and cut outputs at a size cap); the locality merge does the same.
//!
//! **Deletes.** Every document carries its ingest opstamp in the hidden fast field
//! [`OPSTAMP_FIELD_NAME`]; [`DocMapper::delete_task_query`] matches what a delete task deletes
//! (its query, its time range, an opstamp below the task's), [`DocMapper::without_deleted`]
//! excludes it from a search, [`segment_deletes`] turns it into alive bitsets for merges and
//! [`count_deleted`] counts it for the delete-compaction triggers.
//!
//! **Tags.** For every tag field a split records each value present as `field:value`; past
//! [`MAX_VALUES_PER_TAG_FIELD`] distinct values it records only `field!`, meaning "any value".
//!
//! **Partitions.** [`ParsedDoc::partition_id`] comes from the doc mapping's partition key (0 when
//! none). The indexing pipeline caps distinct partitions per split at `max_num_partitions` by
//! sending the overflow to [`OTHER_PARTITION_ID`].

#![warn(missing_docs)]

pub mod bundle;
mod date;
mod deletes;
mod doc_mapper;
mod error;
mod exclusion;
mod glob;
mod hotcache;
mod key_filter;
mod locality_merge;
mod merge;
mod pruning;
mod query;
mod remote;
mod split;
mod time_filter;
mod tokenizers;

pub use bundle::{
    open_bundle, open_split, unpack_split, BundleDirectory, BundleFile, BundleFooter, HotSlice,
};
pub use date::{java_date_format_to_strptime, parse_with_java_format};
pub use deletes::{count_deleted, segment_deletes, SegmentDeletes};
pub use doc_mapper::{
    field_presence_hash, DocMapper, DocStoreSettings, MapperInputs, ParsedDoc,
    DOC_LENGTH_FIELD_NAME, DYNAMIC_FIELD_NAME, FIELD_PRESENCE_FIELD_NAME, MAX_DOC_BYTES,
    OPSTAMP_FIELD_NAME, SORT_KEY_FIELD_NAME, SOURCE_FIELD_NAME,
};
pub use error::{DocParsingError, IndexError};
pub use key_filter::KeyFilter;
pub use locality_merge::{locality_merge_split_files, LocalityCut, LocalityOutput};
pub use merge::{
    merge_split_files, merge_split_files_capped, merge_split_files_with_deletes, merge_splits,
    merge_splits_to, merge_splits_with_deletes,
};
pub use pruning::SplitPruner;
pub use query::{any_value_tag, split_may_match_tags, MAX_QUERY_DEPTH, MAX_VALUES_PER_TAG_FIELD};
pub use remote::RangeRead;
pub use shale_config::OTHER_PARTITION_ID;
pub use split::{
    split_stats, BuiltSplit, SplitBuilder, SplitStats, MIN_HEAP_BYTES_PER_THREAD,
    SPLIT_STATS_VERSION,
};
pub use time_filter::TimeFilterQuery;
pub use tokenizers::fast_field_tokenizers;

#[cfg(test)]
mod tests;
