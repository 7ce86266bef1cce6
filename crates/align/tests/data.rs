//! `align data` end to end on scripted models: which bodies become examples, the labels'
//! mask, the drafter-token cap, resuming, and refusing a folder built for another selection.

use speccompact_align::{build, DataOptions, ModelFile};
use speccompact_engine::{prompt, Backend, CompactionConfig, Compactor, Scripted};
use speccompact_eval::{load_sessions, EvalSession};
use speccompact_runtime::{synthetic::TinyModel, Architecture, LoadOptions, Model, Tokenizer};
use std::path::{Path, PathBuf};

/// Slot bodies by slot index: one good, then empty, looping, copied, unsourced, good.
fn body(slot: usize) -> String {
    match slot {
        0 => "- Fix the retry test in tests/test_upload.py.".into(),
        1 => "### Done\n".into(),
        2 => "- Checked attempt 1 of the test.\n- Checked attempt 3 of the test.".into(),
        3 => "- FAILED tests/test_upload.py::test_retry - expected 3 calls, got 4".into(),
        4 => "- Edit `src/upload/client.rs` next.".into(),
        _ => "- The limit stays at 3 attempts.".into(),
    }
}

fn compactor() -> Compactor<Scripted> {
    let target = Scripted::new("target").with_generate(|stream, _| format!("{}\n", body(stream)));
    Compactor::new(
        Scripted::new("drafter"),
        target,
        CompactionConfig::default(),
    )
    .unwrap()
}

fn tokenizer(dir: &Path) -> Tokenizer {
    let path = dir.join("tiny.gguf");
    TinyModel::new(Architecture::Qwen2).write(&path).unwrap();
    Model::load(&path, &candle_core::Device::Cpu, LoadOptions::default())
        .unwrap()
        .tokenizer
}

fn sessions(dir: &Path, n: usize) -> (PathBuf, Vec<EvalSession>) {
    let path = dir.join("sessions.jsonl");
    let mut text = String::new();
    for i in 0..n {
        let mut messages = vec![
            serde_json::json!({"role": "user", "content": "fix the retry test in tests/test_upload.py; keep MAX_RETRIES = 3"}),
        ];
        for k in 0..(4 + 20 * i) {
            messages.push(serde_json::json!({"role": "assistant", "content": format!("step {k}: reading the upload client")}));
        }
        messages.push(serde_json::json!({"role": "tool", "content": "FAILED tests/test_upload.py::test_retry - expected 3 calls, got 4"}));
        let s = serde_json::json!({"id": format!("s{i}"), "source": "test", "license": "MIT", "kind": "coding", "messages": messages, "probes": []});
        text.push_str(&format!("{s}\n"));
    }
    std::fs::write(&path, text).unwrap();
    let all = load_sessions(&path).unwrap();
    (path, all)
}

/// A drafter-token cap 150 words above the prompt of an empty history: the shortest test
/// session fits whole, the longer ones are cut.
fn cap(c: &Compactor<Scripted>) -> usize {
    let (d, cfg) = (c.drafter(), c.config());
    let empty = d
        .count_tokens(&prompt::prefix(d.format(), cfg, ""))
        .unwrap();
    let request = prompt::slot_requests(d.format(), cfg)
        .iter()
        .map(|r| d.count_tokens(r).unwrap())
        .max()
        .unwrap();
    empty + request + 150
}

fn models(dir: &Path) -> [ModelFile; 2] {
    ["drafter", "target"].map(|n| ModelFile {
        name: n.into(),
        path: dir.join(format!("{n}.gguf")),
    })
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap()
}

