//! The decoder network for every supported architecture (flags in [`ModelConfig`]), and its
//! batched forward over a shared prefix.
//!
//! Attention is computed in two parts whose scores share one softmax: against the shared
//! prefix (one matmul for all rows and heads of a kv group, the prefix is never copied or
//! repeated per row) and against each row's own suffix (padded to the longest row).

mod activation;
mod adapt;
mod attention;
mod batched;
mod load;
mod numerics;
mod options;
mod positions;

use crate::cache::Sequence;
use crate::config::{Activation, ModelConfig, RopeStyle};
use crate::linear::{DenseDecision, Linear};
use crate::lookup::{Lookup, LookupMode};
pub use crate::pass::Pass;
use crate::profile::{span, Op};
use crate::weights::{GgufWeights, Param, SafetensorsWeights, Weight, WeightSource};
use crate::{Error, Result};
use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::QTensor;
use candle_core::{DType, Device, IndexOp, Tensor, D};
use load::{decide_dense, Loader};
pub use options::{LoadOptions, LogitsAt, Row};
use positions::rope_table;
use std::io::{Read, Seek};
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, Clone)]
struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(
            &x.contiguous()?,
            &self.weight,
            self.eps,
        )?)
    }
}

#[derive(Debug, Clone)]
struct Block {
    attn_norm: RmsNorm,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    wo: Linear,
    post_attn_norm: Option<RmsNorm>,
    ffn_norm: RmsNorm,
    post_ffn_norm: Option<RmsNorm>,
    gate: Linear,
    up: Linear,
    down: Linear,
    /// Index into the decoder's rope tables.
    rope: usize,
    sliding: bool,
}

#[derive(Debug, Clone)]
enum Embedding {
    Quant(Arc<QTensor>),
    Dense(Tensor),
}

impl Embedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Embedding::Quant(q) => q.embedding(ids)?,
            Embedding::Dense(t) => t.index_select(ids, 0)?,
        })
    }
}

#[derive(Debug, Clone)]
struct Rope {
    cos: Tensor,
    sin: Tensor,
}

/// A decoder-only transformer (llama, qwen2, qwen3, gemma3) with quantized or dense weights.
#[derive(Debug, Clone)]
pub struct Decoder {
    cfg: ModelConfig,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    ropes: Vec<Rope>,
    max_positions: usize,
    dense: DenseDecision,
    device: Device,
    lookup: Arc<Lookup>,
}

impl Decoder {
    /// Builds the decoder from a parsed GGUF file.
    pub fn from_gguf<R: Read + Seek>(
        ct: &Content,
        reader: &mut R,
        device: &Device,
        opts: LoadOptions,
    ) -> Result<Self> {
        let mut src = GgufWeights::new(ct, reader, device)?;
        Self::from_source(&mut src, device, opts)
    }

    /// Builds the decoder from a Hugging Face model folder (config.json + safetensors).
    pub fn from_safetensors(dir: &Path, device: &Device, opts: LoadOptions) -> Result<Self> {
        let mut src = SafetensorsWeights::open(dir, device)?;
        Self::from_source(&mut src, device, opts)
    }

