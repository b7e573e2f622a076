//! `shale`: the command line. `shale run` starts a node (embedded defaults: 127.0.0.1:7280,
//! `./shale-data`, SQLite metastore, splits on local disk); the other commands talk to a
//! running node over its REST API.

mod client;
mod plan;
mod simulate;

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use shale_config::NodeConfig;

#[derive(Parser)]
#[command(
    name = "shale",
    version = shale_server::VERSION_LINE,
    long_version = shale_server::LONG_VERSION,
    about = "Shale: an observability store on object storage"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a node.
    Run(RunArgs),
    /// Manage indexes.
    #[command(subcommand)]
    Index(client::IndexCommand),
    /// Ingest NDJSON documents from a file or stdin.
    Ingest(client::IngestArgs),
    /// Search an index.
    Search(client::SearchArgs),
    /// Delete the documents matching a query (or list the delete tasks).
    Delete(client::DeleteArgs),
    /// Compact an index now (merges down to the target, every pending delete applied).
    Compact(client::CompactArgs),
    /// Inspect splits.
    #[command(subcommand)]
    Splits(client::SplitsCommand),
    /// Inspect compaction.
    #[command(subcommand)]
    Compaction(client::CompactionCommand),
    /// Inspect the cluster.
    #[command(subcommand)]
    Cluster(client::ClusterCommand),
    /// Dry-run a merge policy over splits from a file or a live index.
    Plan(plan::PlanArgs),
    /// Simulate a cluster's splits over time under a merge policy and scope mode.
    Simulate(simulate::SimulateArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Node config file (YAML); flags and SHALE_* variables override it.
    #[arg(long, env = "SHALE_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory (WAL, cache, default SQLite metastore and split storage).
    #[arg(long, env = "SHALE_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Address of the REST API.
    #[arg(long, env = "SHALE_LISTEN")]
    listen: Option<String>,
    /// Address of the OTLP/gRPC services (logs, traces, metrics), e.g. `127.0.0.1:4317`.
    #[arg(long, env = "SHALE_GRPC_LISTEN")]
    grpc_listen: Option<String>,
    /// `sqlite://PATH` or `postgres://…`.
    #[arg(long, env = "SHALE_METASTORE_URI")]
    metastore_uri: Option<String>,
    /// Default split storage: `file:///DIR` or `s3://bucket/prefix`.
    #[arg(long, env = "SHALE_STORAGE_URI")]
    storage_uri: Option<String>,
    /// This node's id.
    #[arg(long, env = "SHALE_NODE_ID")]
    node_id: Option<String>,
    /// The cluster this node joins (nodes sharing a metastore and a cluster id form a cluster).
    #[arg(long, env = "SHALE_CLUSTER_ID")]
    cluster_id: Option<String>,
    /// `host:port` other nodes reach this node at (default: the listen address).
    #[arg(long, env = "SHALE_ADVERTISE")]
    advertise: Option<String>,
    /// Roles: a comma-separated list of `indexer`, `searcher`, `compactor` (default: all).
    #[arg(long, env = "SHALE_ROLES")]
    roles: Option<String>,
    /// Shared secret of the internal API between nodes (default: none).
    #[arg(long, env = "SHALE_CLUSTER_SECRET", hide_env_values = true)]
    cluster_secret: Option<String>,
    /// Token every REST call but `/health/*` must present (default: none).
    #[arg(long, env = "SHALE_API_TOKEN", hide_env_values = true)]
    api_token: Option<String>,
    /// WAL persist policy: `on-delay` (default) or `on-append`.
    #[arg(long, env = "SHALE_WAL_PERSIST_POLICY")]
    wal_persist_policy: Option<String>,
    /// Print the resolved node config (YAML, secrets redacted) and exit.
    #[arg(long)]
    print_config: bool,
}

