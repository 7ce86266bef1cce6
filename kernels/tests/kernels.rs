//! Every kernel against the scalar reference, the scalar reference against f64 dot products of
//! the dequantized operands, and the unpacking of the tiled layout against candle's
//! dequantization.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use speccompact_kernels::{matmul, Isa, PackedMatrix, QuantizedRows, WeightType};

const TYPES: [(WeightType, GgmlDType); 4] = [
    (WeightType::Q8_0, GgmlDType::Q8_0),
    (WeightType::Q4K, GgmlDType::Q4K),
    (WeightType::Q6K, GgmlDType::Q6K),
    (WeightType::Q4_1, GgmlDType::Q4_1),
];

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Random GGML blocks: every byte random, then the f16 scales set to finite values.
fn random_blocks(ty: WeightType, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let ub = ty.ggml_unit_bytes();
    let mut b: Vec<u8> = (0..n * k / ty.unit() * ub)
        .map(|_| rng.next() as u8)
        .collect();
    let scale_at: &[usize] = match ty {
        WeightType::Q8_0 => &[0],
        WeightType::Q4K | WeightType::Q4_1 => &[0, 2],
        WeightType::Q6K => &[208],
    };
    for unit in b.chunks_exact_mut(ub) {
        for &at in scale_at {
            let v = half::f16::from_f32(0.001 + 0.05 * rng.f32().abs());
            unit[at..at + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    b
}

fn random_rows(m: usize, k: usize, rng: &mut Rng) -> Vec<f32> {
    (0..m * k).map(|_| rng.f32() * 3.0).collect()
}

fn run(w: &PackedMatrix, x: &QuantizedRows, isa: Isa) -> Vec<f32> {
    let mut out = vec![f32::NAN; x.rows() * w.rows()];
    matmul(w, x, &mut out, isa).unwrap();
    out
}

/// Σ |w·a| per output, the scale the tolerances are relative to.
fn magnitudes(w: &PackedMatrix, x: &QuantizedRows) -> Vec<f64> {
    let (wd, xd, k) = (w.dequantize(), x.dequantize(), w.cols());
    let mut out = Vec::new();
    for r in 0..x.rows() {
        for j in 0..w.rows() {
            let s: f64 = (0..k)
                .map(|i| (wd[j * k + i] as f64 * xd[r * k + i] as f64).abs())
                .sum();
            out.push(s);
        }
    }
    out
}

#[test]
fn unpacking_matches_candle_dequantization() {
    let dev = Device::Cpu;
    // One partial tile, one whole tile, and whole tiles plus a partial one.
    for ((ty, g), n) in TYPES.iter().flat_map(|t| [5, 16, 37].map(|n| (*t, n))) {
        let k = 512;
        let t = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let q = QTensor::quantize(&t, g).unwrap();
        let bytes = q.data().unwrap();
        let packed = PackedMatrix::from_ggml(ty, n, k, &bytes).unwrap();
        let ours = packed.dequantize();
        let theirs: Vec<f32> = q
            .dequantize(&dev)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(ours.len(), theirs.len());
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                "{ty:?} n={n} value {i}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn scalar_reference_matches_f64_dot_products() {
    let mut rng = Rng(0x1234_5678);
    for (ty, _) in TYPES {
        let (m, n, k) = (3, 9, 512);
        let w = PackedMatrix::from_ggml(ty, n, k, &random_blocks(ty, n, k, &mut rng)).unwrap();
        let x = QuantizedRows::quantize(&random_rows(m, k, &mut rng), m, k).unwrap();
        let got = run(&w, &x, Isa::Scalar);
        let (wd, xd) = (w.dequantize(), x.dequantize());
        let mags = magnitudes(&w, &x);
        for r in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|i| wd[j * k + i] as f64 * xd[r * k + i] as f64)
                    .sum();
                let err = (got[r * n + j] as f64 - want).abs();
                assert!(
                    err <= 1e-5 * mags[r * n + j] + 1e-6,
                    "{ty:?} ({r},{j}): {} vs {want}",
                    got[r * n + j]
                );
            }
        }
    }
}

#[test]
fn every_instruction_set_matches_the_scalar_reference() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let isas = Isa::available_all();
    eprintln!("instruction sets on this CPU: {isas:?}");
    for (ty, _) in TYPES {
        let ks: &[usize] = match ty {
            WeightType::Q8_0 | WeightType::Q4_1 => &[32, 96, 544],
            _ => &[256, 768],
        };
        for &k in ks {
            for &n in &[1usize, 37, 67] {
                let w =
                    PackedMatrix::from_ggml(ty, n, k, &random_blocks(ty, n, k, &mut rng)).unwrap();
                for &m in &[1usize, 2, 3, 6, 7, 32, 67, 512] {
                    if m == 512 && n != 37 {
                        continue;
                    }
                    let x = QuantizedRows::quantize(&random_rows(m, k, &mut rng), m, k).unwrap();
                    let want = run(&w, &x, Isa::Scalar);
                    let mags = magnitudes(&w, &x);
                    for &isa in &isas {
                        let got = run(&w, &x, isa);
                        for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                            let err = (*g as f64 - *r as f64).abs();
                            assert!(
                                err <= 2e-6 * mags[i] + 1e-6,
                                "{isa:?} {ty:?} m={m} n={n} k={k} out {i}: {g} vs {r}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_row_is_the_same_alone_as_in_a_batch() {
    let mut rng = Rng(42);
    for (ty, _) in TYPES {
        let (m, n, k) = (11, 29, 512);
        let w = PackedMatrix::from_ggml(ty, n, k, &random_blocks(ty, n, k, &mut rng)).unwrap();
        let xs = random_rows(m, k, &mut rng);
        let x = QuantizedRows::quantize(&xs, m, k).unwrap();
        for isa in Isa::available_all() {
            let all = run(&w, &x, isa);
            for r in 0..m {
                let one = QuantizedRows::quantize(&xs[r * k..(r + 1) * k], 1, k).unwrap();
                assert_eq!(
                    run(&w, &one, isa),
                    all[r * n..(r + 1) * n].to_vec(),
                    "{isa:?} {ty:?} row {r}"
                );
            }
        }
    }
}

#[test]
fn thread_count_does_not_change_results() {
    let mut rng = Rng(7);
    let (m, n, k) = (6, 200, 768);
    let w = PackedMatrix::from_ggml(
        WeightType::Q4K,
        n,
        k,
        &random_blocks(WeightType::Q4K, n, k, &mut rng),
    )
    .unwrap();
    let x = QuantizedRows::quantize(&random_rows(m, k, &mut rng), m, k).unwrap();
    let isa = Isa::best();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let three = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    assert_eq!(
        one.install(|| run(&w, &x, isa)),
        three.install(|| run(&w, &x, isa))
    );
}

#[test]
fn bad_shapes_are_named() {
    let mut rng = Rng(3);
    let ty = WeightType::Q4K;
    let e = PackedMatrix::from_ggml(ty, 2, 300, &[0; 10])
        .unwrap_err()
        .to_string();
    assert!(e.contains("not whole units"), "{e}");
    let e = PackedMatrix::from_ggml(ty, 2, 256, &[0; 10])
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected 288 bytes, got 10"), "{e}");
    let w = PackedMatrix::from_ggml(ty, 2, 256, &random_blocks(ty, 2, 256, &mut rng)).unwrap();
    let x = QuantizedRows::quantize(&random_rows(1, 512, &mut rng), 1, 512).unwrap();
    let e = matmul(&w, &x, &mut [0.0; 2], Isa::Scalar)
        .unwrap_err()
        .to_string();
    assert!(e.contains("512 values per row, weights 256"), "{e}");
    let x = QuantizedRows::quantize(&random_rows(1, 256, &mut rng), 1, 256).unwrap();
    let e = matmul(&w, &x, &mut [0.0; 3], Isa::Scalar)
        .unwrap_err()
        .to_string();
    assert!(e.contains("output holds 3 values, 1 x 2 needed"), "{e}");
}

/// Against candle's own quantized matmul on the same GGML bytes. Q8_0: both quantize
/// activations in blocks of 32 with the same rounding, but candle stores each block's scale
/// as f16 (GGML's Q8_0) and these kernels keep f32, so they agree to f16 rounding of the
/// scales (~1e-4). K-quants: activations in blocks of 32 here against candle's 256, so they
/// agree to that quantization's error (~1e-2).
#[test]
fn matches_candle_quantized_matmul() {
    use candle_core::quantized::QMatMul;
    use candle_core::Module;
    let dev = Device::Cpu;
    for (ty, g, k, tol) in [
        (WeightType::Q8_0, GgmlDType::Q8_0, 96, 1e-3),
        (WeightType::Q8_0, GgmlDType::Q8_0, 576, 1e-3),
        (WeightType::Q4K, GgmlDType::Q4K, 512, 2e-2),
        (WeightType::Q6K, GgmlDType::Q6K, 512, 2e-2),
        (WeightType::Q4_1, GgmlDType::Q4_1, 128, 2e-3),
        (WeightType::Q4_1, GgmlDType::Q4_1, 576, 2e-3),
    ] {
        let (m, n) = (6, 48);
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let q = QTensor::quantize(&w, g).unwrap();
        let packed = PackedMatrix::from_ggml(ty, n, k, &q.data().unwrap()).unwrap();
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
        let theirs: Vec<f32> = QMatMul::from_qtensor(q)
            .unwrap()
            .forward(&x)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        let mut ours = vec![0f32; m * n];
        speccompact_kernels::matmul_f32(&packed, &xs, m, &mut ours, Isa::best()).unwrap();
        let num: f32 = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b) * (a - b))
            .sum();
        let den: f32 = theirs.iter().map(|b| b * b).sum();
        let rel = (num / den).sqrt();
        eprintln!("{ty:?} k={k}: relative L2 {rel:.2e}");
        assert!(rel < tol, "{ty:?} k={k}: relative L2 {rel}");
    }
}

/// Stacked matrices compute each output bitwise as their own matrix does; parts that are not
/// whole tiles (but the last) or differ in type or width are refused.
#[test]
fn stacked_matrices_give_each_part_bitwise() {
    let mut rng = Rng(0x5EED_0001);
    for (ty, _) in TYPES {
        let k = ty.unit() * 3;
        let ns = [32usize, 16, 37];
        let parts: Vec<PackedMatrix> = ns
            .iter()
            .map(|&n| {
                PackedMatrix::from_ggml(ty, n, k, &random_blocks(ty, n, k, &mut rng)).unwrap()
            })
            .collect();
        let refs: Vec<&PackedMatrix> = parts.iter().collect();
        let stacked = PackedMatrix::stack(&refs).unwrap();
        assert_eq!(stacked.rows(), ns.iter().sum::<usize>());
        for m in [1usize, 6] {
            let x = QuantizedRows::quantize(&random_rows(m, k, &mut rng), m, k).unwrap();
            for isa in Isa::available_all() {
                let all = run(&stacked, &x, isa);
                let mut at = 0;
                for p in &parts {
                    let one = run(p, &x, isa);
                    for r in 0..m {
                        let got = &all[r * stacked.rows() + at..r * stacked.rows() + at + p.rows()];
                        let want = &one[r * p.rows()..(r + 1) * p.rows()];
                        assert!(
                            got.iter()
                                .zip(want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{isa:?} {ty:?} m={m} part at {at}"
                        );
                    }
                    at += p.rows();
                }
            }
        }
        let odd = [&parts[2], &parts[0]];
        assert!(PackedMatrix::stack(&odd)
            .unwrap_err()
            .to_string()
            .contains("whole tiles"));
    }
    let a = PackedMatrix::from_ggml(
        WeightType::Q8_0,
        16,
        64,
        &random_blocks(WeightType::Q8_0, 16, 64, &mut rng),
    )
    .unwrap();
    let b = PackedMatrix::from_ggml(
        WeightType::Q8_0,
        16,
        96,
        &random_blocks(WeightType::Q8_0, 16, 96, &mut rng),
    )
    .unwrap();
    assert!(PackedMatrix::stack(&[&a, &b]).is_err());
    assert!(PackedMatrix::stack(&[]).is_err());
}
