//! Plugin configuration input that can never work is refused with a message saying why.

use warmpath_core::config::normalize_address;
use warmpath_core::Settings;

#[test]
fn a_json_array_is_refused_as_not_an_object() {
    for text in [r#"["127.0.0.1:18001"]"#, "  [ ]", "\"PREFIX_AWARE\"", "42"] {
        let e = Settings::from_json(text.as_bytes()).expect_err(text).to_string();
        assert!(e.contains("must be a JSON object"), "{text}: {e}");
    }
    assert!(Settings::from_json(br#" {"endpoints": ["127.0.0.1:1"]} "#).is_ok());
}

#[test]
fn endpoints_envoy_can_never_use_are_refused() {
    for bad in ["127.0.0.1:0", "[::ffff:127.0.0.1]:18001", "0.0.0.0:80", "[::]:80", "localhost:80"] {
        assert_eq!(normalize_address(bad), None, "{bad}");
        let cfg = format!(r#"{{"endpoints": ["127.0.0.1:1", "{bad}"]}}"#);
        let e = Settings::from_json(cfg.as_bytes()).expect_err(bad).to_string();
        assert!(e.contains("endpoints[1]") && e.contains("port in 1..=65535"), "{bad}: {e}");
    }
    assert_eq!(normalize_address(" [::1]:8001 ").as_deref(), Some("[::1]:8001"));
    assert_eq!(normalize_address("10.0.0.1:65535").as_deref(), Some("10.0.0.1:65535"));
}
