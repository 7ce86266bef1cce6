//! The bench harness: methods interleaved session by session, speedups relative to
//! `sequential`, and the table, on the scripted backend.

use speccompact_engine::scripted::Scripted;
use speccompact_engine::{CompactionConfig, Compactor, Method};
use speccompact_history::{parse_value, History};
use std::sync::Arc;

fn history() -> History {
    parse_value(&serde_json::json!([
        {"role": "user", "content": "Fix the failing test in src/parser.rs; never touch main."},
        {"role": "assistant", "content": "Running cargo test."},
        {"role": "tool", "name": "bash", "content": "exit 1: test parse_header failed"}
    ]))
    .unwrap()
}

fn config(eta: f32) -> CompactionConfig {
    let mut c = CompactionConfig::default();
    c.eta = eta;
    c
}

/// The lines accepted so far in the first slot's request.
fn accepted_in(prompt: &str) -> Vec<String> {
    let body = prompt.split_once("## Goal\n").map_or("", |(_, b)| b);
    body.lines().map(str::to_string).collect()
}

fn yes(p: f32) -> Vec<(String, f32)> {
    vec![("Yes".into(), p), ("No".into(), 1.0 - p)]
}

#[test]
fn bench_interleaves_methods_and_relates_them_to_sequential() {
    let d = Scripted::new("d").with_generate(|s, p| match accepted_in(p).len() {
        0 if s == 0 => "- x\n".into(),
        _ => String::new(),
    });
    let t = Scripted::new("t")
        .with_judge(|_, _| yes(0.9))
        .with_generate(|_, _| "## Goal\n- y\n".into());
    let c = Compactor::new(Arc::new(d), Arc::new(t), config(0.7)).unwrap();
    let sessions = vec![history(), history()];
    let mut order = Vec::new();
    let rep = speccompact_eval::bench::run(
        &c,
        &sessions,
        &[Method::Speculative, Method::Sequential],
        &mut |i, m| order.push((i, m)),
    )
    .unwrap();
    assert_eq!(
        order,
        [
            (0, Method::Speculative),
            (0, Method::Sequential),
            (1, Method::Speculative),
            (1, Method::Sequential)
        ]
    );
    assert_eq!(rep.runs.len(), 4);
    let seq = &rep.runs[1];
    assert_eq!(seq.speedup_cold, Some(1.0));
    let spec = &rep.runs[0];
    let expect = seq.trace.wall_ms / spec.trace.wall_ms;
    assert!((spec.speedup_cold.unwrap() - expect).abs() < 1e-9);
    assert_eq!(rep.summary.len(), 2);
    assert_eq!(rep.summary[0].sessions, 2);
    assert_eq!(rep.summary[0].acceptance_rate, 1.0);
    let table = rep.table();
    assert!(table.contains("| speculative | 2 |"), "{table}");
    assert_eq!(
        table
            .lines()
            .filter(|l| l.contains("| sequential |"))
            .count(),
        3
    );
}
