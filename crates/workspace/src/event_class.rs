//! An event's class (code change, tool call, discussion, long document, chit-chat): the
//! vocabulary shared by the routing rules as configured (`config`), the classifier that
//! applies them (`route`) and the event log that stores the result (`event`). It depends on
//! no other module of the crate, so each of them can use it without importing the others.

use serde::{Deserialize, Serialize};

/// An event's class. Serialized (and configured in `route.rules[].class`) under the names
/// [`EventClass::as_str`] gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventClass {
    /// A diff or an editing tool.
    CodeChange,
    /// A tool call or a tool result.
    ToolCall,
    /// Ordinary conversation.
    Discussion,
    /// A long text.
    LongDocument,
    /// Greetings and acknowledgements.
    ChitChat,
}

impl EventClass {
    /// Every class.
    pub const ALL: [EventClass; 5] = [
        Self::CodeChange,
        Self::ToolCall,
        Self::Discussion,
        Self::LongDocument,
        Self::ChitChat,
    ];
    /// The class's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CodeChange => "code_change",
            Self::ToolCall => "tool_call",
            Self::Discussion => "discussion",
            Self::LongDocument => "long_document",
            Self::ChitChat => "chit_chat",
        }
    }
    /// Parses a class name (as stored in the event log).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_names_are_the_stored_names() {
        for c in EventClass::ALL {
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
            assert_eq!(serde_json::from_str::<EventClass>(&json).unwrap(), c);
            assert_eq!(EventClass::parse(c.as_str()), Some(c));
        }
        assert!(serde_json::from_str::<EventClass>("\"gossip\"").is_err());
    }
}
