//! Files in and out: reading a history (file or stdin, one session picked from a JSONL
//! file), writing reports atomically (markdown and JSON, headed by the command line where
//! asked), and the source revision recorded in them.

use anyhow::{bail, Context, Result};
use serde::Serialize;
use speccompact_history::{parse_sessions, History};
use std::path::Path;

/// Reads a history file (or stdin for `-`) and picks the session.
pub fn read_history(input: &str, session: Option<&str>) -> Result<History> {
    let text = if input == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading stdin")?;
        s
    } else {
        std::fs::read_to_string(input).with_context(|| format!("reading {input}"))?
    };
    let mut all = parse_sessions(&text).with_context(|| format!("parsing {input}"))?;
    match session {
        Some(id) => {
            let i = all
                .iter()
                .position(|h| h.id.as_deref() == Some(id))
                .with_context(|| {
                    let ids: Vec<_> = all.iter().filter_map(|h| h.id.as_deref()).collect();
                    format!("{input} has no session `{id}` (it has: {})", ids.join(", "))
                })?;
            Ok(all.swap_remove(i))
        }
        None if all.len() > 1 => {
            let ids: Vec<_> = all.iter().filter_map(|h| h.id.as_deref()).collect();
            bail!(
                "{input} holds {} sessions; pick one with --session ID ({})",
                all.len(),
                ids.join(", ")
            )
        }
        None => Ok(all.swap_remove(0)),
    }
}

/// Reads a text file, naming it in the error.
pub fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Writes `text` to `path` through a temporary file in the same folder, so an interrupted
/// run never leaves a partial file in place of an earlier one.
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("writing into {}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())?;
    // Temporary files are private; a report is an ordinary file.
    #[cfg(unix)]
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )?;
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Pretty JSON with a final newline, as the JSON reports are printed and written.
pub fn json_text(value: &impl Serialize) -> Result<String> {
    Ok(serde_json::to_string_pretty(value)? + "\n")
}

/// `text` under the heading `title` and the command line that made it.
pub fn headed(title: &str, text: &str) -> String {
    format!("# {title}\n\nCommand: `{}`\n\n{text}", command_line())
}

/// Writes a report where its flags ask: `text` to `out`, and `value` as JSON
/// ([`json_text`]) to `json`; each atomically.
pub fn write_report(
    out: Option<&Path>,
    text: &str,
    json: Option<&Path>,
    value: &impl Serialize,
) -> Result<()> {
    if let Some(p) = out {
        write_atomic(p, text)?;
    }
    if let Some(p) = json {
        write_atomic(p, &json_text(value)?)?;
    }
    Ok(())
}

/// The command line as typed (for report headers).
pub fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// The source revision, when run from a git checkout (`-dirty` with local changes).
pub fn revision() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(r)
            if git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty()) =>
        {
            format!("{r}-dirty")
        }
        Some(r) => r,
        None => "unknown".into(),
    }
}
