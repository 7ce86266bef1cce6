//! Chat framing and the texts every model sees: the shared prefix (instructions, the history,
//! the whole schema with every contract, the verification rule), and the short suffixes that
//! follow it (one slot's request, the verification question, the whole-summary request).
//! Every piece that is shared lies in the prefix; the model's framing comes from
//! [`ChatFormat`].

use crate::chat_format::ChatFormat;
use crate::config::{CompactionConfig, SlotSpec};

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
