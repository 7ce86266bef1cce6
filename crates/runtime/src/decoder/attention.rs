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

mod sums;

use sums::{exp_nonpositive, max, scores, sum, weigh};

/// Queries of one kv head computed together (they share every key and value load).
const QUERY_BLOCK: usize = 32;

/// Keys scored by every query of a block before the next ones (64 KiB at head width 64,
/// 128 KiB at 128: they stay in the core's cache).
const KEY_TILE: usize = 256;

/// Values of one query and head held in registers while the keys stream past: the queries
/// that accumulate their weighted values together over the keys they share (four at head
/// width 64, two at 128: sixteen AVX-512 registers).
const GROUP_LANES: usize = 256;

/// What one row of the batch attends to past the shared prefix.
pub(super) struct RowKv<'a> {
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

/// Attention of `q` (batch, heads, tokens, head_dim; contiguous f32 on CPU) over the shared
/// prefix's keys and values (kv_heads, prefix_len, head_dim; required when `d.prefix_len` is
/// not 0) and then each row's own; returns (batch, tokens, heads * head_dim). Padded query
/// positions (past a row's new tokens) come out as zeros.
pub(super) fn attend(
    q: &Tensor,
    prefix: Option<(&Tensor, &Tensor)>,
    rows: &[RowKv<'_>],
    d: &Dims,
) -> Result<Tensor> {
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
    let prefix_guards = match prefix {
        Some((k, v)) => Some((k.storage_and_layout(), v.storage_and_layout())),
        None if lp > 0 => return Err(Error::InvalidRequest("prefix cache missing".into())),
        None => None,
    };
    let shared = match &prefix_guards {
        Some(((ks, kl), (vs, vl))) => {
            let (pk, pv) = (plane(ks, kl, hd)?, plane(vs, vl, hd)?);
            if pk.len < lp || pv.len < lp {
                return Err(Error::InvalidRequest(format!(
                    "prefix cache holds {} positions, {lp} needed",
                    pk.len.min(pv.len)
                )));
            }
            Some((pk, pv))
        }
        None => None,
    };
    let guards: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r.suffix.0.storage_and_layout(),
                r.suffix.1.storage_and_layout(),
            )
        })
        .collect();
    let mut planes = Vec::with_capacity(b);
    for (r, ((ks, kl), (vs, vl))) in rows.iter().zip(&guards) {
        let (sk, sv) = (plane(ks, kl, hd)?, plane(vs, vl, hd)?);
        if sk.len < r.cached + r.new || sv.len < r.cached + r.new {
            return Err(Error::InvalidRequest(format!(
                "suffix cache holds {} positions, {} needed",
                sk.len.min(sv.len),
                r.cached + r.new
            )));
        }
        planes.push((sk, sv));
    }
    // Tasks: (kv head, a run of (row, token) pairs). Queries of every row share a task, so
    // the shared prefix's keys and values are read once per kv head and block, not per row.
    let tokens: Vec<(usize, usize)> = rows
        .iter()
        .enumerate()
        .flat_map(|(r, row)| (0..row.new).map(move |i| (r, i)))
        .collect();
    let mut blocks = tokens.len().div_ceil(QUERY_BLOCK.div_ceil(g).max(1)).max(1);
    // Even blocks, more of them when the tasks would leave a thread idle (a query's result
    // does not depend on which block it is in).
    let threads = rayon::current_num_threads().max(1);
    while (hkv * blocks) % threads != 0 && hkv * blocks < 4 * threads && blocks < tokens.len() {
        blocks += 1;
    }
    let size = tokens.len().div_ceil(blocks).max(1);
    let tasks: Vec<(usize, &[(usize, usize)])> = (0..hkv)
        .flat_map(|kh| tokens.chunks(size).map(move |c| (kh, c)))
        .collect();
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(kh, chunk)| {
            let mut out = vec![0f32; chunk.len() * g * hd];
            let queries: Vec<Query<'_>> = chunk
                .iter()
                .flat_map(|&(r, i)| (0..g).map(move |gi| (r, i, gi)))
                .map(|(r, i, gi)| {
                    let h = kh * g + gi;
                    let at = ((r * hq + h) * t + i) * hd;
                    // Absolute position of this query; it sees keys lo..=pos.
                    let pos = lp + rows[r].cached + i;
                    let lo = d.window.map_or(0, |w| (pos + 1).saturating_sub(w));
                    let (sk, sv) = &planes[r];
                    Query {
                        q: &qv[at..at + hd],
                        keys: Keys {
                            head: kh,
                            prefix: shared.as_ref().map(|p| &p.0),
                            suffix: sk,
                            lp,
                        },
                        values: Keys {
                            head: kh,
                            prefix: shared.as_ref().map(|p| &p.1),
                            suffix: sv,
                            lp,
                        },
                        lo,
                        hi: pos + 1,
                    }
                })
                .collect();
            block(&queries, d.scale, hd, lp, &mut out);
            out
        })
        .collect();
    let mut o = vec![0f32; b * t * hq * hd];
    for ((kh, chunk), vals) in tasks.iter().zip(results) {
        for (n, out) in vals.chunks_exact(hd).enumerate() {
            let (r, i) = chunk[n / g];
            let h = kh * g + n % g;
            let at = (r * t + i) * hq * hd + h * hd;
            o[at..at + hd].copy_from_slice(out);
        }
    }
    Ok(Tensor::from_vec(o, (b, t, hq * hd), q.device())?)
}

