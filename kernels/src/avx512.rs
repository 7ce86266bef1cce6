//! AVX-512 VNNI kernels on tiles of 16 outputs (see `formats`): each `vpdpbusd` takes 4
//! broadcast activations against 4 inputs of 16 outputs, so lanes are outputs, per-output
//! scales are lanes too, and no horizontal sum is needed. A tile's weights are decoded once per
//! 4 inputs and reused by every row of the row tile (up to 8).
//!
//! `vpdpbusd` multiplies unsigned by signed bytes. Q4_K and Q4_1 values are unsigned and take
//! the unsigned side against the signed activations; their minimums come from the activations'
//! scaled block sums. Q6_K values are kept unsigned (`w + 32`) and each sum starts at the
//! activations' `-32 · Σa`. Q8_0 values are signed: the activations are shifted to unsigned
//! (`a + 128`, an xor) and `128 · Σw`, stored per tile unit, starts the sum negated.

use crate::activations::QuantizedRows;
use crate::formats::{
    Q41_D, Q41_M, Q41_TILE_UNIT, Q4K_D, Q4K_DMIN, Q4K_M, Q4K_SC, Q4K_TILE_UNIT, Q6K_D, Q6K_QH,
    Q6K_SC, Q6K_TILE_UNIT, Q8_TILE_BLOCK, TILE_N,
};
use crate::prefetch::prefetch_ahead;
use std::arch::x86_64::*;

/// Independent integer accumulators per row for a tile of `rows` rows. One dependency chain of
/// `vpdpbusd` per row bounds a few-row tile by that instruction's latency (a one-row decode
/// ran at half the unit's throughput); more chains overlap it. Integer sums are exact, so the
/// number of chains changes no result.
const fn chains(rows: usize) -> usize {
    match rows {
        1 => 8,
        2 => 4,
        3 | 4 => 2,
        _ => 1,
    }
}

/// Sum of the first `n` chains of row `r`.
#[inline(always)]
unsafe fn sum_chains<const R: usize>(isum: &[[__m512i; R]; 8], r: usize, n: usize) -> __m512i {
    let mut t = isum[0][r];
    for c in isum.iter().take(n).skip(1) {
        t = _mm512_add_epi32(t, c[r]);
    }
    t
}

/// Outputs of one Q4_K tile (16 weight rows) for rows `r0 .. r0 + R` of `x`.
///
/// Per sub-block of 32 inputs: 4 loads of 8 inputs × 16 outputs, split into low and high
/// nibbles (4 inputs each) for `vpdpbusd` against broadcast activations; then per row one
/// multiply-add by the lanes' scales times the row's activation scale, and one of the lanes'
/// minimums times the row's scaled block sum.
///
/// What bounds it: `vpdpbusd`, float multiplies / multiply-adds and `vpmulld` share the same
/// 512-bit execution ports (measured on Zen 4: each costs a cycle there; nibble masks, shifts,
/// conversions and broadcasts do not), so per sub-block and row the 8 dot products carry 3
/// float operations: at most 8/11 of the dot-product peak. Applying the 6-bit scales to the
/// integer sums with `vpmulld` instead of in float costs the same.
///
/// # Safety
/// As [`tile_q8_0`], for Q4_K tile units.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(crate) unsafe fn tile_q4k<const R: usize>(
    tile: &[u8],
    x: &QuantizedRows,
    r0: usize,
    out: &mut [f32],
) {
    let rows: [(&[i8], &[f32], &[f32]); R] = std::array::from_fn(|i| x.row(r0 + i));
    let nc = chains(R);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm512_setzero_ps(); R];
    let mask = _mm512_set1_epi8(0xF);
    let tp = tile.as_ptr();
    for u in 0..tile.len() / Q4K_TILE_UNIT {
        let b = tp.add(u * Q4K_TILE_UNIT);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(b.add(Q4K_D) as *const __m256i));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(b.add(Q4K_DMIN) as *const __m256i));
        for j in 0..8 {
            prefetch_ahead(b, Q4K_TILE_UNIT, j, 8);
            let lanes = |at: usize| {
                let v = _mm_loadu_si128(b.add(at + 16 * j) as *const __m128i);
                _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v))
            };
            let sc = _mm512_mul_ps(lanes(Q4K_SC), d);
            let mn = _mm512_mul_ps(lanes(Q4K_M), dmin);
            let mut isum = [[_mm512_setzero_si512(); R]; 8];
            for g in 0..4 {
                let w = _mm512_load_si512(b.add(64 * (4 * j + g)) as *const __m512i);
                let lo = _mm512_and_si512(w, mask);
                let hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), mask);
                let (c0, c1) = ((2 * g) % nc, (2 * g + 1) % nc);
                for r in 0..R {
                    let ap = rows[r].0.as_ptr().add(256 * u + 32 * j + 8 * g) as *const i32;
                    let a0 = _mm512_set1_epi32(ap.read_unaligned());
                    let a1 = _mm512_set1_epi32(ap.add(1).read_unaligned());
                    isum[c0][r] = _mm512_dpbusd_epi32(isum[c0][r], lo, a0);
                    isum[c1][r] = _mm512_dpbusd_epi32(isum[c1][r], hi, a1);
                }
            }
            for r in 0..R {
                let (_, da, asum) = rows[r];
                let s = _mm512_mul_ps(sc, _mm512_set1_ps(*da.get_unchecked(8 * u + j)));
                let i = sum_chains(&isum, r, nc);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), s, acc[r]);
                let m = _mm512_set1_ps(*asum.get_unchecked(8 * u + j));
                accm[r] = _mm512_fmadd_ps(mn, m, accm[r]);
            }
        }
    }
    for r in 0..R {
        _mm512_storeu_ps(
            out.as_mut_ptr().add(TILE_N * r),
            _mm512_sub_ps(acc[r], accm[r]),
        );
    }
}

