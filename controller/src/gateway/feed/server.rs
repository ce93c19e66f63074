//! The controller's HTTP server (axum): the feed, the wasm module, health; and a separate
//! metrics listener.
//!
//! Routes:
//! - `GET /v1/feed/{kind}/{namespace}/{name}` → the feed's [`FeedSnapshot`] as JSON (404 if
//!   unknown); `kind` is `policy` or `httproute`.
//! - `POST /v1/feed/{kind}/{namespace}/{name}/index` → the gateway leg of the index exchange: the body's index
//!   records are kept, the answer carries the other gateways' records since the request's cursor and, when the
//!   report ends with the gateway's pending prefill work, the sum of the other gateways' (`warmpath_core::exchange`;
//!   404 for an unknown feed, 400 with the reason for a malformed report).
//! - `GET /wasm/{file}` → the filter module (`application/wasm`), only under its content-addressed
//!   name `warmpath_filter-<first 16 hex of sha256>.wasm`, so a gateway can never cache one build
//!   under another build's URL; Envoy Gateway / Istio also verify the sha256 we render.
//! - `GET /healthz` → `ok`.
//! - metrics listener: `GET /metrics` → OpenMetrics text.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use sha2::{Digest, Sha256};
use warmpath_core::exchange::{INDEX_PATH_SUFFIX, MAX_EXCHANGE_BODY_BYTES};
use warmpath_core::headers::{CURSOR_HEADER, FITS_HEADER, PENDING_HEADER, REPORTER_HEADER};

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
        .route(
            &format!("/v1/feed/{{kind}}/{{namespace}}/{{name}}{INDEX_PATH_SUFFIX}"),
            post(index_exchange).layer(DefaultBodyLimit::max(MAX_EXCHANGE_BODY_BYTES)),
        )
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

