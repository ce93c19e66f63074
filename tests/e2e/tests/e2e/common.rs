//! Shared setup: N upstreams + Envoy with the filter, and request helpers.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};
use warmpath_core::prefill_rate::MAX_SLOPE_ERROR;
use warmpath_harness::{filter_wasm, EnvoyConfig, EnvoyProcess, Upstream, DEBUG_HEADER, RIG_DECISION_HEADER};

/// Envoy worker threads in every test (two, so that every test crosses workers: each worker has its own VM).
pub const CONCURRENCY: u32 = 2;

/// Upstreams plus an Envoy in front of them.
pub struct Rig {
    pub upstreams: Vec<Upstream>,
    pub envoy: EnvoyProcess,
    pub client: reqwest::Client,
}

impl Rig {
    /// `n` upstreams, Envoy with the filter configured by `extra` (merged into `{endpoints}`) and the rig headers.
    pub async fn start(n: usize, extra: Value) -> Rig {
        Self::start_with(n, extra, false).await
    }

    /// Like [`Rig::start`] with the listener served from an LDS file (for live reconfiguration).
    pub async fn start_dynamic(n: usize, extra: Value) -> Rig {
        Self::start_with(n, extra, true).await
    }

    /// Like [`Rig::start`] with `workers` Envoy worker threads instead of [`CONCURRENCY`].
    pub async fn start_workers(n: usize, extra: Value, workers: u32) -> Rig {
        Self::start_full(n, extra, false, workers).await
    }

    async fn start_with(n: usize, extra: Value, dynamic: bool) -> Rig {
        Self::start_full(n, extra, dynamic, CONCURRENCY).await
    }

    async fn start_full(n: usize, extra: Value, dynamic: bool, workers: u32) -> Rig {
        let upstreams = Upstream::start_many(n).await.expect("upstreams");
        let cfg = Self::config(&upstreams, extra);
        let envoy = if dynamic {
            EnvoyProcess::start_dynamic(cfg, workers).await
        } else {
            EnvoyProcess::start(cfg, workers).await
        }
        .expect("envoy starts");
        Rig { upstreams, envoy, client: client() }
    }

    /// An Envoy started from `cfg` (with [`CONCURRENCY`] workers) in front of `upstreams`, and a client.
    pub async fn launch(upstreams: Vec<Upstream>, cfg: EnvoyConfig) -> Rig {
        let envoy = EnvoyProcess::start(cfg, CONCURRENCY).await.expect("envoy");
        Rig { upstreams, envoy, client: client() }
    }

    /// Like [`Rig::launch`] with the listener served from an LDS file (for live reconfiguration).
    pub async fn launch_dynamic(upstreams: Vec<Upstream>, cfg: EnvoyConfig) -> Rig {
        let envoy = EnvoyProcess::start_dynamic(cfg, CONCURRENCY).await.expect("envoy");
        Rig { upstreams, envoy, client: client() }
    }

    /// Indexes of the upstreams that received requests since the last call, then clears their counts.
    pub fn used(&self) -> BTreeSet<usize> {
        let s = self.upstreams.iter().enumerate().filter(|(_, u)| u.count() > 0).map(|(i, _)| i).collect();
        self.upstreams.iter().for_each(Upstream::clear);
        s
    }

    /// The Envoy config for these upstreams with plugin config `extra`, with the rig headers (Envoy tells the test
    /// which backend answered and what the filter decided).
    pub fn config(upstreams: &[Upstream], extra: Value) -> EnvoyConfig {
        let addrs: Vec<_> = upstreams.iter().map(Upstream::addr).collect();
        let plugin = EnvoyConfig::plugin_json(&addrs, extra);
        EnvoyConfig::new(addrs, plugin).with_wasm(filter_wasm().expect("filter module")).with_rig_headers()
    }

    /// POSTs a chat completion whose single user message is `prompt`.
    pub async fn chat(&self, prompt: &str) -> Reply {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": prompt}]});
        self.post("/v1/chat/completions", body.to_string().into_bytes(), &[]).await
    }

    /// POSTs raw `body` to `path` with extra headers (bytes go with a `content-length`, a [`chunked`] body without).
    pub async fn post(&self, path: &str, body: impl Into<reqwest::Body>, headers: &[(&str, &str)]) -> Reply {
        let mut req = self.client.post(format!("{}{path}", self.envoy.url())).body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Reply::from(req.send().await.expect("request through envoy")).await
    }

