//! Context assembly for a task: the protected state block (never cut: goals, constraints,
//! permissions, acceptance criteria and open issues are always loaded, borrowing from the
//! other blocks; the assembly fails rather than drop one), the summary block (sections in an
//! order that depends on the task, lines flagged against state withheld), the evidence block
//! (passages retrieved for the task), and an explicit list of what was not loaded.

use crate::budget::Plan;
use crate::event::{id_ranges, Event};
use crate::guard::Flag;
use crate::state::{render as render_record, Record, RecordType};
use crate::summary::Summary;
use crate::{Error, Result};
use regex::Regex;
use serde::Serialize;
use speccompact_engine::sections;
use std::sync::OnceLock;

/// What the context is for: it orders the summary and steers the evidence query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Focus {
    /// Carry on with the work.
    Continue,
    /// Find the cause of a failure.
    Diagnose,
}

/// The focus of a task text.
pub fn focus_of(task: &str) -> Focus {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(
            r"(?i)\b(fail\w*|error\w*|cause|why|debug\w*|diagnos\w*|trace|broken|crash\w*|bug)\b",
        )
        .unwrap_or_else(|e| panic!("{e}"))
    });
    if re.is_match(task) {
        Focus::Diagnose
    } else {
        Focus::Continue
    }
}

/// Summary section order per focus (titles matched by prefix, case-insensitive).
fn section_order(f: Focus) -> &'static [&'static str] {
    match f {
        Focus::Continue => &[
            "goal",
            "next steps",
            "progress",
            "constraints",
            "critical context",
            "key decisions",
        ],
        Focus::Diagnose => &[
            "progress",
            "critical context",
            "key decisions",
            "next steps",
            "goal",
            "constraints",
        ],
    }
}

/// An assembled context and what it holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Assembled {
    /// The context text.
    pub text: String,
    /// The budget it was built for.
    pub plan: Plan,
    /// Focus of the task.
    pub focus: Focus,
    /// Tokens used per block: state, summary, evidence (with the not-loaded list).
    pub used: [usize; 3],
    /// Tokens the state block took beyond its share (taken from evidence, then summary).
    pub borrowed: usize,
    /// State records loaded.
    pub records: Vec<i64>,
    /// Valid state records not loaded.
    pub omitted_records: Vec<i64>,
    /// Summary used.
    pub summary: Option<i64>,
    /// Summary sections not loaded.
    pub omitted_sections: Vec<String>,
    /// Summary lines withheld because they contradict state.
    pub withheld: Vec<Flag>,
    /// Events loaded as evidence.
    pub loaded_events: Vec<i64>,
    /// Events not loaded.
    pub omitted_events: Vec<i64>,
    /// Tool results among them.
    pub omitted_tool_results: Vec<i64>,
}

/// Everything assembly reads.
pub struct Inputs<'a> {
    /// The task.
    pub task: &'a str,
    /// The budget.
    pub plan: Plan,
    /// Valid records of the state view.
    pub state: &'a [Record],
    /// The latest summary and its flags against current state.
    pub summary: Option<(&'a Summary, Vec<Flag>)>,
    /// Every event of the session.
    pub events: &'a [Event],
    /// Event ids in evidence order (best first).
    pub ranked: Vec<i64>,
    /// Longest passage (tokens).
    pub passage_tokens: usize,
    /// Token counter.
    pub count: &'a dyn Fn(&str) -> usize,
}

/// Cuts `text` to about `tokens`, keeping both ends around an omission marker.
fn cut(text: &str, tokens: usize, count: &dyn Fn(&str) -> usize) -> String {
    let n = count(text);
    if n <= tokens {
        return text.to_string();
    }
    let chars: Vec<char> = text.chars().collect();
    let keep = (chars.len() * tokens / n.max(1)).saturating_sub(16) / 2;
    let head: String = chars[..keep].iter().collect();
    let tail: String = chars[chars.len() - keep..].iter().collect();
    format!(
        "{head}\n[... {} characters omitted ...]\n{tail}",
        chars.len() - 2 * keep
    )
}

