//! The workspace on real models: each session of a dev file is ingested (state candidates
//! judged by the target with one token), compacted by the engine, and assembled into a
//! context for the task "continue"; the table reports the records extracted by type and the
//! share of identifier/file probes present in the assembled context vs in the summary alone.

use anyhow::{Context, Result};
use clap::Parser;
use speccompact_engine::{CompactionConfig, Method};
use speccompact_runtime::{set_threads, RuntimeSettings};
use speccompact_store::Store;
use speccompact_workspace::{
    BudgetSpec, EngineSummarizer, ModelJudge, RecordType, Status, SummaryKind, Workspace,
    WorkspaceConfig,
};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// Sessions (JSONL with `messages` and `probes`).
    #[arg(long)]
    data: std::path::PathBuf,
    /// Drafter.
    #[arg(long, default_value = "smollm2-135m-instruct")]
    drafter: String,
    /// Target (summaries' verifier and the records' judge).
    #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
    target: String,
    /// Compaction method.
    #[arg(long, default_value = "speculative")]
    method: String,
    /// Judge threshold for state candidates.
    #[arg(long, default_value_t = 0.5)]
    judge_eta: f32,
    /// Context window of the assembled context.
    #[arg(long, default_value_t = 4096)]
    window: usize,
    /// Reserved system+tools tokens.
    #[arg(long, default_value_t = 512)]
    system_tools: usize,
    /// Reserved question+answer tokens.
    #[arg(long, default_value_t = 512)]
    question_answer: usize,
    /// CPU threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Write the markdown table here.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Write per-session JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    set_threads(args.threads)?;
    let sessions = speccompact_eval::load_sessions(&args.data)?;
    let store = Store::open_default()?;
    let cfg = CompactionConfig {
        drafter: args.drafter.clone(),
        target: args.target.clone(),
        ..CompactionConfig::default()
    };
    let method = Method::ALL
        .into_iter()
        .find(|m| m.as_str() == args.method)
        .context("unknown method")?;
    let compactor = speccompact_loader::load_compactor(
        cfg.clone(),
        &RuntimeSettings::default(),
        &store,
        &mut |_| {},
    )?;
    let target = compactor.target().clone();
    let counter_backend = target.clone();
    let summarizer = EngineSummarizer::new(compactor, method);
    let spec = BudgetSpec {
        window: args.window,
        system_tools: args.system_tools,
        question_answer: args.question_answer,
    };
    let mut table = String::new();
    writeln!(table, "| session | events | goal | constraint | permission | acceptance | open_issue | decision | done | evidence_ref | pending | judge-rejected | summary flags | probes | in summary | in assembled context | state/summary/evidence tokens | seconds |")?;
    writeln!(
        table,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )?;
    let mut rows = Vec::new();
    let (mut tot_p, mut tot_s, mut tot_a) = (0usize, 0usize, 0usize);
    for es in &sessions {
        let h = &es.history;
        let id = es.id.clone();
        let t0 = Instant::now();
        let judge = Arc::new(ModelJudge::new(target.clone(), cfg.clone()));
        let cb = counter_backend.clone();
        let ws = Workspace::in_memory(WorkspaceConfig::default())?.with_token_counter(Arc::new(
            move |s: &str| {
                use speccompact_engine::Backend;
                cb.count_tokens(s).unwrap_or(s.len() / 4)
            },
        ));
        ws.register_cache(judge.clone())?;
        let s = ws.session(&id)?;
        let ing = s.append_history(h, Some((judge.as_ref(), args.judge_eta)))?;
        let compacted = s.compact(&summarizer, SummaryKind::Budget)?;
        let a = s.assemble("continue the task", spec)?;
        let records = s.records()?;
        let count = |t: RecordType| {
            records
                .iter()
                .filter(|r| r.kind == t && r.status == Status::Valid)
                .count()
        };
        let pending = records
            .iter()
            .filter(|r| r.status == Status::PendingConfirmation)
            .count();
        let probes: Vec<&speccompact_eval::Probe> = es.presence_probes().collect();
        let hit = |text: &str| {
            speccompact_eval::metrics::probe_hits(&probes, text, None)
                .iter()
                .filter(|h| h.found)
                .count()
        };
        let in_summary = hit(&compacted.summary.text);
        let in_context = hit(&a.text);
        tot_p += probes.len();
        tot_s += in_summary;
        tot_a += in_context;
        let secs = t0.elapsed().as_secs_f64();
        writeln!(
            table,
            "| {id} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {pending} | {} | {} | {} | {in_summary} | {in_context} | {}/{}/{} | {secs:.0} |",
            ing.events.len(),
            count(RecordType::Goal),
            count(RecordType::Constraint),
            count(RecordType::Permission),
            count(RecordType::AcceptanceCriterion),
            count(RecordType::OpenIssue),
            count(RecordType::Decision),
            count(RecordType::Done),
            count(RecordType::EvidenceRef),
            ing.rejected.len(),
            compacted.summary.flags.len(),
            probes.len(),
            a.used[0],
            a.used[1],
            a.used[2],
        )?;
        eprintln!(
            "{id}: {} probes, {in_summary} in summary, {in_context} in context ({secs:.0} s)",
            probes.len()
        );
        rows.push(serde_json::json!({
            "session": id,
            "events": ing.events.len(),
            "records": records,
            "judge_rejected": ing.rejected,
            "summary": compacted.summary,
            "assembled": a,
            "probes": probes.len(),
            "in_summary": in_summary,
            "in_context": in_context,
            "seconds": secs,
        }));
    }
    let pct = |n: usize| {
        if tot_p == 0 {
            0.0
        } else {
            100.0 * n as f64 / tot_p as f64
        }
    };
    writeln!(
        table,
        "\nIdentifier/file probes over all sessions: {tot_p}; in the summary alone {tot_s} ({:.0} %), in the assembled context {tot_a} ({:.0} %).",
        pct(tot_s),
        pct(tot_a)
    )?;
    print!("{table}");
    if let Some(p) = &args.out {
        std::fs::write(p, &table)?;
    }
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
