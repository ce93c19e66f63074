//! The Hugging Face path (`hf-hub` for the repo listing, `object_store` ranged reads for the bytes)
//! against a local HTTP server shaped like the Hub API: `GET /api/models/{repo}/revision/{rev}` answers
//! the commit and file list, `/{repo}/resolve/{commit}/{file}` serves files with Range support and
//! requires the bearer token. (The real Hub is not reachable from this machine.)

mod common;

use std::{collections::BTreeMap, sync::Arc};

use axum::{
    extract::Request,
    http::StatusCode,
    middleware::{self, Next},
    response::Response,
    routing::get,
    Json, Router,
};
use common::{payload, sha256_hex};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use warmpath_agent::{source::SourceAuth, sync::sync_cache, CacheRequest, SourceSpec, SyncOptions};

const COMMIT: &str = "3f2a1c0d9e8b7a6f5e4d3c2b1a0f9e8d7c6b5a49";

async fn require_token(req: Request, next: Next) -> Result<Response, StatusCode> {
    match req.headers().get("authorization").and_then(|v| v.to_str().ok()) {
        Some("Bearer hf_test_token") => Ok(next.run(req).await),
        _ => Err(StatusCode::UNAUTHORIZED),
    }
}

async fn hub(files: &std::path::Path) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let info = serde_json::json!({
        "sha": COMMIT,
        "siblings": [{"rfilename": "config.json"}, {"rfilename": "model-00001-of-00001.safetensors"}],
    });
    let resolve = Router::new()
        .fallback_service(tower_http::services::ServeDir::new(files))
        .layer(middleware::from_fn(require_token));
    let app = Router::new()
        .route("/api/models/acme/tiny-llm/revision/main", get(move || async move { Json(info.clone()) }))
        .nest_service(&format!("/acme/tiny-llm/resolve/{COMMIT}"), resolve);
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, task)
}

#[tokio::test]
async fn hub_repo_is_pinned_to_its_commit_and_fetched_with_the_token() {
    let files = tempfile::tempdir().unwrap();
    let weights = payload(700 * 1024, 21);
    let config = br#"{"model_type":"llama"}"#.to_vec();
    std::fs::write(files.path().join("model-00001-of-00001.safetensors"), &weights).unwrap();
    std::fs::write(files.path().join("config.json"), &config).unwrap();
    let (base, server) = hub(files.path()).await;

    let root = tempfile::tempdir().unwrap();
    let mut o = SyncOptions::new(root.path());
    o.fetch.chunk_size = 128 * 1024;
    o.fetch.permits = Arc::new(Semaphore::new(4));
    o.reserve_bytes = 0;
    let req = CacheRequest {
        key: "ml.tiny".into(),
        source: SourceSpec::parse_uri(&format!("hf://acme/tiny-llm?revision=main&endpoint={base}")).unwrap(),
        sha256: BTreeMap::from([("model-00001-of-00001.safetensors".into(), sha256_hex(&weights))]),
        pin: None,
    };

    // Without the token the Hub refuses the files: a clear failure, nothing current.
    let err = sync_cache(&req, &o, &CancellationToken::new(), None).await.unwrap_err();
    assert_eq!(err.reason(), "SourceError", "{err}");
    assert!(!root.path().join("ml.tiny/current").exists());

    o.auth = SourceAuth { hf_token: Some("hf_test_token".into()) };
    let r = sync_cache(&req, &o, &CancellationToken::new(), None).await.unwrap();
    assert_eq!(r.files, 2);
    assert_eq!(r.bytes_total, (weights.len() + config.len()) as u64);
    let cur = root.path().join("ml.tiny/current");
    assert_eq!(std::fs::read(cur.join("model-00001-of-00001.safetensors")).unwrap(), weights);
    assert_eq!(std::fs::read(cur.join("config.json")).unwrap(), config);
    server.abort();
}
