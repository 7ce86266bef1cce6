//! qwen3 and gemma3, and safetensors weights for all four architectures.
//!
//! References: candle-transformers' dense models on the same safetensors folder (sequences
//! shorter than gemma3's window: its window is off by one and its quantized gemma3 uses SiLU),
//! candle-transformers' quantized qwen3 on GGUF, and `naive` below: a straightforward
//! full-recompute implementation with an explicit causal + sliding-window mask, written from
//! the Hugging Face definitions and reading the safetensors files directly.
//! Tolerance: max |diff| < 1e-4 on logits (dense f32 paths), relative L2 < 5 % across the
//! Q8_0 GGUF conversion.

use anyhow::Result;
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor, D};
use speccompact_bench::HfReference;
use speccompact_runtime::synthetic::TinyModel;
use speccompact_runtime::{Architecture, LoadOptions, LogitsAt, Model, Row};
use speccompact_tests::{max_diff, rel_l2};
use std::collections::HashMap;
use std::path::Path;

const TOL: f32 = 1e-4;
const ARCHS: [Architecture; 4] = [
    Architecture::Llama,
    Architecture::Qwen2,
    Architecture::Qwen3,
    Architecture::Gemma3,
];

/// Token ids within the tiny vocabulary (267 entries).
fn tokens(n: usize, seed: u32) -> Vec<u32> {
    speccompact_tests::tokens(n, 267, seed)
}

fn spec(arch: Architecture) -> TinyModel {
    TinyModel {
        // qwen3 and gemma3 heads wider than hidden / heads, as in the real models.
        head_dim: matches!(arch, Architecture::Qwen3 | Architecture::Gemma3).then_some(32),
        ..TinyModel::new(arch)
    }
}

