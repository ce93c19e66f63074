//! libFuzzer target: plugin-configuration parsing and validation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warmpath_core::{Router, Settings};

fuzz_target!(|data: &[u8]| {
    match Settings::from_json(data) {
        Ok(s) => {
            assert!(s.block_size <= s.prefix_length);
            let _ = Router::new(s);
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
});
