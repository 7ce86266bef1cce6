//! End-to-end comparison of methods: every method on every session in one process,
//! interleaved (session by session, variants and methods in turn), with wall times, the
//! speedup over `sequential` of the same variant cold (shared prefill included) and warm
//! (prefill excluded), acceptance, call counts and target decode speed, as a markdown table
//! or JSON. Variants are the same models run another way (e.g. token lookup on and off); a
//! variant table sets each against the first: decode speed and whether the summaries are
//! byte-identical.

use crate::Result;
use serde::{Deserialize, Serialize};
use speccompact_engine::{Backend, Compaction, Compactor, Event, Method, Trace};
use speccompact_history::History;
use speccompact_runtime::LookupCounters;

/// One method on one session. Reading a report back, counters it lacks (written before
/// they existed) are zero.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchRun {
    /// Session id (or its index in the file).
    pub session: String,
    /// The method.
    pub method: Method,
    /// The variant's label (empty with a single variant).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub variant: String,
    /// The compaction's counters and times.
    pub trace: Trace,
    /// Lines kept, over all slots (blank lines not counted).
    #[serde(default)]
    pub lines: usize,
    /// The summary.
    pub markdown: String,
    /// Sequential wall time / this wall time, when sequential ran on the session.
    #[serde(default)]
    pub speedup_cold: Option<f64>,
    /// The same without the shared prefill (history already in the cache).
    #[serde(default)]
    pub speedup_warm: Option<f64>,
}

/// Totals of one method over all sessions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchSummary {
    /// The method.
    pub method: Method,
    /// The variant's label (empty with a single variant).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub variant: String,
    /// Sessions run.
    #[serde(default)]
    pub sessions: usize,
    /// Mean wall time (ms).
    #[serde(default)]
    pub mean_wall_ms: f64,
    /// Mean wall time without the shared prefill (ms).
    #[serde(default)]
    pub mean_warm_ms: f64,
    /// Mean prefill time (ms).
    #[serde(default)]
    pub mean_prefill_ms: f64,
    /// Mean drafter / verification / repair time (ms).
    #[serde(default)]
    pub mean_draft_ms: f64,
    /// Mean verification time (ms).
    #[serde(default)]
    pub mean_verify_ms: f64,
    /// Mean repair (target generation) time (ms).
    #[serde(default)]
    pub mean_repair_ms: f64,
    /// Sum of sequential wall times / sum of this method's (cold).
    #[serde(default)]
    pub speedup_cold: Option<f64>,
    /// The same without the shared prefill.
    #[serde(default)]
    pub speedup_warm: Option<f64>,
    /// Accepted / proposed drafted lines over all sessions.
    #[serde(default)]
    pub acceptance_rate: f64,
    /// Mean drafter requests.
    #[serde(default)]
    pub drafter_calls: f64,
    /// Mean verification requests.
    #[serde(default)]
    pub verify_calls: f64,
    /// Mean target generation requests.
    #[serde(default)]
    pub repair_calls: f64,
    /// Mean batched model calls.
    #[serde(default)]
    pub batches: f64,
    /// Mean drafted lines refused by the checks (sent to repair without a judgment).
    #[serde(default)]
    pub failed_checks: f64,
    /// Mean drafted lines that went through the checks.
    #[serde(default)]
    pub proposed: f64,
    /// Mean tokens the drafter generated.
    #[serde(default)]
    pub drafter_tokens: f64,
    /// Mean tokens the target generated.
    #[serde(default)]
    pub target_tokens: f64,
    /// Target decode speed: generated tokens ÷ target generation time, over all sessions.
    #[serde(default)]
    pub target_tokens_per_s: f64,
    /// Token lookup over all sessions, per model (`target`, `drafter`).
    #[serde(default)]
    pub lookup: std::collections::BTreeMap<String, LookupCounters>,
}

/// A compaction of a session without its last messages, then of the whole session: the
/// second reuses the first's prefilled prefixes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Recompaction {
    /// Session id.
    pub session: String,
    /// Messages the session grew by.
    #[serde(default)]
    pub grown_by: usize,
    /// The first compaction (cold).
    pub first: Trace,
    /// The second (the grown session).
    pub second: Trace,
}

