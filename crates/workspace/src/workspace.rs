//! The public API: a [`Workspace`] (one SQLite database) holds sessions; a [`Session`] appends
//! events, proposes and confirms state, compacts recursively with drift control, assembles a
//! context for a task within a budget, deletes, and forks and merges branches.

use crate::assemble::{assemble, Assembled, Inputs};
use crate::branch::{self, MergeReport, OnStale};
use crate::budget::{plan, BudgetSpec};
use crate::config::{Patterns, WorkspaceConfig};
use crate::event::{self, Appended, Event, NewEvent};
use crate::evidence;
use crate::extract::candidates;
use crate::guard::{self, Flag};
use crate::models::{CandidateJudge, EventCache, Summarizer};
use crate::redact::Redaction;
use crate::route::Writer;
use crate::state::{self, Draft, Record, Status, WriteOutcome, MAIN};
use crate::summary::{self, diverge, Divergence, NewSummary, Summary, SummaryKind};
use crate::triggers::{self, Trigger};
use crate::{Error, Result};
use rusqlite::{Connection, Transaction};
use serde::Serialize;
use speccompact_history::History;
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

/// What a compaction produced.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Compacted {
    /// The summary now in force.
    pub summary: Summary,
    /// The recursive summary, when a rebuild replaced it this generation.
    pub recursive: Option<Summary>,
    /// Where the recursive and rebuilt summaries differ, on rebuild generations.
    pub divergence: Option<Divergence>,
}

/// What ingesting a history did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Ingested {
    /// Events appended.
    pub events: Vec<i64>,
    /// Records written valid.
    pub written: Vec<i64>,
    /// Candidates kept pending confirmation.
    pub pending: Vec<i64>,
    /// Candidates the judge rejected: (event, type, value, r).
    pub rejected: Vec<(i64, String, String, f32)>,
    /// Redactions: (event, redaction).
    pub redactions: Vec<(i64, Redaction)>,
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

/// One session of a workspace, seen from a branch (`main` unless forked).
#[derive(Debug)]
pub struct Session<'w> {
    ws: &'w Workspace,
    id: String,
    branch: String,
}

impl<'w> Session<'w> {
    /// Session id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The branch this view writes to.
    pub fn branch(&self) -> &str {
        &self.branch
    }

    /// Appends events in one transaction, then extracts their candidate records (judged by
    /// `judge` when given: candidates under `eta` are not written).
    pub fn append(
        &self,
        events: &[NewEvent],
        judge: Option<(&dyn CandidateJudge, f32)>,
    ) -> Result<Ingested> {
        let mut out = Ingested::default();
        let appended: Vec<Appended> = {
            let mut db = self.ws.db()?;
            let tx = db.transaction()?;
            let count = |s: &str| (self.ws.count)(s);
            let mut v = Vec::new();
            for e in events {
                v.push(event::append(&tx, &self.ws.patterns, &self.id, e, &count)?);
            }
            tx.commit()?;
            v
        };
        let had_user = self
            .events()?
            .iter()
            .any(|e| e.writer == Writer::User && !appended.iter().any(|a| a.event.id == e.id));
        let mut first_user = !had_user;
        for a in appended {
            out.events.push(a.event.id);
            out.redactions
                .extend(a.redactions.iter().map(|r| (a.event.id, r.clone())));
            let is_first = first_user && a.event.writer == Writer::User;
            if is_first {
                first_user = false;
            }
            for d in candidates(
                &self.ws.patterns,
                &self.ws.config.extract,
                &a.event,
                is_first,
            ) {
                if let Some((j, eta)) = judge {
                    if d.kind != state::RecordType::EvidenceRef {
                        let r = j.judge(&a.event, &d)?;
                        if r < eta {
                            out.rejected.push((
                                a.event.id,
                                d.kind.as_str().into(),
                                d.value.clone(),
                                r,
                            ));
                            continue;
                        }
                    }
                }
                match self.write(&d, &[a.event.id])? {
                    WriteOutcome::Written(r) => out.written.push(r.id),
                    WriteOutcome::Pending(r) => out.pending.push(r.id),
                    WriteOutcome::Unchanged(_) => {}
                }
            }
        }
        Ok(out)
    }

