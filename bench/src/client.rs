//! Sends one request over HTTP (streaming) and measures it: time to first token, end-to-end latency, the
//! server's `usage` (ground truth for cache hits), the server's own share of the time (the simulator's
//! `server_timing`) and the endpoint that answered (`x-sim-endpoint`).

use std::time::Instant;

use serde::Deserialize;
use warmpath_core::headers::DESTINATION_HEADER;
use warmpath_sim::api::{ServerTiming, SimExtras, Usage};
use warmpath_sim::ENDPOINT_HEADER;

/// What happened to one request. Times are wall-clock milliseconds.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Request id (position in the workload).
    pub id: usize,
    /// True when the response was a 2xx and the stream ended with `[DONE]`.
    pub ok: bool,
    /// HTTP status (0 when no response arrived).
    pub status: u16,
    /// Error text for failed requests.
    pub error: Option<String>,
    /// Send time, wall ms since the replay started.
    pub sent_ms: f64,
    /// Time to the first generated text, wall ms.
    pub ttft_ms: f64,
    /// Time to the end of the stream, wall ms.
    pub e2e_ms: f64,
    /// Server usage from the last stream chunk.
    pub usage: Usage,
    /// The server's own share of the time, from the last stream chunk (simulated servers only).
    pub server: Option<ServerTiming>,
    /// `IP:port` of the server that answered.
    pub endpoint: Option<String>,
    /// `IP:port` the harness's own router picked, for requests it routed (compared with `endpoint` to prove the
    /// pick was honoured on the way).
    pub picked: Option<String>,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(flatten)]
    extras: SimExtras,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
}

impl Chunk {
    fn has_text(&self) -> bool {
        self.choices.iter().any(|c| {
            c.text.as_deref().is_some_and(|t| !t.is_empty())
                || c.delta.as_ref().and_then(|d| d.content.as_deref()).is_some_and(|t| !t.is_empty())
        })
    }
}

/// Where a request goes: a URL, and for a request the harness routed itself, the server it picked. With a `via`
/// proxy the pick travels in [`DESTINATION_HEADER`] (Envoy's `override_host` policy sends the request there);
/// without one the request goes straight to the picked server.
#[derive(Debug, Clone)]
pub struct Destination {
    url: String,
    picked: Option<String>,
}

impl Destination {
    /// `base` + `path`, routed by whatever listens at `base` (the filter, a peer's router).
    pub fn routed_by(base: &str, path: &str) -> Destination {
        Destination { url: format!("{base}{path}"), picked: None }
    }

    /// The harness's own pick `picked` (`IP:port`): through the proxy at `via` (a base URL) with the pick in
    /// [`DESTINATION_HEADER`], or straight to it when `via` is `None`.
    pub fn picked(picked: String, via: Option<&str>, path: &str) -> Destination {
        let url = match via {
            Some(base) => format!("{base}{path}"),
            None => format!("http://{picked}{path}"),
        };
        Destination { url, picked: Some(picked) }
    }
}

/// POSTs `body` (a streaming OpenAI request) to `to` and reads the SSE stream to the end, calling
/// `on_first_token` once when the first generated text arrives (routers that track prefill work per server release
/// it then). Latencies count from `start`: when the request reached its router. For the harness's own routers that
/// is before their pick, so the time a pick takes is on the clock as the filter's decision inside Envoy is.
pub async fn send(
    client: &reqwest::Client,
    to: Destination,
    body: Vec<u8>,
    id: usize,
    sent_ms: f64,
    start: Instant,
    on_first_token: impl FnOnce(),
) -> Outcome {
    let mut on_first_token = Some(on_first_token);
    let mut out = Outcome { id, sent_ms, ..Default::default() };
    let mut req = client.post(&to.url).header("content-type", "application/json");
    if let Some(p) = &to.picked {
        req = req.header(DESTINATION_HEADER, p.as_str());
    }
    out.picked = to.picked;
    let resp = match req.body(body).send().await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(format!("request failed: {e}"));
            out.e2e_ms = ms(start);
            return out;
        }
    };
    out.status = resp.status().as_u16();
    out.endpoint = resp.headers().get(ENDPOINT_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
    if !resp.status().is_success() {
        let text = resp.text().await.unwrap_or_default();
        out.error = Some(format!("HTTP {}: {}", out.status, text.chars().take(200).collect::<String>()));
        out.e2e_ms = ms(start);
        return out;
    }
    let mut resp = resp;
    let mut buf: Vec<u8> = Vec::new();
    let mut done = false;
    loop {
        match resp.chunk().await {
            Ok(Some(bytes)) => {
                buf.extend_from_slice(&bytes);
                // Server-sent events: one `data: <json>` line per event, events separated by blank lines.
                while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=nl).collect();
                    let Some(data) = line.strip_prefix(b"data:") else { continue };
                    let data = data.trim_ascii();
                    if data == b"[DONE]" {
                        done = true;
                        continue;
                    }
                    match serde_json::from_slice::<Chunk>(data) {
                        Ok(c) => {
                            if out.ttft_ms == 0.0 && c.has_text() {
                                out.ttft_ms = ms(start);
                                if let Some(f) = on_first_token.take() {
                                    f();
                                }
                            }
                            if let Some(u) = c.usage {
                                out.usage = u;
                            }
                            if let Some(t) = c.extras.server_timing {
                                out.server = Some(t);
                            }
                        }
                        Err(e) => out.error = Some(format!("bad stream chunk: {e}")),
                    }
                }
            }
            Ok(None) => break,
            Err(e) => {
                out.error = Some(format!("stream broke: {e}"));
                break;
            }
        }
    }
    out.e2e_ms = ms(start);
    if !done && out.error.is_none() {
        out.error = Some("stream ended without [DONE]".into());
    }
    out.ok = done && out.error.is_none();
    out
}

