//! The web UI in a real browser (headless Chromium through chromedriver) against a node
//! loaded with a known data set: every page loads without a console error and shows the
//! numbers the API gives (documents, splits, levels); the split map draws one mark per
//! published split and follows a compaction live (overlapping level-0 splits become
//! non-overlapping level-1 ones without a reload), marks the splits a delete task has yet to
//! purge and those of a departed node; a search typed into the page finds the right hits and
//! a bad one shows the API's words; a PromQL query draws its series; with an API token, the
//! page is behind a login. Screenshots of each page land in `target/ui-screenshots/` (and in
//! `$SHALE_UI_SCREENSHOTS` when set: `docs/ui` holds the README's).

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::TestNode;
use serde_json::{json, Value};
use shale_config::NodeConfig;
use shale_testkit::browser::Browser;

const WAIT: Duration = Duration::from_secs(60);

/// A closed 15-minute bucket (2023): its buckets are closed for the node's clock at once.
const BUCKET0: i64 = 1_699_999_200;

const WEB_INDEX: &str = "
index_id: web
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: service, type: text, tokenizer: raw, fast: true}
    - {name: host, type: text, tokenizer: raw, fast: true}
    - {name: status, type: u64, fast: true}
    - {name: message, type: text}
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 1
  merge_policy:
    type: locality
    sort_fields: [service, host]
    time_bucket: 15m
    target_split_num_docs: 150
    max_merge_ops: 4
compaction:
  enabled: false
search_settings:
  default_search_fields: [message]
";

const LEGACY_INDEX: &str = "
index_id: legacy
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: message, type: text}
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 1
compaction:
  enabled: false
search_settings:
  default_search_fields: [message]
";

const SERVICES: [&str; 6] = ["api", "auth", "billing", "cart", "db", "search"];
const BATCHES: usize = 4;
const BATCH_DOCS: usize = 300;

/// One test document: `i` decides everything, so the test counts independently.
fn doc(i: usize) -> Value {
    let service = SERVICES[i % SERVICES.len()];
    let word = if i.is_multiple_of(7) { "timeout" } else { "ok" };
    json!({
        // Two buckets, every batch in both.
        "ts": BUCKET0 + (i * 7 % 1800) as i64,
        "service": service,
        "host": format!("{service}-{}", i % 3),
        "status": if i.is_multiple_of(11) { 500 } else { 200 },
        "message": format!("{word} request {i}"),
    })
}

fn screenshot_dirs() -> Vec<PathBuf> {
    let mut dirs =
        vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/ui-screenshots")];
    if let Some(dir) = std::env::var_os("SHALE_UI_SCREENSHOTS") {
        dirs.push(PathBuf::from(dir));
    }
    dirs
}

/// Keeps a screenshot of the window as `name.png`.
async fn keep_screenshot(browser: &Browser, name: &str) {
    let png = browser.screenshot().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    for dir in screenshot_dirs() {
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        std::fs::write(dir.join(format!("{name}.png")), &png).expect("write screenshot");
    }
}

/// Fails on any console error the page logged since the last check.
async fn assert_no_console_errors(browser: &Browser, page: &str) {
    let errors: Vec<_> = browser
        .console()
        .await
        .expect("browser log")
        .into_iter()
        .filter(|entry| entry.level == "SEVERE")
        .map(|entry| entry.message)
        .collect();
    assert!(errors.is_empty(), "console errors on {page}: {errors:#?}");
}

/// Opens `#/route` and waits until `ready` (a JS expression) holds.
async fn open(browser: &Browser, node: &TestNode, route: &str, ready: &str) -> Value {
    browser
        .goto(&node.url(&format!("/ui#/{route}")))
        .await
        .expect("navigate");
    browser
        .wait_for(&format!("return {ready};"), WAIT)
        .await
        .unwrap_or_else(|err| panic!("page {route}: {err}"))
}

