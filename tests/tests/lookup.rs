//! Token lookup is lossless: with random-weight tiny models, greedy continuations and whole
//! compactions are byte-identical with lookup on and off, and the cache after a partly
//! rejected draft equals a fresh forward of the kept tokens.
//!
//! Tolerance: the rolled-back cache is compared with a fresh step forward of the same tokens
//! by the next token's logits, max absolute difference 1e-5 (step forwards are batch-invariant,
//! so the difference is 0 on CPU).

use candle_core::Device;
use speccompact_engine::{CompactionConfig, Compactor, Method, ModelBackend};
use speccompact_runtime::synthetic::TinyModel;
use speccompact_runtime::{
    greedy_rows_gated, Architecture, Continuation, LineMask, LineVerdict, LoadOptions, LogitsAt,
    LookupMode, Model, Row, Sequence, StopRules,
};
use speccompact_tests::{max_diff, retry_history, smoke_sessions, tiny_model_variety};
use std::sync::Arc;

type R<T> = anyhow::Result<T>;

/// Three rows over one prefix, each with other rules: a plain budget, a stop at the first
/// newline, line masks with a grace and a caller who stops after two lines.
fn run(m: &Model, prefix: &[u32], prompts: &[Vec<u32>]) -> R<(Vec<Continuation>, Vec<Sequence>)> {
    let shared = m.decoder.prefill(prefix, 16)?.freeze()?;
    let mut seqs: Vec<Sequence> = prompts.iter().map(|_| shared.fork()).collect();
    let mut plain = StopRules::new(&m.tokenizer, 48);
    plain.stop_tokens.clear();
    let mut masked = plain.clone();
    masked.max_new_tokens = 30;
    masked.line_grace = 8;
    masked.line_masks = vec![LineMask {
        line: String::new(),
        banned: vec![prompts[2][0]],
    }];
    let rules = vec![plain.clone(), plain.line(), masked];
    let mut refs: Vec<&mut Sequence> = seqs.iter_mut().collect();
    let ps: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let mut lines = [0usize; 3];
    let out = greedy_rows_gated(
        &m.decoder,
        &m.tokenizer,
        &mut refs,
        &ps,
        &rules,
        |_, _| Ok(()),
        |i, _| {
            lines[i] += 1;
            if i == 2 && lines[i] >= 2 {
                LineVerdict::Stop
            } else {
                LineVerdict::Continue
            }
        },
    )?;
    Ok((out, seqs))
}

#[test]
fn greedy_with_lookup_equals_greedy_without_and_the_cache_equals_a_fresh_forward() -> R<()> {
    let dir = tempfile::tempdir()?;
    let (mut drafted, mut kept) = (0, 0);
    for (k, spec) in tiny_model_variety().into_iter().enumerate() {
        let path = dir.path().join(format!("m{k}.gguf"));
        spec.write(&path)?;
        let base = Model::load(&path, &Device::Cpu, LoadOptions::default())?;
        let vocab = base.decoder.config().vocab_size as u32;
        // A prefix that repeats itself, so the text has earlier occurrences to match.
        let phrase: Vec<u32> = (0..12).map(|i| (i * 7 + 3) % vocab).collect();
        let prefix: Vec<u32> = [phrase.clone(), vec![5, 9], phrase.clone()].concat();
        let prompts = vec![
            phrase[..4].to_vec(),
            phrase[2..6].to_vec(),
            vec![phrase[6], phrase[7], phrase[8]],
        ];
        let off = base.with_lookup(LookupMode::Off);
        let on = base.with_lookup(LookupMode::On);
        let (want, want_seqs) = run(&off, &prefix, &prompts)?;
        let (got, got_seqs) = run(&on, &prefix, &prompts)?;
        assert_eq!(got, want, "{:?}: continuations", spec.arch);
        let c = on.decoder.lookup().counters();
        assert!(c.kept <= c.drafted, "{:?}: {c:?}", spec.arch);
        (drafted, kept) = (drafted + c.drafted, kept + c.kept);
        assert_eq!(off.decoder.lookup().counters().drafted, 0);
        for (r, (g, w)) in got_seqs.iter().zip(&want_seqs).enumerate() {
            assert_eq!(
                g.tokens(),
                w.tokens(),
                "{:?} row {r}: cached tokens",
                spec.arch
            );
            // The rolled-back cache against a fresh step forward of the same suffix.
            let probe = [phrase[1]];
            let mut rolled = g.fork();
            let mut fresh = g.prefix().expect("forked").fork();
            let fed = [g.suffix_tokens(), &probe].concat();
            let a = &on.decoder.forward(
                &mut [Row {
                    seq: &mut rolled,
                    tokens: &probe,
                }],
                LogitsAt::Last,
            )?[0];
            let b = &on.decoder.forward(
                &mut [Row {
                    seq: &mut fresh,
                    tokens: &fed,
                }],
                LogitsAt::Last,
            )?[0];
            let d = max_diff(a, b)?;
            assert!(d <= 1e-5, "{:?} row {r}: {d}", spec.arch);
        }
    }
    // Drafts were kept and drafts were rejected (so rollbacks were checked).
    assert!(kept > 0 && drafted > kept, "drafted {drafted}, kept {kept}");
    Ok(())
}

