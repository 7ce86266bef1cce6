//! Token-level evidence on a drafted line, read from the verification forward itself, and the
//! rules that accept or reject a line on it.
//!
//! The forward over the slot request, the accepted lines, the proposed line and the question
//! rates every token of the line under the target ([`LineToken`]). From those ratings and the
//! one-token judgment this module derives [`LineScores`]: mean and minimum log-probability,
//! the share of tokens that are the target's own greedy choice, and the first divergence (the
//! first token the target would not have written). [`LineRule`] is a calibrated logistic rule
//! over the scores; [`Verify`] names the rule a compaction applies (or the lossless mode).

use crate::backend::LineToken;
use crate::judge::Judgment;
use serde::{Deserialize, Serialize};

/// How drafted lines are verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verify {
    /// The target's calibrated rule over the line's scores (`configs/calibration.toml`);
    /// the ratio rule for a target without one.
    #[default]
    Calibrated,
    /// The one-token judgment alone: accept iff p_yes / (p_yes + p_no) >= η.
    Ratio,
    /// Lossless: a drafted token is kept only where it is the target's greedy token, so each
    /// slot equals the target's own (`target-self`) byte for byte.
    Exact,
}

impl Verify {
    /// The mode's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Calibrated => "calibrated",
            Self::Ratio => "ratio",
            Self::Exact => "exact",
        }
    }
}

impl std::str::FromStr for Verify {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "calibrated" => Ok(Self::Calibrated),
            "ratio" => Ok(Self::Ratio),
            "exact" => Ok(Self::Exact),
            other => Err(format!(
                "unknown verification mode `{other}` (calibrated, ratio, exact)"
            )),
        }
    }
}

/// Where a line stops agreeing with the target.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    /// A token diverges when the target ranks this many tokens or more above it (1: only the
    /// target's greedy token agrees).
    pub rank: u32,
    /// ... or gives it less than this probability.
    pub floor: f32,
}

impl Divergence {
    /// Whether a token diverges.
    pub fn diverges(&self, t: &LineToken) -> bool {
        t.rank >= self.rank.max(1) || t.logprob.exp() < self.floor
    }
}

/// The evidence on one verified line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LineScores {
    /// The one-token judgment's p_yes / (p_yes + p_no).
    pub r: f32,
    /// Mean log-probability of the line's tokens under the target.
    pub mean_logprob: f32,
    /// Lowest log-probability of a line token.
    pub min_logprob: f32,
    /// Share of the line's tokens that are the target's greedy token.
    pub greedy_fraction: f32,
    /// Tokens in the line (its newline included).
    pub tokens: usize,
    /// Index of the first diverging token (`None`: the target agrees with every token).
    pub divergence: Option<usize>,
}

impl LineScores {
    /// Scores from a judgment and the line's rated tokens.
    pub fn new(j: &Judgment, line: &[LineToken], div: &Divergence) -> Self {
        let n = line.len();
        let (mean, min, greedy) = if n == 0 {
            (0.0, 0.0, 0.0)
        } else {
            let sum: f32 = line.iter().map(|t| t.logprob).sum();
            let min = line.iter().map(|t| t.logprob).fold(f32::INFINITY, f32::min);
            let g = line.iter().filter(|t| t.rank == 0).count();
            (sum / n as f32, min, g as f32 / n as f32)
        };
        Self {
            r: j.r,
            mean_logprob: mean,
            min_logprob: min,
            greedy_fraction: greedy,
            tokens: n,
            divergence: line.iter().position(|t| div.diverges(t)),
        }
    }

    /// The rule's inputs, in [`FEATURES`] order.
    pub fn features(&self) -> [f64; 4] {
        [
            f64::from(self.r),
            f64::from(self.mean_logprob),
            f64::from(self.min_logprob),
            f64::from(self.greedy_fraction),
        ]
    }
}

/// Names of [`LineScores::features`].
pub const FEATURES: [&str; 4] = ["r", "mean_logprob", "min_logprob", "greedy_fraction"];

