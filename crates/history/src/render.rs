//! Rendering: one transcript text with role markers, tool calls as `name(args)`, tool results
//! capped with an explicit omission marker, and runs of left-out messages replaced by one
//! explicit marker line each. [`render`] (one optional middle cut) and [`render_kept`] (any set
//! of kept messages) share one message formatting.

use crate::{Arguments, History, Message, Role};
use std::ops::Range;

/// How the transcript is rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderOptions {
    /// Longest tool result kept whole, in characters; longer ones keep their first and last
    /// halves around `[... N characters omitted ...]`.
    pub tool_result_cap: usize,
    /// Messages `start..end` left out of the middle, replaced by one explicit
    /// `[... messages start-end (N messages, C characters) omitted ...]` line.
    pub omit: Option<Range<usize>>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            tool_result_cap: 4000,
            omit: None,
        }
    }
}

/// `text` whole when it has at most `limit` characters, else its first and last halves around
/// `[... N characters omitted ...]`.
pub(crate) fn cap(text: &str, limit: usize) -> String {
    let n = text.chars().count();
    if n <= limit {
        return text.to_string();
    }
    let head = limit / 2;
    let tail = limit - head;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(n - tail).collect();
    format!("{start}\n[... {} characters omitted ...]\n{end}", n - limit)
}

/// A tool call's arguments as rendered: compact JSON, or the original text.
pub(crate) fn arguments_text(a: &Arguments) -> String {
    match a {
        Arguments::Json(v) => v.to_string(),
        Arguments::Raw(s) => s.clone(),
    }
}

/// Appends one message: `[role]` header and content, `[role -> name(args)]` per tool call,
/// `[tool name]` and the capped content for tool results; always ends with a blank line.
fn write_message(out: &mut String, m: &Message, tool_result_cap: usize) {
    match m.role {
        Role::Tool => {
            let label = m.name.as_deref().unwrap_or("result");
            out.push_str(&format!(
                "[tool {label}]\n{}\n\n",
                cap(&m.content, tool_result_cap)
            ));
        }
        role => {
            if !m.content.is_empty() || m.tool_calls.is_empty() {
                out.push_str(&format!("[{}]\n{}\n", role.as_str(), m.content));
            }
            for c in &m.tool_calls {
                let args = arguments_text(&c.arguments);
                out.push_str(&format!("[{} -> {}({args})]\n", role.as_str(), c.name));
            }
            out.push('\n');
        }
    }
}

/// Appends the marker line of the left-out messages `run` (non-empty, within the history).
fn write_marker(out: &mut String, h: &History, run: &Range<usize>) {
    let n = run.len();
    let chars: usize = h.messages[run.clone()]
        .iter()
        .map(|m| m.content.chars().count())
        .sum();
    out.push_str(&format!(
        "[... messages {}-{} ({n} messages, {chars} characters) omitted ...]\n\n",
        run.start + 1,
        run.end
    ));
}

/// Renders one message alone, as it appears in a transcript.
pub(crate) fn render_message(m: &Message, tool_result_cap: usize) -> String {
    let mut out = String::new();
    write_message(&mut out, m, tool_result_cap);
    out
}

/// The one rendering loop: every message, except that each of `runs` (ascending,
/// non-overlapping, non-empty, within the history) is replaced by its marker line.
fn render_runs(h: &History, runs: &[Range<usize>], tool_result_cap: usize) -> String {
    let mut out = String::new();
    let mut runs = runs.iter().peekable();
    let mut i = 0;
    while i < h.messages.len() {
        if let Some(r) = runs.next_if(|r| r.start == i) {
            write_marker(&mut out, h, r);
            i = r.end;
            continue;
        }
        write_message(&mut out, &h.messages[i], tool_result_cap);
        i += 1;
    }
    out
}

/// Maximal runs of `false` in `kept`, as ascending index ranges.
pub(crate) fn omitted_runs(kept: &[bool]) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, &k) in kept.iter().enumerate() {
        match (k, start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                runs.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push(s..kept.len());
    }
    runs
}

/// The transcript of a history: `[role]` headers, `[assistant] -> name(args)` for calls,
/// `[tool name]` for results.
pub fn render(h: &History, opts: &RenderOptions) -> String {
    let runs: Vec<Range<usize>> = opts
        .omit
        .as_ref()
        .map(|r| r.start..r.end.min(h.messages.len()))
        .filter(|r| !r.is_empty())
        .into_iter()
        .collect();
    render_runs(h, &runs, opts.tool_result_cap)
}

/// The transcript of the messages flagged in `kept` (one flag per message; a missing flag
/// counts as kept), in their original order and formatted exactly as [`render`] formats them;
/// each maximal run of left-out messages (not kept, or in `opts.omit`) is replaced by one
/// `[... messages a-b (N messages, C characters) omitted ...]` line (1-based, inclusive).
/// With every message kept this is `render(h, opts)`.
pub fn render_kept(h: &History, kept: &[bool], opts: &RenderOptions) -> String {
    let flags: Vec<bool> = (0..h.messages.len())
        .map(|i| {
            kept.get(i).copied().unwrap_or(true)
                && !opts.omit.as_ref().is_some_and(|r| r.contains(&i))
        })
        .collect();
    render_runs(h, &omitted_runs(&flags), opts.tool_result_cap)
}
