//! Where the harness finds Envoy and the filter module, and how it picks loopback ports.

use std::net::TcpListener;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

/// The workspace root (the parent of this crate's manifest directory).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}

/// The Envoy binary: `$WARMPATH_ENVOY`, else `<workspace>/.venv/bin/envoy` (installed by `scripts/setup.sh`).
///
/// Errors when the file does not exist, naming the setup command.
pub fn envoy_binary() -> Result<PathBuf> {
    let path = std::env::var_os("WARMPATH_ENVOY")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/envoy"));
    if !path.exists() {
        bail!("Envoy not found at {} (run scripts/setup.sh, or set WARMPATH_ENVOY)", path.display());
    }
    Ok(path)
}

/// The release wasm module of the filter: `$WARMPATH_FILTER_WASM`, else
/// `$CARGO_TARGET_DIR/wasm32-wasip1/release/warmpath_filter.wasm` (default target dir `<workspace>/target`).
///
/// Errors when the module has not been built, naming the build command.
pub fn filter_wasm() -> Result<PathBuf> {
    let path = match std::env::var_os("WARMPATH_FILTER_WASM") {
        Some(p) => PathBuf::from(p),
        None => {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace_root().join("target"));
            target.join("wasm32-wasip1/release/warmpath_filter.wasm")
        }
    };
    if !path.exists() {
        bail!(
            "filter module not found at {}: build it with `cargo build -p warmpath-filter --target wasm32-wasip1 --release` \
             (or set WARMPATH_FILTER_WASM)",
            path.display()
        );
    }
    path.canonicalize().with_context(|| format!("resolving {}", path.display()))
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released).
///
/// Another process (a test running in parallel) can take it before the process it was picked for binds it. Starts
/// that pick ports this way try again with new ones when [`port_was_taken`] says so, up to [`PORT_ATTEMPTS`] times.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Starts tried when a process could not bind a port [`free_port`] picked for it.
pub const PORT_ATTEMPTS: usize = 3;

/// What Envoy, smg and vllm-router log when a port they should listen on is taken (the text of `EADDRINUSE`).
pub const ADDRESS_IN_USE: &str = "Address already in use";

/// Whether a failed start failed because a port was taken: its error carries the process's log, which says so.
pub fn port_was_taken(error: &anyhow::Error) -> bool {
    format!("{error:#}").contains(ADDRESS_IN_USE)
}

/// Starts a process on ports picked free, again with new ones while a start fails because a port was taken
/// ([`port_was_taken`]), at most [`PORT_ATTEMPTS`] times. `start` picks the ports and launches the process, and
/// returns the wait for its readiness (which owns the process); the last error is returned as it is.
pub async fn start_on_picked_ports<T, F, W>(mut start: F) -> Result<T>
where
    F: FnMut() -> Result<W>,
    W: std::future::Future<Output = Result<T>>,
{
    let mut attempt = 1;
    loop {
        match start()?.await {
            Err(e) if attempt < PORT_ATTEMPTS && port_was_taken(&e) => attempt += 1,
            r => return r,
        }
    }
}

/// A port picker for tests of the retry: its first pick is a port this value holds bound (so a start on it fails
/// with [`ADDRESS_IN_USE`]), every later one comes from [`free_port`].
pub struct TakenFirst {
    taken: TcpListener,
    /// Ports picked so far.
    pub picks: usize,
}

impl TakenFirst {
    /// Binds the port the first pick returns.
    pub fn new() -> Result<Self> {
        Ok(TakenFirst { taken: TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?, picks: 0 })
    }

    /// The port held bound.
    pub fn port(&self) -> u16 {
        self.taken.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// The next port: the held one first, then free ones.
    pub fn pick(&mut self) -> Result<u16> {
        self.picks += 1;
        if self.picks == 1 {
            Ok(self.port())
        } else {
            free_port()
        }
    }
}
