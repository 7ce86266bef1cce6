//! Verifier calibration: how well the target's one-token judgment separates true summary
//! lines from false ones, per judgment prompt variant, and the η to use.
//!
//! - The labelled line set is made mechanically from dev sessions (no hand labels). Positive
//!   lines: lines of target-written summaries whose facts (identifiers, numbers, paths) all
//!   occur in the history, lines quoting a probe string from the history, and other history
//!   sentences that carry a fact. Negative lines: each positive with one fact corrupted — a
//!   fact swapped for one from another session, a negation inserted, an outcome word flipped
//!   — or a positive line of another session. The generator is deterministic: same input,
//!   same set, in the same order.
//! - Scoring runs the engine's own judgment (shared prefix with the history, the slot
//!   request, the line, the question) for every variant; variants that share the prefix rule
//!   share one prefill per session.
//! - Metrics: ROC AUC, accept rate of positives and false-accept rate of negatives per η, and
//!   the calibration rule [`choose_eta`].

use crate::models::{run_queues, STREAMS};
use crate::Result;
use serde::Serialize;
use speccompact_engine::calibration::Variant;
use speccompact_engine::judge::score;
use speccompact_engine::verify::{Divergence, LineScores};
use speccompact_engine::{prompt, sections, Backend, CompactionConfig, Compactor, Method, Request, RequestKind};
use speccompact_history::History;

pub mod line_rule;

// ------------------------------------------------------------------------------------------
// The line set.

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

fn is_fact(w: &str) -> bool {
    w.len() >= 2
        && (w.chars().any(|c| c.is_ascii_digit())
            || w.contains('_')
            || (w.contains('/') && w.chars().any(|c| c.is_alphabetic()))
            || (w.len() >= 4
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())))
}

/// The facts of a text: identifiers, numbers and paths, as they appear.
pub fn facts(text: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for w in text.split(|c: char| c.is_whitespace() || ",;:()[]{}\"'`<>=".contains(c)) {
        let w = w.trim_end_matches(['.', '!', '?']);
        if is_fact(w) && !out.contains(&w) {
            out.push(w);
        }
    }
    out
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

// ------------------------------------------------------------------------------------------
// Scoring.

/// Scores every line under every variant with the target of `c`, as the engine judges: the
/// shared prefix (instructions, history, schema; the variant's rule), the slot's request, the
/// line, the variant's question, all scores of a line from that one forward. Returns the
/// scores per line per variant.
pub fn score_lines<B: Backend + 'static>(
    c: &Compactor<B>,
    history: &History,
    lines: &[&Labelled],
    variants: &[Variant],
) -> Result<Vec<Vec<LineScores>>> {
    let target = c.target();
    let (transcript, _) = c.transcript(history, Method::Sequential)?;
    let div = Divergence {
        rank: c.config().divergence_rank,
        floor: c.config().divergence_floor,
    };
    let none = LineScores {
        r: 0.0,
        mean_logprob: 0.0,
        min_logprob: 0.0,
        greedy_fraction: 0.0,
        tokens: 0,
        divergence: None,
    };
    let mut out = vec![vec![none; variants.len()]; lines.len()];
    // Variants sharing a rule share the prefill.
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        match groups.iter_mut().find(|(r, _)| *r == v.judge_rule) {
            Some(g) => g.1.push(i),
            None => groups.push((v.judge_rule.clone(), vec![i])),
        }
    }
    for (rule, members) in groups {
        let mut cfg = c.config().clone();
        cfg.prompts.judge_rule = rule;
        let prefix = prompt::prefix(target.format(), &cfg, &transcript);
        let mut session = target.open(&prefix)?;
        // Six streams; each takes its lines in turn with every variant of the group back to
        // back, so the slot request and the line stay cached and only the question is new.
        let mut queues: Vec<Vec<(usize, usize)>> = vec![Vec::new(); STREAMS];
        for li in 0..lines.len() {
            for &vi in &members {
                queues[li % STREAMS].push((li, vi));
            }
        }
        run_queues(
            target,
            &mut session,
            &queues,
            |stream, &(li, vi)| {
                let mut vc = cfg.clone();
                variants[vi].apply(&mut vc);
                let slot = cfg
                    .slots
                    .iter()
                    .find(|s| s.name == lines[li].slot)
                    .unwrap_or(&cfg.slots[cfg.slots.len() - 1]);
                Request {
                    stream,
                    prompt: vec![
                        prompt::slot_request(target.format(), &vc, slot),
                        format!("{}\n", lines[li].text),
                        prompt::judge_question(target.format(), &vc),
                    ],
                    kind: RequestKind::Verify {
                        top_k: cfg.top_k,
                        line: 1,
                    },
                    lines: Default::default(),
                }
            },
            |&(li, vi), r| {
                let v = r.into_verified(target.name())?;
                let mut vc = cfg.clone();
                variants[vi].apply(&mut vc);
                let j = score(&v.top, &vc.positive_labels, &vc.negative_labels);
                out[li][vi] = LineScores::new(&j, &v.line, &div);
                Ok(())
            },
        )?;
    }
    Ok(out)
}

