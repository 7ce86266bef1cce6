//! `align data`: for each training session the target writes every slot alone (the
//! target-self method) on the drafter's view of the history, so each example is (the exact
//! prompt the drafter sees for that slot, the target's body). Bodies [`check`] rejects are
//! dropped and counted. Examples go to prompt/completion JSONL and, pre-tokenized with the
//! drafter's tokenizer, to `input_ids`/`labels` JSONL (labels −100 on the prompt); sessions
//! are split into train and validation by a hash of their id.
//!
//! Resumable: each finished session is written to `sessions/NNNNN.json` (atomically) before
//! the next starts, and a later run takes those files as they are; the JSONL files and the
//! manifest are assembled from them at the end, in selection order, so a run that was
//! stopped and resumed writes the same files as one that was not.

use crate::filter::{check, Rejection};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use speccompact_engine::{prompt, Backend, Compactor, Method};
use speccompact_eval::data::{history_text, sha256_file, EvalSession};
use speccompact_history::History;
use speccompact_runtime::Tokenizer;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A model as the manifest records it.
#[derive(Debug, Clone)]
pub struct ModelFile {
    /// Store name (or the path it was given as).
    pub name: String,
    /// The file (or folder) it was loaded from.
    pub path: PathBuf,
}

/// Settings of a data build.
#[derive(Debug, Clone)]
pub struct DataOptions {
    /// Output folder.
    pub out: PathBuf,
    /// Most drafter tokens in a prompt (shared prefix plus the slot's request): the middle
    /// of a longer history is left out, keeping its first message and as many of its last
    /// as fit.
    pub max_prompt_tokens: usize,
    /// Sessions whose id hashes below this percentage go to validation.
    pub validation_percent: u32,
}

impl Default for DataOptions {
    fn default() -> Self {
        Self {
            out: PathBuf::from("align-data"),
            max_prompt_tokens: 2048,
            validation_percent: 10,
        }
    }
}

/// One training example.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Example {
    /// Slot name.
    pub slot: String,
    /// The drafter's prompt: shared prefix and the slot's request, as the engine frames them.
    pub prompt: String,
    /// The target's body, ending with a newline.
    pub completion: String,
    /// Drafter tokens: the prefix (with BOS), the request and the body tokenized apart, as
    /// the engine does, then the end-of-turn token.
    pub input_ids: Vec<u32>,
    /// `input_ids` with every prompt token as −100.
    pub labels: Vec<i64>,
}

/// A dropped slot body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dropped {
    /// Slot name.
    pub slot: String,
    /// The reason's name (`empty`, `looping`, `copied`, `unsourced`, `too_long`).
    pub reason: String,
    /// What the filter saw (the looping line, the unsourced assertions, ...).
    pub detail: String,
}

/// Everything one session gave: what `sessions/NNNNN.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionData {
    /// Session id.
    pub id: String,
    /// `train` or `validation`.
    pub split: String,
    /// Messages left out of the middle (1-based, inclusive), if any.
    pub omitted: Option<(usize, usize)>,
    /// The kept examples, in slot order.
    pub examples: Vec<Example>,
    /// The dropped bodies.
    pub dropped: Vec<Dropped>,
}

/// What a build did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DataSummary {
    /// Sessions in the selection.
    pub sessions: usize,
    /// Sessions built by this run (the others were resumed from their files).
    pub built: usize,
    /// Seconds this run spent building sessions.
    pub seconds: f64,
    /// Examples per split.
    pub examples: BTreeMap<String, usize>,
    /// Dropped bodies per reason.
    pub dropped: BTreeMap<String, usize>,
}

/// `train` or `validation` for a session id: the first 32 bits of its SHA-256, modulo 100,
/// below `percent` is validation.
pub fn split_of(id: &str, percent: u32) -> &'static str {
    let h = Sha256::digest(id.as_bytes());
    let x = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    if x % 100 < percent {
        "validation"
    } else {
        "train"
    }
}