/// The keys (or values) one query reads for one kv head: the shared prefix's below `lp`, its
/// row's own from there.
struct Keys<'a> {
    head: usize,
    prefix: Option<&'a Plane<'a>>,
    suffix: &'a Plane<'a>,
    lp: usize,
}

impl Keys<'_> {
    /// The row of absolute position `j`.
    #[inline]
    fn at(&self, j: usize, hd: usize) -> &[f32] {
        match self.prefix {
            Some(p) if j < self.lp => p.at(self.head, j, hd),
            _ => self.suffix.at(self.head, j - self.lp, hd),
        }
    }
}

/// One query: its values, what it reads and the absolute key positions it sees (`lo..hi`).
struct Query<'a> {
    q: &'a [f32],
    keys: Keys<'a>,
    values: Keys<'a>,
    lo: usize,
    hi: usize,
}

/// One run of keys a query reads in a tile: the plane, the absolute position of the plane's
/// first row, and the absolute positions.
type Run<'a> = (&'a Plane<'a>, usize, std::ops::Range<usize>);

/// Scores every query of a block over its run of keys (`run`; none: nothing to score) into
/// `s` (query-major, `span` entries from position `lo` each). Two neighbouring queries reading
/// the same run of the same plane share each key load; each score is the same `dot` either way.
fn score_runs<'a>(
    queries: &[Query<'a>],
    s: &mut [f32],
    (lo, span): (usize, usize),
    scale: f32,
    hd: usize,
    run: impl Fn(&Query<'a>) -> Option<Run<'a>>,
) {
    let mut qi = 0;
    while qi < queries.len() {
        let q = &queries[qi];
        let Some((plane, first, keys)) = run(q) else {
            qi += 1;
            continue;
        };
        let key = |j: usize| plane.at(q.keys.head, j - first, hd);
        let partner = queries.get(qi + 1).filter(|r| {
            run(r).is_some_and(|(p, f, k)| std::ptr::eq(p, plane) && f == first && k == keys)
        });
        match partner {
            Some(r) => {
                let (r0, r1) = s[qi * span..(qi + 2) * span].split_at_mut(span);
                scores([q.q, r.q], key, keys, lo, scale, [r0, r1]);
                qi += 2;
            }
            None => {
                let row = &mut s[qi * span..(qi + 1) * span];
                scores([q.q], key, keys, lo, scale, [row]);
                qi += 1;
            }
        }
    }
}

/// Computes a block of queries of one kv head into `out` (query-major, `hd` each); keys below
/// `shared` (the prefix) are the same for every query.
fn block<'a>(queries: &[Query<'a>], scale: f32, hd: usize, shared: usize, out: &mut [f32]) {
    let lo = queries.iter().map(|q| q.lo).min().unwrap_or(0);
    let hi = queries.iter().map(|q| q.hi).max().unwrap_or(0);
    let span = hi - lo;
    // Scores, query-major over the block's key span (entries outside a query's range unused),
    // a tile of keys at a time (kept in cache while every query reads it), four keys per
    // query at once (independent sums, each computed exactly as `dot` does).
    let mut s = vec![0f32; queries.len() * span];
    for j0 in (lo..hi).step_by(KEY_TILE) {
        let j1 = (j0 + KEY_TILE).min(hi);
        // The prefix part and the row's own part of a query's keys in this tile, each a run
        // of rows in one plane.
        let parts = |q: &Query<'_>| {
            let (a, b) = (j0.max(q.lo), j1.min(q.hi));
            (a, b.min(q.keys.lp).max(a), b)
        };
        // Two queries that read the same keys share each key load: any two over the same
        // run of the prefix, two of one row (heads of one token, or tokens whose windows
        // agree here) over its own keys.
        let prefix = |q: &Query<'a>| {
            let (a, cut, _) = parts(q);
            q.keys.prefix.map(|p| (p, 0, a..cut))
        };
        let own = |q: &Query<'a>| {
            let (_, cut, b) = parts(q);
            Some((q.keys.suffix, q.keys.lp, cut..b))
        };
        score_runs(queries, &mut s, (lo, span), scale, hd, prefix);
        score_runs(queries, &mut s, (lo, span), scale, hd, own);
    }
    // Softmax of each query over its own range.
    let mut inv = vec![0f32; queries.len()];
    for (qi, q) in queries.iter().enumerate() {
        let row = &mut s[qi * span + q.lo - lo..qi * span + q.hi - lo];
        let max = max(row);
        for x in row.iter_mut() {
            *x = exp_nonpositive(*x - max);
        }
        inv[qi] = 1.0 / sum(row);
    }
    // Weighted values, key by key in position order for every query. Up to four queries
    // take the shared prefix keys every one of them sees together (each value row loaded
    // once for all), a tile of keys at a time for every group (the tile's values stay in
    // cache); the keys before and after that common run each query takes alone, before and
    // after it. The sums of an output element are the same additions in the same order
    // either way.
    out.fill(0.0);
    let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(hd).collect();
    let group_size = (GROUP_LANES / hd).clamp(1, 4);
    // Each group's common run of prefix keys (empty when its queries share none).
    let common: Vec<(usize, usize)> = queries
        .chunks(group_size)
        .map(|qs| {
            let c0 = qs.iter().map(|q| q.lo).max().unwrap_or(0);
            let c1 = qs.iter().map(|q| q.hi.min(shared)).min().unwrap_or(0);
            if c0 < c1 && qs[0].values.prefix.is_some() {
                (c0, c1)
            } else {
                (usize::MAX, usize::MAX)
            }
        })
        .collect();
    let alone = |qi: usize, o: &mut [f32], keys: std::ops::Range<usize>| {
        let q = &queries[qi];
        if !keys.is_empty() {
            let p = &s[qi * span + keys.start - lo..(qi + 1) * span];
            weigh([p], [o], |j| q.values.at(j, hd), keys);
        }
    };
    for (qi, o) in outs.iter_mut().enumerate() {
        let q = &queries[qi];
        alone(qi, o, q.lo..common[qi / group_size].0.min(q.hi));
    }
    let (first, last) = common
        .iter()
        .filter(|c| c.0 < c.1)
        .fold((usize::MAX, 0), |(a, b), c| (a.min(c.0), b.max(c.1)));
    for t0 in (first..last).step_by(KEY_TILE) {
        let t1 = (t0 + KEY_TILE).min(last);
        for ((g, group), &(c0, c1)) in outs.chunks_mut(group_size).enumerate().zip(&common) {
            let (a, b) = (t0.max(c0), t1.min(c1));
            let (g0, first) = (g * group_size, &queries[g * group_size]);
            let Some(pv) = first.values.prefix.filter(|_| a < b) else {
                continue;
            };
            let p = |n: usize| &s[(g0 + n) * span + a - lo..(g0 + n) * span + b - lo];
            let v = |j| pv.at(first.values.head, j, hd);
            match group {
                [w, x, y, z] => weigh([p(0), p(1), p(2), p(3)], [w, x, y, z], v, a..b),
                [w, x, y] => weigh([p(0), p(1), p(2)], [w, x, y], v, a..b),
                [w, x] => weigh([p(0), p(1)], [w, x], v, a..b),
                [w] => weigh([p(0)], [w], v, a..b),
                _ => {}
            }
        }
    }
    for (qi, o) in outs.iter_mut().enumerate() {
        let q = &queries[qi];
        let c1 = common[qi / group_size].1;
        alone(
            qi,
            o,
            if c1 == usize::MAX {
                q.hi..q.hi
            } else {
                c1.max(q.lo)..q.hi
            },
        );
    }
    for (qi, i) in inv.iter().enumerate() {
        for o in out[qi * hd..(qi + 1) * hd].iter_mut() {
            *o *= i;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sums::dot;
    use super::*;
    use candle_core::Device;

    /// One query computed the plain way: scores by [`dot`] in key order, the softmax, then
    /// the weighted values added key by key.
    fn reference(q: &[f32], keys: &[&[f32]], values: &[&[f32]], scale: f32) -> Vec<f32> {
        let s: Vec<f32> = keys.iter().map(|k| dot(q, k) * scale).collect();
        let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let e: Vec<f32> = s.iter().map(|x| exp_nonpositive(x - max)).collect();
        let inv = 1.0 / sum(&e);
        let mut out = vec![0f32; q.len()];
        for (p, v) in e.iter().zip(values) {
            for (o, x) in out.iter_mut().zip(*v) {
                *o += p * x;
            }
        }
        out.iter().map(|o| o * inv).collect()
    }

    fn fill(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + seed * 104_729) % 1009) as f32 - 504.0) / 300.0)
            .collect()
    }

    /// Every query of a batch (rows with different cached and new lengths, over a shared
    /// prefix, with and without a sliding window, shorter and longer than a key tile) is
    /// bitwise the plain computation, at head widths that take the register paths (64, 128)
    /// and the general one.
    #[test]
    fn batched_queries_are_bitwise_the_plain_computation() -> Result<()> {
        let dev = Device::Cpu;
        // Prefixes longer than a key tile, with and without a window that starts inside.
        let cases = [
            (64, None, 9),
            (128, None, 9),
            (40, None, 9),
            (64, Some(5), 9),
            (128, None, 600),
            (64, Some(300), 600),
        ];
        for (hd, window, lp) in cases {
            let (hkv, g) = (2, 3);
            let hq = hkv * g;
            let rows = [(0usize, 1usize), (3, 4), (1, 1), (6, 2), (2, 3)];
            let t = rows.iter().map(|r| r.1).max().unwrap_or(1);
            let pk = fill(hkv * lp * hd, 1);
            let pv = fill(hkv * lp * hd, 2);
            let suffixes: Vec<(Vec<f32>, Vec<f32>, usize)> = rows
                .iter()
                .enumerate()
                .map(|(r, &(c, n))| {
                    let len = c + n;
                    (
                        fill(hkv * len * hd, 10 + r),
                        fill(hkv * len * hd, 20 + r),
                        len,
                    )
                })
                .collect();
            let b = rows.len();
            let qv = fill(b * hq * t * hd, 3);
            let q = Tensor::from_vec(qv.clone(), (b, hq, t, hd), &dev)?;
            let pkt = Tensor::from_vec(pk.clone(), (hkv, lp, hd), &dev)?;
            let pvt = Tensor::from_vec(pv.clone(), (hkv, lp, hd), &dev)?;
            let st: Vec<(Tensor, Tensor)> = suffixes
                .iter()
                .map(|(k, v, len)| -> Result<_> {
                    Ok((
                        Tensor::from_vec(k.clone(), (hkv, *len, hd), &dev)?,
                        Tensor::from_vec(v.clone(), (hkv, *len, hd), &dev)?,
                    ))
                })
                .collect::<Result<_>>()?;
            let kv_rows: Vec<RowKv<'_>> = rows
                .iter()
                .zip(&st)
                .map(|(&(cached, new), (k, v))| RowKv {
                    suffix: (k, v),
                    cached,
                    new,
                })
                .collect();
            let d = Dims {
                heads: hq,
                kv_heads: hkv,
                head_dim: hd,
                tokens: t,
                prefix_len: lp,
                scale: 0.3,
                window,
            };
            let got = attend(&q, Some((&pkt, &pvt)), &kv_rows, &d)?;
            let got = got.flatten_all()?.to_vec1::<f32>()?;
            for (r, &(cached, new)) in rows.iter().enumerate() {
                let (sk, sv, len) = &suffixes[r];
                for i in 0..new {
                    let pos = lp + cached + i;
                    let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                    for h in 0..hq {
                        let kh = h / g;
                        let row = |data: &[f32], plen: usize, j: usize| {
                            let at = (kh * plen + j) * hd;
                            data[at..at + hd].to_vec()
                        };
                        let (mut ks, mut vs) = (Vec::new(), Vec::new());
                        for j in lo..=pos {
                            if j < lp {
                                ks.push(row(&pk, lp, j));
                                vs.push(row(&pv, lp, j));
                            } else {
                                ks.push(row(sk, *len, j - lp));
                                vs.push(row(sv, *len, j - lp));
                            }
                        }
                        let kr: Vec<&[f32]> = ks.iter().map(|k| k.as_slice()).collect();
                        let vr: Vec<&[f32]> = vs.iter().map(|v| v.as_slice()).collect();
                        let at = ((r * hq + h) * t + i) * hd;
                        let want = reference(&qv[at..at + hd], &kr, &vr, 0.3);
                        let at = (r * t + i) * hq * hd + h * hd;
                        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&got[at..at + hd]),
                            bits(&want),
                            "head width {hd}, window {window:?}, row {r}, token {i}, head {h}"
                        );
                    }
                }
            }
        }
        Ok(())
    }
}
