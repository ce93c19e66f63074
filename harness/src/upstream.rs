//! A local stand-in for a model server: answers every request with a small OpenAI-style JSON body naming itself,
//! records what it received (bodies of any size: no server-side body limit, unlike axum's default 2 MB, so body
//! limits seen in tests are Envoy's, unless a test sets one), and can hold requests (to build up in-flight load)
//! or delay them, stream its answer as server-sent events one token at a time (as a model server streams a
//! completion), and be killed (listener closed, every open connection dropped mid-request, like a crashed
//! process) and restarted on the same address.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::IntoResponse;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// HTTP method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers, names lower-cased; repeated headers joined with ",".
    pub headers: BTreeMap<String, String>,
    /// Body length in bytes.
    pub body_len: usize,
}

impl Recorded {
    /// The value of header `name` (lower-case), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

struct Shared {
    addr: SocketAddr,
    requests: Mutex<Vec<Recorded>>,
    delay_ms: AtomicU64,
    /// With a value above 0: answers take one more ms per this many request-body bytes, like a server's prefill.
    body_bytes_per_ms: AtomicU64,
    /// `true` while requests are held; handlers wait for it to turn `false`.
    hold: watch::Sender<bool>,
    active: AtomicUsize,
    /// Streamed answers: events per answer (0: one JSON body) and the pause before each, µs.
    stream_events: AtomicUsize,
    stream_gap_us: AtomicU64,
    /// With a value above 0: a request declaring a longer body gets 413 without its body being read (see
    /// [`Upstream::set_body_limit`]).
    body_limit: AtomicU64,
}

/// A running upstream on 127.0.0.1; the server task is aborted on drop.
pub struct Upstream {
    shared: Arc<Shared>,
    /// The accept loop, which owns every connection task (aborting it drops them all).
    task: Mutex<Option<JoinHandle<()>>>,
}

/// Serves `app` on `listener` until aborted; connection tasks live in a `JoinSet` owned by this future, so aborting
/// it closes the listener and drops every open connection at once.
async fn serve(listener: tokio::net::TcpListener, app: axum::Router) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((socket, _)) = listener.accept().await else { continue };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        connections.spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let _ = builder.serve_connection(hyper_util::rt::TokioIo::new(socket), service).await;
        });
        while connections.try_join_next().is_some() {}
    }
}

