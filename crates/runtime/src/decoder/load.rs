//! Building a decoder's parts from a weight source: checked shapes, slow quant types
//! converted, and the dense-copy decision timed at load.

use super::{LoadOptions, RmsNorm};
use crate::config::ModelConfig;
use crate::linear::{
    available_memory, convert_slow, probe_dense, DenseDecision, DenseMode, Linear,
};
use crate::weights::{Param, Weight, WeightSource};
use crate::{Error, Result};
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
            Weight::Quant(q) if self.opts.convert_slow_quants => Weight::Quant(convert_slow(q)?),
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

/// Resolves [`DenseMode::Auto`] into on or off by timing the first MLP's up and down
/// projections.
pub(super) fn decide_dense(
    src: &mut dyn WeightSource,
    cfg: &ModelConfig,
    opts: LoadOptions,
    device: &Device,
) -> Result<(DenseMode, DenseDecision)> {
    let mode = opts.dense;
    let bytes = projection_elems(cfg) * 4;
    let fixed = |mode: DenseMode| {
        let (dense, min_rows) = match mode {
            DenseMode::On { min_rows } => (true, min_rows),
            _ => (false, 0),
        };
        Ok((
            mode,
            DenseDecision {
                dense,
                min_rows,
                probes: Vec::new(),
                bytes,
            },
        ))
    };
    let min_rows = match mode {
        DenseMode::Off | DenseMode::On { .. } => return fixed(mode),
        DenseMode::Auto { min_rows } => min_rows.max(1),
    };
    let mut probe = Vec::new();
    for p in [Param::Up(0), Param::Down(0)] {
        match src.get(p)? {
            Some(Weight::Quant(q)) if device.is_cpu() => probe.push(convert_slow(q)?),
            // Dense checkpoints are dense already; on GPUs quantized kernels are not the
            // bottleneck.
            _ => return fixed(DenseMode::Off),
        }
    }
    let fits = available_memory().is_none_or(|avail| bytes <= avail / 4);
    let mut probes = Vec::new();
    let mut chosen = None;
    if fits {
        for rows in [min_rows, 4 * min_rows, 16 * min_rows] {
            let (q, d) = probe_dense(&probe, rows, opts.kernels)?;
            probes.push((rows, q, d));
            if d * 1.15 < q {
                chosen = Some(rows);
                break;
            }
        }
    }
    tracing::info!(
        ?probes,
        bytes,
        fits,
        ?chosen,
        "dense weights for many-token forwards"
    );
    Ok(match chosen {
        Some(rows) => (
            DenseMode::On { min_rows: rows },
            DenseDecision {
                dense: true,
                min_rows: rows,
                probes,
                bytes,
            },
        ),
        None => (
            DenseMode::Off,
            DenseDecision {
                dense: false,
                min_rows: 0,
                probes,
                bytes,
            },
        ),
    })
}
