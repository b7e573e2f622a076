//! Object storage access and the local split cache.
//!
//! [`Storage`] is the seam: one location in an object store (an index's split directory),
//! with one implementation per kind of store — [`LocalStorage`] (the local file system, the
//! default; writes fsynced before they are reported done) and [`S3Storage`] (any
//! S3-compatible server, `s3://bucket/prefix`, through the `object_store` crate).
//! [`StorageResolver`] and [`IndexStorages`] turn URIs into storages once and reuse them.
//! [`SplitCache`] keeps downloaded split objects on local disk within a byte budget, LRU;
//! [`RangeCache`] keeps the byte ranges of remote split objects that searches read, in memory
//! within a byte budget, LRU.

mod cache;
mod local;
mod range_cache;
mod s3;
mod storage;

pub use cache::{CachedSplit, PressureHandler, SplitCache, DEFAULT_CACHE_WAIT, SPLIT_FILE_NAME};
pub use local::LocalStorage;
pub use range_cache::{RangeCache, RANGE_CHUNK_BYTES, RANGE_FETCH_BYTES};
pub use s3::S3Storage;
pub use storage::{IndexStorages, S3Options, Storage, StorageRef, StorageResolver};

/// Fetches byte ranges of one object: what readers by ranges (Parquet's) are given.
pub type RangeFetcher = std::sync::Arc<
    dyn Fn(
            std::ops::Range<u64>,
        ) -> futures::future::BoxFuture<'static, Result<bytes::Bytes, String>>
        + Send
        + Sync,
>;

/// The byte ranges of the object `name` of `storage`, as a [`RangeFetcher`].
pub fn range_fetcher(storage: StorageRef, name: String) -> RangeFetcher {
    std::sync::Arc::new(move |range| {
        let (storage, name) = (storage.clone(), name.clone());
        Box::pin(async move {
            storage
                .get_range(&name, range)
                .await
                .map_err(|err| err.to_string())
        })
    })
}

/// [`range_fetcher`] for a caller that already runs on a blocking thread (a split decoded on
/// the blocking pool): on a local storage the object's file is opened once and each range
/// read in place, synchronously (no hop to another thread per range); on object storage,
/// the same as [`range_fetcher`].
pub fn blocking_range_fetcher(storage: StorageRef, name: String) -> RangeFetcher {
    let Some(path) = storage.local_path(&name) else {
        return range_fetcher(storage, name);
    };
    let file: std::sync::Arc<std::sync::OnceLock<Result<std::fs::File, String>>> =
        Default::default();
    std::sync::Arc::new(move |range: std::ops::Range<u64>| {
        let read = file
            .get_or_init(|| local::open_object(&path, &name).map_err(|err| err.to_string()))
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|file| {
                local::read_range(file, &path, &name, range).map_err(|err| err.to_string())
            });
        Box::pin(std::future::ready(read))
    })
}

/// Errors of storage operations.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The URI is not one we can resolve.
    #[error("invalid storage uri `{uri}`: {message}")]
    InvalidUri {
        /// The URI.
        uri: String,
        /// Why.
        message: String,
    },
    /// The object does not exist.
    #[error("object `{0}` not found")]
    NotFound(String),
    /// The object store failed.
    #[error("object store error: {0}")]
    ObjectStore(String),
    /// An object name that is not a plain relative path.
    #[error("invalid object name `{0}`")]
    InvalidName(String),
    /// The split cache's budget is taken by splits in use, and none was released in time.
    #[error(
        "the split cache is full: split `{split}` ({size} bytes) does not fit in \
         split_cache_max_bytes ({max_bytes} bytes, {pinned_bytes} in use) and no split in use \
         was released within {waited:?}; retry later or raise split_cache_max_bytes"
    )]
    CacheFull {
        /// The split that did not fit.
        split: String,
        /// Its size.
        size: u64,
        /// The cache budget.
        max_bytes: u64,
        /// Bytes held or reserved when the wait ended.
        pinned_bytes: u64,
        /// How long the fetch waited.
        waited: std::time::Duration,
    },
    /// A split larger than the whole split cache.
    #[error(
        "split `{split}` ({size} bytes) is larger than the whole split cache \
         (split_cache_max_bytes = {max_bytes})"
    )]
    CacheTooSmall {
        /// The split.
        split: String,
        /// Its size.
        size: u64,
        /// The cache budget.
        max_bytes: u64,
    },
    /// Local disk I/O failed.
    #[error("local I/O error on {path}: {source}")]
    Io {
        /// The local path involved.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl StorageError {
    /// Whether trying again later (or on another node) may succeed: the object store failed
    /// to answer, or the split cache had no room.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StorageError::ObjectStore(_) | StorageError::CacheFull { .. }
        )
    }
}

impl From<object_store::Error> for StorageError {
    fn from(err: object_store::Error) -> Self {
        match err {
            object_store::Error::NotFound { path, .. } => StorageError::NotFound(path),
            other => StorageError::ObjectStore(other.to_string()),
        }
    }
}

/// Result of storage operations.
pub type StorageResult<T> = Result<T, StorageError>;

pub(crate) fn io_err(path: &std::path::Path, source: std::io::Error) -> StorageError {
    StorageError::Io {
        path: path.display().to_string(),
        source,
    }
}
