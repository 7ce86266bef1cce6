//! Histories longer than a model's window: compaction in stages when the target cannot read
//! the whole history, and the drafter's slot views when the drafter cannot.

use super::{reserve, Compactor};
use crate::outcome::{Compaction, Event, Method, Stage};
use crate::session_cache::Role;
use crate::{prompt, Backend, DrafterView, Error, Result};
use speccompact_history::{slot_view, History, Message, RenderOptions, ViewOptions};
use std::time::Instant;

impl<B: Backend + 'static> Compactor<B> {
    /// Compacts the longest run of older messages that fits the target, then that summary
    /// with the remaining messages (in stages again if that is still too long).
    pub(super) fn compact_in_stages(
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
    pub(super) fn too_long_error(&self, history: &History, method: Method) -> Result<Error> {
        let (tokens, limit) = self.target_tokens(history, method)?;
        let t = &self.inner.target;
        Ok(Error::HistoryTooLong {
            model: t.name().to_string(),
            tokens,
            limit,
            context: t.context_length(),
        })
    }

    /// The drafter's prefix over the whole transcript, or `None` when the drafter reads slot
    /// views instead: always when configured, else when the whole history does not fit its
    /// context.
    pub(super) fn drafter_prefix(&self, transcript: &str) -> Result<Option<String>> {
        let cfg = &self.inner.config;
        if cfg.drafter_view == DrafterView::Always {
            return Ok(None);
        }
        let d = &self.inner.drafter;
        let prefix = prompt::prefix(d.format(), cfg, transcript);
        let tokens = d.count_tokens(&prefix)?;
        let fits = tokens
            <= d.context_length()
                .saturating_sub(reserve(cfg, Method::Speculative));
        Ok(fits.then_some(prefix))
    }

    /// Prefills one view of the history per slot for the drafter (each view reuses the
    /// positions it shares with the session's earlier view of that slot, else with the
    /// previous slot's view) and opens a session whose streams each read their own.
    pub(super) fn open_views(
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
pub(super) struct DrafterPrefill {
    pub(super) tokens: usize,
    pub(super) reused: usize,
    /// Messages each slot view left out (empty without views).
    pub(super) omitted: Vec<usize>,
}

/// Joins a session id and a stage number in stage parts' cache keys.
pub(super) const STAGE_MARK: &str = "#stage";
/// Most stages of one compaction.
pub(super) const MAX_STAGES: usize = 16;
