//! Projection weights: quantized for decode, optionally a dense f32 copy for many-token
//! forwards, the choice between candle's quantized matmul and the kernels crate's, and the
//! load-time conversion of quant types that have no fast kernel, and a LoRA adapter on top
//! (a side path beside quantized weights, merged into dense ones).

use crate::lora::SidePath;
use crate::pass::Pass;
use crate::weights::Weight;
use crate::Result;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Module, Tensor};
use speccompact_kernels::{matmul_f32, matmul_f32_outputs, Isa, PackedMatrix, WeightType};
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
/// at load (SmolLM2 Q4_1 decodes 50x faster as Q8_0 on AVX-512 machines). Q4_1 keeps its
/// own bits where the kernels crate serves it (`kernels = "on"`, on the CPU).
pub fn needs_conversion(dtype: GgmlDType, kernels: KernelMode, cpu: bool) -> bool {
    match dtype {
        GgmlDType::Q4_1 => kernels == KernelMode::Off || !cpu,
        GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q8_1 => true,
        _ => false,
    }
}

/// Requantizes a slow quant type to Q8_0 when its rows allow it (see [`needs_conversion`]);
/// returns the input otherwise.
pub fn convert_slow(q: Arc<QTensor>, kernels: KernelMode) -> Result<Arc<QTensor>> {
    let dims = q.shape().dims();
    let cols = dims.last().copied().unwrap_or(0);
    let cpu = q.device().is_cpu();
    if !needs_conversion(q.dtype(), kernels, cpu) || cols % GgmlDType::Q8_0.block_size() != 0 {
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
    /// The kernels crate for every weight type it implements (Q8_0, Q4_K, Q6_K, Q4_1), at every row
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
        GgmlDType::Q4_1 => Some(WeightType::Q4_1),
        _ => None,
    }
}

/// A weight in the kernels crate's layout.
#[derive(Debug)]
struct Packed {
    matrix: PackedMatrix,
    isa: Isa,
}

/// Rows up to which stacked projections run as one matmul; longer forwards run each part on
/// its own outputs (one matmul's split output costs more than the calls it saves there:
/// prefill of 512 tokens on the 1.5B, 114 against 101 tok/s).
const STACKED_MAX_ROWS: usize = 8;

impl Packed {
    /// `x`'s projection onto outputs `outputs` only (a whole-tile range).
    fn forward_outputs(&self, x: &Tensor, outputs: std::ops::Range<usize>) -> Result<Tensor> {
        let mut dims = x.dims().to_vec();
        let k = self.matrix.cols();
        let rows = x.elem_count() / k;
        let data = x.flatten_all()?.to_vec1::<f32>()?;
        let mut out = vec![0f32; rows * outputs.len()];
        let last = dims.len() - 1;
        dims[last] = outputs.len();
        matmul_f32_outputs(&self.matrix, &data, rows, outputs, &mut out, self.isa)?;
        Ok(Tensor::from_vec(out, dims, x.device())?)
    }

