//! A local endpoint/load feed server for the filter's poller: serves whatever snapshot document the test sets (one
//! per path if asked, for several feeds), keeps the gateway leg of the index exchange (`POST <path>/index`, a
//! [`RecordLog`] per feed path, as the controller does, with the pending work and fits the gateways report) unless told to
//! answer it with 404 like a server without it, and can be stopped (port closed) and restarted on the same port.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Result;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use tokio::task::JoinHandle;
use warmpath_core::exchange::{split_report, RecordLog, INDEX_PATH_SUFFIX, MAX_EXCHANGE_BODY_BYTES};
use warmpath_core::headers::{CURSOR_HEADER, FITS_HEADER, PENDING_HEADER, REPORTER_HEADER};

struct Shared {
    body: Mutex<String>,
    /// Snapshots served at a given path instead of `body` (several feeds behind one server).
    by_path: Mutex<HashMap<String, String>>,
    /// Snapshot requests (GET) answered, per path.
    hits_by_path: Mutex<HashMap<String, u64>>,
    /// The index exchange's record log of each feed path.
    logs: Mutex<HashMap<String, RecordLog>>,
    /// Answer the index exchange (else 404).
    exchange: AtomicBool,
    /// Keep and answer the gateways' pending sections and say so ([`PENDING_HEADER`]); else answer like a feed
    /// server without them (no header, and 400 to a report that carries one).
    pending: AtomicBool,
    /// The same for the fits sections ([`FITS_HEADER`]).
    fits: AtomicBool,
    /// The clock of the pending sections' freshness.
    started: Instant,
    /// Index exchange reports answered with 200.
    reports: AtomicU64,
}

/// A feed server on 127.0.0.1 answering every GET with the current snapshot JSON.
pub struct FeedServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
}

impl FeedServer {
    /// Binds 127.0.0.1:0 and serves `snapshot_json`.
    pub async fn start(snapshot_json: String) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            body: Mutex::new(snapshot_json),
            by_path: Mutex::new(HashMap::new()),
            hits_by_path: Mutex::new(HashMap::new()),
            logs: Mutex::new(HashMap::new()),
            exchange: AtomicBool::new(true),
            pending: AtomicBool::new(true),
            fits: AtomicBool::new(true),
            started: Instant::now(),
            reports: AtomicU64::new(0),
        });
        let mut s = FeedServer { addr, shared, task: None };
        s.serve(listener);
        Ok(s)
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let app = axum::Router::new()
            .fallback(answer)
            .layer(DefaultBodyLimit::max(MAX_EXCHANGE_BODY_BYTES))
            .with_state(self.shared.clone());
        self.task = Some(tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        }));
    }

    /// The address to put in the feed cluster.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the served snapshot.
    pub fn set_snapshot(&self, snapshot_json: String) {
        if let Ok(mut b) = self.shared.body.lock() {
            *b = snapshot_json;
        }
    }

    /// Serves `snapshot_json` to GETs of `path` (other paths keep the default snapshot).
    pub fn set_snapshot_at(&self, path: &str, snapshot_json: String) {
        if let Ok(mut m) = self.shared.by_path.lock() {
            m.insert(path.to_string(), snapshot_json);
        }
    }

    /// How many snapshot requests (GET) the feed answered so far.
    pub fn hits(&self) -> u64 {
        self.shared.hits_by_path.lock().map(|m| m.values().sum()).unwrap_or(0)
    }

    /// How many snapshot requests (GET) of `path` the feed answered so far.
    pub fn hits_at(&self, path: &str) -> u64 {
        self.shared.hits_by_path.lock().map(|m| m.get(path).copied().unwrap_or(0)).unwrap_or(0)
    }

    /// Keeps (`true`, the default) or refuses with 404 the gateway leg of the index exchange.
    pub fn set_index_exchange(&self, on: bool) {
        self.shared.exchange.store(on, Ordering::SeqCst);
    }

    /// Takes (`true`, the default) or not the pending sections, like a feed server without them: its answers lack
    /// [`PENDING_HEADER`] and a report with one is refused (400), so each gateway sees only its own pending work
    /// (the records, and the fits unless [`Self::set_fits_exchange`], are still exchanged).
    pub fn set_pending_exchange(&self, on: bool) {
        self.shared.pending.store(on, Ordering::SeqCst);
    }

    /// Takes (`true`, the default) or not the fits sections, like a feed server without them: its answers lack
    /// [`FITS_HEADER`] and a report with one is refused (400), so each gateway learns the servers' speeds from its
    /// own samples only.
    pub fn set_fits_exchange(&self, on: bool) {
        self.shared.fits.store(on, Ordering::SeqCst);
    }

    /// How many index exchange reports were answered with 200 so far.
    pub fn index_reports(&self) -> u64 {
        self.shared.reports.load(Ordering::SeqCst)
    }

    /// Closes the port: polls fail with connection refused until [`Self::restart`].
    pub async fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }

    /// Serves again on the same port.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await;
        let listener = tokio::net::TcpListener::bind(self.addr).await?;
        self.serve(listener);
        Ok(())
    }
}

impl Drop for FeedServer {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn answer(State(s): State<Arc<Shared>>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    if method == Method::POST {
        let Some(feed) = uri.path().strip_suffix(INDEX_PATH_SUFFIX) else {
            return StatusCode::NOT_FOUND.into_response();
        };
        if !s.exchange.load(Ordering::SeqCst) {
            return StatusCode::NOT_FOUND.into_response();
        }
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let mut logs = s.logs.lock().unwrap_or_else(|e| e.into_inner());
        let log = logs.entry(feed.to_string()).or_default();
        let takes_pending = s.pending.load(Ordering::SeqCst);
        let takes_fits = s.fits.load(Ordering::SeqCst);
        let sections = split_report(&body);
        if (!takes_pending && sections.pending.is_some()) || (!takes_fits && sections.fits.is_some()) {
            // What a feed server without sections answers to one (its record decoder does not know the byte).
            return (StatusCode::BAD_REQUEST, "index records rejected: unknown record version").into_response();
        }
        let now_ms = s.started.elapsed().as_millis() as u64;
        return match log.serve(header(REPORTER_HEADER), header(CURSOR_HEADER), &body, now_ms) {
            Ok((records, cursor)) => {
                s.reports.fetch_add(1, Ordering::SeqCst);
                let mut r = ([(CURSOR_HEADER, cursor.to_string())], records).into_response();
                for (header, takes) in [(PENDING_HEADER, takes_pending), (FITS_HEADER, takes_fits)] {
                    if takes {
                        r.headers_mut().insert(header, axum::http::HeaderValue::from_static("1"));
                    }
                }
                r
            }
            Err(e) => (StatusCode::BAD_REQUEST, e).into_response(),
        };
    }
    if let Ok(mut m) = s.hits_by_path.lock() {
        *m.entry(uri.path().to_string()).or_default() += 1;
    }
    let at_path = s.by_path.lock().ok().and_then(|m| m.get(uri.path()).cloned());
    let body = at_path.unwrap_or_else(|| s.body.lock().map(|b| b.clone()).unwrap_or_default());
    ([("content-type", "application/json")], body).into_response()
}
