//! When drafting pays: forward time as a line in the tokens a forward computes, fitted from
//! measured forwards, and the chance that a proposed token is kept, counted per match length.
//! The draft length chosen maximises expected tokens per second.

/// Forward sizes (rows × padded tokens per row) timed separately; larger ones are not timed.
pub const TIMED_TOKENS: usize = 64;
/// Match lengths counted separately; longer matches count as this one.
pub const MATCH_CLASSES: usize = 8;

/// Measured forward times and acceptance counts.
#[derive(Debug, Clone)]
pub struct CostModel {
    /// Exponential mean of seconds per forward, by tokens computed (index = tokens - 1).
    seconds: Vec<Option<f64>>,
    /// Per match length class: (drafted tokens reached, of which kept).
    accepted: Vec<(u64, u64)>,
}

impl Default for CostModel {
    fn default() -> Self {
        Self {
            seconds: vec![None; TIMED_TOKENS],
            accepted: vec![(0, 0); MATCH_CLASSES],
        }
    }
}

/// Weight of a new time in the exponential mean.
const EMA: f64 = 0.2;

impl CostModel {
    /// Records a forward that computed `tokens` positions in `seconds`.
    pub fn record_forward(&mut self, tokens: usize, seconds: f64) {
        if tokens == 0 || tokens > TIMED_TOKENS || !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        let s = &mut self.seconds[tokens - 1];
        *s = Some(s.map_or(seconds, |m| m + EMA * (seconds - m)));
    }

    /// Records a draft from a match of `matched` tokens: `reached` proposed tokens were
    /// checked in order (the first `kept` of them equal to the target's).
    pub fn record_draft(&mut self, matched: usize, reached: usize, kept: usize) {
        let c = &mut self.accepted[class(matched)];
        c.0 += reached as u64;
        c.1 += kept.min(reached) as u64;
    }

    /// Probability that a proposed token is kept given the ones before it were, for a match
    /// of `matched` tokens (Laplace's rule over the counts of that class).
    pub fn keep_probability(&self, matched: usize) -> f64 {
        let (n, k) = self.accepted[class(matched)];
        (k as f64 + 1.0) / (n as f64 + 2.0)
    }

    /// Seconds per forward as `fixed + per_token × tokens`, least squares over the timed
    /// sizes; `None` until two sizes were timed.
    pub fn line(&self) -> Option<(f64, f64)> {
        let pts: Vec<(f64, f64)> = self
            .seconds
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| ((i + 1) as f64, s)))
            .collect();
        if pts.len() < 2 {
            return None;
        }
        let n = pts.len() as f64;
        let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
        let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let slope = (sxy / sxx).max(0.0);
        let fixed = (my - slope * mx).max(0.0);
        Some((fixed, slope))
    }

    /// The draft length (0 = none) that maximises expected kept tokens per second for a
    /// forward of `rows` rows, where row `i` can take up to `caps[i].0` drafted tokens from a
    /// match of `caps[i].1` tokens. Rows are padded to the longest, so one length is chosen
    /// for all: each row drafts `min(length, its cap)`. Without a fitted line, `explore`
    /// tokens are drafted (timings of longer forwards are what the fit needs).
    pub fn choose(&self, rows: usize, caps: &[(usize, usize)], explore: usize) -> usize {
        let most = caps.iter().map(|c| c.0).max().unwrap_or(0);
        if rows == 0 || most == 0 {
            return 0;
        }
        let Some((fixed, per_token)) = self.line() else {
            return explore.min(most);
        };
        let time = |len: usize| fixed + per_token * (rows * (1 + len)) as f64;
        let gain = |len: usize| -> f64 {
            caps.iter()
                .map(|&(cap, matched)| {
                    let p = self.keep_probability(matched);
                    (1..=len.min(cap)).map(|j| p.powi(j as i32)).sum::<f64>()
                })
                .sum()
        };
        let mut best = (rows as f64 / time(0), 0);
        for len in 1..=most {
            let rate = (rows as f64 + gain(len)) / time(len);
            if rate > best.0 {
                best = (rate, len);
            }
        }
        best.1
    }
}

fn class(matched: usize) -> usize {
    matched.clamp(1, MATCH_CLASSES) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_fits_the_timed_forwards() {
        let mut c = CostModel::default();
        assert_eq!(c.line(), None);
        c.record_forward(1, 0.05);
        assert_eq!(c.line(), None, "one size is not a line");
        c.record_forward(9, 0.13);
        c.record_forward(5, 0.09);
        c.record_forward(100, 9.0); // not timed
        let (a, b) = c.line().unwrap();
        assert!(
            (a - 0.04).abs() < 1e-9 && (b - 0.01).abs() < 1e-9,
            "{a} {b}"
        );
        // The mean moves a fifth of the way to a new time.
        c.record_forward(1, 0.10);
        assert!((c.seconds[0].unwrap() - 0.06).abs() < 1e-12);
    }

    #[test]
    fn keep_probability_counts_per_match_class() {
        let mut c = CostModel::default();
        assert_eq!(c.keep_probability(3), 0.5);
        c.record_draft(3, 8, 8);
        c.record_draft(3, 2, 0);
        assert!((c.keep_probability(3) - 9.0 / 12.0).abs() < 1e-12);
        assert_eq!(c.keep_probability(2), 0.5, "other classes untouched");
        c.record_draft(40, 4, 4);
        assert_eq!(c.keep_probability(MATCH_CLASSES), 5.0 / 6.0);
    }

    #[test]
    fn drafting_pays_only_where_kept_tokens_outweigh_the_longer_forward() {
        let mut c = CostModel::default();
        assert_eq!(c.choose(1, &[(8, 4)], 2), 2, "explores before a fit");
        assert_eq!(c.choose(1, &[(1, 4)], 2), 1, "never past the proposal");
        assert_eq!(c.choose(1, &[(0, 4)], 2), 0);
        // A forward costs 40 ms + 15 ms per token.
        for t in [1, 2, 4, 8] {
            c.record_forward(t, 0.040 + 0.015 * t as f64);
        }
        // Matches of 8 kept 95 %: a long draft pays for one row.
        c.record_draft(8, 100, 95);
        let long = c.choose(1, &[(16, 8)], 0);
        assert!(long >= 6, "{long}");
        // Matches of 2 kept 10 %: nothing pays.
        c.record_draft(2, 100, 10);
        assert_eq!(c.choose(1, &[(16, 2)], 0), 0);
        // Six rows padded together: the same good match pays less than for one row.
        let six = c.choose(6, &[(16, 8), (0, 0), (0, 0), (0, 0), (0, 0), (0, 0)], 0);
        assert!(six < long, "{six} vs {long}");
    }
}
