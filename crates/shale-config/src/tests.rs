//! Index config parsing and validation tests.

use crate::*;

/// Quickwit's `hdfs-logs` tutorial config.
pub(crate) const HDFS_LOGS_YAML: &str = r#"
version: 0.7
index_id: hdfs-logs
doc_mapping:
  field_mappings:
    - name: timestamp
      type: datetime
      input_formats:
        - unix_timestamp
      output_format: unix_timestamp_secs
      fast_precision: seconds
      fast: true
    - name: tenant_id
      type: u64
    - name: severity_text
      type: text
      tokenizer: raw
      fast:
        normalizer: lowercase
    - name: body
      type: text
      tokenizer: default
      record: position
    - name: resource
      type: json
      tokenizer: raw
  tag_fields: [tenant_id]
  timestamp_field: timestamp
search_settings:
  default_search_fields: [severity_text, body]
indexing_settings:
  commit_timeout_secs: 10
retention:
  period: 90 days
  schedule: daily
"#;

/// A gharchive-like config (Quickwit's tutorial), as JSON, with json fields and a partition key.
pub(crate) const GHARCHIVE_JSON: &str = r#"{
  "version": "0.7",
  "index_id": "gh-archive",
  "doc_mapping": {
    "mode": "dynamic",
    "field_mappings": [
      {"name": "id", "type": "text", "tokenizer": "raw"},
      {"name": "type", "type": "text", "fast": true, "tokenizer": "raw"},
      {"name": "public", "type": "bool", "fast": true},
      {"name": "payload", "type": "json", "tokenizer": "default"},
      {"name": "org", "type": "json", "tokenizer": "default"},
      {"name": "repo", "type": "json", "tokenizer": "default"},
      {"name": "actor", "type": "json", "tokenizer": "default"},
      {"name": "other", "type": "json", "tokenizer": "default"},
      {"name": "created_at", "type": "datetime", "fast": true,
       "input_formats": ["rfc3339"], "fast_precision": "seconds"}
    ],
    "timestamp_field": "created_at",
    "tag_fields": ["type"],
    "partition_key": "hash_mod((type, repo.name), 50)",
    "store_source": true
  },
  "indexing_settings": {
    "commit_timeout_secs": 10,
    "merge_policy": {"type": "stable_log", "merge_factor": 10, "max_merge_factor": 12},
    "resources": {"heap_size": "1GB"}
  }
}"#;

fn parse(text: &str) -> Result<IndexConfig, ConfigError> {
    IndexConfig::parse(text.as_bytes())
}

/// Asserts the config fails and the error names `field`.
#[track_caller]
fn assert_invalid(text: &str, field: &str, needle: &str) {
    let err = parse(text).expect_err("config should be rejected");
    let message = err.to_string();
    match &err {
        ConfigError::Invalid { field: f, .. } => assert_eq!(f, field, "{message}"),
        ConfigError::Parse(_) => assert!(message.contains(field), "{message}"),
    }
    assert!(
        message.contains(needle),
        "expected `{needle}` in: {message}"
    );
}

fn minimal(doc_mapping: &str) -> String {
    format!("index_id: my-index\ndoc_mapping:\n{doc_mapping}")
}

const TS: &str = "    - name: ts\n      type: datetime\n      fast: true\n";

