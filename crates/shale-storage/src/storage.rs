//! The [`Storage`] seam: one location in an object store (an index's split directory), with
//! one implementation per kind of store ([`LocalStorage`], [`S3Storage`]), and the resolvers
//! that turn URIs into storages once and hand out the same instance afterwards.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::local::LocalStorage;
use crate::s3::S3Storage;
use crate::{StorageError, StorageResult};

/// One location in an object store. Object names are relative (`{split_id}.split`, or
/// `dir/name`); they never contain `..`.
#[async_trait]
pub trait Storage: Send + Sync + std::fmt::Debug {
    /// The URI this storage stands for (`file:///abs/dir` or `s3://bucket/prefix`).
    fn uri(&self) -> &str;

    /// The storage of the sub-directory `name` (e.g. an index's directory under the root).
    fn child(&self, name: &str) -> Arc<dyn Storage>;

    /// Uploads the local file `local` as object `name` and returns its size. Atomic (readers
    /// never see a partial object) and durable when it returns: the object survives a crash
    /// of this machine, so it can be published. `local` must not change afterwards: a local
    /// storage on the same file system links it instead of copying it.
    async fn put_file(&self, name: &str, local: &Path) -> StorageResult<u64>;

    /// Uploads `bytes` as object `name` (atomic and durable, as [`Storage::put_file`]).
    async fn put_bytes(&self, name: &str, bytes: Vec<u8>) -> StorageResult<()>;

    /// Reads the whole object `name`.
    async fn get_bytes(&self, name: &str) -> StorageResult<bytes::Bytes>;

    /// Reads bytes `range` of object `name` (one ranged GET on S3). A range past the end of
    /// the object is an error.
    async fn get_range(&self, name: &str, range: Range<u64>) -> StorageResult<bytes::Bytes>;

    /// Whether objects are files on this machine (searches then map them whole instead of
    /// reading them by ranges).
    fn is_local(&self) -> bool {
        false
    }

    /// The file holding object `name` on this machine, for a local storage: searches map it
    /// in place rather than copying it (no second copy, no space needed on a full disk).
    fn local_path(&self, _name: &str) -> Option<PathBuf> {
        None
    }

    /// Downloads object `name` to the local file `dest` (written to a temporary name, then
    /// renamed, so a reader never sees a partial file) and returns its size.
    async fn get_to_file(&self, name: &str, dest: &Path) -> StorageResult<u64>;

    /// Deletes object `name`; deleting a missing object is not an error.
    async fn delete(&self, name: &str) -> StorageResult<()>;

    /// Whether object `name` exists.
    async fn exists(&self, name: &str) -> StorageResult<bool>;

    /// Names of the objects under this storage, sorted (uploads in progress are not listed).
    async fn list(&self) -> StorageResult<Vec<String>>;

    /// Whether the store answers at all: asks for object `name` (which need not exist);
    /// an error only when no answer came (an answer refusing access is an answer).
    async fn probe(&self, name: &str) -> StorageResult<()> {
        self.exists(name).await.map(|_| ())
    }
}

/// A shared handle on a [`Storage`].
pub type StorageRef = Arc<dyn Storage>;

/// Connection settings for S3-compatible stores. Unset values fall back to the standard
/// `AWS_*` environment variables.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct S3Options {
    /// e.g. `http://127.0.0.1:9000` for MinIO/moto; `None` for AWS.
    pub endpoint: Option<String>,
    /// Region (default `us-east-1`).
    pub region: Option<String>,
    /// Access key.
    pub access_key_id: Option<String>,
    /// Secret key (never printed by `Debug`).
    pub secret_access_key: Option<String>,
    /// Path-style requests (`endpoint/bucket/key`), needed by most non-AWS servers.
    pub force_path_style: Option<bool>,
    /// Allow plain HTTP endpoints.
    pub allow_http: Option<bool>,
    /// Retries of a failed request (`None`: `object_store`'s default, 10 within 3 minutes).
    #[serde(default)]
    pub max_retries: Option<usize>,
}

