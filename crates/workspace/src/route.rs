//! Routing by type: each event's class (code change, tool call, discussion, long document,
//! chit-chat; [`EventClass`], defined in `event_class` and re-exported here) from the
//! configured rules, who wrote it (a user message that carries command
//! output is a tool observation), and the lossless extraction of high-risk fields (exit codes,
//! test results, file paths, patch coordinates, error messages and identifiers), which lives in
//! `speccompact_history::fields` and is re-exported here.

use crate::config::Patterns;
pub use crate::event_class::EventClass;
use serde::{Deserialize, Serialize};
use speccompact_history::Role;
pub use speccompact_history::{exit_code_of, extract_fields, Fields, PatchCoord};

/// Who wrote an event, as far as state write rules are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Writer {
    /// Tool output (untrusted).
    Tool,
    /// The agent (untrusted as a source of rules).
    Assistant,
    /// The user.
    User,
    /// The system prompt's author.
    Owner,
}

impl Writer {
    /// Every writer, lowest authority first.
    pub const ALL: [Writer; 4] = [Self::Tool, Self::Assistant, Self::User, Self::Owner];
    /// The writer's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tool => "tool",
            Self::Assistant => "assistant",
            Self::User => "user",
            Self::Owner => "owner",
        }
    }
    /// Parses a writer name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|w| w.as_str() == s)
    }
    /// Whether this writer may set goals, constraints, permissions and acceptance criteria,
    /// and confirm candidates.
    pub fn is_authorized(self) -> bool {
        matches!(self, Self::User | Self::Owner)
    }
}

/// Who wrote a message: system -> owner; a user message matching the observation pattern ->
/// tool.
pub fn writer_of(p: &Patterns, role: Role, content: &str) -> Writer {
    match role {
        Role::System => Writer::Owner,
        Role::User if p.observation.is_match(content) => Writer::Tool,
        Role::User => Writer::User,
        Role::Assistant => Writer::Assistant,
        Role::Tool => Writer::Tool,
    }
}

/// The class of an event: the first rule whose conditions all hold (discussion if none).
pub fn classify(
    p: &Patterns,
    role: Role,
    writer: Writer,
    tool: Option<&str>,
    content: &str,
    exit_code: Option<i32>,
) -> EventClass {
    let chars = content.chars().count();
    for r in &p.rules {
        let w = &r.rule;
        let role_ok = w.roles.is_empty()
            || w.roles.iter().any(|x| {
                x == role.as_str() || (x == "tool" && writer == Writer::Tool && role == Role::User)
            });
        let tool_ok = r
            .tools
            .as_ref()
            .is_none_or(|re| tool.is_some_and(|t| re.is_match(t)));
        let content_ok = r.content.as_ref().is_none_or(|re| re.is_match(content));
        let min_ok = w.min_chars.is_none_or(|m| chars >= m);
        let max_ok = w.max_chars.is_none_or(|m| chars <= m);
        let exit_ok = w.exit_code.is_none_or(|want| want == exit_code.is_some());
        if role_ok && tool_ok && content_ok && min_ok && max_ok && exit_ok {
            return w.class;
        }
    }
    EventClass::Discussion
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkspaceConfig;

    fn patterns() -> Patterns {
        WorkspaceConfig::default().compile("built-in").unwrap()
    }

    #[test]
    fn classes_and_writers() {
        let p = patterns();
        let c = |role, tool, text: &str, exit| {
            let w = writer_of(&p, role, text);
            classify(&p, role, w, tool, text, exit)
        };
        assert_eq!(
            c(Role::Tool, Some("pytest"), "ok", Some(0)),
            EventClass::ToolCall
        );
        assert_eq!(
            c(
                Role::Tool,
                Some("bash"),
                "diff --git a/x.py b/x.py\n@@ -1 +1 @@",
                None
            ),
            EventClass::CodeChange
        );
        assert_eq!(
            c(Role::Assistant, Some("str_replace_editor"), "", None),
            EventClass::CodeChange
        );
        assert_eq!(c(Role::User, None, "thanks!", None), EventClass::ChitChat);
        assert_eq!(
            c(Role::User, None, &"word ".repeat(1000), None),
            EventClass::LongDocument
        );
        assert_eq!(
            c(
                Role::User,
                None,
                "Please fix the login bug in the API.",
                None
            ),
            EventClass::Discussion
        );
        // A user turn that carries command output is a tool observation.
        assert_eq!(
            writer_of(&p, Role::User, "<returncode>1</returncode>"),
            Writer::Tool
        );
        assert_eq!(
            c(Role::User, None, "<returncode>1</returncode>", None),
            EventClass::ToolCall
        );
        assert_eq!(writer_of(&p, Role::System, "policy"), Writer::Owner);
    }
}
