//! Slot-conditioned views: a per-slot ranking of a history's messages ([`rank`]) and a
//! budgeted transcript for one summary slot ([`slot_view`]) made of the history's head and
//! tail plus the messages that matter most for that slot, rendered exactly as
//! [`render`](crate::render) renders them, with one explicit marker line per run of left-out
//! messages. Built for drafter models whose context window is smaller than the history.
//!
//! The ranking is a deterministic sum of simple signals per message: its role, the high-risk
//! fields [`extract_fields`] finds in its text (content and tool-call arguments), keyword
//! hits from the lists below (whole words, case-insensitive) and, for `progress` and
//! `next_steps`, a mild recency bonus.

use crate::fields::{extract_fields, Fields};
use crate::render::{arguments_text, cap, omitted_runs, render_kept, render_message};
use crate::{render, Arguments, History, Message, RenderOptions, Role};
use std::ops::Range;

/// Words of constraints, preferences and permissions (`constraints_preferences`).
const CONSTRAINT_WORDS: &[&str] = &[
    "must",
    "never",
    "don't",
    "do not",
    "always",
    "only",
    "avoid",
    "keep",
    "prefer",
    "should",
    "shouldn't",
    "not allowed",
    "allowed",
    "permission",
    "pr",
    "pull request",
    "branch",
    "required",
    "make sure",
    "forbidden",
];

/// Words of decisions and their reasons (`key_decisions`).
const DECISION_WORDS: &[&str] = &[
    "decided",
    "decide",
    "instead",
    "because",
    "chose",
    "choose",
    "will use",
    "rather than",
    "switch to",
    "going with",
    "opted",
    "trade-off",
];

/// Words of a task statement (`goal`).
const GOAL_WORDS: &[&str] = &[
    "goal",
    "want",
    "need",
    "please",
    "task",
    "implement",
    "fix",
    "add",
    "build",
    "create",
    "support",
];

/// Words of work done (`progress`).
const PROGRESS_WORDS: &[&str] = &[
    "done",
    "fixed",
    "passed",
    "passes",
    "implemented",
    "completed",
    "added",
    "updated",
    "created",
    "resolved",
];

/// Words of work left (`next_steps`).
const NEXT_WORDS: &[&str] = &[
    "next",
    "todo",
    "then",
    "remaining",
    "still",
    "plan",
    "will",
    "need to",
    "after that",
    "follow-up",
];

/// The engine's slot names; any other name gets the generic score.
#[derive(Clone, Copy)]
enum Slot {
    Goal,
    Constraints,
    Progress,
    Decisions,
    NextSteps,
    Critical,
    Other,
}

impl Slot {
    fn parse(s: &str) -> Self {
        match s {
            "goal" => Self::Goal,
            "constraints_preferences" => Self::Constraints,
            "progress" => Self::Progress,
            "key_decisions" => Self::Decisions,
            "next_steps" => Self::NextSteps,
            "critical_context" => Self::Critical,
            _ => Self::Other,
        }
    }
}

/// Whether `word` occurs in `text` (both lowercase) with no letter or digit on either side.
fn has_word(text: &str, word: &str) -> bool {
    let mut from = 0;
    while let Some(p) = text[from..].find(word) {
        let (s, e) = (from + p, from + p + word.len());
        let before = text[..s].chars().next_back();
        let after = text[e..].chars().next();
        if !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric) {
            return true;
        }
        from = s + word.chars().next().map_or(1, char::len_utf8);
    }
    false
}

/// How many of `words` occur in `text`, at most `max`.
fn hits(text: &str, words: &[&str], max: usize) -> f32 {
    words.iter().filter(|w| has_word(text, w)).count().min(max) as f32
}

/// The signals of one message that the scores combine.
struct Signals {
    role: Role,
    fields: Fields,
    text: String,
    tool_calls: bool,
    first_user: bool,
    /// Position in the history, 0 (first) to 1 (last).
    recency: f32,
}

impl Signals {
    fn of(m: &Message, first_user: bool, recency: f32) -> Self {
        let mut text = m.content.clone();
        for c in &m.tool_calls {
            text.push('\n');
            text.push_str(&c.name);
            text.push('\n');
            text.push_str(&arguments_text(&c.arguments));
        }
        Self {
            role: m.role,
            fields: extract_fields(&text),
            text: text.to_lowercase().replace('\u{2019}', "'"),
            tool_calls: !m.tool_calls.is_empty(),
            first_user,
            recency,
        }
    }

    /// Whether a stated test count is a failure ("3 failed", "1 error"; not "0 failed").
    fn failing_tests(&self) -> bool {
        self.fields.test_results.iter().any(|t| {
            let t = t.to_lowercase();
            !t.starts_with("0 ") && (t.contains("failed") || t.contains("error"))
        })
    }

