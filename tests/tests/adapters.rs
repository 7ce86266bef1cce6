//! LoRA adapters: PEFT's layout (round trip, an adapter PEFT wrote, bad files named), the
//! base check, the llama q/k row permutation (rows, and whole models against the Hugging
//! Face dense reference), the side path on quantized weights against the adapter merged into
//! dense copies, batch invariance with side paths, and the loader's refusal of another base.

use candle_core::{Device, Tensor};
use speccompact_runtime::adapter::{interleave_rope_rows, peft_key, CONFIG_FILE, WEIGHTS_FILE};
use speccompact_runtime::synthetic::{Rng, TinyModel};
use speccompact_runtime::{
    Adapter, Architecture, DenseMode, LoadOptions, LogitsAt, LoraPair, Model, Pass, Row,
};
use speccompact_tests::{rel_l2, tokens};
use std::collections::BTreeMap;
use std::path::Path;

const HIDDEN: usize = 32;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = 8;

fn rand(shape: (usize, usize), seed: u64) -> Tensor {
    Rng::new(seed)
        .tensor(&[shape.0, shape.1], 0.5, 0.0)
        .unwrap()
}

fn adapter(base: Option<&str>) -> Adapter {
    let r = 4;
    let mut pairs = BTreeMap::new();
    for layer in 0..2 {
        for (i, (module, out)) in [
            ("q_proj", HEADS * HD),
            ("k_proj", KV_HEADS * HD),
            ("v_proj", KV_HEADS * HD),
        ]
        .into_iter()
        .enumerate()
        {
            let seed = (layer * 10 + i) as u64;
            pairs.insert(
                (layer, module.to_string()),
                LoraPair {
                    a: rand((r, HIDDEN), seed),
                    b: rand((out, r), seed + 100),
                },
            );
        }
    }
    Adapter {
        r,
        alpha: 8.0,
        target_modules: vec!["q_proj".into(), "k_proj".into(), "v_proj".into()],
        base_name: "tiny-llama".into(),
        base_sha256: base.map(str::to_string),
        pairs,
    }
}

fn same(a: &Tensor, b: &Tensor) -> bool {
    a.dims() == b.dims()
        && a.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            == b.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    speccompact_tests::max_diff(a, b).unwrap()
}

#[test]
fn an_adapter_round_trips_through_the_peft_layout() {
    let dir = tempfile::tempdir().unwrap();
    let a = adapter(Some("ab12"));
    a.save(dir.path()).unwrap();
    let b = Adapter::load(dir.path(), &Device::Cpu).unwrap();
    assert_eq!((b.r, b.alpha, b.scale()), (4, 8.0, 2.0));
    assert_eq!(b.target_modules, a.target_modules);
    assert_eq!(b.base_name, "tiny-llama");
    assert_eq!(b.base_sha256.as_deref(), Some("ab12"));
    assert_eq!(b.pairs.len(), 6);
    for (k, p) in &a.pairs {
        let q = &b.pairs[k];
        assert!(same(&p.a, &q.a) && same(&p.b, &q.b), "{k:?}");
    }
    // The files are PEFT's: its config keys and tensor names.
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(CONFIG_FILE)).unwrap())
            .unwrap();
    assert_eq!(c["peft_type"], "LORA");
    assert_eq!(c["lora_alpha"], 8.0);
    let t = candle_core::safetensors::load(dir.path().join(WEIGHTS_FILE), &Device::Cpu).unwrap();
    assert!(t.contains_key("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"));
    assert_eq!(t.len(), 12);
}

/// An adapter as PEFT's `save_pretrained` writes it (its config keys, no base checksum).
fn write_peft(dir: &Path, target_modules: serde_json::Value, tensors: &[(String, Tensor)]) {
    let config = serde_json::json!({
        "alpha_pattern": {}, "auto_mapping": null, "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "bias": "none", "fan_in_fan_out": false, "inference_mode": true, "init_lora_weights": true,
        "layers_pattern": null, "layers_to_transform": null, "lora_alpha": 32, "lora_dropout": 0.05,
        "modules_to_save": null, "peft_type": "LORA", "r": 4, "rank_pattern": {}, "revision": null,
        "target_modules": target_modules, "task_type": "CAUSAL_LM", "use_dora": false, "use_rslora": false
    });
    std::fs::write(dir.join(CONFIG_FILE), config.to_string()).unwrap();
    let map: std::collections::HashMap<String, Tensor> = tensors.iter().cloned().collect();
    candle_core::safetensors::save(&map, dir.join(WEIGHTS_FILE)).unwrap();
}

