//! [`S3Storage`]: objects in a bucket of an S3-compatible server, through `object_store`.
//! Uploads are multipart for large files; an object becomes visible whole when its upload
//! completes, and S3 acknowledges a completed upload only once it is durable.
//!
//! **Requests S3 never answers.** `object_store` retries a failed request (5xx, reset
//! connection, timeout) up to 10 times within 3 minutes, each attempt bounded by a 30 s
//! request timeout (its defaults, kept). With that timeout alone, a read or write that S3
//! accepted but never answered cost 30 s, and a server that stopped answering held every
//! search, upload and merge for 3 minutes. So an attempt to read or write an object (GET,
//! HEAD, PUT of an object or a part, creation of a multipart upload) must also see its answer
//! start within 5 s of its body having had time to go out (at 1 MiB/s, see `answer_timeout`);
//! otherwise it fails as a timeout and is retried. A lost answer costs seconds, and a silent
//! server fails a read in about a minute. Long downloads are not cut: only the wait for the
//! head of the answer is bounded. Requests a server may take long to start answering
//! (listings, multipart completion, deletes) keep the 30 s request timeout only.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
};
use object_store::path::Path as ObjectPath;
use object_store::ClientOptions;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::warn;

use crate::storage::{check_name, S3Options, Storage};
use crate::{io_err, StorageError, StorageResult};

/// Part size of multipart uploads (and the size above which a file is uploaded in parts).
const UPLOAD_CHUNK: usize = 8 * 1024 * 1024;
/// Parts of one multipart upload sent at once.
const MAX_PARTS_IN_FLIGHT: usize = 8;

/// How long an object read or write waits for the start of its answer (status and headers),
/// counted from when its body had time to go out. S3 starts answering them in milliseconds.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The upload rate a request body is given time for before `ANSWER_TIMEOUT` starts: an
/// 8 MiB part may take 8 s more.
const MIN_UPLOAD_BYTES_PER_SEC: f64 = 1024.0 * 1024.0;

/// How long an attempt of `request` waits for its answer to start: `None` (only the request
/// timeout) but for object reads and writes (GET and HEAD but listings, PUT of an object or
/// a part, and the creation of a multipart upload, which S3 answers at once).
fn answer_timeout(request: &HttpRequest) -> Option<Duration> {
    let query = request.uri().query().unwrap_or_default();
    let has_param = |name: &str| {
        query
            .split('&')
            .any(|pair| pair.split('=').next() == Some(name))
    };
    let object_io = match request.method().as_str() {
        "GET" | "HEAD" => !has_param("list-type"),
        "PUT" => true,
        "POST" => has_param("uploads"),
        _ => false,
    };
    if !object_io {
        return None;
    }
    let body_bytes = request.body().content_length();
    Some(ANSWER_TIMEOUT + Duration::from_secs_f64(body_bytes as f64 / MIN_UPLOAD_BYTES_PER_SEC))
}

/// `object_store`'s reqwest client (with every option of the builder), an attempt of which
/// fails as a timeout (retried like one) when its answer does not start in time (see
/// `answer_timeout`).
#[derive(Debug, Default)]
struct AnswerTimeoutConnector;

impl HttpConnector for AnswerTimeoutConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(AnswerTimeout { inner }))
    }
}

/// See [`AnswerTimeoutConnector`].
#[derive(Debug)]
struct AnswerTimeout {
    inner: HttpClient,
}

/// An attempt whose answer did not start in time.
#[derive(Debug, thiserror::Error)]
#[error("no answer from the object store within {0:?}")]
struct NoAnswer(Duration);

#[async_trait]
impl HttpService for AnswerTimeout {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let Some(limit) = answer_timeout(&request) else {
            return self.inner.execute(request).await;
        };
        // The client's future resolves with the answer's head; its body is read afterwards.
        match tokio::time::timeout(limit, self.inner.execute(request)).await {
            Ok(answer) => answer,
            Err(_) => Err(HttpError::new(HttpErrorKind::Timeout, NoAnswer(limit))),
        }
    }
}

/// A prefix inside one bucket.
#[derive(Clone, Debug)]
pub struct S3Storage {
    uri: String,
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
}

impl S3Storage {
    /// A client for `bucket`, configured by `options` then the `AWS_*` environment.
    pub fn connect(bucket: &str, options: &S3Options) -> StorageResult<S3Storage> {
        let uri = format!("s3://{bucket}");
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Some(endpoint) = &options.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        // A plain `http://` endpoint (MinIO, moto) is allowed by naming it.
        let http_endpoint = options
            .endpoint
            .as_deref()
            .is_some_and(|endpoint| endpoint.starts_with("http://"));
        builder = builder.with_allow_http(options.allow_http.unwrap_or(false) || http_endpoint);
        let region = options
            .region
            .clone()
            .or_else(|| std::env::var("AWS_REGION").ok())
            .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
            .unwrap_or_else(|| "us-east-1".to_string());
        builder = builder.with_region(region);
        if let Some(key) = &options.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &options.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        let path_style = options
            .force_path_style
            .unwrap_or(options.endpoint.is_some());
        if let Some(max_retries) = options.max_retries {
            builder = builder.with_retry(object_store::RetryConfig {
                max_retries,
                ..Default::default()
            });
        }
        builder = builder
            .with_virtual_hosted_style_request(!path_style)
            .with_http_connector(AnswerTimeoutConnector);
        let store = builder.build().map_err(|err| StorageError::InvalidUri {
            uri: uri.clone(),
            // object_store's builder errors name settings, never their values.
            message: err.to_string(),
        })?;
        Ok(S3Storage {
            uri,
            store: Arc::new(store),
            prefix: ObjectPath::default(),
        })
    }

