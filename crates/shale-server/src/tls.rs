//! TLS of the node's listeners (REST, OTLP/gRPC) with rustls and its `ring` provider: the
//! server config built from a [`TlsConfig`] (mutual TLS when `verify_client_cert`), kept
//! current while its PEM files change ([`ReloadingTls`]: a bad new file keeps the old config
//! and logs a warning), and the accept loop that serves a router over TLS connections
//! ([`serve_tls`]: one task per connection, handshake timeout, graceful shutdown). Also the
//! client side of node-to-node HTTPS ([`client_tls`]).

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use sha2::{Digest, Sha256};
use shale_config::TlsConfig;

/// How long a client has to finish its TLS handshake before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default interval between checks of the certificate files.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// Milliseconds between checks of the certificate files (see [`set_reload_interval`]).
static RELOAD_INTERVAL_MS: AtomicU64 = AtomicU64::new(5_000);

/// Sets how often every listener checks its certificate files (tests shorten it).
pub fn set_reload_interval(interval: Duration) {
    let ms = u64::try_from(interval.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    RELOAD_INTERVAL_MS.store(ms, Ordering::Relaxed);
}

fn reload_interval() -> Duration {
    Duration::from_millis(RELOAD_INTERVAL_MS.load(Ordering::Relaxed))
}

/// Why a TLS config could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{what} `{path}`: {message}")]
    File {
        /// Which file (`cert_path`, …).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the certificates or the key.
    #[error("TLS config: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client certificate verifier could not be built from the CA.
    #[error("client certificate verifier: {0}")]
    Verifier(String),
    /// The HTTPS client of the internal API could not be built.
    #[error("internal API client: {0}")]
    Client(String),
}

/// ALPN protocols of a listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    /// HTTP/2 and HTTP/1.1 (the REST API).
    Rest,
    /// HTTP/2 only (gRPC).
    Grpc,
}

