//! The driver: checks shapes, splits output columns across the thread pool, tiles rows by up
//! to eight and hands each (row tile, column) to the chosen instruction set's kernel.

use crate::activations::QuantizedRows;
use crate::formats::{PackedMatrix, WeightType, TILE_N};
#[cfg(target_arch = "x86_64")]
use crate::{
    avx2::column as avx2_column, avx2::tile_q8_0 as avx2_tile, avx512::column as avx512_column,
    avx512::tile_q8_0 as avx512_tile,
};
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
    let (m, n, k) = (x.rows(), w.rows(), w.cols());
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
    if w.weight_type() == WeightType::Q8_0 {
        let tiles = n.div_ceil(TILE_N);
        let task = |t: usize| {
            let mut buf = [0f32; ROW_TILE * TILE_N];
            let cols = TILE_N.min(n - t * TILE_N);
            for r0 in (0..m).step_by(ROW_TILE) {
                let rows = ROW_TILE.min(m - r0);
                let b = &mut buf[..rows * TILE_N];
                tile(isa, w.tile(t), x, r0, b);
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
        return Ok(());
    }
    // Enough chunks to balance, each still a few dozen columns.
    let chunk = n.div_ceil(threads * 4).max(16);
    let task = |c: usize| {
        let cols = c * chunk..((c + 1) * chunk).min(n);
        let mut tile = [0f32; ROW_TILE];
        for r0 in (0..m).step_by(ROW_TILE) {
            let rows = ROW_TILE.min(m - r0);
            for j in cols.clone() {
                let t = &mut tile[..rows];
                column(isa, w.weight_type(), w.row(j), x, r0, t);
                for (i, v) in t.iter().enumerate() {
                    // SAFETY: (r0 + i, j) is inside the m × n output, and each column belongs
                    // to exactly one chunk, so no two tasks write the same element.
                    unsafe { *dst.get().add((r0 + i) * n + j) = *v };
                }
            }
        }
    };
    let chunks = n.div_ceil(chunk);
    if !parallel {
        (0..chunks).for_each(task);
    } else {
        (0..chunks).into_par_iter().for_each(task);
    }
    Ok(())
}

thread_local! {
    static SCRATCH: RefCell<QuantizedRows> = RefCell::new(QuantizedRows::default());
}

/// [`matmul`] on f32 activations (`m × k`, row-major): quantizes them once into a per-thread
/// buffer, then runs the kernel.
pub fn matmul_f32(w: &PackedMatrix, x: &[f32], m: usize, out: &mut [f32], isa: Isa) -> Result<()> {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut q) => {
            q.requantize(x, m, w.cols())?;
            matmul(w, &q, out, isa)
        }
        // Re-entered on this thread (a pool task stolen while waiting): a buffer of its own.
        Err(_) => matmul(w, &QuantizedRows::quantize(x, m, w.cols())?, out, isa),
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
    ($kernel:ident, $rows:expr, $($arg:expr),*) => {
        match $rows {
            1 => $kernel::<1>($($arg),*),
            2 => $kernel::<2>($($arg),*),
            3 => $kernel::<3>($($arg),*),
            4 => $kernel::<4>($($arg),*),
            5 => $kernel::<5>($($arg),*),
            6 => $kernel::<6>($($arg),*),
            7 => $kernel::<7>($($arg),*),
            _ => $kernel::<8>($($arg),*),
        }
    };
}

/// One weight row against `out.len()` (1 ..= 8) activation rows from `r0`.
fn column(isa: Isa, ty: WeightType, w: &[u8], x: &QuantizedRows, r0: usize, out: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `matmul` checked the CPU runs `isa`, and the shapes.
        Isa::Avx512Vnni => unsafe { by_rows!(avx512_column, out.len(), ty, w, x, r0, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { by_rows!(avx2_column, out.len(), ty, w, x, r0, out) },
        _ => scalar::column(ty, w, x, r0, out),
    }
}

/// One Q8_0 tile against `out.len() / 16` (1 ..= 8) activation rows from `r0`.
fn tile(isa: Isa, t: &[u8], x: &QuantizedRows, r0: usize, out: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `matmul` checked the CPU runs `isa`, and the shapes.
        Isa::Avx512Vnni => unsafe { by_rows!(avx512_tile, out.len() / TILE_N, t, x, r0, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { by_rows!(avx2_tile, out.len() / TILE_N, t, x, r0, out) },
        _ => scalar::tile_q8_0(t, x, r0, out),
    }
}
