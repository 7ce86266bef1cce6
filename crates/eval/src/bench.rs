//! End-to-end comparison of methods: every method on every session in one process,
//! interleaved (session by session, methods in turn), with wall times, the speedup over
//! `sequential` cold (shared prefill included) and warm (prefill excluded), acceptance and
//! call counts, as a markdown table or JSON.

use crate::Result;
use serde::{Deserialize, Serialize};
use speccompact_engine::{Backend, Compaction, Compactor, Event, Method, Trace};
use speccompact_history::History;

/// One method on one session. Reading a report back, counters it lacks (written before
/// they existed) are zero.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchRun {
    /// Session id (or its index in the file).
    pub session: String,
    /// The method.
    pub method: Method,
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

/// Runs `methods` on each session in turn; `progress(session, method)` is called before each
/// run. A failing run stops the benchmark with its error.
pub fn run<B: Backend + 'static>(
    compactor: &Compactor<B>,
    sessions: &[History],
    methods: &[Method],
    progress: &mut dyn FnMut(usize, Method),
) -> Result<BenchReport> {
    let mut runs = Vec::with_capacity(sessions.len() * methods.len());
    for (i, h) in sessions.iter().enumerate() {
        let id = h.id.clone().unwrap_or_else(|| format!("#{}", i + 1));
        let first = runs.len();
        for &m in methods {
            progress(i, m);
            let c = compactor.compact_blocking(h, m, &mut |_: &Event| {})?;
            tracing::info!(
                session = id.as_str(),
                method = m.as_str(),
                wall_ms = c.trace.wall_ms as u64,
                prefill_ms = c.trace.prefill_ms as u64,
                "bench run done"
            );
            runs.push(BenchRun {
                session: id.clone(),
                method: m,
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
    let summary = methods.iter().map(|&m| summarize(&runs, m)).collect();
    Ok(BenchReport { runs, summary })
}

fn summarize(runs: &[BenchRun], m: Method) -> BenchSummary {
    let mine: Vec<&BenchRun> = runs.iter().filter(|r| r.method == m).collect();
    let n = mine.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Trace) -> f64| mine.iter().map(|r| f(&r.trace)).sum::<f64>() / n;
    // Speedups over the sessions where both ran.
    let pairs: Vec<(&BenchRun, &BenchRun)> = mine
        .iter()
        .filter_map(|r| {
            runs.iter()
                .find(|s| s.method == Method::Sequential && s.session == r.session)
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
    BenchSummary {
        method: m,
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
    }
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
                r.method,
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
            "\n| method | sessions | mean wall s | mean warm s | prefill s | draft s | verify s | repair s | speedup cold | speedup warm | accept | drafter/verify/repair calls | batches | check failures / proposed | drafter tokens |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for m in &self.summary {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0}% | {:.1}/{:.1}/{:.1} | {:.1} | {:.1} / {:.1} | {:.0} |\n",
                m.method,
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
                m.drafter_tokens
            ));
        }
        out
    }
}
