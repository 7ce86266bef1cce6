//! Drafter alignment. The drafter's lines survive verification only when they read like the
//! target's own; this crate builds what a drafter is trained on to get there:
//! [`data::build`] has the target write every slot alone on the very prompts the drafter sees
//! (target-self), filters the bodies ([`filter`]), and writes prompt/completion JSONL, the
//! same examples pre-tokenized for the drafter (labels masked to the body), and a manifest;
//! [`train`] trains LoRA adapters (the runtime's [`speccompact_runtime::adapter`], PEFT's
//! layout) on a dense copy of the drafter.

pub mod curve;
pub mod data;
pub mod filter;
pub mod train;

pub use data::{build, DataOptions, DataSummary, ModelFile};
pub use filter::{check, Rejection};

/// Everything that can go wrong building alignment data.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A file this run wrote earlier (and would resume from) is not what it should be.
    #[error("{path}: {reason} (delete it to build that session again)")]
    Resume {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The settings cannot work.
    #[error("invalid alignment settings: {0}")]
    Settings(String),
    /// The engine failed on a session.
    #[error("session {session}: {source}")]
    Engine {
        /// The session id.
        session: String,
        /// The cause.
        source: speccompact_engine::Error,
    },
    /// A checkpoint could not be written.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The file.
        path: String,
        /// What failed.
        reason: String,
    },
    /// A tensor operation failed.
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
    /// The runtime failed (the drafter's tokenizer, reading weights).
    #[error("runtime: {0}")]
    Runtime(#[from] speccompact_runtime::Error),
    /// The evaluation crate's helpers failed (reading data, checksums).
    #[error(transparent)]
    Data(#[from] speccompact_eval::Error),
}

impl Error {
    /// The I/O error of `path`, for `map_err`.
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Error::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, Error>;
