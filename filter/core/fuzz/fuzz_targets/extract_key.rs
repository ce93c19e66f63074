//! libFuzzer target: key extraction for every body form, then routing of whatever was extracted.
//! Input: first byte selects the path and prefix length, the rest is the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warmpath_core::{extract_key, EndpointLoad, Router, Settings};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let path = ["/v1/chat/completions", "/v1/completions", "/raw"][(sel % 3) as usize];
    let limit = 1 + (sel as usize >> 2) * 16;
    if let Ok(k) = extract_key(path, body, (sel & 0x80 != 0).then_some("t"), limit) {
        assert!(k.text_units <= limit && k.text.len() <= 4 * limit);
        let mut r = Router::new(Settings {
            endpoints: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
            block_size: 16,
            index_capacity: 64,
            ..Settings::default()
        });
        let d = r.route_key(&k, sel as u64, &[EndpointLoad::in_flight(1)]).unwrap();
        assert!(d.endpoint < 2);
    }
});
