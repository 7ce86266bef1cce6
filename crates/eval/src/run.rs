//! Every method on every session: the compactions (with the speculative method's rejected
//! lines kept for loss attribution), the non-model contexts, and every metric per session ×
//! method.

use crate::context::{truncate_tail, EvalMethod, TailBudget};
use crate::data::{history_text, EvalSession};
use crate::metrics::{assertions, probe_hits, qa_score, unsourced, ProbeHit};
use crate::models::{answer, judge, next_step_ask, section_asks, Ask, EvalPrompts};
use crate::Result;
use serde::Serialize;
use speccompact_engine::{Backend, Compaction, Compactor, Event, Method, Trace};
use speccompact_history::{render, History, RenderOptions};
use std::time::Instant;

/// What to run.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// Methods, in report order.
    pub methods: Vec<EvalMethod>,
    /// Budget of `truncate-tail`.
    pub tail_budget: TailBudget,
    /// Answer question probes with the reader (the target).
    pub reader: bool,
    /// Run the next-step and slot-adequacy judges (the target).
    pub judges: bool,
    /// Reader, judge and bootstrap settings.
    pub prompts: EvalPrompts,
}

/// One answered question.
#[derive(Debug, Clone, Serialize)]
pub struct QaAnswer {
    /// Probe id.
    pub id: String,
    /// The reader's answer from this context.
    pub answer: String,
    /// Its score in [0, 1].
    pub score: f64,
}

/// Adequacy of one slot: r per criterion, and the criteria met (r ≥ η).
#[derive(Debug, Clone, Serialize)]
pub struct SlotAdequacy {
    /// Slot name.
    pub slot: String,
    /// r per criterion, in the settings' order.
    pub r: Vec<f32>,
    /// Criteria met (0 to the number of criteria).
    pub score: usize,
}

/// Why a probe that the history holds is missing from a summary.
#[derive(Debug, Clone, Serialize)]
pub struct LostProbe {
    /// Probe id.
    pub id: String,
    /// The slot it belongs to.
    pub slot: String,
    /// `rejected` (a drafted line carried it and was rejected, by the judge or the
    /// checks), `cut` (an accepted line carried it but the slot's caps left it out),
    /// `never-drafted` (no drafted line carried it) or `never-written` (a method without a
    /// drafter wrote no line with it).
    pub reason: String,
    /// Slot of the line that carried it, when one did.
    pub line_slot: Option<String>,
}

/// One method on one session.
#[derive(Debug, Clone, Serialize)]
pub struct MethodResult {
    /// The method.
    pub method: EvalMethod,
    /// Set when the method failed on this session (its metrics are then absent).
    pub error: Option<String>,
    /// The context handed to the next turn.
    pub context: String,
    /// Target tokens of the context.
    pub tokens_out: usize,
    /// Tokens in / tokens out.
    pub compression: f64,
    /// Presence probes.
    pub probes: Vec<ProbeHit>,
    /// Share of presence probes found (none when the session has none).
    pub probe_rate: Option<f64>,
    /// Share of slot-named probes found in their slot (summaries only).
    pub in_slot_rate: Option<f64>,
    /// Answers to question probes.
    pub qa: Vec<QaAnswer>,
    /// Mean answer score.
    pub qa_score: Option<f64>,
    /// Full-history score minus this context's.
    pub qa_delta: Option<f64>,
    /// Next-step judgment r (cut sessions, summaries only).
    pub next_step_r: Option<f32>,
    /// r ≥ η.
    pub next_step_agree: Option<bool>,
    /// Checkable assertions in the context (summaries only).
    pub assertions: usize,
    /// Those that occur nowhere in the history.
    pub unsourced: Vec<String>,
    /// Per-slot adequacy (summaries only, with judges).
    pub adequacy: Vec<SlotAdequacy>,
    /// Mean adequacy score over slots.
    pub adequacy_mean: Option<f64>,
    /// Presence probes the history holds but this summary lost, with where.
    pub lost: Vec<LostProbe>,
    /// The compaction's trace (engine methods).
    pub trace: Option<Trace>,
    /// Wall time of producing the context (ms).
    pub wall_ms: f64,
}

