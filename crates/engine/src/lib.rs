//! speccompact's compaction engine.
//!
//! An agent history becomes a six-slot summary. In the `speculative` method a small drafter
//! proposes each slot's lines, a large target judges every line with one next-token
//! distribution over a cache in which the history and the whole schema are prefilled once, and
//! the target rewrites the lines it rejects. The baselines (`sequential`, `target-self`,
//! `drafter-only`) run in the same engine with the same rendering and budgets.
//!
//! Modules: `config` (settings and slot schema), `calibration` (the calibrated η, judgment
//! prompt and line rule applied per target), `prompt` (chat framing and the texts every model
//! sees), `backend` (the [`Backend`] seam: batched generation and scoring after a shared
//! prefix), `model_backend` (the runtime behind it), `scripted` (a backend whose outputs a test
//! chooses), `judge` (label scoring), `verify` (line scores and rules), `lines` (line checks),
//! `job` (one run's shared state), `methods` (speculative, exact, baselines), `session_cache`
//! (prefixes kept across compactions), `compactor` (the public API; stages and the drafter's
//! slot views in `compactor/long_history.rs`) and `outcome` (the result types).

pub mod backend;
pub mod calibration;
pub mod chat_format;
pub mod compactor;
pub mod config;
mod error;
mod job;
pub mod judge;
pub mod lines;
mod methods;
pub mod model_backend;
pub mod outcome;
pub mod prompt;
pub mod scripted;
pub mod session_cache;
pub mod verify;

pub use backend::{
    Backend, FinishReason, Generated, LineGate, LineRules, Prefilled, Request, RequestKind,
    Response, Speculated, Verified,
};
pub use chat_format::ChatFormat;
pub use compactor::Compactor;
pub use config::{CompactionConfig, DrafterView, Overflow, Overlap, Prompts, SlotSpec};
pub use error::{Error, Result};
pub use judge::{score, Judgment};
pub use model_backend::ModelBackend;
pub use outcome::{
    markdown, sections, Compaction, Event, Judged, LineOut, Method, Origin, SlotOut, SlotStop,
    Stage, Trace,
};
pub use scripted::Scripted;
