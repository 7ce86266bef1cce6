//! Scripted tests of line verification: the scores a verification carries, the calibrated
//! rule and its boundary, the target's own line, and repair from the first divergence.

use speccompact_engine::backend::LineToken;
use speccompact_engine::scripted::{word_tokens, Scripted};
use speccompact_engine::verify::{LineRule, Verify};
use speccompact_engine::{CompactionConfig, Compactor, Method, Origin, RequestKind};
use speccompact_history::{parse_value, History};
use std::sync::Arc;

fn history() -> History {
    parse_value(&serde_json::json!([
        {"role": "user", "content": "Keep the retry limit at 3; fix the off-by-one in upload.py."},
        {"role": "assistant", "content": "Changed attempt <= MAX_RETRIES to attempt < MAX_RETRIES."}
    ]))
    .unwrap()
}

/// Goal slot only, no calibration file, the given rule.
fn config(rule: Option<LineRule>) -> CompactionConfig {
    let mut c = CompactionConfig::default();
    c.slots.truncate(1);
    c.calibrated = false;
    c.line_rule = rule;
    c
}

/// The accepted lines in a request: the text after the slot's heading line.
fn accepted_in(prompt: &str) -> Vec<String> {
    let body = prompt.split_once("## Goal\n").map_or("", |(_, b)| b);
    body.lines().map(str::to_string).collect()
}

/// Token ratings of a line: word tokens, the ranks given (0 when the list runs out).
fn rated(line: &str, ranks: &[u32]) -> Vec<LineToken> {
    word_tokens(line)
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            let rank = ranks.get(i).copied().unwrap_or(0);
            LineToken {
                text: w.to_string(),
                logprob: if rank == 0 { -0.2 } else { -3.0 },
                rank,
            }
        })
        .collect()
}

/// The rule: accept iff greedy_fraction >= 0.75 (weights only on it; p = 0.5 at 0.75).
fn greedy_rule() -> LineRule {
    LineRule::from_weights([0.0, 0.0, 0.0, 40.0], -30.0, 0.5)
}

fn run(
    cfg: CompactionConfig,
    d: Scripted,
    t: Scripted,
) -> (speccompact_engine::Compaction, Arc<Scripted>) {
    let (d, t) = (Arc::new(d), Arc::new(t));
    let c = Compactor::new(d, t.clone(), cfg).unwrap();
    let out = c
        .compact_blocking(&history(), Method::Speculative, &mut |_| {})
        .unwrap();
    (out, t)
}

fn texts(c: &speccompact_engine::Compaction) -> Vec<String> {
    c.slots[0].lines.iter().map(|l| l.text.clone()).collect()
}

#[test]
fn the_calibrated_rule_decides_at_its_boundary_with_scores_in_the_trace() {
    // Line one: 3 of 4 tokens greedy (0.75, exactly the boundary) -> accepted.
    // Line two: 2 of 4 greedy -> rejected and repaired (no divergence kept: rank 1 tokens
    // diverge at token 1, so the repair keeps "- ").
    let d = Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
        0 => "- fix upload.py off-by-one\n- keep retry limit\n".into(),
        _ => String::new(),
    });
    let t = Scripted::new("t")
        .with_judge(|_, _| vec![("Yes".into(), 0.9), ("No".into(), 0.1)])
        .with_line_scores(|_, line| {
            if line.starts_with("- fix") {
                rated(line, &[0, 0, 4, 0])
            } else {
                rated(line, &[0, 2, 0, 5])
            }
        })
        .with_generate(|_, p| {
            if p.ends_with("- ") {
                "keep the retry limit at 3\n".into()
            } else {
                String::new()
            }
        });
    let (out, t) = run(config(Some(greedy_rule())), d, t);
    assert_eq!(
        texts(&out),
        ["- fix upload.py off-by-one", "- keep the retry limit at 3"]
    );
    assert_eq!(out.slots[0].lines[0].origin, Origin::Draft);
    assert_eq!(out.slots[0].lines[1].origin, Origin::Repair);
    let j = &out.trace.judgments;
    assert_eq!(j.len(), 2);
    assert!(j[0].accepted && !j[1].accepted);
    assert_eq!((j[0].by, j[1].by), ("rule", "rule"));
    assert_eq!(j[0].scores.greedy_fraction, 0.75);
    assert_eq!(j[0].scores.divergence, Some(2));
    assert_eq!(j[1].scores.divergence, Some(1));
    assert!((j[0].scores.mean_logprob - (-0.2 * 3.0 - 3.0) / 4.0).abs() < 1e-6);
    assert_eq!(j[0].scores.min_logprob, -3.0);
    let p0 = j[0].probability.unwrap();
    assert!((p0 - 0.5).abs() < 1e-9, "{p0}");
    assert!(j[1].probability.unwrap() < 0.5);
    assert_eq!(out.trace.repairs_from_divergence, 1);
    assert_eq!(out.trace.repair_kept_tokens, 1);
    // The verifications were verification requests naming the line segment.
    assert!(t
        .calls()
        .iter()
        .any(|c| matches!(c.kind, RequestKind::Verify { .. })));
}

