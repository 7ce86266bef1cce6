//! Projection weights: quantized for decode, optionally a dense f32 copy for many-token
//! forwards, the choice between candle's quantized matmul and the kernels crate's, and the
//! load-time conversion of quant types that have no fast kernel.

use crate::weights::Weight;
use crate::Result;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Module, Tensor};
use speccompact_kernels::{matmul_f32, Isa, PackedMatrix, WeightType};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

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

/// Times `rows` tokens through quantized weights (on the matmul `kernels` picks) and their
/// dense copies (one warm-up, then best of 3 each), summed over the weights, in ms.
pub fn probe_dense(
    weights: &[Arc<QTensor>],
    rows: usize,
    kernels: KernelMode,
) -> Result<(f64, f64)> {
    let (mut qt, mut dt) = (0.0, 0.0);
    for q in weights {
        let (a, b) = probe_one(q, rows, kernels)?;
        qt += a;
        dt += b;
    }
    Ok((qt, dt))
}

/// One warm-up call of `f`, then the best of 3 timed calls, in ms.
fn best_ms(f: &dyn Fn() -> Result<Tensor>) -> Result<f64> {
    f()?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(best)
}

fn probe_one(q: &Arc<QTensor>, rows: usize, kernels: KernelMode) -> Result<(f64, f64)> {
    let (_, cols) = q.shape().dims2()?;
    let x = Tensor::randn(0f32, 1.0, (rows, cols), &q.device())?;
    let quant = Linear::with_kernels(q.clone(), None, DenseMode::Off, kernels)?;
    let dense = q.dequantize(&q.device())?;
    let qm = best_ms(&|| quant.forward(&x))?;
    let dm = best_ms(&|| Ok(x.matmul(&dense.t()?)?))?;
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

/// Which quantized matmul serves CPU projections: candle's or the kernels crate's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelMode {
    /// Candle's kernels only.
    Off,
    /// The kernels crate for every weight type it implements, whatever the row count.
    #[default]
    On,
    /// Decide per weight type, shape and row class by timing both at load (once per process
    /// and shape, so every load in a process decides alike); one-row forwards keep candle's.
    Auto,
}

/// Row counts a kernel choice is made for: one row (decode), a few rows (batched decode of
/// the slot streams), many rows (prefill, verification). Probed at these counts.
pub const ROW_CLASSES: [usize; 3] = [1, 6, 32];

fn row_class(rows: usize) -> usize {
    match rows {
        0 | 1 => 0,
        2..=16 => 1,
        _ => 2,
    }
}

/// The kernel chosen for one weight type and shape.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelDecision {
    /// GGML type name, outputs, inputs.
    pub shape: (String, usize, usize),
    /// Per row class ([`ROW_CLASSES`]): whether the kernels crate serves it.
    pub ours: [bool; 3],
    /// Probe results per row class: (rows, candle ms, ours ms); empty when not measured.
    pub probes: Vec<(usize, f64, f64)>,
}

fn decisions() -> &'static Mutex<HashMap<(GgmlDType, usize, usize), KernelDecision>> {
    static D: OnceLock<Mutex<HashMap<(GgmlDType, usize, usize), KernelDecision>>> = OnceLock::new();
    D.get_or_init(Default::default)
}

