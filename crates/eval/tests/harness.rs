//! The harness's wiring on scripted models: each metric lands on the right session, method
//! and probe, and a context without the facts scores lower than the whole history.

use speccompact_engine::{CompactionConfig, Compactor, Method, Scripted};
use speccompact_eval::data::parse_session;
use speccompact_eval::run::MethodResult;
use speccompact_eval::{
    evaluate, EvalMethod, EvalOptions, EvalPrompts, Provenance, Report, TailBudget,
};

fn session() -> speccompact_eval::EvalSession {
    parse_session(&serde_json::json!({
        "id": "s1", "source": "test", "kind": "coding", "cut": 4,
        "messages": [
            {"role": "user", "content": "Fix the crash in src/io/reader.py for user emma_kim_9957."},
            {"role": "assistant", "content": "Reading the file."},
            {"role": "tool", "content": "def parse_header(buf): raise KeyError('id')"},
            {"role": "assistant", "content": "The bug is in parse_header. The release is 4.2.1."}
        ],
        "continuation": [{"role": "assistant", "content": "Now I will edit parse_header."}],
        "probes": [
            {"id": "user", "slot": "critical_context", "kind": "identifier", "expect_any": ["emma_kim_9957"]},
            {"id": "file", "slot": "progress", "kind": "file", "expect_any": ["src/io/reader.py"]},
            {"id": "fn", "slot": "any", "kind": "identifier", "expect_any": ["parse_header"]},
            {"id": "q", "slot": "any", "kind": "qa", "expect_any": ["4.2.1"], "question": "Which release?", "answer": "4.2.1"}
        ]
    }))
    .unwrap()
}

const SUMMARY: &str = "## Goal\n- Fix the crash for emma_kim_9957.\n## Progress\n### Done\n- Found the bug in parse_header (ValueError at line 77).\n## Next Steps\n1. Edit parse_header.\n";

fn target() -> Scripted {
    Scripted::new("target")
        .with_generate(|_, prompt| {
            if prompt.contains("Question: Which release?") {
                "Release 4.2.1\n".into()
            } else {
                SUMMARY.into()
            }
        })
        // The next-step question is answered Yes, every adequacy criterion No, except the
        // "supported" one.
        .with_judge(|_, prompt| {
            if prompt.contains("Is the actual next action consistent")
                || prompt.contains("supported by the record")
            {
                vec![("Yes".into(), 0.9), ("No".into(), 0.05)]
            } else {
                vec![("No".into(), 0.8), ("Yes".into(), 0.1)]
            }
        })
}

fn of(r: &[MethodResult], m: EvalMethod) -> &MethodResult {
    r.iter().find(|x| x.method == m).unwrap()
}

