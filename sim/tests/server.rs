//! The simulated server over real HTTP on loopback: OpenAI shapes, cache hits as ground truth, vLLM metrics.

use serde_json::{json, Value};
use warmpath_sim::api::SimExtras;
use warmpath_sim::{tokens, LatencyProfile, SimConfig, SimServer, ENDPOINT_HEADER};

fn fast() -> SimConfig {
    SimConfig { latency: LatencyProfile { time_scale: 0.01, ..Default::default() }, ..Default::default() }
}

async fn start() -> SimServer {
    SimServer::start(fast(), "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

#[tokio::test]
async fn non_streaming_chat_reports_cached_tokens_on_repeat() {
    let s = start().await;
    let url = format!("http://{}/v1/chat/completions", s.addr());
    let system = tokens::filler_text(1, 300);
    let body = json!({"model": "m", "max_tokens": 5,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]});
    let c = reqwest::Client::new();
    let r1 = c.post(&url).json(&body).send().await.unwrap();
    assert_eq!(r1.headers()[ENDPOINT_HEADER].to_str().unwrap(), s.addr().to_string());
    let v1: Value = r1.json().await.unwrap();
    assert_eq!(v1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(v1["usage"]["completion_tokens"], 5);
    assert_eq!(v1["choices"][0]["message"]["content"].as_str().unwrap().len(), 20);
    let extras: SimExtras = serde_json::from_value(v1.clone()).unwrap();
    let timing = extras.server_timing.expect("a non-streaming answer carries the server's timing too");
    assert!(timing.done_us >= timing.first_token_us, "{timing:?}");
    let v2: Value = c.post(&url).json(&body).send().await.unwrap().json().await.unwrap();
    let prompt_tokens = v2["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = v2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached < prompt_tokens && cached.is_multiple_of(16), "cached {cached} of {prompt_tokens}");
    assert!(prompt_tokens - cached < 16, "all full blocks hit");
    s.stop().await;
}

#[tokio::test]
async fn streaming_completion_sends_chunks_usage_and_done() {
    let s = start().await;
    let url = format!("http://{}/v1/completions", s.addr());
    let body = json!({"model": "m", "prompt": tokens::filler_text(2, 100), "max_tokens": 7, "stream": true,
        "stream_options": {"include_usage": true}});
    let text = reqwest::Client::new().post(&url).json(&body).send().await.unwrap().text().await.unwrap();
    let datas: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(*datas.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = datas[..datas.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let generated: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(generated.len(), 28);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens"], 100);
    assert_eq!(usage["completion_tokens"], 7);
    // The server's own share of the time rides in the last chunk: at time scale 0.01 the 30 ms overhead and
    // 100 × 0.2 ms of prefill take at least 500 µs of wall time, the 6 tokens after the first 6 × 120 µs more.
    let extras: SimExtras = serde_json::from_value(chunks.last().unwrap().clone()).unwrap();
    let timing = extras.server_timing.expect("the last chunk carries the server's timing");
    assert!(timing.first_token_us >= 500, "{timing:?}");
    assert!(timing.done_us >= timing.first_token_us + 720, "{timing:?}");
    s.stop().await;
}

#[tokio::test]
async fn multi_turn_history_hits_prompt_and_reply_blocks() {
    let s = start().await;
    let url = format!("http://{}/v1/chat/completions", s.addr());
    let c = reqwest::Client::new();
    let sys = tokens::filler_text(3, 200);
    let user1 = tokens::filler_text(4, 40);
    let p1 = tokens::chat_prompt([("system", sys.as_str()), ("user", user1.as_str())]);
    let reply = tokens::reply_text(&p1, 64);
    let turn1 = json!({"model": "m", "max_tokens": 64, "messages": [
        {"role": "system", "content": sys}, {"role": "user", "content": user1}]});
    let v1: Value = c.post(&url).json(&turn1).send().await.unwrap().json().await.unwrap();
    assert_eq!(v1["choices"][0]["message"]["content"].as_str().unwrap(), reply, "reply is predictable");
    let turn2 = json!({"model": "m", "max_tokens": 4, "messages": [
        {"role": "system", "content": sys}, {"role": "user", "content": user1},
        {"role": "assistant", "content": reply}, {"role": "user", "content": "next"}]});
    let v2: Value = c.post(&url).json(&turn2).send().await.unwrap().json().await.unwrap();
    let cached = v2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    // Prompt 1 + reply = ceil(len/4) tokens; every full block of it must hit.
    let seq_tokens = (p1.len() + reply.len()) as u64 / 4;
    assert_eq!(cached, seq_tokens / 16 * 16);
    s.stop().await;
}

#[tokio::test]
async fn bad_json_is_a_400_and_metrics_use_vllm_names() {
    let s = start().await;
    let c = reqwest::Client::new();
    let r = c.post(format!("http://{}/v1/chat/completions", s.addr())).body("{not json").send().await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("invalid chat completion request"));
    let body = json!({"model": "m", "prompt": tokens::filler_text(5, 64), "max_tokens": 2});
    c.post(format!("http://{}/v1/completions", s.addr())).json(&body).send().await.unwrap().bytes().await.unwrap();
    let m = c.get(format!("http://{}/metrics", s.addr())).send().await.unwrap().text().await.unwrap();
    for name in [
        "vllm:num_requests_running{",
        "vllm:num_requests_waiting{",
        "vllm:kv_cache_usage_perc{",
        "vllm:prefix_cache_queries_total{",
        "vllm:prefix_cache_hits_total{",
    ] {
        assert!(m.contains(name), "missing {name} in\n{m}");
    }
    assert!(m.contains("vllm:request_success_total{model_name=\"sim-model\"} 1"), "{m}");
    assert!(m.contains("vllm:prefix_cache_queries_total{model_name=\"sim-model\"} 64"), "{m}");
    assert!(m.contains("warmpath_sim:request_errors_total{model_name=\"sim-model\"} 1"), "{m}");
    s.stop().await;
}

#[tokio::test]
async fn batch_limit_queues_requests_and_gauges_return_to_zero() {
    let cfg = SimConfig {
        latency: LatencyProfile { time_scale: 0.01, max_num_seqs: 1, ..Default::default() },
        ..Default::default()
    };
    let s = SimServer::start(cfg, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let c = reqwest::Client::new();
    let url = format!("http://{}/v1/completions", s.addr());
    let reqs = (0..4).map(|i| {
        let body = json!({"model": "m", "prompt": tokens::filler_text(10 + i, 50), "max_tokens": 20});
        c.post(&url).json(&body).send()
    });
    for r in futures::future::join_all(reqs).await {
        assert_eq!(r.unwrap().status(), 200);
    }
    let m = c.get(format!("http://{}/metrics", s.addr())).send().await.unwrap().text().await.unwrap();
    assert!(m.contains("vllm:num_requests_running{model_name=\"sim-model\"} 0"), "{m}");
    assert!(m.contains("vllm:num_requests_waiting{model_name=\"sim-model\"} 0"), "{m}");
    assert!(m.contains("vllm:request_success_total{model_name=\"sim-model\"} 4"), "{m}");
    s.stop().await;
}

#[tokio::test]
async fn probe_reports_pending_prefill_while_it_runs_and_the_cached_prefix_after() {
    // 1 simulated ms per token at real time: 400 tokens of prefill keep the request in its prefill for 400 ms.
    let cfg = SimConfig {
        latency: LatencyProfile { prefill_ms_per_token: 1.0, overhead_ms: 0.0, itl_ms: 1.0, ..Default::default() },
        ..Default::default()
    };
    let s = SimServer::start(cfg, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let probe = s.probe();
    let prompt = tokens::filler_text(9, 400);
    assert_eq!(probe.truth(&prompt), warmpath_sim::ServerTruth { block_tokens: 16, ..Default::default() });
    let url = format!("http://{}/v1/completions", s.addr());
    let body = json!({"model": "m", "prompt": prompt, "max_tokens": 2});
    let req = tokio::spawn(reqwest::Client::new().post(url).json(&body).send());
    let during = until_truth(&probe, &prompt, |t| t.active_blocks > 0).await;
    assert_eq!(during.pending_prefill_tokens, 400, "the whole prompt is uncached and owed: {during:?}");
    assert_eq!(during.active_blocks, 25, "its 25 full blocks are pinned: {during:?}");
    assert_eq!(during.cached_blocks, 0, "blocks under prefill are not hittable yet: {during:?}");
    req.await.unwrap().unwrap().bytes().await.unwrap();
    let after = probe.truth(&prompt);
    // 400 tokens = 25 blocks; at least one token is recomputed, so 24 can hit.
    assert_eq!(
        (after.pending_prefill_tokens, after.waiting_prompt_tokens, after.active_blocks),
        (0, 0, 0),
        "{after:?}"
    );
    assert_eq!(after.cached_blocks, 24, "{after:?}");
    s.stop().await;
}

/// A server at real time with one prefill lane and 1 simulated ms per prompt token, no overhead: a 400-token
/// prompt holds the lane for 400 ms.
async fn start_one_lane() -> SimServer {
    let cfg = SimConfig {
        latency: LatencyProfile {
            prefill_ms_per_token: 1.0,
            overhead_ms: 0.0,
            itl_ms: 1.0,
            prefill_lanes: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    SimServer::start(cfg, "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

/// Polls `probe` for `prompt` until its truth satisfies `done`, for at most 5 s, and returns the last truth read (the
/// caller asserts what it needs).
async fn until_truth(
    probe: &warmpath_sim::SimProbe,
    prompt: &str,
    done: impl Fn(&warmpath_sim::ServerTruth) -> bool,
) -> warmpath_sim::ServerTruth {
    let start = std::time::Instant::now();
    loop {
        let t = probe.truth(prompt);
        if done(&t) || start.elapsed() > std::time::Duration::from_secs(5) {
            return t;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_request_queued_behind_another_prefill_counts_as_waiting() {
    // One prefill lane at real time, 1 simulated ms per token: the first 400-token prompt holds the lane for 400 ms,
    // so the second, sent while it prefills, has a batch slot but has not started its prefill (vLLM would still
    // list it in its waiting queue).
    let s = start_one_lane().await;
    let probe = s.probe();
    let c = reqwest::Client::new();
    let url = format!("http://{}/v1/completions", s.addr());
    let metrics = format!("http://{}/metrics", s.addr());
    let send = |seed: u64| {
        let body = json!({"model": "m", "prompt": tokens::filler_text(seed, 400), "max_tokens": 2});
        tokio::spawn(c.post(&url).json(&body).send())
    };
    let first = send(21);
    let start = std::time::Instant::now();
    until_truth(&probe, "", |t| t.pending_prefill_tokens > 0).await;
    let second = send(22);
    let during = loop {
        let m = c.get(&metrics).send().await.unwrap().text().await.unwrap();
        if probe.truth("").pending_prefill_tokens >= 800 || start.elapsed() > std::time::Duration::from_secs(5) {
            break m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    assert!(during.contains("vllm:num_requests_running{model_name=\"sim-model\"} 1"), "{during}");
    assert!(during.contains("vllm:num_requests_waiting{model_name=\"sim-model\"} 1"), "{during}");
    for r in [first, second] {
        r.await.unwrap().unwrap().bytes().await.unwrap();
    }
    let after = c.get(&metrics).send().await.unwrap().text().await.unwrap();
    assert!(after.contains("vllm:num_requests_running{model_name=\"sim-model\"} 0"), "{after}");
    assert!(after.contains("vllm:num_requests_waiting{model_name=\"sim-model\"} 0"), "{after}");
    s.stop().await;
}

#[tokio::test]
async fn a_request_queued_behind_the_same_prefix_hits_it_when_its_prefill_starts() {
    // One prefill lane at real time: the second copy of a 400-token prompt arrives while the first prefills. Its
    // hit is looked up when its own prefill starts, as vLLM's scheduler does for a waiting request, so it finds the
    // 24 full blocks the first computed; until then it owes its whole prompt.
    let s = start_one_lane().await;
    let probe = s.probe();
    let c = reqwest::Client::new();
    let url = format!("http://{}/v1/completions", s.addr());
    let body = json!({"model": "m", "prompt": tokens::filler_text(23, 400), "max_tokens": 2});
    let send = || {
        let req = c.post(&url).json(&body).send();
        tokio::spawn(async move { req.await.unwrap().json::<Value>().await.unwrap() })
    };
    let first = send();
    until_truth(&probe, "", |t| t.pending_prefill_tokens > 0).await;
    let second = send();
    until_truth(&probe, "", |t| t.pending_prefill_tokens >= 800).await;
    assert_eq!(probe.truth("").pending_prefill_tokens, 800, "both owe their whole prompt while the first prefills");
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert_eq!(cached(&first.await.unwrap()), 0);
    assert_eq!(cached(&second.await.unwrap()), 384, "24 full blocks computed by the request ahead");
    assert_eq!(probe.truth("").pending_prefill_tokens, 0);
    s.stop().await;
}
