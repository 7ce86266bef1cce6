//! The speculative algorithm and the baselines on scripted backends: the test chooses every
//! generated text and every next-token distribution, and counts the calls.

use speccompact_engine::scripted::Scripted;
use speccompact_engine::{
    CompactionConfig, Compactor, Error, Event, Method, Origin, RequestKind, SlotStop,
};
use speccompact_history::{parse_value, History};
use std::sync::{Arc, Mutex};

fn history() -> History {
    parse_value(&serde_json::json!([
        {"role": "user", "content": "Fix the failing test in src/parser.rs; never touch main."},
        {"role": "assistant", "content": "Running cargo test."},
        {"role": "tool", "name": "bash", "content": "exit 1: test parse_header failed"}
    ]))
    .unwrap()
}

/// Config with one slot only (the others are removed) unless `all` is set.
fn config(eta: f32) -> CompactionConfig {
    let mut c = CompactionConfig::default();
    c.eta = eta;
    c
}

fn one_slot(mut c: CompactionConfig) -> CompactionConfig {
    c.slots.truncate(1);
    c
}

/// The accepted lines in a request: the text after the slot's heading line.
fn accepted_in(prompt: &str) -> Vec<String> {
    let body = prompt.split_once("## Goal\n").map_or("", |(_, b)| b);
    body.lines().map(str::to_string).collect()
}

fn yes(p: f32) -> Vec<(String, f32)> {
    vec![("Yes".into(), p), ("No".into(), 1.0 - p)]
}

struct Run {
    out: speccompact_engine::Compaction,
    drafter: Arc<Scripted>,
    target: Arc<Scripted>,
    events: Vec<Event>,
}

fn run(cfg: CompactionConfig, drafter: Scripted, target: Scripted, method: Method) -> Run {
    let (d, t) = (Arc::new(drafter), Arc::new(target));
    let c = Compactor::new(d.clone(), t.clone(), cfg).unwrap();
    let mut events = Vec::new();
    let out = c
        .compact_blocking(&history(), method, &mut |e| events.push(e.clone()))
        .unwrap();
    Run {
        out,
        drafter: d,
        target: t,
        events,
    }
}

fn judge_calls(b: &Scripted) -> usize {
    b.judge_calls()
}

fn slot_texts(r: &Run, slot: usize) -> Vec<String> {
    r.out.slots[slot]
        .lines
        .iter()
        .map(|l| l.text.clone())
        .collect()
}

#[test]
fn r_equal_to_eta_accepts_and_just_above_rejects() {
    // Binary fractions make r exact: 0.75 / (0.75 + 0.25) = 0.75.
    let drafter = || {
        Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
            0 => "- fix parse_header\n".into(),
            _ => String::new(),
        })
    };
    let judge = || {
        Scripted::new("t")
            .with_judge(|_, _| yes(0.75))
            .with_generate(|_, _| "- repaired\n".into())
    };
    let r = run(
        one_slot(config(0.75)),
        drafter(),
        judge(),
        Method::Speculative,
    );
    assert_eq!(slot_texts(&r, 0), ["- fix parse_header"]);
    assert_eq!(r.out.slots[0].lines[0].origin, Origin::Draft);
    assert_eq!(r.out.slots[0].lines[0].r, Some(0.75));

    let r = run(
        one_slot(config(0.7500001)),
        drafter(),
        judge(),
        Method::Speculative,
    );
    assert_eq!(slot_texts(&r, 0)[0], "- repaired");
    assert_eq!(r.out.slots[0].lines[0].origin, Origin::Repair);
    assert_eq!(r.out.trace.lines_rejected, 1);
}

