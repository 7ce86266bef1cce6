//! Scripted tests of what a compaction does around the slot streams: the draft stop rule,
//! the empty-slot rule, lines never kept cut, session caches across compactions, the
//! drafter's slot views and compaction in stages.

use speccompact_engine::scripted::{word_tokens, Scripted};
use speccompact_engine::{
    prompt, CompactionConfig, Compactor, Error, Method, Origin, Overflow, SlotStop,
};
use speccompact_history::{parse_value, render, History, RenderOptions};
use std::sync::Arc;

fn history(n: usize, id: Option<&str>) -> History {
    let msgs: Vec<_> = (0..n)
        .map(|i| {
            serde_json::json!({
                "role": if i % 2 == 0 {"user"} else {"assistant"},
                "content": format!("message number {i} with some words in it")
            })
        })
        .collect();
    let mut h = parse_value(&serde_json::Value::Array(msgs)).unwrap();
    h.id = id.map(str::to_string);
    h
}

/// The settings with only the slot named `name`.
fn only(name: &str) -> CompactionConfig {
    let mut c = CompactionConfig::default();
    c.slots.retain(|s| s.name == name);
    c.calibrated = false;
    c
}

/// The accepted lines in a request: the text after its last `## ` heading line.
fn accepted_in(prompt: &str) -> Vec<String> {
    let body = prompt.rsplit_once("\n## ").map_or("", |(_, b)| b);
    body.lines().skip(1).map(str::to_string).collect()
}

fn texts(c: &speccompact_engine::Compaction, slot: usize) -> Vec<String> {
    c.slots[slot].lines.iter().map(|l| l.text.clone()).collect()
}

fn compact(
    cfg: CompactionConfig,
    d: Scripted,
    t: Scripted,
    h: &History,
) -> (speccompact_engine::Compaction, Arc<Scripted>, Arc<Scripted>) {
    let (d, t) = (Arc::new(d), Arc::new(t));
    let c = Compactor::new(d.clone(), t.clone(), cfg).unwrap();
    let out = c
        .compact_blocking(h, Method::Speculative, &mut |_| {})
        .unwrap();
    (out, d, t)
}

#[test]
fn a_draft_call_ends_at_the_first_line_the_checks_refuse() {
    // After "- good fact" the drafter opens the next section: the call ends there, and the
    // 9 tokens it would have spent on the lines after it are never generated.
    let d = Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
        0 => "- good fact\n## Next Steps\n- a b\n- c d\n- e f\n".into(),
        _ => String::new(),
    });
    let (out, d, _) = compact(only("goal"), d, Scripted::new("t"), &history(3, None));
    assert_eq!(texts(&out, 0), ["- good fact"]);
    assert_eq!(out.trace.drafter_tokens, 3 + 3);
    assert_eq!(d.generate_calls(), 1);

    // A copy of the instructions ends the call too and goes to repair; nothing drafted
    // after it is judged.
    let cfg = only("goal");
    let echo = cfg.slots[0].contract.clone();
    let d = Scripted::new("d").with_generate(move |_, p| match accepted_in(p).len() {
        0 => format!("- fact one\n{echo}\n- fact two\n- fact three\n"),
        _ => String::new(),
    });
    let t = Scripted::new("t").with_generate(|_, _| "- repaired\n".into());
    let (out, _, t) = compact(cfg, d, t, &history(3, None));
    assert_eq!(texts(&out, 0), ["- fact one", "- repaired"]);
    assert_eq!(out.trace.lines_failed_checks, 1);
    assert_eq!(t.judge_calls(), 1, "only the first line is judged");
}

