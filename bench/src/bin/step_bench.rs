//! What a step forward costs by the tokens it carries: one row or six, each with 1…16 new
//! tokens and logits at every one of them (as a decode step that checks drafted tokens),
//! over a shared prefix of each depth. The ratio to the one-token step is what token lookup
//! and line verification pay for what they check. Prints a markdown table (and writes it
//! with --out). With `--profile`, a second table splits each forward by operation
//! (projections, attention, norms, rotary, cache append, logits, argmax) and names the rest
//! (tensor glue, allocation, dispatch). With `--adapter DIR` each model is measured again
//! with that LoRA adapter on it (its side paths), in the same run.

use anyhow::Result;
use candle_core::Device;
use clap::Parser;
use speccompact_bench::{filler_tokens, median};
use speccompact_runtime::profile::{self, Op};
use speccompact_runtime::{argmax, set_threads, LoadOptions, LogitsAt, Model, Row};
use speccompact_store::Store;
use std::fmt::Write as _;

#[derive(Parser)]
struct Args {
    /// Store names or GGUF paths.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["qwen2.5-coder-1.5b-instruct".to_string()])]
    models: Vec<String>,
    /// CPU threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Shared-prefix depths.
    #[arg(long, value_delimiter = ',', default_values_t = vec![16usize, 4096])]
    depths: Vec<usize>,
    /// Rows per forward.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 6])]
    rows: Vec<usize>,
    /// New tokens per row.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 2, 3, 4, 8, 16])]
    tokens: Vec<usize>,
    /// Runs per figure (the median is shown).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Also write the table to this file.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Also time each operation of the forward (mean of `--runs` more forwards).
    #[arg(long)]
    profile: bool,
    /// A LoRA adapter (PEFT layout) for the models: each is measured without and with it.
    #[arg(long)]
    adapter: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    set_threads(args.threads)?;
    let store = Store::open_default()?;
    let mut table = String::from(
        "| model | depth | rows | tokens per row | ms per forward | × one token | ms per token |\n|---|---|---|---|---|---|---|\n",
    );
    let mut ops = String::new();
    if args.profile {
        ops.push_str("| model | depth | rows | tokens per row | forward ms |");
        for op in Op::ALL {
            ops.push_str(&format!(" {} |", op.name()));
        }
        ops.push_str(" argmax | rest: glue, allocation, dispatch |\n|---|---|---|---|---|");
        ops.push_str(&"---|".repeat(Op::ALL.len() + 2));
        ops.push('\n');
    }
    let mut models = Vec::new();
    for name in &args.models {
        let path = store.resolve(name, &mut |_| {})?;
        let m = Model::load(&path, &Device::Cpu, LoadOptions::default())?;
        if let Some(dir) = &args.adapter {
            let adapted = speccompact_loader::with_adapter(&m, &path, dir)?;
            models.push((name.clone(), m));
            models.push((format!("{name} + adapter"), adapted));
        } else {
            models.push((name.clone(), m));
        }
    }
    for (name, m) in &models {
        let d = &m.decoder;
        let vocab = d.config().vocab_size;
        for &depth in &args.depths {
            let prefix = d.prefill(&filler_tokens(depth, vocab), 512)?.freeze()?;
            for &rows in &args.rows {
                let mut one = None;
                for &t in &args.tokens {
                    let toks: Vec<Vec<u32>> = (0..rows)
                        .map(|r| filler_tokens(t + r + 1, vocab)[r + 1..].to_vec())
                        .collect();
                    let s = median(args.runs, || {
                        let mut seqs: Vec<_> = (0..rows).map(|_| prefix.fork()).collect();
                        let mut batch: Vec<Row<'_>> = seqs
                            .iter_mut()
                            .zip(&toks)
                            .map(|(s, t)| Row { seq: s, tokens: t })
                            .collect();
                        d.forward(&mut batch, LogitsAt::All)?;
                        Ok(())
                    })?;
                    let base = *one.get_or_insert(s);
                    let line = format!(
                        "| {name} | {depth} | {rows} | {t} | {:.1} | {:.2}x | {:.1} |\n",
                        s * 1e3,
                        s / base,
                        s * 1e3 / (rows * t) as f64
                    );
                    eprint!("{line}");
                    table.push_str(&line);
                    if args.profile {
                        let line = profile_line(d, &prefix, &toks, args.runs)?;
                        let line = format!("| {name} | {depth} | {rows} | {t} | {line}\n");
                        eprint!("{line}");
                        ops.push_str(&line);
                    }
                }
            }
        }
    }
    let mut out = String::new();
    writeln!(
        out,
        "# Step forward cost by tokens per row\n\nCommand: `{}`\n\nThreads: {}; logits at every new token.\n\n{table}",
        std::env::args().collect::<Vec<_>>().join(" "),
        args.threads
    )?;
    if args.profile {
        writeln!(
            out,
            "\nPer operation, ms per forward (mean of {} forwards; argmax over every row's logits):\n\n{ops}",
            args.runs
        )?;
    }
    print!("{out}");
    if let Some(p) = &args.out {
        std::fs::write(p, &out)?;
    }
    Ok(())
}

/// One profiled figure: the mean forward time, each operation's share, argmax and the rest,
/// in ms, as table cells.
fn profile_line(
    d: &speccompact_runtime::Decoder,
    prefix: &std::sync::Arc<speccompact_runtime::Prefix>,
    toks: &[Vec<u32>],
    runs: usize,
) -> Result<String> {
    let runs = runs.max(1);
    profile::take();
    let (mut forward, mut arg) = (0.0, 0.0);
    for _ in 0..runs {
        let mut seqs: Vec<_> = toks.iter().map(|_| prefix.fork()).collect();
        let mut batch: Vec<Row<'_>> = seqs
            .iter_mut()
            .zip(toks)
            .map(|(s, t)| Row { seq: s, tokens: t })
            .collect();
        profile::enable(true);
        let t0 = std::time::Instant::now();
        let logits = d.forward(&mut batch, LogitsAt::All);
        forward += t0.elapsed().as_secs_f64();
        profile::enable(false);
        let t1 = std::time::Instant::now();
        for l in logits? {
            for i in 0..l.dim(0)? {
                std::hint::black_box(argmax(&l.get(i)?)?);
            }
        }
        arg += t1.elapsed().as_secs_f64();
    }
    let ms = |s: f64| s * 1e3 / runs as f64;
    let spans = profile::take();
    let covered: f64 = spans.iter().map(|(_, s)| s).sum();
    let mut line = format!("{:.2} |", ms(forward));
    for (_, s) in &spans {
        line.push_str(&format!(" {:.2} |", ms(*s)));
    }
    line.push_str(&format!(" {:.2} | {:.2} |", ms(arg), ms(forward - covered)));
    Ok(line)
}
