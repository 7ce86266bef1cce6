//! Protected state: versioned records (goal, constraint, permission, acceptance criterion,
//! decision, open issue, done, evidence reference) with their verbatim value, source events,
//! writer, time, scope, version and status. Records change only through events, under write
//! rules: only the user or the owner may set goals, constraints, permissions and acceptance
//! criteria, or confirm a candidate; the same text from an assistant or a tool is kept as a
//! `pending_confirmation` candidate. An open issue closes only on an event by the user, the
//! owner or a tool that exited 0 — never because a summary says so. Old versions stay, as
//! `replaced`, for the audit history.

use crate::event::Event;
use crate::route::Writer;
use crate::{Error, Result};
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

/// The main line of state; branches are named otherwise.
pub const MAIN: &str = "main";

/// A record's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordType {
    /// What the work is for.
    Goal,
    /// A hard rule.
    Constraint,
    /// Something the agent may do.
    Permission,
    /// When the work counts as done.
    AcceptanceCriterion,
    /// Something still unresolved.
    OpenIssue,
    /// A decision, with rationale and alternatives.
    Decision,
    /// Something completed.
    Done,
    /// A reference to an event (not a copy of it).
    EvidenceRef,
}

impl RecordType {
    /// Every type, in the order state is rendered.
    pub const ALL: [RecordType; 8] = [
        Self::Goal,
        Self::Constraint,
        Self::Permission,
        Self::AcceptanceCriterion,
        Self::OpenIssue,
        Self::Decision,
        Self::Done,
        Self::EvidenceRef,
    ];
    /// The type's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Goal => "goal",
            Self::Constraint => "constraint",
            Self::Permission => "permission",
            Self::AcceptanceCriterion => "acceptance_criterion",
            Self::OpenIssue => "open_issue",
            Self::Decision => "decision",
            Self::Done => "done",
            Self::EvidenceRef => "evidence_ref",
        }
    }
    /// Parses a type name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
    /// Types only the user or the owner may write.
    pub fn needs_authority(self) -> bool {
        matches!(
            self,
            Self::Goal | Self::Constraint | Self::Permission | Self::AcceptanceCriterion
        )
    }
    /// Types an assembled context always loads (it fails rather than drop them).
    pub fn always_loaded(self) -> bool {
        self.needs_authority() || self == Self::OpenIssue
    }
}

/// A record's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// In force.
    Valid,
    /// Superseded by a later version (kept for the audit history).
    Replaced,
    /// A candidate waiting for an authorized confirm event.
    PendingConfirmation,
    /// Lost a merge conflict, or was dropped by review.
    Rejected,
}

impl Status {
    /// The status's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Valid => "valid",
            Self::Replaced => "replaced",
            Self::PendingConfirmation => "pending_confirmation",
            Self::Rejected => "rejected",
        }
    }
    /// Parses a status name.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Valid,
            Self::Replaced,
            Self::PendingConfirmation,
            Self::Rejected,
        ]
        .into_iter()
        .find(|t| t.as_str() == s)
    }
}

/// Per-type extras.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Detail {
    /// A decision's rationale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rationale: Option<String>,
    /// A decision's alternatives.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<String>,
    /// The event that confirmed a candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed_by: Option<i64>,
    /// Why a record was rejected or changed (merge rule, judge score).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A stored record (one version).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// Row id (one per version).
    pub id: i64,
    /// Session.
    pub session: String,
    /// Branch (`main` or a branch name).
    pub branch: String,
    /// The field this record is a version of.
    pub key: String,
    /// Type.
    #[serde(rename = "type")]
    pub kind: RecordType,
    /// Canonical value, verbatim from the source.
    pub value: String,
    /// Source event ids.
    pub sources: Vec<i64>,
    /// Who wrote the source.
    pub writer: Writer,
    /// When (ms since the epoch).
    pub time_ms: i64,
    /// Scope (`session` or a narrower one).
    pub scope: String,
    /// Version of `key`, from 1.
    pub version: i64,
    /// Status.
    pub status: Status,
    /// Extras.
    pub detail: Detail,
    /// Whether a source event was deleted.
    pub source_deleted: bool,
    /// Session-wide write counter at this write (orders writes, detects moved branch bases).
    pub stamp: i64,
}

