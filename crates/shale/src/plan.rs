//! `shale plan`: a dry run of the merge policy. It reads a policy and a list of splits (or a live
//! index's), groups the splits by merge scope and prints the operations the policy would emit,
//! exactly as the node's planner would ask for them:
//!
//! ```text
//! shale plan --policy P.yaml --splits S.json [--now UNIX_SECS] [--scope cluster|node_local]
//! shale plan --index logs [--endpoint URL] [--policy P.yaml]
//! {"operations":[{"split_ids":["a","b",...]},...]}
//! ```
//!
//! Operations come scope after scope (scopes sorted), each scope's in the order the policy
//! returned them, each operation's ids in the policy's order. Bad input is reported on stderr
//! with the offending field (`splits[3].num_docs: expected an unsigned integer`) and exit code 2.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Map, Value};
use shale_compaction::policy::{build_policy, LocalityMergePolicy, MergePolicy, MergePolicyConfig};
use shale_types::sort_key::SortKey;
use shale_types::{IndexUid, SplitMaturity, SplitMetadata, TimeRange, INGEST_API_SOURCE_ID};

/// Default `split_num_docs_target` when the policy file gives none.
const DEFAULT_SPLIT_NUM_DOCS_TARGET: u64 = shale_config::DEFAULT_SPLIT_NUM_DOCS_TARGET;

#[derive(clap::Args)]
pub struct PlanArgs {
    /// Policy file (YAML or JSON): `merge_policy` and `split_num_docs_target`, bare or under
    /// `indexing_settings:` (an index config works). Default: `stable_log`, 10 000 000 docs;
    /// with `--index`, the index's own policy.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Splits file: a JSON array of split objects (`split_id`, `num_docs`, `create_timestamp`,
    /// and optionally `time_range_start`, `time_range_end`, `num_merge_ops`, `maturity`,
    /// `partition_id`, `node_id`, `source_id`, `doc_mapping_uid`, `size_bytes`; for the
    /// `locality` policy `time_bucket_start`, `sort_key_min`/`sort_key_max` (hex) and
    /// `key_level`).
    #[arg(long, required_unless_present = "index", conflicts_with = "index")]
    splits: Option<PathBuf>,
    /// Plan over the Published splits of this live index instead of a splits file.
    #[arg(long)]
    index: Option<String>,
    /// REST endpoint of a node (with `--index`).
    #[arg(long, env = "SHALE_ENDPOINT", default_value = "http://127.0.0.1:7280")]
    endpoint: String,
    /// The clock, in Unix seconds (default: now).
    #[arg(long)]
    now: Option<i64>,
    /// Merge scope mode.
    #[arg(long, value_enum, default_value_t = ScopeArg::Cluster)]
    scope: ScopeArg,
    /// Print the policy's finalize merges (run when a stream of splits ends) instead.
    #[arg(long)]
    finalize: bool,
}

/// Merge scope mode of `plan` and `simulate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ScopeArg {
    /// `(index, source, partition, doc mapping)`: splits of every node merge together.
    #[value(name = "cluster")]
    Cluster,
    /// Adds the node id, as Quickwit does.
    #[value(name = "node_local", alias = "node-local")]
    NodeLocal,
}

impl ScopeArg {
    /// Whether the scope includes the node id.
    pub fn node_local(self) -> bool {
        self == ScopeArg::NodeLocal
    }
}

/// Bad input from the user: reported without a backtrace of contexts, exit code 2.
#[derive(Debug)]
pub struct InputError(pub String);

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InputError {}

fn input_error(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(InputError(message.into()))
}

/// Exits with code 2 if `result` failed on bad input; other errors are returned.
pub fn exit_on_input_error(result: anyhow::Result<()>) -> anyhow::Result<()> {
    match result {
        Err(err) if err.is::<InputError>() => {
            eprintln!("error: {err}");
            std::process::exit(2);
        }
        other => other,
    }
}

/// A policy and its docs target, as read from a policy file or an index config.
pub struct LoadedPolicy {
    /// The parsed `merge_policy` block.
    pub config: MergePolicyConfig,
    /// `split_num_docs_target`.
    pub split_num_docs_target: u64,
    /// The policy.
    pub policy: Arc<dyn MergePolicy>,
}

impl Default for LoadedPolicy {
    fn default() -> Self {
        let config = MergePolicyConfig::default();
        let policy = build_policy(&config, DEFAULT_SPLIT_NUM_DOCS_TARGET);
        LoadedPolicy {
            config,
            split_num_docs_target: DEFAULT_SPLIT_NUM_DOCS_TARGET,
            policy,
        }
    }
}

