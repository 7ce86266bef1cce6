//! The training forward against the runtime's logits, the loss masked to the body, the
//! frozen projection's gradient, and LoRA training lowering the loss on a tiny model.

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor, Var};
use candle_nn::Optimizer;
use speccompact_align::train::{DenseModel, FrozenLinear};
use speccompact_runtime::adapter::MODULES;
use speccompact_runtime::synthetic::TinyModel;
use speccompact_runtime::weights::GgufWeights;
use speccompact_runtime::{read_gguf, Architecture, LoadOptions, LogitsAt, Model, Row};

fn tiny(arch: Architecture, dir: &std::path::Path) -> std::path::PathBuf {
    let mut t = TinyModel::new(arch);
    t.dtype = GgmlDType::F32;
    t.seed = 7;
    let p = dir.join(format!("{arch:?}.gguf"));
    t.write(&p).unwrap();
    p
}

fn dense(path: &std::path::Path) -> DenseModel {
    let (ct, mut f) = read_gguf(path).unwrap();
    let mut src = GgufWeights::new(&ct, &mut f, &Device::Cpu).unwrap();
    DenseModel::load(&mut src).unwrap()
}

fn ids(n: usize, vocab: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 101 + 11) % vocab as u32)
        .collect()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// With the side paths at zero, the training forward gives the runtime's logits (llama GGUF
/// with interleaved rotary pairs, qwen2 with biases and rotate-half pairs) within 1e-4.
#[test]
fn the_training_forward_matches_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let path = tiny(arch, dir.path());
        let m = Model::load(&path, &Device::Cpu, LoadOptions::default()).unwrap();
        let toks = ids(24, m.decoder.config().vocab_size, 3);
        let mut seq = m.decoder.new_sequence();
        let want = m
            .decoder
            .forward(
                &mut [Row {
                    seq: &mut seq,
                    tokens: &toks,
                }],
                LogitsAt::All,
            )
            .unwrap()
            .remove(0);
        let d = dense(&path);
        let ours = d.logits(&toks, None).unwrap();
        let diff = max_diff(&want, &ours);
        eprintln!("{arch:?}: max |runtime - training forward| = {diff:e}");
        assert!(diff < 1e-4, "{arch:?}: {diff}");
        let modules: Vec<String> = MODULES.iter().map(|(m, _)| m.to_string()).collect();
        let lora = d.lora(4, 8.0, &modules, 1).unwrap();
        let with = d.logits(&toks, Some(&lora)).unwrap();
        assert_eq!(
            max_diff(&ours, &with),
            0.0,
            "{arch:?}: zero B changes nothing"
        );
    }
}

/// The loss is the mean NLL of the labelled tokens under the logits, and only those: a
/// prompt position's label is what keeps it out.
#[test]
fn the_loss_covers_the_body_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dense(&tiny(Architecture::Llama, dir.path()));
    let toks = ids(20, d.cfg.vocab_size, 5);
    let prompt = 12;
    let labels: Vec<i64> = toks
        .iter()
        .enumerate()
        .map(|(i, &t)| if i < prompt { -100 } else { i64::from(t) })
        .collect();
    let (loss, n) = d.loss(&toks, &labels, None).unwrap();
    assert_eq!(n, 20 - prompt);
    let logits = d.logits(&toks, None).unwrap();
    let lp = candle_nn::ops::log_softmax(&logits, 1).unwrap();
    let mut want = 0f64;
    for i in prompt - 1..19 {
        let v: f32 = lp
            .get(i)
            .unwrap()
            .get(toks[i + 1] as usize)
            .unwrap()
            .to_scalar()
            .unwrap();
        want -= f64::from(v);
    }
    want /= n as f64;
    let got: f32 = loss.to_scalar().unwrap();
    assert!((f64::from(got) - want).abs() < 1e-4, "{got} vs {want}");
    // Labelling one prompt token brings it in.
    let mut more = labels.clone();
    more[5] = i64::from(toks[5]);
    let (l2, n2) = d.loss(&toks, &more, None).unwrap();
    assert_eq!(n2, n + 1);
    assert_ne!(l2.to_scalar::<f32>().unwrap(), got);
    // An example with nothing labelled is refused, not a NaN.
    assert!(d.loss(&toks, &[-100; 20], None).is_err());
}

