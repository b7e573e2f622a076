//! Client commands: they call a running node's REST API (`--endpoint`, default
//! `http://127.0.0.1:7280`, or `SHALE_ENDPOINT`), over HTTPS for an `https://` endpoint
//! (`--ca-cert` for a private CA, `--client-cert`/`--client-key` under mutual TLS).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressFinish, ProgressStyle};
use serde_json::Value;
use shale_types::sort_key::{decode_values, SortFieldType, SortKey};

#[derive(clap::Args, Clone)]
pub struct Endpoint {
    /// REST endpoint of a node.
    #[arg(long, env = "SHALE_ENDPOINT", default_value = "http://127.0.0.1:7280")]
    endpoint: String,
    /// The node's API token, if it has one (sent as `Authorization: Bearer …`).
    #[arg(long, env = "SHALE_API_TOKEN", hide_env_values = true)]
    api_token: Option<String>,
    /// CA certificates (PEM) to trust for an `https://` endpoint besides the system's: the CA
    /// of a node's `rest.tls` certificate when it is a private one.
    #[arg(long, env = "SHALE_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// A client certificate (PEM) to present, for a node with `verify_client_cert`.
    #[arg(long, env = "SHALE_CLIENT_CERT", requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "SHALE_CLIENT_KEY", requires = "client_cert")]
    client_key: Option<PathBuf>,
}

impl Endpoint {
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.endpoint.trim_end_matches('/'), path)
    }

    /// An HTTP client for the node (with the API token, if any).
    fn client(&self) -> anyhow::Result<reqwest::Client> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = &self.api_token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .context("the API token is not a valid header value")?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_secs(600))
            .default_headers(headers);
        if let Some(path) = &self.ca_cert {
            let pem = std::fs::read(path)
                .with_context(|| format!("cannot read --ca-cert {}", path.display()))?;
            let roots = reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("--ca-cert {}: not PEM certificates", path.display()))?;
            if roots.is_empty() {
                bail!("--ca-cert {}: no PEM certificate in it", path.display());
            }
            for root in roots {
                builder = builder.add_root_certificate(root);
            }
        }
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            let mut pem = std::fs::read(key)
                .with_context(|| format!("cannot read --client-key {}", key.display()))?;
            pem.push(b'\n');
            pem.extend(
                std::fs::read(cert)
                    .with_context(|| format!("cannot read --client-cert {}", cert.display()))?,
            );
            let identity = reqwest::Identity::from_pem(&pem).with_context(|| {
                format!(
                    "--client-cert {} with --client-key {}: not a PEM certificate and key",
                    cert.display(),
                    key.display()
                )
            })?;
            builder = builder.identity(identity);
        }
        Ok(builder.build()?)
    }
}

#[derive(clap::Subcommand)]
pub enum IndexCommand {
    /// Create an index from a YAML or JSON config.
    Create {
        #[command(flatten)]
        endpoint: Endpoint,
        /// Index config file.
        #[arg(long)]
        index_config: PathBuf,
    },
    /// List indexes.
    List {
        #[command(flatten)]
        endpoint: Endpoint,
    },
    /// Show an index's metadata and split statistics.
    Describe {
        #[command(flatten)]
        endpoint: Endpoint,
        /// Index id.
        #[arg(long)]
        index: String,
    },
    /// Delete an index and all its data.
    Delete {
        #[command(flatten)]
        endpoint: Endpoint,
        /// Index id.
        #[arg(long)]
        index: String,
    },
}

#[derive(clap::Args)]
pub struct IngestArgs {
    #[command(flatten)]
    endpoint: Endpoint,
    /// Index id.
    #[arg(long)]
    index: String,
    /// NDJSON file (default: stdin).
    #[arg(long)]
    input: Option<PathBuf>,
    /// auto, wait_for or force (applied to the last batch; others use auto).
    #[arg(long, default_value = "force")]
    commit: String,
    /// Bytes per request.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    batch_bytes: usize,
    /// Exit 0 even if the node rejected documents (by default, any rejection fails the
    /// command after the summary).
    #[arg(long)]
    allow_rejected: bool,
}