#[test]
fn hdfs_logs_parses() {
    let config = parse(HDFS_LOGS_YAML).unwrap();
    assert_eq!(config.index_id, "hdfs-logs");
    let mapping = &config.doc_mapping;
    assert_eq!(mapping.field_mappings.len(), 5);
    assert_eq!(mapping.mode, Mode::Dynamic);
    assert_eq!(mapping.timestamp_field.as_deref(), Some("timestamp"));
    assert_eq!(mapping.tag_fields, ["tenant_id"]);
    assert_eq!(mapping.max_num_partitions, DEFAULT_MAX_NUM_PARTITIONS);
    match &mapping.field_mapping("severity_text").unwrap().kind {
        FieldKind::Text(options) => {
            assert!(options.fast.enabled, "fast: {{normalizer}} means fast");
            assert_eq!(options.tokenizer, Tokenizer::Raw);
            assert!(options.stored && options.indexed);
        }
        other => panic!("{other:?}"),
    }
    match &mapping.field_mapping("timestamp").unwrap().kind {
        FieldKind::Datetime(options) => {
            assert_eq!(options.input_formats, [DateInputFormat::UnixTimestamp]);
            assert_eq!(options.fast_precision, FastPrecision::Seconds);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(config.indexing_settings.commit_timeout_secs, 10);
    assert_eq!(
        config.indexing_settings.split_num_docs_target,
        DEFAULT_SPLIT_NUM_DOCS_TARGET
    );
    assert_eq!(
        config.indexing_settings.merge_policy,
        MergePolicyConfig::default()
    );
    assert_eq!(
        config.search_settings.default_search_fields,
        ["severity_text", "body"]
    );
    let retention = config.retention.as_ref().unwrap();
    assert_eq!(retention.period_secs().unwrap(), 90 * 86_400);
    assert_eq!(retention.schedule, "daily");
    assert_eq!(mapping.partition_key().unwrap(), None);
    assert!(mapping.is_exact_tag_field("tenant_id"));
    assert!(!mapping.is_exact_tag_field("body"));
}

#[test]
fn gharchive_json_parses() {
    let config = parse(GHARCHIVE_JSON).unwrap();
    assert_eq!(config.index_id, "gh-archive");
    let mapping = &config.doc_mapping;
    assert!(mapping.store_source);
    assert!(matches!(
        mapping.field_mapping("payload").unwrap().kind,
        FieldKind::Json(_)
    ));
    assert_eq!(
        mapping.partition_key().unwrap(),
        Some(PartitionKey::HashMod {
            fields: vec!["type".into(), "repo.name".into()],
            modulo: 50
        })
    );
    assert_eq!(
        config.indexing_settings.resources.heap_size,
        Some(serde_json::json!("1GB"))
    );
    assert!(mapping.is_exact_tag_field("type"));
    assert_eq!(
        config.indexing_settings.heap_size_bytes().unwrap(),
        Some(1_000_000_000)
    );
}

#[test]
fn docstore_settings_are_zstd_levels_and_block_sizes() {
    let with = |settings: &str| {
        format!(
            "index_id: my-index\ndoc_mapping:\n  field_mappings: []\nindexing_settings:\n{settings}"
        )
    };
    let config = parse(&with(
        "  docstore_compression_level: 8\n  docstore_blocksize: 1000000\n",
    ))
    .unwrap();
    assert_eq!(config.indexing_settings.docstore_compression_level, Some(8));
    assert_eq!(config.indexing_settings.docstore_blocksize, Some(1_000_000));
    // They shape the splits: no longer listed as keys without effect.
    assert!(config.inert_keys().is_empty());
    parse(&with("  docstore_compression_level: -7\n")).unwrap();
    parse(&with("  docstore_compression_level: 22\n")).unwrap();
    assert_invalid(
        &with("  docstore_compression_level: 23\n"),
        "indexing_settings.docstore_compression_level",
        "-7 to 22",
    );
    assert_invalid(
        &with("  docstore_blocksize: 100\n"),
        "indexing_settings.docstore_blocksize",
        "1024 to 67108864 bytes",
    );
    assert_invalid(
        &with("  docstore_blocksize: 100000000\n"),
        "indexing_settings.docstore_blocksize",
        "1024 to 67108864 bytes",
    );
}

#[test]
fn heap_size_is_a_byte_size_above_tantivys_floor() {
    let with_heap = |heap: &str| {
        format!(
            "index_id: my-index\ndoc_mapping:\n  field_mappings: []\nindexing_settings:\n  resources:\n    heap_size: {heap}\n"
        )
    };
    let config = parse(&with_heap("512MiB")).unwrap();
    assert_eq!(
        config.indexing_settings.heap_size_bytes().unwrap(),
        Some(512 << 20)
    );
    assert_eq!(
        parse(&with_heap("20000000"))
            .unwrap()
            .indexing_settings
            .heap_size_bytes()
            .unwrap(),
        Some(20_000_000)
    );
    assert_eq!(
        parse("index_id: my-index\ndoc_mapping:\n  field_mappings: []\n")
            .unwrap()
            .indexing_settings
            .heap_size_bytes()
            .unwrap(),
        None
    );
    assert_invalid(
        &with_heap("lots"),
        "indexing_settings.resources.heap_size",
        "lots",
    );
    assert_invalid(
        &with_heap("1MB"),
        "indexing_settings.resources.heap_size",
        "15 MB",
    );
}

#[test]
fn json_and_yaml_round_trip() {
    let config = parse(HDFS_LOGS_YAML).unwrap();
    let json = serde_json::to_vec(&config).unwrap();
    assert_eq!(IndexConfig::parse(&json).unwrap(), config);
    let yaml = serde_yaml::to_string(&config).unwrap();
    assert_eq!(parse(&yaml).unwrap(), config);
    // Leading whitespace before `{` is still JSON.
    let mut spaced = b"  \n\t".to_vec();
    spaced.extend_from_slice(&json);
    assert_eq!(IndexConfig::parse(&spaced).unwrap(), config);
}

#[test]
fn quickwit_array_types_are_accepted() {
    let config = parse(&minimal(
        "  field_mappings:\n    - name: tags\n      type: array<text>\n      tokenizer: raw\n    - name: codes\n      type: array<i64>\n",
    ))
    .unwrap();
    assert!(matches!(
        config.doc_mapping.field_mappings[0].kind,
        FieldKind::Text(_)
    ));
    assert!(matches!(
        config.doc_mapping.field_mappings[1].kind,
        FieldKind::I64(_)
    ));
    assert!(config.doc_mapping.field_mappings[0].array);
    // The config is given back as it was declared.
    let json = serde_json::to_value(&config).unwrap();
    assert_eq!(
        json["doc_mapping"]["field_mappings"][0]["type"],
        "array<text>"
    );
    assert_eq!(json["doc_mapping"]["field_mappings"][0]["name"], "tags");
    assert_eq!(
        IndexConfig::parse(json.to_string().as_bytes()).unwrap(),
        config
    );
    let plain = parse(&minimal(
        "  field_mappings:\n    - name: tags\n      type: text\n",
    ))
    .unwrap();
    assert!(!plain.doc_mapping.field_mappings[0].array);
    assert_invalid(
        &minimal("  field_mappings:\n    - name: tags\n      type: array<nope>\n"),
        "doc_mapping.field_mappings[0]",
        "nope",
    );
}

#[test]
fn defaults() {
    let config = parse("index_id: abc\ndoc_mapping: {}\n").unwrap();
    assert_eq!(config.doc_mapping.mode, Mode::Dynamic);
    assert!(config.doc_mapping.field_mappings.is_empty());
    assert_eq!(
        config.indexing_settings.commit_timeout_secs,
        DEFAULT_COMMIT_TIMEOUT_SECS
    );
    assert!(config.retention.is_none());
}

#[test]
fn serde_errors_name_the_field() {
    // Unknown field type: the error names the field mapping and its name.
    assert_invalid(
        &minimal("  field_mappings:\n    - name: a\n      type: string\n"),
        "doc_mapping.field_mappings[0]",
        "unknown variant `string`",
    );
    let err = parse(&minimal(
        "  field_mappings:\n    - name: ok\n      type: u64\n    - name: bad_one\n      type: strin\n",
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("field_mappings[1]") && err.contains("bad_one"),
        "{err}"
    );
    // Unknown option in a field mapping.
    assert_invalid(
        &minimal("  field_mappings:\n    - name: a\n      type: text\n      tokeniser: raw\n"),
        "doc_mapping.field_mappings[0]",
        "tokeniser",
    );
    // Unknown key in the doc mapping.
    assert_invalid(
        &minimal("  timestamp_feld: ts\n"),
        "doc_mapping",
        "timestamp_feld",
    );
    // Unknown top-level key.
    assert_invalid(
        "index_id: abc\ndoc_mapping: {}\nsearch_setings: {}\n",
        "",
        "search_setings",
    );
    // Wrong value type.
    assert_invalid(
        "index_id: abc\ndoc_mapping: {}\nindexing_settings:\n  commit_timeout_secs: soon\n",
        "indexing_settings.commit_timeout_secs",
        "invalid type",
    );
    assert_invalid(
        &minimal("  mode: relaxed\n"),
        "doc_mapping.mode",
        "unknown variant `relaxed`",
    );
    assert_invalid(
        &minimal("  field_mappings:\n    - name: ts\n      type: datetime\n      input_formats: [strftime]\n"),
        "doc_mapping.field_mappings[0]",
        "strftime",
    );
    // Same in JSON.
    let err = IndexConfig::parse(br#"{"index_id": "abc", "doc_mapping": {"field_mappings": [{"name": "x", "type": "integer"}]}}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("doc_mapping.field_mappings[0]") && err.contains("`x`"),
        "{err}"
    );
    // Malformed input.
    assert!(matches!(parse("index_id: [\n"), Err(ConfigError::Parse(_))));
    assert!(matches!(
        IndexConfig::parse(b"{\"index_id\": "),
        Err(ConfigError::Parse(_))
    ));
}

#[test]
fn index_id_rules() {
    for good in ["abc", "my-index_1.v2", &format!("a{}", "b".repeat(254))] {
        parse(&format!("index_id: '{good}'\ndoc_mapping: {{}}\n")).unwrap();
    }
    for bad in [
        "ab",
        "1abc",
        "_abc",
        "my index",
        "abc/def",
        "ab:c",
        &format!("a{}", "b".repeat(255)),
    ] {
        assert_invalid(
            &format!("index_id: '{bad}'\ndoc_mapping: {{}}\n"),
            "index_id",
            "must match",
        );
    }
}

#[test]
fn field_name_rules() {
    assert_invalid(
        &minimal("  field_mappings:\n    - name: ''\n      type: text\n"),
        "doc_mapping.field_mappings[0].name",
        "empty",
    );
    assert_invalid(
        &minimal(
            "  field_mappings:\n    - name: a\n      type: text\n    - name: a\n      type: u64\n",
        ),
        "doc_mapping.field_mappings[1].name",
        "declared twice",
    );
    assert_invalid(
        &minimal("  field_mappings:\n    - name: _source\n      type: text\n"),
        "doc_mapping.field_mappings[0].name",
        "starts with `_`",
    );
    assert_invalid(
        &minimal("  field_mappings:\n    - name: 'a b'\n      type: text\n"),
        "doc_mapping.field_mappings[0].name",
        "invalid",
    );
    parse(&minimal(
        "  field_mappings:\n    - name: '@timestamp'\n      type: text\n    - name: attributes.http/status-code\n      type: u64\n",
    ))
    .unwrap();
}

#[test]
fn timestamp_field_rules() {
    parse(&minimal(&format!(
        "  field_mappings:\n{TS}  timestamp_field: ts\n"
    )))
    .unwrap();
    assert_invalid(
        &minimal(&format!("  field_mappings:\n{TS}  timestamp_field: time\n")),
        "doc_mapping.timestamp_field",
        "no field named `time`",
    );
    assert_invalid(
        &minimal("  field_mappings:\n    - name: ts\n      type: i64\n      fast: true\n  timestamp_field: ts\n"),
        "doc_mapping.timestamp_field",
        "must be of type `datetime`, not `i64`",
    );
    assert_invalid(
        &minimal(
            "  field_mappings:\n    - name: ts\n      type: datetime\n  timestamp_field: ts\n",
        ),
        "doc_mapping.timestamp_field",
        "fast: true",
    );
}

#[test]
fn tag_field_rules() {
    let fields = "  field_mappings:\n    - name: t\n      type: text\n      tokenizer: raw\n    - name: n\n      type: i64\n    - name: f\n      type: f64\n    - name: b\n      type: bool\n";
    parse(&minimal(&format!("{fields}  tag_fields: [t, n]\n"))).unwrap();
    assert_invalid(
        &minimal(&format!("{fields}  tag_fields: [b]\n")),
        "doc_mapping.tag_fields[0]",
        "must be raw text, i64 or u64",
    );
    assert_invalid(
        &minimal(&format!("{fields}  tag_fields: [t, missing]\n")),
        "doc_mapping.tag_fields[1]",
        "no field named `missing`",
    );
    assert_invalid(
        &minimal(&format!("{fields}  tag_fields: [f]\n")),
        "doc_mapping.tag_fields[0]",
        "must be raw text, i64 or u64",
    );
}

#[test]
fn default_search_field_rules() {
    let fields = "  mode: lenient\n  field_mappings:\n    - name: body\n      type: text\n    - name: hidden\n      type: text\n      indexed: false\n";
    parse(&format!(
        "{}search_settings:\n  default_search_fields: [body]\n",
        minimal(fields)
    ))
    .unwrap();
    assert_invalid(
        &format!(
            "{}search_settings:\n  default_search_fields: [body, nope]\n",
            minimal(fields)
        ),
        "search_settings.default_search_fields[1]",
        "unknown default search field `nope`",
    );
    assert_invalid(
        &format!(
            "{}search_settings:\n  default_search_fields: [hidden]\n",
            minimal(fields)
        ),
        "search_settings.default_search_fields[0]",
        "not indexed",
    );
}

#[test]
fn partition_key_rules() {
    let fields = "  field_mappings:\n    - name: tenant\n      type: text\n      tokenizer: raw\n    - name: resource\n      type: json\n";
    parse(&minimal(&format!("{fields}  partition_key: tenant\n"))).unwrap();
    parse(&minimal(&format!(
        "{fields}  partition_key: hash_mod((tenant, resource.service), 10)\n  max_num_partitions: 10\n"
    )))
    .unwrap();
    assert_invalid(
        &minimal(&format!("{fields}  partition_key: hash_mod(tenant, 0)\n")),
        "doc_mapping.partition_key",
        "at least 1",
    );
    assert_invalid(
        &minimal(&format!(
            "{fields}  partition_key: hash_mod((tenant, host), 4)\n"
        )),
        "doc_mapping.partition_key",
        "no field named `host`",
    );
    assert_invalid(
        &minimal(&format!("{fields}  partition_key: 'hash_mod(tenant, 4'\n")),
        "doc_mapping.partition_key",
        "expected `)`",
    );
    assert_invalid(
        &minimal(&format!("{fields}  max_num_partitions: 0\n")),
        "doc_mapping.max_num_partitions",
        "at least 1",
    );
}

#[test]
fn indexing_settings_rules() {
    let base = "index_id: abc\ndoc_mapping: {}\nindexing_settings:\n";
    assert_invalid(
        &format!("{base}  commit_timeout_secs: 0\n"),
        "indexing_settings.commit_timeout_secs",
        "at least 1",
    );
    assert_invalid(
        &format!("{base}  split_num_docs_target: 0\n"),
        "indexing_settings.split_num_docs_target",
        "at least 1",
    );
    assert_invalid(
        &format!("{base}  merge_policy: stable_log\n"),
        "indexing_settings.merge_policy",
        "expected an object with a `type`",
    );
    assert_invalid(
        &format!("{base}  merge_policy:\n    merge_factor: 10\n"),
        "indexing_settings.merge_policy.type",
        "missing",
    );
    let config = parse(&format!(
        "{base}  merge_policy:\n    type: limit_merge\n    max_merge_ops: 3\n"
    ))
    .unwrap();
    match &config.indexing_settings.merge_policy {
        MergePolicyConfig::LimitMerge(limit) => assert_eq!(limit.max_merge_ops, 3),
        other => panic!("{other:?}"),
    }
}

#[test]
fn merge_policy_is_typed_and_validated_at_parse_time() {
    let base = "index_id: abc\ndoc_mapping: {}\nindexing_settings:\n  merge_policy:\n";
    assert_invalid(
        &format!("{base}    type: fancy\n"),
        "indexing_settings.merge_policy.type",
        "unknown merge policy `fancy`",
    );
    assert_invalid(
        &format!("{base}    type: stable_log\n    merge_factor: ten\n"),
        "indexing_settings.merge_policy.merge_factor",
        "expected an unsigned integer",
    );
    assert_invalid(
        &format!("{base}    type: stable_log\n    merge_factr: 10\n"),
        "indexing_settings.merge_policy.merge_factr",
        "unknown key",
    );
    assert_invalid(
        &format!("{base}    type: limit_merge\n    maturation_period: soon\n"),
        "indexing_settings.merge_policy.maturation_period",
        "not a duration",
    );
    assert_invalid(
        &format!("{base}    type: stable_log\n    merge_factor: 12\n    max_merge_factor: 4\n"),
        "indexing_settings.merge_policy.max_merge_factor",
        "at least `merge_factor`",
    );
    // `locality`: its settings are checked alone, then against the doc mapping.
    assert_invalid(
        &format!("{base}    type: locality\n    sort_fields: [service]\n    time_bucket: 7m\n"),
        "indexing_settings.merge_policy.time_bucket",
        "divides an hour",
    );
    assert_invalid(
        &format!("{base}    type: locality\n    sort_fields: [service]\n"),
        "doc_mapping.timestamp_field",
        "needs a timestamp field",
    );
    let logs = "index_id: abc\ndoc_mapping:\n  timestamp_field: ts\n  field_mappings:\n    - {name: ts, type: datetime, fast: true}\n    - {name: service, type: text, tokenizer: raw, fast: true}\nindexing_settings:\n  merge_policy:\n";
    assert_invalid(
        &format!("{logs}    type: locality\n    sort_fields: [service, host]\n"),
        "indexing_settings.merge_policy.sort_fields[1]",
        "no field named `host`",
    );
    assert_invalid(
        &format!("{logs}    type: locality\n    sort_fields: [service]\n    time_bucket: 15m\n    target_split_num_docs: 0\n"),
        "indexing_settings.merge_policy.target_split_num_docs",
        "",
    );
    let accepted = IndexConfig::parse(
        format!("{logs}    type: locality\n    sort_fields: [service]\n    time_bucket: 15m\n    max_merge_ops: 4\n").as_bytes(),
    )
    .expect("a valid locality config is accepted");
    assert_eq!(
        accepted.indexing_settings.merge_policy.type_name(),
        "locality"
    );
    // JSON configs name the field the same way.
    let err = IndexConfig::parse(
        br#"{"index_id": "abc", "doc_mapping": {}, "indexing_settings": {"merge_policy": {"type": "no_merge", "merge_factor": 3}}}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("`indexing_settings.merge_policy.merge_factor`"),
        "{err}"
    );
}

#[test]
fn merge_policy_round_trips_in_quickwit_shape() {
    let config = parse(
        "index_id: abc\ndoc_mapping: {}\nindexing_settings:\n  merge_policy:\n    type: default\n    maturation_period: 48h\n    merge_factor: 8\n",
    )
    .unwrap();
    let json = serde_json::to_value(&config.indexing_settings.merge_policy).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "type": "stable_log",
            "min_level_num_docs": 100000,
            "merge_factor": 8,
            "max_merge_factor": 12,
            "maturation_period": "2days",
        })
    );
    let back: MergePolicyConfig = serde_json::from_value(json).unwrap();
    assert_eq!(back, config.indexing_settings.merge_policy);
    assert_eq!(format_duration(5400), "1h 30m");
    assert_eq!(format_duration(86_400 + 1), "1day 1s");
}

