//! The public API: a [`Workspace`] (one SQLite database) holds sessions; a [`Session`] appends
//! events, proposes and confirms state, compacts recursively with drift control, assembles a
//! context for a task within a budget, deletes, and forks and merges branches.
//!
//! This file owns the workspace itself: opening it, its settings, token counter and
//! registered caches, the connection lock, and finding or creating sessions. The session's
//! log, state, assembly, triggers and branches are in `session`; the summarizer-facing part
//! (compaction, rebuilds, corrections) in `compact`; deletion of events and sessions, with
//! the cache eviction it requires, in `delete`.

mod compact;
mod delete;
mod session;

pub use compact::Compacted;
pub use delete::DeletionReport;
pub use session::{Ingested, Session};

use crate::config::{Patterns, WorkspaceConfig};
use crate::models::EventCache;
use crate::state::MAIN;
use crate::{Error, Result};
use rusqlite::Connection;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

/// Counts tokens of a text.
pub type TokenCounter = Arc<dyn Fn(&str) -> usize + Send + Sync>;

/// The default counter: characters / 4, rounded up.
pub fn char_estimate() -> TokenCounter {
    Arc::new(|s: &str| s.chars().count().div_ceil(4))
}

// Names of the workspace's locks, as `Error::Poisoned` reports them.
const CONNECTION: &str = "workspace connection";
const CACHES: &str = "workspace model caches";

/// A workspace: one database of sessions.
pub struct Workspace {
    conn: Mutex<Connection>,
    config: WorkspaceConfig,
    patterns: Patterns,
    count: TokenCounter,
    caches: Mutex<Vec<Arc<dyn EventCache>>>,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace").finish_non_exhaustive()
    }
}

impl Workspace {
    /// Opens (creating) the workspace in `dir` (database `dir/workspace.db`).
    pub fn open(dir: &Path, config: WorkspaceConfig) -> Result<Self> {
        Self::with_connection(crate::db::open(&dir.join("workspace.db"))?, config)
    }

    /// An in-memory workspace.
    pub fn in_memory(config: WorkspaceConfig) -> Result<Self> {
        Self::with_connection(crate::db::open_in_memory()?, config)
    }

    fn with_connection(conn: Connection, config: WorkspaceConfig) -> Result<Self> {
        let patterns = config.compile("workspace config")?;
        Ok(Self {
            conn: Mutex::new(conn),
            config,
            patterns,
            count: char_estimate(),
            caches: Mutex::new(Vec::new()),
        })
    }

    /// Uses `count` (e.g. the target model's tokenizer) for every token count.
    pub fn with_token_counter(mut self, count: TokenCounter) -> Self {
        self.count = count;
        self
    }

    /// Registers a cache that deletions must reach; [`Error::Poisoned`] (and not registered)
    /// when the lock of the cache list is poisoned.
    pub fn register_cache(&self, cache: Arc<dyn EventCache>) -> Result<()> {
        self.caches
            .lock()
            .map_err(|_| Error::Poisoned(CACHES))?
            .push(cache);
        Ok(())
    }

    /// The settings.
    pub fn config(&self) -> &WorkspaceConfig {
        &self.config
    }

    /// Tokens of a text by the workspace's counter.
    pub fn tokens(&self, text: &str) -> usize {
        (self.count)(text)
    }

    fn db(&self) -> Result<MutexGuard<'_, Connection>> {
        self.conn.lock().map_err(|_| Error::Poisoned(CONNECTION))
    }

    /// A session, created when new.
    pub fn session(&self, id: &str) -> Result<Session<'_>> {
        if id.trim().is_empty() {
            return Err(Error::UnknownSession(id.into()));
        }
        self.db()?.execute(
            "INSERT OR IGNORE INTO sessions (id, created_ms) VALUES (?1, ?2)",
            rusqlite::params![id, crate::db::now_ms()],
        )?;
        Ok(Session {
            ws: self,
            id: id.to_string(),
            branch: MAIN.to_string(),
        })
    }

    /// An existing session.
    pub fn existing(&self, id: &str) -> Result<Session<'_>> {
        let n: i64 =
            self.db()?
                .query_row("SELECT COUNT(*) FROM sessions WHERE id = ?1", [id], |r| {
                    r.get(0)
                })?;
        if n == 0 {
            return Err(Error::UnknownSession(id.into()));
        }
        self.session(id)
    }

    /// Session ids.
    pub fn sessions(&self) -> Result<Vec<String>> {
        let db = self.db()?;
        let mut st = db.prepare("SELECT id FROM sessions ORDER BY id")?;
        let rows = st.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}