/// Reads a policy file: `{merge_policy, split_num_docs_target}`, bare or under
/// `indexing_settings:`.
pub fn load_policy_file(path: &Path) -> anyhow::Result<LoadedPolicy> {
    let label = path.display().to_string();
    let bytes =
        std::fs::read(path).map_err(|err| input_error(format!("cannot read {label}: {err}")))?;
    let document: Value = serde_yaml::from_slice(&bytes)
        .map_err(|err| input_error(format!("{label}: not valid YAML or JSON: {err}")))?;
    let Value::Object(top) = &document else {
        return Err(input_error(format!(
            "{label}: expected a mapping with `merge_policy` and `split_num_docs_target`"
        )));
    };
    // A metrics index config: its policy is the one its `metrics` section implies.
    if top.contains_key("metrics") {
        let config = shale_config::IndexConfig::parse(&bytes)
            .map_err(|err| input_error(format!("{label}: {err}")))?;
        let settings = serde_json::to_value(&config.indexing_settings)?;
        let Value::Object(settings) = settings else {
            return Err(input_error(format!("{label}: indexing_settings")));
        };
        return policy_from_settings(&settings, "indexing_settings.")
            .map_err(|message| input_error(format!("{label}: {message}")));
    }
    match top.get("indexing_settings") {
        Some(Value::Object(settings)) => policy_from_settings(settings, "indexing_settings.")
            .map_err(|message| input_error(format!("{label}: {message}"))),
        Some(_) => Err(input_error(format!(
            "{label}: indexing_settings: expected a mapping"
        ))),
        None => {
            if let Some(key) = top
                .keys()
                .find(|key| !matches!(key.as_str(), "merge_policy" | "split_num_docs_target"))
            {
                return Err(input_error(format!(
                    "{label}: {key}: unknown key (expected `merge_policy` and \
                     `split_num_docs_target`, or an `indexing_settings` block)"
                )));
            }
            policy_from_settings(top, "")
                .map_err(|message| input_error(format!("{label}: {message}")))
        }
    }
}

/// The policy of an `indexing_settings` object; errors are prefixed with `prefix`.
fn policy_from_settings(
    settings: &Map<String, Value>,
    prefix: &str,
) -> Result<LoadedPolicy, String> {
    let split_num_docs_target = match settings.get("split_num_docs_target") {
        None | Some(Value::Null) => DEFAULT_SPLIT_NUM_DOCS_TARGET,
        Some(value) => match value.as_u64() {
            Some(target) if target >= 1 => target,
            _ => {
                return Err(format!(
                    "{prefix}split_num_docs_target: expected an integer of at least 1, got {value}"
                ))
            }
        },
    };
    let merge_policy = settings.get("merge_policy").unwrap_or(&Value::Null);
    let config = MergePolicyConfig::parse(merge_policy)
        .map_err(|err| format!("{prefix}{}: {}", err.field, err.message))?;
    let policy = match (&config, settings.get("commit_timeout_secs")) {
        // Locality buckets close a few commit timeouts after their end.
        (MergePolicyConfig::Locality(locality), Some(value)) => {
            let commit = value.as_u64().ok_or_else(|| {
                format!("{prefix}commit_timeout_secs: expected an unsigned integer, got {value}")
            })?;
            Arc::new(LocalityMergePolicy::new(locality.clone(), commit)) as Arc<dyn MergePolicy>
        }
        _ => build_policy(&config, split_num_docs_target),
    };
    Ok(LoadedPolicy {
        config,
        split_num_docs_target,
        policy,
    })
}

/// Fields of a split object in a splits file.
const SPLIT_FIELDS: &[&str] = &[
    "split_id",
    "num_docs",
    "create_timestamp",
    "time_range_start",
    "time_range_end",
    "time_range",
    "num_merge_ops",
    "maturity",
    "partition_id",
    "node_id",
    "source_id",
    "doc_mapping_uid",
    "size_bytes",
    "index_uid",
    "time_bucket_start",
    "sort_key_min",
    "sort_key_max",
    "key_level",
];

/// Fields of the API's split objects that planning ignores (accepted in files too, so that
/// `GET …/splits` output can be planned as is).
const IGNORED_API_FIELDS: &[&str] = &[
    "split_state",
    "update_timestamp",
    "publish_timestamp",
    "tags",
    "footer_offsets",
    "uncompressed_docs_size_bytes",
    "delete_opstamp",
];