#[test]
fn label_variants_and_the_missing_label_rule_decide_acceptance() {
    let drafter = || {
        Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
            0 => "- a fact\n".into(),
            _ => String::new(),
        })
    };
    let target = |top: Vec<(&'static str, f32)>| {
        Scripted::new("t")
            .with_judge(move |_, _| top.iter().map(|(t, p)| (t.to_string(), *p)).collect())
            .with_generate(|_, _| "- repaired\n".into())
    };
    // " yes" is a variant of the positive label; its best variant counts (0.6, not 0.1).
    let r = run(
        one_slot(config(0.7)),
        drafter(),
        target(vec![(" yes", 0.6), ("NO", 0.2), ("Yes", 0.1)]),
        Method::Speculative,
    );
    assert_eq!(r.out.slots[0].lines[0].origin, Origin::Draft);
    assert!((r.out.slots[0].lines[0].r.unwrap() - 0.75).abs() < 1e-6);
    // No negative variant in the top-k: p_no = min(1 - 0.9, 0.3) = 0.1 -> r = 0.6/0.7 < 0.9.
    let r = run(
        one_slot(config(0.9)),
        drafter(),
        target(vec![("Yes", 0.6), ("Sure", 0.3)]),
        Method::Speculative,
    );
    assert_eq!(r.out.slots[0].lines[0].origin, Origin::Repair);
    let rejected: Vec<f32> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::LineRejected { r, .. } => *r,
            _ => None,
        })
        .collect();
    assert_eq!(rejected.len(), 1);
    assert!((rejected[0] - 0.6 / 0.7).abs() < 1e-5, "{rejected:?}");
    // The same top-k at eta 0.85 accepts (0.857 >= 0.85).
    let r = run(
        one_slot(config(0.85)),
        drafter(),
        target(vec![("Yes", 0.6), ("Sure", 0.3)]),
        Method::Speculative,
    );
    assert_eq!(r.out.slots[0].lines[0].origin, Origin::Draft);
    // An unlisted spelling ("yeah") is not a positive variant: p_yes is the missing-label
    // estimate min(0.05, 0.05), so r = 0.5.
    let r = run(
        one_slot(config(0.6)),
        drafter(),
        target(vec![("yeah", 0.9), ("No", 0.05)]),
        Method::Speculative,
    );
    assert_eq!(r.out.slots[0].lines[0].origin, Origin::Repair);
}

#[test]
fn buffered_lines_are_used_without_new_drafter_calls() {
    let drafter = Scripted::new("d").with_generate(|_, p| {
        if accepted_in(p).is_empty() {
            "- one\n- two\n- three\n".into()
        } else {
            String::new()
        }
    });
    let target = Scripted::new("t").with_judge(|_, _| yes(0.9));
    let r = run(one_slot(config(0.7)), drafter, target, Method::Speculative);
    assert_eq!(slot_texts(&r, 0), ["- one", "- two", "- three"]);
    // One drafter call produced all three lines and the end of the section.
    assert_eq!(r.drafter.generate_calls(), 1);
    assert_eq!(judge_calls(&r.target), 3);
    assert_eq!(r.target.generate_calls(), 0);
    assert_eq!(r.out.slots[0].stop, SlotStop::Complete);
    // Each judgment saw the lines accepted before it and the proposed one.
    let judged: Vec<String> = r
        .target
        .calls()
        .into_iter()
        .filter(|c| {
            matches!(
                c.kind,
                RequestKind::Judge { .. } | RequestKind::Verify { .. }
            )
        })
        .map(|c| c.prompt)
        .collect();
    assert!(
        judged[2].contains("- one\n- two\n- three\n"),
        "{}",
        judged[2]
    );
    let t = &r.out.trace;
    assert_eq!((t.drafter_calls, t.verify_calls, t.repair_calls), (1, 3, 0));
}

#[test]
fn a_repair_empties_the_buffer() {
    let drafter = Scripted::new("d").with_generate(|_, p| {
        let a = accepted_in(p);
        match a.len() {
            0 => "- one\n- bad\n- three\n".into(),
            // After the repair: a fresh draft from the new accepted prefix.
            2 => "- four\n".into(),
            _ => String::new(),
        }
    });
    let target = Scripted::new("t")
        .with_judge(|_, p| {
            if p.contains("- bad\n") {
                yes(0.1)
            } else {
                yes(0.9)
            }
        })
        .with_generate(|_, _| "- fixed\nmore text".into());
    let r = run(one_slot(config(0.7)), drafter, target, Method::Speculative);
    // "- three" was buffered after "- bad"; it was dropped with the buffer, never judged.
    assert_eq!(slot_texts(&r, 0), ["- one", "- fixed", "- four"]);
    let origins: Vec<Origin> = r.out.slots[0].lines.iter().map(|l| l.origin).collect();
    assert_eq!(origins, [Origin::Draft, Origin::Repair, Origin::Draft]);
    assert!(r
        .target
        .calls()
        .iter()
        .all(|c| !c.prompt.contains("- three")));
    // Two drafter calls: the first, and one after the repair (whose text ends the section).
    assert_eq!(r.drafter.generate_calls(), 2);
    // The repair saw A but not the rejected line, and stopped at its first newline.
    let repair = r
        .target
        .calls()
        .into_iter()
        .find(|c| matches!(c.kind, RequestKind::Generate { .. }))
        .unwrap();
    assert!(
        repair.prompt.ends_with("## Goal\n- one\n"),
        "{}",
        repair.prompt
    );
    assert_eq!(
        repair.kind,
        RequestKind::Generate {
            max_tokens: 64,
            stop_at_newline: true
        }
    );
}

