//! Shared pieces of the benchmarks: the candle-transformers reference models and timing.

use anyhow::Result;
use candle_core::{Device, Tensor};
use std::path::Path;
use std::time::Instant;

/// candle-transformers' quantized implementation of the same GGUF file.
pub enum Reference {
    /// `quantized_llama`.
    Llama(candle_transformers::models::quantized_llama::ModelWeights),
    /// `quantized_qwen2`.
    Qwen2(candle_transformers::models::quantized_qwen2::ModelWeights),
    /// `quantized_qwen3`.
    Qwen3(candle_transformers::models::quantized_qwen3::ModelWeights),
}

impl Reference {
    /// Loads the reference model for the file's architecture.
    pub fn load(path: &Path, dev: &Device) -> Result<Self> {
        let mut f = std::fs::File::open(path)?;
        let ct = candle_core::quantized::gguf_file::Content::read(&mut f)?;
        let arch = ct.metadata["general.architecture"].to_string()?.clone();
        Ok(match arch.as_str() {
            "llama" => Self::Llama(
                candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
                    ct, &mut f, dev,
                )?,
            ),
            "qwen2" => Self::Qwen2(
                candle_transformers::models::quantized_qwen2::ModelWeights::from_gguf(
                    ct, &mut f, dev,
                )?,
            ),
            "qwen3" => Self::Qwen3(
                candle_transformers::models::quantized_qwen3::ModelWeights::from_gguf(
                    ct, &mut f, dev,
                )?,
            ),
            // candle-transformers' quantized gemma3 uses SiLU instead of GELU and ignores the
            // window when decoding; gemma3 GGUF is checked against its safetensors form.
            other => anyhow::bail!("no reference for architecture {other}"),
        })
    }

    /// Forward of `toks` at position `pos`; returns last-position logits.
    pub fn forward(&mut self, toks: &[u32], pos: usize, dev: &Device) -> Result<Tensor> {
        let x = Tensor::new(toks, dev)?.unsqueeze(0)?;
        Ok(match self {
            Self::Llama(m) => m.forward(&x, pos)?,
            Self::Qwen2(m) => m.forward(&x, pos)?,
            Self::Qwen3(m) => m.forward(&x, pos)?,
        })
    }
}

/// candle-transformers' dense implementations of a Hugging Face folder (config.json +
/// safetensors), used as the reference for the safetensors path.
pub enum HfReference {
    /// `llama`.
    Llama(
        candle_transformers::models::llama::Llama,
        candle_transformers::models::llama::Cache,
    ),
    /// `qwen2`.
    Qwen2(candle_transformers::models::qwen2::ModelForCausalLM),
    /// `qwen3`.
    Qwen3(candle_transformers::models::qwen3::ModelForCausalLM),
    /// `gemma3`.
    Gemma3(candle_transformers::models::gemma3::Model),
}

impl HfReference {
    /// Loads the reference for the folder's `model_type`.
    pub fn load(dir: &Path, dev: &Device) -> Result<Self> {
        use candle_transformers::models as m;
        let text = std::fs::read_to_string(dir.join("config.json"))?;
        let v: serde_json::Value = serde_json::from_str(&text)?;
        let files = speccompact_runtime::weights::safetensors_files(dir)?;
        let vb = unsafe {
            candle_nn::VarBuilder::from_mmaped_safetensors(&files, candle_core::DType::F32, dev)?
        };
        Ok(match v["model_type"].as_str().unwrap_or("") {
            "llama" => {
                let cfg: m::llama::LlamaConfig = serde_json::from_str(&text)?;
                let cfg = cfg.into_config(false);
                let cache = m::llama::Cache::new(true, candle_core::DType::F32, &cfg, dev)?;
                Self::Llama(m::llama::Llama::load(vb, &cfg)?, cache)
            }
            "qwen2" => Self::Qwen2(m::qwen2::ModelForCausalLM::new(
                &serde_json::from_str(&text)?,
                vb,
            )?),
            "qwen3" => Self::Qwen3(m::qwen3::ModelForCausalLM::new(
                &serde_json::from_str(&text)?,
                vb,
            )?),
            "gemma3_text" | "gemma3" => Self::Gemma3(m::gemma3::Model::new(
                false,
                &serde_json::from_str(&text)?,
                vb,
            )?),
            other => anyhow::bail!("no reference for model_type {other}"),
        })
    }

