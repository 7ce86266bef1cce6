//! From model names to a ready [`Compactor`]: both models resolved in the model store
//! (fetched on first use), loaded with the runtime settings, and the target's built-in
//! calibration applied to the keys the user left unset. The engine itself knows nothing of
//! the store; this crate joins the two.

use speccompact_engine::calibration::{builtin_variants, Calibrations};
use speccompact_engine::{CompactionConfig, Compactor, ModelBackend};
use speccompact_runtime::{parse_device, Model, RuntimeSettings};
use speccompact_store::{Progress, Store};
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

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Resolves both models by store name or path (fetching on first use), loads them with the
/// runtime settings, and builds a compactor. The target's entry in the built-in calibration
/// (`configs/calibration.toml`) sets η, the judgment prompt and the line rule where the
/// settings leave them unset (see [`CompactionConfig::apply_calibration`]). A drafter equal
/// to the target shares its weights.
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
    let load = |name: &str, progress: &mut dyn FnMut(Progress)| -> Result<ModelBackend> {
        let path = store.resolve(name, progress)?;
        let model = Model::load(&path, &device, opts)?;
        Ok(ModelBackend::new(
            name,
            Arc::new(model),
            settings.prefill_chunk,
        )?)
    };
    let target = load(&config.target, progress)?;
    let drafter = if config.drafter == config.target {
        target.clone()
    } else {
        load(&config.drafter, progress)?
    };
    Ok(Compactor::new(drafter, target, config)?)
}