impl std::fmt::Debug for S3Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Options")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field("force_path_style", &self.force_path_style)
            .field("allow_http", &self.allow_http)
            .field("max_retries", &self.max_retries)
            .finish()
    }
}

/// Checks that `name` is a relative object name without `..` or empty components.
pub(crate) fn check_name(name: &str) -> StorageResult<()> {
    let bad = name.is_empty()
        || name.starts_with('/')
        || name
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..");
    if bad {
        return Err(StorageError::InvalidName(name.to_string()));
    }
    Ok(())
}

/// Turns storage URIs into [`Storage`]s. A URI is resolved once: later calls return the same
/// storage (and, for S3, one client per bucket), so nothing is created or canonicalized per
/// request.
#[derive(Debug, Default)]
pub struct StorageResolver {
    s3: S3Options,
    resolved: Mutex<HashMap<String, StorageRef>>,
}

impl StorageResolver {
    /// A resolver using `s3` for `s3://` URIs.
    pub fn new(s3: S3Options) -> Self {
        StorageResolver {
            s3,
            resolved: Mutex::new(HashMap::new()),
        }
    }

    /// Resolves `file:///abs/dir`, a plain path, or `s3://bucket/prefix`. A local directory
    /// is created if missing.
    pub fn resolve(&self, uri: &str) -> StorageResult<StorageRef> {
        let key = uri.trim_end_matches('/').to_string();
        let existing = self.lock().get(&key).cloned();
        if let Some(storage) = existing {
            return Ok(storage);
        }
        let storage = self.resolve_uncached(&key)?;
        Ok(self.lock().entry(key).or_insert(storage).clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, StorageRef>> {
        // The map stays consistent if a holder panicked: inserts are single operations.
        self.resolved
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn resolve_uncached(&self, uri: &str) -> StorageResult<StorageRef> {
        if let Some(rest) = uri.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(StorageError::InvalidUri {
                    uri: uri.to_string(),
                    message: "missing bucket name".to_string(),
                });
            }
            // One client per bucket: children of the bucket's root share it.
            let root_key = format!("s3://{bucket}");
            let existing = self.lock().get(&root_key).cloned();
            let root = match existing {
                Some(root) => root,
                None => {
                    let root: StorageRef = Arc::new(S3Storage::connect(bucket, &self.s3)?);
                    self.lock().entry(root_key).or_insert(root).clone()
                }
            };
            let prefix = prefix.trim_matches('/');
            return Ok(if prefix.is_empty() {
                root
            } else {
                root.child(prefix)
            });
        }
        let dir = if let Some(rest) = uri.strip_prefix("file://") {
            PathBuf::from(rest)
        } else if uri.contains("://") {
            return Err(StorageError::InvalidUri {
                uri: uri.to_string(),
                message: "unsupported scheme (use file:// or s3://)".to_string(),
            });
        } else {
            PathBuf::from(uri)
        };
        Ok(Arc::new(LocalStorage::open(&dir)?))
    }
}

/// Where each index's splits live: its `index_uri` when set, else `{default root}/{index_id}`.
/// Cheap to clone; storages are resolved once per URI.
///
/// It also tells which of them could not be reached lately (see
/// [`IndexStorages::mark_unreachable`]): an index whose storage cannot be reached is
/// answered "unavailable" at once instead of failing after the object store's retries,
/// while the node goes on serving the others.
#[derive(Clone, Debug)]
pub struct IndexStorages {
    resolver: Arc<StorageResolver>,
    default_root: String,
    /// By storage URI: why it could not be reached.
    unreachable: Arc<Mutex<HashMap<String, String>>>,
}

impl IndexStorages {
    /// Indexes without an `index_uri` go under `default_root` (a storage URI).
    pub fn new(resolver: StorageResolver, default_root: impl Into<String>) -> Self {
        IndexStorages {
            resolver: Arc::new(resolver),
            default_root: default_root.into(),
            unreachable: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn unreachable_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        // Single inserts and removals: consistent even if a holder panicked.
        self.unreachable
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records that the index's storage could not be reached (`error` says why), until
    /// [`IndexStorages::mark_reachable`].
    pub fn mark_unreachable(&self, index_id: &str, index_uri: Option<&str>, error: &str) {
        let uri = self.index_uri(index_id, index_uri);
        self.unreachable_lock().insert(uri, error.to_string());
    }

    /// Records that the index's storage answered again.
    pub fn mark_reachable(&self, index_id: &str, index_uri: Option<&str>) {
        let uri = self.index_uri(index_id, index_uri);
        self.unreachable_lock().remove(&uri);
    }

    /// Why the index's storage is unusable, if it could not be reached lately: a message
    /// naming the index, its storage URI and the error.
    pub fn unreachable(&self, index_id: &str, index_uri: Option<&str>) -> Option<String> {
        let unreachable = self.unreachable_lock();
        if unreachable.is_empty() {
            return None;
        }
        let uri = self.index_uri(index_id, index_uri);
        unreachable.get(&uri).map(|error| {
            format!(
                "the storage of index `{index_id}` ({uri}) cannot be reached: {error}; it is \
                 retried in the background, retry later"
            )
        })
    }

    /// The URI of the index's storage.
    pub fn index_uri(&self, index_id: &str, index_uri: Option<&str>) -> String {
        match index_uri {
            Some(uri) => uri.trim_end_matches('/').to_string(),
            None => format!("{}/{}", self.default_root.trim_end_matches('/'), index_id),
        }
    }

    /// The storage of an index (the same instance on every call).
    pub fn for_index(&self, index_id: &str, index_uri: Option<&str>) -> StorageResult<StorageRef> {
        self.resolver.resolve(&self.index_uri(index_id, index_uri))
    }

    /// The storage of the default root.
    pub fn root(&self) -> StorageResult<StorageRef> {
        self.resolver.resolve(&self.default_root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_storage_round_trips_files() {
        let dir = tempfile::tempdir().unwrap();
        let storage = StorageResolver::default()
            .resolve(&format!("file://{}", dir.path().join("root").display()))
            .unwrap()
            .child("my-index");
        let src = dir.path().join("src.bin");
        std::fs::write(&src, vec![7u8; 3 * 1024 * 1024 + 17]).unwrap();
        assert_eq!(
            storage.put_file("a.split", &src).await.unwrap(),
            3 * 1024 * 1024 + 17
        );
        assert!(storage.exists("a.split").await.unwrap());
        assert_eq!(storage.list().await.unwrap(), vec!["a.split".to_string()]);
        let dest = dir.path().join("dest.bin");
        storage.get_to_file("a.split", &dest).await.unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(&src).unwrap());
        storage
            .put_bytes("sub/b.json", b"{}".to_vec())
            .await
            .unwrap();
        assert_eq!(
            storage.get_bytes("sub/b.json").await.unwrap().as_ref(),
            b"{}"
        );
        assert_eq!(
            storage.list().await.unwrap(),
            vec!["a.split".to_string(), "sub/b.json".to_string()]
        );
        storage.delete("a.split").await.unwrap();
        storage.delete("a.split").await.unwrap();
        assert!(!storage.exists("a.split").await.unwrap());
        assert!(matches!(
            storage.get_to_file("a.split", &dest).await,
            Err(StorageError::NotFound(_))
        ));
        assert!(matches!(
            storage.get_bytes("../escape").await,
            Err(StorageError::InvalidName(_))
        ));
        assert!(StorageResolver::default().resolve("gs://x").is_err());
    }

    #[tokio::test]
    async fn a_uri_is_resolved_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = format!("file://{}", dir.path().join("root").display());
        let storages = IndexStorages::new(StorageResolver::default(), root);
        let first = storages.for_index("logs", None).unwrap();
        // The directory may disappear: the resolved storage is reused, not re-created.
        let second = storages.for_index("logs", None).unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        let other = storages.for_index("other", None).unwrap();
        assert!(!Arc::ptr_eq(&first, &other));
        assert!(first.uri().ends_with("/root/logs"), "{}", first.uri());
    }
}