/// A record to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    /// Type.
    pub kind: RecordType,
    /// Verbatim value.
    pub value: String,
    /// Field key; derived from type and value when absent (`goal` for goals).
    pub key: Option<String>,
    /// Scope; `session` when absent.
    pub scope: Option<String>,
    /// Extras.
    pub detail: Detail,
}

impl Draft {
    /// A draft of `kind` with `value`.
    pub fn new(kind: RecordType, value: &str) -> Self {
        Self {
            kind,
            value: value.to_string(),
            key: None,
            scope: None,
            detail: Detail::default(),
        }
    }
    /// Sets the key.
    pub fn key(mut self, key: &str) -> Self {
        self.key = Some(key.to_string());
        self
    }
    /// The field key.
    pub fn field_key(&self) -> String {
        if let Some(k) = &self.key {
            return k.clone();
        }
        if self.kind == RecordType::Goal {
            return "goal".into();
        }
        let words: Vec<String> = self
            .value
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .take(10)
            .map(str::to_lowercase)
            .collect();
        format!("{}:{}", self.kind.as_str(), words.join("-"))
    }
}

/// What a write did.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOutcome {
    /// A new valid version.
    Written(Record),
    /// Kept as a candidate waiting for confirmation.
    Pending(Record),
    /// The same value is already in force.
    Unchanged(Record),
}

impl WriteOutcome {
    /// The record written or found.
    pub fn record(&self) -> &Record {
        match self {
            Self::Written(r) | Self::Pending(r) | Self::Unchanged(r) => r,
        }
    }
}

/// Longest value of an evidence reference: it points at an event, it does not copy it.
pub const EVIDENCE_REF_MAX_CHARS: usize = 160;

const COLUMNS: &str = "id, session, branch, key, type, value, sources, writer, time_ms, scope, version, status, detail, source_deleted, stamp";

fn from_row(r: &Row<'_>) -> rusqlite::Result<Record> {
    let bad = |i: usize, what: &str| {
        rusqlite::Error::FromSqlConversionFailure(
            i,
            rusqlite::types::Type::Text,
            format!("unknown {what}").into(),
        )
    };
    let kind: String = r.get(4)?;
    let writer: String = r.get(7)?;
    let status: String = r.get(11)?;
    let sources: String = r.get(6)?;
    let detail: String = r.get(12)?;
    Ok(Record {
        id: r.get(0)?,
        session: r.get(1)?,
        branch: r.get(2)?,
        key: r.get(3)?,
        kind: RecordType::parse(&kind).ok_or_else(|| bad(4, "record type"))?,
        value: r.get(5)?,
        sources: serde_json::from_str(&sources).map_err(|_| bad(6, "sources"))?,
        writer: Writer::parse(&writer).ok_or_else(|| bad(7, "writer"))?,
        time_ms: r.get(8)?,
        scope: r.get(9)?,
        version: r.get(10)?,
        status: Status::parse(&status).ok_or_else(|| bad(11, "status"))?,
        detail: serde_json::from_str(&detail).map_err(|_| bad(12, "detail"))?,
        source_deleted: r.get::<_, i64>(13)? != 0,
        stamp: r.get(14)?,
    })
}

/// One record by id.
pub fn get(conn: &Connection, id: i64) -> Result<Record> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM records WHERE id = ?1"),
        [id],
        from_row,
    )
    .optional()?
    .ok_or(Error::UnknownRecord(id))
}

