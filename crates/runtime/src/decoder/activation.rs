//! The gated feed-forward activation, `silu(gate) × up`, in one pass over the rows.
//!
//! On CPU f32 tensors each element is `g / (1 + e^-g) × u`: candle's `silu` followed by its
//! elementwise product, the same operations on the same values (so bitwise the same), without
//! the intermediate tensor and split across the thread pool. Other devices and types take
//! candle's two operations.

use crate::Result;
use candle_core::{CpuStorage, Storage, Tensor};
use rayon::prelude::*;

/// Elements per parallel task (below this the pool is not worth waking).
const CHUNK: usize = 2048;

/// `silu(gate) * up` for tensors of one shape.
pub(super) fn silu_times(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if let Some(out) = fused(gate, up) {
        return Ok(Tensor::from_vec(out, gate.shape(), gate.device())?);
    }
    Ok((candle_nn::ops::silu(gate)? * up)?)
}

/// The fused pass, where both are contiguous f32 on CPU with the same shape.
fn fused(gate: &Tensor, up: &Tensor) -> Option<Vec<f32>> {
    if gate.shape() != up.shape() {
        return None;
    }
    let (gs, gl) = gate.storage_and_layout();
    let (us, ul) = up.storage_and_layout();
    let (Storage::Cpu(CpuStorage::F32(g)), Storage::Cpu(CpuStorage::F32(u))) = (&*gs, &*us) else {
        return None;
    };
    let n = gate.elem_count();
    let g = gl.contiguous_offsets().map(|(a, b)| &g[a..b])?;
    let u = ul.contiguous_offsets().map(|(a, b)| &u[a..b])?;
    if g.len() != n || u.len() != n {
        return None;
    }
    let mut out = vec![0f32; n];
    let size = n.div_ceil(rayon::current_num_threads().max(1)).max(CHUNK);
    out.par_chunks_mut(size)
        .zip(g.par_chunks(size).zip(u.par_chunks(size)))
        .for_each(|(o, (g, u))| {
            for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                *o = g / (1.0 + (-g).exp()) * u;
            }
        });
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The fused pass is bitwise candle's `silu` and product, for one row and for many (a
    /// split across tasks), and a non-contiguous input takes candle's path.
    #[test]
    fn fused_is_bitwise_silu_then_product() -> Result<()> {
        let dev = Device::Cpu;
        for n in [1usize, 37, 8960 * 6] {
            let g: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 97.0)
                .collect();
            let u: Vec<f32> = (0..n)
                .map(|i| ((i * 104_729 % 1009) as f32 - 504.0) / 31.0)
                .collect();
            let (gt, ut) = (Tensor::from_vec(g, n, &dev)?, Tensor::from_vec(u, n, &dev)?);
            let want = (candle_nn::ops::silu(&gt)? * &ut)?.to_vec1::<f32>()?;
            let got = silu_times(&gt, &ut)?.to_vec1::<f32>()?;
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{n} elements");
        }
        let g = Tensor::arange(0f32, 12.0, &dev)?.reshape((3, 4))?.t()?;
        let u = Tensor::ones((4, 3), candle_core::DType::F32, &dev)?;
        let want = (candle_nn::ops::silu(&g)? * &u)?;
        let got = silu_times(&g, &u)?;
        assert_eq!(got.to_vec2::<f32>()?, want.to_vec2::<f32>()?);
        Ok(())
    }
}
