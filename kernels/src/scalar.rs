//! Portable kernels: the reference every SIMD path is tested against. Integer dot products
//! per scale group, then one f32 multiply-add per group, per row.

use crate::activations::QuantizedRows;
use crate::formats::{
    q4_1_tile_column, q4k_tile_column, q6k_tile_column, q8_0_tile_column, WeightType, TILE_N,
};

fn idot<A: Copy + Into<i32>>(w: &[A], a: &[i8]) -> i32 {
    w.iter().zip(a).map(|(w, a)| (*w).into() * *a as i32).sum()
}

/// Outputs of one tile (16 weight rows) for rows `r0 .. r0 + out.len() / 16` of `x` (`out`
/// row-major, 16 per row).
pub(crate) fn tile(ty: WeightType, tile: &[u8], x: &QuantizedRows, r0: usize, out: &mut [f32]) {
    out.fill(0.0);
    let rows: Vec<_> = (0..out.len() / TILE_N).map(|i| x.row(r0 + i)).collect();
    for (u, unit) in tile.chunks_exact(ty.tile_unit_bytes()).enumerate() {
        for c in 0..TILE_N {
            let outs = out.chunks_exact_mut(TILE_N).map(|o| &mut o[c]);
            match ty {
                WeightType::Q8_0 => {
                    let (d, q) = q8_0_tile_column(unit, c);
                    for (o, (a, da, _)) in outs.zip(&rows) {
                        *o += d * da[u] * idot(&q, &a[32 * u..32 * u + 32]) as f32;
                    }
                }
                WeightType::Q4_1 => {
                    let (d, m, q) = q4_1_tile_column(unit, c);
                    for (o, (a, da, asum)) in outs.zip(&rows) {
                        *o += d * da[u] * idot(&q, &a[32 * u..32 * u + 32]) as f32 + m * asum[u];
                    }
                }
                WeightType::Q4K => {
                    let (sc, mn, q) = q4k_tile_column(unit, c);
                    for (o, (a, da, asum)) in outs.zip(&rows) {
                        let a = &a[256 * u..256 * u + 256];
                        for j in 0..8 {
                            let s = idot(&q[32 * j..32 * j + 32], &a[32 * j..32 * j + 32]);
                            *o += sc[j] * da[8 * u + j] * s as f32 - mn[j] * asum[8 * u + j];
                        }
                    }
                }
                WeightType::Q6K => {
                    let (sc, q) = q6k_tile_column(unit, c);
                    for (o, (a, da, _)) in outs.zip(&rows) {
                        let a = &a[256 * u..256 * u + 256];
                        for g in 0..16 {
                            let s: i32 = q[16 * g..16 * g + 16]
                                .iter()
                                .zip(&a[16 * g..16 * g + 16])
                                .map(|(w, a)| (*w as i32 - 32) * *a as i32)
                                .sum();
                            *o += sc[g] * da[8 * u + g / 2] * s as f32;
                        }
                    }
                }
            }
        }
    }
}
