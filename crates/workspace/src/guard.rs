//! Summary checks against protected state and the log: the summary channel may never
//! overwrite state, so a summary line that weakens a constraint ("modify cautiously" against
//! "must not modify the production database"), reports an open issue as passed, or reports a
//! failed command (exit code ≠ 0) as having run fine is flagged. Flagged lines are kept out of
//! assembled contexts and listed there.

use crate::event::Event;
use crate::route::Writer;
use crate::state::{Record, RecordType, Status};
use regex::Regex;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::OnceLock;

/// What a flagged line does wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlagKind {
    /// Restates a constraint without its prohibition (or negates a positive one).
    ConstraintWeakened,
    /// Reports an open issue as passed or done.
    OpenIssueClosed,
    /// Reports a failed command as successful.
    FailureMisreported,
}

/// One flagged summary line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Flag {
    /// Kind.
    pub kind: FlagKind,
    /// The line, verbatim.
    pub line: String,
    /// The record it contradicts, if any.
    pub record: Option<i64>,
    /// The event it contradicts, if any.
    pub event: Option<i64>,
}

struct Words {
    negation: Regex,
    completion: Regex,
    still_open: Regex,
    success: Regex,
    failure: Regex,
    hedge: Regex,
}

fn words() -> &'static Words {
    static W: OnceLock<Words> = OnceLock::new();
    W.get_or_init(|| {
        let re = |p: &str| Regex::new(p).unwrap_or_else(|e| panic!("built-in pattern {p}: {e}"));
        Words {
            negation: re(r"(?i)\b(not|never|no|don't|dont|mustn't|cannot|can't|forbidden|prohibited|avoid|without|nor)\b"),
            completion: re(r"(?i)\b(pass(ed|es|ing)?|tested|done|fixed|resolved|completed?|verified|succeed(ed|s)?|works|green|confirmed)\b"),
            still_open: re(r"(?i)\b(still|not yet|to be|pending|open|todo|unresolved|remains?|fail\w*|unknown)\b"),
            success: re(r"(?i)\b(ran|run|passed|passes|succeeded|successful(ly)?|green|works|fine|ok|completed|clean)\b"),
            hedge: re(r"(?i)\b(cautious(ly)?|careful(ly)?|if needed|when necessary|as needed|sparingly|allowed|ok to|okay to|may|can|fine to)\b"),
            failure: re(r"(?i)(\bfail\w*|\berror\w*|\bexit(ed)?( with)?( code| status)? *[1-9]\d*|\bbroken\b|\bred\b|\bnon-?zero\b)"),
        }
    })
}

const FILLER: &[&str] = &[
    "the", "and", "for", "with", "that", "this", "must", "should", "always", "only", "never",
    "not", "don't", "still", "be", "to", "of", "in", "on", "a", "an", "is", "are", "it", "we",
    "you", "use", "from", "now", "yet", "tested", "done", "checked", "verified", "fixed",
];

fn content_words(s: &str) -> Vec<String> {
    s.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '\''))
        .filter(|w| w.chars().count() >= 2)
        .map(str::to_lowercase)
        .filter(|w| !FILLER.contains(&w.as_str()))
        .collect()
}

fn stem(w: &str) -> String {
    w.chars().take(5).collect()
}

fn shares(line: &[String], word: &str) -> bool {
    let s = stem(word);
    line.iter().any(|l| stem(l) == s)
}

/// The first content word after the negation of a prohibition ("modify" in "must not modify
/// the production database").
fn action_word(constraint: &str) -> Option<String> {
    let w = words();
    let m = w.negation.find(constraint)?;
    content_words(&constraint[m.end()..]).into_iter().next()
}

/// Checks summary lines against valid state and the events: returns the flagged lines.
pub fn check(summary: &str, state: &[Record], events: &[Event]) -> Vec<Flag> {
    let w = words();
    let valid: Vec<&Record> = state.iter().filter(|r| r.status == Status::Valid).collect();
    // Commands whose latest run failed: tool name -> (event id, exit code).
    let mut last: HashMap<String, (i64, i32)> = HashMap::new();
    for e in events.iter().filter(|e| e.writer == Writer::Tool) {
        if let Some(code) = e.exit_code {
            last.insert(
                e.tool.clone().unwrap_or_else(|| "command".into()),
                (e.id, code),
            );
        }
    }
    let failed: Vec<(String, i64)> = last
        .into_iter()
        .filter(|(_, (_, c))| *c != 0)
        .map(|(t, (id, _))| (t.to_lowercase(), id))
        .collect();
    let mut flags = Vec::new();
    for line in summary.lines() {
        let text = line.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let lw = content_words(text);
        let negated = w.negation.is_match(text);
        let lower = text.to_lowercase();
        let mut flag = |kind, record: Option<i64>, event: Option<i64>| {
            flags.push(Flag {
                kind,
                line: text.to_string(),
                record,
                event,
            })
        };
        for r in &valid {
            if lower.contains(&r.value.to_lowercase()) {
                continue;
            }
            let cw = content_words(&r.value);
            let shared = cw.iter().filter(|c| shares(&lw, c)).count();
            match r.kind {
                RecordType::Constraint => {
                    let prohibits = w.negation.is_match(&r.value);
                    let action = action_word(&r.value);
                    if prohibits
                        && !negated
                        && action.as_deref().is_some_and(|a| shares(&lw, a))
                        && (shared >= 2 || w.hedge.is_match(text))
                    {
                        flag(FlagKind::ConstraintWeakened, Some(r.id), None);
                    } else if !prohibits && negated && shared >= 2 {
                        flag(FlagKind::ConstraintWeakened, Some(r.id), None);
                    }
                }
                RecordType::OpenIssue => {
                    let strong = cw
                        .iter()
                        .any(|c| c.chars().any(|ch| ch.is_ascii_digit()) && shares(&lw, c));
                    if (strong || shared >= 2)
                        && w.completion.is_match(text)
                        && !w.still_open.is_match(text)
                        && !negated
                    {
                        flag(FlagKind::OpenIssueClosed, Some(r.id), None);
                    }
                }
                _ => {}
            }
        }
        for (tool, id) in &failed {
            let mentions = lower.contains(tool.as_str())
                || ["test", "tests", "build", "command", "suite"]
                    .iter()
                    .any(|t| lw.iter().any(|x| x == t));
            if mentions && w.success.is_match(text) && !w.failure.is_match(text) && !negated {
                flag(FlagKind::FailureMisreported, None, Some(*id));
            }
        }
    }
    flags.dedup_by(|a, b| a.line == b.line && a.kind == b.kind);
    flags
}
