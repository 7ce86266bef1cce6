//! Quantized matmul at the shipped models' projection shapes: candle's `QMatMul` against the
//! kernels crate (each instruction set), for several row counts; prints ms per call, G
//! multiply-adds per second and each row count's cost as a multiple of one row.

use anyhow::Result;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use clap::Parser;
use speccompact_kernels::{matmul_f32, Isa, PackedMatrix, WeightType};
use speccompact_runtime::set_threads;
use std::fmt::Write as _;
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// CPU threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Row counts.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 6, 32, 192, 512])]
    rows: Vec<usize>,
    /// Also write the table to this file.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// (label, type, outputs, inputs): the projections that dominate each model's time.
const SHAPES: &[(&str, WeightType, usize, usize)] = &[
    ("smollm2 mlp up (Q8_0)", WeightType::Q8_0, 1536, 576),
    ("smollm2 mlp down (Q8_0)", WeightType::Q8_0, 576, 1536),
    ("smollm2 mlp up (Q4_1)", WeightType::Q4_1, 1536, 576),
    ("qwen 0.5b mlp up (Q8_0)", WeightType::Q8_0, 4864, 896),
    ("qwen 1.5b mlp up (Q4_K)", WeightType::Q4K, 8960, 1536),
    ("qwen 1.5b mlp down (Q6_K)", WeightType::Q6K, 1536, 8960),
    ("qwen 1.5b logits (Q6_K)", WeightType::Q6K, 151936, 1536),
];

fn best_ms(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(best)
}

fn main() -> Result<()> {
    let args = Args::parse();
    set_threads(args.threads)?;
    let dev = Device::Cpu;
    let isas = Isa::available_all();
    let mut t = String::new();
    writeln!(t, "Threads: {}, instruction sets: {isas:?}\n", args.threads)?;
    write!(t, "| shape | rows | candle ms |")?;
    for i in &isas {
        write!(t, " {i:?} ms |")?;
    }
    writeln!(t, " best vs candle | best GMAC/s | best / 1 row |")?;
    writeln!(t, "|---|---|---|{}---|---|---|", "---|".repeat(isas.len()))?;
    for &(label, ty, n, k) in SHAPES {
        let g = match ty {
            WeightType::Q8_0 => GgmlDType::Q8_0,
            WeightType::Q4K => GgmlDType::Q4K,
            WeightType::Q6K => GgmlDType::Q6K,
            WeightType::Q4_1 => GgmlDType::Q4_1,
        };
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
        let q = QTensor::quantize(&w, g)?;
        let packed = PackedMatrix::from_ggml(ty, n, k, &q.data()?)?;
        let qm = QMatMul::from_qtensor(q)?;
        let mut one_row = None;
        for &m in &args.rows {
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
            let xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
            let reps = if m * n * k > 1 << 30 { 3 } else { 10 };
            let c = best_ms(reps, || {
                qm.forward(&x)?;
                Ok(())
            })?;
            let mut out = vec![0f32; m * n];
            let mut ours = Vec::new();
            for &isa in &isas {
                ours.push(best_ms(reps, || {
                    Ok(matmul_f32(&packed, &xs, m, &mut out, isa)?)
                })?);
            }
            let best = ours.iter().cloned().fold(f64::INFINITY, f64::min);
            let base = *one_row.get_or_insert(best);
            write!(t, "| {label} | {m} | {c:.3} |")?;
            for o in &ours {
                write!(t, " {o:.3} |")?;
            }
            let gmac = (m * n * k) as f64 / best / 1e6;
            writeln!(t, " {:.2}x | {gmac:.1} | {:.2}x |", c / best, best / base)?;
        }
    }
    print!("{t}");
    if let Some(p) = args.out {
        let cmd = std::env::args().collect::<Vec<_>>().join(" ");
        std::fs::write(p, format!("# Kernel benchmark\n\nCommand: `{cmd}`\n\n{t}"))?;
    }
    Ok(())
}