#[test]
fn one_maturity_rule_for_every_policy() {
    use shale_types::SplitMaturity;
    let immature = |secs| SplitMaturity::Immature {
        maturation_period_secs: secs,
    };
    let stable = MergePolicyConfig::default();
    assert_eq!(stable.split_maturity(1000, 10, 0), immature(48 * 3600));
    assert_eq!(stable.split_maturity(1000, 1000, 0), SplitMaturity::Mature);
    assert_eq!(
        MergePolicyConfig::NoMerge.split_maturity(1000, 10, 0),
        SplitMaturity::Mature
    );
    let limit = |ops: u32| {
        MergePolicyConfig::LimitMerge(LimitMergeConfig {
            max_merge_ops: ops,
            ..LimitMergeConfig::default()
        })
    };
    assert_eq!(limit(2).split_maturity(1000, 10, 0), immature(48 * 3600));
    assert_eq!(limit(2).split_maturity(1000, 10, 2), SplitMaturity::Mature);
    // With `max_merge_ops: 0` no split may ever be merged: fresh splits are born mature.
    assert_eq!(limit(0).split_maturity(1000, 10, 0), SplitMaturity::Mature);
}

#[test]
fn retention_schedules_are_parsed_or_rejected() {
    let base = "index_id: abc\ndoc_mapping:\n  field_mappings:\n    - {name: ts, type: datetime, fast: true}\n  timestamp_field: ts\nretention:\n  period: 1 day\n";
    // 2023-11-14T22:13:20Z
    let now = 1_700_000_000;
    for (schedule, next) in [
        ("hourly", 1_700_002_800),       // 23:00:00
        ("@hourly", 1_700_002_800),      // same
        ("daily", 1_700_006_400),        // 2023-11-15T00:00:00Z
        ("0 30 2 * * *", 1_700_015_400), // 02:30:00 the next day
        ("*/10 * * * * *", 1_700_000_010),
    ] {
        let config = parse(&format!("{base}  schedule: \"{schedule}\"\n")).unwrap();
        let parsed = config.retention.unwrap().schedule().unwrap();
        assert_eq!(parsed.next_after(now), Some(next), "{schedule}");
    }
    // The default is hourly.
    let config = parse(base).unwrap();
    assert_eq!(
        config
            .retention
            .unwrap()
            .schedule()
            .unwrap()
            .next_after(now),
        Some(1_700_002_800)
    );
    for bad in ["sometimes", "Daily", "0 0 * *", "61 * * * * *"] {
        assert_invalid(
            &format!("{base}  schedule: \"{bad}\"\n"),
            "retention.schedule",
            "is not a schedule",
        );
    }
    assert_invalid(
        "index_id: abc\ndoc_mapping: {}\nretention:\n  period: 1 day\n",
        "retention",
        "needs a timestamp field",
    );
}

