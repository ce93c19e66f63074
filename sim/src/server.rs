//! The axum app of the simulated server and [`SimServer`], which runs it on a loopback port.
//!
//! A request's life: parse (400 with an OpenAI-style error on bad input) → wait for a batch slot → admit into the
//! prefix cache (hit = longest computed prefix) → overhead → prefill lane → first token → one token per `itl_ms`
//! → cache the generated blocks → release. The simulation runs in its own task, so a client that disconnects
//! never leaves blocks pinned or gauges off.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::{Listener, ListenerExt};
use axum::{Json, Router};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::api::{ChatRequest, CompletionRequest, Prompt, PromptTokensDetails, ServerTiming, SimExtras, Usage};
use crate::cache::PrefixCache;
use crate::latency::LatencyProfile;
use crate::metrics::Metrics;
use crate::tokens::{block_hashes, chat_prompt, reply_text, token_count};

/// Response header naming the server (`IP:port`) that answered; the benchmark's per-endpoint ground truth.
pub const ENDPOINT_HEADER: &str = "x-sim-endpoint";

/// Configuration of one simulated server.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Prefix-cache capacity in blocks. Default 8192 blocks (131,072 tokens at 16 tokens per block).
    pub cache_blocks: usize,
    /// Tokens per cache block (vLLM default 16).
    pub block_tokens: usize,
    /// Latency model.
    pub latency: LatencyProfile,
    /// Model name reported in `/metrics` and responses.
    pub model: String,
    /// Output tokens when a request sets no `max_tokens`. Default 16 (OpenAI completions default).
    pub default_max_tokens: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            cache_blocks: 8192,
            block_tokens: 16,
            latency: LatencyProfile::default(),
            model: "sim-model".into(),
            default_max_tokens: 16,
        }
    }
}

struct AppState {
    cfg: SimConfig,
    name: HeaderValue,
    cache: Mutex<PrefixCache>,
    metrics: Metrics,
    batch: Arc<Semaphore>,
    prefill: Option<Arc<Semaphore>>,
    /// Prompt tokens of requests waiting for a batch slot (not yet admitted into the cache).
    waiting_prompt_tokens: AtomicU64,
    /// Uncached prompt tokens of requests with a batch slot whose prefill has not finished: until the prefill
    /// starts, what the cache lacked when the request got its slot; from then, what it lacked at the start.
    pending_prefill_tokens: AtomicU64,
}

type Shared = Arc<AppState>;

/// What one server truly holds and owes at one instant, for exact-state reference routing: read in-process
/// through [`SimProbe`], never over HTTP, so it costs no simulated time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerTruth {
    /// Leading blocks of the probed prompt that are computed in this server's cache now, capped as an admission
    /// would cap them (at least one prompt token is always recomputed).
    pub cached_blocks: usize,
    /// Uncached prompt tokens of requests with a batch slot still waiting for or running their prefill (for one
    /// still waiting, counted against the cache as it was when it got its slot).
    pub pending_prefill_tokens: u64,
    /// Prompt tokens of requests waiting for a batch slot (their cache hit is not known yet).
    pub waiting_prompt_tokens: u64,
    /// Cache blocks pinned by running requests (vLLM's active KV blocks).
    pub active_blocks: usize,
    /// Tokens per cache block.
    pub block_tokens: usize,
}

/// A read-only handle on one running server's cache and queue (cheap to clone).
#[derive(Clone)]
pub struct SimProbe(Shared);

impl std::fmt::Debug for SimProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SimProbe").field(&self.0.name).finish()
    }
}

impl SimProbe {
    /// The server's true state for a request whose rendered prompt (the text the server tokenizes, see
    /// [`crate::tokens::chat_prompt`]) is `prompt`.
    pub fn truth(&self, prompt: &str) -> ServerTruth {
        let s = &self.0;
        let hashes = block_hashes(prompt.as_bytes(), s.cfg.block_tokens);
        let c = s.cache.lock().unwrap_or_else(|e| e.into_inner());
        ServerTruth {
            cached_blocks: c.hit_blocks(&hashes, token_count(prompt.len())),
            pending_prefill_tokens: s.pending_prefill_tokens.load(Ordering::Relaxed),
            waiting_prompt_tokens: s.waiting_prompt_tokens.load(Ordering::Relaxed),
            active_blocks: c.pinned(),
            block_tokens: c.block_tokens(),
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

/// What the simulation task reports to the handler.
enum Step {
    /// Generated text (the first one marks the first token).
    Text(String),
    /// Finished, with usage and the server's own share of the time.
    Done(Usage, ServerTiming),
}

/// Builds the axum router for one simulated server named `name` (its `IP:port`).
pub fn app(cfg: SimConfig, name: &str) -> Router {
    router(state(cfg, name))
}

fn state(cfg: SimConfig, name: &str) -> Shared {
    Arc::new(AppState {
        cache: Mutex::new(PrefixCache::new(cfg.cache_blocks, cfg.block_tokens)),
        metrics: Metrics::new(&cfg.model),
        batch: Arc::new(Semaphore::new(cfg.latency.max_num_seqs.max(1))),
        prefill: (cfg.latency.prefill_lanes > 0).then(|| Arc::new(Semaphore::new(cfg.latency.prefill_lanes))),
        name: HeaderValue::from_str(name).unwrap_or(HeaderValue::from_static("sim")),
        waiting_prompt_tokens: AtomicU64::new(0),
        pending_prefill_tokens: AtomicU64::new(0),
        cfg,
    })
}

fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "ok" }))
        .with_state(state)
}

