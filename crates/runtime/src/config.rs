//! Architecture description read from GGUF metadata: one struct of flags that every
//! decoder variant is expressed in.

use crate::{Error, Result};
use candle_core::quantized::gguf_file::{Content, Value};

/// The decoder families this runtime implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama-style decoder (SmolLM2, Llama 2/3): interleaved rope in GGUF, no qkv bias.
    Llama,
    /// Qwen2 / Qwen2.5: NeoX rope, bias on q/k/v projections.
    Qwen2,
}

impl Architecture {
    /// Parses the `general.architecture` value.
    pub fn from_gguf_name(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            other => Err(Error::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// The GGUF metadata key prefix (`llama`, `qwen2`).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
        }
    }
}

/// How rotary embeddings pair the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): llama weights as stored in GGUF.
    Interleaved,
    /// Pairs (i, i + d/2): NeoX / Qwen.
    Neox,
}

/// Everything the decoder needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Decoder family.
    pub arch: Architecture,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Number of transformer blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when smaller than `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Longest position the model was trained for.
    pub context_length: usize,
    /// RMS-norm epsilon.
    pub rms_norm_eps: f64,
    /// Rope base frequency.
    pub rope_theta: f32,
    /// Rope pairing.
    pub rope_style: RopeStyle,
    /// Whether q/k/v projections carry a bias.
    pub qkv_bias: bool,
}

pub(crate) fn md<'a>(ct: &'a Content, key: &str) -> Result<&'a Value> {
    ct.metadata
        .get(key)
        .ok_or_else(|| Error::metadata(key, "not present"))
}

pub(crate) fn md_u32(ct: &Content, key: &str) -> Result<usize> {
    let v = md(ct, key)?;
    let n = match v {
        Value::U8(x) => *x as u64,
        Value::U16(x) => *x as u64,
        Value::U32(x) => *x as u64,
        Value::U64(x) => *x,
        Value::I8(x) if *x >= 0 => *x as u64,
        Value::I16(x) if *x >= 0 => *x as u64,
        Value::I32(x) if *x >= 0 => *x as u64,
        Value::I64(x) if *x >= 0 => *x as u64,
        other => {
            return Err(Error::metadata(
                key,
                format!("expected a count, got {other:?}"),
            ))
        }
    };
    Ok(n as usize)
}

fn md_f32(ct: &Content, key: &str) -> Result<f32> {
    match md(ct, key)? {
        Value::F32(x) => Ok(*x),
        Value::F64(x) => Ok(*x as f32),
        other => Err(Error::metadata(
            key,
            format!("expected a float, got {other:?}"),
        )),
    }
}

pub(crate) fn md_str<'a>(ct: &'a Content, key: &str) -> Result<&'a str> {
    match md(ct, key)? {
        Value::String(s) => Ok(s.as_str()),
        other => Err(Error::metadata(
            key,
            format!("expected a string, got {other:?}"),
        )),
    }
}

impl ModelConfig {
    /// Reads the configuration from GGUF metadata and tensor shapes.
    pub fn from_gguf(ct: &Content) -> Result<Self> {
        let arch = Architecture::from_gguf_name(md_str(ct, "general.architecture")?)?;
        let p = arch.gguf_name();
        let key = |k: &str| format!("{p}.{k}");
        let hidden_size = md_u32(ct, &key("embedding_length"))?;
        let num_heads = md_u32(ct, &key("attention.head_count"))?;
        let num_kv_heads = md_u32(ct, &key("attention.head_count_kv")).unwrap_or(num_heads);
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(Error::metadata(
                &key("attention.head_count_kv"),
                format!("{num_heads} query heads are not a multiple of {num_kv_heads} kv heads"),
            ));
        }
        if hidden_size % num_heads != 0 {
            return Err(Error::metadata(
                &key("attention.head_count"),
                format!("hidden size {hidden_size} is not divisible by {num_heads} heads"),
            ));
        }
        let head_dim = match md_u32(ct, &key("attention.key_length")) {
            Ok(d) => d,
            Err(_) => hidden_size / num_heads,
        };
        if let Ok(rope_dim) = md_u32(ct, &key("rope.dimension_count")) {
            if rope_dim != head_dim {
                return Err(Error::metadata(
                    &key("rope.dimension_count"),
                    format!("partial rotary ({rope_dim} of {head_dim} dims) is not supported"),
                ));
            }
        }
        let vocab_size = match ct.tensor_infos.get("token_embd.weight") {
            Some(info) => info.shape.dims()[0],
            None => return Err(Error::weight("token_embd.weight", "not present")),
        };
        let rope_style = match arch {
            Architecture::Llama => RopeStyle::Interleaved,
            Architecture::Qwen2 => RopeStyle::Neox,
        };
        Ok(Self {
            arch,
            hidden_size,
            num_layers: md_u32(ct, &key("block_count"))?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            context_length: md_u32(ct, &key("context_length")).unwrap_or(4096),
            rms_norm_eps: md_f32(ct, &key("attention.layer_norm_rms_epsilon"))? as f64,
            rope_theta: md_f32(ct, &key("rope.freq_base")).unwrap_or(10_000.0),
            rope_style,
            qkv_bias: ct.tensor_infos.contains_key("blk.0.attn_q.bias"),
        })
    }
}
