//! warmpath-agent: the node agent that puts model weights on node-local disk before pods need them.
//!
//! - [`source`]: S3 / HTTP / Hugging Face sources resolved to an `object_store` store and a file list.
//! - [`fetch`]: parallel ranged reads into a partial file with a progress record (resumable).
//! - [`sync`]: one cache made current: disk check, fetch, verify (size, ETag, sha256), atomic switch.
//! - [`cache_dir`]: the on-disk layout (`current` symlink over verified version directories).
//! - [`disk`]: the free-space check.
//! - [`node`]: the DaemonSet's node loop (which caches this node holds; reports on its Node).
#![forbid(unsafe_code)]

pub mod cache_dir;
pub mod disk;
pub mod error;
pub mod fetch;
pub mod node;
pub mod source;
pub mod sync;

pub use error::{AgentError, Result};
pub use source::SourceSpec;
pub use sync::{sync_cache, CacheRequest, SyncOptions, SyncReport};
