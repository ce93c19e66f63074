//! The controller's error type. Each variant maps to a metric label ([`Error::metric_label`]).

/// Everything a reconciler can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed (network, conflict, not found where it was required, ...).
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    /// A finalizer step failed (wraps the reconciler's own error).
    #[error("finalizer error: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// An object could not be (de)serialized.
    #[error("serialization error: {0}")]
    Serde(#[from] serde_json::Error),
    /// The user's object is invalid in a way the schema could not catch (reported in status too).
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    /// An object lacks a field the API server always sets (name, namespace, uid).
    #[error("object is missing {0}")]
    MissingField(&'static str),
    /// Cleanup is waiting for something outside the controller (e.g. node agents removing a cache);
    /// returned so the finalizer stays and the reconcile is retried.
    #[error("cleanup pending: {0}")]
    CleanupPending(String),
}

/// `Result` with the controller's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Short, bounded label for the `error` metric (never user data).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Finalizer(_) => "finalizer",
            Error::Serde(_) => "serde",
            Error::InvalidSpec(_) => "invalid_spec",
            Error::MissingField(_) => "missing_field",
            Error::CleanupPending(_) => "cleanup_pending",
        }
    }
}