/// Types `text` into the input `[data-test=input]`, clicks `[data-test=button]` and waits
/// until `done` (a JS expression) holds.
async fn type_and_run(browser: &Browser, (input, text): (&str, &str), button: &str, done: &str) {
    let field = browser.find(&format!("[data-test={input}]")).await.unwrap();
    field.send_keys(text).await.unwrap();
    browser
        .find(&format!("[data-test={button}]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait_for(&format!("return {done};"), WAIT)
        .await
        .unwrap_or_else(|err| panic!("after `{text}`: {err}"));
}

async fn text_of(browser: &Browser, selector: &str) -> String {
    browser
        .find(selector)
        .await
        .unwrap_or_else(|err| panic!("{selector}: {err}"))
        .text()
        .await
        .expect("text")
}

/// The value of a card (`[data-test=name] .value`).
async fn card(browser: &Browser, name: &str) -> String {
    text_of(browser, &format!("[data-test={name}] .value")).await
}

async fn published_splits(node: &TestNode, index: &str) -> Vec<Value> {
    let (status, body) = node
        .get(&format!(
            "/api/v1/indexes/{index}/splits?split_states=Published"
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    body["splits"].as_array().cloned().unwrap_or_default()
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The split map's marks: `[split id, level, x, y, height, classes]`.
const MARKS: &str = "return [...document.querySelectorAll('svg.splitmap rect.split')].map(r => \
    [r.dataset.splitId, Number(r.dataset.level), Number(r.getAttribute('x')), \
    Number(r.getAttribute('y')), Number(r.getAttribute('height')), r.getAttribute('class')]);";

/// Moves the only split of `index` to a node that is not in the cluster, as a node that
/// left for good leaves its splits (the same documents, republished under its name).
async fn orphan_the_split_of(node: &TestNode, index: &str) {
    let meta = node.node.metastore.index_metadata(index).await.unwrap();
    let uid = meta.index_uid.clone();
    let old = node
        .node
        .metastore
        .list_splits(
            shale_metastore::ListSplitsQuery::for_index(uid.clone())
                .with_states(&[shale_types::SplitState::Published]),
        )
        .await
        .unwrap()
        .remove(0)
        .split_metadata;
    let storage = node.node.index_storage(&meta).unwrap();
    let bytes = storage.get_bytes(&old.object_key()).await.unwrap();
    let mut moved = old.clone();
    moved.split_id = shale_types::new_ulid();
    moved.node_id = "departed-node".to_string();
    storage
        .put_bytes(&moved.object_key(), bytes.to_vec())
        .await
        .unwrap();
    node.node
        .metastore
        .stage_splits(&uid, vec![moved.clone()])
        .await
        .unwrap();
    node.node
        .metastore
        .publish_splits(
            &uid,
            std::slice::from_ref(&moved.split_id),
            std::slice::from_ref(&old.split_id),
            None,
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_shows_the_nodes_data_in_a_real_browser() {
    let Some(browser) = Browser::start(1400, 1000).await else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    config.compaction.planner_interval_secs = 1;
    let node = TestNode::start_with(config).await;

    // The data set: 4 batches into `web` (each cuts one level-0 split per bucket), one into
    // `legacy`, and two metric series over the last hour.
    node.create_index(WEB_INDEX).await;
    node.create_index(LEGACY_INDEX).await;
    let total = BATCHES * BATCH_DOCS;
    for batch in 0..BATCHES {
        let ndjson: String = (batch * BATCH_DOCS..(batch + 1) * BATCH_DOCS)
            .map(|i| format!("{}\n", doc(i)))
            .collect();
        let answer = node.ingest("web", &ndjson, "force").await;
        assert_eq!(answer["num_ingested_docs"], BATCH_DOCS, "{answer}");
    }
    let legacy: String = (0..50)
        .map(|i| {
            format!(
                "{}\n",
                json!({"ts": BUCKET0 + i, "message": format!("old {i}")})
            )
        })
        .collect();
    node.ingest("legacy", &legacy, "force").await;
    orphan_the_split_of(&node, "legacy").await;
    let now_ns = shale_types::now_unix_secs() as u128 * 1_000_000_000;
    let points = |path: &str, base: f64| -> Vec<Value> {
        (0..30u128)
            .map(|k| {
                json!({
                    "timeUnixNano": (now_ns - (30 - k) * 60_000_000_000).to_string(),
                    "asDouble": base + (k % 5) as f64,
                    "attributes": [{"key": "path", "value": {"stringValue": path}}],
                })
            })
            .collect()
    };
    let otlp = json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "shop"}}]},
        "scopeMetrics": [{"metrics": [{"name": "ui_test_inflight",
            "gauge": {"dataPoints": points("/a", 10.0).into_iter().chain(points("/b", 20.0)).collect::<Vec<_>>()}}]}],
    }]});
    let answer = node
        .client
        .post(node.url("/api/v1/otlp/v1/metrics?commit=force"))
        .header("content-type", "application/json")
        .body(otlp.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());

    // A delete task before any merge: every split of `web` has it pending.
    let (status, body) = node
        .post(
            "/api/v1/web/delete-tasks",
            json!({"query": "service:billing"}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let deleted = (0..total)
        .filter(|i| SERVICES[i % SERVICES.len()] == "billing")
        .count();
    let expected_docs = total as u64; // until a merge applies the delete
    let level0 = published_splits(&node, "web").await;
    assert_eq!(level0.len(), 2 * BATCHES, "one split per batch and bucket");

    // Cluster: one live node, the leader.
    open(
        &browser,
        &node,
        "cluster",
        "document.querySelectorAll('[data-test=node-row]').length > 0",
    )
    .await;
    let row = text_of(&browser, "[data-test=node-row]").await;
    assert!(row.contains("test-node") && row.contains("leader"), "{row}");
    assert_eq!(card(&browser, "live-nodes").await, "1");
    assert_no_console_errors(&browser, "cluster").await;
    keep_screenshot(&browser, "cluster").await;

    // Indexes: documents and splits as the API counts them.
    open(
        &browser,
        &node,
        "indexes",
        "document.querySelector('[data-test=index-row][data-index=web]')",
    )
    .await;
    let docs = text_of(&browser, "[data-index=web] [data-test=index-docs]").await;
    assert_eq!(docs, thousands(expected_docs));
    let splits = text_of(&browser, "[data-index=web] [data-test=index-splits]").await;
    assert_eq!(splits, level0.len().to_string());
    assert_no_console_errors(&browser, "indexes").await;
    keep_screenshot(&browser, "indexes").await;

    // Split map before compaction: one mark per split, all level 0, all with the delete
    // pending.
    open(
        &browser,
        &node,
        "splits/web",
        &format!(
            "document.querySelectorAll('svg.splitmap rect.split').length == {}",
            level0.len()
        ),
    )
    .await;
    let marks = browser.execute(MARKS, vec![]).await.unwrap();
    let marks = marks.as_array().unwrap();
    let mut drawn: Vec<&str> = marks.iter().map(|m| m[0].as_str().unwrap()).collect();
    let mut listed: Vec<&str> = level0
        .iter()
        .map(|s| s["split_id"].as_str().unwrap())
        .collect();
    drawn.sort();
    listed.sort();
    assert_eq!(drawn, listed, "one mark per published split");
    assert!(marks.iter().all(|m| m[1] == 0), "{marks:?}");
    assert_eq!(
        card(&browser, "map-delete-pending").await,
        level0.len().to_string()
    );
    assert_no_console_errors(&browser, "split map").await;
    keep_screenshot(&browser, "split-map-level0").await;

    // A manual compaction while the page stays open: the map follows, without a reload.
    let (status, body) = node.post("/api/v1/indexes/web/compact", "").await;
    assert_eq!(status, 200, "{body}");
    let compaction_id = body["compaction_id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (_, body) = node
            .get(&format!("/api/v1/indexes/web/compactions/{compaction_id}"))
            .await;
        match body["state"].as_str() {
            Some("completed") => break,
            Some("failed") => panic!("the compaction failed: {body}"),
            _ => {}
        }
        assert!(
            std::time::Instant::now() < deadline,
            "compaction never ended: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let level1 = published_splits(&node, "web").await;
    assert!(level1.iter().all(|s| s["key_level"] == 1), "{level1:?}");
    browser
        .wait_for(
            &format!(
                "const r = [...document.querySelectorAll('svg.splitmap rect.split')]; \
                 return r.length == {} && r.every(x => x.dataset.level == '1');",
                level1.len()
            ),
            WAIT,
        )
        .await
        .expect("the split map shows the level-1 splits");
    let marks = browser.execute(MARKS, vec![]).await.unwrap();
    let marks = marks.as_array().unwrap();
    let mut drawn: Vec<&str> = marks.iter().map(|m| m[0].as_str().unwrap()).collect();
    let mut listed: Vec<&str> = level1
        .iter()
        .map(|s| s["split_id"].as_str().unwrap())
        .collect();
    drawn.sort();
    listed.sort();
    assert_eq!(
        drawn, listed,
        "one mark per published split, after the merges"
    );
    // Level-1 splits of one bucket (one column) do not overlap on the key axis.
    let mut columns: std::collections::BTreeMap<i64, Vec<(f64, f64)>> = Default::default();
    for mark in marks {
        columns
            .entry(mark[2].as_f64().unwrap().round() as i64)
            .or_default()
            .push((mark[3].as_f64().unwrap(), mark[4].as_f64().unwrap()));
    }
    assert_eq!(columns.len(), 2, "two buckets: {columns:?}");
    for column in columns.values_mut() {
        column.sort_by(|a, b| a.0.total_cmp(&b.0));
        for pair in column.windows(2) {
            assert!(
                pair[0].0 + pair[0].1 <= pair[1].0 + 0.5,
                "level-1 key ranges overlap: {column:?}"
            );
        }
    }
    assert_eq!(card(&browser, "map-splits").await, level1.len().to_string());
    assert_eq!(card(&browser, "map-delete-pending").await, "0");
    assert_eq!(card(&browser, "map-orphans").await, "0");
    assert_no_console_errors(&browser, "split map after compaction").await;
    keep_screenshot(&browser, "split-map").await;

    // A departed node's split is drawn as an orphan.
    open(
        &browser,
        &node,
        "splits/legacy",
        "document.querySelectorAll('svg.splitmap rect.split').length == 1",
    )
    .await;
    assert_eq!(card(&browser, "map-orphans").await, "1");
    let class = browser
        .execute(
            "return document.querySelector('svg.splitmap rect.split').getAttribute('class');",
            vec![],
        )
        .await
        .unwrap();
    assert!(class.as_str().unwrap().contains("orphan"), "{class}");
    assert_no_console_errors(&browser, "legacy split map").await;

    // Compaction: the manual compaction, the merges it ran, the delete applied.
    let (_, status_body) = node
        .get("/api/v1/indexes/web/compaction?recent_merges=500")
        .await;
    let succeeded = status_body["recent_merges"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["state"] == "Succeeded")
        .count();
    assert!(succeeded > 0, "{status_body}");
    open(
        &browser,
        &node,
        "compaction/web",
        "document.querySelector('[data-test=compaction-row]')",
    )
    .await;
    assert_eq!(
        card(&browser, "compaction-splits").await,
        level1.len().to_string()
    );
    let finished = card(&browser, "compaction-finished").await;
    assert!(
        finished.starts_with(&format!("{succeeded} ok")),
        "{finished} vs {succeeded} succeeded"
    );
    let row = text_of(&browser, "[data-test=compaction-row]").await;
    assert!(
        row.contains(&compaction_id) && row.contains("completed"),
        "{row}"
    );
    let task = text_of(&browser, "[data-test=delete-task-row]").await;
    assert!(
        task.contains("service:billing") && task.contains("applied"),
        "{task}"
    );
    assert_no_console_errors(&browser, "compaction").await;
    keep_screenshot(&browser, "compaction").await;

    // Search, typed into the page: the right number of hits, each expandable.
    let expected_hits = (0..total)
        .filter(|i| i.is_multiple_of(7) && SERVICES[i % SERVICES.len()] != "billing")
        .count();
    assert!(deleted > 0 && expected_hits > 50);
    open(
        &browser,
        &node,
        "search/web",
        "document.querySelector('[data-test=query]')",
    )
    .await;
    type_and_run(
        &browser,
        ("query", "timeout"),
        "search-button",
        "document.querySelector('[data-test=num-hits]') && \
         document.querySelector('[data-test=histogram] canvas')",
    )
    .await;
    assert_eq!(
        text_of(&browser, "[data-test=num-hits]").await,
        thousands(expected_hits as u64)
    );
    let rows = browser
        .execute(
            "return document.querySelectorAll('[data-test=hit-row]').length;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(rows, 50, "the first 50 hits are listed");
    let first = browser.find("[data-test=hit-row]").await.unwrap();
    first.click().await.unwrap();
    let expanded = browser
        .wait_for(
            "const d = document.querySelector('tr.hit-doc:not([hidden]) pre'); \
             return d && d.textContent;",
            WAIT,
        )
        .await
        .unwrap();
    let hit: Value = serde_json::from_str(expanded.as_str().unwrap()).expect("a JSON document");
    assert!(
        hit["message"].as_str().unwrap().starts_with("timeout"),
        "{hit}"
    );
    assert_ne!(hit["service"], "billing", "deleted documents stay hidden");
    assert_no_console_errors(&browser, "search").await;
    keep_screenshot(&browser, "search").await;

    // A bad query: the API's own words.
    let (status, api_error) = node
        .post(
            "/api/v1/web/search",
            json!({"query": "status:[1 TO", "max_hits": 50}).to_string(),
        )
        .await;
    assert_eq!(status, 400);
    let query = browser.find("[data-test=query]").await.unwrap();
    query.clear().await.unwrap();
    query.send_keys("status:[1 TO\u{E007}").await.unwrap();
    browser
        .wait_for("return document.querySelector('[data-test=error]');", WAIT)
        .await
        .expect("an error box");
    assert_eq!(
        text_of(&browser, "[data-test=error]").await,
        api_error["message"].as_str().unwrap()
    );
    // A 400 the page asked for is logged by Chromium as a failed resource: not a page error.
    let _ = browser.console().await;

    // Metrics: a PromQL query drawn as two series.
    open(
        &browser,
        &node,
        "metrics",
        "document.querySelector('[data-test=promql]')",
    )
    .await;
    type_and_run(
        &browser,
        ("promql", "ui_test_inflight"),
        "prom-button",
        "document.querySelector('[data-test=num-series]') && \
         document.querySelector('[data-test=prom-chart] canvas')",
    )
    .await;
    assert_eq!(text_of(&browser, "[data-test=num-series]").await, "2");
    assert_no_console_errors(&browser, "metrics").await;
    keep_screenshot(&browser, "metrics").await;

    // A metrics index's split map: one mark per split, per bucket.
    let metric_splits = published_splits(&node, "otel-metrics-v0_9").await;
    assert!(!metric_splits.is_empty());
    open(
        &browser,
        &node,
        "splits/otel-metrics-v0_9",
        &format!(
            "document.querySelectorAll('svg.splitmap rect.split').length == {}",
            metric_splits.len()
        ),
    )
    .await;
    assert_eq!(
        card(&browser, "map-splits").await,
        metric_splits.len().to_string()
    );
    assert_no_console_errors(&browser, "metrics split map").await;
    keep_screenshot(&browser, "split-map-metrics").await;

    // One index: its documents (the delete applied), config and source.
    open(
        &browser,
        &node,
        "index/web",
        "document.querySelector('[data-test=index-config]')",
    )
    .await;
    assert_eq!(
        card(&browser, "index-docs").await,
        thousands((total - deleted) as u64)
    );
    let config = text_of(&browser, "[data-test=index-config]").await;
    assert!(config.contains("\"locality\""), "{config}");
    let source = text_of(&browser, "[data-test=source-row]").await;
    assert!(source.contains("_ingest-api-source"), "{source}");
    assert_no_console_errors(&browser, "index").await;
    keep_screenshot(&browser, "index").await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_api_token_the_page_is_behind_a_login() {
    let tmp = tempfile::tempdir().unwrap();
    let config = NodeConfig {
        api_token: Some("s3cr3t;token".to_string()),
        ..common::config_in(tmp.path())
    };
    let node = TestNode::start_with(config).await;
    // Over HTTP: the page redirects to the login without the token, and opens with it (as a
    // header or as the login's cookie); the login page and the assets are public; the API
    // does not take the cookie.
    let no_redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let get = |path: &str, header: Option<(&str, &str)>| {
        let mut request = no_redirect.get(node.url(path));
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        request.send()
    };
    let page = get("/ui", None).await.unwrap();
    assert_eq!(page.status(), 303);
    assert_eq!(page.headers()["location"], "/ui/login");
    let root = get("/", None).await.unwrap();
    assert_eq!(root.headers()["location"], "/ui");
    let page = get("/ui", Some(("authorization", "Bearer s3cr3t;token")))
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let cookie = "shale_api_token=s3cr3t%3Btoken";
    let page = get("/ui", Some(("cookie", cookie))).await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("/ui/assets/app.js"));
    let wrong = get("/ui", Some(("cookie", "shale_api_token=nope")))
        .await
        .unwrap();
    assert_eq!(wrong.status(), 303);
    assert_eq!(get("/ui/login", None).await.unwrap().status(), 200);
    let asset = get("/ui/assets/app.js", None).await.unwrap();
    assert_eq!(asset.status(), 200);
    assert!(asset.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));
    assert_eq!(
        get("/ui/assets/nothing.js", None).await.unwrap().status(),
        404
    );
    let api = get("/api/v1/indexes", Some(("cookie", cookie)))
        .await
        .unwrap();
    assert_eq!(api.status(), 401, "the API never takes the cookie");

    // In the browser: a wrong token is refused in the API's words, the right one opens the
    // cluster page.
    let Some(browser) = Browser::start(1200, 800).await else {
        node.stop().await;
        return;
    };
    browser.goto(&node.url("/ui")).await.unwrap();
    assert!(browser.current_url().await.unwrap().ends_with("/ui/login"));
    let token = browser.find("#token").await.unwrap();
    token.send_keys("wrong\u{E007}").await.unwrap();
    let refused = browser
        .wait_for(
            "const e = document.getElementById('login-error'); return !e.hidden && e.textContent;",
            WAIT,
        )
        .await
        .unwrap();
    assert!(refused.as_str().unwrap().contains("API token"), "{refused}");
    let _ = browser.console().await; // the refused call's 401
    token.clear().await.unwrap();
    token.send_keys("s3cr3t;token\u{E007}").await.unwrap();
    browser
        .wait_for(
            "return location.pathname == '/ui' && \
             document.querySelectorAll('[data-test=node-row]').length == 1;",
            WAIT,
        )
        .await
        .expect("the cluster page after the login");
    assert_no_console_errors(&browser, "cluster behind a token").await;
    keep_screenshot(&browser, "login-then-cluster").await;
    node.stop().await;
}

/// A page on another origin (served here on its own port) that sends a "simple" cross-site
/// request — `fetch(…, {mode: "no-cors"})` with a `text/plain` body, which a browser sends
/// without asking — to create a delete task `*` on a node without tokens: the node refuses it
/// and deletes nothing. The node's own pages carry `X-Frame-Options: DENY` and a Content
/// Security Policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_another_site_cannot_delete_documents() {
    let Some(browser) = Browser::start(800, 600).await else {
        return;
    };
    let node = TestNode::start().await;
    node.create_index(LEGACY_INDEX).await;
    node.ingest(
        "legacy",
        &format!("{}\n", json!({"ts": BUCKET0, "message": "keep me"})),
        "force",
    )
    .await;
    let target = node.url("/api/v1/legacy/delete-tasks");
    let page = format!(
        r#"<!doctype html><title>loading</title><script>
fetch({target:?}, {{method: "POST", mode: "no-cors",
  headers: {{"Content-Type": "text/plain"}}, body: JSON.stringify({{query: "*"}})}})
  .then(() => {{ document.title = "sent"; }})
  .catch((err) => {{ document.title = "failed " + err; }});
</script>"#
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other_site = format!(
        "http://localhost:{}/",
        listener.local_addr().unwrap().port()
    );
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let page = page.clone();
            async move { axum::response::Html(page) }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let refused_before = node
        .metric_value("shale_requests_refused_total{reason=\"cross_site\"}")
        .await;
    browser.goto(&other_site).await.expect("navigate");
    let title = browser
        .wait_for(
            "return document.title !== 'loading' && document.title;",
            WAIT,
        )
        .await
        .expect("the page's request settles");
    assert_eq!(
        title, "sent",
        "the browser sent it (and could not read the answer)"
    );
    let refused = node
        .metric_value("shale_requests_refused_total{reason=\"cross_site\"}")
        .await;
    assert_eq!(refused, refused_before + 1, "the node saw and refused it");
    let (status, tasks) = node.get("/api/v1/legacy/delete-tasks").await;
    assert_eq!(status, 200);
    assert_eq!(tasks, json!([]), "no delete task was created");
    assert_eq!(node.count("legacy", "*").await, 1);
    // The node's pages may not be framed, and say where their scripts come from.
    let response = node.client.get(node.url("/ui")).send().await.unwrap();
    assert_eq!(response.headers()["x-frame-options"], "DENY");
    let csp = response.headers()["content-security-policy"]
        .to_str()
        .unwrap();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    node.stop().await;
}