#[test]
fn retention_rules() {
    let base = "index_id: abc\ndoc_mapping:\n  field_mappings:\n    - {name: ts, type: datetime, fast: true}\n  timestamp_field: ts\nretention:\n";
    let config = parse(&format!("{base}  period: 12h\n")).unwrap();
    assert_eq!(config.retention.unwrap().period_secs().unwrap(), 43_200);
    assert_invalid(
        &format!("{base}  period: 90 dayz\n"),
        "retention.period",
        "unknown unit `dayz`",
    );
    assert_invalid(
        &format!("{base}  period: 0 days\n"),
        "retention.period",
        "longer than 0",
    );
}

#[test]
fn unknown_keys_are_refused_in_every_section_naming_the_key_and_the_valid_ones() {
    let base = |section: &str| {
        format!(
            "index_id: typos\ndoc_mapping:\n  field_mappings:\n    - name: body\n      type: text\n{section}"
        )
    };
    for (section, key, path) in [
        (
            "indexing_settings:\n  commit_timout_secs: 1\n",
            "commit_timout_secs",
            "indexing_settings",
        ),
        (
            "indexing_settings:\n  resources:\n    heap_sise: 1GB\n",
            "heap_sise",
            "indexing_settings.resources",
        ),
        (
            "search_settings:\n  default_search_field: [body]\n",
            "default_search_field",
            "search_settings",
        ),
        (
            "retention:\n  period: 1 day\n  shedule: daily\n",
            "shedule",
            "retention",
        ),
        (
            "ingest_settings:\n  min_shard: 2\n",
            "min_shard",
            "ingest_settings",
        ),
        ("docmapping: {}\n", "docmapping", ""),
    ] {
        let err = parse(&base(section)).unwrap_err().to_string();
        assert!(err.contains(&format!("unknown field `{key}`")), "{err}");
        assert!(err.contains(", expected "), "lists the valid keys: {err}");
        if !path.is_empty() {
            assert!(
                err.contains(&format!("`{path}")),
                "names the section: {err}"
            );
        }
        assert!(err.contains("line "), "points to the line: {err}");
    }
    // The same in JSON.
    let err = parse(
        r#"{"index_id": "typos", "doc_mapping": {"field_mappings": []},
            "indexing_settings": {"commit_timout_secs": 1}}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("unknown field `commit_timout_secs`"), "{err}");
    assert!(err.contains("line 2"), "{err}");
}