#[test]
fn bodies_are_filtered_labels_masked_and_prompts_capped() {
    let dir = tempfile::tempdir().unwrap();
    let (data, all) = sessions(dir.path(), 3);
    let c = compactor();
    let tok = tokenizer(dir.path());
    let [d, t] = models(dir.path());
    let opts = DataOptions {
        out: dir.path().join("out"),
        max_prompt_tokens: cap(&c),
        validation_percent: 0,
    };
    let s = build(&c, &tok, [&d, &t], &data, &all, &opts, &mut |_, _, _| {}).unwrap();
    assert_eq!((s.sessions, s.built), (3, 3));
    // Two good bodies per session; one of each other reason.
    assert_eq!(s.examples["train"], 6, "{s:?}");
    assert_eq!(s.examples["validation"], 0);
    for reason in ["empty", "looping", "copied", "unsourced"] {
        assert_eq!(s.dropped[reason], 3, "{reason}: {s:?}");
    }
    let texts: Vec<serde_json::Value> = read(&opts.out, "train.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let tokens: Vec<serde_json::Value> = read(&opts.out, "train.tokens.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(texts.len(), 6);
    let cfg = c.config();
    let f = c.drafter().format();
    for (x, y) in texts.iter().zip(&tokens) {
        let prompt_text = x["prompt"].as_str().unwrap();
        let completion = x["completion"].as_str().unwrap();
        // The prompt is the engine's: a shared prefix, then the slot's request.
        let spec = cfg.slots.iter().find(|s| s.name == x["slot"]).unwrap();
        let request = prompt::slot_request(f, cfg, spec);
        let prefix = prompt_text
            .strip_suffix(&request)
            .expect("ends with the request");
        assert!(prefix.starts_with(&prompt::prefix(f, cfg, "")[..40]));
        // Labels: −100 over exactly the prompt's tokens, the ids after it.
        let ids: Vec<u32> = serde_json::from_value(y["input_ids"].clone()).unwrap();
        let labels: Vec<i64> = serde_json::from_value(y["labels"].clone()).unwrap();
        let n_prompt =
            tok.encode(prefix, true).unwrap().len() + tok.encode(&request, false).unwrap().len();
        assert_eq!(ids.len(), labels.len());
        assert!(labels[..n_prompt].iter().all(|&l| l == -100));
        assert!(labels[n_prompt..]
            .iter()
            .zip(&ids[n_prompt..])
            .all(|(&l, &i)| l == i64::from(i)));
        assert_eq!(
            tok.decode(&ids[n_prompt..ids.len() - 1]).unwrap(),
            completion
        );
        assert!(tok.eos_tokens().contains(ids.last().unwrap()));
        // The cap holds in the drafter's own count (the scripted drafter counts words).
        assert!(c.drafter().count_tokens(prompt_text).unwrap() <= opts.max_prompt_tokens);
    }
    // The long sessions were cut in the middle, the short one was not.
    let s0: serde_json::Value =
        serde_json::from_str(&read(&opts.out, "sessions/00000.json")).unwrap();
    let s2: serde_json::Value =
        serde_json::from_str(&read(&opts.out, "sessions/00002.json")).unwrap();
    assert!(s0["omitted"].is_null());
    assert!(s2["omitted"].is_array(), "{}", s2["omitted"]);
    let manifest: serde_json::Value =
        serde_json::from_str(&read(&opts.out, "manifest.json")).unwrap();
    assert_eq!(manifest["data"]["licences"]["MIT"], 3);
    assert_eq!(manifest["dropped"]["copied"], 3);
}

#[test]
fn a_stopped_build_resumes_to_the_same_files() {
    let dir = tempfile::tempdir().unwrap();
    let (data, all) = sessions(dir.path(), 3);
    let c = compactor();
    let tok = tokenizer(dir.path());
    let [d, t] = models(dir.path());
    let opts = |out: &str| DataOptions {
        out: dir.path().join(out),
        max_prompt_tokens: cap(&c),
        validation_percent: 50,
    };
    let whole = opts("whole");
    build(&c, &tok, [&d, &t], &data, &all, &whole, &mut |_, _, _| {}).unwrap();
    // Stopped after two sessions, then run again on the whole selection.
    let parts = opts("parts");
    build(
        &c,
        &tok,
        [&d, &t],
        &data,
        &all[..2],
        &parts,
        &mut |_, _, _| {},
    )
    .unwrap();
    let mut resumed = Vec::new();
    let s = build(&c, &tok, [&d, &t], &data, &all, &parts, &mut |_, id, r| {
        resumed.push((id.to_string(), r))
    })
    .unwrap();
    assert_eq!(s.built, 1);
    assert_eq!(
        resumed,
        [
            ("s0".into(), true),
            ("s1".into(), true),
            ("s2".into(), false)
        ]
    );
    for f in [
        "train.jsonl",
        "validation.jsonl",
        "train.tokens.jsonl",
        "validation.tokens.jsonl",
        "manifest.json",
        "sessions/00002.json",
    ] {
        assert_eq!(read(&whole.out, f), read(&parts.out, f), "{f}");
    }
    // A folder built for another selection, or a damaged session file, is refused by name.
    let err = build(
        &c,
        &tok,
        [&d, &t],
        &data,
        &all[1..],
        &parts,
        &mut |_, _, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("00000.json") && err.contains("s0"), "{err}");
    std::fs::write(parts.out.join("sessions/00001.json"), "{").unwrap();
    let err = build(&c, &tok, [&d, &t], &data, &all, &parts, &mut |_, _, _| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("00001.json") && err.contains("not JSON"),
        "{err}"
    );
}

#[test]
fn impossible_settings_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (data, all) = sessions(dir.path(), 1);
    let c = compactor();
    let tok = tokenizer(dir.path());
    let [d, t] = models(dir.path());
    for (max, pct) in [(0, 10), (2048, 101)] {
        let opts = DataOptions {
            out: dir.path().join("x"),
            max_prompt_tokens: max,
            validation_percent: pct,
        };
        let err = build(&c, &tok, [&d, &t], &data, &all, &opts, &mut |_, _, _| {}).unwrap_err();
        assert!(
            err.to_string().contains("invalid alignment settings"),
            "{err}"
        );
    }
    // A cap below the prompt's own instructions drops the session's every slot as too long.
    let opts = DataOptions {
        out: dir.path().join("y"),
        max_prompt_tokens: 50,
        validation_percent: 0,
    };
    let s = build(&c, &tok, [&d, &t], &data, &all, &opts, &mut |_, _, _| {}).unwrap();
    assert_eq!(s.dropped["too_long"], 6);
    assert_eq!(s.examples["train"], 0);
}