async fn metrics(State(s): State<Shared>) -> Response {
    let mut r = s.metrics.encode().into_response();
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"));
    r
}

async fn models(State(s): State<Shared>) -> Json<serde_json::Value> {
    Json(json!({"object": "list", "data": [{"id": s.cfg.model, "object": "model", "owned_by": "warmpath-sim"}]}))
}

fn bad_request(s: &AppState, msg: String) -> Response {
    s.metrics.request_errors.inc();
    let mut r = (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": {"message": msg, "type": "invalid_request_error", "code": 400}})),
    )
        .into_response();
    r.headers_mut().insert(ENDPOINT_HEADER, s.name.clone());
    r
}

async fn chat(State(s): State<Shared>, body: Bytes) -> Response {
    let req: ChatRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&s, format!("invalid chat completion request: {e}")),
    };
    let texts: Vec<(String, String)> = req
        .messages
        .iter()
        .map(|m| (m.role.clone(), m.content.as_ref().map(|c| c.text()).unwrap_or_default()))
        .collect();
    let prompt = chat_prompt(texts.iter().map(|(r, c)| (r.as_str(), c.as_str())));
    let max_tokens = req.max_completion_tokens.or(req.max_tokens).unwrap_or(s.cfg.default_max_tokens);
    let usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    respond(s, Kind::Chat, req.model, prompt, max_tokens, req.stream, usage).await
}

async fn completions(State(s): State<Shared>, body: Bytes) -> Response {
    let req: CompletionRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&s, format!("invalid completion request: {e}")),
    };
    let prompt = match req.prompt {
        Prompt::Text(t) => t,
        Prompt::Many(v) => v.concat(),
    };
    let max_tokens = req.max_tokens.unwrap_or(s.cfg.default_max_tokens);
    let usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    respond(s, Kind::Completion, req.model, prompt, max_tokens, req.stream, usage).await
}

fn chunk(
    kind: Kind,
    id: &str,
    model: &str,
    created: u64,
    text: Option<&str>,
    finish: Option<&str>,
) -> serde_json::Value {
    match kind {
        Kind::Chat => json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": text.map_or(json!({}), |t| json!({"role": "assistant", "content": t})),
                         "finish_reason": finish}]
        }),
        Kind::Completion => json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text.unwrap_or(""), "finish_reason": finish}]
        }),
    }
}

async fn respond(
    s: Shared,
    kind: Kind,
    model: String,
    prompt: String,
    max_tokens: u32,
    stream: bool,
    include_usage: bool,
) -> Response {
    // The whole request has been read: the server's share of its time starts here.
    let received = Instant::now();
    let (tx, mut rx) = mpsc::channel::<Step>(64);
    tokio::spawn(simulate(s.clone(), prompt, max_tokens.max(1) as usize, received, tx));
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let id = format!("sim-{created}-{:x}", rand_id());
    let mut resp = if stream {
        // State: (receiver, 0 = streaming, 1 = send `[DONE]` next, 2 = finished).
        let stream = futures::stream::unfold((rx, 0u8), move |(mut rx, stage)| {
            let (id, model) = (id.clone(), model.clone());
            async move {
                match stage {
                    1 => return Some((Ok::<_, Infallible>(Event::default().data("[DONE]")), (rx, 2))),
                    2 => return None,
                    _ => {}
                }
                let ev = match rx.recv().await {
                    Some(Step::Text(t)) => {
                        Event::default().data(chunk(kind, &id, &model, created, Some(&t), None).to_string())
                    }
                    Some(Step::Done(u, timing)) => {
                        let mut last = chunk(kind, &id, &model, created, None, Some("length"));
                        if include_usage {
                            last["usage"] = serde_json::to_value(u).unwrap_or_default();
                        }
                        add_extras(&mut last, timing);
                        return Some((Ok(Event::default().data(last.to_string())), (rx, 1)));
                    }
                    None => return None,
                };
                Some((Ok(ev), (rx, 0)))
            }
        });
        Sse::new(stream).into_response()
    } else {
        let mut text = String::new();
        let mut usage = Usage::default();
        let mut timing = None;
        while let Some(step) = rx.recv().await {
            match step {
                Step::Text(t) => text.push_str(&t),
                Step::Done(u, t) => (usage, timing) = (u, Some(t)),
            }
        }
        let mut body = match kind {
            Kind::Chat => json!({
                "id": id, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                "usage": usage,
            }),
            Kind::Completion => json!({
                "id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": usage,
            }),
        };
        if let Some(timing) = timing {
            add_extras(&mut body, timing);
        }
        Json(body).into_response()
    };
    resp.headers_mut().insert(ENDPOINT_HEADER, s.name.clone());
    resp
}