/// The text of a line before its first divergence (the part the target agrees with): the
/// concatenated texts of the tokens before it, without a newline.
pub fn agreed_prefix(line: &[LineToken], divergence: usize) -> String {
    let s: String = line
        .iter()
        .take(divergence)
        .map(|t| t.text.as_str())
        .collect();
    match s.find('\n') {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// A calibrated acceptance rule: logistic in the line's scores, accepting at `threshold`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineRule {
    /// Weight of r.
    pub r: f64,
    /// Weight of the mean log-probability.
    pub mean_logprob: f64,
    /// Weight of the minimum log-probability.
    pub min_logprob: f64,
    /// Weight of the greedy fraction.
    pub greedy_fraction: f64,
    /// Intercept.
    pub bias: f64,
    /// Lowest probability that accepts.
    pub threshold: f64,
}

impl LineRule {
    /// A rule from weights in [`FEATURES`] order.
    pub fn from_weights(w: [f64; 4], bias: f64, threshold: f64) -> Self {
        Self {
            r: w[0],
            mean_logprob: w[1],
            min_logprob: w[2],
            greedy_fraction: w[3],
            bias,
            threshold,
        }
    }

    /// Weights in [`FEATURES`] order.
    pub fn weights(&self) -> [f64; 4] {
        [
            self.r,
            self.mean_logprob,
            self.min_logprob,
            self.greedy_fraction,
        ]
    }

    /// The rule's probability that the line is true.
    pub fn probability(&self, s: &LineScores) -> f64 {
        let z: f64 = self
            .weights()
            .iter()
            .zip(s.features())
            .map(|(w, x)| w * x)
            .sum::<f64>()
            + self.bias;
        1.0 / (1.0 + (-z).exp())
    }

    /// Whether the line is accepted (the threshold itself accepts).
    pub fn accepts(&self, s: &LineScores) -> bool {
        self.probability(s) >= self.threshold
    }
}

/// A fitted logistic model on standardised features (see [`fit_logistic`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Logistic {
    /// Weights on the raw features.
    pub weights: [f64; 4],
    /// Intercept on the raw features.
    pub bias: f64,
}

impl Logistic {
    /// The probability for raw features `x`.
    pub fn predict(&self, x: &[f64; 4]) -> f64 {
        let z: f64 = self.weights.iter().zip(x).map(|(w, v)| w * v).sum::<f64>() + self.bias;
        1.0 / (1.0 + (-z).exp())
    }
}

