//! The write rules: a record version is written from its source events, valid only when the
//! least authoritative writer among them may set its type (goals, constraints, permissions
//! and acceptance criteria need the user or the owner; an open issue closes only on an event
//! by them or a tool that exited 0), and kept as a `pending_confirmation` candidate
//! otherwise, until an authorized event confirms it. Older versions become `replaced`.

use super::{
    current, get, view, Detail, Draft, Record, RecordType, Status, WriteOutcome,
    EVIDENCE_REF_MAX_CHARS,
};
use crate::event::Event;
use crate::route::Writer;
use crate::{Error, Result};
use rusqlite::{params, Connection};

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
