//! The two kinds of forward: prefill of a long text, and the batch-invariant step.

/// How a forward computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// Prefill of a long text in chunks ([`crate::Decoder::extend`]): the fastest kernels (dense
    /// weight copies from their row count, batched matmul attention), whose operation order
    /// depends on the chunk's shape.
    Prefill,
    /// Every other forward (decode steps, prompts of requests, verification of drafted
    /// tokens): batch-invariant on CPU. Each token's logits are bitwise the same whatever
    /// rows and tokens share the forward: projections on one quantized kernel whose rows are
    /// computed alike at any row count, attention per query in a fixed order.
    Step,
}