/// The frozen projection's backward gives the input the same gradient as a plain matmul with
/// a constant weight.
#[test]
fn the_frozen_projection_backpropagates_to_its_input() {
    let w = Tensor::arange(0f32, 12.0, &Device::Cpu)
        .unwrap()
        .reshape((3, 4))
        .unwrap();
    let w = (w / 7.0).unwrap().sin().unwrap();
    let x = Var::from_tensor(
        &(Tensor::arange(0f32, 8.0, &Device::Cpu)
            .unwrap()
            .reshape((2, 4))
            .unwrap()
            / 3.0)
            .unwrap()
            .cos()
            .unwrap(),
    )
    .unwrap();
    let y1 = x
        .as_tensor()
        .apply_op1(FrozenLinear { w: w.clone() })
        .unwrap();
    let y2 = x.as_tensor().matmul(&w.t().unwrap()).unwrap();
    assert!(max_diff(&y1, &y2) < 1e-6);
    let g1 = y1.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    let g2 = y2.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    let (a, b) = (
        g1.get(x.as_tensor()).unwrap(),
        g2.get(x.as_tensor()).unwrap(),
    );
    assert!(max_diff(a, b) < 1e-5);
    assert!(g1.get(&w).is_none());
}

/// Forty AdamW steps on three examples bring the training loss of the adapted tiny model
/// below half of where it started.
#[test]
fn lora_training_lowers_the_loss() {
    let dir = tempfile::tempdir().unwrap();
    let d = dense(&tiny(Architecture::Llama, dir.path()));
    let modules: Vec<String> = ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
        .map(String::from)
        .to_vec();
    let lora = d.lora(8, 16.0, &modules, 2).unwrap();
    let examples: Vec<(Vec<u32>, Vec<i64>)> = (0..3)
        .map(|s| {
            let t = ids(16, d.cfg.vocab_size, 10 + s);
            let l = t
                .iter()
                .enumerate()
                .map(|(i, &x)| if i < 6 { -100 } else { i64::from(x) })
                .collect();
            (t, l)
        })
        .collect();
    let total = |lo| -> f32 {
        examples
            .iter()
            .map(|(t, l)| d.loss(t, l, lo).unwrap().0.to_scalar::<f32>().unwrap())
            .sum::<f32>()
            / 3.0
    };
    let before = total(Some(&lora));
    let mut opt = candle_nn::AdamW::new(
        lora.all_vars(),
        candle_nn::ParamsAdamW {
            lr: 1e-2,
            weight_decay: 0.0,
            ..Default::default()
        },
    )
    .unwrap();
    for _ in 0..40 {
        let mut sum: Option<Tensor> = None;
        for (t, l) in &examples {
            let (loss, _) = d.loss(t, l, Some(&lora)).unwrap();
            sum = Some(match sum {
                Some(s) => (s + loss).unwrap(),
                None => loss,
            });
        }
        opt.backward_step(&(sum.unwrap() / 3.0).unwrap()).unwrap();
    }
    let after = total(Some(&lora));
    eprintln!("training loss {before} -> {after}");
    assert!(after < before / 2.0, "loss {before} -> {after}");
    // The base is untouched: without the side paths the loss is the starting one.
    assert!((total(None) - before).abs() < 1e-5);
}

