//! A training run: one example per step in a seeded order per epoch, AdamW on a cosine
//! schedule with warm-up, gradients clipped by their global norm, the validation loss after
//! each epoch, checkpoints that a later run resumes from (`--stop-after` splits a long run
//! across sessions), and the adapter in PEFT's layout at the end.
//!
//! Files under the output folder: `checkpoint/` (the variables, the optimizer's moments and
//! `state.json`: step, losses, settings), `losses.json` (training loss per step, validation
//! loss by step), `adapter/` (the result). Same data, settings and seed: the same adapter,
//! stopped and resumed or not.

use super::checkpointed;
use super::model::{DenseModel, Lora};
use super::optim::{clip, cosine, AdamW};
use crate::{Error, Result};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use speccompact_runtime::adapter::MODULES;
use speccompact_runtime::rng::Rng;
use speccompact_runtime::RopeStyle;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One pre-tokenized example (a line of `*.tokens.jsonl`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TokenExample {
    /// Prompt and body tokens.
    pub input_ids: Vec<u32>,
    /// −100 on the prompt, the ids on the body.
    pub labels: Vec<i64>,
}

/// Reads a `*.tokens.jsonl` file; a bad line is an error naming the file and line.
pub fn read_tokens(path: &Path) -> Result<Vec<TokenExample>> {
    let text = std::fs::read_to_string(path).map_err(Error::io(path))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let e: TokenExample = serde_json::from_str(l).map_err(|e| Error::Resume {
                path: format!("{}:{}", path.display(), i + 1),
                reason: format!("not a tokenized example: {e}"),
            })?;
            if e.input_ids.len() != e.labels.len() {
                return Err(Error::Settings(format!(
                    "{}:{}: {} input ids and {} labels",
                    path.display(),
                    i + 1,
                    e.input_ids.len(),
                    e.labels.len()
                )));
            }
            Ok(e)
        })
        .collect()
}

/// Settings of a run (all part of the checkpoint: a resumed run must use the same).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainOptions {
    /// LoRA rank.
    pub r: usize,
    /// LoRA alpha.
    pub alpha: f32,
    /// Adapted projections.
    pub modules: Vec<String>,
    /// Passes over the training examples.
    pub epochs: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Warm-up steps.
    pub warmup: usize,
    /// Largest global gradient norm.
    pub clip: f64,
    /// Seed of the initialization and the order.
    pub seed: u64,
    /// Steps between checkpoints (besides each epoch's end).
    pub checkpoint_every: usize,
    /// Steps between validation losses (0: only at each epoch's end).
    pub validate_every: usize,
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self {
            r: 8,
            alpha: 16.0,
            modules: MODULES.iter().map(|(m, _)| m.to_string()).collect(),
            epochs: 1,
            lr: 2e-4,
            warmup: 10,
            clip: 1.0,
            seed: 0,
            checkpoint_every: 25,
            validate_every: 0,
        }
    }
}

/// After each step.
#[derive(Debug, Clone)]
pub struct Progress {
    /// Steps done (over all epochs).
    pub step: usize,
    /// Steps in the run.
    pub total: usize,
    /// The step's loss.
    pub loss: f32,
    /// Labelled tokens per second over this run's steps (forward and backward).
    pub tokens_per_s: f64,
    /// Input tokens (prompt and body) per second over this run's steps.
    pub inputs_per_s: f64,
}

/// What a run did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TrainState {
    /// Steps done.
    pub step: usize,
    /// Training loss of each step.
    pub train_loss: Vec<f32>,
    /// Validation loss (token-weighted mean over the validation examples) by steps done:
    /// before training, every `validate_every` steps and after each epoch.
    pub validation: Vec<(usize, f32)>,
    /// The settings.
    pub options: Option<TrainOptions>,
    /// Training and validation example counts.
    pub examples: (usize, usize),
}

/// The order of epoch `e`: a seeded Fisher–Yates shuffle.
fn order(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut rng = Rng::new(seed ^ (epoch as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        v.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    v
}

fn mean_loss(m: &DenseModel, lora: &Lora, xs: &[TokenExample]) -> Result<Option<f32>> {
    if xs.is_empty() {
        return Ok(None);
    }
    let (mut sum, mut n) = (0f64, 0usize);
    for e in xs {
        let (l, t) = checkpointed::loss(m, &e.input_ids, &e.labels, lora)?;
        sum += f64::from(l) * t as f64;
        n += t;
    }
    Ok(Some((sum / n.max(1) as f64) as f32))
}

fn save_checkpoint(dir: &Path, lora: &Lora, opt: &AdamW, state: &TrainState) -> Result<()> {
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(Error::io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(Error::io(&tmp))?;
    let vars: HashMap<String, Tensor> = lora
        .all_vars()
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("var.{i}"), v.as_tensor().clone()))
        .collect();
    let p = tmp.join("lora.safetensors");
    candle_core::safetensors::save(&vars, &p).map_err(|e| Error::Resume {
        path: p.display().to_string(),
        reason: e.to_string(),
    })?;
    opt.save(&tmp.join("optimizer.safetensors"))?;
    let text = serde_json::to_string_pretty(state).map_err(|e| Error::Settings(e.to_string()))?;
    let p = tmp.join("state.json");
    std::fs::write(&p, text).map_err(Error::io(&p))?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(Error::io(dir))?;
    }
    std::fs::rename(&tmp, dir).map_err(Error::io(dir))?;
    Ok(())
}

