//! `speccompact eval`: what each method's compacted context keeps (probes, answers, next
//! step, unsourced assertions, slot adequacy, sizes) over a selection of evaluation
//! sessions, optionally drift over recursive generations; writes the markdown and JSON
//! report (`speccompact_eval::Report`) with its provenance, and the plots.

use crate::files::{command_line, read_text, revision, write_atomic, write_report};
use crate::load::{compactor, counting_bar};
use crate::settings::{
    file_or_default, tail_budget, trimmed, EngineArgs, EvalMethodArg, MethodArg, RuntimeArgs,
};
use anyhow::{bail, Result};
use speccompact_engine::Compactor;
use speccompact_eval::{self as ev, EvalMethod, TailBudget};
use speccompact_store::Store;
use std::path::PathBuf;
use std::time::Instant;

/// Flags of `eval`.
#[derive(clap::Args)]
pub struct Args {
    /// JSONL file of evaluation sessions (`messages`, `probes`, `continuation`).
    #[arg(long)]
    pub data: PathBuf,
    /// Methods, comma-separated (speculative, sequential, target-self, drafter-only,
    /// truncate-tail, full).
    #[arg(
        long,
        default_value = "speculative,sequential,target-self,drafter-only,truncate-tail,full",
        value_delimiter = ',',
        value_parser = trimmed::<EvalMethodArg>(),
        hide_possible_values = true
    )]
    pub methods: Vec<EvalMethodArg>,
    /// Only these session ids, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub ids: Vec<String>,
    /// Leave out the sessions of this file (and the sessions they were cut from).
    #[arg(long)]
    pub exclude: Option<PathBuf>,
    /// Shortest sessions first (by characters) instead of file order.
    #[arg(long)]
    pub shortest: bool,
    /// Only sessions with identifier, file or question probes.
    #[arg(long)]
    pub with_probes: bool,
    /// At most N sessions.
    #[arg(long)]
    pub limit: Option<usize>,
    /// `truncate-tail` budget: `matched` (the speculative summary's size) or tokens.
    #[arg(long, default_value = "matched", value_parser = tail_budget)]
    pub tail_budget: TailBudget,
    /// Skip the reader (question probes).
    #[arg(long)]
    pub no_reader: bool,
    /// Skip the next-step and slot-adequacy judges.
    #[arg(long)]
    pub no_judges: bool,
    /// Drift stress on the N longest selected sessions.
    #[arg(long, default_value_t = 0)]
    pub drift: usize,
    /// Drift generations.
    #[arg(long, default_value_t = 10)]
    pub drift_generations: usize,
    /// Messages per drift generation (default: spread evenly over the generations).
    #[arg(long)]
    pub drift_every: Option<usize>,
    /// Method of the drift chains.
    #[arg(long, default_value = "speculative", hide_possible_values = true)]
    pub drift_method: MethodArg,
    /// Evaluation settings (see configs/eval.toml); keys given replace the built-in ones.
    #[arg(long)]
    pub eval_config: Option<PathBuf>,
    /// Markdown report (written atomically; also printed).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// JSON report with every session × method.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Plots: PREFIX-probes.svg and PREFIX-qa-delta.svg (default: beside --out).
    #[arg(long)]
    pub plots: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

impl Args {
    /// The sessions chosen by the selection flags.
    fn selection(&self) -> Result<ev::Selection> {
        Ok(ev::Selection {
            ids: self.ids.clone(),
            exclude: match &self.exclude {
                Some(p) => ev::load_sessions(p)?.into_iter().map(|s| s.id).collect(),
                None => Vec::new(),
            },
            with_probes: self.with_probes,
            shortest: self.shortest,
            limit: self.limit,
        })
    }
}

