//! Deletion: one event of a session, or a whole session, from the log, the evidence index,
//! the summaries derived from it (dropped, and rebuilt when asked) and the registered caches,
//! with the records that cite it marked. The database part is one transaction; caches are
//! evicted only after it commits, and a cache that cannot evict fails the deletion.

use super::{Session, Workspace, CACHES};
use crate::event;
use crate::models::Summarizer;
use crate::state;
use crate::summary;
use crate::{Error, Result};
use rusqlite::Transaction;
use serde::Serialize;

/// What a deletion reached.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DeletionReport {
    /// Events removed from the log and the index.
    pub events: Vec<i64>,
    /// Summaries derived from them, dropped.
    pub summaries_dropped: Vec<i64>,
    /// The summary rebuilt from the remaining log, when a summarizer was given.
    pub summary_rebuilt: Option<i64>,
    /// State records that cited them (marked `source_deleted`).
    pub records_marked: Vec<i64>,
    /// Cache entries evicted (prefilled prefixes holding their text).
    pub cache_entries: usize,
}

impl Workspace {
    /// Evicts `ids` from every registered cache (after the deletion is committed). Every cache
    /// is tried; the first failure is returned, so a deletion never reports success while a
    /// cache may still hold the deleted text.
    fn evict(&self, ids: &[i64]) -> Result<usize> {
        let caches = self.caches.lock().map_err(|_| Error::Poisoned(CACHES))?;
        let mut evicted = 0;
        let mut first_err = None;
        for c in caches.iter() {
            match c.evict(ids) {
                Ok(n) => evicted += n,
                Err(e) => {
                    tracing::error!(error = %e, "a model cache could not evict deleted events");
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(evicted), Err)
    }

    /// Deletes a whole session: every event (log, index, caches), every summary, every record.
    /// The database part is one transaction (a failure leaves the session whole); the caches
    /// are cleared after it commits ([`Error::Poisoned`] or the cache's error when one cannot
    /// be: the database deletion then stands, the cache may still hold the text).
    pub fn delete_session(&self, id: &str) -> Result<DeletionReport> {
        self.existing(id)?;
        let mut report = {
            let mut db = self.db()?;
            let tx = db.transaction()?;
            let ids: Vec<i64> = event::list(&tx, id)?.iter().map(|e| e.id).collect();
            let mut report = delete_events_in(&tx, id, &ids)?;
            let recs: Vec<i64> = {
                let mut st = tx.prepare("SELECT id FROM records WHERE session = ?1")?;
                let rows = st.query_map([id], |r| r.get(0))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            report.records_marked = recs;
            tx.execute("DELETE FROM records WHERE session = ?1", [id])?;
            tx.execute("DELETE FROM branches WHERE session = ?1", [id])?;
            let left_ids: Vec<i64> = summary::list(&tx, id)?.iter().map(|s| s.id).collect();
            for sid in &left_ids {
                tx.execute("DELETE FROM summary_sources WHERE summary_id = ?1", [sid])?;
                tx.execute("DELETE FROM summaries WHERE id = ?1", [sid])?;
            }
            report.summaries_dropped.extend(left_ids);
            tx.execute("DELETE FROM sessions WHERE id = ?1", [id])?;
            tx.commit()?;
            report
        };
        report.cache_entries = self.evict(&report.events)?;
        Ok(report)
    }
}

impl Session<'_> {
    /// Deletes one event: from the log, the index, the caches and every summary derived from
    /// it (dropped; rebuilt from the remaining log when `rebuild` is given); records citing
    /// it are marked. The caches are cleared after the database deletion commits; when one
    /// cannot be ([`Error::Poisoned`], or the cache's own error) the deletion fails, though
    /// the database part stands.
    pub fn delete_event(
        &self,
        id: i64,
        rebuild: Option<&dyn Summarizer>,
    ) -> Result<DeletionReport> {
        self.event(id)?;
        self.delete_events(&[id], rebuild)
    }

    fn delete_events(
        &self,
        ids: &[i64],
        rebuild: Option<&dyn Summarizer>,
    ) -> Result<DeletionReport> {
        let mut report = {
            let mut db = self.ws.db()?;
            let tx = db.transaction()?;
            let report = delete_events_in(&tx, &self.id, ids)?;
            tx.commit()?;
            report
        };
        report.cache_entries = self.ws.evict(ids)?;
        if let Some(s) = rebuild {
            if !report.summaries_dropped.is_empty() && !self.events()?.is_empty() {
                report.summary_rebuilt = Some(self.rebuild(s, 1)?.id);
            }
        }
        Ok(report)
    }
}

/// The database part of deleting `ids` of `session`, inside `tx`: summaries derived from them
/// dropped, records citing them marked, then the events, their index entries and redactions
/// removed and the deletions logged. The caller commits, then clears the caches.
fn delete_events_in(tx: &Transaction<'_>, session: &str, ids: &[i64]) -> Result<DeletionReport> {
    let mut report = DeletionReport {
        events: ids.to_vec(),
        ..DeletionReport::default()
    };
    report.summaries_dropped = summary::delete_derived_from(tx, ids)?;
    for r in state::on_branch_all(tx, session)? {
        if r.sources.iter().any(|s| ids.contains(s)) {
            tx.execute(
                "UPDATE records SET source_deleted = 1 WHERE id = ?1",
                [r.id],
            )?;
            report.records_marked.push(r.id);
        }
    }
    for id in ids {
        tx.execute("DELETE FROM evidence WHERE event_id = ?1", [id])?;
        tx.execute("DELETE FROM redactions WHERE event_id = ?1", [id])?;
        tx.execute("DELETE FROM events WHERE id = ?1", [id])?;
        tx.execute(
            "INSERT INTO deletions (event_id, session, time_ms) VALUES (?1, ?2, ?3)",
            rusqlite::params![id, session, crate::db::now_ms()],
        )?;
    }
    Ok(report)
}
