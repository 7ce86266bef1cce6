//! Line checks applied to every proposed line before any model judges it.

use crate::config::CompactionConfig;

/// What to do with a proposed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// A blank line: kept as formatting (dropped after another blank line or at the start).
    Blank,
    /// A level-2 heading: the model began another section, so this slot is complete.
    EndOfSlot,
    /// A declared sub-heading or an empty-slot marker: accepted without verification.
    Auto,
    /// Repeats an accepted line: replaced without verification.
    Duplicate,
    /// Longer than the character limit: replaced without verification.
    TooLong,
    /// Copies the instructions (a contract, a format, a prompt) instead of reporting the
    /// record: replaced without verification.
    Echo,
    /// A heading the slot does not declare: replaced without verification.
    StrayHeading,
    /// Needs the target's judgment.
    Verify,
}

impl Check {
    /// Whether the check sends the line to repair without a judgment.
    pub fn fails(&self) -> bool {
        matches!(
            self,
            Check::Duplicate | Check::TooLong | Check::Echo | Check::StrayHeading
        )
    }
}

/// Markers a slot body may consist of when it has nothing to report.
pub const EMPTY_MARKERS: [&str; 4] = ["(none)", "none", "n/a", "(n/a)"];

/// Shortest normalised line that counts as an echo of the instructions (shorter ones, like
/// "- done", occur in instructions by chance).
const ECHO_MIN_CHARS: usize = 16;

/// Share of a line's word trigrams found in the instructions from which it is an echo.
const ECHO_TRIGRAM_SHARE: f32 = 0.5;

