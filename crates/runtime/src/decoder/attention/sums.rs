//! The arithmetic of the batch-invariant attention: dot products, sums and `exp` with fixed
//! lane-wise partial sums and reduction trees, and the weighted sum of values; each the same
//! operations in the same order on every call, however many queries share it.

/// Lanes of the partial sums (one AVX-512 register of f32; two AVX2 registers).
const LANES: usize = 16;

mod avx512;

/// Whether the AVX-512 form of the dot products runs here (the kernels' instruction set, so
/// `SPECCOMPACT_KERNEL_ISA` forces the portable form too; the results are the same).
fn wide() -> bool {
    use std::sync::OnceLock;
    static WIDE: OnceLock<bool> = OnceLock::new();
    *WIDE.get_or_init(|| {
        cfg!(target_arch = "x86_64")
            && crate::linear::kernel_isa() == speccompact_kernels::Isa::Avx512Vnni
    })
}

/// Scaled scores of each of `N` queries against the keys at absolute positions `keys` into
/// `rows[n][j - base]`, four keys at once (independent sums, each computed exactly as [`dot`]
/// does); the queries share each key load.
#[inline]
pub(super) fn scores<'a, const N: usize>(
    q: [&[f32]; N],
    key: impl Fn(usize) -> &'a [f32],
    keys: std::ops::Range<usize>,
    base: usize,
    scale: f32,
    mut rows: [&mut [f32]; N],
) {
    let n = q.first().map_or(0, |q| q.len());
    let simd = wide() && n % LANES == 0 && q.iter().all(|q| q.len() == n);
    let mut j = keys.start;
    while j + 4 <= keys.end {
        let k = [key(j), key(j + 1), key(j + 2), key(j + 3)];
        let at = j - base;
        if simd && k.iter().all(|k| k.len() >= n) && rows.iter().all(|r| r.len() >= at + 4) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `wide()` checked AVX-512 F; every query and key holds `n` values and
            // every row `at + 4`.
            unsafe {
                avx512::dots(q, k, n / LANES, scale, &mut rows, at)
            };
        } else {
            for (row, q) in rows.iter_mut().zip(&q) {
                for (m, x) in dot4(q, k).into_iter().enumerate() {
                    row[j + m - base] = x * scale;
                }
            }
        }
        j += 4;
    }
    for j in j..keys.end {
        for (row, q) in rows.iter_mut().zip(&q) {
            row[j - base] = dot(q, key(j)) * scale;
        }
    }
}

/// `out[q] += p[q][k] * value(keys.start + k)` for every key in order, for `N` queries reading
/// the same values: each output element is one sum in key order, each value row loaded once
/// for all `N` queries (held in registers for the usual head widths).
#[inline]
pub(super) fn weigh<'a, const N: usize>(
    p: [&[f32]; N],
    out: [&mut [f32]; N],
    value: impl Fn(usize) -> &'a [f32],
    keys: std::ops::Range<usize>,
) {
    match out.first().map(|o| o.len()) {
        Some(64) => weigh_fixed::<N, 64>(p, out, value, keys),
        Some(128) => weigh_fixed::<N, 128>(p, out, value, keys),
        _ => {
            let mut out = out;
            for (k, j) in keys.enumerate() {
                let v = value(j);
                for (o, p) in out.iter_mut().zip(&p) {
                    let pk = p[k];
                    for (o, &x) in o.iter_mut().zip(v) {
                        *o += pk * x;
                    }
                }
            }
        }
    }
}