/// The index uid given to splits that name none.
fn placeholder_index_uid() -> IndexUid {
    IndexUid {
        index_id: "plan".to_string(),
        incarnation: "00000000000000000000000000".to_string(),
    }
}

/// Parses a JSON array of split objects; `label` names the array in errors (`splits`). When
/// `lenient`, unknown fields are ignored (the API's items carry more than planning needs).
pub fn parse_splits(
    document: &Value,
    policy: &dyn MergePolicy,
    label: &str,
    lenient: bool,
) -> Result<Vec<SplitMetadata>, String> {
    let Value::Array(items) = document else {
        return Err(format!("{label}: expected a JSON array of split objects"));
    };
    let mut first_seen: HashMap<&str, usize> = HashMap::new();
    let mut splits = Vec::with_capacity(items.len());
    for (ord, item) in items.iter().enumerate() {
        let at = format!("{label}[{ord}]");
        let split = parse_split(item, policy, &at, lenient)?;
        if let Some(Value::String(id)) = item.get("split_id") {
            if let Some(first) = first_seen.insert(id.as_str(), ord) {
                return Err(format!(
                    "{at}.split_id: duplicate id `{id}` (also {label}[{first}])"
                ));
            }
        }
        splits.push(split);
    }
    Ok(splits)
}

fn parse_split(
    item: &Value,
    policy: &dyn MergePolicy,
    at: &str,
    lenient: bool,
) -> Result<SplitMetadata, String> {
    let Value::Object(object) = item else {
        return Err(format!("{at}: expected an object"));
    };
    if !lenient {
        if let Some(key) = object.keys().find(|key| {
            !SPLIT_FIELDS.contains(&key.as_str()) && !IGNORED_API_FIELDS.contains(&key.as_str())
        }) {
            return Err(format!(
                "{at}.{key}: unknown field (expected {})",
                SPLIT_FIELDS.join(", ")
            ));
        }
    }
    let field = Field { object, at };
    let split_id = field
        .string("split_id")?
        .ok_or_else(|| field.missing("split_id"))?;
    if split_id.is_empty() {
        return Err(format!("{at}.split_id: must not be empty"));
    }
    let num_docs = field
        .u64("num_docs")?
        .ok_or_else(|| field.missing("num_docs"))?;
    let create_timestamp = field
        .i64("create_timestamp")?
        .ok_or_else(|| field.missing("create_timestamp"))?;
    let num_merge_ops = match field.u64("num_merge_ops")? {
        None => 0,
        Some(ops) => u32::try_from(ops).map_err(|_| format!("{at}.num_merge_ops: too large"))?,
    };
    let time_range = field.time_range()?;
    let maturity = match field.maturity()? {
        Some(maturity) => maturity,
        None => policy.split_maturity(num_docs, num_merge_ops),
    };
    let index_uid = match field.string("index_uid")? {
        None => placeholder_index_uid(),
        Some(uid) => uid
            .parse()
            .map_err(|err| format!("{at}.index_uid: {err}"))?,
    };
    let size_bytes = field.u64("size_bytes")?.unwrap_or(0);
    let sort_key_min = field.sort_key("sort_key_min")?;
    let sort_key_max = field.sort_key("sort_key_max")?;
    if let (Some(min), Some(max)) = (&sort_key_min, &sort_key_max) {
        if min > max {
            return Err(format!("{at}.sort_key_max: below sort_key_min"));
        }
    }
    if sort_key_min.is_some() != sort_key_max.is_some() {
        return Err(format!(
            "{at}: give both `sort_key_min` and `sort_key_max`, or neither"
        ));
    }
    let key_level = match field.u64("key_level")? {
        None => 0,
        Some(level @ 0..=1) => level as u8,
        Some(other) => return Err(format!("{at}.key_level: expected 0 or 1, got {other}")),
    };
    Ok(SplitMetadata {
        split_id,
        index_uid,
        source_id: field
            .string("source_id")?
            .unwrap_or_else(|| INGEST_API_SOURCE_ID.to_string()),
        node_id: field.string("node_id")?.unwrap_or_default(),
        partition_id: field.u64("partition_id")?.unwrap_or(0),
        doc_mapping_uid: field.string("doc_mapping_uid")?.unwrap_or_default(),
        num_docs,
        size_bytes,
        uncompressed_docs_size_bytes: size_bytes,
        time_range,
        tags: Default::default(),
        create_timestamp,
        maturity,
        num_merge_ops,
        delete_opstamp: 0,
        footer_offsets: (0, 0),
        time_bucket_start: field.i64("time_bucket_start")?,
        sort_key_min,
        sort_key_max,
        key_level,
        sort_fields: None,
        tag_fields: None,
        format: Default::default(),
        num_series: None,
    })
}

