//! The decoder network for every supported architecture (flags in [`ModelConfig`]), and its
//! batched forward over a shared prefix.
//!
//! Attention is computed in two parts whose scores share one softmax: against the shared
//! prefix (one matmul for all rows and heads of a kv group, the prefix is never copied or
//! repeated per row) and against each row's own suffix (padded to the longest row).

use crate::cache::{LayerKv, Sequence};
use crate::config::{ModelConfig, RopeStyle};
use crate::linear::{convert_slow, dense_f32, DenseMode, Linear};
use crate::{Error, Result};
use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::QTensor;
use candle_core::{DType, Device, IndexOp, Tensor, D};
use std::io::{Read, Seek};
use std::sync::Arc;

/// How weights are prepared at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Requantize quant types without a fast kernel (Q4_1, Q5_x, Q8_1) to Q8_0.
    pub convert_slow_quants: bool,
    /// Whether to keep dense copies of the projection weights for long forwards.
    pub dense: DenseMode,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            convert_slow_quants: true,
            dense: DenseMode::Off,
        }
    }
}

/// Which positions of each row the forward returns logits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsAt {
    /// The last new token of each row: one distribution per row.
    Last,
    /// Every new token of each row.
    All,
}

/// One row of a batched forward: a sequence and the new tokens to append to it.
#[derive(Debug)]
pub struct Row<'a> {
    /// The sequence; its cache is extended by `tokens`.
    pub seq: &'a mut Sequence,
    /// New tokens (at least one).
    pub tokens: &'a [u32],
}

#[derive(Debug, Clone)]
struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(x, &self.weight, self.eps)?)
    }
}

#[derive(Debug, Clone)]
struct Block {
    attn_norm: RmsNorm,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    ffn_norm: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// A decoder-only transformer with quantized weights.
#[derive(Debug, Clone)]
pub struct Decoder {
    cfg: ModelConfig,
    embed: Arc<QTensor>,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
    device: Device,
}

struct GgufReader<'a, R> {
    ct: &'a Content,
    r: &'a mut R,
    device: &'a Device,
    opts: LoadOptions,
}

impl<R: Read + Seek> GgufReader<'_, R> {
    fn qtensor(&mut self, name: &str) -> Result<QTensor> {
        if !self.ct.tensor_infos.contains_key(name) {
            return Err(Error::weight(name, "not present in the file"));
        }
        self.ct
            .tensor(self.r, name, self.device)
            .map_err(|e| Error::weight(name, e))
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Arc<QTensor>> {
        let q = self.qtensor(name)?;
        if q.shape().dims() != [rows, cols] {
            return Err(Error::weight(
                name,
                format!("shape {:?}, expected [{rows}, {cols}]", q.shape().dims()),
            ));
        }
        let q = if self.opts.convert_slow_quants {
            convert_slow(q)?
        } else {
            q
        };
        Ok(Arc::new(q))
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Tensor> {
        let q = self.qtensor(name)?;
        if q.shape().elem_count() != len {
            return Err(Error::weight(
                name,
                format!("shape {:?}, expected [{len}]", q.shape().dims()),
            ));
        }
        dense_f32(&q)?.reshape(len).map_err(Into::into)
    }

    fn linear(&mut self, name: &str, rows: usize, cols: usize, bias: bool) -> Result<Linear> {
        let w = self.matrix(&format!("{name}.weight"), rows, cols)?;
        let b = if bias {
            Some(self.vector(&format!("{name}.bias"), rows)?)
        } else {
            None
        };
        Linear::new(w, b, self.opts.dense)
    }

    fn norm(&mut self, name: &str, len: usize, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: self.vector(name, len)?,
            eps: eps as f32,
        })
    }
}

