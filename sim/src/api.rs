//! OpenAI request and response shapes the simulator reads and writes (only the fields it needs).

use serde::{Deserialize, Serialize};

/// `content` of a chat message: a string or an array of content parts (only `text` parts carry text).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain string content.
    Text(String),
    /// Content parts; non-text parts (images, audio) contribute no text.
    Parts(Vec<ContentPart>),
}

/// One content part, e.g. `{"type": "text", "text": "..."}`.
#[derive(Debug, Deserialize)]
pub struct ContentPart {
    /// Text of a `text` part; absent for other part types.
    #[serde(default)]
    pub text: Option<String>,
}

impl Content {
    /// The text of this content (parts concatenated).
    pub fn text(&self) -> String {
        match self {
            Content::Text(s) => s.clone(),
            Content::Parts(p) => p.iter().filter_map(|x| x.text.as_deref()).collect(),
        }
    }
}

/// One chat message.
#[derive(Debug, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// Message content; may be null for tool calls.
    #[serde(default)]
    pub content: Option<Content>,
}

/// `stream_options` (OpenAI): `include_usage` adds a final chunk with `usage`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk carrying `usage`.
    #[serde(default)]
    pub include_usage: bool,
}

/// `/v1/chat/completions` request body.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// Model name (echoed back).
    pub model: String,
    /// Conversation so far.
    pub messages: Vec<Message>,
    /// Output tokens to generate (the simulator always generates exactly this many).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Newer name for `max_tokens`.
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
}

/// `prompt` of a completion request: a string or an array of strings (concatenated).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One prompt string.
    Text(String),
    /// Several strings; the simulator concatenates them into one prompt.
    Many(Vec<String>),
}

/// `/v1/completions` request body.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// Model name (echoed back).
    pub model: String,
    /// The prompt.
    pub prompt: Prompt,
    /// Output tokens to generate.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache (simulator ground truth).
    pub cached_tokens: u64,
}

/// `usage` of a response. Token counts follow [`crate::tokens`] (4 bytes per token).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Generated tokens.
    pub completion_tokens: u64,
    /// Sum of both.
    pub total_tokens: u64,
    /// Cached-token detail.
    #[serde(default)]
    pub prompt_tokens_details: PromptTokensDetails,
}

/// How long the server itself took with one request, in wall µs from the moment it had the whole request: what a
/// client cannot tell apart from the time spent before the server (its own, the proxy's, the network's). A replay at
/// a time scale other than 1 scales only this part back to model time.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServerTiming {
    /// Until the first generated token was handed to the response stream.
    pub first_token_us: u64,
    /// Until the last chunk was handed to the response stream.
    pub done_us: u64,
}

/// The simulator's own fields in a response body or the last chunk of a streamed one, beside the OpenAI ones; a
/// client reads them with `#[serde(flatten)]` and the routers in between pass them through with the rest.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SimExtras {
    /// The server's own share of the request's time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_timing: Option<ServerTiming>,
}
