//! AVX2 + FMA kernels on tiles of 16 outputs (see `formats`), 8 outputs per register: each
//! `maddubs` takes 4 broadcast activations against 4 inputs of 8 outputs. Q4_K, Q4_1 and Q6_K
//! values are unsigned and take the unsigned side; Q8_0's are signed, so it runs on |w| and
//! sign-adjusted activations.

use crate::activations::QuantizedRows;
use crate::formats::{
    f16_at, Q41_D, Q41_M, Q41_TILE_UNIT, Q4K_D, Q4K_DMIN, Q4K_M, Q4K_SC, Q4K_TILE_UNIT, Q6K_D,
    Q6K_QH, Q6K_SC, Q6K_TILE_UNIT, Q8_TILE_BLOCK, TILE_N,
};
use crate::prefetch::prefetch_ahead;
use std::arch::x86_64::*;

/// The 16 f16 lane values (a `d` or `dmin`) of a tile unit at `at`, as f32.
#[inline]
fn f16_lanes(u: &[u8], at: usize) -> [f32; TILE_N] {
    std::array::from_fn(|c| f16_at(u, at + 2 * c))
}

/// Outputs of one Q4_K tile (16 weight rows) for rows `r0 .. r0 + R` of `x` (`out` row-major,
/// 16 per row): 8 outputs per register, the nibbles of 4 inputs per `maddubs` lane pair, eight
/// `maddubs` summed in 16 bits (at most 8 · 2 · 15 · 127) before widening.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `tile` must hold whole Q4_K tile units for `x.cols()`
/// inputs, `r0 + R <= x.rows()` and `out.len() >= 16 R`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn tile_q4k<const R: usize>(
    tile: &[u8],
    x: &QuantizedRows,
    r0: usize,
    out: &mut [f32],
) {
    let rows: [(&[i8], &[f32], &[f32]); R] = std::array::from_fn(|i| x.row(r0 + i));
    let mask = _mm256_set1_epi8(0xF);
    let ones = _mm256_set1_epi16(1);
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut accm = [_mm256_setzero_ps(); R];
        for (u, unit) in tile.chunks_exact(Q4K_TILE_UNIT).enumerate() {
            let b = unit.as_ptr();
            if h == 0 {
                prefetch_ahead(b, Q4K_TILE_UNIT, 0, 1);
            }
            let d = _mm256_loadu_ps(f16_lanes(unit, Q4K_D).as_ptr().add(8 * h));
            let dmin = _mm256_loadu_ps(f16_lanes(unit, Q4K_DMIN).as_ptr().add(8 * h));
            for j in 0..8 {
                let lanes = |at: usize| {
                    let v = _mm_loadl_epi64(b.add(at + 16 * j + 8 * h) as *const __m128i);
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
                };
                let sc = _mm256_mul_ps(lanes(Q4K_SC), d);
                let mn = _mm256_mul_ps(lanes(Q4K_M), dmin);
                let mut isum = [_mm256_setzero_si256(); R];
                for g in 0..4 {
                    let w = _mm256_loadu_si256(b.add(64 * (4 * j + g) + 32 * h) as *const __m256i);
                    let lo = _mm256_and_si256(w, mask);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), mask);
                    for r in 0..R {
                        let ap = rows[r].0.as_ptr().add(256 * u + 32 * j + 8 * g) as *const i32;
                        let a0 = _mm256_set1_epi32(ap.read_unaligned());
                        let a1 = _mm256_set1_epi32(ap.add(1).read_unaligned());
                        let p = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, a0),
                            _mm256_maddubs_epi16(hi, a1),
                        );
                        isum[r] = _mm256_add_epi16(isum[r], p);
                    }
                }
                for r in 0..R {
                    let (_, da, asum) = rows[r];
                    let i = _mm256_madd_epi16(isum[r], ones);
                    let s = _mm256_mul_ps(sc, _mm256_set1_ps(*da.get_unchecked(8 * u + j)));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), s, acc[r]);
                    let m = _mm256_set1_ps(*asum.get_unchecked(8 * u + j));
                    accm[r] = _mm256_fmadd_ps(mn, m, accm[r]);
                }
            }
        }
        for r in 0..R {
            let o = out.as_mut_ptr().add(TILE_N * r + 8 * h);
            _mm256_storeu_ps(o, _mm256_sub_ps(acc[r], accm[r]));
        }
    }
}