#[derive(clap::Args)]
pub struct SearchArgs {
    #[command(flatten)]
    endpoint: Endpoint,
    /// Index id.
    #[arg(long)]
    index: String,
    /// Query in Tantivy's query language.
    #[arg(long, default_value = "*")]
    query: String,
    /// Hits to return.
    #[arg(long, default_value_t = 20)]
    max_hits: usize,
    /// Hits to skip.
    #[arg(long, default_value_t = 0)]
    start_offset: usize,
    /// Inclusive start, seconds.
    #[arg(long)]
    start_timestamp: Option<i64>,
    /// Exclusive end, seconds.
    #[arg(long)]
    end_timestamp: Option<i64>,
    /// Sort (`timestamp`, `+timestamp`, `_score`, …).
    #[arg(long)]
    sort_by: Option<String>,
    /// Comma-separated default search fields.
    #[arg(long)]
    search_fields: Option<String>,
}

#[derive(clap::Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    endpoint: Endpoint,
    /// Index id.
    #[arg(long)]
    index: String,
    /// Delete the documents matching this query (acknowledged before the task is created).
    #[arg(long, required_unless_present = "list", conflicts_with = "list")]
    query: Option<String>,
    /// Comma-separated fields searched by terms without a field.
    #[arg(long)]
    search_fields: Option<String>,
    /// Only documents at or after this time (seconds).
    #[arg(long)]
    start_timestamp: Option<i64>,
    /// Only documents before this time (seconds).
    #[arg(long)]
    end_timestamp: Option<i64>,
    /// List the index's delete tasks instead.
    #[arg(long)]
    list: bool,
}

#[derive(clap::Args)]
pub struct CompactArgs {
    #[command(flatten)]
    endpoint: Endpoint,
    /// Index id.
    #[arg(long)]
    index: String,
    /// Only splits reaching at or after this time (seconds).
    #[arg(long)]
    start_timestamp: Option<i64>,
    /// Only splits starting before this time (seconds).
    #[arg(long)]
    end_timestamp: Option<i64>,
    /// Include mature splits (below the size cap) too.
    #[arg(long)]
    force: bool,
    /// Wait for the compaction to finish, with a progress bar.
    #[arg(long)]
    wait: bool,
}

#[derive(clap::Subcommand)]
pub enum SplitsCommand {
    /// List an index's splits as a table.
    List {
        #[command(flatten)]
        endpoint: Endpoint,
        /// Index id.
        #[arg(long)]
        index: String,
        /// Comma-separated states (Staged, Published, MarkedForDeletion).
        #[arg(long)]
        states: Option<String>,
    },
}

#[derive(clap::Subcommand)]
pub enum CompactionCommand {
    /// Pending operations, running merges and recent merges of an index.
    Status {
        #[command(flatten)]
        endpoint: Endpoint,
        /// Index id.
        #[arg(long)]
        index: String,
    },
}

/// `shale cluster …`.
#[derive(clap::Subcommand)]
pub enum ClusterCommand {
    /// The cluster's nodes as the node at the endpoint sees them: live and dead, roles,
    /// address, leader, shards and running merges.
    Members {
        #[command(flatten)]
        endpoint: Endpoint,
    },
}

