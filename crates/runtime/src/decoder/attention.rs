//! Batch-invariant attention for step forwards on CPU.
//!
//! Each query is computed alone and always the same way: its scores against the keys it can
//! see, in position order (the shared prefix, then its row's own suffix), each a dot product
//! with fixed 16-lane partial sums and a fixed summation tree; a softmax whose maximum, `exp`
//! and sum do not depend on anything but those scores; and a weighted sum of values
//! accumulated key by key in position order. Nothing depends on how many rows, tokens or
//! padded positions share the forward, or on how the work is split across threads, so a
//! token's output is bitwise the same decoded alone, checked with 31 others, or in a batch of
//! six rows.

use crate::{Error, Result};
use candle_core::{CpuStorage, Layout, Storage, Tensor};
use rayon::prelude::*;

/// Lanes of the partial sums (one AVX-512 register of f32; two AVX2 registers).
const LANES: usize = 16;

/// Queries of one kv head computed together (they share every key and value load).
const QUERY_BLOCK: usize = 32;

/// Keys scored by every query of a block before the next ones (64 KiB at head width 64,
/// 128 KiB at 128: they stay in the core's cache).
const KEY_TILE: usize = 256;

/// What one row of the batch attends to.
pub(super) struct RowKv<'a> {
    /// The shared prefix's keys and values (kv_heads, prefix_len, head_dim), if any.
    pub prefix: Option<(&'a Tensor, &'a Tensor)>,
    /// The row's suffix keys and values (kv_heads, suffix_len + new, head_dim), new included.
    pub suffix: (&'a Tensor, &'a Tensor),
    /// Suffix positions cached before this forward.
    pub cached: usize,
    /// New tokens of this row.
    pub new: usize,
}

/// Shapes shared by every row.
pub(super) struct Dims {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Padded token count of the batch (the queries' second axis).
    pub tokens: usize,
    /// Prefix length shared by every row (0 without a prefix).
    pub prefix_len: usize,
    /// Score scale.
    pub scale: f32,
    /// Sliding window of the layer, if it has one.
    pub window: Option<usize>,
}

/// A (kv_heads, len, head_dim) f32 tensor read in place: element (h, j, d) at
/// `h * head + j * pos + d`.
struct Plane<'a> {
    data: &'a [f32],
    head: usize,
    pos: usize,
    len: usize,
}

impl Plane<'_> {
    #[inline]
    fn at(&self, h: usize, j: usize, hd: usize) -> &[f32] {
        let o = h * self.head + j * self.pos;
        &self.data[o..o + hd]
    }
}

fn plane<'a>(storage: &'a Storage, layout: &'a Layout, hd: usize) -> Result<Plane<'a>> {
    let Storage::Cpu(CpuStorage::F32(data)) = storage else {
        return Err(Error::InvalidRequest(
            "invariant attention reads f32 CPU caches only".into(),
        ));
    };
    let dims = layout.dims();
    let stride = layout.stride();
    if dims.len() != 3 || dims[2] != hd || stride[2] != 1 {
        return Err(Error::InvalidRequest(format!(
            "cache of shape {dims:?} / strides {stride:?} is not (heads, len, {hd}) with rows in place"
        )));
    }
    Ok(Plane {
        data: &data[layout.start_offset()..],
        head: stride[0],
        pos: stride[1],
        len: dims[1],
    })
}

