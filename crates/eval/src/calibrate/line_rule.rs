//! Calibrating the line rule: how well each verification score separates true lines from
//! false ones alone, logistic combinations of them validated on held-out sessions, and the
//! rule (weights and threshold) to ship.

use super::{auc, choose_eta, Rates};
use serde::Serialize;
use speccompact_engine::verify::{fit_logistic, LineRule, LineScores, FEATURES};

/// One candidate combination of scores.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    /// The scores it combines.
    pub name: String,
    /// Which of [`FEATURES`] it uses.
    pub mask: [bool; 4],
    /// ROC AUC of its predictions on held-out sessions.
    pub held_out_auc: f64,
}

/// What the line-rule calibration found.
#[derive(Debug, Clone, Serialize)]
pub struct RuleReport {
    /// ROC AUC of each score alone (higher = truer), in [`FEATURES`] order.
    pub single_auc: Vec<(String, f64)>,
    /// The combinations tried.
    pub candidates: Vec<Candidate>,
    /// Index of the chosen one (highest held-out AUC; fewer scores on ties).
    pub chosen: usize,
    /// The rule: fitted on every line, threshold from the held-out predictions.
    pub rule: LineRule,
    /// Held-out rates at the threshold.
    pub rates: Rates,
    /// How the threshold was chosen.
    pub threshold_rule: String,
    /// Session folds used for the held-out predictions.
    pub folds: usize,
}

const L2: f64 = 1e-2;

fn masks() -> Vec<(String, [bool; 4])> {
    let mut out: Vec<(String, [bool; 4])> = FEATURES
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mut m = [false; 4];
            m[i] = true;
            (f.to_string(), m)
        })
        .collect();
    out.push((
        "mean_logprob + greedy_fraction".into(),
        [false, true, false, true],
    ));
    out.push(("token scores (no r)".into(), [false, true, true, true]));
    out.push(("all four".into(), [true, true, true, true]));
    out
}

/// Predictions for each line from a model fitted on the other folds' sessions.
fn held_out(x: &[[f64; 4]], y: &[bool], fold: &[usize], folds: usize, mask: [bool; 4]) -> Vec<f64> {
    let mut p = vec![0.5; x.len()];
    for k in 0..folds {
        let train: Vec<usize> = (0..x.len()).filter(|&i| fold[i] != k).collect();
        let has_both = train.iter().any(|&i| y[i]) && train.iter().any(|&i| !y[i]);
        if !has_both {
            continue;
        }
        let tx: Vec<[f64; 4]> = train.iter().map(|&i| x[i]).collect();
        let ty: Vec<bool> = train.iter().map(|&i| y[i]).collect();
        let m = fit_logistic(&tx, &ty, mask, L2);
        for i in (0..x.len()).filter(|&i| fold[i] == k) {
            p[i] = m.predict(&x[i]);
        }
    }
    p
}

fn split(v: &[f64], y: &[bool]) -> (Vec<f32>, Vec<f32>) {
    let pos = v
        .iter()
        .zip(y)
        .filter(|(_, &t)| t)
        .map(|(&s, _)| s as f32)
        .collect();
    let neg = v
        .iter()
        .zip(y)
        .filter(|(_, &t)| !t)
        .map(|(&s, _)| s as f32)
        .collect();
    (pos, neg)
}