impl Recompaction {
    /// Target prefix tokens the second compaction computed (not reused).
    pub fn new_target_tokens(&self) -> usize {
        self.second.target_prefix_tokens - self.second.target_prefix_reused
    }
    /// First wall time / second wall time.
    pub fn speedup(&self) -> f64 {
        self.first.wall_ms / self.second.wall_ms.max(1e-9)
    }
}

/// Compacts `h` without its last `grow_by` messages, then all of `h`, with `method`, on a
/// cold cache; the history needs an id (the cache key).
pub fn recompaction<B: Backend + 'static>(
    compactor: &Compactor<B>,
    h: &History,
    method: Method,
    grow_by: usize,
) -> Result<Recompaction> {
    let id = h.id.clone().unwrap_or_else(|| "recompaction".into());
    let mut whole = h.clone();
    whole.id = Some(id.clone());
    let mut part = whole.clone();
    part.messages
        .truncate(whole.messages.len().saturating_sub(grow_by).max(1));
    compactor.forget(&id)?;
    let first = compactor.compact_blocking(&part, method, &mut |_: &Event| {})?;
    let second = compactor.compact_blocking(&whole, method, &mut |_: &Event| {})?;
    compactor.forget(&id)?;
    Ok(Recompaction {
        session: id,
        grown_by: whole.messages.len() - part.messages.len(),
        first: first.trace,
        second: second.trace,
    })
}

/// Markdown table of re-compactions.
pub fn recompaction_table(rs: &[Recompaction]) -> String {
    let mut out = String::from(
        "| session | grown by | first wall s | first target prefill tokens | second wall s | second target tokens computed / reused | second drafter tokens computed / reused | speedup |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rs {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} / {} | {} / {} | {:.2}x |\n",
            r.session,
            r.grown_by,
            s(r.first.wall_ms),
            r.first.target_prefix_tokens,
            s(r.second.wall_ms),
            r.new_target_tokens(),
            r.second.target_prefix_reused,
            r.second.drafter_prefix_tokens - r.second.drafter_prefix_reused,
            r.second.drafter_prefix_reused,
            r.speedup()
        ));
    }
    out
}

/// A whole benchmark.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchReport {
    /// Every run, sessions in order, methods interleaved.
    pub runs: Vec<BenchRun>,
    /// One row per method.
    pub summary: Vec<BenchSummary>,
}

/// The run's content lines.
fn content_lines(c: &Compaction) -> usize {
    c.slots
        .iter()
        .flat_map(|s| &s.lines)
        .filter(|l| !l.text.trim().is_empty())
        .count()
}

fn warm(t: &Trace) -> f64 {
    (t.wall_ms - t.prefill_ms).max(0.0)
}

/// One way of running the models in a benchmark: a label and its compactor.
pub struct Variant<'a, B: Backend = speccompact_engine::ModelBackend> {
    /// Shown beside the method (empty for a lone variant).
    pub label: String,
    /// The compactor that runs it.
    pub compactor: &'a Compactor<B>,
}

/// Runs `methods` with each variant on each session in turn; `progress(session, variant,
/// method)` is called before each run. Speedups relate each run to `sequential` of the same
/// variant. A failing run stops the benchmark with its error.
pub fn run<B: Backend + 'static>(
    variants: &[Variant<B>],
    sessions: &[History],
    methods: &[Method],
    progress: &mut dyn FnMut(usize, &str, Method),
) -> Result<BenchReport> {
    let mut runs = Vec::with_capacity(sessions.len() * methods.len() * variants.len());
    for (i, h) in sessions.iter().enumerate() {
        let id = h.id.clone().unwrap_or_else(|| format!("#{}", i + 1));
        for v in variants {
            let first = runs.len();
            for &m in methods {
                progress(i, &v.label, m);
                let c = v.compactor.compact_blocking(h, m, &mut |_: &Event| {})?;
                tracing::info!(
                    session = id.as_str(),
                    variant = v.label.as_str(),
                    method = m.as_str(),
                    wall_ms = c.trace.wall_ms as u64,
                    prefill_ms = c.trace.prefill_ms as u64,
                    "bench run done"
                );
                runs.push(BenchRun {
                    session: id.clone(),
                    method: m,
                    variant: v.label.clone(),
                    lines: content_lines(&c),
                    trace: c.trace,
                    markdown: c.markdown,
                    speedup_cold: None,
                    speedup_warm: None,
                });
            }
            let seq = runs[first..]
                .iter()
                .find(|r| r.method == Method::Sequential)
                .map(|r| (r.trace.wall_ms, warm(&r.trace)));
            if let Some((cold, w)) = seq {
                for r in &mut runs[first..] {
                    r.speedup_cold = Some(cold / r.trace.wall_ms.max(1e-9));
                    r.speedup_warm = Some(w / warm(&r.trace).max(1e-9));
                }
            }
        }
    }
    let summary = variants
        .iter()
        .flat_map(|v| methods.iter().map(|&m| summarize(&runs, &v.label, m)))
        .collect();
    Ok(BenchReport { runs, summary })
}