/// Builds the context.
pub fn assemble(i: Inputs<'_>) -> Result<Assembled> {
    let count = i.count;
    let plan = i.plan;
    let focus = focus_of(i.task);
    // State: the always-loaded records must fit the history budget.
    let mut state_text =
        String::from("## Protected state (verbatim; rules only the user or owner can change)\n");
    let mut records = Vec::new();
    let mut omitted_records = Vec::new();
    let mut sorted: Vec<&Record> = i.state.iter().collect();
    sorted.sort_by_key(|r| (RecordType::ALL.iter().position(|t| *t == r.kind), r.id));
    for r in sorted.iter().filter(|r| r.kind.always_loaded()) {
        state_text.push_str(&render_record(r));
        state_text.push('\n');
        records.push(r.id);
    }
    let required = count(&state_text);
    if required > plan.history {
        return Err(Error::Budget(format!(
            "the protected state needs {required} tokens but the history budget is {}: state is never cut; raise the window or lower the reserved tokens",
            plan.history
        )));
    }
    let state_cap = plan.state.max(required);
    for r in sorted.iter().filter(|r| !r.kind.always_loaded()) {
        let line = format!("{}\n", render_record(r));
        if count(&state_text) + count(&line) <= state_cap {
            state_text.push_str(&line);
            records.push(r.id);
        } else {
            omitted_records.push(r.id);
        }
    }
    let state_used = count(&state_text);
    let borrowed = state_used.saturating_sub(plan.state);
    let evidence_loss = borrowed.min(plan.evidence);
    let summary_cap = plan.summary - (borrowed - evidence_loss).min(plan.summary);
    // Summary: sections in focus order, flagged lines withheld.
    let mut summary_text = String::new();
    let mut omitted_sections = Vec::new();
    let mut withheld = Vec::new();
    let mut summary_id = None;
    if let Some((s, flags)) = &i.summary {
        summary_id = Some(s.id);
        withheld = flags.clone();
        let head = format!(
            "## Summary (generation {}, {}; {}; {})\n",
            s.generation,
            s.kind.as_str(),
            s.provenance,
            s.classification
        );
        summary_text.push_str(&head);
        let mut secs = sections(&s.text);
        let order = section_order(focus);
        secs.sort_by_key(|(t, _)| {
            let t = t.to_lowercase();
            order
                .iter()
                .position(|o| t.starts_with(o))
                .unwrap_or(order.len())
        });
        for (title, lines) in secs {
            let kept: Vec<&String> = lines
                .iter()
                .filter(|l| !flags.iter().any(|f| f.line == l.trim()))
                .collect();
            let block: String = kept
                .iter()
                .map(|l| {
                    // Section headings become level-3 inside the summary block.
                    if let Some(t) = l.strip_prefix("## ") {
                        format!("### {t}\n")
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect();
            if count(&summary_text) + count(&block) <= summary_cap {
                summary_text.push_str(&block);
            } else if !title.is_empty() {
                omitted_sections.push(title);
            }
        }
        if !flags.is_empty() {
            let list: Vec<String> = flags
                .iter()
                .map(|f| {
                    let what = serde_json::to_value(f.kind)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    match (f.record, f.event) {
                        (Some(r), _) => format!("{what} (record {r})"),
                        (_, Some(e)) => format!("{what} (event {e})"),
                        _ => what,
                    }
                })
                .collect();
            let note = format!(
                "({} summary line(s) withheld, they contradict state or the log: {})\n",
                flags.len(),
                list.join(", ")
            );
            if count(&summary_text) + count(&note) <= summary_cap {
                summary_text.push_str(&note);
            }
        }
        if summary_text == head && count(&head) > summary_cap {
            summary_text.clear();
        }
    }
    let summary_used = count(&summary_text);
    // Evidence: what the budget has left, passages in rank order, then the not-loaded list.
    let evidence_cap = plan.history.saturating_sub(state_used + summary_used);
    let not_loaded = |loaded: &[i64]| -> (String, Vec<i64>, Vec<i64>) {
        let omitted: Vec<i64> = i
            .events
            .iter()
            .map(|e| e.id)
            .filter(|id| !loaded.contains(id))
            .collect();
        let tools: Vec<&Event> = i
            .events
            .iter()
            .filter(|e| !loaded.contains(&e.id) && e.writer == crate::route::Writer::Tool)
            .collect();
        let mut t = String::from("## Not loaded\n");
        if omitted.is_empty() {
            t.push_str("Every event of the log is loaded above.\n");
        } else {
            t.push_str(&format!(
                "Events not loaded ({} of {}), retrievable by id: {}\n",
                omitted.len(),
                i.events.len(),
                id_ranges(&omitted)
            ));
            if !tools.is_empty() {
                let list: Vec<String> = tools
                    .iter()
                    .map(|e| match e.exit_code {
                        Some(c) => format!("{} (exit {c})", e.id),
                        None => e.id.to_string(),
                    })
                    .collect();
                t.push_str(&format!("Tool results not loaded: {}\n", list.join(", ")));
            }
        }
        if !omitted_records.is_empty() {
            t.push_str(&format!(
                "State records not loaded: {}\n",
                id_ranges(&omitted_records)
            ));
        }
        if !omitted_sections.is_empty() {
            t.push_str(&format!(
                "Summary sections not loaded: {}\n",
                omitted_sections.join("; ")
            ));
        }
        (t, omitted, tools.iter().map(|e| e.id).collect())
    };
    let mut loaded: Vec<i64> = Vec::new();
    let mut passages: Vec<String> = Vec::new();
    for id in &i.ranked {
        let Some(e) = i.events.iter().find(|e| e.id == *id) else {
            continue;
        };
        if loaded.contains(id) {
            continue;
        }
        let p = format!(
            "{}\n{}\n",
            e.header(),
            cut(&e.content, i.passage_tokens, count)
        );
        let mut trial = loaded.clone();
        trial.push(*id);
        let body: String = passages
            .iter()
            .map(String::as_str)
            .chain([p.as_str()])
            .collect();
        let total = count(&format!("## Evidence\n{body}")) + count(&not_loaded(&trial).0);
        if total <= evidence_cap {
            passages.push(p);
            loaded = trial;
        }
    }
    let (nl_text, omitted_events, omitted_tool_results) = not_loaded(&loaded);
    let mut evidence_text = String::new();
    if !passages.is_empty() {
        evidence_text.push_str("## Evidence\n");
        for p in &passages {
            evidence_text.push_str(p);
        }
    }
    evidence_text.push_str(&nl_text);
    let evidence_used = count(&evidence_text);
    if state_used + summary_used + evidence_used > plan.history {
        return Err(Error::Budget(format!(
            "the list of what was not loaded alone needs {evidence_used} tokens; {} are left after state and summary",
            evidence_cap
        )));
    }
    let text = format!(
        "# Context for: {}\n\n{state_text}\n{summary_text}\n{evidence_text}",
        i.task.trim()
    );
    Ok(Assembled {
        text,
        plan,
        focus,
        used: [state_used, summary_used, evidence_used],
        borrowed,
        records,
        omitted_records,
        summary: summary_id,
        omitted_sections,
        withheld,
        loaded_events: loaded,
        omitted_events,
        omitted_tool_results,
    })
}
