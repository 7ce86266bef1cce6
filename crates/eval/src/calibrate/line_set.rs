//! The labelled line set, made mechanically from dev sessions (no hand labels): positive
//! lines from target-written summaries, probe quotes and fact-bearing history sentences;
//! negatives by corrupting one fact of a positive (a swapped fact, an inserted negation, a
//! flipped outcome) or by taking another session's line. Deterministic: same input, same set,
//! in the same order.

use serde::Serialize;
use speccompact_engine::{sections, CompactionConfig};
use speccompact_history::facts;

/// Where a labelled line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LineKind {
    /// A line of a target-written summary (positive).
    Summary,
    /// A history sentence quoting a probe string (positive).
    ProbeQuote,
    /// Another history sentence that carries a fact (positive).
    Quote,
    /// One fact swapped for a fact of another session (negative).
    SwapFact,
    /// A negation inserted (negative).
    Negation,
    /// An outcome word flipped (negative).
    OutcomeFlip,
    /// A positive line of another session (negative).
    OtherSession,
}

impl LineKind {
    /// Whether lines of this kind are true.
    pub fn positive(self) -> bool {
        matches!(self, Self::Summary | Self::ProbeQuote | Self::Quote)
    }
    /// The kind's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Summary => "summary",
            Self::ProbeQuote => "probe-quote",
            Self::Quote => "quote",
            Self::SwapFact => "swap-fact",
            Self::Negation => "negation",
            Self::OutcomeFlip => "outcome-flip",
            Self::OtherSession => "other-session",
        }
    }
}

/// One labelled line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Labelled {
    /// Session it is judged against.
    pub session: String,
    /// Slot it is judged in.
    pub slot: String,
    /// The line.
    pub text: String,
    /// Kind (and so the label).
    pub kind: LineKind,
    /// For corruptions: the positive line it was made from.
    pub original: Option<String>,
}

impl Labelled {
    /// The label.
    pub fn positive(&self) -> bool {
        self.kind.positive()
    }
}

