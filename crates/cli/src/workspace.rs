//! The workspace commands: `ingest` (append a history, optionally summarize), `state`,
//! `confirm`, `assemble` (context for a task within a budget counted with the target's
//! tokenizer) and `delete`; and where the workspace lives (`--workspace`,
//! `--workspace-config`).

use crate::files::read_history;
use crate::load::{compactor, token_counter};
use crate::settings::{file_or_default, EngineArgs, RuntimeArgs};
use anyhow::Result;
use speccompact_engine::{CompactionConfig, Method};
use speccompact_store::Store;
use speccompact_workspace::{
    BudgetSpec, EngineSummarizer, SummaryKind, Workspace, WorkspaceConfig,
};
use std::path::PathBuf;

/// Where the workspace lives.
#[derive(clap::Args)]
pub struct WorkspaceArgs {
    /// Workspace folder (its database is `workspace.db` inside).
    #[arg(long, default_value = ".speccompact")]
    pub workspace: PathBuf,
    /// Workspace settings file (see configs/workspace.toml); sections given replace the
    /// built-in ones key by key.
    #[arg(long)]
    pub workspace_config: Option<PathBuf>,
}

impl WorkspaceArgs {
    fn open(&self) -> Result<Workspace> {
        let cfg = file_or_default(self.workspace_config.as_deref(), WorkspaceConfig::load)?;
        Ok(Workspace::open(&self.workspace, cfg)?)
    }
}

/// Flags of `ingest`.
#[derive(clap::Args)]
pub struct IngestArgs {
    /// History file (same formats as `compact`), or `-` for stdin.
    pub input: String,
    /// Session id in a JSONL file of sessions.
    #[arg(long)]
    pub session: Option<String>,
    /// Workspace session to append to (default: the history's id, else the file name).
    #[arg(long)]
    pub name: Option<String>,
    /// Also write a summary with the engine (recursive: it continues the last one).
    #[arg(long)]
    pub summarize: bool,
    #[command(flatten)]
    pub ws: WorkspaceArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Runs `ingest`.
pub fn ingest(a: &IngestArgs, rt: &RuntimeArgs, store: &Store) -> Result<()> {
    let history = read_history(&a.input, a.session.as_deref())?;
    let id = a
        .name
        .clone()
        .or_else(|| history.id.clone())
        .unwrap_or_else(|| {
            std::path::Path::new(&a.input)
                .file_stem()
                .map_or("session".into(), |s| s.to_string_lossy().into_owned())
        });
    let w = a.ws.open()?;
    let s = w.session(&id)?;
    let out = s.append_history(&history, None)?;
    println!(
        "session {id}: {} events appended, {} records written, {} candidates pending confirmation, {} redactions",
        out.events.len(),
        out.written.len(),
        out.pending.len(),
        out.redactions.len()
    );
    for (e, r) in &out.redactions {
        println!(
            "  redacted {} in event {e} (bytes {}..{})",
            r.kind, r.start, r.end
        );
    }
    if a.summarize {
        let c = compactor(&rt.settings()?, store, &a.engine)?;
        let summarizer = EngineSummarizer::new(c, Method::Speculative);
        let done = s.compact(&summarizer, SummaryKind::Budget)?;
        println!(
            "summary {} (generation {}), {} flagged line(s)",
            done.summary.id,
            done.summary.generation,
            done.summary.flags.len()
        );
        if let Some(d) = done.divergence {
            println!(
                "rebuilt from the log; facts the recursive summary lost: {:?}",
                d.lost
            );
        }
    }
    Ok(())
}

/// Flags of `state`.
#[derive(clap::Args)]
pub struct StateArgs {
    /// Session id.
    pub session: String,
    /// Every record, whatever its status.
    #[arg(long)]
    pub all: bool,
    /// Every version of this field key (the audit history).
    #[arg(long)]
    pub history: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub ws: WorkspaceArgs,
}

/// Runs `state`.
pub fn state(a: &StateArgs) -> Result<()> {
    let w = a.ws.open()?;
    let s = w.existing(&a.session)?;
    let recs = match &a.history {
        Some(k) => s.record_history(k)?,
        None if a.all => s.records()?,
        None => s.state()?,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&recs)?);
    } else {
        for r in &recs {
            println!(
                "#{:<5} {:<22} {}",
                r.id,
                r.status.as_str(),
                speccompact_workspace::state::render(r)
            );
        }
    }
    Ok(())
}

/// Flags of `confirm`.
#[derive(clap::Args)]
pub struct ConfirmArgs {
    /// Session id.
    pub session: String,
    /// Record id.
    pub record: i64,
    /// The confirming event's id.
    #[arg(long)]
    pub event: i64,
    #[command(flatten)]
    pub ws: WorkspaceArgs,
}

/// Runs `confirm`.
pub fn confirm(a: &ConfirmArgs) -> Result<()> {
    let w = a.ws.open()?;
    let r = w.existing(&a.session)?.confirm(a.record, a.event)?;
    println!(
        "record {} is now valid (version {}): {}",
        r.id, r.version, r.value
    );
    Ok(())
}

/// Flags of `assemble`.
#[derive(clap::Args)]
pub struct AssembleArgs {
    /// Session id.
    pub session: String,
    /// The task ("continue", "trace the cause of the last failure", ...).
    #[arg(long, default_value = "continue")]
    pub task: String,
    /// Context window (tokens of the target's tokenizer: qwen2.5-coder-0.5b-instruct, the
    /// compaction settings' built-in target; only its tokenizer is read, the model is
    /// fetched on first use). Every block is counted with it.
    #[arg(long, default_value_t = 8192)]
    pub window: usize,
    /// Reserved for system prompt and tools.
    #[arg(long, default_value_t = 1200)]
    pub system_tools: usize,
    /// Reserved for the question and the answer.
    #[arg(long, default_value_t = 1300)]
    pub question_answer: usize,
    /// Print JSON (text and what was loaded / not loaded).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub ws: WorkspaceArgs,
}

/// Runs `assemble`. The session and the budget are checked before the tokenizer loads.
pub fn assemble(a: &AssembleArgs, store: &Store) -> Result<()> {
    let spec = BudgetSpec {
        window: a.window,
        system_tools: a.system_tools,
        question_answer: a.question_answer,
    };
    let w = a.ws.open()?;
    w.existing(&a.session)?;
    speccompact_workspace::budget::plan(spec, &w.config().budget)?;
    let target = CompactionConfig::default().target;
    let w = w.with_token_counter(token_counter(store, &target)?);
    let out = w.existing(&a.session)?.assemble(&a.task, spec)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", out.text);
    }
    Ok(())
}

/// Flags of `delete`.
#[derive(clap::Args)]
pub struct DeleteArgs {
    /// Session id.
    pub session: String,
    /// The event; without it the whole session is deleted.
    #[arg(long)]
    pub event: Option<i64>,
    #[command(flatten)]
    pub ws: WorkspaceArgs,
}

/// Runs `delete`.
pub fn delete(a: &DeleteArgs) -> Result<()> {
    let w = a.ws.open()?;
    let report = match a.event {
        Some(e) => w.existing(&a.session)?.delete_event(e, None)?,
        None => w.delete_session(&a.session)?,
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
