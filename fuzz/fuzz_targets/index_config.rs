//! Index configs: `IndexConfig::parse` (YAML or JSON) and, for configs that parse, the doc
//! mapper of the index, the config as the metastore stores and reads it back, and the same
//! bytes as an index template.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shale_config::{IndexConfig, IndexTemplate};
use shale_index::DocMapper;

fuzz_target!(|data: &[u8]| {
    let _ = IndexTemplate::parse(data);
    let config = match IndexConfig::parse(data) {
        Ok(config) => config,
        Err(err) => {
            assert!(!err.to_string().is_empty(), "an error without a message");
            return;
        }
    };
    let _ = config.inert_keys();
    let _ = config.time_travel_retention_secs();
    // The metastore stores the config as JSON and reads it back.
    let stored = serde_json::to_string(&config).expect("a config serializes");
    let read = IndexConfig::from_stored_json(&stored).expect("a stored config reads back");
    assert_eq!(read, config, "the stored config reads back the same");
    if let Ok(mapper) = DocMapper::for_index(&config) {
        let _ = mapper.parse_doc(b"{}");
        let _ = mapper.parse_query("*", None);
    }
});
