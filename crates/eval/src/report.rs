//! Reports: per method, means with bootstrap 95 % intervals over sessions; the paired
//! speculative − sequential differences; where the speculative method lost probes; drift per
//! generation; per-session JSON; and SVG plots of probe retention and QA Δ. Every report
//! carries its provenance (command, models, settings, data checksum).

mod svg;

pub use svg::bars;

use crate::context::EvalMethod;
use crate::drift::DriftReport;
use crate::metrics::{bootstrap, Stat};
use crate::run::{MethodResult, SessionResult};
use serde::Serialize;
use speccompact_engine::Method;

/// Where a report came from.
#[derive(Debug, Clone, Serialize)]
pub struct Provenance {
    /// The exact command line.
    pub command: String,
    /// Data file.
    pub data: String,
    /// Its SHA-256.
    pub data_sha256: String,
    /// Sessions evaluated, in order, and how they were chosen.
    pub selection: String,
    /// Drafter model (name and file).
    pub drafter: String,
    /// Target model (name and file); also the reader and the judge.
    pub target: String,
    /// The compaction settings, as TOML.
    pub compaction_config: String,
    /// The evaluation settings, as TOML.
    pub eval_config: String,
    /// `truncate-tail` budget.
    pub tail_budget: String,
    /// Source revision of the program, when known.
    pub revision: String,
    /// Runtime settings (threads, device).
    pub runtime: String,
}

/// One method over all sessions.
#[derive(Debug, Clone, Serialize)]
pub struct MethodSummary {
    /// The method.
    pub method: EvalMethod,
    /// Sessions where it ran.
    pub sessions: usize,
    /// Sessions where it failed.
    pub failures: usize,
    /// Probe preservation per session.
    pub probes: Option<Stat>,
    /// Probes found / probes, pooled over sessions.
    pub probes_pooled: (usize, usize),
    /// Probes found in their named slot, per session.
    pub in_slot: Option<Stat>,
    /// QA score per session.
    pub qa_score: Option<Stat>,
    /// QA Δ (full − this) per session.
    pub qa_delta: Option<Stat>,
    /// Next-step agreement (0/1) per cut session.
    pub next_step: Option<Stat>,
    /// Unsourced assertions per session.
    pub unsourced: Option<Stat>,
    /// Checkable assertions per session.
    pub assertions: Option<Stat>,
    /// Slot adequacy (0-5) per session.
    pub adequacy: Option<Stat>,
    /// Tokens out per session.
    pub tokens_out: Option<Stat>,
    /// Compression ratio per session.
    pub compression: Option<Stat>,
    /// Seconds to produce the context, per session.
    pub seconds: Option<Stat>,
}

/// A paired difference between two methods over the sessions where both have a value.
#[derive(Debug, Clone, Serialize)]
pub struct Paired {
    /// Metric name.
    pub metric: String,
    /// First − second, in points (×100), with its interval.
    pub diff: Option<Stat>,
}

/// Where a method lost probes the history holds: (reason, probe slot, line slot) → count.
#[derive(Debug, Clone, Serialize)]
pub struct Loss {
    /// Method.
    pub method: EvalMethod,
    /// `rejected`, `cut`, `never-drafted` or `never-written`.
    pub reason: String,
    /// The probe's slot.
    pub slot: String,
    /// Probes.
    pub count: usize,
    /// Of those, found by `sequential` on the same session.
    pub found_by_sequential: usize,
}

/// A whole evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where it came from.
    pub provenance: Provenance,
    /// Methods, in order.
    pub methods: Vec<EvalMethod>,
    /// One row per method.
    pub summary: Vec<MethodSummary>,
    /// Speculative − sequential, paired by session.
    pub speculative_vs_sequential: Vec<Paired>,
    /// Lost probes by method, reason and slot.
    pub losses: Vec<Loss>,
    /// Drift stress runs.
    pub drift: Vec<DriftReport>,
    /// Every session × method.
    pub sessions: Vec<SessionResult>,
}

