//! The seam between the compaction algorithms and a model: open a session by prefilling one
//! shared prefix, then run batches of requests after it. Each request names a stream (one per
//! slot); a backend keeps each stream's cache and reuses the longest common prefix of
//! consecutive requests on the same stream. A prefilled prefix outlives its session: a later
//! prefill reuses the positions it shares with an earlier one, and a stream may have a prefix
//! of its own (a slot's view of a history too long for the model).

use crate::chat_format::ChatFormat;
use crate::Result;
use std::sync::Arc;

/// Says whether a generation goes on after a line it completed: called with the lines this
/// generation completed before it and the line itself (without its newline); `false` ends the
/// generation after that line.
pub type LineGate = Arc<dyn Fn(&[String], &str) -> bool + Send + Sync>;

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model ended its turn (an end token).
    Ended,
    /// The token budget ran out.
    MaxTokens,
    /// The first newline ended it (asked for by the request).
    Newline,
    /// The model's context is full.
    Context,
    /// The request's line gate refused a completed line.
    LineRejected,
}

impl From<speccompact_runtime::StopReason> for FinishReason {
    fn from(r: speccompact_runtime::StopReason) -> Self {
        use speccompact_runtime::StopReason as S;
        match r {
            S::StopToken => FinishReason::Ended,
            S::MaxTokens => FinishReason::MaxTokens,
            S::Newline => FinishReason::Newline,
            S::Context => FinishReason::Context,
            S::LineRejected => FinishReason::LineRejected,
        }
    }
}

/// Line-level rules of a generation request.
#[derive(Clone, Default)]
pub struct LineRules {
    /// Ends the generation after the first line the gate refuses
    /// ([`FinishReason::LineRejected`]).
    pub gate: Option<LineGate>,
    /// Extra tokens past `max_tokens` to finish the line the budget ran out in.
    pub grace: usize,
    /// Never start a line with `#` except a level-2 `## ` heading (which ends a section).
    pub no_headings: bool,
}

impl std::fmt::Debug for LineRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineRules")
            .field("gate", &self.gate.is_some())
            .field("grace", &self.grace)
            .field("no_headings", &self.no_headings)
            .finish()
    }
}

/// Equal when the settings are and the gates are the same function object.
impl PartialEq for LineRules {
    fn eq(&self, o: &Self) -> bool {
        let gates = match (&self.gate, &o.gate) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        gates && self.grace == o.grace && self.no_headings == o.no_headings
    }
}

impl Eq for LineRules {}

/// A prefilled shared prefix, as returned by [`Backend::prefill`].
#[derive(Debug, Clone)]
pub struct Prefilled<P> {
    /// The prefix (kept by callers to reuse it later).
    pub prefix: P,
    /// Its length in tokens.
    pub tokens: usize,
    /// Positions taken over from the base prefix (not computed again).
    pub reused: usize,
}

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// One forward: the `top_k` most likely next tokens with their probabilities.
    Judge {
        /// Candidates returned.
        top_k: usize,
    },
    /// One forward like [`RequestKind::Judge`], also rating every token of the prompt segment
    /// `line` (a proposed line) under the model: the verification of a drafted line.
    Verify {
        /// Candidates returned for the token after the prompt.
        top_k: usize,
        /// Index of the scored segment in [`Request::prompt`] (1 or later).
        line: usize,
    },
    /// Token-level speculation on a stream's own token path (the lossless mode): the prompt
    /// is `[head, draft]`. The stream continues the path it holds after `head`; the draft's
    /// tokens are appended and checked in one forward, kept while each is the model's greedy
    /// token, and the model's own token at the first mismatch (or after the whole draft) is
    /// added. A stream without a path reads the head and takes the model's first token (the
    /// draft is not used). The path is never re-tokenized, so it
    /// is exactly the model's greedy continuation of `head`.
    Speculate {
        /// Most tokens the path may hold after `head`.
        max_tokens: usize,
    },
    /// Greedy generation.
    Generate {
        /// Most new tokens.
        max_tokens: usize,
        /// End at the first token containing a newline (keeping the text before it).
        stop_at_newline: bool,
    },
}

