//! The evaluation harness: does a compacted context still support the next decision?
//!
//! One module per stage: `bench` (every compaction method on every session, timed, with
//! speedups), `calibrate` (the verifier's labelled line set, its scores and the calibrated η
//! and line rule), `data` (the evaluation sessions with their probes), `context` (what
//! each method hands the next turn: a summary, the recent tail, or the whole history),
//! `metrics` (pure scoring functions), `models` (the reader and the one-token judges over a
//! [`speccompact_engine::Backend`]), `run` (every method on every session), `drift` (recursive
//! generations against rebuilds from the log) and `report` (tables with bootstrap intervals,
//! JSON and plots).

pub mod bench;
pub mod calibrate;
pub mod context;
pub mod data;
pub mod drift;
pub mod metrics;
pub mod models;
pub mod report;
pub mod run;

pub use context::{truncate_tail, EvalMethod, TailBudget};
pub use data::{base_id, load_sessions, sha256_file, EvalSession, Probe, ProbeKind, Selection};
pub use drift::{drift_stress, DriftGeneration, DriftReport};
pub use models::EvalPrompts;
pub use report::{Provenance, Report};
pub use run::{evaluate, EvalOptions, MethodResult, SessionResult};

/// Why an evaluation could not run; always names the input at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A data file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A data file is not in the evaluation format.
    #[error("{path} line {line}: {reason}")]
    Data {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// Settings that cannot work.
    #[error("evaluation settings ({origin}): {reason}")]
    Config {
        /// Where the settings came from.
        origin: String,
        /// What is wrong.
        reason: String,
    },
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] speccompact_engine::Error),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
