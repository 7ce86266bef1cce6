//! Tiny random-weight models, written on demand, for tests and benchmarks that must run
//! without downloading anything. One seeded set of weights (in Hugging Face conventions) is
//! written either as GGUF (q/k rows permuted for llama, gemma norms stored as 1 + w, matrices
//! quantized) or as a Hugging Face folder (config.json, safetensors, tokenizer.json,
//! tokenizer_config.json), so the two formats describe the same model. Both carry a real
//! byte-level BPE vocabulary, special tokens and a ChatML template.

use crate::adapter::{interleave_rope_rows, Adapter, LoraPair, MODULES};
use crate::config::Architecture;
pub use crate::rng::Rng;
use crate::tokenizer::byte_level_tokenizer_json;
use crate::weights::Param;
use crate::{Error, Result};
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The ChatML template written into tiny models (the same shape Qwen and SmolLM2 use).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Shape and weight type of a tiny model.
#[derive(Debug, Clone)]
pub struct TinyModel {
    /// Decoder family.
    pub arch: Architecture,
    /// Residual width (a multiple of 32, or of 256 for k-quants).
    pub hidden: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width (defaults to hidden / heads).
    pub head_dim: Option<usize>,
    /// MLP width.
    pub ffn: usize,
    /// Weight type of the projection matrices in GGUF.
    pub dtype: GgmlDType,
    /// Write a separate output matrix (otherwise the embedding is tied).
    pub untied_output: bool,
    /// Sliding window (gemma3 only).
    pub sliding_window: Option<usize>,
    /// Every n-th layer is global (gemma3 only).
    pub sliding_pattern: usize,
    /// dtype of the safetensors files (F32, F16 or BF16); weights are rounded through it for
    /// both formats.
    pub st_dtype: DType,
    /// Number of safetensors shards (1 = a single `model.safetensors`).
    pub shards: usize,
    /// Seed of the weights.
    pub seed: u64,
    /// Context length written to the metadata.
    pub context: usize,
}

impl TinyModel {
    /// A 2-layer model with grouped-query attention and Q8_0 weights.
    pub fn new(arch: Architecture) -> Self {
        let gemma = arch == Architecture::Gemma3;
        Self {
            arch,
            hidden: 64,
            layers: if gemma { 3 } else { 2 },
            heads: 4,
            kv_heads: 2,
            head_dim: None,
            ffn: 128,
            dtype: GgmlDType::Q8_0,
            untied_output: matches!(arch, Architecture::Llama),
            sliding_window: gemma.then_some(8),
            sliding_pattern: 3,
            st_dtype: DType::F32,
            shards: 1,
            seed: 7,
            context: 4096,
        }
    }

    fn hd(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden / self.heads)
    }
}

/// The byte-to-char table of byte-level BPE (GPT-2): printable bytes map to themselves.
pub fn byte_level_alphabet() -> Vec<char> {
    let printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut out = vec!['\0'; 256];
    for &b in &printable {
        out[b as usize] = char::from_u32(b).unwrap_or('?');
    }
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            out[b as usize] = char::from_u32(256 + extra).unwrap_or('?');
            extra += 1;
        }
    }
    out
}

/// Vocabulary of the tiny models: 256 byte tokens, a few merges, then special tokens.
pub fn tiny_vocab() -> (Vec<String>, Vec<String>, Vec<i32>) {
    let alphabet = byte_level_alphabet();
    let mut tokens: Vec<String> = alphabet.iter().map(|c| c.to_string()).collect();
    let sp = alphabet[b' ' as usize];
    let nl = alphabet[b'\n' as usize];
    let pairs: Vec<(String, String)> = vec![
        (sp.to_string(), "t".into()),
        ("h".into(), "e".into()),
        (format!("{sp}t"), "he".into()),
        ("i".into(), "n".into()),
        (sp.to_string(), "a".into()),
        ("e".into(), "r".into()),
        (nl.to_string(), nl.to_string()),
        ("o".into(), "n".into()),
    ];
    let mut merges = Vec::new();
    for (a, b) in pairs {
        merges.push(format!("{a} {b}"));
        tokens.push(format!("{a}{b}"));
    }
    let mut types = vec![1i32; tokens.len()];
    for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(s.to_string());
        types.push(3);
    }
    (tokens, merges, types)
}