/// Puts the simulator's own fields ([`SimExtras`]) beside the OpenAI ones of a response body or its last chunk.
fn add_extras(body: &mut serde_json::Value, timing: ServerTiming) {
    let extras = SimExtras { server_timing: Some(timing) };
    if let (Some(body), Ok(serde_json::Value::Object(extras))) = (body.as_object_mut(), serde_json::to_value(extras)) {
        body.extend(extras);
    }
}

fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Runs one request through the batch limit, cache, prefill lane and decode, sending text and usage to `tx`.
async fn simulate(s: Shared, prompt: String, max_tokens: usize, received: Instant, tx: mpsc::Sender<Step>) {
    let lat = &s.cfg.latency;
    let prompt_tokens = token_count(prompt.len());
    s.metrics.waiting.inc();
    s.waiting_prompt_tokens.fetch_add(prompt_tokens, Ordering::Relaxed);
    let slot = s.batch.clone().acquire_owned().await;
    s.waiting_prompt_tokens.fetch_sub(prompt_tokens, Ordering::Relaxed);
    let Ok(_slot) = slot else {
        s.metrics.waiting.dec();
        return;
    };
    // Still `waiting` in the gauges until its prefill starts: vLLM's scheduler keeps a request in its waiting queue
    // until a step schedules its first prompt tokens, which a long prefill ahead of it (holding the step's token
    // budget) delays (`vllm/v1/core/sched/scheduler.py`). A request with a batch slot that waits for the prefill
    // lane is that request.
    let start = Instant::now();

    let hashes = block_hashes(prompt.as_bytes(), s.cfg.block_tokens);
    // Until its prefill starts the request's work is what the cache holds of its prompt now; the hit itself is
    // decided when the prefill starts, as vLLM's scheduler looks up a waiting request's computed blocks when it
    // schedules it (`vllm/v1/core/sched/scheduler.py`, `get_computed_blocks`): a prefix computed by a request ahead
    // in the queue is a hit by then.
    let expected = {
        let c = s.cache.lock().unwrap_or_else(|e| e.into_inner());
        prompt_tokens - c.hit_tokens(&hashes, prompt_tokens)
    };
    s.pending_prefill_tokens.fetch_add(expected, Ordering::Relaxed);

    lat.sleep(lat.overhead_ms).await;
    let (mut alloc, cached);
    {
        let _lane = match &s.prefill {
            Some(sem) => sem.clone().acquire_owned().await.ok(),
            None => None,
        };
        // The hit and the pending prefill work change under one lock, so a probe never sees one without the other.
        (alloc, cached) = {
            let mut c = s.cache.lock().unwrap_or_else(|e| e.into_inner());
            let a = c.admit(&hashes, prompt_tokens);
            s.metrics.kv_usage.set(c.usage());
            let cached = ((a.hit_blocks * s.cfg.block_tokens) as u64).min(prompt_tokens);
            s.pending_prefill_tokens.fetch_sub(expected, Ordering::Relaxed);
            s.pending_prefill_tokens.fetch_add(prompt_tokens - cached, Ordering::Relaxed);
            (a, cached)
        };
        s.metrics.prefix_queries.inc_by(prompt_tokens);
        s.metrics.prefix_hits.inc_by(cached);
        s.metrics.prompt_tokens.inc_by(prompt_tokens);
        s.metrics.waiting.dec();
        s.metrics.running.inc();
        lat.sleep(lat.prefill_ms(prompt_tokens - cached)).await;
    }
    {
        let mut c = s.cache.lock().unwrap_or_else(|e| e.into_inner());
        c.mark_ready(&alloc.blocks);
        s.pending_prefill_tokens.fetch_sub(prompt_tokens - cached, Ordering::Relaxed);
    }
    let first = Instant::now();
    let first_token_us = (first - received).as_micros() as u64;
    s.metrics.ttft_seconds.observe((first - start).as_secs_f64() / lat.time_scale.max(1e-9));

    // Decode: token k (0-based) is due at first + k·itl; send whatever is due at each wake-up, waking at most
    // every millisecond of wall time so fast time scales do not spin.
    let reply = reply_text(&prompt, max_tokens);
    let step = lat.wall(lat.itl_ms);
    let mut sent = 0usize;
    let mut aborted = false;
    while sent < max_tokens {
        let due = if step.is_zero() {
            max_tokens
        } else {
            ((first.elapsed().as_secs_f64() / step.as_secs_f64()) as usize + 1).min(max_tokens)
        };
        if due > sent {
            let text = reply[sent * 4..due * 4].to_string();
            sent = due;
            if tx.send(Step::Text(text)).await.is_err() {
                aborted = true;
                break;
            }
        }
        if sent < max_tokens {
            let next = first + step.mul_f64(sent as f64);
            let next = next.max(Instant::now() + std::time::Duration::from_millis(1));
            tokio::time::sleep_until(next.into()).await;
        }
    }

    // Cache the generated blocks (sequence = prompt + reply), then release everything.
    let usage = {
        let mut c = s.cache.lock().unwrap_or_else(|e| e.into_inner());
        if !aborted {
            let seq = format!("{prompt}{reply}");
            let all = block_hashes(seq.as_bytes(), s.cfg.block_tokens);
            let extra = &all[hashes.len().min(all.len())..];
            c.pin_more(&mut alloc, extra);
            c.mark_ready(extra);
        }
        c.release(alloc);
        s.metrics.kv_usage.set(c.usage());
        Usage {
            prompt_tokens,
            completion_tokens: sent as u64,
            total_tokens: prompt_tokens + sent as u64,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: cached },
        }
    };
    s.metrics.running.dec();
    s.metrics.generation_tokens.inc_by(sent as u64);
    if !aborted {
        s.metrics.request_success.inc();
        let timing = ServerTiming { first_token_us, done_us: received.elapsed().as_micros() as u64 };
        let _ = tx.send(Step::Done(usage, timing)).await;
    }
}

