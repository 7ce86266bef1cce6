//! AVX-512 VNNI kernels: 64 values per `vpdpbusd`, per-lane scales (each i32 lane holds four
//! products of one scale group), weights decoded once per 64 values and reused by every row of
//! the tile.
//!
//! Q8_0 is interleaved by tiles of 16 outputs instead (see `formats`): each `vpdpbusd` takes
//! 4 broadcast activations against 4 inputs of 16 outputs, so lanes are outputs and no
//! horizontal sum is needed.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes. Q4_K values are unsigned and take the
//! unsigned side against the signed activations. Q8_0 and Q6_K values are signed: the
//! activations are shifted to unsigned (`a + 128`, an xor) and `128 · Σw`, computed once per
//! weight chunk, starts the sum negated.

use crate::activations::QuantizedRows;
use crate::formats::{f16_at, WeightType, Q8_TILE_BLOCK, TILE_N};
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// Lane indices: lane `l` takes element `base + l / width` of the scale vector.
#[inline]
#[target_feature(enable = "avx512f")]
fn lane_index(base: i32, width: i32) -> __m512i {
    let idx: [i32; 16] = std::array::from_fn(|l| base + l as i32 / width);
    // SAFETY: `idx` is 64 readable bytes.
    unsafe { _mm512_loadu_si512(idx.as_ptr() as *const __m512i) }
}

/// `-128 · Σw` per lane: the start of a sum over `a + 128` that leaves Σ a·w.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn neg_shift(w: __m512i) -> __m512i {
    let c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(-128), w);
    _mm512_sub_epi32(_mm512_setzero_si512(), c)
}

/// Outputs of weight row `w` for rows `r0 .. r0 + R` of `x`.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VNNI, AVX2 and FMA; `w` must hold whole units of `ty`
/// for `x.cols()` values and `r0 + R <= x.rows()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(crate) unsafe fn column<const R: usize>(
    ty: WeightType,
    w: &[u8],
    x: &QuantizedRows,
    r0: usize,
    out: &mut [f32],
) {
    let rows: [(&[i8], &[f32], &[f32]); R] = std::array::from_fn(|i| x.row(r0 + i));
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm256_setzero_ps(); R];
    let wp = w.as_ptr();
    let units = w.len() / ty.unit_bytes();
    let flip = _mm512_set1_epi8(-128);
    match ty {
        // Q8_0 goes through `tile_q8_0`.
        WeightType::Q8_0 => {}
        WeightType::Q4K => {
            let mask = _mm512_set1_epi8(0xF);
            let idx: [__m512i; 4] = std::array::from_fn(|c| lane_index(2 * c as i32, 8));
            for u in 0..units {
                let b = wp.add(148 * u);
                let (d, dmin) = (f16_at(w, 148 * u), f16_at(w, 148 * u + 2));
                let mut sc = [0f32; 8];
                let mut mn = [0f32; 8];
                for j in 0..8 {
                    sc[j] = d * *b.add(4 + j) as f32;
                    mn[j] = dmin * *b.add(12 + j) as f32;
                }
                let scv = _mm256_loadu_ps(sc.as_ptr());
                let mnv = _mm256_loadu_ps(mn.as_ptr());
                let v0 = _mm512_loadu_si512(b.add(20) as *const __m512i);
                let v1 = _mm512_loadu_si512(b.add(84) as *const __m512i);
                let q = [
                    _mm512_and_si512(v0, mask),
                    _mm512_and_si512(_mm512_srli_epi16(v0, 4), mask),
                    _mm512_and_si512(v1, mask),
                    _mm512_and_si512(_mm512_srli_epi16(v1, 4), mask),
                ];
                for r in 0..R {
                    let (a, da, asum) = rows[r];
                    let ap = a.as_ptr().add(256 * u);
                    let p8 = _mm256_mul_ps(scv, _mm256_loadu_ps(da.as_ptr().add(8 * u)));
                    let p16 = _mm512_castps256_ps512(p8);
                    for c in 0..4 {
                        let av = _mm512_loadu_si512(ap.add(64 * c) as *const __m512i);
                        let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[c], av);
                        let s = _mm512_permutexvar_ps(idx[c], p16);
                        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r]);
                    }
                    let am = _mm256_loadu_ps(asum.as_ptr().add(8 * u));
                    accm[r] = _mm256_fmadd_ps(mnv, am, accm[r]);
                }
            }
        }
        WeightType::Q6K => {
            let mask = _mm512_set1_epi8(0xF);
            let hmask = _mm512_set1_epi8(0x30);
            let off = _mm512_set1_epi8(32);
            let lo_shift = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
            let hi_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
            let dup = lane_index(0, 2);
            let idx: [__m512i; 4] = std::array::from_fn(|c| lane_index(4 * c as i32, 4));
            for u in 0..units {
                let b = wp.add(210 * u);
                let d = f16_at(w, 210 * u + 208);
                let sc8 = _mm_loadu_si128(b.add(192) as *const __m128i);
                let scv = _mm512_mul_ps(
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8)),
                    _mm512_set1_ps(d),
                );
                let mut q = [_mm512_setzero_si512(); 4];
                let mut start = [_mm512_setzero_si512(); 4];
                for h in 0..2 {
                    let v = _mm512_loadu_si512(b.add(64 * h) as *const __m512i);
                    let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        b.add(128 + 32 * h) as *const __m256i
                    ));
                    let lo = _mm512_or_si512(
                        _mm512_and_si512(v, mask),
                        _mm512_and_si512(_mm512_sllv_epi16(qh, lo_shift), hmask),
                    );
                    let hi = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16(v, 4), mask),
                        _mm512_and_si512(_mm512_srlv_epi16(qh, hi_shift), hmask),
                    );
                    q[2 * h] = _mm512_sub_epi8(lo, off);
                    q[2 * h + 1] = _mm512_sub_epi8(hi, off);
                    start[2 * h] = neg_shift(q[2 * h]);
                    start[2 * h + 1] = neg_shift(q[2 * h + 1]);
                }
                for r in 0..R {
                    let (a, da, _) = rows[r];
                    let ap = a.as_ptr().add(256 * u);
                    let da16 = _mm512_permutexvar_ps(
                        dup,
                        _mm512_castps256_ps512(_mm256_loadu_ps(da.as_ptr().add(8 * u))),
                    );
                    let p16 = _mm512_mul_ps(scv, da16);
                    for c in 0..4 {
                        let av = _mm512_loadu_si512(ap.add(64 * c) as *const __m512i);
                        let p = _mm512_dpbusd_epi32(start[c], _mm512_xor_si512(av, flip), q[c]);
                        let s = _mm512_permutexvar_ps(idx[c], p16);
                        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r]);
                    }
                }
            }
        }
    }
    for r in 0..R {
        out[r] = _mm512_reduce_add_ps(acc[r]) - hsum256(accm[r]);
    }
}

