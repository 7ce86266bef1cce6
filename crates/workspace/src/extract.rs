//! Candidate state records from an event, by the configured patterns: each candidate is one
//! verbatim sentence of the event (or, for tool results with an exit code, a reference to the
//! event). Whether a candidate becomes a rule is decided by the write rules in `state`, not
//! here: instruction-like text from an assistant or a tool is proposed as a constraint and
//! ends up `pending_confirmation`.

use crate::config::{ExtractConfig, Patterns};
use crate::event::Event;
use crate::route::Writer;
use crate::state::{Detail, Draft, RecordType};

/// Splits text into sentences: verbatim, trimmed slices ending at `.`, `!` or `?` followed
/// by whitespace, or at a line break.
pub fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let end = match c {
            '\n' => Some(i),
            '.' | '!' | '?' => match chars.peek() {
                Some((_, n)) if n.is_whitespace() => Some(i + c.len_utf8()),
                None => Some(i + c.len_utf8()),
                _ => None,
            },
            _ => None,
        };
        if let Some(end) = end {
            let s = text[start..end].trim();
            if !s.is_empty() {
                out.push(s);
            }
            start = end;
        }
    }
    let s = text[start..].trim();
    if !s.is_empty() {
        out.push(s);
    }
    out
}

fn decision(p: &Patterns, s: &str) -> Draft {
    let mut d = Draft::new(RecordType::Decision, s);
    d.detail = Detail {
        rationale: p
            .rationale
            .captures(s)
            .and_then(|c| c.get(1))
            .map(|m| m.as_str().trim_end_matches(['.', '!']).to_string()),
        alternatives: p
            .alternatives
            .captures_iter(s)
            .filter_map(|c| c.get(1).map(|m| m.as_str().trim().to_string()))
            .collect(),
        ..Detail::default()
    };
    d
}

/// Candidate records stated by `event`. `first_user` says whether it is the session's first
/// user message (whose first sentence is the goal when no goal pattern matches).
pub fn candidates(p: &Patterns, c: &ExtractConfig, event: &Event, first_user: bool) -> Vec<Draft> {
    let mut out = Vec::new();
    if event.writer == Writer::Tool {
        if let Some(code) = event.exit_code {
            let tool = event.tool.as_deref().unwrap_or("command");
            let mut v = format!("event {}: {tool} exit {code}", event.id);
            if !event.fields.test_results.is_empty() {
                v.push_str(&format!(" ({})", event.fields.test_results.join(", ")));
            }
            let v: String = v
                .chars()
                .take(crate::state::EVIDENCE_REF_MAX_CHARS)
                .collect();
            out.push(
                Draft::new(RecordType::EvidenceRef, &v)
                    .key(&format!("evidence:event-{}", event.id)),
            );
        }
    }
    // Identifiers and paths the user or the owner states: a reference to where they are.
    if event.writer.is_authorized() {
        let mut facts: Vec<&str> = event.fields.paths.iter().map(String::as_str).collect();
        facts.extend(event.fields.identifiers.iter().map(String::as_str));
        if !facts.is_empty() {
            let mut v = format!("event {} ({}):", event.id, event.writer.as_str());
            for f in facts {
                if v.chars().count() + f.chars().count() + 1 > crate::state::EVIDENCE_REF_MAX_CHARS
                {
                    break;
                }
                v.push(' ');
                v.push_str(f);
            }
            out.push(
                Draft::new(RecordType::EvidenceRef, &v)
                    .key(&format!("evidence:event-{}", event.id)),
            );
        }
    }
    let mut goal_found = false;
    for s in sentences(&event.content) {
        if s.chars().count() > c.max_sentence_chars || s.split_whitespace().count() < 3 {
            continue;
        }
        let kind = match event.writer {
            Writer::User | Writer::Owner => {
                if p.goal.is_match(s) {
                    Some(RecordType::Goal)
                } else if p.acceptance.is_match(s) {
                    Some(RecordType::AcceptanceCriterion)
                } else if p.open_issue.is_match(s) {
                    Some(RecordType::OpenIssue)
                } else if p.permission.is_match(s) {
                    Some(RecordType::Permission)
                } else if p.constraint.is_match(s) {
                    Some(RecordType::Constraint)
                } else if p.decision.is_match(s) {
                    Some(RecordType::Decision)
                } else {
                    None
                }
            }
            Writer::Assistant => {
                if p.decision.is_match(s) {
                    Some(RecordType::Decision)
                } else if p.open_issue.is_match(s) {
                    Some(RecordType::OpenIssue)
                } else if p.instruction.is_match(s) {
                    Some(RecordType::Constraint)
                } else {
                    None
                }
            }
            Writer::Tool => p.instruction.is_match(s).then_some(RecordType::Constraint),
        };
        match kind {
            Some(RecordType::Goal) if goal_found => {}
            Some(RecordType::Decision) => out.push(decision(p, s)),
            Some(RecordType::Goal) if first_user => {
                // In the opening request the goal is read with what leads up to it ("The
                // upload test fails on CI. Please fix it."): the verbatim span from the start.
                goal_found = true;
                let start = sentences(&event.content)
                    .first()
                    .map_or(0, |f| f.as_ptr() as usize - event.content.as_ptr() as usize);
                let end = s.as_ptr() as usize - event.content.as_ptr() as usize + s.len();
                let span = &event.content[start..end];
                let v = if span.chars().count() <= c.max_sentence_chars {
                    span
                } else {
                    s
                };
                out.push(Draft::new(RecordType::Goal, v));
            }
            Some(k) => {
                goal_found |= k == RecordType::Goal;
                out.push(Draft::new(k, s));
            }
            None => {}
        }
    }
    if first_user && c.first_user_is_goal && !goal_found && event.writer == Writer::User {
        if let Some(s) = sentences(&event.content).into_iter().next() {
            if s.chars().count() <= c.max_sentence_chars {
                out.insert(0, Draft::new(RecordType::Goal, s));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_opening_goal_keeps_what_leads_up_to_it() {
        use crate::config::WorkspaceConfig;
        use crate::route::{extract_fields, EventClass};
        let c = WorkspaceConfig::default();
        let p = c.compile("t").unwrap();
        let text = "The upload retry test is failing on CI. Please fix it. Do not change the API.";
        let e = Event {
            id: 1,
            session: "s".into(),
            seq: 0,
            role: speccompact_history::Role::User,
            writer: Writer::User,
            time_ms: 0,
            class: EventClass::Discussion,
            tool: None,
            exit_code: None,
            content: text.into(),
            fields: extract_fields(text),
            tokens: 20,
        };
        let got: Vec<(RecordType, String)> = candidates(&p, &c.extract, &e, true)
            .into_iter()
            .map(|d| (d.kind, d.value))
            .collect();
        assert_eq!(
            got,
            [
                (
                    RecordType::Goal,
                    "The upload retry test is failing on CI. Please fix it.".to_string()
                ),
                (RecordType::Constraint, "Do not change the API.".to_string()),
            ]
        );
        let later: Vec<RecordType> = candidates(&p, &c.extract, &e, false)
            .into_iter()
            .map(|d| d.kind)
            .collect();
        assert_eq!(later, [RecordType::Goal, RecordType::Constraint]);
    }

    #[test]
    fn sentences_are_verbatim() {
        let t = "Fix the bug. Do not touch prod!\nP95 still to be tested? yes v1.2 ok";
        assert_eq!(
            sentences(t),
            [
                "Fix the bug.",
                "Do not touch prod!",
                "P95 still to be tested?",
                "yes v1.2 ok"
            ]
        );
    }
}
