//! The runtime's one error type.

use std::path::PathBuf;

/// Everything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed inside candle.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// A CPU matmul kernel failed.
    #[error("matmul kernel: {0}")]
    Kernel(#[from] speccompact_kernels::Error),

    /// A model file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },

    /// The file is not a readable GGUF file (bad magic, truncated, inconsistent header).
    #[error("{path} is not a valid GGUF file: {reason}")]
    CorruptGguf {
        /// The file that failed.
        path: PathBuf,
        /// What the parser reported.
        reason: String,
    },

    /// GGUF metadata lacks a key the architecture needs, or it has the wrong type.
    #[error("GGUF metadata key `{key}` is missing or invalid: {reason}")]
    Metadata {
        /// The metadata key.
        key: String,
        /// Why it could not be used.
        reason: String,
    },

    /// A weight tensor is missing or has an unexpected shape.
    #[error("weight `{name}`: {reason}")]
    Weight {
        /// The tensor name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The architecture named in the file is not one this runtime implements.
    #[error("unsupported architecture `{0}` (supported: llama, qwen2, qwen3, gemma3)")]
    UnsupportedArchitecture(String),

    /// The tokenizer could not be built or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// The chat template could not be parsed or rendered.
    #[error("chat template: {0}")]
    ChatTemplate(String),

    /// A device string (`cpu`, `cuda:N`) is malformed or not available in this build.
    #[error("device `{spec}`: {reason}")]
    Device {
        /// The device string given.
        spec: String,
        /// Why it cannot be used.
        reason: String,
    },

    /// A LoRA adapter's files are not what they should be, or it does not fit its base.
    #[error("adapter {path}: {reason}")]
    Adapter {
        /// The adapter's folder or file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },

    /// A request to the model is inconsistent (empty input, position past the context, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

/// The runtime's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The I/O error of `path`, for `map_err`.
    pub fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn metadata(key: &str, reason: impl std::fmt::Display) -> Self {
        Error::Metadata {
            key: key.to_string(),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn weight(name: &str, reason: impl std::fmt::Display) -> Self {
        Error::Weight {
            name: name.to_string(),
            reason: reason.to_string(),
        }
    }
}
