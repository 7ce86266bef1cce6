//! Helpers for the workspace-level tests: locating real models in the store's cache.
//!
//! Real-model tests need the models fetched (`speccompact models fetch NAME`). With
//! `SPECCOMPACT_REQUIRE_MODELS=1` (as in CI) a missing model fails the test; otherwise the
//! test prints that it was skipped.

use speccompact_store::{Status, Store};
use std::path::PathBuf;

/// Path of a verified cached model, `None` (with a message) when absent and not required.
pub fn real_model(name: &str) -> Option<PathBuf> {
    let store = Store::open_default().expect("store manifests");
    let required = std::env::var("SPECCOMPACT_REQUIRE_MODELS").is_ok_and(|v| v == "1");
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