/// Outputs of one Q6_K tile (16 weight rows) for rows `r0 .. r0 + R` of `x`.
///
/// Per sub-block of 16 inputs: two nibble loads and one load of high bits make 4 registers of
/// 4 inputs × 16 outputs (unsigned, `w + 32`) for `vpdpbusd` against broadcast activations,
/// each row's sum starting at `-32 · Σa`; per 32 inputs and row, the two sums times the lanes'
/// scales and the row's activation scale: 3 float operations per 8 dot products, as Q4_K.
///
/// # Safety
/// As [`tile_q8_0`], for Q6_K tile units.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(crate) unsafe fn tile_q6k<const R: usize>(
    tile: &[u8],
    x: &QuantizedRows,
    r0: usize,
    out: &mut [f32],
) {
    let rows: [(&[i8], &[f32], &[i32]); R] = std::array::from_fn(|i| {
        let (a, da, _) = x.row(r0 + i);
        (a, da, x.off16(r0 + i))
    });
    // Four dot products per half-block and row: at most four chains.
    let nc = chains(R).min(4);
    let mut acc = [_mm512_setzero_ps(); R];
    let mask = _mm512_set1_epi8(0xF);
    let hmask = _mm512_set1_epi8(0x30);
    let tp = tile.as_ptr();
    for u in 0..tile.len() / Q6K_TILE_UNIT {
        let b = tp.add(u * Q6K_TILE_UNIT);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(b.add(Q6K_D) as *const __m256i));
        // Two sub-blocks of 16 per activation block of 32.
        for blk in 0..8 {
            let mut isum = [[_mm512_setzero_si512(); R]; 2];
            let mut sc = [_mm512_setzero_ps(); 2];
            for h in 0..2 {
                let s = 2 * blk + h;
                prefetch_ahead(b, Q6K_TILE_UNIT, s, 16);
                let v = _mm_loadu_si128(b.add(Q6K_SC + 16 * s) as *const __m128i);
                sc[h] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)), d);
                let l0 = _mm512_load_si512(b.add(128 * s) as *const __m512i);
                let l1 = _mm512_load_si512(b.add(128 * s + 64) as *const __m512i);
                let qh = _mm512_load_si512(b.add(Q6K_QH + 64 * s) as *const __m512i);
                let w = [
                    _mm512_or_si512(
                        _mm512_and_si512(l0, mask),
                        _mm512_and_si512(_mm512_slli_epi16(qh, 4), hmask),
                    ),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16(l0, 4), mask),
                        _mm512_and_si512(_mm512_slli_epi16(qh, 2), hmask),
                    ),
                    _mm512_or_si512(_mm512_and_si512(l1, mask), _mm512_and_si512(qh, hmask)),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16(l1, 4), mask),
                        _mm512_and_si512(_mm512_srli_epi16(qh, 2), hmask),
                    ),
                ];
                for r in 0..R {
                    let (a, _, off) = rows[r];
                    let ap = a.as_ptr().add(256 * u + 16 * s) as *const i32;
                    let mut t = [_mm512_setzero_si512(); 4];
                    t[0] = _mm512_set1_epi32(*off.get_unchecked(16 * u + s));
                    for (i, wi) in w.iter().enumerate() {
                        let c = i % nc;
                        t[c] = _mm512_dpbusd_epi32(
                            t[c],
                            *wi,
                            _mm512_set1_epi32(ap.add(i).read_unaligned()),
                        );
                    }
                    let mut sum = t[0];
                    for tc in t.iter().take(nc).skip(1) {
                        sum = _mm512_add_epi32(sum, *tc);
                    }
                    isum[h][r] = sum;
                }
            }
            for r in 0..R {
                let da = _mm512_set1_ps(*rows[r].1.get_unchecked(8 * u + blk));
                let p = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(isum[0][r]),
                    sc[0],
                    _mm512_mul_ps(_mm512_cvtepi32_ps(isum[1][r]), sc[1]),
                );
                acc[r] = _mm512_fmadd_ps(p, da, acc[r]);
            }
        }
    }
    for r in 0..R {
        _mm512_storeu_ps(out.as_mut_ptr().add(TILE_N * r), acc[r]);
    }
}