/// Prints the cluster members as a table.
pub async fn cluster(cmd: ClusterCommand) -> anyhow::Result<()> {
    let ClusterCommand::Members { endpoint } = cmd;
    let client = endpoint.client()?;
    let state = call(client.get(endpoint.url("/api/v1/cluster"))).await?;
    println!(
        "cluster {} (seen from {})",
        state["cluster_id"].as_str().unwrap_or("?"),
        state["self_node_id"].as_str().unwrap_or("?")
    );
    let mut rows: Vec<Vec<String>> = vec![[
        "NODE",
        "GEN",
        "STATE",
        "LEADER",
        "ADDRESS",
        "ROLES",
        "OPEN SHARDS",
        "RUNNING MERGES",
        "LAST HEARTBEAT",
    ]
    .map(String::from)
    .to_vec()];
    for (key, label) in [("live_nodes", "live"), ("dead_nodes", "dead")] {
        for node in state[key].as_array().cloned().unwrap_or_default() {
            let roles: Vec<&str> = node["roles"]
                .as_array()
                .map(|roles| roles.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let open_shards = node["shards"]
                .as_array()
                .map(|shards| shards.iter().filter(|s| s["shard_state"] == "Open").count())
                .unwrap_or(0);
            let number = |v: &Value| {
                v.as_u64()
                    .map_or_else(|| "?".to_string(), |n| n.to_string())
            };
            rows.push(vec![
                node["node_id"].as_str().unwrap_or("?").to_string(),
                number(&node["generation"]),
                label.to_string(),
                if node["is_leader"] == true { "yes" } else { "" }.to_string(),
                node["advertise_address"]
                    .as_str()
                    .unwrap_or("?")
                    .to_string(),
                roles.join(","),
                open_shards.to_string(),
                number(&node["running_merges"]),
                heartbeat_age(&node),
            ]);
        }
    }
    print!("{}", table(&rows, &[1, 6, 7, 8]));
    Ok(())
}

/// How long ago a node's last heartbeat was, or `unknown` when the node recorded none (a node
/// that left records its last heartbeat at the epoch, and older nodes answer an age from it).
fn heartbeat_age(node: &Value) -> String {
    let recorded = node["last_heartbeat_ms"].as_i64().is_none_or(|ms| ms > 0);
    match node["heartbeat_age_ms"].as_i64() {
        Some(age) if recorded => format!("{} ms ago", age.max(0)),
        _ => "unknown".to_string(),
    }
}

/// Renders `rows` as columns two spaces apart, the columns in `right` aligned right.
fn table(rows: &[Vec<String>], right: &[usize]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|row| row.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                if right.contains(&c) {
                    format!("{cell:>width$}", width = widths[c])
                } else {
                    format!("{cell:<width$}", width = widths[c])
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Sends a request and returns its JSON, turning error statuses into errors with the
/// server's `message`.
async fn call(request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
    let response = request.send().await.context("cannot reach the node")?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let message = body
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("no message");
        bail!("{status}: {message}");
    }
    Ok(body)
}

fn print_json(value: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

pub async fn index(cmd: IndexCommand) -> anyhow::Result<()> {
    let client = match &cmd {
        IndexCommand::Create { endpoint, .. }
        | IndexCommand::List { endpoint }
        | IndexCommand::Describe { endpoint, .. }
        | IndexCommand::Delete { endpoint, .. } => endpoint.client()?,
    };
    match cmd {
        IndexCommand::Create {
            endpoint,
            index_config,
        } => {
            let body = std::fs::read(&index_config)
                .with_context(|| format!("cannot read {}", index_config.display()))?;
            let index = call(client.post(endpoint.url("/api/v1/indexes")).body(body)).await?;
            println!(
                "created index `{}` ({})",
                index["index_config"]["index_id"].as_str().unwrap_or("?"),
                index["index_uid"].as_str().unwrap_or("?")
            );
        }
        IndexCommand::List { endpoint } => {
            let indexes = call(client.get(endpoint.url("/api/v1/indexes"))).await?;
            print!("{}", index_table(&indexes));
        }
        IndexCommand::Describe { endpoint, index } => {
            let meta = call(client.get(endpoint.url(&format!("/api/v1/indexes/{index}")))).await?;
            let splits = call(client.get(endpoint.url(&format!(
                "/api/v1/indexes/{index}/splits?split_states=Published"
            ))))
            .await?;
            let splits = splits["splits"].as_array().cloned().unwrap_or_default();
            let docs: u64 = splits.iter().filter_map(|s| s["num_docs"].as_u64()).sum();
            let bytes: u64 = splits.iter().filter_map(|s| s["size_bytes"].as_u64()).sum();
            print_json(&meta)?;
            println!("published splits: {}", splits.len());
            println!("documents:        {docs}");
            println!("size:             {:.2} MB", bytes as f64 / 1e6);
        }
        IndexCommand::Delete { endpoint, index } => {
            let files =
                call(client.delete(endpoint.url(&format!("/api/v1/indexes/{index}")))).await?;
            println!(
                "deleted index `{index}` and {} split(s)",
                files.as_array().map_or(0, Vec::len)
            );
        }
    }
    Ok(())
}

/// The indexes of `GET /api/v1/indexes` as a table: id and uid.
fn index_table(indexes: &Value) -> String {
    let mut rows = vec![vec!["INDEX ID".to_string(), "INDEX UID".to_string()]];
    for index in indexes.as_array().into_iter().flatten() {
        rows.push(vec![
            index["index_config"]["index_id"]
                .as_str()
                .unwrap_or("?")
                .to_string(),
            index["index_uid"].as_str().unwrap_or("?").to_string(),
        ]);
    }
    table(&rows, &[])
}

pub async fn ingest(args: IngestArgs) -> anyhow::Result<()> {
    let client = args.endpoint.client()?;
    let (reader, total_bytes): (Box<dyn Read>, Option<u64>) = match &args.input {
        Some(path) => {
            let file = std::fs::File::open(path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            let len = file.metadata().ok().map(|m| m.len());
            (Box::new(file), len)
        }
        None => (Box::new(std::io::stdin()), None),
    };
    // Drawn on stderr (a terminal only) and cleared before anything else is printed, also
    // when the command fails midway; an empty file gets no bar at all.
    let bar = match total_bytes {
        Some(0) => ProgressBar::hidden(),
        Some(total) => ProgressBar::new(total).with_style(ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {msg}",
        )?),
        None => ProgressBar::new_spinner().with_style(ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bytes} {msg}",
        )?),
    }
    .with_finish(ProgressFinish::AndClear);
    let started = Instant::now();
    let mut reader = BufReader::new(reader);
    let mut batch = Vec::with_capacity(args.batch_bytes + 4096);
    let mut line = Vec::new();
    let mut stats = IngestStats::default();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n > 0 {
            batch.extend_from_slice(&line);
            if !line.ends_with(b"\n") {
                batch.push(b'\n');
            }
        }
        let last = n == 0;
        if batch.len() >= args.batch_bytes || (last && !batch.is_empty()) {
            let commit = if last { args.commit.as_str() } else { "auto" };
            let url = args
                .endpoint
                .url(&format!("/api/v1/{}/ingest?commit={commit}", args.index));
            let sent = batch.len() as u64;
            let response = call(client.post(url).body(std::mem::take(&mut batch))).await?;
            stats.add(&response);
            bar.inc(sent);
            let secs = started.elapsed().as_secs_f64().max(1e-3);
            bar.set_message(format!(
                "{} docs, {:.0} docs/s, {} rejected",
                stats.ingested,
                stats.ingested as f64 / secs,
                stats.rejected
            ));
        }
        if last {
            break;
        }
    }
    bar.finish_and_clear();
    print!("{}", stats.summary(started.elapsed()));
    if stats.rejected > 0 && !args.allow_rejected {
        bail!(
            "the node rejected {} document(s) (see above); pass --allow-rejected to exit 0 \
             when rejections are expected",
            stats.rejected
        );
    }
    Ok(())
}

