//! Line checks applied to every proposed line before any model judges it.

/// What to do with a proposed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// A blank line: kept as formatting (dropped after another blank line or at the start).
    Blank,
    /// A level-2 heading: the model began another section, so this slot is complete.
    EndOfSlot,
    /// A sub-heading or an empty-slot marker: accepted without verification.
    Auto,
    /// Repeats an accepted line: replaced without verification.
    Duplicate,
    /// Longer than the character limit: replaced without verification.
    TooLong,
    /// Needs the target's judgment.
    Verify,
}

/// Markers a slot body may consist of when it has nothing to report.
pub const EMPTY_MARKERS: [&str; 4] = ["(none)", "none", "n/a", "(n/a)"];

fn normal(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Classifies `line` given the slot's accepted lines.
pub fn check(line: &str, accepted: &[String], max_chars: usize) -> Check {
    let t = line.trim();
    if t.is_empty() {
        return Check::Blank;
    }
    if t.starts_with("## ") || t == "##" {
        return Check::EndOfSlot;
    }
    let n = normal(t);
    if accepted
        .iter()
        .any(|a| !a.trim().is_empty() && normal(a) == n)
    {
        return Check::Duplicate;
    }
    if t.chars().count() > max_chars {
        return Check::TooLong;
    }
    if t.starts_with('#') || EMPTY_MARKERS.contains(&n.trim_end_matches('.')) {
        return Check::Auto;
    }
    Check::Verify
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let acc = vec!["- fixed parser.rs".to_string()];
        assert_eq!(check("  ", &acc, 50), Check::Blank);
        assert_eq!(check("## Next Steps", &acc, 50), Check::EndOfSlot);
        assert_eq!(check("### Done", &acc, 50), Check::Auto);
        assert_eq!(check("(none)", &acc, 50), Check::Auto);
        assert_eq!(check("None.", &acc, 50), Check::Auto);
        assert_eq!(check("-  Fixed parser.rs ", &acc, 50), Check::Duplicate);
        assert_eq!(check(&"x".repeat(51), &acc, 50), Check::TooLong);
        assert_eq!(check(&"x".repeat(50), &acc, 50), Check::Verify);
        assert_eq!(
            check(
                "### a duplicate check comes first",
                &["### A duplicate check comes first".into()],
                50
            ),
            Check::Duplicate
        );
    }
}
