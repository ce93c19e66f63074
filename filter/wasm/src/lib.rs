//! warmpath-filter: the proxy-wasm shell (skeleton; see issue 2).