// ------------------------------------------------------------------------------------------
// Metrics.

/// ROC AUC: the probability that a random positive scores above a random negative (ties
/// count half).
pub fn auc(pos: &[f32], neg: &[f32]) -> f64 {
    if pos.is_empty() || neg.is_empty() {
        return f64::NAN;
    }
    let mut s = 0.0;
    for p in pos {
        for n in neg {
            s += if p > n {
                1.0
            } else if p == n {
                0.5
            } else {
                0.0
            };
        }
    }
    s / (pos.len() * neg.len()) as f64
}

/// Rates at one η.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rates {
    /// Threshold.
    pub eta: f32,
    /// Share of positives with r >= η.
    pub accept: f64,
    /// Share of negatives with r >= η.
    pub false_accept: f64,
}

impl Rates {
    /// (accept + (1 - false_accept)) / 2.
    pub fn balanced_accuracy(&self) -> f64 {
        (self.accept + 1.0 - self.false_accept) / 2.0
    }
}

/// Rates at `eta`.
pub fn rates(pos: &[f32], neg: &[f32], eta: f32) -> Rates {
    let share = |v: &[f32]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().filter(|&&r| r >= eta).count() as f64 / v.len() as f64
        }
    };
    Rates {
        eta,
        accept: share(pos),
        false_accept: share(neg),
    }
}

/// The largest false-accept rate the calibration rule tolerates.
pub const MAX_FALSE_ACCEPT: f64 = 0.10;
/// The smallest accept rate of true lines worth that rule.
pub const MIN_ACCEPT: f64 = 0.50;