/// Outputs of one Q8_0 tile (16 weight rows) for rows `r0 .. r0 + R` of `x` (`out` row-major,
/// 16 per row).
///
/// # Safety
/// As [`column`]; `tile` must hold whole tile blocks for `x.cols()` inputs.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(crate) unsafe fn tile_q8_0<const R: usize>(
    tile: &[u8],
    x: &QuantizedRows,
    r0: usize,
    out: &mut [f32],
) {
    let rows: [(&[i8], &[f32], &[f32]); R] = std::array::from_fn(|i| x.row(r0 + i));
    let mut acc = [_mm512_setzero_ps(); R];
    let tp = tile.as_ptr();
    let flip = _mm512_set1_epi32(0x8080_8080u32 as i32);
    for b in 0..tile.len() / Q8_TILE_BLOCK {
        let blk = tp.add(b * Q8_TILE_BLOCK);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
        let sums = _mm512_cvtepi16_epi32(_mm256_loadu_si256(blk.add(32) as *const __m256i));
        let start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sums, 7));
        let mut w = [_mm512_setzero_si512(); 8];
        for (g, v) in w.iter_mut().enumerate() {
            *v = _mm512_loadu_si512(blk.add(64 + 64 * g) as *const __m512i);
        }
        for r in 0..R {
            let (a, da, _) = rows[r];
            // The block's 32 activations, shifted to unsigned, in lanes 0..8.
            let au = _mm512_xor_si512(
                _mm512_castsi256_si512(
                    _mm256_loadu_si256(a.as_ptr().add(32 * b) as *const __m256i),
                ),
                flip,
            );
            let mut s = start;
            for g in 0..8 {
                let av = _mm512_permutexvar_epi32(_mm512_set1_epi32(g as i32), au);
                s = _mm512_dpbusd_epi32(s, av, w[g]);
            }
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(*da.get_unchecked(b)));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[r]);
        }
    }
    for r in 0..R {
        _mm512_storeu_ps(out.as_mut_ptr().add(TILE_N * r), acc[r]);
    }
}
