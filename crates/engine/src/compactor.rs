//! The public API: [`Compactor`] (models + settings), [`Compaction`] (the six slots, the
//! markdown and the trace), the progress [`Event`]s, and the shared steps every method takes
//! (rendering the history within the context, prefilling, assembling, the budget check).

use crate::backend::{Backend, Prefilled, Request, Response};
use crate::config::{CompactionConfig, DrafterView, Overflow, Overlap};
use crate::model_backend::ModelBackend;
use crate::session_cache::{Role, SessionCache};
use crate::{baselines, prompt, speculative, Error, Result};
use serde::Serialize;
use speccompact_history::{render, slot_view, History, Message, RenderOptions, ViewOptions};
use std::sync::{Arc, Mutex};
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
    /// Target-written whole bodies of slots that had no content line (one per such slot).
    pub whole_slot_calls: usize,
    /// Lines those bodies added (origin `repair`).
    pub whole_slot_lines: usize,
    /// lines_accepted / lines_proposed (0 when nothing was proposed).
    pub acceptance_rate: f64,
    /// Tokens the drafter generated.
    pub drafter_tokens: usize,
    /// Tokens the target generated.
    pub target_tokens: usize,
    /// Shared prefix of the target, in tokens (0 when unused).
    pub target_prefix_tokens: usize,
    /// Shared prefix of the drafter, in tokens (0 when unused; the sum over slot views).
    pub drafter_prefix_tokens: usize,
    /// Target prefix positions taken from an earlier prefill of the session (not computed).
    pub target_prefix_reused: usize,
    /// Drafter prefix positions taken from an earlier prefill (of the session, or of another
    /// slot's view).
    pub drafter_prefix_reused: usize,
    /// Slot views the drafter read (0: it read the whole history).
    pub drafter_views: usize,
    /// Messages each slot view left out, per slot (empty without views).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub view_omitted_messages: Vec<usize>,
    /// Stages run for a history longer than the target's context (empty: one stage).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<Stage>,
    /// Messages left out by a middle cut (first and last, 1-based), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub omitted_messages: Option<(usize, usize)>,
    /// Target tokens of the assembled summary.
    pub summary_tokens: usize,
    /// Every judgment in order: the distribution of r for accepted and rejected lines.
    pub judgments: Vec<Judged>,
}

/// One stage of a compaction in stages.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stage {
    /// Messages of the original history it compacted (1-based, inclusive).
    pub messages: (usize, usize),
    /// Whether its input began with the summary of the stages before it.
    pub carried_summary: bool,
    /// Its wall time.
    pub wall_ms: f64,
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

