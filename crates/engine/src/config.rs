//! Compaction settings and the slot schema, as written in `configs/compaction.toml` (whose
//! text is also the built-in default).

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The built-in settings file.
pub const DEFAULT_CONFIG: &str = include_str!("../configs/compaction.toml");

/// One section of the summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotSpec {
    /// Machine name (`goal`, `progress`, ...).
    pub name: String,
    /// Heading shown in the summary.
    pub title: String,
    /// What belongs in it, in words the models read.
    pub contract: String,
    /// The body's shape, in words the models read.
    pub format: String,
    /// Sub-headings the body may use (e.g. `### Done`); other heading lines are replaced.
    #[serde(default)]
    pub headings: Vec<String>,
}

/// The texts every model sees, in the project's own words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prompts {
    /// System message.
    pub system: String,
    /// Line before the history.
    pub intro: String,
    /// Text before the section list.
    pub outline: String,
    /// Request for one section (`{title}`, `{contract}`, `{format}` are filled in).
    pub section: String,
    /// Request for the whole summary (sequential baseline).
    pub whole: String,
    /// Definition of the verification question, placed in the shared prefix.
    pub judge_rule: String,
    /// The verification question asked after each proposed line.
    pub judge: String,
}

/// What to do with a history that does not fit the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overflow {
    /// Fail with the token counts.
    Error,
    /// Leave messages out of the middle, with an explicit marker.
    MiddleCut,
    /// Compact in stages: the older messages that fit first, then their summary with the
    /// rest (repeated until it fits).
    Stages,
}

/// When the drafter writes from a slot-conditioned view of the history instead of all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DrafterView {
    /// Only when the history does not fit the drafter's context.
    Auto,
    /// Always (each slot's view within `drafter_view_tokens`).
    Always,
}

/// Whether the drafter's and the target's batches of one round run at the same time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// Only on a GPU device.
    Auto,
    /// Always.
    On,
    /// Never.
    Off,
}

/// Every compaction setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionConfig {
    /// Drafter model: store name or path.
    pub drafter: String,
    /// A LoRA adapter on the drafter: a folder in PEFT's layout (`adapter_config.json`,
    /// `adapter_model.safetensors`), trained on this drafter file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter_adapter: Option<String>,
    /// Target model: store name or path.
    pub target: String,
    /// Acceptance threshold on r = p+ / (p+ + p-).
    pub eta: f32,
    /// Next-token candidates inspected per judgment.
    pub top_k: usize,
    /// Token texts that count as "yes".
    pub positive_labels: Vec<String>,
    /// Token texts that count as "no".
    pub negative_labels: Vec<String>,
    /// Tokens per drafter call.
    pub draft_tokens: usize,
    /// Tokens per repair.
    pub repair_tokens: usize,
    /// Extra tokens a draft or a repair may take past its budget to finish its line.
    pub line_grace: usize,
    /// When the drafter reads a slot-conditioned view of the history.
    pub drafter_view: DrafterView,
    /// Most drafter tokens of a view's prefix (the drafter's context bounds it too).
    pub drafter_view_tokens: usize,
    /// Memory for prefilled prefixes kept across compactions of a session, in MiB (least
    /// recently used first out; 0 keeps none).
    pub session_cache_mb: usize,
    /// Longest line in characters.
    pub max_line_chars: usize,
    /// Most lines per slot.
    pub slot_max_lines: usize,
    /// Most target tokens per slot.
    pub slot_max_tokens: usize,
    /// Most target tokens for the assembled summary.
    pub summary_budget: usize,
    /// Longest tool result kept whole in the transcript (characters).
    pub tool_result_cap: usize,
    /// Over-long histories: error or middle cut.
    pub overflow: Overflow,
    /// Drafter/target overlap.
    pub overlap: Overlap,
    /// Whether the target's calibration entry (η, judgment prompt, line rule) applies to
    /// unset keys.
    pub calibrated: bool,
    /// How drafted lines are verified.
    pub verify: crate::verify::Verify,
    /// A line token diverges from the target when the target ranks this many tokens above
    /// it (1: anything but its greedy token) ...
    pub divergence_rank: u32,
    /// ... or gives it less than this probability.
    pub divergence_floor: f32,
    /// The calibrated line rule in force (set from the target's calibration entry).
    #[serde(skip)]
    pub line_rule: Option<crate::verify::LineRule>,
    /// Keys the user set (file or flags): calibration never overrides them.
    #[serde(skip)]
    pub explicit: Vec<String>,
    /// Prompt texts.
    pub prompts: Prompts,
    /// The summary's sections, in order.
    pub slots: Vec<SlotSpec>,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        // The embedded file is checked by a unit test; failing here would be a build defect.
        Self::parse(DEFAULT_CONFIG, "built-in").unwrap_or_else(|e| panic!("{e}"))
    }
}

fn config_err(origin: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        origin: origin.to_string(),
        reason: reason.into(),
    }
}

