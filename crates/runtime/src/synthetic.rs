//! Tiny random-weight GGUF models, written on demand, for tests and benchmarks that must
//! run without downloading anything. They carry a real byte-level BPE vocabulary, special
//! tokens and a ChatML template, so the whole loading path is exercised.

use crate::config::Architecture;
use crate::{Error, Result};
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use std::path::Path;

/// The ChatML template written into tiny models (the same shape Qwen and SmolLM2 use).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Shape and weight type of a tiny model.
#[derive(Debug, Clone)]
pub struct TinyModel {
    /// Decoder family (selects metadata keys, rope style and qkv bias).
    pub arch: Architecture,
    /// Residual width (a multiple of 32, or of 256 for k-quants).
    pub hidden: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// MLP width.
    pub ffn: usize,
    /// Weight type of the projection matrices.
    pub dtype: GgmlDType,
    /// Write a separate output matrix (otherwise the embedding is tied).
    pub untied_output: bool,
    /// Seed of the weights.
    pub seed: u64,
}

impl TinyModel {
    /// A 2-layer model with grouped-query attention and Q8_0 weights.
    pub fn new(arch: Architecture) -> Self {
        Self {
            arch,
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            ffn: 128,
            dtype: GgmlDType::Q8_0,
            untied_output: matches!(arch, Architecture::Llama),
            seed: 7,
        }
    }
}

/// The byte-to-char table of byte-level BPE (GPT-2): printable bytes map to themselves.
pub fn byte_level_alphabet() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
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
    printable.clear();
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

struct Rng(u64);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn tensor(&mut self, shape: &[usize], scale: f32, offset: f32) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| offset + scale * self.next_f32()).collect();
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
    }
}

impl TinyModel {
    /// Writes the model to `path` as GGUF.
    pub fn write(&self, path: &Path) -> Result<()> {
        let (tokens, merges, types) = tiny_vocab();
        let vocab = tokens.len();
        let p = self.arch.gguf_name();
        let hd = self.hidden / self.heads;
        let mut rng = Rng(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut tensors: Vec<(String, QTensor)> = Vec::new();
        let quant = |t: &Tensor, d: GgmlDType| QTensor::quantize(t, d).map_err(Error::from);
        let mat = |rng: &mut Rng, rows: usize, cols: usize| {
            rng.tensor(&[rows, cols], 1.5 / (cols as f32).sqrt(), 0.0)
        };
        let emb = rng.tensor(&[vocab, self.hidden], 1.0, 0.0)?;
        tensors.push(("token_embd.weight".into(), quant(&emb, self.dtype)?));
        for i in 0..self.layers {
            let b = format!("blk.{i}");
            let norm = rng.tensor(&[self.hidden], 0.2, 1.0)?;
            tensors.push((
                format!("{b}.attn_norm.weight"),
                quant(&norm, GgmlDType::F32)?,
            ));
            for (name, rows) in [
                ("attn_q", self.heads * hd),
                ("attn_k", self.kv_heads * hd),
                ("attn_v", self.kv_heads * hd),
            ] {
                let w = mat(&mut rng, rows, self.hidden)?;
                tensors.push((format!("{b}.{name}.weight"), quant(&w, self.dtype)?));
                if matches!(self.arch, Architecture::Qwen2) {
                    let bias = rng.tensor(&[rows], 0.5, 0.0)?;
                    tensors.push((format!("{b}.{name}.bias"), quant(&bias, GgmlDType::F32)?));
                }
            }
            let wo = mat(&mut rng, self.hidden, self.heads * hd)?;
            tensors.push((format!("{b}.attn_output.weight"), quant(&wo, self.dtype)?));
            let norm = rng.tensor(&[self.hidden], 0.2, 1.0)?;
            tensors.push((
                format!("{b}.ffn_norm.weight"),
                quant(&norm, GgmlDType::F32)?,
            ));
            for (name, rows, cols) in [
                ("ffn_gate", self.ffn, self.hidden),
                ("ffn_up", self.ffn, self.hidden),
                ("ffn_down", self.hidden, self.ffn),
            ] {
                let w = mat(&mut rng, rows, cols)?;
                tensors.push((format!("{b}.{name}.weight"), quant(&w, self.dtype)?));
            }
        }
        let norm = rng.tensor(&[self.hidden], 0.2, 1.0)?;
        tensors.push(("output_norm.weight".into(), quant(&norm, GgmlDType::F32)?));
        if self.untied_output {
            let w = mat(&mut rng, vocab, self.hidden)?;
            tensors.push(("output.weight".into(), quant(&w, self.dtype)?));
        }

        let u = |x: usize| Value::U32(x as u32);
        let strs =
            |v: &[String]| Value::Array(v.iter().map(|s| Value::String(s.clone())).collect());
        let eos = tokens.iter().position(|t| t == "<|im_end|>").unwrap_or(0);
        let bos = tokens
            .iter()
            .position(|t| t == "<|endoftext|>")
            .unwrap_or(0);
        let pre = match self.arch {
            Architecture::Qwen2 => "qwen2",
            Architecture::Llama => "smollm",
        };
        let md: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(p.into())),
            ("general.name".into(), Value::String(format!("tiny-{p}"))),
            (format!("{p}.embedding_length"), u(self.hidden)),
            (format!("{p}.block_count"), u(self.layers)),
            (format!("{p}.feed_forward_length"), u(self.ffn)),
            (format!("{p}.attention.head_count"), u(self.heads)),
            (format!("{p}.attention.head_count_kv"), u(self.kv_heads)),
            (format!("{p}.context_length"), u(4096)),
            (format!("{p}.rope.dimension_count"), u(hd)),
            (format!("{p}.rope.freq_base"), Value::F32(10_000.0)),
            (
                format!("{p}.attention.layer_norm_rms_epsilon"),
                Value::F32(1e-6),
            ),
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
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
}