/// Writes `text` to `path` through a temporary file in the same folder.
fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(Error::io(dir))?;
    std::io::Write::write_all(&mut tmp, text.as_bytes()).map_err(Error::io(path))?;
    // Temporary files are private; the data are ordinary files.
    #[cfg(unix)]
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .map_err(Error::io(path))?;
    tmp.persist(path).map_err(|e| Error::io(path)(e.error))?;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The end-of-turn token closing each body: the drafter's end token that opens its chat
/// format's text after an assistant turn (`<|im_end|>` for ChatML), else its first end token.
fn end_token(tok: &Tokenizer, after_assistant: &str) -> Result<u32> {
    let ends = tok.eos_tokens();
    for &t in ends {
        let text = tok.decode(&[t])?;
        if !text.is_empty() && after_assistant.starts_with(&text) {
            return Ok(t);
        }
    }
    ends.first().copied().ok_or_else(|| {
        Error::Settings("the drafter's tokenizer names no end token to close a body".into())
    })
}

/// A history as the drafter reads it: the messages kept, their transcript, and the messages
/// left out of the middle (1-based, inclusive).
type View = (History, String, Option<(usize, usize)>);

/// The drafter's view: the whole history if its prompts fit `max` drafter tokens, else its
/// first message and the most of its last messages that fit (`None` when even the first
/// message alone does not).
fn drafter_view<B: Backend + 'static>(
    c: &Compactor<B>,
    history: &History,
    max: usize,
) -> Result<Option<View>> {
    let cfg = c.config();
    let d = c.drafter();
    let longest_request = prompt::slot_requests(d.format(), cfg)
        .iter()
        .map(|r| d.count_tokens(r))
        .collect::<speccompact_engine::Result<Vec<_>>>()
        .map_err(|source| engine(history, source))?
        .into_iter()
        .max()
        .unwrap_or(0);
    let n = history.messages.len();
    // The history keeping the first message and the last `k` (all of it when k = n - 1).
    let view = |k: usize| -> Result<(History, String, bool)> {
        let mut messages = history.messages[..1].to_vec();
        messages.extend_from_slice(&history.messages[n - k..]);
        let h = History { id: None, messages };
        let (text, _) = c
            .transcript(&h, Method::TargetSelf)
            .map_err(|source| engine(history, source))?;
        let tokens = d
            .count_tokens(&prompt::prefix(d.format(), cfg, &text))
            .map_err(|source| engine(history, source))?;
        Ok((h, text, tokens + longest_request <= max))
    };
    if n == 0 {
        return Ok(None);
    }
    let (h, text, fits) = view(n - 1)?;
    if fits {
        return Ok(Some((h, text, None)));
    }
    if !view(0)?.2 {
        return Ok(None);
    }
    // Largest k that fits (fits(0) holds, fits(n - 1) does not).
    let (mut lo, mut hi) = (0, n - 1);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if view(mid)?.2 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (h, text, _) = view(lo)?;
    Ok(Some((h, text, Some((2, n - lo)))))
}

fn engine(history: &History, source: speccompact_engine::Error) -> Error {
    Error::Engine {
        session: history.id.clone().unwrap_or_default(),
        source,
    }
}

