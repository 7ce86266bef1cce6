//! Chat framing and the texts every model sees: the shared prefix (instructions, the history,
//! the whole schema with every contract, the verification rule), and the short suffixes that
//! follow it (one slot's request, the verification question, the whole-summary request).
//!
//! A model's chat template is reduced once to its glue strings by rendering a conversation of
//! marker texts, so prompts can be assembled piece by piece and every piece that is shared
//! lies in the prefix.

use crate::config::{CompactionConfig, SlotSpec};
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

/// The shared prefix: instructions with the verification rule, the rendered history, and
/// every section with its contract. Ends inside the user turn so slot requests can follow.
///
/// The schema stays after the history although a growing session then recomputes it on
/// every re-compaction (a few hundred tokens beside its new messages): with the history last,
/// small targets copy the record instead of summarising it (measured on the sample session
/// with qwen2.5-coder-0.5b: the sequential summary became a copy of the record).
pub fn prefix(f: &ChatFormat, c: &CompactionConfig, transcript: &str) -> String {
    let p = &c.prompts;
    let mut s = String::with_capacity(transcript.len() + 4096);
    s.push_str(&f.open);
    s.push_str(&p.system);
    // The verification rule is defined once, far from where lines are written, so writers
    // do not take it for content.
    s.push_str("\n\n");
    s.push_str(&p.judge_rule);
    s.push_str(&f.system_to_user);
    s.push_str(&p.intro);
    s.push_str("\n<record>\n");
    s.push_str(transcript.trim_end());
    s.push_str("\n</record>\n\n");
    s.push_str(&p.outline);
    s.push_str("\n\n");
    for slot in &c.slots {
        s.push_str(&format!(
            "## {}\n{} Format: {}.\n\n",
            slot.title, slot.contract, slot.format
        ));
    }
    s
}

/// [`slot_request`] of every slot, in schema order.
pub fn slot_requests(f: &ChatFormat, c: &CompactionConfig) -> Vec<String> {
    c.slots.iter().map(|s| slot_request(f, c, s)).collect()
}

/// The request for one slot, ending with the opened assistant turn and the slot's heading.
pub fn slot_request(f: &ChatFormat, c: &CompactionConfig, slot: &SlotSpec) -> String {
    let ask = c
        .prompts
        .section
        .replace("{title}", &slot.title)
        .replace("{contract}", &slot.contract)
        .replace("{format}", &slot.format);
    format!("\n{ask}{}## {}\n", f.user_to_assistant, slot.title)
}

/// The verification question after a proposed line (which ends with its newline).
pub fn judge_question(f: &ChatFormat, c: &CompactionConfig) -> String {
    format!(
        "{}{}{}",
        f.assistant_to_user, c.prompts.judge, f.user_to_assistant
    )
}

/// The request for the whole summary (sequential baseline).
pub fn whole_request(f: &ChatFormat, c: &CompactionConfig) -> String {
    format!("\n{}{}", c.prompts.whole, f.user_to_assistant)
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

    #[test]
    fn prefix_holds_every_contract_and_the_history() {
        let c = CompactionConfig::default();
        let p = prefix(&ChatFormat::plain(), &c, "[user]\nfix bug 42\n");
        assert!(p.contains("fix bug 42"));
        for s in &c.slots {
            assert!(
                p.contains(&format!("## {}\n{}", s.title, s.contract)),
                "{}",
                s.name
            );
        }
        assert!(p.contains(&c.prompts.judge_rule));
        let r = slot_request(&ChatFormat::plain(), &c, &c.slots[0]);
        assert!(r.ends_with("## Goal\n") && r.contains("\"Goal\""), "{r}");
    }
}
