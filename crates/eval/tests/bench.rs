//! The bench harness: methods interleaved session by session, speedups relative to
//! `sequential`, and the table, on the scripted backend.

use speccompact_engine::scripted::Scripted;
use speccompact_engine::{CompactionConfig, Compactor, Method};
use speccompact_eval::bench::Variant;
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
    let one = [Variant {
        label: String::new(),
        compactor: &c,
    }];
    let rep = speccompact_eval::bench::run(
        &one,
        &sessions,
        &[Method::Speculative, Method::Sequential],
        &mut |i, _, m| order.push((i, m)),
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
    assert!(
        rep.variant_table().is_empty(),
        "one variant, no variant table"
    );
}

/// Variants run in turn on each session; each is related to its own sequential run and set
/// against the first variant: a variant whose target writes the same summaries is identical
/// on every session, one whose target writes another line on none.
#[test]
fn bench_sets_each_variant_against_the_first() {
    let drafter = || Arc::new(Scripted::new("d"));
    let target = |line: &'static str| {
        Arc::new(
            Scripted::new("t")
                .with_judge(|_, _| vec![("Yes".into(), 0.9), ("No".into(), 0.1)])
                .with_generate(move |_, _| format!("## Goal\n- {line}\n")),
        )
    };
    let cfg = CompactionConfig::default();
    let a = Compactor::new(drafter(), target("y"), cfg.clone()).unwrap();
    let b = Compactor::new(drafter(), target("y"), cfg.clone()).unwrap();
    let z = Compactor::new(drafter(), target("z"), cfg).unwrap();
    let session =
        parse_value(&serde_json::json!([{"role": "user", "content": "Fix src/parser.rs."}]))
            .unwrap();
    let variants: Vec<Variant<_>> = [("off", &a), ("same", &b), ("other", &z)]
        .into_iter()
        .map(|(label, compactor)| Variant {
            label: label.into(),
            compactor,
        })
        .collect();
    let mut order = Vec::new();
    let rep = speccompact_eval::bench::run(
        &variants,
        &[session.clone(), session],
        &[Method::Sequential],
        &mut |i, v, _| order.push((i, v.to_string())),
    )
    .unwrap();
    let expect: Vec<(usize, String)> = [0, 1]
        .into_iter()
        .flat_map(|i| ["off", "same", "other"].map(|v| (i, v.to_string())))
        .collect();
    assert_eq!(order, expect);
    assert!(rep.runs.iter().all(|r| r.speedup_cold == Some(1.0)));
    assert_eq!(rep.summary.len(), 3);
    assert!(rep.summary.iter().all(|s| s.sessions == 2));
    let table = rep.variant_table();
    let row = |v: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("| sequential | {v} |")))
            .unwrap_or_else(|| panic!("no row for {v}: {table}"))
            .to_string()
    };
    assert!(row("same").contains("| 2/2 |"), "{table}");
    assert!(row("other").contains("| 0/2 |"), "{table}");
    assert!(table.contains("identical to off"), "{table}");
    assert!(
        rep.table().contains("| sequential (other) | 2 |"),
        "{}",
        rep.table()
    );
}
