//! LoRA adapters in PEFT's layout: round trip, a PEFT-written adapter, the base check, bad
//! files named, and the llama q/k row permutation against the dense reference.

use candle_core::{Device, Tensor};
use speccompact_align::adapter::{interleave_rope_rows, peft_key, CONFIG_FILE, WEIGHTS_FILE};
use speccompact_align::{Adapter, LoraPair};
use std::collections::BTreeMap;
use std::path::Path;

const HIDDEN: usize = 32;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = 8;

fn rand(shape: (usize, usize), seed: u64) -> Tensor {
    let n = shape.0 * shape.1;
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
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
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap()
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
        let reference =
            speccompact_runtime::synthetic::permute_for_interleaved_rope(&merged, heads, HD)
                .unwrap();
        let permuted_w =
            speccompact_runtime::synthetic::permute_for_interleaved_rope(&w, heads, HD).unwrap();
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

/// The side path `W x + s · B (A x)` equals the merged `(W + s · B A) x` within 1e-5.
#[test]
fn the_side_path_equals_the_merged_weight() {
    let a = adapter(None);
    let x = rand((3, HIDDEN), 7);
    let w = rand((HEADS * HD, HIDDEN), 8);
    let p = &a.pairs[&(0, "q_proj".into())];
    let side = (x.matmul(&w.t().unwrap()).unwrap()
        + (x.matmul(&p.a.t().unwrap())
            .unwrap()
            .matmul(&p.b.t().unwrap())
            .unwrap()
            * f64::from(a.scale()))
        .unwrap())
    .unwrap();
    let merged_w = (&w + a.delta(0, "q_proj").unwrap().unwrap()).unwrap();
    let merged = x.matmul(&merged_w.t().unwrap()).unwrap();
    assert!(max_diff(&side, &merged) < 1e-5);
}
