//! The evaluation sessions: one JSON object per line with `messages`, `probes`, `cut`,
//! `continuation` and `reference_summary` (the format of `evaldata/dev`), read without
//! changing a byte of the text, and the data file's checksum for reports.

use crate::{Error, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};
use speccompact_history::{parse_value, History, Message};
use std::path::Path;

/// What a probe checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeKind {
    /// An identifier that must survive verbatim.
    Identifier,
    /// A file path that must survive verbatim.
    File,
    /// A question with a reference answer.
    Qa,
    /// The benchmark's label for the whole run (used to stratify, not as text).
    Outcome,
}

/// One check on a compacted context.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Probe {
    /// Unique within the session.
    pub id: String,
    /// Slot where the fact belongs (`any` for anywhere).
    pub slot: String,
    /// Kind.
    pub kind: ProbeKind,
    /// Exact strings; one must occur (case-sensitive for identifiers and files).
    pub expect_any: Vec<String>,
    /// The question, for `qa`.
    pub question: Option<String>,
    /// The reference answer, for `qa` and `outcome`.
    pub answer: Option<String>,
}

impl Probe {
    /// Whether this is a string-presence probe (identifier or file).
    pub fn is_presence(&self) -> bool {
        matches!(self.kind, ProbeKind::Identifier | ProbeKind::File)
    }
}

/// One evaluation session.
#[derive(Debug, Clone)]
pub struct EvalSession {
    /// Session id.
    pub id: String,
    /// Dataset and subset.
    pub source: String,
    /// The licence of the session's text, as the file states it (empty when absent).
    pub license: String,
    /// `tool-use`, `coding`, `meeting` or `memory`.
    pub kind: String,
    /// The kept messages (`history.id` is the session id).
    pub history: History,
    /// Checks on a compacted context.
    pub probes: Vec<Probe>,
    /// Messages kept before the cut, when the session was cut.
    pub cut: Option<usize>,
    /// The real next messages after the cut (empty when complete).
    pub continuation: Vec<Message>,
    /// A reference summary, when the source has one.
    pub reference_summary: Option<String>,
    /// Characters of the kept messages (from the file's `stats`, else counted).
    pub chars: usize,
}

impl EvalSession {
    /// Identifier and file probes.
    pub fn presence_probes(&self) -> impl Iterator<Item = &Probe> {
        self.probes.iter().filter(|p| p.is_presence())
    }

    /// Question probes.
    pub fn qa_probes(&self) -> impl Iterator<Item = &Probe> {
        self.probes
            .iter()
            .filter(|p| p.kind == ProbeKind::Qa && p.question.is_some())
    }
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_str().map(str::to_string))
        .collect()
}

fn parse_probe(v: &serde_json::Value) -> std::result::Result<Probe, String> {
    let s = |k: &str| v[k].as_str().map(str::to_string);
    let kind = match v["kind"].as_str() {
        Some("identifier") => ProbeKind::Identifier,
        Some("file") => ProbeKind::File,
        Some("qa") => ProbeKind::Qa,
        Some("outcome") => ProbeKind::Outcome,
        other => return Err(format!("probe with unknown kind {other:?}")),
    };
    let probe = Probe {
        id: s("id").ok_or("probe without an `id`")?,
        slot: s("slot").unwrap_or_else(|| "any".into()),
        kind,
        expect_any: strings(&v["expect_any"]),
        question: s("question"),
        answer: v["answer"]
            .as_str()
            .map(str::to_string)
            .or_else(|| v["answer"].as_f64().map(|x| x.to_string())),
    };
    if probe.is_presence() && probe.expect_any.is_empty() {
        return Err(format!("probe {} has an empty `expect_any`", probe.id));
    }
    Ok(probe)
}

