//! Weight formats: GGML block bytes in, the kernels' layout out, and the scalar unpacking every
//! path is checked against.
//!
//! Layouts (one output row's units are contiguous; `unit` values per unit):
//! - **Q8_0**, interleaved by tiles of [`TILE_N`] outputs (as ggml's and candle's repacked x86
//!   kernels do): per tile and block of 32 inputs, `d: [f16; 16]`, `Σw: [i16; 16]`, then for
//!   each of 8 groups of 4 inputs, 4 bytes per output: one 64-byte load holds 4 inputs of 16
//!   outputs, and one `vpdpbusd` against 4 broadcast activations gives 16 partial sums.
//!   Missing outputs of the last tile are zero.
//! - **Q4_K** (unit 256, 148 bytes): `d: f16`, `dmin: f16`, `sc: [u8; 8]`, `m: [u8; 8]`
//!   (GGML's packed 6-bit scales unpacked), `qs: [u8; 128]` reordered so that in each half `h`
//!   byte `i` of its 64 holds value `128h + i` in the low nibble and `128h + 64 + i` in the high
//!   one (GGML interleaves by 32): one 64-byte load feeds 64 consecutive values per nibble.
//! - **Q6_K** (unit 256, 210 bytes), as GGML, whose order already suits the kernels: `ql: [u8;
//!   128]` (half `h`, byte `i`: value `128h + i` low, `128h + 64 + i` high), `qh: [u8; 64]`
//!   (half `h`, byte `i`: 2-bit highs of `128h + i + 32j` at bits `2j`), `sc: [i8; 16]`, `d: f16`.

use crate::{Error, Result};
use half::f16;

/// Outputs per Q8_0 tile.
pub const TILE_N: usize = 16;
/// Bytes per Q8_0 tile and block of 32 inputs.
pub(crate) const Q8_TILE_BLOCK: usize = 2 * TILE_N + 2 * TILE_N + 32 * TILE_N;

/// A weight type the kernels implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightType {
    /// 8-bit, blocks of 32 with an f16 scale.
    Q8_0,
    /// 4-bit k-quant: super-blocks of 256, 6-bit scales and minimums per 32.
    Q4K,
    /// 6-bit k-quant: super-blocks of 256, 8-bit scales per 16.
    Q6K,
}

impl WeightType {
    /// Values per unit.
    pub const fn unit(self) -> usize {
        match self {
            WeightType::Q8_0 => 32,
            WeightType::Q4K | WeightType::Q6K => 256,
        }
    }

    /// Bytes per unit in the kernels' layout (Q8_0: per output, averaged over a tile).
    pub const fn unit_bytes(self) -> usize {
        match self {
            WeightType::Q8_0 => Q8_TILE_BLOCK / TILE_N,
            WeightType::Q4K => 148,
            WeightType::Q6K => 210,
        }
    }

    /// Bytes per unit in GGML's layout.
    pub const fn ggml_unit_bytes(self) -> usize {
        match self {
            WeightType::Q8_0 => 34,
            WeightType::Q4K => 144,
            WeightType::Q6K => 210,
        }
    }
}

/// An `n × k` weight matrix (`n` outputs of `k` inputs) in the kernels' layout.
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    ty: WeightType,
    n: usize,
    k: usize,
    data: Vec<u8>,
}

impl PackedMatrix {
    /// Repacks GGML block bytes of `n` rows of `k` values.
    pub fn from_ggml(ty: WeightType, n: usize, k: usize, bytes: &[u8]) -> Result<Self> {
        if k % ty.unit() != 0 {
            return Err(Error::Shape(format!(
                "{ty:?} rows of {k} values are not whole units of {}",
                ty.unit()
            )));
        }
        let units = n * (k / ty.unit());
        if bytes.len() != units * ty.ggml_unit_bytes() {
            return Err(Error::Shape(format!(
                "{ty:?} {n}x{k}: expected {} bytes, got {}",
                units * ty.ggml_unit_bytes(),
                bytes.len()
            )));
        }
        let data = match ty {
            WeightType::Q8_0 => interleave_q8_0(n, k, bytes),
            WeightType::Q6K => bytes.to_vec(),
            WeightType::Q4K => {
                let mut out = Vec::with_capacity(units * ty.unit_bytes());
                for b in bytes.chunks_exact(144) {
                    repack_q4k(b, &mut out);
                }
                out
            }
        };
        Ok(Self { ty, n, k, data })
    }

    /// The weight type.
    pub fn weight_type(&self) -> WeightType {
        self.ty
    }

    /// Outputs (rows of the weight).
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Inputs (values per weight row).
    pub fn cols(&self) -> usize {
        self.k
    }

    /// Bytes of one output row (k-quants).
    fn row_bytes(&self) -> usize {
        self.k / self.ty.unit() * self.ty.unit_bytes()
    }

    /// Output row `j`'s units (k-quants).
    pub(crate) fn row(&self, j: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data[j * rb..(j + 1) * rb]
    }

