//! AVX2 + FMA kernels: 32 values per step, `maddubs` on |w| and sign-adjusted activations,
//! one f32 accumulator per row of the tile.

use crate::activations::QuantizedRows;
use crate::formats::{f16_at, WeightType, Q8_TILE_BLOCK, TILE_N};
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// Σ w·a in 8 i32 lanes (4 values each) for signed `w`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn dot_signed(aw: __m256i, w: __m256i, a: __m256i) -> __m256 {
    let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w));
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}

/// Outputs of weight row `w` for rows `r0 .. r0 + R` of `x`.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `w` must hold whole units of `ty` for `x.cols()` values
/// and `r0 + R <= x.rows()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn column<const R: usize>(
    ty: WeightType,
    w: &[u8],
    x: &QuantizedRows,
    r0: usize,
    out: &mut [f32],
) {
    let rows: [(&[i8], &[f32], &[f32]); R] = std::array::from_fn(|i| x.row(r0 + i));
    let mut acc = [_mm256_setzero_ps(); R];
    let mut accm = [_mm256_setzero_ps(); R];
    let wp = w.as_ptr();
    let units = w.len() / ty.unit_bytes();
    match ty {
        // Q8_0 goes through `tile_q8_0`.
        WeightType::Q8_0 => {}
        WeightType::Q4K => {
            let mask = _mm256_set1_epi8(0xF);
            for u in 0..units {
                let b = wp.add(148 * u);
                let (d, dmin) = (f16_at(w, 148 * u), f16_at(w, 148 * u + 2));
                let mut sc = [0f32; 8];
                let mut mn = [0f32; 8];
                for j in 0..8 {
                    sc[j] = d * *b.add(4 + j) as f32;
                    mn[j] = dmin * *b.add(12 + j) as f32;
                }
                let mnv = _mm256_loadu_ps(mn.as_ptr());
                for h in 0..2 {
                    let v0 = _mm256_loadu_si256(b.add(20 + 64 * h) as *const __m256i);
                    let v1 = _mm256_loadu_si256(b.add(52 + 64 * h) as *const __m256i);
                    let parts = [
                        (4 * h, _mm256_and_si256(v0, mask)),
                        (4 * h + 1, _mm256_and_si256(v1, mask)),
                        (4 * h + 2, _mm256_and_si256(_mm256_srli_epi16(v0, 4), mask)),
                        (4 * h + 3, _mm256_and_si256(_mm256_srli_epi16(v1, 4), mask)),
                    ];
                    for (j, q) in parts {
                        for r in 0..R {
                            let (a, da, _) = rows[r];
                            let av = _mm256_loadu_si256(
                                a.as_ptr().add(256 * u + 32 * j) as *const __m256i
                            );
                            let p = _mm256_madd_epi16(
                                _mm256_maddubs_epi16(q, av),
                                _mm256_set1_epi16(1),
                            );
                            let s = _mm256_set1_ps(sc[j] * *da.get_unchecked(8 * u + j));
                            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[r]);
                        }
                    }
                }
                for r in 0..R {
                    let asum = _mm256_loadu_ps(rows[r].2.as_ptr().add(8 * u));
                    accm[r] = _mm256_fmadd_ps(mnv, asum, accm[r]);
                }
            }
        }
        WeightType::Q6K => {
            let mask = _mm256_set1_epi8(0xF);
            let hmask = _mm256_set1_epi8(0x30);
            let off = _mm256_set1_epi8(32);
            for u in 0..units {
                let b = wp.add(210 * u);
                let d = f16_at(w, 210 * u + 208);
                let mut sc = [0f32; 16];
                for (g, s) in sc.iter_mut().enumerate() {
                    *s = d * *b.add(192 + g) as i8 as f32;
                }
                for h in 0..2 {
                    let l0 = _mm256_loadu_si256(b.add(64 * h) as *const __m256i);
                    let l1 = _mm256_loadu_si256(b.add(64 * h + 32) as *const __m256i);
                    let qh = _mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i);
                    let parts = [
                        _mm256_or_si256(
                            _mm256_and_si256(l0, mask),
                            _mm256_and_si256(_mm256_slli_epi16(qh, 4), hmask),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(l1, mask),
                            _mm256_and_si256(_mm256_slli_epi16(qh, 2), hmask),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(l0, 4), mask),
                            _mm256_and_si256(qh, hmask),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(l1, 4), mask),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), hmask),
                        ),
                    ];
                    for (i, q) in parts.into_iter().enumerate() {
                        let c = 4 * h + i; // 32-value chunk within the unit
                        let wv = _mm256_sub_epi8(q, off);
                        let aw = _mm256_abs_epi8(wv);
                        for r in 0..R {
                            let (a, da, _) = rows[r];
                            let av = _mm256_loadu_si256(
                                a.as_ptr().add(256 * u + 32 * c) as *const __m256i
                            );
                            let dab = *da.get_unchecked(8 * u + c);
                            let s = _mm256_set_m128(
                                _mm_set1_ps(sc[2 * c + 1] * dab),
                                _mm_set1_ps(sc[2 * c] * dab),
                            );
                            acc[r] = _mm256_fmadd_ps(dot_signed(aw, wv, av), s, acc[r]);
                        }
                    }
                }
            }
        }
    }
    for r in 0..R {
        out[r] = hsum(acc[r]) - hsum(accm[r]);
    }
}

/// Outputs of one Q8_0 tile (16 weight rows) for rows `r0 .. r0 + R` of `x` (`out` row-major,
/// 16 per row): 8 outputs per register, 4 inputs per `maddubs` lane pair.
///
/// # Safety
/// As [`column`]; `tile` must hold whole tile blocks for `x.cols()` inputs.
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
