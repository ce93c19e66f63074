//! The agent's one error type. Each variant maps to a short CamelCase `reason` that ends up in the
//! node's cache state (and from there in `ModelCache.status.nodes[].reason`), so users see *why*.

use std::path::PathBuf;

/// Everything that can stop a cache from becoming ready on this node.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The object store (S3, HTTP) refused or failed a request.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// The Hugging Face Hub API failed (repo info, revision lookup).
    #[error("Hugging Face Hub: {0}")]
    Hub(String),
    /// A local filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done (`create`, `rename`, `write`, ...).
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Not enough free space on the cache filesystem: the cache does not fit on this node. Nothing was
    /// downloaded, and what this attempt allocated was released.
    #[error(
        "does not fit: not enough free disk on {path}: need {needed} bytes to download plus {reserve} bytes reserve, \
         {available} bytes available"
    )]
    InsufficientDisk {
        /// The cache root whose filesystem was checked.
        path: PathBuf,
        /// Bytes still to download (bytes, not counting what a previous attempt already verified).
        needed: u64,
        /// Bytes the agent must leave free (configured reserve).
        reserve: u64,
        /// Bytes the filesystem reports available to unprivileged users.
        available: u64,
    },
    /// The downloaded file has a different length than the source reported.
    #[error("size mismatch for {file}: source says {expected} bytes, downloaded {actual} bytes")]
    SizeMismatch {
        /// File path relative to the cache version directory.
        file: String,
        /// Bytes reported by the source.
        expected: u64,
        /// Bytes on disk.
        actual: u64,
    },
    /// The downloaded file's sha256 differs from the expected checksum in the spec.
    #[error("sha256 mismatch for {file}: expected {expected}, downloaded {actual}")]
    ChecksumMismatch {
        /// File path relative to the cache version directory.
        file: String,
        /// Hex sha256 from the spec.
        expected: String,
        /// Hex sha256 of the downloaded bytes.
        actual: String,
    },
    /// The source is malformed or names something that cannot be cached.
    #[error("invalid source: {0}")]
    InvalidSource(String),
    /// The source no longer holds the version this cache is pinned to (an object changed under the same
    /// spec). Nothing is fetched, so nodes never mix versions; new content needs a new ModelCache.
    #[error(
        "the source changed: it now lists version {found}, but this cache is pinned to version {pinned} (the \
         version its first node verified); nothing fetched so replicas do not mix versions. Nodes holding \
         {pinned} keep serving it; to roll out the new content, create a new ModelCache (with an \
         InferenceEndpoint: change the model source, e.g. a new prefix, revision or sha256)"
    )]
    SourceChanged {
        /// The pinned version fingerprint.
        pinned: String,
        /// The fingerprint of what the source lists now.
        found: String,
    },
    /// The download was cancelled (cache deleted or agent shutting down); progress is kept.
    #[error("cancelled; progress kept for resume")]
    Cancelled,
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(String),
    /// A directory the agent would write into holds files it did not create; it refuses to use it (and
    /// never deletes them).
    #[error(
        "{path} holds files warmpath did not create ({entries}); refusing to use it. Empty it or choose another \
         directory, or allow it explicitly (`--allow-foreign-files`, Helm `agent.allowForeignFiles`): the agent \
         then works beside those files and never deletes them"
    )]
    ForeignFiles {
        /// The directory.
        path: PathBuf,
        /// Up to five of the foreign entries, comma-separated.
        entries: String,
    },
}

impl AgentError {
    /// Short CamelCase reason for status fields (Kubernetes condition `reason` style).
    pub fn reason(&self) -> &'static str {
        match self {
            AgentError::Store(object_store::Error::NotFound { .. }) => "SourceNotFound",
            AgentError::Store(object_store::Error::Precondition { .. }) => "SourceChanged",
            AgentError::Store(_) => "SourceError",
            AgentError::Hub(_) => "HubError",
            AgentError::Io { .. } => "DiskError",
            AgentError::InsufficientDisk { .. } => "InsufficientDisk",
            AgentError::SizeMismatch { .. } => "SizeMismatch",
            AgentError::ChecksumMismatch { .. } => "ChecksumMismatch",
            AgentError::InvalidSource(_) => "InvalidSource",
            AgentError::SourceChanged { .. } => "SourceChanged",
            AgentError::Cancelled => "Cancelled",
            AgentError::Kube(_) => "KubernetesError",
            AgentError::ForeignFiles { .. } => "ForeignFiles",
        }
    }

    /// Whether a later attempt can resume from what this failure leaves staged: a cancel, or a source or Hub that
    /// failed for now (unreachable, an error status). Not when the source's object changed under the download
    /// (its bytes so far belong to the old object) or the source cannot serve ranged reads (there is nothing to
    /// resume from), nor after a checksum, size or disk failure.
    pub fn keeps_progress(&self) -> bool {
        match self {
            AgentError::Store(object_store::Error::Precondition { .. } | object_store::Error::NotSupported { .. }) => {
                false
            }
            AgentError::Cancelled | AgentError::Store(_) | AgentError::Hub(_) => true,
            _ => false,
        }
    }

    /// Helper: wrap an io error with the operation and path.
    pub fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> AgentError {
        let path = path.into();
        move |source| AgentError::Io { op, path, source }
    }
}

/// Result alias for the agent.
pub type Result<T, E = AgentError> = std::result::Result<T, E>;