#[test]
fn an_adapter_written_by_peft_loads_and_bad_ones_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let good = vec![
        (peft_key(0, "up_proj", "A"), rand((4, HIDDEN), 1)),
        (peft_key(0, "up_proj", "B"), rand((64, 4), 2)),
        (peft_key(0, "o_proj", "A"), rand((4, HIDDEN), 3)),
        (peft_key(0, "o_proj", "B"), rand((HIDDEN, 4), 4)),
    ];
    assert_eq!(
        good[0].0,
        "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight"
    );
    write_peft(dir.path(), serde_json::json!(["o_proj", "up_proj"]), &good);
    let a = Adapter::load(dir.path(), &Device::Cpu).unwrap();
    assert_eq!((a.r, a.scale(), a.base_sha256.as_deref()), (4, 8.0, None));
    // Without a recorded checksum any base is taken.
    a.check_base(dir.path(), "cafe").unwrap();
    let d = a.delta(0, "up_proj").unwrap().unwrap();
    let want = (good[1].1.matmul(&good[0].1).unwrap() * 8.0).unwrap();
    assert!(same(&d, &want));
    assert!(a.delta(0, "q_proj").unwrap().is_none());

    type Case<'a> = (serde_json::Value, Vec<(String, Tensor)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            serde_json::json!("all-linear"),
            good.clone(),
            "must be a list of names",
        ),
        (
            serde_json::json!(["o_proj", "lm_head"]),
            good.clone(),
            "lm_head is not a projection",
        ),
        (
            serde_json::json!(["o_proj"]),
            good.clone(),
            "up_proj is not in target_modules",
        ),
        (
            serde_json::json!(["o_proj", "up_proj"]),
            good[..3].to_vec(),
            "lora_A or lora_B missing",
        ),
        (
            serde_json::json!(["o_proj", "up_proj"]),
            vec![
                good[0].clone(),
                (peft_key(0, "up_proj", "B"), rand((64, 3), 2)),
            ],
            "do not have rank r = 4",
        ),
        (
            serde_json::json!(["o_proj", "up_proj"]),
            vec![("base_model.model.lm_head.weight".into(), rand((4, 4), 9))],
            "unexpected tensor base_model.model.lm_head.weight",
        ),
    ];
    for (modules, tensors, needle) in cases {
        let d = tempfile::tempdir().unwrap();
        write_peft(d.path(), modules, &tensors);
        let err = Adapter::load(d.path(), &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "`{needle}` not in: {err}");
    }
    let err = Adapter::load(Path::new("/nonexistent/adapter"), &Device::Cpu).unwrap_err();
    assert!(err.to_string().contains("adapter_config.json"), "{err}");
}

#[test]
fn a_wrong_base_is_refused() {
    let a = adapter(Some("ab12"));
    a.check_base(Path::new("x"), "ab12").unwrap();
    let err = a
        .check_base(Path::new("x"), "cd34")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ab12") && err.contains("cd34") && err.contains("tiny-llama"),
        "{err}"
    );
}

/// llama.cpp's converter on q/k rows, index by index: within each head, row `i` of the first
/// half goes to `2i` and row `i` of the second half to `2i + 1`.
fn converter_permute(w: &Tensor, heads: usize, hd: usize) -> Tensor {
    let rows: Vec<Vec<f32>> = w.to_vec2().unwrap();
    let mut out = rows.clone();
    for h in 0..heads {
        for i in 0..hd / 2 {
            out[h * hd + 2 * i] = rows[h * hd + i].clone();
            out[h * hd + 2 * i + 1] = rows[h * hd + hd / 2 + i].clone();
        }
    }
    Tensor::new(out, &Device::Cpu).unwrap()
}