#[test]
fn every_key_of_quickwits_index_config_reference_is_accepted() {
    let config = parse(
        r#"
version: 0.9
index_id: quickwit-keys
index_uri: file:///tmp/quickwit-keys
doc_mapping:
  doc_mapping_uid: 01HZZZZZZZZZZZZZZZZZZZZZZZ
  mode: dynamic
  dynamic_mapping:
    indexed: true
    stored: true
    tokenizer: default
    record: basic
    expand_dots: true
    fast: true
  field_mappings:
    - name: timestamp
      type: datetime
      fast: true
      input_formats: [unix_timestamp]
      output_format: rfc3339
      fast_precision: seconds
    - name: service
      type: text
      tokenizer: raw
      fast: true
  tag_fields: [service]
  timestamp_field: timestamp
  partition_key: service
  max_num_partitions: 100
  index_field_presence: true
  store_document_size: true
  store_source: false
  tokenizers:
    - name: my_tokenizer
      type: ngram
      min_gram: 2
      max_gram: 3
indexing_settings:
  commit_timeout_secs: 30
  split_num_docs_target: 1000000
  docstore_compression_level: 8
  docstore_blocksize: 1000000
  resources:
    heap_size: 1GB
    max_merge_write_throughput: 100MB
  merge_policy:
    type: limit_merge
    max_merge_ops: 3
    merge_factor: 10
    max_merge_factor: 12
    maturation_period: 48h
  parquet_merge_policy:
    merge_factor: 10
  parquet_indexing:
    window_duration_secs: 900
ingest_settings:
  min_shards: 2
  validate_docs: true
search_settings:
  default_search_fields: [service]
retention:
  period: 90 days
  schedule: daily
"#,
    )
    .unwrap();
    let inert: Vec<&str> = config.inert_keys().iter().map(|(key, _)| *key).collect();
    assert_eq!(
        inert,
        [
            "indexing_settings.parquet_merge_policy",
            "indexing_settings.parquet_indexing",
            "indexing_settings.resources.max_merge_write_throughput",
            "ingest_settings.min_shards",
            "ingest_settings.validate_docs",
        ]
    );
    assert_eq!(
        config.indexing_settings.heap_size_bytes().unwrap(),
        Some(1_000_000_000)
    );
    // Quickwit's older name of `store_document_size`.
    let older =
        parse("index_id: older\ndoc_mapping:\n  document_length: true\n  field_mappings: []\n")
            .unwrap();
    assert!(older.doc_mapping.store_document_size);
}