/// Builds one session's examples.
fn build_session<B: Backend + 'static>(
    c: &Compactor<B>,
    tok: &Tokenizer,
    end: u32,
    s: &EvalSession,
    opts: &DataOptions,
) -> Result<SessionData> {
    let split = split_of(&s.id, opts.validation_percent).to_string();
    let mut out = SessionData {
        id: s.id.clone(),
        split,
        omitted: None,
        examples: Vec::new(),
        dropped: Vec::new(),
    };
    let cfg = c.config();
    let Some((view, transcript, omitted)) = drafter_view(c, &s.history, opts.max_prompt_tokens)?
    else {
        for slot in &cfg.slots {
            out.dropped.push(Dropped {
                slot: slot.name.clone(),
                reason: "too_long".into(),
                detail: format!(
                    "the first message alone is over {} drafter tokens",
                    opts.max_prompt_tokens
                ),
            });
        }
        return Ok(out);
    };
    out.omitted = omitted;
    let written = c
        .compact_blocking(&view, Method::TargetSelf, &mut |_| {})
        .map_err(|source| engine(&s.history, source))?;
    let record = history_text(&view);
    let d = c.drafter();
    let prefix = prompt::prefix(d.format(), cfg, &transcript);
    let prefix_ids = tok.encode(&prefix, true)?;
    for (spec, slot) in cfg.slots.iter().zip(&written.slots) {
        let body: Vec<&str> = slot.lines.iter().map(|l| l.text.as_str()).collect();
        let body = body.join("\n");
        if let Some(r) = check(&body, &record) {
            let detail = match &r {
                Rejection::Empty => String::new(),
                Rejection::Looping(l) => l.clone(),
                Rejection::Copied(p) => format!("{p} % of the content copied"),
                Rejection::Unsourced(a) => a.join(" | "),
            };
            out.dropped.push(Dropped {
                slot: spec.name.clone(),
                reason: r.name().into(),
                detail,
            });
            continue;
        }
        let request = prompt::slot_request(d.format(), cfg, spec);
        let completion = format!("{body}\n");
        let mut input_ids = prefix_ids.clone();
        input_ids.extend(tok.encode(&request, false)?);
        let prompt_len = input_ids.len();
        input_ids.extend(tok.encode(&completion, false)?);
        input_ids.push(end);
        let labels = input_ids
            .iter()
            .enumerate()
            .map(|(i, &t)| if i < prompt_len { -100 } else { i64::from(t) })
            .collect();
        out.examples.push(Example {
            slot: spec.name.clone(),
            prompt: format!("{prefix}{request}"),
            completion,
            input_ids,
            labels,
        });
    }
    Ok(out)
}

/// Reads a session file a previous run wrote, checking it is the session expected there.
fn resume(path: &Path, id: &str) -> Result<Option<SessionData>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path)(e)),
    };
    let bad = |reason: String| Error::Resume {
        path: path.display().to_string(),
        reason,
    };
    let d: SessionData = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    if d.id != id {
        return Err(bad(format!(
            "holds session {}, this selection has {id} there (another selection was built into this folder)",
            d.id
        )));
    }
    Ok(Some(d))
}

