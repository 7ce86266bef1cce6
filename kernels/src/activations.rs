//! Activations quantized once per forward: int8 blocks of [`ACT_BLOCK`] values with one f32
//! scale each, the scaled block sums the Q4_K and Q4_1 minimum terms need, and the per-16 integer sums
//! the Q6_K offset needs.

use crate::{Error, Result};
use rayon::prelude::*;

/// Values per activation block (one scale each).
pub const ACT_BLOCK: usize = 32;

/// Values below which quantizing on one thread beats handing rows to the pool (about 0.2 ns a
/// value against tens of microseconds for a hand-off).
const PARALLEL_VALUES: usize = 1 << 18;

/// Quantizes whole blocks of `x`, on the widest instruction set this CPU runs (the same
/// arithmetic on each, so the same results).
fn quantize_blocks(
    x: &[f32],
    qs: &mut [i8],
    scale: &mut [f32],
    sum: &mut [f32],
    off16: &mut [i32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::Isa::Avx512Vnni.available() {
            // SAFETY: the CPU runs AVX-512 F/BW.
            return unsafe { quantize_avx512(x, qs, scale, sum, off16) };
        }
        if crate::Isa::Avx2.available() {
            // SAFETY: the CPU runs AVX2 and FMA.
            return unsafe { quantize_avx2(x, qs, scale, sum, off16) };
        }
    }
    quantize_portable(x, qs, scale, sum, off16)
}

/// [`quantize_portable`] 16 values per register: the same operations, so the same results.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn quantize_avx512(
    x: &[f32],
    qs: &mut [i8],
    scale: &mut [f32],
    sum: &mut [f32],
    off16: &mut [i32],
) {
    use std::arch::x86_64::*;
    let abs = _mm512_set1_epi32(0x7FFF_FFFF);
    let sign = _mm512_set1_epi32(i32::MIN);
    let half = _mm512_castps_si512(_mm512_set1_ps(0.499_999_97));
    let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    for b in 0..x.len() / ACT_BLOCK {
        let p = x.as_ptr().add(ACT_BLOCK * b);
        let v = [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))];
        let a = v.map(|v| _mm512_and_si512(_mm512_castps_si512(v), abs));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(
            _mm512_castsi512_ps(a[0]),
            _mm512_castsi512_ps(a[1]),
        ));
        let d = amax / 127.0;
        let inv = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let mut s = [0i32; 2];
        for h in 0..2 {
            let y = _mm512_mul_ps(v[h], inv);
            let c = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(y), sign), half);
            let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(
                _mm512_add_ps(y, _mm512_castsi512_ps(c)),
            );
            let q = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(r, lo), hi));
            let dst = qs.as_mut_ptr().add(ACT_BLOCK * b + 16 * h);
            _mm_storeu_si128(dst as *mut __m128i, _mm512_cvtepi32_epi8(q));
            s[h] = _mm512_reduce_add_epi32(q);
        }
        finish_block(b, d, s, scale, sum, off16);
    }
}

/// [`quantize_portable`] 8 values per register: the same operations, so the same results.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(
    x: &[f32],
    qs: &mut [i8],
    scale: &mut [f32],
    sum: &mut [f32],
    off16: &mut [i32],
) {
    use std::arch::x86_64::*;
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let sign = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
    let half = _mm256_set1_ps(0.499_999_97);
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for b in 0..x.len() / ACT_BLOCK {
        let p = x.as_ptr().add(ACT_BLOCK * b);
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_and_ps(v[0], abs), _mm256_and_ps(v[1], abs)),
            _mm256_max_ps(_mm256_and_ps(v[2], abs), _mm256_and_ps(v[3], abs)),
        );
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
        let d = amax / 127.0;
        let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let q = v.map(|v| {
            let y = _mm256_mul_ps(v, inv);
            let c = _mm256_or_ps(_mm256_and_ps(y, sign), half);
            let r =
                _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(_mm256_add_ps(y, c));
            _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
        });
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let dst = qs.as_mut_ptr().add(ACT_BLOCK * b);
        _mm256_storeu_si256(
            dst as *mut __m256i,
            _mm256_permutevar8x32_epi32(bytes, order),
        );
        let s = [0, 1].map(|h| {
            let t = _mm256_add_epi32(q[2 * h], q[2 * h + 1]);
            let t = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            let t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0b01_00_11_10));
            _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0b10_11_00_01)))
        });
        finish_block(b, d, s, scale, sum, off16);
    }
}

/// Block `b`'s scale, scaled sum and per-16 offsets from its per-16 sums `s`.
#[inline(always)]
fn finish_block(
    b: usize,
    d: f32,
    s: [i32; 2],
    scale: &mut [f32],
    sum: &mut [f32],
    off16: &mut [i32],
) {
    scale[b] = d;
    sum[b] = d * (s[0] + s[1]) as f32;
    off16[2 * b] = -32 * s[0];
    off16[2 * b + 1] = -32 * s[1];
}

/// `y.round()` (halves away from zero) in a form that vectorizes: `trunc(y ± (0.5 - 2⁻²⁵))`,
/// exact for every `|y| < 2²³` (an exact half lands on the even side of the next integer).
#[inline(always)]
fn round_half_away(y: f32) -> f32 {
    (y + 0.499_999_97f32.copysign(y)).trunc()
}