#[test]
fn duplicate_and_overlong_lines_go_to_repair_without_a_judgment() {
    let long = format!("- {}", "x".repeat(50));
    let drafter = Scripted::new("d").with_generate(move |_, p| match accepted_in(p).len() {
        0 => format!("- same\n- Same \n{long}\n"),
        _ => String::new(),
    });
    let repairs = Arc::new(Mutex::new(0));
    let n = repairs.clone();
    let target = Scripted::new("t")
        .with_judge(|_, _| yes(0.9))
        .with_generate(move |_, _| {
            let mut k = n.lock().unwrap();
            *k += 1;
            format!("- repair {k}\n")
        });
    let mut cfg = one_slot(config(0.7));
    cfg.max_line_chars = 40;
    let r = run(cfg, drafter, target, Method::Speculative);
    // "- Same " duplicates "- same" -> repair 1; the drafter is asked again from
    // [same, repair 1] and ends; so the long line is never seen (buffer emptied).
    assert_eq!(slot_texts(&r, 0), ["- same", "- repair 1"]);
    assert_eq!(judge_calls(&r.target), 1, "only `- same` is judged");
    assert_eq!(r.out.trace.lines_failed_checks, 1);

    // A long line first: straight to repair, no judgment at all.
    let long = format!("- {}", "y".repeat(50));
    let drafter = Scripted::new("d").with_generate(move |_, p| match accepted_in(p).len() {
        0 => format!("{long}\n"),
        _ => String::new(),
    });
    let target = Scripted::new("t")
        .with_judge(|_, _| yes(0.9))
        .with_generate(|_, _| "- short\n".into());
    let mut cfg = one_slot(config(0.7));
    cfg.max_line_chars = 40;
    let r = run(cfg, drafter, target, Method::Speculative);
    assert_eq!(slot_texts(&r, 0), ["- short"]);
    assert_eq!(judge_calls(&r.target), 0);
    assert_eq!(r.target.generate_calls(), 1);
}

#[test]
fn headings_and_empty_markers_are_accepted_without_judgment() {
    let drafter = Scripted::new("d").with_generate(|_, p| {
        let body = p.split_once("## Progress\n").map_or("", |(_, b)| b);
        match body.lines().count() {
            0 => "### Done\n- built it\n\n\n### Blocked\n(none)\n".into(),
            _ => String::new(),
        }
    });
    let target = Scripted::new("t").with_judge(|_, _| yes(0.9));
    let mut cfg = config(0.7);
    cfg.slots.retain(|s| s.name == "progress");
    let r = run(cfg, drafter, target, Method::Speculative);
    assert_eq!(
        slot_texts(&r, 0),
        ["### Done", "- built it", "", "### Blocked", "(none)"],
        "one blank line kept as formatting, the second dropped"
    );
    assert_eq!(judge_calls(&r.target), 1, "only `- built it` is judged");
    let auto = r.out.slots[0]
        .lines
        .iter()
        .filter(|l| l.origin == Origin::Auto)
        .count();
    assert_eq!(auto, 4);
}

#[test]
fn echoed_instructions_and_stray_headings_go_to_repair_without_judgment() {
    let cfg = one_slot(config(0.7));
    let contract = cfg.slots[0].contract.clone();
    let drafter = Scripted::new("d").with_generate(move |_, p| match accepted_in(p).len() {
        0 => format!("{contract}\n"),
        1 => "### Preferences\n".into(),
        _ => String::new(),
    });
    let n = Arc::new(Mutex::new(0));
    let k = n.clone();
    let target = Scripted::new("t")
        .with_judge(|_, _| yes(0.9))
        .with_generate(move |_, _| {
            let mut k = k.lock().unwrap();
            *k += 1;
            format!("- fact {k}\n")
        });
    let r = run(cfg, drafter, target, Method::Speculative);
    assert_eq!(slot_texts(&r, 0), ["- fact 1", "- fact 2"]);
    assert_eq!(judge_calls(&r.target), 0);
    assert_eq!(r.out.trace.lines_failed_checks, 2);
}

