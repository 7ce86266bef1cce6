//! Architecture description: one struct of flags that every decoder variant is expressed in,
//! read from GGUF metadata or from a Hugging Face `config.json`.

use crate::{Error, Result};
use candle_core::quantized::gguf_file::{Content, Value};

/// The decoder families this runtime implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama-style decoder (SmolLM2, Llama 2/3).
    Llama,
    /// Qwen2 / Qwen2.5: bias on q/k/v projections.
    Qwen2,
    /// Qwen3: per-head RMS-norm on queries and keys, no qkv bias.
    Qwen3,
    /// Gemma 3: scaled embeddings, sandwich norms, GELU, sliding-window and global layers.
    Gemma3,
}

impl Architecture {
    /// Parses a GGUF `general.architecture` or a `config.json` `model_type`.
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            "gemma3" | "gemma3_text" => Ok(Self::Gemma3),
            other => Err(Error::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// The GGUF metadata key prefix.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Gemma3 => "gemma3",
        }
    }
}

/// How rotary embeddings pair the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): llama weights as permuted by the GGUF converter.
    Interleaved,
    /// Pairs (i, i + d/2): NeoX / Hugging Face layout.
    Neox,
}

/// MLP gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (llama, qwen).
    Silu,
    /// GELU, tanh approximation (gemma).
    GeluTanh,
}

/// Everything the decoder needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Decoder family.
    pub arch: Architecture,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
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
    /// Rope base frequency (global layers).
    pub rope_theta: f32,
    /// Rope base frequency of sliding-window layers.
    pub rope_theta_local: f32,
    /// Linear rope scaling of global layers (positions are divided by it; 1 = none).
    pub rope_scale: f32,
    /// Rope pairing.
    pub rope_style: RopeStyle,
    /// Whether q/k/v projections carry a bias.
    pub qkv_bias: bool,
    /// Per-head RMS-norm of queries and keys before rope.
    pub qk_norm: bool,
    /// Extra norms after attention and after the MLP (gemma's sandwich norms).
    pub post_norms: bool,
    /// MLP activation.
    pub activation: Activation,
    /// Factor applied to token embeddings (gemma: sqrt(hidden); else 1).
    pub embed_scale: f32,
    /// Factor applied to attention scores (1/sqrt(head_dim) unless the model says otherwise).
    pub attn_scale: f64,
    /// Sliding-window width: a query sees keys at most `window - 1` positions back.
    pub sliding_window: Option<usize>,
    /// Every `sliding_pattern`-th layer (1-based) is global, the others slide.
    pub sliding_pattern: usize,
}