#[test]
fn stored_configs_with_keys_refused_today_still_load() {
    let mut value = serde_json::to_value(parse(HDFS_LOGS_YAML).unwrap()).unwrap();
    value["indexing_settings"]["commit_timout_secs"] = serde_json::json!(1);
    value["indexing_settings"]["resources"] =
        serde_json::json!({"heap_size": "1GB", "heap_sise": "2GB"});
    let json = serde_json::to_string(&value).unwrap();
    assert!(serde_json::from_str::<IndexConfig>(&json).is_err());
    let config = IndexConfig::from_stored_json(&json).unwrap();
    assert_eq!(config.indexing_settings.commit_timeout_secs, 10);
    assert_eq!(
        config.indexing_settings.heap_size_bytes().unwrap(),
        Some(1_000_000_000)
    );
    // A config broken elsewhere is still an error.
    value["doc_mapping"]["nonsense"] = serde_json::json!(1);
    assert!(IndexConfig::from_stored_json(&value.to_string()).is_err());
}

/// Found by fuzzing: a config whose `version` is a float with many digits read back from the
/// metastore's JSON one unit in the last place off (serde_json parses floats exactly only
/// with `float_roundtrip`), so a stored config was not the config that was created.
#[test]
fn a_stored_config_reads_back_exactly_with_float_values() {
    let yaml = "version: 0444444444444444444444444444444444444444.9\nindex_id: floats\ndoc_mapping:\n  mode: dynamic\n";
    let config = IndexConfig::parse(yaml.as_bytes()).unwrap();
    let stored = serde_json::to_string(&config).unwrap();
    assert_eq!(IndexConfig::from_stored_json(&stored).unwrap(), config);
}

