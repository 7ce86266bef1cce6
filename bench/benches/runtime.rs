//! Criterion micro-benchmarks of the runtime on a synthetic model (no download needed):
//! fork cost, one decode step over a shared prefix, one 32-token suffix vs 6 batched rows.

use candle_core::quantized::GgmlDType;
use candle_core::Device;
use criterion::{criterion_group, criterion_main, Criterion};
use speccompact_runtime::synthetic::TinyModel;
use speccompact_runtime::{Architecture, LoadOptions, LogitsAt, Model, Row};

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.gguf");
    TinyModel {
        hidden: 256,
        layers: 4,
        heads: 8,
        kv_heads: 2,
        ffn: 768,
        dtype: GgmlDType::Q8_0,
        ..TinyModel::new(Architecture::Qwen2)
    }
    .write(&path)
    .unwrap();
    let m = Model::load(&path, &Device::Cpu, LoadOptions::default()).unwrap();
    let d = &m.decoder;
    let prefix_toks: Vec<u32> = (0..512u32).map(|i| i % 260).collect();
    let prefix = d.prefill(&prefix_toks, 512).unwrap().freeze().unwrap();
    c.bench_function("fork 512-token prefix", |b| {
        b.iter(|| std::hint::black_box(prefix.fork()))
    });
    c.bench_function("decode step over 512 prefix", |b| {
        let mut s = prefix.fork();
        d.extend(&mut s, &[5, 6, 7], 8).unwrap();
        b.iter(|| {
            d.forward(
                &mut [Row {
                    seq: &mut s,
                    tokens: &[9],
                }],
                LogitsAt::Last,
            )
            .unwrap();
            s.truncate(515).unwrap();
        })
    });
    let suffix: Vec<u32> = (0..32u32).map(|i| (i * 7) % 260).collect();
    c.bench_function("verify 1x32 over 512 prefix", |b| {
        b.iter(|| {
            let mut s = prefix.fork();
            d.forward(
                &mut [Row {
                    seq: &mut s,
                    tokens: &suffix,
                }],
                LogitsAt::Last,
            )
            .unwrap()
        })
    });
    c.bench_function("verify 6x32 over 512 prefix", |b| {
        b.iter(|| {
            let mut seqs: Vec<_> = (0..6).map(|_| prefix.fork()).collect();
            let mut rows: Vec<Row<'_>> = seqs
                .iter_mut()
                .map(|s| Row {
                    seq: s,
                    tokens: &suffix,
                })
                .collect();
            d.forward(&mut rows, LogitsAt::Last).unwrap()
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);
