//! The driver: checks shapes, splits tiles of 16 outputs across the thread pool, tiles rows by
//! up to eight and hands each (row tile, output tile) to the chosen instruction set's kernel.

use crate::activations::QuantizedRows;
use crate::formats::{PackedMatrix, WeightType, TILE_N};
#[cfg(target_arch = "x86_64")]
use crate::{avx2, avx512};
use crate::{scalar, Error, Isa, Result};
use rayon::prelude::*;
use std::cell::RefCell;

/// Rows computed together against one decoded weight block.
const ROW_TILE: usize = 8;

/// Multiply-adds below which the pool's hand-off costs more than a second thread saves.
const PARALLEL_MIN: usize = 1 << 19;

/// `out[r][j] = Σ_i x[r][i] · w[j][i]` for the `m` quantized rows of `x` (`out` is `m × n`,
/// row-major), on instruction set `isa`.
pub fn matmul(w: &PackedMatrix, x: &QuantizedRows, out: &mut [f32], isa: Isa) -> Result<()> {
    matmul_outputs(w, x, 0..w.rows(), out, isa)
}

/// [`matmul`] for outputs `outputs` of `w` only (`out` is `m × outputs.len()`): the range
/// must start on a tile boundary and end on one or at `w.rows()`. Each output is computed
/// as [`matmul`] computes it.
pub fn matmul_outputs(
    w: &PackedMatrix,
    x: &QuantizedRows,
    outputs: std::ops::Range<usize>,
    out: &mut [f32],
    isa: Isa,
) -> Result<()> {
    if outputs.start % TILE_N != 0
        || outputs.end > w.rows()
        || outputs.start > outputs.end
        || (outputs.end % TILE_N != 0 && outputs.end != w.rows())
    {
        return Err(Error::Shape(format!(
            "outputs {outputs:?} of {} are not whole tiles of {TILE_N}",
            w.rows()
        )));
    }
    let first = outputs.start / TILE_N;
    let (m, n, k) = (x.rows(), outputs.len(), w.cols());
    if x.cols() != k {
        return Err(Error::Shape(format!(
            "activations have {} values per row, weights {k}",
            x.cols()
        )));
    }
    if out.len() != m * n {
        return Err(Error::Shape(format!(
            "output holds {} values, {m} x {n} needed",
            out.len()
        )));
    }
    if !isa.available() {
        return Err(Error::Unavailable(isa));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let threads = rayon::current_num_threads().max(1);
    let parallel = threads > 1 && m * n * k >= PARALLEL_MIN;
    let dst = SyncPtr(out.as_mut_ptr());
    let ty = w.weight_type();
    let tiles = n.div_ceil(TILE_N);
    let task = |t: usize| {
        let mut buf = [0f32; ROW_TILE * TILE_N];
        let cols = TILE_N.min(n - t * TILE_N);
        for r0 in (0..m).step_by(ROW_TILE) {
            let rows = ROW_TILE.min(m - r0);
            let b = &mut buf[..rows * TILE_N];
            tile(isa, ty, w.tile(first + t), x, r0, b);
            for (i, vals) in b.chunks_exact(TILE_N).enumerate() {
                for (c, v) in vals[..cols].iter().enumerate() {
                    // SAFETY: inside the m × n output; each tile is one task's.
                    unsafe { *dst.get().add((r0 + i) * n + t * TILE_N + c) = *v };
                }
            }
        }
    };
    if parallel {
        (0..tiles).into_par_iter().for_each(task);
    } else {
        (0..tiles).for_each(task);
    }
    Ok(())
}

thread_local! {
    static SCRATCH: RefCell<QuantizedRows> = RefCell::new(QuantizedRows::default());
}

/// [`matmul`] on f32 activations (`m × k`, row-major): quantizes them once into a per-thread
/// buffer, then runs the kernel.
pub fn matmul_f32(w: &PackedMatrix, x: &[f32], m: usize, out: &mut [f32], isa: Isa) -> Result<()> {
    matmul_f32_outputs(w, x, m, 0..w.rows(), out, isa)
}

/// [`matmul_outputs`] on f32 activations, as [`matmul_f32`].
pub fn matmul_f32_outputs(
    w: &PackedMatrix,
    x: &[f32],
    m: usize,
    outputs: std::ops::Range<usize>,
    out: &mut [f32],
    isa: Isa,
) -> Result<()> {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut q) => {
            q.requantize(x, m, w.cols())?;
            matmul_outputs(w, &q, outputs, out, isa)
        }
        // Re-entered on this thread (a pool task stolen while waiting): a buffer of its own.
        Err(_) => matmul_outputs(
            w,
            &QuantizedRows::quantize(x, m, w.cols())?,
            outputs,
            out,
            isa,
        ),
    })
}

#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: tasks write disjoint elements (see `matmul`).
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}
impl SyncPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

macro_rules! by_rows {
    ($($kernel:ident)::+, $rows:expr, $($arg:expr),*) => {
        match $rows {
            1 => $($kernel)::+::<1>($($arg),*),
            2 => $($kernel)::+::<2>($($arg),*),
            3 => $($kernel)::+::<3>($($arg),*),
            4 => $($kernel)::+::<4>($($arg),*),
            5 => $($kernel)::+::<5>($($arg),*),
            6 => $($kernel)::+::<6>($($arg),*),
            7 => $($kernel)::+::<7>($($arg),*),
            _ => $($kernel)::+::<8>($($arg),*),
        }
    };
}

/// One tile of `ty` against `out.len() / 16` (1 ..= 8) activation rows from `r0`.
fn tile(isa: Isa, ty: WeightType, t: &[u8], x: &QuantizedRows, r0: usize, out: &mut [f32]) {
    let rows = out.len() / TILE_N;
    match (isa, ty) {
        // SAFETY (every arm): `matmul` checked the CPU runs `isa`, and the shapes.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni, WeightType::Q8_0) => unsafe {
            by_rows!(avx512::tile_q8_0, rows, t, x, r0, out)
        },
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni, WeightType::Q4K) => unsafe {
            by_rows!(avx512::tile_q4k, rows, t, x, r0, out)
        },
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni, WeightType::Q6K) => unsafe {
            by_rows!(avx512::tile_q6k, rows, t, x, r0, out)
        },
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni, WeightType::Q4_1) => unsafe {
            by_rows!(avx512::tile_q4_1, rows, t, x, r0, out)
        },
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WeightType::Q4_1) => unsafe { by_rows!(avx2::tile_q4_1, rows, t, x, r0, out) },
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WeightType::Q8_0) => unsafe { by_rows!(avx2::tile_q8_0, rows, t, x, r0, out) },
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WeightType::Q4K) => unsafe { by_rows!(avx2::tile_q4k, rows, t, x, r0, out) },
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WeightType::Q6K) => unsafe { by_rows!(avx2::tile_q6k, rows, t, x, r0, out) },
        _ => scalar::tile(ty, t, x, r0, out),
    }
}
