//! The speculative method: six slot streams, each with an accepted prefix A. Per round,
//! every stream that needs lines asks the drafter (one batch), every stream with a proposed
//! line asks the target for one judgment (one batch) and every stream with a rejected line
//! asks the target for its replacement (one batch); the drafter's and the target's batches of
//! a round may run at the same time. Lines drafted after the first wait in a buffer that is
//! valid only while A is exactly what they were drafted after.
//!
//! A draft call ends at the first line the checks refuse (nothing after it could be used),
//! and drafts and repairs may run past their budget to finish a line: no line is kept cut.
//! A slot that would end without a content line gets one target-written attempt of its whole
//! body first: it may end empty only when the target, asked for that slot, writes nothing.

use super::slot_stream::{Item, State, Stream};
use crate::backend::FinishReason;
use crate::backend::{Generated, LineRules, Request, RequestKind, Verified};
use crate::job::{open_session, run_timed, Job};
use crate::judge::score;
use crate::lines::{Check, Checker};
use crate::outcome::{Event, Judged, LineOut, Origin, SlotOut, SlotStop};
use crate::verify::{agreed_prefix, Divergence, LineScores, Verify};
use crate::{prompt, Backend, Error, Result};
use std::collections::VecDeque;
use std::sync::Arc;

/// What taking a line into A does.
enum Admit {
    Added,
    Stopped(SlotStop),
}

/// Adds a line to A unless a cap stops the slot first.
fn admit<B: Backend>(
    job: &mut Job<'_, B>,
    s: &mut Stream,
    text: String,
    origin: Origin,
    r: Option<f32>,
) -> Result<Admit> {
    let cfg = job.cfg;
    if !text.trim().is_empty() && s.content_lines() >= cfg.slot_max_lines {
        return Ok(Admit::Stopped(SlotStop::MaxLines));
    }
    let t = job.line_tokens(&text)?;
    if s.tokens + t > cfg.slot_max_tokens {
        return Ok(Admit::Stopped(SlotStop::TokenBudget));
    }
    s.tokens += t;
    s.line_tokens.push(t);
    job.emit(Event::LineAccepted {
        slot: cfg.slots[s.slot].name.clone(),
        text: text.clone(),
        origin,
        r,
    });
    s.lines.push(LineOut { text, origin, r });
    Ok(Admit::Added)
}

/// Ends a slot; a slot without a content line first gets the target's whole-body attempt.
fn finish<B: Backend>(job: &mut Job<'_, B>, s: &mut Stream, stop: SlotStop) {
    if !s.whole_tried && !s.has_content() {
        s.whole_tried = true;
        s.clear_buffer();
        s.drop_markers();
        s.state = State::WholeSlot;
        return;
    }
    s.state = State::Done(stop);
    s.clear_buffer();
    job.emit(Event::SlotDone {
        slot: job.cfg.slots[s.slot].name.clone(),
        stop,
    });
}

/// Takes one drafted line through the checks: it is kept, dropped, or moves the stream to
/// verification or repair.
fn propose<B: Backend>(job: &mut Job<'_, B>, s: &mut Stream, line: String) -> Result<()> {
    match s.checker.check(&line, &s.texts()) {
        Check::Blank => {
            // Formatting: kept after a content line, dropped at the start or after a blank.
            if s.lines.last().is_some_and(|l| !l.text.trim().is_empty()) {
                if let Admit::Stopped(stop) = admit(job, s, String::new(), Origin::Auto, None)? {
                    finish(job, s, stop);
                }
            }
        }
        Check::EndOfSlot => finish(job, s, SlotStop::Complete),
        Check::Auto => {
            job.trace.lines_proposed += 1;
            match admit(job, s, line.trim_end().to_string(), Origin::Auto, None)? {
                Admit::Added => job.trace.lines_accepted += 1,
                Admit::Stopped(stop) => finish(job, s, stop),
            }
        }
        c if c.fails() => send_to_repair(job, s, line),
        _ => {
            job.trace.lines_proposed += 1;
            s.state = State::Verify(line.trim_end().to_string());
        }
    }
    Ok(())
}

/// A drafted line that failed a check: counted, reported, and replaced by a repair (the
/// buffer drafted after it is dropped).
fn send_to_repair<B: Backend>(job: &mut Job<'_, B>, s: &mut Stream, line: String) {
    job.trace.lines_proposed += 1;
    job.trace.lines_failed_checks += 1;
    job.emit(Event::LineRejected {
        slot: job.cfg.slots[s.slot].name.clone(),
        text: line,
        r: None,
    });
    s.clear_buffer();
    s.state = State::Repair;
}