#[test]
fn a_slot_ends_empty_only_when_the_target_writes_nothing_for_it() {
    let drafter = || {
        Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
            0 => "(none)\n".into(),
            _ => String::new(),
        })
    };
    // The drafter says (none); the target, asked for the whole slot, has two constraints.
    let t = Scripted::new("t")
        .with_generate(|_, _| "- never push to main\n- open a PR from fix/upload-retry\n".into());
    let cfg = only("constraints_preferences");
    let (out, _, t) = compact(cfg.clone(), drafter(), t, &history(3, None));
    assert_eq!(
        texts(&out, 0),
        ["- never push to main", "- open a PR from fix/upload-retry"]
    );
    assert!(out.slots[0]
        .lines
        .iter()
        .all(|l| l.origin == Origin::Repair));
    assert_eq!(t.generate_calls(), 1);
    // The target agrees there is nothing: the slot keeps its marker.
    let t = Scripted::new("t").with_generate(|_, _| "(none)\n".into());
    let (out, _, t) = compact(cfg, drafter(), t, &history(3, None));
    assert_eq!(texts(&out, 0), ["(none)"]);
    assert_eq!(t.generate_calls(), 1);

    // Progress with only its three sub-headings counts as empty.
    let d = Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
        0 => "### Done\n### In Progress\n### Blocked\n".into(),
        _ => String::new(),
    });
    let t = Scripted::new("t").with_generate(|_, _| "- fixed the retry bound\n".into());
    let (out, _, _) = compact(only("progress"), d, t, &history(3, None));
    assert_eq!(
        texts(&out, 0).last().map(String::as_str),
        Some("- fixed the retry bound")
    );
    assert_eq!(out.slots[0].stop, SlotStop::Complete);

    // A drafter that writes nothing: the target's first-line repair ends the slot at once,
    // which is already the target asked for the slot; no second attempt.
    let d = Scripted::new("d");
    let t = Scripted::new("t");
    let (out, _, t) = compact(only("goal"), d, t, &history(3, None));
    assert!(out.slots[0].lines.is_empty());
    assert_eq!(t.generate_calls(), 1);

    // A rejected first line whose repair is refused by the checks gets the whole-body try.
    let d = Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
        0 => "- a false claim\n".into(),
        _ => String::new(),
    });
    let t = Scripted::new("t")
        .with_judge(|_, _| vec![("No".into(), 0.9)])
        .with_generate(|_, p| {
            if p.contains("- the goal") {
                String::new()
            } else {
                "### Stray heading\n- the goal is X\n".into()
            }
        });
    let (out, _, t) = compact(only("goal"), d, t, &history(3, None));
    assert_eq!(texts(&out, 0), ["- the goal is X"]);
    assert_eq!(t.generate_calls(), 2);
}

#[test]
fn a_repair_is_never_kept_cut() {
    // The repair's line runs past repair_tokens + line_grace: it is dropped, not truncated,
    // and the slot keeps what it had.
    let d = Scripted::new("d").with_generate(|_, p| match accepted_in(p).len() {
        0 => "- kept line\n- rejected line\n".into(),
        _ => String::new(),
    });
    let long: String = (0..40).map(|i| format!("w{i} ")).collect();
    let t = Scripted::new("t")
        .with_judge(|_, p| {
            if p.contains("rejected") {
                vec![("No".into(), 0.9)]
            } else {
                vec![("Yes".into(), 0.9)]
            }
        })
        .with_generate(move |_, _| format!("- {long}\n"));
    let mut cfg = only("goal");
    cfg.repair_tokens = 8;
    cfg.line_grace = 8;
    let (out, _, _) = compact(cfg, d, t, &history(3, None));
    assert_eq!(texts(&out, 0), ["- kept line"]);
    assert_eq!(out.slots[0].stop, SlotStop::RepairFailed);
}

fn facts() -> Scripted {
    Scripted::new("d").with_generate(|s, p| match accepted_in(p).len() {
        0 => format!("- fact of slot {s}\n"),
        _ => String::new(),
    })
}

#[test]
fn a_grown_session_prefills_only_its_new_messages_and_forget_drops_it() {
    let cfg = CompactionConfig::default();
    let (d, t) = (Arc::new(facts()), Arc::new(Scripted::new("t")));
    let c = Compactor::new(d.clone(), t.clone(), cfg.clone()).unwrap();
    let grown = history(40, Some("s1"));
    let mut first = grown.clone();
    first.messages.truncate(36);
    let a = c
        .compact_blocking(&first, Method::Speculative, &mut |_| {})
        .unwrap();
    assert_eq!(a.trace.target_prefix_reused, 0);
    let b = c
        .compact_blocking(&grown, Method::Speculative, &mut |_| {})
        .unwrap();
    // New tokens: the last 4 messages and what follows the record, nothing else.
    let new_messages = History {
        id: None,
        messages: grown.messages[36..].to_vec(),
    };
    // The schema after the history is computed again too.
    let marked = prompt::prefix(&speccompact_engine::ChatFormat::plain(), &cfg, "\u{E001}");
    let tail = word_tokens(marked.split_once('\u{E001}').unwrap().1).len();
    let new_words = word_tokens(&render(&new_messages, &RenderOptions::default())).len() + tail;
    for (who, tokens, reused) in [
        (
            "target",
            b.trace.target_prefix_tokens,
            b.trace.target_prefix_reused,
        ),
        (
            "drafter",
            b.trace.drafter_prefix_tokens,
            b.trace.drafter_prefix_reused,
        ),
    ] {
        let fresh = tokens - reused;
        assert!(
            fresh <= new_words + 2 && fresh >= new_words,
            "{who}: {fresh} tokens prefilled for {new_words} new"
        );
    }
    assert_eq!(a.markdown, b.markdown);
    let (entries, bytes) = c.cached().unwrap();
    assert_eq!(entries, 2);
    assert!(bytes > 0);
    // Another session starts cold; forgetting one drops all its prefixes.
    assert_eq!(c.forget("s1").unwrap(), 2);
    let again = c
        .compact_blocking(&grown, Method::Speculative, &mut |_| {})
        .unwrap();
    assert_eq!(again.trace.target_prefix_reused, 0);
    // No session id, no cache.
    let anon = history(40, None);
    c.forget("s1").unwrap();
    c.compact_blocking(&anon, Method::Speculative, &mut |_| {})
        .unwrap();
    assert_eq!(c.cached().unwrap().0, 0);
    // A bound of 0 keeps nothing.
    let mut off = cfg;
    off.session_cache_mb = 0;
    let c = Compactor::new(facts(), Scripted::new("t"), off).unwrap();
    c.compact_blocking(&grown, Method::Speculative, &mut |_| {})
        .unwrap();
    assert_eq!(c.cached().unwrap().0, 0);
}

