//! Shared test servers: a real S3-compatible server (moto, Python) and a static HTTP server with range
//! support (tower-http `ServeDir`), both on 127.0.0.1 and killed on drop.
#![allow(dead_code, missing_docs)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// Repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// A `moto_server` child process; killed on drop.
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

impl Moto {
    /// Starts moto from the repo's `.venv` (installed by `scripts/test.d/60-agent.sh`).
    pub fn start() -> Moto {
        let bin = repo_root().join(".venv/bin/moto_server");
        assert!(
            bin.exists(),
            "{} missing: run scripts/test.d/60-agent.sh (installs moto[server] into .venv)",
            bin.display()
        );
        // moto binds a port of its own choosing (`-p 0`) and prints it; a port picked here and passed in could be
        // taken by another process before moto bound it.
        let mut child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads moto's log to the end (werkzeug logs every request there; a full pipe would stall it). Sends the
        // port from its "Running on http://127.0.0.1:PORT" line, or everything it said if it ended without one.
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut said = Vec::new();
            let mut sent = false;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if let (false, Some(rest)) = (sent, line.split("Running on http://127.0.0.1:").nth(1)) {
                    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    sent = tx.send(digits.parse::<u16>().map_err(|_| line.clone())).is_ok();
                } else if !sent {
                    said.push(line);
                }
            }
            if !sent {
                let _ = tx.send(Err(said.join("\n")));
            }
        });
        let port = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(port)) => port,
            failed => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("moto did not report its port: {failed:?}");
            }
        };
        let moto = Moto { child, endpoint: format!("http://127.0.0.1:{port}") };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto did not listen within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        // Credentials the S3 client signs with; moto accepts any.
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
        moto
    }

    /// Creates a bucket (moto accepts unsigned requests).
    pub async fn create_bucket(&self, bucket: &str) {
        let r = reqwest::Client::new().put(format!("{}/{bucket}", self.endpoint)).send().await.unwrap();
        assert!(r.status().is_success(), "create bucket: {}", r.status());
    }

    /// Uploads an object through a signed S3 client (moto makes objects private to their writer, so
    /// unsigned overwrites would be refused).
    pub async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) {
        use object_store::ObjectStoreExt;
        let store = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region("us-east-1")
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_access_key_id("testing")
            .with_secret_access_key("testing")
            .build()
            .unwrap();
        store.put(&object_store::path::Path::from(key), body.into()).await.unwrap();
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A static file server with Range support serving `dir`; stops when dropped.
pub struct RangeServer {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    task: tokio::task::JoinHandle<()>,
}

impl RangeServer {
    pub async fn start(dir: &Path) -> RangeServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new().fallback_service(tower_http::services::ServeDir::new(dir));
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        RangeServer { base, task }
    }
}

impl Drop for RangeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Deterministic pseudo-random bytes (xorshift) so content differs per seed and per offset.
pub fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Hex sha256 of bytes.
pub fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

/// How a [`SwitchServer`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// Serve the directory (Range, ETag, HEAD).
    Serve = 0,
    /// 429 Too Many Requests to everything (S3 / Hub throttling).
    Throttle = 1,
    /// Accept the request and never answer (a black-holed route).
    BlackHole = 2,
    /// 404 to everything (object deleted upstream).
    Gone = 3,
}

/// A Range-capable file server whose behaviour can be switched while it runs, counting every request it
/// receives; [`SwitchServer::stop`] closes the port (source down). Like S3 and the Hub it sends a strong
/// ETag (from the file's content, so rewriting a file changes it) and answers a GET whose `If-Match`
/// names another ETag with 412 Precondition Failed.
pub struct SwitchServer {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    mode: std::sync::Arc<std::sync::atomic::AtomicU8>,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl SwitchServer {
    pub async fn start(dir: &Path) -> SwitchServer {
        use std::sync::{atomic::Ordering, Arc};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let mode = Arc::new(std::sync::atomic::AtomicU8::new(Mode::Serve as u8));
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (m, n) = (mode.clone(), requests.clone());
        let root = dir.to_path_buf();
        let app = axum::Router::new().fallback_service(tower_http::services::ServeDir::new(dir)).layer(
            axum::middleware::from_fn(move |req: axum::extract::Request, next: axum::middleware::Next| {
                let (m, n, root) = (m.clone(), n.clone(), root.clone());
                async move {
                    use axum::response::IntoResponse;
                    n.fetch_add(1, Ordering::SeqCst);
                    match m.load(Ordering::SeqCst) {
                        1 => (axum::http::StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "slow down")
                            .into_response(),
                        2 => {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            axum::http::StatusCode::GATEWAY_TIMEOUT.into_response()
                        }
                        3 => axum::http::StatusCode::NOT_FOUND.into_response(),
                        _ => {
                            let file = root.join(req.uri().path().trim_start_matches('/'));
                            let etag = std::fs::read(&file).ok().map(|b| format!("\"{}\"", &sha256_hex(&b)[..16]));
                            let wanted =
                                req.headers().get("if-match").and_then(|v| v.to_str().ok()).map(str::to_string);
                            if let (Some(want), Some(tag)) = (&wanted, &etag) {
                                if want != "*" && want != tag {
                                    return axum::http::StatusCode::PRECONDITION_FAILED.into_response();
                                }
                            }
                            let mut resp = next.run(req).await;
                            if let Some(tag) = etag {
                                resp.headers_mut().insert("etag", tag.parse().unwrap());
                            }
                            resp
                        }
                    }
                }
            }),
        );
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        SwitchServer { base, mode, requests, task: Some(task) }
    }

    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, std::sync::atomic::Ordering::SeqCst);
    }

    /// Requests received so far (any mode).
    pub fn requests(&self) -> usize {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Closes the listening socket: connections are refused from now on.
    pub async fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for SwitchServer {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}
