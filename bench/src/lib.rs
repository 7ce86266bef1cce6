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
            other => anyhow::bail!("no reference for architecture {other}"),
        })
    }

    /// Forward of `toks` at position `pos`; returns last-position logits.
    pub fn forward(&mut self, toks: &[u32], pos: usize, dev: &Device) -> Result<Tensor> {
        let x = Tensor::new(toks, dev)?.unsqueeze(0)?;
        Ok(match self {
            Self::Llama(m) => m.forward(&x, pos)?,
            Self::Qwen2(m) => m.forward(&x, pos)?,
        })
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
