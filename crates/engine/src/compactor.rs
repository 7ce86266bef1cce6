//! The public API: [`Compactor`] (models + settings), [`Compaction`] (the six slots, the
//! markdown and the trace), the progress [`Event`]s, and the shared steps every method takes
//! (rendering the history within the context, prefilling, assembling, the budget check).

use crate::backend::{Backend, Request, Response};
use crate::config::{CompactionConfig, Overflow, Overlap};
use crate::model_backend::ModelBackend;
use crate::{baselines, prompt, speculative, Error, Result};
use serde::Serialize;
use speccompact_history::{render, History, RenderOptions};
use std::sync::Arc;
use std::time::Instant;

/// A compaction method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// Drafter proposes lines, target verifies each with one token and repairs rejections.
    Speculative,
    /// The target writes the whole summary in one generation.
    Sequential,
    /// The target writes each slot on its own (six batched streams), no drafter.
    TargetSelf,
    /// The drafter writes each slot, nothing is verified: a latency floor.
    DrafterOnly,
}

impl Method {
    /// Every method, ours first.
    pub const ALL: [Method; 4] = [
        Method::Speculative,
        Method::Sequential,
        Method::TargetSelf,
        Method::DrafterOnly,
    ];

    /// The method's command-line name.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Speculative => "speculative",
            Method::Sequential => "sequential",
            Method::TargetSelf => "target-self",
            Method::DrafterOnly => "drafter-only",
        }
    }

    fn uses_drafter(self) -> bool {
        matches!(self, Method::Speculative | Method::DrafterOnly)
    }

    fn uses_target(self) -> bool {
        !matches!(self, Method::DrafterOnly)
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Method {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Method::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| Error::Config {
                origin: "method".into(),
                reason: format!(
                    "unknown method `{s}` (speculative, sequential, target-self, drafter-only)"
                ),
            })
    }
}

/// Who wrote a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Drafted and accepted by verification (or kept unverified by `drafter-only`).
    Draft,
    /// Written by the target in place of a rejected or failed draft.
    Repair,
    /// Accepted without verification: sub-headings, empty-slot markers, blank lines.
    Auto,
    /// Written by the target in a baseline without a drafter.
    Target,
}

/// One line of a slot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LineOut {
    /// The text.
    pub text: String,
    /// Who wrote it.
    pub origin: Origin,
    /// The verification ratio, for verified lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub r: Option<f32>,
}

/// Why a slot ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotStop {
    /// A model ended the section.
    Complete,
    /// The line cap was reached.
    MaxLines,
    /// The next line would exceed the slot's token budget.
    TokenBudget,
    /// A repair came back empty or unusable.
    RepairFailed,
    /// The round limit was reached (a safeguard; reported, never silent).
    RoundLimit,
}

/// One slot of the summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotOut {
    /// Slot name.
    pub name: String,
    /// Slot title.
    pub title: String,
    /// Its lines in order.
    pub lines: Vec<LineOut>,
    /// Why it ended.
    pub stop: SlotStop,
    /// Target tokens of its lines.
    pub tokens: usize,
}

impl SlotOut {
    /// A finished slot; trailing blank lines (formatting with nothing after it) are dropped.
    pub fn new(
        spec: &crate::SlotSpec,
        mut lines: Vec<LineOut>,
        stop: SlotStop,
        tokens: usize,
    ) -> Self {
        while lines.last().is_some_and(|l| l.text.trim().is_empty()) {
            lines.pop();
        }
        Self {
            name: spec.name.clone(),
            title: spec.title.clone(),
            lines,
            stop,
            tokens,
        }
    }
}

/// Counters and times of one compaction.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Trace {
    /// Whole compaction, history rendering and prefill included.
    pub wall_ms: f64,
    /// Prefilling the shared prefixes.
    pub prefill_ms: f64,
    /// Drafter batches.
    pub draft_ms: f64,
    /// Verification batches.
    pub verify_ms: f64,
    /// Repair batches (and the baselines' target generation).
    pub repair_ms: f64,
    /// Drafter requests.
    pub drafter_calls: usize,
    /// Lines judged by the target.
    pub verify_calls: usize,
    /// Target generation requests (repairs, baseline generations).
    pub repair_calls: usize,
    /// Batched model calls (one per drafter / verify / repair batch).
    pub batches: usize,
    /// Drafted lines that went through the checks.
    pub lines_proposed: usize,
    /// Drafted lines kept as drafted (verified or auto-accepted).
    pub lines_accepted: usize,
    /// Drafted lines the target judged and rejected.
    pub lines_rejected: usize,
    /// Drafted lines sent to repair by the checks (duplicate, too long).
    pub lines_failed_checks: usize,
    /// Lines written by repairs and kept.
    pub lines_repaired: usize,
    /// lines_accepted / lines_proposed (0 when nothing was proposed).
    pub acceptance_rate: f64,
    /// Tokens the drafter generated.
    pub drafter_tokens: usize,
    /// Tokens the target generated.
    pub target_tokens: usize,
    /// Shared prefix of the target, in tokens (0 when unused).
    pub target_prefix_tokens: usize,
    /// Shared prefix of the drafter, in tokens (0 when unused).
    pub drafter_prefix_tokens: usize,
    /// Messages left out by a middle cut (first and last, 1-based), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub omitted_messages: Option<(usize, usize)>,
    /// Target tokens of the assembled summary.
    pub summary_tokens: usize,
    /// Every judgment in order: the distribution of r for accepted and rejected lines.
    pub judgments: Vec<Judged>,
}

