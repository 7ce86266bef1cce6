//! Hub sources resolved from a local cache written in the standard hub layout
//! (`models--OWNER--NAME/refs/REV`, `snapshots/COMMIT/FILE -> ../../blobs/SHA256`).
//! Nothing is downloaded: the store runs in offline mode.

use sha2::{Digest, Sha256};
use speccompact_store::{HubCache, Manifest, Status, Store, StoreError};
use std::path::Path;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Writes `files` into a hub cache at `root` for `repo` at branch `main`.
fn write_hub_cache(root: &Path, repo: &str, files: &[(&str, &[u8])]) {
    let src = tempfile::tempdir().unwrap();
    for (name, data) in files {
        std::fs::write(src.path().join(name), data).unwrap();
    }
    let hub = HubCache {
        root: root.to_path_buf(),
        offline: true,
    };
    hub.import_folder(repo, "main", COMMIT, src.path()).unwrap();
}

fn manifest(revision: &str) -> Manifest {
    let text = format!(
        r#"name = "tiny-hub"
architecture = "qwen3"
licence = "MIT"
network = true
[source]
kind = "hugging-face"
repo = "tiny-org/tiny-model"
revision = "{revision}"
files = ["config.json", "model.safetensors"]
"#
    );
    Manifest::parse(&text, "tiny-hub.toml").unwrap()
}

fn store(root: &Path, revision: &str) -> Store {
    Store::with_manifests(root.join("home"), vec![manifest(revision)])
        .unwrap()
        .with_hub(HubCache {
            root: root.join("hub"),
            offline: true,
        })
}

#[test]
fn resolves_branch_and_commit_from_the_hub_cache() {
    let tmp = tempfile::tempdir().unwrap();
    write_hub_cache(
        &tmp.path().join("hub"),
        "tiny-org/tiny-model",
        &[
            ("config.json", b"{\"model_type\": \"qwen3\"}"),
            ("model.safetensors", b"weights"),
        ],
    );
    for rev in ["main", COMMIT] {
        let s = store(tmp.path(), rev);
        assert_eq!(s.verify("tiny-hub").unwrap(), Status::Verified, "{rev}");
        let dir = s.fetch("tiny-hub", &mut |_| {}).unwrap();
        assert!(
            dir.ends_with(format!("snapshots/{COMMIT}")),
            "{}",
            dir.display()
        );
        assert_eq!(
            std::fs::read(dir.join("model.safetensors")).unwrap(),
            b"weights"
        );
        assert_eq!(s.resolve("tiny-hub", &mut |_| {}).unwrap(), dir);
    }
}

#[test]
fn missing_files_offline_are_named_and_corrupt_blobs_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path(), "main");
    assert_eq!(s.verify("tiny-hub").unwrap(), Status::Missing);
    assert!(s
        .path("tiny-hub")
        .unwrap_err()
        .to_string()
        .contains("not in the hub cache"));
    write_hub_cache(
        &tmp.path().join("hub"),
        "tiny-org/tiny-model",
        &[("config.json", b"{}")],
    );
    let e = s.fetch("tiny-hub", &mut |_| {}).unwrap_err();
    assert!(matches!(e, StoreError::Unfetchable { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("offline")
            && msg.contains("model.safetensors")
            && !msg.contains("config.json,"),
        "{msg}"
    );
    // A blob whose content no longer matches its content address.
    let tmp = tempfile::tempdir().unwrap();
    write_hub_cache(
        &tmp.path().join("hub"),
        "tiny-org/tiny-model",
        &[("config.json", b"{}"), ("model.safetensors", b"weights")],
    );
    let blobs = tmp.path().join("hub/models--tiny-org--tiny-model/blobs");
    let blob = blobs.join(hex(b"weights"));
    std::fs::write(&blob, b"tampered").unwrap();
    let s = store(tmp.path(), "main");
    assert!(matches!(
        s.verify("tiny-hub").unwrap(),
        Status::Corrupt { .. }
    ));
}

#[test]
fn builtin_hub_manifests_are_marked_as_needing_network() {
    let all = Store::builtin().unwrap();
    for name in ["qwen3-0.6b", "qwen3-1.7b", "gemma-3-1b-it"] {
        let m = all
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name}"));
        assert!(m.network, "{name}");
    }
    assert!(all.iter().filter(|m| !m.network).count() >= 3);
}