/// Every kernel decision made in this process so far.
pub fn kernel_decisions() -> Vec<KernelDecision> {
    let mut v: Vec<_> = decisions()
        .lock()
        .map(|d| d.values().cloned().collect())
        .unwrap_or_default();
    v.sort_by(|a, b| {
        a.shape
            .partial_cmp(&b.shape)
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    v
}

fn weight_type(d: GgmlDType) -> Option<WeightType> {
    match d {
        GgmlDType::Q8_0 => Some(WeightType::Q8_0),
        GgmlDType::Q4K => Some(WeightType::Q4K),
        GgmlDType::Q6K => Some(WeightType::Q6K),
        _ => None,
    }
}

/// A weight in the kernels crate's layout and the row classes it serves.
#[derive(Debug)]
struct Packed {
    matrix: PackedMatrix,
    isa: Isa,
    ours: [bool; 3],
}

impl Packed {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let k = self.matrix.cols();
        let rows = x.elem_count() / k;
        let data = x.flatten_all()?.to_vec1::<f32>()?;
        let mut out = vec![0f32; rows * self.matrix.rows()];
        matmul_f32(&self.matrix, &data, rows, &mut out, self.isa)?;
        let mut shape = dims;
        let last = shape.len() - 1;
        shape[last] = self.matrix.rows();
        Ok(Tensor::from_vec(out, shape, x.device())?)
    }
}

fn probe_kernels(q: &Arc<QTensor>, packed: &Packed) -> Result<Vec<(usize, f64, f64)>> {
    let (_, cols) = q.shape().dims2()?;
    let quant = QMatMul::from_arc(q.clone())?;
    let mut out = Vec::new();
    for rows in ROW_CLASSES {
        let x = Tensor::randn(0f32, 1.0, (rows, cols), &q.device())?;
        let theirs = best_ms(&|| Ok(quant.forward(&x)?))?;
        let ours = best_ms(&|| packed.forward(&x))?;
        out.push((rows, theirs, ours));
    }
    Ok(out)
}

/// The kernels crate's copy of `q` when `mode` and (for `Auto`) measurement choose it for
/// some row class; `None` keeps candle's kernel for every row count.
fn pack(q: &Arc<QTensor>, mode: KernelMode) -> Result<Option<Arc<Packed>>> {
    let Some(ty) = weight_type(q.dtype()) else {
        return Ok(None);
    };
    if mode == KernelMode::Off || !q.device().is_cpu() {
        return Ok(None);
    }
    let (n, k) = q.shape().dims2()?;
    let Ok(matrix) = PackedMatrix::from_ggml(ty, n, k, &q.data()?) else {
        return Ok(None);
    };
    let mut packed = Packed {
        matrix,
        isa: Isa::best(),
        ours: [true; 3],
    };
    if mode == KernelMode::Auto {
        let key = (q.dtype(), n, k);
        let known = decisions().lock().ok().and_then(|d| d.get(&key).cloned());
        let decision = match known {
            Some(d) => d,
            None => {
                let probes = probe_kernels(q, &packed)?;
                // One-row forwards (decode) stay on candle's kernels: a warm-cache probe
                // favoured ours for some shapes, but whole decode steps were slower with them
                // on every shipped model (SmolLM2 112 -> 104 tok/s, 0.5B 44.9 -> 39.0,
                // 1.5B 18.0-18.3 -> 14.1-17.5, `runtime-bench --kernels off|auto`), where the
                // weights stream from memory between other ops.
                let mut ours = [false; 3];
                for (class, (o, (_, theirs, mine))) in ours.iter_mut().zip(&probes).enumerate() {
                    *o = class > 0 && mine < theirs;
                }
                let d = KernelDecision {
                    shape: (format!("{:?}", q.dtype()), n, k),
                    ours,
                    probes,
                };
                if let Ok(mut all) = decisions().lock() {
                    all.insert(key, d.clone());
                }
                d
            }
        };
        if !decision.ours.iter().any(|o| *o) {
            return Ok(None);
        }
        packed.ours = decision.ours;
    }
    Ok(Some(Arc::new(packed)))
}

/// One projection `y = x W^T (+ b)`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: QMatMul,
    packed: Option<Arc<Packed>>,
    dense: Option<(Tensor, usize)>,
    bias: Option<Tensor>,
}

impl Linear {
    /// Wraps a quantized weight of shape (out, in), with an optional bias and dense policy;
    /// candle's kernels serve it.
    pub fn new(weight: Arc<QTensor>, bias: Option<Tensor>, dense: DenseMode) -> Result<Self> {
        Self::with_kernels(weight, bias, dense, KernelMode::Off)
    }

    /// [`Linear::new`] with a choice of quantized matmul (CPU only; other devices and weight
    /// types the kernels crate lacks keep candle's).
    pub fn with_kernels(
        weight: Arc<QTensor>,
        bias: Option<Tensor>,
        dense: DenseMode,
        kernels: KernelMode,
    ) -> Result<Self> {
        let packed = pack(&weight, kernels)?;
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
            packed,
            dense,
            bias,
        })
    }

    /// Wraps a weight from any source: quantized weights follow `dense` and `kernels`; dense
    /// weights are used as they are.
    pub fn from_weight(
        w: Weight,
        bias: Option<Tensor>,
        dense: DenseMode,
        kernels: KernelMode,
    ) -> Result<Self> {
        match w {
            Weight::Quant(q) => Self::with_kernels(q, bias, dense, kernels),
            Weight::Dense(t) => Ok(Self {
                weight: QMatMul::Tensor(t),
                packed: None,
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

    /// [`Linear::forward`]; `dense = false` keeps the quantized kernel one-row forwards use,
    /// whatever the row count (its rows are computed as one-row forwards compute them).
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
            _ => {
                let class = if dense { row_class(rows) } else { 0 };
                match &self.packed {
                    Some(p) if p.ours[class] => p.forward(x)?,
                    _ => self.weight.forward(x)?,
                }
            }
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
