//! The user-facing settings files in `configs/` are the same text as the defaults each crate
//! embeds from its own folder (so the crates package on their own and the files a user
//! copies say what the binary does).

use std::path::Path;

fn user_copy(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../configs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn configs_equal_the_embedded_defaults() {
    let embedded = [
        ("runtime.toml", speccompact_runtime::DEFAULT_RUNTIME),
        (
            "compaction.toml",
            speccompact_engine::config::DEFAULT_CONFIG,
        ),
        (
            "calibration.toml",
            speccompact_engine::calibration::DEFAULT_CALIBRATION,
        ),
        (
            "judge-variants.toml",
            speccompact_engine::calibration::DEFAULT_VARIANTS,
        ),
        ("eval.toml", speccompact_eval::models::DEFAULT_EVAL_CONFIG),
        (
            "workspace.toml",
            speccompact_workspace::config::DEFAULT_CONFIG,
        ),
    ];
    for (name, text) in embedded {
        assert!(
            user_copy(name) == text,
            "configs/{name} differs from the copy its crate embeds; copy one over the other"
        );
    }
    // Every file in configs/ is one of them.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    for e in std::fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        assert!(
            embedded.iter().any(|(n, _)| *n == name),
            "configs/{name} is not embedded by any crate"
        );
    }
}
