//! Projection weights: quantized for decode, optionally a dense f32 copy for many-token
//! forwards, and the load-time conversion of quant types that have no fast kernel.

use crate::weights::Weight;
use crate::Result;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Module, Tensor};
use std::sync::Arc;

/// When to keep a dequantized copy of projection weights for many-token forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenseMode {
    /// Quantized weights only (least memory).
    #[default]
    Off,
    /// Keep an f32 copy; forwards with at least `min_rows` tokens use it.
    On {
        /// Token count from which the dense copy is used.
        min_rows: usize,
    },
    /// Decide at load by measurement: time the first MLP's up and down projections both ways at
    /// `min_rows`, 4x and 16x as many rows; dense copies are kept, used from the smallest of
    /// those row counts at which they are at least 15 % faster, if any is and they fit in a
    /// quarter of the available memory.
    Auto {
        /// Smallest row count probed.
        min_rows: usize,
    },
}

/// The outcome of [`DenseMode::Auto`] (or the fixed choice) for one loaded model.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseDecision {
    /// Whether dense copies are kept.
    pub dense: bool,
    /// Forwards of at least this many tokens use them.
    pub min_rows: usize,
    /// Probe results: (rows, quantized ms, dense ms); empty when not measured.
    pub probes: Vec<(usize, f64, f64)>,
    /// Bytes the dense copies take (or would take).
    pub bytes: usize,
}

/// Times `rows` tokens through quantized weights and their dense copies (one warm-up, then
/// best of 3 each), summed over the weights, in ms.
pub fn probe_dense(weights: &[Arc<QTensor>], rows: usize) -> Result<(f64, f64)> {
    let (mut qt, mut dt) = (0.0, 0.0);
    for q in weights {
        let (a, b) = probe_one(q, rows)?;
        qt += a;
        dt += b;
    }
    Ok((qt, dt))
}

fn probe_one(q: &Arc<QTensor>, rows: usize) -> Result<(f64, f64)> {
    let (_, cols) = q.shape().dims2()?;
    let x = Tensor::randn(0f32, 1.0, (rows, cols), &q.device())?;
    let quant = QMatMul::from_arc(q.clone())?;
    let dense = q.dequantize(&q.device())?;
    let best = |f: &dyn Fn() -> Result<Tensor>| -> Result<f64> {
        f()?;
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            f()?;
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(best)
    };
    let qm = best(&|| Ok(quant.forward(&x)?))?;
    let dm = best(&|| Ok(x.matmul(&dense.t()?)?))?;
    Ok((qm, dm))
}

/// Bytes of memory the OS reports as available (Linux `MemAvailable`), if known.
pub fn available_memory() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Quant types whose CPU matmul has no SIMD kernel in candle; they are requantized to Q8_0
/// at load (SmolLM2 Q4_1 decodes 50x faster as Q8_0 on AVX-512 machines).
pub fn needs_conversion(dtype: GgmlDType) -> bool {
    matches!(
        dtype,
        GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q8_1
    )
}

/// Requantizes a slow quant type to Q8_0 when its rows allow it; returns the input otherwise.
pub fn convert_slow(q: Arc<QTensor>) -> Result<Arc<QTensor>> {
    let dims = q.shape().dims();
    let cols = dims.last().copied().unwrap_or(0);
    if !needs_conversion(q.dtype()) || cols % GgmlDType::Q8_0.block_size() != 0 {
        return Ok(q);
    }
    let dense = q.dequantize(&q.device())?;
    Ok(Arc::new(QTensor::quantize(&dense, GgmlDType::Q8_0)?))
}

/// One projection `y = x W^T (+ b)`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: QMatMul,
    dense: Option<(Tensor, usize)>,
    bias: Option<Tensor>,
}

impl Linear {
    /// Wraps a quantized weight of shape (out, in), with an optional bias and dense policy.
    pub fn new(weight: Arc<QTensor>, bias: Option<Tensor>, dense: DenseMode) -> Result<Self> {
        let dense = match dense {
            DenseMode::On { min_rows } | DenseMode::Auto { min_rows }
                if !is_dense_dtype(weight.dtype()) =>
            {
                Some((weight.dequantize(&weight.device())?, min_rows))
            }
            _ => None,
        };
        Ok(Self {
            weight: QMatMul::from_arc(weight)?,
            dense,
            bias,
        })
    }

    /// Wraps a weight from any source: quantized weights follow `dense`; dense weights are
    /// used as they are.
    pub fn from_weight(w: Weight, bias: Option<Tensor>, dense: DenseMode) -> Result<Self> {
        match w {
            Weight::Quant(q) => Self::new(q, bias, dense),
            Weight::Dense(t) => Ok(Self {
                weight: QMatMul::Tensor(t),
                dense: None,
                bias,
            }),
        }
    }

    /// Bytes held by the optional dense copy.
    pub fn dense_bytes(&self) -> usize {
        self.dense
            .as_ref()
            .map_or(0, |(t, _)| t.elem_count() * t.dtype().size_in_bytes())
    }

    /// Applies the projection to `x` of shape (.., in).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, true)
    }

    /// [`Linear::forward`]; `dense = false` keeps the quantized kernel whatever the row
    /// count (its rows are computed as one-row forwards compute them).
    pub fn forward_with(&self, x: &Tensor, dense: bool) -> Result<Tensor> {
        let rows = x.elem_count() / x.dim(candle_core::D::Minus1)?;
        let y = match &self.dense {
            Some((w, min_rows)) if dense && rows >= *min_rows => {
                let dims = x.dims().to_vec();
                let x2 = x.reshape((rows, dims[dims.len() - 1]))?;
                let y = x2.matmul(&w.t()?)?;
                let mut out = dims;
                let last = out.len() - 1;
                out[last] = w.dim(0)?;
                y.reshape(out)?
            }
            _ => self.weight.forward(x)?,
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

fn is_dense_dtype(d: GgmlDType) -> bool {
    matches!(d, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn q4_1_is_converted_and_stays_close() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (64, 128), &dev).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let before = q.dequantize(&dev).unwrap();
        let c = convert_slow(Arc::new(q)).unwrap();
        assert_eq!(c.dtype(), GgmlDType::Q8_0);
        let after = c.dequantize(&dev).unwrap();
        let err = (before - after).unwrap().abs().unwrap().max_all().unwrap();
        assert!(err.to_scalar::<f32>().unwrap() < 0.05);
        let q8 = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        assert_eq!(convert_slow(Arc::new(q8)).unwrap().dtype(), GgmlDType::Q8_0);
    }

    #[test]
    fn dense_copy_matches_quantized_path() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (96, 256), &dev).unwrap();
        let q = Arc::new(QTensor::quantize(&w, GgmlDType::Q8_0).unwrap());
        let x = Tensor::randn(0f32, 1.0, (1, 8, 256), &dev).unwrap();
        let quant = Linear::new(q.clone(), None, DenseMode::Off).unwrap();
        let dense = Linear::new(q, None, DenseMode::On { min_rows: 4 }).unwrap();
        assert_eq!(dense.dense_bytes(), 96 * 256 * 4);
        let a = quant.forward(&x).unwrap();
        let b = dense.forward(&x).unwrap();
        assert_eq!(a.dims(), b.dims());
        // The quantized path also quantizes the activations to 8 bits.
        let rel = ((&a - &b)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            / a.sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap())
        .sqrt();
        assert!(rel < 0.02, "relative error {rel}");
    }
}