    /// `x`'s projection split into consecutive output ranges of the given widths.
    fn forward_split(&self, x: &Tensor, widths: &[usize]) -> Result<Vec<Tensor>> {
        let dims = x.dims().to_vec();
        let (k, n) = (self.matrix.cols(), self.matrix.rows());
        let rows = x.elem_count() / k;
        let data = x.flatten_all()?.to_vec1::<f32>()?;
        let mut out = vec![0f32; rows * n];
        matmul_f32(&self.matrix, &data, rows, &mut out, self.isa)?;
        let shape = |w: usize| {
            let mut s = dims.clone();
            let last = s.len() - 1;
            s[last] = w;
            s
        };
        if widths == [n] {
            return Ok(vec![Tensor::from_vec(out, shape(n), x.device())?]);
        }
        let mut parts = Vec::with_capacity(widths.len());
        let mut at = 0;
        for &w in widths {
            let mut v = Vec::with_capacity(rows * w);
            for r in 0..rows {
                v.extend_from_slice(&out[r * n + at..r * n + at + w]);
            }
            parts.push(Tensor::from_vec(v, shape(w), x.device())?);
            at += w;
        }
        Ok(parts)
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
    /// The kernels crate's copy: this weight's own, or a stack of several projections of the
    /// same input that this one is the output range `part` of ([`Linear::stack`]).
    packed: Option<Arc<Packed>>,
    part: Option<(usize, usize)>,
    dense: Option<(Tensor, usize)>,
    bias: Option<Tensor>,
    /// An adapter's side path, added to every forward that its dense copy (merged) does not
    /// serve.
    side: Option<Arc<SidePath>>,
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
            part: None,
            dense,
            bias,
            side: None,
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
                part: None,
                dense: None,
                bias,
                side: None,
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

    /// Stacks the kernels crate's copies of projections of one input into one matrix, so a
    /// forward computes them in one matmul ([`Linear::forward_parts`]); each output is
    /// computed bitwise as before. Leaves them as they are (and returns false) unless every
    /// one has a kernels-crate copy of one weight type and input width, and every one but
    /// the last a whole number of 16-output tiles.
    pub fn stack(parts: &mut [&mut Linear]) -> Result<bool> {
        let mut mats = Vec::with_capacity(parts.len());
        for p in parts.iter() {
            match (&p.packed, p.part) {
                (Some(k), None) => mats.push(&k.matrix),
                _ => return Ok(false),
            }
        }
        let isa = match &parts[0].packed {
            Some(k) => k.isa,
            None => return Ok(false),
        };
        let Ok(matrix) = PackedMatrix::stack(&mats) else {
            return Ok(false);
        };
        let stacked = Arc::new(Packed { matrix, isa });
        let mut at = 0;
        for p in parts.iter_mut() {
            let w = p.out_features();
            p.packed = Some(stacked.clone());
            p.part = Some((at, w));
            at += w;
        }
        Ok(true)
    }

    /// Outputs of this projection.
    fn out_features(&self) -> usize {
        match (&self.packed, self.part) {
            (_, Some((_, w))) => w,
            (Some(k), None) => k.matrix.rows(),
            _ => self.weight_rows(),
        }
    }

    /// Inputs of this projection.
    fn in_features(&self) -> usize {
        match &self.weight {
            QMatMul::QTensor(q) => q.shape().dims().get(1).copied().unwrap_or(0),
            QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.dims().get(1).copied().unwrap_or(0),
        }
    }

    /// This projection with a LoRA adapter, `W x + s · B (A x)` (`a` is `[r, in]`, `b` is
    /// `[out, r]`): merged into a dense weight and into the dense copy, a side path beside
    /// quantized bits. A shape that does not fit is returned as the reason.
    pub fn with_adapter(
        &self,
        a: &Tensor,
        b: &Tensor,
        scale: f32,
    ) -> std::result::Result<Self, String> {
        let side = SidePath::new(a, b, scale, self.out_features(), self.in_features())?;
        let merge = |w: &Tensor| -> Result<Tensor> {
            Ok((w.to_dtype(candle_core::DType::F32)? + side.delta()?.to_device(w.device())?)?)
        };
        let mut out = self.clone();
        match &self.weight {
            QMatMul::Tensor(w) | QMatMul::TensorF16(w) => {
                out.weight = QMatMul::Tensor(merge(w).map_err(|e| e.to_string())?);
                return Ok(out);
            }
            QMatMul::QTensor(_) => {}
        }
        if let Some((w, min_rows)) = &self.dense {
            out.dense = Some((merge(w).map_err(|e| e.to_string())?, *min_rows));
        }
        out.side = Some(Arc::new(side));
        Ok(out)
    }

    /// Whether an adapter's side path runs beside this projection's quantized weight.
    pub fn has_side_path(&self) -> bool {
        self.side.is_some()
    }

    /// Adds the side path's `s · B (A x)` to `y` where the merged dense copy did not serve.
    fn add_side(&self, x: &Tensor, y: Tensor, pass: Pass, rows: usize) -> Result<Tensor> {
        match &self.side {
            Some(s) if !self.dense_serves(pass, rows) => s.add_to(x, y),
            _ => Ok(y),
        }
    }

    fn weight_rows(&self) -> usize {
        match &self.weight {
            QMatMul::QTensor(q) => q.shape().dims().first().copied().unwrap_or(0),
            QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.dims().first().copied().unwrap_or(0),
        }
    }

    /// Every part's projection of `x`: one matmul when they were stacked together (and no
    /// dense copy serves this forward), else one forward each.
    pub fn forward_parts(parts: &[&Linear], x: &Tensor, pass: Pass) -> Result<Vec<Tensor>> {
        let rows = x.elem_count() / x.dim(candle_core::D::Minus1)?;
        let stacked = parts.first().and_then(|p| p.packed.as_ref()).filter(|k| {
            !parts.iter().any(|p| p.dense_serves(pass, rows))
                && parts.iter().enumerate().all(|(i, p)| {
                    p.packed.as_ref().is_some_and(|q| Arc::ptr_eq(q, k))
                        && p.part.is_some_and(|(at, _)| {
                            at == parts[..i].iter().map(|q| q.out_features()).sum::<usize>()
                        })
                })
                && parts.iter().map(|p| p.out_features()).sum::<usize>() == k.matrix.rows()
        });
        let Some(k) = stacked.filter(|_| rows <= STACKED_MAX_ROWS) else {
            return parts.iter().map(|p| p.forward_pass(x, pass)).collect();
        };
        let widths: Vec<usize> = parts.iter().map(|p| p.out_features()).collect();
        let ys = k.forward_split(x, &widths)?;
        parts
            .iter()
            .zip(ys)
            .map(|(p, y)| p.add_bias(p.add_side(x, y, pass, rows)?))
            .collect()
    }

    /// Whether the dense copy serves a forward of `rows` rows in `pass`.
    fn dense_serves(&self, pass: Pass, rows: usize) -> bool {
        matches!(&self.dense, Some((_, min_rows)) if pass == Pass::Prefill && rows >= *min_rows)
    }

    fn add_bias(&self, y: Tensor) -> Result<Tensor> {
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
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
            (Some((w, _)), _) if self.dense_serves(pass, rows) => {
                let dims = x.dims().to_vec();
                let x2 = x.reshape((rows, dims[dims.len() - 1]))?;
                let y = x2.matmul(&w.t()?)?;
                let mut out = dims;
                let last = out.len() - 1;
                out[last] = w.dim(0)?;
                y.reshape(out)?
            }
            // Alone, or a part of a stack: its own outputs.
            (_, Some(p)) => {
                let (at, w) = self.part.unwrap_or((0, p.matrix.rows()));
                p.forward_outputs(x, at..at + w)?
            }
            _ => self.weight.forward(x)?,
        };
        self.add_bias(self.add_side(x, y, pass, rows)?)
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
    fn q4_1_is_converted_for_candle_only_and_stays_close() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (64, 128), &dev).unwrap();
        let q = Arc::new(QTensor::quantize(&w, GgmlDType::Q4_1).unwrap());
        // The kernels crate serves Q4_1 as it is.
        let kept = convert_slow(q.clone(), KernelMode::On).unwrap();
        assert_eq!(kept.dtype(), GgmlDType::Q4_1);
        let before = q.dequantize(&dev).unwrap();
        let c = convert_slow(q, KernelMode::Off).unwrap();
        assert_eq!(c.dtype(), GgmlDType::Q8_0);
        let after = c.dequantize(&dev).unwrap();
        let err = (before - after).unwrap().abs().unwrap().max_all().unwrap();
        assert!(err.to_scalar::<f32>().unwrap() < 0.05);
        let q8 = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        assert_eq!(
            convert_slow(Arc::new(q8), KernelMode::Off).unwrap().dtype(),
            GgmlDType::Q8_0
        );
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