/// Word tokens of the prefix around an empty transcript, and the reserve after it.
fn overhead(cfg: &CompactionConfig) -> usize {
    let p = prompt::prefix(&speccompact_engine::ChatFormat::plain(), cfg, "");
    word_tokens(&p).len() + cfg.slot_max_tokens + cfg.draft_tokens.max(cfg.repair_tokens) + 192
}

#[test]
fn a_history_longer_than_the_drafter_is_drafted_from_slot_views() {
    let cfg = CompactionConfig::default();
    let h = history(60, Some("long"));
    let ctx = overhead(&cfg) + 150;
    let d = facts().with_context(ctx);
    let t = Scripted::new("t");
    let (out, d, t) = compact(cfg.clone(), d, t, &h);
    assert_eq!(out.trace.drafter_views, 6);
    assert_eq!(out.trace.view_omitted_messages.len(), 6);
    assert!(out.trace.view_omitted_messages.iter().all(|&n| n > 0));
    // The target reads the whole history; each drafter stream its own view that fits.
    assert!(t.prefixes()[0].contains("message number 30 "));
    let limit = ctx - (cfg.slot_max_tokens + cfg.draft_tokens.max(cfg.repair_tokens) + 192);
    for call in d.calls() {
        assert!(
            word_tokens(&call.prefix).len() <= limit,
            "stream {}",
            call.stream
        );
        assert!(call.prefix.contains("message number 0 "), "head kept");
        assert!(call.prefix.contains("message number 59 "), "tail kept");
        assert!(call.prefix.contains("omitted ...]"), "marked");
    }
    // Each view after the first reuses the positions it shares with the one before.
    assert!(out.trace.drafter_prefix_reused > 0);
    assert_eq!(texts(&out, 0), ["- fact of slot 0"]);

    // With views always on, a history that fits is drafted from views too.
    let mut always = cfg;
    always.drafter_view = speccompact_engine::DrafterView::Always;
    always.drafter_view_tokens = 100_000;
    let (out, _, _) = compact(always, facts(), Scripted::new("t"), &history(6, None));
    assert_eq!(out.trace.drafter_views, 6);
    assert!(out.trace.view_omitted_messages.iter().all(|&n| n == 0));
}

#[test]
fn a_history_longer_than_the_target_is_compacted_in_stages() {
    let mut cfg = CompactionConfig::default();
    let h = history(60, Some("big"));
    let full = word_tokens(&render(&h, &RenderOptions::default())).len();
    let ctx = overhead(&cfg) + full * 2 / 3;
    let t = || Scripted::new("t").with_context(ctx);
    let (out, _, t1) = compact(cfg.clone(), facts(), t(), &h);
    let stages = &out.trace.stages;
    assert!(stages.len() >= 2, "{stages:?}");
    assert_eq!(stages[0].messages.0, 1);
    assert_eq!(stages.last().unwrap().messages.1, 60);
    for w in stages.windows(2) {
        assert_eq!(w[0].messages.1 + 1, w[1].messages.0, "{stages:?}");
        assert!(w[1].carried_summary);
    }
    // The later stage read the earlier one's summary and the rest of the history.
    let prefixes = t1.prefixes();
    assert!(prefixes.len() >= 2);
    assert!(prefixes[1].contains("[Summary of the"));
    assert!(prefixes[1].contains("- fact of slot 0"));
    assert!(prefixes[1].contains("message number 59 "));
    assert!(!prefixes[1].contains("message number 1 "));

    cfg.overflow = Overflow::Error;
    let c = Compactor::new(facts(), t(), cfg).unwrap();
    let e = c
        .compact_blocking(&h, Method::Speculative, &mut |_| {})
        .unwrap_err();
    assert!(matches!(e, Error::HistoryTooLong { .. }), "{e}");
}
