//! What one LoRA training step costs with the frozen projections as their own op (backward:
//! the input's gradient only) against candle's matmul (backward: the input's and the frozen
//! weight's, the latter thrown away). Each example is one step's loss and gradients, a block
//! at a time, as `align train` computes them; the table gives seconds per step and input
//! tokens per second for both, on the same examples, in one process.

use anyhow::{Context, Result};
use clap::Parser;
use speccompact_align::train::{checkpointed, read_tokens, DenseModel};
use speccompact_runtime::adapter::MODULES;
use speccompact_runtime::set_threads;
use speccompact_store::Store;
use std::fmt::Write as _;
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// An `align data` folder (its `train.tokens.jsonl` is read).
    #[arg(long)]
    data: std::path::PathBuf,
    /// The drafter: store name or path.
    #[arg(long, default_value = "smollm2-135m-instruct")]
    model: String,
    /// Examples timed per variant (the first ones of the file).
    #[arg(long, default_value_t = 2)]
    examples: usize,
    /// CPU threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// LoRA rank.
    #[arg(long, default_value_t = 8)]
    rank: usize,
    /// Also write the table to this file.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    set_threads(args.threads)?;
    let store = Store::open_default()?;
    let path = store.resolve(&args.model, &mut |_| {})?;
    let base = DenseModel::from_path(&path).with_context(|| format!("{}", path.display()))?;
    let examples = read_tokens(&args.data.join("train.tokens.jsonl"))?;
    let examples = &examples[..args.examples.min(examples.len())];
    let modules: Vec<String> = MODULES.iter().map(|(m, _)| m.to_string()).collect();
    let mut table = String::from(
        "| frozen projections | examples | input tokens | s per step | input tokens/s |\n|---|---|---|---|---|\n",
    );
    for (name, m) in [
        ("own op (input gradient only)", base.clone()),
        (
            "candle matmul (weight gradient too)",
            base.with_weight_gradients(),
        ),
    ] {
        let lora = m.lora(args.rank, 2.0 * args.rank as f32, &modules, 0)?;
        let (mut secs, mut tokens) = (0.0, 0);
        for ex in examples {
            let t0 = Instant::now();
            let step = checkpointed::loss_and_grads(&m, &ex.input_ids, &ex.labels, &lora)?;
            secs += t0.elapsed().as_secs_f64();
            tokens += ex.input_ids.len();
            eprintln!(
                "{name}: {} tokens, loss {:.4}, {:.1} s",
                ex.input_ids.len(),
                step.loss,
                t0.elapsed().as_secs_f64()
            );
        }
        let n = examples.len().max(1) as f64;
        let line = format!(
            "| {name} | {} | {tokens} | {:.1} | {:.1} |\n",
            examples.len(),
            secs / n,
            tokens as f64 / secs
        );
        eprint!("{line}");
        table.push_str(&line);
    }
    let mut out = String::new();
    writeln!(
        out,
        "# LoRA step cost: frozen projections' gradients\n\nCommand: `{}`\n\nThreads: {}; rank {}, all seven projections.\n\n{table}",
        std::env::args().collect::<Vec<_>>().join(" "),
        args.threads,
        args.rank
    )?;
    print!("{out}");
    if let Some(p) = &args.out {
        std::fs::write(p, &out)?;
    }
    Ok(())
}