    /// Q8_0 tile `t` (outputs `16t ..`): its blocks of 32 inputs.
    pub(crate) fn tile(&self, t: usize) -> &[u8] {
        let tb = self.k / 32 * Q8_TILE_BLOCK;
        &self.data[t * tb..(t + 1) * tb]
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// The f32 values (row-major `n × k`), for tests and references.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.n * self.k);
        if self.ty == WeightType::Q8_0 {
            for j in 0..self.n {
                let tile = self.tile(j / TILE_N);
                for blk in tile.chunks_exact(Q8_TILE_BLOCK) {
                    let (d, q) = q8_0_tile_column(blk, j % TILE_N);
                    out.extend(q.iter().map(|v| d * *v as f32));
                }
            }
            return out;
        }
        for u in self.data.chunks_exact(self.ty.unit_bytes()) {
            match self.ty {
                WeightType::Q8_0 => {}
                WeightType::Q4K => {
                    let (sc, mn, q) = q4k_unit(u);
                    out.extend((0..256).map(|e| sc[e / 32] * q[e] as f32 - mn[e / 32]));
                }
                WeightType::Q6K => {
                    let (sc, q) = q6k_unit(u);
                    out.extend((0..256).map(|e| sc[e / 16] * q[e] as f32));
                }
            }
        }
        out
    }
}

pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// GGML's 6-bit scale and minimum of sub-block `j` from the 12 packed bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn repack_q4k(b: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&b[0..4]);
    let packed = &b[4..16];
    let (sc, mn): (Vec<u8>, Vec<u8>) = (0..8).map(|j| scale_min_k4(j, packed)).unzip();
    out.extend_from_slice(&sc);
    out.extend_from_slice(&mn);
    let qs = &b[16..144];
    // GGML: group g of 64 values is 32 bytes, low nibble = value 64g + l, high = 64g + 32 + l.
    let value = |e: usize| -> u8 {
        let (g, r) = (e / 64, e % 64);
        let byte = qs[32 * g + r % 32];
        if r < 32 {
            byte & 0xF
        } else {
            byte >> 4
        }
    };
    for h in 0..2 {
        for i in 0..64 {
            out.push(value(128 * h + i) | (value(128 * h + 64 + i) << 4));
        }
    }
}

fn interleave_q8_0(n: usize, k: usize, bytes: &[u8]) -> Vec<u8> {
    let nb = k / 32;
    let tiles = n.div_ceil(TILE_N);
    let mut out = vec![0u8; tiles * nb * Q8_TILE_BLOCK];
    for j in 0..n {
        let (t, c) = (j / TILE_N, j % TILE_N);
        for b in 0..nb {
            let src = &bytes[34 * (j * nb + b)..34 * (j * nb + b + 1)];
            let dst = &mut out[(t * nb + b) * Q8_TILE_BLOCK..(t * nb + b + 1) * Q8_TILE_BLOCK];
            dst[2 * c..2 * c + 2].copy_from_slice(&src[0..2]);
            let sum: i16 = src[2..].iter().map(|v| *v as i8 as i16).sum();
            dst[32 + 2 * c..34 + 2 * c].copy_from_slice(&sum.to_le_bytes());
            for (e, v) in src[2..].iter().enumerate() {
                dst[64 + 64 * (e / 4) + 4 * c + e % 4] = *v;
            }
        }
    }
    out
}

/// Column `c` of a Q8_0 tile block: scale and values.
pub(crate) fn q8_0_tile_column(blk: &[u8], c: usize) -> (f32, [i8; 32]) {
    let mut q = [0i8; 32];
    for (e, o) in q.iter_mut().enumerate() {
        *o = blk[64 + 64 * (e / 4) + 4 * c + e % 4] as i8;
    }
    (f16_at(blk, 2 * c), q)
}

/// Q4_K unit: per-32 scales (`d * sc`), minimums (`dmin * m`) and the 4-bit values in order.
pub(crate) fn q4k_unit(u: &[u8]) -> ([f32; 8], [f32; 8], [u8; 256]) {
    let (d, dmin) = (f16_at(u, 0), f16_at(u, 2));
    let mut sc = [0f32; 8];
    let mut mn = [0f32; 8];
    for j in 0..8 {
        sc[j] = d * u[4 + j] as f32;
        mn[j] = dmin * u[12 + j] as f32;
    }
    let mut q = [0u8; 256];
    for h in 0..2 {
        for i in 0..64 {
            let byte = u[20 + 64 * h + i];
            q[128 * h + i] = byte & 0xF;
            q[128 * h + 64 + i] = byte >> 4;
        }
    }
    (sc, mn, q)
}

/// Q6_K unit: per-16 scales (`d * sc`) and the values minus 32.
pub(crate) fn q6k_unit(u: &[u8]) -> ([f32; 16], [i8; 256]) {
    let d = f16_at(u, 208);
    let mut sc = [0f32; 16];
    for (j, s) in sc.iter_mut().enumerate() {
        *s = d * u[192 + j] as i8 as f32;
    }
    let mut q = [0i8; 256];
    for h in 0..2 {
        for i in 0..64 {
            let l = u[64 * h + i];
            for (half, nib) in [(0, l & 0xF), (1, l >> 4)] {
                let e = 64 * half + i; // value within the half
                let hb = u[128 + 32 * h + e % 32] >> (2 * (e / 32)) & 3;
                q[128 * h + e] = ((nib | (hb << 4)) as i8) - 32;
            }
        }
    }
    (sc, q)
}