/// Outputs of one Q8_0 tile (16 weight rows) for rows `r0 .. r0 + R` of `x` (`out` row-major,
/// 16 per row).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VNNI, AVX2 and FMA; `tile` must hold whole tile units of
/// the kernel's type for `x.cols()` inputs, `r0 + R <= x.rows()` and `out.len() >= 16 R`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(crate) unsafe fn tile_q8_0<const R: usize>(
    tile: &[u8],
    x: &QuantizedRows,
    r0: usize,
    out: &mut [f32],
) {
    let rows: [(&[i8], &[f32], &[f32]); R] = std::array::from_fn(|i| x.row(r0 + i));
    let nc = chains(R);
    let mut acc = [_mm512_setzero_ps(); R];
    let tp = tile.as_ptr();
    let flip = _mm512_set1_epi32(0x8080_8080u32 as i32);
    for b in 0..tile.len() / Q8_TILE_BLOCK {
        let blk = tp.add(b * Q8_TILE_BLOCK);
        prefetch_ahead(blk, Q8_TILE_BLOCK, 0, 1);
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
            let mut t = [[_mm512_setzero_si512(); 1]; 8];
            t[0][0] = start;
            for g in 0..8 {
                let av = _mm512_permutexvar_epi32(_mm512_set1_epi32(g as i32), au);
                t[g % nc][0] = _mm512_dpbusd_epi32(t[g % nc][0], av, w[g]);
            }
            let s = sum_chains(&t, 0, nc);
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(*da.get_unchecked(b)));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[r]);
        }
    }
    for r in 0..R {
        _mm512_storeu_ps(out.as_mut_ptr().add(TILE_N * r), acc[r]);
    }
}

/// Outputs of one Q4_1 tile (16 weight rows) for rows `r0 .. r0 + R` of `x`.
///
/// Per block of 32 inputs: 4 loads of 8 inputs × 16 outputs, split into low and high nibbles
/// for `vpdpbusd` against broadcast activations (8 dot products per row); then per row one
/// multiply-add by the lanes' scales times the row's activation scale, and one of the lanes'
/// minimums times the row's scaled block sum.
///
/// # Safety
/// As [`tile_q8_0`], for Q4_1 tile units.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(crate) unsafe fn tile_q4_1<const R: usize>(
    tile: &[u8],
    x: &QuantizedRows,
    r0: usize,
    out: &mut [f32],
) {
    let rows: [(&[i8], &[f32], &[f32]); R] = std::array::from_fn(|i| x.row(r0 + i));
    let nc = chains(R);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm512_setzero_ps(); R];
    let mask = _mm512_set1_epi8(0xF);
    let tp = tile.as_ptr();
    for u in 0..tile.len() / Q41_TILE_UNIT {
        let b = tp.add(u * Q41_TILE_UNIT);
        prefetch_ahead(b, Q41_TILE_UNIT, 0, 1);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(b.add(Q41_D) as *const __m256i));
        let m = _mm512_cvtph_ps(_mm256_loadu_si256(b.add(Q41_M) as *const __m256i));
        let mut isum = [[_mm512_setzero_si512(); R]; 8];
        for g in 0..4 {
            let w = _mm512_load_si512(b.add(64 * g) as *const __m512i);
            let lo = _mm512_and_si512(w, mask);
            let hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), mask);
            let (c0, c1) = ((2 * g) % nc, (2 * g + 1) % nc);
            for r in 0..R {
                let ap = rows[r].0.as_ptr().add(32 * u + 8 * g) as *const i32;
                let a0 = _mm512_set1_epi32(ap.read_unaligned());
                let a1 = _mm512_set1_epi32(ap.add(1).read_unaligned());
                isum[c0][r] = _mm512_dpbusd_epi32(isum[c0][r], lo, a0);
                isum[c1][r] = _mm512_dpbusd_epi32(isum[c1][r], hi, a1);
            }
        }
        for r in 0..R {
            let (_, da, asum) = rows[r];
            let s = _mm512_mul_ps(d, _mm512_set1_ps(*da.get_unchecked(u)));
            let i = sum_chains(&isum, r, nc);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), s, acc[r]);
            accm[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(*asum.get_unchecked(u)), accm[r]);
        }
    }
    for r in 0..R {
        _mm512_storeu_ps(
            out.as_mut_ptr().add(TILE_N * r),
            _mm512_add_ps(acc[r], accm[r]),
        );
    }
}