impl MethodResult {
    /// A method that failed on a session: the error, no metrics.
    pub fn failed(method: EvalMethod, error: String, context: String, wall_ms: f64) -> Self {
        Self {
            method,
            error: Some(error),
            context,
            tokens_out: 0,
            compression: 0.0,
            probes: Vec::new(),
            probe_rate: None,
            in_slot_rate: None,
            qa: Vec::new(),
            qa_score: None,
            qa_delta: None,
            next_step_r: None,
            next_step_agree: None,
            assertions: 0,
            unsourced: Vec::new(),
            adequacy: Vec::new(),
            adequacy_mean: None,
            lost: Vec::new(),
            trace: None,
            wall_ms,
        }
    }
}

/// Every method on one session.
#[derive(Debug, Clone, Serialize)]
pub struct SessionResult {
    /// Session id.
    pub id: String,
    /// Source dataset.
    pub source: String,
    /// Session kind.
    pub kind: String,
    /// Messages.
    pub messages: usize,
    /// Whether the session was cut (has a continuation).
    pub cut: bool,
    /// Target tokens of the rendered history.
    pub tokens_in: usize,
    /// Presence probes / question probes.
    pub presence_probes: usize,
    /// Question probes.
    pub qa_probes: usize,
    /// Mean answer score from the whole history (the reference of QA Δ).
    pub qa_full: Option<f64>,
    /// One entry per method, in the options' order.
    pub methods: Vec<MethodResult>,
}

