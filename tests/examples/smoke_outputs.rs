//! Prints every method's compaction of the smoke sessions with the scripted backend and with
//! tiny random-weight models: slots, lines, origins, verification ratios and the trace's
//! counters (no times), and the progress events with every rejected line. Two builds that print the same text compact alike, which is how a
//! refactor shows it changed no behaviour:
//!
//! `cargo run --release -p speccompact-tests --example smoke_outputs > before.txt`

use speccompact_engine::{Compaction, CompactionConfig, Compactor, Method, Scripted};
use speccompact_history::{parse_sessions, History};
use speccompact_runtime::Architecture;
use std::hash::{Hash, Hasher};

fn hash(stream: usize, prompt: &str) -> u64 {
    // SipHash with fixed keys: the same on every run and machine.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    stream.hash(&mut h);
    prompt.hash(&mut h);
    h.finish()
}

/// A scripted pair whose outputs depend only on the prompt: drafts of a few lines (some
/// copied from the prompt, some cut), judgments that accept about two lines in three.
fn scripted(name: &str) -> Scripted {
    Scripted::new(name)
        .with_generate(|stream, prompt| {
            let h = hash(stream, prompt);
            let words: Vec<&str> = prompt.split_whitespace().collect();
            let mut out = String::new();
            for k in 0..(1 + h % 3) {
                let at = ((h >> (8 * k)) as usize) % words.len().max(1);
                let take = 3 + ((h >> (4 * k)) as usize) % 6;
                let line: Vec<&str> = words.iter().skip(at).take(take).copied().collect();
                out.push_str("- ");
                out.push_str(&line.join(" "));
                out.push('\n');
            }
            if h % 5 == 0 {
                out.push_str("- an unfinished");
            }
            out
        })
        .with_judge(|stream, prompt| {
            let h = hash(stream, prompt);
            let yes = if h % 3 == 0 { 0.2 } else { 0.8 };
            vec![("Yes".into(), yes), ("No".into(), 1.0 - yes)]
        })
}

fn dump(label: &str, m: Method, c: &Compaction) {
    println!("=== {label} {m}");
    for s in &c.slots {
        println!("[{}] stop={:?}", s.name, s.stop);
        for l in &s.lines {
            println!("  {:?} {:?} {:?}", l.origin, l.r, l.text);
        }
    }
    let t = &c.trace;
    println!(
        "trace: drafter_calls={} verify_calls={} repair_calls={} batches={} lines_proposed={} \
         accepted={} rejected={} repaired={} lines_failed_checks={} whole_slot={} \
         spec_tokens_drafted={} spec_tokens_kept={} stages={:?}",
        t.drafter_calls,
        t.verify_calls,
        t.repair_calls,
        t.batches,
        t.lines_proposed,
        t.lines_accepted,
        t.lines_rejected,
        t.lines_repaired,
        t.lines_failed_checks,
        t.whole_slot_calls,
        t.spec_tokens_drafted,
        t.spec_tokens_kept,
        t.stages
    );
}

fn run<B: speccompact_engine::Backend + 'static>(
    label: &str,
    c: &Compactor<B>,
    sessions: &[History],
) {
    for (k, h) in sessions.iter().enumerate() {
        for m in Method::ALL {
            let label = format!("{label} session {k}");
            let mut events = Vec::new();
            match c.compact_blocking(h, m, &mut |e| events.push(format!("{e:?}"))) {
                Ok(out) => {
                    dump(&label, m, &out);
                    for e in events {
                        println!("event: {e}");
                    }
                }
                Err(e) => println!("=== {label} {m}\nerror: {e}"),
            }
        }
    }
}

fn main() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/evaldata/dev/smoke.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let sessions = parse_sessions(&text).expect("smoke sessions");

    let cfg = CompactionConfig {
        slot_max_lines: 3,
        ..CompactionConfig::default()
    };
    let scripted_pair =
        Compactor::new(scripted("drafter"), scripted("target"), cfg).expect("scripted compactor");
    run("scripted", &scripted_pair, &sessions);

    let dir = tempfile::tempdir().expect("temp dir");
    let tiny = |arch, seed| {
        speccompact_tests::tiny_backend_with_context(arch, seed, dir.path(), 256, Some(16384))
    };
    // Small budgets: random weights rarely end a line.
    let small = "eta = 0.5\ndraft_tokens = 12\nrepair_tokens = 8\nslot_max_lines = 2\n\
                 slot_max_tokens = 32\nsummary_budget = 200\n";
    let cfg = CompactionConfig::overlay(small, "smoke_outputs").expect("tiny settings");
    let tiny_pair = Compactor::new(
        tiny(Architecture::Llama, 3),
        tiny(Architecture::Qwen2, 5),
        cfg,
    )
    .expect("tiny compactor");
    run("tiny", &tiny_pair, &sessions);
}