    /// GETs `path`.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut req = self.client.get(format!("{}{path}", self.envoy.url()));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Reply::from(req.send().await.expect("request through envoy")).await
    }

    /// Index of the upstream with address `addr`.
    pub fn index_of(&self, addr: &str) -> Option<usize> {
        self.upstreams.iter().position(|u| u.addr().to_string() == addr)
    }

    /// Requests recorded per upstream.
    pub fn counts(&self) -> Vec<usize> {
        self.upstreams.iter().map(Upstream::count).collect()
    }

    /// Polls `/stats` until `pred` holds (up to 10 s); returns the last stats either way.
    pub async fn stats_until(&self, pred: impl Fn(&warmpath_harness::Stats) -> bool) -> warmpath_harness::Stats {
        let mut s = self.envoy.stats().await.expect("stats");
        for _ in 0..200 {
            if pred(&s) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            s = self.envoy.stats().await.expect("stats");
        }
        s
    }
}

/// The HTTP client of every rig (20 s timeout per request).
fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(20)).build().expect("client")
}

/// `body` as a stream of 64 KiB pieces, which reqwest sends with chunked transfer encoding: no declared length.
pub fn chunked(body: &[u8]) -> reqwest::Body {
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> = body.chunks(64 << 10).map(|c| Ok(c.to_vec())).collect();
    reqwest::Body::wrap_stream(futures::stream::iter(pieces))
}

/// POSTs to `envoy`'s `/v1/chat/completions` a chat body whose one user message is `size` bytes, with a
/// `content-length` or, when `chunked`, without one ([`chunked`]).
pub async fn post_prompt(client: &reqwest::Client, envoy: &EnvoyProcess, size: usize, chunked: bool) -> Reply {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "z".repeat(size)}]}).to_string();
    let request = client.post(format!("{}/v1/chat/completions", envoy.url()));
    let request = if chunked { request.body(self::chunked(body.as_bytes())) } else { request.body(body) };
    Reply::from(request.send().await.expect("request")).await
}

/// What a client got back.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// `x-upstream` response header: the upstream that answered.
    pub upstream: String,
    /// The filter's decision record as the rig's Envoy copies it from filter state (`x-rig-decision`,
    /// `<endpoint>;<reason>;matched=<n>`), empty when absent (no rig headers, or the filter placed nothing).
    pub decision: String,
    /// The filter's own debug header (`x-warmpath-decision`, `debug_header: true`), empty when absent.
    pub debug: String,
}

impl Reply {
    async fn from(r: reqwest::Response) -> Reply {
        let h = |n: &str| r.headers().get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let (status, upstream, decision, debug) =
            (r.status().as_u16(), h("x-upstream"), h(RIG_DECISION_HEADER), h(DEBUG_HEADER));
        let _ = r.bytes().await;
        Reply { status, upstream, decision, debug }
    }

    /// The reason part of the decision record.
    pub fn reason(&self) -> &str {
        self.decision.split(';').nth(1).unwrap_or("")
    }
}

/// How [`learn_prefill_speed`] sends its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connections {
    /// On the rig's pooled client (kept-alive connections: one Envoy worker sees them all).
    Pooled,
    /// Each on a connection of its own ([`post_fresh`]), which Envoy's workers take as they wake.
    Fresh,
}

/// Makes every upstream answer 5 ms plus 1 ms per 50 bytes of body after a request arrives, then sends `samples`
/// misses of different sizes one at a time: each finds its endpoint with nothing pending and, its distinct prefix
/// being shorter than `prefix_length`, is charged with its whole prompt — the samples PREFIX_AWARE learns the
/// pool's prefill speed from. Returns the stats once the `prefill.bytes_per_s` gauge reads 35,000–65,000 B/s and the
/// fit's `prefill.slope_error_ppm` is within the bound a speed needs.
pub async fn learn_prefill_speed(rig: &Rig, samples: usize, connections: Connections) -> warmpath_harness::Stats {
    for u in &rig.upstreams {
        u.set_delay(Duration::from_millis(5));
        u.set_body_rate(50);
    }
    for i in 0..samples {
        let text = prompt(&format!("speed {i}"), 1_000 + (i * 3_700) % 7_000);
        let status = match connections {
            Connections::Pooled => rig.chat(&text).await.status,
            Connections::Fresh => post_fresh(&rig.envoy, turn(&text, "go on")).await.0,
        };
        assert_eq!(status, 200);
    }
    // The tick writes the speed, then the fit's error: wait for both (jitter of a ms or more keeps the error above 0).
    let s = rig.stats_until(|s| s.filter("prefill.bytes_per_s") > 0 && s.filter("prefill.slope_error_ppm") > 0).await;
    let rate = s.filter("prefill.bytes_per_s");
    assert!((35_000..=65_000).contains(&rate), "{rate} bytes per s learned; the upstreams answer at 50,000");
    let error_ppm = s.filter("prefill.slope_error_ppm");
    assert!(error_ppm as f64 <= MAX_SLOPE_ERROR * 1e6, "a speed given from a fit with {error_ppm} ppm of slope error");
    s
}