/// The converter permutes a llama model's q and k rows; an adapter permuted the same way acts
/// on the permuted weights as the original acts on the original ones.
#[test]
fn the_llama_qk_permutation_matches_the_dense_reference() {
    let a = adapter(None);
    let g = a.for_interleaved_rope(HEADS, KV_HEADS, HD, false).unwrap();
    for ((layer, module), heads) in [((0, "q_proj"), HEADS), ((1, "k_proj"), KV_HEADS)] {
        let w = rand((heads * HD, HIDDEN), 42);
        let merged = (&w + a.delta(layer, module).unwrap().unwrap()).unwrap();
        // Reference: the converter's permutation of the merged Hugging Face weight.
        let reference = converter_permute(&merged, heads, HD);
        let permuted_w = converter_permute(&w, heads, HD);
        let ours = (&permuted_w + g.delta(layer, module).unwrap().unwrap()).unwrap();
        assert!(max_diff(&reference, &ours) < 1e-6, "{module}");
        // Our row permutation is the converter's, and its inverse undoes it.
        assert!(same(
            &interleave_rope_rows(&w, heads, HD, false).unwrap(),
            &permuted_w
        ));
        assert!(same(
            &interleave_rope_rows(&permuted_w, heads, HD, true).unwrap(),
            &w
        ));
    }
    // v is not permuted; the inverse brings the adapter back.
    assert!(same(
        &g.pairs[&(0, "v_proj".into())].b,
        &a.pairs[&(0, "v_proj".into())].b
    ));
    let back = g.for_interleaved_rope(HEADS, KV_HEADS, HD, true).unwrap();
    for (k, p) in &a.pairs {
        assert!(same(&back.pairs[k].b, &p.b), "{k:?}");
    }
}

fn model_adapter(spec: &TinyModel, r: usize, base: Option<String>) -> Adapter {
    Adapter {
        base_sha256: base,
        ..spec.random_adapter(r, 11).unwrap()
    }
}

/// Logits of every token of `ids` in one forward of `pass` from an empty sequence.
fn logits(m: &Model, ids: &[u32], pass: Pass) -> Tensor {
    let d = &m.decoder;
    let mut seq = d.new_sequence();
    let rows = &mut [Row {
        seq: &mut seq,
        tokens: ids,
    }];
    d.forward_pass(rows, LogitsAt::All, pass).unwrap().remove(0)
}

fn load(path: &Path, dense: DenseMode) -> Model {
    let opts = LoadOptions {
        dense,
        ..LoadOptions::default()
    };
    Model::load(path, &Device::Cpu, opts).unwrap()
}

/// On 8-bit weights the side path `W x + s · B (A x)` (step forwards, and prefill without
/// dense copies) gives the logits of the adapter merged into f32 dense copies (prefill with
/// copies) within the base's own quantized-against-dense difference plus 0.01 (relative L2),
/// while the adapter moves the logits by more than ten times that.
#[test]
fn the_side_path_matches_the_adapter_merged_into_dense_copies() {
    let dir = tempfile::tempdir().unwrap();
    for arch in [Architecture::Qwen2, Architecture::Llama] {
        let spec = TinyModel::new(arch);
        let path = dir.path().join(format!("{arch:?}.gguf"));
        spec.write(&path).unwrap();
        let (quant, dense) = (
            load(&path, DenseMode::Off),
            load(&path, DenseMode::On { min_rows: 1 }),
        );
        let ad = model_adapter(&spec, 8, None);
        let (qa, da) = (
            quant.with_adapter(&ad).unwrap(),
            dense.with_adapter(&ad).unwrap(),
        );
        assert_eq!(qa.decoder.side_paths(), 7 * spec.layers, "{arch:?}");
        assert_eq!(quant.decoder.side_paths(), 0, "the base is left as it was");
        let ids = tokens(24, quant.decoder.config().vocab_size, 3);
        let base_gap = rel_l2(
            &logits(&quant, &ids, Pass::Prefill),
            &logits(&dense, &ids, Pass::Prefill),
        )
        .unwrap();
        let side = logits(&qa, &ids, Pass::Prefill);
        let merged = logits(&da, &ids, Pass::Prefill);
        let gap = rel_l2(&side, &merged).unwrap();
        let moved = rel_l2(&side, &logits(&quant, &ids, Pass::Prefill)).unwrap();
        println!("{arch:?}: side vs merged {gap:.5}, base quantized vs dense {base_gap:.5}, adapter moves {moved:.3}");
        assert!(gap <= base_gap + 0.01, "{arch:?}: {gap} against {base_gap}");
        assert!(moved > 10.0 * (base_gap + 0.01), "{arch:?}: moved {moved}");
        // Step forwards of the dense-copy model run the side path too: bitwise the
        // quantized model's.
        let bits = |m: &Model| -> Vec<u32> {
            let t = logits(m, &ids, Pass::Step).flatten_all().unwrap();
            t.to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        assert!(bits(&da) == bits(&qa), "{arch:?}: step forwards differ");
    }
}

/// A llama GGUF file holds q/k rows permuted for its rotary layout; the adapter, in Hugging
/// Face order, is permuted the same way: the GGUF model (f32 weights, so the adapter is
/// merged) gives the logits of the Hugging Face folder with the adapter within 1e-4, and the
/// unpermuted adapter would not.
#[test]
fn an_adapter_on_a_llama_gguf_matches_the_dense_hugging_face_reference() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinyModel {
        dtype: candle_core::quantized::GgmlDType::F32,
        ..TinyModel::new(Architecture::Llama)
    };
    let gguf = dir.path().join("llama.gguf");
    spec.write(&gguf).unwrap();
    let hf = dir.path().join("hf");
    spec.write_safetensors(&hf).unwrap();
    let (g, h) = (load(&gguf, DenseMode::Off), load(&hf, DenseMode::Off));
    let ad = model_adapter(&spec, 4, None);
    let ids = tokens(20, g.decoder.config().vocab_size, 5);
    let diff = |a: &Model, b: &Model| {
        max_diff(
            &logits(a, &ids, Pass::Prefill),
            &logits(b, &ids, Pass::Prefill),
        )
    };
    assert!(diff(&g, &h) < 1e-4, "bases differ by {}", diff(&g, &h));
    let (ga, ha) = (g.with_adapter(&ad).unwrap(), h.with_adapter(&ad).unwrap());
    assert_eq!(
        ga.decoder.side_paths(),
        0,
        "dense weights take the adapter merged"
    );
    let d = diff(&ga, &ha);
    assert!(d < 1e-4, "with the adapter: {d}");
    assert!(diff(&ga, &h) > 0.1, "the adapter must move the logits");
    // Undoing the permutation first leaves the adapter's q/k rows unpermuted on the GGUF.
    let hd = spec.hidden / spec.heads;
    let unpermuted = ad
        .for_interleaved_rope(spec.heads, spec.kv_heads, hd, true)
        .unwrap();
    let wrong = diff(&g.with_adapter(&unpermuted).unwrap(), &ha);
    assert!(wrong > 100.0 * d.max(1e-6), "unpermuted: {wrong}");
}