#[test]
fn a_metrics_index_is_declared_by_its_metrics_section() {
    let config = parse(
        "version: 0.9\nindex_id: prom\nmetrics:\n  sort_labels: [job, instance]\n  time_bucket: 5m\n\
         indexing_settings:\n  commit_timeout_secs: 10\nretention:\n  period: 30 days\n",
    )
    .unwrap();
    let metrics = config.metrics.as_ref().unwrap();
    assert_eq!(metrics.sort_labels, ["job", "instance"]);
    assert_eq!(metrics.time_bucket_secs(), 300);
    assert_eq!(config.indexing_settings.commit_timeout_secs, 10);
    // The default bucket is 15 minutes; a stored config reads back the same.
    let config = parse("index_id: prom\nmetrics: {}\n").unwrap();
    assert_eq!(config.metrics.as_ref().unwrap().time_bucket_secs(), 900);
    let json = serde_json::to_string(&config).unwrap();
    assert_eq!(IndexConfig::from_stored_json(&json).unwrap(), config);
    // It merges with the locality policy its section implies (cluster-wide, by bucket).
    let crate::MergePolicyConfig::Locality(locality) = &config.indexing_settings.merge_policy
    else {
        panic!("{:?}", config.indexing_settings.merge_policy);
    };
    assert_eq!(locality.sort_fields, ["__name__", "__series_id__"]);
    assert_eq!(locality.time_bucket_secs, 900);
    assert_eq!(locality.target_split_bytes, Some(256 << 20));
    assert_eq!(locality.max_merge_ops, 4);
    // Its settings come from the `metrics` section; the config reads back as written.
    let config = parse(
        "index_id: prom\nmetrics:\n  sort_labels: [job]\n  target_split_bytes: 64MiB\n  \
         max_merge_ops: 2\n",
    )
    .unwrap();
    let again = parse(&serde_json::to_string(&config).unwrap()).unwrap();
    assert_eq!(again, config);
    let crate::MergePolicyConfig::Locality(locality) = &config.indexing_settings.merge_policy
    else {
        panic!("locality");
    };
    assert_eq!(locality.sort_fields, ["__name__", "job", "__series_id__"]);
    assert_eq!(locality.target_split_bytes, Some(64 << 20));
    assert_eq!(locality.max_merge_ops, 2);
    // `no_merge` turns merges off.
    let off = parse(
        "index_id: prom\nmetrics: {}\nindexing_settings:\n  merge_policy:\n    type: no_merge\n",
    )
    .unwrap();
    assert_eq!(
        off.indexing_settings.merge_policy,
        crate::MergePolicyConfig::NoMerge
    );
    // A logs index still needs nothing of it, and has no `metrics` key when stored.
    let logs = parse(&minimal("  field_mappings: []\n")).unwrap();
    assert!(logs.metrics.is_none());
    assert!(!serde_json::to_string(&logs).unwrap().contains("metrics"));
}

