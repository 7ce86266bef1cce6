//! Activations quantized once per forward: int8 blocks of [`ACT_BLOCK`] values with one f32
//! scale each, and the scaled block sums the Q4_K minimum term needs.

use crate::{Error, Result};

/// Values per activation block (one scale each).
pub const ACT_BLOCK: usize = 32;

/// `m` rows of `k` activations as int8 blocks.
#[derive(Debug, Clone, Default)]
pub struct QuantizedRows {
    m: usize,
    k: usize,
    /// Quantized values, row-major (`m * k`).
    pub(crate) qs: Vec<i8>,
    /// One scale per block (`m * k / 32`).
    pub(crate) scale: Vec<f32>,
    /// `scale * Σ q` per block.
    pub(crate) sum: Vec<f32>,
}

impl QuantizedRows {
    /// Quantizes `x` (`m` rows of `k`, row-major); `k` must be a multiple of [`ACT_BLOCK`].
    pub fn quantize(x: &[f32], m: usize, k: usize) -> Result<Self> {
        let mut q = Self::default();
        q.requantize(x, m, k)?;
        Ok(q)
    }

    /// [`QuantizedRows::quantize`] into this buffer, reusing its memory.
    pub fn requantize(&mut self, x: &[f32], m: usize, k: usize) -> Result<()> {
        if k % ACT_BLOCK != 0 || x.len() != m * k {
            return Err(Error::Shape(format!(
                "activations: {} values for {m} rows of {k} (k must be a multiple of {ACT_BLOCK})",
                x.len()
            )));
        }
        let blocks = m * k / ACT_BLOCK;
        self.m = m;
        self.k = k;
        self.qs.resize(m * k, 0);
        self.scale.resize(blocks, 0.0);
        self.sum.resize(blocks, 0.0);
        for (b, (src, dst)) in x
            .chunks_exact(ACT_BLOCK)
            .zip(self.qs.chunks_exact_mut(ACT_BLOCK))
            .enumerate()
        {
            let amax = src.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut s = 0i32;
            for (o, v) in dst.iter_mut().zip(src) {
                let q = (v * inv).round().clamp(-127.0, 127.0) as i8;
                *o = q;
                s += q as i32;
            }
            self.scale[b] = d;
            self.sum[b] = d * s as f32;
        }
        Ok(())
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.m
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.k
    }

    /// The values the quantized rows stand for (row-major), for tests and references.
    pub fn dequantize(&self) -> Vec<f32> {
        self.qs
            .chunks_exact(ACT_BLOCK)
            .zip(&self.scale)
            .flat_map(|(q, d)| q.iter().map(move |v| *v as f32 * d))
            .collect()
    }

    /// Row `r`'s values, scales and block sums.
    pub(crate) fn row(&self, r: usize) -> (&[i8], &[f32], &[f32]) {
        let nb = self.k / ACT_BLOCK;
        (
            &self.qs[r * self.k..(r + 1) * self.k],
            &self.scale[r * nb..(r + 1) * nb],
            &self.sum[r * nb..(r + 1) * nb],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_is_within_half_a_step() {
        let x: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let q = QuantizedRows::quantize(&x, 2, 64).unwrap();
        let y = q.dequantize();
        for (b, (xs, ys)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let step = q.scale[b];
            for (a, c) in xs.iter().zip(ys) {
                assert!((a - c).abs() <= step * 0.5 + 1e-6);
            }
            let s: f32 = ys.iter().sum();
            assert!((s - q.sum[b]).abs() <= 1e-4 * (1.0 + s.abs()));
        }
        assert!(QuantizedRows::quantize(&x, 2, 60).is_err());
        assert!(QuantizedRows::quantize(&x, 3, 64).is_err());
        let zeros = QuantizedRows::quantize(&[0.0; 32], 1, 32).unwrap();
        assert_eq!(zeros.dequantize(), vec![0.0; 32]);
    }
}
