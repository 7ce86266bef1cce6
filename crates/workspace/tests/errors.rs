//! Failures are typed and loud: a deletion never reports success while a model cache may
//! still hold the deleted text, a session deletion is all or nothing, and each failure has its
//! own error variant.

use speccompact_engine::{CompactionConfig, Compactor, Method, Overflow, Scripted};
use speccompact_history::HistoryError;
use speccompact_workspace::models::EventCache;
use speccompact_workspace::{
    db, summary, EngineSummarizer, Error, Event, NewEvent, Result, Summarizer, SummaryKind,
    Workspace, WorkspaceConfig,
};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One line per event.
struct Lines;

impl Summarizer for Lines {
    fn name(&self) -> String {
        "lines-test".into()
    }
    fn summarize(&self, previous: Option<&str>, events: &[Event]) -> Result<String> {
        let mut text = previous.unwrap_or("## Progress\n").to_string();
        for e in events {
            text.push_str(&format!("- {}\n", e.content.replace('\n', " ")));
        }
        Ok(text)
    }
}

/// Counts evictions; holds everything.
#[derive(Default)]
struct Counting {
    calls: AtomicUsize,
}

impl EventCache for Counting {
    fn evict(&self, events: &[i64]) -> Result<usize> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(events.len())
    }
    fn holds(&self, _event: i64) -> bool {
        true
    }
}

/// A cache with a bug: evicting panics (inside the workspace's cache lock).
struct Panicking;

impl EventCache for Panicking {
    fn evict(&self, _events: &[i64]) -> Result<usize> {
        panic!("cache bug while evicting");
    }
    fn holds(&self, _event: i64) -> bool {
        true
    }
}

/// A cache that cannot evict.
struct Failing;

impl EventCache for Failing {
    fn evict(&self, _events: &[i64]) -> Result<usize> {
        Err(Error::Poisoned("test cache"))
    }
    fn holds(&self, _event: i64) -> bool {
        true
    }
}

fn three_events(ws: &Workspace, session: &str) -> Vec<i64> {
    ws.session(session)
        .unwrap()
        .append(
            &[
                NewEvent::user("Keep the API stable. You must not rename public fields."),
                NewEvent::assistant("Noted: public fields keep their names."),
                NewEvent::user("My badge code is zebracorn77."),
            ],
            None,
        )
        .unwrap()
        .events
}

#[test]
fn a_poisoned_cache_lock_fails_every_deletion_instead_of_skipping_the_caches() {
    let ws = Workspace::in_memory(WorkspaceConfig::default()).unwrap();
    ws.register_cache(Arc::new(Panicking)).unwrap();
    let ids = three_events(&ws, "p");
    let s = ws.existing("p").unwrap();
    // The cache panics while the workspace holds its cache lock: the lock is poisoned.
    let panicked = catch_unwind(AssertUnwindSafe(|| s.delete_event(ids[0], None)));
    assert!(panicked.is_err(), "the cache's panic propagates");

    // Every later deletion says the caches could not be cleared.
    let e = s.delete_event(ids[2], None).unwrap_err();
    assert!(matches!(e, Error::Poisoned(_)), "{e:?}");
    assert!(e.to_string().contains("model caches"), "{e}");
    let e = ws.delete_session("p").unwrap_err();
    assert!(matches!(e, Error::Poisoned(_)), "{e:?}");
    // A cache registered now would never be reached: registering fails too.
    let e = ws
        .register_cache(Arc::new(Counting::default()))
        .unwrap_err();
    assert!(matches!(e, Error::Poisoned(_)), "{e:?}");
}

#[test]
fn a_cache_that_cannot_evict_fails_the_deletion_and_the_others_are_still_evicted() {
    let ws = Workspace::in_memory(WorkspaceConfig::default()).unwrap();
    let counting = Arc::new(Counting::default());
    ws.register_cache(Arc::new(Failing)).unwrap();
    ws.register_cache(counting.clone()).unwrap();
    let ids = three_events(&ws, "f");
    let s = ws.existing("f").unwrap();
    let e = s.delete_event(ids[2], None).unwrap_err();
    assert!(matches!(e, Error::Poisoned("test cache")), "{e:?}");
    assert_eq!(counting.calls.load(Ordering::SeqCst), 1);
    // The log deletion itself stands.
    assert!(s.event(ids[2]).is_err());
}

