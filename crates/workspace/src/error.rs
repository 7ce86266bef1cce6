//! The crate's error type: every failure names what is wrong and where.

/// A workspace failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database could not be opened or migrated.
    #[error("workspace database {path}: {reason}")]
    Open {
        /// Database file.
        path: String,
        /// What failed.
        reason: String,
    },
    /// A database operation failed.
    #[error("workspace database: {0}")]
    Db(#[from] rusqlite::Error),
    /// The database was written by a newer build.
    #[error("workspace schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew {
        /// Version in the file.
        found: i64,
        /// Newest version this build knows.
        supported: i64,
    },
    /// A settings file or value is wrong.
    #[error("workspace config {origin}: {reason}")]
    Config {
        /// File (or "built-in").
        origin: String,
        /// What is wrong, naming the key.
        reason: String,
    },
    /// No such session.
    #[error("unknown session `{0}`")]
    UnknownSession(String),
    /// No such event in the session.
    #[error("unknown event {0}")]
    UnknownEvent(i64),
    /// No such state record.
    #[error("unknown state record {0}")]
    UnknownRecord(i64),
    /// A writer tried a state write the rules forbid.
    #[error("{writer} may not {action} (only the user or the owner may)")]
    NotAuthorized {
        /// Who tried.
        writer: String,
        /// What was tried.
        action: String,
    },
    /// A record draft is incomplete or invalid.
    #[error("invalid state record: {0}")]
    InvalidRecord(String),
    /// The budget cannot hold what must be loaded.
    #[error("budget: {0}")]
    Budget(String),
    /// A branch operation failed.
    #[error("branch `{name}`: {reason}")]
    Branch {
        /// Branch name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The engine (a summarizer's compactor or the judge's backend) failed.
    #[error("engine: {0}")]
    Engine(#[from] speccompact_engine::Error),
    /// A lock is poisoned (a thread panicked while holding it); names the lock. From a
    /// deletion: the database part is committed, but a model cache may still hold the deleted
    /// text until the process restarts.
    #[error("{0} lock poisoned (a thread panicked while holding it)")]
    Poisoned(&'static str),
    /// Compaction or a rebuild was asked of a session without events.
    #[error("session `{session}` has no events to summarize")]
    NoEvents {
        /// The session.
        session: String,
    },
    /// No such summary.
    #[error("unknown summary {0}")]
    UnknownSummary(i64),
    /// The judge's backend answered a judge request without a token distribution.
    #[error("the judge returned no distribution for a candidate of event {event}")]
    NoJudgement {
        /// The candidate's source event.
        event: i64,
    },
    /// An input history is malformed.
    #[error("history: {0}")]
    History(#[from] speccompact_history::HistoryError),
    /// Stored JSON is malformed.
    #[error("stored JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
