//! Error types of the core: plugin-configuration errors (rejected at configure time) and key-extraction
//! errors (the filter fails open on them and counts them by [`ExtractError::as_str`]).

use thiserror::Error;

/// A plugin configuration that cannot be used. `Display` is one line naming the field, the bad value and
/// what is allowed, so it reads well in Envoy's log.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    /// The configuration is not valid JSON, has an unknown field, or a field has the wrong JSON type.
    /// Holds serde_json's message (it names the field or variant and the line/column).
    #[error("plugin configuration: invalid JSON: {0}")]
    Json(String),
    /// A numeric field is outside its allowed range.
    #[error("plugin configuration: `{field}` = {value} is out of range; allowed {allowed}")]
    OutOfRange {
        /// JSON field name, e.g. `prefix_length`.
        field: &'static str,
        /// The rejected value as written.
        value: String,
        /// The allowed range with its unit, e.g. `1024..=65536 characters`.
        allowed: String,
    },
    /// A field has a value of the right type but an unusable form (bad address, bad header name, ...).
    #[error("plugin configuration: `{field}` = {value:?} is invalid: {reason}")]
    Invalid {
        /// JSON field name (with an index for list items, e.g. `endpoints[2]`).
        field: String,
        /// The rejected value.
        value: String,
        /// What is expected instead.
        reason: &'static str,
    },
}

/// Why no routing key could be taken from a request. The filter routes such requests by its fallback
/// (least outstanding requests), never fails them, and counts them by [`ExtractError::as_str`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ExtractError {
    /// An OpenAI body is not valid JSON (syntax error, truncated body, trailing garbage, lone surrogate escape).
    #[error("malformed JSON body: {0}")]
    MalformedJson(String),
    /// The body is not valid UTF-8 (JSON requires UTF-8).
    #[error("body is not valid UTF-8")]
    NotUtf8,
    /// A required field is absent (`messages` for chat, `prompt` for completions).
    #[error("missing field `{0}`")]
    MissingField(&'static str),
    /// A field has a JSON type the OpenAI API does not allow there (e.g. `messages` is not an array).
    #[error("field `{0}` has an invalid type or shape")]
    InvalidField(&'static str),
    /// The tenant id (header or `prompt_cache_key`) is longer than 64 characters or not printable ASCII.
    #[error("tenant id must be 1..=64 printable ASCII characters")]
    InvalidTenant,
}

impl ExtractError {
    /// Stable snake_case label for metrics and the debug header (never changes between releases).
    pub fn as_str(&self) -> &'static str {
        match self {
            ExtractError::MalformedJson(_) => "malformed_json",
            ExtractError::NotUtf8 => "not_utf8",
            ExtractError::MissingField(_) => "missing_field",
            ExtractError::InvalidField(_) => "invalid_field",
            ExtractError::InvalidTenant => "invalid_tenant",
        }
    }
}