fn pre_tokenizer(arch: Architecture) -> &'static str {
    match arch {
        Architecture::Qwen2 | Architecture::Qwen3 => "qwen2",
        Architecture::Llama => "smollm",
        Architecture::Gemma3 => "default",
    }
}

impl TinyModel {
    /// The weights in Hugging Face conventions; norm weights are the effective multipliers.
    fn weights(&self) -> Result<Vec<(Param, Tensor)>> {
        let (tokens, _, _) = tiny_vocab();
        let vocab = tokens.len();
        let hd = self.hd();
        let mut rng = Rng::new(self.seed);
        let mut out = Vec::new();
        let round =
            |t: Tensor| -> Result<Tensor> { Ok(t.to_dtype(self.st_dtype)?.to_dtype(DType::F32)?) };
        let mat = |rng: &mut Rng, rows: usize, cols: usize| {
            rng.tensor(&[rows, cols], 1.5 / (cols as f32).sqrt(), 0.0)
        };
        out.push((Param::Embed, rng.tensor(&[vocab, self.hidden], 1.0, 0.0)?));
        let gemma = self.arch == Architecture::Gemma3;
        let qk_norm = matches!(self.arch, Architecture::Qwen3 | Architecture::Gemma3);
        for i in 0..self.layers {
            out.push((Param::AttnNorm(i), rng.tensor(&[self.hidden], 0.2, 1.0)?));
            for (p, rows) in [
                (Param::Q(i), self.heads * hd),
                (Param::K(i), self.kv_heads * hd),
                (Param::V(i), self.kv_heads * hd),
            ] {
                out.push((p, mat(&mut rng, rows, self.hidden)?));
            }
            if self.arch == Architecture::Qwen2 {
                for (p, rows) in [
                    (Param::QBias(i), self.heads * hd),
                    (Param::KBias(i), self.kv_heads * hd),
                    (Param::VBias(i), self.kv_heads * hd),
                ] {
                    out.push((p, rng.tensor(&[rows], 0.5, 0.0)?));
                }
            }
            if qk_norm {
                out.push((Param::QNorm(i), rng.tensor(&[hd], 0.2, 1.0)?));
                out.push((Param::KNorm(i), rng.tensor(&[hd], 0.2, 1.0)?));
            }
            out.push((Param::O(i), mat(&mut rng, self.hidden, self.heads * hd)?));
            if gemma {
                out.push((
                    Param::PostAttnNorm(i),
                    rng.tensor(&[self.hidden], 0.2, 1.0)?,
                ));
            }
            out.push((Param::FfnNorm(i), rng.tensor(&[self.hidden], 0.2, 1.0)?));
            if gemma {
                out.push((Param::PostFfnNorm(i), rng.tensor(&[self.hidden], 0.2, 1.0)?));
            }
            out.push((Param::Gate(i), mat(&mut rng, self.ffn, self.hidden)?));
            out.push((Param::Up(i), mat(&mut rng, self.ffn, self.hidden)?));
            out.push((Param::Down(i), mat(&mut rng, self.hidden, self.ffn)?));
        }
        out.push((Param::FinalNorm, rng.tensor(&[self.hidden], 0.2, 1.0)?));
        if self.untied_output {
            out.push((Param::Output, mat(&mut rng, vocab, self.hidden)?));
        }
        out.into_iter()
            .map(|(p, t)| {
                // Gemma stores norms as w with multiplier 1 + w: round the stored form.
                let t = if gemma && p.is_norm() {
                    (round((t - 1.0)?)? + 1.0)?
                } else {
                    round(t)?
                };
                Ok((p, t))
            })
            .collect()
    }