#[test]
fn line_and_token_caps_stop_a_slot() {
    let many = || {
        Scripted::new("d").with_generate(|_, p| {
            // More than one call's worth (64 tokens): the section never ends by itself.
            let k = accepted_in(p).len();
            (k..k + 30).map(|i| format!("- item {i}\n")).collect()
        })
    };
    let target = || Scripted::new("t").with_judge(|_, _| yes(0.9));
    let mut cfg = one_slot(config(0.7));
    cfg.slot_max_lines = 4;
    let r = run(cfg, many(), target(), Method::Speculative);
    assert_eq!(r.out.slots[0].lines.len(), 4);
    assert_eq!(r.out.slots[0].stop, SlotStop::MaxLines);

    // Each "- item N\n" is 3 word tokens; a budget of 10 holds 3 lines, not 4.
    let mut cfg = one_slot(config(0.7));
    cfg.slot_max_tokens = 10;
    let r = run(cfg, many(), target(), Method::Speculative);
    assert_eq!(r.out.slots[0].lines.len(), 3);
    assert_eq!(r.out.slots[0].tokens, 9);
    assert_eq!(r.out.slots[0].stop, SlotStop::TokenBudget);

    // The drafter's tokens per call are capped: a 10-word line with draft_tokens = 4 is cut
    // unfinished, so the target writes the line instead, without judging the fragment.
    let d = Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
        0 => "- a b c d e f g h i\n".into(),
        _ => String::new(),
    });
    let t = Scripted::new("t")
        .with_judge(|_, _| yes(0.9))
        .with_generate(|_, _| "- whole line\n".into());
    let mut cfg = one_slot(config(0.7));
    cfg.draft_tokens = 4;
    cfg.line_grace = 0;
    let r = run(cfg, d, t, Method::Speculative);
    assert_eq!(slot_texts(&r, 0), ["- whole line"]);
    assert_eq!(judge_calls(&r.target), 0);
    assert_eq!(r.out.trace.lines_failed_checks, 1);
    assert_eq!(r.out.trace.drafter_tokens, 4 + 1);
}

#[test]
fn a_draft_cut_by_its_budget_finishes_its_line_in_the_grace() {
    // The 10-word line runs past draft_tokens = 4; the grace lets the drafter finish it (and
    // only it), so it is judged whole instead of going to repair.
    let d = Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
        0 => "- a b c d e f g h i
- next line here
"
        .into(),
        _ => String::new(),
    });
    let t = Scripted::new("t")
        .with_judge(|_, _| yes(0.9))
        .with_generate(|_, _| {
            "- whole line
"
            .into()
        });
    let mut cfg = one_slot(config(0.7));
    cfg.draft_tokens = 4;
    cfg.line_grace = 16;
    let r = run(cfg, d, t, Method::Speculative);
    assert_eq!(slot_texts(&r, 0)[0], "- a b c d e f g h i");
    assert_eq!(r.out.trace.lines_failed_checks, 0);
    let first = &r.drafter.calls()[0];
    assert_eq!(
        first.kind,
        RequestKind::Generate {
            max_tokens: 4,
            stop_at_newline: false
        }
    );
    // The first call ended at the end of that line: 10 tokens, not the second line's.
    let out = r.out.trace.drafter_tokens;
    assert!(out >= 10, "{out}");
}

#[test]
fn empty_or_failed_repair_stops_the_slot_with_what_was_accepted() {
    // "- bad" is rejected; the repair writes `repair`.
    let run_with = |repair: &'static str| {
        let drafter = Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
            0 => "- good\n- bad\n".into(),
            _ => "- again\n".into(),
        });
        let target = Scripted::new("t")
            .with_judge(|_, p| {
                if p.contains("- bad\n") {
                    yes(0.2)
                } else {
                    yes(0.9)
                }
            })
            .with_generate(move |_, _| repair.into());
        run(one_slot(config(0.7)), drafter, target, Method::Speculative)
    };
    // An empty repair stops the slot with A.
    let r = run_with("\n");
    assert_eq!(slot_texts(&r, 0), ["- good"]);
    assert_eq!(r.out.slots[0].stop, SlotStop::RepairFailed);
    // So does a repair that duplicates an accepted line.
    let r = run_with("- good\n");
    assert_eq!(slot_texts(&r, 0), ["- good"]);
    assert_eq!(r.out.slots[0].stop, SlotStop::RepairFailed);
    assert_eq!(r.out.trace.lines_repaired, 0);
    // A usable repair is kept and the slot goes on.
    let r = run_with("- better\n");
    assert_eq!(slot_texts(&r, 0), ["- good", "- better", "- again"]);
}