/// Uses buffered lines while they are valid for A.
fn drain_buffer<B: Backend>(job: &mut Job<'_, B>, s: &mut Stream) -> Result<()> {
    while s.state == State::Draft {
        if s.expect != s.texts() {
            s.clear_buffer();
        }
        let Some(item) = s.buffer.pop_front() else {
            return Ok(());
        };
        match item {
            Item::End if s.lines.is_empty() => {
                // The drafter wrote nothing: the target gets a chance to write the slot.
                s.clear_buffer();
                s.state = State::Repair;
            }
            Item::End => finish(job, s, SlotStop::Complete),
            // Not a line: the target writes one instead, without a judgment.
            Item::Unfinished(l) => send_to_repair(job, s, l),
            Item::Line(l) => {
                // The buffer stays valid while A grows by exactly the drafted lines (a blank
                // line dropped as surplus formatting leaves A unchanged and is skipped).
                let pending = l.trim_end().to_string();
                propose(job, s, l)?;
                match &s.state {
                    State::Verify(_) => s.expect.push(pending),
                    State::Draft => s.expect = s.texts(),
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

/// Splits a drafter continuation into complete lines (and an end marker when the drafter
/// ended the section); a trailing partial line is discarded, or marked unfinished when it is
/// all there is.
fn split_draft(g: &Generated) -> Vec<Item> {
    let mut parts: Vec<&str> = g.text.split('\n').collect();
    let last = parts.pop().unwrap_or("");
    let mut items: Vec<Item> = parts
        .into_iter()
        .map(|p| Item::Line(p.to_string()))
        .collect();
    match g.reason {
        FinishReason::Ended => {
            if !last.trim().is_empty() {
                items.push(Item::Line(last.to_string()));
            }
            items.push(Item::End);
        }
        _ if items.is_empty() => items.push(Item::Unfinished(last.to_string())),
        _ => {}
    }
    items
}

/// Generation requests of the streams in `state` (drafting or repair), each after its
/// slot request and accepted lines.
fn generations(
    streams: &[Stream],
    state: State,
    heads: &[String],
    max_tokens: usize,
    stop_at_newline: bool,
    rules: impl Fn(&Stream) -> LineRules,
) -> Vec<Request> {
    streams
        .iter()
        .filter(|s| s.state == state)
        .map(|s| Request {
            stream: s.slot,
            prompt: s.prompt(&heads[s.slot]),
            kind: RequestKind::Generate {
                max_tokens,
                stop_at_newline,
            },
            lines: rules(s),
        })
        .collect()
}

/// Takes the target's whole body of a slot: its lines through the checks (refused ones and
/// a last line cut by the budget are dropped), then the slot ends.
fn take_whole<B: Backend>(job: &mut Job<'_, B>, s: &mut Stream, g: &Generated) -> Result<()> {
    let mut text = g.text.as_str();
    if g.reason == FinishReason::MaxTokens {
        text = text.rfind('\n').map_or("", |i| &text[..i]);
    }
    let mut stop = SlotStop::Complete;
    for raw in text.lines() {
        let c = s.checker.check(raw, &s.texts());
        let origin = match c {
            Check::EndOfSlot => break,
            c if c.fails() => continue,
            Check::Blank if s.lines.last().is_none_or(|l| l.text.trim().is_empty()) => continue,
            Check::Blank => Origin::Auto,
            _ => Origin::Repair,
        };
        let line = if c == Check::Blank {
            String::new()
        } else {
            raw.trim_end().to_string()
        };
        match admit(job, s, line, origin, None)? {
            Admit::Added if origin == Origin::Repair => job.trace.whole_slot_lines += 1,
            Admit::Added => {}
            Admit::Stopped(st) => {
                stop = st;
                break;
            }
        }
    }
    finish(job, s, stop);
    Ok(())
}

/// Runs the speculative method over an open job.
pub(crate) fn run<B: Backend>(job: &mut Job<'_, B>) -> Result<Vec<SlotOut>> {
    let cfg = job.cfg;
    let dreq = prompt::slot_requests(job.drafter.format(), cfg);
    let treq = prompt::slot_requests(job.target.format(), cfg);
    let question = prompt::judge_question(job.target.format(), cfg);
    let mut streams: Vec<Stream> = (0..cfg.slots.len())
        .map(|slot| Stream {
            slot,
            checker: Arc::new(Checker::new(cfg, slot)),
            lines: Vec::new(),
            line_tokens: Vec::new(),
            tokens: 0,
            whole_tried: false,
            state: State::Draft,
            buffer: VecDeque::new(),
            expect: Vec::new(),
            kept: String::new(),
            kept_tokens: 0,
        })
        .collect();
    let div = Divergence {
        rank: cfg.divergence_rank,
        floor: cfg.divergence_floor,
    };
    let rule = match cfg.verify {
        Verify::Calibrated => cfg.line_rule.as_ref(),
        Verify::Ratio | Verify::Exact => None,
    };
    // Each round adds or ends something on every live stream except through repair after a
    // rejection, so 3 rounds per possible line bound it; reaching the bound is reported.
    let max_rounds = 3 * (cfg.slot_max_lines + 2) + 5;
    for _round in 0..max_rounds {
        for s in streams.iter_mut() {
            drain_buffer(job, s)?;
        }
        let drafts = generations(
            &streams,
            State::Draft,
            &dreq,
            cfg.draft_tokens,
            false,
            |s| s.draft_rules(cfg.line_grace, cfg.slots[s.slot].headings.is_empty()),
        );
        let verifies: Vec<Request> = streams
            .iter()
            .filter_map(|s| match &s.state {
                State::Verify(line) => {
                    let mut p = s.prompt(&treq[s.slot]);
                    let at = p.len();
                    p.push(format!("{line}\n"));
                    p.push(question.clone());
                    Some(Request {
                        stream: s.slot,
                        prompt: p,
                        kind: RequestKind::Verify {
                            top_k: cfg.top_k,
                            line: at,
                        },
                        lines: LineRules::default(),
                    })
                }
                _ => None,
            })
            .collect();
        let mut repairs = generations(
            &streams,
            State::Repair,
            &treq,
            cfg.repair_tokens,
            true,
            |_| LineRules {
                grace: cfg.line_grace,
                ..LineRules::default()
            },
        );
        // A repair after a rejection continues from the line's agreed part.
        for r in repairs.iter_mut() {
            let kept = &streams[r.stream].kept;
            if !kept.is_empty() {
                r.prompt.push(kept.clone());
            }
        }
        // Whole-body attempts go in the same target batch as the repairs.
        repairs.extend(
            streams
                .iter()
                .filter(|s| s.state == State::WholeSlot)
                .map(|s| Request {
                    stream: s.slot,
                    prompt: s.prompt(&treq[s.slot]),
                    kind: RequestKind::Generate {
                        max_tokens: cfg.slot_max_tokens.saturating_sub(s.tokens).max(1),
                        stop_at_newline: false,
                    },
                    lines: s.body_rules(),
                }),
        );
        if drafts.is_empty() && verifies.is_empty() && repairs.is_empty() {
            break;
        }
        // The target's batches of this round (verification, then repair) and the drafter's.
        let target_work = |job: &mut Job<'_, B>| -> Result<_> {
            let v = job.run_target(&verifies)?;
            let r = job.run_target(&repairs)?;
            Ok((v, r))
        };
        let ((vout, vms), (rout, rms), (dout, dms)) = if job.overlap && !drafts.is_empty() {
            let drafter = job.drafter;
            let mut dsess = job.dsess.take();
            let res = std::thread::scope(|sc| {
                let h = sc.spawn(|| {
                    let sess = open_session(drafter, &mut dsess)?;
                    run_timed(drafter, sess, &drafts)
                });
                let t = target_work(job);
                let d = h.join().unwrap_or_else(|_| {
                    Err(Error::Backend {
                        backend: drafter.name().to_string(),
                        reason: "drafter thread panicked".into(),
                    })
                });
                (t, d)
            });
            job.dsess = dsess;
            let (t, d) = res;
            let (v, r) = t?;
            (v, r, d?)
        } else {
            let d = job.run_drafter(&drafts)?;
            let (v, r) = target_work(job)?;
            (v, r, d)
        };
        let t = &mut job.trace;
        t.draft_ms += dms;
        t.verify_ms += vms;
        t.repair_ms += rms;
        t.drafter_calls += drafts.len();
        t.verify_calls += verifies.len();
        t.repair_calls += repairs.len();
        t.batches += [&drafts, &verifies, &repairs]
            .iter()
            .filter(|b| !b.is_empty())
            .count();

        for (req, resp) in drafts.iter().zip(dout) {
            let g = resp.into_generated(job.drafter.name())?;
            job.trace.drafter_tokens += g.tokens;
            let s = &mut streams[req.stream];
            s.buffer = split_draft(&g).into();
            s.expect = s.texts();
        }
        for (req, resp) in verifies.iter().zip(vout) {
            let Verified { top, line: rated } = resp.into_verified(job.target.name())?;
            let j = score(&top, &cfg.positive_labels, &cfg.negative_labels);
            let scores = LineScores::new(&j, &rated, &div);
            // The target's own greedy line is kept whatever the rule: a repair would write it.
            let own = scores.tokens > 0 && scores.greedy_fraction >= 1.0;
            let (accepted, probability, by) = match rule {
                Some(_) if own => (true, None, "own-line"),
                Some(rule) => (
                    rule.accepts(&scores),
                    Some(rule.probability(&scores)),
                    "rule",
                ),
                None => (j.accepts(cfg.eta), None, "ratio"),
            };
            let s = &mut streams[req.stream];
            let State::Verify(line) = std::mem::replace(&mut s.state, State::Draft) else {
                continue;
            };
            job.trace.judgments.push(Judged {
                slot: cfg.slots[s.slot].name.clone(),
                r: j.r,
                accepted,
                scores,
                probability,
                by,
            });
            if accepted {
                match admit(job, s, line, Origin::Draft, Some(j.r))? {
                    Admit::Added => job.trace.lines_accepted += 1,
                    Admit::Stopped(stop) => finish(job, s, stop),
                }
            } else {
                job.trace.lines_rejected += 1;
                job.emit(Event::LineRejected {
                    slot: cfg.slots[s.slot].name.clone(),
                    text: line,
                    r: Some(j.r),
                });
                s.clear_buffer();
                if let Some(d) = scores.divergence {
                    s.kept = agreed_prefix(&rated, d);
                    s.kept_tokens = d;
                }
                s.state = State::Repair;
            }
        }
        for (req, resp) in repairs.iter().zip(rout) {
            let g = resp.into_generated(job.target.name())?;
            job.trace.target_tokens += g.tokens;
            let s = &mut streams[req.stream];
            s.clear_buffer();
            if s.state == State::WholeSlot {
                job.trace.whole_slot_calls += 1;
                take_whole(job, s, &g)?;
                continue;
            }
            s.state = State::Draft;
            let kept = std::mem::take(&mut s.kept);
            let kept_tokens = std::mem::take(&mut s.kept_tokens);
            if !kept.is_empty() {
                job.trace.repairs_from_divergence += 1;
                job.trace.repair_kept_tokens += kept_tokens;
            }
            let text = format!("{kept}{}", g.text).trim_end().to_string();
            let ended = g.reason == FinishReason::Ended;
            // Asked for the slot's first line, the target ended the slot: it has nothing to
            // write there, which is what a whole-body attempt would find out.
            if ended && text.trim().is_empty() && !s.has_content() {
                s.whole_tried = true;
            }
            // The line ran past the budget and its grace: never kept cut.
            if g.reason == FinishReason::MaxTokens {
                finish(job, s, SlotStop::RepairFailed);
                continue;
            }
            if text.trim().is_empty() {
                let stop = if ended && !s.lines.is_empty() {
                    SlotStop::Complete
                } else {
                    SlotStop::RepairFailed
                };
                finish(job, s, stop);
                continue;
            }
            match s.checker.check(&text, &s.texts()) {
                Check::EndOfSlot => {
                    finish(job, s, SlotStop::Complete);
                    continue;
                }
                c if c.fails() => {
                    finish(job, s, SlotStop::RepairFailed);
                    continue;
                }
                _ => {}
            }
            match admit(job, s, text, Origin::Repair, None)? {
                Admit::Added => {
                    job.trace.lines_repaired += 1;
                    if ended {
                        finish(job, s, SlotStop::Complete);
                    }
                }
                Admit::Stopped(stop) => finish(job, s, stop),
            }
        }
    }
    let mut out = Vec::with_capacity(streams.len());
    for mut s in streams {
        let stop = match s.state {
            State::Done(stop) => stop,
            _ => {
                s.whole_tried = true;
                finish(job, &mut s, SlotStop::RoundLimit);
                SlotStop::RoundLimit
            }
        };
        out.push(SlotOut::new(&cfg.slots[s.slot], s.lines, stop, s.tokens));
    }
    Ok(out)
}