#[test]
fn invalid_metrics_settings_are_refused_naming_the_key() {
    let base = "index_id: prom\n";
    for (tail, field, needle) in [
        (
            "metrics:\n  time_bucket: 7m\n",
            "metrics.time_bucket",
            "divide an hour",
        ),
        (
            "metrics:\n  time_bucket: 2h\n",
            "metrics.time_bucket",
            "divide an hour",
        ),
        (
            "metrics:\n  time_bucket: 30s\n",
            "metrics.time_bucket",
            "at least a minute",
        ),
        (
            "metrics:\n  time_bucket: soon\n",
            "metrics.time_bucket",
            "not a duration",
        ),
        (
            "metrics:\n  sort_labels: [job, job]\n",
            "metrics.sort_labels[1]",
            "twice",
        ),
        (
            "metrics:\n  sort_labels: [host.name]\n",
            "metrics.sort_labels[0]",
            "not a label name",
        ),
        (
            "metrics:\n  sort_labels: [__name__]\n",
            "metrics.sort_labels[0]",
            "reserved",
        ),
        (
            "metrics: {}\ndoc_mapping:\n  field_mappings:\n    - {name: a, type: text}\n",
            "doc_mapping",
            "no doc mapping",
        ),
        (
            "metrics: {}\nsearch_settings:\n  default_search_fields: [a]\n",
            "search_settings",
            "PromQL",
        ),
        (
            "metrics: {}\nindexing_settings:\n  commit_timeout_secs: 0\n",
            "indexing_settings.commit_timeout_secs",
            "at least 1",
        ),
        (
            "metrics: {}\nretention:\n  period: forever\n",
            "retention.period",
            "",
        ),
        ("metrics:\n  sort_label: [job]\n", "", "sort_label"),
        (
            "metrics:\n  max_merge_ops: 0\n",
            "metrics.max_merge_ops",
            "at least 1",
        ),
        (
            "metrics:\n  target_split_bytes: 0\n",
            "metrics.target_split_bytes",
            "at least 1",
        ),
        (
            "metrics: {}\nindexing_settings:\n  merge_policy:\n    type: stable_log\n    merge_factor: 3\n",
            "indexing_settings.merge_policy",
            "no_merge",
        ),
        ("retention:\n  period: 1 day\n", "doc_mapping", "missing"),
    ] {
        assert_invalid(&format!("{base}{tail}"), field, needle);
    }
}