#[test]
fn the_targets_own_line_is_kept_whatever_the_rule_says() {
    // A rule that accepts nothing; every token of the drafted line is the target's greedy
    // token, so it is the target's line.
    let never = LineRule::from_weights([0.0; 4], -100.0, 0.5);
    let d = Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
        0 => "- fix upload.py\n".into(),
        _ => String::new(),
    });
    let t = Scripted::new("t").with_line_scores(|_, line| rated(line, &[]));
    let (out, _) = run(config(Some(never.clone())), d, t);
    assert_eq!(texts(&out), ["- fix upload.py"]);
    assert_eq!(out.trace.judgments[0].by, "own-line");

    // One token off and the same rule rejects.
    let d = Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
        0 => "- fix upload.py\n".into(),
        _ => String::new(),
    });
    let t = Scripted::new("t").with_line_scores(|_, line| rated(line, &[0, 0, 1]));
    let (out, _) = run(config(Some(never)), d, t);
    assert!(!out.trace.judgments[0].accepted);
    assert_eq!(out.trace.judgments[0].by, "rule");
}

#[test]
fn a_rejected_line_is_repaired_from_its_first_divergence_reusing_the_verified_prompt() {
    // "- The limit is 2" diverges at "is" (token 3): the repair's prompt is the
    // verification's up to "- The limit ", and the kept part plus the continuation is the line.
    let d = Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
        0 => "- The limit is 2\n".into(),
        _ => String::new(),
    });
    let t = Scripted::new("t")
        .with_judge(|_, _| vec![("No".into(), 0.9), ("Yes".into(), 0.1)])
        .with_line_scores(|_, line| rated(line, &[0, 0, 0, 7, 9]))
        .with_generate(|_, p| {
            // Word tokens carry their trailing space: the kept part is "- The limit ".
            if p.ends_with("- The limit ") {
                "stays at 3\n".into()
            } else {
                String::new()
            }
        });
    let (out, t) = run(config(None), d, t);
    assert_eq!(texts(&out), ["- The limit stays at 3"]);
    assert_eq!(out.slots[0].lines[0].origin, Origin::Repair);
    assert_eq!(out.trace.judgments[0].by, "ratio");
    assert_eq!(out.trace.repairs_from_divergence, 1);
    assert_eq!(out.trace.repair_kept_tokens, 3);
    let calls = t.calls();
    let verify = calls
        .iter()
        .find(|c| matches!(c.kind, RequestKind::Verify { .. }))
        .unwrap();
    let repair = calls
        .iter()
        .find(|c| {
            matches!(c.kind, RequestKind::Generate { .. }) && c.prompt.ends_with("- The limit ")
        })
        .unwrap();
    // The repair's prompt is a prefix of the verification's: its cache is reused up to the
    // divergence.
    assert!(
        verify.prompt.starts_with(&repair.prompt),
        "{verify:?} / {repair:?}"
    );
    assert_eq!(repair.stream, verify.stream);
}

#[test]
fn the_ratio_mode_ignores_a_calibrated_rule() {
    let d = Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
        0 => "- fix upload.py\n".into(),
        _ => String::new(),
    });
    // The rule would reject (no greedy tokens); r = 0.9 >= eta accepts under the ratio rule.
    let t = Scripted::new("t")
        .with_judge(|_, _| vec![("Yes".into(), 0.9), ("No".into(), 0.1)])
        .with_line_scores(|_, line| rated(line, &[3, 3, 3]));
    let mut cfg = config(Some(greedy_rule()));
    cfg.verify = Verify::Ratio;
    let (out, _) = run(cfg, d, t);
    assert_eq!(texts(&out), ["- fix upload.py"]);
    assert_eq!(out.trace.judgments[0].by, "ratio");
    assert!(out.trace.judgments[0].probability.is_none());
}

#[test]
fn the_exact_mode_equals_target_self_and_keeps_agreeing_draft_words() {
    // The target's own body; the drafter agrees on the first line and not on the second.
    let body = "- fix upload.py off-by-one\n- keep retry limit at 3\n";
    let mk = || {
        // The drafter continues its own version of the body from where the body is.
        let d = Scripted::new("d").with_generate(|_, p| {
            let mine = "- fix upload.py off-by-one\n- change retry limit at 3\n";
            let body = p.split_once("## Goal\n").map_or("", |(_, b)| b);
            mine.strip_prefix(body).unwrap_or("").to_string()
        });
        let t = Scripted::new("t").with_generate(move |_, _| body.to_string());
        (d, t)
    };
    let (d, t) = mk();
    let c = Compactor::new(d, t, config(None)).unwrap();
    let want = c
        .compact_blocking(&history(), Method::TargetSelf, &mut |_| {})
        .unwrap();
    let mut cfg = config(None);
    cfg.verify = Verify::Exact;
    let (d, t) = mk();
    let (out, t) = run(cfg, d, t);
    assert_eq!(out.markdown, want.markdown);
    assert_eq!(
        texts(&out),
        ["- fix upload.py off-by-one", "- keep retry limit at 3"]
    );
    // The target takes "- " first; drafted words that agree with its body are kept;
    // "change" is replaced by "keep".
    assert!(out.trace.spec_tokens_kept >= 2, "{:?}", out.trace);
    assert!(out.trace.spec_tokens_kept < out.trace.spec_tokens_drafted);
    assert!(t
        .calls()
        .iter()
        .all(|c| matches!(c.kind, RequestKind::Speculate { .. })));
}
