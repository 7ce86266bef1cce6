//! What a decoder tells traces about how it computes: the step kernels, the dense rule's
//! outcome and whether step forwards are batch-invariant.

use super::{Decoder, Pass};

impl Decoder {
    /// How this model computes, in words (recorded in traces): the matmul kernel of its
    /// projections, the dense rule's outcome and whether step forwards are batch-invariant.
    pub fn numerics(&self) -> String {
        let mut kernels: Vec<&str> = self
            .blocks
            .iter()
            .flat_map(|b| [&b.wq, &b.wk, &b.wv, &b.wo, &b.gate, &b.up, &b.down])
            .chain([&self.lm_head])
            .map(|l| l.kernel(Pass::Step))
            .collect();
        kernels.sort_unstable();
        kernels.dedup();
        let ours = kernels == ["ours"];
        let invariant = ours && self.device.is_cpu();
        format!(
            "step kernels: {}{}; prefill dense copies: {} ({}); step forwards batch-invariant: {}",
            kernels.join("+"),
            if kernels.contains(&"ours") {
                format!(" ({})", crate::linear::kernel_isa().name())
            } else {
                String::new()
            },
            if self.dense.dense {
                format!("from {} rows", self.dense.min_rows)
            } else {
                "off".into()
            },
            self.dense.reason,
            if invariant { "yes" } else { "no" }
        )
    }
}
