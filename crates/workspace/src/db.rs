//! The workspace database: one SQLite file per workspace, schema versioned by
//! `PRAGMA user_version` and brought up to date by ordered migrations, each in a transaction.

use crate::{Error, Result};
use rusqlite::Connection;
use std::path::Path;

/// Migrations in order; migration `i` brings the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: event log, evidence index, state records, summaries, caches, branches, deletions.
    r#"
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        created_ms INTEGER NOT NULL
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session TEXT NOT NULL REFERENCES sessions(id),
        seq INTEGER NOT NULL,
        role TEXT NOT NULL,
        writer TEXT NOT NULL,
        time_ms INTEGER NOT NULL,
        class TEXT NOT NULL,
        tool TEXT,
        exit_code INTEGER,
        content TEXT NOT NULL,
        fields TEXT NOT NULL,
        tokens INTEGER NOT NULL,
        UNIQUE (session, seq)
    );
    CREATE VIRTUAL TABLE evidence USING fts5(content, event_id UNINDEXED, session UNINDEXED);
    CREATE TABLE redactions (
        event_id INTEGER NOT NULL,
        kind TEXT NOT NULL,
        start INTEGER NOT NULL,
        end INTEGER NOT NULL
    );
    CREATE TABLE records (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session TEXT NOT NULL REFERENCES sessions(id),
        branch TEXT NOT NULL,
        key TEXT NOT NULL,
        type TEXT NOT NULL,
        value TEXT NOT NULL,
        sources TEXT NOT NULL,
        writer TEXT NOT NULL,
        time_ms INTEGER NOT NULL,
        scope TEXT NOT NULL,
        version INTEGER NOT NULL,
        status TEXT NOT NULL,
        detail TEXT NOT NULL,
        source_deleted INTEGER NOT NULL DEFAULT 0,
        stamp INTEGER NOT NULL
    );
    CREATE INDEX records_key ON records (session, branch, key);
    CREATE TABLE summaries (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session TEXT NOT NULL REFERENCES sessions(id),
        generation INTEGER NOT NULL,
        kind TEXT NOT NULL,
        text TEXT NOT NULL,
        upto INTEGER NOT NULL,
        base INTEGER,
        provenance TEXT NOT NULL,
        classification TEXT NOT NULL,
        flags TEXT NOT NULL,
        time_ms INTEGER NOT NULL
    );
    CREATE TABLE summary_sources (
        summary_id INTEGER NOT NULL,
        event_id INTEGER NOT NULL
    );
    CREATE INDEX summary_sources_event ON summary_sources (event_id);
    CREATE TABLE branches (
        session TEXT NOT NULL,
        name TEXT NOT NULL,
        base_stamp INTEGER NOT NULL,
        status TEXT NOT NULL,
        PRIMARY KEY (session, name)
    );
    CREATE TABLE deletions (
        event_id INTEGER NOT NULL,
        session TEXT NOT NULL,
        time_ms INTEGER NOT NULL
    );
    "#,
];

/// Newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Opens (creating if needed) and migrates the database at `path`.
pub fn open(path: &Path) -> Result<Connection> {
    let open_err = |reason: String| Error::Open {
        path: path.display().to_string(),
        reason,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| open_err(format!("cannot create folder: {e}")))?;
    }
    let conn = Connection::open(path).map_err(|e| open_err(e.to_string()))?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(|e| open_err(format!("not a workspace database ({e})")))?;
    migrate(conn).map_err(|e| match e {
        Error::Db(d) => open_err(d.to_string()),
        other => other,
    })
}

/// An in-memory database (tests, one-off runs).
pub fn open_in_memory() -> Result<Connection> {
    migrate(Connection::open_in_memory()?)
}

fn migrate(mut conn: Connection) -> Result<Connection> {
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    let found: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
        tracing::debug!(version = i + 1, "workspace schema migrated");
    }
    Ok(conn)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrates_once_and_refuses_newer_schemas() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ws/workspace.db");
        drop(open(&path).unwrap());
        let c = open(&path).unwrap();
        let v: i64 = c
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        c.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        drop(c);
        let e = open(&path).unwrap_err().to_string();
        assert!(e.contains("newer"), "{e}");
        std::fs::write(
            dir.path().join("junk.db"),
            b"this is not sqlite at all, not at all",
        )
        .unwrap();
        let e = open(&dir.path().join("junk.db")).unwrap_err().to_string();
        assert!(e.contains("junk.db"), "{e}");
    }
}
