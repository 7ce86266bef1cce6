//! Where weights come from: GGUF files (quantized) or Hugging Face safetensors (dense,
//! possibly sharded). Both are read through [`WeightSource`] by logical parameter, so the
//! decoder is built by one code path whatever the format.

use crate::config::{Architecture, ModelConfig};
use crate::{Error, Result};
use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One logical parameter of a decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// Token embedding (vocab, hidden).
    Embed,
    /// Output projection (vocab, hidden); absent when tied to the embedding.
    Output,
    /// Final norm.
    FinalNorm,
    /// Norm before attention.
    AttnNorm(usize),
    /// Query projection.
    Q(usize),
    /// Key projection.
    K(usize),
    /// Value projection.
    V(usize),
    /// Query bias.
    QBias(usize),
    /// Key bias.
    KBias(usize),
    /// Value bias.
    VBias(usize),
    /// Per-head query norm.
    QNorm(usize),
    /// Per-head key norm.
    KNorm(usize),
    /// Attention output projection.
    O(usize),
    /// Norm after attention (sandwich norms).
    PostAttnNorm(usize),
    /// Norm before the MLP.
    FfnNorm(usize),
    /// Norm after the MLP (sandwich norms).
    PostFfnNorm(usize),
    /// MLP gate projection.
    Gate(usize),
    /// MLP up projection.
    Up(usize),
    /// MLP down projection.
    Down(usize),
}

impl Param {
    /// Whether this parameter is an RMS-norm weight.
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            Param::FinalNorm
                | Param::AttnNorm(_)
                | Param::QNorm(_)
                | Param::KNorm(_)
                | Param::PostAttnNorm(_)
                | Param::FfnNorm(_)
                | Param::PostFfnNorm(_)
        )
    }

    /// The tensor name in GGUF files.
    pub fn gguf_name(self) -> String {
        let b = |i: usize, s: &str| format!("blk.{i}.{s}");
        match self {
            Param::Embed => "token_embd.weight".into(),
            Param::Output => "output.weight".into(),
            Param::FinalNorm => "output_norm.weight".into(),
            Param::AttnNorm(i) => b(i, "attn_norm.weight"),
            Param::Q(i) => b(i, "attn_q.weight"),
            Param::K(i) => b(i, "attn_k.weight"),
            Param::V(i) => b(i, "attn_v.weight"),
            Param::QBias(i) => b(i, "attn_q.bias"),
            Param::KBias(i) => b(i, "attn_k.bias"),
            Param::VBias(i) => b(i, "attn_v.bias"),
            Param::QNorm(i) => b(i, "attn_q_norm.weight"),
            Param::KNorm(i) => b(i, "attn_k_norm.weight"),
            Param::O(i) => b(i, "attn_output.weight"),
            Param::PostAttnNorm(i) => b(i, "post_attention_norm.weight"),
            Param::FfnNorm(i) => b(i, "ffn_norm.weight"),
            Param::PostFfnNorm(i) => b(i, "post_ffw_norm.weight"),
            Param::Gate(i) => b(i, "ffn_gate.weight"),
            Param::Up(i) => b(i, "ffn_up.weight"),
            Param::Down(i) => b(i, "ffn_down.weight"),
        }
    }

    /// The tensor name in Hugging Face checkpoints (without the `model.` prefix handling).
    pub fn hf_name(self, arch: Architecture) -> String {
        let gemma = arch == Architecture::Gemma3;
        let l = |i: usize, s: &str| format!("model.layers.{i}.{s}");
        match self {
            Param::Embed => "model.embed_tokens.weight".into(),
            Param::Output => "lm_head.weight".into(),
            Param::FinalNorm => "model.norm.weight".into(),
            Param::AttnNorm(i) => l(i, "input_layernorm.weight"),
            Param::Q(i) => l(i, "self_attn.q_proj.weight"),
            Param::K(i) => l(i, "self_attn.k_proj.weight"),
            Param::V(i) => l(i, "self_attn.v_proj.weight"),
            Param::QBias(i) => l(i, "self_attn.q_proj.bias"),
            Param::KBias(i) => l(i, "self_attn.k_proj.bias"),
            Param::VBias(i) => l(i, "self_attn.v_proj.bias"),
            Param::QNorm(i) => l(i, "self_attn.q_norm.weight"),
            Param::KNorm(i) => l(i, "self_attn.k_norm.weight"),
            Param::O(i) => l(i, "self_attn.o_proj.weight"),
            Param::PostAttnNorm(i) => l(i, "post_attention_layernorm.weight"),
            Param::FfnNorm(i) if gemma => l(i, "pre_feedforward_layernorm.weight"),
            Param::FfnNorm(i) => l(i, "post_attention_layernorm.weight"),
            Param::PostFfnNorm(i) => l(i, "post_feedforward_layernorm.weight"),
            Param::Gate(i) => l(i, "mlp.gate_proj.weight"),
            Param::Up(i) => l(i, "mlp.up_proj.weight"),
            Param::Down(i) => l(i, "mlp.down_proj.weight"),
        }
    }
}