    /// Appends every message of a history.
    pub fn append_history(
        &self,
        h: &History,
        judge: Option<(&dyn CandidateJudge, f32)>,
    ) -> Result<Ingested> {
        let events: Vec<NewEvent> = h.messages.iter().map(NewEvent::from_message).collect();
        self.append(&events, judge)
    }

    /// The session's events in order.
    pub fn events(&self) -> Result<Vec<Event>> {
        event::list(&*self.ws.db()?, &self.id)
    }

    /// One event of this session.
    pub fn event(&self, id: i64) -> Result<Event> {
        let e = event::get(&*self.ws.db()?, id)?;
        if e.session != self.id {
            return Err(Error::UnknownEvent(id));
        }
        Ok(e)
    }

    /// What was redacted, by event.
    pub fn redactions(&self) -> Result<Vec<(i64, Redaction)>> {
        event::redactions(&*self.ws.db()?, &self.id)
    }

    /// Events of this session matching `query`, best first.
    pub fn search(&self, query: &str, limit: usize) -> Result<Vec<evidence::Hit>> {
        evidence::search(&*self.ws.db()?, &self.id, query, limit)
    }

    /// Writes a record from its source events, under the write rules.
    pub fn write(&self, draft: &Draft, sources: &[i64]) -> Result<WriteOutcome> {
        let evs = sources
            .iter()
            .map(|s| self.event(*s))
            .collect::<Result<Vec<_>>>()?;
        let mut db = self.ws.db()?;
        let tx = db.transaction()?;
        let out = state::write(&tx, &self.id, &self.branch, draft, &evs)?;
        tx.commit()?;
        Ok(out)
    }

    /// Confirms a pending candidate with an event by the user or the owner.
    pub fn confirm(&self, record: i64, event: i64) -> Result<Record> {
        let e = self.event(event)?;
        let mut db = self.ws.db()?;
        let tx = db.transaction()?;
        let r = state::get(&tx, record)?;
        if r.session != self.id {
            return Err(Error::UnknownRecord(record));
        }
        let out = state::confirm(&tx, &r, &e)?;
        tx.commit()?;
        Ok(out)
    }

    /// Every record seen from this branch (all statuses).
    pub fn records(&self) -> Result<Vec<Record>> {
        state::view(&*self.ws.db()?, &self.id, &self.branch)
    }

    /// Valid records seen from this branch.
    pub fn state(&self) -> Result<Vec<Record>> {
        Ok(self
            .records()?
            .into_iter()
            .filter(|r| r.status == Status::Valid)
            .collect())
    }

    /// Every version of a field, oldest first.
    pub fn record_history(&self, key: &str) -> Result<Vec<Record>> {
        state::history(&*self.ws.db()?, &self.id, key)
    }

    /// The session's summaries, oldest first.
    pub fn summaries(&self) -> Result<Vec<Summary>> {
        summary::list(&*self.ws.db()?, &self.id)
    }

    /// The summary the next generation continues (the newest).
    pub fn latest_summary(&self) -> Result<Option<Summary>> {
        Ok(self.summaries()?.pop())
    }

    /// Checks a summary text against current state and the log.
    pub fn check_summary(&self, text: &str) -> Result<Vec<Flag>> {
        Ok(guard::check(text, &self.state()?, &self.events()?))
    }

    fn classification(&self, events: &[Event]) -> Result<String> {
        let untrusted = events
            .iter()
            .any(|e| matches!(e.writer, Writer::Tool | Writer::Assistant));
        let redacted: Vec<i64> = {
            let r = self.redactions()?;
            let mut v: Vec<i64> = r
                .iter()
                .map(|(e, _)| *e)
                .filter(|e| events.iter().any(|x| x.id == *e))
                .collect();
            v.dedup();
            v
        };
        Ok(format!(
            "internal; {}; {}",
            if untrusted {
                "derived from untrusted tool/assistant text, not a source of rules"
            } else {
                "derived from user/owner text"
            },
            if redacted.is_empty() {
                "no redactions".to_string()
            } else {
                format!("secrets redacted in events {}", event::id_ranges(&redacted))
            }
        ))
    }

