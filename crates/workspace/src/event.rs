//! The event log: append-only messages and tool events with stable ids, role, writer, time,
//! class, tool name, exit code and extracted fields. Text is redacted before it is stored;
//! the log (and its evidence index row, written in the same transaction) is the only factual
//! anchor everything else cites.

use crate::config::Patterns;
use crate::event_class::EventClass;
use crate::redact::{redact, Redaction};
use crate::route::{classify, exit_code_of, extract_fields, writer_of, Fields, Writer};
use crate::{Error, Result};
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::Serialize;
use speccompact_history::{Arguments, Message, Role};

/// An event to append.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// Role.
    pub role: Role,
    /// Text.
    pub content: String,
    /// Tool name (a call or a result).
    pub tool: Option<String>,
    /// Exit code, when the caller knows it (else read from the text).
    pub exit_code: Option<i32>,
    /// Time (ms since the epoch); now when absent.
    pub time_ms: Option<i64>,
}

impl NewEvent {
    /// A message with `role` and `content`.
    pub fn new(role: Role, content: &str) -> Self {
        Self {
            role,
            content: content.to_string(),
            tool: None,
            exit_code: None,
            time_ms: None,
        }
    }
    /// A user message.
    pub fn user(content: &str) -> Self {
        Self::new(Role::User, content)
    }
    /// An assistant message.
    pub fn assistant(content: &str) -> Self {
        Self::new(Role::Assistant, content)
    }
    /// A tool result with its exit code.
    pub fn tool(name: &str, content: &str, exit_code: Option<i32>) -> Self {
        Self {
            tool: Some(name.to_string()),
            exit_code,
            ..Self::new(Role::Tool, content)
        }
    }
    /// A history message: tool calls become `name(arguments)` lines after the text.
    pub fn from_message(m: &Message) -> Self {
        let mut content = m.content.clone();
        for c in &m.tool_calls {
            let args = match &c.arguments {
                Arguments::Json(v) => v.to_string(),
                Arguments::Raw(s) => s.clone(),
            };
            if !content.is_empty() {
                content.push('\n');
            }
            content.push_str(&format!("{}({args})", c.name));
        }
        Self {
            role: m.role,
            content,
            tool: m
                .name
                .clone()
                .or_else(|| m.tool_calls.first().map(|c| c.name.clone())),
            exit_code: None,
            time_ms: None,
        }
    }
}

/// A stored event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// Stable id (never reused).
    pub id: i64,
    /// Session.
    pub session: String,
    /// Position in the session, from 0.
    pub seq: i64,
    /// Role.
    pub role: Role,
    /// Writer, for state rules.
    pub writer: Writer,
    /// Time (ms since the epoch).
    pub time_ms: i64,
    /// Class.
    pub class: EventClass,
    /// Tool name.
    pub tool: Option<String>,
    /// Exit code.
    pub exit_code: Option<i32>,
    /// Text (redacted).
    pub content: String,
    /// High-risk fields.
    pub fields: Fields,
    /// Tokens of `content`.
    pub tokens: usize,
}

impl Event {
    /// The event's header in a context: `[event 12 · tool pytest · exit 1]`.
    pub fn header(&self) -> String {
        let mut h = format!("[event {} · {}", self.id, self.writer.as_str());
        if let Some(t) = &self.tool {
            h.push_str(&format!(" {t}"));
        }
        if let Some(c) = self.exit_code {
            h.push_str(&format!(" · exit {c}"));
        }
        h.push(']');
        h
    }
}

/// What appending did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Appended {
    /// The stored event.
    pub event: Event,
    /// What was redacted (offsets in the text as given).
    pub redactions: Vec<Redaction>,
}

const COLUMNS: &str =
    "id, session, seq, role, writer, time_ms, class, tool, exit_code, content, fields, tokens";

fn role_of(s: &str) -> Option<Role> {
    [Role::System, Role::User, Role::Assistant, Role::Tool]
        .into_iter()
        .find(|r| r.as_str() == s)
}