/// Records of a session on one branch (not the main line it forked from).
pub fn on_branch(conn: &Connection, session: &str, branch: &str) -> Result<Vec<Record>> {
    let mut st = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM records WHERE session = ?1 AND branch = ?2 ORDER BY id"
    ))?;
    let rows = st.query_map(params![session, branch], from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Every version of a field, oldest first, across branches.
pub fn history(conn: &Connection, session: &str, key: &str) -> Result<Vec<Record>> {
    let mut st = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM records WHERE session = ?1 AND key = ?2 ORDER BY id"
    ))?;
    let rows = st.query_map(params![session, key], from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The state seen from `branch`: main's records up to the branch's base stamp, overlaid by
/// the branch's own records. Every status is returned; filter with [`Record::status`].
pub fn view(conn: &Connection, session: &str, branch: &str) -> Result<Vec<Record>> {
    if branch == MAIN {
        return on_branch(conn, session, MAIN);
    }
    let base: i64 = conn
        .query_row(
            "SELECT base_stamp FROM branches WHERE session = ?1 AND name = ?2",
            params![session, branch],
            |r| r.get(0),
        )
        .optional()?
        .ok_or_else(|| Error::Branch {
            name: branch.into(),
            reason: "no such branch".into(),
        })?;
    let own = on_branch(conn, session, branch)?;
    let mut out: Vec<Record> = on_branch(conn, session, MAIN)?
        .into_iter()
        .filter(|r| r.stamp <= base)
        .map(|mut r| {
            // A main record replaced after the base was still valid at the base.
            if r.status == Status::Replaced && replaced_after(conn, &r, base).unwrap_or(false) {
                r.status = Status::Valid;
            }
            r
        })
        .collect();
    for r in &own {
        if r.status == Status::Valid {
            for m in out
                .iter_mut()
                .filter(|m| m.key == r.key && m.status == Status::Valid)
            {
                m.status = Status::Replaced;
            }
        }
    }
    out.extend(own);
    Ok(out)
}

fn replaced_after(conn: &Connection, r: &Record, base: i64) -> Result<bool> {
    let next: Option<i64> = conn
        .query_row(
            "SELECT MIN(stamp) FROM records WHERE session = ?1 AND branch = ?2 AND key = ?3 AND stamp > ?4 AND status != 'pending_confirmation'",
            params![r.session, r.branch, r.key, r.stamp],
            |row| row.get(0),
        )
        .optional()?
        .flatten();
    Ok(next.is_some_and(|s| s > base))
}

/// The valid record of `key` seen from `branch`.
pub fn current(
    conn: &Connection,
    session: &str,
    branch: &str,
    key: &str,
) -> Result<Option<Record>> {
    Ok(view(conn, session, branch)?
        .into_iter()
        .rev()
        .find(|r| r.key == key && r.status == Status::Valid))
}

fn next_stamp(conn: &Connection, session: &str) -> Result<i64> {
    let s: Option<i64> = conn.query_row(
        "SELECT MAX(stamp) FROM records WHERE session = ?1",
        [session],
        |r| r.get(0),
    )?;
    Ok(s.unwrap_or(0) + 1)
}

/// Inserts one record version; returns it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn insert(
    conn: &Connection,
    session: &str,
    branch: &str,
    key: &str,
    draft: &Draft,
    sources: &[i64],
    writer: Writer,
    time_ms: i64,
    version: i64,
    status: Status,
) -> Result<Record> {
    let stamp = next_stamp(conn, session)?;
    conn.execute(
        "INSERT INTO records (session, branch, key, type, value, sources, writer, time_ms, scope, version, status, detail, stamp)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        params![
            session,
            branch,
            key,
            draft.kind.as_str(),
            draft.value,
            serde_json::to_string(sources)?,
            writer.as_str(),
            time_ms,
            draft.scope.as_deref().unwrap_or("session"),
            version,
            status.as_str(),
            serde_json::to_string(&draft.detail)?,
            stamp,
        ],
    )?;
    get(conn, conn.last_insert_rowid())
}

/// Sets a record's status.
pub(crate) fn set_status(conn: &Connection, id: i64, status: Status) -> Result<()> {
    conn.execute(
        "UPDATE records SET status = ?2 WHERE id = ?1",
        params![id, status.as_str()],
    )?;
    Ok(())
}