/// Parses one session record.
pub fn parse_session(v: &serde_json::Value) -> std::result::Result<EvalSession, String> {
    let id = v["id"]
        .as_str()
        .ok_or("record without an `id`")?
        .to_string();
    let mut history = parse_value(v).map_err(|e| format!("session {id}: {e}"))?;
    history.id = Some(id.clone());
    let probes = v["probes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(parse_probe)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| format!("session {id}: {e}"))?;
    let continuation = match v.get("continuation") {
        Some(c) if c.as_array().is_some_and(|a| !a.is_empty()) => {
            parse_value(c)
                .map_err(|e| format!("session {id}: continuation: {e}"))?
                .messages
        }
        _ => Vec::new(),
    };
    let chars = v["stats"]["chars"].as_u64().map_or_else(
        || {
            history
                .messages
                .iter()
                .map(|m| m.content.chars().count())
                .sum()
        },
        |c| c as usize,
    );
    Ok(EvalSession {
        source: v["source"].as_str().unwrap_or_default().to_string(),
        license: v["license"].as_str().unwrap_or_default().to_string(),
        kind: v["kind"].as_str().unwrap_or_default().to_string(),
        cut: v["cut"].as_u64().map(|c| c as usize),
        reference_summary: v["reference_summary"].as_str().map(str::to_string),
        id,
        history,
        probes,
        continuation,
        chars,
    })
}

/// Reads every session of a JSONL file; a bad line is an error naming the file and line.
pub fn load_sessions(path: &Path) -> Result<Vec<EvalSession>> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: p.clone(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let data = |reason: String| Error::Data {
            path: p.clone(),
            line: i + 1,
            reason,
        };
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| data(format!("not JSON: {e}")))?;
        out.push(parse_session(&v).map_err(data)?);
    }
    if out.is_empty() {
        return Err(Error::Data {
            path: p,
            line: 0,
            reason: "no sessions".into(),
        });
    }
    Ok(out)
}

