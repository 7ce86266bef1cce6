//! `speccompact`: model store management and greedy generation with the runtime.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use speccompact_runtime::{
    greedy, parse_device, set_threads, ChatMessage, Model, RuntimeSettings, StopRules,
};
use speccompact_store::{Progress, Status, Store};
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
    config: Option<PathBuf>,
    /// CPU threads for every kernel (0 = all cores).
    #[arg(long, global = true)]
    threads: Option<usize>,
    /// Device: `cpu` or `cuda:N`.
    #[arg(long, global = true)]
    device: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
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
    match cli.cmd {
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
        Cmd::Generate { model, prompt, max_tokens, raw } => {
            let mut settings = match &cli.config {
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
            let out = greedy(&m.decoder, &m.tokenizer, &mut [&mut seq], &[last], &StopRules::new(&m.tokenizer, max_tokens))?;
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
