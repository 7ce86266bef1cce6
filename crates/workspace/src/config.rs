//! Workspace settings as written in `configs/workspace.toml`: routing rules, extraction
//! patterns, redaction patterns, budget weights, drift control and triggers. Patterns are
//! compiled once, here; a bad pattern is an error naming its key, an unknown route class a
//! deserialize error naming the class and its key.

use crate::event_class::EventClass;
use crate::{Error, Result};
use regex::Regex;
use serde::Deserialize;
use std::path::Path;

/// The built-in settings (`configs/workspace.toml`).
pub const DEFAULT_CONFIG: &str = include_str!("../configs/workspace.toml");

/// One routing rule as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRule {
    /// Class given to matching events (an unknown name fails to deserialize).
    pub class: EventClass,
    /// Roles it applies to (`system`, `user`, `assistant`, `tool`); empty: any.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Regex on the tool name.
    pub tools: Option<String>,
    /// Regex on the text.
    pub content: Option<String>,
    /// Shortest text (characters).
    pub min_chars: Option<usize>,
    /// Longest text (characters).
    pub max_chars: Option<usize>,
    /// Whether the event must (true) or must not (false) carry an exit code.
    pub exit_code: Option<bool>,
}

/// Routing section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// A user message matching this is a tool observation.
    pub observation: String,
    /// Rules in order; the first match gives the class.
    pub rules: Vec<RouteRule>,
}

/// Extraction section: one pattern per state type.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtractConfig {
    /// The first user message's first sentence is the goal when none matches.
    pub first_user_is_goal: bool,
    /// Goal sentences.
    pub goal: String,
    /// Acceptance criteria.
    pub acceptance_criterion: String,
    /// Permissions.
    pub permission: String,
    /// Constraints.
    pub constraint: String,
    /// Open issues.
    pub open_issue: String,
    /// Decisions.
    pub decision: String,
    /// Instruction-like text in assistant or tool output.
    pub instruction: String,
    /// Rationale of a decision (capture 1).
    pub rationale: String,
    /// Alternatives of a decision (capture 1).
    pub alternatives: String,
    /// Longest candidate sentence.
    pub max_sentence_chars: usize,
}

/// One named redaction pattern.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedPattern {
    /// Kind, used in the placeholder and the report.
    pub name: String,
    /// Regex; a `value` capture group limits what is replaced.
    pub pattern: String,
}

/// Redaction section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedactConfig {
    /// Secrets (always on).
    pub secrets: Vec<NamedPattern>,
    /// Personal data patterns (configurable).
    #[serde(default)]
    pub pii: Vec<NamedPattern>,
}

/// Budget split weights.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetWeights {
    /// State block weight.
    pub state: u32,
    /// Summary block weight.
    pub summary: u32,
    /// Evidence block weight.
    pub evidence: u32,
    /// Longest evidence passage (tokens).
    pub passage_tokens: usize,
}

/// Drift control.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriftConfig {
    /// Rebuild from the original log every this many generations (0: never).
    pub rebuild_every: u32,
}

/// Trigger settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerConfig {
    /// Share of the window at which a budget compaction fires.
    pub watermark: f64,
    /// Milestone on a phase completion.
    pub phase_completion: bool,
    /// Jaccard threshold of a topic switch (0: off).
    pub topic_switch: f64,
    /// Milestone on test results and new user constraints.
    pub high_value: bool,
    /// A command that runs tests.
    pub test_command: String,
}

/// All workspace settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceConfig {
    /// Routing.
    pub route: RouteConfig,
    /// Extraction.
    pub extract: ExtractConfig,
    /// Redaction.
    pub redact: RedactConfig,
    /// Budget weights.
    pub budget: BudgetWeights,
    /// Drift control.
    pub drift: DriftConfig,
    /// Triggers.
    pub triggers: TriggerConfig,
}

impl Default for WorkspaceConfig {
    fn default() -> Self {
        // The embedded file is checked by a unit test; failing here would be a build defect.
        Self::overlay("", "built-in").unwrap_or_else(|e| panic!("{e}"))
    }
}

fn config_err(origin: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        origin: origin.to_string(),
        reason: reason.into(),
    }
}

impl WorkspaceConfig {
    /// Reads a settings file whose keys override the built-in defaults.
    pub fn load(path: &Path) -> Result<Self> {
        let c: Self = speccompact_settings::load(DEFAULT_CONFIG, path)
            .map_err(|e| config_err(e.origin(), e.reason()))?
            .value;
        c.compile(&path.display().to_string())?;
        Ok(c)
    }

    /// The built-in defaults with the keys of `text` replacing theirs (per section).
    pub fn overlay(text: &str, origin: &str) -> Result<Self> {
        let c: Self = speccompact_settings::overlay(DEFAULT_CONFIG, text, origin)
            .map_err(|e| config_err(e.origin(), e.reason()))?
            .value;
        c.compile(origin)?;
        Ok(c)
    }