/// Every method (and the lossless verification mode) writes the same summary with lookup
/// on, auto and off, on the short history and the smoke sessions.
#[test]
fn compaction_with_lookup_equals_compaction_without_for_every_method() -> R<()> {
    let dir = tempfile::tempdir()?;
    let load = |arch: Architecture, seed: u64| -> R<Model> {
        let mut t = TinyModel::new(arch);
        t.seed = seed;
        t.context = 16384;
        let path = dir.path().join(format!("{arch:?}-{seed}.gguf"));
        t.write(&path)?;
        Ok(Model::load(&path, &Device::Cpu, LoadOptions::default())?)
    };
    let (drafter, target) = (load(Architecture::Llama, 3)?, load(Architecture::Qwen2, 5)?);
    let mut cfg = CompactionConfig::default();
    cfg.slot_max_tokens = 40;
    cfg.draft_tokens = 12;
    let mut exact = cfg.clone();
    exact.verify = speccompact_engine::verify::Verify::Exact;
    let pair = |mode: LookupMode, cfg: &CompactionConfig| -> R<Compactor> {
        let b = |m: &Model, name: &str| -> R<ModelBackend> {
            Ok(ModelBackend::new(name, Arc::new(m.with_lookup(mode)), 256)?)
        };
        Ok(Compactor::new(
            b(&drafter, "tiny-drafter")?,
            b(&target, "tiny-target")?,
            cfg.clone(),
        )?)
    };
    let mut histories = vec![retry_history()];
    histories.extend(smoke_sessions().unwrap_or_default());
    let runs = [
        (Method::Speculative, &cfg),
        (Method::Speculative, &exact),
        (Method::Sequential, &cfg),
        (Method::TargetSelf, &cfg),
        (Method::DrafterOnly, &cfg),
    ];
    let mut kept = 0;
    for (method, cfg) in runs {
        let [off, on, auto] =
            [LookupMode::Off, LookupMode::On, LookupMode::Auto].map(|m| pair(m, cfg));
        let (off, on, auto) = (off?, on?, auto?);
        for (k, h) in histories.iter().enumerate() {
            let want = off.compact_blocking(h, method, &mut |_| {})?;
            // `auto` on every history for one method, on the short one for the others.
            let modes = match (method, k) {
                (Method::Speculative, _) | (_, 0) => vec![("on", &on), ("auto", &auto)],
                _ => vec![("on", &on)],
            };
            for (mode, c) in modes {
                let got = c.compact_blocking(h, method, &mut |_| {})?;
                assert_eq!(
                    got.markdown, want.markdown,
                    "{method:?} lookup {mode}, history {k}"
                );
                let texts = |c: &speccompact_engine::Compaction| -> Vec<String> {
                    c.slots
                        .iter()
                        .flat_map(|s| &s.lines)
                        .map(|l| l.text.clone())
                        .collect()
                };
                assert_eq!(texts(&got), texts(&want));
                let t = got.trace.lookup.values().fold(0, |s, c| s + c.kept);
                assert!(got.trace.lookup.values().all(|c| c.kept <= c.drafted));
                if mode == "on" {
                    kept += t;
                }
            }
            assert!(want.trace.lookup.values().all(|c| c.drafted == 0));
        }
    }
    assert!(
        kept > 0,
        "lookup never kept a token: the test proves nothing"
    );
    Ok(())
}