/// Writes a record on `branch` from its source events, under the write rules.
pub(crate) fn write(
    conn: &Connection,
    session: &str,
    branch: &str,
    draft: &Draft,
    sources: &[Event],
) -> Result<WriteOutcome> {
    let first = sources.first().ok_or_else(|| {
        Error::InvalidRecord("a record must cite at least one source event".into())
    })?;
    if draft.value.trim().is_empty() {
        return Err(Error::InvalidRecord(format!(
            "empty {} value",
            draft.kind.as_str()
        )));
    }
    if draft.kind == RecordType::EvidenceRef && draft.value.chars().count() > EVIDENCE_REF_MAX_CHARS
    {
        return Err(Error::InvalidRecord(format!(
            "an evidence_ref keeps the reference, not a copy: {} characters (most {EVIDENCE_REF_MAX_CHARS})",
            draft.value.chars().count()
        )));
    }
    // The writer is the least authoritative of the cited events: citing a user message
    // beside a tool output does not launder the tool's text into a rule.
    let writer = sources
        .iter()
        .map(|e| e.writer)
        .min()
        .unwrap_or(first.writer);
    let ids: Vec<i64> = sources.iter().map(|e| e.id).collect();
    let key = draft.field_key();
    let cur = current(conn, session, branch, &key)?;
    if let Some(c) = &cur {
        if c.value == draft.value && c.kind == draft.kind {
            return Ok(WriteOutcome::Unchanged(c.clone()));
        }
    }
    let closes_issue = cur
        .as_ref()
        .is_some_and(|c| c.kind == RecordType::OpenIssue && draft.kind != RecordType::OpenIssue);
    let tool_passed = sources
        .iter()
        .any(|e| e.writer == Writer::Tool && e.exit_code == Some(0));
    let allowed = if draft.kind.needs_authority() {
        writer.is_authorized()
    } else if closes_issue {
        writer.is_authorized() || tool_passed
    } else {
        true
    };
    let version = cur.as_ref().map_or(1, |c| c.version + 1);
    if !allowed {
        // Candidate evidence, never a rule: the valid version (if any) stays in force.
        let pending_exists = view(conn, session, branch)?.into_iter().find(|r| {
            r.key == key && r.value == draft.value && r.status == Status::PendingConfirmation
        });
        if let Some(p) = pending_exists {
            return Ok(WriteOutcome::Pending(p));
        }
    }
    let status = if allowed {
        Status::Valid
    } else {
        Status::PendingConfirmation
    };
    let r = insert(
        conn,
        session,
        branch,
        &key,
        draft,
        &ids,
        writer,
        first.time_ms,
        version,
        status,
    )?;
    if !allowed {
        return Ok(WriteOutcome::Pending(r));
    }
    if let Some(c) = cur {
        if c.branch == branch {
            set_status(conn, c.id, Status::Replaced)?;
        }
    }
    Ok(WriteOutcome::Written(r))
}

/// Confirms a pending candidate with an event by the user or the owner.
pub(crate) fn confirm(conn: &Connection, record: &Record, event: &Event) -> Result<Record> {
    if record.status != Status::PendingConfirmation {
        return Err(Error::InvalidRecord(format!(
            "record {} is {}, not pending_confirmation",
            record.id,
            record.status.as_str()
        )));
    }
    if !event.writer.is_authorized() {
        return Err(Error::NotAuthorized {
            writer: event.writer.as_str().into(),
            action: format!("confirm record {} (event {})", record.id, event.id),
        });
    }
    let cur = current(conn, &record.session, &record.branch, &record.key)?;
    let mut sources = record.sources.clone();
    sources.push(event.id);
    let draft = Draft {
        kind: record.kind,
        value: record.value.clone(),
        key: Some(record.key.clone()),
        scope: Some(record.scope.clone()),
        detail: Detail {
            confirmed_by: Some(event.id),
            ..record.detail.clone()
        },
    };
    let r = insert(
        conn,
        &record.session,
        &record.branch,
        &record.key,
        &draft,
        &sources,
        record.writer,
        event.time_ms,
        cur.as_ref().map_or(1, |c| c.version + 1),
        Status::Valid,
    )?;
    set_status(conn, record.id, Status::Replaced)?;
    if let Some(c) = cur.filter(|c| c.branch == record.branch) {
        set_status(conn, c.id, Status::Replaced)?;
    }
    Ok(r)
}

/// Renders one record as a state line: `- [type vN · writer · event 3] value`.
pub fn render(r: &Record) -> String {
    let srcs: Vec<String> = r.sources.iter().map(|s| s.to_string()).collect();
    let mut line = format!(
        "- [{} v{} · {} · event {}{}] {}",
        r.kind.as_str(),
        r.version,
        r.writer.as_str(),
        srcs.join(","),
        if r.source_deleted {
            " (source deleted)"
        } else {
            ""
        },
        r.value
    );
    if let Some(why) = &r.detail.rationale {
        line.push_str(&format!(" — because {why}"));
    }
    if !r.detail.alternatives.is_empty() {
        line.push_str(&format!(" — over: {}", r.detail.alternatives.join("; ")));
    }
    line
}

/// Every record of a session, on every branch.
pub(crate) fn on_branch_all(conn: &Connection, session: &str) -> Result<Vec<Record>> {
    let mut st = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM records WHERE session = ?1 ORDER BY id"
    ))?;
    let rows = st.query_map([session], from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}
