//! Redaction of secrets (API keys, tokens, passwords, private keys) and configurable personal
//! data, applied to an event's text before it is stored, indexed, summarized or turned into
//! state. Each replacement is reported with its kind and where it was.

use crate::config::Patterns;
use regex::Regex;
use serde::Serialize;

/// One redacted span.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Redaction {
    /// Pattern name (`openai_key`, `password`, `email`, ...).
    pub kind: String,
    /// Byte offset of the span in the original text.
    pub start: usize,
    /// Byte end of the span in the original text.
    pub end: usize,
}

/// The placeholder a span of `kind` becomes.
pub fn placeholder(kind: &str) -> String {
    format!("[REDACTED:{kind}]")
}

/// Redacts `text`: returns the redacted text and the spans, in order of position.
pub fn redact(p: &Patterns, text: &str) -> (String, Vec<Redaction>) {
    let mut spans: Vec<Redaction> = Vec::new();
    let all: Vec<&(String, Regex)> = p.secrets.iter().chain(&p.pii).collect();
    for (kind, re) in all {
        for c in re.captures_iter(text) {
            let Some(m) = c.name("value").or_else(|| c.get(0)) else {
                continue;
            };
            // Overlaps keep the span found first (secrets come before personal data).
            if spans.iter().any(|s| m.start() < s.end && s.start < m.end()) {
                continue;
            }
            spans.push(Redaction {
                kind: kind.clone(),
                start: m.start(),
                end: m.end(),
            });
        }
    }
    spans.sort_by_key(|s| s.start);
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for s in &spans {
        out.push_str(&text[at..s.start]);
        out.push_str(&placeholder(&s.kind));
        at = s.end;
    }
    out.push_str(&text[at..]);
    (out, spans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkspaceConfig;

    #[test]
    fn secrets_and_pii_are_replaced_and_reported() {
        let p = WorkspaceConfig::default().compile("built-in").unwrap();
        let key = "sk-proj-abcdefghijklmnopqrstuvwx1234";
        let text = format!(
            "use {key} then password: hunter2pass and mail ops@example.com\n-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----"
        );
        let (out, spans) = redact(&p, &text);
        assert!(!out.contains(key) && !out.contains("hunter2pass") && !out.contains("MIIE"));
        assert!(!out.contains("ops@example.com"));
        let kinds: Vec<&str> = spans.iter().map(|s| s.kind.as_str()).collect();
        assert_eq!(kinds, ["openai_key", "password", "email", "private_key"]);
        assert_eq!(&text[spans[0].start..spans[0].end], key);
        assert!(out.contains("password: [REDACTED:password]"), "{out}");
        // Ordinary ids stay.
        let (same, none) = redact(&p, "reservation MDCLVA for emma_kim_9957, exit 1");
        assert!(none.is_empty());
        assert_eq!(same, "reservation MDCLVA for emma_kim_9957, exit 1");
    }
}
