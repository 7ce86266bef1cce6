//! Quantized vs dense-weight forwards on CPU: prefill tok/s at several lengths and the
//! batched 6 x 32 verification over a shared prefix, with the memory each path costs and
//! what `dense = "auto"` decides for the model. Prints a markdown table (and writes it with
//! --out).

use anyhow::{Context, Result};
use candle_core::Device;
use clap::Parser;
use speccompact_bench::{filler_tokens, median, rss_bytes, verify_timing};
use speccompact_runtime::{set_threads, DenseMode, LoadOptions, Model};
use speccompact_store::Store;
use std::fmt::Write as _;

#[derive(Parser)]
struct Args {
    /// Store names or model paths.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["qwen2.5-coder-0.5b-instruct".to_string(), "qwen2.5-coder-1.5b-instruct".to_string()])]
    models: Vec<String>,
    /// CPU threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Prefill lengths.
    #[arg(long, value_delimiter = ',', default_values_t = vec![512usize, 2048])]
    prefill: Vec<usize>,
    /// Prefill chunk (the runtime default).
    #[arg(long, default_value_t = 512)]
    chunk: usize,
    /// Shared prefix of the batched verification.
    #[arg(long, default_value_t = 2048)]
    prefix: usize,
    /// Also write the table to this file.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Only report what `dense = "auto"` decides (appended to --out).
    #[arg(long)]
    probe_only: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    set_threads(args.threads)?;
    let dev = Device::Cpu;
    let store = Store::open_default()?;
    let mut t = String::new();
    writeln!(
        t,
        "| model | weights | extra memory | prefill {} | verify 1x32 | verify 6x32 (ratio) |",
        args.prefill
            .iter()
            .map(|n| format!("{n} tok/s"))
            .collect::<Vec<_>>()
            .join(" | prefill ")
    )?;
    writeln!(
        t,
        "|---|---|---|{}---|---|---|",
        "---|".repeat(args.prefill.len())
    )?;
    let mut notes = String::new();
    for name in &args.models {
        let path = store.resolve(name, &mut |_| {})?;
        let auto = Model::load(
            &path,
            &dev,
            LoadOptions {
                dense: DenseMode::Auto { min_rows: 128 },
                ..Default::default()
            },
        )?;
        let dd = auto.decoder.dense_decision().clone();
        writeln!(
            notes,
            "- {name}: `dense = \"auto\"` -> dense {} ({}); dense copies take {} MiB",
            if dd.dense {
                format!("on from {} rows", dd.min_rows)
            } else {
                "off".into()
            },
            dd.reason,
            dd.bytes >> 20
        )?;
        drop(auto);
        if args.probe_only {
            continue;
        }
        for (label, mode) in [
            ("quantized", DenseMode::Off),
            ("dense f32 (>= 32 rows)", DenseMode::On { min_rows: 32 }),
        ] {
            eprintln!("== {name} {label}");
            let rss0 = rss_bytes().unwrap_or(0);
            let m = Model::load(
                &path,
                &dev,
                LoadOptions {
                    dense: mode,
                    ..Default::default()
                },
            )?;
            let rss1 = rss_bytes().unwrap_or(0);
            let d = &m.decoder;
            let vocab = d.config().vocab_size;
            let mut cells = Vec::new();
            for &n in &args.prefill {
                let toks = filler_tokens(n, vocab);
                let s = median(1, || {
                    d.prefill(&toks, args.chunk)?;
                    Ok(())
                })?;
                eprintln!("prefill {n}: {:.1} tok/s", n as f64 / s);
                cells.push(format!("{:.1}", n as f64 / s));
            }
            let prefix = d
                .prefill(&filler_tokens(args.prefix, vocab), args.chunk)?
                .freeze()?;
            let (one, six) = verify_timing(d, &prefix)?;
            writeln!(t, "| {name} | {label} | {} MiB dense (rss +{} MiB) | {} | {:.0} ms | {:.0} ms ({:.2}x) |",
                d.dense_bytes() >> 20, rss1.saturating_sub(rss0) >> 20, cells.join(" | "), one * 1e3, six * 1e3, six / one)?;
        }
    }
    if args.probe_only {
        println!("{notes}");
        if let Some(p) = &args.out {
            let cmd: Vec<String> = std::env::args().collect();
            let old = std::fs::read_to_string(p).unwrap_or_default();
            std::fs::write(
                p,
                format!(
                    "{old}\n## What `dense = \"auto\"` decides\n\nCommand: `{}`\n\n{notes}",
                    cmd.join(" ")
                ),
            )?;
        }
        return Ok(());
    }
    let body = format!("{t}\n{notes}");
    println!("{body}");
    if let Some(p) = &args.out {
        let cmd: Vec<String> = std::env::args().collect();
        let text = format!("# Quantized vs dense weights for many-token forwards (CPU)\n\nCommand: `{}`\n\nThreads: {}; prefill in chunks of {}; verification over a {}-token shared prefix.\n\n{body}", cmd.join(" "), args.threads, args.chunk, args.prefix);
        std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
