//! The README's examples run as written: its Elasticsearch Python example (the fenced
//! `python` block that calls `helpers.bulk`) against a node holding the README's quickstart
//! index (the YAML of its quickstart's `cat > logs.yaml` heredoc), both read from README.md.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{self, TestNode};

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The fenced blocks of `markdown` in `language`, in order.
fn fenced_blocks(markdown: &str, language: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        let fence = line.trim_start().starts_with("```");
        match current.as_mut() {
            None if fence => {
                let info = line.trim_start().trim_start_matches('`').trim();
                if info == language {
                    current = Some(String::new());
                }
            }
            Some(block) if fence => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// The quickstart's index config: the heredoc the quickstart writes to `logs.yaml`.
fn quickstart_index_config(readme: &str) -> String {
    let mut lines = readme.lines();
    let opening = lines
        .by_ref()
        .find(|l| l.contains("logs.yaml") && l.contains("<<"))
        .expect("the quickstart writes logs.yaml from a heredoc");
    let marker = opening
        .rsplit("<<")
        .next()
        .unwrap()
        .trim()
        .trim_matches(|c| c == '\'' || c == '"' || c == '-');
    let config: Vec<&str> = lines.take_while(|l| l.trim() != marker).collect();
    assert!(!config.is_empty(), "empty heredoc {marker}");
    config.join("\n") + "\n"
}

/// The value of a metric without labels in `/metrics`.
fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

/// The README's Python example exits 0 on the quickstart index within its client's timeouts
/// (a request past them raises), and every document it sent is searchable as soon as it
/// returns, once.
#[tokio::test]
async fn the_readme_elasticsearch_python_example_runs_as_written() {
    if !common::python_module_installed("elasticsearch") {
        return;
    }
    let readme = readme();
    let index_config = quickstart_index_config(&readme);
    let example = fenced_blocks(&readme, "python")
        .into_iter()
        .find(|block| block.contains("helpers.bulk"))
        .expect("a python block calling helpers.bulk in the README");

    let node = TestNode::start().await;
    node.create_index(&index_config).await;
    let setting = |key: &str| {
        index_config
            .lines()
            .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    };
    let index_id = setting("index_id").expect("the quickstart config has an index_id");
    let commit_timeout = setting("commit_timeout_secs")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(60);

    // The example talks to the README's default address: point it at this node.
    let mut script = example.clone();
    for address in ["http://127.0.0.1:7280", "http://localhost:7280"] {
        script = script.replace(address, &node.base);
    }
    assert_ne!(
        script, example,
        "the example names no node address to replace"
    );
    // After the example: what the client sees right away, and how many documents it built.
    script.push_str(&format!(
        r#"
import json as _json
_seen = es.count(index="{index_id}")["count"]
_built = len(docs) if isinstance(docs, (list, tuple)) else None
print(_json.dumps({{"count": _seen, "built": _built}}))
"#
    ));

    let started = Instant::now();
    let mut child = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(&script)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let read = async move {
        use tokio::io::AsyncReadExt;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let _ = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        (out, err)
    };
    // Ingesting 10 000 documents and one commit: far less than this, even on a loaded machine.
    let limit = Duration::from_secs(commit_timeout * 6 + 120);
    let ((out, err), status) = tokio::time::timeout(limit, async {
        let output = read.await;
        (output, child.wait().await.unwrap())
    })
    .await
    .unwrap_or_else(|_| panic!("the README example did not finish within {limit:?}"));
    let (out, err) = (String::from_utf8_lossy(&out), String::from_utf8_lossy(&err));
    assert!(
        status.success(),
        "the README example failed after {:?}:\n{err}\n{out}",
        started.elapsed()
    );

    let result: Value = serde_json::from_str(out.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {out}"));
    let metrics = node.metrics().await;
    let accepted = counter(&metrics, "shale_ingest_docs_total");
    assert!(accepted > 0.0, "nothing ingested");
    assert_eq!(counter(&metrics, "shale_ingest_docs_rejected_total"), 0.0);
    // Searchable when the example returned, through its own client and through the API.
    assert_eq!(result["count"].as_f64(), Some(accepted), "{result}");
    assert_eq!(node.count(&index_id, "*").await as f64, accepted);
    if let Some(built) = result["built"].as_f64() {
        // Each document once: no chunk sent twice.
        assert_eq!(built, accepted, "{result}");
    }
    node.stop().await;
}

/// The Security section's node config (the `yaml` block starting `# node.yaml`) parses as
/// written, and a node started with its tokens gives each the role the comments say.
#[tokio::test]
async fn the_readme_security_config_runs_as_written() {
    let readme = readme();
    let yaml = fenced_blocks(&readme, "yaml")
        .into_iter()
        .find(|block| block.starts_with("# node.yaml"))
        .expect("the Security section's node.yaml block");
    let parsed = shale_config::NodeConfig::from_yaml(yaml.as_bytes()).unwrap();
    assert_eq!(parsed.api_tokens.len(), 3);
    assert_eq!(parsed.query_memory_budget_bytes, 2 << 30);
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    config.api_token = parsed.api_token.clone();
    config.api_tokens = parsed.api_tokens.clone();
    config.cluster.cluster_secret = parsed.cluster.cluster_secret.clone();
    config.rest = parsed.rest.clone();
    let node = TestNode::start_with(config).await;
    let status = |token: &str, method: reqwest::Method, path: &str| {
        node.client
            .request(method, node.url(path))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body("{}")
            .send()
    };
    for (token, role) in parsed.api_tokens.iter().map(|t| (t.token.as_str(), t.role)) {
        let list = status(token, reqwest::Method::GET, "/api/v1/indexes")
            .await
            .unwrap()
            .status()
            .as_u16();
        let create = status(token, reqwest::Method::POST, "/api/v1/indexes")
            .await
            .unwrap()
            .status()
            .as_u16();
        match role {
            shale_config::TokenRole::Reader => assert_eq!((list, create), (200, 403)),
            shale_config::TokenRole::Writer => assert_eq!((list, create), (403, 403)),
            // An admin may create: `{}` is not an index config.
            shale_config::TokenRole::Admin => assert_eq!((list, create), (200, 400)),
        }
    }
    node.stop().await;
}
