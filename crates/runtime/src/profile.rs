//! Per-operation wall time of forwards, for profiling one decode step.
//!
//! Off by default: each [`span`] then costs one relaxed atomic load. [`enable`] turns it on
//! for the whole process; [`take`] returns and clears the totals. Operations run one after
//! another (each may use every thread), so the totals add up to the time inside the
//! forward that the spans cover; the rest is tensor glue, allocation and dispatch.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// The operations of a forward that are timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Token embedding lookup.
    Embed,
    /// RMS / layer norms (attention, feed-forward, q/k, final).
    Norm,
    /// Attention projections q, k, v and o.
    AttnProjection,
    /// Rotary position embedding of q and k.
    Rotary,
    /// Appending the new keys and values to the cache.
    CacheAppend,
    /// Attention over the cache (scores, softmax, weighted values).
    Attention,
    /// Feed-forward projections gate, up and down.
    FfnProjection,
    /// Activation and the gate × up product.
    Activation,
    /// Residual additions.
    Residual,
    /// The logits projection and the choice of positions it reads.
    Logits,
}

impl Op {
    /// Every operation, in the order of a forward.
    pub const ALL: [Op; 10] = [
        Op::Embed,
        Op::Norm,
        Op::AttnProjection,
        Op::Rotary,
        Op::CacheAppend,
        Op::Attention,
        Op::FfnProjection,
        Op::Activation,
        Op::Residual,
        Op::Logits,
    ];

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Op::Embed => "embedding",
            Op::Norm => "norms",
            Op::AttnProjection => "q/k/v/o projections",
            Op::Rotary => "rotary",
            Op::CacheAppend => "cache append",
            Op::Attention => "attention over the cache",
            Op::FfnProjection => "gate/up/down projections",
            Op::Activation => "activation × up",
            Op::Residual => "residual adds",
            Op::Logits => "logits projection",
        }
    }
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; Op::ALL.len()] = [const { AtomicU64::new(0) }; Op::ALL.len()];

/// Turns timing on or off for the whole process.
pub fn enable(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Runs `f`, adding its wall time to `op` when profiling is on.
#[inline]
pub fn span<T>(op: Op, f: impl FnOnce() -> T) -> T {
    if !ENABLED.load(Ordering::Relaxed) {
        return f();
    }
    let t = Instant::now();
    let v = f();
    NANOS[op as usize].fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    v
}

/// Seconds spent per operation since the last call, and clears them.
pub fn take() -> Vec<(Op, f64)> {
    Op::ALL
        .iter()
        .map(|&op| {
            (
                op,
                NANOS[op as usize].swap(0, Ordering::Relaxed) as f64 * 1e-9,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_count_only_while_enabled_and_take_clears() {
        // One test owns the process-wide switch (tests in this module run in one binary).
        take();
        span(Op::Rotary, || {
            std::thread::sleep(std::time::Duration::from_millis(2))
        });
        assert_eq!(take()[Op::Rotary as usize].1, 0.0);
        enable(true);
        let v = span(Op::Rotary, || {
            std::thread::sleep(std::time::Duration::from_millis(2));
            7
        });
        enable(false);
        assert_eq!(v, 7);
        let t = take();
        assert!(t[Op::Rotary as usize].1 >= 0.002, "{t:?}");
        assert_eq!(take()[Op::Rotary as usize].1, 0.0);
    }
}