impl Decoder {
    /// Builds the decoder from a parsed GGUF file.
    pub fn from_gguf<R: Read + Seek>(
        ct: &Content,
        reader: &mut R,
        device: &Device,
        opts: LoadOptions,
    ) -> Result<Self> {
        let cfg = ModelConfig::from_gguf(ct)?;
        let mut g = GgufReader {
            ct,
            r: reader,
            device,
            opts,
        };
        let h = cfg.hidden_size;
        let q_dim = cfg.num_heads * cfg.head_dim;
        let kv_dim = cfg.num_kv_heads * cfg.head_dim;
        let embed = g.qtensor("token_embd.weight")?;
        if embed.shape().dims() != [cfg.vocab_size, h] {
            return Err(Error::weight(
                "token_embd.weight",
                format!("shape {:?}, expected [vocab, {h}]", embed.shape().dims()),
            ));
        }
        let embed = Arc::new(if opts.convert_slow_quants {
            convert_slow(embed)?
        } else {
            embed
        });
        let lm_head = if ct.tensor_infos.contains_key("output.weight") {
            g.linear("output", cfg.vocab_size, h, false)?
        } else {
            // Tied embeddings: the output projection shares the embedding's storage.
            Linear::new(embed.clone(), None, opts.dense)?
        };
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = format!("blk.{i}");
            let ffn = g.qtensor(&format!("{p}.ffn_up.weight"))?.shape().dims()[0];
            blocks.push(Block {
                attn_norm: g.norm(&format!("{p}.attn_norm.weight"), h, cfg.rms_norm_eps)?,
                wq: g.linear(&format!("{p}.attn_q"), q_dim, h, cfg.qkv_bias)?,
                wk: g.linear(&format!("{p}.attn_k"), kv_dim, h, cfg.qkv_bias)?,
                wv: g.linear(&format!("{p}.attn_v"), kv_dim, h, cfg.qkv_bias)?,
                wo: g.linear(&format!("{p}.attn_output"), h, q_dim, false)?,
                ffn_norm: g.norm(&format!("{p}.ffn_norm.weight"), h, cfg.rms_norm_eps)?,
                gate: g.linear(&format!("{p}.ffn_gate"), ffn, h, false)?,
                up: g.linear(&format!("{p}.ffn_up"), ffn, h, false)?,
                down: g.linear(&format!("{p}.ffn_down"), h, ffn, false)?,
            });
        }
        let norm = g.norm("output_norm.weight", h, cfg.rms_norm_eps)?;
        let (cos, sin) = rope_tables(&cfg, device)?;
        Ok(Self {
            cfg,
            embed,
            blocks,
            norm,
            lm_head,
            cos,
            sin,
            device: device.clone(),
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A new empty sequence for this model.
    pub fn new_sequence(&self) -> Sequence {
        Sequence::new(self.cfg.num_layers)
    }

    /// Bytes held by dense weight copies (0 unless [`DenseMode::On`]).
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
            self.forward(
                &mut [Row {
                    seq: &mut *seq,
                    tokens: part,
                }],
                LogitsAt::Last,
            )?;
        }
        Ok(())
    }

