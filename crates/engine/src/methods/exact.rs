//! The lossless mode (`verify = "exact"`): token-level speculation on each slot's body. The
//! drafter proposes the next line; the target checks every drafted token against its own
//! greedy token in one forward, keeps the agreeing run and adds its own token at the first
//! mismatch. Each slot's body is therefore exactly the target's greedy continuation of the
//! slot request, as `target-self` writes it, and goes through the same line checks. The
//! draft length adapts per slot (see `Body::draft_len`).

use super::baselines::take_lines;
use crate::backend::FinishReason;
use crate::backend::{Request, RequestKind, Speculated};
use crate::job::Job;
use crate::outcome::{Origin, SlotOut};
use crate::{prompt, Backend, Error, Result};

struct Body {
    text: String,
    tokens: usize,
    done: Option<FinishReason>,
    /// Drafter tokens to ask for next: doubled after a draft kept whole, cut to what was
    /// kept (plus one) otherwise, so a drafter that disagrees costs little.
    draft_len: usize,
}

/// Runs the lossless mode over an open job.
pub(crate) fn run<B: Backend>(job: &mut Job<'_, B>) -> Result<Vec<SlotOut>> {
    let cfg = job.cfg;
    let dreq = prompt::slot_requests(job.drafter.format(), cfg);
    let treq = prompt::slot_requests(job.target.format(), cfg);
    let mut bodies: Vec<Body> = (0..cfg.slots.len())
        .map(|_| Body {
            text: String::new(),
            tokens: 0,
            done: (cfg.slot_max_tokens == 0).then_some(FinishReason::MaxTokens),
            draft_len: cfg.draft_tokens.min(8),
        })
        .collect();
    // Every step adds at least one target token to each live body. The first reads the
    // slot requests and takes the target's first tokens: nothing to draft after yet.
    for step in 0..=cfg.slot_max_tokens {
        let live: Vec<usize> = (0..bodies.len())
            .filter(|&i| bodies[i].done.is_none())
            .collect();
        if live.is_empty() {
            break;
        }
        let drafts: Vec<Request> = live
            .iter()
            .filter(|_| step > 0)
            .map(|&i| Request {
                stream: i,
                prompt: vec![dreq[i].clone(), bodies[i].text.clone()],
                kind: RequestKind::Generate {
                    max_tokens: bodies[i].draft_len.max(1),
                    stop_at_newline: true,
                },
                lines: Default::default(),
            })
            .collect();
        let (dout, dms) = if drafts.is_empty() {
            (Vec::new(), 0.0)
        } else {
            job.run_drafter(&drafts)?
        };
        let mut dout = dout.into_iter();
        let mut specs = Vec::with_capacity(live.len());
        for &i in &live {
            let mut draft = String::new();
            if step > 0 {
                let resp = dout.next().ok_or_else(|| Error::Backend {
                    backend: job.drafter.name().to_string(),
                    reason: "fewer responses than requests".into(),
                })?;
                let g = resp.into_generated(job.drafter.name())?;
                job.trace.drafter_tokens += g.tokens;
                draft = g.text;
                if g.reason == FinishReason::Newline {
                    draft.push('\n');
                }
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
        t.batches += 1 + usize::from(!drafts.is_empty());
        for (&i, resp) in live.iter().zip(tout) {
            let Speculated {
                text,
                tokens,
                accepted,
                drafted,
                done,
            } = resp.into_speculated(job.target.name())?;
            let b = &mut bodies[i];
            job.trace.target_tokens += tokens - b.tokens;
            job.trace.spec_tokens_drafted += drafted;
            job.trace.spec_tokens_kept += accepted;
            let draft_len = if accepted >= drafted && drafted > 0 {
                (b.draft_len * 2).min(cfg.draft_tokens.max(1))
            } else {
                accepted + 1
            };
            *b = Body {
                text,
                tokens,
                done,
                draft_len,
            };
        }
    }
    let mut out = Vec::with_capacity(bodies.len());
    for (i, b) in bodies.into_iter().enumerate() {
        // As target-self: a last line cut by the budget is dropped.
        let mut text = b.text;
        if b.done != Some(FinishReason::Ended) {
            text.truncate(text.rfind('\n').unwrap_or(0));
        }
        out.push(take_lines(job, i, &text, Origin::Target)?);
    }
    Ok(out)
}