fn of<'a>(s: &'a SessionResult, m: EvalMethod) -> Option<&'a MethodResult> {
    s.methods
        .iter()
        .find(|r| r.method == m && r.error.is_none())
}

impl Report {
    /// Aggregates per-session results; `iters` and `seed` drive the bootstrap.
    pub fn new(
        provenance: Provenance,
        methods: Vec<EvalMethod>,
        sessions: Vec<SessionResult>,
        drift: Vec<DriftReport>,
        iters: usize,
        seed: u64,
    ) -> Self {
        let stat = |v: Vec<f64>| bootstrap(&v, iters, seed);
        let summary = methods
            .iter()
            .map(|&m| {
                let rows: Vec<&MethodResult> = sessions.iter().filter_map(|s| of(s, m)).collect();
                let col = |f: &dyn Fn(&MethodResult) -> Option<f64>| {
                    stat(rows.iter().filter_map(|r| f(r)).collect())
                };
                let summaries = matches!(m, EvalMethod::Engine(_));
                MethodSummary {
                    method: m,
                    sessions: rows.len(),
                    failures: sessions
                        .iter()
                        .filter(|s| s.methods.iter().any(|r| r.method == m && r.error.is_some()))
                        .count(),
                    probes: col(&|r| r.probe_rate),
                    probes_pooled: rows.iter().fold((0, 0), |(f, n), r| {
                        (
                            f + r.probes.iter().filter(|h| h.found).count(),
                            n + r.probes.len(),
                        )
                    }),
                    in_slot: col(&|r| r.in_slot_rate),
                    qa_score: col(&|r| r.qa_score),
                    qa_delta: col(&|r| r.qa_delta),
                    next_step: col(&|r| r.next_step_agree.map(|a| a as u8 as f64)),
                    unsourced: if summaries {
                        col(&|r| Some(r.unsourced.len() as f64))
                    } else {
                        None
                    },
                    assertions: if summaries {
                        col(&|r| Some(r.assertions as f64))
                    } else {
                        None
                    },
                    adequacy: col(&|r| r.adequacy_mean),
                    tokens_out: col(&|r| Some(r.tokens_out as f64)),
                    compression: col(&|r| Some(r.compression)),
                    seconds: col(&|r| Some(r.wall_ms / 1e3)),
                }
            })
            .collect();
        let spec = EvalMethod::Engine(Method::Speculative);
        let seq = EvalMethod::Engine(Method::Sequential);
        let paired = |name: &str, f: &dyn Fn(&MethodResult) -> Option<f64>| Paired {
            metric: name.into(),
            diff: stat(
                sessions
                    .iter()
                    .filter_map(|s| Some(100.0 * (f(of(s, spec)?)? - f(of(s, seq)?)?)))
                    .collect(),
            ),
        };
        let speculative_vs_sequential = if methods.contains(&spec) && methods.contains(&seq) {
            vec![
                paired("probe preservation", &|r| r.probe_rate),
                paired("probes in their slot", &|r| r.in_slot_rate),
                paired("QA score", &|r| r.qa_score),
                paired("QA Δ (full − method)", &|r| r.qa_delta),
                paired("next-step agreement", &|r| {
                    r.next_step_agree.map(|a| a as u8 as f64)
                }),
            ]
        } else {
            Vec::new()
        };
        let mut losses: Vec<Loss> = Vec::new();
        for s in &sessions {
            let seq_found: Vec<&str> = of(s, seq)
                .map(|r| {
                    r.probes
                        .iter()
                        .filter(|h| h.found)
                        .map(|h| h.id.as_str())
                        .collect()
                })
                .unwrap_or_default();
            for r in s.methods.iter().filter(|r| r.error.is_none()) {
                for l in &r.lost {
                    let i = match losses.iter().position(|x| {
                        x.method == r.method && x.reason == l.reason && x.slot == l.slot
                    }) {
                        Some(i) => i,
                        None => {
                            losses.push(Loss {
                                method: r.method,
                                reason: l.reason.clone(),
                                slot: l.slot.clone(),
                                count: 0,
                                found_by_sequential: 0,
                            });
                            losses.len() - 1
                        }
                    };
                    losses[i].count += 1;
                    losses[i].found_by_sequential += seq_found.contains(&l.id.as_str()) as usize;
                }
            }
        }
        Report {
            provenance,
            methods,
            summary,
            speculative_vs_sequential,
            losses,
            drift,
            sessions,
        }
    }

    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let p = &self.provenance;
        let mut o = String::new();
        o.push_str("# Evaluation: what each compacted context keeps\n\n");
        o.push_str(&format!(
            "- Command: `{}`\n- Data: `{}` (sha256 `{}`); {}\n- Drafter: {}\n- Target (also reader and judge): {}\n- Runtime: {}\n- Revision: {}\n- `truncate-tail` budget: {}\n- Settings: the compaction and evaluation settings are in the JSON report (`provenance`).\n\n",
            p.command, p.data, p.data_sha256, p.selection, p.drafter, p.target, p.runtime, p.revision, p.tail_budget
        ));
        o.push_str("Means over sessions with bootstrap 95 % intervals (resampling sessions) in brackets; a metric without values for a method is `–`. Probe preservation: identifier/file probes found verbatim (case-sensitive); in slot: found in the slot the probe names (summaries only). QA: reader answers scored by normalised match against the acceptable answers, or token F1 against a free-text answer; QA Δ = full history − context, in points. Next step: judge agrees that Next Steps is consistent with the real continuation (cut sessions). Unsourced: identifiers, numbers, paths, error names and quoted code in the summary that occur nowhere in the history. Adequacy: criteria met per slot (0–5), mean over slots. Sizes are context, not quality.\n\n");
        o.push_str("| method | sessions (failed) | probe preservation % | in slot % | pooled probes | QA score % | QA Δ points | next step % | unsourced / summary | assertions / summary | adequacy 0–5 | tokens out | compression | seconds |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for m in &self.summary {
            o.push_str(&format!(
                "| {} | {} ({}) | {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                m.method,
                m.sessions,
                m.failures,
                pct(m.probes),
                pct(m.in_slot),
                m.probes_pooled.0,
                m.probes_pooled.1,
                pct(m.qa_score),
                pct(m.qa_delta),
                pct(m.next_step),
                num(m.unsourced, 1),
                num(m.assertions, 1),
                num(m.adequacy, 2),
                num(m.tokens_out, 0),
                num(m.compression, 1),
                num(m.seconds, 1),
            ));
        }
        if !self.speculative_vs_sequential.is_empty() {
            o.push_str("\n## Speculative − sequential (paired by session, points)\n\n| metric | sessions | difference | 95 % interval | within 3 points |\n|---|---|---|---|---|\n");
            for d in &self.speculative_vs_sequential {
                match d.diff {
                    Some(s) => o.push_str(&format!(
                        "| {} | {} | {:+.1} | [{:+.1}, {:+.1}] | {} |\n",
                        d.metric,
                        s.n,
                        s.mean,
                        s.lo,
                        s.hi,
                        if s.mean.abs() <= 3.0 { "yes" } else { "no" }
                    )),
                    None => o.push_str(&format!("| {} | 0 | – | – | – |\n", d.metric)),
                }
            }
        }
        if !self.losses.is_empty() {
            o.push_str("\n## Where probes were lost\n\nPresence probes whose strings occur in the history but not in the summary, by method, reason and the probe's slot. `rejected`: a drafted line carried the string and was rejected (judge or checks) and its repair did not keep it; `never-drafted`: no drafted line carried it; `never-written`: a method without a drafter wrote no line with it.\n\n| method | reason | probe slot | probes | of those found by sequential |\n|---|---|---|---|---|\n");
            let mut l = self.losses.clone();
            l.sort_by(|a, b| {
                (a.method.as_str(), &a.reason, &a.slot).cmp(&(
                    b.method.as_str(),
                    &b.reason,
                    &b.slot,
                ))
            });
            for x in l {
                o.push_str(&format!(
                    "| {} | {} | {} | {} | {} |\n",
                    x.method, x.reason, x.slot, x.count, x.found_by_sequential
                ));
            }
        }
        o.push_str("\n## Per session\n\nProbe preservation / QA score / next step r / unsourced / adequacy / tokens out, per method.\n\n| session | tokens in | probes | qa | ");
        for m in &self.methods {
            o.push_str(&format!("{m} | "));
        }
        o.push_str("\n|---|---|---|---|");
        for _ in &self.methods {
            o.push_str("---|");
        }
        o.push('\n');
        for s in &self.sessions {
            o.push_str(&format!(
                "| {} | {} | {} | {} | ",
                s.id, s.tokens_in, s.presence_probes, s.qa_probes
            ));
            for m in &self.methods {
                let cell = match s.methods.iter().find(|r| r.method == *m) {
                    Some(r) if r.error.is_some() => "failed".to_string(),
                    Some(r) => format!(
                        "{} / {} / {} / {} / {} / {}",
                        r.probe_rate
                            .map_or("–".into(), |x| format!("{:.0}%", 100.0 * x)),
                        r.qa_score
                            .map_or("–".into(), |x| format!("{:.0}%", 100.0 * x)),
                        r.next_step_r.map_or("–".into(), |x| format!("{x:.2}")),
                        if matches!(r.method, EvalMethod::Engine(_)) {
                            r.unsourced.len().to_string()
                        } else {
                            "–".into()
                        },
                        r.adequacy_mean.map_or("–".into(), |x| format!("{x:.1}")),
                        r.tokens_out
                    ),
                    None => "–".into(),
                };
                o.push_str(&format!("{cell} | "));
            }
            o.push('\n');
        }
        let failed: Vec<String> = self
            .sessions
            .iter()
            .flat_map(|s| {
                s.methods.iter().filter_map(move |r| {
                    r.error
                        .as_ref()
                        .map(|e| format!("- {} / {}: {e}", s.id, r.method))
                })
            })
            .collect();
        if !failed.is_empty() {
            o.push_str("\n## Failed runs\n\n");
            o.push_str(&failed.join("\n"));
            o.push('\n');
        }
        for d in &self.drift {
            o.push_str(&format!(
                "\n## Drift: {} ({}, every {} messages)\n\nProbes seen so far that survive in the recursive chain (previous summary + new messages) and in a rebuild from the log.\n\n| generation | messages | probes seen | recursive | rebuild | only recursive | only rebuild | errors |\n|---|---|---|---|---|---|---|---|\n",
                d.session, d.method, d.every
            ));
            for g in &d.generations {
                o.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                    g.generation,
                    g.messages,
                    g.probes_seen,
                    g.recursive,
                    g.rebuild,
                    g.only_recursive.join(", "),
                    g.only_rebuild.join(", "),
                    g.errors.join("; ")
                ));
            }
        }
        o
    }

    /// Bar charts with 95 % intervals: probe preservation (%) and QA Δ (points) by method.
    pub fn plots(&self) -> Vec<(&'static str, String)> {
        let rows = |f: &dyn Fn(&MethodSummary) -> Option<Stat>| -> Vec<(String, Stat)> {
            self.summary
                .iter()
                .filter_map(|m| f(m).map(|s| (m.method.to_string(), s)))
                .collect()
        };
        vec![
            (
                "probes",
                bars("Probe preservation by method (%)", &rows(&|m| m.probes)),
            ),
            (
                "qa-delta",
                bars(
                    "QA Δ by method (full − context, points)",
                    &rows(&|m| m.qa_delta),
                ),
            ),
        ]
    }
}

