//! A model's chat framing: its chat template reduced once to the glue strings around each
//! turn (found by rendering a conversation of marker texts), so prompts can be assembled
//! piece by piece.

use crate::{Error, Result};
use speccompact_runtime::{ChatMessage, ChatTemplate};

/// The text a chat template puts around each turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatFormat {
    /// Before the system text.
    pub open: String,
    /// Between the system text and the first user text.
    pub system_to_user: String,
    /// After a user text, opening the assistant's turn.
    pub user_to_assistant: String,
    /// After an assistant text, opening the next user turn.
    pub assistant_to_user: String,
}

const MARKS: [&str; 4] = ["\u{E000}S", "\u{E000}U", "\u{E000}A", "\u{E000}Q"];

impl ChatFormat {
    /// Plain text framing for models without a chat template.
    pub fn plain() -> Self {
        Self {
            open: String::new(),
            system_to_user: "\n\n".into(),
            user_to_assistant: "\n\nAnswer:\n".into(),
            assistant_to_user: "\n\n".into(),
        }
    }

    /// Glue strings of a chat template, found by rendering marker messages.
    pub fn from_template(t: &ChatTemplate) -> Result<Self> {
        let msgs = [
            ChatMessage::new("system", MARKS[0]),
            ChatMessage::new("user", MARKS[1]),
            ChatMessage::new("assistant", MARKS[2]),
            ChatMessage::new("user", MARKS[3]),
        ];
        let text = t.render(&msgs, true)?;
        let mut parts = Vec::with_capacity(5);
        let mut rest = text.as_str();
        for m in MARKS {
            let (before, after) = rest.split_once(m).ok_or_else(|| Error::Backend {
                backend: "chat template".into(),
                reason: format!(
                    "the template drops or reorders message text (marker {m:?} missing)"
                ),
            })?;
            parts.push(before.to_string());
            rest = after;
        }
        let f = Self {
            open: parts[0].clone(),
            system_to_user: parts[1].clone(),
            user_to_assistant: rest.to_string(),
            assistant_to_user: parts[3].clone(),
        };
        if parts[2] != f.user_to_assistant {
            tracing::debug!(
                first = parts[2].as_str(),
                last = f.user_to_assistant.as_str(),
                "chat template opens assistant turns differently; using the generation prompt"
            );
        }
        Ok(f)
    }

    /// The template's glue, or plain framing when there is no template.
    pub fn for_template(t: Option<&ChatTemplate>) -> Result<Self> {
        t.map_or_else(|| Ok(Self::plain()), Self::from_template)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use speccompact_runtime::synthetic::CHATML_TEMPLATE;

    #[test]
    fn chatml_glue_is_recovered() {
        let t = ChatTemplate::new(CHATML_TEMPLATE, "", "<|im_end|>").unwrap();
        let f = ChatFormat::from_template(&t).unwrap();
        assert_eq!(f.open, "<|im_start|>system\n");
        assert_eq!(f.system_to_user, "<|im_end|>\n<|im_start|>user\n");
        assert_eq!(f.user_to_assistant, "<|im_end|>\n<|im_start|>assistant\n");
        assert_eq!(f.assistant_to_user, "<|im_end|>\n<|im_start|>user\n");
    }

    #[test]
    fn a_template_that_drops_text_is_an_error() {
        let t = ChatTemplate::new("{% for m in messages %}x{% endfor %}", "", "").unwrap();
        assert!(ChatFormat::from_template(&t).is_err());
    }
}
