//! The compaction methods, each a function of a [`crate::job::Job`]: `speculative` (drafted
//! lines judged by the target, rejected ones repaired), `exact` (lossless verification: the
//! target's own greedy lines), and `baselines` (`sequential`, `target-self`, `drafter-only`).

pub(crate) mod baselines;
pub(crate) mod exact;
mod slot_stream;
pub(crate) mod speculative;
