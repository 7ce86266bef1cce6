//! The model adapters are trained on: a dense copy of the model (dequantized
//! from GGUF or read from safetensors; llama and qwen2 decoders), a side path
//! `W x + (alpha / r) · B (A x)` on every adapted projection, and the loss over the body
//! tokens only (labels −100 elsewhere).
//!
//! Frozen weights take no gradient: candle's matmul backward computes the gradient of both
//! operands, which for a frozen `W` is a second matmul as large as the forward's, thrown
//! away. [`FrozenLinear`] is a custom op whose backward returns only the input's gradient.
//!
//! The forward follows the runtime's conventions (RMS norm, rotary pairs interleaved for
//! llama GGUF files and rotate-half otherwise, grouped-query attention, SiLU MLP), checked
//! against the runtime's logits in the tests.

use crate::{Error, Result};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor, Var};
use speccompact_runtime::adapter::{Adapter, LoraPair, MODULES};
use speccompact_runtime::rng::Rng;
use speccompact_runtime::weights::{Param, WeightSource};
use speccompact_runtime::{Architecture, ModelConfig, RopeStyle};
use std::collections::BTreeMap;

/// `x W^T` with `W` frozen: the backward gives `x`'s gradient only.
#[derive(Debug, Clone)]
pub struct FrozenLinear {
    /// `[out, in]`.
    pub w: Tensor,
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "frozen-linear"
    }

    /// `x Wᵀ` straight on the storages: no copy of the input or of the output.
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        if !l.is_contiguous() {
            candle_core::bail!("frozen-linear: input must be contiguous");
        }
        let (n, k) = self.w.dims2()?;
        let mut dims = l.shape().dims().to_vec();
        if dims.last() != Some(&k) {
            candle_core::bail!("frozen-linear: input {dims:?} for a weight of {k} inputs");
        }
        let m = l.shape().elem_count() / k;
        let (storage, wl) = self.w.storage_and_layout();
        let candle_core::Storage::Cpu(w) = &*storage else {
            candle_core::bail!("frozen-linear: the weight is not on the CPU");
        };
        let xl = Layout::contiguous_with_offset((m, k), l.start_offset());
        let y = s.matmul(w, (1, m, n, k), &xl, &wl.transpose(0, 1)?)?;
        if let Some(last) = dims.last_mut() {
            *last = n;
        }
        Ok((y, Shape::from(dims)))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad.matmul(&self.w)?))
    }
}

impl FrozenLinear {
    /// `x Wᵀ` through this op, or through candle's matmul when `weight_gradient` (whose
    /// backward also computes `W`'s gradient, thrown away: kept to measure that waste).
    fn forward(&self, x: &Tensor, weight_gradient: bool) -> Result<Tensor> {
        let x = x.contiguous()?;
        Ok(match weight_gradient {
            true => x.matmul(&self.w.t()?)?,
            // The custom backward is recorded only when `x` leads back to a variable.
            false => x.apply_op1(self.clone())?,
        })
    }
}

/// A frozen projection and its optional bias.
#[derive(Debug, Clone)]
struct Proj {
    op: FrozenLinear,
    bias: Option<Tensor>,
}