    /// Stacked projections give each part bitwise what it gives alone, biases included, in
    /// one forward and called one by one; a stack of mixed types is refused and left as is.
    #[test]
    fn stacked_projections_are_bitwise_their_parts() {
        let dev = Device::Cpu;
        let lin = |n: usize, dtype: GgmlDType, bias: bool| {
            let w = Tensor::randn(0f32, 1.0, (n, 256), &dev).unwrap();
            let q = Arc::new(QTensor::quantize(&w, dtype).unwrap());
            let b = bias.then(|| Tensor::randn(0f32, 1.0, n, &dev).unwrap());
            Linear::with_kernels(q, b, DenseMode::Off, KernelMode::On).unwrap()
        };
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        let x = Tensor::randn(0f32, 1.0, (2, 3, 256), &dev).unwrap();
        let (q, k, v) = (
            lin(64, GgmlDType::Q4K, true),
            lin(32, GgmlDType::Q4K, true),
            lin(40, GgmlDType::Q4K, false),
        );
        let alone: Vec<Vec<u32>> = [&q, &k, &v]
            .iter()
            .map(|l| bits(&l.forward(&x).unwrap()))
            .collect();
        let (mut sq, mut sk, mut sv) = (q.clone(), k.clone(), v.clone());
        assert!(Linear::stack(&mut [&mut sq, &mut sk, &mut sv]).unwrap());
        let parts = Linear::forward_parts(&[&sq, &sk, &sv], &x, Pass::Step).unwrap();
        for (i, p) in parts.iter().enumerate() {
            assert_eq!(bits(p), alone[i], "part {i} in the stacked forward");
        }
        // Past the stacked row limit each part runs on its own outputs: the same again.
        let long = Tensor::randn(0f32, 1.0, (2, STACKED_MAX_ROWS, 256), &dev).unwrap();
        let parts = Linear::forward_parts(&[&sq, &sk, &sv], &long, Pass::Step).unwrap();
        for (i, (p, l)) in parts.iter().zip([&q, &k, &v]).enumerate() {
            assert_eq!(
                bits(p),
                bits(&l.forward(&long).unwrap()),
                "part {i}, long forward"
            );
        }
        for (i, l) in [&sq, &sk, &sv].iter().enumerate() {
            assert_eq!(bits(&l.forward(&x).unwrap()), alone[i], "part {i} alone");
        }
        // Parts out of order are computed one by one, still the same.
        let swapped = Linear::forward_parts(&[&sk, &sq], &x, Pass::Step).unwrap();
        assert_eq!(bits(&swapped[0]), alone[1]);
        // Mixed weight types are not stacked.
        let (mut a, mut b) = (
            lin(32, GgmlDType::Q4K, false),
            lin(32, GgmlDType::Q6K, false),
        );
        assert!(!Linear::stack(&mut [&mut a, &mut b]).unwrap());
        assert_eq!(a.part, None);
    }
}