/// [`weigh`] for a head width known at compile time.
#[inline]
fn weigh_fixed<'a, const N: usize, const HD: usize>(
    p: [&[f32]; N],
    mut out: [&mut [f32]; N],
    value: impl Fn(usize) -> &'a [f32],
    keys: std::ops::Range<usize>,
) {
    let mut acc = [[0f32; HD]; N];
    for (a, o) in acc.iter_mut().zip(&out) {
        a.copy_from_slice(&o[..HD]);
    }
    let p: [&[f32]; N] = p.map(|p| &p[..keys.len()]);
    for (k, j) in keys.enumerate() {
        // Value rows are `hd` long and `HD == hd`: the conversion always succeeds.
        let Some(v) = value(j).first_chunk::<HD>() else {
            return;
        };
        for n in 0..N {
            let pk = p[n][k];
            for l in 0..HD {
                acc[n][l] += pk * v[l];
            }
        }
    }
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        o[..HD].copy_from_slice(a);
    }
}

/// Dot product with 16 lane-wise partial sums, then a fixed pairwise tree, then the tail in
/// order: the same operations for every call of the same length.
#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut total = tree(acc);
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        total += x * y;
    }
    total
}

/// Four dot products of `a` with keys of its length, interleaved so they do not wait on one
/// another; each is bitwise [`dot`] of the same pair.
#[inline(always)]
fn dot4(a: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
    let n = a.len();
    let k = k.map(|k| &k[..n]);
    let full = n - n % LANES;
    let mut acc = [[0f32; LANES]; 4];
    for i in (0..full).step_by(LANES) {
        let x = &a[i..i + LANES];
        for (acc, k) in acc.iter_mut().zip(&k) {
            let y = &k[i..i + LANES];
            for l in 0..LANES {
                acc[l] += x[l] * y[l];
            }
        }
    }
    let mut out = [0f32; 4];
    for ((o, acc), k) in out.iter_mut().zip(acc).zip(&k) {
        let mut total = tree(acc);
        for (x, y) in a[full..].iter().zip(&k[full..]) {
            total += x * y;
        }
        *o = total;
    }
    out
}

/// The largest value (`-inf` for none): lane-wise maxima, then across lanes. A maximum is
/// exact, so it does not depend on the order (for values that are not NaN; of `+0` and
/// `-0` either may come back, and both subtract alike from every score).
#[inline]
pub(super) fn max(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut c = a.chunks_exact(LANES);
    for x in &mut c {
        for l in 0..LANES {
            acc[l] = if x[l] > acc[l] { x[l] } else { acc[l] };
        }
    }
    c.remainder()
        .iter()
        .chain(&acc)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// Sum with 16 lane-wise partial sums (lanes counted from the slice's start), a fixed tree
/// and the tail in order.
#[inline]
pub(super) fn sum(a: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut c = a.chunks_exact(LANES);
    for x in &mut c {
        for l in 0..LANES {
            acc[l] += x[l];
        }
    }
    let mut total = tree(acc);
    for x in c.remainder() {
        total += x;
    }
    total
}

#[inline]
fn tree(mut acc: [f32; LANES]) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0]
}

