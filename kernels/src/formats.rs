//! Weight formats: GGML block bytes in, the kernels' layout out, and the scalar unpacking every
//! path is checked against.
//!
//! Every type is interleaved by tiles of [`TILE_N`] outputs (as ggml's and candle's repacked
//! x86 kernels do): a tile's units (32 inputs for Q8_0, 256 for the k-quants) follow each
//! other, and within a unit each group of 4 inputs is 64 bytes, 4 per output, so that one
//! 64-byte load feeds one `vpdpbusd` against 4 broadcast activations and gives 16 outputs'
//! partial sums in 16 lanes. Per-output scales sit in lanes too. Missing outputs of the last
//! tile are zero. Tile units are whole 64-byte lines and the buffer is line-aligned, so every
//! 64-byte weight load is aligned.
//!
//! - **Q8_0** (576 bytes per tile unit of 32 inputs): `d: [f16; 16]`, `Σw: [i16; 16]`, then
//!   8 groups of 4 inputs × 16 outputs as signed bytes.
//! - **Q4_K** (2368 bytes per tile unit of 256): `qs`, 32 groups of 8 inputs, 64 bytes each:
//!   byte `4c + j` of group `g` holds value `8g + j` of output `c` in its low nibble and
//!   `8g + 4 + j` in its high one; then `d: [f16; 16]`, `dmin: [f16; 16]`, and GGML's packed
//!   6-bit scales and minimums unpacked, sub-block major: `sc: [[u8; 16]; 8]`,
//!   `m: [[u8; 16]; 8]`.
//! - **Q6_K** (3392 bytes per tile unit of 256): values kept unsigned (`q + 32`, 0 ..= 63):
//!   `ql`, 32 groups of 8 inputs as Q4_K's `qs` holds its nibbles (the low 4 bits); `qh`, 16
//!   groups of 16 inputs, 64 bytes each: bits `2i .. 2i + 2` of byte `4c + j` of group `s` are
//!   the high 2 bits of value `16s + 4i + j` of output `c`; then `sc: [[i8; 16]; 16]` (per 16
//!   inputs, sub-block major), `d: [f16; 16]` and 32 bytes of padding.
//! - **Q4_1** (320 bytes per tile unit of 32 inputs): `qs`, 4 groups of 8 inputs as Q4_K's;
//!   then `d: [f16; 16]` and `m: [f16; 16]`; a value is `d · q + m`.

use crate::{Error, Result};
use half::f16;

/// Outputs per tile.
pub const TILE_N: usize = 16;
/// Bytes per Q8_0 tile unit (32 inputs).
pub(crate) const Q8_TILE_BLOCK: usize = 2 * TILE_N + 2 * TILE_N + 32 * TILE_N;
/// Bytes per Q4_K tile unit (256 inputs).
pub(crate) const Q4K_TILE_UNIT: usize = 2368;
/// Q4_K tile unit offsets: `d`, `dmin`, `sc`, `m` (the 4-bit values start at 0).
pub(crate) const Q4K_D: usize = 2048;
pub(crate) const Q4K_DMIN: usize = Q4K_D + 32;
pub(crate) const Q4K_SC: usize = Q4K_DMIN + 32;
pub(crate) const Q4K_M: usize = Q4K_SC + 128;
/// Bytes per Q6_K tile unit (256 inputs).
pub(crate) const Q6K_TILE_UNIT: usize = 3392;
/// Q6_K tile unit offsets: `qh`, `sc`, `d` (the low 4 bits start at 0).
pub(crate) const Q6K_QH: usize = 2048;
pub(crate) const Q6K_SC: usize = Q6K_QH + 1024;
pub(crate) const Q6K_D: usize = Q6K_SC + 256;
/// Bytes per Q4_1 tile unit (32 inputs).
pub(crate) const Q41_TILE_UNIT: usize = 320;
/// Q4_1 tile unit offsets: `d`, `m` (the 4-bit values start at 0).
pub(crate) const Q41_D: usize = 256;
pub(crate) const Q41_M: usize = Q41_D + 32;

/// A weight type the kernels implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightType {
    /// 8-bit, blocks of 32 with an f16 scale.
    Q8_0,
    /// 4-bit k-quant: super-blocks of 256, 6-bit scales and minimums per 32.
    Q4K,
    /// 6-bit k-quant: super-blocks of 256, 8-bit scales per 16.
    Q6K,
    /// 4-bit, blocks of 32 with an f16 scale and an f16 minimum.
    Q4_1,
}

