//! A safetensors model in the standard Hugging Face hub cache, resolved by store name in
//! offline mode and loaded end to end (nothing can be downloaded here).

use candle_core::Device;
use speccompact_runtime::synthetic::TinyModel;
use speccompact_runtime::{Architecture, LoadOptions, LogitsAt, Model, Row};
use speccompact_store::{HubCache, Manifest, Store};

#[test]
fn hub_cached_model_loads_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("download");
    TinyModel {
        shards: 2,
        ..TinyModel::new(Architecture::Qwen3)
    }
    .write_safetensors(&folder)
    .unwrap();
    let hub = HubCache {
        root: tmp.path().join("hub"),
        offline: true,
    };
    hub.import_folder("tiny-org/tiny-qwen3", "main", &"a".repeat(40), &folder)
        .unwrap();
    let manifest = Manifest::parse(
        r#"name = "tiny-qwen3"
architecture = "qwen3"
licence = "MIT"
network = true
[source]
kind = "hugging-face"
repo = "tiny-org/tiny-qwen3"
files = ["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "tokenizer.json", "tokenizer_config.json"]
"#,
        "tiny-qwen3.toml",
    )
    .unwrap();
    let store = Store::with_manifests(tmp.path().join("home"), vec![manifest])
        .unwrap()
        .with_hub(hub);
    let dir = store.resolve("tiny-qwen3", &mut |_| {}).unwrap();
    let m = Model::load(&dir, &Device::Cpu, LoadOptions::default()).unwrap();
    let direct = Model::load(&folder, &Device::Cpu, LoadOptions::default()).unwrap();
    let toks: Vec<u32> = (1..10).collect();
    let run = |m: &Model| {
        let mut s = m.decoder.new_sequence();
        m.decoder
            .forward(
                &mut [Row {
                    seq: &mut s,
                    tokens: &toks,
                }],
                LogitsAt::Last,
            )
            .unwrap()
            .remove(0)
    };
    let d = (run(&m) - run(&direct))
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert_eq!(d, 0.0);
    assert!(m.chat_template.is_some());
}