/// `e^x` for `x <= 0` (softmax exponents), within 2 ulp of the true value down to 1e-37:
/// a range reduction by ln 2 and a degree-6 polynomial, plain float operations that the
/// compiler vectorizes, identical on every call.
#[inline]
pub(super) fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Round to nearest by the 1.5 * 2^23 trick.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 0.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // `t` is 1.5 · 2^23 + n with n an integer in -126 ..= 0, so its bits are those of
    // 1.5 · 2^23 plus n: 2^n from integer operations alone (no float-to-int conversion,
    // which keeps the loop vectorized).
    let scale = f32::from_bits(t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    p * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_the_library_within_two_ulp() {
        let mut worst = 0f64;
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            let want = (x as f64).exp();
            let got = exp_nonpositive(x) as f64;
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        // 2^n by integer operations equals the float-to-int form at every reachable n.
        for i in 0..=870_000 {
            let x = (-(i as f32) * 1e-4).clamp(-87.0, 0.0);
            let n = (x * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
            let t = x * std::f32::consts::LOG2_E + 12_582_912.0;
            let by_int = ((n as i32 + 127) as u32) << 23;
            let by_bits = t
                .to_bits()
                .wrapping_sub(12_582_912f32.to_bits())
                .wrapping_add(127)
                << 23;
            assert_eq!(by_int, by_bits, "x {x}");
        }
        assert!(exp_nonpositive(-1e9) >= 0.0);
    }

    #[test]
    fn dot_and_sum_match_f64_references() {
        let a: Vec<f32> = (0..131)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) / 7.0)
            .collect();
        let b: Vec<f32> = (0..131)
            .map(|i| ((i * 11 % 13) as f32 - 6.0) / 5.0)
            .collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - want).abs() < 1e-4);
        let want: f64 = a.iter().map(|x| *x as f64).sum();
        assert!((sum(&a) as f64 - want).abs() < 1e-4);
        for n in [0, 1, 15, 16, 17, 131] {
            let want = a[..n].iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            assert_eq!(max(&a[..n]).to_bits(), want.to_bits(), "n {n}");
        }
    }

    /// Scores of two queries sharing each key load, on whichever path this CPU takes, and
    /// the AVX-512 form called directly where the CPU has it: bitwise `dot` times the scale.
    #[test]
    fn shared_key_scores_are_bitwise_dots() {
        for n in [16, 64, 128, 256, 40] {
            let val = |i: usize, s: usize| {
                let x = (((i * 37 + s * 101) % 29) as f32 - 14.3) / 3.7;
                // Magnitudes far apart, so that a different order of additions would show.
                if i % 5 == 0 {
                    x * 1e4
                } else {
                    x * 1e-3
                }
            };
            let q: Vec<Vec<f32>> = (0..2)
                .map(|m| (0..n).map(|i| val(i, m)).collect())
                .collect();
            let ks: Vec<Vec<f32>> = (0..11)
                .map(|m| (0..n).map(|i| val(i, m + 7)).collect())
                .collect();
            let (mut r0, mut r1) = (vec![0f32; 13], vec![0f32; 13]);
            scores(
                [&q[0][..], &q[1][..]],
                |j| &ks[j - 2][..],
                2..13,
                0,
                0.37,
                [&mut r0, &mut r1],
            );
            for (row, q) in [(&r0, &q[0]), (&r1, &q[1])] {
                for j in 2..13 {
                    assert_eq!(
                        row[j].to_bits(),
                        (dot(q, &ks[j - 2]) * 0.37).to_bits(),
                        "n {n} key {j}"
                    );
                }
            }
            #[cfg(target_arch = "x86_64")]
            if n % LANES == 0 && std::arch::is_x86_feature_detected!("avx512f") {
                let k = [&ks[0][..], &ks[1][..], &ks[2][..], &ks[3][..]];
                let (mut g0, mut g1) = ([0f32; 5], [0f32; 5]);
                let mut out = [&mut g0[..], &mut g1[..]];
                // SAFETY: AVX-512 F detected; every slice holds n values, each row 1 + 4.
                unsafe { avx512::dots([&q[0][..], &q[1][..]], k, n / LANES, 1.0, &mut out, 1) };
                for (g, q) in [&g0, &g1].iter().zip(&q) {
                    for (m, k) in k.iter().enumerate() {
                        assert_eq!(g[1 + m].to_bits(), dot(q, k).to_bits(), "n {n} key {m}");
                    }
                }
            }
        }
    }

    #[test]
    fn four_dots_at_once_are_bitwise_four_dots() {
        for n in [1, 5, 16, 31, 64, 128, 131] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 37 % 17) as f32 - 8.3) / 7.1).collect();
            let ks: Vec<Vec<f32>> = (0..4)
                .map(|m| {
                    (0..n)
                        .map(|i| (((i + m * 5) * 11 % 13) as f32 - 6.2) / 5.3)
                        .collect()
                })
                .collect();
            let got = dot4(&a, [&ks[0], &ks[1], &ks[2], &ks[3]]);
            for m in 0..4 {
                assert_eq!(got[m].to_bits(), dot(&a, &ks[m]).to_bits(), "n {n} key {m}");
            }
        }
    }
}
