//! The LoRA side path of one projection, `s · B (A x)`, added to the base projection `W x`
//! of a quantized weight (which cannot take the adapter into its bits). On the CPU every
//! row is computed alone in a fixed order, so a row's result does not depend on the rows
//! that share the forward: step forwards stay batch-invariant with an adapter.

use crate::{Error, Result};
use candle_core::{DType, Tensor};
use rayon::prelude::*;

/// Rows from which the CPU side path runs its rows in parallel.
const PARALLEL_ROWS: usize = 16;

/// `A` (`[r, in]`), `B` (`[out, r]`) and the factor `s` of one adapted projection.
#[derive(Debug)]
pub(crate) struct SidePath {
    a: Tensor,
    b: Tensor,
    /// Row-major copies of `a` and `b` for the CPU loop.
    a_rows: Vec<f32>,
    b_rows: Vec<f32>,
    rank: usize,
    inputs: usize,
    outputs: usize,
    scale: f32,
}

/// A dot product with eight accumulators in a fixed order (the compiler vectorizes it).
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail: f32 = xc
        .remainder()
        .iter()
        .zip(yc.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in xc.zip(yc) {
        for l in 0..8 {
            acc[l] += a[l] * b[l];
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

impl SidePath {
    /// The side path of `a` (`[r, in]`) and `b` (`[out, r]`) for a weight of `outputs` rows
    /// and `inputs` columns; a shape that does not fit is named in the error.
    pub(crate) fn new(
        a: &Tensor,
        b: &Tensor,
        scale: f32,
        outputs: usize,
        inputs: usize,
    ) -> std::result::Result<Self, String> {
        let shape = |t: &Tensor| t.dims2().map_err(|e| e.to_string());
        let ((ra, ia), (ob, rb)) = (shape(a)?, shape(b)?);
        if ia != inputs || ob != outputs || ra != rb || ra == 0 {
            return Err(format!(
                "lora_A {:?} and lora_B {:?} do not fit a weight of {outputs} outputs and \
                 {inputs} inputs",
                a.dims(),
                b.dims()
            ));
        }
        let rows = |t: &Tensor| -> candle_core::Result<Vec<f32>> {
            t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()
        };
        let err = |e: candle_core::Error| e.to_string();
        Ok(Self {
            a_rows: rows(a).map_err(err)?,
            b_rows: rows(b).map_err(err)?,
            a: a.to_dtype(DType::F32).map_err(err)?,
            b: b.to_dtype(DType::F32).map_err(err)?,
            rank: ra,
            inputs,
            outputs,
            scale,
        })
    }

    /// `s · B A` (`[out, in]`), what merging adds to a dense weight.
    pub(crate) fn delta(&self) -> Result<Tensor> {
        Ok((self.b.matmul(&self.a)? * f64::from(self.scale))?)
    }

    /// `s · B (A x)` for `x` of shape `(.., in)`: shape `(.., out)`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut dims = x.dims().to_vec();
        let last = dims.len() - 1;
        if dims[last] != self.inputs {
            return Err(Error::InvalidRequest(format!(
                "adapter side path takes {} inputs, got {:?}",
                self.inputs,
                x.dims()
            )));
        }
        dims[last] = self.outputs;
        if !x.device().is_cpu() {
            let x2 = x.reshape(((), self.inputs))?;
            let y = (x2.matmul(&self.a.t()?)?.matmul(&self.b.t()?)? * f64::from(self.scale))?;
            return Ok(y.reshape(dims)?);
        }
        let data = x.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let rows = data.len() / self.inputs;
        let mut out = vec![0f32; rows * self.outputs];
        let row = |(xr, yr): (&[f32], &mut [f32])| {
            let mut ax = vec![0f32; self.rank];
            for (j, v) in ax.iter_mut().enumerate() {
                *v = dot(xr, &self.a_rows[j * self.inputs..(j + 1) * self.inputs]);
            }
            for (o, y) in yr.iter_mut().enumerate() {
                *y = self.scale * dot(&ax, &self.b_rows[o * self.rank..(o + 1) * self.rank]);
            }
        };
        if rows >= PARALLEL_ROWS {
            data.par_chunks(self.inputs)
                .zip(out.par_chunks_mut(self.outputs))
                .for_each(row);
        } else {
            data.chunks(self.inputs)
                .zip(out.chunks_mut(self.outputs))
                .for_each(row);
        }
        Ok(Tensor::from_vec(out, dims, x.device())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(shape: (usize, usize), seed: u64) -> Tensor {
        crate::synthetic::Rng::new(seed)
            .tensor(&[shape.0, shape.1], 1.0, 0.0)
            .unwrap()
    }

    /// The loop equals candle's matmuls within 1e-5, and a row's result is bitwise the same
    /// alone and among 40 rows (the parallel path).
    #[test]
    fn side_path_matches_matmul_and_is_row_invariant() {
        let (a, b) = (rand((8, 72), 1), rand((40, 8), 2));
        let s = SidePath::new(&a, &b, 2.0, 40, 72).unwrap();
        let x = rand((40, 72), 3);
        let ours = s.forward(&x).unwrap();
        let reference = (x
            .matmul(&a.t().unwrap())
            .unwrap()
            .matmul(&b.t().unwrap())
            .unwrap()
            * 2.0)
            .unwrap();
        let diff: f32 = (&ours - &reference)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!(diff < 1e-4, "{diff}");
        for r in [0, 17, 39] {
            let alone = s.forward(&x.narrow(0, r, 1).unwrap()).unwrap();
            assert_eq!(
                alone.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                ours.get(r).unwrap().to_vec1::<f32>().unwrap(),
                "row {r}"
            );
        }
        let delta = s.delta().unwrap();
        assert_eq!(delta.dims(), &[40, 72]);
        assert!(SidePath::new(&a, &b, 2.0, 40, 64)
            .unwrap_err()
            .contains("64 inputs"));
    }
}