fn from_row(r: &Row<'_>) -> rusqlite::Result<Event> {
    let bad = |i: usize, what: &str| {
        rusqlite::Error::FromSqlConversionFailure(
            i,
            rusqlite::types::Type::Text,
            format!("unknown {what}").into(),
        )
    };
    let role: String = r.get(3)?;
    let writer: String = r.get(4)?;
    let class: String = r.get(6)?;
    let fields: String = r.get(10)?;
    Ok(Event {
        id: r.get(0)?,
        session: r.get(1)?,
        seq: r.get(2)?,
        role: role_of(&role).ok_or_else(|| bad(3, "role"))?,
        writer: Writer::parse(&writer).ok_or_else(|| bad(4, "writer"))?,
        time_ms: r.get(5)?,
        class: EventClass::parse(&class).ok_or_else(|| bad(6, "class"))?,
        tool: r.get(7)?,
        exit_code: r.get(8)?,
        content: r.get(9)?,
        fields: serde_json::from_str(&fields).map_err(|_| bad(10, "fields"))?,
        tokens: r.get::<_, i64>(11)? as usize,
    })
}

/// Appends an event (redacted, classified, indexed) inside the caller's transaction.
pub(crate) fn append(
    conn: &Connection,
    p: &Patterns,
    session: &str,
    e: &NewEvent,
    count: &dyn Fn(&str) -> usize,
) -> Result<Appended> {
    let (content, redactions) = redact(p, &e.content);
    let writer = writer_of(p, e.role, &content);
    let fields = extract_fields(&content);
    let exit_code = exit_code_of(e.exit_code, &fields);
    let class = classify(p, e.role, writer, e.tool.as_deref(), &content, exit_code);
    let seq: i64 = conn.query_row(
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE session = ?1",
        [session],
        |r| r.get(0),
    )?;
    let time_ms = e.time_ms.unwrap_or_else(crate::db::now_ms);
    let tokens = count(&content);
    conn.execute(
        "INSERT INTO events (session, seq, role, writer, time_ms, class, tool, exit_code, content, fields, tokens)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            session,
            seq,
            e.role.as_str(),
            writer.as_str(),
            time_ms,
            class.as_str(),
            e.tool,
            exit_code,
            content,
            serde_json::to_string(&fields)?,
            tokens as i64,
        ],
    )?;
    let id = conn.last_insert_rowid();
    conn.execute(
        "INSERT INTO evidence (content, event_id, session) VALUES (?1, ?2, ?3)",
        params![content, id, session],
    )?;
    for r in &redactions {
        conn.execute(
            "INSERT INTO redactions (event_id, kind, start, end) VALUES (?1, ?2, ?3, ?4)",
            params![id, r.kind, r.start as i64, r.end as i64],
        )?;
    }
    Ok(Appended {
        event: get(conn, id)?,
        redactions,
    })
}

/// One event by id.
pub fn get(conn: &Connection, id: i64) -> Result<Event> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM events WHERE id = ?1"),
        [id],
        from_row,
    )
    .optional()?
    .ok_or(Error::UnknownEvent(id))
}

/// A session's events in order.
pub fn list(conn: &Connection, session: &str) -> Result<Vec<Event>> {
    let mut st = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM events WHERE session = ?1 ORDER BY seq"
    ))?;
    let rows = st.query_map([session], from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Redactions recorded for a session: (event id, redaction).
pub fn redactions(conn: &Connection, session: &str) -> Result<Vec<(i64, Redaction)>> {
    let mut st = conn.prepare(
        "SELECT r.event_id, r.kind, r.start, r.end FROM redactions r JOIN events e ON e.id = r.event_id
         WHERE e.session = ?1 ORDER BY r.event_id, r.start",
    )?;
    let rows = st.query_map([session], |r| {
        Ok((
            r.get(0)?,
            Redaction {
                kind: r.get(1)?,
                start: r.get::<_, i64>(2)? as usize,
                end: r.get::<_, i64>(3)? as usize,
            },
        ))
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Renders events as a context block: each event's header, then its text.
pub fn render(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| format!("{}\n{}", e.header(), e.content))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// Compresses sorted ids into ranges: `1-3, 7, 9-10`.
pub fn id_ranges(ids: &[i64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ids[i].to_string()
        } else {
            format!("{}-{}", ids[i], ids[j])
        });
        i = j + 1;
    }
    out.join(", ")
}
