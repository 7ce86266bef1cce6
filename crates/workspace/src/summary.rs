//! The summary channel: narrative summaries with their generation, kind (recursive, rebuilt
//! from the log, milestone, budget, user correction), the events they were derived from,
//! provenance and classification marks, and the flags the state checks raised. Summaries may
//! be rewritten or dropped; they never write state.

use crate::guard::Flag;
use crate::{Error, Result};
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};
use speccompact_history::facts;

/// Why a summary was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SummaryKind {
    /// Previous summary + new events.
    Recursive,
    /// From the original log (drift control, or after a deletion).
    Rebuild,
    /// A stable snapshot at a milestone.
    Milestone,
    /// A compaction near the window limit.
    Budget,
    /// A user's corrected summary: the start of the next generation.
    Correction,
}

impl SummaryKind {
    /// The kind's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Recursive => "recursive",
            Self::Rebuild => "rebuild",
            Self::Milestone => "milestone",
            Self::Budget => "budget",
            Self::Correction => "correction",
        }
    }
    /// Parses a kind.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Recursive,
            Self::Rebuild,
            Self::Milestone,
            Self::Budget,
            Self::Correction,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// A stored summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Id.
    pub id: i64,
    /// Session.
    pub session: String,
    /// Generation (1 = first compaction).
    pub generation: i64,
    /// Kind.
    pub kind: SummaryKind,
    /// Markdown text.
    pub text: String,
    /// Last event id covered.
    pub upto: i64,
    /// The summary it continued.
    pub base: Option<i64>,
    /// Who wrote it from what.
    pub provenance: String,
    /// Classification marks (trust of its sources, redactions).
    pub classification: String,
    /// Lines that contradict state.
    pub flags: Vec<Flag>,
    /// Events it was derived from.
    pub sources: Vec<i64>,
}

const COLUMNS: &str =
    "id, session, generation, kind, text, upto, base, provenance, classification, flags";

fn from_row(r: &Row<'_>) -> rusqlite::Result<Summary> {
    let kind: String = r.get(3)?;
    let flags: String = r.get(9)?;
    let bad = |i: usize| {
        rusqlite::Error::FromSqlConversionFailure(
            i,
            rusqlite::types::Type::Text,
            "malformed summary row".into(),
        )
    };
    Ok(Summary {
        id: r.get(0)?,
        session: r.get(1)?,
        generation: r.get(2)?,
        kind: SummaryKind::parse(&kind).ok_or_else(|| bad(3))?,
        text: r.get(4)?,
        upto: r.get(5)?,
        base: r.get(6)?,
        provenance: r.get(7)?,
        classification: r.get(8)?,
        flags: serde_json::from_str::<Vec<FlagRow>>(&flags)
            .map_err(|_| bad(9))?
            .into_iter()
            .map(FlagRow::into_flag)
            .collect(),
        sources: Vec::new(),
    })
}

#[derive(Serialize, Deserialize)]
struct FlagRow {
    kind: String,
    line: String,
    record: Option<i64>,
    event: Option<i64>,
}

