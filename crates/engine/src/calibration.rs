//! The calibration the engine applies: the judgment prompt variants and, per target model,
//! the calibrated η, judgment variant and line rule (`configs/calibration.toml`, embedded),
//! applied to the keys a user left unset. Measuring a calibration is the evaluation crate's
//! job (`speccompact_eval::calibrate`).

use crate::config::CompactionConfig;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The built-in judgment variants (`configs/judge-variants.toml`).
pub const DEFAULT_VARIANTS: &str = include_str!("../configs/judge-variants.toml");
/// The committed calibration (`configs/calibration.toml`).
pub const DEFAULT_CALIBRATION: &str = include_str!("../configs/calibration.toml");

/// One judgment prompt variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// Name.
    pub name: String,
    /// What it is.
    pub description: String,
    /// Rule text placed in the shared prefix (may be empty).
    pub judge_rule: String,
    /// Question after each line.
    pub judge: String,
    /// Answer words counting as yes (default: the settings' labels).
    #[serde(default)]
    pub positive_labels: Option<Vec<String>>,
    /// Answer words counting as no.
    #[serde(default)]
    pub negative_labels: Option<Vec<String>>,
}

impl Variant {
    /// Puts this variant's prompts and labels into `cfg`.
    pub fn apply(&self, cfg: &mut CompactionConfig) {
        cfg.prompts.judge_rule = self.judge_rule.clone();
        cfg.prompts.judge = self.judge.clone();
        if let Some(p) = &self.positive_labels {
            cfg.positive_labels = p.clone();
        }
        if let Some(n) = &self.negative_labels {
            cfg.negative_labels = n.clone();
        }
    }
}

#[derive(Deserialize)]
struct VariantFile {
    variant: Vec<Variant>,
}

/// Parses a variants file.
pub fn parse_variants(text: &str, origin: &str) -> Result<Vec<Variant>> {
    let f: VariantFile = toml::from_str(text).map_err(|e| Error::Config {
        origin: origin.into(),
        reason: e.to_string(),
    })?;
    if f.variant.is_empty() {
        return Err(Error::Config {
            origin: origin.into(),
            reason: "no [[variant]]".into(),
        });
    }
    Ok(f.variant)
}

/// The built-in variants.
pub fn builtin_variants() -> Result<Vec<Variant>> {
    parse_variants(DEFAULT_VARIANTS, "configs/judge-variants.toml")
}

/// A target's calibrated verification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Calibrated η.
    pub eta: f64,
    /// Judgment variant (by name).
    pub variant: String,
    /// ROC AUC of that variant on the line set.
    pub auc: f64,
    /// Accept rate of true lines at `eta`.
    pub accept_rate: f64,
    /// Accept rate of false lines at `eta`.
    pub false_accept_rate: f64,
    /// Lines measured (positive + negative).
    pub lines: usize,
    /// Sessions they came from.
    pub sessions: usize,
    /// The rule that chose `eta`.
    pub rule: String,
    /// The calibrated line rule over the verification scores (`verify = "calibrated"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line_rule: Option<crate::verify::LineRule>,
    /// Held-out ROC AUC of the line rule (fitted on other sessions than each line's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line_rule_auc: Option<f64>,
    /// Held-out accept rate of true lines at the rule's threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line_rule_accept: Option<f64>,
    /// Held-out accept rate of false lines at the rule's threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line_rule_false_accept: Option<f64>,
}

/// Calibration entries by target model name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Calibrations {
    /// Entries.
    #[serde(default)]
    pub models: BTreeMap<String, Entry>,
}

impl Calibrations {
    /// Parses a calibration file.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| Error::Config {
            origin: origin.into(),
            reason: e.to_string(),
        })
    }
    /// The committed calibration.
    pub fn builtin() -> Result<Self> {
        Self::parse(DEFAULT_CALIBRATION, "configs/calibration.toml")
    }
    /// Reads a calibration file (missing file: empty).
    pub fn load(path: &Path) -> Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(t) => Self::parse(&t, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(Error::Config {
                origin: path.display().to_string(),
                reason: e.to_string(),
            }),
        }
    }
    /// The file text (with its header comment).
    pub fn to_toml(&self) -> Result<String> {
        let body = toml::to_string(self).map_err(|e| Error::Config {
            origin: "calibration".into(),
            reason: e.to_string(),
        })?;
        let header: String = DEFAULT_CALIBRATION
            .lines()
            .take_while(|l| l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        Ok(format!("{header}\n{body}"))
    }
}

