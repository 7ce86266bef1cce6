//! The arithmetic of the batch-invariant attention: dot products, sums and `exp` with fixed
//! lane-wise partial sums and reduction trees, and the weighted sum of values; each the same
//! operations in the same order on every call, however many queries share it.

/// Lanes of the partial sums (one AVX-512 register of f32; two AVX2 registers).
const LANES: usize = 16;

/// Scaled scores of `q` against the keys at absolute positions `keys` into `row[j - base]`,
/// four keys at once (independent sums, each computed exactly as [`dot`] does).
#[inline]
pub(super) fn scores<'a>(
    q: &[f32],
    key: impl Fn(usize) -> &'a [f32],
    keys: std::ops::Range<usize>,
    base: usize,
    scale: f32,
    row: &mut [f32],
) {
    let mut j = keys.start;
    while j + 4 <= keys.end {
        let d = dot4(q, [key(j), key(j + 1), key(j + 2), key(j + 3)]);
        for (m, x) in d.into_iter().enumerate() {
            row[j + m - base] = x * scale;
        }
        j += 4;
    }
    for j in j..keys.end {
        row[j - base] = dot(q, key(j)) * scale;
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
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
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
