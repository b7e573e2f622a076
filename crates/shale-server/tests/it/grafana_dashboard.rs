//! The Grafana dashboard shipped in `deploy/grafana/shale-dashboard.json`: a dashboard Grafana
//! imports (title, uid, panels placed on the grid, a Prometheus data source variable), whose
//! every query parses as PromQL and reads only metrics (and labels) that a live node's
//! `/metrics` exposes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use promql_parser::parser::{Expr, VectorSelector};
use promql_parser::util::{walk_expr, ExprVisitor};
use serde_json::{json, Value};

use crate::common::{self, TestNode};
use crate::metrics_endpoint::parse_exposition;

fn dashboard() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/shale-dashboard.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// `expr` with Grafana's variables given values PromQL accepts: intervals become `5m`, the
/// others (label values in matchers) `.*`.
fn substitute_variables(expr: &str) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').expect("unclosed ${");
            (&braced[..end], end + 2)
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        assert!(!name.is_empty(), "a lone $ in {expr}");
        let name = name.split(':').next().unwrap_or(name);
        out.push_str(if name.starts_with("__") { "5m" } else { ".*" });
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// The selectors of an expression: metric name → label names its matchers use.
#[derive(Default)]
struct Selectors(BTreeMap<String, BTreeSet<String>>);

impl Selectors {
    fn add(&mut self, selector: &VectorSelector) {
        let name = selector.name.clone().or_else(|| {
            selector
                .matchers
                .matchers
                .iter()
                .find(|m| m.name == "__name__")
                .map(|m| m.value.clone())
        });
        let Some(name) = name else {
            panic!("a selector without a metric name: {selector}");
        };
        let labels = self.0.entry(name).or_default();
        for matcher in &selector.matchers.matchers {
            if matcher.name != "__name__" {
                labels.insert(matcher.name.clone());
            }
        }
    }
}

impl ExprVisitor for Selectors {
    type Error = ();

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, ()> {
        match expr {
            Expr::VectorSelector(selector) => self.add(selector),
            Expr::MatrixSelector(matrix) => self.add(&matrix.vs),
            _ => {}
        }
        Ok(true)
    }
}

#[test]
fn the_dashboard_is_a_grafana_dashboard() {
    let dashboard = dashboard();
    assert!(!dashboard["title"].as_str().unwrap_or_default().is_empty());
    assert!(!dashboard["uid"].as_str().unwrap_or_default().is_empty());
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating");
    let datasource = variables
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a data source variable");
    assert_eq!(datasource["query"], "prometheus");
    let datasource_ref = format!("${{{}}}", datasource["name"].as_str().unwrap());

    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut rows = Vec::new();
    let mut targets = 0;
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "a panel without a title: {panel}");
        assert!(
            ids.insert(panel["id"].as_u64().expect("panel id")),
            "{title}: id reused"
        );
        let grid = &panel["gridPos"];
        let [h, w, x, y] = ["h", "w", "x", "y"].map(|k| grid[k].as_u64());
        assert!(h.is_some() && y.is_some(), "{title}: gridPos {grid}");
        assert!(
            x.zip(w).is_some_and(|(x, w)| w > 0 && x + w <= 24),
            "{title}: gridPos {grid}"
        );
        if panel["type"] == "row" {
            rows.push(title.to_string());
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"],
            datasource_ref.as_str(),
            "{title}"
        );
        let panel_targets = panel["targets"].as_array().expect("targets");
        assert!(!panel_targets.is_empty(), "{title}: no query");
        let ref_ids: BTreeSet<&str> = panel_targets
            .iter()
            .map(|t| t["refId"].as_str().expect("refId"))
            .collect();
        assert_eq!(ref_ids.len(), panel_targets.len(), "{title}: refIds");
        for target in panel_targets {
            assert!(
                target["expr"].as_str().is_some_and(|e| !e.is_empty()),
                "{title}"
            );
            assert_eq!(
                target["datasource"]["uid"],
                datasource_ref.as_str(),
                "{title}"
            );
            targets += 1;
        }
    }
    for row in [
        "Ingest",
        "Search",
        "Compaction",
        "Storage",
        "HTTP",
        "Process",
    ] {
        assert!(rows.iter().any(|r| r == row), "no {row} row in {rows:?}");
    }
    assert!(targets >= 20, "{targets} queries");
}

/// Every query parses, and each metric it reads (with each label it matches on, but those
/// Prometheus adds at scrape time) is in a node's `/metrics` once it ingested and searched.
#[tokio::test]
async fn every_dashboard_query_reads_metrics_a_node_exposes() {
    let dashboard = dashboard();
    let mut selectors = Selectors::default();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            queries.push((
                panel["title"].as_str().unwrap_or_default().to_string(),
                expr,
            ));
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        // `label_values(metric, label)`: its metric is a selector too.
        if let Some(inner) = variable["definition"]
            .as_str()
            .and_then(|d| d.strip_prefix("label_values("))
            .and_then(|d| d.strip_suffix(')'))
        {
            let (metric, label) = inner.rsplit_once(',').expect("label_values(metric, label)");
            queries.push((format!("variable {}", variable["name"]), metric.trim()));
            selectors
                .0
                .entry(metric.trim().to_string())
                .or_default()
                .insert(label.trim().to_string());
        }
    }
    for (title, expr) in &queries {
        let parsed = promql_parser::parser::parse(&substitute_variables(expr))
            .unwrap_or_else(|err| panic!("{title}: `{expr}` does not parse: {err}"));
        walk_expr(&mut selectors, &parsed).unwrap();
    }
    assert!(selectors.0.len() >= 20, "{:?}", selectors.0.keys());

    // A node that ingested and searched, so that histograms and per-route series exist.
    let node = TestNode::start().await;
    node.create_index(common::LOGS_INDEX).await;
    node.ingest(
        "logs",
        &common::log_docs(0, 50, 1_700_000_000, "api"),
        "force",
    )
    .await;
    node.search("logs", json!({"query": "level:ERROR"})).await;
    let (status, _) = node.get("/api/v1/_elastic/logs/_search?q=*").await;
    assert_eq!(status, 200);
    let samples = parse_exposition(&node.metrics().await);
    let mut exposed: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for sample in &samples {
        exposed
            .entry(sample.name.as_str())
            .or_default()
            .extend(sample.labels.keys().map(String::as_str));
    }
    // Labels the Prometheus server attaches to every scraped series.
    let scrape_labels = ["instance", "job"];
    for (metric, labels) in &selectors.0 {
        let Some(known) = exposed.get(metric.as_str()) else {
            panic!("the dashboard reads `{metric}`, which /metrics does not expose");
        };
        for label in labels {
            assert!(
                scrape_labels.contains(&label.as_str()) || known.contains(label.as_str()),
                "the dashboard matches `{metric}` on `{label}`, which it does not have ({known:?})"
            );
        }
    }
    node.stop().await;
}
