//! Branches of state for parallel subtasks: a fork records the main line's write stamp as its
//! base; the branch's writes are its increments. Merging never lets the last branch to finish
//! win: for each field the branch changed, if the main line did not change it since the base
//! the increment applies; otherwise the conflict rule decides — the more authoritative writer
//! (owner > user > assistant > tool), then the later source event; on a full tie the main line
//! stays. A branch whose base moved is either replayed on the new base (the rule applied per
//! field against the current main line) or marked expired, as the caller asks.

use crate::state::{self, Draft, Record, Status, MAIN};
use crate::{Error, Result};
use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;

/// What to do with a branch whose base moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStale {
    /// Re-apply its increments on the current main line under the conflict rule.
    Replay,
    /// Mark it expired; apply nothing.
    Expire,
}

/// A branch's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BranchStatus {
    /// Accepting writes.
    Open,
    /// Merged into the main line.
    Merged,
    /// Its base moved and it was not replayed.
    Expired,
}

impl BranchStatus {
    fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Merged => "merged",
            Self::Expired => "expired",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        [Self::Open, Self::Merged, Self::Expired]
            .into_iter()
            .find(|b| b.as_str() == s)
    }
}

/// One field's fate in a merge.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldMerge {
    /// Field key.
    pub key: String,
    /// The branch's record.
    pub branch_record: i64,
    /// The new main record, when the increment applied.
    pub applied: Option<i64>,
    /// Why (rule that decided).
    pub rule: String,
}

/// What a merge did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MergeReport {
    /// Branch.
    pub branch: String,
    /// Whether the base had moved.
    pub base_moved: bool,
    /// Final status.
    pub status: BranchStatus,
    /// Per field.
    pub fields: Vec<FieldMerge>,
}

/// Forks a branch from the main line's current state.
pub(crate) fn fork(conn: &Connection, session: &str, name: &str) -> Result<()> {
    if name == MAIN || name.trim().is_empty() {
        return Err(Error::Branch {
            name: name.into(),
            reason: "reserved or empty name".into(),
        });
    }
    let base: i64 = conn.query_row(
        "SELECT COALESCE(MAX(stamp), 0) FROM records WHERE session = ?1 AND branch = 'main'",
        [session],
        |r| r.get(0),
    )?;
    let n = conn.execute(
        "INSERT OR IGNORE INTO branches (session, name, base_stamp, status) VALUES (?1, ?2, ?3, 'open')",
        params![session, name, base],
    )?;
    if n == 0 {
        return Err(Error::Branch {
            name: name.into(),
            reason: "already exists".into(),
        });
    }
    Ok(())
}