/// One request: the text after the shared prefix, as segments (each tokenized on its own, so
/// a stream's repeated segments hit its cache), on a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Stream id (the slot index); requests on one stream share a cache.
    pub stream: usize,
    /// Text after the prefix.
    pub prompt: Vec<String>,
    /// Judge or generate.
    pub kind: RequestKind,
    /// Line rules of a generation (ignored by judgments).
    pub lines: LineRules,
}

/// Output of a generation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// Generated text (without the stop token; cut at the newline when asked).
    pub text: String,
    /// Tokens generated, including one that stopped the row.
    pub tokens: usize,
    /// Why it ended.
    pub reason: FinishReason,
}

/// How the model rates one token of a verified line.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LineToken {
    /// The token's text (the line's text is the concatenation of its tokens' texts).
    pub text: String,
    /// Its log-probability given everything before it.
    pub logprob: f32,
    /// Tokens the model rates higher (0: the model's own greedy choice).
    pub rank: u32,
}

/// Output of a verification request.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// Next-token candidates after the prompt, most likely first.
    pub top: Vec<(String, f32)>,
    /// The scored line's tokens, in order.
    pub line: Vec<LineToken>,
}

/// Output of a speculation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Speculated {
    /// The whole path after the head, as text.
    pub text: String,
    /// Tokens of the path after the head.
    pub tokens: usize,
    /// Draft tokens kept this time.
    pub accepted: usize,
    /// Draft tokens offered this time (in the model's tokenization).
    pub drafted: usize,
    /// Set when the path has ended: by a stop token, or at `max_tokens`.
    pub done: Option<FinishReason>,
}

/// Output of one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// Next-token candidates, most likely first: (token text, probability).
    Judged(Vec<(String, f32)>),
    /// A verified line.
    Verified(Verified),
    /// A speculation step.
    Speculated(Speculated),
    /// Generated text.
    Generated(Generated),
}

impl Response {
    /// What kind of response this is, for errors.
    fn kind(&self) -> &'static str {
        match self {
            Response::Judged(_) => "a judgment",
            Response::Verified(_) => "a verification",
            Response::Speculated(_) => "a speculation step",
            Response::Generated(_) => "a generation",
        }
    }

    fn wrong(&self, backend: &str, asked: &str) -> crate::Error {
        crate::Error::Backend {
            backend: backend.to_string(),
            reason: format!("answered {asked} request with {}", self.kind()),
        }
    }

    /// The generation, or an error naming `backend` when the response is of another kind.
    pub fn into_generated(self, backend: &str) -> Result<Generated> {
        match self {
            Response::Generated(g) => Ok(g),
            other => Err(other.wrong(backend, "a generation")),
        }
    }

    /// The next-token candidates, or an error naming `backend` when the response is of
    /// another kind.
    pub fn into_judged(self, backend: &str) -> Result<Vec<(String, f32)>> {
        match self {
            Response::Judged(top) => Ok(top),
            other => Err(other.wrong(backend, "a judgment")),
        }
    }

    /// The verified line, or an error naming `backend` when the response is of another kind.
    pub fn into_verified(self, backend: &str) -> Result<Verified> {
        match self {
            Response::Verified(v) => Ok(v),
            other => Err(other.wrong(backend, "a verification")),
        }
    }

    /// The speculation step, or an error naming `backend` when the response is of another
    /// kind.
    pub fn into_speculated(self, backend: &str) -> Result<Speculated> {
        match self {
            Response::Speculated(s) => Ok(s),
            other => Err(other.wrong(backend, "a speculation")),
        }
    }
}

