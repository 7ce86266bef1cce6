//! `speccompact align data`: training data for the drafter, written by the target on the
//! drafter's own prompts (see `speccompact_align::data`).

use crate::load::{compactor, counting_bar, resolve, tokenizer};
use crate::settings::{EngineArgs, RuntimeArgs};
use anyhow::{bail, Context, Result};
use speccompact_align::{DataOptions, ModelFile};
use speccompact_store::Store;
use std::path::PathBuf;

/// Flags of `align`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: AlignCmd,
}

/// What `align` does.
#[derive(clap::Subcommand)]
pub enum AlignCmd {
    /// The target writes every slot of each training session on the drafter's prompts;
    /// filtered examples as prompt/completion JSONL, pre-tokenized for the drafter, with a
    /// manifest. Resumable: run it again on the same folder to go on.
    Data(DataArgs),
    /// LoRA on the drafter over what `align data` wrote: one example per step, AdamW on a
    /// cosine schedule, validation loss, checkpoints (run again to resume); the adapter in
    /// PEFT's layout and the loss curve (`loss.svg`) in the output folder.
    Train(TrainArgs),
}

/// Flags of `align train`.
#[derive(clap::Args)]
pub struct TrainArgs {
    /// Folder written by `align data` (its `*.tokens.jsonl` and `manifest.json`).
    #[arg(long)]
    pub data: PathBuf,
    /// Output folder (checkpoints, losses, the adapter); a checkpoint in it is resumed.
    #[arg(long)]
    pub out: PathBuf,
    /// The drafter (default: the one the data were tokenized for).
    #[arg(long)]
    pub drafter: Option<String>,
    /// LoRA rank.
    #[arg(long, default_value_t = 8)]
    pub rank: usize,
    /// LoRA alpha (the side path is scaled by alpha / rank).
    #[arg(long, default_value_t = 16.0)]
    pub alpha: f32,
    /// Adapted projections, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_values_t = speccompact_runtime::adapter::MODULES.map(|(m, _)| m.to_string())
    )]
    pub modules: Vec<String>,
    /// Passes over the training examples.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-4)]
    pub lr: f64,
    /// Warm-up steps.
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,
    /// Largest global gradient norm.
    #[arg(long, default_value_t = 1.0)]
    pub clip: f64,
    /// Seed of the initialization and the order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Steps between checkpoints.
    #[arg(long, default_value_t = 25)]
    pub checkpoint_every: usize,
    /// Steps between validation losses (0: each epoch's end only).
    #[arg(long, default_value_t = 0)]
    pub validate_every: usize,
    /// Stop after N steps of this run (run again to go on).
    #[arg(long)]
    pub stop_after: Option<usize>,
    /// Use only the first N training and N validation examples.
    #[arg(long)]
    pub max_examples: Option<usize>,
}