/// A branch's status and base stamp.
pub(crate) fn status(conn: &Connection, session: &str, name: &str) -> Result<(BranchStatus, i64)> {
    let row: Option<(String, i64)> = conn
        .query_row(
            "SELECT status, base_stamp FROM branches WHERE session = ?1 AND name = ?2",
            params![session, name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let (s, base) = row.ok_or_else(|| Error::Branch {
        name: name.into(),
        reason: "no such branch".into(),
    })?;
    let s = BranchStatus::parse(&s).ok_or_else(|| Error::Branch {
        name: name.into(),
        reason: format!("unknown status {s}"),
    })?;
    Ok((s, base))
}

fn set_status(conn: &Connection, session: &str, name: &str, s: BranchStatus) -> Result<()> {
    conn.execute(
        "UPDATE branches SET status = ?3 WHERE session = ?1 AND name = ?2",
        params![session, name, s.as_str()],
    )?;
    Ok(())
}

/// The conflict rule's rank of a record: writer authority, then its latest source event.
fn rank(r: &Record) -> (crate::route::Writer, i64) {
    (r.writer, r.sources.iter().copied().max().unwrap_or(0))
}

/// Merges a branch into the main line.
pub(crate) fn merge(
    conn: &Connection,
    session: &str,
    name: &str,
    on_stale: OnStale,
) -> Result<MergeReport> {
    let (st, base) = status(conn, session, name)?;
    if st != BranchStatus::Open {
        return Err(Error::Branch {
            name: name.into(),
            reason: format!("is {}, not open", st.as_str()),
        });
    }
    let main = state::on_branch(conn, session, MAIN)?;
    let base_moved = main.iter().any(|r| r.stamp > base);
    if base_moved && on_stale == OnStale::Expire {
        set_status(conn, session, name, BranchStatus::Expired)?;
        return Ok(MergeReport {
            branch: name.into(),
            base_moved,
            status: BranchStatus::Expired,
            fields: Vec::new(),
        });
    }
    // The branch's increments: its latest valid or pending record per field.
    let own = state::on_branch(conn, session, name)?;
    let mut latest: Vec<&Record> = Vec::new();
    for r in own
        .iter()
        .filter(|r| matches!(r.status, Status::Valid | Status::PendingConfirmation))
    {
        latest.retain(|x| x.key != r.key || x.status != r.status);
        latest.push(r);
    }
    let mut fields = Vec::new();
    for inc in latest {
        let cur = state::current(conn, session, MAIN, &inc.key)?;
        let draft = Draft {
            kind: inc.kind,
            value: inc.value.clone(),
            key: Some(inc.key.clone()),
            scope: Some(inc.scope.clone()),
            detail: inc.detail.clone(),
        };
        let version = cur.as_ref().map_or(1, |c| c.version + 1);
        if inc.status == Status::PendingConfirmation {
            let r = state::insert(
                conn,
                session,
                MAIN,
                &inc.key,
                &draft,
                &inc.sources,
                inc.writer,
                inc.time_ms,
                version,
                Status::PendingConfirmation,
            )?;
            fields.push(FieldMerge {
                key: inc.key.clone(),
                branch_record: inc.id,
                applied: Some(r.id),
                rule: "candidate carried over, still pending confirmation".into(),
            });
            continue;
        }
        let (apply, rule) = match &cur {
            None => (true, "new field".to_string()),
            Some(c) if c.value == inc.value && c.kind == inc.kind => {
                (false, "same value already in force".to_string())
            }
            Some(c) if c.stamp <= base => (true, "main unchanged since the fork".to_string()),
            Some(c) => {
                let (a, b) = (rank(inc), rank(c));
                if a > b {
                    (
                        true,
                        format!(
                            "conflict: branch wins ({} event {} over {} event {})",
                            a.0.as_str(),
                            a.1,
                            b.0.as_str(),
                            b.1
                        ),
                    )
                } else {
                    (
                        false,
                        format!(
                            "conflict: main keeps record {} ({} event {} over {} event {})",
                            c.id,
                            b.0.as_str(),
                            b.1,
                            a.0.as_str(),
                            a.1
                        ),
                    )
                }
            }
        };
        let applied = if apply {
            let r = state::insert(
                conn,
                session,
                MAIN,
                &inc.key,
                &draft,
                &inc.sources,
                inc.writer,
                inc.time_ms,
                version,
                Status::Valid,
            )?;
            if let Some(c) = &cur {
                state::set_status(conn, c.id, Status::Replaced)?;
            }
            Some(r.id)
        } else {
            if cur.as_ref().is_some_and(|c| c.value != inc.value) {
                let mut d = draft.clone();
                d.detail.note = Some(rule.clone());
                state::insert(
                    conn,
                    session,
                    MAIN,
                    &inc.key,
                    &d,
                    &inc.sources,
                    inc.writer,
                    inc.time_ms,
                    version,
                    Status::Rejected,
                )?;
            }
            None
        };
        fields.push(FieldMerge {
            key: inc.key.clone(),
            branch_record: inc.id,
            applied,
            rule,
        });
    }
    set_status(conn, session, name, BranchStatus::Merged)?;
    Ok(MergeReport {
        branch: name.into(),
        base_moved,
        status: BranchStatus::Merged,
        fields,
    })
}