/// With side paths a token's logits stay bitwise the same alone and in a batch of rows.
#[test]
fn side_paths_keep_step_forwards_batch_invariant() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinyModel::new(Architecture::Llama);
    let path = dir.path().join("m.gguf");
    spec.write(&path).unwrap();
    let m = load(&path, DenseMode::Off)
        .with_adapter(&model_adapter(&spec, 8, None))
        .unwrap();
    let d = &m.decoder;
    assert!(d.batch_invariant());
    let v = d.config().vocab_size;
    let prefix = d.prefill(&tokens(40, v, 1), 16).unwrap().freeze().unwrap();
    let lines: Vec<Vec<u32>> = (0..5).map(|r| tokens(20, v, 20 + r)).collect();
    let mut seqs: Vec<_> = (0..5).map(|_| prefix.fork()).collect();
    let mut rows: Vec<Row<'_>> = seqs
        .iter_mut()
        .zip(&lines)
        .map(|(s, l)| Row { seq: s, tokens: l })
        .collect();
    let batch = d.forward(&mut rows, LogitsAt::All).unwrap();
    for r in [0, 4] {
        let mut s = prefix.fork();
        let alone = d
            .forward(
                &mut [Row {
                    seq: &mut s,
                    tokens: &lines[r],
                }],
                LogitsAt::All,
            )
            .unwrap();
        assert_eq!(
            alone[0].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            batch[r].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            "row {r}"
        );
    }
}

/// The loader puts an adapter on a model file it was trained on, and refuses another file
/// with both checksums in the error; a shape that does not fit names the weight.
#[test]
fn the_loader_refuses_an_adapter_trained_on_another_base() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinyModel::new(Architecture::Qwen2);
    let path = dir.path().join("m.gguf");
    spec.write(&path).unwrap();
    let (sha, _) = speccompact_store::sha256_file(&path).unwrap();
    let m = load(&path, DenseMode::Off);
    let good = dir.path().join("good");
    model_adapter(&spec, 4, Some(sha.clone()))
        .save(&good)
        .unwrap();
    let with = speccompact_loader::with_adapter(&m, &path, &good).unwrap();
    assert_eq!(with.decoder.side_paths(), 7 * spec.layers);
    let other = dir.path().join("other");
    model_adapter(&spec, 4, Some("0".repeat(64)))
        .save(&other)
        .unwrap();
    let err = speccompact_loader::with_adapter(&m, &path, &other)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&sha) && err.contains(&"0".repeat(64)), "{err}");
    // An adapter for a wider model.
    let wide = TinyModel {
        hidden: 128,
        ..spec.clone()
    };
    let err = m
        .with_adapter(&model_adapter(&wide, 4, None))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("blk.0.") && err.contains("do not fit"),
        "{err}"
    );
}
