//! What each method hands the next turn: a compaction method's summary, the most recent
//! messages that fit the same budget (`truncate-tail`), or the whole history (`full`, the
//! reference).

use crate::{Error, Result};
use serde::Serialize;
use speccompact_engine::Method;
use speccompact_history::{render, History, HistoryError, RenderOptions};

/// A method under evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EvalMethod {
    /// A compaction method of the engine.
    Engine(Method),
    /// The most recent messages that fit the budget, rendered as the engine renders them.
    TruncateTail,
    /// No compaction: the whole rendered history.
    Full,
}

impl EvalMethod {
    /// Every method, in report order.
    pub const ALL: [EvalMethod; 6] = [
        EvalMethod::Engine(Method::Speculative),
        EvalMethod::Engine(Method::Sequential),
        EvalMethod::Engine(Method::TargetSelf),
        EvalMethod::Engine(Method::DrafterOnly),
        EvalMethod::TruncateTail,
        EvalMethod::Full,
    ];

    /// The command-line name.
    pub fn as_str(self) -> &'static str {
        match self {
            EvalMethod::Engine(m) => m.as_str(),
            EvalMethod::TruncateTail => "truncate-tail",
            EvalMethod::Full => "full",
        }
    }

    /// Parses a comma-separated list of method names.
    pub fn parse_list(s: &str) -> Result<Vec<EvalMethod>> {
        let mut out = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let m = EvalMethod::ALL
                .into_iter()
                .find(|m| m.as_str() == name)
                .ok_or_else(|| Error::Config {
                    origin: "methods".into(),
                    reason: format!(
                        "unknown method `{name}` (speculative, sequential, target-self, drafter-only, truncate-tail, full)"
                    ),
                })?;
            if !out.contains(&m) {
                out.push(m);
            }
        }
        if out.is_empty() {
            return Err(Error::Config {
                origin: "methods".into(),
                reason: "no method given".into(),
            });
        }
        Ok(out)
    }
}

impl std::fmt::Display for EvalMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for TailBudget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// The token budget of `truncate-tail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailBudget {
    /// The size of the speculative summary of the same session (else of the first summary
    /// that ran, else the summary budget): the tail gets the room the method under test used.
    Matched,
    /// A fixed number of target tokens.
    Fixed(usize),
}

impl std::fmt::Display for TailBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TailBudget::Matched => f.write_str("matched"),
            TailBudget::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for TailBudget {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s == "matched" {
            return Ok(TailBudget::Matched);
        }
        s.parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .map(TailBudget::Fixed)
            .ok_or_else(|| Error::Config {
                origin: "tail budget".into(),
                reason: format!("`{s}` is neither `matched` nor a positive token count"),
            })
    }
}

/// The most recent messages of `history` whose rendering fits `budget` tokens, after a line
/// saying how many earlier messages are not shown. When not even the last message fits, the
/// end of its rendering that does. Returns the text and the number of messages kept whole.
/// An empty history is [`speccompact_history::HistoryError::Empty`] (there is no tail).
pub fn truncate_tail(
    history: &History,
    budget: usize,
    tool_result_cap: usize,
    count: &dyn Fn(&str) -> speccompact_engine::Result<usize>,
) -> Result<(String, usize)> {
    let n = history.messages.len();
    if n == 0 {
        return Err(Error::Engine(HistoryError::Empty.into()));
    }
    let opts = RenderOptions {
        tool_result_cap,
        omit: None,
    };
    let text_of = |k: usize| {
        let tail = History {
            id: None,
            messages: history.messages[n - k..].to_vec(),
        };
        let body = render(&tail, &opts);
        if k < n {
            format!("[... {} earlier messages not shown ...]\n{body}", n - k)
        } else {
            body
        }
    };
    // The omission line makes size not quite monotonic in k: try every k.
    let mut best: Option<(String, usize)> = None;
    for k in 1..=n {
        let t = text_of(k);
        if count(&t)? <= budget {
            best = Some((t, k));
        }
    }
    if let Some(b) = best {
        return Ok(b);
    }
    // Not even the last message: the longest end of its rendering that fits.
    let t = text_of(1);
    let chars: Vec<char> = t.chars().collect();
    let (mut lo, mut hi) = (0usize, chars.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        let s: String = chars[chars.len() - mid..].iter().collect();
        if count(&s)? <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok((chars[chars.len() - lo..].iter().collect(), 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use speccompact_history::{Message, Role};

    fn words(s: &str) -> speccompact_engine::Result<usize> {
        Ok(s.split_whitespace().count())
    }

    #[test]
    fn the_tail_keeps_the_latest_messages_that_fit() {
        let h = History {
            id: None,
            messages: (0..6)
                .map(|i| Message::text(Role::User, &format!("message {i} one two three")))
                .collect(),
        };
        let full = words(&render(
            &h,
            &RenderOptions {
                tool_result_cap: 1000,
                omit: None,
            },
        ))
        .unwrap();
        let (all, k) = truncate_tail(&h, full, 1000, &words).unwrap();
        assert_eq!(k, 6);
        assert!(!all.contains("not shown"));
        let (t, k) = truncate_tail(&h, 25, 1000, &words).unwrap();
        assert!(k >= 1 && k < 6, "{k}");
        assert!(words(&t).unwrap() <= 25);
        assert!(t.contains("message 5") && !t.contains("message 0"), "{t}");
        assert!(t.contains(&format!("[... {} earlier messages not shown ...]", 6 - k)));
        // Must fail to keep a whole message under a tiny budget: the end of the last one.
        let (t, k) = truncate_tail(&h, 2, 1000, &words).unwrap();
        assert_eq!(k, 0);
        assert!(
            words(&t).unwrap() <= 2 && t.trim_end().ends_with("three"),
            "{t}"
        );
    }

    #[test]
    fn an_empty_history_has_no_tail_and_says_so() {
        let e = truncate_tail(&History::default(), 25, 1000, &words).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Engine(speccompact_engine::Error::History(HistoryError::Empty))
            ),
            "{e:?}"
        );
    }

    #[test]
    fn method_lists_parse_and_unknown_names_are_named() {
        let m = EvalMethod::parse_list("speculative, truncate-tail,full,speculative").unwrap();
        assert_eq!(
            m,
            vec![
                EvalMethod::Engine(Method::Speculative),
                EvalMethod::TruncateTail,
                EvalMethod::Full
            ]
        );
        let e = EvalMethod::parse_list("speculative,tail")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`tail`"), "{e}");
        assert_eq!(
            "matched".parse::<TailBudget>().unwrap(),
            TailBudget::Matched
        );
        assert_eq!("300".parse::<TailBudget>().unwrap(), TailBudget::Fixed(300));
        assert!("0".parse::<TailBudget>().is_err());
    }
}