/// Typed access to one split object's fields, with errors naming `at.field`.
struct Field<'a> {
    object: &'a Map<String, Value>,
    at: &'a str,
}

impl Field<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.object.get(key).filter(|value| !value.is_null())
    }

    fn missing(&self, key: &str) -> String {
        format!("{}.{key}: missing", self.at)
    }

    fn u64(&self, key: &str) -> Result<Option<u64>, String> {
        self.get(key)
            .map(|value| {
                value.as_u64().ok_or_else(|| {
                    format!(
                        "{}.{key}: expected an unsigned integer, got {value}",
                        self.at
                    )
                })
            })
            .transpose()
    }

    fn i64(&self, key: &str) -> Result<Option<i64>, String> {
        self.get(key)
            .map(|value| {
                value.as_i64().ok_or_else(|| {
                    format!(
                        "{}.{key}: expected an integer (Unix seconds), got {value}",
                        self.at
                    )
                })
            })
            .transpose()
    }

    /// A sort key, as the API shows it: lowercase hex.
    fn sort_key(&self, key: &str) -> Result<Option<SortKey>, String> {
        self.get(key)
            .map(|value| {
                serde_json::from_value::<SortKey>(value.clone()).map_err(|err| {
                    format!(
                        "{}.{key}: expected a hex sort key, got {value} ({err})",
                        self.at
                    )
                })
            })
            .transpose()
    }

    fn string(&self, key: &str) -> Result<Option<String>, String> {
        self.get(key)
            .map(|value| match value {
                Value::String(text) => Ok(text.clone()),
                _ => Err(format!("{}.{key}: expected a string, got {value}", self.at)),
            })
            .transpose()
    }

    /// `time_range_start` + `time_range_end`, or the API's `time_range: {start, end}`.
    fn time_range(&self) -> Result<Option<TimeRange>, String> {
        let at = self.at;
        let start = self.i64("time_range_start")?;
        let end = self.i64("time_range_end")?;
        let range = match (start, end, self.get("time_range")) {
            (None, None, None) => return Ok(None),
            (Some(start), Some(end), None) => TimeRange { start, end },
            (Some(_), None, _) => return Err(format!("{at}.time_range_end: missing (time_range_start is given)")),
            (None, Some(_), _) => return Err(format!("{at}.time_range_start: missing (time_range_end is given)")),
            (Some(_), Some(_), Some(_)) => {
                return Err(format!(
                    "{at}.time_range: give either `time_range` or `time_range_start` and `time_range_end`"
                ))
            }
            (None, None, Some(Value::Object(object))) => {
                let inner = Field {
                    object,
                    at: &format!("{at}.time_range"),
                };
                let start = inner.i64("start")?.ok_or_else(|| inner.missing("start"))?;
                let end = inner.i64("end")?.ok_or_else(|| inner.missing("end"))?;
                TimeRange { start, end }
            }
            (None, None, Some(value)) => {
                return Err(format!(
                    "{at}.time_range: expected an object {{start, end}} or null, got {value}"
                ))
            }
        };
        if range.start > range.end {
            return Err(format!(
                "{at}.time_range_end: {} is before time_range_start {}",
                range.end, range.start
            ));
        }
        Ok(Some(range))
    }

    /// `{"type":"mature"}` or `{"type":"immature","maturation_period_secs":N}`.
    fn maturity(&self) -> Result<Option<SplitMaturity>, String> {
        let at = self.at;
        let Some(value) = self.get("maturity") else {
            return Ok(None);
        };
        let Value::Object(object) = value else {
            return Err(format!(
                "{at}.maturity: expected {{\"type\":\"mature\"}} or \
                 {{\"type\":\"immature\",\"maturation_period_secs\":N}}, got {value}"
            ));
        };
        let inner = Field {
            object,
            at: &format!("{at}.maturity"),
        };
        match inner.string("type")?.as_deref() {
            Some("mature") => {
                if let Some(key) = object.keys().find(|key| *key != "type") {
                    return Err(format!(
                        "{at}.maturity.{key}: unknown field for a mature split"
                    ));
                }
                Ok(Some(SplitMaturity::Mature))
            }
            Some("immature") => {
                if let Some(key) = object
                    .keys()
                    .find(|key| !matches!(key.as_str(), "type" | "maturation_period_secs"))
                {
                    return Err(format!(
                        "{at}.maturity.{key}: unknown field (expected maturation_period_secs)"
                    ));
                }
                let maturation_period_secs = inner
                    .u64("maturation_period_secs")?
                    .ok_or_else(|| inner.missing("maturation_period_secs"))?;
                Ok(Some(SplitMaturity::Immature {
                    maturation_period_secs,
                }))
            }
            Some(other) => Err(format!(
                "{at}.maturity.type: unknown maturity `{other}` (mature or immature)"
            )),
            None => Err(inner.missing("type")),
        }
    }
}

