//! A [`Session`]: one session of a workspace seen from a branch. It appends events (and
//! extracts and writes their candidate records), reads the log, the index and state, writes
//! and confirms records, assembles a context for a task, reports the triggers that fire, and
//! forks and merges branches. Compaction is in `compact`, deletion in `delete`.

use super::Workspace;
use crate::assemble::{assemble, Assembled, Inputs};
use crate::branch::{self, MergeReport, OnStale};
use crate::budget::{plan, BudgetSpec};
use crate::event::{self, Appended, Event, NewEvent};
use crate::evidence;
use crate::extract::candidates;
use crate::guard;
use crate::models::CandidateJudge;
use crate::redact::Redaction;
use crate::route::Writer;
use crate::state::{self, Draft, Record, Status, WriteOutcome, MAIN};
use crate::triggers::{self, Trigger};
use crate::{Error, Result};
use serde::Serialize;
use speccompact_history::History;

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

/// One session of a workspace, seen from a branch (`main` unless forked).
#[derive(Debug)]
pub struct Session<'w> {
    pub(super) ws: &'w Workspace,
    pub(super) id: String,
    pub(super) branch: String,
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