impl ModelConfig {
    /// Whether layer `i` uses the sliding window.
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.sliding_window.is_some()
            && self.sliding_pattern > 0
            && (layer + 1) % self.sliding_pattern != 0
    }

    fn defaults(arch: Architecture) -> (RopeStyle, bool, bool, bool, Activation) {
        // (rope style for GGUF, qkv bias, qk norm, post norms, activation)
        match arch {
            Architecture::Llama => (
                RopeStyle::Interleaved,
                false,
                false,
                false,
                Activation::Silu,
            ),
            Architecture::Qwen2 => (RopeStyle::Neox, true, false, false, Activation::Silu),
            Architecture::Qwen3 => (RopeStyle::Neox, false, true, false, Activation::Silu),
            Architecture::Gemma3 => (RopeStyle::Neox, false, true, true, Activation::GeluTanh),
        }
    }

    fn validate(self) -> Result<Self> {
        let key = |k: &str| format!("{}.{k}", self.arch.gguf_name());
        if self.num_heads == 0 || self.num_kv_heads == 0 || self.num_heads % self.num_kv_heads != 0
        {
            return Err(Error::metadata(
                &key("attention.head_count_kv"),
                format!(
                    "{} query heads are not a multiple of {} kv heads",
                    self.num_heads, self.num_kv_heads
                ),
            ));
        }
        if self.head_dim == 0 || self.head_dim % 2 != 0 {
            return Err(Error::metadata(
                &key("attention.key_length"),
                format!("head dim {} must be even and non-zero", self.head_dim),
            ));
        }
        if self.num_layers == 0 || self.hidden_size == 0 {
            return Err(Error::metadata(&key("block_count"), "model has no layers"));
        }
        Ok(self)
    }

    /// Reads the configuration from GGUF metadata and tensor shapes.
    pub fn from_gguf(ct: &Content) -> Result<Self> {
        let arch = Architecture::from_name(md_str(ct, "general.architecture")?)?;
        let p = arch.gguf_name();
        let key = |k: &str| format!("{p}.{k}");
        let hidden_size = md_u32(ct, &key("embedding_length"))?;
        let num_heads = md_u32(ct, &key("attention.head_count"))?;
        let num_kv_heads = md_u32(ct, &key("attention.head_count_kv")).unwrap_or(num_heads);
        if num_heads == 0 {
            return Err(Error::metadata(&key("attention.head_count"), "zero heads"));
        }
        let head_dim = md_u32(ct, &key("attention.key_length")).unwrap_or(hidden_size / num_heads);
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
        let intermediate_size = match ct.tensor_infos.get("blk.0.ffn_up.weight") {
            Some(info) => info.shape.dims()[0],
            None => return Err(Error::weight("blk.0.ffn_up.weight", "not present")),
        };
        let (rope_style, _, qk_norm, post_norms, activation) = Self::defaults(arch);
        let gemma = arch == Architecture::Gemma3;
        let rope_theta = md_f32(ct, &key("rope.freq_base")).unwrap_or(if gemma {
            1_000_000.0
        } else {
            10_000.0
        });
        Self {
            arch,
            hidden_size,
            intermediate_size,
            num_layers: md_u32(ct, &key("block_count"))?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            context_length: md_u32(ct, &key("context_length")).unwrap_or(4096),
            rms_norm_eps: md_f32(ct, &key("attention.layer_norm_rms_epsilon"))? as f64,
            rope_theta,
            rope_theta_local: md_f32(ct, &key("rope.local_freq_base")).unwrap_or(if gemma {
                10_000.0
            } else {
                rope_theta
            }),
            rope_scale: md_f32(ct, &key("rope.scaling.factor")).unwrap_or(1.0),
            rope_style,
            qkv_bias: ct.tensor_infos.contains_key("blk.0.attn_q.bias"),
            qk_norm,
            post_norms,
            activation,
            embed_scale: embed_scale(arch, hidden_size),
            attn_scale: 1.0 / (head_dim as f64).sqrt(),
            sliding_window: if gemma {
                md_u32(ct, &key("attention.sliding_window")).ok()
            } else {
                None
            },
            sliding_pattern: md_u32(ct, &key("attention.sliding_window_type")).unwrap_or(6),
        }
        .validate()
    }

    /// Reads a Hugging Face `config.json` (multimodal Gemma 3 configs use `text_config`).
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let root: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::metadata("config.json", e))?;
        let v = match root.get("text_config") {
            Some(t) if t.is_object() => t,
            _ => &root,
        };
        let model_type = v["model_type"]
            .as_str()
            .or_else(|| root["model_type"].as_str())
            .ok_or_else(|| Error::metadata("config.json: model_type", "not present"))?;
        let arch = Architecture::from_name(model_type)?;
        let num = |k: &str| -> Result<usize> {
            v[k].as_u64().map(|x| x as usize).ok_or_else(|| {
                Error::metadata(&format!("config.json: {k}"), "missing or not a number")
            })
        };
        let float = |k: &str, d: f64| v[k].as_f64().unwrap_or(d);
        let (_, qkv_bias, qk_norm, post_norms, activation) = Self::defaults(arch);
        let gemma = arch == Architecture::Gemma3;
        let hidden_size = num("hidden_size")?;
        let num_heads = num("num_attention_heads")?;
        if num_heads == 0 {
            return Err(Error::metadata(
                "config.json: num_attention_heads",
                "zero heads",
            ));
        }
        let head_dim = num("head_dim").unwrap_or(hidden_size / num_heads);
        let scaling = &v["rope_scaling"];
        let rope_scale = match scaling["rope_type"].as_str().or(scaling["type"].as_str()) {
            None => 1.0,
            Some("linear") => scaling["factor"].as_f64().unwrap_or(1.0) as f32,
            Some("default") => 1.0,
            Some(other) => {
                return Err(Error::metadata(
                    "config.json: rope_scaling",
                    format!("rope scaling `{other}` is not supported"),
                ))
            }
        };
        let pre_attn = v["query_pre_attn_scalar"]
            .as_f64()
            .unwrap_or(head_dim as f64);
        Self {
            arch,
            hidden_size,
            intermediate_size: num("intermediate_size")?,
            num_layers: num("num_hidden_layers")?,
            num_heads,
            num_kv_heads: num("num_key_value_heads").unwrap_or(num_heads),
            head_dim,
            vocab_size: num("vocab_size")?,
            context_length: num("max_position_embeddings").unwrap_or(4096),
            rms_norm_eps: float("rms_norm_eps", 1e-6),
            rope_theta: float("rope_theta", if gemma { 1_000_000.0 } else { 10_000.0 }) as f32,
            rope_theta_local: float("rope_local_base_freq", 10_000.0) as f32,
            rope_scale,
            // Hugging Face checkpoints keep q/k rows in rotate-half order for every family.
            rope_style: RopeStyle::Neox,
            qkv_bias: v["attention_bias"].as_bool().unwrap_or(qkv_bias),
            qk_norm,
            post_norms,
            activation,
            embed_scale: embed_scale(arch, hidden_size),
            attn_scale: 1.0 / pre_attn.sqrt(),
            sliding_window: if gemma {
                num("sliding_window").ok()
            } else {
                None
            },
            sliding_pattern: num("sliding_window_pattern").unwrap_or(6),
        }
        .validate()
    }
}

/// Gemma multiplies token embeddings by sqrt(hidden); the others by 1.
fn embed_scale(arch: Architecture, hidden: usize) -> f32 {
    match arch {
        Architecture::Gemma3 => (hidden as f32).sqrt(),
        _ => 1.0,
    }
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