impl Outcome {
    /// Time to first token in simulated ms at `time_scale`: see [`simulated_ms`].
    pub fn sim_ttft_ms(&self, time_scale: f64) -> f64 {
        simulated_ms(self.ttft_ms, self.server.map(|t| t.first_token_us), time_scale)
    }

    /// The part of the time to first token the server does not account for, wall ms: the client, the proxies and
    /// the router's pick on the way there, the network both ways (`None` without the server's timing). It is not
    /// scaled, so it is the same in simulated ms.
    pub fn ttft_outside_server_ms(&self) -> Option<f64> {
        self.server.map(|t| self.ttft_ms - server_share_ms(self.ttft_ms, t.first_token_us))
    }

    /// End-to-end latency in simulated ms at `time_scale`: see [`simulated_ms`].
    pub fn sim_e2e_ms(&self, time_scale: f64) -> f64 {
        simulated_ms(self.e2e_ms, self.server.map(|t| t.done_us), time_scale)
    }
}

/// A latency of `wall_ms` in simulated ms. A simulated server runs `1 / time_scale` times faster than the model
/// it stands for; the client, the proxy and the network do not. So only the server's own share (`server_us`, wall
/// µs, as it reports it) is scaled back, and the rest counts as it was measured: at time scale 0.1 a proxy's
/// 0.2 ms is 0.2 ms, not 2. Without the server's report the whole latency is scaled.
pub fn simulated_ms(wall_ms: f64, server_us: Option<u64>, time_scale: f64) -> f64 {
    let scale = time_scale.max(1e-9);
    match server_us {
        Some(us) => {
            let server_ms = server_share_ms(wall_ms, us);
            (wall_ms - server_ms) + server_ms / scale
        }
        None => wall_ms / scale,
    }
}

/// The server's reported share `server_us` of a latency of `wall_ms`, wall ms, capped at the client's own measure
/// (so the part outside the server is never negative).
fn server_share_ms(wall_ms: f64, server_us: u64) -> f64 {
    (server_us as f64 / 1000.0).min(wall_ms)
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use warmpath_sim::{LatencyProfile, SimConfig, SimServer};

    use super::*;

    /// Latencies count from the `start` the caller gives (for the harness's own routers, before their pick), not
    /// from when the request is sent.
    #[tokio::test]
    async fn latencies_count_from_the_given_start() {
        let latency = LatencyProfile { time_scale: 0.001, ..Default::default() };
        let server = SimServer::start(SimConfig { latency, ..Default::default() }, "127.0.0.1:0".parse().unwrap())
            .await
            .expect("sim server");
        let body = serde_json::json!({
            "model": "sim-model", "stream": true, "max_tokens": 2,
            "messages": [{"role": "user", "content": "hello"}],
        });
        let earlier = Duration::from_millis(600);
        let start = Instant::now().checked_sub(earlier).expect("an instant 600 ms ago");
        let to = Destination::routed_by(&format!("http://{}", server.addr()), "/v1/chat/completions");
        let out = send(&reqwest::Client::new(), to, body.to_string().into_bytes(), 0, 0.0, start, || {}).await;
        server.stop().await;
        assert!(out.ok, "{out:?}");
        assert!(out.ttft_ms >= 600.0, "TTFT {} ms counted from the send, not from the given start", out.ttft_ms);
        assert!(out.e2e_ms >= out.ttft_ms, "{out:?}");
        // The 600 ms before the send are not the server's: they count at wall speed, the server's share scaled.
        let timing = out.server.expect("the simulated server reports its share of the time");
        assert!(timing.first_token_us > 0 && timing.done_us >= timing.first_token_us, "{timing:?}");
        let sim = out.sim_ttft_ms(0.001);
        let server_ms = timing.first_token_us as f64 / 1000.0;
        assert!((sim - (out.ttft_ms - server_ms + server_ms * 1000.0)).abs() < 1e-6, "{sim} from {out:?}");
        assert!(sim >= 600.0 + 30.0, "600 ms at wall speed plus the server's 30 simulated ms of overhead: {sim}");
        // What the server does not account for is the path: here the 600 ms before the send and the hop.
        let outside = out.ttft_outside_server_ms().expect("timed");
        assert!((outside - (out.ttft_ms - server_ms)).abs() < 1e-9 && outside >= 600.0, "{outside} from {out:?}");
    }

    #[test]
    fn the_part_outside_the_server_needs_its_timing_and_is_never_negative() {
        let timed = |ttft_ms: f64, first_token_us: u64| Outcome {
            ttft_ms,
            server: Some(ServerTiming { first_token_us, done_us: first_token_us }),
            ..Default::default()
        };
        assert_eq!(timed(10.0, 4_000).ttft_outside_server_ms(), Some(6.0));
        assert_eq!(timed(1.0, 5_000).ttft_outside_server_ms(), Some(0.0));
        assert_eq!(Outcome { ttft_ms: 10.0, ..Default::default() }.ttft_outside_server_ms(), None);
    }

    #[test]
    fn only_the_servers_share_is_scaled() {
        // 10 wall ms, 4 of them the server's, at time scale 0.1: 6 ms outside the server plus 40 simulated ms.
        assert!((simulated_ms(10.0, Some(4_000), 0.1) - 46.0).abs() < 1e-9);
        // Without a report the whole latency is scaled, as for a server that does not report.
        assert!((simulated_ms(10.0, None, 0.1) - 100.0).abs() < 1e-9);
        // A report longer than the client's own measure is capped at it (nothing counts below zero).
        assert!((simulated_ms(1.0, Some(5_000), 0.1) - 10.0).abs() < 1e-9);
    }
}
