//! The compaction engine end to end on real decoders: tiny random-weight models written by
//! the test (every method, the model backend's stream caches against fresh recomputation),
//! and the real drafter/target pair on the smoke sessions of `../shared/evaldata`.

use candle_core::Device;
use speccompact_engine::{
    Backend, Compaction, CompactionConfig, Compactor, Method, ModelBackend, Origin, Request,
    RequestKind, Response,
};
use speccompact_history::{parse_value, History};
use speccompact_runtime::{Architecture, Model};
use speccompact_tests::{real_model, smoke_sessions};
use std::sync::Arc;

fn tiny(arch: Architecture, seed: u64, dir: &std::path::Path) -> ModelBackend {
    speccompact_tests::tiny_backend(arch, seed, dir, 64)
}

fn short_history() -> History {
    parse_value(&serde_json::json!([
        {"role": "user", "content": "Fix the bug in src/lib.rs; keep the API."},
        {"role": "assistant", "content": "Running the tests.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\":\"cargo test\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "bash", "content": "exit 1: parse_header failed"}
    ]))
    .unwrap()
}

/// Invariants every compaction must satisfy, whatever the models wrote.
fn check_consistent(c: &Compaction, cfg: &CompactionConfig) {
    assert_eq!(c.slots.len(), 6);
    for (slot, spec) in c.slots.iter().zip(&cfg.slots) {
        assert_eq!(slot.name, spec.name);
        assert!(
            c.markdown.contains(&format!("## {}\n", spec.title)),
            "{}",
            c.markdown
        );
        let content = slot
            .lines
            .iter()
            .filter(|l| !l.text.trim().is_empty())
            .count();
        assert!(content <= cfg.slot_max_lines);
        assert!(slot.tokens <= cfg.slot_max_tokens);
        for l in &slot.lines {
            assert!(!l.text.contains('\n'));
            assert!(l.text.chars().count() <= cfg.max_line_chars);
        }
    }
    let t = &c.trace;
    let kept = |o: Origin| {
        c.slots
            .iter()
            .flat_map(|s| &s.lines)
            .filter(|l| l.origin == o && !l.text.trim().is_empty())
            .count()
    };
    assert!(t.summary_tokens <= cfg.summary_budget);
    assert!(t.wall_ms >= t.prefill_ms + t.draft_ms.max(t.verify_ms));
    match c.method {
        Method::Speculative => {
            // Every drafted line is accepted, rejected by the judge or failed a check, and
            // every kept line was accepted or repaired.
            assert!(
                t.lines_accepted + t.lines_rejected + t.lines_failed_checks <= t.lines_proposed
            );
            assert_eq!(t.lines_accepted, kept(Origin::Draft) + kept(Origin::Auto));
            assert_eq!(t.lines_repaired + t.whole_slot_lines, kept(Origin::Repair));
            assert!(t.whole_slot_calls <= c.slots.len());
            // Judged lines: kept drafts + rejected ones + at most one accepted line per slot
            // that a cap then kept out.
            let judged = kept(Origin::Draft) + t.lines_rejected;
            assert!(
                t.verify_calls >= judged && t.verify_calls <= judged + c.slots.len(),
                "{} judgments for {judged} judged lines",
                t.verify_calls
            );
            assert!(t.repair_calls >= t.lines_repaired + t.whole_slot_calls);
            assert_eq!(t.judgments.len(), t.verify_calls);
            assert_eq!(
                t.judgments.iter().filter(|j| !j.accepted).count(),
                t.lines_rejected
            );
            assert!(t.target_prefix_tokens > 0 && t.drafter_prefix_tokens > 0);
            // Under the calibrated line rule a draft is kept by the rule over its token
            // scores, not by r ≥ η alone.
            let by_ratio = cfg.verify != speccompact_engine::verify::Verify::Calibrated
                || cfg.line_rule.is_none();
            for l in c.slots.iter().flat_map(|s| &s.lines) {
                match l.origin {
                    Origin::Draft => {
                        assert!(l.r.is_some_and(|r| !by_ratio || r >= cfg.eta), "{l:?}")
                    }
                    _ => assert!(l.r.is_none()),
                }
            }
        }
        Method::Sequential => {
            assert_eq!((t.repair_calls, t.verify_calls, t.drafter_calls), (1, 0, 0))
        }
        Method::TargetSelf => assert_eq!((t.repair_calls, t.drafter_calls), (6, 0)),
        Method::DrafterOnly => assert_eq!(
            (t.repair_calls, t.drafter_calls, t.target_prefix_tokens),
            (0, 6, 0)
        ),
    }
}

#[test]
fn tiny_models_run_every_method() {
    let dir = tempfile::tempdir().unwrap();
    let drafter = tiny(Architecture::Llama, 3, dir.path());
    let target = tiny(Architecture::Qwen2, 5, dir.path());
    let mut cfg = CompactionConfig::default();
    // Random weights give r near 0.5: an eta in the middle exercises both outcomes.
    cfg.eta = 0.5;
    cfg.draft_tokens = 24;
    cfg.repair_tokens = 12;
    cfg.slot_max_lines = 3;
    cfg.slot_max_tokens = 64;
    // Random weights rarely end a generation: keep the sequential baseline's run short.
    cfg.summary_budget = 400;
    let c = Compactor::new(drafter, target, cfg.clone()).unwrap();
    let h = short_history();
    for m in Method::ALL {
        let a = c.compact_blocking(&h, m, &mut |_| {}).unwrap();
        check_consistent(&a, &cfg);
        // Greedy decoding: the same run gives the same summary.
        let b = c.compact_blocking(&h, m, &mut |_| {}).unwrap();
        assert_eq!(a.markdown, b.markdown, "{m} is not reproducible");
        if m == Method::Speculative {
            // Random weights rarely write a newline, so most drafts end unfinished and go to
            // repair; every proposed line was judged or failed a check.
            let t = &a.trace;
            assert!(t.drafter_calls > 0 && t.lines_proposed > 0);
            assert!(
                t.lines_proposed >= t.verify_calls + t.lines_failed_checks,
                "{t:?}"
            );
        }
    }
}

#[test]
fn async_api_streams_events_and_matches_the_blocking_result() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = CompactionConfig::default();
    cfg.slot_max_lines = 2;
    cfg.draft_tokens = 16;
    cfg.repair_tokens = 8;
    cfg.eta = 0.5;
    let c = Compactor::new(
        tiny(Architecture::Llama, 3, dir.path()),
        tiny(Architecture::Qwen2, 5, dir.path()),
        cfg,
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (events, out) = rt.block_on(async {
        let (mut rx, handle) = c.compact_stream(short_history(), Method::Speculative);
        let mut events = Vec::new();
        while let Some(e) = rx.recv().await {
            events.push(e);
        }
        (events, handle.await.unwrap().unwrap())
    });
    let blocking = c
        .compact_blocking(&short_history(), Method::Speculative, &mut |_| {})
        .unwrap();
    assert_eq!(out.markdown, blocking.markdown);
    let done = events
        .iter()
        .filter(|e| matches!(e, speccompact_engine::Event::SlotDone { .. }))
        .count();
    assert_eq!(done, 6);
    let accepted = events
        .iter()
        .filter(|e| matches!(e, speccompact_engine::Event::LineAccepted { .. }))
        .count();
    assert_eq!(
        accepted,
        out.slots.iter().map(|s| s.lines.len()).sum::<usize>()
    );
    assert!(matches!(
        events[0],
        speccompact_engine::Event::Prefilled { .. }
    ));
}

/// The next-token distribution of a judgment must not depend on what the stream's cache
/// held before (longest-common-prefix reuse and rollback) nor on the other rows of the batch.
#[test]
fn stream_cache_reuse_and_batching_match_fresh_computation() {
    let dir = tempfile::tempdir().unwrap();
    for arch in [Architecture::Qwen2, Architecture::Gemma3] {
        let b = tiny(arch, 11, dir.path());
        let prefix =
            "<|im_start|>system\nsummarise<|im_end|>\n<|im_start|>user\nrecord: x=1, y=2\n";
        let judge = |stream: usize, line: &str| Request {
            stream,
            prompt: vec![
                "\nslot goal<|im_end|>\n<|im_start|>assistant\n## Goal\n".into(),
                format!("{line}\n"),
                "Check.".into(),
            ],
            kind: RequestKind::Judge { top_k: 8 },
            lines: Default::default(),
        };
        let gen = |stream: usize| Request {
            stream,
            prompt: vec!["\nslot goal<|im_end|>\n<|im_start|>assistant\n## Goal\n".into()],
            kind: RequestKind::Generate {
                max_tokens: 7,
                stop_at_newline: false,
            },
            lines: Default::default(),
        };
        let probs = |r: &Response| match r {
            Response::Judged(v) => v.clone(),
            other => panic!("{other:?}"),
        };
        // Fresh: a new session, one request.
        let mut s = b.open(prefix).unwrap();
        let fresh = probs(&b.run(&mut s, &[judge(0, "- set x to 1")]).unwrap()[0]);
        // Reused: the same stream generated, then judged another line, then this one.
        let mut s = b.open(prefix).unwrap();
        b.run(&mut s, &[gen(0)]).unwrap();
        b.run(&mut s, &[judge(0, "- something else entirely")])
            .unwrap();
        let reused = probs(&b.run(&mut s, &[judge(0, "- set x to 1")]).unwrap()[0]);
        // Batched with other streams of other lengths.
        let mut s = b.open(prefix).unwrap();
        let out = b
            .run(&mut s, &[gen(1), judge(0, "- set x to 1"), judge(2, "- y")])
            .unwrap();
        let batched = probs(&out[1]);
        for other in [&reused, &batched] {
            assert_eq!(fresh.len(), other.len());
            for ((ta, pa), (tb, pb)) in fresh.iter().zip(other.iter()) {
                assert_eq!(ta, tb, "{arch:?}: top-k order differs");
                assert!((pa - pb).abs() < 1e-4, "{arch:?}: {pa} vs {pb}");
            }
        }
        let total: f32 = fresh.iter().map(|(_, p)| p).sum();
        assert!(total > 0.0 && total <= 1.0 + 1e-5);
    }
}

fn real(name: &str) -> Option<ModelBackend> {
    let path = real_model(name)?;
    let opts = speccompact_runtime::RuntimeSettings::default().load_options();
    let m = Model::load(&path, &Device::Cpu, opts).unwrap();
    Some(ModelBackend::new(name, Arc::new(m), 512).unwrap())
}

#[test]
fn real_pair_compacts_the_smoke_sessions() {
    let Some(sessions) = smoke_sessions() else {
        return;
    };
    let (Some(d), Some(t)) = (
        real("smollm2-135m-instruct"),
        real("qwen2.5-coder-0.5b-instruct"),
    ) else {
        return;
    };
    let cfg = CompactionConfig::default();
    let c = Compactor::new(d, t, cfg.clone()).unwrap();
    assert_eq!(sessions.len(), 6);
    for h in &sessions {
        let out = c
            .compact_blocking(h, Method::Speculative, &mut |_| {})
            .unwrap();
        eprintln!(
            "{}: {:.1} s, {} proposed, {:.0}% accepted, {} repaired",
            h.id.as_deref().unwrap_or("?"),
            out.trace.wall_ms / 1e3,
            out.trace.lines_proposed,
            100.0 * out.trace.acceptance_rate,
            out.trace.lines_repaired
        );
        check_consistent(&out, &cfg);
        let content: usize = out
            .slots
            .iter()
            .map(|s| s.lines.iter().filter(|l| !l.text.trim().is_empty()).count())
            .sum();
        assert!(
            content >= 3,
            "{:?}: almost nothing written:\n{}",
            h.id,
            out.markdown
        );
    }
}

/// A history of `bytes` characters or more, in 40 messages.
fn long_history(bytes: usize, id: &str) -> History {
    let per = bytes / 40 + 1;
    let msgs: Vec<_> = (0..40)
        .map(|i| {
            let body: String =
                format!("step {i}: edited src/mod{i}.rs and ran the tests. ").repeat(per / 40 + 1);
            serde_json::json!({
                "role": if i % 2 == 0 {"user"} else {"assistant"},
                "content": body.chars().take(per).collect::<String>()
            })
        })
        .collect();
    let mut h = parse_value(&serde_json::Value::Array(msgs)).unwrap();
    h.id = Some(id.to_string());
    h
}

#[test]
fn tiny_models_compact_a_history_of_one_and_a_half_contexts_in_stages() {
    let dir = tempfile::tempdir().unwrap();
    let drafter = tiny(Architecture::Llama, 3, dir.path());
    let target = tiny(Architecture::Qwen2, 5, dir.path());
    let context = target.context_length();
    let mut cfg = CompactionConfig::default();
    cfg.eta = 0.5;
    cfg.draft_tokens = 12;
    cfg.repair_tokens = 8;
    cfg.line_grace = 8;
    cfg.slot_max_lines = 2;
    cfg.slot_max_tokens = 32;
    cfg.summary_budget = 400;
    let c = Compactor::new(drafter, target, cfg.clone()).unwrap();
    // A history of at least 1.5 contexts in the target's tokens.
    let count = |h: &History| {
        c.target()
            .count_tokens(&speccompact_history::render(h, &Default::default()))
            .unwrap()
    };
    let mut bytes = context * 3 / 2;
    let mut h = long_history(bytes, "long");
    while count(&h) < context * 3 / 2 {
        bytes += context / 2;
        h = long_history(bytes, "long");
    }
    assert!(count(&h) < context * 2, "{} tokens", count(&h));
    for m in [Method::Speculative, Method::TargetSelf] {
        let out = c.compact_blocking(&h, m, &mut |_| {}).unwrap();
        check_consistent(&out, &cfg);
        let st = &out.trace.stages;
        assert!(st.len() >= 2, "{m}: {st:?}");
        assert_eq!((st[0].messages.0, st.last().unwrap().messages.1), (1, 40));
        for w in st.windows(2) {
            assert_eq!(w[0].messages.1 + 1, w[1].messages.0, "{st:?}");
        }
    }
    // The drafter's window is the same as the target's: speculative drafted from views in
    // each stage that did not fit it whole, never with a context error.
    let mut err = cfg;
    err.overflow = speccompact_engine::Overflow::Error;
    let c = Compactor::new(
        tiny(Architecture::Llama, 3, dir.path()),
        tiny(Architecture::Qwen2, 5, dir.path()),
        err,
    )
    .unwrap();
    assert!(c
        .compact_blocking(&h, Method::Speculative, &mut |_| {})
        .is_err());
}

#[test]
fn real_pair_recompaction_of_a_grown_session_prefills_only_the_new_messages() {
    let (Some(d), Some(t)) = (
        real("smollm2-135m-instruct"),
        real("qwen2.5-coder-0.5b-instruct"),
    ) else {
        return;
    };
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/sample-session.json");
    let mut h =
        speccompact_history::parse_history(&std::fs::read_to_string(path).unwrap()).unwrap();
    h.id = Some("sample".into());
    let mut cfg = CompactionConfig::default();
    cfg.slot_max_lines = 2;
    let c = Compactor::new(d, t, cfg).unwrap();
    let r = speccompact_eval::bench::recompaction(&c, &h, Method::Speculative, 4).unwrap();
    let new_msgs = History {
        id: None,
        messages: h.messages[h.messages.len() - 4..].to_vec(),
    };
    // The schema after the history is computed again too.
    let f = c.target().format();
    let marked = speccompact_engine::prompt::prefix(f, c.config(), "\u{E001}");
    let tail = marked.split_once('\u{E001}').unwrap().1;
    let new_tokens = c
        .target()
        .count_tokens(&speccompact_history::render(&new_msgs, &Default::default()))
        .unwrap()
        + c.target().count_tokens(tail).unwrap();
    eprintln!(
        "first {:.1} s, second {:.1} s; target computed {} of {} (new messages {new_tokens})",
        r.first.wall_ms / 1e3,
        r.second.wall_ms / 1e3,
        r.new_target_tokens(),
        r.second.target_prefix_tokens
    );
    assert_eq!(r.first.target_prefix_reused, 0);
    assert!(r.second.target_prefix_reused > 0);
    assert!(
        r.new_target_tokens() <= new_tokens + 8,
        "{} computed for {new_tokens} new",
        r.new_target_tokens()
    );
    assert!(r.second.drafter_prefix_reused > 0);
}

/// The lossless mode keeps a drafted token only where it is the target's greedy token, so its
/// summary equals target-self's byte for byte: with a drafter that agrees with the target (the
/// same model) and one that does not, on a short history and on the smoke sessions.
#[test]
fn exact_verification_equals_target_self_with_tiny_models() {
    let dir = tempfile::tempdir().unwrap();
    // A context that holds a few of the smoke sessions' messages (tool results are capped
    // at 4,000 characters); longer sessions run in stages, the same for both methods.
    let tiny = |arch, seed| {
        speccompact_tests::tiny_backend_with_context(arch, seed, dir.path(), 256, Some(16384))
    };
    let target = || tiny(Architecture::Qwen2, 5);
    let mut cfg = CompactionConfig::default();
    cfg.slot_max_tokens = 48;
    cfg.draft_tokens = 12;
    cfg.verify = speccompact_engine::verify::Verify::Exact;
    // The smoke sessions are longer than the tiny models' context: both methods run in the
    // same stages.
    let same = Compactor::new(target(), target(), cfg.clone()).unwrap();
    let other = Compactor::new(tiny(Architecture::Llama, 3), target(), cfg.clone()).unwrap();
    let mut histories = vec![short_history()];
    if let Some(s) = smoke_sessions() {
        histories.extend(s);
    }
    for (k, h) in histories.iter().enumerate() {
        let want = other
            .compact_blocking(h, Method::TargetSelf, &mut |_| {})
            .unwrap();
        for (name, c) in [("same", &same), ("other", &other)] {
            if name == "same" && k > 0 {
                continue;
            }
            let got = c
                .compact_blocking(h, Method::Speculative, &mut |_| {})
                .unwrap();
            assert_eq!(got.markdown, want.markdown, "{name} drafter, history {k}");
            let t = &got.trace;
            assert!(t.spec_tokens_kept <= t.spec_tokens_drafted);
            if name == "same" {
                // The drafter is the target: what it drafts is kept, up to the budget.
                assert!(t.spec_tokens_kept > 0, "{t:?}");
            }
        }
    }
}

/// The README example with the 1.5B target, its calibrated line rule and the shipped load
/// settings: whatever greedy text the pair writes on this CPU, the summary has the six
/// headings in order, keeps the facts the next step depends on (both constraints, the fix,
/// the failing test, the branch) and asserts nothing the history does not contain (no
/// identifier, number, path or quoted code outside it, by the evaluation's unsourced-
/// assertions metric). Run on each kernel path (`SPECCOMPACT_KERNEL_ISA=avx2|scalar` forces
/// the narrower ones).
#[test]
fn real_pair_readme_example_keeps_the_facts_and_asserts_nothing_unsourced() {
    let name = "qwen2.5-coder-1.5b-instruct";
    // The test command fetches only the small pair: this runs where the 1.5B is in the store.
    let Some(tpath) = speccompact_tests::optional_real_model(name) else {
        return;
    };
    let Some(dpath) = real_model("smollm2-135m-instruct") else {
        return;
    };
    let opts = speccompact_runtime::RuntimeSettings::default().load_options();
    let dm = Model::load(&dpath, &Device::Cpu, opts).unwrap();
    let d = ModelBackend::new("smollm2-135m-instruct", Arc::new(dm), 512).unwrap();
    let m = Model::load(&tpath, &Device::Cpu, opts).unwrap();
    let t = ModelBackend::new(name, Arc::new(m), 512).unwrap();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/sample-session.json");
    let h = speccompact_history::parse_history(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut cfg = CompactionConfig::default();
    cfg.target = name.into();
    let applied = cfg.apply_calibration(
        &speccompact_engine::calibration::Calibrations::builtin().unwrap(),
        &speccompact_engine::calibration::builtin_variants().unwrap(),
    );
    assert!(
        applied.as_deref().is_some_and(|a| a.contains("line rule")),
        "{applied:?}"
    );
    let c = Compactor::new(d, t, cfg.clone()).unwrap();
    let out = c
        .compact_blocking(&h, Method::Speculative, &mut |_| {})
        .unwrap();
    eprintln!(
        "{:.1} s, {} judged ({} rejected), {} repaired; {:?}\n{}",
        out.trace.wall_ms / 1e3,
        out.trace.judgments.len(),
        out.trace.lines_rejected,
        out.trace.lines_repaired,
        out.trace.numerics,
        out.markdown
    );
    check_consistent(&out, &cfg);
    let md = out.markdown.to_lowercase();
    for fact in [
        "uploadclient",
        "attempt < max_retries",
        "no_retry_on_auth_error",
        "fix/upload-retry",
    ] {
        assert!(md.contains(fact), "missing {fact}:\n{}", out.markdown);
    }
    assert!(
        md.contains('3'),
        "the retry limit of 3 is missing:\n{}",
        out.markdown
    );
    let history = speccompact_eval::data::history_text(&h);
    let unsourced = speccompact_eval::metrics::unsourced(&out.markdown, &history);
    assert!(
        unsourced.is_empty(),
        "asserts what the history does not contain: {unsourced:?}\n{}",
        out.markdown
    );
}