/// Builds (or resumes) the data for `sessions` (read from `data`) into `opts.out`, calling
/// `on_session(done, id, resumed)` after each session. The compactor's drafter is the model
/// trained and its target the writer; `tok` is the drafter's tokenizer.
pub fn build<B: Backend + 'static>(
    c: &Compactor<B>,
    tok: &Tokenizer,
    models: [&ModelFile; 2],
    data: &Path,
    sessions: &[EvalSession],
    opts: &DataOptions,
    on_session: &mut dyn FnMut(usize, &str, bool),
) -> Result<DataSummary> {
    if opts.max_prompt_tokens == 0 || opts.validation_percent > 100 {
        return Err(Error::Settings(format!(
            "max prompt tokens {} (must be > 0), validation {} % (must be ≤ 100)",
            opts.max_prompt_tokens, opts.validation_percent
        )));
    }
    let dir = opts.out.join("sessions");
    std::fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
    let end = end_token(tok, &c.drafter().format().assistant_to_user)?;
    let mut summary = DataSummary {
        sessions: sessions.len(),
        ..Default::default()
    };
    let mut all = Vec::with_capacity(sessions.len());
    for (i, s) in sessions.iter().enumerate() {
        let path = dir.join(format!("{i:05}.json"));
        let (d, resumed) = match resume(&path, &s.id)? {
            Some(d) => (d, true),
            None => {
                let t0 = Instant::now();
                let d = build_session(c, tok, end, s, opts)?;
                summary.seconds += t0.elapsed().as_secs_f64();
                summary.built += 1;
                let text = serde_json::to_string(&d).map_err(|e| Error::Settings(e.to_string()))?;
                write_atomic(&path, &text)?;
                tracing::info!(
                    session = s.id.as_str(),
                    examples = d.examples.len(),
                    dropped = d.dropped.len(),
                    "session built"
                );
                (d, false)
            }
        };
        on_session(i + 1, &s.id, resumed);
        all.push(d);
    }
    // Assemble the outputs.
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for split in ["train", "validation"] {
        let (mut text, mut tokens) = (String::new(), String::new());
        let mut n = 0;
        for d in all.iter().filter(|d| d.split == split) {
            for e in &d.examples {
                let line = serde_json::json!({
                    "session": d.id, "slot": e.slot, "prompt": e.prompt, "completion": e.completion,
                });
                text.push_str(&line.to_string());
                text.push('\n');
                let line = serde_json::json!({
                    "session": d.id, "slot": e.slot, "input_ids": e.input_ids, "labels": e.labels,
                });
                tokens.push_str(&line.to_string());
                tokens.push('\n');
                n += 1;
            }
        }
        summary.examples.insert(split.into(), n);
        for (name, body) in [
            (format!("{split}.jsonl"), text),
            (format!("{split}.tokens.jsonl"), tokens),
        ] {
            write_atomic(&opts.out.join(&name), &body)?;
            files.insert(name, hex(&Sha256::digest(body.as_bytes())));
        }
    }
    for d in &all {
        for x in &d.dropped {
            *summary.dropped.entry(x.reason.clone()).or_default() += 1;
        }
    }
    let mut licences: BTreeMap<String, usize> = BTreeMap::new();
    for s in sessions {
        let l = if s.license.is_empty() {
            "unstated"
        } else {
            &s.license
        };
        *licences.entry(l.to_string()).or_default() += 1;
    }
    let cfg = c.config();
    let prompts = serde_json::to_string(&(&cfg.prompts, &cfg.slots))
        .map_err(|e| Error::Settings(e.to_string()))?;
    let model = |m: &ModelFile| -> Result<serde_json::Value> {
        let sha = if m.path.is_file() {
            sha256_file(&m.path)?
        } else {
            String::new()
        };
        Ok(
            serde_json::json!({ "name": m.name, "file": m.path.file_name().map(|f| f.to_string_lossy()), "sha256": sha }),
        )
    };
    let manifest = serde_json::json!({
        "method": "target-self on the drafter's view of each history",
        "drafter": model(models[0])?,
        "target": model(models[1])?,
        "prompts_sha256": hex(&Sha256::digest(prompts.as_bytes())),
        "settings": {
            "max_prompt_tokens": opts.max_prompt_tokens,
            "validation_percent": opts.validation_percent,
            "slot_max_tokens": cfg.slot_max_tokens,
            "tool_result_cap": cfg.tool_result_cap,
            "copied_line_chars": crate::filter::COPIED_LINE_CHARS,
        },
        "data": {
            "file": data.file_name().map(|f| f.to_string_lossy()),
            "sha256": sha256_file(data)?,
            "sessions": sessions.iter().map(|s| &s.id).collect::<Vec<_>>(),
            "licences": licences,
        },
        "split": {
            "train_sessions": all.iter().filter(|d| d.split == "train").count(),
            "validation_sessions": all.iter().filter(|d| d.split == "validation").count(),
        },
        "examples": summary.examples,
        "dropped": summary.dropped,
        "files": files,
    });
    let text =
        serde_json::to_string_pretty(&manifest).map_err(|e| Error::Settings(e.to_string()))?;
    write_atomic(&opts.out.join("manifest.json"), &format!("{text}\n"))?;
    Ok(summary)
}