/// The node config: file, then environment and flags on top; defaults derived from the data
/// dir follow an overridden data dir.
fn node_config(args: &RunArgs) -> anyhow::Result<NodeConfig> {
    let mut config = match &args.config {
        Some(path) => {
            let bytes = std::fs::read(path)
                .with_context(|| format!("cannot read node config {}", path.display()))?;
            NodeConfig::from_yaml(&bytes)
                .with_context(|| format!("invalid node config {}", path.display()))?
        }
        None => NodeConfig::default(),
    };
    if let Some(data_dir) = &args.data_dir {
        let old_metastore = NodeConfig::default_metastore_uri(&config.data_dir);
        let old_storage = NodeConfig::default_storage_uri(&config.data_dir);
        config.data_dir = data_dir.clone();
        if config.metastore_uri == old_metastore {
            config.metastore_uri = NodeConfig::default_metastore_uri(data_dir);
        }
        if config.default_index_root_uri == old_storage {
            config.default_index_root_uri = NodeConfig::default_storage_uri(data_dir);
        }
    }
    if let Some(listen) = &args.listen {
        config.listen_address = listen.clone();
    }
    if let Some(grpc) = &args.grpc_listen {
        config.grpc_listen_address = Some(grpc.clone());
    }
    if let Some(uri) = &args.metastore_uri {
        config.metastore_uri = uri.clone();
    }
    if let Some(uri) = &args.storage_uri {
        config.default_index_root_uri = uri.clone();
    }
    if let Some(node_id) = &args.node_id {
        config.node_id = node_id.clone();
    }
    if let Some(cluster_id) = &args.cluster_id {
        config.cluster_id = cluster_id.clone();
    }
    if let Some(advertise) = &args.advertise {
        config.advertise_address = Some(advertise.clone());
    }
    if let Some(roles) = &args.roles {
        config.roles = shale_config::Role::parse_list(roles)?;
    }
    if let Some(secret) = &args.cluster_secret {
        config.cluster.cluster_secret = Some(secret.clone());
    }
    if let Some(token) = &args.api_token {
        config.api_token = Some(token.clone());
    }
    if let Some(policy) = &args.wal_persist_policy {
        config.wal_persist_policy = match policy.as_str() {
            "on-delay" => shale_config::WalPersistPolicy::OnDelay,
            "on-append" => shale_config::WalPersistPolicy::OnAppend,
            other => anyhow::bail!("unknown WAL persist policy `{other}` (on-delay or on-append)"),
        };
    }
    config.validate()?;
    Ok(config)
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = node_config(&args)?;
    if args.print_config {
        print!("{}", config.to_redacted_yaml());
        return Ok(());
    }
    let listen = config.listen_address.clone();
    // One process per data directory: locked before anything is opened there.
    let lock = shale_server::DataDirLock::acquire(&config.data_dir)?;
    // Listening before joining the cluster: a node that cannot serve never registers (and
    // never fences out an incarnation that can).
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let grpc_listener = match &config.grpc_listen_address {
        Some(address) => Some((
            address.clone(),
            tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen on {address} (grpc_listen_address)"))?,
        )),
        None => None,
    };
    let health_listener = match &config.health_listen_address {
        Some(address) => Some((
            address.clone(),
            tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen on {address} (health_listen_address)"))?,
        )),
        None => None,
    };
    // Certificates that cannot be used stop the node before it joins the cluster.
    use shale_server::tls::{server_config, Alpn};
    if let Some(tls) = &config.rest.tls {
        server_config(tls, Alpn::Rest).context("rest.tls")?;
    }
    if let Some(tls) = &config.grpc.tls {
        server_config(tls, Alpn::Grpc).context("grpc.tls")?;
    }
    let scheme = if config.rest.tls.is_some() {
        "https"
    } else {
        "http"
    };
    log_startup_summary(&config);
    let node = shale_server::Node::start_locked(config, lock).await?;
    tracing::info!("shale node listening on {scheme}://{listen}");
    // OTLP/gRPC, stopped when the REST API stops.
    let (grpc_stop, grpc_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some((address, grpc_listener)) = grpc_listener {
        tracing::info!("OTLP/gRPC listening on {address}");
        let node = node.clone();
        tokio::spawn(async move {
            let stopped = async {
                let _ = grpc_stopped.await;
            };
            if let Err(err) =
                shale_server::otlp_grpc::serve_grpc(node, grpc_listener, stopped).await
            {
                tracing::error!(%err, "the OTLP/gRPC server failed");
            }
        });
    }
    // The plaintext health probes, stopped when the REST API stops.
    let (health_stop, health_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some((address, health_listener)) = health_listener {
        tracing::info!("health probes listening on http://{address}");
        let node = node.clone();
        tokio::spawn(async move {
            let stopped = async {
                let _ = health_stopped.await;
            };
            if let Err(err) = shale_server::serve_health(node, health_listener, stopped).await {
                tracing::error!(%err, "the health listener failed");
            }
        });
    }
    let mut superseded = node.membership.subscribe_superseded();
    let shutdown = async move {
        let zombie = async move {
            while superseded.changed().await.is_ok() {
                if *superseded.borrow() {
                    return;
                }
            }
            std::future::pending::<()>().await
        };
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("install SIGTERM handler");
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
                _ = zombie => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
    };
    shale_server::serve(node.clone(), listener, shutdown).await?;
    let _ = grpc_stop.send(());
    let _ = health_stop.send(());
    if node.membership.is_superseded() {
        node.shutdown().await;
        anyhow::bail!(
            "a newer incarnation of node `{}` registered in the cluster: this one stopped",
            node.config.node_id
        );
    }
    tracing::info!("shutting down");
    node.shutdown().await;
    // Make everything acknowledged durable before exiting.
    node.wal.persist().await?;
    tracing::info!("WAL persisted; node stopped");
    Ok(())
}

/// One line with what an operator checks first: addresses, data dir, metastore and storage
/// (secrets redacted), node, cluster and roles.
fn log_startup_summary(config: &NodeConfig) {
    let roles: Vec<&str> = config.roles.iter().map(|role| role.as_str()).collect();
    tracing::info!(
        listen = %config.listen_address,
        grpc = %config.grpc_listen_address.as_deref().unwrap_or("off"),
        health = %config.health_listen_address.as_deref().unwrap_or("off"),
        rest_tls = %tls_mode(config.rest.tls.as_ref()),
        grpc_tls = %tls_mode(config.grpc.tls.as_ref()),
        data_dir = %config.data_dir.display(),
        metastore = %shale_config::redact_uri(&config.metastore_uri),
        storage = %shale_config::redact_uri(&config.default_index_root_uri),
        node_id = %config.node_id,
        cluster_id = %config.cluster_id,
        roles = %roles.join(","),
        "starting node"
    );
}

/// `off`, `tls` or `mtls`, for the startup line.
fn tls_mode(tls: Option<&shale_config::TlsConfig>) -> &'static str {
    match tls {
        None => "off",
        Some(tls) if tls.verify_client_cert => "mtls",
        Some(_) => "tls",
    }
}

/// How logs are written to stderr (`SHALE_LOG_FORMAT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    /// Human-readable lines, coloured only on a terminal.
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// The format named by `SHALE_LOG_FORMAT`'s value (unset or empty: text).
    fn parse(value: Option<&str>) -> anyhow::Result<Self> {
        match value.map(str::trim) {
            None | Some("") => Ok(LogFormat::Text),
            Some(value) if value.eq_ignore_ascii_case("text") => Ok(LogFormat::Text),
            Some(value) if value.eq_ignore_ascii_case("json") => Ok(LogFormat::Json),
            Some(other) => {
                anyhow::bail!("SHALE_LOG_FORMAT: unknown log format `{other}` (text or json)")
            }
        }
    }
}

