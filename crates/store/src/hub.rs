//! Hugging Face hub sources: files resolved in the standard hub cache
//! (`$HF_HOME/hub`, default `~/.cache/huggingface/hub`, layout
//! `models--OWNER--NAME/{refs,snapshots,blobs}`), downloaded through hf-hub when missing
//! unless offline mode (`HF_HUB_OFFLINE=1`) is on.

use crate::{io_err, sha256_file, Result, Status, StoreError};
use hf_hub::{Repo, RepoType};
use std::path::{Path, PathBuf};

/// Where hub files live and whether the network may be used.
#[derive(Debug, Clone)]
pub struct HubCache {
    /// Root of the hub cache.
    pub root: PathBuf,
    /// Never download: resolve from the cache only.
    pub offline: bool,
}

impl Default for HubCache {
    fn default() -> Self {
        let offline = std::env::var("HF_HUB_OFFLINE")
            .is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        Self {
            root: hf_hub::Cache::from_env().path().clone(),
            offline,
        }
    }
}

fn repo(repo_id: &str, revision: &str) -> Repo {
    Repo::with_revision(repo_id.to_string(), RepoType::Model, revision.to_string())
}

impl HubCache {
    /// The snapshot folder of `repo_id` at `revision`, if the cache knows the revision:
    /// a branch or tag through `refs/`, or a commit hash directly.
    pub fn snapshot(&self, repo_id: &str, revision: &str) -> Option<PathBuf> {
        let dir = self.root.join(repo(repo_id, revision).folder_name());
        let commit = match std::fs::read_to_string(dir.join("refs").join(revision)) {
            Ok(c) => c.trim().to_string(),
            Err(_) if revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit()) => {
                revision.to_string()
            }
            Err(_) => return None,
        };
        let snap = dir.join("snapshots").join(commit);
        snap.is_dir().then_some(snap)
    }

    /// Copies the files of a local folder into the cache as `repo_id` at branch `branch`
    /// (commit `commit`), content-addressed like a hub download: blobs named by sha256,
    /// snapshot entries linking to them. For machines without hub access.
    pub fn import_folder(
        &self,
        repo_id: &str,
        branch: &str,
        commit: &str,
        dir: &Path,
    ) -> Result<PathBuf> {
        let base = self.root.join(repo(repo_id, branch).folder_name());
        let snap = base.join("snapshots").join(commit);
        let blobs = base.join("blobs");
        for d in [&snap, &blobs, &base.join("refs")] {
            std::fs::create_dir_all(d).map_err(io_err(d))?;
        }
        let rd = std::fs::read_dir(dir).map_err(io_err(dir))?;
        for entry in rd.flatten() {
            let src = entry.path();
            if !src.is_file() {
                continue;
            }
            let (sha, _) = sha256_file(&src)?;
            let blob = blobs.join(&sha);
            if !blob.is_file() {
                std::fs::copy(&src, &blob).map_err(io_err(&blob))?;
            }
            let link = snap.join(entry.file_name());
            let _ = std::fs::remove_file(&link);
            link_blob(&format!("../../blobs/{sha}"), &blob, &link)?;
        }
        let r = base.join("refs").join(branch);
        std::fs::write(&r, commit).map_err(io_err(&r))?;
        Ok(snap)
    }

    /// Status of the files: missing if any is absent; corrupt if a content-addressed blob
    /// (named by its sha256) does not hash to its name.
    pub fn verify(&self, repo_id: &str, revision: &str, files: &[String]) -> Result<Status> {
        let Some(snap) = self.snapshot(repo_id, revision) else {
            return Ok(Status::Missing);
        };
        for f in files {
            let p = snap.join(f);
            if !p.is_file() {
                return Ok(Status::Missing);
            }
            let target = std::fs::canonicalize(&p).map_err(io_err(&p))?;
            let blob = target
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            if blob.len() == 64 && blob.chars().all(|c| c.is_ascii_hexdigit()) {
                let (actual, size) = sha256_file(&target)?;
                if actual != blob {
                    return Ok(Status::Corrupt { actual, size });
                }
            }
        }
        Ok(Status::Verified)
    }

    /// Makes every file available and returns the snapshot folder.
    pub fn fetch(
        &self,
        name: &str,
        repo_id: &str,
        revision: &str,
        files: &[String],
    ) -> Result<PathBuf> {
        if self.verify(repo_id, revision, files)? == Status::Verified {
            if let Some(s) = self.snapshot(repo_id, revision) {
                return Ok(s);
            }
        }
        let missing: Vec<&str> = files
            .iter()
            .filter(|f| {
                self.snapshot(repo_id, revision)
                    .is_none_or(|s| !s.join(f).is_file())
            })
            .map(String::as_str)
            .collect();
        if self.offline {
            return Err(StoreError::Unfetchable {
                name: name.to_string(),
                reason: format!(
                    "offline mode (HF_HUB_OFFLINE) and {} is missing {} in the hub cache {}",
                    repo_id,
                    missing.join(", "),
                    self.root.display()
                ),
            });
        }
        let api = hf_hub::api::sync::ApiBuilder::from_cache(hf_hub::Cache::new(self.root.clone()))
            .with_progress(false)
            .build()
            .map_err(|e| StoreError::Network {
                package: repo_id.to_string(),
                detail: e.to_string(),
            })?;
        let r = api.repo(repo(repo_id, revision));
        let mut snap: Option<PathBuf> = None;
        for f in files {
            let p = r.get(f).map_err(|e| StoreError::Network {
                package: format!("{repo_id}/{f}"),
                detail: e.to_string(),
            })?;
            snap = p.parent().map(Path::to_path_buf);
        }
        match self.verify(repo_id, revision, files)? {
            Status::Verified => {}
            other => {
                return Err(StoreError::Unfetchable {
                    name: name.to_string(),
                    reason: format!("downloaded files do not verify: {other:?}"),
                })
            }
        }
        self.snapshot(repo_id, revision)
            .or(snap)
            .ok_or_else(|| StoreError::Unfetchable {
                name: name.to_string(),
                reason: "download finished but the snapshot folder is not in the cache".into(),
            })
    }
}

#[cfg(unix)]
fn link_blob(relative: &str, _blob: &Path, link: &Path) -> Result<()> {
    std::os::unix::fs::symlink(relative, link).map_err(io_err(link))
}

#[cfg(not(unix))]
fn link_blob(_relative: &str, blob: &Path, link: &Path) -> Result<()> {
    std::fs::copy(blob, link).map(|_| ()).map_err(io_err(link))
}
