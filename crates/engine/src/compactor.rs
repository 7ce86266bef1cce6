//! The public API: [`Compactor`] (models + settings), [`Compaction`] (the six slots, the
//! markdown and the trace), the progress [`Event`]s, and the shared steps every method takes
//! (rendering the history within the context, prefilling, assembling, the budget check).

use crate::backend::{Backend, Prefilled};
use crate::config::{CompactionConfig, Overflow, Overlap};
use crate::job::Job;
use crate::model_backend::ModelBackend;
use crate::session_cache::{Role, SessionCache};
use crate::{methods, prompt, Error, Result};
use speccompact_history::{render, History, RenderOptions};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::outcome::{markdown, Compaction, Event, Method, Trace};

mod long_history;

use long_history::{DrafterPrefill, MAX_STAGES, STAGE_MARK};

/// The transcript a compaction runs on, as measured against the target's context.
struct Fitted {
    /// The rendered history (or its middle cut).
    text: String,
    /// Messages cut from the middle (first, last; 1-based), if any.
    omitted: Option<(usize, usize)>,
    /// The target's whole prefix around `text`, when the method uses the target.
    target_prefix: Option<String>,
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

impl Compactor<ModelBackend> {
    /// The same models (weights shared) and settings with a fresh lookup in `mode` in both
    /// models' decodes, and an empty session cache.
    pub fn with_lookup(&self, mode: speccompact_runtime::LookupMode) -> Result<Self> {
        let i = &self.inner;
        Self::new(
            i.drafter.with_lookup(mode),
            i.target.with_lookup(mode),
            i.config.clone(),
        )
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
        let f = self.fit(history, method)?;
        Ok((f.text, f.omitted))
    }

    /// The sequential method's one call to the target, as the texts it is tokenized from:
    /// the shared prefix (system prompt and transcript, tokenized with BOS) and the request
    /// for the whole summary (tokenized alone). A serving engine given these tokens writes
    /// what the sequential method writes.
    pub fn one_call_prompt(&self, history: &History) -> Result<[String; 2]> {
        let f = self.fit(history, Method::Sequential)?;
        let t = &self.inner.target;
        let prefix = f
            .target_prefix
            .unwrap_or_else(|| prompt::prefix(t.format(), &self.inner.config, &f.text));
        Ok([
            prefix,
            prompt::whole_request(t.format(), &self.inner.config),
        ])
    }

    /// [`Compactor::transcript`] with the target's prefix it was measured with (built and
    /// tokenized once: the prefill reuses both).
    fn fit(&self, history: &History, method: Method) -> Result<Fitted> {
        let cfg = &self.inner.config;
        // The drafter reads slot views when the history does not fit it; only the target
        // must read the whole history.
        let mut models: Vec<&B> = Vec::new();
        if method.uses_target() {
            models.push(&self.inner.target);
        }
        let n = history.messages.len();
        // The text and the target's prefix, and Some(over) when a model's prefix does not
        // fit: (model, tokens, limit, context).
        type Over = Option<(String, usize, usize, usize)>;
        let over = |omit: Option<std::ops::Range<usize>>| -> Result<(Fitted, Over)> {
            let text = render(
                history,
                &RenderOptions {
                    tool_result_cap: cfg.tool_result_cap,
                    omit,
                },
            );
            let mut fitted = Fitted {
                text,
                omitted: None,
                target_prefix: None,
            };
            for m in &models {
                let p = prompt::prefix(m.format(), cfg, &fitted.text);
                let tokens = m.count_tokens(&p)?;
                let ctx = m.context_length();
                let limit = ctx.saturating_sub(reserve(cfg, method));
                fitted.target_prefix = Some(p);
                if tokens > limit {
                    return Ok((fitted, Some((m.name().to_string(), tokens, limit, ctx))));
                }
            }
            Ok((fitted, None))
        };
        let (fitted, first) = over(None)?;
        let Some((model, tokens, limit, context)) = first else {
            return Ok(fitted);
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
        let (mut fitted, _) = over(Some(r.clone()))?;
        tracing::warn!(
            first = r.start + 1,
            last = r.end,
            "history cut in the middle to fit the context"
        );
        fitted.omitted = Some((r.start + 1, r.end));
        Ok(fitted)
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
        let lookup_before = [inner.target.lookup(), inner.drafter.lookup()];
        let fitted = self.fit(history, method)?;
        let (transcript, omitted) = (fitted.text, fitted.omitted);
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
        let tprefix = match fitted.target_prefix {
            Some(p) => p,
            None => prompt::prefix(inner.target.format(), cfg, &transcript),
        };
        let dprefix = if method.uses_drafter() {
            self.drafter_prefix(&transcript)?
        } else {
            None
        };
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
            let Some(dprefix) = &dprefix else {
                return self.open_views(history, session).map(Some);
            };
            let p = self.prefill_cached(&inner.drafter, session, Role::Drafter, dprefix, None)?;
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
                methods::exact::run(&mut job)?
            }
            Method::Speculative => methods::speculative::run(&mut job)?,
            Method::Sequential => methods::baselines::sequential(&mut job)?,
            Method::TargetSelf => methods::baselines::per_slot(&mut job, false)?,
            Method::DrafterOnly => methods::baselines::per_slot(&mut job, true)?,
        };
        let markdown = markdown(&slots);
        let mut trace = job.trace;
        for (role, n) in [
            ("target", inner.target.numerics()),
            ("drafter", inner.drafter.numerics()),
        ] {
            if !n.is_empty() {
                trace.numerics.insert(role.into(), n);
            }
        }
        let lookup_after = [inner.target.lookup(), inner.drafter.lookup()];
        for (role, (before, after)) in ["target", "drafter"]
            .into_iter()
            .zip(lookup_before.iter().zip(&lookup_after))
        {
            if let (Some(b), Some(a)) = (before, after) {
                trace.lookup.insert(role.into(), a.since(b));
            }
        }
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
