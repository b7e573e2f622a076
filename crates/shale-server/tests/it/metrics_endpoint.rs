//! `GET /metrics`: every `shale_*` family registered anywhere in the workspace is rendered
//! from a fresh node's first scrape (the names are read from the crates' sources, so a new
//! family is covered without touching this test), with the process's own metrics, and HTTP
//! requests are counted by route template, method and status.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::json;

use crate::common::{self, TestNode};

/// One sample line of the Prometheus text format.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// The samples of a Prometheus text exposition (comments skipped).
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(parts) => parts,
            None => panic!("malformed sample line: {line}"),
        };
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            other => other
                .parse()
                .unwrap_or_else(|_| panic!("bad value: {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("labels end with }");
                (name.to_string(), parse_labels(body))
            }
        };
        samples.push(Sample {
            name,
            labels,
            value,
        });
    }
    samples
}

/// `a="x",b="y"` (values with the text format's escapes).
fn parse_labels(body: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut chars = body.chars().peekable();
    loop {
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if name.is_empty() {
            break;
        }
        assert_eq!(chars.next(), Some('"'), "label {name} in {body}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                other => value.push(other),
            }
        }
        labels.insert(name.trim_start_matches(',').to_string(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    labels
}

/// The families of an exposition that have at least one sample (a histogram by its
/// `_bucket`, `_sum` and `_count` series).
pub fn rendered_families(text: &str) -> BTreeSet<String> {
    let histograms: BTreeSet<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" histogram"))
        .collect();
    parse_exposition(text)
        .into_iter()
        .map(|s| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|suffix| s.name.strip_suffix(suffix))
                .find(|base| histograms.contains(base))
                .map_or(s.name.clone(), str::to_string)
        })
        .collect()
}

/// Every metric name that the workspace's crates register: the first string literal after
/// each `register_…!(` or `Opts::new(` in their sources, when it starts with `shale_`.
pub fn registered_shale_families() -> BTreeSet<String> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut names = BTreeSet::new();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&crates).unwrap() {
        collect_rs(&entry.unwrap().path().join("src"), &mut files);
    }
    for file in files {
        let source = std::fs::read_to_string(&file).unwrap();
        let mut rest = source.as_str();
        while let Some(at) = next_registration(rest) {
            rest = &rest[at..];
            let Some(open) = rest.find('"') else { break };
            let literal = &rest[open + 1..];
            let Some(close) = literal.find('"') else {
                break;
            };
            let name = &literal[..close];
            if name.starts_with("shale_") {
                names.insert(name.to_string());
            }
            rest = &literal[close..];
        }
    }
    names
}

/// Where the next registration in `source` starts (just after its opening parenthesis).
fn next_registration(source: &str) -> Option<usize> {
    let mut best: Option<usize> = None;
    let mut consider = |at: Option<usize>| {
        if let Some(at) = at {
            best = Some(best.map_or(at, |b| b.min(at)));
        }
    };
    consider(source.find("Opts::new(").map(|i| i + "Opts::new(".len()));
    let mut from = 0;
    while let Some(i) = source[from..].find("register_") {
        let start = from + i;
        let ident_end = source[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(source.len(), |e| start + e);
        if source[ident_end..].starts_with("!(") {
            consider(Some(ident_end + 2));
            break;
        }
        from = ident_end;
    }
    best
}

fn collect_rs(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The samples of `family` whose labels include every `(name, value)` of `labels`.
fn matching<'a>(samples: &'a [Sample], family: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| s.name == family)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

#[tokio::test]
async fn every_family_is_rendered_from_the_first_scrape() {
    let registered = registered_shale_families();
    // The scan found the families of every crate that registers some (a scan that finds
    // nothing would pass vacuously).
    for known in [
        "shale_ingest_docs_total",
        "shale_merges_pending",
        "shale_search_latency_seconds",
        "shale_splits",
        "shale_http_requests_total",
    ] {
        assert!(
            registered.contains(known),
            "{known} not found in {registered:?}"
        );
    }

    let node = TestNode::start().await;
    node.create_index(common::LOGS_INDEX).await;
    let text = node.metrics().await;
    let first = parse_exposition(&text);
    let rendered = rendered_families(&text);
    let http = [
        "shale_http_requests_total",
        "shale_http_request_duration_seconds",
    ];
    let missing: Vec<&String> = registered
        .iter()
        .filter(|name| !rendered.contains(*name) && !http.contains(&name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "not rendered on the first scrape: {missing:?}"
    );
    #[cfg(target_os = "linux")]
    for (process, least) in [
        ("process_resident_memory_bytes", 1.0),
        // Whole seconds: a fresh test process may not have used one yet.
        ("process_cpu_seconds_total", 0.0),
        ("process_open_fds", 1.0),
    ] {
        let value = matching(&first, process, &[])
            .first()
            .unwrap_or_else(|| panic!("{process} missing"))
            .value;
        assert!(value >= least, "{process} = {value}");
    }
    // The new index's per-index series exist before it has a split.
    for state in ["Staged", "Published", "MarkedForDeletion"] {
        let splits = matching(
            &first,
            "shale_splits",
            &[("index", "logs"), ("state", state)],
        );
        assert_eq!(splits.len(), 1, "shale_splits of logs/{state}");
        assert_eq!(splits[0].value, 0.0);
    }
    assert!(!matching(&first, "shale_scope_splits", &[("index", "logs")]).is_empty());

    // Every family, the HTTP ones included, once requests were answered (the scrape itself
    // was one).
    let (status, _) = node.get("/api/v1/indexes").await;
    assert_eq!(status, 200);
    let text = node.metrics().await;
    let after = parse_exposition(&text);
    let rendered = rendered_families(&text);
    let missing: Vec<&String> = registered
        .iter()
        .filter(|name| !rendered.contains(*name))
        .collect();
    assert!(missing.is_empty(), "not rendered: {missing:?}");
    let listed = matching(
        &after,
        "shale_http_requests_total",
        &[
            ("route", "/api/v1/indexes"),
            ("method", "GET"),
            ("status", "200"),
        ],
    );
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].value, 1.0);
    node.stop().await;
}