    /// Batched forward. Each row's new tokens are appended to its sequence's cache; returns,
    /// per row, logits of shape (n, vocab) with n = 1 for [`LogitsAt::Last`] or the row's new
    /// token count for [`LogitsAt::All`]. Rows may have different suffix lengths, token
    /// counts and prefixes (rows are grouped by prefix internally).
    pub fn forward(&self, rows: &mut [Row<'_>], at: LogitsAt) -> Result<Vec<Tensor>> {
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
            if end > self.cos.dim(0)? {
                return Err(Error::InvalidRequest(format!(
                    "row {i}: {end} positions exceed the model's context of {}",
                    self.cos.dim(0)?
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
            let res = self.forward_group(&mut sub, at)?;
            for (i, t) in idx.into_iter().zip(res) {
                out[i] = Some(t);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    fn forward_group(&self, rows: &mut [&mut Row<'_>], at: LogitsAt) -> Result<Vec<Tensor>> {
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
        let cos = self.cos.index_select(&pos, 0)?.reshape((b, t, half))?;
        let sin = self.sin.index_select(&pos, 0)?.reshape((b, t, half))?;
        let mask = suffix_mask(&s, &n, t, kv_total, dev)?;

        let mut x = self
            .embed
            .embedding(&ids)?
            .reshape((b, t, cfg.hidden_size))?;
        let (hq, hkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let g = hq / hkv;
        let scale = 1.0 / (hd as f64).sqrt();
        for (li, blk) in self.blocks.iter().enumerate() {
            let h = blk.attn_norm.forward(&x)?;
            let q = blk.wq.forward(&h)?;
            let k = blk.wk.forward(&h)?;
            let v = blk.wv.forward(&h)?;
            let q = q.reshape((b, t, hq, hd))?.transpose(1, 2)?.contiguous()?;
            let k = k.reshape((b, t, hkv, hd))?.transpose(1, 2)?.contiguous()?;
            let v = v.reshape((b, t, hkv, hd))?.transpose(1, 2)?.contiguous()?;
            let (q, k) = match cfg.rope_style {
                RopeStyle::Neox => (
                    candle_nn::rotary_emb::rope(&q, &cos, &sin)?,
                    candle_nn::rotary_emb::rope(&k, &cos, &sin)?,
                ),
                RopeStyle::Interleaved => (
                    candle_nn::rotary_emb::rope_i(&q, &cos, &sin)?,
                    candle_nn::rotary_emb::rope_i(&k, &cos, &sin)?,
                ),
            };
            // Append the new keys/values to each row's suffix, then gather the padded
            // suffix block in kv-head-major layout (hkv, b, kv_total, hd).
            let mut ks = Vec::with_capacity(b);
            let mut vs = Vec::with_capacity(b);
            for (r, row) in rows.iter_mut().enumerate() {
                let kr = k.i(r)?.narrow(1, 0, n[r])?;
                let vr = v.i(r)?.narrow(1, 0, n[r])?;
                row.seq.append_layer(li, kr, vr)?;
                let kv: &LayerKv = row
                    .seq
                    .suffix_layer(li)
                    .ok_or_else(|| Error::InvalidRequest("suffix cache missing".into()))?;
                ks.push(pad_len(&kv.k, kv_total)?);
                vs.push(pad_len(&kv.v, kv_total)?);
            }
            let ks = Tensor::stack(&ks, 1)?;
            let vs = Tensor::stack(&vs, 1)?;
            // Queries grouped by kv head: (hkv, b, g*t, hd). Every large tensor below is
            // produced contiguous in this layout, so no score matrix is ever transposed.
            let qh = q
                .reshape((b, hkv, g * t, hd))?
                .transpose(0, 1)?
                .contiguous()?;
            let ss = (qh.matmul(&ks.t()?)? * scale)?
                .reshape((hkv, b, g, t, kv_total))?
                .broadcast_add(&mask)?
                .reshape((hkv, b * g * t, kv_total))?;
            let o = match &prefix {
                Some(p) if lp > 0 => {
                    let pkv = p
                        .layer(li)
                        .ok_or_else(|| Error::InvalidRequest("prefix layer missing".into()))?;
                    // One matmul per kv head covers every row: the prefix is read in place.
                    let qp = qh.reshape((hkv, b * g * t, hd))?;
                    let sp = (qp.matmul(&pkv.k.t()?)? * scale)?;
                    let all = Tensor::cat(&[&sp, &ss], 2)?;
                    let probs = candle_nn::ops::softmax_last_dim(&all)?;
                    let op = probs.narrow(2, 0, lp)?.matmul(&pkv.v)?;
                    let ps = probs.narrow(2, lp, kv_total)?.contiguous()?.reshape((
                        hkv,
                        b,
                        g * t,
                        kv_total,
                    ))?;
                    (op.reshape((hkv, b, g * t, hd))? + ps.matmul(&vs)?)?
                }
                _ => candle_nn::ops::softmax_last_dim(&ss)?
                    .reshape((hkv, b, g * t, kv_total))?
                    .matmul(&vs)?,
            };
            // (hkv, b, g, t, hd) -> (b, t, hkv, g, hd) -> (b, t, hq*hd)
            let o = o
                .reshape((hkv, b, g, t, hd))?
                .permute((1, 3, 0, 2, 4))?
                .contiguous()?
                .reshape((b, t, hq * hd))?;
            x = (x + blk.wo.forward(&o)?)?;
            let h = blk.ffn_norm.forward(&x)?;
            let gate = candle_nn::ops::silu(&blk.gate.forward(&h)?)?;
            let up = blk.up.forward(&h)?;
            x = (x + blk.down.forward(&(gate * up)?)?)?;
        }
        for row in rows.iter_mut() {
            row.seq.push_tokens(row.tokens);
        }
        let x = self.norm.forward(&x)?.reshape((b * t, cfg.hidden_size))?;
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
            }
        }
        let npick = pick.len();
        let pick = Tensor::from_vec(pick, npick, dev)?;
        let logits = self
            .lm_head
            .forward(&x.index_select(&pick, 0)?)?
            .to_dtype(DType::F32)?;
        let mut out = Vec::with_capacity(b);
        let mut at_row = 0;
        for c in counts {
            out.push(logits.narrow(0, at_row, c)?);
            at_row += c;
        }
        Ok(out)
    }
}

/// Pads (hkv, len, hd) with zeros along positions to `to`.
fn pad_len(x: &Tensor, to: usize) -> Result<Tensor> {
    let len = x.dim(1)?;
    if len == to {
        return Ok(x.contiguous()?);
    }
    let (h, _, d) = x.dims3()?;
    let z = Tensor::zeros((h, to - len, d), x.dtype(), x.device())?;
    Ok(Tensor::cat(&[x, &z], 1)?)
}

/// Additive mask (1, b, 1, t, kv_total) over the suffix keys: query i of row r (at suffix
/// position s_r + i) sees suffix keys 0..=s_r+i; padded queries see all real keys.
fn suffix_mask(
    s: &[usize],
    n: &[usize],
    t: usize,
    kv_total: usize,
    dev: &Device,
) -> Result<Tensor> {
    let b = s.len();
    let mut m = vec![0f32; b * t * kv_total];
    for r in 0..b {
        for i in 0..t {
            let visible = s[r] + i.min(n[r] - 1) + 1;
            for j in visible..kv_total {
                m[(r * t + i) * kv_total + j] = f32::NEG_INFINITY;
            }
        }
    }
    Ok(Tensor::from_vec(m, (1, b, 1, t, kv_total), dev)?)
}

fn rope_tables(cfg: &ModelConfig, dev: &Device) -> Result<(Tensor, Tensor)> {
    let max_pos = cfg.context_length.clamp(1, 1 << 17);
    let half = cfg.head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1f32 / cfg.rope_theta.powf((2 * i) as f32 / cfg.head_dim as f32))
        .collect();
    let inv = Tensor::from_vec(inv, (1, half), dev)?;
    let p = Tensor::arange(0u32, max_pos as u32, dev)?
        .to_dtype(DType::F32)?
        .reshape((max_pos, 1))?;
    let f = p.matmul(&inv)?;
    Ok((f.cos()?.contiguous()?, f.sin()?.contiguous()?))
}

/// Index of the largest logit of a (vocab,) or (1, vocab) tensor.
pub fn argmax(logits: &Tensor) -> Result<u32> {
    Ok(logits
        .flatten_all()?
        .argmax(D::Minus1)?
        .to_scalar::<u32>()?)
}