/// Runs `shale plan`.
pub async fn run(args: PlanArgs) -> anyhow::Result<()> {
    exit_on_input_error(plan(args).await)
}

async fn plan(args: PlanArgs) -> anyhow::Result<()> {
    let now = args.now.unwrap_or_else(shale_types::now_unix_secs);
    let policy_file = args.policy.as_deref().map(load_policy_file).transpose()?;
    let (loaded, splits) = match (&args.index, &args.splits) {
        (Some(index), _) => {
            let (index_policy, splits) =
                fetch_index(&args.endpoint, index, policy_file.as_ref()).await?;
            (policy_file.unwrap_or(index_policy), splits)
        }
        (None, Some(path)) => {
            let loaded = policy_file.unwrap_or_default();
            let label = path.display().to_string();
            let bytes = std::fs::read(path)
                .map_err(|err| input_error(format!("cannot read {label}: {err}")))?;
            let document: Value = serde_json::from_slice(&bytes)
                .map_err(|err| input_error(format!("{label}: not valid JSON: {err}")))?;
            let splits = parse_splits(&document, loaded.policy.as_ref(), "splits", false)
                .map_err(|message| input_error(format!("{label}: {message}")))?;
            (loaded, splits)
        }
        (None, None) => return Err(input_error("give --splits FILE or --index ID")),
    };
    let operations = operations(
        &splits,
        loaded.policy.as_ref(),
        args.scope,
        now,
        args.finalize,
    );
    println!(
        "{}",
        serde_json::to_string(&serde_json::json!({ "operations": operations }))?
    );
    Ok(())
}

/// The operations of every scope, scopes sorted.
fn operations(
    splits: &[SplitMetadata],
    policy: &dyn MergePolicy,
    scope: ScopeArg,
    now: i64,
    finalize: bool,
) -> Vec<shale_compaction::MergeOperation> {
    if !finalize {
        return shale_compaction::plan(splits, policy, scope.node_local(), now)
            .into_iter()
            .flat_map(|(_, operations)| operations)
            .collect();
    }
    let mut scopes: std::collections::BTreeMap<_, Vec<SplitMetadata>> = Default::default();
    for split in splits {
        scopes
            .entry(split.merge_scope(scope.node_local()))
            .or_default()
            .push(split.clone());
    }
    scopes
        .values()
        .flat_map(|members| policy.finalize_operations(members, now))
        .collect()
}

/// The index's policy and Published splits, from a node's REST API.
async fn fetch_index(
    endpoint: &str,
    index: &str,
    policy_override: Option<&LoadedPolicy>,
) -> anyhow::Result<(LoadedPolicy, Vec<SplitMetadata>)> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    let base = endpoint.trim_end_matches('/');
    let metadata = get_json(&client, &format!("{base}/api/v1/indexes/{index}")).await?;
    let index_policy = match metadata.pointer("/index_config/indexing_settings") {
        Some(Value::Object(settings)) => {
            policy_from_settings(settings, "index_config.indexing_settings.").map_err(
                |message| anyhow::anyhow!("index `{index}` has an invalid merge policy: {message}"),
            )?
        }
        _ => LoadedPolicy::default(),
    };
    let policy = policy_override.map_or(index_policy.policy.as_ref(), |loaded| {
        loaded.policy.as_ref()
    });
    let listing = get_json(
        &client,
        &format!("{base}/api/v1/indexes/{index}/splits?split_states=Published"),
    )
    .await?;
    let items = listing
        .get("splits")
        .cloned()
        .unwrap_or(Value::Array(Vec::new()));
    let splits = parse_splits(&items, policy, "splits", true)
        .map_err(|message| anyhow::anyhow!("unexpected split listing from the node: {message}"))?;
    Ok((index_policy, splits))
}

async fn get_json(client: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    let response = client
        .get(url)
        .send()
        .await
        .with_context(|| format!("cannot reach the node at {url}"))?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let message = body
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("no message");
        anyhow::bail!("{status}: {message}");
    }
    Ok(body)
}
