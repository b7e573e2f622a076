use std::time::Instant;
fn main() {
    let yaml = r#"
index_id: bench
doc_mapping:
  mode: dynamic
  field_mappings:
    - name: timestamp
      type: datetime
      fast: true
    - name: tenant_id
      type: u64
    - name: severity_text
      type: text
      tokenizer: raw
      fast: true
    - name: body
      type: text
    - name: resource
      type: json
  tag_fields: [tenant_id]
  timestamp_field: timestamp
  partition_key: hash_mod(tenant_id, 8)
"#;
    let config = shale_config::IndexConfig::parse(yaml.as_bytes()).unwrap();
    let mapper = shale_index::DocMapper::new(&config.doc_mapping, &config.search_settings).unwrap();
    let docs: Vec<String> = (0..100_000).map(|i| format!(
        r#"{{"timestamp": {}, "tenant_id": {}, "severity_text": "INFO", "body": "PacketResponder: BP-108841162-10.10.34.11-1440074360971:blk_1074072698_331874, type=HAS_DOWNSTREAM_IN_PIPELINE terminating {i}", "resource": {{"service": "datanode/{}"}}, "attributes": {{"class": "org.apache.hadoop"}}}}"#,
        1_460_000_000 + i, i % 10, i % 50)).collect();
    let bytes: usize = docs.iter().map(|d| d.len()).sum();
    for _ in 0..3 {
        let start = Instant::now();
        let mut n = 0;
        for doc in &docs {
            n += mapper.parse_doc(doc.as_bytes()).unwrap().tags.len();
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{} docs/s, {:.0} MB/s ({n})",
            (docs.len() as f64 / secs) as u64,
            bytes as f64 / secs / 1e6
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let mapper = std::sync::Arc::new(mapper);
    let start = Instant::now();
    let mut builder =
        shale_index::SplitBuilder::new(mapper.clone(), &dir.path().join("s"), 200_000_000).unwrap();
    for doc in &docs {
        builder
            .add(mapper.parse_doc(doc.as_bytes()).unwrap())
            .unwrap();
    }
    let split = builder.finish().unwrap();
    println!(
        "indexed {} docs in {:?} → {} bytes",
        split.num_docs,
        start.elapsed(),
        split.size_bytes
    );
}
