//! Positions: rotary tables, the attention masks of each row's suffix (causal, and sliding
//! for local layers), and padding of rows to a common length.

use super::Rope;
use crate::config::ModelConfig;
use crate::Result;
use candle_core::{DType, Device, Tensor};

/// Pads (hkv, len, hd) with zeros along positions to `to`.
pub(super) fn pad_len(x: &Tensor, to: usize) -> Result<Tensor> {
    let len = x.dim(1)?;
    if len == to {
        return Ok(x.contiguous()?);
    }
    let (h, _, d) = x.dims3()?;
    let z = Tensor::zeros((h, to - len, d), x.dtype(), x.device())?;
    Ok(Tensor::cat(&[x, &z], 1)?)
}

/// Additive mask (1, b, 1, t, kv_total) over the suffix keys: query i of row r (at suffix
/// position s_r + i) sees suffix keys 0..=s_r+i, and with a window only those less than
/// `window` positions back; padded queries see what their row's last real query sees.
pub(super) fn suffix_mask(
    s: &[usize],
    n: &[usize],
    t: usize,
    kv_total: usize,
    window: Option<usize>,
    dev: &Device,
) -> Result<Tensor> {
    let b = s.len();
    let mut m = vec![0f32; b * t * kv_total];
    for r in 0..b {
        for i in 0..t {
            let q = s[r] + i.min(n[r] - 1);
            let lo = window.map_or(0, |w| (q + 1).saturating_sub(w));
            for j in 0..kv_total {
                if j > q || j < lo {
                    m[(r * t + i) * kv_total + j] = f32::NEG_INFINITY;
                }
            }
        }
    }
    Ok(Tensor::from_vec(m, (1, b, 1, t, kv_total), dev)?)
}

/// Masks of sliding-window layers for one batch.
pub(super) struct SlidingMasks {
    pub(super) suffix: Tensor,
    /// First prefix position any query of the batch can see.
    pub(super) prefix_start: usize,
    /// Additive mask (1, b, 1, t, lp - prefix_start) over the visible prefix, when some
    /// query cannot see all of it.
    pub(super) prefix: Option<Tensor>,
}

impl SlidingMasks {
    pub(super) fn new(
        lp: usize,
        s: &[usize],
        n: &[usize],
        t: usize,
        kv_total: usize,
        window: usize,
        dev: &Device,
    ) -> Result<Self> {
        let b = s.len();
        let suffix = suffix_mask(s, n, t, kv_total, Some(window), dev)?;
        // Absolute position of query (r, i) is lp + s_r + i; it sees keys >= pos + 1 - window.
        let lowest = (0..b)
            .map(|r| (lp + s[r] + 1).saturating_sub(window))
            .min()
            .unwrap_or(0);
        let prefix_start = lowest.min(lp);
        let plen = lp - prefix_start;
        let mut any = false;
        let mut m = vec![0f32; b * t * plen];
        for r in 0..b {
            for i in 0..t {
                let q = lp + s[r] + i.min(n[r] - 1);
                let lo = (q + 1).saturating_sub(window);
                for j in 0..plen {
                    if prefix_start + j < lo {
                        m[(r * t + i) * plen + j] = f32::NEG_INFINITY;
                        any = true;
                    }
                }
            }
        }
        let prefix = match any {
            true => Some(Tensor::from_vec(m, (1, b, 1, t, plen), dev)?),
            false => None,
        };
        Ok(Self {
            suffix,
            prefix_start,
            prefix,
        })
    }
}

pub(super) fn rope_table(cfg: &ModelConfig, theta: f32, scale: f32, dev: &Device) -> Result<Rope> {
    let max_pos = cfg.context_length.clamp(1, 1 << 17);
    let half = cfg.head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1f32 / theta.powf((2 * i) as f32 / cfg.head_dim as f32) / scale)
        .collect();
    let inv = Tensor::from_vec(inv, (1, half), dev)?;
    let p = Tensor::arange(0u32, max_pos as u32, dev)?
        .to_dtype(DType::F32)?
        .reshape((max_pos, 1))?;
    let f = p.matmul(&inv)?;
    Ok(Rope {
        cos: f.cos()?.contiguous()?,
        sin: f.sin()?.contiguous()?,
    })
}