impl Proj {
    fn apply(&self, x: &Tensor, weight_gradient: bool) -> Result<Tensor> {
        let y = self.op.forward(x, weight_gradient)?;
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

#[derive(Debug, Clone)]
struct Layer {
    attn_norm: Tensor,
    ffn_norm: Tensor,
    /// q, k, v, o, gate, up, down (the order of [`MODULES`]).
    proj: Vec<Proj>,
}

/// The trainable side paths: `a` `[r, in]` (random), `b` `[out, r]` (zeros) per adapted
/// projection.
#[derive(Debug)]
pub struct Lora {
    /// Rank.
    pub r: usize,
    /// Scale numerator.
    pub alpha: f32,
    /// Adapted module names.
    pub modules: Vec<String>,
    /// The variables by (layer, module).
    pub vars: BTreeMap<(usize, String), (Var, Var)>,
}

impl Lora {
    /// Every variable, in a fixed order (for the optimizer).
    pub fn all_vars(&self) -> Vec<Var> {
        self.vars
            .values()
            .flat_map(|(a, b)| [a.clone(), b.clone()])
            .collect()
    }

    /// The adapter these variables hold now.
    pub fn adapter(&self, base_name: &str, base_sha256: Option<String>) -> Result<Adapter> {
        let mut pairs = BTreeMap::new();
        for (k, (a, b)) in &self.vars {
            pairs.insert(
                k.clone(),
                LoraPair {
                    a: a.as_tensor().copy()?,
                    b: b.as_tensor().copy()?,
                },
            );
        }
        Ok(Adapter {
            r: self.r,
            alpha: self.alpha,
            target_modules: self.modules.clone(),
            base_name: base_name.to_string(),
            base_sha256,
            pairs,
        })
    }
}

/// A dense model for training adapters on.
#[derive(Debug, Clone)]
pub struct DenseModel {
    /// Its shape.
    pub cfg: ModelConfig,
    embed: Tensor,
    layers: Vec<Layer>,
    final_norm: Tensor,
    output: FrozenLinear,
    /// Candle's matmul for the frozen weights ([`DenseModel::with_weight_gradients`]).
    weight_gradients: bool,
}

/// A weight as dense contiguous f32, `None` when the model does not have it.
fn get(src: &mut dyn WeightSource, p: Param) -> Result<Option<Tensor>> {
    Ok(match src.get(p)? {
        Some(w) => Some(w.to_f32()?.to_dtype(DType::F32)?.contiguous()?),
        None => None,
    })
}

/// [`get`] for a weight the model must have.
fn need(src: &mut dyn WeightSource, p: Param) -> Result<Tensor> {
    get(src, p)?.ok_or_else(|| Error::Settings(format!("the model has no {}", p.gguf_name())))
}

const PARAMS: [fn(usize) -> Param; 7] = [
    Param::Q,
    Param::K,
    Param::V,
    Param::O,
    Param::Gate,
    Param::Up,
    Param::Down,
];

impl DenseModel {
    /// Dense f32 copies of every weight of `src` (llama and qwen2 decoders).
    pub fn load(src: &mut dyn WeightSource) -> Result<Self> {
        let cfg = src.config().clone();
        if !matches!(cfg.arch, Architecture::Llama | Architecture::Qwen2)
            || cfg.qk_norm
            || cfg.post_norms
            || cfg.sliding_window.is_some()
        {
            return Err(Error::Settings(format!(
                "adapter training supports llama and qwen2 decoders, not {:?}",
                cfg.arch
            )));
        }
        let embed = need(src, Param::Embed)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let attn_norm = need(src, Param::AttnNorm(i))?;
            let ffn_norm = need(src, Param::FfnNorm(i))?;
            let mut proj = Vec::with_capacity(7);
            for (k, p) in PARAMS.iter().enumerate() {
                let w = need(src, p(i))?;
                let bias = match k {
                    0 => get(src, Param::QBias(i))?,
                    1 => get(src, Param::KBias(i))?,
                    2 => get(src, Param::VBias(i))?,
                    _ => None,
                };
                proj.push(Proj {
                    op: FrozenLinear { w },
                    bias,
                });
            }
            layers.push(Layer {
                attn_norm,
                ffn_norm,
                proj,
            });
        }
        let final_norm = need(src, Param::FinalNorm)?;
        let output = match get(src, Param::Output)? {
            Some(w) => w,
            None => embed.clone(),
        };
        Ok(Self {
            cfg,
            embed,
            layers,
            final_norm,
            output: FrozenLinear { w: output },
            weight_gradients: false,
        })
    }

    /// The same model computing its frozen projections with candle's matmul, whose backward
    /// also computes every frozen weight's gradient and throws it away: the same losses and
    /// LoRA gradients, slower. For measuring what [`FrozenLinear`] saves.
    pub fn with_weight_gradients(mut self) -> Self {
        self.weight_gradients = true;
        self
    }

    /// [`DenseModel::load`] from a GGUF file or a Hugging Face safetensors folder.
    pub fn from_path(path: &std::path::Path) -> Result<Self> {
        if path.is_dir() {
            let mut src =
                speccompact_runtime::weights::SafetensorsWeights::open(path, &Device::Cpu)?;
            Self::load(&mut src)
        } else {
            let (ct, mut f) = speccompact_runtime::read_gguf(path)?;
            let mut src =
                speccompact_runtime::weights::GgufWeights::new(&ct, &mut f, &Device::Cpu)?;
            Self::load(&mut src)
        }
    }

    /// Fresh side paths of rank `r` on `modules` (names from [`MODULES`]): `a` uniform in
    /// ±1/sqrt(in) from `seed`, `b` zero (the adapted model starts as the base).
    pub fn lora(&self, r: usize, alpha: f32, modules: &[String], seed: u64) -> Result<Lora> {
        if r == 0 {
            return Err(Error::Settings("LoRA rank 0".into()));
        }
        let mut rng = Rng::new(seed);
        let mut vars = BTreeMap::new();
        for m in modules {
            let k = MODULES
                .iter()
                .position(|(n, _)| n == m)
                .ok_or_else(|| Error::Settings(format!("{m} is not a projection")))?;
            for (i, layer) in self.layers.iter().enumerate() {
                let (out, inp) = layer.proj[k].op.w.dims2()?;
                let bound = 1.0 / (inp as f32).sqrt();
                let a = Var::from_tensor(&rng.tensor(&[r, inp], bound, 0.0)?)?;
                let b = Var::zeros((out, r), DType::F32, &Device::Cpu)?;
                vars.insert((i, m.clone()), (a, b));
            }
        }
        Ok(Lora {
            r,
            alpha,
            modules: modules.to_vec(),
            vars,
        })
    }

    fn rms(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        let eps = self.cfg.rms_norm_eps;
        let ms = x.sqr()?.mean_keepdim(candle_core::D::Minus1)?;
        Ok(x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(w)?)
    }

    /// Rotary embedding of `x` (`[n, heads, hd]`) at positions `0..n`.
    fn rope(&self, x: &Tensor) -> Result<Tensor> {
        let (n, heads, hd) = x.dims3()?;
        let half = hd / 2;
        let mut cos = vec![0f32; n * half];
        let mut sin = vec![0f32; n * half];
        for p in 0..n {
            for i in 0..half {
                let pos = p as f32 / self.cfg.rope_scale;
                let f = pos / self.cfg.rope_theta.powf(2.0 * i as f32 / hd as f32);
                cos[p * half + i] = f.cos();
                sin[p * half + i] = f.sin();
            }
        }
        let interleaved = self.cfg.rope_style == RopeStyle::Interleaved;
        let shape = if interleaved {
            (n, 1, half, 1)
        } else {
            (n, 1, 1, half)
        };
        let cos = Tensor::from_vec(cos, shape, &Device::Cpu)?;
        let sin = Tensor::from_vec(sin, shape, &Device::Cpu)?;
        // Pairs (2i, 2i + 1) as [n, heads, half, 2]; pairs (i, i + half) as [n, heads, 2, half].
        let (x, d) = if interleaved {
            (x.reshape((n, heads, half, 2))?, 3)
        } else {
            (x.reshape((n, heads, 2, half))?, 2)
        };
        let x1 = x.narrow(d, 0, 1)?;
        let x2 = x.narrow(d, 1, 1)?;
        let a = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
        let b = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
        Ok(Tensor::cat(&[a, b], d)?.reshape((n, heads, hd))?)
    }

    /// Projection `k` of layer `l` with its side path, if any.
    fn project(&self, l: usize, k: usize, x: &Tensor, lora: Option<&Lora>) -> Result<Tensor> {
        let y = self.layers[l].proj[k].apply(x, self.weight_gradients)?;
        let side = lora.and_then(|lo| {
            lo.vars
                .get(&(l, MODULES[k].0.to_string()))
                .map(|(a, b)| (lo.alpha / lo.r as f32, a, b))
        });
        Ok(match side {
            Some((s, a, b)) => {
                let d = x.matmul(&a.t()?)?.matmul(&b.t()?)?;
                (y + (d * f64::from(s))?)?
            }
            None => y,
        })
    }

    /// The token embeddings of `ids`, `[n, hidden]`.
    pub fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        Ok(self
            .embed
            .index_select(&Tensor::new(ids, &Device::Cpu)?, 0)?)
    }