#[derive(Default)]
struct IngestStats {
    ingested: u64,
    rejected: u64,
    reasons: BTreeMap<String, u64>,
    examples: Vec<String>,
}

impl IngestStats {
    /// What `shale ingest` prints at the end: the counts, then the rejections by reason and
    /// the first few, each on its own line.
    fn summary(&self, elapsed: Duration) -> String {
        let secs = elapsed.as_secs_f64().max(1e-3);
        let mut out = format!(
            "ingested {} documents in {:.1}s ({:.0} docs/s), {} rejected\n",
            self.ingested,
            secs,
            self.ingested as f64 / secs,
            self.rejected
        );
        if !self.reasons.is_empty() {
            out.push_str("rejections by reason:\n");
            for (reason, count) in &self.reasons {
                out.push_str(&format!("  {count:>8}  {reason}\n"));
            }
            out.push_str("first rejections:\n");
            for example in &self.examples {
                out.push_str(&format!("  {example}\n"));
            }
        }
        out
    }

    fn add(&mut self, response: &Value) {
        self.ingested += response["num_ingested_docs"].as_u64().unwrap_or(0);
        self.rejected += response["num_rejected_docs"].as_u64().unwrap_or(0);
        for failure in response["parse_failures"].as_array().into_iter().flatten() {
            let reason = failure["reason"].as_str().unwrap_or("unknown").to_string();
            *self.reasons.entry(reason).or_default() += 1;
            if self.examples.len() < 5 {
                self.examples
                    .push(failure["message"].as_str().unwrap_or("").to_string());
            }
        }
    }
}

