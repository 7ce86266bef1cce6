//! Building a decoder's parts from a weight source: checked shapes, slow quant types
//! converted, and the dense-copy decision by its fixed rule.

use super::{LoadOptions, RmsNorm};
use crate::config::ModelConfig;
use crate::linear::{convert_slow, total_memory, DenseDecision, DenseMode, Linear};
use crate::weights::{Param, Weight, WeightSource};
use crate::{Error, Result};
use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};

pub(super) struct Loader<'a> {
    pub(super) src: &'a mut dyn WeightSource,
    pub(super) opts: LoadOptions,
}

impl Loader<'_> {
    pub(super) fn require(&mut self, p: Param) -> Result<Weight> {
        self.src
            .get(p)?
            .ok_or_else(|| Error::weight(&p.gguf_name(), "not present in the file"))
    }

    pub(super) fn matrix(&mut self, p: Param, rows: usize, cols: usize) -> Result<Weight> {
        let w = self.require(p)?;
        if w.dims() != [rows, cols] {
            return Err(Error::weight(
                &p.gguf_name(),
                format!("shape {:?}, expected [{rows}, {cols}]", w.dims()),
            ));
        }
        Ok(match w {
            Weight::Quant(q) if self.opts.convert_slow_quants => {
                Weight::Quant(convert_slow(q, self.opts.kernels)?)
            }
            other => other,
        })
    }

    pub(super) fn vector(&mut self, p: Param, len: usize) -> Result<Tensor> {
        let w = self.require(p)?;
        if w.dims().iter().product::<usize>() != len {
            return Err(Error::weight(
                &p.gguf_name(),
                format!("shape {:?}, expected [{len}]", w.dims()),
            ));
        }
        w.to_f32()?.reshape(len).map_err(Into::into)
    }

    pub(super) fn linear(
        &mut self,
        p: Param,
        bias: Option<Param>,
        rows: usize,
        cols: usize,
    ) -> Result<Linear> {
        let w = self.matrix(p, rows, cols)?;
        let b = match bias {
            Some(b) => Some(self.vector(b, rows)?),
            None => None,
        };
        Linear::from_weight(w, b, self.opts.dense, self.opts.kernels)
    }

    pub(super) fn norm(&mut self, p: Param, len: usize, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: self.vector(p, len)?,
            eps: eps as f32,
        })
    }
}

/// Elements of every projection matrix (what dense copies would hold).
pub(super) fn projection_elems(cfg: &ModelConfig) -> usize {
    let h = cfg.hidden_size;
    let q = cfg.num_heads * cfg.head_dim;
    let kv = cfg.num_kv_heads * cfg.head_dim;
    let per_layer = 2 * q * h + 2 * kv * h + 3 * cfg.intermediate_size * h;
    per_layer * cfg.num_layers + cfg.vocab_size * h
}

/// Resolves [`DenseMode::Auto`] into on or off by its fixed rule.
pub(super) fn decide_dense(
    src: &mut dyn WeightSource,
    cfg: &ModelConfig,
    opts: LoadOptions,
    device: &Device,
) -> Result<(DenseMode, DenseDecision)> {
    let bytes = projection_elems(cfg) * 4;
    let decided = |mode: DenseMode, reason: String| {
        let (dense, min_rows) = match mode {
            DenseMode::On { min_rows } => (true, min_rows),
            _ => (false, 0),
        };
        Ok((
            mode,
            DenseDecision {
                dense,
                min_rows,
                reason,
                bytes,
            },
        ))
    };
    let min_rows = match opts.dense {
        DenseMode::Off => return decided(DenseMode::Off, "dense = off".into()),
        DenseMode::On { min_rows } => {
            return decided(opts.dense, format!("dense = on from {min_rows} rows"))
        }
        DenseMode::Auto { min_rows } => min_rows.max(1),
    };
    if !device.is_cpu() {
        return decided(DenseMode::Off, "not on CPU".into());
    }
    for p in [Param::Up(0), Param::Down(0)] {
        let dtype = match src.get(p)? {
            Some(Weight::Quant(q)) if opts.convert_slow_quants => {
                convert_slow(q, opts.kernels)?.dtype()
            }
            Some(Weight::Quant(q)) => q.dtype(),
            _ => return decided(DenseMode::Off, "dense weights already".into()),
        };
        if dtype != GgmlDType::Q8_0 {
            return decided(
                DenseMode::Off,
                format!("{dtype:?} projections: f32 copies are slower than their kernels"),
            );
        }
    }
    match total_memory() {
        Some(total) if bytes > total / 4 => decided(
            DenseMode::Off,
            format!(
                "copies of {} MiB exceed a quarter of the machine's {} MiB",
                bytes >> 20,
                total >> 20
            ),
        ),
        _ => decided(
            DenseMode::On { min_rows },
            format!("8-bit projections: f32 copies from {min_rows} rows"),
        ),
    }
}
