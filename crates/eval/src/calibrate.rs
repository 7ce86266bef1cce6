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
use speccompact_engine::{prompt, Backend, Compactor, Method, Request, RequestKind};
use speccompact_history::History;

pub mod line_rule;
mod line_set;

pub use line_set::{
    flip_outcome, line_set, negate, summary_lines, swap_fact, Labelled, LineKind, SessionSource,
};

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
    use speccompact_history::facts;

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
