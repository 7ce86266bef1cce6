//! The public API: [`Compactor`] (models + settings), [`Compaction`] (the six slots, the
//! markdown and the trace), the progress [`Event`]s, and the shared steps every method takes
//! (rendering the history within the context, prefilling, assembling, the budget check).

use crate::backend::{Backend, Prefilled, Request, Response};
use crate::config::{CompactionConfig, Overflow, Overlap};
use crate::model_backend::ModelBackend;
use crate::session_cache::{Role, SessionCache};
use crate::{baselines, prompt, speculative, Error, Result};
use speccompact_history::{render, History, RenderOptions};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use crate::outcome::{
    Compaction, Event, Judged, LineOut, Method, Origin, SlotOut, SlotStop, Stage, Trace,
};

mod long_history;

use long_history::{DrafterPrefill, MAX_STAGES, STAGE_MARK};

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

    /// The target's prefix tokens for the whole history and the most `method` allows.
    fn target_tokens(&self, history: &History, method: Method) -> Result<(usize, usize)> {
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
        Ok((
            tokens,
            t.context_length().saturating_sub(reserve(cfg, method)),
        ))
    }

    /// Whether the whole history fits the target for `method`.
    fn fits_target(&self, history: &History, method: Method) -> Result<bool> {
        let (tokens, limit) = self.target_tokens(history, method)?;
        Ok(tokens <= limit)
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
        // The fit is checked once, by `transcript` before any model work: a history that is
        // too long for the target fails there and goes to stages.
        match self.compact_once(history, method, on_event) {
            Err(Error::HistoryTooLong { .. })
                if self.inner.config.overflow == Overflow::Stages && method.uses_target() =>
            {
                self.compact_in_stages(history, method, on_event, 1)
            }
            r => r,
        }
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
            Method::Speculative if cfg.verify == crate::verify::Verify::Exact => {
                crate::exact::run(&mut job)?
            }
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
