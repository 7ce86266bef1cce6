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
        let invariant = self.batch_invariant();
        format!(
            "step kernels: {}{}; prefill dense copies: {} ({}); step forwards batch-invariant: {}; lookup: {}",
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
            if invariant { "yes" } else { "no" },
            match (self.lookup.mode(), self.lookup.active()) {
                (mode, true) => mode.name().to_string(),
                (mode, false) if mode != crate::LookupMode::Off => format!("{} (inactive)", mode.name()),
                _ => "off".into(),
            }
        )
    }

    /// Whether a token's step-forward logits are bitwise the same whatever rows and tokens
    /// share its forward: every projection on the kernels crate, on a CPU.
    pub fn batch_invariant(&self) -> bool {
        self.device.is_cpu()
            && self
                .blocks
                .iter()
                .flat_map(|b| [&b.wq, &b.wk, &b.wv, &b.wo, &b.gate, &b.up, &b.down])
                .chain([&self.lm_head])
                .all(|l| l.kernel(Pass::Step) == "ours")
    }
}
