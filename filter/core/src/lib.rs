//! warmpath-core: the pure routing core of the warmpath filter.
//!
//! It turns a request (path, body, tenant header) into a routing key ([`extract_key`]), hashes the key's
//! leading text into chained blocks ([`block_hashes`]) and picks a model-server endpoint with one of three
//! policies ([`Strategy`]), keeping a bounded index of which endpoint recently served which blocks.
//!
//! The crate has no proxy-wasm types, never reads a clock (time and randomness are inputs, see
//! [`PickInput`]), starts no threads, and compiles to `wasm32-unknown-unknown` / `wasm32-wasip1` as well as
//! natively, so the filter, the benchmarks and the controller share one implementation.
#![forbid(unsafe_code)]

pub mod config;
pub mod decision;
pub mod endpoint;
pub mod error;
pub mod exchange;
pub mod extract;
pub mod feed;
pub mod headers;
pub mod health;
pub mod hrw;
pub mod index;
pub mod load;
pub mod policy;
pub mod prefill_rate;
pub mod prefix;
pub mod router;

pub use config::{FeedSettings, RawConfig, RawFeed, Settings, Strategy};
pub use decision::{Decision, Reason};
pub use endpoint::{Endpoint, EndpointLoad, ServerLoad};
pub use error::{ConfigError, ExtractError};
pub use extract::{extract_key, BodyKind, RequestKey};
pub use index::PrefixIndex;
pub use policy::{PickInput, Policy};
pub use prefill_rate::{PrefillEstimate, PrefillRate};
pub use prefix::{block_hashes, PrefixHashes};
pub use router::Router;
