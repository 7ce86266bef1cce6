//! What callers hand the decoder: load options and the rows and logit positions of a forward.

use crate::cache::Sequence;
use crate::linear::{DenseMode, KernelMode};
use crate::lookup::LookupMode;

/// How weights are prepared at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Requantize quant types without a fast kernel (Q5_x, Q8_1; Q4_1 unless the kernels
    /// crate serves it) to Q8_0.
    pub convert_slow_quants: bool,
    /// Whether to keep dense copies of the projection weights for long forwards.
    pub dense: DenseMode,
    /// Which quantized matmul serves CPU projections.
    pub kernels: KernelMode,
    /// Whether decodes draft tokens from the text ([`crate::lookup`]).
    pub lookup: LookupMode,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            convert_slow_quants: true,
            dense: DenseMode::Off,
            kernels: KernelMode::On,
            lookup: LookupMode::Off,
        }
    }
}

/// Which positions of each row the forward returns logits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogitsAt {
    /// The last new token of each row: one distribution per row.
    Last,
    /// Every new token of each row.
    All,
    /// Chosen new-token indices per row (in row order; each index below the row's new token
    /// count), in the order given.
    At(Vec<Vec<usize>>),
}

/// One row of a batched forward: a sequence and the new tokens to append to it.
#[derive(Debug)]
pub struct Row<'a> {
    /// The sequence; its cache is extended by `tokens`.
    pub seq: &'a mut Sequence,
    /// New tokens (at least one).
    pub tokens: &'a [u32],
}
