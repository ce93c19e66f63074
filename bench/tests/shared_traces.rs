//! Loads the public traces from the directory named by `WARMPATH_TRACES` (they are not part of the repository);
//! without the variable there is nothing to load and the test says so.

use warmpath_bench::trace::{load, traces_dir, TRACES_ENV};

#[test]
fn mooncake_and_azure_traces_load_without_bad_lines() {
    let Some(dir) = traces_dir().expect(TRACES_ENV) else {
        eprintln!("SKIP: {TRACES_ENV} is not set; this test reads the public traces from that directory");
        return;
    };
    let m = load(&dir.join("mooncake_synthetic_trace.jsonl"), 200).expect("mooncake trace");
    assert_eq!(m.requests.len(), 200);
    assert_eq!(m.bad_lines, 0, "{:?}", m.errors);
    // The trace's multi-turn structure shows up as byte-identical 512-token (2,048-byte) leading blocks.
    let prompts: Vec<String> = m.requests.iter().map(|r| r.server_prompt()).collect();
    let shared = prompts
        .iter()
        .enumerate()
        .filter(|(i, p)| prompts[..*i].iter().any(|q| q.len() >= 2048 && p.len() >= 2048 && q[..2048] == p[..2048]))
        .count();
    assert!(shared > 0, "some requests share a leading block");
    assert!(m.requests.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    for f in ["AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_code.csv"] {
        let a = load(&dir.join(f), 300).expect(f);
        assert_eq!(a.requests.len(), 300, "{f}");
        assert_eq!(a.bad_lines, 0, "{f}: {:?}", a.errors);
    }
}
