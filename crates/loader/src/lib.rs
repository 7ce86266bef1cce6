//! From model names to a ready [`Compactor`]: both models resolved in the model store
//! (fetched on first use), loaded with the runtime settings, and the target's built-in
//! calibration applied to the keys the user left unset, and the drafter's LoRA adapter
//! (checked against the drafter file it was trained on) put on. The engine itself knows
//! nothing of the store; this crate joins the two.

use speccompact_engine::calibration::{builtin_variants, Calibrations};
use speccompact_engine::{CompactionConfig, Compactor, ModelBackend};
use speccompact_runtime::{parse_device, Adapter, Model, RuntimeSettings};
use speccompact_store::{Progress, Store};
use std::path::Path;
use std::sync::Arc;

/// Why a compactor could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model could not be found or fetched.
    #[error(transparent)]
    Store(#[from] speccompact_store::StoreError),
    /// A model failed to load.
    #[error(transparent)]
    Runtime(#[from] speccompact_runtime::Error),
    /// The settings or calibration are invalid.
    #[error(transparent)]
    Engine(#[from] speccompact_engine::Error),
}

/// `model` (loaded from `base`) with the adapter in `dir`, refused when the adapter records
/// another base file.
pub fn with_adapter(model: &Model, base: &Path, dir: &Path) -> Result<Model> {
    let adapter = Adapter::load(dir, model.decoder.device())?;
    if adapter.base_sha256.is_some() && base.is_file() {
        let (sha, _) = speccompact_store::sha256_file(base)?;
        adapter.check_base(dir, &sha)?;
    }
    let m = model.with_adapter(&adapter)?;
    tracing::info!(
        adapter = %dir.display(),
        r = adapter.r,
        alpha = adapter.alpha,
        side_paths = m.decoder.side_paths(),
        "drafter adapter"
    );
    Ok(m)
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Resolves both models by store name or path (fetching on first use), loads them with the
/// runtime settings, and builds a compactor. The target's entry in the built-in calibration
/// (`configs/calibration.toml`) sets η, the judgment prompt and the line rule where the
/// settings leave them unset (see [`CompactionConfig::apply_calibration`]). A drafter equal
/// to the target shares its weights. A drafter adapter is read from its folder, refused when
/// it records another base file than the drafter's, and put on the drafter (side paths
/// beside its quantized weights, which stay shared).
pub fn load_compactor(
    config: CompactionConfig,
    settings: &RuntimeSettings,
    store: &Store,
    progress: &mut dyn FnMut(Progress),
) -> Result<Compactor<ModelBackend>> {
    let mut config = config;
    if let Some(applied) = config.apply_calibration(&Calibrations::builtin()?, &builtin_variants()?)
    {
        tracing::info!(%applied, "calibrated verification");
    }
    config.validate("calibration")?;
    let device = parse_device(&settings.device)?;
    let opts = settings.load_options();
    let load = |name: &str, progress: &mut dyn FnMut(Progress)| -> Result<(Arc<Model>, _)> {
        let path = store.resolve(name, progress)?;
        Ok((Arc::new(Model::load(&path, &device, opts)?), path))
    };
    let backend = |name: &str, model: Arc<Model>| -> Result<ModelBackend> {
        Ok(ModelBackend::new(name, model, settings.prefill_chunk)?)
    };
    let (target_model, target_path) = load(&config.target, progress)?;
    let (drafter_model, drafter_path) = if config.drafter == config.target {
        (target_model.clone(), target_path)
    } else {
        load(&config.drafter, progress)?
    };
    let drafter_model = match &config.drafter_adapter {
        Some(dir) => Arc::new(with_adapter(&drafter_model, &drafter_path, Path::new(dir))?),
        None => drafter_model,
    };
    let target = backend(&config.target, target_model)?;
    let drafter = backend(&config.drafter, drafter_model)?;
    Ok(Compactor::new(drafter, target, config)?)
}
