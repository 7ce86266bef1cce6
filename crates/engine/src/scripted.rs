//! A backend whose outputs the caller scripts: for algorithm tests, where a test chooses the
//! next-token distributions and the generated texts and counts the calls.
//!
//! Text is split into word tokens (a run of non-space characters with the whitespace after
//! it), so `max_tokens` and the newline rule behave as with a real tokenizer.

use crate::backend::{Backend, Generated, Request, RequestKind, Response};
use crate::prompt::ChatFormat;
use crate::Result;
use speccompact_runtime::StopReason;
use std::sync::Mutex;

type GenerateFn = dyn Fn(usize, &str) -> String + Send + Sync;
type JudgeFn = dyn Fn(usize, &str) -> Vec<(String, f32)> + Send + Sync;

/// One request a [`Scripted`] backend served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Stream id.
    pub stream: usize,
    /// The whole text after the prefix.
    pub prompt: String,
    /// What was asked.
    pub kind: RequestKind,
    /// Index of the batch it was part of.
    pub batch: usize,
}

/// A scripted backend.
pub struct Scripted {
    name: String,
    format: ChatFormat,
    context: usize,
    generate: Box<GenerateFn>,
    judge: Box<JudgeFn>,
    calls: Mutex<Vec<Call>>,
    batches: Mutex<usize>,
    prefixes: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scripted")
            .field("name", &self.name)
            .finish()
    }
}

/// Splits text into word tokens.
pub fn word_tokens(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut in_space = false;
    for (i, c) in text.char_indices() {
        if !c.is_whitespace() && in_space {
            out.push(&text[start..i]);
            start = i;
        }
        in_space = c.is_whitespace();
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

impl Scripted {
    /// A backend that generates nothing and answers every judgment "Yes" with p = 0.9.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            format: ChatFormat::plain(),
            context: 1 << 20,
            generate: Box::new(|_, _| String::new()),
            judge: Box::new(|_, _| vec![("Yes".to_string(), 0.9)]),
            calls: Mutex::new(Vec::new()),
            batches: Mutex::new(0),
            prefixes: Mutex::new(Vec::new()),
        }
    }

    /// Generation script: (stream, prompt after the prefix) -> the whole continuation; the
    /// backend applies `max_tokens` and the newline rule, and reports a stop token when the
    /// text runs out.
    pub fn with_generate(
        mut self,
        f: impl Fn(usize, &str) -> String + Send + Sync + 'static,
    ) -> Self {
        self.generate = Box::new(f);
        self
    }

    /// Judgment script: (stream, prompt after the prefix) -> top-k (token text, probability).
    pub fn with_judge(
        mut self,
        f: impl Fn(usize, &str) -> Vec<(String, f32)> + Send + Sync + 'static,
    ) -> Self {
        self.judge = Box::new(f);
        self
    }

    /// Sets the context length.
    pub fn with_context(mut self, tokens: usize) -> Self {
        self.context = tokens;
        self
    }

    /// Every request served so far.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// How many judgment requests were served.
    pub fn judge_calls(&self) -> usize {
        self.calls()
            .iter()
            .filter(|c| matches!(c.kind, RequestKind::Judge { .. }))
            .count()
    }

    /// How many generation requests were served.
    pub fn generate_calls(&self) -> usize {
        self.calls().len() - self.judge_calls()
    }

    /// The prefixes sessions were opened with.
    pub fn prefixes(&self) -> Vec<String> {
        self.prefixes.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

/// A scripted session (the prefix text).
#[derive(Debug)]
pub struct ScriptedSession {
    /// The prefix it was opened with.
    pub prefix: String,
}

impl Backend for Scripted {
    type Session = ScriptedSession;

    fn name(&self) -> &str {
        &self.name
    }

    fn format(&self) -> &ChatFormat {
        &self.format
    }

    fn context_length(&self) -> usize {
        self.context
    }

    fn count_tokens(&self, text: &str) -> Result<usize> {
        Ok(word_tokens(text).len())
    }

    fn is_gpu(&self) -> bool {
        false
    }

    fn open(&self, prefix: &str) -> Result<ScriptedSession> {
        if let Ok(mut p) = self.prefixes.lock() {
            p.push(prefix.to_string());
        }
        Ok(ScriptedSession {
            prefix: prefix.to_string(),
        })
    }

    fn run(&self, _session: &mut ScriptedSession, requests: &[Request]) -> Result<Vec<Response>> {
        let batch = {
            let mut b = self.batches.lock().map_err(|_| crate::Error::Backend {
                backend: self.name.clone(),
                reason: "poisoned".into(),
            })?;
            *b += 1;
            *b - 1
        };
        let mut out = Vec::with_capacity(requests.len());
        for r in requests {
            let prompt = r.prompt.concat();
            if let Ok(mut c) = self.calls.lock() {
                c.push(Call {
                    stream: r.stream,
                    prompt: prompt.clone(),
                    kind: r.kind,
                    batch,
                });
            }
            out.push(match r.kind {
                RequestKind::Judge { top_k } => {
                    let mut d = (self.judge)(r.stream, &prompt);
                    d.truncate(top_k);
                    Response::Judged(d)
                }
                RequestKind::Generate {
                    max_tokens,
                    stop_at_newline,
                } => {
                    let full = (self.generate)(r.stream, &prompt);
                    let pieces = word_tokens(&full);
                    let mut text = String::new();
                    let mut reason = StopReason::StopToken;
                    let mut tokens = 0;
                    for p in pieces {
                        if tokens == max_tokens {
                            reason = StopReason::MaxTokens;
                            break;
                        }
                        tokens += 1;
                        if stop_at_newline && p.contains('\n') {
                            text.push_str(p.split('\n').next().unwrap_or(""));
                            reason = StopReason::Newline;
                            break;
                        }
                        text.push_str(p);
                    }
                    if reason == StopReason::StopToken {
                        tokens += 1;
                    }
                    Response::Generated(Generated {
                        text,
                        tokens,
                        reason,
                    })
                }
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_tokens_keep_their_whitespace() {
        assert_eq!(word_tokens("a b\nc"), ["a ", "b\n", "c"]);
        assert_eq!(word_tokens("\nx"), ["\n", "x"]);
        assert!(word_tokens("").is_empty());
    }
}
