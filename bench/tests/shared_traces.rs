//! Loads the public traces from `../shared/traces/` when that folder exists; skips with a message otherwise.

use warmpath_bench::trace::{load, shared_traces_dir};

#[test]
fn mooncake_and_azure_traces_load_without_bad_lines() {
    let Some(dir) = shared_traces_dir() else {
        eprintln!("SKIP: ../shared/traces not found; the trace tests need the public traces beside the repository");
        return;
    };
    let m = load(&dir.join("mooncake_synthetic_trace.jsonl"), 200).expect("mooncake trace");
    assert_eq!(m.requests.len(), 200);
    assert_eq!(m.bad_lines, 0, "{:?}", m.errors);
    // The trace's multi-turn structure shows up as byte-identical 512-token (2,048-byte) leading blocks.
    let prompts: Vec<String> = m.requests.iter().map(|r| r.server_prompt()).collect();
    let shared = prompts.iter().enumerate().filter(|(i, p)| prompts[..*i].iter().any(|q| q.len() >= 2048 && p.len() >= 2048 && q[..2048] == p[..2048])).count();
    assert!(shared > 0, "some requests share a leading block");
    assert!(m.requests.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    for f in ["AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_code.csv"] {
        let a = load(&dir.join(f), 300).expect(f);
        assert_eq!(a.requests.len(), 300, "{f}");
        assert_eq!(a.bad_lines, 0, "{f}: {:?}", a.errors);
    }
}
