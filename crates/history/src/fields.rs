//! Lossless extraction of high-risk fields from a text: exit codes, test results, file paths,
//! patch coordinates, error lines and identifiers, and the checkable facts of a text. Every extracted string is a verbatim slice
//! of the text (checked by pattern before it is kept). Pure functions of the text, used by the
//! workspace's event log and by the slot ranking in [`crate::view`].

use regex::Regex;
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// A hunk's coordinates in a patch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchCoord {
    /// File (from the `+++ b/` or `diff --git` line), when given.
    pub file: Option<String>,
    /// First old line.
    pub old_start: u32,
    /// Old line count.
    pub old_lines: u32,
    /// First new line.
    pub new_start: u32,
    /// New line count.
    pub new_lines: u32,
}

/// High-risk fields of one event, each a verbatim slice of its text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fields {
    /// Exit codes stated in the text.
    pub exit_codes: Vec<i32>,
    /// Test result counts ("3 failed", "12 passed").
    pub test_results: Vec<String>,
    /// File paths.
    pub paths: Vec<String>,
    /// Patch hunks.
    pub patches: Vec<PatchCoord>,
    /// Error lines.
    pub errors: Vec<String>,
    /// Identifiers (snake_case, camelCase, ids with digits, hashes).
    pub identifiers: Vec<String>,
}

impl Fields {
    /// Every extracted string (paths, identifiers, errors, test results).
    pub fn strings(&self) -> impl Iterator<Item = &str> {
        self.paths
            .iter()
            .chain(&self.identifiers)
            .chain(&self.errors)
            .chain(&self.test_results)
            .map(String::as_str)
    }
}

struct FieldPatterns {
    exit: Regex,
    tests: Regex,
    path: Regex,
    hunk: Regex,
    file_header: Regex,
    error: Regex,
    ident: Regex,
}

fn field_patterns() -> &'static FieldPatterns {
    static P: OnceLock<FieldPatterns> = OnceLock::new();
    P.get_or_init(|| {
        let re = |p: &str| Regex::new(p).unwrap_or_else(|e| panic!("built-in pattern {p}: {e}"));
        FieldPatterns {
            exit: re(
                r"(?i)(?:<returncode>\s*(-?\d{1,3})\s*</returncode>|\bexit(?:ed)?(?:\s+with)?(?:\s+(?:code|status))?\s*[:=]?\s*(-?\d{1,3})\b|\b(?:return\s*code|returncode|exit_code|exit_status)\s*[:=]\s*(-?\d{1,3})\b)",
            ),
            tests: re(r"(?i)\b\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|tests? run)\b"),
            path: re(
                r"(?:\b|/)(?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_.-]+\.[A-Za-z0-9]{1,6}\b|\b[A-Za-z0-9_-]+\.(?:rs|py|js|ts|tsx|go|java|c|h|cc|cpp|hpp|rb|sh|toml|yaml|yml|json|md|txt|cfg|ini|sql|html|css)\b",
            ),
            hunk: re(r"(?m)^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@"),
            file_header: re(r"(?m)^(?:\+\+\+ b/|diff --git a/\S+ b/)(\S+)"),
            error: re(
                r"(?m)^.*?\b(?:[A-Z][A-Za-z]*(?:Error|Exception)|error(?:\[E\d+\])?:|FAILED|panicked at|Traceback \(most recent call last\)).*$",
            ),
            ident: re(
                r"\b(?:[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]+|[a-z]+[A-Z][A-Za-z0-9]*|[A-Z][a-z]+[A-Z][A-Za-z0-9]*|[A-Z]{2,}[-_]?\d+|[A-Z0-9]{6}|[0-9a-f]{7,40})\b",
            ),
        }
    })
}

fn push_unique(v: &mut Vec<String>, s: &str) {
    if !v.iter().any(|x| x == s) {
        v.push(s.to_string());
    }
}