    /// A random LoRA adapter of rank `r` on every projection, in Hugging Face row order,
    /// strong enough to move the logits well past quantization noise (no base checksum).
    pub fn random_adapter(&self, r: usize, seed: u64) -> Result<Adapter> {
        let hd = self.hd();
        let (h, q, kv, f) = (self.hidden, self.heads * hd, self.kv_heads * hd, self.ffn);
        let shapes = [
            ("q_proj", q, h),
            ("k_proj", kv, h),
            ("v_proj", kv, h),
            ("o_proj", h, q),
            ("gate_proj", f, h),
            ("up_proj", f, h),
            ("down_proj", h, f),
        ];
        let mut rng = Rng::new(seed);
        let mut pairs = BTreeMap::new();
        for layer in 0..self.layers {
            for (m, out, inp) in shapes {
                let a = rng.tensor(&[r, inp], 1.0 / (inp as f32).sqrt(), 0.0)?;
                let b = rng.tensor(&[out, r], 0.3, 0.0)?;
                pairs.insert((layer, m.to_string()), LoraPair { a, b });
            }
        }
        Ok(Adapter {
            r,
            alpha: 2.0 * r as f32,
            target_modules: MODULES.iter().map(|(m, _)| m.to_string()).collect(),
            base_name: format!("tiny-{:?}", self.arch).to_lowercase(),
            base_sha256: None,
            pairs,
        })
    }