    /// Compiles every pattern; errors name the key.
    pub fn compile(&self, origin: &str) -> Result<Patterns> {
        let re = |key: &str, p: &str| {
            Regex::new(p).map_err(|e| config_err(origin, format!("{key}: invalid regex: {e}")))
        };
        let mut rules = Vec::new();
        for (i, r) in self.route.rules.iter().enumerate() {
            rules.push(CompiledRule {
                rule: r.clone(),
                tools: r
                    .tools
                    .as_deref()
                    .map(|p| re(&format!("route.rules[{i}].tools"), p))
                    .transpose()?,
                content: r
                    .content
                    .as_deref()
                    .map(|p| re(&format!("route.rules[{i}].content"), p))
                    .transpose()?,
            });
        }
        let named = |section: &str, list: &[NamedPattern]| -> Result<Vec<(String, Regex)>> {
            list.iter()
                .enumerate()
                .map(|(i, n)| Ok((n.name.clone(), re(&format!("{section}[{i}]"), &n.pattern)?)))
                .collect()
        };
        let e = &self.extract;
        if !(0.0..=1.0).contains(&self.triggers.watermark) {
            return Err(config_err(origin, "triggers.watermark must be in [0, 1]"));
        }
        if self.budget.state + self.budget.summary + self.budget.evidence == 0 {
            return Err(config_err(origin, "budget: the three weights sum to 0"));
        }
        Ok(Patterns {
            observation: re("route.observation", &self.route.observation)?,
            rules,
            goal: re("extract.goal", &e.goal)?,
            acceptance: re("extract.acceptance_criterion", &e.acceptance_criterion)?,
            permission: re("extract.permission", &e.permission)?,
            constraint: re("extract.constraint", &e.constraint)?,
            open_issue: re("extract.open_issue", &e.open_issue)?,
            decision: re("extract.decision", &e.decision)?,
            instruction: re("extract.instruction", &e.instruction)?,
            rationale: re("extract.rationale", &e.rationale)?,
            alternatives: re("extract.alternatives", &e.alternatives)?,
            secrets: named("redact.secrets", &self.redact.secrets)?,
            pii: named("redact.pii", &self.redact.pii)?,
            test_command: re("triggers.test_command", &self.triggers.test_command)?,
        })
    }
}

/// A routing rule with its patterns compiled.
#[derive(Debug, Clone)]
pub struct CompiledRule {
    /// The rule as written.
    pub rule: RouteRule,
    /// Tool-name pattern.
    pub tools: Option<Regex>,
    /// Content pattern.
    pub content: Option<Regex>,
}

/// Every pattern of a [`WorkspaceConfig`], compiled.
#[derive(Debug, Clone)]
pub struct Patterns {
    /// User messages that are observations.
    pub observation: Regex,
    /// Routing rules.
    pub rules: Vec<CompiledRule>,
    /// Goal sentences.
    pub goal: Regex,
    /// Acceptance criteria.
    pub acceptance: Regex,
    /// Permissions.
    pub permission: Regex,
    /// Constraints.
    pub constraint: Regex,
    /// Open issues.
    pub open_issue: Regex,
    /// Decisions.
    pub decision: Regex,
    /// Instruction-like text.
    pub instruction: Regex,
    /// Decision rationale.
    pub rationale: Regex,
    /// Decision alternatives.
    pub alternatives: Regex,
    /// Secret patterns.
    pub secrets: Vec<(String, Regex)>,
    /// PII patterns.
    pub pii: Vec<(String, Regex)>,
    /// Test commands.
    pub test_command: Regex,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_config_compiles() {
        let c = WorkspaceConfig::default();
        let p = c.compile("built-in").unwrap();
        assert!(p.rules.len() >= 5);
        assert_eq!(c.drift.rebuild_every, 5);
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = WorkspaceConfig::overlay("[extract]\nconstraint = '(unclosed'", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("f.toml") && e.contains("extract.constraint"),
            "{e}"
        );
        let e = WorkspaceConfig::overlay("[[route.rules]]\nclass = 'gossip'", "f.toml")
            .unwrap_err()
            .to_string();
        // `[[route.rules]]` replaces the whole route table here, so `observation` is missing.
        assert!(e.contains("f.toml"), "{e}");
        let e = WorkspaceConfig::overlay("[triggers]\nwatermark = 2.0", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("watermark"), "{e}");
        // An unknown class is a deserialize error naming the value and the key.
        let e = WorkspaceConfig::overlay(
            "[route]\nobservation = 'x'\n[[route.rules]]\nclass = 'gossip'",
            "f.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("f.toml") && e.contains("gossip") && e.contains("class"),
            "{e}"
        );
    }
}