/// A session as the generator reads it.
#[derive(Debug, Clone)]
pub struct SessionSource {
    /// Session id.
    pub id: String,
    /// The rendered history.
    pub transcript: String,
    /// Target-written summary lines: (slot name, line).
    pub summary: Vec<(String, String)>,
    /// Probe strings (identifier/file probes) with their slot.
    pub probes: Vec<(String, String)>,
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Replaces the first fact of `line` by a fact from `pool` that does not occur in
/// `transcript` (same shape preferred: all digits for all digits). Returns the new line, the
/// fact replaced and its replacement.
pub fn swap_fact(
    line: &str,
    pool: &[String],
    transcript: &str,
) -> Option<(String, String, String)> {
    let f = *facts(line).first()?;
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    let cands: Vec<&String> = pool
        .iter()
        .filter(|p| p.as_str() != f && !transcript.contains(p.as_str()) && digits(p) == digits(f))
        .collect();
    let to = cands.get((fnv(line) % cands.len().max(1) as u64) as usize)?;
    let at = line.find(f)?;
    Some((
        format!("{}{}{}", &line[..at], to, &line[at + f.len()..]),
        f.to_string(),
        to.to_string(),
    ))
}

const AUXILIARIES: &[&str] = &[
    "is", "are", "was", "were", "has", "have", "had", "will", "can", "should", "does", "did",
    "must", "could", "would",
];

/// Inserts one negation: "not" after the first auxiliary verb. `None` when the line has no
/// auxiliary or is already negated.
pub fn negate(line: &str) -> Option<String> {
    let lower = line.to_lowercase();
    if lower
        .split_whitespace()
        .any(|w| matches!(w, "not" | "no" | "never" | "n't"))
        || lower.contains("n't")
    {
        return None;
    }
    let mut at = 0;
    for w in line.split_inclusive(' ') {
        let bare = w
            .trim()
            .trim_end_matches([',', '.', ':', ';'])
            .to_lowercase();
        if AUXILIARIES.contains(&bare.as_str()) && w.ends_with(' ') {
            let end = at + w.len() - 1;
            return Some(format!("{} not{}", &line[..end], &line[end..]));
        }
        at += w.len();
    }
    None
}

const FLIPS: &[(&str, &str)] = &[
    ("approved", "refused"),
    ("refused", "approved"),
    ("accepted", "rejected"),
    ("rejected", "accepted"),
    ("passed", "failed"),
    ("failed", "passed"),
    ("succeeded", "failed"),
    ("successful", "unsuccessful"),
    ("successfully", "unsuccessfully"),
    ("cancelled", "confirmed"),
    ("canceled", "confirmed"),
    ("confirmed", "cancelled"),
    ("booked", "cancelled"),
    ("added", "removed"),
    ("removed", "added"),
    ("fixed", "broken"),
    ("resolved", "unresolved"),
    ("enabled", "disabled"),
    ("disabled", "enabled"),
    ("increased", "decreased"),
    ("decreased", "increased"),
    ("true", "false"),
    ("false", "true"),
    ("allowed", "forbidden"),
    ("agreed", "disagreed"),
    ("completed", "abandoned"),
    ("created", "deleted"),
    ("deleted", "created"),
    ("upgraded", "downgraded"),
    ("refunded", "charged"),
];

/// Flips the first outcome word (whole word, case kept for the first letter). Returns the
/// new line, the word and its flip.
pub fn flip_outcome(line: &str) -> Option<(String, String, String)> {
    let mut at = 0;
    for w in line.split_inclusive(|c: char| !c.is_alphanumeric()) {
        let word: String = w.chars().take_while(|c| c.is_alphanumeric()).collect();
        let lw = word.to_lowercase();
        if let Some((_, to)) = FLIPS.iter().find(|(from, _)| *from == lw) {
            let mut rep = to.to_string();
            if word.chars().next().is_some_and(char::is_uppercase) {
                rep = rep[..1].to_uppercase() + &rep[1..];
            }
            return Some((
                format!("{}{}{}", &line[..at], rep, &line[at + word.len()..]),
                word,
                rep,
            ));
        }
        at += w.len();
    }
    None
}

/// Cuts a history sentence around `needle` to at most `max` characters, on word bounds.
fn quote_around(line: &str, needle: &str, max: usize) -> String {
    let line = line.trim();
    if line.chars().count() <= max {
        return line.to_string();
    }
    let at = line.find(needle).unwrap_or(0);
    let start = line[..at]
        .char_indices()
        .rev()
        .map(|(i, _)| i)
        .find(|&i| at - i >= max / 2 && line[i..].starts_with(' '))
        .unwrap_or(0);
    let s: String = line[start..].chars().take(max).collect();
    let s = match s.rfind(' ') {
        Some(i) if i > needle.len() && s.len() == max => s[..i].to_string(),
        _ => s,
    };
    s.trim().to_string()
}

/// The labelled line set: per session at most `per_session` positives (summary lines first,
/// then probe quotes, then other quotes), each followed by one negative whose kind cycles
/// through swap-fact, negation, outcome-flip and other-session (the next applicable one).
pub fn line_set(sessions: &[SessionSource], per_session: usize) -> Vec<Labelled> {
    // Positives of every session first (other-session negatives draw from them).
    let mut positives: Vec<Vec<Labelled>> = Vec::new();
    for s in sessions {
        let mut p: Vec<Labelled> = Vec::new();
        let push = |p: &mut Vec<Labelled>, slot: &str, text: String, kind| {
            if p.len() < per_session && !p.iter().any(|x| x.text == text) {
                p.push(Labelled {
                    session: s.id.clone(),
                    slot: slot.to_string(),
                    text,
                    kind,
                    original: None,
                });
            }
        };
        for (slot, line) in &s.summary {
            let body = line.trim();
            let f = facts(body);
            if body.len() >= 12 && !f.is_empty() && f.iter().all(|x| s.transcript.contains(x)) {
                push(&mut p, slot, body.to_string(), LineKind::Summary);
            }
        }
        for (probe, slot) in &s.probes {
            if let Some(l) = s.transcript.lines().find(|l| l.contains(probe.as_str())) {
                push(
                    &mut p,
                    slot,
                    format!("- {}", quote_around(l, probe, 160)),
                    LineKind::ProbeQuote,
                );
            }
        }
        // Other quotes: sentences of the history (not JSON, not role markers) with a fact.
        for l in s.transcript.lines() {
            let l = l.trim();
            if l.starts_with('[') || l.starts_with('{') {
                continue;
            }
            for sent in l.split_inclusive(". ") {
                let sent = sent.trim();
                if (30..=200).contains(&sent.chars().count()) && !facts(sent).is_empty() {
                    push(
                        &mut p,
                        "critical_context",
                        format!("- {sent}"),
                        LineKind::Quote,
                    );
                }
            }
        }
        positives.push(p);
    }
    let pool: Vec<Vec<String>> = positives
        .iter()
        .map(|ps| {
            let mut v: Vec<String> = ps
                .iter()
                .flat_map(|p| facts(&p.text).into_iter().map(str::to_string))
                .collect();
            v.sort();
            v.dedup();
            v
        })
        .collect();
    let mut out = Vec::new();
    let kinds = [
        LineKind::SwapFact,
        LineKind::Negation,
        LineKind::OutcomeFlip,
        LineKind::OtherSession,
    ];
    let mut turn = 0usize;
    for (si, ps) in positives.iter().enumerate() {
        let others: Vec<String> = pool
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != si)
            .flat_map(|(_, v)| v.iter().cloned())
            .collect();
        let transcript = &sessions[si].transcript;
        for p in ps {
            out.push(p.clone());
            for k in 0..kinds.len() {
                let kind = kinds[(turn + k) % kinds.len()];
                let made = match kind {
                    LineKind::SwapFact => swap_fact(&p.text, &others, transcript).map(|x| x.0),
                    LineKind::Negation => negate(&p.text),
                    LineKind::OutcomeFlip => flip_outcome(&p.text).map(|x| x.0),
                    _ => positives
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != si)
                        .flat_map(|(_, v)| v.iter())
                        .filter(|o| facts(&o.text).iter().all(|f| !transcript.contains(f)))
                        .nth((fnv(&p.text) % 7) as usize)
                        .map(|o| o.text.clone()),
                };
                if let Some(text) = made {
                    out.push(Labelled {
                        session: p.session.clone(),
                        slot: p.slot.clone(),
                        text,
                        kind,
                        original: Some(p.text.clone()),
                    });
                    turn = (turn + k + 1) % kinds.len();
                    break;
                }
            }
        }
    }
    out
}

/// Summary lines of a markdown summary: (slot name by heading title, line), headings and
/// blank lines left out.
pub fn summary_lines(cfg: &CompactionConfig, markdown: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (_, lines) in sections(markdown) {
        let Some((heading, body)) = lines.split_first() else {
            continue;
        };
        let Some(slot) = cfg.slot_for_heading(heading) else {
            continue;
        };
        let name = &cfg.slots[slot].name;
        for l in body {
            if !l.trim().is_empty() && !l.starts_with('#') && l.trim() != "(none)" {
                out.push((name.clone(), l.trim().to_string()));
            }
        }
    }
    out
}
