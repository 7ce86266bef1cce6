//! speccompact's compaction system around the engine.
//!
//! The original event log is the only factual anchor; compaction produces a *view for a
//! task*, never a replacement of the log. Three channels with separate lifecycles: protected
//! **state** (versioned records changed only by events under write rules), the task
//! **summary** (rewritten by the engine, checked against state, never writing it), and the
//! **evidence** index over the original events. A context for a task is assembled from the
//! three within a budget and lists what it did not load.
//!
//! One module per concern: `db` (SQLite schema and migrations), `config` (settings and
//! patterns), `redact` (secrets and personal data), `event_class` (the classes routing
//! gives), `route` (classification, writers, high-risk fields), `event` (the log), `extract`
//! (state candidates), `state` (records, their queries and write rules), `evidence` (BM25
//! index), `summary` (the summary channel and drift reports), `guard` (summary checks against
//! state), `budget`, `assemble`, `triggers`, `branch`, `models` (summarizer and judge seams)
//! and `workspace` (the API: the workspace, its sessions, compaction and deletion).

pub mod assemble;
pub mod branch;
pub mod budget;
pub mod config;
pub mod db;
mod error;
pub mod event;
pub mod event_class;
pub mod evidence;
pub mod extract;
pub mod guard;
pub mod models;
pub mod redact;
pub mod route;
pub mod state;
pub mod summary;
pub mod triggers;
pub mod workspace;

pub use assemble::{Assembled, Focus};
pub use branch::{BranchStatus, MergeReport, OnStale};
pub use budget::{BudgetSpec, Plan};
pub use config::WorkspaceConfig;
pub use error::{Error, Result};
pub use event::{Event, NewEvent};
pub use event_class::EventClass;
pub use guard::{Flag, FlagKind};
pub use models::{CandidateJudge, EngineSummarizer, EventCache, ModelJudge, Summarizer};
pub use route::Writer;
pub use state::{Detail, Draft, Record, RecordType, Status, WriteOutcome};
pub use summary::{Divergence, Summary, SummaryKind};
pub use triggers::Trigger;
pub use workspace::{
    char_estimate, Compacted, DeletionReport, Ingested, Session, TokenCounter, Workspace,
};