    /// Builds the decoder from any weight source.
    pub fn from_source(
        src: &mut dyn WeightSource,
        device: &Device,
        opts: LoadOptions,
    ) -> Result<Self> {
        let cfg = src.config().clone();
        let (dense, decision) = decide_dense(src, &cfg, opts, device)?;
        let opts = LoadOptions { dense, ..opts };
        let mut g = Loader { src, opts };
        let h = cfg.hidden_size;
        let q_dim = cfg.num_heads * cfg.head_dim;
        let kv_dim = cfg.num_kv_heads * cfg.head_dim;
        let eps = cfg.rms_norm_eps;
        let embed_w = g.matrix(Param::Embed, cfg.vocab_size, h)?;
        let lm_head = match g.src.get(Param::Output)? {
            Some(_) => g.linear(Param::Output, None, cfg.vocab_size, h)?,
            // Tied embeddings: the output projection shares the embedding's storage.
            None => Linear::from_weight(embed_w.clone(), None, opts.dense, opts.kernels)?,
        };
        let embed = match embed_w {
            Weight::Quant(q) => Embedding::Quant(q),
            Weight::Dense(t) => Embedding::Dense(t),
        };
        let mut ropes = vec![rope_table(&cfg, cfg.rope_theta, cfg.rope_scale, device)?];
        if cfg.sliding_window.is_some() {
            ropes.push(rope_table(&cfg, cfg.rope_theta_local, 1.0, device)?);
        }
        let bias = |p: Param| cfg.qkv_bias.then_some(p);
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let ffn = cfg.intermediate_size;
            let sliding = cfg.is_sliding(i);
            blocks.push(Block {
                attn_norm: g.norm(Param::AttnNorm(i), h, eps)?,
                wq: g.linear(Param::Q(i), bias(Param::QBias(i)), q_dim, h)?,
                wk: g.linear(Param::K(i), bias(Param::KBias(i)), kv_dim, h)?,
                wv: g.linear(Param::V(i), bias(Param::VBias(i)), kv_dim, h)?,
                q_norm: match cfg.qk_norm {
                    true => Some(g.norm(Param::QNorm(i), cfg.head_dim, eps)?),
                    false => None,
                },
                k_norm: match cfg.qk_norm {
                    true => Some(g.norm(Param::KNorm(i), cfg.head_dim, eps)?),
                    false => None,
                },
                wo: g.linear(Param::O(i), None, h, q_dim)?,
                post_attn_norm: match cfg.post_norms {
                    true => Some(g.norm(Param::PostAttnNorm(i), h, eps)?),
                    false => None,
                },
                ffn_norm: g.norm(Param::FfnNorm(i), h, eps)?,
                post_ffn_norm: match cfg.post_norms {
                    true => Some(g.norm(Param::PostFfnNorm(i), h, eps)?),
                    false => None,
                },
                gate: g.linear(Param::Gate(i), None, ffn, h)?,
                up: g.linear(Param::Up(i), None, ffn, h)?,
                down: g.linear(Param::Down(i), None, h, ffn)?,
                rope: usize::from(sliding),
                sliding,
            });
            // Projections of one input in one matmul each (bitwise the same outputs).
            if let Some(blk) = blocks.last_mut() {
                Linear::stack(&mut [&mut blk.wq, &mut blk.wk, &mut blk.wv])?;
                Linear::stack(&mut [&mut blk.gate, &mut blk.up])?;
            }
        }
        let norm = g.norm(Param::FinalNorm, h, eps)?;
        let mut decoder = Self {
            max_positions: ropes[0].cos.dim(0)?,
            dense: decision,
            cfg,
            embed,
            blocks,
            norm,
            lm_head,
            ropes,
            device: device.clone(),
            lookup: Arc::new(Lookup::new(LookupMode::Off, false)),
        };
        decoder.lookup = Arc::new(Lookup::new(opts.lookup, decoder.batch_invariant()));
        Ok(decoder)
    }

    /// The same model with a fresh lookup in `mode` (weights shared).
    pub fn with_lookup(&self, mode: LookupMode) -> Self {
        Self {
            lookup: Arc::new(Lookup::new(mode, self.batch_invariant())),
            ..self.clone()
        }
    }

    /// This model's lookup: mode, cost model and counters.
    pub fn lookup(&self) -> &Lookup {
        &self.lookup
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Whether dense weight copies were kept, and the measurement behind an automatic choice.
    pub fn dense_decision(&self) -> &DenseDecision {
        &self.dense
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A new empty sequence for this model.
    pub fn new_sequence(&self) -> Sequence {
        Sequence::new(self.cfg.num_layers)
    }

    /// Bytes held by dense weight copies (0 unless dense copies were chosen).
    pub fn dense_bytes(&self) -> usize {
        let mut n = self.lm_head.dense_bytes();
        for b in &self.blocks {
            for l in [&b.wq, &b.wk, &b.wv, &b.wo, &b.gate, &b.up, &b.down] {
                n += l.dense_bytes();
            }
        }
        n
    }

    /// Runs `tokens` through the model from an empty state in chunks of at most `chunk`
    /// tokens and returns the resulting sequence (freeze it to share it as a prefix).
    pub fn prefill(&self, tokens: &[u32], chunk: usize) -> Result<Sequence> {
        let mut seq = self.new_sequence();
        self.extend(&mut seq, tokens, chunk)?;
        Ok(seq)
    }

    /// Appends `tokens` to `seq` in chunks, discarding logits.
    pub fn extend(&self, seq: &mut Sequence, tokens: &[u32], chunk: usize) -> Result<()> {
        for part in tokens.chunks(chunk.max(1)) {
            self.forward_pass(
                &mut [Row {
                    seq: &mut *seq,
                    tokens: part,
                }],
                LogitsAt::Last,
                Pass::Prefill,
            )?;
        }
        Ok(())
    }

    /// Batched forward, a [`Pass::Step`]. Each row's new tokens are appended to its
    /// sequence's cache; returns, per row, logits of shape (n, vocab) with n = 1 for
    /// [`LogitsAt::Last`], the row's new token count for [`LogitsAt::All`] or the row's index
    /// count for [`LogitsAt::At`]. Rows may have different suffix lengths, token counts and
    /// prefixes (rows are grouped by prefix internally).
    pub fn forward(&self, rows: &mut [Row<'_>], at: LogitsAt) -> Result<Vec<Tensor>> {
        self.forward_pass(rows, at, Pass::Step)
    }

    /// [`Decoder::forward`] as the given pass.
    pub fn forward_pass(
        &self,
        rows: &mut [Row<'_>],
        at: LogitsAt,
        pass: Pass,
    ) -> Result<Vec<Tensor>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        for (i, r) in rows.iter().enumerate() {
            if r.tokens.is_empty() {
                return Err(Error::InvalidRequest(format!("row {i} has no new tokens")));
            }
            if r.seq.num_layers() != self.cfg.num_layers {
                return Err(Error::InvalidRequest(format!(
                    "row {i}: sequence has {} layers, model has {}",
                    r.seq.num_layers(),
                    self.cfg.num_layers
                )));
            }
            let end = r.seq.len() + r.tokens.len();
            if end > self.max_positions {
                return Err(Error::InvalidRequest(format!(
                    "row {i}: {end} positions exceed the model's context of {}",
                    self.max_positions
                )));
            }
            if let Some(&bad) = r
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.cfg.vocab_size)
            {
                return Err(Error::InvalidRequest(format!(
                    "row {i}: token id {bad} is outside the vocabulary of {}",
                    self.cfg.vocab_size
                )));
            }
            r.seq.check_consistent()?;
        }
        if let LogitsAt::At(at) = &at {
            let bad = at.len() != rows.len()
                || rows
                    .iter()
                    .zip(at)
                    .any(|(r, ix)| ix.is_empty() || ix.iter().any(|&j| j >= r.tokens.len()));
            if bad {
                return Err(Error::InvalidRequest(
                    "logit positions must name 1 or more new tokens of every row".into(),
                ));
            }
        }
        // Group rows by the prefix they share.
        let mut groups: Vec<(Option<u64>, Vec<usize>)> = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            let key = r.seq.prefix().map(|p| p.id());
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(i),
                None => groups.push((key, vec![i])),
            }
        }
        let mut out: Vec<Option<Tensor>> = vec![None; rows.len()];
        for (_, idx) in groups {
            let mut sub: Vec<&mut Row<'_>> = Vec::with_capacity(idx.len());
            // Safe split of disjoint mutable borrows.
            let mut rest: &mut [Row<'_>] = rows;
            let mut base = 0;
            for &i in &idx {
                let (_, tail) = rest.split_at_mut(i - base);
                let (one, tail) = tail.split_at_mut(1);
                sub.push(&mut one[0]);
                rest = tail;
                base = i + 1;
            }
            let group_at = match &at {
                LogitsAt::At(all) => LogitsAt::At(idx.iter().map(|&i| all[i].clone()).collect()),
                other => other.clone(),
            };
            // CPU: run on a pool worker, so parallel ops start from its queue (no wake-ups).
            let res = if self.device.is_cpu() {
                rayon::scope(|_| self.forward_group(&mut sub, &group_at, pass))?
            } else {
                self.forward_group(&mut sub, &group_at, pass)?
            };
            for (i, t) in idx.into_iter().zip(res) {
                out[i] = Some(t);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    fn forward_group(
        &self,
        rows: &mut [&mut Row<'_>],
        at: &LogitsAt,
        pass: Pass,
    ) -> Result<Vec<Tensor>> {
        let cfg = &self.cfg;
        let dev = &self.device;
        let b = rows.len();
        let prefix = rows[0].seq.prefix().cloned();
        let lp = prefix.as_ref().map_or(0, |p| p.len());
        let n: Vec<usize> = rows.iter().map(|r| r.tokens.len()).collect();
        let s: Vec<usize> = rows.iter().map(|r| r.seq.suffix_len()).collect();
        let t = *n.iter().max().unwrap_or(&1);
        let kv_total = (0..b).map(|r| s[r] + n[r]).max().unwrap_or(1);

        let mut ids = Vec::with_capacity(b * t);
        let mut pos = Vec::with_capacity(b * t);
        for (r, row) in rows.iter().enumerate() {
            for i in 0..t {
                let j = i.min(n[r] - 1);
                ids.push(row.tokens[j]);
                pos.push((lp + s[r] + j) as u32);
            }
        }
        let ids = Tensor::from_vec(ids, b * t, dev)?;
        let pos = Tensor::from_vec(pos, b * t, dev)?;
        let half = cfg.head_dim / 2;
        let ropes = self
            .ropes
            .iter()
            .map(|r| -> Result<(Tensor, Tensor)> {
                Ok((
                    r.cos.index_select(&pos, 0)?.reshape((b, t, half))?,
                    r.sin.index_select(&pos, 0)?.reshape((b, t, half))?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        // Masks of the batched attention, made on its first use.
        let mut masks: Option<batched::Masks> = None;

        let mut x =
            span(Op::Embed, || self.embed.forward(&ids))?.reshape((b, t, cfg.hidden_size))?;
        if cfg.embed_scale != 1.0 {
            x = (x * cfg.embed_scale as f64)?;
        }
        let (hq, hkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let scale = cfg.attn_scale;
        for (li, blk) in self.blocks.iter().enumerate() {
            let h = span(Op::Norm, || blk.attn_norm.forward(&x))?;
            let mut qkv = span(Op::AttnProjection, || {
                Linear::forward_parts(&[&blk.wq, &blk.wk, &blk.wv], &h, pass)
            })?
            .into_iter();
            let (Some(q), Some(k), Some(v)) = (qkv.next(), qkv.next(), qkv.next()) else {
                return Err(Error::InvalidRequest("q/k/v projections missing".into()));
            };
            let mut q = q.reshape((b, t, hq, hd))?;
            let mut k = k.reshape((b, t, hkv, hd))?;
            let v = v.reshape((b, t, hkv, hd))?;
            if let (Some(qn), Some(kn)) = (&blk.q_norm, &blk.k_norm) {
                (q, k) = span(Op::Norm, || -> Result<_> {
                    Ok((qn.forward(&q)?, kn.forward(&k)?))
                })?;
            }
            let q = q.transpose(1, 2)?.contiguous()?;
            let k = k.transpose(1, 2)?.contiguous()?;
            let v = v.transpose(1, 2)?.contiguous()?;
            let (cos, sin) = &ropes[blk.rope];
            let (q, k) = span(Op::Rotary, || -> Result<_> {
                Ok(match cfg.rope_style {
                    RopeStyle::Neox => (
                        candle_nn::rotary_emb::rope(&q, cos, sin)?,
                        candle_nn::rotary_emb::rope(&k, cos, sin)?,
                    ),
                    RopeStyle::Interleaved => (
                        candle_nn::rotary_emb::rope_i(&q, cos, sin)?,
                        candle_nn::rotary_emb::rope_i(&k, cos, sin)?,
                    ),
                })
            })?;
            // Append the new keys/values to each row's suffix.
            span(Op::CacheAppend, || -> Result<()> {
                for (r, row) in rows.iter_mut().enumerate() {
                    let kr = k.i(r)?.narrow(1, 0, n[r])?;
                    let vr = v.i(r)?.narrow(1, 0, n[r])?;
                    row.seq.append_layer(li, kr, vr)?;
                }
                Ok(())
            })?;
            let window = if blk.sliding {
                cfg.sliding_window
            } else {
                None
            };
            let o = if pass == Pass::Step && dev.is_cpu() {
                let pkv = match &prefix {
                    Some(p) => Some(
                        p.layer(li)
                            .ok_or_else(|| Error::InvalidRequest("prefix layer missing".into()))?,
                    ),
                    None => None,
                };
                let mut kv_rows = Vec::with_capacity(b);
                for (r, row) in rows.iter().enumerate() {
                    let kv = row
                        .seq
                        .suffix_layer(li)
                        .ok_or_else(|| Error::InvalidRequest("suffix cache missing".into()))?;
                    kv_rows.push(attention::RowKv {
                        suffix: (&kv.k, &kv.v),
                        cached: s[r],
                        new: n[r],
                    });
                }
                let dims = attention::Dims {
                    heads: hq,
                    kv_heads: hkv,
                    head_dim: hd,
                    tokens: t,
                    prefix_len: lp,
                    scale: scale as f32,
                    window,
                };
                span(Op::Attention, || {
                    attention::attend(&q, pkv.map(|p| (&p.k, &p.v)), &kv_rows, &dims)
                })?
            } else {
                let masks = match &masks {
                    Some(m) => m,
                    None => masks.insert(batched::Masks::new(
                        lp,
                        &s,
                        &n,
                        (t, kv_total),
                        cfg.sliding_window,
                        dev,
                    )?),
                };
                let shape = batched::Shape {
                    b,
                    t,
                    kv_total,
                    heads: hq,
                    kv_heads: hkv,
                    head_dim: hd,
                    scale,
                };
                let rows: Vec<&mut Row<'_>> = rows.iter_mut().map(|r| &mut **r).collect();
                span(Op::Attention, || {
                    batched::attend(&q, &rows, li, prefix.as_ref(), masks, blk.sliding, &shape)
                })?
            };
            let mut attn = span(Op::AttnProjection, || blk.wo.forward_pass(&o, pass))?;
            if let Some(pn) = &blk.post_attn_norm {
                attn = span(Op::Norm, || pn.forward(&attn))?;
            }
            x = span(Op::Residual, || x + attn)?;
            let h = span(Op::Norm, || blk.ffn_norm.forward(&x))?;
            let mut gate_up = span(Op::FfnProjection, || {
                Linear::forward_parts(&[&blk.gate, &blk.up], &h, pass)
            })?
            .into_iter();
            let (Some(gate), Some(up)) = (gate_up.next(), gate_up.next()) else {
                return Err(Error::InvalidRequest("gate/up projections missing".into()));
            };
            let act = span(Op::Activation, || match cfg.activation {
                Activation::Silu => activation::silu_times(&gate, &up),
                Activation::GeluTanh => Ok((gate.gelu()? * up)?),
            })?;
            let mut m = span(Op::FfnProjection, || blk.down.forward_pass(&act, pass))?;
            if let Some(pn) = &blk.post_ffn_norm {
                m = span(Op::Norm, || pn.forward(&m))?;
            }
            x = span(Op::Residual, || x + m)?;
        }
        for row in rows.iter_mut() {
            row.seq.push_tokens(row.tokens);
        }
        let x = span(Op::Norm, || self.norm.forward(&x))?.reshape((b * t, cfg.hidden_size))?;
        let mut pick = Vec::new();
        let mut counts = Vec::with_capacity(b);
        for r in 0..b {
            match at {
                LogitsAt::Last => {
                    pick.push((r * t + n[r] - 1) as u32);
                    counts.push(1);
                }
                LogitsAt::All => {
                    pick.extend((0..n[r]).map(|i| (r * t + i) as u32));
                    counts.push(n[r]);
                }
                LogitsAt::At(ix) => {
                    pick.extend(ix[r].iter().map(|&i| (r * t + i) as u32));
                    counts.push(ix[r].len());
                }
            }
        }
        let npick = pick.len();
        let pick = Tensor::from_vec(pick, npick, dev)?;
        let logits = span(Op::Logits, || -> Result<_> {
            Ok(self
                .lm_head
                .forward_pass(&x.index_select(&pick, 0)?, pass)?
                .to_dtype(DType::F32)?)
        })?;
        let mut out = Vec::with_capacity(b);
        let mut at_row = 0;
        for c in counts {
            out.push(logits.narrow(0, at_row, c)?);
            at_row += c;
        }
        Ok(out)
    }
}

/// Index of the largest logit of a (vocab,) or (1, vocab) tensor.
pub fn argmax(logits: &Tensor) -> Result<u32> {
    Ok(logits
        .flatten_all()?
        .argmax(D::Minus1)?
        .to_scalar::<u32>()?)
}
