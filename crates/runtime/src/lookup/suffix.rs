//! Draft sources: where proposed continuations come from. [`SuffixMatch`] proposes what
//! followed the longest earlier occurrence of the text's last tokens (prompt lookup).

/// Tokens proposed to follow a context, with how well the source matched it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// The proposed continuation, in order (never empty).
    pub tokens: Vec<u32>,
    /// Length of the match the proposal came from (the source's confidence signal).
    pub matched: usize,
}

/// Proposes continuations of a token context. Implementations are pure: the same context
/// gives the same proposal.
pub trait DraftSource: Send + Sync + std::fmt::Debug {
    /// Up to `max` tokens likely to follow `context`, or `None`.
    fn propose(&self, context: &[u32], max: usize) -> Option<Proposal>;
}

/// The continuation of the longest earlier occurrence of the context's last tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SuffixMatch {
    /// Shortest match that proposes anything.
    pub min_match: usize,
    /// Longest match looked for (longer matches count as this long).
    pub max_match: usize,
}

impl Default for SuffixMatch {
    fn default() -> Self {
        Self {
            min_match: 2,
            max_match: 16,
        }
    }
}

impl DraftSource for SuffixMatch {
    /// One backward scan: every earlier position holding the last token is extended
    /// backwards up to `max_match`; the longest match wins, the most recent among equals.
    fn propose(&self, context: &[u32], max: usize) -> Option<Proposal> {
        let n = context.len();
        if max == 0 || n < 2 || self.min_match == 0 {
            return None;
        }
        let last = context[n - 1];
        let cap = self.max_match.max(self.min_match);
        let mut best: Option<(usize, usize)> = None; // (match length, end position)
        for end in (0..n - 1).rev() {
            if context[end] != last {
                continue;
            }
            let mut len = 1;
            while len < cap && len <= end && context[end - len] == context[n - 1 - len] {
                len += 1;
            }
            if best.is_none_or(|(b, _)| len > b) {
                best = Some((len, end));
                if len == cap {
                    break;
                }
            }
        }
        let (matched, end) = best.filter(|&(len, _)| len >= self.min_match)?;
        let tokens: Vec<u32> = context[end + 1..].iter().take(max).copied().collect();
        (!tokens.is_empty()).then_some(Proposal { tokens, matched })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(ctx: &[u32], max: usize) -> Option<Proposal> {
        SuffixMatch::default().propose(ctx, max)
    }

    #[test]
    fn proposes_what_followed_the_longest_match() {
        // "5 6" occurs twice; "4 5 6" only once, followed by 7 8 9.
        let ctx = [1, 5, 6, 2, 4, 5, 6, 7, 8, 9, 3, 4, 5, 6];
        let p = propose(&ctx, 8).unwrap();
        assert_eq!(p.matched, 3);
        assert_eq!(p.tokens, vec![7, 8, 9, 3, 4, 5, 6]);
        assert_eq!(propose(&ctx, 2).unwrap().tokens, vec![7, 8]);
    }

    #[test]
    fn the_most_recent_of_equal_matches_wins() {
        let ctx = [1, 2, 10, 1, 2, 20, 9, 1, 2];
        let p = propose(&ctx, 4).unwrap();
        assert_eq!((p.matched, p.tokens), (2, vec![20, 9, 1, 2]));
    }

    #[test]
    fn nothing_below_the_minimum_match_or_without_a_continuation() {
        assert_eq!(propose(&[1, 2, 3, 4, 3], 4), None, "match of 1 < min 2");
        assert_eq!(propose(&[7], 4), None);
        assert_eq!(propose(&[], 4), None);
        assert_eq!(propose(&[1, 2, 1, 2], 0), None, "no room");
        let one = SuffixMatch {
            min_match: 1,
            max_match: 4,
        };
        assert_eq!(one.propose(&[1, 2, 3, 4, 3], 4).unwrap().tokens, vec![4, 3]);
    }

    #[test]
    fn matches_are_capped_at_max_match() {
        let cap = SuffixMatch {
            min_match: 2,
            max_match: 3,
        };
        // A long repeated run: the match counts as 3 and the latest occurrence is used.
        let ctx = [9, 1, 2, 3, 4, 5, 8, 1, 2, 3, 4, 5];
        let p = cap.propose(&ctx, 3).unwrap();
        assert_eq!(p.matched, 3);
        assert_eq!(p.tokens, vec![8, 1, 2]);
    }

    #[test]
    fn a_repeated_token_proposes_its_own_run() {
        let p = propose(&[4, 4, 4, 4], 3).unwrap();
        assert_eq!(p.tokens, vec![4]);
        assert_eq!(p.matched, 3);
    }
}
