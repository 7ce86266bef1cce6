//! One compaction run's shared state ([`Job`]: the settings, both backends and their open
//! sessions, the trace, the event sink) and the timed batch call every method goes through.

use crate::backend::{Backend, Request, Response};
use crate::config::CompactionConfig;
use crate::outcome::{Event, Trace};
use crate::{Error, Result};
use std::time::Instant;

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
