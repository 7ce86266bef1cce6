//! Agent histories: the message model, parsers for OpenAI chat messages, Anthropic messages
//! (content blocks with `tool_use` / `tool_result`) and JSONL of either (one message or one
//! session with `messages` per line), the one transcript rendering every method uses, the
//! verbatim extraction of high-risk fields, and slot-conditioned views of a history.
//!
//! One module each: `parse` (text -> [`History`]), `render` ([`History`] -> transcript text,
//! with explicit markers for left-out messages), `fields` (exit codes, test results, paths,
//! patch hunks, errors and identifiers of a text) and `view` (per-slot message ranking and a
//! budgeted transcript of head, tail and the messages that matter most for one slot).

mod fields;
mod parse;
mod render;
mod view;

pub use fields::{exit_code_of, extract_fields, facts, Fields, PatchCoord};
pub use parse::{parse_history, parse_sessions, parse_value};
pub use render::{render, render_kept, RenderOptions};
pub use view::{rank, slot_view, View, ViewOptions};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// System prompt.
    System,
    /// The user.
    User,
    /// The agent.
    Assistant,
    /// A tool's output.
    Tool,
}

impl Role {
    /// The role's lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// Arguments of a tool call: parsed JSON, or the original text when it is not valid JSON.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum Arguments {
    /// Valid JSON.
    Json(serde_json::Value),
    /// Not valid JSON: kept verbatim.
    Raw(String),
}

/// One tool call made by the assistant.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ToolCall {
    /// Call id (links the tool result).
    pub id: Option<String>,
    /// Tool name.
    pub name: String,
    /// Arguments.
    pub arguments: Arguments,
}

/// One message of a history.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Message {
    /// Author.
    pub role: Role,
    /// Text content (may be empty, e.g. an assistant turn that only calls tools).
    pub content: String,
    /// Tool calls of an assistant turn.
    pub tool_calls: Vec<ToolCall>,
    /// For tool results: the call they answer.
    pub tool_call_id: Option<String>,
    /// For tool results: the tool's name, when known.
    pub name: Option<String>,
}

impl Message {
    /// A plain text message.
    pub fn text(role: Role, content: &str) -> Self {
        Self {
            role,
            content: content.to_string(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// An agent history: messages in order, with an optional id (from a session record).
///
/// The parsers build it through [`History::new`], so a parsed history is never empty; the
/// fields stay public for callers that assemble a history themselves (which must then handle
/// an empty one, e.g. by answering [`HistoryError::Empty`]).
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct History {
    /// Session id, when the input carried one.
    pub id: Option<String>,
    /// The messages.
    pub messages: Vec<Message>,
}

impl History {
    /// A history of `messages` without an id; [`HistoryError::Empty`] when there are none.
    pub fn new(messages: Vec<Message>) -> Result<Self> {
        if messages.is_empty() {
            return Err(HistoryError::Empty);
        }
        Ok(Self { id: None, messages })
    }

    /// The same history with session id `id`.
    pub fn with_id(mut self, id: Option<String>) -> Self {
        self.id = id;
        self
    }
}

/// Why an input is not a history; always names where.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HistoryError {
    /// The text is not JSON / JSONL.
    #[error("not JSON{}: {reason}", line.map(|l| format!(" (line {l})")).unwrap_or_default())]
    Json {
        /// 1-based JSONL line, if the input is JSONL.
        line: Option<usize>,
        /// Parser message.
        reason: String,
    },
    /// JSON, but not a history.
    #[error("message {index}: {reason}")]
    Malformed {
        /// 0-based message index.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// No messages at all.
    #[error("the history has no messages")]
    Empty,
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, HistoryError>;