struct Inner<B: Backend> {
    drafter: B,
    target: B,
    config: CompactionConfig,
    /// Prefilled prefixes per session, kept across compactions.
    cache: Mutex<SessionCache<B::Prefix>>,
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
        let bound = config.session_cache_mb.saturating_mul(1 << 20);
        Ok(Self {
            inner: Arc::new(Inner {
                drafter,
                target,
                config,
                cache: Mutex::new(SessionCache::new(bound)),
            }),
        })
    }

    /// Drops every cached prefix of `session` (and of its stages); returns how many. Call it
    /// when a session's text is deleted, so none of it stays in a cache.
    pub fn forget(&self, session: &str) -> Result<usize> {
        let mut c = self.cache()?;
        let stages = format!("{session}{STAGE_MARK}");
        let mut n = c.forget(session);
        for k in 1..=MAX_STAGES {
            n += c.forget(&format!("{stages}{k}"));
        }
        Ok(n)
    }

    /// Drops every cached prefix of every session; returns how many.
    pub fn forget_all(&self) -> Result<usize> {
        let mut c = self.cache()?;
        Ok(c.clear())
    }

    /// Prefixes cached across compactions: (entries, bytes).
    pub fn cached(&self) -> Result<(usize, usize)> {
        let c = self.cache()?;
        Ok((c.len(), c.bytes()))
    }

    fn cache(&self) -> Result<std::sync::MutexGuard<'_, SessionCache<B::Prefix>>> {
        self.inner.cache.lock().map_err(|_| Error::Backend {
            backend: "compactor".into(),
            reason: "the session cache lock is poisoned (a compaction panicked)".into(),
        })
    }

    /// Prefills `text` on `model`, starting from the session's cached prefix of `role` (or
    /// `fallback`), and caches the result under the session.
    fn prefill_cached(
        &self,
        model: &B,
        session: Option<&str>,
        role: Role,
        text: &str,
        fallback: Option<&B::Prefix>,
    ) -> Result<Prefilled<B::Prefix>> {
        let cached = match session {
            Some(s) => self.cache()?.get(s, role),
            None => None,
        };
        let p = model.prefill(text, cached.as_ref().or(fallback))?;
        if let Some(s) = session {
            let bytes = model.prefix_bytes(&p.prefix);
            self.cache()?.insert(s, role, p.prefix.clone(), bytes);
        }
        Ok(p)
    }

    /// Whether the whole history fits the target for `method`.
    fn fits_target(&self, history: &History, method: Method) -> Result<bool> {
        let cfg = &self.inner.config;
        let t = &self.inner.target;
        let text = render(
            history,
            &RenderOptions {
                tool_result_cap: cfg.tool_result_cap,
                omit: None,
            },
        );
        let tokens = t.count_tokens(&prompt::prefix(t.format(), cfg, &text))?;
        Ok(tokens <= t.context_length().saturating_sub(reserve(cfg, method)))
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
        // The drafter reads slot views when the history does not fit it; only the target
        // must read the whole history.
        let mut models: Vec<&B> = Vec::new();
        if method.uses_target() {
            models.push(&self.inner.target);
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
        if cfg.overflow != Overflow::MiddleCut || n < 3 {
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

    /// Runs one compaction on this thread, reporting progress to `on_event`. A history with
    /// an id keeps its prefilled prefixes in the session cache: compacting it again (grown
    /// or not) prefills only what changed. A history longer than the target's context is
    /// compacted in stages unless `overflow` says otherwise.
    pub fn compact_blocking(
        &self,
        history: &History,
        method: Method,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<Compaction> {
        if history.messages.is_empty() {
            return Err(speccompact_history::HistoryError::Empty.into());
        }
        if self.inner.config.overflow == Overflow::Stages
            && method.uses_target()
            && !self.fits_target(history, method)?
        {
            return self.compact_in_stages(history, method, on_event, 1);
        }
        self.compact_once(history, method, on_event)
    }

    /// Compacts the longest run of older messages that fits the target, then that summary
    /// with the remaining messages (in stages again if that is still too long).
    fn compact_in_stages(
        &self,
        history: &History,
        method: Method,
        on_event: &mut dyn FnMut(&Event),
        stage: usize,
    ) -> Result<Compaction> {
        let t0 = Instant::now();
        let n = history.messages.len();
        let carried = stage > 1;
        let part = |k: usize| History {
            id: history.id.clone(),
            messages: history.messages[..k].to_vec(),
        };
        // Largest k whose first k messages fit (fitting is monotone in k).
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.fits_target(&part(mid), method)? {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let k = lo;
        // At least one new message must go into the first part beside a carried summary.
        if k < 1 + usize::from(carried) || stage > MAX_STAGES {
            return Err(self.too_long_error(history, method)?);
        }
        if k == n {
            return self.compact_once(history, method, on_event);
        }
        let mut older = part(k);
        older.id = history
            .id
            .as_ref()
            .map(|id| format!("{id}{STAGE_MARK}{stage}"));
        let first = self.compact_once(&older, method, on_event)?;
        let first_ms = first.trace.wall_ms;
        let mut rest = History {
            id: history.id.clone(),
            messages: Vec::with_capacity(n - k + 1),
        };
        rest.messages.push(Message::text(
            speccompact_history::Role::User,
            &format!(
                "[Summary of the {} earlier messages, compacted before the rest]\n{}",
                k - usize::from(carried),
                first.markdown.trim_end()
            ),
        ));
        rest.messages.extend_from_slice(&history.messages[k..]);
        let mut out = if self.fits_target(&rest, method)? {
            self.compact_once(&rest, method, on_event)?
        } else {
            self.compact_in_stages(&rest, method, on_event, stage + 1)?
        };
        // Stages in this history's message numbers: the rest's first message is the carried
        // summary, its message j is message k + j - 1 here.
        let mut stages = vec![Stage {
            messages: (1, k),
            carried_summary: carried,
            wall_ms: first_ms,
        }];
        if out.trace.stages.is_empty() {
            stages.push(Stage {
                messages: (k + 1, n),
                carried_summary: true,
                wall_ms: out.trace.wall_ms,
            });
        } else {
            stages.extend(out.trace.stages.iter().map(|s| Stage {
                messages: (s.messages.0.max(2) + k - 1, s.messages.1 + k - 1),
                ..s.clone()
            }));
        }
        let t = &mut out.trace;
        t.stages = stages;
        t.prefill_ms += first.trace.prefill_ms;
        t.draft_ms += first.trace.draft_ms;
        t.verify_ms += first.trace.verify_ms;
        t.repair_ms += first.trace.repair_ms;
        t.drafter_tokens += first.trace.drafter_tokens;
        t.target_tokens += first.trace.target_tokens;
        t.wall_ms = t0.elapsed().as_secs_f64() * 1e3;
        Ok(out)
    }

    /// The context error for a history that cannot be split into stages.
    fn too_long_error(&self, history: &History, method: Method) -> Result<Error> {
        let cfg = &self.inner.config;
        let t = &self.inner.target;
        let text = render(
            history,
            &RenderOptions {
                tool_result_cap: cfg.tool_result_cap,
                omit: None,
            },
        );
        let tokens = t.count_tokens(&prompt::prefix(t.format(), cfg, &text))?;
        Ok(Error::HistoryTooLong {
            model: t.name().to_string(),
            tokens,
            limit: t.context_length().saturating_sub(reserve(cfg, method)),
            context: t.context_length(),
        })
    }

    /// One compaction of a history that fits the target.
    fn compact_once(
        &self,
        history: &History,
        method: Method,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<Compaction> {
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
        let session = if cfg.session_cache_mb > 0 {
            history.id.as_deref()
        } else {
            None
        };
        let tprefix = prompt::prefix(inner.target.format(), cfg, &transcript);
        let views = method.uses_drafter() && self.needs_views(&transcript)?;
        let open_t = || -> Result<Option<Prefilled<B::Prefix>>> {
            method
                .uses_target()
                .then(|| self.prefill_cached(&inner.target, session, Role::Target, &tprefix, None))
                .transpose()
        };
        let open_d = || -> Result<Option<(B::Session, DrafterPrefill)>> {
            if !method.uses_drafter() {
                return Ok(None);
            }
            if views {
                return self.open_views(history, session).map(Some);
            }
            let dprefix = prompt::prefix(inner.drafter.format(), cfg, &transcript);
            let p = self.prefill_cached(&inner.drafter, session, Role::Drafter, &dprefix, None)?;
            Ok(Some((
                inner.drafter.session(&p.prefix),
                DrafterPrefill {
                    tokens: p.tokens,
                    reused: p.reused,
                    omitted: Vec::new(),
                },
            )))
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
        if let Some(p) = ts? {
            job.trace.target_prefix_tokens = p.tokens;
            job.trace.target_prefix_reused = p.reused;
            job.tsess = Some(inner.target.session(&p.prefix));
        }
        if let Some((sess, d)) = ds? {
            job.trace.drafter_prefix_tokens = d.tokens;
            job.trace.drafter_prefix_reused = d.reused;
            job.trace.drafter_views = d.omitted.len();
            job.trace.view_omitted_messages = d.omitted;
            job.dsess = Some(sess);
        }
        job.trace.prefill_ms = tp.elapsed().as_secs_f64() * 1e3;
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

impl<B: Backend + 'static> Compactor<B> {
    /// Whether the drafter reads slot views: always when configured, else when the whole
    /// history does not fit its context.
    fn needs_views(&self, transcript: &str) -> Result<bool> {
        let cfg = &self.inner.config;
        if cfg.drafter_view == DrafterView::Always {
            return Ok(true);
        }
        let d = &self.inner.drafter;
        let tokens = d.count_tokens(&prompt::prefix(d.format(), cfg, transcript))?;
        Ok(tokens
            > d.context_length()
                .saturating_sub(reserve(cfg, Method::Speculative)))
    }

    /// Prefills one view of the history per slot for the drafter (each view reuses the
    /// positions it shares with the session's earlier view of that slot, else with the
    /// previous slot's view) and opens a session whose streams each read their own.
    fn open_views(
        &self,
        history: &History,
        session: Option<&str>,
    ) -> Result<(B::Session, DrafterPrefill)> {
        let cfg = &self.inner.config;
        let d = &self.inner.drafter;
        let overhead = d.count_tokens(&prompt::prefix(d.format(), cfg, ""))?;
        let window = d
            .context_length()
            .saturating_sub(reserve(cfg, Method::Speculative));
        let budget = cfg.drafter_view_tokens.min(window).saturating_sub(overhead);
        let opts = ViewOptions {
            budget_tokens: budget,
            render: RenderOptions {
                tool_result_cap: cfg.tool_result_cap,
                omit: None,
            },
            ..ViewOptions::default()
        };
        let mut count = |t: &str| d.count_tokens(t).unwrap_or(t.len());
        let mut prev: Option<B::Prefix> = None;
        let mut sess: Option<B::Session> = None;
        let mut out = DrafterPrefill {
            tokens: 0,
            reused: 0,
            omitted: Vec::with_capacity(cfg.slots.len()),
        };
        for (i, slot) in cfg.slots.iter().enumerate() {
            let view = slot_view(history, &slot.name, &opts, &mut count);
            let text = prompt::prefix(d.format(), cfg, &view.text);
            let p = self.prefill_cached(d, session, Role::DrafterView(i), &text, prev.as_ref())?;
            out.tokens += p.tokens;
            out.reused += p.reused;
            out.omitted
                .push(view.omitted.iter().map(|r| r.end - r.start).sum());
            let s = sess.get_or_insert_with(|| d.session(&p.prefix));
            d.set_stream_prefix(s, i, &p.prefix);
            prev = Some(p.prefix);
        }
        let sess = sess.ok_or_else(|| Error::Config {
            origin: "compactor".into(),
            reason: "no slots to draft".into(),
        })?;
        Ok((sess, out))
    }
}

/// What the drafter's prefill did.
struct DrafterPrefill {
    tokens: usize,
    reused: usize,
    /// Messages each slot view left out (empty without views).
    omitted: Vec<usize>,
}

/// Joins a session id and a stage number in stage parts' cache keys.
const STAGE_MARK: &str = "#stage";
/// Most stages of one compaction.
const MAX_STAGES: usize = 16;

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
