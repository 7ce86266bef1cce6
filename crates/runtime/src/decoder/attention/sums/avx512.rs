//! AVX-512 form of the attention's dot products: the same 16-lane partial sums (per lane and
//! chunk a multiply, then an add, chunks in order) and the same pairwise tree as the portable
//! `dot`, so every result is bitwise the portable one. Several queries share each key load.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Scaled dot products of `N` queries with four keys, all `16 · chunks` long (no tail):
/// `out[n][at + m]` becomes bitwise `dot(q[n], k[m]) * scale`.
///
/// # Safety
/// The CPU runs AVX-512 F, every `q` and `k` slice holds at least `16 · chunks` values, and
/// every `out[n]` at least `at + 4`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dots<const N: usize>(
    q: [&[f32]; N],
    k: [&[f32]; 4],
    chunks: usize,
    scale: f32,
    out: &mut [&mut [f32]; N],
    at: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); 4]; N];
    for c in 0..chunks {
        let i = 16 * c;
        let kv = k.map(|k| _mm512_loadu_ps(k.as_ptr().add(i)));
        for (acc, q) in acc.iter_mut().zip(&q) {
            let x = _mm512_loadu_ps(q.as_ptr().add(i));
            for (a, y) in acc.iter_mut().zip(&kv) {
                *a = _mm512_add_ps(*a, _mm512_mul_ps(x, *y));
            }
        }
    }
    let scale = _mm_set1_ps(scale);
    for (a, o) in acc.into_iter().zip(out.iter_mut()) {
        _mm_storeu_ps(o.as_mut_ptr().add(at), _mm_mul_ps(tree4(a), scale));
    }
}

/// The portable tree (lane `l` plus lane `l + w` for w = 8, 4, 2, 1) of four accumulators at
/// once: the same additions, two keys per register after the first step, four after the
/// second; the four totals come back in order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn tree4(a: [__m512; 4]) -> __m128 {
    // Lanes 0..8 of two keys beside lanes 8..16 of the same two: one add is step w = 8.
    let half = |x: __m512, y: __m512| {
        let lo = _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y);
        let hi = _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y);
        _mm512_add_ps(lo, hi)
    };
    let (ab, cd) = (half(a[0], a[1]), half(a[2], a[3]));
    // w = 4: each key's lanes 0..4 beside its lanes 4..8, one key per 128-bit lane.
    let lo = _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd);
    let hi = _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd);
    let s = _mm512_add_ps(lo, hi);
    // w = 2, then w = 1, inside each 128-bit lane.
    let s = _mm512_add_ps(s, _mm512_permute_ps::<0b01_00_11_10>(s));
    let s = _mm512_add_ps(s, _mm512_permute_ps::<0b10_11_00_01>(s));
    // Lanes 0, 4, 8 and 12 hold the totals.
    let first = _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        s,
    );
    _mm512_castps512_ps128(first)
}
