//! `speccompact`: compaction of agent histories (`compact`), method comparison (`bench`),
//! model store management and greedy generation with the runtime.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use speccompact_engine::{CompactionConfig, Compactor, Event, Method, Overflow};
use speccompact_history::{parse_sessions, History};
use speccompact_runtime::{
    greedy, parse_device, set_threads, ChatMessage, Model, RuntimeSettings, StopRules,
};
use speccompact_store::{Progress, Status, Store};
use speccompact_workspace::{
    BudgetSpec, EngineSummarizer, SummaryKind, Workspace, WorkspaceConfig,
};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "speccompact",
    version,
    about = "Fast, faithful compaction of LLM-agent histories"
)]
struct Cli {
    /// Runtime settings file (see configs/runtime.toml); flags below override it.
    #[arg(long, global = true)]
    runtime_config: Option<PathBuf>,
    /// CPU threads for every kernel (0 = all cores).
    #[arg(long, global = true)]
    threads: Option<usize>,
    /// Device: `cpu` or `cuda:N`.
    #[arg(long, global = true)]
    device: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Model and settings choices shared by `compact` and `bench`.
#[derive(clap::Args)]
struct EngineArgs {
    /// Drafter: store name or path (default from the settings: smollm2-135m-instruct).
    #[arg(long)]
    drafter: Option<String>,
    /// Target: store name or path (default from the settings: qwen2.5-coder-0.5b-instruct).
    #[arg(long)]
    target: Option<String>,
    /// Acceptance threshold on p_yes / (p_yes + p_no).
    #[arg(long)]
    eta: Option<f32>,
    /// Compaction settings file (see configs/compaction.toml); keys given replace the
    /// built-in defaults, flags win over the file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A history over the target's context: `stages` (default), `error` or `middle-cut`.
    #[arg(long)]
    overflow: Option<String>,
    /// Line verification: `calibrated` (default: the target's calibrated rule over the
    /// verification scores), `ratio` (r >= eta alone) or `exact` (lossless: equals
    /// target-self).
    #[arg(long)]
    verify: Option<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compact an agent history (OpenAI / Anthropic messages, JSON or JSONL; `-` for stdin)
    /// into the six-slot summary.
    Compact {
        /// History file, or `-` for standard input.
        input: String,
        /// Session id, for a JSONL file of several sessions.
        #[arg(long)]
        session: Option<String>,
        /// speculative, sequential, target-self or drafter-only.
        #[arg(long, default_value = "speculative")]
        method: String,
        /// Output: `md` (the summary) or `json` (slots, lines with origins, trace).
        #[arg(long, default_value = "md")]
        format: String,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Run every method on every session of a JSONL file in one process and compare them.
    Bench {
        /// JSONL file of sessions (objects with `messages`).
        #[arg(long)]
        data: PathBuf,
        /// Methods, comma-separated.
        #[arg(
            long,
            default_value = "speculative,sequential,target-self,drafter-only"
        )]
        methods: String,
        /// Only the first N sessions.
        #[arg(long)]
        limit: Option<usize>,
        /// Output: `table` (markdown) or `json` (`runs` and `summary`).
        #[arg(long, default_value = "table")]
        format: String,
        /// Also write the output to this file (atomically), headed by the command line.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Also write the JSON report (`runs` and `summary`) to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also measure a re-compaction per session: speculative on the session without its
        /// last N messages, then on the whole (the second reuses the first's prefixes).
        #[arg(long)]
        recompact: Option<usize>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Evaluate what each method's compacted context keeps: probes, answers to questions,
    /// next-step agreement, unsourced assertions, slot adequacy and sizes, with bootstrap
    /// intervals; optionally drift over recursive generations.
    Eval {
        /// JSONL file of evaluation sessions (`messages`, `probes`, `continuation`).
        #[arg(long)]
        data: PathBuf,
        /// Methods, comma-separated (speculative, sequential, target-self, drafter-only,
        /// truncate-tail, full).
        #[arg(
            long,
            default_value = "speculative,sequential,target-self,drafter-only,truncate-tail,full"
        )]
        methods: String,
        /// Only these session ids, comma-separated.
        #[arg(long, value_delimiter = ',')]
        ids: Vec<String>,
        /// Leave out the sessions of this file (and the sessions they were cut from).
        #[arg(long)]
        exclude: Option<PathBuf>,
        /// Shortest sessions first (by characters) instead of file order.
        #[arg(long)]
        shortest: bool,
        /// Only sessions with identifier, file or question probes.
        #[arg(long)]
        with_probes: bool,
        /// At most N sessions.
        #[arg(long)]
        limit: Option<usize>,
        /// `truncate-tail` budget: `matched` (the speculative summary's size) or tokens.
        #[arg(long, default_value = "matched")]
        tail_budget: String,
        /// Skip the reader (question probes).
        #[arg(long)]
        no_reader: bool,
        /// Skip the next-step and slot-adequacy judges.
        #[arg(long)]
        no_judges: bool,
        /// Drift stress on the N longest selected sessions.
        #[arg(long, default_value_t = 0)]
        drift: usize,
        /// Drift generations.
        #[arg(long, default_value_t = 10)]
        drift_generations: usize,
        /// Messages per drift generation (default: spread evenly over the generations).
        #[arg(long)]
        drift_every: Option<usize>,
        /// Method of the drift chains.
        #[arg(long, default_value = "speculative")]
        drift_method: String,
        /// Evaluation settings (see configs/eval.toml); keys given replace the built-in ones.
        #[arg(long)]
        eval_config: Option<PathBuf>,
        /// Markdown report (written atomically; also printed).
        #[arg(long)]
        out: Option<PathBuf>,
        /// JSON report with every session × method.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Plots: PREFIX-probes.svg and PREFIX-qa-delta.svg (default: beside --out).
        #[arg(long)]
        plots: Option<PathBuf>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Append a history to a workspace session: events are redacted, classified, indexed,
    /// and their state candidates written under the write rules.
    Ingest {
        /// History file (same formats as `compact`), or `-` for stdin.
        input: String,
        /// Session id in a JSONL file of sessions.
        #[arg(long)]
        session: Option<String>,
        /// Workspace session to append to (default: the history's id, else the file name).
        #[arg(long)]
        name: Option<String>,
        /// Also write a summary with the engine (recursive: it continues the last one).
        #[arg(long)]
        summarize: bool,
        #[command(flatten)]
        ws: WorkspaceArgs,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Show a session's protected state (valid records), or every version of one field.
    State {
        /// Session id.
        session: String,
        /// Every record, whatever its status.
        #[arg(long)]
        all: bool,
        /// Every version of this field key (the audit history).
        #[arg(long)]
        history: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ws: WorkspaceArgs,
    },
    /// Confirm a pending candidate record with an event written by the user or the owner.
    Confirm {
        /// Session id.
        session: String,
        /// Record id.
        record: i64,
        /// The confirming event's id.
        #[arg(long)]
        event: i64,
        #[command(flatten)]
        ws: WorkspaceArgs,
    },
    /// Build the context for a task within a budget: state, summary, evidence, and the list
    /// of what was not loaded.
    Assemble {
        /// Session id.
        session: String,
        /// The task ("continue", "trace the cause of the last failure", ...).
        #[arg(long, default_value = "continue")]
        task: String,
        /// Context window (tokens).
        #[arg(long, default_value_t = 8192)]
        window: usize,
        /// Reserved for system prompt and tools.
        #[arg(long, default_value_t = 1200)]
        system_tools: usize,
        /// Reserved for the question and the answer.
        #[arg(long, default_value_t = 1300)]
        question_answer: usize,
        /// Print JSON (text and what was loaded / not loaded).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ws: WorkspaceArgs,
    },
    /// Delete one event (from log, index, caches and derived summaries) or a whole session.
    Delete {
        /// Session id.
        session: String,
        /// The event; without it the whole session is deleted.
        #[arg(long)]
        event: Option<i64>,
        #[command(flatten)]
        ws: WorkspaceArgs,
    },
    /// Measure how well a target's one-token judgment separates true from false summary
    /// lines, per judgment prompt variant; write the calibrated η and the best variant.
    Calibrate {
        /// Target model: store name or path.
        #[arg(long)]
        target: String,
        /// Session files (JSONL with `messages` and `probes`); the shortest tool-use/coding
        /// sessions are taken, file by file.
        #[arg(long, value_delimiter = ',', default_values_t = vec!["../shared/evaldata/dev/sessions.jsonl".to_string()])]
        data: Vec<String>,
        /// Bench JSON reports whose `sequential` runs give target-written summary lines.
        #[arg(long, value_delimiter = ',')]
        summaries: Vec<PathBuf>,
        /// Sessions in the set.
        #[arg(long, default_value_t = 12)]
        sessions: usize,
        /// Most true lines per session (each gets one corrupted twin).
        #[arg(long, default_value_t = 12)]
        per_session: usize,
        /// Judgment variants file (default configs/judge-variants.toml, built in).
        #[arg(long)]
        variants: Option<PathBuf>,
        /// Only these variants (by name).
        #[arg(long, value_delimiter = ',')]
        variant: Vec<String>,
        /// Calibration file to update with this target's entry.
        #[arg(long, default_value = "configs/calibration.toml")]
        out: PathBuf,
        /// Also write the markdown table here.
        #[arg(long)]
        table: Option<PathBuf>,
        /// Also write every line with its scores here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Manage the model store.
    Models {
        #[command(subcommand)]
        cmd: ModelsCmd,
    },
    /// Greedy continuation of a prompt (rendered through the model's chat template).
    Generate {
        /// Store name or GGUF path.
        #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
        model: String,
        /// The user message.
        #[arg(long)]
        prompt: String,
        /// Most tokens to generate.
        #[arg(long, default_value_t = 128)]
        max_tokens: usize,
        /// Feed the prompt as raw text instead of through the chat template.
        #[arg(long)]
        raw: bool,
    },
}

/// Where the workspace lives.
#[derive(clap::Args)]
struct WorkspaceArgs {
    /// Workspace folder (its database is `workspace.db` inside).
    #[arg(long, default_value = ".speccompact")]
    workspace: PathBuf,
    /// Workspace settings file (see configs/workspace.toml); sections given replace the
    /// built-in ones key by key.
    #[arg(long)]
    workspace_config: Option<PathBuf>,
}

impl WorkspaceArgs {
    fn open(&self) -> Result<Workspace> {
        let cfg = match &self.workspace_config {
            Some(p) => WorkspaceConfig::load(p)?,
            None => WorkspaceConfig::default(),
        };
        Ok(Workspace::open(&self.workspace, cfg)?)
    }
}

#[derive(Subcommand)]
enum ModelsCmd {
    /// List known models and whether they are cached.
    List,
    /// Download and verify a model (no-op when already verified).
    Fetch { name: String },
    /// Check a cached model's size and sha256.
    Verify { name: String },
    /// Print where a model lives in the cache.
    Path { name: String },
}

fn progress_bar() -> (ProgressBar, impl FnMut(Progress)) {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let b = bar.clone();
    let cb = move |p: Progress| match p {
        Progress::Downloading { index, parts } => {
            b.set_message(format!("part {}/{}", index + 1, parts))
        }
        Progress::Bytes { done, total } => {
            b.set_length(total);
            b.set_position(done);
        }
    };
    (bar, cb)
}

fn resolve(store: &Store, name: &str) -> Result<PathBuf> {
    let (bar, mut cb) = progress_bar();
    let p = store.resolve(name, &mut cb)?;
    bar.finish_and_clear();
    Ok(p)
}

/// Runtime settings from `--runtime-config`, with `--threads` / `--device` applied and the
/// thread pool set.
fn runtime_settings(cli: &Cli) -> Result<RuntimeSettings> {
    let mut settings = match &cli.runtime_config {
        Some(p) => RuntimeSettings::load(p)?,
        None => RuntimeSettings::default(),
    };
    if let Some(t) = cli.threads {
        settings.threads = t;
    }
    if let Some(d) = &cli.device {
        settings.device = d.clone();
    }
    set_threads(settings.threads)?;
    Ok(settings)
}

/// Loads the compaction settings and both models.
fn compactor(cli: &Cli, store: &Store, a: &EngineArgs) -> Result<Compactor> {
    let mut cfg = match &a.config {
        Some(p) => CompactionConfig::load(p)?,
        None => CompactionConfig::default(),
    };
    if let Some(d) = &a.drafter {
        cfg.drafter = d.clone();
    }
    if let Some(t) = &a.target {
        cfg.target = t.clone();
    }
    if let Some(e) = a.eta {
        cfg.set_eta(e);
    }
    if let Some(o) = &a.overflow {
        cfg.overflow = match o.as_str() {
            "error" => Overflow::Error,
            "middle-cut" => Overflow::MiddleCut,
            "stages" => Overflow::Stages,
            _ => bail!("unknown --overflow `{o}` (stages, error, middle-cut)"),
        };
    }
    if let Some(v) = &a.verify {
        cfg.verify = v
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--verify: {e}"))?;
        cfg.explicit.push("verify".into());
    }
    cfg.validate("command line")?;
    let settings = runtime_settings(cli)?;
    let (bar, mut cb) = progress_bar();
    let t0 = Instant::now();
    let c = Compactor::load(cfg, &settings, store, &mut cb)?;
    bar.finish_and_clear();
    tracing::info!(
        drafter = c.config().drafter.as_str(),
        target = c.config().target.as_str(),
        ms = t0.elapsed().as_millis() as u64,
        "models loaded"
    );
    Ok(c)
}

/// Reads a history file (or stdin) and picks the session.
fn read_history(input: &str, session: Option<&str>) -> Result<History> {
    let text = if input == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading stdin")?;
        s
    } else {
        std::fs::read_to_string(input).with_context(|| format!("reading {input}"))?
    };
    let mut all = parse_sessions(&text).with_context(|| format!("parsing {input}"))?;
    match session {
        Some(id) => {
            let i = all
                .iter()
                .position(|h| h.id.as_deref() == Some(id))
                .with_context(|| {
                    let ids: Vec<_> = all.iter().filter_map(|h| h.id.as_deref()).collect();
                    format!("{input} has no session `{id}` (it has: {})", ids.join(", "))
                })?;
            Ok(all.swap_remove(i))
        }
        None if all.len() > 1 => {
            let ids: Vec<_> = all.iter().filter_map(|h| h.id.as_deref()).collect();
            bail!(
                "{input} holds {} sessions; pick one with --session ID ({})",
                all.len(),
                ids.join(", ")
            )
        }
        None => Ok(all.swap_remove(0)),
    }
}

/// Writes `text` to `path` through a temporary file in the same folder, so an interrupted
/// run never leaves a partial file in place of an earlier one.
fn write_atomic(path: &std::path::Path, text: &str) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("writing into {}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())?;
    // Temporary files are private; a report is an ordinary file.
    #[cfg(unix)]
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )?;
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
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
    match &cli.cmd {
        Cmd::Ingest { input, session, name, summarize, ws, engine } => {
            let history = read_history(input, session.as_deref())?;
            let id = name
                .clone()
                .or_else(|| history.id.clone())
                .unwrap_or_else(|| {
                    std::path::Path::new(input)
                        .file_stem()
                        .map_or("session".into(), |s| s.to_string_lossy().into_owned())
                });
            let w = ws.open()?;
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
                println!("  redacted {} in event {e} (bytes {}..{})", r.kind, r.start, r.end);
            }
            if *summarize {
                let c = compactor(&cli, &store, engine)?;
                let summarizer = EngineSummarizer::new(c, Method::Speculative);
                let done = s.compact(&summarizer, SummaryKind::Budget)?;
                println!("summary {} (generation {}), {} flagged line(s)", done.summary.id, done.summary.generation, done.summary.flags.len());
                if let Some(d) = done.divergence {
                    println!("rebuilt from the log; facts the recursive summary lost: {:?}", d.lost);
                }
            }
        }
        Cmd::State { session, all, history, json, ws } => {
            let w = ws.open()?;
            let s = w.existing(session)?;
            let recs = match history {
                Some(k) => s.record_history(k)?,
                None if *all => s.records()?,
                None => s.state()?,
            };
            if *json {
                println!("{}", serde_json::to_string_pretty(&recs)?);
            } else {
                for r in &recs {
                    println!("#{:<5} {:<22} {}", r.id, r.status.as_str(), speccompact_workspace::state::render(r));
                }
            }
        }
        Cmd::Confirm { session, record, event, ws } => {
            let w = ws.open()?;
            let r = w.existing(session)?.confirm(*record, *event)?;
            println!("record {} is now valid (version {}): {}", r.id, r.version, r.value);
        }
        Cmd::Assemble { session, task, window, system_tools, question_answer, json, ws } => {
            let w = ws.open()?;
            let a = w.existing(session)?.assemble(
                task,
                BudgetSpec { window: *window, system_tools: *system_tools, question_answer: *question_answer },
            )?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&a)?);
            } else {
                print!("{}", a.text);
            }
        }
        Cmd::Delete { session, event, ws } => {
            let w = ws.open()?;
            let report = match event {
                Some(e) => w.existing(session)?.delete_event(*e, None)?,
                None => w.delete_session(session)?,
            };
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        Cmd::Calibrate { target, data, summaries, sessions, per_session, variants, variant, out, table, json } => {
            calibrate_cmd(&cli, &store, target, data, summaries, *sessions, *per_session, variants.as_deref(), variant, out, table.as_deref(), json.as_deref())?;
        }
        Cmd::Models { cmd } => match cmd {
            ModelsCmd::List => {
                println!("{:<32} {:<8} {:<8} {:>12}  status", "name", "arch", "role", "bytes");
                for m in store.manifests() {
                    let status = match store.verify(&m.name)? {
                        Status::Missing if m.network => "not cached (needs hub access)".to_string(),
                        Status::Missing => "not fetched".to_string(),
                        Status::Verified => "verified".to_string(),
                        Status::Corrupt { .. } => "CORRUPT (run fetch)".to_string(),
                    };
                    let size = if m.size > 0 { m.size.to_string() } else { "-".to_string() };
                    println!("{:<32} {:<8} {:<8} {:>12}  {status}", m.name, m.architecture, m.role, size);
                }
            }
            ModelsCmd::Fetch { name } => {
                let p = resolve(&store, &name)?;
                println!("{}", p.display());
            }
            ModelsCmd::Verify { name } => match store.verify(&name)? {
                Status::Verified => println!("{name}: verified ({})", store.path(&name)?.display()),
                Status::Missing => bail!("{name}: not in the cache; run `speccompact models fetch {name}`"),
                Status::Corrupt { actual, size } => bail!(
                    "{name}: cached file is corrupt (sha256 {actual}, {size} bytes); run `speccompact models fetch {name}` to replace it"
                ),
            },
            ModelsCmd::Path { name } => println!("{}", store.path(&name)?.display()),
        },
        Cmd::Compact { input, session, method, format, engine } => {
            let method: Method = method.parse()?;
            if !matches!(format.as_str(), "md" | "json") {
                bail!("unknown --format `{format}` (md, json)");
            }
            let history = read_history(input, session.as_deref())?;
            let c = compactor(&cli, &store, engine)?;
            let bar = ProgressBar::new_spinner();
            bar.enable_steady_tick(std::time::Duration::from_millis(200));
            bar.set_message(format!("{method}: prefilling {} messages", history.messages.len()));
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
            if format == "json" {
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
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
        Cmd::Bench { data, methods, limit, format, out, json, recompact, engine } => {
            let methods: Vec<Method> = methods
                .split(',')
                .map(|m| m.trim().parse())
                .collect::<std::result::Result<_, _>>()?;
            if !matches!(format.as_str(), "table" | "json") {
                bail!("unknown --format `{format}` (table, json)");
            }
            let text = std::fs::read_to_string(data).with_context(|| format!("reading {}", data.display()))?;
            let mut sessions = parse_sessions(&text).with_context(|| format!("parsing {}", data.display()))?;
            if let Some(n) = limit {
                sessions.truncate(*n);
            }
            let c = compactor(&cli, &store, engine)?;
            let bar = ProgressBar::new((sessions.len() * methods.len()) as u64);
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            let mut first = true;
            let report = speccompact_engine::bench::run(&c, &sessions, &methods, &mut |i, m| {
                if !first {
                    bar.inc(1);
                }
                first = false;
                let id = sessions[i].id.as_deref().unwrap_or("?");
                bar.set_message(format!("{id} {m}"));
            })?;
            bar.finish_and_clear();
            let mut recompactions = Vec::new();
            if let Some(n) = recompact {
                for h in &sessions {
                    let r = speccompact_engine::bench::recompaction(&c, h, Method::Speculative, *n)?;
                    tracing::info!(session = r.session.as_str(), speedup = r.speedup(), "re-compaction done");
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
            let text = if format == "json" {
                serde_json::to_string_pretty(&report)? + "\n"
            } else if recompactions.is_empty() {
                header + &report.table()
            } else {
                format!(
                    "{header}{}\nRe-compaction (speculative, session grown by its last messages):\n\n{}",
                    report.table(),
                    speccompact_engine::bench::recompaction_table(&recompactions)
                )
            };
            print!("{text}");
            if let Some(p) = out {
                let args: Vec<String> = std::env::args().collect();
                let text = if format == "table" {
                    format!(
                        "# Compaction benchmark\n\nCommand: `{}`\n\n{text}",
                        args.join(" ")
                    )
                } else {
                    text
                };
                write_atomic(p, &text)?;
            }
            if let Some(p) = json {
                write_atomic(p, &(serde_json::to_string_pretty(&report)? + "\n"))?;
            }
        }
        Cmd::Eval { .. } => run_eval(&cli, &store)?,
        Cmd::Generate { model, prompt, max_tokens, raw } => {
            let settings = runtime_settings(&cli)?;
            let device = parse_device(&settings.device)?;
            let path = resolve(&store, &model)?;
            let opts = settings.load_options();
            let t0 = Instant::now();
            let m = Model::load(&path, &device, opts).with_context(|| format!("loading {}", path.display()))?;
            let load_ms = t0.elapsed().as_millis();
            let text = match (&m.chat_template, raw) {
                (Some(t), false) => t.render(&[ChatMessage::new("user", &prompt)], true)?,
                _ => prompt.clone(),
            };
            let ids = m.tokenizer.encode(&text, true)?;
            if ids.is_empty() {
                bail!("the prompt encodes to no tokens");
            }
            let t1 = Instant::now();
            // Long prompts are prefilled in chunks; the last token starts the continuation.
            let (head, last) = ids.split_at(ids.len() - 1);
            let mut seq = m.decoder.prefill(head, settings.prefill_chunk)?;
            let out = greedy(&m.decoder, &m.tokenizer, &mut [&mut seq], &[last], &StopRules::new(&m.tokenizer, *max_tokens))?;
            let gen_s = t1.elapsed().as_secs_f64();
            let c = &out[0];
            println!("{}", c.text);
            eprintln!(
                "[{} prompt tokens, {} generated, stop: {:?}, load {load_ms} ms, {:.1} tok/s incl. prefill]",
                ids.len(),
                c.tokens.len(),
                c.reason,
                c.tokens.len() as f64 / gen_s
            );
        }
    }
    Ok(())
}

/// `speccompact calibrate`.
#[allow(clippy::too_many_arguments)]
fn calibrate_cmd(
    cli: &Cli,
    store: &Store,
    target: &str,
    data: &[String],
    summaries: &[PathBuf],
    n_sessions: usize,
    per_session: usize,
    variants: Option<&std::path::Path>,
    only: &[String],
    out: &std::path::Path,
    table: Option<&std::path::Path>,
    json: Option<&std::path::Path>,
) -> Result<()> {
    use speccompact_engine::calibrate::{
        auc, builtin_variants, choose_eta, line_set, parse_variants, rates, score_lines,
        summary_lines, Calibrations, Entry, Labelled, SessionSource,
    };
    let variants = match variants {
        Some(p) => parse_variants(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            &p.display().to_string(),
        )?,
        None => builtin_variants()?,
    };
    let mut variants = variants;
    if !only.is_empty() {
        variants.retain(|v| only.contains(&v.name));
        if variants.is_empty() {
            anyhow::bail!("no judgment variant named {}", only.join(", "));
        }
    }
    // Sessions: the shortest tool-use / coding sessions, file by file.
    let mut picked: Vec<speccompact_eval::EvalSession> = Vec::new();
    for f in data {
        let mut all = speccompact_eval::load_sessions(std::path::Path::new(f))?;
        all.retain(|s| {
            matches!(s.kind.as_str(), "tool-use" | "coding") && !picked.iter().any(|p| p.id == s.id)
        });
        all.sort_by_key(|s| s.chars);
        for s in all {
            if picked.len() < n_sessions {
                picked.push(s);
            }
        }
    }
    // Target-written summaries (sequential runs of bench reports).
    let mut cfg = CompactionConfig::default();
    cfg.target = target.to_string();
    cfg.drafter = target.to_string();
    cfg.calibrated = false;
    let mut written: std::collections::HashMap<String, Vec<(String, String)>> = Default::default();
    for p in summaries {
        let v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )?;
        for r in v["runs"].as_array().into_iter().flatten() {
            if r["method"] == "sequential" {
                if let (Some(s), Some(md)) = (r["session"].as_str(), r["markdown"].as_str()) {
                    written
                        .entry(s.to_string())
                        .or_default()
                        .extend(summary_lines(&cfg, md));
                }
            }
        }
    }
    let settings = runtime_settings(cli)?;
    let (bar, mut cb) = progress_bar();
    let c = Compactor::load(cfg.clone(), &settings, store, &mut cb)?;
    bar.finish_and_clear();
    let mut sources = Vec::new();
    for es in &picked {
        let (transcript, _) = c.transcript(&es.history, Method::Sequential)?;
        let probes = es
            .presence_probes()
            .flat_map(|p| {
                let slot = if p.slot == "any" {
                    "critical_context"
                } else {
                    p.slot.as_str()
                };
                p.expect_any
                    .iter()
                    .map(move |x| (x.clone(), slot.to_string()))
            })
            .collect();
        let id = es.id.clone();
        sources.push(SessionSource {
            summary: written.get(&id).cloned().unwrap_or_default(),
            id,
            transcript,
            probes,
        });
    }
    let set = line_set(&sources, per_session);
    for s in &sources {
        let n = set
            .iter()
            .filter(|l| l.session == s.id && l.positive())
            .count();
        eprintln!(
            "{}: {n} true lines ({} summary lines offered)",
            s.id,
            s.summary.len()
        );
    }
    let n_pos = set.iter().filter(|l| l.positive()).count();
    eprintln!(
        "{} lines ({} true, {} false) from {} sessions; {} variants",
        set.len(),
        n_pos,
        set.len() - n_pos,
        sources.len(),
        variants.len()
    );
    let bar = ProgressBar::new(picked.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} sessions ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut scores: Vec<Vec<speccompact_engine::verify::LineScores>> = vec![Vec::new(); set.len()];
    let t0 = Instant::now();
    for es in &picked {
        let h = &es.history;
        let id = es.id.clone();
        bar.set_message(id.clone());
        let idx: Vec<usize> = (0..set.len()).filter(|&i| set[i].session == id).collect();
        let lines: Vec<&Labelled> = idx.iter().map(|&i| &set[i]).collect();
        if !lines.is_empty() {
            let r = score_lines(&c, h, &lines, &variants)?;
            for (k, i) in idx.iter().enumerate() {
                scores[*i] = r[k].clone();
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let mut md = String::new();
    use std::fmt::Write as _;
    writeln!(
        md,
        "Target `{target}`: {} lines ({} true, {} false) from {} sessions, {:.0} s.\n",
        set.len(),
        n_pos,
        set.len() - n_pos,
        sources.len(),
        secs
    )?;
    writeln!(md, "| variant | AUC | chosen eta | accept (true) | false-accept | at eta 0.7: accept / false-accept | mean r true / false | rule |")?;
    writeln!(md, "|---|---|---|---|---|---|---|---|")?;
    let mut best: Option<(f64, Entry)> = None;
    let mut per_variant = Vec::new();
    for (vi, v) in variants.iter().enumerate() {
        let pos: Vec<f32> = set
            .iter()
            .zip(&scores)
            .filter(|(l, _)| l.positive())
            .map(|(_, s)| s[vi].r)
            .collect();
        let neg: Vec<f32> = set
            .iter()
            .zip(&scores)
            .filter(|(l, _)| !l.positive())
            .map(|(_, s)| s[vi].r)
            .collect();
        let a = auc(&pos, &neg);
        let (r, rule) = choose_eta(&pos, &neg);
        let at7 = rates(&pos, &neg, 0.7);
        let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len().max(1) as f32;
        writeln!(md, "| {} | {a:.3} | {:.2} | {:.0} % | {:.0} % | {:.0} % / {:.0} % | {:.2} / {:.2} | {rule} |", v.name, r.eta, 100.0 * r.accept, 100.0 * r.false_accept, 100.0 * at7.accept, 100.0 * at7.false_accept, mean(&pos), mean(&neg))?;
        let e = Entry {
            eta: (r.eta as f64 * 100.0).round() / 100.0,
            variant: v.name.clone(),
            auc: (a * 1000.0).round() / 1000.0,
            accept_rate: (r.accept * 1000.0).round() / 1000.0,
            false_accept_rate: (r.false_accept * 1000.0).round() / 1000.0,
            lines: set.len(),
            sessions: sources.len(),
            rule,
            line_rule: None,
            line_rule_auc: None,
            line_rule_accept: None,
            line_rule_false_accept: None,
        };
        per_variant
            .push(serde_json::json!({"variant": v.name, "auc": a, "chosen": r, "at_0_7": at7}));
        if best.as_ref().is_none_or(|(b, _)| a > *b) {
            best = Some((a, e));
        }
    }
    // By kind: mean r of the best variant; then the line rule over its scores.
    let mut rule_report = None;
    if let Some((_, e)) = &mut best {
        let vi = variants
            .iter()
            .position(|v| v.name == e.variant)
            .unwrap_or(0);
        let mut kinds: std::collections::BTreeMap<&str, (f32, usize)> = Default::default();
        for (l, s) in set.iter().zip(&scores) {
            let k = kinds.entry(l.kind.as_str()).or_default();
            k.0 += s[vi].r;
            k.1 += 1;
        }
        let line_scores: Vec<_> = scores.iter().map(|s| s[vi]).collect();
        let labels: Vec<bool> = set.iter().map(|l| l.positive()).collect();
        let session: Vec<usize> = set
            .iter()
            .map(|l| sources.iter().position(|s| s.id == l.session).unwrap_or(0))
            .collect();
        let rep = speccompact_engine::calibrate::line_rule::calibrate_rule(
            &line_scores,
            &labels,
            &session,
            5,
        );
        writeln!(
            md,
            "\nLine rule over the verification scores of variant `{}`:\n\n{}",
            e.variant,
            rep.markdown()
        )?;
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        e.line_rule = Some(rep.rule.clone());
        e.line_rule_auc = Some(round(rep.candidates[rep.chosen].held_out_auc));
        e.line_rule_accept = Some(round(rep.rates.accept));
        e.line_rule_false_accept = Some(round(rep.rates.false_accept));
        rule_report = Some(rep);
        writeln!(
            md,
            "\nMean r by line kind, variant `{}`: {}.",
            e.variant,
            kinds
                .iter()
                .map(|(k, (s, n))| format!("{k} {:.2} (n={n})", s / *n as f32))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
        writeln!(
            md,
            "Chosen: variant `{}` (highest AUC), eta {:.2}.",
            e.variant, e.eta
        )?;
    }
    print!("{md}");
    if let Some(p) = table {
        write_atomic(p, &md)?;
    }
    if let Some(p) = json {
        let lines: Vec<serde_json::Value> = set.iter().zip(&scores).map(|(l, s)| serde_json::json!({"line": l, "scores": variants.iter().map(|v| v.name.clone()).zip(s.iter().copied()).collect::<std::collections::BTreeMap<_, _>>()})).collect();
        write_atomic(
            p,
            &serde_json::to_string_pretty(
                &serde_json::json!({"target": target, "variants": per_variant, "line_rule": rule_report, "seconds": secs, "lines": lines}),
            )?,
        )?;
    }
    if let Some((_, e)) = best {
        let mut cal = Calibrations::load(out)?;
        cal.models.insert(target.to_string(), e);
        write_atomic(out, &cal.to_toml()?)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

/// The source revision, when run from a git checkout (`-dirty` with local changes).
fn revision() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(r)
            if git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty()) =>
        {
            format!("{r}-dirty")
        }
        Some(r) => r,
        None => "unknown".into(),
    }
}

/// `speccompact eval`.
fn run_eval(cli: &Cli, store: &Store) -> Result<()> {
    use speccompact_eval::{self as ev, EvalMethod};
    let Cmd::Eval {
        data,
        methods,
        ids,
        exclude,
        shortest,
        with_probes,
        limit,
        tail_budget,
        no_reader,
        no_judges,
        drift,
        drift_generations,
        drift_every,
        drift_method,
        eval_config,
        out,
        json,
        plots,
        engine,
    } = &cli.cmd
    else {
        unreachable!("run_eval is only called for eval")
    };
    let methods = EvalMethod::parse_list(methods)?;
    let tail_budget: ev::TailBudget = tail_budget.parse()?;
    let drift_method: Method = drift_method.parse()?;
    let prompts = match eval_config {
        Some(p) => ev::EvalPrompts::overlay(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            &p.display().to_string(),
        )?,
        None => ev::EvalPrompts::default(),
    };
    let selection = ev::Selection {
        ids: ids.clone(),
        exclude: match exclude {
            Some(p) => ev::load_sessions(p)?.into_iter().map(|s| s.id).collect(),
            None => Vec::new(),
        },
        with_probes: *with_probes,
        shortest: *shortest,
        limit: *limit,
    };
    let sessions = selection
        .apply(ev::load_sessions(data)?)
        .map_err(|e| anyhow::anyhow!("{}: {e}", data.display()))?;
    if sessions.is_empty() {
        bail!("{}: the selection leaves no session", data.display());
    }
    let checksum = ev::sha256_file(data)?;
    let c = compactor(cli, store, engine)?;
    let settings = runtime_settings(cli)?;
    let opts = ev::EvalOptions {
        methods: methods.clone(),
        tail_budget,
        reader: !no_reader,
        judges: !no_judges,
        prompts: prompts.clone(),
    };
    let bar = ProgressBar::new(sessions.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} sessions {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
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
    let mut drifts = Vec::new();
    if *drift > 0 {
        let mut longest: Vec<&ev::EvalSession> = sessions.iter().collect();
        longest.sort_by_key(|s| std::cmp::Reverse(s.history.messages.len()));
        for s in longest.into_iter().take(*drift) {
            let b = ProgressBar::new(*drift_generations as u64);
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} drift generations {msg} [{elapsed}]",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b.set_message(s.id.clone());
            drifts.push(ev::drift_stress(
                &c,
                s,
                drift_method,
                *drift_generations,
                *drift_every,
                &mut |g| b.set_position(g as u64 - 1),
            )?);
            b.finish_and_clear();
        }
    }
    let model = |name: &str| match store.path(name) {
        Ok(p) if p.exists() => format!("{name} ({})", p.display()),
        _ => name.to_string(),
    };
    let provenance = ev::Provenance {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        data: data.display().to_string(),
        data_sha256: checksum,
        selection: selection.describe(sessions.len()),
        drafter: model(&c.config().drafter),
        target: model(&c.config().target),
        compaction_config: toml::to_string(c.config()).unwrap_or_default(),
        eval_config: toml::to_string(&prompts).unwrap_or_default(),
        tail_budget: tail_budget.to_string(),
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
    let md = report.markdown();
    print!("{md}");
    if let Some(p) = out {
        write_atomic(p, &md)?;
    }
    if let Some(p) = json {
        write_atomic(p, &(serde_json::to_string_pretty(&report)? + "\n"))?;
    }
    let prefix = plots
        .clone()
        .or_else(|| out.as_ref().map(|o| o.with_extension("")));
    if let Some(prefix) = prefix {
        for (name, svg) in report.plots() {
            let p = PathBuf::from(format!("{}-{name}.svg", prefix.display()));
            write_atomic(&p, &svg)?;
        }
    }
    Ok(())
}
