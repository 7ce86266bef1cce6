//! Helpers for the workspace-level tests: locating real models in the store's cache, and
//! tiny random-weight model backends.
//!
//! Real-model tests need the models fetched (`speccompact models fetch NAME`). With
//! `SPECCOMPACT_REQUIRE_MODELS=1` (as in CI) a missing model fails the test; otherwise the
//! test prints that it was skipped.

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use speccompact_runtime::synthetic::TinyModel;
use speccompact_runtime::Architecture;
use speccompact_store::{Status, Store};
use std::path::PathBuf;

/// Path of a verified cached model, `None` (with a message) when absent and not required.
pub fn real_model(name: &str) -> Option<PathBuf> {
    real_model_if(name, true)
}

/// [`real_model`] for a model the test command does not fetch: skipped when absent, even
/// when real models are required.
pub fn optional_real_model(name: &str) -> Option<PathBuf> {
    real_model_if(name, false)
}

fn real_model_if(name: &str, may_require: bool) -> Option<PathBuf> {
    let store = Store::open_default().expect("store manifests");
    let required =
        may_require && std::env::var("SPECCOMPACT_REQUIRE_MODELS").is_ok_and(|v| v == "1");
    match store.verify(name).expect("verify") {
        Status::Verified => Some(store.path(name).expect("path")),
        other => {
            assert!(
                !required,
                "model {name} is required but {other:?}; run `speccompact models fetch {name}`"
            );
            eprintln!("skipped: model {name} not fetched ({other:?})");
            None
        }
    }
}

/// Deterministic token ids below `vocab` for numerical tests.
pub fn tokens(n: usize, vocab: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 101 + 11) % vocab as u32)
        .collect()
}

/// Largest absolute elementwise difference of two tensors of equal size.
pub fn max_diff(a: &Tensor, b: &Tensor) -> candle_core::Result<f32> {
    let a = a.to_device(&Device::Cpu)?.flatten_all()?;
    let b = b.to_device(&Device::Cpu)?.flatten_all()?;
    (a - b)?.abs()?.max_all()?.to_scalar::<f32>()
}

/// Relative L2 error of `b` against `a`.
pub fn rel_l2(a: &Tensor, b: &Tensor) -> candle_core::Result<f32> {
    let a = a.to_device(&Device::Cpu)?.flatten_all()?;
    let b = b.to_device(&Device::Cpu)?.flatten_all()?;
    let num = (&a - &b)?.sqr()?.sum_all()?.to_scalar::<f32>()?;
    let den = a.sqr()?.sum_all()?.to_scalar::<f32>()?;
    Ok((num / den).sqrt())
}

/// A backend over a tiny random-weight model of `arch`, written into `dir`.
pub fn tiny_backend(
    arch: speccompact_runtime::Architecture,
    seed: u64,
    dir: &std::path::Path,
    prefill_chunk: usize,
) -> speccompact_engine::ModelBackend {
    tiny_backend_with_context(arch, seed, dir, prefill_chunk, None)
}

/// [`tiny_backend`] with a chosen context length (`None`: the tiny models' default).
pub fn tiny_backend_with_context(
    arch: speccompact_runtime::Architecture,
    seed: u64,
    dir: &std::path::Path,
    prefill_chunk: usize,
    context: Option<usize>,
) -> speccompact_engine::ModelBackend {
    use speccompact_runtime::{synthetic::TinyModel, LoadOptions, Model};
    let mut t = TinyModel::new(arch);
    t.seed = seed;
    if let Some(c) = context {
        t.context = c;
    }
    let path = dir.join(format!("{arch:?}-{seed}-{}.gguf", t.context));
    t.write(&path).expect("write tiny model");
    let m = Model::load(&path, &Device::Cpu, LoadOptions::default()).expect("load tiny model");
    speccompact_engine::ModelBackend::new(
        &format!("tiny-{arch:?}"),
        std::sync::Arc::new(m),
        prefill_chunk,
    )
    .expect("tiny backend")
}

/// One tiny model per architecture (Q8_0) plus a Q4_K qwen2 with an untied output and a Q6_K
/// llama: the weight types and layouts every numerical property is checked on.
pub fn tiny_model_variety() -> Vec<TinyModel> {
    let mut kq = TinyModel::new(Architecture::Qwen2);
    kq.hidden = 256;
    kq.ffn = 512;
    kq.dtype = GgmlDType::Q4K;
    kq.untied_output = true;
    let mut q6 = TinyModel::new(Architecture::Llama);
    q6.hidden = 256;
    q6.ffn = 512;
    q6.dtype = GgmlDType::Q6K;
    let mut out: Vec<TinyModel> = [
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Gemma3,
    ]
    .into_iter()
    .map(TinyModel::new)
    .collect();
    out.extend([kq, q6]);
    out
}

/// A short coding history (a failing retry test and the planned fix) for tiny-model
/// compaction tests.
pub fn retry_history() -> speccompact_history::History {
    speccompact_history::parse_value(&serde_json::json!([
        {"role": "user", "content": "Fix the retry bug in src/upload.rs; keep the public API and do not retry on auth errors."},
        {"role": "assistant", "content": "Running the tests.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\":\"cargo test upload\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "bash", "content": "test upload::retries_three_times ... FAILED\nexpected 3 attempts, got 4"},
        {"role": "assistant", "content": "The loop uses <= MAX_RETRIES; changing it to attempt < MAX_RETRIES."}
    ]))
    .expect("the retry history parses")
}

/// The six smoke sessions' file, `None` (with a message) when the evaluation data is not
/// beside the repository; with `SPECCOMPACT_REQUIRE_DATA=1` (as in CI) its absence fails.
pub fn smoke_path() -> Option<PathBuf> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/evaldata/dev/smoke.jsonl");
    if path.exists() {
        return Some(path);
    }
    let required = std::env::var("SPECCOMPACT_REQUIRE_DATA").as_deref() == Ok("1");
    assert!(!required, "missing {}", path.display());
    eprintln!("skipped: {} not found", path.display());
    None
}

/// The six smoke sessions as histories (see [`smoke_path`]).
pub fn smoke_sessions() -> Option<Vec<speccompact_history::History>> {
    let text = std::fs::read_to_string(smoke_path()?).expect("smoke sessions readable");
    Some(speccompact_history::parse_sessions(&text).expect("smoke sessions parse"))
}
