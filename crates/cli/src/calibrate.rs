//! `speccompact calibrate`: builds the labelled line set (true lines from probes and
//! target-written summaries, each with a corrupted twin), scores it with every judgment
//! variant in one verification forward per session, and writes the markdown table, the
//! scored lines, and the target's entry of the calibration file (best variant by AUC, its η
//! and line rule). The measures themselves live in `speccompact_eval::calibrate`.

use crate::files::{read_text, write_atomic};
use crate::load::{compactor_with, counting_bar};
use crate::settings::RuntimeArgs;
use anyhow::{bail, Result};
use speccompact_engine::calibration::{
    builtin_variants, parse_variants, Calibrations, Entry, Variant,
};
use speccompact_engine::verify::LineScores;
use speccompact_engine::{CompactionConfig, Compactor, Method};
use speccompact_eval::bench::BenchReport;
use speccompact_eval::calibrate::line_rule::{calibrate_rule, RuleReport};
use speccompact_eval::calibrate::{
    auc, choose_eta, line_set, rates, score_lines, summary_lines, Labelled, SessionSource,
};
use speccompact_eval::EvalSession;
use speccompact_store::Store;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Flags of `calibrate`.
#[derive(clap::Args)]
pub struct Args {
    /// Target model: store name or path.
    #[arg(long)]
    pub target: String,
    /// Session files (JSONL with `messages` and `probes`); the shortest tool-use/coding
    /// sessions are taken, file by file.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["../shared/evaldata/dev/sessions.jsonl".to_string()])]
    pub data: Vec<String>,
    /// Bench JSON reports whose `sequential` runs give target-written summary lines.
    #[arg(long, value_delimiter = ',')]
    pub summaries: Vec<PathBuf>,
    /// Sessions in the set.
    #[arg(long, default_value_t = 12)]
    pub sessions: usize,
    /// Most true lines per session (each gets one corrupted twin).
    #[arg(long, default_value_t = 12)]
    pub per_session: usize,
    /// Judgment variants file (default configs/judge-variants.toml, built in).
    #[arg(long)]
    pub variants: Option<PathBuf>,
    /// Only these variants (by name).
    #[arg(long, value_delimiter = ',')]
    pub variant: Vec<String>,
    /// Calibration file to update with this target's entry.
    #[arg(long, default_value = "configs/calibration.toml")]
    pub out: PathBuf,
    /// Also write the markdown table here.
    #[arg(long)]
    pub table: Option<PathBuf>,
    /// Also write every line with its scores here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs `calibrate`.
pub fn run(a: &Args, rt: &RuntimeArgs, store: &Store) -> Result<()> {
    let variants = variants(a.variants.as_deref(), &a.variant)?;
    let picked = pick_sessions(&a.data, a.sessions)?;
    // The target judges its own lines: it is the drafter too, uncalibrated.
    let cfg = CompactionConfig {
        target: a.target.clone(),
        drafter: a.target.clone(),
        calibrated: false,
        ..CompactionConfig::default()
    };
    let written = target_summaries(&cfg, &a.summaries)?;
    let c = compactor_with(cfg, &rt.settings()?, store)?;
    let sources = sources(&c, &picked, &written)?;
    let set = line_set(&sources, a.per_session);
    for s in &sources {
        let n = set
            .iter()
            .filter(|l| l.session == s.id && l.positive())
            .count();
        eprintln!(
            "{}: {n} true lines ({} summary lines offered)",
            s.id,
            s.summary.len()
        );
    }
    let n_pos = set.iter().filter(|l| l.positive()).count();
    eprintln!(
        "{} lines ({} true, {} false) from {} sessions; {} variants",
        set.len(),
        n_pos,
        set.len() - n_pos,
        sources.len(),
        variants.len()
    );
    let t0 = Instant::now();
    let scores = score_all(&c, &picked, &set, &variants)?;
    let secs = t0.elapsed().as_secs_f64();
    let mut md = String::new();
    writeln!(
        md,
        "Target `{}`: {} lines ({} true, {} false) from {} sessions, {:.0} s.\n",
        a.target,
        set.len(),
        n_pos,
        set.len() - n_pos,
        sources.len(),
        secs
    )?;
    let (mut best, per_variant) = variant_table(&mut md, &set, &scores, &variants, sources.len())?;
    let rule_report = match &mut best {
        Some(e) => Some(line_rule(&mut md, e, &set, &scores, &variants, &sources)?),
        None => None,
    };
    print!("{md}");
    if let Some(p) = &a.table {
        write_atomic(p, &md)?;
    }
    if let Some(p) = &a.json {
        let lines: Vec<serde_json::Value> = set
            .iter()
            .zip(&scores)
            .map(|(l, s)| {
                let by_variant: BTreeMap<_, _> = variants
                    .iter()
                    .map(|v| v.name.clone())
                    .zip(s.iter().copied())
                    .collect();
                serde_json::json!({"line": l, "scores": by_variant})
            })
            .collect();
        let report = serde_json::json!({"target": a.target, "variants": per_variant, "line_rule": rule_report, "seconds": secs, "lines": lines});
        write_atomic(p, &serde_json::to_string_pretty(&report)?)?;
    }
    if let Some(e) = best {
        let mut cal = Calibrations::load(&a.out)?;
        cal.models.insert(a.target.clone(), e);
        write_atomic(&a.out, &cal.to_toml()?)?;
        eprintln!("wrote {}", a.out.display());
    }
    Ok(())
}

/// The judgment variants: the file's (else the built-in ones), only those named when any
/// are.
fn variants(file: Option<&Path>, only: &[String]) -> Result<Vec<Variant>> {
    let mut variants = match file {
        Some(p) => parse_variants(&read_text(p)?, &p.display().to_string())?,
        None => builtin_variants()?,
    };
    if !only.is_empty() {
        variants.retain(|v| only.contains(&v.name));
        if variants.is_empty() {
            bail!("no judgment variant named {}", only.join(", "));
        }
    }
    Ok(variants)
}

/// The `n` shortest tool-use / coding sessions, file by file (each id once).
fn pick_sessions(data: &[String], n: usize) -> Result<Vec<EvalSession>> {
    let mut picked: Vec<EvalSession> = Vec::new();
    for f in data {
        let mut all = speccompact_eval::load_sessions(Path::new(f))?;
        all.retain(|s| {
            matches!(s.kind.as_str(), "tool-use" | "coding") && !picked.iter().any(|p| p.id == s.id)
        });
        all.sort_by_key(|s| s.chars);
        for s in all {
            if picked.len() < n {
                picked.push(s);
            }
        }
    }
    Ok(picked)
}

/// Target-written summary lines per session: the `sequential` runs of bench reports.
fn target_summaries(
    cfg: &CompactionConfig,
    reports: &[PathBuf],
) -> Result<HashMap<String, Vec<(String, String)>>> {
    let mut written: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for p in reports {
        let report: BenchReport = serde_json::from_str(&read_text(p)?)
            .map_err(|e| anyhow::anyhow!("{} is not a bench JSON report: {e}", p.display()))?;
        for r in report.runs {
            if r.method == Method::Sequential {
                written
                    .entry(r.session)
                    .or_default()
                    .extend(summary_lines(cfg, &r.markdown));
            }
        }
    }
    Ok(written)
}

/// Each picked session's transcript, probes (file and identifier facts, by slot) and
/// target-written summary lines.
fn sources(
    c: &Compactor,
    picked: &[EvalSession],
    written: &HashMap<String, Vec<(String, String)>>,
) -> Result<Vec<SessionSource>> {
    let mut sources = Vec::new();
    for es in picked {
        let (transcript, _) = c.transcript(&es.history, Method::Sequential)?;
        let probes = es
            .presence_probes()
            .flat_map(|p| {
                let slot = if p.slot == "any" {
                    "critical_context"
                } else {
                    p.slot.as_str()
                };
                p.expect_any
                    .iter()
                    .map(move |x| (x.clone(), slot.to_string()))
            })
            .collect();
        sources.push(SessionSource {
            summary: written.get(&es.id).cloned().unwrap_or_default(),
            id: es.id.clone(),
            transcript,
            probes,
        });
    }
    Ok(sources)
}

/// Scores every line of `set` under every variant, session by session (one verification
/// forward per session); `scores[line][variant]`.
fn score_all(
    c: &Compactor,
    picked: &[EvalSession],
    set: &[Labelled],
    variants: &[Variant],
) -> Result<Vec<Vec<LineScores>>> {
    let bar = counting_bar(
        picked.len(),
        "{msg} [{bar:40}] {pos}/{len} sessions ({elapsed})",
    );
    let mut scores: Vec<Vec<LineScores>> = vec![Vec::new(); set.len()];
    for es in picked {
        bar.set_message(es.id.clone());
        let idx: Vec<usize> = (0..set.len())
            .filter(|&i| set[i].session == es.id)
            .collect();
        let lines: Vec<&Labelled> = idx.iter().map(|&i| &set[i]).collect();
        if !lines.is_empty() {
            let r = score_lines(c, &es.history, &lines, variants)?;
            for (k, i) in idx.iter().enumerate() {
                scores[*i] = r[k].clone();
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(scores)
}

/// The r of each line under variant `vi`, true lines then false lines.
fn ratios(set: &[Labelled], scores: &[Vec<LineScores>], vi: usize) -> (Vec<f32>, Vec<f32>) {
    let of = |positive: bool| {
        set.iter()
            .zip(scores)
            .filter(|(l, _)| l.positive() == positive)
            .map(|(_, s)| s[vi].r)
            .collect()
    };
    (of(true), of(false))
}

/// One table row per variant (AUC, chosen η and its rates, rates at η 0.7, mean r); returns
/// the entry of the variant with the highest AUC, and every variant's measures for the JSON.
fn variant_table(
    md: &mut String,
    set: &[Labelled],
    scores: &[Vec<LineScores>],
    variants: &[Variant],
    sessions: usize,
) -> Result<(Option<Entry>, Vec<serde_json::Value>)> {
    writeln!(md, "| variant | AUC | chosen eta | accept (true) | false-accept | at eta 0.7: accept / false-accept | mean r true / false | rule |")?;
    writeln!(md, "|---|---|---|---|---|---|---|---|")?;
    let mut best: Option<(f64, Entry)> = None;
    let mut per_variant = Vec::new();
    for (vi, v) in variants.iter().enumerate() {
        let (pos, neg) = ratios(set, scores, vi);
        let a = auc(&pos, &neg);
        let (r, rule) = choose_eta(&pos, &neg);
        let at7 = rates(&pos, &neg, 0.7);
        let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len().max(1) as f32;
        writeln!(md, "| {} | {a:.3} | {:.2} | {:.0} % | {:.0} % | {:.0} % / {:.0} % | {:.2} / {:.2} | {rule} |", v.name, r.eta, 100.0 * r.accept, 100.0 * r.false_accept, 100.0 * at7.accept, 100.0 * at7.false_accept, mean(&pos), mean(&neg))?;
        let e = Entry {
            eta: (r.eta as f64 * 100.0).round() / 100.0,
            variant: v.name.clone(),
            auc: (a * 1000.0).round() / 1000.0,
            accept_rate: (r.accept * 1000.0).round() / 1000.0,
            false_accept_rate: (r.false_accept * 1000.0).round() / 1000.0,
            lines: set.len(),
            sessions,
            rule,
            line_rule: None,
            line_rule_auc: None,
            line_rule_accept: None,
            line_rule_false_accept: None,
        };
        per_variant
            .push(serde_json::json!({"variant": v.name, "auc": a, "chosen": r, "at_0_7": at7}));
        if best.as_ref().is_none_or(|(b, _)| a > *b) {
            best = Some((a, e));
        }
    }
    Ok((best.map(|(_, e)| e), per_variant))
}

/// The line rule over the verification scores of the chosen variant, written into its
/// entry, and the mean r by line kind; appends both and the choice to `md`.
fn line_rule(
    md: &mut String,
    e: &mut Entry,
    set: &[Labelled],
    scores: &[Vec<LineScores>],
    variants: &[Variant],
    sources: &[SessionSource],
) -> Result<RuleReport> {
    let vi = variants
        .iter()
        .position(|v| v.name == e.variant)
        .unwrap_or(0);
    let mut kinds: BTreeMap<&str, (f32, usize)> = BTreeMap::new();
    for (l, s) in set.iter().zip(scores) {
        let k = kinds.entry(l.kind.as_str()).or_default();
        k.0 += s[vi].r;
        k.1 += 1;
    }
    let line_scores: Vec<_> = scores.iter().map(|s| s[vi]).collect();
    let labels: Vec<bool> = set.iter().map(|l| l.positive()).collect();
    let session: Vec<usize> = set
        .iter()
        .map(|l| sources.iter().position(|s| s.id == l.session).unwrap_or(0))
        .collect();
    let rep = calibrate_rule(&line_scores, &labels, &session, 5);
    writeln!(
        md,
        "\nLine rule over the verification scores of variant `{}`:\n\n{}",
        e.variant,
        rep.markdown()
    )?;
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    e.line_rule = Some(rep.rule.clone());
    e.line_rule_auc = Some(round(rep.candidates[rep.chosen].held_out_auc));
    e.line_rule_accept = Some(round(rep.rates.accept));
    e.line_rule_false_accept = Some(round(rep.rates.false_accept));
    writeln!(
        md,
        "\nMean r by line kind, variant `{}`: {}.",
        e.variant,
        kinds
            .iter()
            .map(|(k, (s, n))| format!("{k} {:.2} (n={n})", s / *n as f32))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    writeln!(
        md,
        "Chosen: variant `{}` (highest AUC), eta {:.2}.",
        e.variant, e.eta
    )?;
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use speccompact_eval::bench::BenchRun;

    fn run(session: &str, method: Method, markdown: &str) -> BenchRun {
        BenchRun {
            session: session.into(),
            method,
            variant: String::new(),
            trace: Default::default(),
            lines: 1,
            markdown: markdown.into(),
            speedup_cold: None,
            speedup_warm: None,
        }
    }

    /// What `bench --json` writes reads back as the same report.
    #[test]
    fn bench_reports_read_back_through_their_runs() {
        let report = BenchReport {
            runs: vec![
                run("a", Method::Speculative, "## Goal\n- spec\n"),
                run("a", Method::Sequential, "## Goal\n- seq\n"),
                run("b", Method::TargetSelf, ""),
            ],
            summary: vec![],
        };
        let text = serde_json::to_string_pretty(&report).unwrap();
        let back: BenchReport = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string_pretty(&back).unwrap(), text);
        let got: Vec<_> = back
            .runs
            .iter()
            .map(|r| (r.session.as_str(), r.method, r.markdown.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", Method::Speculative, "## Goal\n- spec\n"),
                ("a", Method::Sequential, "## Goal\n- seq\n"),
                ("b", Method::TargetSelf, ""),
            ]
        );
    }

    /// The committed reports (older traces without today's fields) still read.
    #[test]
    fn committed_bench_reports_read() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/results");
        for name in [
            "compaction-smollm2-qwen0.5b.json",
            "compaction-smollm2-qwen1.5b.json",
        ] {
            let p = dir.join(name);
            let r: BenchReport = serde_json::from_str(&read_text(&p).unwrap()).unwrap();
            assert!(
                r.runs.iter().any(|r| r.method == Method::Sequential),
                "{name}"
            );
        }
    }
}