fn words(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

fn trigrams(s: &str) -> Vec<String> {
    words(s).windows(3).map(|w| w.join(" ")).collect()
}

fn normal(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// The line without list markers and trailing punctuation, for comparisons.
fn core(s: &str) -> String {
    normal(s)
        .trim_start_matches(|c: char| {
            c == '-' || c == '*' || c.is_ascii_digit() || c == '.' || c == ' '
        })
        .trim_end_matches(['.', ':', ' '])
        .to_string()
}

/// The checks of one slot: its declared sub-headings, the instruction texts a line must not
/// copy, and the character limit.
#[derive(Debug, Clone)]
pub struct Checker {
    max_chars: usize,
    headings: Vec<String>,
    instructions: String,
    trigrams: std::collections::HashSet<String>,
}

impl Checker {
    /// The checker for slot `slot` of `cfg`.
    pub fn new(cfg: &CompactionConfig, slot: usize) -> Self {
        let spec = &cfg.slots[slot];
        let p = &cfg.prompts;
        let mut instructions = vec![
            p.system.as_str(),
            p.intro.as_str(),
            p.outline.as_str(),
            p.section.as_str(),
            p.judge_rule.as_str(),
            p.judge.as_str(),
        ];
        for s in &cfg.slots {
            instructions.extend([s.contract.as_str(), s.format.as_str()]);
        }
        Self {
            max_chars: cfg.max_line_chars,
            headings: spec
                .headings
                .iter()
                .map(|h| core(h.trim_start_matches('#')))
                .collect(),
            trigrams: instructions.iter().flat_map(|t| trigrams(t)).collect(),
            instructions: instructions
                .iter()
                .map(|t| normal(t))
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// A checker with no declared headings and no instruction texts.
    pub fn plain(max_chars: usize) -> Self {
        Self {
            max_chars,
            headings: Vec::new(),
            instructions: String::new(),
            trigrams: Default::default(),
        }
    }

    /// Declares the sub-headings the slot may use.
    pub fn with_headings(mut self, headings: &[&str]) -> Self {
        self.headings = headings
            .iter()
            .map(|h| core(h.trim_start_matches('#')))
            .collect();
        self
    }

    /// Classifies `line` given the slot's accepted lines.
    pub fn check(&self, line: &str, accepted: &[String]) -> Check {
        let t = line.trim();
        if t.is_empty() {
            return Check::Blank;
        }
        if t.starts_with("## ") || t == "##" {
            return Check::EndOfSlot;
        }
        // List markers and numbers do not make a line new ("7. Fix it" repeats "6. Fix it").
        let c = core(t);
        if accepted
            .iter()
            .any(|a| !a.trim().is_empty() && core(a) == c)
        {
            return Check::Duplicate;
        }
        if t.chars().count() > self.max_chars {
            return Check::TooLong;
        }
        if t.starts_with('#') {
            let name = core(t.trim_start_matches('#'));
            return if self.headings.contains(&name) {
                Check::Auto
            } else {
                Check::StrayHeading
            };
        }
        if EMPTY_MARKERS.contains(&normal(t).trim_end_matches('.')) {
            return Check::Auto;
        }
        if self.is_echo(t) {
            return Check::Echo;
        }
        Check::Verify
    }

    /// Whether a line copies the instructions: verbatim (a part of at least
    /// `ECHO_MIN_CHARS`), or mostly (half of its word trigrams occur in them).
    fn is_echo(&self, line: &str) -> bool {
        let c = core(line);
        if c.chars().count() >= ECHO_MIN_CHARS && self.instructions.contains(&c) {
            return true;
        }
        let grams = trigrams(line);
        if grams.len() < 3 {
            return false;
        }
        let found = grams.iter().filter(|g| self.trigrams.contains(*g)).count();
        found as f32 >= ECHO_TRIGRAM_SHARE * grams.len() as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let acc = vec!["- fixed parser.rs".to_string()];
        let c = Checker::plain(50).with_headings(&["### Done", "### Blocked"]);
        assert_eq!(c.check("  ", &acc), Check::Blank);
        assert_eq!(c.check("## Next Steps", &acc), Check::EndOfSlot);
        assert_eq!(c.check("### Done", &acc), Check::Auto);
        assert_eq!(c.check("### done:", &acc), Check::Auto);
        assert_eq!(c.check("### Preferences", &acc), Check::StrayHeading);
        assert_eq!(c.check("###", &acc), Check::StrayHeading);
        assert_eq!(c.check("(none)", &acc), Check::Auto);
        assert_eq!(c.check("None.", &acc), Check::Auto);
        assert_eq!(c.check("-  Fixed parser.rs ", &acc), Check::Duplicate);
        assert_eq!(c.check("* fixed parser.rs.", &acc), Check::Duplicate);
        assert_eq!(
            c.check("7. Fix it again", &["6. Fix it again".into()]),
            Check::Duplicate
        );
        assert_eq!(c.check("- fixed parser.rs twice", &acc), Check::Verify);
        assert_eq!(c.check(&"x".repeat(51), &acc), Check::TooLong);
        assert_eq!(c.check(&"x".repeat(50), &acc), Check::Verify);
        assert_eq!(
            c.check(
                "### A duplicate check comes first",
                &["### A duplicate check comes first".into()]
            ),
            Check::Duplicate
        );
    }

    #[test]
    fn copies_of_the_instructions_are_echoes() {
        let cfg = CompactionConfig::default();
        let c = Checker::new(&cfg, 0);
        let contract = &cfg.slots[0].contract;
        assert_eq!(c.check(contract, &[]), Check::Echo);
        assert_eq!(
            c.check(&format!("- {}", contract.to_uppercase()), &[]),
            Check::Echo
        );
        // A part of another slot's contract is an echo too.
        let next = cfg.slots[4].contract.split(',').next().unwrap();
        assert!(next.len() >= ECHO_MIN_CHARS, "{next}");
        assert_eq!(c.check(next, &[]), Check::Echo);
        // A contract glued to a format, with list numbers after it, is mostly copied.
        let glued = format!(
            "{} {}, 1., 2., 3., 4.",
            cfg.slots[2].contract, cfg.slots[2].format
        );
        assert_eq!(c.check(&glued, &[]), Check::Echo);
        // Facts are not, nor short lines that happen to occur in a prompt.
        assert_eq!(
            c.check(
                "- The user wants the retry test fixed and the limit kept at 3 attempts",
                &[]
            ),
            Check::Verify
        );
        assert_eq!(
            c.check("- Fix the retry loop in src/upload.rs", &[]),
            Check::Verify
        );
        assert_eq!(c.check("- the user", &[]), Check::Verify);
        // The progress slot declares its three sub-headings; the goal slot none.
        let p = cfg.slots.iter().position(|s| s.name == "progress").unwrap();
        assert_eq!(
            Checker::new(&cfg, p).check("### In Progress", &[]),
            Check::Auto
        );
        assert_eq!(c.check("### In Progress", &[]), Check::StrayHeading);
    }
}
