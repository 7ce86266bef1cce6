//! Scoring functions, free of models: probe presence (overall and in the named slot), answer
//! matching, unsourced assertions, and bootstrap intervals. Each is unit-tested on hand-made
//! fixtures, with a case that must fail.

use crate::data::Probe;
use serde::Serialize;

/// Whether one presence probe survived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProbeHit {
    /// Probe id.
    pub id: String,
    /// The slot it belongs to.
    pub slot: String,
    /// One of its strings occurs verbatim in the context.
    pub found: bool,
    /// One occurs in the named slot; `None` when the probe names no slot (`any`) or the
    /// context has no slots (a tail or the whole history).
    pub in_slot: Option<bool>,
}

/// Presence of each identifier/file probe in `context` (case-sensitive, as the data defines
/// them); `slots` gives each slot's text by slot name when the context is a summary.
pub fn probe_hits(
    probes: &[&Probe],
    context: &str,
    slots: Option<&[(String, String)]>,
) -> Vec<ProbeHit> {
    probes
        .iter()
        .filter(|p| p.is_presence())
        .map(|p| {
            let found = p.expect_any.iter().any(|e| context.contains(e.as_str()));
            let in_slot = match slots {
                Some(slots) if p.slot != "any" => Some(slots.iter().any(|(name, text)| {
                    *name == p.slot && p.expect_any.iter().any(|e| text.contains(e.as_str()))
                })),
                _ => None,
            };
            ProbeHit {
                id: p.id.clone(),
                slot: p.slot.clone(),
                found,
                in_slot,
            }
        })
        .collect()
}

/// Lowercase words without punctuation or articles (the usual answer normalisation).
pub fn normalize(s: &str) -> Vec<String> {
    s.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty() && !matches!(*w, "a" | "an" | "the"))
        .map(str::to_string)
        .collect()
}

/// Token F1 of two texts after normalisation.
pub fn token_f1(pred: &str, reference: &str) -> f64 {
    let p = normalize(pred);
    let r = normalize(reference);
    if p.is_empty() || r.is_empty() {
        return if p == r { 1.0 } else { 0.0 };
    }
    let mut rest = r.clone();
    let mut common = 0usize;
    for w in &p {
        if let Some(i) = rest.iter().position(|x| x == w) {
            rest.swap_remove(i);
            common += 1;
        }
    }
    if common == 0 {
        return 0.0;
    }
    let prec = common as f64 / p.len() as f64;
    let rec = common as f64 / r.len() as f64;
    2.0 * prec * rec / (prec + rec)
}

/// Score of an answer to a question probe in [0, 1]: with acceptable answers (`expect_any`),
/// 1 when one of them occurs as whole words in the normalised answer, else 0; without them,
/// token F1 against the reference answer.
pub fn qa_score(pred: &str, probe: &Probe) -> f64 {
    if probe.expect_any.is_empty() {
        return probe.answer.as_deref().map_or(0.0, |a| token_f1(pred, a));
    }
    let p = format!(" {} ", normalize(pred).join(" "));
    let hit = probe.expect_any.iter().any(|e| {
        let e = normalize(e).join(" ");
        !e.is_empty() && p.contains(&format!(" {e} "))
    });
    if hit {
        1.0
    } else {
        0.0
    }
}

fn is_error_name(w: &str) -> bool {
    let core = w.trim_end_matches(':');
    core.len() > 5
        && core.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && core.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
        && ["Error", "Exception", "Warning"]
            .iter()
            .any(|s| core.ends_with(s))
}

/// The checkable assertions of a summary: identifiers, numbers and paths (the facts the
/// verifier calibration also uses), error names (`ValueError`, `KeyError`) and `quoted code`.
/// Headings are skipped.
pub fn assertions(summary: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |s: &str| {
        if !s.is_empty() && !out.iter().any(|x| x == s) {
            out.push(s.to_string());
        }
    };
    for line in summary.lines().filter(|l| !l.trim_start().starts_with('#')) {
        for f in speccompact_history::facts(line) {
            push(f);
        }
        for w in line.split(|c: char| c.is_whitespace() || "()[]{},;\"'`".contains(c)) {
            if is_error_name(w) {
                push(w.trim_end_matches(':'));
            }
        }
        let mut parts = line.split('`');
        parts.next();
        while let (Some(code), Some(_)) = (parts.next(), parts.next()) {
            if code.trim().chars().count() >= 2 {
                push(code.trim());
            }
        }
    }
    out
}

/// Assertions of `summary` that occur nowhere in `history_text` (verbatim).
pub fn unsourced(summary: &str, history_text: &str) -> Vec<String> {
    assertions(summary)
        .into_iter()
        .filter(|a| !history_text.contains(a.as_str()))
        .collect()
}

/// A mean with its bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stat {
    /// Values averaged.
    pub n: usize,
    /// Their mean.
    pub mean: f64,
    /// 2.5th percentile of the resampled means.
    pub lo: f64,
    /// 97.5th percentile of the resampled means.
    pub hi: f64,
}

