//! The controller's HTTP server (axum): the feed, the wasm module, health; and a separate
//! metrics listener.
//!
//! Routes:
//! - `GET /v1/feed/{kind}/{namespace}/{name}` → the feed's [`FeedSnapshot`] as JSON (404 if
//!   unknown); `kind` is `policy` or `httproute`.
//! - `GET /wasm/{file}` → the filter module (`application/wasm`), only under its content-addressed
//!   name `warmpath_filter-<first 16 hex of sha256>.wasm`, so a gateway can never cache one build
//!   under another build's URL; Envoy Gateway / Istio also verify the sha256 we render.
//! - `GET /healthz` → `ok`.
//! - metrics listener: `GET /metrics` → OpenMetrics text.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};

use super::store::FeedStore;
#[cfg(doc)]
use super::FeedSnapshot;
use crate::metrics::Metrics;

/// The wasm filter module as served to gateways.
#[derive(Clone, Debug)]
pub struct WasmBlob {
    /// Module bytes.
    pub bytes: Bytes,
    /// Lower-case hex SHA-256 of `bytes`.
    pub sha256: String,
    /// Content-addressed file name under `/wasm/`.
    pub file_name: String,
}

impl WasmBlob {
    /// Wraps module bytes, computing the sha256 and file name.
    pub fn new(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let file_name = format!("warmpath_filter-{}.wasm", &sha256[..16]);
        Self { bytes, sha256, file_name }
    }

    /// URL path of the module on the controller.
    pub fn path(&self) -> String {
        format!("/wasm/{}", self.file_name)
    }
}

#[derive(Clone)]
struct AppState {
    store: FeedStore,
    wasm: Option<Arc<WasmBlob>>,
}

/// Router for the main HTTP port.
pub fn router(store: FeedStore, wasm: Option<WasmBlob>) -> Router {
    Router::new()
        .route("/v1/feed/{kind}/{namespace}/{name}", get(feed))
        .route("/wasm/{file}", get(wasm_module))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(AppState { store, wasm: wasm.map(Arc::new) })
}

/// Router for the metrics port.
pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let m = metrics.clone();
            async move {
                ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], m.encode())
            }
        }),
    )
}

async fn feed(State(st): State<AppState>, Path((kind, namespace, name)): Path<(String, String, String)>) -> Response {
    let key = crate::routing::feed_key(&kind, &namespace, &name);
    match st.store.get(&key) {
        Some(snap) => axum::Json(snap).into_response(),
        None => (StatusCode::NOT_FOUND, format!("no feed {key}\n")).into_response(),
    }
}

async fn wasm_module(State(st): State<AppState>, Path(file): Path<String>) -> Response {
    match st.wasm {
        Some(w) if w.file_name == file => {
            ([(header::CONTENT_TYPE, "application/wasm")], w.bytes.clone()).into_response()
        }
        _ => (StatusCode::NOT_FOUND, "no such module\n").into_response(),
    }
}
