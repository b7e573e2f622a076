//! Index updates can neither resurrect nor hide documents: a delete task keeps the meaning
//! it had when it was created, a split's key range and tags are read only as the mapping
//! that wrote them meant them, and documents accepted before an update are indexed with the
//! mapping they were validated with.

use crate::common;

use std::time::{Duration, Instant};

use common::TestNode;
use serde_json::{json, Value};

const T0: i64 = 1_700_000_000;

const NOTES: &str = "
index_id: notes
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: title, type: text}
    - {name: message, type: text}
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 1
search_settings:
  default_search_fields: [message]
";

async fn put_index(node: &TestNode, index: &str, yaml: &str) -> Value {
    let (status, body) = node
        .put(&format!("/api/v1/indexes/{index}"), yaml.to_string())
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn wait_compaction(node: &TestNode, index: &str) {
    let (status, resp) = node
        .post(&format!("/api/v1/indexes/{index}/compact"), "{}")
        .await;
    assert_eq!(status, 200, "{resp}");
    let id = resp["compaction_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, resp) = node
            .get(&format!("/api/v1/indexes/{index}/compactions/{id}"))
            .await;
        match resp["state"].as_str() {
            Some("completed") => return,
            Some("failed") => panic!("compaction failed: {resp}"),
            _ => {}
        }
        assert!(Instant::now() < deadline, "compaction stuck: {resp}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn num_docs(node: &TestNode, index: &str) -> u64 {
    let (_, resp) = node
        .get(&format!(
            "/api/v1/indexes/{index}/splits?split_states=Published"
        ))
        .await;
    resp["splits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["num_docs"].as_u64().unwrap())
        .sum()
}

/// The reproduced defect: a delete task without `search_field`, then new default search
/// fields, then a manual compaction brought the deleted documents back for good.
#[tokio::test]
async fn a_delete_task_keeps_its_meaning_when_the_default_search_fields_change() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    config.compaction.planner_interval_secs = 1;
    let node = TestNode::start_with(config).await;
    node.create_index(NOTES).await;
    for batch in 0..3 {
        let docs: String = (0..100)
            .map(|i| {
                let n = batch * 100 + i;
                let word = if n % 5 == 0 { "secret" } else { "public" };
                format!(
                    "{}\n",
                    json!({"ts": T0 + n, "title": format!("note {n}"), "message": format!("a {word} note")})
                )
            })
            .collect();
        node.ingest("notes", &docs, "force").await;
    }
    assert_eq!(node.count("notes", "message:secret").await, 60);
    let (status, task) = node
        .post(
            "/api/v1/notes/delete-tasks",
            json!({"query": "secret"}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{task}");
    assert_eq!(node.count("notes", "message:secret").await, 0);

    put_index(
        &node,
        "notes",
        &NOTES.replace(
            "default_search_fields: [message]",
            "default_search_fields: [title]",
        ),
    )
    .await;
    // Still deleted at search time, before any compaction.
    assert_eq!(node.count("notes", "message:secret").await, 0);
    wait_compaction(&node, "notes").await;
    assert_eq!(node.count("notes", "message:secret").await, 0);
    assert_eq!(node.count("notes", "message:public").await, 240);
    assert_eq!(
        num_docs(&node, "notes").await,
        240,
        "purged, not resurrected"
    );
    // The task's listing still says what it was asked.
    let (_, tasks) = node.get("/api/v1/notes/delete-tasks").await;
    assert_eq!(tasks[0]["delete_query"]["query"], "secret");
    // A new task uses the new defaults: `note` is in every title.
    let (status, _) = node
        .post(
            "/api/v1/notes/delete-tasks",
            json!({"query": "\"note 7\""}).to_string(),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(node.count("notes", "*").await, 239);
}

const SORTED: &str = "
index_id: sorted
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: service, type: text, tokenizer: raw, fast: true}
    - {name: host, type: text, tokenizer: raw, fast: true}
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 1
  merge_policy:
    type: locality
    sort_fields: [service]
    time_bucket: 15m
";

fn hosts_docs(start: i64, n: i64, web_every: i64) -> String {
    (start..start + n)
        .map(|i| {
            let host = if i % web_every != 0 { "web" } else { "db" };
            format!(
                "{}\n",
                json!({"ts": T0 + i, "service": format!("svc-{}", i % 4), "host": host})
            )
        })
        .collect()
}

/// The reproduced defect: after `sort_fields` changed, old splits' key ranges were read as if
/// encoded with the new fields and pruned away.
#[tokio::test]
async fn changing_the_sort_fields_never_hides_documents() {
    let tmp = tempfile::tempdir().unwrap();
    let config = common::config_in(tmp.path());
    let node = TestNode::start_with(config.clone()).await;
    node.create_index(SORTED).await;
    let uid0 = node.get("/api/v1/indexes/sorted").await.1["index_config"]["doc_mapping"]
        ["doc_mapping_uid"]
        .clone();
    // 90 documents, 60 on host web.
    node.ingest("sorted", &hosts_docs(0, 90, 3), "force").await;
    assert_eq!(node.count("sorted", "host:web").await, 60);
    let updated = put_index(
        &node,
        "sorted",
        &SORTED.replace("sort_fields: [service]", "sort_fields: [host]"),
    )
    .await;
    assert_ne!(
        updated["index_config"]["doc_mapping"]["doc_mapping_uid"], uid0,
        "new sort fields are a new layout"
    );
    // 30 more, 20 on host web.
    node.ingest("sorted", &hosts_docs(90, 30, 3), "force").await;
    assert_eq!(node.count("sorted", "host:web").await, 80);
    assert_eq!(node.count("sorted", "host:db").await, 40);
    assert_eq!(node.count("sorted", "service:svc-1").await, 30);
    let (_, splits) = node
        .get("/api/v1/indexes/sorted/splits?split_states=Published")
        .await;
    let recorded: Vec<Value> = splits["splits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sort_fields"].clone())
        .collect();
    assert!(recorded.contains(&json!(["service"])), "{recorded:?}");
    assert!(recorded.contains(&json!(["host"])), "{recorded:?}");

    let dir = node.stop().await;
    let node = TestNode::start_with(config).await;
    assert_eq!(node.count("sorted", "host:web").await, 80);
    assert_eq!(node.count("sorted", "host:db").await, 40);
    drop(dir);
}

/// Tags speak only for the tag fields of the mapping that wrote a split: a field that became
/// a tag field later must not prune the older splits away.
#[tokio::test]
async fn a_new_tag_field_never_hides_older_splits() {
    let node = TestNode::start().await;
    node.create_index(NOTES).await;
    node.ingest(
        "notes",
        &format!(
            "{}\n",
            json!({"ts": T0, "title": "alpha", "message": "first"})
        ),
        "force",
    )
    .await;
    let tagged = NOTES
        .replace(
            "    - {name: title, type: text}",
            "    - {name: title, type: text, tokenizer: raw}",
        )
        .replace(
            "  timestamp_field: ts",
            "  timestamp_field: ts\n  tag_fields: [title]",
        );
    put_index(&node, "notes", &tagged).await;
    node.ingest(
        "notes",
        &format!(
            "{}\n",
            json!({"ts": T0 + 1, "title": "beta", "message": "second"})
        ),
        "force",
    )
    .await;
    assert_eq!(node.count("notes", "title:alpha").await, 1);
    assert_eq!(node.count("notes", "title:beta").await, 1);
}

/// Documents acknowledged (`commit=auto`) before an update that makes them invalid are
/// indexed with the mapping they were validated with, not dropped.
#[tokio::test]
async fn documents_accepted_before_a_mapping_update_are_indexed_as_accepted() {
    let node = TestNode::start().await;
    let codes = "
index_id: codes
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: code, type: text, tokenizer: raw}
  timestamp_field: ts
indexing_settings:
  commit_timeout_secs: 60
";
    node.create_index(codes).await;
    let old: String = (0..20)
        .map(|i| format!("{}\n", json!({"ts": T0 + i, "code": "abc"})))
        .collect();
    let resp = node.ingest("codes", &old, "auto").await;
    assert_eq!(resp["num_docs_for_processing"], 20, "{resp}");
    put_index(
        &node,
        "codes",
        &codes.replace(
            "{name: code, type: text, tokenizer: raw}",
            "{name: code, type: u64, fast: true}",
        ),
    )
    .await;
    let new: String = (20..25)
        .map(|i| format!("{}\n", json!({"ts": T0 + i, "code": 7})))
        .collect();
    node.ingest("codes", &new, "force").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.count("codes", "*").await != 25 {
        assert!(
            Instant::now() < deadline,
            "documents acknowledged before the update were lost: {}",
            node.count("codes", "*").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // In splits of the mapping each document was accepted under.
    let (_, splits) = node
        .get("/api/v1/indexes/codes/splits?split_states=Published")
        .await;
    let mut by_uid = std::collections::BTreeMap::<String, u64>::new();
    for split in splits["splits"].as_array().unwrap() {
        *by_uid
            .entry(split["doc_mapping_uid"].as_str().unwrap().to_string())
            .or_default() += split["num_docs"].as_u64().unwrap();
    }
    let mut counts: Vec<u64> = by_uid.values().copied().collect();
    counts.sort();
    assert_eq!(counts, [5, 20], "{by_uid:?}");
    assert_eq!(node.count("codes", "code:7").await, 5);
    let metrics = node.metrics().await;
    assert!(
        metrics.contains("shale_indexing_dead_letters_total 0"),
        "nothing dead-lettered"
    );
}

/// Splits of an older doc mapping merge with that mapping (before, the current one was used:
/// a merge of old splits failed on the schema and was retried forever), and a delete task
/// created after the update is applied to them with their own schema.
#[tokio::test]
async fn splits_of_an_older_mapping_merge_with_their_own_mapping() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_in(tmp.path());
    config.compaction.planner_interval_secs = 1;
    let node = TestNode::start_with(config).await;
    node.create_index(NOTES).await;
    for batch in 0..3 {
        let docs: String = (0..10)
            .map(|i| {
                let n = batch * 10 + i;
                format!(
                    "{}\n",
                    json!({"ts": T0 + n, "title": format!("t{n}"), "message": if n % 2 == 0 { "even" } else { "odd" }})
                )
            })
            .collect();
        node.ingest("notes", &docs, "force").await;
    }
    let remapped = NOTES.replace(
        "    - {name: message, type: text}",
        "    - {name: message, type: text}\n    - {name: level, type: text, tokenizer: raw}",
    );
    put_index(&node, "notes", &remapped).await;
    let (status, _) = node
        .post(
            "/api/v1/notes/delete-tasks",
            json!({"query": "odd"}).to_string(),
        )
        .await;
    assert_eq!(status, 200);
    wait_compaction(&node, "notes").await;
    let (_, splits) = node
        .get("/api/v1/indexes/notes/splits?split_states=Published")
        .await;
    let splits = splits["splits"].as_array().unwrap();
    assert_eq!(
        splits.len(),
        1,
        "the old mapping's splits merged: {splits:?}"
    );
    assert_eq!(splits[0]["num_docs"], 15, "and the delete task applied");
    assert_eq!(node.count("notes", "*").await, 15);
    assert_eq!(node.count("notes", "even").await, 15);
    let (_, merges) = node.get("/api/v1/indexes/notes/compaction").await;
    assert!(!merges.to_string().contains("different schema"), "{merges}");
}

/// The reproduced defect: `indexing_settings: {commit_timout_secs: 1}` answered 200 and was
/// stored beside the real key, on create and on update alike.
#[tokio::test]
async fn a_typo_in_an_index_config_is_refused_on_create_and_on_update() {
    let node = TestNode::start().await;
    for (typo, key) in [
        ("commit_timout_secs: 1", "commit_timout_secs"),
        ("resources: {heap_sise: 1GB}", "heap_sise"),
    ] {
        let yaml = NOTES.replace("commit_timeout_secs: 1", typo);
        let (status, body) = node.post("/api/v1/indexes", yaml).await;
        assert_eq!(status, 400, "{typo}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("unknown field `{key}`")),
            "{message}"
        );
        assert!(message.contains("line "), "{message}");
    }
    node.create_index(NOTES).await;
    let (status, body) = node
        .put(
            "/api/v1/indexes/notes",
            NOTES.replace("commit_timeout_secs: 1", "commit_timout_secs: 5"),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (_, index) = node.get("/api/v1/indexes/notes").await;
    assert_eq!(
        index["index_config"]["indexing_settings"]["commit_timeout_secs"], 1,
        "the stored config is unchanged: {index}"
    );
    assert!(index["index_config"]["indexing_settings"]
        .get("commit_timout_secs")
        .is_none());
    node.stop().await;
}