/// The block-at-a-time gradients equal the whole graph's, with or without the frozen
/// weights' gradients computed.
#[test]
fn checkpointed_gradients_equal_the_whole_graph() {
    let dir = tempfile::tempdir().unwrap();
    let d = dense(&tiny(Architecture::Qwen2, dir.path()));
    let modules: Vec<String> = ["q_proj", "k_proj", "down_proj"].map(String::from).to_vec();
    let lora = d.lora(4, 8.0, &modules, 3).unwrap();
    // Non-zero B so every path carries a gradient.
    for v in lora.all_vars() {
        v.set(&(v.as_tensor().ones_like().unwrap() * 0.05).unwrap())
            .unwrap();
    }
    let toks = ids(18, d.cfg.vocab_size, 9);
    let labels: Vec<i64> = toks
        .iter()
        .enumerate()
        .map(|(i, &t)| if i < 7 { -100 } else { i64::from(t) })
        .collect();
    let (loss, _) = d.loss(&toks, &labels, Some(&lora)).unwrap();
    let whole = loss.backward().unwrap();
    // Block at a time with the frozen-projection op, and with candle's matmul (whose
    // backward also computes the frozen weights' gradients): the same loss and gradients.
    let plain = d.clone().with_weight_gradients();
    for m in [&d, &plain] {
        let step = speccompact_align::train::checkpointed::loss_and_grads(m, &toks, &labels, &lora)
            .unwrap();
        assert!((step.loss - loss.to_scalar::<f32>().unwrap()).abs() < 1e-6);
        for (v, g) in lora.all_vars().iter().zip(&step.grads) {
            let w = whole.get(v.as_tensor()).unwrap();
            let scale: f32 = w.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
            assert!(
                max_diff(w, g) <= 1e-4 * scale.max(1e-6),
                "{} vs {scale}",
                max_diff(w, g)
            );
        }
    }
}

/// A run stopped after five steps and resumed writes the same adapter and losses as one that
/// was not stopped; the validation loss falls; other settings cannot resume its checkpoint.
#[test]
fn a_run_resumes_to_the_same_adapter_and_validation_falls() {
    use speccompact_align::train::{train, TokenExample, TrainOptions};
    let dir = tempfile::tempdir().unwrap();
    let d = dense(&tiny(Architecture::Llama, dir.path()));
    let ex: Vec<TokenExample> = (0..4)
        .map(|s| {
            let t = ids(14, d.cfg.vocab_size, 20 + s);
            let labels = t
                .iter()
                .enumerate()
                .map(|(i, &x)| if i < 5 { -100 } else { i64::from(x) })
                .collect();
            TokenExample {
                input_ids: t,
                labels,
            }
        })
        .collect();
    let opts = TrainOptions {
        r: 4,
        alpha: 8.0,
        epochs: 3,
        lr: 1e-2,
        warmup: 2,
        checkpoint_every: 3,
        seed: 5,
        ..Default::default()
    };
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let run = |out: &std::path::Path, stop_after: Option<usize>| {
        let base = ("tiny", Some("ab".to_string()));
        train(
            &d,
            (&ex, &ex[..2]),
            &opts,
            out,
            base,
            stop_after,
            &mut |_| {},
        )
        .unwrap()
    };
    let sa = run(&a, None);
    let sb = run(&b, Some(5));
    assert_eq!(sb.step, 5);
    assert!(!b.join("adapter").exists());
    let sb = run(&b, None);
    assert_eq!((sa.step, sb.step), (12, 12));
    assert_eq!(sa.train_loss, sb.train_loss);
    for f in [
        "adapter/adapter_model.safetensors",
        "adapter/adapter_config.json",
        "losses.json",
    ] {
        assert_eq!(
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(b.join(f)).unwrap(),
            "{f}"
        );
    }
    eprintln!("validation {:?}", sa.validation);
    let steps: Vec<usize> = sa.validation.iter().map(|v| v.0).collect();
    assert_eq!(steps, [0, 4, 8, 12]);
    assert!(
        sa.validation[3].1 < sa.validation[0].1 * 0.8,
        "{:?}",
        sa.validation
    );
    // The adapter loads back, in the Hugging Face row order, with its base recorded.
    let ad = speccompact_runtime::Adapter::load(&a.join("adapter"), &Device::Cpu).unwrap();
    assert_eq!((ad.r, ad.base_sha256.as_deref()), (4, Some("ab")));
    let other = TrainOptions { lr: 2e-2, ..opts };
    let err = train(
        &d,
        (&ex, &ex[..2]),
        &other,
        &b,
        ("tiny", None),
        None,
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("other settings"), "{err}");
}