/// Outputs of one Q6_K tile (16 weight rows) for rows `r0 .. r0 + R` of `x` (`out` row-major,
/// 16 per row): 8 outputs per register, unsigned values (`w + 32`) against the activations
/// with two `maddubs` summed in 16 bits (at most 2 · 2 · 63 · 127), each sum starting at
/// `-32 · Σa`.
///
/// # Safety
/// As [`tile_q4k`], for Q6_K tile units.
#[target_feature(enable = "avx2,fma")]
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
    let mask = _mm256_set1_epi8(0xF);
    let hmask = _mm256_set1_epi8(0x30);
    let ones = _mm256_set1_epi16(1);
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); R];
        for (u, unit) in tile.chunks_exact(Q6K_TILE_UNIT).enumerate() {
            let b = unit.as_ptr();
            if h == 0 {
                prefetch_ahead(b, Q6K_TILE_UNIT, 0, 1);
            }
            let d = _mm256_loadu_ps(f16_lanes(unit, Q6K_D).as_ptr().add(8 * h));
            for blk in 0..8 {
                let mut isum = [[_mm256_setzero_si256(); R]; 2];
                let mut sc = [_mm256_setzero_ps(); 2];
                for (k, isum) in isum.iter_mut().enumerate() {
                    let s = 2 * blk + k;
                    let v = _mm_loadl_epi64(b.add(Q6K_SC + 16 * s + 8 * h) as *const __m128i);
                    sc[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), d);
                    let ld = |at: usize| _mm256_loadu_si256(b.add(at + 32 * h) as *const __m256i);
                    let (l0, l1, qh) = (ld(128 * s), ld(128 * s + 64), ld(Q6K_QH + 64 * s));
                    let w = [
                        _mm256_or_si256(
                            _mm256_and_si256(l0, mask),
                            _mm256_and_si256(_mm256_slli_epi16(qh, 4), hmask),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(l0, 4), mask),
                            _mm256_and_si256(_mm256_slli_epi16(qh, 2), hmask),
                        ),
                        _mm256_or_si256(_mm256_and_si256(l1, mask), _mm256_and_si256(qh, hmask)),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(l1, 4), mask),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), hmask),
                        ),
                    ];
                    for r in 0..R {
                        let (a, _, off) = rows[r];
                        let ap = a.as_ptr().add(256 * u + 16 * s) as *const i32;
                        let a4: [__m256i; 4] =
                            std::array::from_fn(|i| _mm256_set1_epi32(ap.add(i).read_unaligned()));
                        let p = _mm256_add_epi16(
                            _mm256_maddubs_epi16(w[0], a4[0]),
                            _mm256_maddubs_epi16(w[1], a4[1]),
                        );
                        let q = _mm256_add_epi16(
                            _mm256_maddubs_epi16(w[2], a4[2]),
                            _mm256_maddubs_epi16(w[3], a4[3]),
                        );
                        let t = _mm256_add_epi32(
                            _mm256_madd_epi16(p, ones),
                            _mm256_madd_epi16(q, ones),
                        );
                        let o = _mm256_set1_epi32(*off.get_unchecked(16 * u + s));
                        isum[r] = _mm256_add_epi32(t, o);
                    }
                }
                for r in 0..R {
                    let da = _mm256_set1_ps(*rows[r].1.get_unchecked(8 * u + blk));
                    let p = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(isum[0][r]),
                        sc[0],
                        _mm256_mul_ps(_mm256_cvtepi32_ps(isum[1][r]), sc[1]),
                    );
                    acc[r] = _mm256_fmadd_ps(p, da, acc[r]);
                }
            }
        }
        for r in 0..R {
            _mm256_storeu_ps(out.as_mut_ptr().add(TILE_N * r + 8 * h), acc[r]);
        }
    }
}