/// The calibration rule, on η in 0.01 steps: the lowest η whose false-accept rate is at most
/// 10 % while it still accepts at least half of the true lines (speed with a bound on
/// errors); when no η does both, the η of best balanced accuracy (lowest on ties). Returns
/// the rates at the chosen η and the rule that chose it.
pub fn choose_eta(pos: &[f32], neg: &[f32]) -> (Rates, String) {
    let grid: Vec<Rates> = (1..=100)
        .map(|i| rates(pos, neg, i as f32 / 100.0))
        .collect();
    if let Some(r) = grid
        .iter()
        .find(|r| r.false_accept <= MAX_FALSE_ACCEPT && r.accept >= MIN_ACCEPT)
    {
        return (
            *r,
            "lowest eta with false-accept <= 10 % and accept >= 50 %".into(),
        );
    }
    let mut best = grid[0];
    for r in &grid {
        if r.balanced_accuracy() > best.balanced_accuracy() + 1e-12 {
            best = *r;
        }
    }
    (
        best,
        "best balanced accuracy (no eta kept false-accept <= 10 % with accept >= 50 %)".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions() -> Vec<SessionSource> {
        vec![
            SessionSource {
                id: "a".into(),
                transcript: "user: My user id is emma_kim_9957 and reservation MDCLVA.\nassistant: The reservation MDCLVA was cancelled and refunded.\ntool: flight HAT170 is booked for 2024-05-17".into(),
                summary: vec![
                    ("critical_context".into(), "- Reservation MDCLVA was cancelled for emma_kim_9957.".into()),
                    ("progress".into(), "- Flight HAT999 was booked.".into()),
                ],
                probes: vec![("emma_kim_9957".into(), "critical_context".into())],
            },
            SessionSource {
                id: "b".into(),
                transcript: "user: Fix tests/test_io.py, the parser fails on line 42.\ntool: 3 failed, exit 1 in src/parse.rs".into(),
                summary: vec![("progress".into(), "- The parser in src/parse.rs has 3 failed tests.".into())],
                probes: vec![("tests/test_io.py".into(), "progress".into())],
            },
        ]
    }

    fn words(s: &str) -> Vec<&str> {
        s.split_whitespace().collect()
    }

    #[test]
    fn each_corruption_changes_exactly_the_intended_fact() {
        let line = "- Reservation MDCLVA was cancelled for emma_kim_9957.";
        let (swapped, from, to) =
            swap_fact(line, &["OWZ4XL".into(), "MDCLVA".into()], "MDCLVA").unwrap();
        assert_eq!((from.as_str(), to.as_str()), ("MDCLVA", "OWZ4XL"));
        let (a, b) = (words(line), words(&swapped));
        assert_eq!(a.len(), b.len());
        let diff: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
        assert_eq!(diff, [2]);
        // A replacement that occurs in the history is never used.
        assert!(swap_fact(line, &["MDCLVA".into()], "MDCLVA").is_none());

        let neg = negate(line).unwrap();
        assert_eq!(
            neg,
            "- Reservation MDCLVA was not cancelled for emma_kim_9957."
        );
        assert_eq!(neg.replacen(" not", "", 1), line);
        assert!(negate("- The build did not pass.").is_none());
        assert!(negate("- Reservation MDCLVA for emma.").is_none());

        let (flipped, w, r) = flip_outcome("- Refund Approved for MDCLVA.").unwrap();
        assert_eq!(
            (flipped.as_str(), w.as_str(), r.as_str()),
            ("- Refund Refused for MDCLVA.", "Approved", "Refused")
        );
        let (flipped, _, _) = flip_outcome(line).unwrap();
        let (a, b) = (words(line), words(&flipped));
        let diff: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
        assert_eq!(diff, [4]);
        assert_eq!(b[4], "confirmed");
        assert!(flip_outcome("- The reservation MDCLVA exists.").is_none());
    }

    #[test]
    fn line_set_is_deterministic_labelled_and_sourced() {
        let s = sessions();
        let set = line_set(&s, 10);
        assert_eq!(set, line_set(&s, 10), "deterministic");
        // The unsupported summary line (HAT999 is not in the history) is not a positive.
        assert!(!set
            .iter()
            .any(|l| l.positive() && l.text.contains("HAT999")));
        let pos = set.iter().filter(|l| l.positive()).count();
        let neg = set.len() - pos;
        assert_eq!(pos, neg, "one negative per positive");
        for l in &set {
            if l.positive() {
                assert!(facts(&l.text).iter().all(|f| s
                    .iter()
                    .find(|x| x.id == l.session)
                    .unwrap()
                    .transcript
                    .contains(f)));
            } else {
                assert_ne!(Some(&l.text), l.original.as_ref());
            }
        }
        let kinds: std::collections::BTreeSet<LineKind> = set.iter().map(|l| l.kind).collect();
        for k in [
            LineKind::Summary,
            LineKind::ProbeQuote,
            LineKind::SwapFact,
            LineKind::Negation,
            LineKind::OutcomeFlip,
        ] {
            assert!(kinds.contains(&k), "{k:?} in {kinds:?}");
        }
        assert!(set
            .iter()
            .any(|l| l.kind == LineKind::ProbeQuote && l.text.contains("tests/test_io.py")));
        // Other-session lines carry no fact of the session they are judged against.
        for l in set.iter().filter(|l| l.kind == LineKind::OtherSession) {
            let t = &s.iter().find(|x| x.id == l.session).unwrap().transcript;
            assert!(facts(&l.text).iter().all(|f| !t.contains(f)));
        }
    }

    #[test]
    fn auc_and_rates_on_known_distributions() {
        assert_eq!(auc(&[0.9, 0.8], &[0.1, 0.2]), 1.0);
        assert_eq!(auc(&[0.1], &[0.9]), 0.0);
        assert_eq!(auc(&[0.5, 0.5], &[0.5]), 0.5);
        let r = rates(&[0.9, 0.7, 0.69], &[0.7, 0.2], 0.7);
        assert!((r.accept - 2.0 / 3.0).abs() < 1e-9 && (r.false_accept - 0.5).abs() < 1e-9);
    }

    #[test]
    fn calibration_rule_on_synthetic_distributions() {
        // Separable: positives 0.80-0.99, negatives 0.30-0.59 -> the lowest eta whose
        // false-accept rate is <= 10 % (3 of 30 negatives at most), all positives kept.
        let pos: Vec<f32> = (0..20).map(|i| 0.80 + i as f32 * 0.01).collect();
        let neg: Vec<f32> = (0..30).map(|i| 0.30 + i as f32 * 0.01).collect();
        let (r, rule) = choose_eta(&pos, &neg);
        assert!(
            r.false_accept <= MAX_FALSE_ACCEPT && r.accept == 1.0,
            "{r:?}"
        );
        let below = rates(&pos, &neg, r.eta - 0.01);
        assert!(below.false_accept > MAX_FALSE_ACCEPT, "{below:?}");
        assert!((0.55..=0.60).contains(&r.eta), "{r:?}");
        assert!(rule.starts_with("lowest eta"));
        // Overlapping: positives 0.5-0.9, negatives 0.45-0.85: no eta keeps FAR <= 10 % with
        // accept >= 50 %, so balanced accuracy decides.
        let pos: Vec<f32> = (0..41).map(|i| 0.50 + i as f32 * 0.01).collect();
        let neg: Vec<f32> = (0..41).map(|i| 0.45 + i as f32 * 0.01).collect();
        let (r, rule) = choose_eta(&pos, &neg);
        assert!(rule.starts_with("best balanced"), "{rule}");
        let best = (1..=100)
            .map(|i| rates(&pos, &neg, i as f32 / 100.0).balanced_accuracy())
            .fold(0.0f64, f64::max);
        assert!((r.balanced_accuracy() - best).abs() < 1e-12);
        assert!(r.false_accept > MAX_FALSE_ACCEPT || r.accept < MIN_ACCEPT);
    }

}