/// The position of the first of `upstreams` handling exactly one request, polled every `every` (up to 200 times);
/// `None` when none did.
pub async fn upstream_with_one_request(upstreams: &[Upstream], every: Duration) -> Option<usize> {
    for _ in 0..200 {
        if let Some(i) = upstreams.iter().position(|u| u.active() == 1) {
            return Some(i);
        }
        tokio::time::sleep(every).await;
    }
    None
}

/// A prompt of about `len` characters that starts with `seed` (distinct seeds → distinct prefixes).
pub fn prompt(seed: &str, len: usize) -> String {
    let mut s = format!("{seed}: ");
    let mut i = 0u64;
    while s.len() < len {
        s.push_str(&format!("{seed} sentence {i} about caches and prefixes. "));
        i += 1;
    }
    s.truncate(len);
    s
}

/// A chat body of a conversation's later turn: its first exchange (`history`, then the assistant's "Noted."), then
/// `question`.
pub fn turn(history: &str, question: &str) -> Vec<u8> {
    json!({"model": "m", "messages": [
        {"role": "user", "content": history},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": question},
    ]})
    .to_string()
    .into_bytes()
}

/// POSTs a chat `body` through `envoy` on a connection of its own (a fresh client, closed after the answer), as
/// separate users or a reconnecting client do; returns the status and the upstream that answered.
pub async fn post_fresh(envoy: &EnvoyProcess, body: Vec<u8>) -> (u16, String) {
    post_fresh_to(envoy.url(), body).await
}

/// [`post_fresh`] from a task of its own, to the Envoy listening at `url`.
pub fn spawn_post(url: String, body: Vec<u8>) -> Sent {
    tokio::spawn(post_fresh_to(url, body))
}

async fn post_fresh_to(url: String, body: Vec<u8>) -> (u16, String) {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().expect("client");
    let r = client
        .post(format!("{url}/v1/chat/completions"))
        .header("connection", "close")
        .body(body)
        .send()
        .await
        .expect("request through envoy");
    let status = r.status().as_u16();
    let upstream = r.headers().get("x-upstream").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let _ = r.bytes().await;
    (status, upstream)
}

/// A request sent from a task: its status and the upstream that answered.
pub type Sent = tokio::task::JoinHandle<(u16, String)>;

/// Puts prefill work in front of `upstream`, which the caller holds: starts the requests `send(i)` makes, one every
/// 100 ms, until one of them waits there, then waits until every request started so far has either been answered
/// by another upstream or waits there too (one still on its way would otherwise arrive later and count as a later
/// request). Returns the requests and how many wait at `upstream` (at least one, asserted). Fails when the requests
/// have not settled so after 10 s: counting then would count a request still on its way.
pub async fn hold_filler(upstream: &Upstream, mut send: impl FnMut(usize) -> Sent) -> (Vec<Sent>, usize) {
    let mut filler = Vec::new();
    for i in 0..30 {
        filler.push(send(i));
        tokio::time::sleep(Duration::from_millis(100)).await;
        if upstream.active() >= 1 {
            break;
        }
    }
    let unsettled = |filler: &[Sent]| {
        filler.len().saturating_sub(filler.iter().filter(|h| h.is_finished()).count() + upstream.active())
    };
    for _ in 0..200 {
        if unsettled(&filler) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = unsettled(&filler);
    assert_eq!(
        left,
        0,
        "{left} of {} filler requests neither answered nor waiting at the held upstream after 10 s",
        filler.len()
    );
    let waiting = upstream.active();
    assert!(waiting >= 1, "none of {} filler requests reached the held upstream", filler.len());
    (filler, waiting)
}
