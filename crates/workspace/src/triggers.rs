//! When to compact: a token watermark near the window limit (a budget compaction), and
//! milestones — a phase completion (a failing command now passes, an open issue closed), a
//! topic switch, a high-value event (a test result, a new user constraint). Also the
//! compaction tool an agent model can call itself, with its rubric.

use crate::config::{Patterns, TriggerConfig};
use crate::event::Event;
use crate::route::Writer;
use crate::state::{Record, RecordType, Status};
use serde::Serialize;
use std::collections::HashSet;

/// A reason to compact now.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "trigger", rename_all = "snake_case")]
pub enum Trigger {
    /// Unsummarized tokens plus the summary reached the watermark (a budget compaction).
    Watermark {
        /// Tokens counted.
        tokens: usize,
        /// The watermark.
        limit: usize,
    },
    /// A command that failed now passes, or an open issue was closed.
    PhaseCompletion {
        /// The event.
        event: i64,
    },
    /// The newest user message moved to another topic.
    TopicSwitch {
        /// The event.
        event: i64,
        /// Its word overlap with earlier user messages.
        overlap: f64,
    },
    /// A test result or a new user constraint.
    HighValue {
        /// The event.
        event: i64,
        /// What it is.
        reason: String,
    },
}

impl Trigger {
    /// Whether this trigger asks for a milestone snapshot (else a budget compaction).
    pub fn is_milestone(&self) -> bool {
        !matches!(self, Self::Watermark { .. })
    }
}

fn words(s: &str) -> HashSet<String> {
    s.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 3)
        .map(str::to_lowercase)
        .collect()
}

/// The triggers that fire for the events since the last compaction (`fresh`), given every
/// event, the state records, the tokens of the last summary and the window.
pub fn check(
    c: &TriggerConfig,
    p: &Patterns,
    all: &[Event],
    fresh: &[Event],
    records: &[Record],
    summary_tokens: usize,
    window: usize,
) -> Vec<Trigger> {
    let mut out = Vec::new();
    let tokens: usize = summary_tokens + fresh.iter().map(|e| e.tokens).sum::<usize>();
    let limit = (window as f64 * c.watermark) as usize;
    if tokens >= limit {
        out.push(Trigger::Watermark { tokens, limit });
    }
    let first_fresh = fresh.first().map_or(i64::MAX, |e| e.id);
    for e in fresh {
        let earlier = all.iter().filter(|x| x.id < e.id);
        if c.phase_completion && e.writer == Writer::Tool && e.exit_code == Some(0) {
            let tool = e.tool.as_deref();
            let failed_before = earlier
                .clone()
                .filter(|x| x.writer == Writer::Tool && x.tool.as_deref() == tool)
                .last()
                .is_some_and(|x| x.exit_code.is_some_and(|c| c != 0));
            if failed_before {
                out.push(Trigger::PhaseCompletion { event: e.id });
            }
        }
        if c.high_value {
            let test_like = e.writer == Writer::Tool
                && (e
                    .tool
                    .as_deref()
                    .is_some_and(|t| p.test_command.is_match(t))
                    || p.test_command.is_match(&e.content)
                    || !e.fields.test_results.is_empty());
            if test_like && (e.exit_code.is_some() || !e.fields.test_results.is_empty()) {
                out.push(Trigger::HighValue {
                    event: e.id,
                    reason: format!(
                        "test result{}",
                        e.exit_code
                            .map(|c| format!(" (exit {c})"))
                            .unwrap_or_default()
                    ),
                });
            }
        }
        if c.topic_switch > 0.0 && e.writer == Writer::User {
            let before: HashSet<String> = earlier
                .filter(|x| x.writer == Writer::User)
                .flat_map(|x| words(&x.content))
                .collect();
            let now = words(&e.content);
            if !before.is_empty() && now.len() >= 3 {
                let inter = now.intersection(&before).count() as f64;
                let overlap = inter / now.union(&before).count().max(1) as f64;
                if overlap < c.topic_switch {
                    out.push(Trigger::TopicSwitch {
                        event: e.id,
                        overlap,
                    });
                }
            }
        }
    }
    for r in records {
        let fresh_source = r.sources.iter().any(|s| *s >= first_fresh);
        if !fresh_source || r.status != Status::Valid {
            continue;
        }
        if c.high_value && r.kind == RecordType::Constraint && r.writer == Writer::User {
            out.push(Trigger::HighValue {
                event: r.sources[0],
                reason: "new user constraint".into(),
            });
        }
        if c.phase_completion && r.kind == RecordType::Done && r.key.starts_with("open_issue:") {
            out.push(Trigger::PhaseCompletion {
                event: r.sources[0],
            });
        }
    }
    out
}

/// When an agent model should call the compaction tool itself.
pub const RUBRIC: &str = "Call `compact_context` when a sub-task has just resolved (tests pass, a \
question is answered, a decision is made) or when the trajectory is converging and the recent \
turns repeat what is known. Do not call it in the middle of a derivation (a multi-step \
computation, an edit in progress, a plan being laid out) or while stuck on an unresolved error: \
the details you would lose are the ones you need next. Use kind `milestone` after a resolved \
sub-task and `budget` only when the context is close to its limit.";

/// The compaction tool definition (JSON schema), for agent models that call tools.
pub fn compaction_tool() -> serde_json::Value {
    serde_json::json!({
        "type": "function",
        "function": {
            "name": "compact_context",
            "description": RUBRIC,
            "parameters": {
                "type": "object",
                "properties": {
                    "kind": {
                        "type": "string",
                        "enum": ["milestone", "budget"],
                        "description": "milestone: a stable snapshot after a resolved sub-task; budget: the context is near its limit"
                    },
                    "reason": {
                        "type": "string",
                        "description": "What just resolved, or why the context must shrink"
                    },
                    "next_task": {
                        "type": "string",
                        "description": "The task the compacted context is for (steers the summary and the evidence)"
                    }
                },
                "required": ["kind", "reason"],
                "additionalProperties": false
            }
        }
    })
}