fn pct(s: Option<Stat>) -> String {
    s.map_or("–".into(), |s| {
        format!(
            "{:.1} [{:.1}, {:.1}]",
            100.0 * s.mean,
            100.0 * s.lo,
            100.0 * s.hi
        )
    })
}

fn num(s: Option<Stat>, d: usize) -> String {
    s.map_or("–".into(), |s| {
        format!("{:.d$} [{:.d$}, {:.d$}]", s.mean, s.lo, s.hi)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::ProbeHit;
    use crate::run::{LostProbe, MethodResult};

    fn result(m: EvalMethod, found: &[bool], qa: Option<f64>, lost: &[&str]) -> MethodResult {
        MethodResult {
            method: m,
            error: None,
            context: String::new(),
            tokens_out: 10,
            compression: 5.0,
            probes: found
                .iter()
                .enumerate()
                .map(|(i, &f)| ProbeHit {
                    id: format!("p{i}"),
                    slot: "progress".into(),
                    found: f,
                    in_slot: None,
                })
                .collect(),
            probe_rate: Some(found.iter().filter(|&&f| f).count() as f64 / found.len() as f64),
            in_slot_rate: None,
            qa: Vec::new(),
            qa_score: qa,
            qa_delta: qa.map(|q| 1.0 - q),
            next_step_r: None,
            next_step_agree: None,
            assertions: 0,
            unsourced: Vec::new(),
            adequacy: Vec::new(),
            adequacy_mean: None,
            lost: lost
                .iter()
                .map(|id| LostProbe {
                    id: id.to_string(),
                    slot: "progress".into(),
                    reason: "rejected".into(),
                    line_slot: None,
                })
                .collect(),
            trace: None,
            wall_ms: 1000.0,
        }
    }

    #[test]
    fn summaries_pair_sessions_and_attribute_losses() {
        let spec = EvalMethod::Engine(Method::Speculative);
        let seq = EvalMethod::Engine(Method::Sequential);
        let session = |i: usize, a: &[bool], b: &[bool]| SessionResult {
            id: format!("s{i}"),
            source: String::new(),
            kind: String::new(),
            messages: 3,
            cut: false,
            tokens_in: 50,
            presence_probes: a.len(),
            qa_probes: 0,
            qa_full: Some(1.0),
            methods: vec![
                result(
                    spec,
                    a,
                    Some(0.5),
                    &a.iter()
                        .enumerate()
                        .filter(|(_, f)| !**f)
                        .map(|(i, _)| ["p0", "p1"][i])
                        .collect::<Vec<_>>(),
                ),
                result(seq, b, Some(0.75), &[]),
            ],
        };
        let sessions = vec![
            session(0, &[true, false], &[true, true]),
            session(1, &[true, true], &[true, true]),
        ];
        let prov = Provenance {
            command: "eval".into(),
            data: "d".into(),
            data_sha256: "x".into(),
            selection: "all".into(),
            drafter: "a".into(),
            target: "b".into(),
            compaction_config: String::new(),
            eval_config: String::new(),
            tail_budget: "matched".into(),
            revision: "r".into(),
            runtime: "cpu".into(),
        };
        let r = Report::new(prov, vec![spec, seq], sessions, Vec::new(), 500, 3);
        let s = &r.summary[0];
        assert_eq!(s.probes_pooled, (3, 4));
        assert!((s.probes.unwrap().mean - 0.75).abs() < 1e-12);
        let d = r.speculative_vs_sequential[0].diff.unwrap();
        assert_eq!(d.n, 2);
        assert!((d.mean + 25.0).abs() < 1e-9, "{d:?}");
        // Must fail the 3-point gate, and say so.
        let md = r.markdown();
        assert!(
            md.contains("| probe preservation | 2 | -25.0 |") && md.contains("| no |"),
            "{md}"
        );
        let qa = r.speculative_vs_sequential[2].diff.unwrap();
        assert!((qa.mean + 25.0).abs() < 1e-9);
        assert_eq!(r.losses.len(), 1);
        assert_eq!((r.losses[0].count, r.losses[0].found_by_sequential), (1, 1));
        let plots = r.plots();
        assert!(
            plots[0].1.starts_with("<svg")
                && plots[0].1.contains("speculative")
                && plots[0].1.contains("75.0")
        );
    }
}
