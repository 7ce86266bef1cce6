//! LoRA adapters in PEFT's layout: `adapter_config.json` (`peft_type` LORA, `r`,
//! `lora_alpha`, `target_modules`, ...) and `adapter_model.safetensors` with PEFT's key names
//! (`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`, `lora_A` of shape
//! `[r, in]`, `lora_B` of shape `[out, r]`), so an adapter trained here loads in PEFT and one
//! trained with PEFT loads here. The base model's file checksum, when known, is kept in the
//! safetensors metadata (`speccompact.base_sha256`, which PEFT ignores) and checked before
//! use. A projection `W` with an adapter computes `W x + (alpha / r) · B (A x)`.
//!
//! Llama-architecture GGUF files hold q and k with each head's rows interleaved for their
//! rotary layout (llama.cpp's converter permutes them); [`Adapter::for_interleaved_rope`]
//! applies the same permutation to the adapter's `B` rows, so the adapter acts on those
//! weights as it acts on the Hugging Face ones.

use crate::{Error, Result};
use candle_core::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::path::Path;

/// Projections an adapter may target, with the block that holds each.
pub const MODULES: [(&str, &str); 7] = [
    ("q_proj", "self_attn"),
    ("k_proj", "self_attn"),
    ("v_proj", "self_attn"),
    ("o_proj", "self_attn"),
    ("gate_proj", "mlp"),
    ("up_proj", "mlp"),
    ("down_proj", "mlp"),
];

/// The config file's name.
pub const CONFIG_FILE: &str = "adapter_config.json";
/// The weights file's name.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// Metadata key of the base model's SHA-256.
const BASE_KEY: &str = "speccompact.base_sha256";

/// One adapted projection: `a` is `[r, in]`, `b` is `[out, r]`.
#[derive(Debug, Clone)]
pub struct LoraPair {
    /// Down projection.
    pub a: Tensor,
    /// Up projection.
    pub b: Tensor,
}

/// A LoRA adapter.
#[derive(Debug, Clone)]
pub struct Adapter {
    /// Rank.
    pub r: usize,
    /// Scale numerator: the side path is multiplied by `alpha / r`.
    pub alpha: f32,
    /// The projections adapted (names from [`MODULES`]).
    pub target_modules: Vec<String>,
    /// The base model's name, as PEFT's `base_model_name_or_path`.
    pub base_name: String,
    /// The base model file's SHA-256, when recorded.
    pub base_sha256: Option<String>,
    /// The pairs by (layer, module).
    pub pairs: BTreeMap<(usize, String), LoraPair>,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::Adapter {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn block_of(module: &str) -> Option<&'static str> {
    MODULES.iter().find(|(m, _)| *m == module).map(|(_, b)| *b)
}

/// PEFT's key of one side of a pair (`"A"` or `"B"`).
pub fn peft_key(layer: usize, module: &str, side: &str) -> String {
    let block = block_of(module).unwrap_or("self_attn");
    format!("base_model.model.model.layers.{layer}.{block}.{module}.lora_{side}.weight")
}

/// (layer, module, side) of a PEFT key, `None` when it is not one.
fn parse_key(key: &str) -> Option<(usize, String, char)> {
    let rest = key.strip_prefix("base_model.model.model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (block, rest) = rest.split_once('.')?;
    let (module, rest) = rest.split_once('.')?;
    let side = match rest {
        "lora_A.weight" => 'A',
        "lora_B.weight" => 'B',
        _ => return None,
    };
    (block_of(module)? == block).then_some(())?;
    Some((layer.parse().ok()?, module.to_string(), side))
}

/// A safetensors file of f32 tensors with the same bytes for the same contents: names and
/// metadata keys in sorted order (the safetensors crate writes its metadata map in hash
/// order), the header padded with spaces to a multiple of 8.
fn safetensors_bytes(
    tensors: &BTreeMap<String, Tensor>,
    meta: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!(meta));
    let mut data: Vec<u8> = Vec::new();
    for (name, t) in tensors {
        let start = data.len();
        for x in t.flatten_all()?.to_vec1::<f32>()? {
            data.extend_from_slice(&x.to_le_bytes());
        }
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": t.dims(), "data_offsets": [start, data.len()]}),
        );
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + data.len());
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    Ok(out)
}

/// Reorders the rows of `w` (`[heads * hd, cols]`) from rotate-half order to the interleaved
/// order of llama GGUF files (within a head, row `i` of the first half goes to `2i`, of the
/// second half to `2i + 1`); `inverse` undoes it.
pub fn interleave_rope_rows(w: &Tensor, heads: usize, hd: usize, inverse: bool) -> Result<Tensor> {
    let cols = w.dim(1)?;
    let t = if inverse {
        w.reshape((heads, hd / 2, 2, cols))?.transpose(1, 2)?
    } else {
        w.reshape((heads, 2, hd / 2, cols))?.transpose(1, 2)?
    };
    Ok(t.contiguous()?.reshape((heads * hd, cols))?)
}

impl Adapter {
    /// The side path's factor, `alpha / r`.
    pub fn scale(&self) -> f32 {
        self.alpha / self.r as f32
    }

    /// `scale · B A` of one projection (`[out, in]`), for merging into a dense copy.
    pub fn delta(&self, layer: usize, module: &str) -> Result<Option<Tensor>> {
        match self.pairs.get(&(layer, module.to_string())) {
            Some(p) => Ok(Some((p.b.matmul(&p.a)? * f64::from(self.scale()))?)),
            None => Ok(None),
        }
    }