fn load_checkpoint(
    dir: &Path,
    lora: &Lora,
    opts: &TrainOptions,
    examples: (usize, usize),
) -> Result<Option<(AdamW, TrainState)>> {
    let sp = dir.join("state.json");
    if !sp.exists() {
        return Ok(None);
    }
    let bad = |p: &Path, reason: String| Error::Resume {
        path: p.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(&sp).map_err(Error::io(&sp))?;
    let state: TrainState =
        serde_json::from_str(&text).map_err(|e| bad(&sp, format!("not JSON: {e}")))?;
    if state.options.as_ref() != Some(opts) || state.examples != examples {
        return Err(bad(
            &sp,
            format!(
                "written by a run with other settings or data ({:?}, {:?} examples); these are {opts:?}, {examples:?}",
                state.options, state.examples
            ),
        ));
    }
    let vp = dir.join("lora.safetensors");
    let t =
        candle_core::safetensors::load(&vp, &Device::Cpu).map_err(|e| bad(&vp, e.to_string()))?;
    let vars = lora.all_vars();
    for (i, v) in vars.iter().enumerate() {
        let x = t
            .get(&format!("var.{i}"))
            .filter(|x| x.dims() == v.dims())
            .ok_or_else(|| bad(&vp, format!("variable {i} missing or of the wrong shape")))?;
        v.set(x)?;
    }
    let opt = AdamW::load(&dir.join("optimizer.safetensors"), &vars)?;
    Ok(Some((opt, state)))
}

/// Trains (or resumes training) an adapter on the training examples, validating on the
/// validation ones; stops after
/// `stop_after` steps of this call when given (a later call resumes). Writes the adapter
/// (PEFT layout, Hugging Face row order) when the run is complete; returns the state.
pub fn train(
    m: &DenseModel,
    (train, val): (&[TokenExample], &[TokenExample]),
    opts: &TrainOptions,
    out: &Path,
    base: (&str, Option<String>),
    stop_after: Option<usize>,
    on_step: &mut dyn FnMut(&Progress),
) -> Result<TrainState> {
    let lr_ok = opts.lr.is_finite() && opts.lr > 0.0;
    if train.is_empty() || opts.epochs == 0 || opts.clip <= 0.0 || !lr_ok {
        return Err(Error::Settings(format!(
            "{} training examples, {} epochs, clip {}, lr {} (each must be positive)",
            train.len(),
            opts.epochs,
            opts.clip,
            opts.lr
        )));
    }
    std::fs::create_dir_all(out).map_err(Error::io(out))?;
    let lora = m.lora(opts.r, opts.alpha, &opts.modules, opts.seed)?;
    let vars = lora.all_vars();
    let ckpt: PathBuf = out.join("checkpoint");
    let examples = (train.len(), val.len());
    let (mut opt, mut state) = match load_checkpoint(&ckpt, &lora, opts, examples)? {
        Some(x) => x,
        None => {
            let state = TrainState {
                validation: mean_loss(m, &lora, val)?
                    .map(|v| (0, v))
                    .into_iter()
                    .collect(),
                options: Some(opts.clone()),
                examples,
                ..Default::default()
            };
            (AdamW::new(&vars)?, state)
        }
    };
    let per_epoch = train.len();
    let total = per_epoch * opts.epochs;
    let t0 = Instant::now();
    let (mut tokens, mut inputs, mut done_here) = (0usize, 0usize, 0usize);
    while state.step < total {
        if stop_after.is_some_and(|s| done_here >= s) {
            break;
        }
        let (epoch, pos) = (state.step / per_epoch, state.step % per_epoch);
        let e = &train[order(per_epoch, opts.seed, epoch)[pos]];
        let mut s = checkpointed::loss_and_grads(m, &e.input_ids, &e.labels, &lora)?;
        clip(&mut s.grads, opts.clip)?;
        opt.update(
            &vars,
            &s.grads,
            cosine(state.step, total, opts.warmup, opts.lr),
        )?;
        state.step += 1;
        state.train_loss.push(s.loss);
        tokens += s.tokens;
        inputs += e.input_ids.len();
        done_here += 1;
        on_step(&Progress {
            step: state.step,
            total,
            loss: s.loss,
            tokens_per_s: tokens as f64 / t0.elapsed().as_secs_f64().max(1e-9),
            inputs_per_s: inputs as f64 / t0.elapsed().as_secs_f64().max(1e-9),
        });
        let epoch_end = state.step % per_epoch == 0;
        let every = opts.validate_every > 0 && state.step % opts.validate_every == 0;
        if epoch_end || every {
            if let Some(v) = mean_loss(m, &lora, val)? {
                state.validation.push((state.step, v));
            }
        }
        if epoch_end || state.step % opts.checkpoint_every.max(1) == 0 {
            save_checkpoint(&ckpt, &lora, &opt, &state)?;
        }
    }
    save_checkpoint(&ckpt, &lora, &opt, &state)?;
    let losses = serde_json::json!({
        "train_loss": state.train_loss,
        "validation": state.validation,
    });
    let p = out.join("losses.json");
    std::fs::write(&p, format!("{losses}\n")).map_err(Error::io(&p))?;
    if state.step >= total {
        let mut adapter = lora.adapter(base.0, base.1)?;
        if m.cfg.rope_style == RopeStyle::Interleaved {
            adapter = adapter.for_interleaved_rope(
                m.cfg.num_heads,
                m.cfg.num_kv_heads,
                m.cfg.head_dim,
                true,
            )?;
        }
        adapter.save(&out.join("adapter"))?;
    }
    Ok(state)
}