#[test]
fn a_drafter_that_writes_nothing_hands_the_slot_to_the_target() {
    let drafter = Scripted::new("d");
    let target = Scripted::new("t").with_generate(|_, p| {
        if accepted_in(p).is_empty() {
            "- from target\n".into()
        } else {
            String::new()
        }
    });
    let r = run(one_slot(config(0.7)), drafter, target, Method::Speculative);
    assert_eq!(slot_texts(&r, 0), ["- from target"]);
    assert_eq!(r.out.slots[0].lines[0].origin, Origin::Repair);
}

#[test]
fn six_streams_are_batched_and_the_trace_adds_up() {
    // Each slot: two lines; the second of slots 1, 3 and 5 is rejected and repaired.
    let drafter = Scripted::new("d").with_generate(|s, p| {
        let body = p.rsplit_once("\n## ").map_or("", |(_, b)| b);
        let n = body.lines().count().saturating_sub(1);
        match n {
            0 => format!("- s{s} first\n- s{s} second\n"),
            _ => String::new(),
        }
    });
    let target = Scripted::new("t")
        .with_judge(|s, p| {
            if s % 2 == 1 && p.contains("second\n") {
                yes(0.3)
            } else {
                yes(0.95)
            }
        })
        .with_generate(|s, _| format!("- s{s} repaired\n"));
    let r = run(config(0.7), drafter, target, Method::Speculative);
    let t = &r.out.trace;
    assert_eq!(r.out.slots.len(), 6);
    let kept: usize = r.out.slots.iter().map(|s| s.lines.len()).sum();
    assert_eq!(kept, 12);
    assert_eq!(t.lines_proposed, 12);
    assert_eq!(t.lines_accepted, 9);
    assert_eq!(t.lines_rejected, 3);
    assert_eq!(t.lines_repaired, 3);
    assert_eq!(t.lines_accepted + t.lines_repaired, kept);
    assert_eq!(t.verify_calls, judge_calls(&r.target));
    assert_eq!(t.verify_calls, 12);
    assert_eq!(t.repair_calls, r.target.generate_calls());
    assert_eq!(t.drafter_calls, r.drafter.generate_calls());
    assert!((t.acceptance_rate - 0.75).abs() < 1e-9);
    // The trace keeps every judgment's r.
    assert_eq!(t.judgments.len(), 12);
    let rejected: Vec<_> = t.judgments.iter().filter(|j| !j.accepted).collect();
    assert_eq!(rejected.len(), 3);
    assert!(rejected
        .iter()
        .all(|j| (j.r - 0.3).abs() < 1e-6 && j.slot != "goal"));
    // Requests of different slots share batches: far fewer batches than requests.
    let batches = r.target.calls().iter().map(|c| c.batch).max().unwrap() + 1;
    assert!(
        batches <= 4,
        "{batches} target batches for {} requests",
        r.target.calls().len()
    );
    assert!(r
        .out
        .markdown
        .contains("## Next Steps\n- s4 first\n- s4 second\n"));
    for s in &r.out.slots {
        assert_eq!(s.stop, SlotStop::Complete, "{}", s.name);
    }
    // The shared prefix is opened once per model and holds every contract.
    assert_eq!(r.target.prefixes().len(), 1);
    assert_eq!(r.drafter.prefixes().len(), 1);
    for s in &CompactionConfig::default().slots {
        assert!(r.target.prefixes()[0].contains(&s.contract));
    }
}

#[test]
fn results_are_reproducible() {
    let make = || {
        (
            Scripted::new("d").with_generate(|s, p| match accepted_in(p).len() {
                0 => format!("- {s} a\n- {s} b\n"),
                _ => String::new(),
            }),
            Scripted::new("t")
                .with_judge(|s, _| yes(if s == 2 { 0.1 } else { 0.9 }))
                .with_generate(|s, _| format!("- {s} fixed\n")),
        )
    };
    let (d, t) = make();
    let a = run(config(0.7), d, t, Method::Speculative);
    let (d, t) = make();
    let b = run(config(0.7), d, t, Method::Speculative);
    assert_eq!(a.out.markdown, b.out.markdown);
    assert_eq!(a.events, b.events);
}