    /// Whether the text reports a failure: a non-zero exit code, a failing test or an error.
    fn failure(&self) -> bool {
        self.fields.exit_codes.iter().any(|&c| c != 0)
            || self.failing_tests()
            || !self.fields.errors.is_empty()
    }

    /// Evidence of work: exit codes (more when non-zero), test results (more when failing),
    /// error lines, patch hunks and file paths.
    fn evidence(&self) -> f32 {
        let f = &self.fields;
        let mut s = 0.0;
        if !f.exit_codes.is_empty() {
            s += 1.0;
            if f.exit_codes.iter().any(|&c| c != 0) {
                s += 1.0;
            }
        }
        if !f.test_results.is_empty() {
            s += 1.0;
            if self.failing_tests() {
                s += 0.5;
            }
        }
        if !f.errors.is_empty() {
            s += 1.0 + 0.25 * f.errors.len().min(4) as f32;
        }
        if !f.patches.is_empty() {
            s += 1.5;
        }
        s + 0.25 * f.paths.len().min(4) as f32
    }

    fn score(&self, slot: Slot) -> f32 {
        let t = self.text.as_str();
        let (user, system, assistant, tool) = (
            self.role == Role::User,
            self.role == Role::System,
            self.role == Role::Assistant,
            self.role == Role::Tool,
        );
        let by_role = |u: f32, s: f32, a: f32, x: f32| {
            if user {
                u
            } else if system {
                s
            } else if assistant {
                a
            } else {
                x
            }
        };
        match slot {
            Slot::Goal => {
                let g = hits(t, GOAL_WORDS, 4);
                let first = if self.first_user { 2.0 } else { 0.0 };
                by_role(3.0 + first + 0.5 * g, 1.0 + 0.25 * g, 0.25 * g, 0.0)
            }
            Slot::Constraints => {
                let c = hits(t, CONSTRAINT_WORDS, 4);
                by_role(2.0 + 1.5 * c, 1.0 + c, 0.3 * c, 0.0)
            }
            Slot::Progress => {
                let p = hits(t, PROGRESS_WORDS, 3);
                let calls = if self.tool_calls { 0.5 } else { 0.0 };
                let base = by_role(0.0, 0.0, calls + 0.5 * p, 1.0);
                base + self.evidence() + 1.5 * self.recency
            }
            Slot::Decisions => {
                let d = hits(t, DECISION_WORDS, 4);
                by_role(0.5 + d, 0.5 * d, 1.0 + 1.5 * d, 0.0)
            }
            Slot::NextSteps => {
                let n = hits(t, NEXT_WORDS, 4);
                let failed = if self.failure() { 0.5 } else { 0.0 };
                let base = by_role(1.5 + 0.5 * n, 0.0, 0.5 + 0.75 * n, failed);
                base + if tool { 1.0 } else { 2.0 } * self.recency
            }
            Slot::Critical => {
                let c = hits(t, CONSTRAINT_WORDS, 4);
                let ids = 0.2 * self.fields.identifiers.len().min(5) as f32;
                self.evidence() + ids + by_role(1.0 + 0.5 * c, 0.5, 0.0, 0.0)
            }
            Slot::Other => {
                let c = hits(t, CONSTRAINT_WORDS, 4);
                0.5 * self.evidence() + by_role(1.0 + 0.5 * c, 0.5, 0.0, 0.0) + 0.5 * self.recency
            }
        }
    }
}

/// One score per message of `history` for the summary slot `slot` (`goal`,
/// `constraints_preferences`, `progress`, `key_decisions`, `next_steps`, `critical_context`;
/// any other name gets a generic score); higher matters more. Deterministic.
///
/// - `goal`: user messages, the first one most, more with task words;
/// - `constraints_preferences`: user (and system) messages, more per constraint word;
/// - `progress`: tool results and assistant tool calls, more per exit code (non-zero more),
///   test result (failing more), error line, patch hunk and path, plus recency;
/// - `key_decisions`: assistant messages, more per decision word;
/// - `next_steps`: user and assistant messages, more per next-step word, plus recency;
///   tool results that report a failure;
/// - `critical_context`: the evidence of `progress`, identifiers, user constraints.
pub fn rank(history: &History, slot: &str) -> Vec<f32> {
    let slot = Slot::parse(slot);
    let n = history.messages.len();
    let first_user = history.messages.iter().position(|m| m.role == Role::User);
    history
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let recency = if n > 1 {
                i as f32 / (n - 1) as f32
            } else {
                1.0
            };
            Signals::of(m, first_user == Some(i), recency).score(slot)
        })
        .collect()
}