/// All-position logits (n, vocab) computed from scratch, Hugging Face semantics.
fn naive(dir: &Path, toks: &[u32], spec: &TinyModel, use_window: bool) -> Result<Tensor> {
    let dev = Device::Cpu;
    let mut w: HashMap<String, Tensor> = HashMap::new();
    for f in speccompact_runtime::weights::safetensors_files(dir)? {
        w.extend(candle_core::safetensors::load(f, &dev)?);
    }
    let get = |k: &str| w[k].to_dtype(DType::F32).unwrap();
    let gemma = spec.arch == Architecture::Gemma3;
    let hd = spec.head_dim.unwrap_or(spec.hidden / spec.heads);
    let (hq, hkv) = (spec.heads, spec.kv_heads);
    let n = toks.len();
    let rms = |x: &Tensor, wname: &str| -> Result<Tensor> {
        let wt = get(wname);
        let wt = if gemma { (wt + 1.0)? } else { wt };
        let var = x.sqr()?.mean_keepdim(D::Minus1)?;
        Ok(x.broadcast_div(&(var + 1e-6)?.sqrt()?)?
            .broadcast_mul(&wt)?)
    };
    let lin = |x: &Tensor, wname: &str| -> Result<Tensor> { Ok(x.matmul(&get(wname).t()?)?) };
    let rope = |x: &Tensor, theta: f32| -> Result<Tensor> {
        // x: (n, heads, hd), rotate-half pairing.
        let half = hd / 2;
        let mut cos = vec![0f32; n * half];
        let mut sin = vec![0f32; n * half];
        for p in 0..n {
            for i in 0..half {
                let f = p as f32 / theta.powf(2.0 * i as f32 / hd as f32);
                cos[p * half + i] = f.cos();
                sin[p * half + i] = f.sin();
            }
        }
        let cos = Tensor::from_vec(cos, (n, 1, half), &dev)?;
        let sin = Tensor::from_vec(sin, (n, 1, half), &dev)?;
        let x1 = x.narrow(2, 0, half)?;
        let x2 = x.narrow(2, half, half)?;
        let a = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
        let b = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
        Ok(Tensor::cat(&[a, b], 2)?)
    };
    let ids = Tensor::new(toks, &dev)?;
    let mut x = get("model.embed_tokens.weight").index_select(&ids, 0)?;
    if gemma {
        x = (x * (spec.hidden as f64).sqrt())?;
    }
    for l in 0..spec.layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        let sliding = gemma && use_window && (l + 1) % spec.sliding_pattern != 0;
        let theta = if gemma && (l + 1) % spec.sliding_pattern != 0 {
            1000.0
        } else {
            10_000.0
        };
        let h = rms(&x, &p("input_layernorm.weight"))?;
        let mut q = lin(&h, &p("self_attn.q_proj.weight"))?;
        let mut k = lin(&h, &p("self_attn.k_proj.weight"))?;
        let mut v = lin(&h, &p("self_attn.v_proj.weight"))?;
        if spec.arch == Architecture::Qwen2 {
            q = q.broadcast_add(&get(&p("self_attn.q_proj.bias")))?;
            k = k.broadcast_add(&get(&p("self_attn.k_proj.bias")))?;
            v = v.broadcast_add(&get(&p("self_attn.v_proj.bias")))?;
        }
        let mut q = q.reshape((n, hq, hd))?;
        let mut k = k.reshape((n, hkv, hd))?;
        let v = v.reshape((n, hkv, hd))?;
        if matches!(spec.arch, Architecture::Qwen3 | Architecture::Gemma3) {
            q = rms(&q, &p("self_attn.q_norm.weight"))?;
            k = rms(&k, &p("self_attn.k_norm.weight"))?;
        }
        let q = rope(&q, theta)?;
        let k = rope(&k, theta)?;
        let mut mask = vec![0f32; n * n];
        for i in 0..n {
            for j in 0..n {
                let hidden = j > i || (sliding && i - j >= spec.sliding_window.unwrap_or(n));
                if hidden {
                    mask[i * n + j] = f32::NEG_INFINITY;
                }
            }
        }
        let mask = Tensor::from_vec(mask, (n, n), &dev)?;
        let mut heads = Vec::new();
        for head in 0..hq {
            let kv = head / (hq / hkv);
            let qh = q.narrow(1, head, 1)?.squeeze(1)?;
            let kh = k.narrow(1, kv, 1)?.squeeze(1)?;
            let vh = v.narrow(1, kv, 1)?.squeeze(1)?;
            let s = ((qh.matmul(&kh.t()?)? / (hd as f64).sqrt())? + &mask)?;
            let pr = candle_nn::ops::softmax_last_dim(&s)?;
            heads.push(pr.matmul(&vh)?);
        }
        let o = Tensor::cat(&heads, 1)?;
        let mut o = lin(&o, &p("self_attn.o_proj.weight"))?;
        if gemma {
            o = rms(&o, &p("post_attention_layernorm.weight"))?;
        }
        x = (x + o)?;
        let pre = if gemma {
            "pre_feedforward_layernorm.weight"
        } else {
            "post_attention_layernorm.weight"
        };
        let h = rms(&x, &p(pre))?;
        let g = lin(&h, &p("mlp.gate_proj.weight"))?;
        let g = if gemma {
            g.gelu()?
        } else {
            candle_nn::ops::silu(&g)?
        };
        let mut m = lin(
            &(g * lin(&h, &p("mlp.up_proj.weight"))?)?,
            &p("mlp.down_proj.weight"),
        )?;
        if gemma {
            m = rms(&m, &p("post_feedforward_layernorm.weight"))?;
        }
        x = (x + m)?;
    }
    let x = rms(&x, "model.norm.weight")?;
    let head = if w.contains_key("lm_head.weight") {
        "lm_head.weight"
    } else {
        "model.embed_tokens.weight"
    };
    lin(&x, head)
}

fn all_logits(m: &Model, toks: &[u32]) -> Result<Tensor> {
    let mut s = m.decoder.new_sequence();
    Ok(m.decoder
        .forward(
            &mut [Row {
                seq: &mut s,
                tokens: toks,
            }],
            LogitsAt::All,
        )?
        .remove(0))
}