/// One line judged by the target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judged {
    /// Slot name.
    pub slot: String,
    /// p_yes / (p_yes + p_no).
    pub r: f32,
    /// Whether r reached eta.
    pub accepted: bool,
}

/// A finished compaction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Compaction {
    /// The method that produced it.
    pub method: Method,
    /// The slots, in schema order.
    pub slots: Vec<SlotOut>,
    /// The summary as markdown.
    pub markdown: String,
    /// Counters and times.
    pub trace: Trace,
}

/// Progress of a compaction, for UIs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The shared prefixes are prefilled.
    Prefilled {
        /// Target prefix tokens.
        target_tokens: usize,
        /// Drafter prefix tokens.
        drafter_tokens: usize,
    },
    /// A line was kept.
    LineAccepted {
        /// Slot name.
        slot: String,
        /// The line.
        text: String,
        /// Who wrote it.
        origin: Origin,
        /// Verification ratio, if judged.
        r: Option<f32>,
    },
    /// A drafted line was rejected (by the judge or by the checks) and goes to repair.
    LineRejected {
        /// Slot name.
        slot: String,
        /// The rejected line.
        text: String,
        /// Verification ratio, if judged.
        r: Option<f32>,
    },
    /// A slot is finished.
    SlotDone {
        /// Slot name.
        slot: String,
        /// Why.
        stop: SlotStop,
    },
}

/// Shared state of one compaction run, handed to the method implementations.
pub(crate) struct Job<'a, B: Backend> {
    pub cfg: &'a CompactionConfig,
    pub drafter: &'a B,
    pub target: &'a B,
    pub dsess: Option<B::Session>,
    pub tsess: Option<B::Session>,
    pub trace: Trace,
    pub events: &'a mut dyn FnMut(&Event),
    pub overlap: bool,
}

impl<B: Backend> Job<'_, B> {
    /// Runs one target batch, timed.
    pub fn run_target(&mut self, reqs: &[Request]) -> Result<(Vec<Response>, f64)> {
        run_timed(
            self.target,
            open_session(self.target, &mut self.tsess)?,
            reqs,
        )
    }

    /// Runs one drafter batch, timed.
    pub fn run_drafter(&mut self, reqs: &[Request]) -> Result<(Vec<Response>, f64)> {
        run_timed(
            self.drafter,
            open_session(self.drafter, &mut self.dsess)?,
            reqs,
        )
    }

    /// Target tokens of a line with its newline.
    pub fn line_tokens(&self, text: &str) -> Result<usize> {
        self.target.count_tokens(&format!("{text}\n"))
    }

    pub fn emit(&mut self, e: Event) {
        (self.events)(&e);
    }
}

/// The open session of `b`, or an error naming the backend.
pub(crate) fn open_session<'s, B: Backend>(
    b: &B,
    sess: &'s mut Option<B::Session>,
) -> Result<&'s mut B::Session> {
    sess.as_mut().ok_or_else(|| Error::Backend {
        backend: b.name().to_string(),
        reason: "session not open".into(),
    })
}

/// Runs a batch and measures it; an empty batch costs nothing.
pub(crate) fn run_timed<B: Backend>(
    b: &B,
    sess: &mut B::Session,
    reqs: &[Request],
) -> Result<(Vec<Response>, f64)> {
    if reqs.is_empty() {
        return Ok((Vec::new(), 0.0));
    }
    let t = Instant::now();
    let out = b.run(sess, reqs)?;
    if out.len() != reqs.len() {
        return Err(Error::Backend {
            backend: b.name().to_string(),
            reason: format!("{} responses to {} requests", out.len(), reqs.len()),
        });
    }
    Ok((out, t.elapsed().as_secs_f64() * 1e3))
}

struct Inner<B> {
    drafter: B,
    target: B,
    config: CompactionConfig,
}

/// Drafter + target + settings; cheap to clone and shareable between tasks.
pub struct Compactor<B: Backend = ModelBackend> {
    inner: Arc<Inner<B>>,
}

impl<B: Backend> Clone for Compactor<B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

