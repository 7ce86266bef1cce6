//! `speccompact compact`: one history into the six-slot summary, with live progress, as
//! markdown (trace line on stderr) or as JSON.

use crate::files::read_history;
use crate::load::compactor;
use crate::settings::{EngineArgs, MethodArg, RuntimeArgs};
use anyhow::Result;
use clap::ValueEnum;
use indicatif::ProgressBar;
use speccompact_engine::{Backend, Event, Method};
use speccompact_store::Store;

/// Flags of `compact`.
#[derive(clap::Args)]
pub struct Args {
    /// History file, or `-` for standard input.
    pub input: String,
    /// Session id, for a JSONL file of several sessions.
    #[arg(long)]
    pub session: Option<String>,
    /// speculative, sequential, target-self or drafter-only.
    #[arg(long, default_value = "speculative", hide_possible_values = true)]
    pub method: MethodArg,
    /// Output: `md` (the summary) or `json` (slots, lines with origins, trace).
    #[arg(long, default_value = "md", hide_possible_values = true)]
    pub format: Format,
    /// Print the sequential method's one call to the target as JSON (`model`, `tokens`,
    /// `max_tokens`, `text`) instead of compacting: the same prompt for a serving engine.
    #[arg(long)]
    pub prompt_only: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// What `compact` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The summary as markdown.
    Md,
    /// Slots, lines with their origins, and the trace.
    Json,
}

/// Runs `compact`.
pub fn run(a: &Args, rt: &RuntimeArgs, store: &Store) -> Result<()> {
    let method: Method = a.method.into();
    let history = read_history(&a.input, a.session.as_deref())?;
    let c = compactor(&rt.settings()?, store, &a.engine)?;
    if a.prompt_only {
        let [prefix, request] = c.one_call_prompt(&history)?;
        let tokens = c
            .target()
            .prompt_tokens(&prefix, std::slice::from_ref(&request))?;
        let out = serde_json::json!({
            "model": c.target().name(),
            "tokens": tokens,
            "max_tokens": c.config().summary_budget,
            "text": format!("{prefix}{request}"),
        });
        println!("{out}");
        return Ok(());
    }
    let bar = ProgressBar::new_spinner();
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar.set_message(format!(
        "{method}: prefilling {} messages",
        history.messages.len()
    ));
    let (mut kept, mut rejected, mut slots_done) = (0, 0, 0);
    let total = c.config().slots.len();
    let out = c.compact_blocking(&history, method, &mut |e| {
        match e {
            Event::LineAccepted { .. } => kept += 1,
            Event::LineRejected { .. } => rejected += 1,
            Event::SlotDone { .. } => slots_done += 1,
            Event::Prefilled { .. } => {}
        }
        bar.set_message(format!(
            "{method}: {kept} lines kept, {rejected} rejected, {slots_done}/{total} slots done"
        ));
    })?;
    bar.finish_and_clear();
    match a.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&out)?),
        Format::Md => {
            print!("{}", out.markdown);
            let t = &out.trace;
            eprintln!(
                "[{method}: {:.1} s (prefill {:.1} s), {} lines proposed, {:.0}% accepted, {} repaired; calls drafter/verify/repair {}/{}/{}]",
                t.wall_ms / 1e3,
                t.prefill_ms / 1e3,
                t.lines_proposed,
                100.0 * t.acceptance_rate,
                t.lines_repaired,
                t.drafter_calls,
                t.verify_calls,
                t.repair_calls
            );
        }
    }
    Ok(())
}
