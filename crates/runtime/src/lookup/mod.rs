//! Lossless token speculation from the text itself (prompt lookup): a draft source proposes
//! what follows the longest earlier occurrence of the tokens written so far, one forward
//! checks the proposal, and the longest run equal to the model's greedy choices is kept.
//! Owns the mode, the draft source, the cost model deciding how much to draft, and the
//! counters traces report.

mod cost;
mod suffix;

pub use cost::{CostModel, MATCH_CLASSES, TIMED_TOKENS};
pub use suffix::{DraftSource, Proposal, SuffixMatch};

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Whether decodes draft from the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LookupMode {
    /// Draft where the measured cost model says it pays, and only on a model whose step
    /// forwards are batch-invariant (so the output is the same as without).
    Auto,
    /// Draft whenever the source proposes something.
    On,
    /// Never draft.
    #[default]
    Off,
}

impl LookupMode {
    /// The mode's name as settings and flags spell it.
    pub fn name(self) -> &'static str {
        match self {
            LookupMode::Auto => "auto",
            LookupMode::On => "on",
            LookupMode::Off => "off",
        }
    }
}

impl std::str::FromStr for LookupMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(LookupMode::Auto),
            "on" => Ok(LookupMode::On),
            "off" => Ok(LookupMode::Off),
            other => Err(format!("unknown lookup mode {other:?} (auto, on or off)")),
        }
    }
}

/// Most tokens drafted for one row in one forward.
pub const MAX_DRAFT: usize = 16;
/// Tokens drafted before the cost model has timed two forward sizes.
const EXPLORE: usize = 2;

/// What lookup did so far (totals since the model was loaded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupCounters {
    /// Proposed tokens fed to forwards.
    pub drafted: u64,
    /// Of those, tokens equal to the model's greedy choice and kept.
    pub kept: u64,
    /// Forwards that carried proposed tokens.
    pub forwards: u64,
}

impl LookupCounters {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &LookupCounters) -> LookupCounters {
        LookupCounters {
            drafted: self.drafted.saturating_sub(earlier.drafted),
            kept: self.kept.saturating_sub(earlier.kept),
            forwards: self.forwards.saturating_sub(earlier.forwards),
        }
    }
}

/// A model's lookup: mode, source, cost model and counters (shared by its clones).
#[derive(Debug)]
pub struct Lookup {
    mode: LookupMode,
    /// False where step forwards are not batch-invariant: `auto` then never drafts.
    invariant: bool,
    source: Box<dyn DraftSource>,
    model: Mutex<CostModel>,
    drafted: AtomicU64,
    kept: AtomicU64,
    forwards: AtomicU64,
}

impl Lookup {
    /// Lookup in `mode` with the default suffix-match source; `invariant` says whether the
    /// model's step forwards are batch-invariant.
    pub fn new(mode: LookupMode, invariant: bool) -> Self {
        Self::with_source(mode, invariant, Box::new(SuffixMatch::default()))
    }

    /// Lookup with another draft source.
    pub fn with_source(mode: LookupMode, invariant: bool, source: Box<dyn DraftSource>) -> Self {
        Self {
            mode,
            invariant,
            source,
            model: Mutex::new(CostModel::default()),
            drafted: AtomicU64::new(0),
            kept: AtomicU64::new(0),
            forwards: AtomicU64::new(0),
        }
    }

    /// The configured mode.
    pub fn mode(&self) -> LookupMode {
        self.mode
    }

    /// Whether decodes may draft at all.
    pub fn active(&self) -> bool {
        match self.mode {
            LookupMode::Off => false,
            LookupMode::On => true,
            LookupMode::Auto => self.invariant,
        }
    }

    /// The totals so far.
    pub fn counters(&self) -> LookupCounters {
        LookupCounters {
            drafted: self.drafted.load(Ordering::Relaxed),
            kept: self.kept.load(Ordering::Relaxed),
            forwards: self.forwards.load(Ordering::Relaxed),
        }
    }