#[test]
fn the_summary_budget_is_a_typed_error() {
    let mut cfg = config(0.7);
    cfg.summary_budget = 20;
    let d = Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
        0 => "- one two three four\n".into(),
        _ => String::new(),
    });
    let c = Compactor::new(Arc::new(d), Arc::new(Scripted::new("t")), cfg).unwrap();
    let e = c
        .compact_blocking(&history(), Method::Speculative, &mut |_| {})
        .unwrap_err();
    assert!(
        matches!(e, Error::SummaryOverBudget { budget: 20, tokens } if tokens > 20),
        "{e}"
    );
}

#[test]
fn a_history_over_the_context_is_an_error_or_a_marked_middle_cut() {
    let msgs: Vec<_> = (0..40)
        .map(|i| serde_json::json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": format!("message number {i} with some words in it")}))
        .collect();
    let h = parse_value(&serde_json::Value::Array(msgs)).unwrap();
    let small = || Scripted::new("t").with_context(1200);
    let mut cfg = config(0.7);
    cfg.overflow = speccompact_engine::Overflow::Error;
    let c = Compactor::new(Arc::new(Scripted::new("d")), Arc::new(small()), cfg).unwrap();
    let e = c
        .compact_blocking(&h, Method::Speculative, &mut |_| {})
        .unwrap_err();
    let Error::HistoryTooLong {
        tokens,
        limit,
        context,
        model,
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!((*context, model.as_str()), (1200, "t"));
    assert!(tokens > limit, "{e}");
    assert!(e.to_string().contains("middle-cut"), "{e}");

    let mut cfg = config(0.7);
    cfg.overflow = speccompact_engine::Overflow::MiddleCut;
    let c = Compactor::new(Arc::new(Scripted::new("d")), Arc::new(small()), cfg).unwrap();
    let (text, omitted) = c.transcript(&h, Method::Speculative).unwrap();
    let (first, last) = omitted.expect("a cut");
    assert!(first > 1 && last < 40, "{first}-{last}");
    assert!(
        text.contains("message number 0 "),
        "the first message is kept"
    );
    assert!(
        text.contains("message number 39 "),
        "the last message is kept"
    );
    assert!(
        text.contains(&format!("[... messages {first}-{last} (")),
        "{text}"
    );
    assert!(
        !text.contains(&format!("message number {} ", first - 1)),
        "omitted"
    );
    assert!(
        text.contains(&format!("message number {} ", first - 2)),
        "kept before the cut"
    );
    assert!(
        text.contains(&format!("message number {} ", last)),
        "kept after the cut"
    );
}

#[test]
fn sequential_splits_one_generation_into_slots() {
    let target = Scripted::new("t").with_generate(|_, _| {
        "## Goal\nFix parse_header.\n\n## Constraints & Preferences\nNever touch main.\n## Progress\n### Done\n- ran tests\n## Key Decisions\n(none)\n## Next Steps\n1. fix it\n## Critical Context\nsrc/parser.rs\n".into()
    });
    let r = run(config(0.7), Scripted::new("d"), target, Method::Sequential);
    assert_eq!(slot_texts(&r, 0), ["Fix parse_header."]);
    assert_eq!(slot_texts(&r, 1), ["Never touch main."]);
    assert_eq!(slot_texts(&r, 2), ["### Done", "- ran tests"]);
    assert_eq!(slot_texts(&r, 5), ["src/parser.rs"]);
    assert_eq!(r.drafter.calls().len(), 0);
    assert!(
        r.drafter.prefixes().is_empty(),
        "sequential never prefills the drafter"
    );
    assert_eq!(r.out.trace.repair_calls, 1);
}

#[test]
fn target_self_and_drafter_only_write_each_slot_in_one_batch() {
    let gen = |who: &'static str| {
        Scripted::new(who).with_generate(move |s, _| format!("- {who} {s}\n- second {s}\n"))
    };
    let r = run(config(0.7), gen("d"), gen("t"), Method::TargetSelf);
    assert_eq!(slot_texts(&r, 3), ["- t 3", "- second 3"]);
    assert_eq!(r.target.calls().len(), 6);
    assert!(r.target.calls().iter().all(|c| c.batch == 0));
    assert!(r.drafter.calls().is_empty());
    let r = run(config(0.7), gen("d"), gen("t"), Method::DrafterOnly);
    assert_eq!(slot_texts(&r, 3), ["- d 3", "- second 3"]);
    assert!(r.target.calls().is_empty() && r.target.prefixes().is_empty());
    assert_eq!(judge_calls(&r.drafter), 0);
}
