//! A small seeded generator (xorshift64): random test weights, LoRA initialisation and
//! shuffles, the same numbers for a seed on every machine.

use crate::Result;
use candle_core::{Device, Tensor};

/// A seeded xorshift64 generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, zero included).
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    pub fn next_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// A CPU tensor of `shape` with elements `offset + scale · u`, `u` uniform in [-1, 1).
    pub fn tensor(&mut self, shape: &[usize], scale: f32, offset: f32) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| offset + scale * self.next_f32()).collect();
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
    }
}