/// Extracts the high-risk fields of a text.
pub fn extract_fields(content: &str) -> Fields {
    let p = field_patterns();
    let mut f = Fields::default();
    for c in p.exit.captures_iter(content) {
        if let Some(code) = (1..=3)
            .find_map(|i| c.get(i))
            .and_then(|m| m.as_str().parse().ok())
        {
            if !f.exit_codes.contains(&code) {
                f.exit_codes.push(code);
            }
        }
    }
    for m in p.tests.find_iter(content) {
        push_unique(&mut f.test_results, m.as_str());
    }
    for m in p.path.find_iter(content) {
        let mut s = m.as_str().trim_start_matches('/');
        // Diff headers name files as a/PATH and b/PATH.
        let line_start = content[..m.start()].rfind('\n').map_or(0, |i| i + 1);
        let line = &content[line_start..];
        if line.starts_with("diff --git") || line.starts_with("+++ ") || line.starts_with("--- ") {
            s = s
                .strip_prefix("a/")
                .or_else(|| s.strip_prefix("b/"))
                .unwrap_or(s);
        }
        if s.contains('/') || s.contains('.') {
            push_unique(&mut f.paths, s);
        }
    }
    let files: Vec<(usize, &str)> = p
        .file_header
        .captures_iter(content)
        .filter_map(|c| c.get(1).map(|m| (m.start(), m.as_str())))
        .collect();
    for c in p.hunk.captures_iter(content) {
        let num = |i: usize, default: u32| {
            c.get(i)
                .and_then(|m| m.as_str().parse().ok())
                .unwrap_or(default)
        };
        let at = c.get(0).map_or(0, |m| m.start());
        let file = files
            .iter()
            .rev()
            .find(|(pos, _)| *pos < at)
            .map(|(_, f)| f.to_string());
        f.patches.push(PatchCoord {
            file,
            old_start: num(1, 0),
            old_lines: num(2, 1),
            new_start: num(3, 0),
            new_lines: num(4, 1),
        });
    }
    for m in p.error.find_iter(content) {
        let line = m.as_str().trim();
        if !line.is_empty() && line.len() <= 300 {
            push_unique(&mut f.errors, line);
        }
    }
    for m in p.ident.find_iter(content) {
        let s = m.as_str();
        // Six-character all-caps/digit codes must mix letters and digits or be all caps
        // (reservation codes), and plain hex must contain a digit and a letter.
        let hexlike = s.chars().all(|c| c.is_ascii_hexdigit());
        if hexlike
            && !(s.chars().any(|c| c.is_ascii_digit())
                && s.chars().any(|c| c.is_ascii_alphabetic()))
        {
            continue;
        }
        push_unique(&mut f.identifiers, s);
    }
    f
}

/// The exit code of an event: the explicit one, else the first stated in its text.
pub fn exit_code_of(explicit: Option<i32>, fields: &Fields) -> Option<i32> {
    explicit.or_else(|| fields.exit_codes.first().copied())
}

fn is_fact(w: &str) -> bool {
    w.len() >= 2
        && (w.chars().any(|c| c.is_ascii_digit())
            || w.contains('_')
            || (w.contains('/') && w.chars().any(|c| c.is_alphabetic()))
            || (w.len() >= 4
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())))
}

/// The checkable facts of a text: identifiers, numbers and paths, each once, as they
/// appear. The one rule by which a summary is held to its sources (unsourced assertions,
/// drift between summaries, the verifier's line set).
pub fn facts(text: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for w in text.split(|c: char| c.is_whitespace() || ",;:()[]{}\"'`<>=".contains(c)) {
        let w = w.trim_end_matches(['.', '!', '?']);
        if is_fact(w) && !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_identifiers_numbers_and_paths_each_once() {
        let t = "Reservation MDCLVA (user emma_kim_9957) moved to 2024-05-17; see src/lib.rs, \
                 not a/b or / alone. MDCLVA again: exit=137, code 7 and OK.";
        assert_eq!(
            facts(t),
            [
                "MDCLVA",
                "emma_kim_9957",
                "2024-05-17",
                "src/lib.rs",
                "a/b",
                "137"
            ]
        );
        assert!(facts("plain words only, nothing to check").is_empty());
    }

    #[test]
    fn fields_are_verbatim_slices() {
        let text = "$ pytest tests/test_api.py\nFAILED tests/test_api.py::test_p95 - AssertionError: 212 > 200\n3 failed, 12 passed in 4.1s\nexit code 1\ndiff --git a/src/app.py b/src/app.py\n+++ b/src/app.py\n@@ -10,4 +10,6 @@ def handler\n reservation MDCLVA for emma_kim_9957 commit 3f9a2c1";
        let f = extract_fields(text);
        assert_eq!(f.exit_codes, vec![1]);
        assert_eq!(f.test_results, vec!["3 failed", "12 passed"]);
        assert!(
            f.paths.contains(&"tests/test_api.py".to_string()),
            "{:?}",
            f.paths
        );
        assert!(f.paths.contains(&"src/app.py".to_string()));
        assert_eq!(
            f.patches,
            vec![PatchCoord {
                file: Some("src/app.py".into()),
                old_start: 10,
                old_lines: 4,
                new_start: 10,
                new_lines: 6
            }]
        );
        assert!(f.errors[0].contains("AssertionError: 212 > 200"));
        for id in ["MDCLVA", "emma_kim_9957", "3f9a2c1"] {
            assert!(
                f.identifiers.contains(&id.to_string()),
                "{id} in {:?}",
                f.identifiers
            );
        }
        for s in f.strings() {
            assert!(text.contains(s), "{s} is not verbatim");
        }
    }

    #[test]
    fn exit_codes_in_every_common_form() {
        for (t, code) in [
            ("<returncode>1</returncode>\n<output>", 1),
            ("Process exited with code 2", 2),
            ("exit status 127", 127),
            ("returncode=0", 0),
            ("[exit 1]", 1),
        ] {
            assert_eq!(extract_fields(t).exit_codes, vec![code], "{t}");
        }
        assert!(extract_fields("the exit was fine").exit_codes.is_empty());
    }
}