impl WeightType {
    /// Values per unit.
    pub const fn unit(self) -> usize {
        match self {
            WeightType::Q8_0 | WeightType::Q4_1 => 32,
            WeightType::Q4K | WeightType::Q6K => 256,
        }
    }

    /// Bytes per tile unit (one unit of [`TILE_N`] outputs) in the kernels' layout.
    pub(crate) const fn tile_unit_bytes(self) -> usize {
        match self {
            WeightType::Q8_0 => Q8_TILE_BLOCK,
            WeightType::Q4K => Q4K_TILE_UNIT,
            WeightType::Q6K => Q6K_TILE_UNIT,
            WeightType::Q4_1 => Q41_TILE_UNIT,
        }
    }

    /// Bytes per unit in the kernels' layout (per output, averaged over a tile).
    pub const fn unit_bytes(self) -> usize {
        self.tile_unit_bytes() / TILE_N
    }

    /// Bytes per unit in GGML's layout.
    pub const fn ggml_unit_bytes(self) -> usize {
        match self {
            WeightType::Q8_0 => 34,
            WeightType::Q4K => 144,
            WeightType::Q6K => 210,
            WeightType::Q4_1 => 20,
        }
    }
}

/// One 64-byte line: the buffer's unit of allocation, so that tiles start aligned.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// An `n × k` weight matrix (`n` outputs of `k` inputs) in the kernels' layout.
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    ty: WeightType,
    n: usize,
    k: usize,
    data: Vec<Line>,
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
        let tub = ty.tile_unit_bytes();
        debug_assert_eq!(tub % 64, 0);
        let (nb, tiles) = (k / ty.unit(), n.div_ceil(TILE_N));
        let mut m = Self {
            ty,
            n,
            k,
            data: vec![Line([0; 64]); tiles * nb * tub / 64],
        };
        let gub = ty.ggml_unit_bytes();
        let out = m.bytes_mut();
        for j in 0..n {
            let (t, c) = (j / TILE_N, j % TILE_N);
            for b in 0..nb {
                let src = &bytes[gub * (j * nb + b)..gub * (j * nb + b + 1)];
                let dst = &mut out[(t * nb + b) * tub..(t * nb + b + 1) * tub];
                match ty {
                    WeightType::Q8_0 => put_q8_0(src, dst, c),
                    WeightType::Q4K => put_q4k(src, dst, c),
                    WeightType::Q6K => put_q6k(src, dst, c),
                    WeightType::Q4_1 => put_q4_1(src, dst, c),
                }
            }
        }
        Ok(m)
    }

    /// Matrices of one weight type and input width stacked by outputs, in order. Every part
    /// but the last must hold whole tiles (outputs a multiple of [`TILE_N`]): tiles are moved
    /// as they are, so each output is computed exactly as in its own matrix.
    pub fn stack(parts: &[&PackedMatrix]) -> Result<Self> {
        let Some(first) = parts.first() else {
            return Err(Error::Shape("no matrices to stack".into()));
        };
        let (ty, k) = (first.ty, first.k);
        for (i, p) in parts.iter().enumerate() {
            if p.ty != ty || p.k != k {
                return Err(Error::Shape(format!(
                    "part {i} is {:?} {}x{}, part 0 {ty:?} with {k} inputs",
                    p.ty, p.n, p.k
                )));
            }
            if i + 1 < parts.len() && p.n % TILE_N != 0 {
                return Err(Error::Shape(format!(
                    "part {i} has {} outputs, not whole tiles of {TILE_N}",
                    p.n
                )));
            }
        }
        Ok(Self {
            ty,
            n: parts.iter().map(|p| p.n).sum(),
            k,
            data: parts.iter().flat_map(|p| p.data.iter().copied()).collect(),
        })
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

    fn raw(&self) -> &[u8] {
        // SAFETY: `Line` is 64 plain bytes without padding.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr() as *const u8, self.data.len() * 64) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `raw`.
        unsafe {
            std::slice::from_raw_parts_mut(self.data.as_mut_ptr() as *mut u8, self.data.len() * 64)
        }
    }

    /// Tile `t` (outputs `16t .. 16t + 16`): its units, each [`WeightType::tile_unit_bytes`].
    pub(crate) fn tile(&self, t: usize) -> &[u8] {
        let tb = self.k / self.ty.unit() * self.ty.tile_unit_bytes();
        &self.raw()[t * tb..(t + 1) * tb]
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 64
    }

    /// The f32 values (row-major `n × k`), for tests and references.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.n * self.k);
        let tub = self.ty.tile_unit_bytes();
        for j in 0..self.n {
            for u in self.tile(j / TILE_N).chunks_exact(tub) {
                let c = j % TILE_N;
                match self.ty {
                    WeightType::Q8_0 => {
                        let (d, q) = q8_0_tile_column(u, c);
                        out.extend(q.iter().map(|v| d * *v as f32));
                    }
                    WeightType::Q4K => {
                        let (sc, mn, q) = q4k_tile_column(u, c);
                        out.extend((0..256).map(|e| sc[e / 32] * q[e] as f32 - mn[e / 32]));
                    }
                    WeightType::Q6K => {
                        let (sc, q) = q6k_tile_column(u, c);
                        out.extend((0..256).map(|e| sc[e / 16] * (q[e] as i32 - 32) as f32));
                    }
                    WeightType::Q4_1 => {
                        let (d, m, q) = q4_1_tile_column(u, c);
                        out.extend(q.iter().map(|v| d * *v as f32 + m));
                    }
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

/// Byte of value `e` of output `c` in a group of 8 inputs × 16 outputs packed as nibbles.
fn nibble_at(e: usize, c: usize) -> (usize, u32) {
    (64 * (e / 8) + 4 * c + e % 4, 4 * (e % 8 / 4) as u32)
}

/// Byte and shift of value `e`'s high 2 bits of output `c` in a Q6_K tile unit.
fn q6k_high_at(e: usize, c: usize) -> (usize, u32) {
    (
        Q6K_QH + 64 * (e / 16) + 4 * c + e % 4,
        2 * (e % 16 / 4) as u32,
    )
}

/// GGML Q8_0 block `src` as column `c` of a tile unit.
fn put_q8_0(src: &[u8], dst: &mut [u8], c: usize) {
    dst[2 * c..2 * c + 2].copy_from_slice(&src[0..2]);
    let sum: i16 = src[2..].iter().map(|v| *v as i8 as i16).sum();
    dst[32 + 2 * c..34 + 2 * c].copy_from_slice(&sum.to_le_bytes());
    for (e, v) in src[2..].iter().enumerate() {
        dst[64 + 64 * (e / 4) + 4 * c + e % 4] = *v;
    }
}

/// Values of output `c` (a multiple of 8) into a tile unit's nibble groups from `dst[0]`
/// (the low 4 bits of each value; 64 bytes per 8 values).
fn put_nibbles(v: &[u8], dst: &mut [u8], c: usize) {
    for (g, v8) in v.chunks_exact(8).enumerate() {
        let out = &mut dst[64 * g + 4 * c..64 * g + 4 * c + 4];
        for (j, o) in out.iter_mut().enumerate() {
            *o = (v8[j] & 0xF) | (v8[4 + j] << 4);
        }
    }
}

/// GGML Q4_K block `src` as column `c` of a tile unit.
fn put_q4k(src: &[u8], dst: &mut [u8], c: usize) {
    dst[Q4K_D + 2 * c..Q4K_D + 2 * c + 2].copy_from_slice(&src[0..2]);
    dst[Q4K_DMIN + 2 * c..Q4K_DMIN + 2 * c + 2].copy_from_slice(&src[2..4]);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &src[4..16]);
        dst[Q4K_SC + 16 * j + c] = sc;
        dst[Q4K_M + 16 * j + c] = m;
    }
    // GGML: group g of 64 values is 32 bytes, low nibble = value 64g + l, high = 64g + 32 + l.
    let mut v = [0u8; 256];
    for (qs, v) in src[16..144].chunks_exact(32).zip(v.chunks_exact_mut(64)) {
        for (l, q) in qs.iter().enumerate() {
            v[l] = q & 0xF;
            v[32 + l] = q >> 4;
        }
    }
    put_nibbles(&v, dst, c);
}

/// GGML Q4_1 block `src` as column `c` of a tile unit.
fn put_q4_1(src: &[u8], dst: &mut [u8], c: usize) {
    dst[Q41_D + 2 * c..Q41_D + 2 * c + 2].copy_from_slice(&src[0..2]);
    dst[Q41_M + 2 * c..Q41_M + 2 * c + 2].copy_from_slice(&src[2..4]);
    // GGML: byte l holds value l in its low nibble and value 16 + l in its high one.
    let mut v = [0u8; 32];
    for (l, q) in src[4..20].iter().enumerate() {
        v[l] = q & 0xF;
        v[16 + l] = q >> 4;
    }
    put_nibbles(&v, dst, c);
}

/// GGML Q6_K block `src` as column `c` of a tile unit.
fn put_q6k(src: &[u8], dst: &mut [u8], c: usize) {
    dst[Q6K_D + 2 * c..Q6K_D + 2 * c + 2].copy_from_slice(&src[208..210]);
    for j in 0..16 {
        dst[Q6K_SC + 16 * j + c] = src[192 + j];
    }
    // GGML, per half h of 128 values: `ql` byte 64h + i holds value 128h + i in its low nibble
    // and 128h + 64 + i in its high one; `qh` byte 32h + i holds the high 2 bits of value
    // 128h + i + 32j at bits 2j.
    let mut v = [0u8; 256];
    for h in 0..2 {
        let (ql, qh) = (&src[64 * h..64 * h + 64], &src[128 + 32 * h..160 + 32 * h]);
        let v = &mut v[128 * h..128 * h + 128];
        for i in 0..32 {
            v[i] = (ql[i] & 0xF) | ((qh[i] & 3) << 4);
            v[32 + i] = (ql[32 + i] & 0xF) | ((qh[i] >> 2 & 3) << 4);
            v[64 + i] = (ql[i] >> 4) | ((qh[i] >> 4 & 3) << 4);
            v[96 + i] = (ql[32 + i] >> 4) | ((qh[i] >> 6) << 4);
        }
    }
    put_nibbles(&v, dst, c);
    for (s, v16) in v.chunks_exact(16).enumerate() {
        let out = &mut dst[Q6K_QH + 64 * s + 4 * c..Q6K_QH + 64 * s + 4 * c + 4];
        for (j, o) in out.iter_mut().enumerate() {
            *o = (0..4).fold(0, |b, i| b | (v16[4 * i + j] >> 4) << (2 * i));
        }
    }
}

/// Column `c` of a Q8_0 tile unit: scale and values.
pub(crate) fn q8_0_tile_column(blk: &[u8], c: usize) -> (f32, [i8; 32]) {
    let mut q = [0i8; 32];
    for (e, o) in q.iter_mut().enumerate() {
        *o = blk[64 + 64 * (e / 4) + 4 * c + e % 4] as i8;
    }
    (f16_at(blk, 2 * c), q)
}

/// Column `c` of a Q4_K tile unit: per-32 scales (`d * sc`), minimums (`dmin * m`) and the
/// 4-bit values in order.
pub(crate) fn q4k_tile_column(u: &[u8], c: usize) -> ([f32; 8], [f32; 8], [u8; 256]) {
    let (d, dmin) = (f16_at(u, Q4K_D + 2 * c), f16_at(u, Q4K_DMIN + 2 * c));
    let sc = std::array::from_fn(|j| d * u[Q4K_SC + 16 * j + c] as f32);
    let mn = std::array::from_fn(|j| dmin * u[Q4K_M + 16 * j + c] as f32);
    let q = std::array::from_fn(|e| {
        let (at, shift) = nibble_at(e, c);
        (u[at] >> shift) & 0xF
    });
    (sc, mn, q)
}

/// Column `c` of a Q4_1 tile unit: scale, minimum and the 4-bit values in order.
pub(crate) fn q4_1_tile_column(u: &[u8], c: usize) -> (f32, f32, [u8; 32]) {
    let q = std::array::from_fn(|e| {
        let (at, shift) = nibble_at(e, c);
        (u[at] >> shift) & 0xF
    });
    (f16_at(u, Q41_D + 2 * c), f16_at(u, Q41_M + 2 * c), q)
}

/// Column `c` of a Q6_K tile unit: per-16 scales (`d * sc`) and the values plus 32 (0 ..= 63).
pub(crate) fn q6k_tile_column(u: &[u8], c: usize) -> ([f32; 16], [u8; 256]) {
    let d = f16_at(u, Q6K_D + 2 * c);
    let sc = std::array::from_fn(|j| d * u[Q6K_SC + 16 * j + c] as i8 as f32);
    let q = std::array::from_fn(|e| {
        let (at, shift) = nibble_at(e, c);
        let (hat, hshift) = q6k_high_at(e, c);
        ((u[at] >> shift) & 0xF) | (((u[hat] >> hshift) & 3) << 4)
    });
    (sc, q)
}