pub async fn search(args: SearchArgs) -> anyhow::Result<()> {
    let client = args.endpoint.client()?;
    let mut body = serde_json::json!({
        "query": args.query,
        "max_hits": args.max_hits,
        "start_offset": args.start_offset,
    });
    if let Some(ts) = args.start_timestamp {
        body["start_timestamp"] = ts.into();
    }
    if let Some(ts) = args.end_timestamp {
        body["end_timestamp"] = ts.into();
    }
    if let Some(sort) = args.sort_by {
        body["sort_by"] = sort.into();
    }
    if let Some(fields) = args.search_fields {
        body["search_field"] = fields.into();
    }
    let url = args.endpoint.url(&format!("/api/v1/{}/search", args.index));
    let response = call(client.post(url).json(&body)).await?;
    print_json(&response)
}

/// `shale delete`: creates a delete task (printed as JSON), or lists them with `--list`.
pub async fn delete(args: DeleteArgs) -> anyhow::Result<()> {
    let client = args.endpoint.client()?;
    let url = args
        .endpoint
        .url(&format!("/api/v1/{}/delete-tasks", args.index));
    let Some(query) = args.query else {
        let tasks = call(client.get(url)).await?;
        return print_json(&tasks);
    };
    let mut body = serde_json::json!({ "query": query });
    if let Some(fields) = args.search_fields {
        body["search_field"] = fields.into();
    }
    if let Some(ts) = args.start_timestamp {
        body["start_timestamp"] = ts.into();
    }
    if let Some(ts) = args.end_timestamp {
        body["end_timestamp"] = ts.into();
    }
    let task = call(client.post(url).json(&body)).await?;
    print_json(&task)
}

