//! Causal softmax over attention scores as one op with its own backward: rows of
//! `[heads, n, n]` scores, row `i` over keys `0..=i` (the rest are zero), split across the
//! thread pool. The composed form (mask, max, subtract, exp, sum, divide) keeps five
//! `heads × n × n` tensors alive for the backward and runs mostly on one thread; this keeps
//! only the probabilities.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

fn rows<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> candle_core::Result<(&'a [f32], usize)> {
    let n = *l.dims().last().unwrap_or(&0);
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b)))
            if n > 0 && l.dims().len() >= 2 && l.dims()[l.dims().len() - 2] == n =>
        {
            Ok((&v[a..b], n))
        }
        _ => candle_core::bail!("causal softmax: {what} must be contiguous f32 [.., n, n]"),
    }
}

/// Causal softmax of the last dimension of `[.., n, n]` scores.
#[derive(Debug, Clone, Copy)]
pub struct CausalSoftmax;

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, n) = rows(s, l, "scores")?;
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(n)
            .zip(x.par_chunks(n))
            .enumerate()
            .for_each(|(r, (o, x))| {
                let i = r % n;
                let m = x[..=i].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for (o, &x) in o[..=i].iter_mut().zip(&x[..=i]) {
                    *o = (x - m).exp();
                    sum += *o;
                }
                let inv = 1.0 / sum;
                for o in &mut o[..=i] {
                    *o *= inv;
                }
            });
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, p: &Tensor, g: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(
            p.contiguous()?
                .apply_op2_no_bwd(&g.contiguous()?, &SoftmaxGrad)?,
        ))
    }
}

/// `p ⊙ (g − Σ p ⊙ g)` per row: the softmax's input gradient from its output `p` and the
/// output's gradient `g`.
#[derive(Debug, Clone, Copy)]
struct SoftmaxGrad;

impl CustomOp2 for SoftmaxGrad {
    fn name(&self) -> &'static str {
        "causal-softmax-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (p, n) = rows(s1, l1, "probabilities")?;
        let (g, _) = rows(s2, l2, "gradient")?;
        if p.len() != g.len() {
            candle_core::bail!("causal softmax grad: shapes differ");
        }
        let mut out = vec![0f32; p.len()];
        out.par_chunks_mut(n)
            .zip(p.par_chunks(n).zip(g.par_chunks(n)))
            .for_each(|(o, (p, g))| {
                let dot: f32 = p.iter().zip(g).map(|(a, b)| a * b).sum();
                for ((o, &p), &g) in o.iter_mut().zip(p).zip(g) {
                    *o = p * (g - dot);
                }
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var, D};

    /// Forward and gradient equal the composed masked softmax's within 1e-6.
    #[test]
    fn causal_softmax_matches_the_composed_form() {
        let n = 7;
        let x = (Tensor::arange(0f32, (3 * n * n) as f32, &Device::Cpu).unwrap() * 0.37)
            .unwrap()
            .sin()
            .unwrap()
            .reshape((3, n, n))
            .unwrap();
        let w = x.cos().unwrap();
        let mask: Vec<f32> = (0..n * n)
            .map(|k| {
                if k % n > k / n {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (1, n, n), &Device::Cpu).unwrap();
        let v = Var::from_tensor(&x).unwrap();
        let ours = v.as_tensor().apply_op1(CausalSoftmax).unwrap();
        let s = v.as_tensor().broadcast_add(&mask).unwrap();
        let e = s
            .broadcast_sub(&s.max_keepdim(D::Minus1).unwrap().detach())
            .unwrap()
            .exp()
            .unwrap();
        let theirs = e.broadcast_div(&e.sum_keepdim(D::Minus1).unwrap()).unwrap();
        let diff = |a: &Tensor, b: &Tensor| -> f32 {
            (a - b)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar()
                .unwrap()
        };
        assert!(diff(&ours, &theirs) < 1e-6);
        let g1 = (ours * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = (theirs * &w)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        assert!(
            diff(
                g1.get(v.as_tensor()).unwrap(),
                g2.get(v.as_tensor()).unwrap()
            ) < 1e-6
        );
    }
}
