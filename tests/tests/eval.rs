//! The evaluation harness end to end on tiny random-weight models and the smoke sessions of
//! `../shared/evaldata`: every method, every metric, the report with its plots, and a drift
//! stress of ten generations.

use speccompact_engine::{CompactionConfig, Compactor, Method, ModelBackend, Overflow};
use speccompact_eval::{
    drift_stress, evaluate, load_sessions, sha256_file, EvalMethod, EvalOptions, EvalPrompts,
    Provenance, Report, TailBudget,
};
use speccompact_runtime::Architecture;

fn tiny(arch: Architecture, seed: u64, dir: &std::path::Path) -> ModelBackend {
    speccompact_tests::tiny_backend(arch, seed, dir, 256)
}

#[test]
fn the_harness_runs_end_to_end_with_tiny_models_on_the_smoke_set() {
    let Some(path) = speccompact_tests::smoke_path() else {
        return;
    };
    let mut sessions = load_sessions(&path).unwrap();
    assert_eq!(sessions.len(), 6);
    // Tiny models tokenize byte by byte: each message is clipped to its first 160 characters
    // so six sessions × six methods stay fast. Probes whose strings the clip removes are
    // simply absent from every context, the whole history included.
    for s in &mut sessions {
        for m in s
            .history
            .messages
            .iter_mut()
            .chain(s.continuation.iter_mut())
        {
            m.content = m.content.chars().take(160).collect();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = CompactionConfig::default();
    cfg.calibrated = false;
    cfg.eta = 0.5;
    cfg.draft_tokens = 16;
    cfg.repair_tokens = 8;
    cfg.slot_max_lines = 2;
    cfg.slot_max_tokens = 40;
    cfg.summary_budget = 400;
    cfg.overflow = Overflow::MiddleCut;
    let c = Compactor::new(
        tiny(Architecture::Llama, 1, dir.path()),
        tiny(Architecture::Qwen2, 2, dir.path()),
        cfg,
    )
    .unwrap();
    let mut prompts = EvalPrompts::default();
    prompts.reader_max_tokens = 6;
    let opts = EvalOptions {
        methods: EvalMethod::ALL.to_vec(),
        tail_budget: TailBudget::Matched,
        reader: true,
        judges: true,
        prompts: prompts.clone(),
    };
    let results = evaluate(&c, &sessions, &opts, &mut |_, _| {}).unwrap();
    assert_eq!(results.len(), 6);
    for (s, r) in sessions.iter().zip(&results) {
        assert_eq!(r.methods.len(), 6, "{}", s.id);
        for m in &r.methods {
            assert!(m.error.is_none(), "{} {}: {:?}", s.id, m.method, m.error);
            assert_eq!(m.probes.len(), s.presence_probes().count());
            assert_eq!(m.qa.len(), s.qa_probes().count());
            assert!(m.probe_rate.is_none_or(|x| (0.0..=1.0).contains(&x)));
            let summary = matches!(m.method, EvalMethod::Engine(_));
            // Summaries get the judges (six slots × five criteria; next step on cut
            // sessions); the tail and the whole history get none.
            assert_eq!(
                m.adequacy.len(),
                if summary { 6 } else { 0 },
                "{} {}",
                s.id,
                m.method
            );
            assert_eq!(
                m.next_step_r.is_some(),
                summary && !s.continuation.is_empty()
            );
            assert!(m.unsourced.len() <= m.assertions);
        }
        let of = |x: EvalMethod| r.methods.iter().find(|m| m.method == x).unwrap();
        let full = of(EvalMethod::Full);
        assert!((full.compression - 1.0).abs() < 1e-9);
        if r.qa_probes > 0 {
            assert_eq!(full.qa_delta, Some(0.0));
        }
        // The tail gets the room the speculative summary used, never more.
        let spec = of(EvalMethod::Engine(Method::Speculative));
        let tail = of(EvalMethod::TruncateTail);
        assert!(
            tail.tokens_out <= spec.trace.as_ref().unwrap().summary_tokens,
            "{}",
            s.id
        );
    }
    let long = sessions
        .iter()
        .max_by_key(|s| s.history.messages.len())
        .unwrap();
    let drift = drift_stress(&c, long, Method::DrafterOnly, 10, None, &mut |_| {}).unwrap();
    assert_eq!(drift.generations.len(), 10, "{}", long.id);
    let mut seen = 0;
    for g in &drift.generations {
        assert!(
            g.probes_seen >= seen && g.recursive <= g.probes_seen && g.rebuild <= g.probes_seen
        );
        assert!(g.errors.is_empty(), "{:?}", g.errors);
        seen = g.probes_seen;
    }
    assert_eq!(
        drift.generations.last().unwrap().messages,
        long.history.messages.len()
    );
    let report = Report::new(
        Provenance {
            command: "test".into(),
            data: path.display().to_string(),
            data_sha256: sha256_file(&path).unwrap(),
            selection: "all".into(),
            drafter: "tiny-llama".into(),
            target: "tiny-qwen2".into(),
            compaction_config: toml::to_string(c.config()).unwrap(),
            eval_config: toml::to_string(&prompts).unwrap(),
            tail_budget: "matched".into(),
            revision: "test".into(),
            runtime: "cpu".into(),
        },
        opts.methods.clone(),
        results,
        vec![drift],
        500,
        1,
    );
    assert_eq!(
        report.provenance.data_sha256,
        "c816813d7d582d77059ba2f16cdde9206a0a114b56864db8db836af75db5e62e"
    );
    let md = report.markdown();
    for m in EvalMethod::ALL {
        assert!(md.contains(&format!("\n| {m} | 6 (0) |")), "{m}:\n{md}");
    }
    assert!(md.contains("## Speculative − sequential") && md.contains("## Drift:"));
    let json = serde_json::to_string(&report).unwrap();
    assert!(json.contains("\"qa_delta\""));
    let plots = report.plots();
    assert_eq!(plots.len(), 2);
    assert!(plots
        .iter()
        .all(|(_, svg)| svg.starts_with("<svg") && svg.contains("full")));
}
