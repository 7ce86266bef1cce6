//! Drift stress: a long session compacted every K messages for N generations, each from the
//! previous summary plus the new messages (recursive), and each rebuilt from the original log
//! up to the same point; per generation, how many of the probes seen so far survive in each
//! and which survive in only one.

use crate::data::{history_text, EvalSession};
use crate::metrics::probe_hits;
use crate::Result;
use serde::Serialize;
use speccompact_engine::{Backend, Compactor, Method};
use speccompact_history::{History, Message, Role};

/// The lead-in of the message that carries the previous summary into the next generation.
pub const SUMMARY_LEAD: &str = "Summary of the session so far (written at the last compaction):\n";

/// One generation.
#[derive(Debug, Clone, Serialize)]
pub struct DriftGeneration {
    /// 1-based generation.
    pub generation: usize,
    /// Messages of the original log covered.
    pub messages: usize,
    /// Presence probes whose strings occur in those messages.
    pub probes_seen: usize,
    /// Of those, found in the recursive summary.
    pub recursive: usize,
    /// Of those, found in the rebuild.
    pub rebuild: usize,
    /// Probe ids found only in the recursive summary.
    pub only_recursive: Vec<String>,
    /// Probe ids found only in the rebuild.
    pub only_rebuild: Vec<String>,
    /// Errors of this generation's compactions (the other one still counts).
    pub errors: Vec<String>,
}

/// Drift of one session.
#[derive(Debug, Clone, Serialize)]
pub struct DriftReport {
    /// Session id.
    pub session: String,
    /// Method used for both chains.
    pub method: Method,
    /// Messages per generation (at most; spread evenly unless fixed).
    pub every: usize,
    /// Generations in order.
    pub generations: Vec<DriftGeneration>,
}

/// Runs `generations` generations on `s`: every `every` messages, or at evenly spread
/// points ending with the last message (fewer generations only when the session has fewer
/// messages than generations).
pub fn drift_stress<B: Backend + 'static>(
    c: &Compactor<B>,
    s: &EvalSession,
    method: Method,
    generations: usize,
    every: Option<usize>,
    progress: &mut dyn FnMut(usize),
) -> Result<DriftReport> {
    let n = s.history.messages.len();
    let gens = generations.max(1);
    let k = every.unwrap_or_else(|| n.div_ceil(gens)).max(1);
    // Without a fixed K the generations end at evenly spread points, the last at the end.
    let end_of = |g: usize| match every {
        Some(_) => (g * k).min(n),
        None => (g * n).div_ceil(gens),
    };
    let probes: Vec<&crate::Probe> = s.presence_probes().collect();
    let mut out = Vec::new();
    let mut previous: Option<String> = None;
    let mut prev_end = 0;
    // First message not yet folded into a summary (a failed generation keeps its messages
    // for the next one).
    let mut chain_from = 0;
    for g in 1..=generations {
        let end = end_of(g);
        if end == prev_end {
            break;
        }
        progress(g);
        let seen = History {
            id: s.history.id.clone(),
            messages: s.history.messages[..end].to_vec(),
        };
        let stext = history_text(&seen);
        let live: Vec<&crate::Probe> = probes
            .iter()
            .copied()
            .filter(|p| p.expect_any.iter().any(|e| stext.contains(e.as_str())))
            .collect();
        let mut recursive_input = History {
            id: s.history.id.clone(),
            messages: Vec::new(),
        };
        if let Some(prev) = &previous {
            recursive_input
                .messages
                .push(Message::text(Role::User, &format!("{SUMMARY_LEAD}{prev}")));
        }
        recursive_input
            .messages
            .extend_from_slice(&s.history.messages[chain_from..end]);
        let mut errors = Vec::new();
        let mut run = |h: &History, what: &str| match c.compact_blocking(h, method, &mut |_| {}) {
            Ok(c) => Some(c.markdown),
            Err(e) => {
                errors.push(format!("{what}: {e}"));
                None
            }
        };
        let rec = run(&recursive_input, "recursive");
        let reb = if g == 1 {
            rec.clone()
        } else {
            run(&seen, "rebuild")
        };
        let found = |text: &Option<String>| -> Vec<String> {
            text.as_deref().map_or_else(Vec::new, |t| {
                probe_hits(&live, t, None)
                    .into_iter()
                    .filter(|h| h.found)
                    .map(|h| h.id)
                    .collect()
            })
        };
        let (fr, fb) = (found(&rec), found(&reb));
        out.push(DriftGeneration {
            generation: g,
            messages: end,
            probes_seen: live.len(),
            recursive: fr.len(),
            rebuild: fb.len(),
            only_recursive: fr.iter().filter(|x| !fb.contains(x)).cloned().collect(),
            only_rebuild: fb.iter().filter(|x| !fr.contains(x)).cloned().collect(),
            errors,
        });
        if rec.is_some() {
            previous = rec;
            chain_from = end;
        }
        prev_end = end;
    }
    Ok(DriftReport {
        session: s.id.clone(),
        method,
        every: k,
        generations: out,
    })
}