async fn index_exchange(
    State(st): State<AppState>,
    Path((kind, namespace, name)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = crate::routing::feed_key(&kind, &namespace, &name);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match st.store.index_exchange(&key, header(REPORTER_HEADER), header(CURSOR_HEADER), &body) {
        Some(Ok((records, cursor))) => {
            let headers = [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (HeaderName::from_static(CURSOR_HEADER), cursor.to_string()),
                (HeaderName::from_static(PENDING_HEADER), "1".to_string()),
                (HeaderName::from_static(FITS_HEADER), "1".to_string()),
            ];
            (headers, records).into_response()
        }
        Some(Err(e)) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feed::{FeedEndpoint, FeedSnapshot};

    async fn serve(app: Router) -> (String, tokio::task::JoinHandle<()>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", l.local_addr().unwrap());
        (
            base,
            tokio::spawn(async move {
                let _ = axum::serve(l, app).await;
            }),
        )
    }

    #[tokio::test]
    async fn serves_the_module_under_its_content_address_and_the_feed() {
        let blob = WasmBlob::new(b"\0asm\x01\0\0\0".to_vec());
        assert_eq!(blob.sha256, hex::encode(Sha256::digest(b"\0asm\x01\0\0\0")));
        assert!(blob.file_name.starts_with("warmpath_filter-") && blob.file_name.contains(&blob.sha256[..16]));
        let store = FeedStore::default();
        let version = store.update("policy/ns/p", vec![FeedEndpoint { address: "10.0.0.1:8000".into(), load: None }]);
        let (base, task) = serve(router(store, Some(blob.clone()))).await;
        let got = reqwest::get(format!("{base}{}", blob.path())).await.unwrap();
        assert_eq!(got.headers()[header::CONTENT_TYPE], "application/wasm");
        let bytes = got.bytes().await.unwrap();
        assert_eq!(hex::encode(Sha256::digest(&bytes)), blob.sha256, "served bytes match the rendered sha256");
        assert_eq!(
            reqwest::get(format!("{base}/wasm/warmpath_filter-0000000000000000.wasm")).await.unwrap().status(),
            404
        );
        let snap: FeedSnapshot =
            reqwest::get(format!("{base}/v1/feed/policy/ns/p")).await.unwrap().json().await.unwrap();
        assert_eq!((snap.version, snap.endpoints.len()), (version, 1));
        assert_eq!(reqwest::get(format!("{base}/v1/feed/policy/ns/q")).await.unwrap().status(), 404);
        assert_eq!(reqwest::get(format!("{base}/healthz")).await.unwrap().text().await.unwrap(), "ok");
        // The index exchange beside the feed: a gateway's records go to the others, never back to itself.
        let mut rec = Vec::new();
        warmpath_core::exchange::encode(&mut rec, 128, "10.0.0.1:8000", &[1, 2, 3]);
        let report = |who: &'static str, body: Vec<u8>, path: &'static str| {
            let url = format!("{base}{path}");
            async move {
                reqwest::Client::new()
                    .post(url)
                    .header(REPORTER_HEADER, who)
                    .header(CURSOR_HEADER, "0")
                    .body(body)
                    .send()
                    .await
                    .unwrap()
            }
        };
        let a = report("00000000000000aa", rec.clone(), "/v1/feed/policy/ns/p/index").await;
        assert_eq!(
            (a.status(), a.headers()[CURSOR_HEADER].to_str().unwrap().to_string()),
            (StatusCode::OK, "1".to_string())
        );
        assert_eq!(a.headers()[PENDING_HEADER], "1", "the gateways may send their pending work");
        assert!(a.bytes().await.unwrap().is_empty(), "its own record is not sent back");
        let b = report("00000000000000bb", Vec::new(), "/v1/feed/policy/ns/p/index").await;
        assert_eq!(b.bytes().await.unwrap().to_vec(), rec);
        // Pending prefill work: A's section reaches B in the answer to B's next report that carries one.
        use warmpath_core::exchange::{counts, push_count, split_report, PENDING_SECTION};
        let mut with_section = vec![PENDING_SECTION];
        push_count(&mut with_section, b"10.0.0.1:8000", 4096);
        assert_eq!(
            report("00000000000000aa", with_section, "/v1/feed/policy/ns/p/index").await.status(),
            StatusCode::OK
        );
        let b = report("00000000000000bb", vec![PENDING_SECTION], "/v1/feed/policy/ns/p/index")
            .await
            .bytes()
            .await
            .unwrap();
        let sections = split_report(&b);
        assert_eq!(sections.records, &rec[..]);
        assert_eq!(
            counts(sections.pending.expect("a section")).collect::<Vec<_>>(),
            vec![(&b"10.0.0.1:8000"[..], 4096)]
        );
        // Prefill-speed fits: A's reach B in the answer to B's next report that carries its own.
        use warmpath_core::exchange::push_fits;
        use warmpath_core::prefill_rate::PrefillFits;
        let mut fits = PrefillFits::default();
        for i in 0..20u32 {
            fits.observe("10.0.0.1:8000", 1_000 + i * 500, 2 + u64::from(i * 5), |_| true);
        }
        let (mut from_a, mut from_b) = (Vec::new(), Vec::new());
        push_fits(&mut from_a, &fits);
        push_fits(&mut from_b, &PrefillFits::default());
        let a = report("00000000000000aa", from_a, "/v1/feed/policy/ns/p/index").await;
        assert_eq!(a.status(), StatusCode::OK);
        assert_eq!(a.headers()[FITS_HEADER], "1", "the gateways may send their fits");
        let b = report("00000000000000bb", from_b, "/v1/feed/policy/ns/p/index").await.bytes().await.unwrap();
        let got = PrefillFits::from_bytes(split_report(&b).fits.expect("a fits section"));
        assert_eq!(got.to_bytes(), fits.to_bytes(), "B gets A's fits");
        assert_eq!(report("00000000000000bb", Vec::new(), "/v1/feed/policy/ns/q/index").await.status(), 404);
        assert_eq!(report("nope", Vec::new(), "/v1/feed/policy/ns/p/index").await.status(), 400);
        task.abort();
    }

    #[tokio::test]
    async fn takes_the_largest_report_a_gateway_sends() {
        use warmpath_core::exchange::{
            encode, push_count, push_fits, MAX_EXCHANGE_BODY_BYTES, MAX_REPORT_BYTES, PENDING_SECTION,
        };
        use warmpath_core::prefill_rate::{PrefillFits, PrefillRate};
        let store = FeedStore::default();
        store.update("policy/ns/p", vec![FeedEndpoint { address: "10.0.0.1:8000".into(), load: None }]);
        let (base, task) = serve(router(store, None)).await;
        // Records up to their bound, then fits and pending sections of MAX_ENDPOINTS long addresses: over 3 MiB
        // together, more than axum takes by default.
        let mut body = Vec::new();
        while body.len() < MAX_REPORT_BYTES - 100 {
            encode(&mut body, 128, "10.0.0.1:8000", &[1; 8]);
        }
        let long = |i: usize| format!("{}{i:05}:80", "h".repeat(245));
        let endpoints = (0..warmpath_core::config::MAX_ENDPOINTS).map(|i| (long(i), PrefillRate::default())).collect();
        push_fits(&mut body, &PrefillFits { pool: PrefillRate::default(), endpoints });
        body.push(PENDING_SECTION);
        for i in 0..warmpath_core::config::MAX_ENDPOINTS {
            push_count(&mut body, long(i).as_bytes(), 1);
        }
        assert!(body.len() > 3 << 20 && body.len() <= MAX_EXCHANGE_BODY_BYTES, "{} bytes", body.len());
        let got = reqwest::Client::new()
            .post(format!("{base}/v1/feed/policy/ns/p/index"))
            .header(REPORTER_HEADER, "00000000000000aa")
            .header(CURSOR_HEADER, "0")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(got.status(), StatusCode::OK, "{}", got.text().await.unwrap());
        task.abort();
    }
}
