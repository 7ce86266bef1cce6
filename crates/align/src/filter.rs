//! Which target-written slot bodies make training examples. A body is dropped when it is
//! empty (no line with content: only blank lines, punctuation or `#` sub-headings), loops
//! (two content lines with the same words once digits and punctuation are set aside and
//! case folded: "Checked step 1." and "checked step 2" — the engine already drops lines
//! equal up to list markers and case), is copied from the record (content lines found
//! verbatim in the record, at least [`COPIED_LINE_CHARS`] long, hold more than half of the
//! body's content characters), or asserts what the record does not contain (the
//! evaluation's unsourced-assertions metric). The first reason that applies is the one
//! counted.

use serde::Serialize;

/// Shortest content line that counts as copied when the record holds it verbatim.
pub const COPIED_LINE_CHARS: usize = 40;

/// Why a body was dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason", content = "detail")]
pub enum Rejection {
    /// No line with content.
    Empty,
    /// A content line repeats (normalized): the line that does.
    Looping(String),
    /// Mostly lines copied from the record: the share of content characters copied, in %.
    Copied(u32),
    /// Assertions the record does not contain.
    Unsourced(Vec<String>),
}

impl Rejection {
    /// The reason's name, as counted in the manifest.
    pub fn name(&self) -> &'static str {
        match self {
            Rejection::Empty => "empty",
            Rejection::Looping(_) => "looping",
            Rejection::Copied(_) => "copied",
            Rejection::Unsourced(_) => "unsourced",
        }
    }
}

/// The line without its list marker (`- `, `* `, `1. `, `2) `) and surrounding blanks.
fn content(line: &str) -> &str {
    let t = line.trim();
    let t = t
        .strip_prefix("- ")
        .or_else(|| t.strip_prefix("* "))
        .unwrap_or(t);
    let digits = t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    match t[digits..]
        .strip_prefix(". ")
        .or(t[digits..].strip_prefix(") "))
    {
        Some(rest) if digits > 0 => rest.trim(),
        _ => t,
    }
}

/// Lines that carry content: not blank, not a `#` heading, with a letter or digit.
fn content_lines(body: &str) -> Vec<&str> {
    body.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(content)
        .filter(|l| l.chars().any(char::is_alphanumeric))
        .collect()
}

/// The line's words: letters only, lower case, one space between.
fn normalized(line: &str) -> String {
    line.split(|c: char| !c.is_alphabetic())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `None` when `body` makes a training example against `record` (the text the model read),
/// else why not.
pub fn check(body: &str, record: &str) -> Option<Rejection> {
    let lines = content_lines(body);
    if lines.is_empty() {
        return Some(Rejection::Empty);
    }
    let mut seen = std::collections::HashSet::new();
    for l in &lines {
        let words = normalized(l);
        if !words.is_empty() && !seen.insert(words) {
            return Some(Rejection::Looping(l.to_string()));
        }
    }
    let total: usize = lines.iter().map(|l| l.chars().count()).sum();
    let copied: usize = lines
        .iter()
        .filter(|l| l.chars().count() >= COPIED_LINE_CHARS && record.contains(*l))
        .map(|l| l.chars().count())
        .sum();
    if copied * 2 > total {
        return Some(Rejection::Copied((copied * 100 / total.max(1)) as u32));
    }
    let unsourced = speccompact_eval::metrics::unsourced(body, record);
    if !unsourced.is_empty() {
        return Some(Rejection::Unsourced(unsourced));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECORD: &str = "user: fix the retry test in tests/test_upload.py; keep MAX_RETRIES = 3\n\
        tool: FAILED tests/test_upload.py::test_retry - AssertionError: expected 3 calls, got 4\n";

    #[test]
    fn a_sourced_summary_line_passes() {
        assert_eq!(
            check(
                "- Fix the failing retry test; keep MAX_RETRIES at 3.",
                RECORD
            ),
            None
        );
    }

    #[test]
    fn bodies_without_content_are_empty() {
        for b in ["", "\n\n", "### Done\n### Blocked\n", "- \n-\n", "  ---  "] {
            assert_eq!(check(b, RECORD), Some(Rejection::Empty), "{b:?}");
        }
    }

    #[test]
    fn a_repeated_line_is_looping_whatever_its_marker_and_case() {
        let b = "- Fix the retry test.\n2. fix the  RETRY test.\n";
        assert_eq!(
            check(b, RECORD).as_ref().map(Rejection::name),
            Some("looping")
        );
        let b = "- Checked step 1 of the test.\n- Checked step 3 of the test";
        assert_eq!(
            check(b, RECORD).as_ref().map(Rejection::name),
            Some("looping")
        );
        assert_eq!(
            check("- Fix the retry test.\n- Keep the limit.", RECORD),
            None
        );
    }

    #[test]
    fn mostly_verbatim_record_lines_are_copied() {
        let b = "- tool: FAILED tests/test_upload.py::test_retry - AssertionError: expected 3 calls, got 4\n- Fix it.";
        let line = "tool: FAILED tests/test_upload.py::test_retry - AssertionError: expected 3 calls, got 4";
        assert!(RECORD.contains(line));
        assert_eq!(
            check(b, RECORD).as_ref().map(Rejection::name),
            Some("copied")
        );
        // A short quoted fragment is not a copy.
        assert_eq!(check("- The test expected 3 calls, got 4.", RECORD), None);
    }

    #[test]
    fn an_identifier_outside_the_record_is_unsourced() {
        let r = check("- Edit `src/upload/client.rs` next.", RECORD);
        assert!(
            matches!(&r, Some(Rejection::Unsourced(a)) if a.iter().any(|a| a.contains("client.rs"))),
            "{r:?}"
        );
    }
}
