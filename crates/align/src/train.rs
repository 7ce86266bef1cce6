//! LoRA training of the drafter on candle's autograd: the dense model with side paths
//! ([`model`]), loss and gradients a block at a time ([`checkpointed`]), the optimizer and
//! schedule ([`optim`]), and the run over the data with checkpoints ([`run`]).

pub mod checkpointed;
pub mod model;
pub mod optim;
pub mod run;
pub mod softmax;

pub use model::{DenseModel, FrozenLinear, Lora};
pub use run::{read_tokens, train, Progress, TokenExample, TrainOptions, TrainState};
