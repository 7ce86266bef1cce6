//! A backend whose outputs the caller scripts: for algorithm tests, where a test chooses the
//! next-token distributions and the generated texts and counts the calls.
//!
//! Text is split into word tokens (a run of non-space characters with the whitespace after
//! it), so `max_tokens` and the newline rule behave as with a real tokenizer.

use crate::backend::{
    Backend, FinishReason, Generated, LineToken, Prefilled, Request, RequestKind, Response,
    Speculated, Verified,
};
use crate::chat_format::ChatFormat;
use crate::Result;
use std::sync::Mutex;

type GenerateFn = dyn Fn(usize, &str) -> String + Send + Sync;
type JudgeFn = dyn Fn(usize, &str) -> Vec<(String, f32)> + Send + Sync;
type LineScoreFn = dyn Fn(usize, &str) -> Vec<LineToken> + Send + Sync;

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
    /// The prefix the stream runs on (the session's, or the stream's own).
    pub prefix: String,
}

/// A scripted backend.
pub struct Scripted {
    name: String,
    format: ChatFormat,
    context: usize,
    generate: Box<GenerateFn>,
    judge: Box<JudgeFn>,
    line_scores: Box<LineScoreFn>,
    calls: Mutex<Vec<Call>>,
    batches: Mutex<usize>,
    prefixes: Mutex<Vec<String>>,
    prefills: Mutex<Vec<PrefillCall>>,
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
            line_scores: Box::new(|_, line| {
                word_tokens(line)
                    .into_iter()
                    .map(|w| LineToken {
                        text: w.to_string(),
                        logprob: -0.1,
                        rank: 0,
                    })
                    .collect()
            }),
            calls: Mutex::new(Vec::new()),
            batches: Mutex::new(0),
            prefixes: Mutex::new(Vec::new()),
            prefills: Mutex::new(Vec::new()),
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