impl CompactionConfig {
    /// Applies the target's calibration entry to the keys the user left unset (when
    /// `calibrated` is on); returns a description of what applied.
    pub fn apply_calibration(
        &mut self,
        cal: &Calibrations,
        variants: &[Variant],
    ) -> Option<String> {
        if !self.calibrated {
            return None;
        }
        let e = cal.models.get(&self.target)?.clone();
        let mut done = Vec::new();
        if !self.is_explicit("eta") {
            self.eta = e.eta as f32;
            done.push(format!("eta {}", e.eta));
        }
        let judge_keys = [
            "prompts.judge",
            "prompts.judge_rule",
            "positive_labels",
            "negative_labels",
        ];
        let mut variant_applied = false;
        if !judge_keys.iter().any(|k| self.is_explicit(k)) {
            if let Some(v) = variants.iter().find(|v| v.name == e.variant) {
                v.apply(self);
                variant_applied = true;
                done.push(format!("judgment prompt `{}`", v.name));
            }
        }
        // The line rule was fitted on the entry's judgment prompt; an η the user set asks for
        // the ratio rule unless the user also chose the mode.
        let eta_only = self.is_explicit("eta") && !self.is_explicit("verify");
        if self.verify == crate::verify::Verify::Calibrated && variant_applied && !eta_only {
            if let Some(rule) = &e.line_rule {
                self.line_rule = Some(rule.clone());
                done.push("line rule".into());
            }
        }
        (!done.is_empty()).then(|| format!("{}: {}", self.target, done.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_applies_only_to_unset_keys() {
        let variants = builtin_variants().unwrap();
        assert!(variants.len() >= 5);
        let mut cal = Calibrations::default();
        cal.models.insert(
            "t".into(),
            Entry {
                eta: 0.55,
                variant: "claim".into(),
                auc: 0.7,
                accept_rate: 0.8,
                false_accept_rate: 0.2,
                lines: 200,
                sessions: 10,
                rule: "r".into(),
                line_rule: Some(crate::verify::LineRule::from_weights(
                    [0.0, 1.0, 0.0, 2.0],
                    0.5,
                    0.6,
                )),
                line_rule_auc: Some(0.9),
                line_rule_accept: Some(0.6),
                line_rule_false_accept: Some(0.08),
            },
        );
        let text = cal.to_toml().unwrap();
        assert_eq!(Calibrations::parse(&text, "x").unwrap(), cal);
        let mut c = CompactionConfig::default();
        c.target = "t".into();
        let applied = c.apply_calibration(&cal, &variants).unwrap();
        assert!(applied.contains("line rule"), "{applied}");
        assert_eq!(c.line_rule, cal.models["t"].line_rule);
        assert_eq!(c.eta, 0.55);
        assert!(c.prompts.judge.starts_with("Claim:"));
        assert!(c.positive_labels.contains(&"True".to_string()));
        let mut u = CompactionConfig::overlay("eta = 0.8\ntarget = \"t\"", "user.toml").unwrap();
        u.apply_calibration(&cal, &variants);
        assert_eq!(u.eta, 0.8, "the user's eta wins");
        assert!(
            u.line_rule.is_none(),
            "an eta set alone asks for the ratio rule"
        );
        let mut both = CompactionConfig::overlay(
            "eta = 0.8\nverify = \"calibrated\"\ntarget = \"t\"",
            "user.toml",
        )
        .unwrap();
        both.apply_calibration(&cal, &variants);
        assert!(both.line_rule.is_some(), "the mode the user chose applies");
        assert!(u.prompts.judge.starts_with("Claim:"));
        let mut f =
            CompactionConfig::overlay("calibrated = false\ntarget = \"t\"", "user.toml").unwrap();
        assert!(f.apply_calibration(&cal, &variants).is_none());
        assert_eq!(f.eta, 0.7);
        let mut flag = CompactionConfig::default();
        flag.target = "t".into();
        flag.set_eta(0.9);
        flag.apply_calibration(&cal, &variants);
        assert_eq!(flag.eta, 0.9);
    }
}
