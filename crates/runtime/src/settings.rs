//! Runtime settings as written in `configs/runtime.toml` (embedded from this crate's
//! `configs/`), overlaid by a user's file.

use crate::decoder::LoadOptions;
use crate::linear::{DenseMode, KernelMode};
use crate::lookup::LookupMode;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The built-in runtime settings (the same text as the user-facing `configs/runtime.toml`).
pub const DEFAULT_RUNTIME: &str = include_str!("../configs/runtime.toml");

/// Whether to keep dense f32 copies of the projection weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenseChoice {
    /// By a fixed rule on the weights and the machine ([`DenseMode::Auto`]).
    Auto,
    /// Always ([`DenseMode::On`]).
    On,
    /// Never ([`DenseMode::Off`]).
    Off,
}

/// Threads, device and weight preparation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSettings {
    /// CPU threads (0 = all logical cores).
    pub threads: usize,
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// Longest prefill chunk in tokens.
    pub prefill_chunk: usize,
    /// Requantize slow quant types to Q8_0 at load.
    pub convert_slow_quants: bool,
    /// Dense f32 copies of the projection weights for prefill: `auto` (a fixed rule), `on`,
    /// `off`.
    pub dense: DenseChoice,
    /// Prefill forwards of at least this many tokens use the dense copies.
    pub dense_min_rows: usize,
    /// Quantized matmul on CPU: `on` (the kernels crate wherever it implements the weight
    /// type, at every row count; `auto` reads as `on`), `off` (candle's, not batch-invariant).
    pub kernels: KernelMode,
    /// Token speculation from the text in every decode: `auto` (where the measured cost
    /// model says it pays, on batch-invariant models only), `on`, `off`.
    pub lookup: LookupMode,
}

/// The built-in settings ([`DEFAULT_RUNTIME`]).
impl Default for RuntimeSettings {
    fn default() -> Self {
        // The embedded file is checked by a unit test; failing here would be a build defect.
        Self::parse("", "built-in").unwrap_or_else(|e| panic!("{e}"))
    }
}

fn invalid(e: speccompact_settings::Error) -> Error {
    Error::InvalidRequest(format!("runtime settings {e}"))
}

impl RuntimeSettings {
    /// The built-in settings with the keys of `text` replacing theirs; `origin` names the
    /// source in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let s: Self = speccompact_settings::overlay(DEFAULT_RUNTIME, text, origin)
            .map_err(invalid)?
            .value;
        if s.prefill_chunk == 0 {
            return Err(Error::InvalidRequest(format!(
                "runtime settings {origin}: prefill_chunk must be at least 1"
            )));
        }
        Ok(s)
    }

    /// Reads a settings file whose keys override the built-in ones.
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
            dense: match self.dense {
                DenseChoice::On => DenseMode::On {
                    min_rows: self.dense_min_rows.max(1),
                },
                DenseChoice::Off => DenseMode::Off,
                DenseChoice::Auto => DenseMode::Auto {
                    min_rows: self.dense_min_rows.max(1),
                },
            },
            kernels: self.kernels,
            lookup: self.lookup,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_file_equals_defaults() {
        let s = RuntimeSettings::parse(DEFAULT_RUNTIME, "runtime.toml").unwrap();
        assert_eq!(s, RuntimeSettings::default());
        assert_eq!(s.dense, DenseChoice::Auto);
        assert_eq!(s.kernels, KernelMode::On);
        assert_eq!(s.prefill_chunk, 512);
        assert_eq!(s.load_options().lookup, LookupMode::Auto);
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
        let s = RuntimeSettings::parse("dense = \"on\"\ndense_min_rows = 16", "z").unwrap();
        assert_eq!(s.load_options().dense, DenseMode::On { min_rows: 16 });
        assert_eq!(
            RuntimeSettings::default().load_options().dense,
            DenseMode::Auto { min_rows: 128 }
        );
        let s = RuntimeSettings::parse("kernels = \"auto\"", "k").unwrap();
        assert_eq!(s.load_options().kernels, KernelMode::On);
        let s = RuntimeSettings::parse("kernels = \"off\"", "k").unwrap();
        assert_eq!(s.load_options().kernels, KernelMode::Off);
        let e = RuntimeSettings::parse("kernels = \"fast\"", "k.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("k.toml") && e.contains("fast"), "{e}");
        let s = RuntimeSettings::parse("lookup = \"off\"", "l").unwrap();
        assert_eq!(s.load_options().lookup, LookupMode::Off);
        let e = RuntimeSettings::parse("lookup = \"always\"", "l.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("l.toml") && e.contains("always"), "{e}");
        let e = RuntimeSettings::parse("dense = \"maybe\"", "w.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("maybe"), "{e}");
    }
}