#[tokio::test]
async fn http_requests_are_counted_by_route_template_and_status() {
    let node = TestNode::start().await;
    node.create_index(common::LOGS_INDEX).await;
    node.ingest(
        "logs",
        &common::log_docs(0, 20, 1_700_000_000, "api"),
        "force",
    )
    .await;
    for _ in 0..3 {
        node.search("logs", json!({"query": "*"})).await;
    }
    let (status, _) = node.get("/api/v1/nope-index/search?query=x").await;
    assert_eq!(status, 404);
    let (status, _) = node.get("/no/such/route/12345").await;
    assert_eq!(status, 404);
    // The remote-write routes (outside the REST middleware) are counted too.
    let (status, _) = node.post("/prometheus/api/v1/write", "not snappy").await;
    assert!(status >= 400, "{status}");

    let samples = parse_exposition(&node.metrics().await);
    let requests = |labels: &[(&str, &str)]| -> f64 {
        matching(&samples, "shale_http_requests_total", labels)
            .iter()
            .map(|s| s.value)
            .sum()
    };
    let search = "/api/v1/{index_id}/search";
    assert_eq!(
        requests(&[("route", search), ("method", "POST"), ("status", "200")]),
        3.0
    );
    assert_eq!(
        requests(&[("route", search), ("method", "GET"), ("status", "404")]),
        1.0
    );
    assert_eq!(requests(&[("route", "unmatched"), ("status", "404")]), 1.0);
    assert_eq!(
        requests(&[("route", "/prometheus/api/v1/write"), ("method", "POST")]),
        1.0
    );
    assert_eq!(
        requests(&[("route", "/api/v1/{index_id}/ingest"), ("status", "200")]),
        1.0
    );
    // Never a raw path: bounded label values.
    for sample in matching(&samples, "shale_http_requests_total", &[]) {
        let route = &sample.labels["route"];
        assert!(
            !route.contains("nope-index") && !route.contains("12345"),
            "raw path as a label: {route}"
        );
    }
    // The latency histogram of the searches.
    let count = matching(
        &samples,
        "shale_http_request_duration_seconds_count",
        &[("route", search), ("method", "POST")],
    );
    assert_eq!(count.len(), 1);
    assert_eq!(count[0].value, 3.0);

    // The split the forced commit published: its level, bytes and documents.
    let published = [("index", "logs"), ("state", "Published")];
    assert_eq!(matching(&samples, "shale_splits", &published)[0].value, 1.0);
    assert_eq!(
        matching(&samples, "shale_split_docs", &published)[0].value,
        20.0
    );
    assert!(matching(&samples, "shale_split_bytes", &published)[0].value > 0.0);
    let level0 = matching(
        &samples,
        "shale_splits_by_level",
        &[("index", "logs"), ("level", "0")],
    );
    assert_eq!(level0[0].value, 1.0);
    node.stop().await;
}
