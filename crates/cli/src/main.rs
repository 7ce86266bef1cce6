//! `speccompact`: compaction of agent histories (`compact`), method comparison (`bench`),
//! evaluation (`eval`), verifier calibration (`calibrate`), the workspace (`ingest`,
//! `state`, `confirm`, `assemble`, `delete`), drafter alignment data (`align`), model store
//! management (`models`) and greedy generation with the runtime (`generate`).
//!
//! This file owns the command tree and the dispatch only. Each command's flags and work are
//! in its module (`compact.rs`, `bench.rs`, `eval.rs`, `calibrate.rs`, `workspace.rs`,
//! `align.rs`, `models.rs`, `generate.rs`); the shared pieces are `settings.rs` (flags to settings, the
//! value enums), `load.rs` (models, tokenizer, progress bars) and `files.rs` (histories in,
//! reports out).

mod align;
mod bench;
mod calibrate;
mod compact;
mod eval;
mod files;
mod generate;
mod load;
mod models;
mod settings;
mod workspace;

use anyhow::Result;
use clap::{Parser, Subcommand};
use speccompact_store::Store;

#[derive(Parser)]
#[command(
    name = "speccompact",
    version,
    about = "Fast, faithful compaction of LLM-agent histories"
)]
struct Cli {
    #[command(flatten)]
    runtime: settings::RuntimeArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compact an agent history (OpenAI / Anthropic messages, JSON or JSONL; `-` for stdin)
    /// into the six-slot summary.
    Compact(compact::Args),
    /// Run every method on every session of a JSONL file in one process and compare them.
    Bench(bench::Args),
    /// Evaluate what each method's compacted context keeps: probes, answers to questions,
    /// next-step agreement, unsourced assertions, slot adequacy and sizes, with bootstrap
    /// intervals; optionally drift over recursive generations.
    Eval(eval::Args),
    /// Append a history to a workspace session: events are redacted, classified, indexed,
    /// and their state candidates written under the write rules.
    Ingest(workspace::IngestArgs),
    /// Show a session's protected state (valid records), or every version of one field.
    State(workspace::StateArgs),
    /// Confirm a pending candidate record with an event written by the user or the owner.
    Confirm(workspace::ConfirmArgs),
    /// Build the context for a task within a budget: state, summary, evidence, and the list
    /// of what was not loaded.
    Assemble(workspace::AssembleArgs),
    /// Delete one event (from log, index, caches and derived summaries) or a whole session.
    Delete(workspace::DeleteArgs),
    /// Measure how well a target's one-token judgment separates true from false summary
    /// lines, per judgment prompt variant; write the calibrated η and the best variant.
    Calibrate(calibrate::Args),
    /// Drafter alignment: `align data` has the target write every slot on the drafter's
    /// prompts over training sessions (filtered, split, pre-tokenized, with a manifest).
    Align(align::Args),
    /// Manage the model store.
    Models(models::Args),
    /// Greedy continuation of a prompt (rendered through the model's chat template).
    Generate(generate::Args),
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let store = Store::open_default()?;
    let rt = &cli.runtime;
    match &cli.cmd {
        Cmd::Compact(a) => compact::run(a, rt, &store),
        Cmd::Bench(a) => bench::run(a, rt, &store),
        Cmd::Eval(a) => eval::run(a, rt, &store),
        Cmd::Ingest(a) => workspace::ingest(a, rt, &store),
        Cmd::State(a) => workspace::state(a),
        Cmd::Confirm(a) => workspace::confirm(a),
        Cmd::Assemble(a) => workspace::assemble(a, &store),
        Cmd::Delete(a) => workspace::delete(a),
        Cmd::Calibrate(a) => calibrate::run(a, rt, &store),
        Cmd::Align(a) => align::run(a, rt, &store),
        Cmd::Models(a) => models::run(a, &store),
        Cmd::Generate(a) => generate::run(a, rt, &store),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_tree_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// The method lists' defaults split like a typed list, and typed lists may have spaces.
    #[test]
    fn method_lists_parse_with_their_defaults() {
        use settings::{EvalMethodArg as E, MethodArg as M};
        let parse = |args: &[&str]| Cli::try_parse_from(args).unwrap().cmd;
        let Cmd::Bench(b) = parse(&["speccompact", "bench", "--data", "x"]) else {
            unreachable!()
        };
        let all = [M::Speculative, M::Sequential, M::TargetSelf, M::DrafterOnly];
        assert_eq!(b.methods, all);
        let Cmd::Eval(e) = parse(&["speccompact", "eval", "--data", "x"]) else {
            unreachable!()
        };
        assert_eq!(e.methods.len(), 6);
        assert_eq!(e.methods[4..], [E::TruncateTail, E::Full]);
        let Cmd::Bench(b) = parse(&[
            "speccompact",
            "bench",
            "--data",
            "x",
            "--methods",
            " sequential , target-self",
        ]) else {
            unreachable!()
        };
        assert_eq!(b.methods, [M::Sequential, M::TargetSelf]);
    }
}
