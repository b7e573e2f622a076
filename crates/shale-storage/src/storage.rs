//! Resolving storage URIs to object stores, and moving split files in and out of them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::buffered::BufWriter;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{io_err, StorageError, StorageResult};

/// Connection settings for S3-compatible stores. Unset values fall back to the standard
/// `AWS_*` environment variables.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct S3Options {
    /// e.g. `http://127.0.0.1:9000` for MinIO/moto; `None` for AWS.
    pub endpoint: Option<String>,
    /// Region (default `us-east-1`).
    pub region: Option<String>,
    /// Access key.
    pub access_key_id: Option<String>,
    /// Secret key.
    pub secret_access_key: Option<String>,
    /// Path-style requests (`endpoint/bucket/key`), needed by most non-AWS servers.
    pub force_path_style: Option<bool>,
    /// Allow plain HTTP endpoints.
    pub allow_http: Option<bool>,
}

/// Turns storage URIs into [`Storage`]s.
#[derive(Clone, Debug, Default)]
pub struct StorageResolver {
    s3: S3Options,
}

impl StorageResolver {
    /// A resolver using `s3` for `s3://` URIs.
    pub fn new(s3: S3Options) -> Self {
        StorageResolver { s3 }
    }

    /// Resolves `file:///abs/dir`, a plain path, or `s3://bucket/prefix`.
    pub fn resolve(&self, uri: &str) -> StorageResult<Storage> {
        let invalid = |message: &str| StorageError::InvalidUri {
            uri: uri.to_string(),
            message: message.to_string(),
        };
        if let Some(rest) = uri.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(invalid("missing bucket name"));
            }
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
            let opts = &self.s3;
            if let Some(endpoint) = &opts.endpoint {
                builder = builder.with_endpoint(endpoint);
                if endpoint.starts_with("http://") {
                    builder = builder.with_allow_http(true);
                }
            }
            let region = opts
                .region
                .clone()
                .or_else(|| std::env::var("AWS_REGION").ok())
                .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
                .unwrap_or_else(|| "us-east-1".to_string());
            builder = builder.with_region(region);
            if let Some(key) = &opts.access_key_id {
                builder = builder.with_access_key_id(key);
            }
            if let Some(secret) = &opts.secret_access_key {
                builder = builder.with_secret_access_key(secret);
            }
            if let Some(allow_http) = opts.allow_http {
                builder = builder.with_allow_http(allow_http);
            }
            let path_style = opts.force_path_style.unwrap_or(opts.endpoint.is_some());
            builder = builder.with_virtual_hosted_style_request(!path_style);
            let store = builder.build().map_err(|err| invalid(&err.to_string()))?;
            return Ok(Storage {
                uri: uri.trim_end_matches('/').to_string(),
                store: Arc::new(store),
                prefix: ObjectPath::from(prefix.trim_matches('/')),
                local_root: None,
            });
        }
        let dir = if let Some(rest) = uri.strip_prefix("file://") {
            PathBuf::from(rest)
        } else if uri.contains("://") {
            return Err(invalid("unsupported scheme (use file:// or s3://)"));
        } else {
            PathBuf::from(uri)
        };
        std::fs::create_dir_all(&dir).map_err(|err| io_err(&dir, err))?;
        let dir = dir.canonicalize().map_err(|err| io_err(&dir, err))?;
        let store = LocalFileSystem::new_with_prefix(&dir)?.with_automatic_cleanup(true);
        Ok(Storage {
            uri: format!("file://{}", dir.display()),
            store: Arc::new(store),
            prefix: ObjectPath::default(),
            local_root: Some(dir),
        })
    }
}

/// One location in an object store (an index's split directory).
#[derive(Clone, Debug)]
pub struct Storage {
    uri: String,
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    /// The directory objects live in, for the local file system: whole-file transfers then
    /// use the kernel's file copy instead of streaming through `object_store`.
    local_root: Option<PathBuf>,
}

const UPLOAD_CHUNK: usize = 8 * 1024 * 1024;

impl Storage {
    /// The URI this storage was resolved from.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// A storage for the sub-directory `name` (e.g. an index's directory under the root).
    pub fn child(&self, name: &str) -> Storage {
        Storage {
            uri: format!("{}/{}", self.uri, name),
            store: self.store.clone(),
            prefix: self.key(name),
            local_root: self.local_root.clone(),
        }
    }

    fn key(&self, name: &str) -> ObjectPath {
        let mut parts: Vec<String> = self
            .prefix
            .parts()
            .map(|p| p.as_ref().to_string())
            .collect();
        parts.extend(
            name.split('/')
                .filter(|p| !p.is_empty())
                .map(str::to_string),
        );
        ObjectPath::from_iter(parts)
    }

    /// The local path of object `name` on a local file system storage.
    fn local_path(&self, name: &str) -> Option<PathBuf> {
        let root = self.local_root.as_ref()?;
        let mut path = root.clone();
        for part in self.key(name).parts() {
            path.push(part.as_ref());
        }
        Some(path)
    }

