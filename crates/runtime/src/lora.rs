//! The LoRA side path of one projection, `s · B (A x)`, added to the base projection `W x`
//! of a quantized weight (which cannot take the adapter into its bits). On the CPU every
//! row is computed alone in a fixed order, so a row's result does not depend on the rows
//! that share the forward: step forwards stay batch-invariant with an adapter.

use crate::{Error, Result};
use candle_core::{DType, Tensor};
use rayon::prelude::*;

/// Rows from which the CPU side path splits its rows across the thread pool (each row is
/// computed alike wherever it runs).
const PARALLEL_ROWS: usize = 2;

/// `A` (`[r, in]`), `B` (`[out, r]`) and the factor `s` of one adapted projection.
#[derive(Debug)]
pub(crate) struct SidePath {
    a: Tensor,
    b: Tensor,
    /// Row-major `A` and `Bᵀ` (`[r, out]`) for the CPU loop.
    a_rows: Vec<f32>,
    b_cols: Vec<f32>,
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
            b_cols: rows(&b.t().map_err(err)?.contiguous().map_err(err)?).map_err(err)?,
            a: a.to_dtype(DType::F32).map_err(err)?,
            b: b.to_dtype(DType::F32).map_err(err)?,
            inputs,
            outputs,
            scale,
        })
    }

    /// `s · B A` (`[out, in]`), what merging adds to a dense weight.
    pub(crate) fn delta(&self) -> Result<Tensor> {
        Ok((self.b.matmul(&self.a)? * f64::from(self.scale))?)
    }

    /// `y + s · B (A x)` for `x` of shape `(.., in)` and `y` of shape `(.., out)`.
    pub(crate) fn add_to(&self, x: &Tensor, y: Tensor) -> Result<Tensor> {
        let (xd, yd) = (x.dims(), y.dims().to_vec());
        let fits = xd.last() == Some(&self.inputs)
            && yd.last() == Some(&self.outputs)
            && xd[..xd.len() - 1] == yd[..yd.len() - 1];
        if !fits {
            return Err(Error::InvalidRequest(format!(
                "adapter side path of {} inputs and {} outputs given {xd:?} and {yd:?}",
                self.inputs, self.outputs
            )));
        }
        if !x.device().is_cpu() {
            let x2 = x.reshape(((), self.inputs))?;
            let d = (x2.matmul(&self.a.t()?)?.matmul(&self.b.t()?)? * f64::from(self.scale))?;
            return Ok((y + d.reshape(yd)?)?);
        }
        let dims = yd;
        let data = x.flatten_all()?.to_vec1::<f32>()?;
        let mut out = y.flatten_all()?.to_vec1::<f32>()?;
        // Per row: each of the r products `s · (A_j · x)`, then `Bᵀ` row j added to the
        // outputs in rank order (an axpy, which vectorizes without horizontal sums).
        let row = |(xr, yr): (&[f32], &mut [f32])| {
            for (j, col) in self.b_cols.chunks_exact(self.outputs).enumerate() {
                let aj = &self.a_rows[j * self.inputs..(j + 1) * self.inputs];
                let c = self.scale * dot(xr, aj);
                for (y, &w) in yr.iter_mut().zip(col) {
                    *y += c * w;
                }
            }
        };
        if data.len() / self.inputs >= PARALLEL_ROWS {
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

    /// `y + s · B (A x)` equals candle's matmuls within 1e-4, and a row's result is bitwise
    /// the same alone and among 40 rows (split across the thread pool).
    #[test]
    fn side_path_matches_matmul_and_is_row_invariant() {
        let (a, b) = (rand((8, 72), 1), rand((40, 8), 2));
        let s = SidePath::new(&a, &b, 2.0, 40, 72).unwrap();
        let x = rand((40, 72), 3);
        let y = rand((40, 40), 4);
        let ours = s.add_to(&x, y.clone()).unwrap();
        let reference = (&y
            + (x.matmul(&a.t().unwrap())
                .unwrap()
                .matmul(&b.t().unwrap())
                .unwrap()
                * 2.0)
                .unwrap())
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
            let one = |t: &Tensor| t.narrow(0, r, 1).unwrap();
            let alone = s.add_to(&one(&x), one(&y)).unwrap();
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