/// `shale compact`: starts a manual compaction; with `--wait`, follows it to the end.
pub async fn compact(args: CompactArgs) -> anyhow::Result<()> {
    let client = args.endpoint.client()?;
    let mut body = serde_json::json!({ "force": args.force });
    if let Some(ts) = args.start_timestamp {
        body["start_timestamp"] = ts.into();
    }
    if let Some(ts) = args.end_timestamp {
        body["end_timestamp"] = ts.into();
    }
    let url = args
        .endpoint
        .url(&format!("/api/v1/indexes/{}/compact", args.index));
    let started = call(client.post(url).json(&body)).await?;
    let Some(compaction_id) = started["compaction_id"].as_str() else {
        bail!("unexpected answer: {started}");
    };
    if !args.wait {
        return print_json(&started);
    }
    let url = args.endpoint.url(&format!(
        "/api/v1/indexes/{}/compactions/{compaction_id}",
        args.index
    ));
    // A spinner until the plan has merges (none: no bar), then a bar of the merges done;
    // cleared before the result is printed, also when the command fails midway.
    let bar = ProgressBar::new_spinner()
        .with_style(ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {msg}",
        )?)
        .with_finish(ProgressFinish::AndClear);
    bar.enable_steady_tick(Duration::from_millis(200));
    let bar_style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} merges {msg}",
    )?;
    let status = loop {
        let status = call(client.get(&url)).await?;
        let plan = &status["plan"];
        let total = plan["total"].as_u64().unwrap_or(0);
        if total > 0 && bar.length().is_none() {
            bar.set_style(bar_style.clone());
        }
        if total > 0 {
            bar.set_length(total);
        }
        bar.set_position(
            plan["completed"].as_u64().unwrap_or(0) + plan["failed"].as_u64().unwrap_or(0),
        );
        let state = status["state"].as_str().unwrap_or("unknown").to_string();
        bar.set_message(state.clone());
        if state == "completed" || state == "failed" {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    bar.finish_and_clear();
    print_json(&status)?;
    if status["state"] == "failed" {
        bail!(
            "compaction {compaction_id} failed: {}",
            status["error"].as_str().unwrap_or("no error recorded")
        );
    }
    Ok(())
}

pub async fn splits(cmd: SplitsCommand) -> anyhow::Result<()> {
    let SplitsCommand::List {
        endpoint,
        index,
        states,
    } = cmd;
    let client = endpoint.client()?;
    let mut url = endpoint.url(&format!("/api/v1/indexes/{index}/splits"));
    if let Some(states) = states {
        url.push_str(&format!("?split_states={states}"));
    }
    let response = call(client.get(url)).await?;
    // Locality indexes: the bucket, key level and key range of each split, decoded with the
    // sort field types of the index's config.
    let splits: Vec<&Value> = response["splits"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let keyed = splits.iter().any(|split| split["sort_key_min"].is_string());
    let kinds = if keyed {
        let metadata = call(client.get(endpoint.url(&format!("/api/v1/indexes/{index}")))).await?;
        sort_field_types(&metadata["index_config"])
    } else {
        None
    };
    print!("{}", splits_table(&splits, keyed, kinds.as_deref()));
    Ok(())
}

/// Splits (as the splits API returns them) as a table; `keyed`: with the bucket, key level and
/// key range columns, keys decoded with `kinds` when given.
fn splits_table(splits: &[&Value], keyed: bool, kinds: Option<&[SortFieldType]>) -> String {
    // Metrics splits (Parquet): their documents are samples; their series are counted too.
    let metrics = splits.iter().any(|split| split["num_series"].is_u64());
    let mut header = vec![
        "SPLIT ID",
        "STATE",
        if metrics { "SAMPLES" } else { "DOCS" },
        "SIZE (MB)",
        "PARTITION",
        "MERGE OPS",
        "MATURITY",
        "START",
        "END",
    ];
    // Right-aligned: the numbers.
    let mut right = vec![2, 3, 4, 5];
    if metrics {
        right.push(header.len());
        header.push("SERIES");
    }
    if keyed {
        right.push(header.len() + 1);
        header.extend(["BUCKET", "KEY LEVEL", "KEY RANGE"]);
    }
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    let ts = |v: &Value| {
        v.as_i64()
            .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
            .map(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default()
            })
            .unwrap_or_else(|| "-".to_string())
    };
    let key = |value: &Value| -> String {
        let Some(hex) = value.as_str() else {
            return "-".to_string();
        };
        let decoded = serde_json::from_value::<SortKey>(Value::String(hex.to_string()))
            .ok()
            .zip(kinds)
            .and_then(|(key, kinds)| decode_values(kinds, &key.0).ok());
        match decoded {
            Some(values) => values
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("/"),
            None => hex.to_string(),
        }
    };
    for split in splits {
        let maturity = match split["maturity"]["type"].as_str() {
            Some("mature") => "mature",
            Some("immature") => "immature",
            _ => "-",
        };
        let mut row = vec![
            split["split_id"].as_str().unwrap_or("?").to_string(),
            split["split_state"].as_str().unwrap_or("?").to_string(),
            split["num_docs"].as_u64().unwrap_or(0).to_string(),
            format!(
                "{:.2}",
                split["size_bytes"].as_u64().unwrap_or(0) as f64 / 1e6
            ),
            split["partition_id"].as_u64().unwrap_or(0).to_string(),
            split["num_merge_ops"].as_u64().unwrap_or(0).to_string(),
            maturity.to_string(),
            ts(&split["time_range"]["start"]),
            ts(&split["time_range"]["end"]),
        ];
        if metrics {
            row.push(split["num_series"].as_u64().unwrap_or(0).to_string());
        }
        if keyed {
            row.push(ts(&split["time_bucket_start"]));
            row.push(split["key_level"].as_u64().unwrap_or(0).to_string());
            row.push(format!(
                "{} .. {}",
                key(&split["sort_key_min"]),
                key(&split["sort_key_max"])
            ));
        }
        rows.push(row);
    }
    table(&rows, &right)
}

/// The sort field types of a locality or metrics index's config (as the API returns it).
fn sort_field_types(config: &Value) -> Option<Vec<SortFieldType>> {
    let config = shale_config::IndexConfig::parse(config.to_string().as_bytes()).ok()?;
    // Metrics splits: the metric name and sort labels (text), then the series id.
    if let Some(metrics) = &config.metrics {
        let mut kinds = vec![SortFieldType::Text; 1 + metrics.sort_labels.len()];
        kinds.push(SortFieldType::U64);
        return Some(kinds);
    }
    match &config.indexing_settings.merge_policy {
        shale_config::MergePolicyConfig::Locality(locality) => {
            locality.sort_field_types(&config.doc_mapping).ok()
        }
        _ => None,
    }
}

pub async fn compaction(cmd: CompactionCommand) -> anyhow::Result<()> {
    let CompactionCommand::Status { endpoint, index } = cmd;
    let client = endpoint.client()?;
    let status =
        call(client.get(endpoint.url(&format!("/api/v1/indexes/{index}/compaction")))).await?;
    println!("index:              {index}");
    println!(
        "scope mode:         {}",
        status["scope_mode"].as_str().unwrap_or("?")
    );
    println!("merge policy:       {}", status["merge_policy"]);
    println!("published splits:   {}", status["published_splits"]);
    println!("immature splits:    {}", status["immature_splits"]);
    println!("pending operations: {}", status["pending_operations"]);
    let task_line = |task: &Value| {
        format!(
            "  {}  {:<10} {:>3} splits  attempts {}  {}{}",
            task["task_id"].as_str().unwrap_or("?"),
            task["state"].as_str().unwrap_or("?"),
            task["split_ids"].as_array().map_or(0, Vec::len),
            task["attempts"],
            task["lease_owner"]
                .as_str()
                .map(|o| format!("on {o}"))
                .unwrap_or_default(),
            task["error"]
                .as_str()
                .map(|e| format!("  error: {e}"))
                .unwrap_or_default(),
        )
    };
    for (title, key) in [
        ("running", "running"),
        ("pending", "pending"),
        ("recent merges", "recent_merges"),
    ] {
        let tasks = status[key].as_array().cloned().unwrap_or_default();
        println!("{title}: {}", tasks.len());
        for task in &tasks {
            println!("{}", task_line(task));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The cells of a table line: text separated by two spaces or more, with its span.
    fn spans(line: &str) -> Vec<(usize, usize, &str)> {
        let mut out = Vec::new();
        let mut start = None;
        let bytes = line.as_bytes();
        for i in 0..=bytes.len() {
            let gap = i == bytes.len() || (bytes[i] == b' ' && bytes.get(i + 1) == Some(&b' '));
            match (start, gap) {
                (None, false) if bytes[i] != b' ' => start = Some(i),
                (Some(s), true) => {
                    out.push((s, i, &line[s..i]));
                    start = None;
                }
                _ => {}
            }
        }
        out
    }

    /// The cells of `line`, each checked to stand under its header (their spans overlap).
    fn cells<'a>(header: &str, line: &'a str) -> Vec<&'a str> {
        let (header, row) = (spans(header), spans(line));
        assert_eq!(header.len(), row.len(), "{header:?} / {row:?}");
        for ((hs, he, h), (rs, re, r)) in header.iter().zip(&row) {
            assert!(hs < re && rs < he, "`{r}` is not under `{h}`");
        }
        row.into_iter().map(|(_, _, text)| text).collect()
    }

    #[test]
    fn a_node_without_a_recorded_heartbeat_shows_unknown() {
        let live = json!({"last_heartbeat_ms": 1_796_402_140_000_i64, "heartbeat_age_ms": 850});
        assert_eq!(heartbeat_age(&live), "850 ms ago");
        // A node that left: its last heartbeat is at the epoch, and the node says null…
        let left = json!({"last_heartbeat_ms": 0, "heartbeat_age_ms": null});
        assert_eq!(heartbeat_age(&left), "unknown");
        // …or, from an older node, the time since 1970.
        let old = json!({"last_heartbeat_ms": 0, "heartbeat_age_ms": 1_796_402_142_933_i64});
        assert_eq!(heartbeat_age(&old), "unknown");
        assert_eq!(heartbeat_age(&json!({})), "unknown");
    }

    #[test]
    fn the_index_list_header_names_its_columns() {
        let indexes = json!([
            {"index_uid": "logs:01KA3Y3R5W0D4Y8M3ZJ8Q1X2V6", "index_config": {"index_id": "logs"}},
            {"index_uid": "a-much-longer-index-name:01KA3Y3R5W0D4Y8M3ZJ8Q1X2V7",
             "index_config": {"index_id": "a-much-longer-index-name"}},
        ]);
        let out = index_table(&indexes);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(cells(lines[0], lines[0]), ["INDEX ID", "INDEX UID"]);
        assert_eq!(
            cells(lines[0], lines[1]),
            ["logs", "logs:01KA3Y3R5W0D4Y8M3ZJ8Q1X2V6"]
        );
        assert_eq!(
            cells(lines[0], lines[2]),
            [
                "a-much-longer-index-name",
                "a-much-longer-index-name:01KA3Y3R5W0D4Y8M3ZJ8Q1X2V7"
            ]
        );
    }

    #[test]
    fn the_splits_table_puts_each_value_under_its_header() {
        let split = json!({
            "split_id": "01KA3Y3R5W0D4Y8M3ZJ8Q1X2V6",
            "split_state": "MarkedForDeletion",
            "num_docs": 123456,
            "size_bytes": 2_500_000,
            "partition_id": 7,
            "num_merge_ops": 2,
            "maturity": {"type": "immature"},
            "time_range": {"start": 1_700_000_000, "end": 1_700_000_059},
        });
        let out = splits_table(&[&split], false, None);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            cells(lines[0], lines[0]),
            [
                "SPLIT ID",
                "STATE",
                "DOCS",
                "SIZE (MB)",
                "PARTITION",
                "MERGE OPS",
                "MATURITY",
                "START",
                "END"
            ]
        );
        assert_eq!(
            cells(lines[0], lines[1]),
            [
                "01KA3Y3R5W0D4Y8M3ZJ8Q1X2V6",
                "MarkedForDeletion",
                "123456",
                "2.50",
                "7",
                "2",
                "immature",
                "2023-11-14T22:13:20Z",
                "2023-11-14T22:14:19Z"
            ]
        );
        // Metrics splits: samples and series; locality splits: bucket, key level, key range.
        let mut metrics = split.clone();
        metrics["num_series"] = json!(42);
        metrics["time_bucket_start"] = json!(1_699_999_200);
        metrics["key_level"] = json!(1);
        metrics["sort_key_min"] = json!("00");
        metrics["sort_key_max"] = json!("ff");
        let out = splits_table(&[&metrics], true, None);
        let lines: Vec<&str> = out.lines().collect();
        let header = cells(lines[0], lines[0]);
        let row = cells(lines[0], lines[1]);
        let cell = |name: &str| row[header.iter().position(|h| *h == name).unwrap()];
        assert_eq!(cell("SAMPLES"), "123456");
        assert_eq!(cell("SERIES"), "42");
        assert_eq!(cell("BUCKET"), "2023-11-14T22:00:00Z");
        assert_eq!(cell("KEY LEVEL"), "1");
        assert_eq!(cell("KEY RANGE"), "00 .. ff");
        assert!(!header.contains(&"DOCS"));
    }

    #[test]
    fn the_ingest_summary_is_one_line_per_fact() {
        let mut stats = IngestStats::default();
        stats.add(&json!({"num_ingested_docs": 50000, "num_rejected_docs": 0}));
        assert_eq!(
            stats.summary(Duration::from_secs(2)),
            "ingested 50000 documents in 2.0s (25000 docs/s), 0 rejected\n"
        );
        stats.add(&json!({
            "num_ingested_docs": 0,
            "num_rejected_docs": 1,
            "parse_failures": [{"reason": "invalid_json", "message": "line 3: expected value"}],
        }));
        assert_eq!(
            stats.summary(Duration::from_secs(2)),
            "ingested 50000 documents in 2.0s (25000 docs/s), 1 rejected\n\
             rejections by reason:\n\
             \x20        1  invalid_json\n\
             first rejections:\n\
             \x20 line 3: expected value\n"
        );
    }

    #[test]
    fn table_columns_line_up_whatever_the_cell_widths() {
        let rows = vec![
            vec!["NODE".to_string(), "GEN".to_string(), "LEADER".to_string()],
            vec![
                "a-long-node-name".to_string(),
                "12".to_string(),
                "yes".to_string(),
            ],
            vec!["n".to_string(), "1".to_string(), String::new()],
        ];
        assert_eq!(
            table(&rows, &[1]),
            "NODE              GEN  LEADER\n\
             a-long-node-name   12  yes\n\
             n                   1\n"
        );
    }
}