    /// Uploads a local file as object `name`, streaming (multipart on S3 for large files).
    /// Atomic: readers never see a partial object.
    pub async fn put_file(&self, name: &str, local: &Path) -> StorageResult<u64> {
        if let Some(dest) = self.local_path(name) {
            if let Some(parent) = dest.parent() {
                tokio::fs::create_dir_all(parent)
                    .await
                    .map_err(|err| io_err(parent, err))?;
            }
            let tmp = dest.with_extension(format!("{}.uploading", shale_types::new_ulid()));
            let copied = tokio::fs::copy(local, &tmp)
                .await
                .map_err(|err| io_err(local, err));
            let result = match copied {
                Ok(size) => tokio::fs::rename(&tmp, &dest)
                    .await
                    .map(|_| size)
                    .map_err(|err| io_err(&dest, err)),
                Err(err) => Err(err),
            };
            if result.is_err() {
                let _ = tokio::fs::remove_file(&tmp).await;
            }
            return result;
        }
        let mut file = tokio::fs::File::open(local)
            .await
            .map_err(|err| io_err(local, err))?;
        let mut writer = BufWriter::with_capacity(self.store.clone(), self.key(name), UPLOAD_CHUNK);
        let mut buf = vec![0u8; 1024 * 1024];
        let mut total = 0u64;
        loop {
            let n = file
                .read(&mut buf)
                .await
                .map_err(|err| io_err(local, err))?;
            if n == 0 {
                break;
            }
            total += n as u64;
            if let Err(err) = writer.write_all(&buf[..n]).await {
                let _ = writer.abort().await;
                return Err(StorageError::ObjectStore(err.to_string()));
            }
        }
        writer
            .shutdown()
            .await
            .map_err(|err| StorageError::ObjectStore(err.to_string()))?;
        Ok(total)
    }

    /// Uploads bytes as object `name`.
    pub async fn put_bytes(&self, name: &str, bytes: Vec<u8>) -> StorageResult<()> {
        self.store.put(&self.key(name), bytes.into()).await?;
        Ok(())
    }

    /// Reads the whole object `name`.
    pub async fn get_bytes(&self, name: &str) -> StorageResult<bytes::Bytes> {
        Ok(self.store.get(&self.key(name)).await?.bytes().await?)
    }

    /// Reads `range` of object `name`.
    pub async fn get_range(
        &self,
        name: &str,
        range: std::ops::Range<u64>,
    ) -> StorageResult<bytes::Bytes> {
        Ok(self.store.get_range(&self.key(name), range).await?)
    }

    /// Downloads object `name` to the local file `dest` (written to a temp name, then renamed,
    /// so a reader never sees a partial file). Returns its size.
    pub async fn get_to_file(&self, name: &str, dest: &Path) -> StorageResult<u64> {
        let tmp = dest.with_extension("partial");
        if let Some(src) = self.local_path(name) {
            let result = match tokio::fs::copy(&src, &tmp).await {
                Ok(size) => tokio::fs::rename(&tmp, dest)
                    .await
                    .map(|_| size)
                    .map_err(|err| io_err(dest, err)),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                    Err(StorageError::NotFound(name.to_string()))
                }
                Err(err) => Err(io_err(&src, err)),
            };
            if result.is_err() {
                let _ = tokio::fs::remove_file(&tmp).await;
            }
            return result;
        }
        let result = async {
            let mut stream = self.store.get(&self.key(name)).await?.into_stream();
            let mut file = tokio::fs::File::create(&tmp)
                .await
                .map_err(|err| io_err(&tmp, err))?;
            let mut total = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                total += chunk.len() as u64;
                file.write_all(&chunk)
                    .await
                    .map_err(|err| io_err(&tmp, err))?;
            }
            file.flush().await.map_err(|err| io_err(&tmp, err))?;
            tokio::fs::rename(&tmp, dest)
                .await
                .map_err(|err| io_err(dest, err))?;
            Ok(total)
        }
        .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        result
    }

    /// Deletes object `name`; deleting a missing object is not an error.
    pub async fn delete(&self, name: &str) -> StorageResult<()> {
        match self.store.delete(&self.key(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Whether object `name` exists.
    pub async fn exists(&self, name: &str) -> StorageResult<bool> {
        match self.store.head(&self.key(name)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    /// Names of the objects directly or indirectly under this storage.
    pub async fn list(&self) -> StorageResult<Vec<String>> {
        let prefix = (!self.prefix.as_ref().is_empty()).then_some(&self.prefix);
        let mut stream = self.store.list(prefix);
        let mut names = Vec::new();
        let prefix_len = self.prefix.parts().count();
        while let Some(meta) = stream.next().await {
            let meta = meta?;
            let rel: Vec<String> = meta
                .location
                .parts()
                .skip(prefix_len)
                .map(|p| p.as_ref().to_string())
                .collect();
            names.push(rel.join("/"));
        }
        names.sort();
        Ok(names)
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
        assert_eq!(
            storage.get_range("a.split", 0..4).await.unwrap().as_ref(),
            &[7u8; 4]
        );
        storage.delete("a.split").await.unwrap();
        storage.delete("a.split").await.unwrap();
        assert!(!storage.exists("a.split").await.unwrap());
        assert!(matches!(
            storage.get_to_file("a.split", &dest).await,
            Err(StorageError::NotFound(_))
        ));
        assert!(StorageResolver::default().resolve("gs://x").is_err());
    }
}

/// Where each index's splits live: its `index_uri` when set, else `{default root}/{index_id}`.
#[derive(Clone, Debug)]
pub struct IndexStorages {
    resolver: StorageResolver,
    default_root: String,
}

impl IndexStorages {
    /// Indexes without an `index_uri` go under `default_root` (a storage URI).
    pub fn new(resolver: StorageResolver, default_root: impl Into<String>) -> Self {
        IndexStorages {
            resolver,
            default_root: default_root.into(),
        }
    }

    /// The URI of the index's storage.
    pub fn index_uri(&self, index_id: &str, index_uri: Option<&str>) -> String {
        match index_uri {
            Some(uri) => uri.trim_end_matches('/').to_string(),
            None => format!("{}/{}", self.default_root.trim_end_matches('/'), index_id),
        }
    }

    /// The storage of an index.
    pub fn for_index(&self, index_id: &str, index_uri: Option<&str>) -> StorageResult<Storage> {
        self.resolver.resolve(&self.index_uri(index_id, index_uri))
    }
}