/// Block `b`: `d = max|x| / 127`, `q = round(x / d)`, its scaled sum and per-16 offsets.
fn quantize_portable(
    x: &[f32],
    qs: &mut [i8],
    scale: &mut [f32],
    sum: &mut [f32],
    off16: &mut [i32],
) {
    for (b, (src, dst)) in x
        .chunks_exact(ACT_BLOCK)
        .zip(qs.chunks_exact_mut(ACT_BLOCK))
        .enumerate()
    {
        let mut lanes = [0f32; 16];
        for c in src.chunks_exact(16) {
            for (l, v) in lanes.iter_mut().zip(c) {
                *l = l.max(v.abs());
            }
        }
        let amax = lanes.iter().fold(0f32, |a, v| a.max(*v));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut s = [0i32; 2];
        for (h, (o16, v16)) in dst
            .chunks_exact_mut(16)
            .zip(src.chunks_exact(16))
            .enumerate()
        {
            for (o, v) in o16.iter_mut().zip(v16) {
                *o = round_half_away(v * inv).clamp(-127.0, 127.0) as i8;
            }
            s[h] = o16.iter().map(|q| *q as i32).sum();
        }
        finish_block(b, d, s, scale, sum, off16);
    }
}

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
    /// `-32 · Σ q` per 16 values (`m * k / 16`): the start of an integer sum against Q6_K
    /// values kept unsigned (`w + 32`), which leaves Σ q·w.
    pub(crate) off16: Vec<i32>,
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
        self.off16.resize(2 * blocks, 0);
        if blocks == 0 {
            return Ok(());
        }
        // Whole rows per task: all of them, or a share per thread when there are enough.
        let threads = rayon::current_num_threads().max(1);
        let rows_per = if m * k >= PARALLEL_VALUES && threads > 1 {
            m.div_ceil(threads)
        } else {
            m.max(1)
        };
        let nb = k / ACT_BLOCK;
        let parts = x
            .chunks(rows_per * k)
            .zip(self.qs.chunks_mut(rows_per * k))
            .zip(self.scale.chunks_mut(rows_per * nb))
            .zip(self.sum.chunks_mut(rows_per * nb))
            .zip(self.off16.chunks_mut(rows_per * 2 * nb))
            .map(|((((x, q), d), s), o)| (x, q, d, s, o));
        if m > rows_per {
            parts
                .collect::<Vec<_>>()
                .into_par_iter()
                .for_each(|(x, q, d, s, o)| quantize_blocks(x, q, d, s, o));
        } else {
            parts.for_each(|(x, q, d, s, o)| quantize_blocks(x, q, d, s, o));
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

    /// Row `r`'s Q6_K offsets (`-32 · Σ q` per 16 values).
    pub(crate) fn off16(&self, r: usize) -> &[i32] {
        let n16 = self.k / 16;
        &self.off16[r * n16..(r + 1) * n16]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_instruction_set_quantizes_alike() {
        let mut x: Vec<f32> = (0..32 * 64)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / (1.0 + (i % 13) as f32))
            .collect();
        // An all-zero block, ties at ±half steps, tiny and signed-zero values.
        x[..32].fill(0.0);
        for (i, v) in x[32..64].iter_mut().enumerate() {
            *v = (i as f32 - 15.5) * 127.0 / 16.0;
        }
        x[64..96].copy_from_slice(&[-0.0; 32]);
        x[96] = 1e-30;
        let nb = x.len() / 32;
        type Quantizer<'a> = &'a dyn Fn(&[f32], &mut [i8], &mut [f32], &mut [f32], &mut [i32]);
        let run = |f: Quantizer| {
            let (mut q, mut d, mut s, mut o) = (
                vec![0i8; x.len()],
                vec![0f32; nb],
                vec![0f32; nb],
                vec![0i32; 2 * nb],
            );
            f(&x, &mut q, &mut d, &mut s, &mut o);
            (q, d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), s, o)
        };
        let want = run(&quantize_portable);
        #[cfg(target_arch = "x86_64")]
        {
            if crate::Isa::Avx2.available() {
                // SAFETY: checked above.
                assert_eq!(
                    run(&|a, b, c, d, e| unsafe { quantize_avx2(a, b, c, d, e) }),
                    want
                );
            }
            if crate::Isa::Avx512Vnni.available() {
                // SAFETY: checked above.
                assert_eq!(
                    run(&|a, b, c, d, e| unsafe { quantize_avx512(a, b, c, d, e) }),
                    want
                );
            }
        }
        assert_eq!(run(&quantize_blocks), want);
    }

    #[test]
    fn rounding_matches_round() {
        let mut ys: Vec<f32> = (-2600..=2600).map(|i| i as f32 / 20.0).collect();
        for i in -260..=260 {
            let h = i as f32 + 0.5;
            ys.extend([
                h,
                f32::from_bits(h.to_bits() - 1),
                f32::from_bits(h.to_bits() + 1),
            ]);
        }
        ys.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            0.499_999_97,
            -0.499_999_97,
            127.000_01,
        ]);
        for y in ys {
            assert_eq!(round_half_away(y), y.round(), "{y}");
        }
    }

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
            for h in 0..2 {
                let qs: i32 = q.qs[32 * b + 16 * h..32 * b + 16 * h + 16]
                    .iter()
                    .map(|v| *v as i32)
                    .sum();
                assert_eq!(q.off16[2 * b + h], -32 * qs);
            }
        }
        assert!(QuantizedRows::quantize(&x, 2, 60).is_err());
        assert!(QuantizedRows::quantize(&x, 3, 64).is_err());
        let zeros = QuantizedRows::quantize(&[0.0; 32], 1, 32).unwrap();
        assert_eq!(QuantizedRows::quantize(&[], 3, 0).unwrap().rows(), 3);
        assert_eq!(QuantizedRows::quantize(&[], 0, 64).unwrap().rows(), 0);
        assert_eq!(zeros.dequantize(), vec![0.0; 32]);
    }
}
