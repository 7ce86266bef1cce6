//! CPU matmul kernels for quantized projection weights.
//!
//! The shape of the work follows ggml's CPU backend: activations are quantized **once per
//! forward** into int8 blocks of 32 ([`QuantizedRows`]), weights are repacked at load into
//! the layout the kernels read ([`PackedMatrix`]), and [`matmul`] tiles rows × columns so each
//! weight block is loaded once for a tile of up to eight rows. A six-row decode step therefore
//! streams the weights once, as a one-row step does.
//!
//! Each instruction set has its own module ([`Isa`]): AVX-512 VNNI, AVX2 and a scalar path
//! that is also the reference the others are tested against. The best available one is
//! detected at run time; any available one can be forced.

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod error;
mod formats;
mod isa;
mod matmul;
mod prefetch;
mod scalar;

pub use activations::{QuantizedRows, ACT_BLOCK};
pub use error::{Error, Result};
pub use formats::{PackedMatrix, WeightType};
pub use isa::Isa;
pub use matmul::{matmul, matmul_f32, matmul_f32_outputs, matmul_outputs};