impl CompactionConfig {
    /// Parses a complete settings text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let c: Self = toml::from_str(text).map_err(|e| config_err(origin, e.to_string()))?;
        c.validate(origin)?;
        Ok(c)
    }

    /// Reads a settings file whose keys override the built-in defaults.
    pub fn load(path: &Path) -> Result<Self> {
        let o = speccompact_settings::load(DEFAULT_CONFIG, path)?;
        Self::checked(o, &path.display().to_string())
    }

    /// The built-in defaults with the keys of `text` replacing theirs.
    pub fn overlay(text: &str, origin: &str) -> Result<Self> {
        let o = speccompact_settings::overlay(DEFAULT_CONFIG, text, origin)?;
        Self::checked(o, origin)
    }

    fn checked(o: speccompact_settings::Overlaid<Self>, origin: &str) -> Result<Self> {
        let mut c = o.value;
        c.explicit = o.explicit;
        c.validate(origin)?;
        Ok(c)
    }

    /// Sets η as the user's choice (calibration will not override it).
    pub fn set_eta(&mut self, eta: f32) {
        self.eta = eta;
        self.explicit.push("eta".into());
    }

    /// The slot a `## ` heading line opens: its title or name, case-insensitive, a trailing
    /// `:` allowed.
    pub fn slot_for_heading(&self, line: &str) -> Option<usize> {
        let t = line
            .trim()
            .strip_prefix("## ")?
            .trim()
            .trim_end_matches(':')
            .to_lowercase();
        self.slots
            .iter()
            .position(|s| s.title.to_lowercase() == t || s.name.to_lowercase() == t)
    }

    /// Whether the user set `key` (`eta`, `prompts.judge`, ...).
    pub fn is_explicit(&self, key: &str) -> bool {
        self.explicit.iter().any(|k| k == key)
    }

    /// Checks ranges and the schema.
    pub fn validate(&self, origin: &str) -> Result<()> {
        if !(self.eta > 0.0 && self.eta <= 1.0) {
            return Err(config_err(
                origin,
                format!("eta must be in (0, 1], not {}", self.eta),
            ));
        }
        if !(0.0..1.0).contains(&self.divergence_floor) {
            return Err(config_err(
                origin,
                format!(
                    "divergence_floor must be in [0, 1), not {}",
                    self.divergence_floor
                ),
            ));
        }
        for (key, v) in [
            ("top_k", self.top_k),
            ("divergence_rank", self.divergence_rank as usize),
            ("draft_tokens", self.draft_tokens),
            ("repair_tokens", self.repair_tokens),
            ("max_line_chars", self.max_line_chars),
            ("slot_max_lines", self.slot_max_lines),
            ("slot_max_tokens", self.slot_max_tokens),
            ("summary_budget", self.summary_budget),
        ] {
            if v == 0 {
                return Err(config_err(origin, format!("{key} must be at least 1")));
            }
        }
        if self.positive_labels.is_empty() || self.negative_labels.is_empty() {
            return Err(config_err(
                origin,
                "positive_labels and negative_labels must not be empty",
            ));
        }
        if let Some(l) = self
            .positive_labels
            .iter()
            .find(|l| self.negative_labels.contains(l))
        {
            return Err(config_err(
                origin,
                format!("label `{l}` is both positive and negative"),
            ));
        }
        if self.slots.is_empty() {
            return Err(config_err(origin, "the schema has no slots"));
        }
        let mut seen = std::collections::HashSet::new();
        for s in &self.slots {
            if s.name.trim().is_empty() || s.title.trim().is_empty() {
                return Err(config_err(origin, "every slot needs a name and a title"));
            }
            if !seen.insert(s.name.as_str()) {
                return Err(config_err(
                    origin,
                    format!("slot `{}` appears twice", s.name),
                ));
            }
        }
        for (key, text) in [("prompts.section", &self.prompts.section)] {
            if !text.contains("{title}") {
                return Err(config_err(origin, format!("{key} must contain {{title}}")));
            }
        }
        Ok(())
    }

    /// The slot with this name.
    pub fn slot(&self, name: &str) -> Option<&SlotSpec> {
        self.slots.iter().find(|s| s.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_config_parses_with_six_slots() {
        let c = CompactionConfig::parse(DEFAULT_CONFIG, "built-in").unwrap();
        let names: Vec<_> = c.slots.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "goal",
                "constraints_preferences",
                "progress",
                "key_decisions",
                "next_steps",
                "critical_context"
            ]
        );
        assert_eq!(c.eta, 0.7);
        assert_eq!(c.top_k, 20);
    }

    #[test]
    fn overlay_replaces_only_given_keys() {
        let c = CompactionConfig::overlay("eta = 0.5\n[prompts]\njudge = \"Ok?\"\n", "t").unwrap();
        assert_eq!(c.eta, 0.5);
        assert_eq!(c.prompts.judge, "Ok?");
        assert_eq!(c.prompts.system, CompactionConfig::default().prompts.system);
        assert_eq!(c.slots.len(), 6);
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = CompactionConfig::overlay("eta = 1.5", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("f.toml") && e.contains("eta"), "{e}");
        let e = CompactionConfig::overlay("top_k = 0", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("top_k"), "{e}");
        let e = CompactionConfig::overlay("etaa = 0.5", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("etaa"), "{e}");
        let e = CompactionConfig::overlay("positive_labels = [\"No\"]", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("both"), "{e}");
    }
}
