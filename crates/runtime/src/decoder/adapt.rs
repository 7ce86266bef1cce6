//! A LoRA adapter on a loaded decoder: each adapted projection gets its side path (or the
//! merged weight, for dense ones); the weights themselves stay shared with the base.

use super::Decoder;
use crate::adapter::Adapter;
use crate::config::RopeStyle;
use crate::linear::Linear;
use crate::lookup::Lookup;
use crate::weights::Param;
use crate::{Error, Result};
use std::sync::Arc;

impl Decoder {
    /// This decoder with `adapter` on its projections (PEFT's `q_proj` … `down_proj`, in
    /// Hugging Face row order; for llama GGUF files the q/k rows are permuted as the
    /// converter permuted the weights). The base's weights are shared, not copied; the
    /// result has a fresh lookup. A layer or shape that does not fit names the weight.
    pub fn with_adapter(&self, adapter: &Adapter) -> Result<Self> {
        let cfg = &self.cfg;
        let adapter = match cfg.rope_style {
            RopeStyle::Interleaved => adapter.for_interleaved_rope(
                cfg.num_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                false,
            )?,
            RopeStyle::Neox => adapter.clone(),
        };
        let mut out = self.clone();
        for ((layer, module), pair) in &adapter.pairs {
            let i = *layer;
            let (param, slot): (Param, fn(&mut super::Block) -> &mut Linear) = match module.as_str()
            {
                "q_proj" => (Param::Q(i), |b| &mut b.wq),
                "k_proj" => (Param::K(i), |b| &mut b.wk),
                "v_proj" => (Param::V(i), |b| &mut b.wv),
                "o_proj" => (Param::O(i), |b| &mut b.wo),
                "gate_proj" => (Param::Gate(i), |b| &mut b.gate),
                "up_proj" => (Param::Up(i), |b| &mut b.up),
                "down_proj" => (Param::Down(i), |b| &mut b.down),
                other => {
                    return Err(Error::weight(
                        &format!("layer {i} {other}"),
                        "not a projection this runtime adapts",
                    ))
                }
            };
            let n = cfg.num_layers;
            let block = out.blocks.get_mut(i).ok_or_else(|| {
                Error::weight(
                    &param.gguf_name(),
                    format!("the adapter has layer {i}, the model {n} layers"),
                )
            })?;
            let lin = slot(block);
            *lin = lin
                .with_adapter(&pair.a, &pair.b, adapter.scale())
                .map_err(|reason| {
                    Error::weight(&param.gguf_name(), format!("adapter: {reason}"))
                })?;
        }
        out.lookup = Arc::new(Lookup::new(self.lookup.mode(), out.batch_invariant()));
        Ok(out)
    }

    /// Projections that run an adapter's side path beside their quantized weights.
    pub fn side_paths(&self) -> usize {
        self.blocks
            .iter()
            .flat_map(|b| [&b.wq, &b.wk, &b.wv, &b.wo, &b.gate, &b.up, &b.down])
            .filter(|l| l.has_side_path())
            .count()
    }
}