/// Runs `eval`.
pub fn run(a: &Args, rt: &RuntimeArgs, store: &Store) -> Result<()> {
    let methods: Vec<EvalMethod> = dedup(a.methods.iter().map(|&m| m.into()));
    let prompts = file_or_default(a.eval_config.as_deref(), |p| {
        let text = read_text(p)?;
        anyhow::Ok(ev::EvalPrompts::overlay(&text, &p.display().to_string())?)
    })?;
    let selection = a.selection()?;
    let data = &a.data;
    let sessions = selection
        .apply(ev::load_sessions(data)?)
        .map_err(|e| anyhow::anyhow!("{}: {e}", data.display()))?;
    if sessions.is_empty() {
        bail!("{}: the selection leaves no session", data.display());
    }
    let checksum = ev::sha256_file(data)?;
    let settings = rt.settings()?;
    let c = compactor(&settings, store, &a.engine)?;
    let opts = ev::EvalOptions {
        methods: methods.clone(),
        tail_budget: a.tail_budget,
        reader: !a.no_reader,
        judges: !a.no_judges,
        prompts: prompts.clone(),
    };
    let bar = counting_bar(
        sessions.len(),
        "{bar:30} {pos}/{len} sessions {msg} [{elapsed}]",
    );
    let t0 = Instant::now();
    let mut last = 0;
    let results = ev::evaluate(&c, &sessions, &opts, &mut |i, step| {
        if i != last {
            bar.set_position(i as u64);
            last = i;
        }
        bar.set_message(format!("{} {step}", sessions[i].id));
        tracing::info!(session = sessions[i].id.as_str(), step, "eval step");
    })?;
    bar.finish_and_clear();
    let drifts = drift(a, &c, &sessions)?;
    let model = |name: &str| match store.path(name) {
        Ok(p) if p.exists() => format!("{name} ({})", p.display()),
        _ => name.to_string(),
    };
    let provenance = ev::Provenance {
        command: command_line(),
        data: data.display().to_string(),
        data_sha256: checksum,
        selection: selection.describe(sessions.len()),
        drafter: model(&c.config().drafter),
        target: model(&c.config().target),
        compaction_config: toml::to_string(c.config()).unwrap_or_default(),
        eval_config: toml::to_string(&prompts).unwrap_or_default(),
        tail_budget: a.tail_budget.to_string(),
        revision: revision(),
        runtime: format!(
            "device {}, {} threads, eta {}, {:.0} s in all",
            settings.device,
            settings.threads,
            c.config().eta,
            t0.elapsed().as_secs_f64()
        ),
    };
    let report = ev::Report::new(
        provenance,
        methods,
        results,
        drifts,
        prompts.bootstrap_iterations,
        prompts.seed,
    );
    print_and_write(a, &report)
}

/// Methods in the order given, each once (as `EvalMethod::parse_list` gave them).
fn dedup(methods: impl Iterator<Item = EvalMethod>) -> Vec<EvalMethod> {
    let mut out: Vec<EvalMethod> = Vec::new();
    for m in methods {
        if !out.contains(&m) {
            out.push(m);
        }
    }
    out
}

/// Drift stress on the `--drift` longest sessions.
fn drift(a: &Args, c: &Compactor, sessions: &[ev::EvalSession]) -> Result<Vec<ev::DriftReport>> {
    let mut drifts = Vec::new();
    let mut longest: Vec<&ev::EvalSession> = sessions.iter().collect();
    longest.sort_by_key(|s| std::cmp::Reverse(s.history.messages.len()));
    for s in longest.into_iter().take(a.drift) {
        let b = counting_bar(
            a.drift_generations,
            "{bar:30} {pos}/{len} drift generations {msg} [{elapsed}]",
        );
        b.set_message(s.id.clone());
        drifts.push(ev::drift_stress(
            c,
            s,
            a.drift_method.into(),
            a.drift_generations,
            a.drift_every,
            &mut |g| b.set_position(g as u64 - 1),
        )?);
        b.finish_and_clear();
    }
    Ok(drifts)
}

/// Prints the markdown report and writes it, the JSON report and the plots where asked.
fn print_and_write(a: &Args, report: &ev::Report) -> Result<()> {
    let md = report.markdown();
    print!("{md}");
    write_report(a.out.as_deref(), &md, a.json.as_deref(), report)?;
    let prefix = a
        .plots
        .clone()
        .or_else(|| a.out.as_ref().map(|o| o.with_extension("")));
    if let Some(prefix) = prefix {
        for (name, svg) in report.plots() {
            let p = PathBuf::from(format!("{}-{name}.svg", prefix.display()));
            write_atomic(&p, &svg)?;
        }
    }
    Ok(())
}
