//! The lossless mode (`verify = "exact"`): token-level speculation on each slot's body. The
//! drafter proposes the next line; the target checks every drafted token against its own
//! greedy token in one forward, keeps the agreeing run and adds its own token at the first
//! mismatch. Each slot's body is therefore exactly the target's greedy continuation of the
//! slot request, as `target-self` writes it, and goes through the same line checks.

use crate::backend::{Request, RequestKind, Response, Speculated};
use crate::baselines::take_lines;
use crate::compactor::{Job, Origin, SlotOut};
use crate::{prompt, Backend, Error, Result};
use speccompact_runtime::StopReason;

struct Body {
    text: String,
    tokens: usize,
    done: Option<StopReason>,
}

/// Runs the lossless mode over an open job.
pub(crate) fn run<B: Backend>(job: &mut Job<'_, B>) -> Result<Vec<SlotOut>> {
    let cfg = job.cfg;
    let dreq: Vec<String> = cfg
        .slots
        .iter()
        .map(|s| prompt::slot_request(job.drafter.format(), cfg, s))
        .collect();
    let treq: Vec<String> = cfg
        .slots
        .iter()
        .map(|s| prompt::slot_request(job.target.format(), cfg, s))
        .collect();
    let mut bodies: Vec<Body> = (0..cfg.slots.len())
        .map(|_| Body {
            text: String::new(),
            tokens: 0,
            done: (cfg.slot_max_tokens == 0).then_some(StopReason::MaxTokens),
        })
        .collect();
    // Every step adds at least one target token to each live body.
    for _ in 0..=cfg.slot_max_tokens {
        let live: Vec<usize> = (0..bodies.len())
            .filter(|&i| bodies[i].done.is_none())
            .collect();
        if live.is_empty() {
            break;
        }
        let drafts: Vec<Request> = live
            .iter()
            .map(|&i| Request {
                stream: i,
                prompt: vec![dreq[i].clone(), bodies[i].text.clone()],
                kind: RequestKind::Generate {
                    max_tokens: cfg.draft_tokens,
                    stop_at_newline: true,
                },
                lines: Default::default(),
            })
            .collect();
        let (dout, dms) = job.run_drafter(&drafts)?;
        let mut specs = Vec::with_capacity(live.len());
        for (&i, resp) in live.iter().zip(dout) {
            let g = resp.into_generated(job.drafter.name())?;
            job.trace.drafter_tokens += g.tokens;
            let mut draft = g.text;
            if g.reason == StopReason::Newline {
                draft.push('\n');
            }
            specs.push(Request {
                stream: i,
                prompt: vec![treq[i].clone(), draft],
                kind: RequestKind::Speculate {
                    max_tokens: cfg.slot_max_tokens,
                },
                lines: Default::default(),
            });
        }
        let (tout, tms) = job.run_target(&specs)?;
        let t = &mut job.trace;
        t.draft_ms += dms;
        t.verify_ms += tms;
        t.drafter_calls += drafts.len();
        t.verify_calls += specs.len();
        t.batches += 2;
        for (&i, resp) in live.iter().zip(tout) {
            let Response::Speculated(Speculated {
                text,
                tokens,
                accepted,
                drafted,
                done,
            }) = resp
            else {
                return Err(Error::Backend {
                    backend: job.target.name().to_string(),
                    reason: "answered a speculation with something else".into(),
                });
            };
            let b = &mut bodies[i];
            job.trace.target_tokens += tokens - b.tokens;
            job.trace.spec_tokens_drafted += drafted;
            job.trace.spec_tokens_kept += accepted;
            *b = Body { text, tokens, done };
        }
    }
    let mut out = Vec::with_capacity(bodies.len());
    for (i, b) in bodies.into_iter().enumerate() {
        // As target-self: a last line cut by the budget is dropped.
        let mut text = b.text;
        if b.done != Some(StopReason::StopToken) {
            text.truncate(text.rfind('\n').unwrap_or(0));
        }
        out.push(take_lines(job, i, &text, Origin::Target)?);
    }
    Ok(out)
}