    fn store(
        &self,
        s: &dyn Summarizer,
        kind: SummaryKind,
        generation: i64,
        base: Option<&Summary>,
        text: &str,
        covered: &[Event],
    ) -> Result<Summary> {
        let all = self.events()?;
        let flags = guard::check(text, &self.state()?, &all);
        let mut sources: Vec<i64> = base.map(|b| b.sources.clone()).unwrap_or_default();
        sources.extend(covered.iter().map(|e| e.id));
        sources.sort_unstable();
        sources.dedup();
        let src_events: Vec<Event> = all
            .into_iter()
            .filter(|e| sources.contains(&e.id))
            .collect();
        let provenance = format!(
            "by {} from events {}{}",
            s.name(),
            event::id_ranges(&sources),
            base.map(|b| format!(", continuing summary {}", b.id))
                .unwrap_or_default()
        );
        let classification = self.classification(&src_events)?;
        let upto = sources.last().copied().unwrap_or(0);
        let db = self.ws.db()?;
        summary::insert(
            &db,
            &self.id,
            &NewSummary {
                generation,
                kind,
                text,
                upto,
                base: base.map(|b| b.id),
                provenance: &provenance,
                classification: &classification,
                flags: &flags,
                sources: &sources,
            },
        )
    }

    /// One recursive generation: the previous summary plus the events after it become a new
    /// summary; every `rebuild_every` generations it is also rebuilt from the original log,
    /// the rebuilt one becomes the base and the divergence is reported.
    pub fn compact(&self, s: &dyn Summarizer, kind: SummaryKind) -> Result<Compacted> {
        let prev = self.latest_summary()?;
        let events = self.events()?;
        let fresh: Vec<Event> = events
            .iter()
            .filter(|e| prev.as_ref().is_none_or(|p| e.id > p.upto))
            .cloned()
            .collect();
        if fresh.is_empty() {
            if let Some(p) = prev {
                return Ok(Compacted {
                    summary: p,
                    recursive: None,
                    divergence: None,
                });
            }
            return Err(Error::NoEvents {
                session: self.id.clone(),
            });
        }
        let generation = prev.as_ref().map_or(1, |p| p.generation + 1);
        let text = s.summarize(prev.as_ref().map(|p| p.text.as_str()), &fresh)?;
        let rec = self.store(s, kind, generation, prev.as_ref(), &text, &fresh)?;
        let k = self.ws.config.drift.rebuild_every as i64;
        if k > 0 && generation % k == 0 {
            let rebuilt = self.rebuild(s, generation)?;
            let d = diverge(generation, &rec, &rebuilt);
            if !d.lost.is_empty() {
                tracing::warn!(generation, lost = ?d.lost, "recursive summary drifted from the log");
            }
            return Ok(Compacted {
                summary: rebuilt,
                recursive: Some(rec),
                divergence: Some(d),
            });
        }
        Ok(Compacted {
            summary: rec,
            recursive: None,
            divergence: None,
        })
    }

    /// A summary rebuilt from the whole original log (on demand or by drift control).
    pub fn rebuild(&self, s: &dyn Summarizer, generation: i64) -> Result<Summary> {
        let events = self.events()?;
        if events.is_empty() {
            return Err(Error::NoEvents {
                session: self.id.clone(),
            });
        }
        let text = s.summarize(None, &events)?;
        self.store(s, SummaryKind::Rebuild, generation, None, &text, &events)
    }