/// `listener` with TCP_NODELAY set on every accepted connection, as vLLM's and SGLang's servers have it (asyncio
/// sets it on every TCP transport). Without it Nagle's algorithm holds the first streamed chunk, written right after
/// the response headers, until the proxy acknowledges the headers, which a delayed ACK puts off for up to 40 ms:
/// about a third of the requests then took 40 ms of wall time more to their first token.
fn no_delay(listener: TcpListener) -> impl Listener<Io = TcpStream, Addr = SocketAddr> {
    listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    })
}

/// One simulated server listening on a loopback port; shut down on [`SimServer::stop`] or drop.
#[derive(Debug)]
pub struct SimServer {
    addr: SocketAddr,
    probe: SimProbe,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl SimServer {
    /// Binds `addr` (use port 0 for any free port; only loopback addresses are accepted) and serves in a task.
    ///
    /// Errors: a non-loopback address, or the bind failure.
    pub async fn start(cfg: SimConfig, addr: SocketAddr) -> std::io::Result<Self> {
        if !addr.ip().is_loopback() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{addr} is not a loopback address"),
            ));
        }
        let listener = TcpListener::bind(addr).await?;
        Self::serve(cfg, listener)
    }

    /// Serves on an already bound listener.
    pub fn serve(cfg: SimConfig, listener: TcpListener) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let shared = state(cfg, &addr.to_string());
        let probe = SimProbe(shared.clone());
        let app = router(shared);
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            let _ = axum::serve(no_delay(listener), app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(Self { addr, probe, shutdown: Some(tx), task: Some(task) })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle on this server's true cache and queue state (stays valid after the server stops).
    pub fn probe(&self) -> SimProbe {
        self.probe.clone()
    }

    /// Stops accepting, aborts in-flight connections, and waits for the server task.
    pub async fn stop(mut self) {
        if let Some(t) = self.shutdown.take() {
            let _ = t.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_connections_have_no_delay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let mut listener = no_delay(listener);
        let _client = TcpStream::connect(addr).await.expect("connect");
        let (accepted, _) = listener.accept().await;
        assert!(accepted.nodelay().expect("socket option"), "an accepted connection left Nagle's algorithm on");
    }
}