    /// Forward of `toks` at position `pos`; returns last-position logits (flattened).
    pub fn forward(&mut self, toks: &[u32], pos: usize, dev: &Device) -> Result<Tensor> {
        let x = Tensor::new(toks, dev)?.unsqueeze(0)?;
        let out = match self {
            Self::Llama(m, cache) => m.forward(&x, pos, cache)?,
            Self::Qwen2(m) => m.forward(&x, pos)?,
            Self::Qwen3(m) => m.forward(&x, pos)?,
            Self::Gemma3(m) => m.forward(&x, pos)?,
        };
        let vocab = out.dim(candle_core::D::Minus1)?;
        let flat = out.flatten_all()?;
        let n = flat.dim(0)?;
        Ok(flat.narrow(0, n - vocab, vocab)?)
    }
}

/// Wall time of `f` in seconds.
pub fn time<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let t = Instant::now();
    let v = f()?;
    Ok((v, t.elapsed().as_secs_f64()))
}

/// Median of a few runs of `f`, in seconds.
pub fn median(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut v = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed().as_secs_f64());
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// Deterministic filler tokens (valid ids below `vocab`, avoiding the special range).
pub fn filler_tokens(n: usize, vocab: usize) -> Vec<u32> {
    let v = (vocab.min(30_000)) as u32;
    (0..n as u32)
        .map(|i| 200 + (i * 7919) % (v - 200))
        .collect()
}

/// Resident set size of this process in bytes (Linux), for memory columns.
pub fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Median seconds (3 runs) of one 32-token suffix over `prefix`, and of 6 rows of 32-37
/// tokens over the same prefix in one batched forward (logits of each row's last token).
pub fn step_timing(
    d: &speccompact_runtime::Decoder,
    prefix: &std::sync::Arc<speccompact_runtime::Prefix>,
) -> Result<(f64, f64)> {
    use speccompact_runtime::{LogitsAt, Row};
    let step = |rows: usize| {
        median(5, || {
            let mut seqs: Vec<_> = (0..rows).map(|_| prefix.fork()).collect();
            let toks: Vec<[u32; 1]> = (0..rows).map(|r| [300 + r as u32]).collect();
            let mut batch: Vec<Row<'_>> = seqs
                .iter_mut()
                .zip(&toks)
                .map(|(s, t)| Row { seq: s, tokens: t })
                .collect();
            d.forward(&mut batch, LogitsAt::Last)?;
            Ok(())
        })
    };
    let (one, six) = (step(1)?, step(6)?);
    eprintln!("decode step: one row {one:.4} s, six rows {six:.4} s");
    Ok((one, six))
}

/// One forward of 32 new tokens over the prefix, and of 6 rows of 32 (distinct tokens per
/// row), in seconds (median of 3).
pub fn verify_timing(
    d: &speccompact_runtime::Decoder,
    prefix: &std::sync::Arc<speccompact_runtime::Prefix>,
) -> Result<(f64, f64)> {
    use speccompact_runtime::{LogitsAt, Row};
    let vocab = d.config().vocab_size;
    let suffix: Vec<Vec<u32>> = (0..6)
        .map(|r| filler_tokens(32 + r, vocab)[r..].to_vec())
        .collect();
    let one = median(3, || {
        let mut s = prefix.fork();
        d.forward(
            &mut [Row {
                seq: &mut s,
                tokens: &suffix[0],
            }],
            LogitsAt::Last,
        )?;
        Ok(())
    })?;
    let six = median(3, || {
        let mut seqs: Vec<_> = (0..6).map(|_| prefix.fork()).collect();
        let mut rows: Vec<Row<'_>> = seqs
            .iter_mut()
            .zip(&suffix)
            .map(|(s, t)| Row { seq: s, tokens: t })
            .collect();
        d.forward(&mut rows, LogitsAt::Last)?;
        Ok(())
    })?;
    eprintln!("verify: one {one:.3} s, six {six:.3} s");
    Ok((one, six))
}