/// Outputs of one Q8_0 tile (16 weight rows) for rows `r0 .. r0 + R` of `x` (`out` row-major,
/// 16 per row): 8 outputs per register, 4 inputs per `maddubs` lane pair.
///
/// # Safety
/// As [`tile_q4k`], for Q8_0 tile units.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn tile_q8_0<const R: usize>(
    tile: &[u8],
    x: &QuantizedRows,
    r0: usize,
    out: &mut [f32],
) {
    let rows: [(&[i8], &[f32], &[f32]); R] = std::array::from_fn(|i| x.row(r0 + i));
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let tp = tile.as_ptr();
    let ones = _mm256_set1_epi16(1);
    for b in 0..tile.len() / Q8_TILE_BLOCK {
        let blk = tp.add(b * Q8_TILE_BLOCK);
        prefetch_ahead(blk, Q8_TILE_BLOCK, 0, 1);
        let mut d = [0f32; TILE_N];
        for (c, v) in d.iter_mut().enumerate() {
            *v = f16_at(tile, b * Q8_TILE_BLOCK + 2 * c);
        }
        for h in 0..2 {
            let dv = _mm256_loadu_ps(d.as_ptr().add(8 * h));
            let w: [__m256i; 8] = std::array::from_fn(|g| {
                _mm256_loadu_si256(blk.add(64 + 64 * g + 32 * h) as *const __m256i)
            });
            let aw: [__m256i; 8] = std::array::from_fn(|g| _mm256_abs_epi8(w[g]));
            for r in 0..R {
                let (a, da, _) = rows[r];
                let ap = a.as_ptr().add(32 * b) as *const i32;
                let mut s = _mm256_setzero_si256();
                for g in 0..8 {
                    let av = _mm256_set1_epi32(ap.add(g).read_unaligned());
                    let p = _mm256_maddubs_epi16(aw[g], _mm256_sign_epi8(av, w[g]));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
                }
                let scale = _mm256_mul_ps(dv, _mm256_set1_ps(*da.get_unchecked(b)));
                acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[r][h]);
            }
        }
    }
    for r in 0..R {
        _mm256_storeu_ps(out.as_mut_ptr().add(TILE_N * r), acc[r][0]);
        _mm256_storeu_ps(out.as_mut_ptr().add(TILE_N * r + 8), acc[r][1]);
    }
}

/// Outputs of one Q4_1 tile (16 weight rows) for rows `r0 .. r0 + R` of `x` (`out` row-major,
/// 16 per row): 8 outputs per register, as [`tile_q4k`] with one scale and one minimum per
/// block of 32 (eight `maddubs` summed in 16 bits before widening).
///
/// # Safety
/// As [`tile_q4k`], for Q4_1 tile units.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn tile_q4_1<const R: usize>(
    tile: &[u8],
    x: &QuantizedRows,
    r0: usize,
    out: &mut [f32],
) {
    let rows: [(&[i8], &[f32], &[f32]); R] = std::array::from_fn(|i| x.row(r0 + i));
    let mask = _mm256_set1_epi8(0xF);
    let ones = _mm256_set1_epi16(1);
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut accm = [_mm256_setzero_ps(); R];
        for (u, unit) in tile.chunks_exact(Q41_TILE_UNIT).enumerate() {
            let b = unit.as_ptr();
            if h == 0 {
                prefetch_ahead(b, Q41_TILE_UNIT, 0, 1);
            }
            let lanes = |at: usize| -> [f32; 8] {
                std::array::from_fn(|c| f16_at(unit, at + 2 * (8 * h + c)))
            };
            let d = _mm256_loadu_ps(lanes(Q41_D).as_ptr());
            let m = _mm256_loadu_ps(lanes(Q41_M).as_ptr());
            let mut isum = [_mm256_setzero_si256(); R];
            for g in 0..4 {
                let w = _mm256_loadu_si256(b.add(64 * g + 32 * h) as *const __m256i);
                let lo = _mm256_and_si256(w, mask);
                let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), mask);
                for r in 0..R {
                    let ap = rows[r].0.as_ptr().add(32 * u + 8 * g) as *const i32;
                    let a0 = _mm256_set1_epi32(ap.read_unaligned());
                    let a1 = _mm256_set1_epi32(ap.add(1).read_unaligned());
                    let p = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, a0),
                        _mm256_maddubs_epi16(hi, a1),
                    );
                    isum[r] = _mm256_add_epi16(isum[r], p);
                }
            }
            for r in 0..R {
                let (_, da, asum) = rows[r];
                let i = _mm256_madd_epi16(isum[r], ones);
                let s = _mm256_mul_ps(d, _mm256_set1_ps(*da.get_unchecked(u)));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), s, acc[r]);
                accm[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(*asum.get_unchecked(u)), accm[r]);
            }
        }
        for r in 0..R {
            let o = out.as_mut_ptr().add(TILE_N * r + 8 * h);
            _mm256_storeu_ps(o, _mm256_add_ps(acc[r], accm[r]));
        }
    }
}