fn rate(hits: impl Iterator<Item = bool>) -> Option<f64> {
    let (mut n, mut k) = (0usize, 0usize);
    for h in hits {
        n += 1;
        k += h as usize;
    }
    (n > 0).then(|| k as f64 / n as f64)
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Slot texts of a compaction by slot name.
fn slot_texts(c: &Compaction) -> Vec<(String, String)> {
    c.slots
        .iter()
        .map(|s| {
            let t: Vec<&str> = s.lines.iter().map(|l| l.text.as_str()).collect();
            (s.name.clone(), t.join("\n"))
        })
        .collect()
}

/// A compaction plus the lines its run rejected and accepted: (slot, text).
struct Produced {
    compaction: Compaction,
    rejected: Vec<(String, String)>,
    accepted: Vec<(String, String)>,
}

fn attribute(
    session: &EvalSession,
    hits: &[ProbeHit],
    htext: &str,
    p: &Produced,
) -> Vec<LostProbe> {
    let drafted = matches!(
        p.compaction.method,
        Method::Speculative | Method::DrafterOnly
    );
    let mut out = Vec::new();
    for h in hits.iter().filter(|h| !h.found) {
        let Some(probe) = session.probes.iter().find(|x| x.id == h.id) else {
            continue;
        };
        if !probe.expect_any.iter().any(|e| htext.contains(e.as_str())) {
            continue;
        }
        let carries = |lines: &[(String, String)]| {
            lines
                .iter()
                .find(|(_, t)| probe.expect_any.iter().any(|e| t.contains(e.as_str())))
                .map(|(s, _)| s.clone())
        };
        let (reason, line_slot) = match (carries(&p.rejected), carries(&p.accepted)) {
            (Some(s), _) => ("rejected", Some(s)),
            (None, Some(s)) => ("cut", Some(s)),
            (None, None) if drafted => ("never-drafted", None),
            (None, None) => ("never-written", None),
        };
        out.push(LostProbe {
            id: probe.id.clone(),
            slot: probe.slot.clone(),
            reason: reason.into(),
            line_slot,
        });
    }
    out
}

/// Evaluates `methods` on every session; `progress(session index, step)` is called before
/// each step. A method that fails on a session is recorded with its error, never dropped.
pub fn evaluate<B: Backend + 'static>(
    c: &Compactor<B>,
    sessions: &[EvalSession],
    opts: &EvalOptions,
    progress: &mut dyn FnMut(usize, &str),
) -> Result<Vec<SessionResult>> {
    let target = c.target();
    let cfg = c.config();
    let mut results = Vec::with_capacity(sessions.len());
    for (si, s) in sessions.iter().enumerate() {
        let (transcript, _) = c.transcript(&s.history, Method::Sequential)?;
        let tokens_in = target.count_tokens(&transcript)?;
        let htext = history_text(&s.history);
        let presence: Vec<&crate::Probe> = s.presence_probes().collect();
        let qa: Vec<&crate::Probe> = s.qa_probes().collect();
        let questions: Vec<&str> = qa.iter().filter_map(|p| p.question.as_deref()).collect();
        let count = |t: &str| target.count_tokens(t);
        // Reference answers from the whole history.
        let qa_full = if opts.reader && !qa.is_empty() {
            progress(si, "reader: full history");
            let a = answer(target, &opts.prompts, &transcript, &questions)?;
            Some(a)
        } else {
            None
        };
        let full_score = qa_full.as_ref().map(|a| {
            let v: Vec<f64> = a.iter().zip(&qa).map(|(x, p)| qa_score(x, p)).collect();
            mean(&v).unwrap_or(0.0)
        });
        let mut produced: Vec<(EvalMethod, std::result::Result<Produced, String>, f64)> =
            Vec::new();
        for &m in &opts.methods {
            let EvalMethod::Engine(em) = m else { continue };
            progress(si, m.as_str());
            // Every method starts cold: nothing of another method's prefill is reused.
            if let Some(sid) = &s.history.id {
                c.forget(sid)?;
            }
            let t0 = Instant::now();
            let (mut rejected, mut accepted) = (Vec::new(), Vec::new());
            let r = c.compact_blocking(&s.history, em, &mut |e: &Event| match e {
                Event::LineRejected { slot, text, .. } => {
                    rejected.push((slot.clone(), text.clone()))
                }
                Event::LineAccepted { slot, text, .. } => {
                    accepted.push((slot.clone(), text.clone()))
                }
                _ => {}
            });
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            let r = r.map(|compaction| Produced { compaction, rejected, accepted }).map_err(|e| {
                tracing::warn!(session = s.id.as_str(), method = m.as_str(), error = %e, "method failed");
                e.to_string()
            });
            produced.push((m, r, ms));
        }
        // The tail's matched budget: the speculative summary's size, else the first summary's.
        let summary_tokens = |want: Option<Method>| {
            produced.iter().find_map(|(m, r, _)| match (m, r) {
                (EvalMethod::Engine(x), Ok(p)) if want.is_none_or(|w| w == *x) => {
                    Some(p.compaction.trace.summary_tokens)
                }
                _ => None,
            })
        };
        let spec_tokens =
            summary_tokens(Some(Method::Speculative)).or_else(|| summary_tokens(None));
        // Judge asks of every summary, judged in one pass over the record.
        let mut asks: Vec<Ask> = Vec::new();
        let mut ask_of: Vec<(usize, Vec<std::ops::Range<usize>>, Option<usize>)> = Vec::new();
        let continuation = (!s.continuation.is_empty()).then(|| {
            render(
                &History {
                    id: None,
                    messages: s.continuation.clone(),
                },
                &RenderOptions {
                    tool_result_cap: cfg.tool_result_cap,
                    omit: None,
                },
            )
        });
        if opts.judges {
            for (k, (_, r, _)) in produced.iter().enumerate() {
                let Ok(p) = r else { continue };
                let texts = slot_texts(&p.compaction);
                let mut ranges = Vec::new();
                for (slot, (_, text)) in p.compaction.slots.iter().zip(&texts) {
                    let spec = cfg.slot(&slot.name);
                    let a = section_asks(
                        &opts.prompts,
                        &slot.title,
                        spec.map_or("", |x| x.contract.as_str()),
                        text,
                    );
                    ranges.push(asks.len()..asks.len() + a.len());
                    asks.extend(a);
                }
                let ns = continuation.as_ref().map(|cont| {
                    let next = texts
                        .iter()
                        .find(|(n, _)| n == "next_steps")
                        .map_or("", |(_, t)| t.as_str());
                    asks.push(next_step_ask(&opts.prompts, next, cont));
                    asks.len() - 1
                });
                ask_of.push((k, ranges, ns));
            }
        }
        let verdicts = if asks.is_empty() {
            Vec::new()
        } else {
            progress(si, "judges");
            judge(target, &opts.prompts, cfg, &transcript, &asks)?
        };
        let mut methods = Vec::with_capacity(opts.methods.len());
        for &m in &opts.methods {
            let t0 = Instant::now();
            let (context, slots, prod, wall, err) = match m {
                EvalMethod::Engine(_) => {
                    let k = produced.iter().position(|(x, _, _)| *x == m).unwrap_or(0);
                    match &produced[k].1 {
                        Ok(p) => (
                            p.compaction.markdown.clone(),
                            Some(slot_texts(&p.compaction)),
                            Some((k, p)),
                            produced[k].2,
                            None,
                        ),
                        Err(e) => (String::new(), None, None, produced[k].2, Some(e.clone())),
                    }
                }
                EvalMethod::TruncateTail => {
                    let budget = match opts.tail_budget {
                        TailBudget::Fixed(n) => n,
                        TailBudget::Matched => spec_tokens.unwrap_or(cfg.summary_budget),
                    };
                    let (t, _) = truncate_tail(&s.history, budget, cfg.tool_result_cap, &count)?;
                    (t, None, None, t0.elapsed().as_secs_f64() * 1e3, None)
                }
                EvalMethod::Full => (transcript.clone(), None, None, 0.0, None),
            };
            if let Some(e) = err {
                methods.push(MethodResult::failed(m, e, context, wall));
                continue;
            }
            let tokens_out = count(&context)?;
            let hits = probe_hits(&presence, &context, slots.as_deref());
            let probe_rate = rate(hits.iter().map(|h| h.found));
            let in_slot_rate = rate(hits.iter().filter_map(|h| h.in_slot));
            let qa_answers = match (&qa_full, m) {
                (Some(full), EvalMethod::Full) => full.clone(),
                (Some(_), _) => {
                    progress(si, &format!("reader: {m}"));
                    answer(target, &opts.prompts, &context, &questions)?
                }
                (None, _) => Vec::new(),
            };
            let qa_rows: Vec<QaAnswer> = qa_answers
                .iter()
                .zip(&qa)
                .map(|(a, p)| QaAnswer {
                    id: p.id.clone(),
                    answer: a.clone(),
                    score: qa_score(a, p),
                })
                .collect();
            let qa_s = mean(&qa_rows.iter().map(|q| q.score).collect::<Vec<_>>());
            let is_summary = slots.is_some();
            let (adequacy, next_step_r) =
                match prod.and_then(|(k, _)| ask_of.iter().find(|a| a.0 == k)) {
                    Some((_, ranges, ns)) => {
                        let ad = prod
                            .map(|(_, p)| &p.compaction.slots)
                            .into_iter()
                            .flatten()
                            .zip(ranges)
                            .map(|(slot, r)| {
                                let rs: Vec<f32> = verdicts[r.clone()].to_vec();
                                SlotAdequacy {
                                    slot: slot.name.clone(),
                                    score: rs.iter().filter(|&&x| x >= cfg.eta).count(),
                                    r: rs,
                                }
                            })
                            .collect::<Vec<_>>();
                        (ad, ns.map(|i| verdicts[i]))
                    }
                    None => (Vec::new(), None),
                };
            let adequacy_mean = mean(&adequacy.iter().map(|a| a.score as f64).collect::<Vec<_>>());
            let lost = prod.map_or_else(Vec::new, |(_, p)| attribute(s, &hits, &htext, p));
            methods.push(MethodResult {
                method: m,
                error: None,
                tokens_out,
                compression: tokens_in as f64 / tokens_out.max(1) as f64,
                probe_rate,
                in_slot_rate,
                qa_delta: match (full_score, qa_s) {
                    (Some(f), Some(x)) => Some(f - x),
                    _ => None,
                },
                qa_score: qa_s,
                qa: qa_rows,
                next_step_agree: next_step_r.map(|r| r >= cfg.eta),
                next_step_r,
                assertions: if is_summary {
                    assertions(&context).len()
                } else {
                    0
                },
                unsourced: if is_summary {
                    unsourced(&context, &htext)
                } else {
                    Vec::new()
                },
                adequacy,
                adequacy_mean,
                lost,
                trace: prod.map(|(_, p)| p.compaction.trace.clone()),
                wall_ms: wall,
                probes: hits,
                context,
            });
        }
        results.push(SessionResult {
            id: s.id.clone(),
            source: s.source.clone(),
            kind: s.kind.clone(),
            messages: s.history.messages.len(),
            cut: !s.continuation.is_empty(),
            tokens_in,
            presence_probes: presence.len(),
            qa_probes: qa.len(),
            qa_full: full_score,
            methods,
        });
    }
    Ok(results)
}
