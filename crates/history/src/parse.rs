//! Parsing: OpenAI messages, Anthropic messages, session records with `messages`, and JSONL
//! of any of them. The format is recognised per message, so mixed inputs work.

use crate::{Arguments, History, HistoryError, Message, Result, Role, ToolCall};
use serde_json::Value;

/// Parses a history from text: a JSON array of messages, a JSON object with `messages`
/// (and optional `system`, `id`), or JSONL with one message or one session per line (a
/// JSONL file of several sessions yields the first; [`parse_sessions`] returns all).
pub fn parse_history(text: &str) -> Result<History> {
    let mut all = parse_sessions(text)?;
    Ok(all.swap_remove(0))
}

/// Parses every history in a text: one for a JSON value or JSONL of messages, one per line
/// for JSONL of session records. Never empty.
pub fn parse_sessions(text: &str) -> Result<Vec<History>> {
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Err(HistoryError::Empty);
    }
    match serde_json::from_str::<Value>(trimmed) {
        Ok(v) => Ok(vec![parse_value(&v)?]),
        Err(whole) => {
            // JSONL: every non-empty line is a JSON value.
            let mut values = Vec::new();
            for (i, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let v: Value = serde_json::from_str(line).map_err(|e| HistoryError::Json {
                    line: Some(i + 1),
                    reason: if values.is_empty() {
                        whole.to_string()
                    } else {
                        e.to_string()
                    },
                })?;
                values.push(v);
            }
            match values.first() {
                Some(first) if first.get("messages").is_some() => {
                    values.iter().map(parse_value).collect()
                }
                _ => Ok(vec![parse_value(&Value::Array(values))?]),
            }
        }
    }
}

/// Parses one JSON value (array of messages or session object).
pub fn parse_value(v: &Value) -> Result<History> {
    let (id, system, list) = match v {
        Value::Array(a) => (None, None, a),
        Value::Object(o) => {
            let list =
                o.get("messages")
                    .and_then(Value::as_array)
                    .ok_or(HistoryError::Malformed {
                        index: 0,
                        reason: "expected an array of messages or an object with `messages`".into(),
                    })?;
            let system = match o.get("system") {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Array(blocks)) => Some(blocks_text(blocks)),
                _ => None,
            };
            (
                o.get("id").and_then(Value::as_str).map(str::to_string),
                system,
                list,
            )
        }
        _ => {
            return Err(HistoryError::Malformed {
                index: 0,
                reason: "expected an array of messages or an object with `messages`".into(),
            })
        }
    };
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(Message::text(Role::System, &s));
    }
    for (i, m) in list.iter().enumerate() {
        messages.extend(parse_message(i, m)?);
    }
    Ok(History::new(messages)?.with_id(id))
}

fn bad(index: usize, reason: impl Into<String>) -> HistoryError {
    HistoryError::Malformed {
        index,
        reason: reason.into(),
    }
}

fn blocks_text(blocks: &[Value]) -> String {
    blocks
        .iter()
        .filter_map(|b| match b {
            Value::String(s) => Some(s.clone()),
            _ => b.get("text").and_then(Value::as_str).map(str::to_string),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn arguments(raw: &Value) -> Arguments {
    match raw {
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(v) => Arguments::Json(v),
            Err(_) => Arguments::Raw(s.clone()),
        },
        other => Arguments::Json(other.clone()),
    }
}

/// One input message; an Anthropic message with several tool results becomes several.
fn parse_message(i: usize, m: &Value) -> Result<Vec<Message>> {
    let role = match m.get("role").and_then(Value::as_str) {
        Some("system") | Some("developer") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool") | Some("function") => Role::Tool,
        Some(other) => return Err(bad(i, format!("unknown role `{other}`"))),
        None => return Err(bad(i, "missing `role`")),
    };
    let mut msg = Message::text(role, "");
    msg.tool_call_id = m
        .get("tool_call_id")
        .and_then(Value::as_str)
        .map(str::to_string);
    msg.name = m.get("name").and_then(Value::as_str).map(str::to_string);
    let mut extra = Vec::new();
    match m.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => msg.content = s.clone(),
        Some(Value::Array(blocks)) => {
            let mut text = Vec::new();
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") | None => {
                        if let Some(t) = b.get("text").and_then(Value::as_str).or(b.as_str()) {
                            text.push(t.to_string());
                        }
                    }
                    Some("tool_use") => msg.tool_calls.push(ToolCall {
                        id: b.get("id").and_then(Value::as_str).map(str::to_string),
                        name: b
                            .get("name")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        arguments: arguments(b.get("input").unwrap_or(&Value::Null)),
                    }),
                    Some("tool_result") => {
                        let content = match b.get("content") {
                            Some(Value::String(s)) => s.clone(),
                            Some(Value::Array(a)) => blocks_text(a),
                            _ => String::new(),
                        };
                        let mut r = Message::text(Role::Tool, &content);
                        r.tool_call_id = b
                            .get("tool_use_id")
                            .and_then(Value::as_str)
                            .map(str::to_string);
                        if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                            r.content = format!("[error] {}", r.content);
                        }
                        extra.push(r);
                    }
                    Some(other) => text.push(format!("[{other} block]")),
                }
            }
            msg.content = text.join("\n");
        }
        Some(other) => {
            return Err(bad(
                i,
                format!("`content` must be text or blocks, got {other}"),
            ))
        }
    }
    if let Some(calls) = m.get("tool_calls") {
        let calls = calls
            .as_array()
            .ok_or_else(|| bad(i, "`tool_calls` must be an array"))?;
        for (j, c) in calls.iter().enumerate() {
            let f = c.get("function").unwrap_or(c);
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(i, format!("tool call {j} has no function name")))?;
            msg.tool_calls.push(ToolCall {
                id: c.get("id").and_then(Value::as_str).map(str::to_string),
                name: name.to_string(),
                arguments: arguments(f.get("arguments").unwrap_or(&Value::Null)),
            });
        }
    }
    let mut out = Vec::new();
    // A user turn that only carried tool results is represented by those results alone.
    if !(msg.content.is_empty() && msg.tool_calls.is_empty() && !extra.is_empty()) {
        out.push(msg);
    }
    out.extend(extra);
    Ok(out)
}
