//! The crate's error type.

/// Errors from packing weights or running a kernel.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A weight type the kernels do not implement.
    #[error("no kernel for weight type {0}")]
    Unsupported(String),
    /// Sizes that do not fit together.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// A forced instruction set this CPU lacks.
    #[error("instruction set {0:?} is not available on this CPU")]
    Unavailable(crate::Isa),
}

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
