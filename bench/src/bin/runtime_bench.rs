//! End-to-end runtime benchmark on real GGUF models, beside candle-transformers' reference
//! on the same file in the same process. Prints a markdown table (and writes it with --out).
//!
//! Columns: prefill tok/s (single sequence), decode tok/s (greedy single sequence after a
//! prefix of each `--decode-depths` depth, as llama-bench's `-n N -d D`), fork cost, and batched verification: 6 rows x 32 new tokens over a
//! 2,048-token shared prefix, against one row of 32 tokens over the same prefix.

use anyhow::{Context, Result};
use candle_core::Device;
use clap::Parser;
use speccompact_bench::{
    filler_tokens, median, rss_bytes, step_timing, time, verify_timing, Reference,
};
use speccompact_runtime::{set_threads, DenseMode, KernelMode, LoadOptions, LogitsAt, Model, Row};
use speccompact_store::Store;
use std::fmt::Write as _;

#[derive(Parser)]
struct Args {
    /// Store names or GGUF paths.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["smollm2-135m-instruct".to_string(), "qwen2.5-coder-1.5b-instruct".to_string()])]
    models: Vec<String>,
    /// CPU threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Prefill lengths to measure.
    #[arg(long, value_delimiter = ',', default_values_t = vec![512usize, 2048])]
    prefill: Vec<usize>,
    /// Tokens decoded for the decode figure.
    #[arg(long, default_value_t = 64)]
    decode: usize,
    /// Prefix depths the decode figure starts from (0: one token).
    #[arg(long, value_delimiter = ',', default_values_t = vec![64usize])]
    decode_depths: Vec<usize>,
    /// Runs per prefill and decode figure (the median is shown).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Shared-prefix length of the batched verification.
    #[arg(long, default_value_t = 2048)]
    prefix: usize,
    /// Prefill chunk of our runtime (its default setting); the reference takes the whole
    /// prompt in one forward, as it must.
    #[arg(long, default_value_t = 512)]
    chunk: usize,
    /// Skip the candle-transformers reference columns.
    #[arg(long)]
    no_reference: bool,
    /// Skip the dense-weight rows.
    #[arg(long)]
    no_dense: bool,
    /// Quantized matmul: on (kernels crate; `auto` reads as on), off (candle).
    #[arg(long, default_value = "on")]
    kernels: String,
    /// Also write the table to this file.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Also write the prefill and decode figures as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// Machine-readable figures of one model (`--json`).
#[derive(serde::Serialize)]
struct Figures {
    model: String,
    /// (tokens, tok/s) per prefill length.
    prefill: Vec<(usize, f64)>,
    /// (depth, tok/s) per decode depth.
    decode: Vec<(usize, f64)>,
    /// (prefix depth, one-row step ms, six-row step ms).
    step: Option<(usize, f64, f64)>,
}

struct Line {
    model: String,
    metric: String,
    ours: String,
    reference: String,
    ratio: String,
}

fn main() -> Result<()> {
    let args = Args::parse();
    set_threads(args.threads)?;
    let dev = Device::Cpu;
    let store = Store::open_default()?;
    let mut lines: Vec<Line> = Vec::new();
    let mut figures: Vec<Figures> = Vec::new();
    let kernels = match args.kernels.as_str() {
        "on" | "auto" => KernelMode::On,
        "off" => KernelMode::Off,
        other => anyhow::bail!("--kernels must be on or off, not `{other}`"),
    };
    let load = LoadOptions {
        kernels,
        ..Default::default()
    };
    for name in &args.models {
        let path = store.resolve(name, &mut |_| {})?;
        let push = |lines: &mut Vec<Line>,
                    metric: String,
                    ours: f64,
                    reference: Option<f64>,
                    unit: &str| {
            lines.push(Line {
                model: name.clone(),
                metric,
                ours: format!("{ours:.1} {unit}"),
                reference: reference.map_or("n/a".into(), |r| format!("{r:.1} {unit}")),
                ratio: reference.map_or("".into(), |r| format!("{:.2}x", ours / r)),
            })
        };
        eprintln!("== {name}");
        let mut fig = Figures {
            model: name.clone(),
            prefill: Vec::new(),
            decode: Vec::new(),
            step: None,
        };
        let rss0 = rss_bytes().unwrap_or(0);
        let (m, load_s) = time(|| Ok(Model::load(&path, &dev, load)?))?;
        let rss1 = rss_bytes().unwrap_or(0);
        let d = &m.decoder;
        let vocab = d.config().vocab_size;
        lines.push(Line {
            model: name.clone(),
            metric: "load (s) / resident MiB".into(),
            ours: format!("{load_s:.1} s / {} MiB", (rss1.saturating_sub(rss0)) >> 20),
            reference: String::new(),
            ratio: String::new(),
        });
        // Prefill.
        for &n in &args.prefill {
            let toks = filler_tokens(n, vocab);
            let ours = median(args.runs, || {
                d.prefill(&toks, args.chunk)?;
                Ok(())
            })?;
            fig.prefill.push((n, n as f64 / ours));
            let r = if args.no_reference {
                None
            } else {
                let mut reference = Reference::load(&path, &dev)?;
                let (_, s) = time(|| reference.forward(&toks, 0, &dev))?;
                Some(n as f64 / s)
            };
            eprintln!("prefill {n}: ours {:.1} tok/s", n as f64 / ours);
            push(
                &mut lines,
                format!("prefill {n} tok/s"),
                n as f64 / ours,
                r,
                "tok/s",
            );
        }
        // Decode after a prefix of each depth.
        let steps = args.decode;
        for &depth in &args.decode_depths {
            let prompt = filler_tokens(depth.max(1), vocab);
            // Prefilled once; each run decodes on a fork of it.
            let prefix = d.prefill(&prompt, args.chunk)?.freeze()?;
            let ours = median(args.runs, || {
                let mut seq = prefix.fork();
                let mut tok = 300u32;
                for _ in 0..steps {
                    let l = d.forward(
                        &mut [Row {
                            seq: &mut seq,
                            tokens: &[tok],
                        }],
                        LogitsAt::Last,
                    )?;
                    tok = speccompact_runtime::argmax(&l[0])?;
                }
                Ok(())
            })?;
            drop(prefix);
            let ours_decode = steps as f64 / ours;
            let r = if args.no_reference {
                None
            } else {
                let mut reference = Reference::load(&path, &dev)?;
                reference.forward(&prompt, 0, &dev)?;
                let mut tok = 300u32;
                let (_, s) = time(|| {
                    for i in 0..steps {
                        let l = reference.forward(&[tok], prompt.len() + i, &dev)?;
                        tok = l.flatten_all()?.argmax(0)?.to_scalar::<u32>()?;
                    }
                    Ok(())
                })?;
                Some(steps as f64 / s)
            };
            eprintln!("decode {steps} at depth {depth}: ours {ours_decode:.1} tok/s");
            fig.decode.push((depth, ours_decode));
            push(
                &mut lines,
                format!("decode {steps} tok/s at depth {depth}"),
                ours_decode,
                r,
                "tok/s",
            );
        }
        figures.push(fig);
        // Shared prefix, fork, batched verification.
        let ptoks = filler_tokens(args.prefix, vocab);
        let prefix = d.prefill(&ptoks, 512)?.freeze()?;
        let fork_s = median(5, || {
            for _ in 0..1000 {
                std::hint::black_box(prefix.fork());
            }
            Ok(())
        })? / 1000.0;
        lines.push(Line {
            model: name.clone(),
            metric: format!("fork of a {}-token prefix", args.prefix),
            ours: format!(
                "{:.2} us, 0 bytes copied (prefix KV {} MiB shared)",
                fork_s * 1e6,
                prefix.kv_bytes() >> 20
            ),
            reference: "no fork (cache is per model)".into(),
            ratio: String::new(),
        });
        let (one, six) = step_timing(d, &prefix)?;
        if let Some(f) = figures.last_mut() {
            f.step = Some((args.prefix, one * 1e3, six * 1e3));
        }
        lines.push(Line {
            model: name.clone(),
            metric: format!("decode step over {} prefix, 1 row / 6 rows", args.prefix),
            ours: format!(
                "{:.1} ms / {:.1} ms ({:.2}x one row)",
                one * 1e3,
                six * 1e3,
                six / one
            ),
            reference: String::new(),
            ratio: String::new(),
        });
        let (one, six) = verify_timing(d, &prefix)?;
        lines.push(Line {
            model: name.clone(),
            metric: format!("verify 1x32 over {} prefix", args.prefix),
            ours: format!("{:.0} ms", one * 1e3),
            reference: String::new(),
            ratio: String::new(),
        });
        lines.push(Line {
            model: name.clone(),
            metric: format!("verify 6x32 batched over {} prefix", args.prefix),
            ours: format!("{:.0} ms ({:.2}x one row)", six * 1e3, six / one),
            reference: "batch > 1 unsupported".into(),
            ratio: String::new(),
        });
        drop(m);
        if args.no_dense {
            continue;
        }
        // Dense weights for many-token forwards.
        let rss0 = rss_bytes().unwrap_or(0);
        let dense = Model::load(
            &path,
            &dev,
            LoadOptions {
                dense: DenseMode::On { min_rows: 16 },
                ..load
            },
        )?;
        let rss1 = rss_bytes().unwrap_or(0);
        for &n in &args.prefill {
            let toks = filler_tokens(n, vocab);
            let s = median(1, || {
                dense.decoder.prefill(&toks, args.chunk)?;
                Ok(())
            })?;
            let dense_mib = dense.decoder.dense_bytes() >> 20;
            lines.push(Line {
                model: name.clone(),
                metric: format!("prefill {n} tok/s, dense f32 weights"),
                ours: format!(
                    "{:.1} tok/s (+{dense_mib} MiB dense, rss +{} MiB)",
                    n as f64 / s,
                    rss1.saturating_sub(rss0) >> 20
                ),
                reference: String::new(),
                ratio: String::new(),
            });
            eprintln!("dense prefill {n}: {:.1} tok/s", n as f64 / s);
        }
    }
    let mut t = String::new();
    writeln!(
        t,
        "| model | metric | speccompact | candle-transformers | ratio |"
    )?;
    writeln!(t, "|---|---|---|---|---|")?;
    for l in &lines {
        writeln!(
            t,
            "| {} | {} | {} | {} | {} |",
            l.model, l.metric, l.ours, l.reference, l.ratio
        )?;
    }
    println!("{t}");
    if let Some(p) = &args.out {
        let cmd: Vec<String> = std::env::args().collect();
        let body = format!(
            "# Runtime benchmark\n\nCommand: `{}`\n\nThreads: {}, prefill chunk {} (reference: one forward), CPU: {}\n\n{t}",
            cmd.join(" "),
            args.threads,
            args.chunk,
            cpu_name()
        );
        std::fs::write(p, body).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}
