//! Runtime settings as written in `configs/runtime.toml`.

use crate::decoder::LoadOptions;
use crate::linear::DenseMode;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Threads, device and weight preparation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeSettings {
    /// CPU threads (0 = all logical cores).
    pub threads: usize,
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// Longest prefill chunk in tokens.
    pub prefill_chunk: usize,
    /// Requantize slow quant types to Q8_0 at load.
    pub convert_slow_quants: bool,
    /// Use dense weights for forwards of at least this many tokens (0 = never).
    pub dense_min_rows: usize,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        Self {
            threads: 0,
            device: "cpu".into(),
            prefill_chunk: 512,
            convert_slow_quants: true,
            dense_min_rows: 0,
        }
    }
}

impl RuntimeSettings {
    /// Parses TOML text; `origin` names the source in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let s: Self = toml::from_str(text)
            .map_err(|e| Error::InvalidRequest(format!("runtime settings {origin}: {e}")))?;
        if s.prefill_chunk == 0 {
            return Err(Error::InvalidRequest(format!(
                "runtime settings {origin}: prefill_chunk must be at least 1"
            )));
        }
        Ok(s)
    }

    /// Reads a settings file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The load options these settings imply.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            convert_slow_quants: self.convert_slow_quants,
            dense: match self.dense_min_rows {
                0 => DenseMode::Off,
                n => DenseMode::On { min_rows: n },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_file_equals_defaults() {
        let text = include_str!("../../../configs/runtime.toml");
        assert_eq!(
            RuntimeSettings::parse(text, "runtime.toml").unwrap(),
            RuntimeSettings::default()
        );
    }

    #[test]
    fn wrong_settings_are_named() {
        let e = RuntimeSettings::parse("thread = 2", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.toml") && e.contains("thread"), "{e}");
        let e = RuntimeSettings::parse("prefill_chunk = 0", "y.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("prefill_chunk"), "{e}");
        let s = RuntimeSettings::parse("dense_min_rows = 16", "z").unwrap();
        assert_eq!(s.load_options().dense, DenseMode::On { min_rows: 16 });
    }
}
