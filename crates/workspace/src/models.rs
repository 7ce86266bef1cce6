//! The model seams of the workspace: a [`Summarizer`] writes the task summary (the engine's
//! compactor behind [`EngineSummarizer`]), and a [`CandidateJudge`] answers one yes/no token
//! on whether a candidate record is really stated by its source event ([`ModelJudge`], any
//! engine backend). The judge keeps a prefilled KV prefix per source event; both report which
//! events their caches hold, so a deletion can evict them.

use crate::event::Event;
use crate::state::Draft;
use crate::{Error, Result};
use speccompact_engine::{
    score, Backend, CompactionConfig, Compactor, Method, Request, RequestKind, Response,
};
use speccompact_history::{History, HistoryError, Message, Role};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Mutex;

/// A cache whose entries contain event text.
pub trait EventCache: Send + Sync {
    /// Drops every entry that contains one of `events`; returns how many were dropped. An
    /// error means entries holding their text may remain (a deletion then fails loudly).
    fn evict(&self, events: &[i64]) -> Result<usize>;
    /// Whether an entry contains `event`.
    fn holds(&self, event: i64) -> bool;
}

/// Writes task summaries.
pub trait Summarizer: Send + Sync {
    /// Name, recorded as the summary's provenance.
    fn name(&self) -> String;
    /// Summarizes `events`, continuing `previous` when given (recursive compaction).
    fn summarize(&self, previous: Option<&str>, events: &[Event]) -> Result<String>;
}

/// The history a summarizer sees: the previous summary as the first user turn, then the
/// events with their roles.
pub fn history_for(previous: Option<&str>, events: &[Event]) -> History {
    let mut messages = Vec::new();
    if let Some(p) = previous {
        messages.push(Message::text(
            Role::User,
            &format!("Summary of the conversation so far:\n{p}"),
        ));
    }
    for e in events {
        let mut m = Message::text(e.role, &e.content);
        if e.role == Role::Tool {
            m.name = e.tool.clone();
            if let Some(c) = e.exit_code {
                m.content = format!("[exit {c}]\n{}", e.content);
            }
        }
        messages.push(m);
    }
    History { id: None, messages }
}

/// The engine's compactor as a summarizer.
pub struct EngineSummarizer<B: Backend> {
    compactor: Compactor<B>,
    method: Method,
}

impl<B: Backend + 'static> EngineSummarizer<B> {
    /// Summarizes with `method`.
    pub fn new(compactor: Compactor<B>, method: Method) -> Self {
        Self { compactor, method }
    }
    /// The compactor.
    pub fn compactor(&self) -> &Compactor<B> {
        &self.compactor
    }
}

impl<B: Backend + 'static> Summarizer for EngineSummarizer<B> {
    fn name(&self) -> String {
        format!(
            "{} ({} -> {})",
            self.method.as_str(),
            self.compactor.drafter().name(),
            self.compactor.target().name()
        )
    }
    fn summarize(&self, previous: Option<&str>, events: &[Event]) -> Result<String> {
        let h = history_for(previous, events);
        if h.messages.is_empty() {
            return Err(HistoryError::Empty.into());
        }
        let out = self
            .compactor
            .compact_blocking(&h, self.method, &mut |_| {})?;
        Ok(out.markdown)
    }
}

/// The compactor's session cache holds prefilled history text: a deletion drops all of it
/// (register the summarizer with `Workspace::register_cache`).
impl<B: Backend + 'static> EventCache for EngineSummarizer<B> {
    fn evict(&self, _events: &[i64]) -> Result<usize> {
        Ok(self.compactor.forget_all()?)
    }
    fn holds(&self, _event: i64) -> bool {
        self.compactor.cached().is_ok_and(|(n, _)| n > 0)
    }
}

/// Judges whether a candidate record is stated by its source event: r in [0, 1].
pub trait CandidateJudge: Send + Sync {
    /// The score of `draft` against `event`.
    fn judge(&self, event: &Event, draft: &Draft) -> Result<f32>;
}

/// A one-token yes/no judge on an engine backend, with one prefilled prefix per source event
/// (several candidates of one event share it).
pub struct ModelJudge<B: Backend> {
    backend: B,
    config: CompactionConfig,
    sessions: Mutex<HashMap<i64, B::Session>>,
}

impl<B: Backend> ModelJudge<B> {
    /// A judge on `backend` with the labels and top-k of `config`.
    pub fn new(backend: B, config: CompactionConfig) -> Self {
        Self {
            backend,
            config,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    fn prefix(&self, e: &Event) -> String {
        let f = self.backend.format();
        format!(
            "{}You check records taken from an agent's history. Answer with one word: Yes or No.{}Message (event {}, written by the {}):\n<message>\n{}\n</message>\n\n",
            f.open,
            f.system_to_user,
            e.id,
            e.writer.as_str(),
            e.content
        )
    }
}

impl<B: Backend> CandidateJudge for ModelJudge<B> {
    fn judge(&self, event: &Event, draft: &Draft) -> Result<f32> {
        let mut sessions = self
            .sessions
            .lock()
            .map_err(|_| Error::Poisoned("judge prefix cache"))?;
        let session = match sessions.entry(event.id) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => v.insert(self.backend.open(&self.prefix(event))?),
        };
        let kind = draft.kind.as_str().replace('_', " ");
        let f = self.backend.format();
        let q = format!(
            "Candidate {kind}: \"{}\"\nDoes the message state this {kind}?{}",
            draft.value, f.user_to_assistant
        );
        let resp = self.backend.run(
            session,
            &[Request {
                stream: 0,
                prompt: vec![q],
                kind: RequestKind::Judge {
                    top_k: self.config.top_k,
                },
                lines: Default::default(),
            }],
        )?;
        match resp.first() {
            Some(Response::Judged(top)) => Ok(score(
                top,
                &self.config.positive_labels,
                &self.config.negative_labels,
            )
            .r),
            _ => Err(Error::NoJudgement { event: event.id }),
        }
    }
}

impl<B: Backend> EventCache for ModelJudge<B> {
    fn evict(&self, events: &[i64]) -> Result<usize> {
        let mut s = self
            .sessions
            .lock()
            .map_err(|_| Error::Poisoned("judge prefix cache"))?;
        let before = s.len();
        s.retain(|id, _| !events.contains(id));
        Ok(before - s.len())
    }
    fn holds(&self, event: i64) -> bool {
        self.sessions.lock().is_ok_and(|s| s.contains_key(&event))
    }
}