impl FlagRow {
    fn from_flag(f: &Flag) -> Self {
        Self {
            kind: serde_json::to_value(f.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            line: f.line.clone(),
            record: f.record,
            event: f.event,
        }
    }
    fn into_flag(self) -> Flag {
        use crate::guard::FlagKind::*;
        let kind = match self.kind.as_str() {
            "open_issue_closed" => OpenIssueClosed,
            "failure_misreported" => FailureMisreported,
            _ => ConstraintWeakened,
        };
        Flag {
            kind,
            line: self.line,
            record: self.record,
            event: self.event,
        }
    }
}

fn sources_of(conn: &Connection, id: i64) -> Result<Vec<i64>> {
    let mut st = conn
        .prepare("SELECT event_id FROM summary_sources WHERE summary_id = ?1 ORDER BY event_id")?;
    let rows = st.query_map([id], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// One summary by id.
pub fn get(conn: &Connection, id: i64) -> Result<Summary> {
    let mut s = conn
        .query_row(
            &format!("SELECT {COLUMNS} FROM summaries WHERE id = ?1"),
            [id],
            from_row,
        )
        .optional()?
        .ok_or(Error::UnknownSummary(id))?;
    s.sources = sources_of(conn, id)?;
    Ok(s)
}

/// A session's summaries, oldest first.
pub fn list(conn: &Connection, session: &str) -> Result<Vec<Summary>> {
    let mut st = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM summaries WHERE session = ?1 ORDER BY id"
    ))?;
    let rows: Vec<Summary> = st
        .query_map([session], from_row)?
        .collect::<rusqlite::Result<_>>()?;
    rows.into_iter()
        .map(|mut s| {
            s.sources = sources_of(conn, s.id)?;
            Ok(s)
        })
        .collect()
}

/// What [`insert`] stores.
pub(crate) struct NewSummary<'a> {
    pub generation: i64,
    pub kind: SummaryKind,
    pub text: &'a str,
    pub upto: i64,
    pub base: Option<i64>,
    pub provenance: &'a str,
    pub classification: &'a str,
    pub flags: &'a [Flag],
    pub sources: &'a [i64],
}

/// Stores a summary and its sources.
pub(crate) fn insert(conn: &Connection, session: &str, s: &NewSummary<'_>) -> Result<Summary> {
    let flags: Vec<FlagRow> = s.flags.iter().map(FlagRow::from_flag).collect();
    conn.execute(
        "INSERT INTO summaries (session, generation, kind, text, upto, base, provenance, classification, flags, time_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            session,
            s.generation,
            s.kind.as_str(),
            s.text,
            s.upto,
            s.base,
            s.provenance,
            s.classification,
            serde_json::to_string(&flags)?,
            crate::db::now_ms(),
        ],
    )?;
    let id = conn.last_insert_rowid();
    let mut st =
        conn.prepare("INSERT INTO summary_sources (summary_id, event_id) VALUES (?1, ?2)")?;
    for e in s.sources {
        st.execute(params![id, e])?;
    }
    get(conn, id)
}

/// Deletes the summaries derived from any of `events`; returns their ids.
pub(crate) fn delete_derived_from(conn: &Connection, events: &[i64]) -> Result<Vec<i64>> {
    let mut ids: Vec<i64> = Vec::new();
    {
        let mut st =
            conn.prepare("SELECT DISTINCT summary_id FROM summary_sources WHERE event_id = ?1")?;
        for e in events {
            for id in st.query_map([e], |r| r.get::<_, i64>(0))? {
                let id = id?;
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
    }
    for id in &ids {
        conn.execute("DELETE FROM summary_sources WHERE summary_id = ?1", [id])?;
        conn.execute("DELETE FROM summaries WHERE id = ?1", [id])?;
        // A summary continuing a dropped one lost its base.
        conn.execute("UPDATE summaries SET base = NULL WHERE base = ?1", [id])?;
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Where a recursive summary and one rebuilt from the log differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Divergence {
    /// Generation compared.
    pub generation: i64,
    /// The recursive summary.
    pub recursive: i64,
    /// The rebuilt summary.
    pub rebuilt: i64,
    /// Facts in the rebuilt summary the recursive one lost.
    pub lost: Vec<String>,
    /// Facts only the recursive one has.
    pub only_recursive: Vec<String>,
}

/// Compares the facts of two summaries.
pub fn diverge(generation: i64, recursive: &Summary, rebuilt: &Summary) -> Divergence {
    let owned = |t: &str| -> Vec<String> { facts(t).into_iter().map(str::to_string).collect() };
    let (a, b) = (owned(&recursive.text), owned(&rebuilt.text));
    Divergence {
        generation,
        recursive: recursive.id,
        rebuilt: rebuilt.id,
        lost: b.iter().filter(|x| !a.contains(x)).cloned().collect(),
        only_recursive: a.iter().filter(|x| !b.contains(x)).cloned().collect(),
    }
}
