//! Portable kernels: the reference every SIMD path is tested against. Integer dot products
//! per scale group, then one f32 multiply-add per group, per row.

use crate::activations::QuantizedRows;
use crate::formats::{q4k_unit, q6k_unit, q8_0_tile_column, WeightType, Q8_TILE_BLOCK, TILE_N};

fn idot<A: Copy + Into<i32>>(w: &[A], a: &[i8]) -> i32 {
    w.iter().zip(a).map(|(w, a)| (*w).into() * *a as i32).sum()
}

/// Outputs of one weight row `w` for rows `r0 .. r0 + out.len()` of `x`.
pub(crate) fn column(ty: WeightType, w: &[u8], x: &QuantizedRows, r0: usize, out: &mut [f32]) {
    let rows: Vec<_> = (0..out.len()).map(|i| x.row(r0 + i)).collect();
    out.fill(0.0);
    for (u, unit) in w.chunks_exact(ty.unit_bytes()).enumerate() {
        match ty {
            // Q8_0 goes through `tile_q8_0`.
            WeightType::Q8_0 => {}
            WeightType::Q4K => {
                let (sc, mn, q) = q4k_unit(unit);
                for (o, (a, da, asum)) in out.iter_mut().zip(&rows) {
                    let a = &a[256 * u..256 * u + 256];
                    for j in 0..8 {
                        let s = idot(&q[32 * j..32 * j + 32], &a[32 * j..32 * j + 32]);
                        *o += sc[j] * da[8 * u + j] * s as f32 - mn[j] * asum[8 * u + j];
                    }
                }
            }
            WeightType::Q6K => {
                let (sc, q) = q6k_unit(unit);
                for (o, (a, da, _)) in out.iter_mut().zip(&rows) {
                    let a = &a[256 * u..256 * u + 256];
                    for g in 0..16 {
                        let s = idot(&q[16 * g..16 * g + 16], &a[16 * g..16 * g + 16]);
                        *o += sc[g] * da[8 * u + g / 2] * s as f32;
                    }
                }
            }
        }
    }
}

/// Outputs of one Q8_0 tile (16 weight rows) for rows `r0 .. r0 + out.len() / 16` of `x`
/// (`out` row-major, 16 per row).
pub(crate) fn tile_q8_0(tile: &[u8], x: &QuantizedRows, r0: usize, out: &mut [f32]) {
    out.fill(0.0);
    for (b, blk) in tile.chunks_exact(Q8_TILE_BLOCK).enumerate() {
        for c in 0..TILE_N {
            let (d, q) = q8_0_tile_column(blk, c);
            for (i, o) in out.chunks_exact_mut(TILE_N).enumerate() {
                let (a, da, _) = x.row(r0 + i);
                o[c] += d * da[b] * idot(&q, &a[32 * b..32 * b + 32]) as f32;
            }
        }
    }
}
