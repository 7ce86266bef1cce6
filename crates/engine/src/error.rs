//! The engine's one error type.

/// Everything that can stop a compaction.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model failed to load or run.
    #[error(transparent)]
    Runtime(#[from] speccompact_runtime::Error),
    /// The input is not a usable history.
    #[error("history: {0}")]
    History(#[from] speccompact_history::HistoryError),
    /// The configuration is invalid; names the key.
    #[error("config {origin}: {reason}")]
    Config {
        /// File or source of the settings.
        origin: String,
        /// What is wrong.
        reason: String,
    },
    /// The rendered history does not fit a model's context.
    #[error(
        "the history is {tokens} tokens for {model}, whose context of {context} tokens leaves \
         {limit} for it after the instructions and the summary reserve; shorten it, lower \
         tool_result_cap, or pass --overflow stages (or middle-cut)"
    )]
    HistoryTooLong {
        /// The model whose context is exceeded.
        model: String,
        /// Tokens of the whole prefix (instructions, history, schema).
        tokens: usize,
        /// Tokens available for that prefix.
        limit: usize,
        /// The model's context length.
        context: usize,
    },
    /// The assembled summary exceeds its token budget.
    #[error("the summary is {tokens} tokens, over its budget of {budget}")]
    SummaryOverBudget {
        /// Tokens of the assembled summary.
        tokens: usize,
        /// The budget.
        budget: usize,
    },
    /// A backend broke the request/response contract.
    #[error("backend {backend}: {reason}")]
    Backend {
        /// The backend's name.
        backend: String,
        /// What went wrong.
        reason: String,
    },
}

impl From<speccompact_settings::Error> for Error {
    fn from(e: speccompact_settings::Error) -> Self {
        Error::Config {
            origin: e.origin().to_string(),
            reason: e.reason(),
        }
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
