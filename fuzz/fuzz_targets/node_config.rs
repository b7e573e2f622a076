//! Node configs: `NodeConfig::from_yaml`, then what `shale run` does with one that parses
//! (validation, the advertised address, the redacted rendering).
#![no_main]

use libfuzzer_sys::fuzz_target;
use shale_config::NodeConfig;

fuzz_target!(|data: &[u8]| {
    let config = match NodeConfig::from_yaml(data) {
        Ok(config) => config,
        Err(err) => {
            assert!(!err.to_string().is_empty(), "an error without a message");
            return;
        }
    };
    let _ = config.validate();
    let _ = config.advertise_address();
    let _ = config.to_redacted_yaml();
});