fn summarize(runs: &[BenchRun], variant: &str, m: Method) -> BenchSummary {
    let mine: Vec<&BenchRun> = runs
        .iter()
        .filter(|r| r.method == m && r.variant == variant)
        .collect();
    let n = mine.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Trace) -> f64| mine.iter().map(|r| f(&r.trace)).sum::<f64>() / n;
    // Speedups over the sessions where both ran.
    let pairs: Vec<(&BenchRun, &BenchRun)> = mine
        .iter()
        .filter_map(|r| {
            runs.iter()
                .find(|s| {
                    s.method == Method::Sequential && s.session == r.session && s.variant == variant
                })
                .map(|s| (*r, s))
        })
        .collect();
    let ratio = |f: &dyn Fn(&Trace) -> f64| {
        (!pairs.is_empty()).then(|| {
            let seq: f64 = pairs.iter().map(|(_, s)| f(&s.trace)).sum();
            let me: f64 = pairs.iter().map(|(r, _)| f(&r.trace)).sum();
            seq / me.max(1e-9)
        })
    };
    let proposed: usize = mine.iter().map(|r| r.trace.lines_proposed).sum();
    let accepted: usize = mine.iter().map(|r| r.trace.lines_accepted).sum();
    let mut lookup = std::collections::BTreeMap::<String, LookupCounters>::new();
    for (role, c) in mine.iter().flat_map(|r| &r.trace.lookup) {
        let e = lookup.entry(role.clone()).or_default();
        e.drafted += c.drafted;
        e.kept += c.kept;
        e.forwards += c.forwards;
    }
    let target_tokens: f64 = mine.iter().map(|r| r.trace.target_tokens as f64).sum();
    let target_ms: f64 = mine.iter().map(|r| r.trace.repair_ms).sum();
    BenchSummary {
        method: m,
        variant: variant.to_string(),
        sessions: mine.len(),
        mean_wall_ms: mean(&|t| t.wall_ms),
        mean_warm_ms: mean(&warm),
        mean_prefill_ms: mean(&|t| t.prefill_ms),
        mean_draft_ms: mean(&|t| t.draft_ms),
        mean_verify_ms: mean(&|t| t.verify_ms),
        mean_repair_ms: mean(&|t| t.repair_ms),
        speedup_cold: ratio(&|t| t.wall_ms),
        speedup_warm: ratio(&warm),
        acceptance_rate: if proposed > 0 {
            accepted as f64 / proposed as f64
        } else {
            0.0
        },
        drafter_calls: mean(&|t| t.drafter_calls as f64),
        verify_calls: mean(&|t| t.verify_calls as f64),
        repair_calls: mean(&|t| t.repair_calls as f64),
        batches: mean(&|t| t.batches as f64),
        failed_checks: mean(&|t| t.lines_failed_checks as f64),
        proposed: mean(&|t| t.lines_proposed as f64),
        drafter_tokens: mean(&|t| t.drafter_tokens as f64),
        target_tokens: mean(&|t| t.target_tokens as f64),
        target_tokens_per_s: target_tokens / (target_ms / 1e3).max(1e-9),
        lookup,
    }
}

/// `method`, or `method (variant)`.
fn labelled(m: Method, variant: &str) -> String {
    if variant.is_empty() {
        m.to_string()
    } else {
        format!("{m} ({variant})")
    }
}

