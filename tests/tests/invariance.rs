//! Batch invariance and determinism: a token's logits from a step forward are bitwise the
//! same decoded alone, checked with the other 31 tokens of its line, or in a batch of 6 rows
//! x 32 tokens over a shared prefix; the same compaction twice in one process, with the
//! models loaded afresh (kernel and dense choices made again), is byte-identical.

use candle_core::{Device, Tensor};
use speccompact_engine::{CompactionConfig, Compactor, Method, ModelBackend};
use speccompact_runtime::settings::RuntimeSettings;
use speccompact_runtime::synthetic::TinyModel;
use speccompact_runtime::{Architecture, LoadOptions, LogitsAt, Model, Row, Sequence};
use speccompact_tests::{retry_history, tiny_model_variety, tokens};
use std::sync::Arc;

type R<T> = anyhow::Result<T>;

fn bits(t: &Tensor) -> R<Vec<u32>> {
    Ok(t.flatten_all()?
        .to_vec1::<f32>()?
        .into_iter()
        .map(f32::to_bits)
        .collect())
}

#[test]
fn a_tokens_logits_are_bitwise_equal_alone_and_in_a_batch_of_6_rows_by_32_tokens() -> R<()> {
    let dir = tempfile::tempdir()?;
    for (k, spec) in tiny_model_variety().into_iter().enumerate() {
        let path = dir.path().join(format!("m{k}.gguf"));
        spec.write(&path)?;
        let m = Model::load(&path, &Device::Cpu, LoadOptions::default())?;
        let d = &m.decoder;
        let v = d.config().vocab_size;
        // A prefix prefilled in chunks (the prefill pass), rows with their own cached
        // suffixes of different lengths.
        let prefix = d.prefill(&tokens(100, v, 1), 48)?.freeze()?;
        let cached: Vec<Vec<u32>> = (0..6).map(|r| tokens(r * 3, v, 10 + r as u32)).collect();
        let lines: Vec<Vec<u32>> = (0..6).map(|r| tokens(32, v, 20 + r as u32)).collect();
        let start = |r: usize| -> R<Sequence> {
            let mut s = prefix.fork();
            if !cached[r].is_empty() {
                d.forward(
                    &mut [Row {
                        seq: &mut s,
                        tokens: &cached[r],
                    }],
                    LogitsAt::Last,
                )?;
            }
            Ok(s)
        };
        // 6 rows x 32 tokens in one forward.
        let mut seqs: Vec<Sequence> = (0..6).map(start).collect::<R<_>>()?;
        let mut rows: Vec<Row<'_>> = seqs
            .iter_mut()
            .zip(&lines)
            .map(|(s, l)| Row { seq: s, tokens: l })
            .collect();
        let batch = d.forward(&mut rows, LogitsAt::All)?;
        for r in [0, 3, 5] {
            // The row alone, 32 tokens in one forward.
            let mut s = start(r)?;
            let alone = d
                .forward(
                    &mut [Row {
                        seq: &mut s,
                        tokens: &lines[r],
                    }],
                    LogitsAt::All,
                )?
                .remove(0);
            assert_eq!(
                bits(&alone)?,
                bits(&batch[r])?,
                "model {k} row {r}: 1x32 vs 6x32"
            );
            // Token by token, as greedy decoding computes them.
            let mut s = start(r)?;
            for (i, t) in lines[r].iter().enumerate() {
                let one = d
                    .forward(
                        &mut [Row {
                            seq: &mut s,
                            tokens: std::slice::from_ref(t),
                        }],
                        LogitsAt::Last,
                    )?
                    .remove(0);
                assert_eq!(
                    bits(&one)?,
                    bits(&batch[r].narrow(0, i, 1)?)?,
                    "model {k} row {r} token {i}: decoded alone vs 6x32"
                );
            }
        }
    }
    Ok(())
}

/// Loads both tiny models afresh with the runtime's default settings (so every load-time
/// choice is made again) and compacts with every method.
fn compact_all(dir: &std::path::Path) -> R<Vec<String>> {
    let opts = RuntimeSettings::default().load_options();
    let load = |arch: Architecture, seed: u64| -> R<ModelBackend> {
        let mut t = TinyModel::new(arch);
        t.seed = seed;
        let path = dir.join(format!("{arch:?}-{seed}.gguf"));
        if !path.exists() {
            t.write(&path)?;
        }
        let m = Model::load(&path, &Device::Cpu, opts)?;
        Ok(ModelBackend::new(
            &format!("tiny-{arch:?}"),
            Arc::new(m),
            64,
        )?)
    };
    let mut cfg = CompactionConfig::default();
    cfg.slot_max_tokens = 40;
    cfg.draft_tokens = 12;
    let c = Compactor::new(
        load(Architecture::Llama, 3)?,
        load(Architecture::Qwen2, 5)?,
        cfg,
    )?;
    let mut out = Vec::new();
    for method in [
        Method::Speculative,
        Method::Sequential,
        Method::TargetSelf,
        Method::DrafterOnly,
    ] {
        let r = c.compact_blocking(&retry_history(), method, &mut |_| {})?;
        let lines: Vec<String> = r
            .slots
            .iter()
            .flat_map(|s| &s.lines)
            .map(|l| format!("{:?} {:?} {}", l.origin, l.r, l.text))
            .collect();
        out.push(format!("{}\n{}", r.markdown, lines.join("\n")));
    }
    Ok(out)
}

#[test]
fn the_same_compaction_twice_in_one_process_is_byte_identical() -> R<()> {
    let dir = tempfile::tempdir()?;
    let first = compact_all(dir.path())?;
    let second = compact_all(dir.path())?;
    assert_eq!(first.len(), 4);
    for (a, b) in first.iter().zip(&second) {
        assert_eq!(a, b);
    }
    Ok(())
}