    /// Number of transformer blocks.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Block `l` on the residual stream `x` (`[n, hidden]`), causal over its `n` positions.
    pub fn layer(&self, l: usize, x: &Tensor, lora: Option<&Lora>) -> Result<Tensor> {
        let c = &self.cfg;
        let layer = &self.layers[l];
        let (n, _) = x.dims2()?;
        let (hq, hkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let h = self.rms(x, &layer.attn_norm)?;
        let q = self.project(l, 0, &h, lora)?.reshape((n, hq, hd))?;
        let k = self.project(l, 1, &h, lora)?.reshape((n, hkv, hd))?;
        let v = self.project(l, 2, &h, lora)?.reshape((n, hkv, hd))?;
        let q = self.rope(&q)?.transpose(0, 1)?.contiguous()?; // [hq, n, hd]
        let k = self.rope(&k)?.transpose(0, 1)?.contiguous()?;
        let v = v.transpose(0, 1)?.contiguous()?;
        let g = hq / hkv;
        // Each kv head serves `g` query heads: [hkv, g * n, hd] against [hkv, n, hd].
        let q = q.reshape((hkv, g * n, hd))?;
        let s = (q.matmul(&k.t()?)? * c.attn_scale)?.reshape((hkv * g, n, n))?;
        let p = s.apply_op1(super::softmax::CausalSoftmax)?;
        let o = p.reshape((hkv, g * n, n))?.matmul(&v)?; // [hkv, g * n, hd]
        let o = o
            .reshape((hq, n, hd))?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((n, hq * hd))?;
        let x = (x + self.project(l, 3, &o, lora)?)?;
        let h = self.rms(&x, &layer.ffn_norm)?;
        let gate = self.project(l, 4, &h, lora)?.silu()?;
        let up = self.project(l, 5, &h, lora)?;
        Ok((&x + self.project(l, 6, &(gate * up)?, lora)?)?)
    }

    /// Hidden states after the final norm, `[n, hidden]`, for tokens `ids`.
    pub fn hidden(&self, ids: &[u32], lora: Option<&Lora>) -> Result<Tensor> {
        let mut x = self.embed(ids)?;
        for l in 0..self.layers.len() {
            x = self.layer(l, &x, lora)?;
        }
        self.rms(&x, &self.final_norm)
    }

    /// Logits at every position, `[n, vocab]`.
    pub fn logits(&self, ids: &[u32], lora: Option<&Lora>) -> Result<Tensor> {
        self.output
            .forward(&self.hidden(ids, lora)?, self.weight_gradients)
    }

    /// The positions that predict a label (position `i` predicts `labels[i + 1]`; labels
    /// −100 are left out) and the labels they predict.
    pub fn targets(ids: &[u32], labels: &[i64]) -> Result<(Vec<u32>, Vec<u32>)> {
        if ids.len() != labels.len() || ids.len() < 2 {
            return Err(Error::Settings(format!(
                "{} input ids and {} labels (equal, at least 2, expected)",
                ids.len(),
                labels.len()
            )));
        }
        let (mut at, mut want) = (Vec::new(), Vec::new());
        for i in 0..ids.len() - 1 {
            let t = labels[i + 1];
            if t >= 0 {
                at.push(i as u32);
                want.push(u32::try_from(t).map_err(|_| Error::Settings(format!("label {t}")))?);
            }
        }
        if at.is_empty() {
            return Err(Error::Settings("an example with no labelled token".into()));
        }
        Ok((at, want))
    }

    /// Mean negative log-likelihood under the final residual stream `x` (`[n, hidden]`, before
    /// the final norm) of the tokens `want` predicted at positions `at`; logits are computed
    /// only there.
    pub fn head_loss(&self, x: &Tensor, at: &[u32], want: &[u32]) -> Result<Tensor> {
        let h = self.rms(x, &self.final_norm)?;
        let h = h.index_select(&Tensor::new(at, &Device::Cpu)?, 0)?;
        let logits = self.output.forward(&h, self.weight_gradients)?;
        let max = logits.max_keepdim(1)?.detach();
        let z = logits.broadcast_sub(&max)?;
        let lse = z.exp()?.sum_keepdim(1)?.log()?;
        let want_t = Tensor::new(want, &Device::Cpu)?.unsqueeze(1)?;
        let picked = z.gather(&want_t, 1)?;
        Ok((lse - picked)?.mean_all()?)
    }

    /// Mean negative log-likelihood of the labelled tokens ([`DenseModel::targets`]), with
    /// the whole graph kept (small inputs; training goes through
    /// [`super::checkpointed`]). Returns the loss and the tokens it covers.
    pub fn loss(
        &self,
        ids: &[u32],
        labels: &[i64],
        lora: Option<&Lora>,
    ) -> Result<(Tensor, usize)> {
        let (at, want) = Self::targets(ids, labels)?;
        let mut x = self.embed(ids)?;
        for l in 0..self.layers.len() {
            x = self.layer(l, &x, lora)?;
        }
        Ok((self.head_loss(&x, &at, &want)?, at.len()))
    }
}
