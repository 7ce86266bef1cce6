//! One-token verification: from a next-token top-k, the probability of "yes" and of "no"
//! and their normalised ratio.

/// The verdict on one line.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Judgment {
    /// Probability of the positive label (best variant in the top-k, or the missing-label
    /// estimate).
    pub p_yes: f32,
    /// Probability of the negative label, likewise.
    pub p_no: f32,
    /// p_yes / (p_yes + p_no); 0 when both are 0.
    pub r: f32,
}

impl Judgment {
    /// Whether the line is accepted at threshold `eta` (r = eta accepts).
    pub fn accepts(&self, eta: f32) -> bool {
        self.r >= eta
    }
}

/// Scores a top-k. A label's probability is its best variant among the candidates; a label
/// with no variant there gets min(1 - sum of the top-k, smallest returned probability), the
/// most it could have without having entered the top-k.
pub fn score(top_k: &[(String, f32)], positive: &[String], negative: &[String]) -> Judgment {
    let best = |labels: &[String]| {
        top_k
            .iter()
            .filter(|(t, _)| labels.iter().any(|l| l == t))
            .map(|&(_, p)| p)
            .fold(None, |m: Option<f32>, p| Some(m.map_or(p, |m| m.max(p))))
    };
    let missing = {
        let sum: f32 = top_k.iter().map(|(_, p)| p).sum();
        let smallest = top_k.iter().map(|&(_, p)| p).fold(f32::INFINITY, f32::min);
        let rest = (1.0 - sum).max(0.0);
        if smallest.is_finite() {
            rest.min(smallest)
        } else {
            rest
        }
    };
    let p_yes = best(positive).unwrap_or(missing);
    let p_no = best(negative).unwrap_or(missing);
    let r = if p_yes + p_no > 0.0 {
        p_yes / (p_yes + p_no)
    } else {
        0.0
    };
    Judgment { p_yes, p_no, r }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> (Vec<String>, Vec<String>) {
        (
            vec!["Yes".into(), " yes".into(), "YES".into()],
            vec!["No".into(), " no".into()],
        )
    }

    fn d(v: &[(&str, f32)]) -> Vec<(String, f32)> {
        v.iter().map(|(t, p)| (t.to_string(), *p)).collect()
    }

    #[test]
    fn best_variant_counts() {
        let (pos, neg) = labels();
        let j = score(
            &d(&[("No", 0.2), (" yes", 0.5), ("Yes", 0.1), (" no", 0.05)]),
            &pos,
            &neg,
        );
        assert_eq!(j.p_yes, 0.5);
        assert_eq!(j.p_no, 0.2);
        assert!((j.r - 0.5 / 0.7).abs() < 1e-6);
    }

    #[test]
    fn a_missing_label_gets_the_smaller_of_rest_and_last() {
        let (pos, neg) = labels();
        // top-k sums to 0.9: rest 0.1, smallest returned 0.3 -> 0.1.
        let j = score(&d(&[("Yes", 0.6), ("Sure", 0.3)]), &pos, &neg);
        assert!((j.p_no - 0.1).abs() < 1e-6, "{j:?}");
        // top-k sums to 0.99 with a small tail: smallest returned 0.04 beats rest? rest 0.01.
        let j = score(&d(&[("Yes", 0.95), ("x", 0.04)]), &pos, &neg);
        assert!((j.p_no - 0.01).abs() < 1e-5, "{j:?}");
        // rest 0.5, smallest returned 0.02 -> 0.02.
        let j = score(&d(&[("No", 0.48), ("x", 0.02)]), &pos, &neg);
        assert!((j.p_yes - 0.02).abs() < 1e-6, "{j:?}");
        assert!(j.r < 0.1);
    }

    #[test]
    fn the_threshold_itself_accepts() {
        let (pos, neg) = labels();
        let j = score(&d(&[("Yes", 0.7), ("No", 0.3)]), &pos, &neg);
        assert!(j.accepts(j.r));
        assert!(j.accepts(0.7 - 1e-6));
        assert!(!j.accepts(j.r + 1e-6));
    }

    #[test]
    fn label_variants_are_exact_token_texts() {
        let (pos, neg) = labels();
        // "yes" (no space, lowercase) is not a listed variant: it counts as missing.
        let j = score(&d(&[("yes", 0.8), ("No", 0.1)]), &pos, &neg);
        assert!(j.p_yes < 0.11, "{j:?}");
    }
}
