//! Projection weights: quantized for decode, optionally a dense f32 copy for many-token
//! forwards, the choice between candle's quantized matmul and the kernels crate's, and the
//! load-time conversion of quant types that have no fast kernel.

use crate::pass::Pass;
use crate::weights::Weight;
use crate::Result;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Module, Tensor};
use speccompact_kernels::{matmul_f32, Isa, PackedMatrix, WeightType};
use std::sync::{Arc, OnceLock};

/// When to keep a dequantized copy of projection weights for prefill forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenseMode {
    /// Quantized weights only (least memory).
    #[default]
    Off,
    /// Keep an f32 copy; prefill forwards with at least `min_rows` tokens use it.
    On {
        /// Token count from which the dense copy is used.
        min_rows: usize,
    },
    /// A fixed rule, the same in every process on a machine: dense copies on CPU when the
    /// projections are 8-bit (Q8_0, as loaded) and the copies fit in a quarter of the
    /// machine's total memory. Measured on AVX-512 VNNI (`dense-bench`): f32 copies of 8-bit
    /// weights prefill faster from 128 rows (Qwen2.5-0.5B 180 against 118 tok/s at 512,
    /// SmolLM2 from 128 rows); copies of 4-bit weights, 7x the bytes, prefill slower
    /// (Qwen2.5-1.5B Q4_K_M 58 against 90 tok/s).
    Auto {
        /// Token count from which the dense copy is used.
        min_rows: usize,
    },
}

/// The outcome of [`DenseMode::Auto`] (or the fixed choice) for one loaded model.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DenseDecision {
    /// Whether dense copies are kept.
    pub dense: bool,
    /// Prefill forwards of at least this many tokens use them.
    pub min_rows: usize,
    /// Why, in words.
    pub reason: String,
    /// Bytes the dense copies take (or would take).
    pub bytes: usize,
}

/// Bytes of memory the machine has (Linux `MemTotal`), if known: fixed for the machine, so
/// a rule on it decides alike in every process.
pub fn total_memory() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
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
    /// Candle's kernels only. Candle picks its kernel by row count (a one-row gemv, tiles,
    /// AMX from 32 rows where present), so a token's logits then depend on the forward's
    /// shape: step forwards are not batch-invariant.
    Off,
    /// The kernels crate for every weight type it implements (Q8_0, Q4_K, Q6_K), at every row
    /// count: each row is computed alike whatever rows share the call, so step forwards are
    /// batch-invariant. `auto`, the spelling of earlier versions, reads as this.
    #[default]
    #[serde(alias = "auto")]
    On,
}

fn weight_type(d: GgmlDType) -> Option<WeightType> {
    match d {
        GgmlDType::Q8_0 => Some(WeightType::Q8_0),
        GgmlDType::Q4K => Some(WeightType::Q4K),
        GgmlDType::Q6K => Some(WeightType::Q6K),
        _ => None,
    }
}

/// A weight in the kernels crate's layout.
#[derive(Debug)]
struct Packed {
    matrix: PackedMatrix,
    isa: Isa,
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

/// The kernels crate's copy of `q` when `mode` asks for it and the kernels implement its
/// type (CPU only); `None` keeps candle's kernel.
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
    Ok(Some(Arc::new(Packed {
        matrix,
        isa: kernel_isa(),
    })))
}

/// The instruction set of the kernels crate's matmuls in this process: the best this CPU
/// runs, or the one `SPECCOMPACT_KERNEL_ISA` names (`avx512vnni`, `avx2`, `scalar`) when
/// this CPU runs it, to check another path's numerics on one machine.
pub fn kernel_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let named = std::env::var("SPECCOMPACT_KERNEL_ISA").ok();
        let forced = named.as_deref().and_then(|n| {
            Isa::ALL
                .into_iter()
                .find(|i| i.name() == n.trim().to_ascii_lowercase())
        });
        match (named, forced) {
            (_, Some(i)) if i.available() => i,
            (Some(n), f) => {
                let best = Isa::best();
                tracing::warn!(
                    "SPECCOMPACT_KERNEL_ISA={n}: {}; using {}",
                    if f.is_some() {
                        "not available on this CPU"
                    } else {
                        "unknown (avx512vnni, avx2 or scalar)"
                    },
                    best.name()
                );
                best
            }
            (None, _) => Isa::best(),
        }
    })
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

    /// Which kernel serves this projection in a forward of the given pass, in words.
    pub fn kernel(&self, pass: Pass) -> &'static str {
        match (&self.dense, &self.packed, pass) {
            (Some(_), _, Pass::Prefill) => "dense",
            (_, Some(_), _) => "ours",
            _ => "candle",
        }
    }

    /// Applies the projection to `x` of shape (.., in) as a step forward.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_pass(x, Pass::Step)
    }

    /// Applies the projection: a [`Pass::Step`] always on the quantized kernel (each row
    /// computed as a one-row forward computes it); a [`Pass::Prefill`] on the dense copy
    /// from its row count.
    pub fn forward_pass(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        let rows = x.elem_count() / x.dim(candle_core::D::Minus1)?;
        let y = match (&self.dense, &self.packed) {
            (Some((w, min_rows)), _) if pass == Pass::Prefill && rows >= *min_rows => {
                let dims = x.dims().to_vec();
                let x2 = x.reshape((rows, dims[dims.len() - 1]))?;
                let y = x2.matmul(&w.t()?)?;
                let mut out = dims;
                let last = out.len() - 1;
                out[last] = w.dim(0)?;
                y.reshape(out)?
            }
            (_, Some(p)) => p.forward(x)?,
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