/// Tokens a model needs after the prefix for `method` (requests, lines, judgment).
fn reserve(cfg: &CompactionConfig, method: Method) -> usize {
    match method {
        Method::Sequential => cfg.summary_budget + 128,
        _ => cfg.slot_max_tokens + cfg.draft_tokens.max(cfg.repair_tokens) + 192,
    }
}

impl<B: Backend + 'static> Compactor<B> {
    /// A compactor over two backends.
    pub fn new(drafter: B, target: B, config: CompactionConfig) -> Result<Self> {
        config.validate("compactor")?;
        Ok(Self {
            inner: Arc::new(Inner {
                drafter,
                target,
                config,
            }),
        })
    }

    /// The settings.
    pub fn config(&self) -> &CompactionConfig {
        &self.inner.config
    }

    /// The drafter backend.
    pub fn drafter(&self) -> &B {
        &self.inner.drafter
    }

    /// The target backend.
    pub fn target(&self) -> &B {
        &self.inner.target
    }

    /// The transcript every method sees: the whole history if it fits every model used,
    /// else an error with the counts, or (when configured) a middle cut.
    pub fn transcript(
        &self,
        history: &History,
        method: Method,
    ) -> Result<(String, Option<(usize, usize)>)> {
        let cfg = &self.inner.config;
        let mut models: Vec<&B> = Vec::new();
        if method.uses_target() {
            models.push(&self.inner.target);
        }
        if method.uses_drafter() {
            models.push(&self.inner.drafter);
        }
        let n = history.messages.len();
        // Some(over) when a model's prefix does not fit: (model, tokens, limit, context).
        let over = |omit: Option<std::ops::Range<usize>>| -> Result<(String, Option<(String, usize, usize, usize)>)> {
            let text = render(
                history,
                &RenderOptions {
                    tool_result_cap: cfg.tool_result_cap,
                    omit,
                },
            );
            for m in &models {
                let p = prompt::prefix(m.format(), cfg, &text);
                let tokens = m.count_tokens(&p)?;
                let ctx = m.context_length();
                let limit = ctx.saturating_sub(reserve(cfg, method));
                if tokens > limit {
                    return Ok((text, Some((m.name().to_string(), tokens, limit, ctx))));
                }
            }
            Ok((text, None))
        };
        let (text, first) = over(None)?;
        let Some((model, tokens, limit, context)) = first else {
            return Ok((text, None));
        };
        let too_long = Error::HistoryTooLong {
            model,
            tokens,
            limit,
            context,
        };
        if cfg.overflow == Overflow::Error || n < 3 {
            return Err(too_long);
        }
        // Smallest middle cut that fits: keep the first message and as much of the end as
        // possible around the middle.
        let range = |k: usize| {
            let start = (1 + (n - 1 - k) / 2).max(1);
            start..start + k
        };
        let (mut lo, mut hi) = (1, n - 2);
        if over(Some(range(hi)))?.1.is_some() {
            return Err(too_long);
        }
        while lo < hi {
            let mid = (lo + hi) / 2;
            if over(Some(range(mid)))?.1.is_some() {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let r = range(lo);
        let (text, _) = over(Some(r.clone()))?;
        tracing::warn!(
            first = r.start + 1,
            last = r.end,
            "history cut in the middle to fit the context"
        );
        Ok((text, Some((r.start + 1, r.end))))
    }

    /// Runs one compaction on this thread, reporting progress to `on_event`.
    pub fn compact_blocking(
        &self,
        history: &History,
        method: Method,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<Compaction> {
        if history.messages.is_empty() {
            return Err(speccompact_history::HistoryError::Empty.into());
        }
        let t0 = Instant::now();
        let inner = &*self.inner;
        let cfg = &inner.config;
        let (transcript, omitted) = self.transcript(history, method)?;
        let overlap = match cfg.overlap {
            Overlap::On => true,
            Overlap::Off => false,
            Overlap::Auto => inner.target.is_gpu() && inner.drafter.is_gpu(),
        };
        let mut job = Job {
            cfg,
            drafter: &inner.drafter,
            target: &inner.target,
            dsess: None,
            tsess: None,
            trace: Trace {
                omitted_messages: omitted,
                ..Trace::default()
            },
            events: on_event,
            overlap,
        };
        let tp = Instant::now();
        let tprefix = prompt::prefix(inner.target.format(), cfg, &transcript);
        let dprefix = prompt::prefix(inner.drafter.format(), cfg, &transcript);
        let open_t = || -> Result<Option<B::Session>> {
            method
                .uses_target()
                .then(|| inner.target.open(&tprefix))
                .transpose()
        };
        let open_d = || -> Result<Option<B::Session>> {
            method
                .uses_drafter()
                .then(|| inner.drafter.open(&dprefix))
                .transpose()
        };
        let (ts, ds) = if overlap {
            std::thread::scope(|s| {
                let d = s.spawn(open_d);
                let t = open_t();
                (
                    t,
                    d.join()
                        .unwrap_or_else(|_| Err(backend_panic(&inner.drafter))),
                )
            })
        } else {
            (open_t(), open_d())
        };
        job.tsess = ts?;
        job.dsess = ds?;
        job.trace.prefill_ms = tp.elapsed().as_secs_f64() * 1e3;
        if job.tsess.is_some() {
            job.trace.target_prefix_tokens = inner.target.count_tokens(&tprefix)?;
        }
        if job.dsess.is_some() {
            job.trace.drafter_prefix_tokens = inner.drafter.count_tokens(&dprefix)?;
        }
        job.emit(Event::Prefilled {
            target_tokens: job.trace.target_prefix_tokens,
            drafter_tokens: job.trace.drafter_prefix_tokens,
        });
        let slots = match method {
            Method::Speculative => speculative::run(&mut job)?,
            Method::Sequential => baselines::sequential(&mut job)?,
            Method::TargetSelf => baselines::per_slot(&mut job, false)?,
            Method::DrafterOnly => baselines::per_slot(&mut job, true)?,
        };
        let markdown = markdown(&slots);
        let mut trace = job.trace;
        trace.summary_tokens = inner.target.count_tokens(&markdown)?;
        trace.acceptance_rate = if trace.lines_proposed > 0 {
            trace.lines_accepted as f64 / trace.lines_proposed as f64
        } else {
            0.0
        };
        trace.wall_ms = t0.elapsed().as_secs_f64() * 1e3;
        if trace.summary_tokens > cfg.summary_budget {
            return Err(Error::SummaryOverBudget {
                tokens: trace.summary_tokens,
                budget: cfg.summary_budget,
            });
        }
        Ok(Compaction {
            method,
            slots,
            markdown,
            trace,
        })
    }

    /// Runs one compaction on the blocking thread pool.
    pub async fn compact(&self, history: History, method: Method) -> Result<Compaction> {
        let (_events, done) = self.compact_stream(history, method);
        done.await.map_err(|e| Error::Backend {
            backend: "compactor".into(),
            reason: format!("compaction task failed: {e}"),
        })?
    }

    /// Starts a compaction on the blocking thread pool; events arrive on the receiver while
    /// it runs, the result on the handle.
    pub fn compact_stream(
        &self,
        history: History,
        method: Method,
    ) -> (
        tokio::sync::mpsc::UnboundedReceiver<Event>,
        tokio::task::JoinHandle<Result<Compaction>>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let me = self.clone();
        let handle = tokio::task::spawn_blocking(move || {
            me.compact_blocking(&history, method, &mut |e| {
                let _ = tx.send(e.clone());
            })
        });
        (rx, handle)
    }
}

fn backend_panic<B: Backend>(b: &B) -> Error {
    Error::Backend {
        backend: b.name().to_string(),
        reason: "prefill thread panicked".into(),
    }
}

/// The summary as markdown: `## Title` then the slot's lines, slots in order.
pub fn markdown(slots: &[SlotOut]) -> String {
    let mut s = String::new();
    for slot in slots {
        s.push_str(&format!("## {}\n", slot.title));
        for l in &slot.lines {
            s.push_str(&l.text);
            s.push('\n');
        }
        s.push('\n');
    }
    s
}

impl Compactor<ModelBackend> {
    /// Resolves both models by store name or path (fetching on first use), loads them with
    /// the runtime settings, and builds a compactor. The target's entry in
    /// `configs/calibration.toml` sets η and the judgment prompt where the settings leave them
    /// unset (see [`CompactionConfig::apply_calibration`]).
    pub fn load(
        config: CompactionConfig,
        settings: &speccompact_runtime::RuntimeSettings,
        store: &speccompact_store::Store,
        progress: &mut dyn FnMut(speccompact_store::Progress),
    ) -> Result<Self> {
        let mut config = config;
        if let Some(applied) = config.apply_calibration(
            &crate::calibrate::Calibrations::builtin()?,
            &crate::calibrate::builtin_variants()?,
        ) {
            tracing::info!(%applied, "calibrated verification");
        }
        config.validate("calibration")?;
        let device = speccompact_runtime::parse_device(&settings.device)?;
        let opts = settings.load_options();
        let load = |name: &str,
                    progress: &mut dyn FnMut(speccompact_store::Progress)|
         -> Result<ModelBackend> {
            let path = store.resolve(name, progress)?;
            let model = speccompact_runtime::Model::load(&path, &device, opts)?;
            ModelBackend::new(name, Arc::new(model), settings.prefill_chunk)
        };
        let target = load(&config.target, progress)?;
        let drafter = if config.drafter == config.target {
            target.clone()
        } else {
            load(&config.drafter, progress)?
        };
        Self::new(drafter, target, config)
    }
}
