//! speccompact's model runtime: quantized GGUF decoders with a shared-prefix, batched KV
//! cache, greedy continuation with stop rules, tokenizers and chat templates.
//!
//! The seam for callers is [`Decoder::forward`]: B rows over one shared [`Prefix`], each with
//! its own suffix and number of new tokens, returning logits only where asked.

pub mod adapter;
pub mod cache;
pub mod chat;
pub mod config;
pub mod decoder;
pub mod device;
mod error;
pub mod generate;
pub mod linear;
pub mod lookup;
mod lora;
pub mod model;
pub mod pass;
pub mod profile;
pub mod rng;
pub mod settings;
// Tiny random-weight models for tests and benchmarks: `cfg(test)` here, feature `testing` elsewhere.
#[cfg(any(test, feature = "testing"))]
pub mod synthetic;
pub mod tokenizer;
pub mod weights;

pub use adapter::{Adapter, LoraPair};
pub use cache::{Prefix, Sequence};
pub use chat::{ChatMessage, ChatTemplate};
pub use config::{Activation, Architecture, ModelConfig, RopeStyle};
pub use decoder::{argmax, Decoder, LoadOptions, LogitsAt, Pass, Row};
pub use device::{parse_device, set_threads, threads};
pub use error::{Error, Result};
pub use generate::{
    greedy, greedy_rows, greedy_rows_gated, Continuation, LineMask, LineVerdict, StopReason,
    StopRules, TokenScore,
};
pub use linear::{kernel_isa, DenseDecision, DenseMode, KernelMode};
pub use lookup::{Lookup, LookupCounters, LookupMode};
pub use model::{read_gguf, Model};
pub use settings::{DenseChoice, RuntimeSettings, DEFAULT_RUNTIME};
pub use tokenizer::Tokenizer;
