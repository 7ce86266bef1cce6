//! Reading records back: one by id, a branch's own records, every version of a field, and
//! the state seen from a branch (main up to the branch's base, overlaid by the branch).

use super::{Record, RecordType, Status, MAIN};
use crate::route::Writer;
use crate::{Error, Result};
use rusqlite::{params, Connection, OptionalExtension, Row};

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

/// Every record of a session, on every branch.
pub(crate) fn on_branch_all(conn: &Connection, session: &str) -> Result<Vec<Record>> {
    let mut st = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM records WHERE session = ?1 ORDER BY id"
    ))?;
    let rows = st.query_map([session], from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}
