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
/// Another process could take it before Envoy binds it; the window is tiny on a test machine.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}