/// A loaded weight: quantized (GGUF) or dense f32 (safetensors).
#[derive(Debug, Clone)]
pub enum Weight {
    /// Quantized, kept as stored (or converted to a faster quant type).
    Quant(Arc<QTensor>),
    /// Dense f32.
    Dense(Tensor),
}

impl Weight {
    /// The tensor's dimensions.
    pub fn dims(&self) -> Vec<usize> {
        match self {
            Weight::Quant(q) => q.shape().dims().to_vec(),
            Weight::Dense(t) => t.dims().to_vec(),
        }
    }

    /// Dense f32 copy (norms, biases).
    pub fn to_f32(&self) -> Result<Tensor> {
        Ok(match self {
            Weight::Quant(q) => q.dequantize(&q.device())?,
            Weight::Dense(t) => t.to_dtype(DType::F32)?,
        })
    }
}

/// Reads weights by logical parameter.
pub trait WeightSource {
    /// The model configuration this source describes.
    fn config(&self) -> &ModelConfig;
    /// The weight, or `None` when the file does not have it.
    fn get(&mut self, p: Param) -> Result<Option<Weight>>;
}

/// Weights from a GGUF file.
pub struct GgufWeights<'a, R> {
    ct: &'a Content,
    reader: &'a mut R,
    device: Device,
    cfg: ModelConfig,
}

impl<'a, R: Read + Seek> GgufWeights<'a, R> {
    /// Wraps a parsed GGUF header and its reader.
    pub fn new(ct: &'a Content, reader: &'a mut R, device: &Device) -> Result<Self> {
        Ok(Self {
            cfg: ModelConfig::from_gguf(ct)?,
            ct,
            reader,
            device: device.clone(),
        })
    }
}

impl<R: Read + Seek> WeightSource for GgufWeights<'_, R> {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn get(&mut self, p: Param) -> Result<Option<Weight>> {
        let name = p.gguf_name();
        if !self.ct.tensor_infos.contains_key(&name) {
            return Ok(None);
        }
        let q = self
            .ct
            .tensor(self.reader, &name, &self.device)
            .map_err(|e| Error::weight(&name, e))?;
        Ok(Some(Weight::Quant(Arc::new(q))))
    }
}

/// Weights from Hugging Face safetensors (one file or shards listed in an index), converted
/// to f32. Gemma's norms store `w` where the model computes `x * (1 + w)`: 1 is added here,
/// as the GGUF converter does.
pub struct SafetensorsWeights {
    st: candle_core::safetensors::MmapedSafetensors,
    prefix: String,
    device: Device,
    cfg: ModelConfig,
}

impl SafetensorsWeights {
    /// Opens the safetensors files of a model folder (`model.safetensors` or the shards named
    /// by `model.safetensors.index.json`) with its `config.json`.
    pub fn open(dir: &Path, device: &Device) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::Io {
            path: cfg_path.clone(),
            source: e,
        })?;
        let cfg = ModelConfig::from_hf_json(&text)?;
        let files = safetensors_files(dir)?;
        // SAFETY: the files are memory-mapped read-only; they must not be truncated while the
        // model loads (the same contract as candle's loaders).
        let st =
            unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }.map_err(|e| {
                Error::CorruptGguf {
                    path: files[0].clone(),
                    reason: format!("not a valid safetensors file: {e}"),
                }
            })?;
        let prefix = if st.get("model.embed_tokens.weight").is_ok() {
            String::new()
        } else if st.get("language_model.model.embed_tokens.weight").is_ok() {
            "language_model.".to_string()
        } else {
            return Err(Error::weight(
                "model.embed_tokens.weight",
                "not present in the safetensors files",
            ));
        };
        Ok(Self {
            st,
            prefix,
            device: device.clone(),
            cfg,
        })
    }
}

/// The safetensors files of a model folder, in shard order.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| Error::Io {
            path: index.clone(),
            source: e,
        })?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::metadata("model.safetensors.index.json", e))?;
        let map = v["weight_map"].as_object().ok_or_else(|| {
            Error::metadata("model.safetensors.index.json: weight_map", "not an object")
        })?;
        let mut files: Vec<String> = map
            .values()
            .filter_map(|f| f.as_str().map(str::to_string))
            .collect();
        files.sort();
        files.dedup();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    Err(Error::Io {
        path: single,
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no model.safetensors or model.safetensors.index.json in the folder",
        ),
    })
}

impl WeightSource for SafetensorsWeights {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn get(&mut self, p: Param) -> Result<Option<Weight>> {
        let name = format!("{}{}", self.prefix, p.hf_name(self.cfg.arch));
        if self.st.get(&name).is_err() {
            return Ok(None);
        }
        let t = self
            .st
            .load(&name, &self.device)
            .map_err(|e| Error::weight(&name, e))?
            .to_dtype(DType::F32)?;
        let t = if p.is_norm() && self.cfg.arch == Architecture::Gemma3 {
            (t + 1.0)?
        } else {
            t
        };
        Ok(Some(Weight::Dense(t)))
    }
}