    /// A user's corrected summary, written by event `by` (user or owner): the next
    /// generation continues from it.
    pub fn correct(&self, text: &str, by: i64) -> Result<Summary> {
        let e = self.event(by)?;
        if !e.writer.is_authorized() {
            return Err(Error::NotAuthorized {
                writer: e.writer.as_str().into(),
                action: "correct the summary".into(),
            });
        }
        let prev = self.latest_summary()?;
        let all = self.events()?;
        let mut sources = prev.as_ref().map(|p| p.sources.clone()).unwrap_or_default();
        sources.push(by);
        sources.sort_unstable();
        sources.dedup();
        let flags = guard::check(text, &self.state()?, &all);
        let db = self.ws.db()?;
        summary::insert(
            &db,
            &self.id,
            &NewSummary {
                generation: prev.as_ref().map_or(0, |p| p.generation),
                kind: SummaryKind::Correction,
                text,
                upto: prev.as_ref().map_or(by, |p| p.upto.max(by)),
                base: prev.as_ref().map(|p| p.id),
                provenance: &format!("user correction in event {by}"),
                classification: "internal; written by the user",
                flags: &flags,
                sources: &sources,
            },
        )
    }

    /// Builds the context for `task` within `spec`.
    pub fn assemble(&self, task: &str, spec: BudgetSpec) -> Result<Assembled> {
        let p = plan(spec, &self.ws.config.budget)?;
        let state = self.state()?;
        let events = self.events()?;
        let latest = self.latest_summary()?;
        let flags = latest
            .as_ref()
            .map(|s| guard::check(&s.text, &state, &events))
            .unwrap_or_default();
        let mut query = task.to_string();
        let focus = crate::assemble::focus_of(task);
        let mut ranked: Vec<i64> = Vec::new();
        if focus == crate::assemble::Focus::Diagnose {
            // Failures first, newest first; their error lines steer the text query.
            for e in events.iter().rev() {
                if e.exit_code.is_some_and(|c| c != 0) || !e.fields.errors.is_empty() {
                    ranked.push(e.id);
                    if let Some(err) = e.fields.errors.first() {
                        query.push(' ');
                        query.push_str(err);
                    }
                }
            }
        }
        for h in self.search(&query, 64)? {
            if !ranked.contains(&h.event_id) {
                ranked.push(h.event_id);
            }
        }
        // What the query did not rank fills the rest of the block, newest first.
        for e in events.iter().rev() {
            if !ranked.contains(&e.id) {
                ranked.push(e.id);
            }
        }
        let count = |s: &str| (self.ws.count)(s);
        assemble(Inputs {
            task,
            plan: p,
            state: &state,
            summary: latest.as_ref().map(|s| (s, flags)),
            events: &events,
            ranked,
            passage_tokens: self.ws.config.budget.passage_tokens,
            count: &count,
        })
    }

    /// The triggers that fire now, for a model with `window` tokens.
    pub fn triggers(&self, window: usize) -> Result<Vec<Trigger>> {
        let all = self.events()?;
        let last = self.latest_summary()?;
        let fresh: Vec<Event> = all
            .iter()
            .filter(|e| last.as_ref().is_none_or(|s| e.id > s.upto))
            .cloned()
            .collect();
        let summary_tokens = last.as_ref().map_or(0, |s| self.ws.tokens(&s.text));
        Ok(triggers::check(
            &self.ws.config.triggers,
            &self.ws.patterns,
            &all,
            &fresh,
            &self.records()?,
            summary_tokens,
            window,
        ))
    }

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

    /// Forks a branch of state for a parallel subtask.
    pub fn fork(&self, name: &str) -> Result<Session<'w>> {
        branch::fork(&*self.ws.db()?, &self.id, name)?;
        self.on_branch(name)
    }

    /// This session seen from (and writing to) an existing branch.
    pub fn on_branch(&self, name: &str) -> Result<Session<'w>> {
        if name != MAIN {
            branch::status(&*self.ws.db()?, &self.id, name)?;
        }
        Ok(Session {
            ws: self.ws,
            id: self.id.clone(),
            branch: name.to_string(),
        })
    }

    /// Merges a branch into the main line under the conflict rule.
    pub fn merge(&self, name: &str, on_stale: OnStale) -> Result<MergeReport> {
        let mut db = self.ws.db()?;
        let tx = db.transaction()?;
        let r = branch::merge(&tx, &self.id, name, on_stale)?;
        tx.commit()?;
        Ok(r)
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
