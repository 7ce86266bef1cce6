//! What a compaction returns and reports: the method, the slots and their lines, why each
//! slot ended, the trace of counters and times, and the progress events.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// A compaction method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// Drafter proposes lines, target verifies each with one token and repairs rejections.
    Speculative,
    /// The target writes the whole summary in one generation.
    Sequential,
    /// The target writes each slot on its own (six batched streams), no drafter.
    TargetSelf,
    /// The drafter writes each slot, nothing is verified: a latency floor.
    DrafterOnly,
}

impl Method {
    /// Every method, ours first.
    pub const ALL: [Method; 4] = [
        Method::Speculative,
        Method::Sequential,
        Method::TargetSelf,
        Method::DrafterOnly,
    ];

    /// The method's command-line name.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Speculative => "speculative",
            Method::Sequential => "sequential",
            Method::TargetSelf => "target-self",
            Method::DrafterOnly => "drafter-only",
        }
    }

    pub(crate) fn uses_drafter(self) -> bool {
        matches!(self, Method::Speculative | Method::DrafterOnly)
    }

    pub(crate) fn uses_target(self) -> bool {
        !matches!(self, Method::DrafterOnly)
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Method {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Method::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| Error::Config {
                origin: "method".into(),
                reason: format!(
                    "unknown method `{s}` (speculative, sequential, target-self, drafter-only)"
                ),
            })
    }
}

/// Who wrote a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Drafted and accepted by verification (or kept unverified by `drafter-only`).
    Draft,
    /// Written by the target in place of a rejected or failed draft.
    Repair,
    /// Accepted without verification: sub-headings, empty-slot markers, blank lines.
    Auto,
    /// Written by the target in a baseline without a drafter.
    Target,
}

/// One line of a slot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LineOut {
    /// The text.
    pub text: String,
    /// Who wrote it.
    pub origin: Origin,
    /// The verification ratio, for verified lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub r: Option<f32>,
}

/// Why a slot ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotStop {
    /// A model ended the section.
    Complete,
    /// The line cap was reached.
    MaxLines,
    /// The next line would exceed the slot's token budget.
    TokenBudget,
    /// A repair came back empty or unusable.
    RepairFailed,
    /// The round limit was reached (a safeguard; reported, never silent).
    RoundLimit,
}

/// One slot of the summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotOut {
    /// Slot name.
    pub name: String,
    /// Slot title.
    pub title: String,
    /// Its lines in order.
    pub lines: Vec<LineOut>,
    /// Why it ended.
    pub stop: SlotStop,
    /// Target tokens of its lines.
    pub tokens: usize,
}

impl SlotOut {
    /// A finished slot; trailing blank lines (formatting with nothing after it) are dropped.
    pub fn new(
        spec: &crate::SlotSpec,
        mut lines: Vec<LineOut>,
        stop: SlotStop,
        tokens: usize,
    ) -> Self {
        while lines.last().is_some_and(|l| l.text.trim().is_empty()) {
            lines.pop();
        }
        Self {
            name: spec.name.clone(),
            title: spec.title.clone(),
            lines,
            stop,
            tokens,
        }
    }
}

/// Counters and times of one compaction. Reading a report back, fields it lacks (written
/// before they existed) are zero or empty.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Trace {
    /// Whole compaction, history rendering and prefill included.
    pub wall_ms: f64,
    /// Prefilling the shared prefixes.
    pub prefill_ms: f64,
    /// Drafter batches.
    pub draft_ms: f64,
    /// Verification batches.
    pub verify_ms: f64,
    /// Repair batches (and the baselines' target generation).
    pub repair_ms: f64,
    /// Drafter requests.
    pub drafter_calls: usize,
    /// Lines judged by the target.
    pub verify_calls: usize,
    /// Target generation requests (repairs, baseline generations).
    pub repair_calls: usize,
    /// Batched model calls (one per drafter / verify / repair batch).
    pub batches: usize,
    /// Drafted lines that went through the checks.
    pub lines_proposed: usize,
    /// Drafted lines kept as drafted (verified or auto-accepted).
    pub lines_accepted: usize,
    /// Drafted lines the target judged and rejected.
    pub lines_rejected: usize,
    /// Drafted lines sent to repair by the checks (duplicate, too long).
    pub lines_failed_checks: usize,
    /// Lines written by repairs and kept.
    pub lines_repaired: usize,
    /// Repairs that continued a rejected line from its first divergence (not from its start).
    pub repairs_from_divergence: usize,
    /// Target tokens those repairs took over from the rejected lines.
    pub repair_kept_tokens: usize,
    /// Lossless mode: drafted tokens the target checked (in its tokenization).
    pub spec_tokens_drafted: usize,
    /// Lossless mode: drafted tokens that were the target's greedy tokens and were kept.
    pub spec_tokens_kept: usize,
    /// Target-written whole bodies of slots that had no content line (one per such slot).
    pub whole_slot_calls: usize,
    /// Lines those bodies added (origin `repair`).
    pub whole_slot_lines: usize,
    /// lines_accepted / lines_proposed (0 when nothing was proposed).
    pub acceptance_rate: f64,
    /// Tokens the drafter generated.
    pub drafter_tokens: usize,
    /// Tokens the target generated.
    pub target_tokens: usize,
    /// Shared prefix of the target, in tokens (0 when unused).
    pub target_prefix_tokens: usize,
    /// Shared prefix of the drafter, in tokens (0 when unused; the sum over slot views).
    pub drafter_prefix_tokens: usize,
    /// Target prefix positions taken from an earlier prefill of the session (not computed).
    pub target_prefix_reused: usize,
    /// Drafter prefix positions taken from an earlier prefill (of the session, or of another
    /// slot's view).
    pub drafter_prefix_reused: usize,
    /// Slot views the drafter read (0: it read the whole history).
    pub drafter_views: usize,
    /// Messages each slot view left out, per slot (empty without views).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub view_omitted_messages: Vec<usize>,
    /// How each model computed (`target`, `drafter`): kernels, dense copies, batch
    /// invariance; what makes the same command give the same summary.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub numerics: std::collections::BTreeMap<String, String>,
    /// Token lookup in this compaction's decodes, per model (`target`, `drafter`): proposed
    /// tokens fed, tokens kept (each one a forward saved), forwards that carried proposals.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub lookup: std::collections::BTreeMap<String, speccompact_runtime::LookupCounters>,
    /// Stages run for a history longer than the target's context (empty: one stage).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<Stage>,
    /// Messages left out by a middle cut (first and last, 1-based), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub omitted_messages: Option<(usize, usize)>,
    /// Target tokens of the assembled summary.
    pub summary_tokens: usize,
    /// Every judgment in order: the distribution of r for accepted and rejected lines.
    pub judgments: Vec<Judged>,
}