#[test]
fn safetensors_match_naive_reference_for_all_architectures() -> Result<()> {
    for arch in ARCHS {
        let dir = tempfile::tempdir()?;
        let sp = spec(arch);
        sp.write_safetensors(dir.path())?;
        let m = Model::load(dir.path(), &Device::Cpu, LoadOptions::default())?;
        let toks = tokens(21, 1);
        let want = naive(dir.path(), &toks, &sp, true)?;
        let got = all_logits(&m, &toks)?;
        let d = max_diff(&want, &got)?;
        assert!(d < TOL, "{arch:?}: max diff {d}");
        if arch == Architecture::Gemma3 {
            // The test is sensitive to the window: without it the logits differ.
            let unwindowed = naive(dir.path(), &toks, &sp, false)?;
            assert!(
                max_diff(&unwindowed, &got)? > 1e-2,
                "window has no effect at 21 tokens"
            );
        }
        assert_eq!(m.tokenizer.token_id("<|im_start|>"), Some(265));
        assert!(
            m.chat_template.is_some(),
            "{arch:?}: tokenizer_config.json chat template"
        );
    }
    Ok(())
}

/// candle-transformers' dense gemma3 fails on CPU here ("slice-set only supports contiguous
/// tensors" in its rotating KV cache) and its quantized gemma3 uses SiLU: gemma3 is checked
/// against `naive` instead.
#[test]
fn safetensors_match_candle_transformers() -> Result<()> {
    for arch in [
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Qwen3,
    ] {
        let dir = tempfile::tempdir()?;
        let sp = spec(arch);
        sp.write_safetensors(dir.path())?;
        let m = Model::load(dir.path(), &Device::Cpu, LoadOptions::default())?;
        // Shorter than gemma3's window of 8: candle's window differs by one position.
        let toks = tokens(7, 2);
        let mut reference = HfReference::load(dir.path(), &Device::Cpu)?;
        let want = reference
            .forward(&toks, 0, &Device::Cpu)
            .map_err(|e| anyhow::anyhow!("{arch:?} reference: {e}"))?;
        let got = all_logits(&m, &toks)?.get(6)?;
        let d = max_diff(&want, &got)?;
        assert!(d < TOL, "{arch:?}: max diff {d}");
    }
    Ok(())
}

#[test]
fn sharded_bf16_safetensors_load() -> Result<()> {
    for arch in [Architecture::Qwen3, Architecture::Gemma3] {
        let dir = tempfile::tempdir()?;
        let sp = TinyModel {
            st_dtype: DType::BF16,
            shards: 3,
            ..spec(arch)
        };
        sp.write_safetensors(dir.path())?;
        assert!(dir.path().join("model.safetensors.index.json").is_file());
        let m = Model::load(dir.path(), &Device::Cpu, LoadOptions::default())?;
        let toks = tokens(12, 3);
        let d = max_diff(
            &naive(dir.path(), &toks, &sp, true)?,
            &all_logits(&m, &toks)?,
        )?;
        assert!(d < TOL, "{arch:?}: {d}");
    }
    Ok(())
}

#[test]
fn gguf_conversion_matches_safetensors() -> Result<()> {
    for arch in ARCHS {
        for (dtype, exact) in [(GgmlDType::F32, true), (GgmlDType::Q8_0, false)] {
            let dir = tempfile::tempdir()?;
            let sp = TinyModel {
                dtype,
                ..spec(arch)
            };
            sp.write_safetensors(dir.path())?;
            let gguf = dir.path().join("model.gguf");
            sp.write(&gguf)?;
            let a = Model::load(dir.path(), &Device::Cpu, LoadOptions::default())?;
            let b = Model::load(&gguf, &Device::Cpu, LoadOptions::default())?;
            assert_eq!(
                a.decoder.config().rope_style,
                speccompact_runtime::RopeStyle::Neox
            );
            let toks = tokens(19, 4);
            let (la, lb) = (all_logits(&a, &toks)?, all_logits(&b, &toks)?);
            if exact {
                let d = max_diff(&la, &lb)?;
                assert!(d < TOL, "{arch:?} f32 GGUF vs safetensors: {d}");
            } else {
                let e = rel_l2(&la, &lb)?;
                assert!(
                    e < 0.05 && e > 0.0,
                    "{arch:?} Q8_0 GGUF vs safetensors: {e}"
                );
            }
        }
    }
    Ok(())
}