impl Upstream {
    /// Binds 127.0.0.1:0 and serves on the current tokio runtime.
    pub async fn start() -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (hold, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            addr,
            requests: Mutex::new(Vec::new()),
            delay_ms: AtomicU64::new(0),
            body_bytes_per_ms: AtomicU64::new(0),
            hold,
            active: AtomicUsize::new(0),
            stream_events: AtomicUsize::new(0),
            stream_gap_us: AtomicU64::new(0),
            body_limit: AtomicU64::new(0),
        });
        let app = app(shared.clone());
        let task = tokio::spawn(serve(listener, app));
        Ok(Upstream { shared, task: Mutex::new(Some(task)) })
    }

    /// Kills the server: closes the listener and drops every open connection, in-flight requests included (their
    /// clients see a reset). Returns how many requests were in flight at that moment.
    pub fn kill(&self) -> usize {
        let active = self.active();
        if let Ok(mut task) = self.task.lock() {
            if let Some(t) = task.take() {
                t.abort();
            }
        }
        active
    }

    /// Serves again on the same address after [`Self::kill`] (no-op when running).
    pub async fn restart(&self) -> Result<()> {
        if self.task.lock().map(|t| t.is_some()).unwrap_or(true) {
            return Ok(());
        }
        let listener = tokio::net::TcpListener::bind(self.shared.addr).await?;
        let app = app(self.shared.clone());
        let task = tokio::spawn(serve(listener, app));
        if let Ok(mut t) = self.task.lock() {
            *t = Some(task);
        }
        Ok(())
    }

    /// Starts `n` upstreams.
    pub async fn start_many(n: usize) -> Result<Vec<Self>> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(Self::start().await?);
        }
        Ok(v)
    }

    /// The address Envoy should send to (also the endpoint name in the plugin config).
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// Everything received so far, in arrival order (recorded on arrival, before any hold or delay).
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// How many requests arrived so far.
    pub fn count(&self) -> usize {
        self.shared.requests.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// Forgets the recorded requests.
    pub fn clear(&self) {
        if let Ok(mut r) = self.shared.requests.lock() {
            r.clear();
        }
    }

    /// Requests currently being handled (arrived, not yet answered).
    pub fn active(&self) -> usize {
        self.shared.active.load(Ordering::SeqCst)
    }

    /// Delays every answer by `d` from now on.
    pub fn set_delay(&self, d: Duration) {
        self.shared.delay_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// From now on delays every answer, on top of [`Self::set_delay`], by the request body's length at `bytes_per_ms`
    /// (0 turns it off): the answer then comes after a time that grows with the prompt, as after a server's prefill.
    pub fn set_body_rate(&self, bytes_per_ms: u64) {
        self.shared.body_bytes_per_ms.store(bytes_per_ms, Ordering::SeqCst);
    }

    /// From now on answers as a stream of `events` server-sent events (`text/event-stream`, one token each, then
    /// `data: [DONE]`), each written `gap` after the previous one, so that a proxy reads each as its own chunk; 0
    /// events goes back to one JSON body.
    pub fn set_stream(&self, events: usize, gap: Duration) {
        self.shared.stream_gap_us.store(gap.as_micros() as u64, Ordering::SeqCst);
        self.shared.stream_events.store(events, Ordering::SeqCst);
    }

    /// From now on refuses a request whose `content-length` is above `bytes` (0 turns it off) as a server with an
    /// upload limit does: it answers 413 at once, leaves the body unread and closes the connection, so a proxy still
    /// sending the body usually sees the connection reset before the answer.
    pub fn set_body_limit(&self, bytes: u64) {
        self.shared.body_limit.store(bytes, Ordering::SeqCst);
    }

    /// Holds every request (arrived ones and new ones) until [`Self::release`].
    pub fn hold(&self) {
        self.shared.hold.send_replace(true);
    }

    /// Lets held requests finish.
    pub fn release(&self) {
        self.shared.hold.send_replace(false);
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.release();
        self.kill();
    }
}

/// The upstream's routes: every request goes to [`handle`], after the upload limit ([`refuse_oversized`]).
fn app(shared: Arc<Shared>) -> axum::Router {
    axum::Router::new()
        .fallback(handle)
        .layer(axum::middleware::from_fn_with_state(shared.clone(), refuse_oversized))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(shared)
}

/// Answers 413 to a request declaring a body longer than the limit of [`Upstream::set_body_limit`], before its body
/// is read; the request is not recorded.
async fn refuse_oversized(
    State(s): State<Arc<Shared>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let limit = s.body_limit.load(Ordering::SeqCst);
    let declared =
        request.headers().get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if limit > 0 && declared.is_some_and(|len| len > limit) {
        return (axum::http::StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response();
    }
    next.run(request).await
}

async fn handle(
    State(s): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let mut h = BTreeMap::new();
    for (k, v) in &headers {
        let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
        h.entry(k.as_str().to_string())
            .and_modify(|e: &mut String| {
                e.push(',');
                e.push_str(&v)
            })
            .or_insert(v);
    }
    let rec = Recorded { method: method.to_string(), path: uri.to_string(), headers: h, body_len: body.len() };
    if let Ok(mut r) = s.requests.lock() {
        r.push(rec);
    }
    s.active.fetch_add(1, Ordering::SeqCst);
    // Decrements `active` also when Envoy resets the upstream request and this future is dropped.
    let _active = ActiveGuard(s.clone());
    let mut hold = s.hold.subscribe();
    let _ = hold.wait_for(|held| !*held).await;
    let rate = s.body_bytes_per_ms.load(Ordering::SeqCst);
    let delay = s.delay_ms.load(Ordering::SeqCst) + (body.len() as u64).checked_div(rate).unwrap_or(0);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let events = s.stream_events.load(Ordering::SeqCst);
    if events > 0 {
        let gap = Duration::from_micros(s.stream_gap_us.load(Ordering::SeqCst));
        let chunks = futures::stream::unfold(0usize, move |i| async move {
            if i > events {
                return None;
            }
            tokio::time::sleep(gap).await;
            let event = if i == events {
                "data: [DONE]\n\n".to_string()
            } else {
                r#"data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"ok"}}]}"#
                    .to_string()
                    + "\n\n"
            };
            Some((Ok::<_, std::convert::Infallible>(Bytes::from(event)), i + 1))
        });
        let headers = [("content-type", "text/event-stream".to_string()), ("x-upstream", s.addr.to_string())];
        return (headers, axum::body::Body::from_stream(chunks)).into_response();
    }
    let body = format!(
        r#"{{"object":"chat.completion","upstream":"{}","choices":[{{"index":0,"message":{{"role":"assistant","content":"ok"}},"finish_reason":"stop"}}]}}"#,
        s.addr
    );
    ([("content-type", "application/json"), ("x-upstream", &s.addr.to_string())], body).into_response()
}

struct ActiveGuard(Arc<Shared>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn streamed_answers_carry_each_event_then_done() {
        let u = Upstream::start().await.expect("upstream");
        u.set_stream(3, Duration::from_millis(1));
        let r = reqwest::Client::new()
            .post(format!("http://{}/v1/chat/completions", u.addr()))
            .body("{}")
            .send()
            .await
            .expect("send");
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let body = r.text().await.expect("body");
        let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 4, "{body}");
        assert!(events[..3].iter().all(|e| e.starts_with("data: {") && e.contains("chat.completion.chunk")), "{body}");
        assert_eq!(events[3], "data: [DONE]");
        u.set_stream(0, Duration::ZERO);
        let r = reqwest::Client::new().post(format!("http://{}/x", u.addr())).send().await.expect("send");
        assert_eq!(r.headers()["content-type"], "application/json");
        assert_eq!(u.count(), 2);
    }
}