/// How a slot view is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewOptions {
    /// Most tokens the view's text may have (as the caller's counter counts them).
    pub budget_tokens: usize,
    /// Messages always kept from the start (while the budget allows).
    pub head_messages: usize,
    /// Messages always kept from the end (while the budget allows; the last one always).
    pub tail_messages: usize,
    /// How kept messages are rendered; messages in `render.omit` are never kept.
    pub render: RenderOptions,
}

impl ViewOptions {
    /// A budget with the default head (2), tail (4) and rendering.
    pub fn new(budget_tokens: usize) -> Self {
        Self {
            budget_tokens,
            head_messages: 2,
            tail_messages: 4,
            render: RenderOptions::default(),
        }
    }
}

impl Default for ViewOptions {
    /// No budget (the full render), head 2, tail 4.
    fn default() -> Self {
        Self::new(usize::MAX)
    }
}

/// A slot-conditioned view of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// The transcript: kept messages in order, one marker line per omitted run.
    pub text: String,
    /// Indices of the kept messages, ascending.
    pub kept: Vec<usize>,
    /// The omitted runs of message indices, ascending (each one marker line in `text`).
    pub omitted: Vec<Range<usize>>,
}

/// Kept messages and the estimated tokens of their view: per-message estimates plus one
/// conservative marker estimate per omitted run.
struct Selection<'a> {
    kept: Vec<bool>,
    est: &'a [usize],
    marker: usize,
    runs: usize,
    total: usize,
}

impl Selection<'_> {
    /// Omitted runs after flipping message `i` (neighbours decide whether a run splits,
    /// shrinks, merges or vanishes).
    fn runs_after_flip(&self, i: usize) -> usize {
        let left = i > 0 && !self.kept[i - 1];
        let right = i + 1 < self.kept.len() && !self.kept[i + 1];
        let (adding, both, neither) = (!self.kept[i], left && right, !left && !right);
        match (adding, both, neither) {
            (true, true, _) | (false, _, true) => self.runs + 1,
            (true, _, true) | (false, true, _) => self.runs.saturating_sub(1),
            _ => self.runs,
        }
    }

    /// The estimated total after flipping message `i`.
    fn total_after_flip(&self, i: usize) -> usize {
        let runs = self.runs_after_flip(i);
        let body = self
            .total
            .saturating_sub(self.runs.saturating_mul(self.marker));
        let body = if self.kept[i] {
            body.saturating_sub(self.est[i])
        } else {
            body.saturating_add(self.est[i])
        };
        body.saturating_add(runs.saturating_mul(self.marker))
    }

    fn flip(&mut self, i: usize) {
        self.total = self.total_after_flip(i);
        self.runs = self.runs_after_flip(i);
        self.kept[i] = !self.kept[i];
    }
}