    fn key(&self, name: &str) -> StorageResult<ObjectPath> {
        check_name(name)?;
        let parts = self
            .prefix
            .parts()
            .map(|p| p.as_ref().to_string())
            .chain(name.split('/').map(str::to_string))
            .collect::<Vec<_>>();
        Ok(ObjectPath::from_iter(parts))
    }
}

#[async_trait]
impl Storage for S3Storage {
    fn uri(&self) -> &str {
        &self.uri
    }

    fn child(&self, name: &str) -> Arc<dyn Storage> {
        let name = name.trim_matches('/');
        let prefix = ObjectPath::from_iter(
            self.prefix.parts().map(|p| p.as_ref().to_string()).chain(
                name.split('/')
                    .filter(|p| !p.is_empty())
                    .map(str::to_string),
            ),
        );
        Arc::new(S3Storage {
            uri: format!("{}/{name}", self.uri),
            store: self.store.clone(),
            prefix,
        })
    }

    async fn put_file(&self, name: &str, local: &Path) -> StorageResult<u64> {
        let key = self.key(name)?;
        let mut file = tokio::fs::File::open(local)
            .await
            .map_err(|err| io_err(local, err))?;
        let len = file
            .metadata()
            .await
            .map_err(|err| io_err(local, err))?
            .len();
        // Small files: one PUT.
        if len <= UPLOAD_CHUNK as u64 {
            let mut bytes = Vec::with_capacity(len as usize);
            file.read_to_end(&mut bytes)
                .await
                .map_err(|err| io_err(local, err))?;
            let total = bytes.len() as u64;
            self.store.put(&key, bytes.into()).await?;
            return Ok(total);
        }
        // Large files: a multipart upload, aborted on any failure (a part, or the
        // completion), so that no unfinished upload is left in the bucket to be paid for.
        let upload = self.store.put_multipart(&key).await?;
        let mut writer = object_store::WriteMultipart::new_with_chunk_size(upload, UPLOAD_CHUNK);
        let mut buf = vec![0u8; 1024 * 1024];
        let mut total = 0u64;
        let written: StorageResult<()> = async {
            loop {
                let n = file
                    .read(&mut buf)
                    .await
                    .map_err(|err| io_err(local, err))?;
                if n == 0 {
                    break;
                }
                total += n as u64;
                writer.wait_for_capacity(MAX_PARTS_IN_FLIGHT).await?;
                writer.write(&buf[..n]);
            }
            Ok(())
        }
        .await;
        if let Err(err) = written {
            if let Err(abort) = writer.abort().await {
                warn!(%abort, key = %key, "could not abort a failed multipart upload");
            }
            return Err(err);
        }
        // Completes, or aborts when completing fails.
        writer.finish().await?;
        Ok(total)
    }

    async fn put_bytes(&self, name: &str, bytes: Vec<u8>) -> StorageResult<()> {
        self.store.put(&self.key(name)?, bytes.into()).await?;
        Ok(())
    }

    async fn get_bytes(&self, name: &str) -> StorageResult<bytes::Bytes> {
        Ok(self.store.get(&self.key(name)?).await?.bytes().await?)
    }

    async fn get_range(&self, name: &str, range: Range<u64>) -> StorageResult<bytes::Bytes> {
        Ok(self.store.get_range(&self.key(name)?, range).await?)
    }

    async fn get_to_file(&self, name: &str, dest: &Path) -> StorageResult<u64> {
        let key = self.key(name)?;
        let tmp = dest.with_extension("partial");
        let result = async {
            let mut stream = self.store.get(&key).await?.into_stream();
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

    async fn delete(&self, name: &str) -> StorageResult<()> {
        match self.store.delete(&self.key(name)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    async fn exists(&self, name: &str) -> StorageResult<bool> {
        match self.store.head(&self.key(name)?).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    async fn probe(&self, name: &str) -> StorageResult<()> {
        match self.store.head(&self.key(name)?).await {
            Ok(_)
            | Err(object_store::Error::NotFound { .. })
            | Err(object_store::Error::PermissionDenied { .. })
            | Err(object_store::Error::Unauthenticated { .. }) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    async fn list(&self) -> StorageResult<Vec<String>> {
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
