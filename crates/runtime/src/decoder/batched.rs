//! Attention of many-token forwards (prefill) as batched matmuls: against the shared prefix
//! (one matmul for all rows and heads of a kv group; the prefix is read in place, never
//! copied or repeated per row) and against each row's own suffix (padded to the longest
//! row), the two parts sharing one softmax. Fast, but the matmuls' operation order depends
//! on the batch's shape: step forwards use [`super::attention`] instead.

use super::positions::{pad_len, suffix_mask, SlidingMasks};
use super::Row;
use crate::cache::{LayerKv, Prefix};
use crate::{Error, Result};
use candle_core::{Device, Tensor};
use std::sync::Arc;

/// The additive masks of one batch.
pub(super) struct Masks {
    global: Tensor,
    sliding: Option<SlidingMasks>,
}

impl Masks {
    /// Masks for rows with `s` cached suffix positions and `n` new tokens, padded to `t`
    /// tokens and `kv_total` suffix keys, after a prefix of `lp`.
    pub(super) fn new(
        lp: usize,
        s: &[usize],
        n: &[usize],
        (t, kv_total): (usize, usize),
        window: Option<usize>,
        dev: &Device,
    ) -> Result<Self> {
        Ok(Self {
            global: suffix_mask(s, n, t, kv_total, None, dev)?,
            sliding: match window {
                Some(w) => Some(SlidingMasks::new(lp, s, n, t, kv_total, w, dev)?),
                None => None,
            },
        })
    }
}

/// Shapes of one batched attention.
pub(super) struct Shape {
    pub b: usize,
    pub t: usize,
    pub kv_total: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f64,
}

/// Attention of `q` (b, heads, t, head_dim) for layer `li`, whose keys and values are
/// already appended to each row's suffix; returns (b, t, heads * head_dim).
pub(super) fn attend(
    q: &Tensor,
    rows: &[&mut Row<'_>],
    li: usize,
    prefix: Option<&Arc<Prefix>>,
    masks: &Masks,
    sliding: bool,
    sh: &Shape,
) -> Result<Tensor> {
    let (b, t, kv_total) = (sh.b, sh.t, sh.kv_total);
    let (hq, hkv, hd, scale) = (sh.heads, sh.kv_heads, sh.head_dim, sh.scale);
    let g = hq / hkv;
    let lp = prefix.map_or(0, |p| p.len());
    // The padded suffix block in kv-head-major layout (hkv, b, kv_total, hd).
    let mut ks = Vec::with_capacity(b);
    let mut vs = Vec::with_capacity(b);
    for row in rows {
        let kv: &LayerKv = row
            .seq
            .suffix_layer(li)
            .ok_or_else(|| Error::InvalidRequest("suffix cache missing".into()))?;
        ks.push(pad_len(&kv.k, kv_total)?);
        vs.push(pad_len(&kv.v, kv_total)?);
    }
    let ks = Tensor::stack(&ks, 1)?;
    let vs = Tensor::stack(&vs, 1)?;
    // Queries grouped by kv head: (hkv, b, g*t, hd). Every large tensor below is produced
    // contiguous in this layout, so no score matrix is ever transposed.
    let qh = q
        .reshape((b, hkv, g * t, hd))?
        .transpose(0, 1)?
        .contiguous()?;
    let sw = if sliding {
        masks.sliding.as_ref()
    } else {
        None
    };
    let mask = sw.map_or(&masks.global, |m| &m.suffix);
    let ss = (qh.matmul(&ks.t()?)? * scale)?
        .reshape((hkv, b, g, t, kv_total))?
        .broadcast_add(mask)?
        .reshape((hkv, b * g * t, kv_total))?;
    // The part of the prefix this layer can see.
    let (p0, plen) = match sw {
        Some(m) => (m.prefix_start, lp - m.prefix_start),
        None => (0, lp),
    };
    let o = match prefix {
        Some(p) if plen > 0 => {
            let pkv = p
                .layer(li)
                .ok_or_else(|| Error::InvalidRequest("prefix layer missing".into()))?;
            let (pk, pv) = (pkv.k.narrow(1, p0, plen)?, pkv.v.narrow(1, p0, plen)?);
            // One matmul per kv head covers every row: the prefix is read in place.
            let qp = qh.reshape((hkv, b * g * t, hd))?;
            let mut sp = (qp.matmul(&pk.t()?)? * scale)?;
            if let Some(m) = sw.and_then(|m| m.prefix.as_ref()) {
                sp = sp
                    .reshape((hkv, b, g, t, plen))?
                    .broadcast_add(m)?
                    .reshape((hkv, b * g * t, plen))?;
            }
            let all = Tensor::cat(&[&sp, &ss], 2)?;
            let probs = candle_nn::ops::softmax_last_dim(&all)?;
            let op = probs.narrow(2, 0, plen)?.matmul(&pv.contiguous()?)?;
            let ps = probs.narrow(2, plen, kv_total)?.contiguous()?.reshape((
                hkv,
                b,
                g * t,
                kv_total,
            ))?;
            (op.reshape((hkv, b, g * t, hd))? + ps.matmul(&vs)?)?
        }
        _ => candle_nn::ops::softmax_last_dim(&ss)?
            .reshape((hkv, b, g * t, kv_total))?
            .matmul(&vs)?,
    };
    // (hkv, b, g, t, hd) -> (b, t, hkv, g, hd) -> (b, t, hq*hd)
    let o = o
        .reshape((hkv, b, g, t, hd))?
        .permute((1, 3, 0, 2, 4))?
        .contiguous()?
        .reshape((b, t, hq * hd))?;
    Ok(o)
}