/// Fits a logistic regression (L2 penalty `l2`, full-batch gradient descent on standardised
/// features, deterministic) of `y` on the features of `x` whose `mask` is on (others get
/// weight 0); returns weights on the raw features.
pub fn fit_logistic(x: &[[f64; 4]], y: &[bool], mask: [bool; 4], l2: f64) -> Logistic {
    let n = x.len().max(1) as f64;
    let mut mean = [0.0; 4];
    let mut sd = [1.0; 4];
    for k in 0..4 {
        mean[k] = x.iter().map(|v| v[k]).sum::<f64>() / n;
        let var = x.iter().map(|v| (v[k] - mean[k]).powi(2)).sum::<f64>() / n;
        sd[k] = if var > 1e-12 { var.sqrt() } else { 1.0 };
    }
    let z: Vec<[f64; 4]> = x
        .iter()
        .map(|v| {
            let mut o = [0.0; 4];
            for k in 0..4 {
                o[k] = if mask[k] {
                    (v[k] - mean[k]) / sd[k]
                } else {
                    0.0
                };
            }
            o
        })
        .collect();
    let mut w = [0.0f64; 4];
    let mut b = 0.0f64;
    let lr = 0.5;
    for _ in 0..2000 {
        let mut gw = [0.0; 4];
        let mut gb = 0.0;
        for (v, &t) in z.iter().zip(y) {
            let p = 1.0 / (1.0 + (-(w.iter().zip(v).map(|(a, b)| a * b).sum::<f64>() + b)).exp());
            let e = p - if t { 1.0 } else { 0.0 };
            for k in 0..4 {
                gw[k] += e * v[k];
            }
            gb += e;
        }
        for k in 0..4 {
            w[k] -= lr * (gw[k] / n + l2 * w[k]);
        }
        b -= lr * gb / n;
    }
    // Back to raw features: w_k (x_k - m_k) / s_k.
    let mut raw = [0.0; 4];
    let mut bias = b;
    for k in 0..4 {
        if mask[k] {
            raw[k] = w[k] / sd[k];
            bias -= w[k] * mean[k] / sd[k];
        }
    }
    Logistic { weights: raw, bias }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(text: &str, logprob: f32, rank: u32) -> LineToken {
        LineToken {
            text: text.into(),
            logprob,
            rank,
        }
    }

    fn judgment(r: f32) -> Judgment {
        Judgment {
            p_yes: r,
            p_no: 1.0 - r,
            r,
        }
    }

    #[test]
    fn scores_from_hand_set_token_ratings() {
        let line = [
            tok("- The", -0.5, 0),
            tok(" limit", -1.5, 0),
            tok(" is", -0.2, 3),
            tok(" 2", -4.0, 12),
            tok("\n", -0.1, 0),
        ];
        let div = Divergence {
            rank: 1,
            floor: 0.0,
        };
        let s = LineScores::new(&judgment(0.8), &line, &div);
        assert_eq!(s.tokens, 5);
        assert!((s.mean_logprob - (-6.3 / 5.0)).abs() < 1e-6, "{s:?}");
        assert_eq!(s.min_logprob, -4.0);
        assert!((s.greedy_fraction - 0.6).abs() < 1e-6);
        assert_eq!(s.divergence, Some(2));
        assert_eq!(s.r, 0.8);
        // A wider rank lets " is" pass; the probability floor still stops at " 2".
        let loose = Divergence {
            rank: 5,
            floor: 0.05,
        };
        assert_eq!(
            LineScores::new(&judgment(0.8), &line, &loose).divergence,
            Some(3)
        );
        // A floor above exp(-1.5) stops at " limit".
        let floor = Divergence {
            rank: 100,
            floor: 0.3,
        };
        assert_eq!(
            LineScores::new(&judgment(0.8), &line, &floor).divergence,
            Some(1)
        );
        assert_eq!(agreed_prefix(&line, 2), "- The limit");
        assert_eq!(agreed_prefix(&line, 5), "- The limit is 2");
        assert_eq!(agreed_prefix(&line, 0), "");
        // Every token greedy: no divergence.
        let own = [tok("a", -0.1, 0), tok("\n", -0.2, 0)];
        assert_eq!(LineScores::new(&judgment(0.1), &own, &div).divergence, None);
    }

    #[test]
    fn the_rule_accepts_at_its_threshold_and_not_below() {
        let s = LineScores {
            r: 0.5,
            mean_logprob: -1.0,
            min_logprob: -3.0,
            greedy_fraction: 0.5,
            tokens: 4,
            divergence: Some(1),
        };
        // z = 2*0.5 + 1*(-1) + 0 + 2*0.5 + 0 = 1 -> p = 0.731.
        let p = 1.0 / (1.0 + (-1.0f64).exp());
        let rule = LineRule::from_weights([2.0, 1.0, 0.0, 2.0], 0.0, p);
        assert!((rule.probability(&s) - p).abs() < 1e-12);
        assert!(rule.accepts(&s));
        let stricter = LineRule {
            threshold: p + 1e-9,
            ..rule.clone()
        };
        assert!(!stricter.accepts(&s));
        let mut better = s;
        better.greedy_fraction = 0.6;
        assert!(stricter.accepts(&better));
    }

    #[test]
    fn logistic_fit_separates_a_separable_feature_and_ignores_masked_ones() {
        // Feature 3 separates; feature 0 is noise; feature 1 is masked out.
        let x: Vec<[f64; 4]> = (0..40)
            .map(|i| {
                let t = i % 2 == 0;
                [
                    ((i * 7) % 5) as f64,
                    i as f64,
                    0.0,
                    if t { 0.9 } else { 0.2 },
                ]
            })
            .collect();
        let y: Vec<bool> = (0..40).map(|i| i % 2 == 0).collect();
        let m = fit_logistic(&x, &y, [true, false, false, true], 1e-3);
        assert_eq!(m.weights[1], 0.0);
        assert!(m.weights[3] > 0.0);
        for (v, &t) in x.iter().zip(&y) {
            assert_eq!(m.predict(v) >= 0.5, t, "{v:?}");
        }
    }

    #[test]
    fn modes_parse_by_name() {
        assert_eq!("ratio".parse::<Verify>(), Ok(Verify::Ratio));
        assert_eq!("calibrated".parse::<Verify>(), Ok(Verify::Calibrated));
        assert!("exactly".parse::<Verify>().unwrap_err().contains("exactly"));
    }
}
