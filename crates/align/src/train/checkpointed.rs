//! Loss and gradients of one example with one block's graph alive at a time: the forward
//! keeps only each block's input (detached); the backward recomputes a block from its input,
//! pulls the gradient of its output back through it, and moves on to the block below. Memory
//! is one block's activations (at 2,048 tokens the attention probabilities dominate) instead
//! of every block's.

use super::model::{DenseModel, Lora};
use crate::Result;
use candle_core::{Tensor, Var};

/// Loss and gradients of one example.
#[derive(Debug)]
pub struct Step {
    /// Mean negative log-likelihood of the labelled tokens.
    pub loss: f32,
    /// Labelled tokens.
    pub tokens: usize,
    /// Gradients in the order of [`Lora::all_vars`].
    pub grads: Vec<Tensor>,
}

/// Loss of one example without gradients (validation), one block alive at a time.
pub fn loss(m: &DenseModel, ids: &[u32], labels: &[i64], lora: &Lora) -> Result<(f32, usize)> {
    let (at, want) = DenseModel::targets(ids, labels)?;
    let mut x = m.embed(ids)?;
    for l in 0..m.num_layers() {
        x = m.layer(l, &x, Some(lora))?.detach();
    }
    Ok((m.head_loss(&x, &at, &want)?.detach().to_scalar()?, at.len()))
}

/// Loss and gradients of one example.
pub fn loss_and_grads(m: &DenseModel, ids: &[u32], labels: &[i64], lora: &Lora) -> Result<Step> {
    let (at, want) = DenseModel::targets(ids, labels)?;
    let mut inputs = Vec::with_capacity(m.num_layers());
    let mut x = m.embed(ids)?;
    for l in 0..m.num_layers() {
        inputs.push(x.clone());
        x = m.layer(l, &x, Some(lora))?.detach();
    }
    let top = Var::from_tensor(&x)?;
    let loss = m.head_loss(top.as_tensor(), &at, &want)?;
    let g = loss.backward()?;
    let mut upstream = g
        .get(top.as_tensor())
        .cloned()
        .ok_or_else(|| crate::Error::Settings("no gradient reached the last block".into()))?;
    let vars = lora.all_vars();
    let mut grads: Vec<Option<Tensor>> = vec![None; vars.len()];
    for l in (0..m.num_layers()).rev() {
        let xin = Var::from_tensor(&inputs[l])?;
        let out = m.layer(l, xin.as_tensor(), Some(lora))?;
        let g = (out * &upstream)?.sum_all()?.backward()?;
        for (slot, v) in grads.iter_mut().zip(&vars) {
            if let Some(d) = g.get(v.as_tensor()) {
                *slot = Some(match slot.take() {
                    Some(s) => (s + d)?,
                    None => d.clone(),
                });
            }
        }
        if l > 0 {
            upstream = match g.get(xin.as_tensor()) {
                Some(d) => d.clone(),
                None => {
                    return Err(crate::Error::Settings(format!(
                        "no gradient below block {l}"
                    )))
                }
            };
        }
    }
    let grads = grads
        .into_iter()
        .zip(&vars)
        .map(|(g, v)| match g {
            Some(g) => Ok(g),
            None => Ok(v.as_tensor().zeros_like()?),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Step {
        loss: loss.to_scalar()?,
        tokens: at.len(),
        grads,
    })
}
