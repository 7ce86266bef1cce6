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
