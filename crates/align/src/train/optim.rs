//! AdamW with state that can be saved and restored, a cosine schedule with linear warm-up,
//! and clipping by the global gradient norm.

use crate::{Error, Result};
use candle_core::{Device, Tensor, Var};
use std::collections::HashMap;
use std::path::Path;

/// AdamW over a fixed list of variables.
#[derive(Debug)]
pub struct AdamW {
    /// First moments.
    m: Vec<Tensor>,
    /// Second moments.
    v: Vec<Tensor>,
    /// Updates applied so far.
    pub step: usize,
    /// β1, β2, ε, weight decay.
    pub betas: (f64, f64),
    /// Denominator term.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

impl AdamW {
    /// Zero moments for `vars`.
    pub fn new(vars: &[Var]) -> Result<Self> {
        let z = vars
            .iter()
            .map(|v| Ok(v.as_tensor().zeros_like()?))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            m: z.clone(),
            v: z,
            step: 0,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
        })
    }

    /// One update of `vars` with `grads` at learning rate `lr`.
    pub fn update(&mut self, vars: &[Var], grads: &[Tensor], lr: f64) -> Result<()> {
        if vars.len() != self.m.len() || grads.len() != vars.len() {
            return Err(Error::Settings(
                "optimizer state does not match the variables".into(),
            ));
        }
        self.step += 1;
        let (b1, b2) = self.betas;
        let c1 = 1.0 - b1.powi(self.step as i32);
        let c2 = 1.0 - b2.powi(self.step as i32);
        for (((var, g), m), v) in vars.iter().zip(grads).zip(&mut self.m).zip(&mut self.v) {
            *m = ((&*m * b1)? + (g * (1.0 - b1))?)?;
            *v = ((&*v * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let mhat = (&*m / c1)?;
            let vhat = (&*v / c2)?;
            let upd = (mhat / (vhat.sqrt()? + self.eps)?)?;
            let decayed = (var.as_tensor() * (1.0 - lr * self.weight_decay))?;
            var.set(&(decayed - (upd * lr)?)?)?;
        }
        Ok(())
    }

    /// Writes the moments and the step to `path` (safetensors).
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut t: HashMap<String, Tensor> = HashMap::new();
        for (i, (m, v)) in self.m.iter().zip(&self.v).enumerate() {
            t.insert(format!("m.{i}"), m.clone());
            t.insert(format!("v.{i}"), v.clone());
        }
        t.insert(
            "step".into(),
            Tensor::new(&[self.step as u32], &Device::Cpu)?,
        );
        candle_core::safetensors::save(&t, path).map_err(|e| Error::Checkpoint {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
    }

    /// Reads what [`AdamW::save`] wrote, for `vars`.
    pub fn load(path: &Path, vars: &[Var]) -> Result<Self> {
        let bad = |reason: String| Error::Resume {
            path: path.display().to_string(),
            reason,
        };
        let t =
            candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| bad(e.to_string()))?;
        let mut s = Self::new(vars)?;
        for (i, var) in vars.iter().enumerate() {
            let (Some(m), Some(v)) = (t.get(&format!("m.{i}")), t.get(&format!("v.{i}"))) else {
                return Err(bad(format!("moments of variable {i} missing")));
            };
            if m.dims() != var.dims() || v.dims() != var.dims() {
                return Err(bad(format!("moments of variable {i} have the wrong shape")));
            }
            s.m[i] = m.clone();
            s.v[i] = v.clone();
        }
        let step = t.get("step").ok_or_else(|| bad("step missing".into()))?;
        s.step = step.to_vec1::<u32>()?.first().copied().unwrap_or(0) as usize;
        Ok(s)
    }
}

/// Learning rate at `step` (0-based) of `total`: linear warm-up over `warmup` steps to
/// `peak`, then a cosine down to zero at `total`.
pub fn cosine(step: usize, total: usize, warmup: usize, peak: f64) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    let t = ((step - warmup) as f64 / span).min(1.0);
    peak * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
}

/// Scales `grads` so their global L2 norm is at most `max`; returns the norm before.
pub fn clip(grads: &mut [Tensor], max: f64) -> Result<f64> {
    let mut sq = 0f64;
    for g in grads.iter() {
        sq += f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
    }
    let norm = sq.sqrt();
    if norm > max && norm > 0.0 {
        let s = max / norm;
        for g in grads.iter_mut() {
            *g = (&*g * s)?;
        }
    }
    Ok(norm)
}