/// A model behind the compaction algorithms.
pub trait Backend: Send + Sync {
    /// Per-compaction state: the prefilled prefix and the streams' caches.
    type Session: Send;
    /// A prefilled prefix, shareable between sessions and reusable by later prefills.
    type Prefix: Clone + Send + Sync;

    /// The model's name, for traces and errors.
    fn name(&self) -> &str;
    /// The model's chat framing.
    fn format(&self) -> &ChatFormat;
    /// Longest sequence the model accepts, in tokens.
    fn context_length(&self) -> usize;
    /// Tokens of a text (no BOS).
    fn count_tokens(&self, text: &str) -> Result<usize>;
    /// Whether the model runs on a GPU (drafter/target overlap pays off there).
    fn is_gpu(&self) -> bool;
    /// How the model computes (kernels, dense copies, batch invariance), for traces; empty
    /// when the backend has nothing to say.
    fn numerics(&self) -> String {
        String::new()
    }
    /// Totals of the model's token lookup since it was loaded (`None`: the backend drafts
    /// nothing from the text).
    fn lookup(&self) -> Option<speccompact_runtime::LookupCounters> {
        None
    }
    /// Prefills `text` as a shared prefix; the positions it shares with `base` (longest
    /// common prefix of their tokens) are taken from `base`, not computed again.
    fn prefill(&self, text: &str, base: Option<&Self::Prefix>) -> Result<Prefilled<Self::Prefix>>;
    /// A session whose streams fork from `prefix`.
    fn session(&self, prefix: &Self::Prefix) -> Self::Session;
    /// Gives `stream` its own prefix: its cache forks from `prefix` from now on.
    fn set_stream_prefix(&self, session: &mut Self::Session, stream: usize, prefix: &Self::Prefix);
    /// Memory a prefix holds, in bytes.
    fn prefix_bytes(&self, prefix: &Self::Prefix) -> usize;
    /// Prefills the shared prefix and starts a session.
    fn open(&self, prefix: &str) -> Result<Self::Session> {
        Ok(self.session(&self.prefill(prefix, None)?.prefix))
    }
    /// Runs requests as one batch (one forward per step for all rows still going);
    /// responses are in request order.
    fn run(&self, session: &mut Self::Session, requests: &[Request]) -> Result<Vec<Response>>;
}

/// A shared backend is a backend (tests keep a handle to count calls; servers share models).
impl<B: Backend> Backend for std::sync::Arc<B> {
    type Session = B::Session;
    type Prefix = B::Prefix;

    fn name(&self) -> &str {
        (**self).name()
    }
    fn format(&self) -> &ChatFormat {
        (**self).format()
    }
    fn numerics(&self) -> String {
        (**self).numerics()
    }
    fn lookup(&self) -> Option<speccompact_runtime::LookupCounters> {
        (**self).lookup()
    }
    fn context_length(&self) -> usize {
        (**self).context_length()
    }
    fn count_tokens(&self, text: &str) -> Result<usize> {
        (**self).count_tokens(text)
    }
    fn is_gpu(&self) -> bool {
        (**self).is_gpu()
    }
    fn prefill(&self, text: &str, base: Option<&Self::Prefix>) -> Result<Prefilled<Self::Prefix>> {
        (**self).prefill(text, base)
    }
    fn session(&self, prefix: &Self::Prefix) -> Self::Session {
        (**self).session(prefix)
    }
    fn set_stream_prefix(&self, session: &mut Self::Session, stream: usize, prefix: &Self::Prefix) {
        (**self).set_stream_prefix(session, stream, prefix)
    }
    fn prefix_bytes(&self, prefix: &Self::Prefix) -> usize {
        (**self).prefix_bytes(prefix)
    }
    fn open(&self, prefix: &str) -> Result<Self::Session> {
        (**self).open(prefix)
    }
    fn run(&self, session: &mut Self::Session, requests: &[Request]) -> Result<Vec<Response>> {
        (**self).run(session, requests)
    }
}