/// GGUF qwen3 against candle-transformers' dense qwen3 on the same weights (the f32 GGUF is
/// written from the safetensors form). candle's quantized qwen3 is not used: on these tiny
/// models it disagrees with both its own dense qwen3 and ours by ~0.13 in the logits.
#[test]
fn qwen3_gguf_matches_candle_reference() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sp = TinyModel {
        dtype: GgmlDType::F32,
        ..spec(Architecture::Qwen3)
    };
    sp.write_safetensors(dir.path())?;
    let path = dir.path().join("q3.gguf");
    sp.write(&path)?;
    let m = Model::load(&path, &Device::Cpu, LoadOptions::default())?;
    let toks = tokens(17, 5);
    let mut reference = HfReference::load(dir.path(), &Device::Cpu)?;
    let want = reference.forward(&toks, 0, &Device::Cpu)?;
    let got = all_logits(&m, &toks)?.get(16)?;
    let d = max_diff(&want, &got)?;
    assert!(d < TOL, "qwen3 GGUF: {d}");
    Ok(())
}

/// Decode one token at a time over a frozen prefix, and a batch of rows at different
/// depths, past the window: every step must equal the windowed full recompute.
#[test]
fn sliding_window_is_respected_in_decode_and_batches() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sp = spec(Architecture::Gemma3);
    sp.write_safetensors(dir.path())?;
    let m = Model::load(dir.path(), &Device::Cpu, LoadOptions::default())?;
    let d = &m.decoder;
    let toks = tokens(24, 6);
    let want = naive(dir.path(), &toks, &sp, true)?;
    let prefix = d.prefill(&toks[..5], 3)?.freeze()?;
    let mut seq = prefix.fork();
    for (i, &t) in toks.iter().enumerate().skip(5) {
        let l = d.forward(
            &mut [Row {
                seq: &mut seq,
                tokens: &[t],
            }],
            LogitsAt::Last,
        )?;
        let diff = max_diff(&want.get(i)?, &l[0])?;
        assert!(diff < TOL, "decode position {i}: {diff}");
    }
    // A prefix longer than the window, rows at different depths in one batch.
    let prefix = d.prefill(&toks[..11], 64)?.freeze()?;
    let depths = [0usize, 3, 7];
    let mut seqs = Vec::new();
    for &dep in &depths {
        let mut s = prefix.fork();
        if dep > 0 {
            d.extend(&mut s, &toks[11..11 + dep], 64)?;
        }
        seqs.push(s);
    }
    let news: Vec<&[u32]> = depths
        .iter()
        .map(|&dep| &toks[11 + dep..(11 + dep + 4).min(24)])
        .collect();
    let mut rows: Vec<Row<'_>> = seqs
        .iter_mut()
        .zip(&news)
        .map(|(s, t)| Row { seq: s, tokens: t })
        .collect();
    let out = d.forward(&mut rows, LogitsAt::All)?;
    for ((&dep, l), t) in depths.iter().zip(&out).zip(&news) {
        let w = want.narrow(0, 11 + dep, t.len())?;
        let diff = max_diff(&w, l)?;
        assert!(diff < TOL, "batched row at depth {dep}: {diff}");
    }
    Ok(())
}

#[test]
fn unsupported_rope_scaling_and_bad_config_are_named() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sp = spec(Architecture::Qwen3);
    sp.write_safetensors(dir.path())?;
    let mut cfg = sp.hf_config();
    cfg["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
    std::fs::write(dir.path().join("config.json"), cfg.to_string())?;
    let e = Model::load(dir.path(), &Device::Cpu, LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("yarn"), "{e}");
    cfg["model_type"] = serde_json::json!("mamba");
    std::fs::write(dir.path().join("config.json"), cfg.to_string())?;
    let e = Model::load(dir.path(), &Device::Cpu, LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("mamba"), "{e}");
    std::fs::remove_file(dir.path().join("model.safetensors"))?;
    let e = speccompact_runtime::weights::safetensors_files(dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.safetensors"), "{e}");
    Ok(())
}