/// SplitMix64: a small deterministic generator for resampling.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Mean of `values` with a percentile bootstrap 95 % interval (`iters` resamples with
/// replacement, deterministic for a seed). `None` for no values.
pub fn bootstrap(values: &[f64], iters: usize, seed: u64) -> Option<Stat> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    let mut rng = Mix(seed);
    let mut means: Vec<f64> = (0..iters.max(1))
        .map(|_| {
            (0..n)
                .map(|_| values[(rng.next() % n as u64) as usize])
                .sum::<f64>()
                / n as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    let at = |q: f64| means[((q * (means.len() - 1) as f64).round() as usize).min(means.len() - 1)];
    Some(Stat {
        n,
        mean,
        lo: at(0.025),
        hi: at(0.975),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::ProbeKind;

    fn probe(
        id: &str,
        kind: ProbeKind,
        slot: &str,
        expect: &[&str],
        answer: Option<&str>,
    ) -> Probe {
        Probe {
            id: id.into(),
            slot: slot.into(),
            kind,
            expect_any: expect.iter().map(|s| s.to_string()).collect(),
            question: Some("?".into()),
            answer: answer.map(str::to_string),
        }
    }

    #[test]
    fn probes_are_found_verbatim_and_in_their_slot() {
        let a = probe(
            "a",
            ProbeKind::Identifier,
            "critical_context",
            &["emma_kim_9957"],
            None,
        );
        let b = probe(
            "b",
            ProbeKind::File,
            "progress",
            &["src/io.py", "io.py"],
            None,
        );
        let c = probe("c", ProbeKind::Identifier, "any", &["HAT170"], None);
        let q = probe("q", ProbeKind::Qa, "any", &["x"], Some("x"));
        let slots = vec![
            (
                "critical_context".to_string(),
                "- user emma_kim_9957".to_string(),
            ),
            ("progress".to_string(), "- nothing yet".to_string()),
            ("next_steps".to_string(), "- open io.py".to_string()),
        ];
        let ctx = "- user emma_kim_9957\n- nothing yet\n- open io.py\n";
        let hits = probe_hits(&[&a, &b, &c, &q], ctx, Some(&slots));
        assert_eq!(hits.len(), 3, "qa probes are not presence probes");
        assert!(hits[0].found && hits[0].in_slot == Some(true));
        // Found (second string) but in the wrong slot.
        assert!(hits[1].found && hits[1].in_slot == Some(false));
        // Must fail: absent, and case matters.
        assert!(!hits[2].found && hits[2].in_slot.is_none());
        let lower = probe_hits(&[&a], "EMMA_KIM_9957", None);
        assert!(!lower[0].found && lower[0].in_slot.is_none());
    }

    #[test]
    fn answers_match_after_normalisation_and_free_text_gets_f1() {
        let bfcl = probe(
            "q1",
            ProbeKind::Qa,
            "any",
            &["Blue Ridge", "blue-ridge"],
            Some("Blue Ridge"),
        );
        assert_eq!(qa_score("It was the blue ridge parkway.", &bfcl), 1.0);
        assert_eq!(qa_score("BLUE-RIDGE", &bfcl), 1.0);
        // Must fail: a different answer, and a partial word.
        assert_eq!(qa_score("Green hills", &bfcl), 0.0);
        assert_eq!(qa_score("blueridge", &bfcl), 0.0);
        let free = probe(
            "q2",
            ProbeKind::Qa,
            "any",
            &[],
            Some("The team chose a rubber case."),
        );
        assert!((qa_score("rubber case", &free) - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(qa_score("plastic", &free), 0.0);
        assert_eq!(token_f1("", ""), 1.0);
    }

    #[test]
    fn unsourced_assertions_are_the_ones_missing_from_the_history() {
        let history =
            "Traceback: KeyError: 'id'\nedit src/app/models.py line 120\nuser_id mia_li_3668";
        let summary = "## Progress\n- Fixed KeyError in src/app/models.py (line 120).\n- Reservation Q69X3R for mia_li_3668; ran `pytest -x`.\n- Raised ValueError at line 404.";
        let a = assertions(summary);
        for want in [
            "KeyError",
            "src/app/models.py",
            "120",
            "Q69X3R",
            "mia_li_3668",
            "pytest -x",
            "ValueError",
            "404",
        ] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
        assert!(!a.iter().any(|x| x == "Progress"));
        let u = unsourced(summary, history);
        assert_eq!(u, vec!["Q69X3R", "pytest -x", "404", "ValueError"]);
        // Must fail: a fully sourced summary has none.
        assert!(unsourced("- KeyError in src/app/models.py", history).is_empty());
    }

    #[test]
    fn bootstrap_interval_brackets_the_mean_and_is_deterministic() {
        let v = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0];
        let s = bootstrap(&v, 2000, 7).unwrap();
        assert_eq!(s.n, 8);
        assert!((s.mean - 0.625).abs() < 1e-12);
        assert!(
            s.lo < s.mean && s.mean < s.hi && s.lo >= 0.0 && s.hi <= 1.0,
            "{s:?}"
        );
        assert_eq!(bootstrap(&v, 2000, 7), Some(s));
        // A constant sample has a zero-width interval; no sample has none.
        let c = bootstrap(&[0.5; 5], 100, 1).unwrap();
        assert_eq!((c.lo, c.hi), (0.5, 0.5));
        assert!(bootstrap(&[], 10, 1).is_none());
    }
}
