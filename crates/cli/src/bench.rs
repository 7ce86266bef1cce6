//! `speccompact bench`: every method on every session of a JSONL file in one process, as a
//! markdown table or the JSON report (`speccompact_eval::bench::BenchReport`), optionally
//! with a re-compaction per session. With `--lookup off,on,…` each lookup mode is a variant
//! over the same loaded weights, run in turn on each session.

use crate::files::{headed, json_text, read_text, write_report};
use crate::load::{compactor, counting_bar};
use crate::settings::{trimmed, EngineArgs, MethodArg, RuntimeArgs};
use anyhow::{Context, Result};
use clap::ValueEnum;
use speccompact_engine::{Compactor, Method};
use speccompact_eval::bench;
use speccompact_history::parse_sessions;
use speccompact_store::Store;
use std::path::PathBuf;

/// Flags of `bench`.
#[derive(clap::Args)]
pub struct Args {
    /// JSONL file of sessions (objects with `messages`).
    #[arg(long)]
    pub data: PathBuf,
    /// Methods, comma-separated.
    #[arg(
        long,
        default_value = "speculative,sequential,target-self,drafter-only",
        value_delimiter = ',',
        value_parser = trimmed::<MethodArg>(),
        hide_possible_values = true
    )]
    pub methods: Vec<MethodArg>,
    /// Only the first N sessions.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Output: `table` (markdown) or `json` (`runs` and `summary`).
    #[arg(long, default_value = "table", hide_possible_values = true)]
    pub format: Format,
    /// Also write the output to this file (atomically), headed by the command line.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write the JSON report (`runs` and `summary`) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also measure a re-compaction per session: speculative on the session without its
    /// last N messages, then on the whole (the second reuses the first's prefixes).
    #[arg(long)]
    pub recompact: Option<usize>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// What `bench` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A markdown table per method.
    Table,
    /// The JSON report: `runs` and `summary`.
    Json,
}

/// Runs `bench`.
pub fn run(a: &Args, rt: &RuntimeArgs, store: &Store) -> Result<()> {
    let methods: Vec<Method> = a.methods.iter().map(|&m| m.into()).collect();
    let data = &a.data;
    let text = read_text(data)?;
    let mut sessions =
        parse_sessions(&text).with_context(|| format!("parsing {}", data.display()))?;
    if let Some(n) = a.limit {
        sessions.truncate(n);
    }
    let modes = &rt.lookup;
    let c = compactor(
        &rt.settings_with_lookup(modes.first().copied())?,
        store,
        &a.engine,
    )?;
    let variants: Vec<(String, Compactor)> = if modes.len() > 1 {
        modes
            .iter()
            .map(|&m| Ok((format!("lookup {}", m.name()), c.with_lookup(m)?)))
            .collect::<Result<_>>()?
    } else {
        vec![(String::new(), c.clone())]
    };
    let variants: Vec<bench::Variant> = variants
        .iter()
        .map(|(label, compactor)| bench::Variant {
            label: label.clone(),
            compactor,
        })
        .collect();
    let bar = counting_bar(
        sessions.len() * methods.len() * variants.len(),
        "{bar:30} {pos}/{len} {msg} [{elapsed}]",
    );
    let mut first = true;
    let report = bench::run(&variants, &sessions, &methods, &mut |i, v, m| {
        if !first {
            bar.inc(1);
        }
        first = false;
        let id = sessions[i].id.as_deref().unwrap_or("?");
        bar.set_message(format!("{id} {m} {v}"));
    })?;
    bar.finish_and_clear();
    let mut recompactions = Vec::new();
    if let Some(n) = a.recompact {
        for h in &sessions {
            let r = bench::recompaction(&c, h, Method::Speculative, n)?;
            tracing::info!(
                session = r.session.as_str(),
                speedup = r.speedup(),
                "re-compaction done"
            );
            recompactions.push(r);
        }
    }
    let header = format!(
        "drafter {}, target {}, eta {}, {} sessions of {}\n\n",
        c.config().drafter,
        c.config().target,
        c.config().eta,
        sessions.len(),
        data.display()
    );
    let text = match a.format {
        Format::Json => json_text(&report)?,
        Format::Table if recompactions.is_empty() => header + &report.table(),
        Format::Table => format!(
            "{header}{}\nRe-compaction (speculative, session grown by its last messages):\n\n{}",
            report.table(),
            bench::recompaction_table(&recompactions)
        ),
    };
    print!("{text}");
    let text = match a.format {
        Format::Table => headed("Compaction benchmark", &text),
        Format::Json => text,
    };
    write_report(a.out.as_deref(), &text, a.json.as_deref(), &report)
}