/// `kept/drafted` of a model's lookup, `-` when it drafted nothing.
fn kept(l: &std::collections::BTreeMap<String, LookupCounters>, role: &str) -> String {
    l.get(role)
        .filter(|c| c.drafted > 0)
        .map_or("-".into(), |c| format!("{}/{}", c.kept, c.drafted))
}

fn x(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}x"))
}

fn s(ms: f64) -> String {
    format!("{:.1}", ms / 1e3)
}

impl BenchReport {
    /// Per-session and overall tables in markdown (times in seconds).
    pub fn table(&self) -> String {
        let mut out = String::from(
            "| session | method | wall s | prefill s | draft s | verify s | repair s | speedup cold | speedup warm | accept | drafter/verify/repair calls | lines |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for r in &self.runs {
            let t = &r.trace;
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0}% | {}/{}/{} | {} |\n",
                r.session,
                labelled(r.method, &r.variant),
                s(t.wall_ms),
                s(t.prefill_ms),
                s(t.draft_ms),
                s(t.verify_ms),
                s(t.repair_ms),
                x(r.speedup_cold),
                x(r.speedup_warm),
                100.0 * t.acceptance_rate,
                t.drafter_calls,
                t.verify_calls,
                t.repair_calls,
                r.lines
            ));
        }
        out.push_str(
            "\n| method | sessions | mean wall s | mean warm s | prefill s | draft s | verify s | repair s | speedup cold | speedup warm | accept | drafter/verify/repair calls | batches | check failures / proposed | drafter tokens | target tokens | target tok/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for m in &self.summary {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0}% | {:.1}/{:.1}/{:.1} | {:.1} | {:.1} / {:.1} | {:.0} | {:.0} | {:.1} |\n",
                labelled(m.method, &m.variant),
                m.sessions,
                s(m.mean_wall_ms),
                s(m.mean_warm_ms),
                s(m.mean_prefill_ms),
                s(m.mean_draft_ms),
                s(m.mean_verify_ms),
                s(m.mean_repair_ms),
                x(m.speedup_cold),
                x(m.speedup_warm),
                100.0 * m.acceptance_rate,
                m.drafter_calls,
                m.verify_calls,
                m.repair_calls,
                m.batches,
                m.failed_checks,
                m.proposed,
                m.drafter_tokens,
                m.target_tokens,
                m.target_tokens_per_s
            ));
        }
        out.push_str(&self.variant_table());
        out
    }

    /// Each variant against the first, per method (empty with a single variant): target
    /// decode speed and its ratio, summaries byte-identical to the first variant's, and the
    /// lookup counters (kept/drafted tokens).
    pub fn variant_table(&self) -> String {
        let Some(base) = self.summary.first().map(|m| m.variant.clone()) else {
            return String::new();
        };
        if self.summary.iter().all(|m| m.variant == base) {
            return String::new();
        }
        let mut out = format!(
            "\n| method | variant | target tok/s | × {base} | identical to {base} | target lookup kept/drafted | drafter lookup kept/drafted | mean wall s | speedup cold |\n|---|---|---|---|---|---|---|---|---|\n"
        );
        for m in &self.summary {
            let Some(b) = self
                .summary
                .iter()
                .find(|b| b.method == m.method && b.variant == base)
            else {
                continue;
            };
            let mine = self
                .runs
                .iter()
                .filter(|r| r.method == m.method && r.variant == m.variant);
            let (mut same, mut n) = (0, 0);
            for r in mine {
                n += 1;
                same += self.runs.iter().any(|o| {
                    o.variant == base
                        && o.method == r.method
                        && o.session == r.session
                        && o.markdown == r.markdown
                }) as usize;
            }
            out.push_str(&format!(
                "| {} | {} | {:.1} | {:.2}x | {same}/{n} | {} | {} | {} | {} |\n",
                m.method,
                m.variant,
                m.target_tokens_per_s,
                m.target_tokens_per_s / b.target_tokens_per_s.max(1e-9),
                kept(&m.lookup, "target"),
                kept(&m.lookup, "drafter"),
                s(m.mean_wall_ms),
                x(m.speedup_cold),
            ));
        }
        out
    }
}
