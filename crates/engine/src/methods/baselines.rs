//! The baselines, run in the same engine with the same rendering and budgets: `sequential`
//! (the target writes the whole summary in one generation), `target-self` (the target writes
//! each slot, six streams in one batch) and `drafter-only` (the drafter does, unverified).

use crate::backend::FinishReason;
use crate::backend::{Request, RequestKind, Response};
use crate::job::Job;
use crate::lines::{Check, Checker};
use crate::outcome::Event;
use crate::outcome::{LineOut, Origin, SlotOut, SlotStop};
use crate::{prompt, Backend, Error, Result};

/// A generation's text and tokens; a last line cut by the token budget is dropped (a line is
/// never kept cut).
fn text_of(resp: Response, who: &str) -> Result<(String, usize)> {
    let g = resp.into_generated(who)?;
    let mut text = g.text;
    if g.reason == FinishReason::MaxTokens {
        text.truncate(text.rfind('\n').unwrap_or(0));
    }
    Ok((text, g.tokens))
}

/// Keeps a slot's lines under the same checks and caps as the speculative method, with no
/// verification: duplicates and over-long lines are dropped, a `## ` heading ends the slot.
pub(crate) fn take_lines<B: Backend>(
    job: &mut Job<'_, B>,
    slot: usize,
    text: &str,
    origin: Origin,
) -> Result<SlotOut> {
    let cfg = job.cfg;
    let spec = &cfg.slots[slot];
    let mut lines: Vec<LineOut> = Vec::new();
    let mut tokens = 0;
    let mut stop = SlotStop::Complete;
    let checker = Checker::new(cfg, slot);
    for raw in text.lines() {
        let texts: Vec<String> = lines.iter().map(|l| l.text.clone()).collect();
        let c = checker.check(raw, &texts);
        let (line, o) = match c {
            Check::EndOfSlot => break,
            c if c.fails() => continue,
            Check::Blank if lines.last().is_none_or(|l| l.text.trim().is_empty()) => continue,
            Check::Blank => (String::new(), Origin::Auto),
            Check::Auto => (raw.trim_end().to_string(), Origin::Auto),
            _ => (raw.trim_end().to_string(), origin),
        };
        if !line.is_empty()
            && lines.iter().filter(|l| !l.text.trim().is_empty()).count() >= cfg.slot_max_lines
        {
            stop = SlotStop::MaxLines;
            break;
        }
        let t = job.line_tokens(&line)?;
        if tokens + t > cfg.slot_max_tokens {
            stop = SlotStop::TokenBudget;
            break;
        }
        tokens += t;
        job.emit(Event::LineAccepted {
            slot: spec.name.clone(),
            text: line.clone(),
            origin: o,
            r: None,
        });
        lines.push(LineOut {
            text: line,
            origin: o,
            r: None,
        });
    }
    job.emit(Event::SlotDone {
        slot: spec.name.clone(),
        stop,
    });
    Ok(SlotOut::new(spec, lines, stop, tokens))
}

/// The target writes the whole summary; its sections are split by their headings.
pub(crate) fn sequential<B: Backend>(job: &mut Job<'_, B>) -> Result<Vec<SlotOut>> {
    let cfg = job.cfg;
    let req = Request {
        stream: 0,
        prompt: vec![prompt::whole_request(job.target.format(), cfg)],
        kind: RequestKind::Generate {
            max_tokens: cfg.summary_budget,
            stop_at_newline: false,
        },
        lines: Default::default(),
    };
    let (mut out, ms) = job.run_target(std::slice::from_ref(&req))?;
    job.trace.repair_ms += ms;
    job.trace.repair_calls += 1;
    job.trace.batches += 1;
    let resp = out.pop().ok_or_else(|| Error::Backend {
        backend: job.target.name().to_string(),
        reason: "no response".into(),
    })?;
    let (text, tokens) = text_of(resp, job.target.name())?;
    job.trace.target_tokens += tokens;
    // Text under each recognised heading; text before the first heading or under an unknown
    // heading goes to the slot before it (never dropped silently).
    let mut bodies = vec![String::new(); cfg.slots.len()];
    let mut cur = 0;
    for line in text.lines() {
        if let Some(i) = cfg.slot_for_heading(line) {
            cur = i;
            continue;
        }
        let l = if line.trim_start().starts_with("## ") {
            line.trim_start().trim_start_matches('#').trim_start()
        } else {
            line
        };
        bodies[cur].push_str(l);
        bodies[cur].push('\n');
    }
    let mut slots = Vec::with_capacity(bodies.len());
    for (i, b) in bodies.iter().enumerate() {
        slots.push(take_lines(job, i, b, Origin::Target)?);
    }
    Ok(slots)
}

/// Each slot written by one model (target or drafter), six streams in one batch.
pub(crate) fn per_slot<B: Backend>(job: &mut Job<'_, B>, drafter: bool) -> Result<Vec<SlotOut>> {
    let cfg = job.cfg;
    let model = if drafter { job.drafter } else { job.target };
    let reqs: Vec<Request> = cfg
        .slots
        .iter()
        .enumerate()
        .map(|(i, s)| Request {
            stream: i,
            prompt: vec![prompt::slot_request(model.format(), cfg, s)],
            kind: RequestKind::Generate {
                max_tokens: cfg.slot_max_tokens,
                stop_at_newline: false,
            },
            lines: Default::default(),
        })
        .collect();
    let (out, ms) = if drafter {
        job.run_drafter(&reqs)?
    } else {
        job.run_target(&reqs)?
    };
    job.trace.batches += 1;
    if drafter {
        job.trace.draft_ms += ms;
        job.trace.drafter_calls += reqs.len();
    } else {
        job.trace.repair_ms += ms;
        job.trace.repair_calls += reqs.len();
    }
    let mut slots = Vec::with_capacity(reqs.len());
    for (i, resp) in out.into_iter().enumerate() {
        let (text, tokens) = text_of(resp, model.name())?;
        if drafter {
            job.trace.drafter_tokens += tokens;
        } else {
            job.trace.target_tokens += tokens;
        }
        let origin = if drafter {
            Origin::Draft
        } else {
            Origin::Target
        };
        slots.push(take_lines(job, i, &text, origin)?);
    }
    Ok(slots)
}
