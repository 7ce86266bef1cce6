//! The evidence index: BM25 full-text search (SQLite FTS5) over the original events, queried
//! with words taken from the current task or question, returning event ids with their rank.
//! Rows are written with the event and deleted with it.

use crate::Result;
use rusqlite::{params, Connection};

/// One hit.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// Event id.
    pub event_id: i64,
    /// BM25 score (lower is better, as FTS5 reports it).
    pub score: f64,
}

const STOPWORDS: &[&str] = &[
    "the", "and", "for", "with", "that", "this", "from", "what", "when", "where", "which", "who",
    "why", "how", "was", "were", "are", "is", "be", "to", "of", "in", "on", "at", "a", "an", "it",
    "its", "do", "does", "did", "we", "you", "i", "me", "my", "our", "your", "can", "could",
    "should", "would", "will", "please", "continue", "task", "next", "last", "about", "into",
];

/// An FTS5 query from free text: its distinct words (alphanumeric runs of 2+ characters, not
/// stopwords), each quoted, joined with OR. `None` when no word is left.
pub fn query_of(text: &str) -> Option<String> {
    let mut words: Vec<String> = Vec::new();
    for w in text.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        let lw = w.to_lowercase();
        if w.chars().count() < 2 || STOPWORDS.contains(&lw.as_str()) || words.contains(&lw) {
            continue;
        }
        words.push(lw);
    }
    (!words.is_empty()).then(|| {
        words
            .iter()
            .map(|w| format!("\"{}\"", w.replace('"', "")))
            .collect::<Vec<_>>()
            .join(" OR ")
    })
}

/// The best `limit` events of `session` for `text`, best first.
pub fn search(conn: &Connection, session: &str, text: &str, limit: usize) -> Result<Vec<Hit>> {
    let Some(q) = query_of(text) else {
        return Ok(Vec::new());
    };
    let mut st = conn.prepare(
        "SELECT event_id, bm25(evidence) AS s FROM evidence
         WHERE evidence MATCH ?1 AND session = ?2 ORDER BY s LIMIT ?3",
    )?;
    let rows = st.query_map(params![q, session, limit as i64], |r| {
        Ok(Hit {
            event_id: r.get(0)?,
            score: r.get(1)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_drop_stopwords_and_quote_words() {
        assert_eq!(
            query_of("Trace the cause of the last failure in test_api.py").as_deref(),
            Some("\"trace\" OR \"cause\" OR \"failure\" OR \"test_api\" OR \"py\"")
        );
        assert_eq!(query_of("the a of"), None);
    }
}