    /// Proposals for a forward of `contexts.len()` rows: row `i` continues `contexts[i]` and
    /// can take at most `room[i]` drafted tokens. Returns each row's drafted tokens and the
    /// match length they came from (empty: no draft), one length for all rows.
    pub fn propose(&self, contexts: &[Vec<u32>], room: &[usize]) -> Vec<(Vec<u32>, usize)> {
        let none = || vec![(Vec::new(), 0); contexts.len()];
        if !self.active() {
            return none();
        }
        let found: Vec<Option<Proposal>> = contexts
            .iter()
            .zip(room)
            .map(|(c, &r)| self.source.propose(c, r.min(MAX_DRAFT)))
            .collect();
        if found.iter().all(Option::is_none) {
            return none();
        }
        let len = match self.mode {
            LookupMode::On => MAX_DRAFT,
            _ => {
                let caps: Vec<(usize, usize)> = found
                    .iter()
                    .map(|p| p.as_ref().map_or((0, 0), |p| (p.tokens.len(), p.matched)))
                    .collect();
                self.cost().choose(contexts.len(), &caps, EXPLORE)
            }
        };
        found
            .into_iter()
            .map(|p| match p {
                Some(mut p) if len > 0 => {
                    p.tokens.truncate(len);
                    (p.tokens, p.matched)
                }
                _ => (Vec::new(), 0),
            })
            .collect()
    }

    /// Records a forward computing `tokens` positions in `seconds`.
    pub fn record_forward(&self, tokens: usize, seconds: f64) {
        if self.active() {
            self.cost().record_forward(tokens, seconds);
        }
    }

    /// Records one row's draft: `drafted` tokens from a match of `matched`, `reached` of
    /// them checked before the row stopped or diverged, `kept` equal to the model's choice.
    pub fn record_draft(&self, matched: usize, drafted: usize, reached: usize, kept: usize) {
        self.cost().record_draft(matched, reached, kept);
        self.drafted.fetch_add(drafted as u64, Ordering::Relaxed);
        self.kept.fetch_add(kept as u64, Ordering::Relaxed);
    }

    /// Records that one forward carried drafts.
    pub fn record_draft_forward(&self) {
        self.forwards.fetch_add(1, Ordering::Relaxed);
    }

    fn cost(&self) -> std::sync::MutexGuard<'_, CostModel> {
        // A panic elsewhere cannot leave the model's numbers half-written in a harmful way.
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_gate_drafting() {
        assert_eq!("auto".parse::<LookupMode>(), Ok(LookupMode::Auto));
        assert!("fast".parse::<LookupMode>().unwrap_err().contains("fast"));
        assert!(!Lookup::new(LookupMode::Off, true).active());
        assert!(Lookup::new(LookupMode::On, false).active());
        assert!(Lookup::new(LookupMode::Auto, true).active());
        assert!(
            !Lookup::new(LookupMode::Auto, false).active(),
            "auto never drafts where drafting could change the output"
        );
    }

    #[test]
    fn proposals_share_one_length_and_respect_each_rows_room() {
        let l = Lookup::new(LookupMode::On, true);
        let ctx = vec![1, 2, 3, 4, 5, 6, 7, 1, 2];
        let p = l.propose(&[ctx.clone(), vec![9, 8], ctx], &[20, 5, 3]);
        assert_eq!(p[0], (vec![3, 4, 5, 6, 7, 1, 2], 2));
        assert_eq!(p[1], (vec![], 0), "no match");
        assert_eq!(p[2], (vec![3, 4, 5], 2), "room of 3");
        let off = Lookup::new(LookupMode::Off, true);
        assert!(off.propose(&[vec![1, 2, 1, 2]], &[4])[0].0.is_empty());
        // Auto explores two tokens before it has timings.
        let auto = Lookup::new(LookupMode::Auto, true);
        assert_eq!(auto.propose(&[vec![1, 2, 3, 1, 2]], &[8])[0].0, vec![3, 1]);
    }

    #[test]
    fn counters_add_up() {
        let l = Lookup::new(LookupMode::On, true);
        l.record_draft(3, 5, 4, 3);
        l.record_draft_forward();
        let a = l.counters();
        assert_eq!((a.drafted, a.kept, a.forwards), (5, 3, 1));
        l.record_draft(3, 2, 2, 2);
        assert_eq!(l.counters().since(&a).kept, 2);
    }
}
