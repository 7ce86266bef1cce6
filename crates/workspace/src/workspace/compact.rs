//! The summarizer-facing part of a [`Session`]: one recursive compaction generation with
//! drift control (a rebuild from the original log every `drift.rebuild_every` generations,
//! and the divergence between the two), rebuilds on demand, a user's corrected summary, and
//! how each summary is stored with its sources, provenance, classification and guard flags.

use super::Session;
use crate::event::{self, Event};
use crate::guard::{self, Flag};
use crate::models::Summarizer;
use crate::route::Writer;
use crate::summary::{self, diverge, Divergence, NewSummary, Summary, SummaryKind};
use crate::{Error, Result};
use serde::Serialize;

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

impl Session<'_> {
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
}