    /// Writes the model to `path` as GGUF.
    pub fn write(&self, path: &Path) -> Result<()> {
        let (tokens, merges, types) = tiny_vocab();
        let p = self.arch.gguf_name();
        let hd = self.hd();
        let mut tensors: Vec<(String, QTensor)> = Vec::new();
        for (param, t) in self.weights()? {
            let t = match (self.arch, param) {
                (Architecture::Llama, Param::Q(_)) => {
                    interleave_rope_rows(&t, self.heads, hd, false)?
                }
                (Architecture::Llama, Param::K(_)) => {
                    interleave_rope_rows(&t, self.kv_heads, hd, false)?
                }
                _ => t,
            };
            let dtype = if t.rank() == 1 {
                GgmlDType::F32
            } else {
                self.dtype
            };
            tensors.push((param.gguf_name(), QTensor::quantize(&t, dtype)?));
        }
        let u = |x: usize| Value::U32(x as u32);
        let strs =
            |v: &[String]| Value::Array(v.iter().map(|s| Value::String(s.clone())).collect());
        let eos = tokens.iter().position(|t| t == "<|im_end|>").unwrap_or(0);
        let bos = tokens
            .iter()
            .position(|t| t == "<|endoftext|>")
            .unwrap_or(0);
        let mut md: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(p.into())),
            ("general.name".into(), Value::String(format!("tiny-{p}"))),
            (format!("{p}.embedding_length"), u(self.hidden)),
            (format!("{p}.block_count"), u(self.layers)),
            (format!("{p}.feed_forward_length"), u(self.ffn)),
            (format!("{p}.attention.head_count"), u(self.heads)),
            (format!("{p}.attention.head_count_kv"), u(self.kv_heads)),
            (format!("{p}.attention.key_length"), u(hd)),
            (format!("{p}.attention.value_length"), u(hd)),
            (format!("{p}.context_length"), u(self.context)),
            (format!("{p}.rope.dimension_count"), u(hd)),
            (format!("{p}.rope.freq_base"), Value::F32(10_000.0)),
            (
                format!("{p}.attention.layer_norm_rms_epsilon"),
                Value::F32(1e-6),
            ),
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            (
                "tokenizer.ggml.pre".into(),
                Value::String(pre_tokenizer(self.arch).into()),
            ),
            ("tokenizer.ggml.tokens".into(), strs(&tokens)),
            ("tokenizer.ggml.merges".into(), strs(&merges)),
            (
                "tokenizer.ggml.token_type".into(),
                Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
            ),
            ("tokenizer.ggml.eos_token_id".into(), u(eos)),
            ("tokenizer.ggml.bos_token_id".into(), u(bos)),
            ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
            (
                "tokenizer.chat_template".into(),
                Value::String(CHATML_TEMPLATE.into()),
            ),
        ];
        if let Some(w) = self.sliding_window {
            md.push((format!("{p}.attention.sliding_window"), u(w)));
            md.push((
                format!("{p}.attention.sliding_window_type"),
                u(self.sliding_pattern),
            ));
            md.push((format!("{p}.rope.local_freq_base"), Value::F32(1_000.0)));
        }
        let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let io = |e: std::io::Error| Error::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        gguf_file::write(&mut f, &md_refs, &t_refs)?;
        std::io::Write::flush(&mut f).map_err(io)?;
        Ok(())
    }

    /// The `config.json` of the Hugging Face form (keys for every family's loader).
    pub fn hf_config(&self) -> serde_json::Value {
        let (tokens, _, _) = tiny_vocab();
        let model_type = match self.arch {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma3 => "gemma3_text",
        };
        let eos = tokens.iter().position(|t| t == "<|im_end|>").unwrap_or(0);
        serde_json::json!({
            "model_type": model_type,
            "hidden_size": self.hidden,
            "intermediate_size": self.ffn,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.hd(),
            "vocab_size": tokens.len(),
            "max_position_embeddings": self.context,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "rope_local_base_freq": 1000.0,
            "tie_word_embeddings": !self.untied_output,
            "attention_bias": self.arch == Architecture::Qwen2,
            "hidden_act": "silu",
            "hidden_activation": "gelu_pytorch_tanh",
            "sliding_window": self.sliding_window.unwrap_or(4096),
            "sliding_window_pattern": self.sliding_pattern,
            "use_sliding_window": false,
            "max_window_layers": self.layers,
            "query_pre_attn_scalar": self.hd(),
            "final_logit_softcapping": null,
            "attn_logit_softcapping": null,
            "bos_token_id": 0,
            "eos_token_id": eos,
        })
    }

    /// Writes the Hugging Face form into `dir`: config.json, safetensors (sharded with an
    /// index when `shards > 1`), tokenizer.json and tokenizer_config.json.
    pub fn write_safetensors(&self, dir: &Path) -> Result<()> {
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |e: std::io::Error| Error::Io { path: p, source: e }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let gemma = self.arch == Architecture::Gemma3;
        let mut named: Vec<(String, Tensor)> = Vec::new();
        for (p, t) in self.weights()? {
            let t = if gemma && p.is_norm() { (t - 1.0)? } else { t };
            named.push((p.hf_name(self.arch), t.to_dtype(self.st_dtype)?));
        }
        let shards = self.shards.max(1);
        let per = named.len().div_ceil(shards);
        let mut weight_map = serde_json::Map::new();
        for (k, chunk) in named.chunks(per).enumerate() {
            let file = if shards == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{:05}.safetensors", k + 1, shards)
            };
            let map: HashMap<String, Tensor> = chunk.iter().cloned().collect();
            for name in map.keys() {
                weight_map.insert(name.clone(), serde_json::Value::String(file.clone()));
            }
            candle_core::safetensors::save(&map, dir.join(&file))?;
        }
        if shards > 1 {
            let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
            let p = dir.join("model.safetensors.index.json");
            std::fs::write(&p, index.to_string()).map_err(io(&p))?;
        }
        let p = dir.join("config.json");
        std::fs::write(&p, self.hf_config().to_string()).map_err(io(&p))?;
        let (tokens, merges, types) = tiny_vocab();
        let p = dir.join("tokenizer.json");
        std::fs::write(
            &p,
            byte_level_tokenizer_json(&tokens, &merges, &types, pre_tokenizer(self.arch))?,
        )
        .map_err(io(&p))?;
        let cfg = serde_json::json!({
            "chat_template": CHATML_TEMPLATE,
            "bos_token": "<|endoftext|>",
            "eos_token": "<|im_end|>",
        });
        let p = dir.join("tokenizer_config.json");
        std::fs::write(&p, cfg.to_string()).map_err(io(&p))?;
        Ok(())
    }
}