/// Attention of `q` (batch, heads, tokens, head_dim; contiguous f32 on CPU) over each row's
/// visible keys; returns (batch, tokens, heads * head_dim). Padded query positions (past a
/// row's new tokens) come out as zeros.
pub(super) fn attend(q: &Tensor, rows: &[RowKv<'_>], d: &Dims) -> Result<Tensor> {
    let (hq, hkv, hd, t, lp) = (d.heads, d.kv_heads, d.head_dim, d.tokens, d.prefix_len);
    let b = rows.len();
    let q = q.contiguous()?;
    let qv = q.flatten_all()?.to_vec1::<f32>()?;
    if qv.len() != b * hq * t * hd || hkv == 0 || hq % hkv != 0 {
        return Err(Error::InvalidRequest(format!(
            "queries hold {} values, {b} x {hq} x {t} x {hd} expected",
            qv.len()
        )));
    }
    let g = hq / hkv;
    if lp > 0 && rows.iter().any(|r| r.prefix.is_none()) {
        return Err(Error::InvalidRequest("prefix cache missing".into()));
    }
    let guards: Vec<[Option<_>; 4]> = rows
        .iter()
        .map(|r| {
            let (pk, pv) = match r.prefix {
                Some((k, v)) => (Some(k.storage_and_layout()), Some(v.storage_and_layout())),
                None => (None, None),
            };
            [
                pk,
                pv,
                Some(r.suffix.0.storage_and_layout()),
                Some(r.suffix.1.storage_and_layout()),
            ]
        })
        .collect();
    let mut planes = Vec::with_capacity(b);
    for (r, gs) in rows.iter().zip(&guards) {
        let get = |i: usize| gs[i].as_ref().map(|(s, l)| plane(s, l, hd)).transpose();
        let (pk, pv, sk, sv) = (get(0)?, get(1)?, get(2)?, get(3)?);
        let (Some(sk), Some(sv)) = (sk, sv) else {
            return Err(Error::InvalidRequest("suffix cache missing".into()));
        };
        if sk.len < r.cached + r.new || sv.len < r.cached + r.new {
            return Err(Error::InvalidRequest(format!(
                "suffix cache holds {} positions, {} needed",
                sk.len,
                r.cached + r.new
            )));
        }
        if let Some(p) = &pk {
            if p.len < lp {
                return Err(Error::InvalidRequest(format!(
                    "prefix cache holds {} positions, {lp} needed",
                    p.len
                )));
            }
        }
        planes.push((pk, pv, sk, sv));
    }
    // Tasks: (row, kv head, first token of a block of queries).
    let tok_block = QUERY_BLOCK.div_ceil(g).max(1);
    let mut tasks = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        for kh in 0..hkv {
            for i0 in (0..row.new).step_by(tok_block) {
                tasks.push((r, kh, i0));
            }
        }
    }
    let results: Vec<(usize, usize, usize, Vec<f32>)> = tasks
        .into_par_iter()
        .map(|(r, kh, i0)| {
            let row = &rows[r];
            let (pk, pv, sk, sv) = &planes[r];
            let i1 = (i0 + tok_block).min(row.new);
            let mut out = vec![0f32; (i1 - i0) * g * hd];
            let queries: Vec<Query<'_>> = (i0..i1)
                .flat_map(|i| (0..g).map(move |gi| (i, gi)))
                .map(|(i, gi)| {
                    let h = kh * g + gi;
                    let at = ((r * hq + h) * t + i) * hd;
                    // Absolute position of this query; it sees keys lo..=pos.
                    let pos = lp + row.cached + i;
                    let lo = d.window.map_or(0, |w| (pos + 1).saturating_sub(w));
                    Query {
                        q: &qv[at..at + hd],
                        lo,
                        hi: pos + 1,
                    }
                })
                .collect();
            let key = |j: usize| match (pk, j < lp) {
                (Some(p), true) => p.at(kh, j, hd),
                _ => sk.at(kh, j - lp, hd),
            };
            let value = |j: usize| match (pv, j < lp) {
                (Some(p), true) => p.at(kh, j, hd),
                _ => sv.at(kh, j - lp, hd),
            };
            block(&queries, d.scale, hd, key, value, &mut out);
            (r, kh, i0, out)
        })
        .collect();
    let mut o = vec![0f32; b * t * hq * hd];
    for (r, kh, i0, vals) in results {
        for (n, chunk) in vals.chunks_exact(hd).enumerate() {
            let (i, gi) = (i0 + n / g, n % g);
            let h = kh * g + gi;
            let at = (r * t + i) * hq * hd + h * hd;
            o[at..at + hd].copy_from_slice(chunk);
        }
    }
    Ok(Tensor::from_vec(o, (b, t, hq * hd), q.device())?)
}

/// One query: its values and the absolute key positions it sees (`lo..hi`).
struct Query<'a> {
    q: &'a [f32],
    lo: usize,
    hi: usize,
}

/// Computes a block of queries of one kv head into `out` (query-major, `hd` each).
fn block<'a>(
    queries: &[Query<'_>],
    scale: f32,
    hd: usize,
    key: impl Fn(usize) -> &'a [f32],
    value: impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
) {
    let lo = queries.iter().map(|q| q.lo).min().unwrap_or(0);
    let hi = queries.iter().map(|q| q.hi).max().unwrap_or(0);
    let span = hi - lo;
    // Scores, query-major over the block's key span (entries outside a query's range unused),
    // a tile of keys at a time (kept in cache while every query reads it), four keys per
    // query at once (independent sums, each computed exactly as `dot` does).
    let mut s = vec![0f32; queries.len() * span];
    for j0 in (lo..hi).step_by(KEY_TILE) {
        let j1 = (j0 + KEY_TILE).min(hi);
        for (qi, q) in queries.iter().enumerate() {
            let (a, b) = (j0.max(q.lo), j1.min(q.hi));
            let row = &mut s[qi * span..(qi + 1) * span];
            let mut j = a;
            while j + 4 <= b {
                let d = dot4(q.q, [key(j), key(j + 1), key(j + 2), key(j + 3)]);
                for (m, x) in d.into_iter().enumerate() {
                    row[j + m - lo] = x * scale;
                }
                j += 4;
            }
            for j in j..b {
                row[j - lo] = dot(q.q, key(j)) * scale;
            }
        }
    }
    // Softmax of each query over its own range.
    let mut inv = vec![0f32; queries.len()];
    for (qi, q) in queries.iter().enumerate() {
        let row = &mut s[qi * span + q.lo - lo..qi * span + q.hi - lo];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        for x in row.iter_mut() {
            *x = exp_nonpositive(*x - max);
        }
        inv[qi] = 1.0 / sum(row);
    }
    // Weighted values, key by key in position order.
    out.fill(0.0);
    for j in lo..hi {
        let v = value(j);
        for (qi, q) in queries.iter().enumerate() {
            if j >= q.lo && j < q.hi {
                let p = s[qi * span + j - lo];
                for (o, &x) in out[qi * hd..(qi + 1) * hd].iter_mut().zip(v) {
                    *o += p * x;
                }
            }
        }
    }
    for (qi, i) in inv.iter().enumerate() {
        for o in out[qi * hd..(qi + 1) * hd].iter_mut() {
            *o *= i;
        }
    }
}

/// Dot product with 16 lane-wise partial sums, then a fixed pairwise tree, then the tail in
/// order: the same operations for every call of the same length.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
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
#[inline]
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
fn sum(a: &[f32]) -> f32 {
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