#[test]
fn a_session_deletion_that_fails_part_way_leaves_the_session_whole() {
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::open(dir.path(), WorkspaceConfig::default()).unwrap();
    let cache = Arc::new(Counting::default());
    ws.register_cache(cache.clone()).unwrap();
    let ids = three_events(&ws, "whole");
    let s = ws.existing("whole").unwrap();
    s.compact(&Lines, SummaryKind::Milestone).unwrap();
    s.fork("side").unwrap();
    let records = s.records().unwrap();
    let summaries = s.summaries().unwrap();
    assert!(!records.is_empty() && !summaries.is_empty());
    assert_eq!(s.search("zebracorn77", 5).unwrap().len(), 1);

    // The last delete of the session deletion fails: every earlier one must roll back.
    let side = rusqlite::Connection::open(dir.path().join("workspace.db")).unwrap();
    side.execute_batch(
        "CREATE TRIGGER keep_sessions BEFORE DELETE ON sessions
         BEGIN SELECT RAISE(ABORT, 'sessions are kept by this test'); END;",
    )
    .unwrap();
    let e = ws.delete_session("whole").unwrap_err();
    assert!(matches!(e, Error::Db(_)), "{e:?}");
    assert!(e.to_string().contains("kept by this test"), "{e}");

    let s = ws.existing("whole").unwrap();
    let ev: Vec<i64> = s.events().unwrap().iter().map(|e| e.id).collect();
    assert_eq!(ev, ids, "events");
    assert_eq!(s.records().unwrap(), records, "records (none marked)");
    assert_eq!(s.summaries().unwrap(), summaries, "summaries");
    assert_eq!(s.search("zebracorn77", 5).unwrap().len(), 1, "index");
    assert!(s.on_branch("side").is_ok(), "branches");
    let logged: i64 = side
        .query_row("SELECT COUNT(*) FROM deletions", [], |r| r.get(0))
        .unwrap();
    assert_eq!(logged, 0, "no deletion logged");
    assert_eq!(
        cache.calls.load(Ordering::SeqCst),
        0,
        "caches are cleared only after the commit"
    );

    // Without the trigger the same deletion goes through, caches included.
    side.execute_batch("DROP TRIGGER keep_sessions;").unwrap();
    let report = ws.delete_session("whole").unwrap();
    assert_eq!(report.events, ids);
    assert_eq!(report.cache_entries, ids.len());
    assert_eq!(cache.calls.load(Ordering::SeqCst), 1);
    assert!(ws.sessions().unwrap().is_empty());
    assert!(matches!(
        ws.existing("whole").unwrap_err(),
        Error::UnknownSession(_)
    ));
}

#[test]
fn each_failure_has_its_own_variant() {
    let ws = Workspace::in_memory(WorkspaceConfig::default()).unwrap();
    let s = ws.session("empty").unwrap();
    let e = s.compact(&Lines, SummaryKind::Budget).unwrap_err();
    assert!(
        matches!(&e, Error::NoEvents { session } if session == "empty"),
        "{e:?}"
    );
    let e = s.rebuild(&Lines, 1).unwrap_err();
    assert!(
        matches!(&e, Error::NoEvents { session } if session == "empty"),
        "{e:?}"
    );

    let conn = db::open_in_memory().unwrap();
    let e = summary::get(&conn, 42).unwrap_err();
    assert!(matches!(e, Error::UnknownSummary(42)), "{e:?}");

    // The engine's own error comes through typed, not flattened to text.
    let mut cfg = CompactionConfig::default();
    cfg.overflow = Overflow::Error;
    let small = Scripted::new("t").with_context(64);
    let compactor = Compactor::new(Arc::new(Scripted::new("d")), Arc::new(small), cfg).unwrap();
    let summarizer = EngineSummarizer::new(compactor, Method::Speculative);
    let s = ws.session("long").unwrap();
    let events: Vec<NewEvent> = (0..40)
        .map(|i| NewEvent::user(&format!("message number {i} with quite a few words in it")))
        .collect();
    s.append(&events, None).unwrap();
    let e = summarizer
        .summarize(None, &s.events().unwrap())
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Engine(speccompact_engine::Error::HistoryTooLong { .. })
        ),
        "{e:?}"
    );
    let e = summarizer.summarize(None, &[]).unwrap_err();
    assert!(matches!(e, Error::History(HistoryError::Empty)), "{e:?}");
}