    /// Line scores of a verification: (stream, the verified segment) -> its tokens with
    /// log-probabilities and ranks (default: its word tokens, each the greedy choice at
    /// log-probability -0.1). The judgment part comes from the judgment script, given the
    /// whole prompt.
    pub fn with_line_scores(
        mut self,
        f: impl Fn(usize, &str) -> Vec<LineToken> + Send + Sync + 'static,
    ) -> Self {
        self.line_scores = Box::new(f);
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

    /// How many judgment requests (verifications included) were served.
    pub fn judge_calls(&self) -> usize {
        self.calls()
            .iter()
            .filter(|c| {
                matches!(
                    c.kind,
                    RequestKind::Judge { .. } | RequestKind::Verify { .. }
                )
            })
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

    /// Every prefill, in order, with the tokens it reused.
    pub fn prefills(&self) -> Vec<PrefillCall> {
        self.prefills.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

/// A scripted session (the prefix text).
#[derive(Debug)]
pub struct ScriptedSession {
    /// The prefix it was opened with.
    pub prefix: String,
    /// Streams' own prefixes.
    pub stream_prefixes: std::collections::HashMap<usize, String>,
    /// Speculation paths per stream: the head and the words of the path after it.
    paths: std::collections::HashMap<usize, (String, usize)>,
}

/// A scripted prefix: its text; its tokens are [`word_tokens`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedPrefix {
    /// The text.
    pub text: String,
}

/// One scripted prefill: the prefix text and how many of its word tokens were reused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillCall {
    /// The prefix text.
    pub text: String,
    /// Word tokens taken from the base prefix.
    pub reused: usize,
    /// Word tokens in all.
    pub tokens: usize,
}

/// Applies `max_tokens`, the line grace, the newline rule and the line gate to a scripted
/// continuation.
fn continuation(full: &str, kind: RequestKind, lines: &crate::backend::LineRules) -> Generated {
    let RequestKind::Generate {
        max_tokens,
        stop_at_newline,
    } = kind
    else {
        return Generated {
            text: String::new(),
            tokens: 0,
            reason: FinishReason::MaxTokens,
        };
    };
    let mut text = String::new();
    let mut reason = FinishReason::Ended;
    let mut tokens = 0;
    let mut done_lines: Vec<String> = Vec::new();
    for p in word_tokens(full) {
        if tokens >= max_tokens {
            let mid_line = !text.is_empty() && !text.ends_with('\n');
            if !(mid_line && tokens < max_tokens + lines.grace) {
                reason = FinishReason::MaxTokens;
                break;
            }
        }
        tokens += 1;
        if stop_at_newline && p.contains('\n') {
            text.push_str(p.split('\n').next().unwrap_or(""));
            reason = FinishReason::Newline;
            break;
        }
        text.push_str(p);
        if p.contains('\n') {
            let parts: Vec<&str> = text.split('\n').collect();
            let complete = parts.len() - 1;
            let mut cut = None;
            for (k, line) in parts
                .iter()
                .enumerate()
                .take(complete)
                .skip(done_lines.len())
            {
                if let Some(gate) = &lines.gate {
                    if !gate(&done_lines, line) {
                        cut = Some(k);
                        break;
                    }
                }
                done_lines.push(line.to_string());
            }
            if let Some(k) = cut {
                text = format!("{}\n", parts[..=k].join("\n"));
                reason = FinishReason::LineRejected;
                break;
            }
            if tokens >= max_tokens {
                reason = FinishReason::MaxTokens;
                break;
            }
        }
    }
    if reason == FinishReason::Ended {
        tokens += 1;
    }
    Generated {
        text,
        tokens,
        reason,
    }
}

impl Backend for Scripted {
    type Session = ScriptedSession;
    type Prefix = ScriptedPrefix;

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

    fn prefill(
        &self,
        text: &str,
        base: Option<&ScriptedPrefix>,
    ) -> Result<Prefilled<ScriptedPrefix>> {
        let tokens = word_tokens(text);
        let reused = base.map_or(0, |b| {
            word_tokens(&b.text)
                .iter()
                .zip(&tokens)
                .take_while(|(a, b)| a == b)
                .count()
        });
        if let Ok(mut p) = self.prefills.lock() {
            p.push(PrefillCall {
                text: text.to_string(),
                reused,
                tokens: tokens.len(),
            });
        }
        Ok(Prefilled {
            prefix: ScriptedPrefix {
                text: text.to_string(),
            },
            tokens: tokens.len(),
            reused,
        })
    }

    fn session(&self, prefix: &ScriptedPrefix) -> ScriptedSession {
        if let Ok(mut p) = self.prefixes.lock() {
            p.push(prefix.text.clone());
        }
        ScriptedSession {
            prefix: prefix.text.clone(),
            stream_prefixes: Default::default(),
            paths: Default::default(),
        }
    }

    fn set_stream_prefix(
        &self,
        session: &mut ScriptedSession,
        stream: usize,
        prefix: &ScriptedPrefix,
    ) {
        session.stream_prefixes.insert(stream, prefix.text.clone());
    }

    fn prefix_bytes(&self, prefix: &ScriptedPrefix) -> usize {
        prefix.text.len()
    }

    fn run(&self, session: &mut ScriptedSession, requests: &[Request]) -> Result<Vec<Response>> {
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
                    prefix: session
                        .stream_prefixes
                        .get(&r.stream)
                        .unwrap_or(&session.prefix)
                        .clone(),
                });
            }
            out.push(match r.kind {
                RequestKind::Judge { top_k } => {
                    let mut d = (self.judge)(r.stream, &prompt);
                    d.truncate(top_k);
                    Response::Judged(d)
                }
                RequestKind::Verify { top_k, line } => {
                    let mut top = (self.judge)(r.stream, &prompt);
                    top.truncate(top_k);
                    let seg = r.prompt.get(line).map_or("", String::as_str);
                    Response::Verified(Verified {
                        top,
                        line: (self.line_scores)(r.stream, seg),
                    })
                }
                RequestKind::Speculate { max_tokens } => {
                    let head = r.prompt.first().map_or("", String::as_str);
                    let draft = r.prompt.get(1).map_or("", String::as_str);
                    let full = (self.generate)(r.stream, head);
                    // A new path takes the first token without a draft, as models do.
                    let (path, draft) = match session.paths.get(&r.stream) {
                        Some((h, n)) if h == head => (*n, draft),
                        _ => (0, ""),
                    };
                    Response::Speculated(speculate(&full, path, draft, max_tokens))
                }
                RequestKind::Generate { .. } => Response::Generated(continuation(
                    &(self.generate)(r.stream, &prompt),
                    r.kind,
                    &r.lines,
                )),
            });
        }
        for (r, resp) in requests.iter().zip(&out) {
            if let Response::Speculated(sp) = resp {
                session.paths.insert(
                    r.stream,
                    (r.prompt.first().cloned().unwrap_or_default(), sp.tokens),
                );
            }
        }
        Ok(out)
    }
}

/// A speculation step on word tokens: the target's greedy path is `full`'s words; the path
/// holds its first `path` words; draft words are kept while they match, then the target's
/// next word is added (its text running out is a stop token).
fn speculate(full: &str, path: usize, draft: &str, max: usize) -> Speculated {
    let words = word_tokens(full);
    let drafted = word_tokens(draft);
    let agree = drafted
        .iter()
        .zip(words.iter().skip(path))
        .take_while(|(d, w)| d == w)
        .count();
    let keep = agree.min(max.saturating_sub(path));
    let (len, done) = if keep < agree || path + keep >= max {
        (path + keep, Some(FinishReason::MaxTokens))
    } else if path + agree >= words.len() {
        (path + agree, Some(FinishReason::Ended))
    } else if path + keep + 1 >= max {
        (path + keep + 1, Some(FinishReason::MaxTokens))
    } else {
        (path + keep + 1, None)
    };
    Speculated {
        text: words[..len].concat(),
        tokens: len,
        accepted: keep,
        drafted: drafted.len(),
        done,
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