/// Sets up logging to stderr: `SHALE_LOG` filters, `SHALE_LOG_FORMAT` picks the format.
fn init_logging() -> anyhow::Result<LogFormat> {
    let value = match std::env::var("SHALE_LOG_FORMAT") {
        Ok(value) => Some(value),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => {
            anyhow::bail!("SHALE_LOG_FORMAT: not valid UTF-8 (text or json)")
        }
    };
    let format = LogFormat::parse(value.as_deref())?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHALE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr);
    match format {
        // Colour codes only for a terminal: a file or a log collector gets plain text.
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.with_ansi(false).json().init(),
    }
    Ok(format)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Before any thread starts, so that every allocation follows it.
    shale_server::allocator::limit_arenas();
    let log_format = match init_logging() {
        Ok(format) => format,
        Err(err) => {
            eprintln!("error: {err:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run(args).await,
            Command::Index(cmd) => client::index(cmd).await,
            Command::Ingest(args) => client::ingest(args).await,
            Command::Search(args) => client::search(args).await,
            Command::Delete(args) => client::delete(args).await,
            Command::Compact(args) => client::compact(args).await,
            Command::Splits(cmd) => client::splits(cmd).await,
            Command::Compaction(cmd) => client::compaction(cmd).await,
            Command::Cluster(cmd) => client::cluster(cmd).await,
            Command::Plan(args) => plan::run(args).await,
            Command::Simulate(args) => simulate::run(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // As a JSON log line when logs are JSON, so that stderr stays one JSON object a line.
        Err(err) if log_format == LogFormat::Json => {
            tracing::error!("{err:#}");
            std::process::ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LogFormat;

    #[test]
    fn log_formats_are_text_by_default_json_on_request_and_nothing_else() {
        assert_eq!(LogFormat::parse(None).unwrap(), LogFormat::Text);
        assert_eq!(LogFormat::parse(Some("")).unwrap(), LogFormat::Text);
        assert_eq!(LogFormat::parse(Some("text")).unwrap(), LogFormat::Text);
        assert_eq!(LogFormat::parse(Some("JSON")).unwrap(), LogFormat::Json);
        let err = LogFormat::parse(Some("xml")).unwrap_err().to_string();
        assert!(
            err.contains("SHALE_LOG_FORMAT")
                && err.contains("`xml`")
                && err.contains("text or json"),
            "{err}"
        );
    }
}