/// A view of `history` for the summary slot `slot` within `opts.budget_tokens` tokens as
/// `count_tokens` counts them.
///
/// The whole render when it fits. Otherwise the first `head_messages` and last
/// `tail_messages` messages, then other messages by descending [`rank`] score (ties: later
/// first) while the estimated view fits, each estimated by counting its own rendering; the
/// assembled text is counted once and, if it went over, the lowest-ranked additions are
/// dropped until it fits. When head and tail do not fit, head messages go first (latest
/// first), then tail messages (oldest first); the last message is always kept, truncated
/// (smaller tool-result cap, capped content and arguments) when it alone is over budget.
/// With a budget too small for even that, the text is cut to a prefix that fits.
pub fn slot_view(
    history: &History,
    slot: &str,
    opts: &ViewOptions,
    count_tokens: &mut dyn FnMut(&str) -> usize,
) -> View {
    let n = history.messages.len();
    let budget = opts.budget_tokens;
    let allowed: Vec<bool> = (0..n)
        .map(|i| !opts.render.omit.as_ref().is_some_and(|r| r.contains(&i)))
        .collect();
    let full = render(history, &opts.render);
    if count_tokens(&full) <= budget {
        return view(full, &allowed);
    }
    let ids: Vec<usize> = (0..n).filter(|&i| allowed[i]).collect();
    let Some(&last) = ids.last() else {
        return view(prefix_within(&full, budget, count_tokens), &allowed);
    };

    let cap = opts.render.tool_result_cap;
    let est: Vec<usize> = history
        .messages
        .iter()
        .map(|m| count_tokens(&render_message(m, cap)))
        .collect();
    let all_chars: usize = history
        .messages
        .iter()
        .map(|m| m.content.chars().count())
        .sum();
    let marker = count_tokens(&format!(
        "[... messages {n}-{n} ({n} messages, {all_chars} characters) omitted ...]\n\n"
    ));
    let mut sel = Selection {
        kept: vec![false; n],
        est: &est,
        marker,
        runs: usize::from(n > 0),
        total: marker,
    };

    // Head and tail, then drop them (head latest first, tail oldest first) while over.
    let head: Vec<usize> = ids.iter().copied().take(opts.head_messages).collect();
    let tail_from = ids.len().saturating_sub(opts.tail_messages.max(1));
    let tail = &ids[tail_from..];
    let mut must_drop: Vec<usize> = head
        .iter()
        .rev()
        .copied()
        .filter(|i| !tail.contains(i))
        .collect();
    must_drop.extend(tail.iter().copied().filter(|&i| i != last));
    for &i in head.iter().chain(tail) {
        if !sel.kept[i] {
            sel.flip(i);
        }
    }
    let mut must_drop = must_drop.into_iter();
    while sel.total > budget {
        match must_drop.next() {
            Some(i) => sel.flip(i),
            None => break,
        }
    }

    // Other messages by descending score (ties: later first) while the estimate fits.
    let scores = rank(history, slot);
    let mut order: Vec<usize> = ids.iter().copied().filter(|&i| !sel.kept[i]).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(b.cmp(&a)));
    let mut added = Vec::new();
    for i in order {
        if sel.total_after_flip(i) <= budget {
            sel.flip(i);
            added.push(i);
        }
    }

    // Count the text once; while over, drop the lowest-ranked additions (then head and tail)
    // until the estimate has shed the excess, and count again.
    let mut drops = added.into_iter().rev().chain(must_drop);
    loop {
        let text = render_kept(history, &sel.kept, &opts.render);
        let tokens = count_tokens(&text);
        if tokens <= budget {
            return view(text, &sel.kept);
        }
        let target = sel.total.saturating_sub(tokens - budget);
        let mut dropped = false;
        while !dropped || sel.total > target {
            match drops.next() {
                Some(i) => {
                    sel.flip(i);
                    dropped = true;
                }
                None => break,
            }
        }
        if !dropped {
            break;
        }
    }

    // Only the last message is left and it is over budget: truncate it.
    let text = truncated_last(history, last, &sel.kept, &opts.render, budget, count_tokens);
    view(text, &sel.kept)
}

/// The view of `text` with the messages flagged in `kept`.
fn view(text: String, kept: &[bool]) -> View {
    View {
        text,
        kept: (0..kept.len()).filter(|&i| kept[i]).collect(),
        omitted: omitted_runs(kept),
    }
}

/// The rendering with message `last` truncated to the most characters (content, arguments and
/// tool-result cap) that fit `budget`; a prefix of the 0-character rendering if none does.
fn truncated_last(
    history: &History,
    last: usize,
    kept: &[bool],
    render: &RenderOptions,
    budget: usize,
    count_tokens: &mut dyn FnMut(&str) -> usize,
) -> String {
    let original = &history.messages[last];
    let longest = original
        .tool_calls
        .iter()
        .map(|c| arguments_text(&c.arguments).chars().count())
        .chain([original.content.chars().count()])
        .max()
        .unwrap_or(0);
    let mut h = history.clone();
    let mut at = |limit: usize| {
        let m = &mut h.messages[last];
        if m.role != Role::Tool {
            m.content = cap(&original.content, limit);
        }
        for (c, o) in m.tool_calls.iter_mut().zip(&original.tool_calls) {
            c.arguments = Arguments::Raw(cap(&arguments_text(&o.arguments), limit));
        }
        let opts = RenderOptions {
            tool_result_cap: render.tool_result_cap.min(limit),
            omit: render.omit.clone(),
        };
        render_kept(&h, kept, &opts)
    };
    // Largest limit that fits: lo fits (or is 0), hi does not.
    let (mut lo, mut hi) = (0, longest);
    let mut best = at(0);
    if count_tokens(&best) > budget {
        return prefix_within(&best, budget, count_tokens);
    }
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        let text = at(mid);
        if count_tokens(&text) <= budget {
            (lo, best) = (mid, text);
        } else {
            hi = mid;
        }
    }
    best
}

/// The longest prefix of `text` (at a character boundary) that fits `budget`.
fn prefix_within(text: &str, budget: usize, count_tokens: &mut dyn FnMut(&str) -> usize) -> String {
    let bounds: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .collect();
    let (mut lo, mut hi) = (0, bounds.len());
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if count_tokens(&text[..bounds[mid]]) <= budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    text[..bounds[lo]].to_string()
}
