//! Protected state: versioned records (goal, constraint, permission, acceptance criterion,
//! decision, open issue, done, evidence reference) with their verbatim value, source events,
//! writer, time, scope, version and status. Records change only through events, under write
//! rules: only the user or the owner may set goals, constraints, permissions and acceptance
//! criteria, or confirm a candidate; the same text from an assistant or a tool is kept as a
//! `pending_confirmation` candidate. An open issue closes only on an event by the user, the
//! owner or a tool that exited 0 — never because a summary says so. Old versions stay, as
//! `replaced`, for the audit history.
//!
//! The module is split by concern: `record` holds the record types and how a record renders,
//! `query` reads records back (one branch, a field's history, the view from a branch), and
//! `rules` writes them under the write rules (new versions, statuses, confirmations).

mod query;
mod record;
mod rules;

pub(crate) use query::on_branch_all;
pub use query::{current, get, history, on_branch, view};
pub use record::{
    render, Detail, Draft, Record, RecordType, Status, WriteOutcome, EVIDENCE_REF_MAX_CHARS,
};
pub(crate) use rules::{confirm, insert, set_status, write};

/// The main line of state; branches are named otherwise.
pub const MAIN: &str = "main";
