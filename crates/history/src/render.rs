//! Rendering: one transcript text with role markers, tool calls as `name(args)`, and tool
//! results capped with an explicit omission marker.

use crate::{Arguments, History, Role};

/// How the transcript is rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderOptions {
    /// Longest tool result kept whole, in characters; longer ones keep their first and last
    /// halves around `[... N characters omitted ...]`.
    pub tool_result_cap: usize,
    /// Messages `start..end` left out of the middle, replaced by one explicit
    /// `[... messages start-end (N messages, C characters) omitted ...]` line.
    pub omit: Option<std::ops::Range<usize>>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            tool_result_cap: 4000,
            omit: None,
        }
    }
}

fn cap(text: &str, limit: usize) -> String {
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

/// The transcript of a history: `[role]` headers, `[assistant] -> name(args)` for calls,
/// `[tool name]` for results.
pub fn render(h: &History, opts: &RenderOptions) -> String {
    let mut out = String::new();
    for (i, m) in h.messages.iter().enumerate() {
        if let Some(r) = opts.omit.as_ref().filter(|r| r.contains(&i)) {
            if i == r.start {
                let n = r.end.min(h.messages.len()) - r.start;
                let chars: usize = h.messages[r.start..r.start + n]
                    .iter()
                    .map(|m| m.content.chars().count())
                    .sum();
                out.push_str(&format!(
                    "[... messages {}-{} ({n} messages, {chars} characters) omitted ...]\n\n",
                    r.start + 1,
                    r.start + n
                ));
            }
            continue;
        }
        match m.role {
            Role::Tool => {
                let label = m.name.as_deref().unwrap_or("result");
                out.push_str(&format!(
                    "[tool {label}]\n{}\n\n",
                    cap(&m.content, opts.tool_result_cap)
                ));
            }
            role => {
                if !m.content.is_empty() || m.tool_calls.is_empty() {
                    out.push_str(&format!("[{}]\n{}\n", role.as_str(), m.content));
                }
                for c in &m.tool_calls {
                    let args = match &c.arguments {
                        Arguments::Json(v) => v.to_string(),
                        Arguments::Raw(s) => s.clone(),
                    };
                    out.push_str(&format!("[{} -> {}({args})]\n", role.as_str(), c.name));
                }
                out.push('\n');
            }
        }
    }
    out
}
