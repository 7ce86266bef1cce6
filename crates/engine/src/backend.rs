//! The seam between the compaction algorithms and a model: open a session by prefilling one
//! shared prefix, then run batches of requests after it. Each request names a stream (one per
//! slot); a backend keeps each stream's cache and reuses the longest common prefix of
//! consecutive requests on the same stream.

use crate::prompt::ChatFormat;
use crate::Result;
use speccompact_runtime::StopReason;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// One forward: the `top_k` most likely next tokens with their probabilities.
    Judge {
        /// Candidates returned.
        top_k: usize,
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
}

/// Output of a generation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// Generated text (without the stop token; cut at the newline when asked).
    pub text: String,
    /// Tokens generated, including one that stopped the row.
    pub tokens: usize,
    /// Why it ended.
    pub reason: StopReason,
}

/// Output of one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// Next-token candidates, most likely first: (token text, probability).
    Judged(Vec<(String, f32)>),
    /// Generated text.
    Generated(Generated),
}

/// A model behind the compaction algorithms.
pub trait Backend: Send + Sync {
    /// Per-compaction state: the prefilled prefix and the streams' caches.
    type Session: Send;

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
    /// Prefills the shared prefix and starts a session.
    fn open(&self, prefix: &str) -> Result<Self::Session>;
    /// Runs requests as one batch (one forward per step for all rows still going);
    /// responses are in request order.
    fn run(&self, session: &mut Self::Session, requests: &[Request]) -> Result<Vec<Response>>;
}

/// A shared backend is a backend (tests keep a handle to count calls; servers share models).
impl<B: Backend> Backend for std::sync::Arc<B> {
    type Session = B::Session;

    fn name(&self) -> &str {
        (**self).name()
    }
    fn format(&self) -> &ChatFormat {
        (**self).format()
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
    fn open(&self, prefix: &str) -> Result<Self::Session> {
        (**self).open(prefix)
    }
    fn run(&self, session: &mut Self::Session, requests: &[Request]) -> Result<Vec<Response>> {
        (**self).run(session, requests)
    }
}