/// Calibrates the line rule on scored lines with their labels and session index; lines of a
/// session are held out together (`folds` folds by session index).
pub fn calibrate_rule(
    scores: &[LineScores],
    labels: &[bool],
    session: &[usize],
    folds: usize,
) -> RuleReport {
    let folds = folds.max(2);
    let x: Vec<[f64; 4]> = scores.iter().map(LineScores::features).collect();
    let fold: Vec<usize> = session.iter().map(|s| s % folds).collect();
    let single_auc = FEATURES
        .iter()
        .enumerate()
        .map(|(k, f)| {
            let v: Vec<f64> = x.iter().map(|r| r[k]).collect();
            let (pos, neg) = split(&v, labels);
            (f.to_string(), auc(&pos, &neg))
        })
        .collect();
    let mut candidates = Vec::new();
    let mut preds = Vec::new();
    for (name, mask) in masks() {
        let p = held_out(&x, labels, &fold, folds, mask);
        let (pos, neg) = split(&p, labels);
        candidates.push(Candidate {
            name,
            mask,
            held_out_auc: auc(&pos, &neg),
        });
        preds.push(p);
    }
    let mut chosen = 0;
    for (i, c) in candidates.iter().enumerate() {
        let best = &candidates[chosen];
        let fewer =
            c.mask.iter().filter(|&&m| m).count() < best.mask.iter().filter(|&&m| m).count();
        if c.held_out_auc > best.held_out_auc + 1e-9
            || ((c.held_out_auc - best.held_out_auc).abs() <= 1e-9 && fewer)
        {
            chosen = i;
        }
    }
    let (pos, neg) = split(&preds[chosen], labels);
    let (rates, threshold_rule) = choose_eta(&pos, &neg);
    let m = fit_logistic(&x, labels, candidates[chosen].mask, L2);
    let rule = LineRule::from_weights(m.weights, m.bias, f64::from(rates.eta));
    RuleReport {
        single_auc,
        candidates,
        chosen,
        rule,
        rates,
        threshold_rule,
        folds,
    }
}

impl RuleReport {
    /// The report as markdown tables.
    pub fn markdown(&self) -> String {
        let mut md = String::from("| score alone | AUC |\n|---|---|\n");
        for (n, a) in &self.single_auc {
            md.push_str(&format!("| {n} | {a:.3} |\n"));
        }
        md.push_str(&format!(
            "\n| logistic rule over | held-out AUC ({} session folds) |\n|---|---|\n",
            self.folds
        ));
        for (i, c) in self.candidates.iter().enumerate() {
            let mark = if i == self.chosen { " (chosen)" } else { "" };
            md.push_str(&format!("| {}{mark} | {:.3} |\n", c.name, c.held_out_auc));
        }
        md.push_str(&format!(
            "\nChosen rule: `{}`, threshold {:.2} ({}): held-out accept {:.0} % of true lines, {:.0} % of false lines.\n",
            self.candidates[self.chosen].name,
            self.rates.eta,
            self.threshold_rule,
            100.0 * self.rates.accept,
            100.0 * self.rates.false_accept
        ));
        md
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(r: f32, mean: f32, greedy: f32) -> LineScores {
        LineScores {
            r,
            mean_logprob: mean,
            min_logprob: mean * 3.0,
            greedy_fraction: greedy,
            tokens: 10,
            divergence: None,
        }
    }

    #[test]
    fn a_separating_score_is_found_and_r_noise_is_not_chosen() {
        // 12 sessions; true lines have higher greedy fraction, r is noise.
        let mut scores = Vec::new();
        let mut labels = Vec::new();
        let mut session = Vec::new();
        for i in 0..120usize {
            let t = i % 2 == 0;
            let noise = ((i * 37) % 11) as f32 / 11.0;
            scores.push(s(
                noise,
                if t { -0.5 } else { -1.5 } + noise * 0.3,
                if t { 0.8 } else { 0.4 } + noise * 0.1,
            ));
            labels.push(t);
            session.push(i / 10);
        }
        let rep = calibrate_rule(&scores, &labels, &session, 4);
        let r_auc = rep.single_auc[0].1;
        assert!(r_auc < 0.7, "{r_auc}");
        assert!(rep.candidates[rep.chosen].held_out_auc > 0.95, "{rep:?}");
        assert!(
            !rep.candidates[rep.chosen].mask[0]
                || rep.candidates[rep.chosen].mask.iter().all(|&m| m)
        );
        // The shipped rule reproduces the held-out operating point on these lines roughly.
        let acc = scores
            .iter()
            .zip(&labels)
            .filter(|(s, &t)| t && rep.rule.accepts(s))
            .count();
        assert!(acc >= 50, "{acc}");
        let md = rep.markdown();
        assert!(
            md.contains("(chosen)") && md.contains("greedy_fraction"),
            "{md}"
        );
    }
}