/// Flags of `align data`.
#[derive(clap::Args)]
pub struct DataArgs {
    /// JSONL file of training sessions (the evaluation sessions' schema).
    #[arg(long)]
    pub data: PathBuf,
    /// Output folder (created; a previous run's sessions in it are kept and reused).
    #[arg(long)]
    pub out: PathBuf,
    /// Only the first N sessions of the file.
    #[arg(long)]
    pub sessions: Option<usize>,
    /// Most drafter tokens in a prompt: a longer history keeps its first message and as
    /// many of its last as fit.
    #[arg(long, default_value_t = 2048)]
    pub max_prompt_tokens: usize,
    /// Percentage of sessions (by a hash of their id) kept for validation.
    #[arg(long, default_value_t = 10)]
    pub validation_percent: u32,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Runs `align`.
pub fn run(a: &Args, rt: &RuntimeArgs, store: &Store) -> Result<()> {
    match &a.cmd {
        AlignCmd::Data(d) => data(d, rt, store),
        AlignCmd::Train(t) => train(t, rt, store),
    }
}

fn data(a: &DataArgs, rt: &RuntimeArgs, store: &Store) -> Result<()> {
    let mut sessions = speccompact_eval::load_sessions(&a.data)?;
    if let Some(n) = a.sessions {
        if n == 0 {
            bail!("--sessions 0 selects nothing");
        }
        sessions.truncate(n);
    }
    let c = compactor(&rt.settings()?, store, &a.engine)?;
    let cfg = c.config();
    let drafter = ModelFile {
        name: cfg.drafter.clone(),
        path: resolve(store, &cfg.drafter)?,
    };
    let target = ModelFile {
        name: cfg.target.clone(),
        path: resolve(store, &cfg.target)?,
    };
    let tok = tokenizer(&drafter.path)
        .with_context(|| format!("loading the tokenizer of {}", drafter.name))?;
    let opts = DataOptions {
        out: a.out.clone(),
        max_prompt_tokens: a.max_prompt_tokens,
        validation_percent: a.validation_percent,
    };
    let bar = counting_bar(
        sessions.len(),
        "{bar:30} {pos}/{len} sessions {msg} [{elapsed}, ETA {eta}]",
    );
    let summary = speccompact_align::build(
        &c,
        &tok,
        [&drafter, &target],
        &a.data,
        &sessions,
        &opts,
        &mut |done, id, resumed| {
            bar.set_position(done as u64);
            bar.set_message(format!("{id}{}", if resumed { " (resumed)" } else { "" }));
        },
    )?;
    bar.finish_and_clear();
    let per = if summary.built > 0 {
        format!(
            ", {:.1} s per session built",
            summary.seconds / summary.built as f64
        )
    } else {
        String::new()
    };
    println!(
        "{} sessions ({} built in {:.1} s{per}, {} resumed); examples {:?}; dropped {:?}; written to {}",
        summary.sessions,
        summary.built,
        summary.seconds,
        summary.sessions - summary.built,
        summary.examples,
        summary.dropped,
        a.out.display()
    );
    Ok(())
}

/// Peak resident memory of this process, in MiB (Linux), for the summary.
fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = s
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

fn train(a: &TrainArgs, rt: &RuntimeArgs, store: &Store) -> Result<()> {
    use speccompact_align::train::{read_tokens, DenseModel, TrainOptions};
    rt.settings()?;
    let mpath = a.data.join("manifest.json");
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&mpath).with_context(|| format!("reading {}", mpath.display()))?,
    )
    .with_context(|| format!("parsing {}", mpath.display()))?;
    let want = &manifest["drafter"];
    let name = match &a.drafter {
        Some(d) => d.clone(),
        None => want["name"]
            .as_str()
            .context("the manifest names no drafter; pass --drafter")?
            .to_string(),
    };
    let path = resolve(store, &name)?;
    let sha = if path.is_file() {
        speccompact_eval::sha256_file(&path)?
    } else {
        String::new()
    };
    if want["sha256"]
        .as_str()
        .is_some_and(|w| !w.is_empty() && w != sha)
    {
        bail!(
            "the data in {} were tokenized for {} (SHA-256 {}), not for {name} ({sha})",
            a.data.display(),
            want["name"],
            want["sha256"]
        );
    }
    let mut tr = read_tokens(&a.data.join("train.tokens.jsonl"))?;
    let mut val = read_tokens(&a.data.join("validation.tokens.jsonl"))?;
    if let Some(n) = a.max_examples {
        tr.truncate(n);
        val.truncate(n);
    }
    let t0 = std::time::Instant::now();
    let model = DenseModel::from_path(&path)?;
    tracing::info!(ms = t0.elapsed().as_millis() as u64, "dense drafter loaded");
    let opts = TrainOptions {
        r: a.rank,
        alpha: a.alpha,
        modules: a.modules.clone(),
        epochs: a.epochs,
        lr: a.lr,
        warmup: a.warmup,
        clip: a.clip,
        seed: a.seed,
        checkpoint_every: a.checkpoint_every,
        validate_every: a.validate_every,
    };
    let total = tr.len() * a.epochs;
    let bar = counting_bar(
        total,
        "{bar:30} {pos}/{len} steps {msg} [{elapsed}, ETA {eta}]",
    );
    let (mut speed, mut inputs) = (0.0, 0.0);
    let t1 = std::time::Instant::now();
    let state = speccompact_align::train::train(
        &model,
        (&tr, &val),
        &opts,
        &a.out,
        (&name, Some(sha).filter(|s| !s.is_empty())),
        a.stop_after,
        &mut |p| {
            (speed, inputs) = (p.tokens_per_s, p.inputs_per_s);
            bar.set_position(p.step as u64);
            bar.set_message(format!(
                "loss {:.3}, {:.0} input tok/s",
                p.loss, p.inputs_per_s
            ));
        },
    )?;
    bar.finish_and_clear();
    let svg = speccompact_align::curve::svg(
        &format!("{name}: LoRA r={} on {} examples", a.rank, tr.len()),
        &state.train_loss,
        &state.validation,
    );
    let p = a.out.join("loss.svg");
    std::fs::write(&p, svg).with_context(|| format!("writing {}", p.display()))?;
    println!(
        "{} of {total} steps ({:.1} s this run; {inputs:.1} input and {speed:.2} labelled tokens/s in steps); validation {:?}; peak memory {:.0} MiB; {}",
        state.step,
        t1.elapsed().as_secs_f64(),
        state.validation,
        peak_rss_mib().unwrap_or(f64::NAN),
        if state.step >= total {
            format!("adapter in {}", a.out.join("adapter").display())
        } else {
            "run again to go on".to_string()
        }
    );
    Ok(())
}