#[test]
fn metrics_land_on_the_right_method_and_probe() {
    let mut cfg = CompactionConfig::default();
    cfg.calibrated = false;
    let c = Compactor::new(Scripted::new("drafter"), target(), cfg).unwrap();
    let opts = EvalOptions {
        methods: vec![
            EvalMethod::Engine(Method::Sequential),
            EvalMethod::TruncateTail,
            EvalMethod::Full,
        ],
        tail_budget: TailBudget::Fixed(14),
        reader: true,
        judges: true,
        prompts: EvalPrompts::default(),
    };
    let mut steps = Vec::new();
    let out = evaluate(&c, &[session()], &opts, &mut |_, s| {
        steps.push(s.to_string())
    })
    .unwrap();
    assert!(
        steps.iter().any(|s| s == "judges") && steps.iter().any(|s| s == "reader: full history")
    );
    let r = &out[0].methods;
    let seq = of(r, EvalMethod::Engine(Method::Sequential));
    assert!(seq.error.is_none());
    // The summary keeps the user and the function but not the file.
    let found: Vec<(&str, bool, Option<bool>)> = seq
        .probes
        .iter()
        .map(|h| (h.id.as_str(), h.found, h.in_slot))
        .collect();
    assert_eq!(
        found,
        vec![
            ("user", true, Some(false)),
            ("file", false, Some(false)),
            ("fn", true, None)
        ]
    );
    assert!((seq.probe_rate.unwrap() - 2.0 / 3.0).abs() < 1e-9);
    assert_eq!(seq.in_slot_rate, Some(0.0));
    assert_eq!(seq.lost.len(), 1);
    assert_eq!(
        (seq.lost[0].id.as_str(), seq.lost[0].reason.as_str()),
        ("file", "never-written")
    );
    // "ValueError" and "77" are in the summary but not in the history.
    assert_eq!(seq.unsourced, vec!["77", "ValueError"]);
    // One criterion of five met in every slot; the next step agrees.
    assert_eq!(seq.adequacy.len(), 6);
    assert!(
        seq.adequacy.iter().all(|a| a.score == 1 && a.r.len() == 5),
        "{:?}",
        seq.adequacy
    );
    assert_eq!(seq.next_step_agree, Some(true));
    assert_eq!((seq.qa_score, seq.qa_delta), (Some(1.0), Some(0.0)));
    // The tail keeps only the last message: the user and the file are gone.
    let tail = of(r, EvalMethod::TruncateTail);
    assert!(tail.tokens_out <= 14, "{}", tail.tokens_out);
    assert_eq!(tail.probes.iter().filter(|h| h.found).count(), 1);
    assert!(tail.in_slot_rate.is_none() && tail.next_step_r.is_none() && tail.adequacy.is_empty());
    // The whole history keeps every probe and is the QA reference.
    let full = of(r, EvalMethod::Full);
    assert_eq!(full.probe_rate, Some(1.0));
    assert_eq!(full.qa_delta, Some(0.0));
    assert!((full.compression - 1.0).abs() < 1e-9);
    assert!((seq.compression - out[0].tokens_in as f64 / seq.tokens_out as f64).abs() < 1e-9);
    let report = Report::new(
        Provenance {
            command: "eval".into(),
            data: "inline".into(),
            data_sha256: "-".into(),
            selection: "1".into(),
            drafter: "drafter".into(),
            target: "target".into(),
            compaction_config: String::new(),
            eval_config: String::new(),
            tail_budget: "14".into(),
            revision: "-".into(),
            runtime: "-".into(),
        },
        opts.methods.clone(),
        out,
        Vec::new(),
        200,
        1,
    );
    let md = report.markdown();
    assert!(
        md.contains("| sequential | 1 (0) | 66.7 [66.7, 66.7] | 0.0 [0.0, 0.0] | 2/3 |"),
        "{md}"
    );
    assert!(
        md.contains("| sequential | never-written | progress | 1 | 0 |"),
        "{md}"
    );
}

#[test]
fn a_failing_method_is_recorded_not_dropped() {
    let mut cfg = CompactionConfig::default();
    cfg.calibrated = false;
    // A summary budget the scripted summary exceeds: the method fails with the engine's
    // error, the other methods still run.
    cfg.summary_budget = 12;
    cfg.slot_max_tokens = 12;
    let c = Compactor::new(Scripted::new("d"), target(), cfg).unwrap();
    let opts = EvalOptions {
        methods: vec![EvalMethod::Engine(Method::Sequential), EvalMethod::Full],
        tail_budget: TailBudget::Matched,
        reader: false,
        judges: true,
        prompts: EvalPrompts::default(),
    };
    let out = evaluate(&c, &[session()], &opts, &mut |_, _| {}).unwrap();
    let seq = of(&out[0].methods, EvalMethod::Engine(Method::Sequential));
    let e = seq.error.as_deref().unwrap_or_default();
    assert!(e.contains("budget"), "{e}");
    assert!(seq.probe_rate.is_none() && seq.adequacy.is_empty());
    assert_eq!(of(&out[0].methods, EvalMethod::Full).probe_rate, Some(1.0));
}
