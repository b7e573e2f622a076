//! Object storage access and the local split cache.
//!
//! [`Storage`] is one index's view of an object store (local file system by default, any
//! S3-compatible server by `s3://bucket/prefix`), built on the `object_store` crate.
//! [`SplitCache`] keeps downloaded split objects on local disk, bounded in bytes, LRU.

mod cache;
mod storage;

pub use cache::{CachedSplit, SplitCache, SPLIT_FILE_NAME};
pub use storage::{IndexStorages, S3Options, Storage, StorageResolver};

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
    /// Local disk I/O failed.
    #[error("local I/O error on {path}: {source}")]
    Io {
        /// The local path involved.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
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
