//! A slot stream of the speculative method: its accepted lines and their token counts, its
//! state (drafting, awaiting a judgment, repair, whole-slot attempt, done), the buffer of
//! drafted lines and the line rules of its requests.

use crate::backend::LineRules;
use crate::lines::{Check, Checker};
use crate::outcome::{LineOut, SlotStop};
use std::collections::VecDeque;
use std::sync::Arc;

/// One buffered draft item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Item {
    Line(String),
    /// The drafter's token budget ran out inside its first line.
    Unfinished(String),
    /// The drafter ended the section here.
    End,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum State {
    Draft,
    Verify(String),
    Repair,
    /// The target writes the whole slot body (the slot had no content line).
    WholeSlot,
    Done(SlotStop),
}

pub(super) struct Stream {
    pub(super) slot: usize,
    pub(super) checker: Arc<Checker>,
    pub(super) lines: Vec<LineOut>,
    /// Target tokens of each line of `lines`.
    pub(super) line_tokens: Vec<usize>,
    pub(super) tokens: usize,
    /// Whether the target has been asked for the whole body (or wrote nothing for the slot).
    pub(super) whole_tried: bool,
    pub(super) state: State,
    pub(super) buffer: VecDeque<Item>,
    /// The accepted texts the buffer's front item was drafted after.
    pub(super) expect: Vec<String>,
    /// The next repair's start: a rejected line's part before its first divergence.
    pub(super) kept: String,
    /// Target tokens of `kept`.
    pub(super) kept_tokens: usize,
}

impl Stream {
    pub(super) fn texts(&self) -> Vec<String> {
        self.lines.iter().map(|l| l.text.clone()).collect()
    }

    pub(super) fn content_lines(&self) -> usize {
        self.lines
            .iter()
            .filter(|l| !l.text.trim().is_empty())
            .count()
    }

    /// Whether a line reports something: not blank, not a declared sub-heading, not an
    /// empty-slot marker.
    pub(super) fn has_content(&self) -> bool {
        self.lines
            .iter()
            .any(|l| !l.text.trim().is_empty() && self.checker.check(&l.text, &[]) != Check::Auto)
    }

    /// Drops empty-slot markers (before the target writes the body in their place).
    pub(super) fn drop_markers(&mut self) {
        let mut i = 0;
        while i < self.lines.len() {
            let t = self.lines[i].text.trim().to_lowercase();
            if crate::lines::EMPTY_MARKERS.contains(&t.trim_end_matches('.')) {
                self.lines.remove(i);
                self.tokens -= self.line_tokens.remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Line rules of a whole body: stop where the model opens another section.
    pub(super) fn body_rules(&self) -> LineRules {
        let checker = Arc::clone(&self.checker);
        LineRules {
            gate: Some(Arc::new(move |_: &[String], line: &str| {
                checker.check(line, &[]) != Check::EndOfSlot
            })),
            ..LineRules::default()
        }
    }

    /// Line rules of a draft: stop after the first line the checks refuse or that ends the
    /// slot, finish a line the budget cut, and never open an undeclared heading.
    pub(super) fn draft_rules(&self, grace: usize, no_headings: bool) -> LineRules {
        let checker = Arc::clone(&self.checker);
        let accepted = self.texts();
        LineRules {
            gate: Some(Arc::new(move |prior: &[String], line: &str| {
                let mut seen = accepted.clone();
                seen.extend(prior.iter().cloned());
                let c = checker.check(line, &seen);
                !(c.fails() || c == Check::EndOfSlot)
            })),
            grace,
            no_headings,
        }
    }

    pub(super) fn prompt(&self, head: &str) -> Vec<String> {
        let mut p = Vec::with_capacity(self.lines.len() + 3);
        p.push(head.to_string());
        p.extend(self.lines.iter().map(|l| format!("{}\n", l.text)));
        p
    }

    pub(super) fn clear_buffer(&mut self) {
        self.buffer.clear();
        self.expect.clear();
    }
}
