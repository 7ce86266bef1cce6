//! The bench harness: methods interleaved session by session, speedups relative to
//! `sequential`, and the table, on the scripted backend.

use speccompact_engine::scripted::Scripted;
use speccompact_engine::{CompactionConfig, Compactor, Method};
use speccompact_history::parse_value;
use std::sync::Arc;

#[test]
fn bench_interleaves_methods_and_relates_them_to_sequential() {
    // The drafter writes one line, for the first slot only, at its start.
    let d = Scripted::new("d").with_generate(|s, p| {
        if s == 0 && p.ends_with("## Goal\n") {
            "- x\n".into()
        } else {
            String::new()
        }
    });
    let t = Scripted::new("t")
        .with_judge(|_, _| vec![("Yes".into(), 0.9), ("No".into(), 0.1)])
        .with_generate(|_, _| "## Goal\n- y\n".into());
    let cfg = CompactionConfig {
        eta: 0.7,
        ..CompactionConfig::default()
    };
    let c = Compactor::new(Arc::new(d), Arc::new(t), cfg).unwrap();
    let session =
        parse_value(&serde_json::json!([{"role": "user", "content": "Fix src/parser.rs."}]))
            .unwrap();
    let sessions = vec![session.clone(), session];
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