    /// Refuses a base other than the one the adapter was trained on (when it records one).
    pub fn check_base(&self, path: &Path, sha256: &str) -> Result<()> {
        match &self.base_sha256 {
            Some(b) if b != sha256 => Err(bad(
                path,
                format!(
                    "trained on a base with SHA-256 {b} ({}), this base's is {sha256}",
                    self.base_name
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The adapter for a llama GGUF file's q and k rows: `B` of `q_proj` (`heads` heads)
    /// and of `k_proj` (`kv_heads`) permuted as the converter permuted the base; `inverse`
    /// brings such an adapter back to the Hugging Face order.
    pub fn for_interleaved_rope(
        &self,
        heads: usize,
        kv_heads: usize,
        hd: usize,
        inverse: bool,
    ) -> Result<Self> {
        let mut out = self.clone();
        for ((_, module), pair) in out.pairs.iter_mut() {
            let h = match module.as_str() {
                "q_proj" => heads,
                "k_proj" => kv_heads,
                _ => continue,
            };
            pair.b = interleave_rope_rows(&pair.b, h, hd, inverse)?;
        }
        Ok(out)
    }

    /// Writes `adapter_config.json` and `adapter_model.safetensors` into `dir` (created).
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
        let config = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": self.base_name,
            "r": self.r,
            "lora_alpha": self.alpha,
            "lora_dropout": 0.0,
            "target_modules": self.target_modules,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
        });
        let path = dir.join(CONFIG_FILE);
        let text = serde_json::to_string_pretty(&config).map_err(|e| bad(&path, e.to_string()))?;
        std::fs::write(&path, format!("{text}\n")).map_err(Error::io(&path))?;
        let mut tensors = BTreeMap::new();
        for ((layer, module), p) in &self.pairs {
            tensors.insert(peft_key(*layer, module, "A"), p.a.to_dtype(DType::F32)?);
            tensors.insert(peft_key(*layer, module, "B"), p.b.to_dtype(DType::F32)?);
        }
        let mut meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        if let Some(s) = &self.base_sha256 {
            meta.insert(BASE_KEY.into(), s.clone());
        }
        let path = dir.join(WEIGHTS_FILE);
        std::fs::write(&path, safetensors_bytes(&tensors, &meta)?).map_err(Error::io(&path))?;
        Ok(())
    }

    /// Reads an adapter in PEFT's layout from `dir` onto `device`.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let cpath = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&cpath).map_err(Error::io(&cpath))?;
        let c: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(&cpath, format!("not JSON: {e}")))?;
        if c["peft_type"].as_str() != Some("LORA") {
            return Err(bad(
                &cpath,
                format!("peft_type {} is not LORA", c["peft_type"]),
            ));
        }
        let r = c["r"]
            .as_u64()
            .filter(|&r| r > 0)
            .ok_or_else(|| bad(&cpath, "no positive integer `r`"))? as usize;
        let alpha = c["lora_alpha"]
            .as_f64()
            .ok_or_else(|| bad(&cpath, "no number `lora_alpha`"))? as f32;
        let target_modules: Vec<String> = match &c["target_modules"] {
            serde_json::Value::Array(a) => a
                .iter()
                .map(|m| m.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| bad(&cpath, "`target_modules` holds a non-string"))?,
            other => {
                return Err(bad(
                    &cpath,
                    format!("`target_modules` must be a list of names, not {other}"),
                ))
            }
        };
        if let Some(m) = target_modules.iter().find(|m| block_of(m).is_none()) {
            return Err(bad(
                &cpath,
                format!("target module {m} is not a projection this runtime adapts"),
            ));
        }
        for (k, want) in [("bias", "none")] {
            if c[k].as_str().is_some_and(|v| v != want) {
                return Err(bad(&cpath, format!("{k} = {} is not supported", c[k])));
            }
        }
        if c["fan_in_fan_out"].as_bool() == Some(true) {
            return Err(bad(&cpath, "fan_in_fan_out = true is not supported"));
        }
        let wpath = dir.join(WEIGHTS_FILE);
        let bytes = std::fs::read(&wpath).map_err(Error::io(&wpath))?;
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)
            .map_err(|e| bad(&wpath, e.to_string()))?;
        let base_sha256 = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get(BASE_KEY).cloned());
        let tensors = candle_core::safetensors::load_buffer(&bytes, device)
            .map_err(|e| bad(&wpath, e.to_string()))?;
        let mut sides: BTreeMap<(usize, String), [Option<Tensor>; 2]> = BTreeMap::new();
        for (key, t) in tensors {
            let (layer, module, side) =
                parse_key(&key).ok_or_else(|| bad(&wpath, format!("unexpected tensor {key}")))?;
            if !target_modules.contains(&module) {
                return Err(bad(
                    &wpath,
                    format!("{key}: {module} is not in target_modules"),
                ));
            }
            let e = sides.entry((layer, module)).or_default();
            e[usize::from(side == 'B')] = Some(t.to_dtype(DType::F32)?);
        }
        let mut pairs = BTreeMap::new();
        for ((layer, module), [a, b]) in sides {
            let (Some(a), Some(b)) = (a, b) else {
                return Err(bad(
                    &wpath,
                    format!("layer {layer} {module}: lora_A or lora_B missing"),
                ));
            };
            let (ar, _) = a.dims2()?;
            let (_, br) = b.dims2()?;
            if ar != r || br != r {
                return Err(bad(
                    &wpath,
                    format!(
                        "layer {layer} {module}: A {:?} and B {:?} do not have rank r = {r}",
                        a.dims(),
                        b.dims()
                    ),
                ));
            }
            pairs.insert((layer, module), LoraPair { a, b });
        }
        if pairs.is_empty() {
            return Err(bad(&wpath, "no LoRA tensors"));
        }
        Ok(Self {
            r,
            alpha,
            target_modules,
            base_name: c["base_model_name_or_path"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            base_sha256,
            pairs,
        })
    }
}
