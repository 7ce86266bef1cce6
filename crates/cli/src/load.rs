//! Loading what the commands run on, with progress on the terminal: models resolved in the
//! store (fetched on first use, with a download bar), the compactor, a model's tokenizer
//! alone (for token counts without the weights), and the progress bars of long loops.

use crate::settings::EngineArgs;
use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use speccompact_engine::Compactor;
use speccompact_runtime::{read_gguf, RuntimeSettings, Tokenizer};
use speccompact_store::{Progress, Store};
use speccompact_workspace::TokenCounter;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// A download bar and the store callback that drives it.
pub fn download_bar() -> (ProgressBar, impl FnMut(Progress)) {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let b = bar.clone();
    let cb = move |p: Progress| match p {
        Progress::Downloading { index, parts } => {
            b.set_message(format!("part {}/{}", index + 1, parts))
        }
        Progress::Bytes { done, total } => {
            b.set_length(total);
            b.set_position(done);
        }
    };
    (bar, cb)
}

/// A bar over `len` steps drawn with `template` (indicatif's syntax).
pub fn counting_bar(len: usize, template: &str) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// A model by store name or path: a path is used as is, a name is fetched if needed.
pub fn resolve(store: &Store, name: &str) -> Result<PathBuf> {
    let (bar, mut cb) = download_bar();
    let p = store.resolve(name, &mut cb)?;
    bar.finish_and_clear();
    Ok(p)
}

/// The compaction settings of `engine` and both models, loaded with `settings`.
pub fn compactor(
    settings: &RuntimeSettings,
    store: &Store,
    engine: &EngineArgs,
) -> Result<Compactor> {
    compactor_with(engine.config()?, settings, store)
}

/// Both models of `cfg`, loaded with `settings`.
pub fn compactor_with(
    cfg: speccompact_engine::CompactionConfig,
    settings: &RuntimeSettings,
    store: &Store,
) -> Result<Compactor> {
    let (bar, mut cb) = download_bar();
    let t0 = Instant::now();
    let c = speccompact_loader::load_compactor(cfg, settings, store, &mut cb)?;
    bar.finish_and_clear();
    tracing::info!(
        drafter = c.config().drafter.as_str(),
        target = c.config().target.as_str(),
        ms = t0.elapsed().as_millis() as u64,
        "models loaded"
    );
    Ok(c)
}

/// The tokenizer of the model at `path`, as [`speccompact_runtime::Model::load`] would build
/// it, without its weights: a Hugging Face folder's `tokenizer.json`; for a GGUF file, a
/// `tokenizer.json` beside it, else the tokenizer in its metadata (only the header is read).
pub fn tokenizer(path: &Path) -> Result<Tokenizer> {
    let t = if path.is_dir() {
        Tokenizer::from_file(&path.join("tokenizer.json"))?
    } else {
        let (ct, _) = read_gguf(path)?;
        let beside = path
            .parent()
            .unwrap_or(Path::new("."))
            .join("tokenizer.json");
        if beside.is_file() {
            Tokenizer::from_file(&beside)?
        } else {
            Tokenizer::from_gguf(&ct)?
        }
    };
    Ok(t)
}

/// Counts tokens with the tokenizer of `model` (store name or path, fetched if needed), as
/// the engine counts them (no BOS). Text the tokenizer rejects counts as characters / 4.
pub fn token_counter(store: &Store, model: &str) -> Result<TokenCounter> {
    let path = resolve(store, model)?;
    let t = tokenizer(&path).with_context(|| format!("loading the tokenizer of {model}"))?;
    Ok(Arc::new(move |s: &str| {
        t.encode(s, false)
            .map_or_else(|_| s.chars().count().div_ceil(4), |ids| ids.len())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use speccompact_runtime::synthetic::TinyModel;
    use speccompact_runtime::{parse_device, Architecture, LoadOptions, Model};

    /// The tokenizer alone counts as the loaded model's tokenizer does, for a model given
    /// by path.
    #[test]
    fn token_counter_counts_with_the_models_tokenizer() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::with_manifests(dir.path().join("home"), Vec::new()).unwrap();
        let path = dir.path().join("tiny.gguf");
        TinyModel::new(Architecture::Qwen2).write(&path).unwrap();
        let count = token_counter(&store, &path.display().to_string()).unwrap();
        let m = Model::load(&path, &parse_device("cpu").unwrap(), LoadOptions::default()).unwrap();
        for text in [
            "",
            "Fix `UploadClient::retry` in src/upload.rs",
            "## Goal\n- keep 3 attempts\n",
        ] {
            assert_eq!(
                count(text),
                m.tokenizer.encode(text, false).unwrap().len(),
                "{text:?}"
            );
        }
    }
}