/// Hex SHA-256 of a file, recorded in every report.
pub fn sha256_file(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    Ok(Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The text a fact must occur in to count as sourced: every message's content, tool names and
/// call arguments, verbatim.
pub fn history_text(h: &History) -> String {
    let mut s = String::new();
    for m in &h.messages {
        s.push_str(&m.content);
        s.push('\n');
        if let Some(n) = &m.name {
            s.push_str(n);
            s.push('\n');
        }
        for c in &m.tool_calls {
            s.push_str(&c.name);
            s.push('\n');
            match &c.arguments {
                speccompact_history::Arguments::Json(v) => {
                    s.push_str(&v.to_string());
                    // Argument strings as written (JSON escaping would hide paths with quotes).
                    collect_strings(v, &mut s);
                }
                speccompact_history::Arguments::Raw(r) => s.push_str(r),
            }
            s.push('\n');
        }
    }
    s
}

fn collect_strings(v: &serde_json::Value, out: &mut String) {
    match v {
        serde_json::Value::String(x) => {
            out.push('\n');
            out.push_str(x);
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect_strings(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| collect_strings(x, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_record_parses_with_probes_and_continuation() {
        let v = serde_json::json!({
            "id": "s1", "source": "x", "kind": "coding", "cut": 2,
            "messages": [{"role": "user", "content": "fix a.py"},
                         {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                           "function": {"name": "bash", "arguments": "{\"cmd\": \"cat 'a b.py'\"}"}}]}],
            "continuation": [{"role": "tool", "tool_call_id": "c", "content": "ok"}],
            "probes": [{"id": "p1", "slot": "progress", "kind": "file", "expect_any": ["a.py"]},
                       {"id": "q", "slot": "any", "kind": "qa", "expect_any": [], "question": "Q?", "answer": "A"}],
            "reference_summary": null
        });
        let s = parse_session(&v).unwrap();
        assert_eq!(s.history.messages.len(), 2);
        assert_eq!(s.continuation.len(), 1);
        assert_eq!(s.presence_probes().count(), 1);
        assert_eq!(s.qa_probes().count(), 1);
        assert!(history_text(&s.history).contains("cat 'a b.py'"));
        let bad = serde_json::json!({"id": "s", "messages": [{"role": "user", "content": "x"}],
            "probes": [{"id": "p", "kind": "file", "expect_any": []}]});
        assert!(parse_session(&bad)
            .unwrap_err()
            .contains("empty `expect_any`"));
    }
}

/// The id a session was cut from (`x.cut18` → `x`).
pub fn base_id(id: &str) -> &str {
    match id.rsplit_once(".cut") {
        Some((b, n)) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => b,
        _ => id,
    }
}

/// Which sessions to evaluate.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only these ids (in this order), when given.
    pub ids: Vec<String>,
    /// Leave out sessions cut from or equal to these ids.
    pub exclude: Vec<String>,
    /// Only sessions with at least one identifier, file or question probe.
    pub with_probes: bool,
    /// Shortest first (by characters) instead of file order.
    pub shortest: bool,
    /// At most this many.
    pub limit: Option<usize>,
}

impl Selection {
    /// Applies the selection; an unknown id is an error listing the file's ids.
    pub fn apply(&self, all: Vec<EvalSession>) -> std::result::Result<Vec<EvalSession>, String> {
        let mut out: Vec<EvalSession> = if self.ids.is_empty() {
            all
        } else {
            let mut picked = Vec::new();
            for id in &self.ids {
                match all.iter().find(|s| s.id == *id) {
                    Some(s) => picked.push(s.clone()),
                    None => {
                        let known: Vec<&str> = all.iter().map(|s| s.id.as_str()).collect();
                        return Err(format!(
                            "no session `{id}` (the file has: {})",
                            known.join(", ")
                        ));
                    }
                }
            }
            picked
        };
        out.retain(|s| !self.exclude.iter().any(|x| base_id(x) == base_id(&s.id)));
        if self.with_probes {
            out.retain(|s| s.presence_probes().next().is_some() || s.qa_probes().next().is_some());
        }
        if self.shortest {
            out.sort_by_key(|s| s.chars);
        }
        if let Some(n) = self.limit {
            out.truncate(n);
        }
        Ok(out)
    }

    /// A sentence saying how the sessions were chosen, for reports.
    pub fn describe(&self, n: usize) -> String {
        let mut s = format!("{n} sessions");
        if self.with_probes {
            s.push_str(" with identifier/file/question probes");
        }
        if !self.ids.is_empty() {
            s.push_str(" named on the command line");
        } else if self.shortest {
            s.push_str(", the shortest by characters");
        } else {
            s.push_str(" in file order");
        }
        if !self.exclude.is_empty() {
            s.push_str(&format!(
                ", leaving out {} excluded ids",
                self.exclude.len()
            ));
        }
        s
    }
}

#[cfg(test)]
mod selection_tests {
    use super::*;

    fn s(id: &str, chars: usize) -> EvalSession {
        EvalSession {
            id: id.into(),
            source: String::new(),
            license: String::new(),
            kind: String::new(),
            history: History::default(),
            probes: Vec::new(),
            cut: None,
            continuation: Vec::new(),
            reference_summary: None,
            chars,
        }
    }

    #[test]
    fn selection_excludes_cut_twins_sorts_and_limits() {
        assert_eq!(base_id("tau-22.cut18"), "tau-22");
        assert_eq!(base_id("a.cutx"), "a.cutx");
        let all = vec![s("a", 30), s("b", 10), s("c", 20), s("d", 5)];
        let sel = Selection {
            exclude: vec!["d.cut3".into()],
            shortest: true,
            limit: Some(2),
            ..Default::default()
        };
        let mut probed = s("e", 1);
        probed.probes.push(Probe {
            id: "p".into(),
            slot: "any".into(),
            kind: ProbeKind::File,
            expect_any: vec!["x.py".into()],
            question: None,
            answer: None,
        });
        let only = Selection {
            with_probes: true,
            ..Default::default()
        }
        .apply(vec![s("a", 3), probed])
        .unwrap();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].id, "e");
        let ids: Vec<String> = sel
            .apply(all.clone())
            .unwrap()
            .into_iter()
            .map(|x| x.id)
            .collect();
        assert_eq!(ids, vec!["b", "c"]);
        let e = Selection {
            ids: vec!["zz".into()],
            ..Default::default()
        }
        .apply(all)
        .unwrap_err();
        assert!(e.contains("`zz`") && e.contains("a, b, c, d"), "{e}");
    }
}