/// One stage of a compaction in stages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    /// Messages of the original history it compacted (1-based, inclusive).
    pub messages: (usize, usize),
    /// Whether its input began with the summary of the stages before it.
    pub carried_summary: bool,
    /// Its wall time.
    pub wall_ms: f64,
}

/// One line judged by the target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judged {
    /// Slot name.
    pub slot: String,
    /// p_yes / (p_yes + p_no).
    pub r: f32,
    /// Whether the line was accepted.
    pub accepted: bool,
    /// The line's token-level scores from the verification forward.
    pub scores: crate::verify::LineScores,
    /// The calibrated rule's probability that the line is true (absent under the ratio
    /// rule).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probability: Option<f64>,
    /// Why it was decided: `ratio`, `rule` or `own-line` (the target's greedy line).
    pub by: &'static str,
}

/// The ways a line is decided, as [`Judged::by`] names them.
pub const DECIDED_BY: [&str; 3] = ["ratio", "rule", "own-line"];

/// [`Judged`] as read from a report (its `by` owned until checked). Reports written before
/// the token scores and the line rule existed judged by the ratio alone.
#[derive(Deserialize)]
struct JudgedRecord {
    slot: String,
    r: f32,
    accepted: bool,
    #[serde(default)]
    scores: crate::verify::LineScores,
    #[serde(default)]
    probability: Option<f64>,
    #[serde(default = "ratio")]
    by: String,
}

fn ratio() -> String {
    DECIDED_BY[0].to_string()
}

impl<'de> Deserialize<'de> for Judged {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let j = JudgedRecord::deserialize(d)?;
        let by = DECIDED_BY
            .into_iter()
            .find(|b| *b == j.by)
            .ok_or_else(|| serde::de::Error::unknown_variant(&j.by, &DECIDED_BY))?;
        Ok(Judged {
            slot: j.slot,
            r: j.r,
            accepted: j.accepted,
            scores: j.scores,
            probability: j.probability,
            by,
        })
    }
}

/// A finished compaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compaction {
    /// The method that produced it.
    pub method: Method,
    /// The slots, in schema order.
    pub slots: Vec<SlotOut>,
    /// The summary as markdown.
    pub markdown: String,
    /// Counters and times.
    pub trace: Trace,
}

/// Progress of a compaction, for UIs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The shared prefixes are prefilled.
    Prefilled {
        /// Target prefix tokens.
        target_tokens: usize,
        /// Drafter prefix tokens.
        drafter_tokens: usize,
    },
    /// A line was kept.
    LineAccepted {
        /// Slot name.
        slot: String,
        /// The line.
        text: String,
        /// Who wrote it.
        origin: Origin,
        /// Verification ratio, if judged.
        r: Option<f32>,
    },
    /// A drafted line was rejected (by the judge or by the checks) and goes to repair.
    LineRejected {
        /// Slot name.
        slot: String,
        /// The rejected line.
        text: String,
        /// Verification ratio, if judged.
        r: Option<f32>,
    },
    /// A slot is finished.
    SlotDone {
        /// Slot name.
        slot: String,
        /// Why.
        stop: SlotStop,
    },
}

/// The summary as markdown: `## Title` then the slot's lines, slots in order.
pub fn markdown(slots: &[SlotOut]) -> String {
    let mut s = String::new();
    for slot in slots {
        s.push_str(&format!("## {}\n", slot.title));
        for l in &slot.lines {
            s.push_str(&l.text);
            s.push('\n');
        }
        s.push('\n');
    }
    s
}

/// Splits a markdown summary into its `## ` sections: (title, lines with the heading first).
/// Lines before the first heading form a section with an empty title. The one splitter of
/// summaries: what [`markdown`] writes, every reader splits with this.
pub fn sections(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("## ") {
            out.push((t.trim().to_string(), vec![line.to_string()]));
        } else if let Some(last) = out.last_mut() {
            last.1.push(line.to_string());
        } else {
            out.push((String::new(), vec![line.to_string()]));
        }
    }
    out
}
