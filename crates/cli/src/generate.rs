//! `speccompact generate`: greedy continuation of a prompt with one model (through its chat
//! template unless `--raw`), with load time and speed on stderr.

use crate::load::resolve;
use crate::settings::RuntimeArgs;
use anyhow::{bail, Context, Result};
use speccompact_runtime::{greedy, parse_device, ChatMessage, Model, StopRules};
use speccompact_store::Store;
use std::time::Instant;

/// Flags of `generate`.
#[derive(clap::Args)]
pub struct Args {
    /// Store name or GGUF path.
    #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
    pub model: String,
    /// The user message.
    #[arg(long)]
    pub prompt: String,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Feed the prompt as raw text instead of through the chat template.
    #[arg(long)]
    pub raw: bool,
}

/// Runs `generate`.
pub fn run(a: &Args, rt: &RuntimeArgs, store: &Store) -> Result<()> {
    let settings = rt.settings()?;
    let device = parse_device(&settings.device)?;
    let path = resolve(store, &a.model)?;
    let t0 = Instant::now();
    let m = Model::load(&path, &device, settings.load_options())
        .with_context(|| format!("loading {}", path.display()))?;
    let load_ms = t0.elapsed().as_millis();
    let text = match (&m.chat_template, a.raw) {
        (Some(t), false) => t.render(&[ChatMessage::new("user", &a.prompt)], true)?,
        _ => a.prompt.clone(),
    };
    let ids = m.tokenizer.encode(&text, true)?;
    if ids.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    let t1 = Instant::now();
    // Long prompts are prefilled in chunks; the last token starts the continuation.
    let (head, last) = ids.split_at(ids.len() - 1);
    let mut seq = m.decoder.prefill(head, settings.prefill_chunk)?;
    let out = greedy(
        &m.decoder,
        &m.tokenizer,
        &mut [&mut seq],
        &[last],
        &StopRules::new(&m.tokenizer, a.max_tokens),
    )?;
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
    Ok(())
}