impl Alpn {
    fn protocols(self) -> Vec<Vec<u8>> {
        match self {
            Alpn::Rest => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            Alpn::Grpc => vec![b"h2".to_vec()],
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn file_error(what: &'static str, path: &Path, message: impl ToString) -> TlsError {
    TlsError::File {
        what,
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// The certificates of a PEM file (at least one).
pub fn read_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|err| file_error(what, path, err))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| file_error(what, path, err))?;
    if certs.is_empty() {
        return Err(file_error(what, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|err| file_error("key_path", path, err))
}

/// The roots of a PEM CA file.
fn read_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs("ca_path", path)? {
        roots
            .add(cert)
            .map_err(|err| file_error("ca_path", path, err))?;
    }
    Ok(roots)
}

/// A rustls server config from `config`'s files: mutual TLS (client certificates chaining
/// to `ca_path`) when `verify_client_cert`, no client authentication otherwise.
pub fn server_config(config: &TlsConfig, alpn: Alpn) -> Result<ServerConfig, TlsError> {
    let certs = read_certs("cert_path", &config.cert_path)?;
    let key = read_key(&config.key_path)?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match (&config.ca_path, config.verify_client_cert) {
        (Some(ca_path), true) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(
                Arc::new(read_roots(ca_path)?),
                provider,
            )
            .build()
            .map_err(|err| TlsError::Verifier(err.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        (None, true) => {
            return Err(TlsError::Verifier(
                "verify_client_cert needs ca_path".to_string(),
            ))
        }
        (_, false) => builder.with_no_client_auth(),
    };
    let mut server = builder.with_single_cert(certs, key)?;
    server.alpn_protocols = alpn.protocols();
    Ok(server)
}

/// The digest of the files a config is built from (missing files read as empty).
fn files_digest(config: &TlsConfig) -> [u8; 32] {
    let mut hasher = Sha256::new();
    let paths = [
        Some(&config.cert_path),
        Some(&config.key_path),
        config.ca_path.as_ref(),
    ];
    for path in paths.into_iter().flatten() {
        let bytes = std::fs::read(path).unwrap_or_default();
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    }
    hasher.finalize().into()
}

/// A listener's server config, rebuilt when its files change.
pub struct ReloadingTls {
    config: TlsConfig,
    alpn: Alpn,
    current: RwLock<Arc<ServerConfig>>,
    /// Digest of the files last looked at (loaded or refused), so a bad file warns once.
    seen: Mutex<[u8; 32]>,
}

impl ReloadingTls {
    /// Builds the config from `config`'s files (an error if they are not usable now) and
    /// starts checking them every reload interval while the returned value is alive.
    pub fn start(config: &TlsConfig, alpn: Alpn) -> Result<Arc<Self>, TlsError> {
        let seen = files_digest(config);
        let server = server_config(config, alpn)?;
        let tls = Arc::new(ReloadingTls {
            config: config.clone(),
            alpn,
            current: RwLock::new(Arc::new(server)),
            seen: Mutex::new(seen),
        });
        watch_while_alive(&tls);
        Ok(tls)
    }

    /// The server config for a new connection.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Rebuilds the config if its files changed since last looked at; returns whether a new
    /// config is in place. A file that cannot be used keeps the old config (a warning).
    pub fn reload_if_changed(&self) -> bool {
        if !files_changed(&self.config, &self.seen) {
            return false;
        }
        match server_config(&self.config, self.alpn) {
            Ok(server) => {
                *self
                    .current
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(server);
                tracing::info!(
                    cert = %self.config.cert_path.display(),
                    "TLS certificate reloaded"
                );
                true
            }
            Err(err) => {
                tracing::warn!(%err, "TLS files changed but cannot be used: keeping the previous certificate");
                false
            }
        }
    }
}

/// Whether the files of `config` changed since `seen` (then updated) was taken.
fn files_changed(config: &TlsConfig, seen: &Mutex<[u8; 32]>) -> bool {
    let digest = files_digest(config);
    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    if *seen == digest {
        return false;
    }
    *seen = digest;
    true
}

/// Something rebuilt from TLS files when they change.
trait Reload: Send + Sync + 'static {
    /// Rebuilds if the files changed; whether something new is in place.
    fn reload_if_changed(&self) -> bool;
}

impl Reload for ReloadingTls {
    fn reload_if_changed(&self) -> bool {
        ReloadingTls::reload_if_changed(self)
    }
}

/// Checks the files of `tls` every reload interval while it is alive (nothing outside a
/// Tokio runtime).
fn watch_while_alive<T: Reload>(tls: &Arc<T>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let tls = Arc::downgrade(tls);
    runtime.spawn(watch(tls));
}

async fn watch<T: Reload>(tls: Weak<T>) {
    loop {
        tokio::time::sleep(reload_interval()).await;
        let Some(tls) = tls.upgrade() else { return };
        // Reading a few small files: off the async threads all the same.
        let result = tokio::task::spawn_blocking(move || tls.reload_if_changed()).await;
        if let Err(err) = result {
            tracing::warn!(%err, "TLS reload check failed");
        }
    }
}

/// An HTTPS client (the internal API's) under `config`, rebuilt when its files change: the
/// CA it trusts and, under mutual TLS, the certificate it presents follow the files as the
/// listeners' do.
pub struct ReloadingClient {
    config: TlsConfig,
    builder: fn() -> reqwest::ClientBuilder,
    current: RwLock<reqwest::Client>,
    seen: Mutex<[u8; 32]>,
}

impl ReloadingClient {
    /// Builds the client from `builder` and `config`'s files (an error if they are not
    /// usable now) and checks them every reload interval while the returned value is alive.
    pub fn start(
        config: &TlsConfig,
        builder: fn() -> reqwest::ClientBuilder,
    ) -> Result<Arc<Self>, TlsError> {
        let seen = files_digest(config);
        let client = Self::build(config, builder)?;
        let reloading = Arc::new(ReloadingClient {
            config: config.clone(),
            builder,
            current: RwLock::new(client),
            seen: Mutex::new(seen),
        });
        watch_while_alive(&reloading);
        Ok(reloading)
    }

    fn build(
        config: &TlsConfig,
        builder: fn() -> reqwest::ClientBuilder,
    ) -> Result<reqwest::Client, TlsError> {
        client_tls(builder(), config)?
            .build()
            .map_err(|err| TlsError::Client(err.to_string()))
    }

    /// The client for a new call (cheap: clones share their connections).
    pub fn current(&self) -> reqwest::Client {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl Reload for ReloadingClient {
    fn reload_if_changed(&self) -> bool {
        if !files_changed(&self.config, &self.seen) {
            return false;
        }
        match Self::build(&self.config, self.builder) {
            Ok(client) => {
                *self
                    .current
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = client;
                tracing::info!(
                    cert = %self.config.cert_path.display(),
                    "TLS files of the internal client reloaded"
                );
                true
            }
            Err(err) => {
                tracing::warn!(%err, "TLS files changed but cannot be used by the internal client: keeping the previous ones");
                false
            }
        }
    }
}

impl std::fmt::Debug for ReloadingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingClient")
            .field("cert_path", &self.config.cert_path)
            .finish_non_exhaustive()
    }
}

/// Serves `service` over TLS on `listener` until `shutdown` resolves, then lets open
/// connections finish their requests. Each connection is handshaken and served on its own
/// task; a handshake not done within [`HANDSHAKE_TIMEOUT`] drops the connection.
pub async fn serve_tls<S>(
    listener: tokio::net::TcpListener,
    service: S,
    tls: Arc<ReloadingTls>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    S: tower::Service<Request<hyper::body::Incoming>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => accepted,
            // Reap finished connections as we go.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(%err, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
        let service = service.clone();
        let mut stop_rx = stop_rx.clone();
        connections.spawn(async move {
            let stream =
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(err)) => {
                        tracing::debug!(%peer, %err, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection_with_upgrades(
                TokioIo::new(stream),
                TowerToHyperService::new(service),
            );
            tokio::pin!(connection);
            let stopping = async {
                while !*stop_rx.borrow_and_update() {
                    if stop_rx.changed().await.is_err() {
                        break;
                    }
                }
            };
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(err) = result {
                        tracing::debug!(%peer, %err, "connection ended with an error");
                    }
                    return;
                }
                _ = stopping => {}
            }
            connection.as_mut().graceful_shutdown();
            if let Err(err) = connection.await {
                tracing::debug!(%peer, %err, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// The client side of node-to-node HTTPS for a node whose REST listener has `config`: trust
/// `ca_path` (else the built-in web roots), and present the node's own certificate when the
/// peers verify client certificates.
pub fn client_tls(
    builder: reqwest::ClientBuilder,
    config: &TlsConfig,
) -> Result<reqwest::ClientBuilder, TlsError> {
    let mut builder = builder.use_rustls_tls().https_only(true);
    if let Some(ca_path) = &config.ca_path {
        let pem = std::fs::read(ca_path).map_err(|err| file_error("ca_path", ca_path, err))?;
        let roots = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|err| file_error("ca_path", ca_path, err))?;
        if roots.is_empty() {
            return Err(file_error("ca_path", ca_path, "no PEM certificate in it"));
        }
        builder = builder.tls_built_in_root_certs(false);
        for root in roots {
            builder = builder.add_root_certificate(root);
        }
    }
    if config.verify_client_cert {
        let mut pem = std::fs::read(&config.key_path)
            .map_err(|err| file_error("key_path", &config.key_path, err))?;
        pem.push(b'\n');
        pem.extend(
            std::fs::read(&config.cert_path)
                .map_err(|err| file_error("cert_path", &config.cert_path, err))?,
        );
        let identity = reqwest::Identity::from_pem(&pem)
            .map_err(|err| file_error("cert_path", &config.cert_path, err))?;
        builder = builder.identity(identity);
    }
    Ok(builder)
}
