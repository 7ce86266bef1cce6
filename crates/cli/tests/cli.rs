//! The `speccompact` binary on bad inputs (exit status and message), and one compaction of
//! the sample session with tiny random-weight models. Every run gets an empty model store
//! (`SPECCOMPACT_HOME`) and an empty working folder, so nothing is fetched or written
//! outside the test's temporary folder.

use speccompact_runtime::synthetic::TinyModel;
use speccompact_runtime::Architecture;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A temporary folder for one test: store home, working folder and written files.
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary folder");
        std::fs::create_dir(dir.path().join("home")).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `text` to `name`; returns its path as a string.
    fn file(&self, name: &str, text: &str) -> String {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    /// Writes a tiny random-weight GGUF model with a context of `context` tokens.
    fn tiny(&self, arch: Architecture, seed: u64, context: usize) -> String {
        let mut t = TinyModel::new(arch);
        t.seed = seed;
        t.context = context;
        let p = self.path(&format!("{arch:?}-{seed}-{context}.gguf"));
        t.write(&p).expect("write tiny model");
        p.display().to_string()
    }

    /// Runs the binary with `args`.
    fn run(&self, args: &[&str]) -> Output {
        self.run_logged(args, None)
    }

    /// Runs the binary with `args` and the log filter `log` (none: warnings only).
    fn run_logged(&self, args: &[&str], log: Option<&str>) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_speccompact"));
        c.args(args)
            .current_dir(self.dir.path())
            .env("SPECCOMPACT_HOME", self.path("home"))
            .env_remove("RUST_LOG");
        if let Some(l) = log {
            c.env("RUST_LOG", l).env("NO_COLOR", "1");
        }
        c.output().expect("run speccompact")
    }

    /// Runs the binary on each case's arguments and asserts the case's exit status and that
    /// stderr holds every one of its needles.
    #[track_caller]
    fn refuses(&self, cases: &[Refusal]) {
        for &(args, code, needles) in cases {
            let o = self.run(args);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(code), "{args:?}, stderr:\n{err}");
            for n in needles {
                assert!(
                    err.contains(n),
                    "{args:?}: `{n}` missing from stderr:\n{err}"
                );
            }
        }
    }
}

/// A refused command line: its arguments, the exit status and what stderr must hold.
type Refusal<'a> = (&'a [&'a str], i32, &'a [&'a str]);

fn sample() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/sample-session.json")
        .display()
        .to_string()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Small budgets for tiny models (random weights rarely end a generation on their own).
const FAST: &str = "eta = 0.5\ndraft_tokens = 12\nrepair_tokens = 8\nline_grace = 8\n\
                    slot_max_lines = 2\nslot_max_tokens = 32\nsummary_budget = 400\n";

/// Flag values clap refuses (exit status 2), naming the flag and, for the value enums, the
/// possible values.
#[test]
fn bad_flag_values_are_refused_with_the_possible_values() {
    let sample = sample();
    Sandbox::new().refuses(&[
        (
            &["compact", &sample, "--method", "fastest"],
            2,
            &[
                "invalid value 'fastest' for '--method <METHOD>'",
                "speculative, sequential, target-self, drafter-only",
            ],
        ),
        (
            &[
                "bench",
                "--data",
                "x.jsonl",
                "--methods",
                "speculative,fast",
            ],
            2,
            &["invalid value 'fast' for '--methods <METHODS>'"],
        ),
        (
            &["eval", "--data", "x.jsonl", "--methods", "full,everything"],
            2,
            &[
                "invalid value 'everything' for '--methods <METHODS>'",
                "truncate-tail, full",
            ],
        ),
        (
            &["compact", &sample, "--overflow", "sideways"],
            2,
            &[
                "invalid value 'sideways' for '--overflow <OVERFLOW>'",
                "stages, error, middle-cut",
            ],
        ),
        (
            &["compact", &sample, "--format", "table"],
            2,
            &["invalid value 'table' for '--format <FORMAT>'", "md, json"],
        ),
        (
            &["bench", "--data", "x.jsonl", "--format", "md"],
            2,
            &["invalid value 'md' for '--format <FORMAT>'", "table, json"],
        ),
        (
            &["compact", &sample, "--lookup", "sometimes"],
            2,
            &[
                "invalid value 'sometimes' for '--lookup <LOOKUP>'",
                "auto, on or off",
            ],
        ),
        (
            &["compact", &sample, "--verify", "strict"],
            2,
            &["invalid value 'strict' for '--verify <VERIFY>'"],
        ),
        (
            &["eval", "--data", "x.jsonl", "--tail-budget", "0"],
            2,
            &[
                "'--tail-budget <TAIL_BUDGET>'",
                "neither `matched` nor a positive token count",
            ],
        ),
    ]);
}

/// Inputs that parse but cannot be used (exit status 1): missing and malformed files, an
/// unknown model, a corrupt model file, bad settings; each named in the message.
#[test]
fn bad_inputs_are_named() {
    let s = Sandbox::new();
    let sample = sample();
    let missing = s.path("missing.json").display().to_string();
    let bad_json = s.file("bad.json", "{\"messages\": [{\"role\": \"user\", ");
    let drafter = s.tiny(Architecture::Llama, 3, 4096);
    let broken = s.file("broken.gguf", "GGUF but not really a model file");
    let unknown_key = s.file("bad.toml", "eta = 0.6\nspeed = \"fast\"\n");
    let eta = s.file("eta.toml", "eta = 1.5\n");
    let budget = s.file("budget.toml", "summary_budget = 0\n");
    s.refuses(&[
        (
            &["compact", &missing],
            1,
            &[&format!("reading {missing}"), "No such file"],
        ),
        (
            &["compact", &bad_json],
            1,
            &[&format!("parsing {bad_json}"), "not JSON"],
        ),
        // The list parses (spaces after the commas); the run then stops at the missing file.
        (
            &[
                "bench",
                "--data",
                "missing.jsonl",
                "--methods",
                "speculative, sequential",
            ],
            1,
            &["reading missing.jsonl"],
        ),
        (
            &["compact", &sample, "--lookup", "off,on"],
            1,
            &["--lookup takes one mode here", "for `bench`"],
        ),
        (
            &["compact", &sample, "--target", "no-such-model"],
            1,
            &[
                "unknown model `no-such-model`",
                "known models:",
                "qwen2.5-coder-0.5b-instruct",
            ],
        ),
        (
            &[
                "compact",
                &sample,
                "--drafter",
                &drafter,
                "--target",
                &broken,
            ],
            1,
            &[&format!("{broken} is not a valid GGUF file")],
        ),
        (
            &["compact", &sample, "--config", &unknown_key],
            1,
            &[&format!("config {unknown_key}"), "unknown field `speed`"],
        ),
        (
            &["compact", &sample, "--config", &eta],
            1,
            &[&format!("config {eta}"), "eta must be in (0, 1], not 1.5"],
        ),
        (
            &["compact", &sample, "--config", &budget],
            1,
            &["summary_budget must be at least 1"],
        ),
        (
            &["compact", &sample, "--eta", "0"],
            1,
            &["config command line: eta must be in (0, 1], not 0"],
        ),
    ]);
}

#[test]
fn history_over_a_tiny_context_fails_with_overflow_error() {
    let s = Sandbox::new();
    let drafter = s.tiny(Architecture::Llama, 3, 256);
    let target = s.tiny(Architecture::Qwen2, 5, 256);
    let sample = sample();
    s.refuses(&[(
        &[
            "--threads",
            "1",
            "compact",
            &sample,
            "--drafter",
            &drafter,
            "--target",
            &target,
            "--overflow",
            "error",
        ],
        1,
        &[
            "the history is",
            "whose context of 256 tokens",
            "--overflow stages",
        ],
    )]);
}

#[test]
fn workspace_commands_refuse_unknown_sessions_and_full_windows() {
    let s = Sandbox::new();
    let ws = s.path("ws").display().to_string();
    let o = s.run(&["ingest", &sample(), "--workspace", &ws]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with("session sample-flaky-upload: "),
        "stdout:\n{out}"
    );
    // Both fail before the target's tokenizer would be fetched (the store here is empty).
    s.refuses(&[
        (&["assemble", "nobody", "--workspace", &ws], 1, &["nobody"]),
        (
            &[
                "assemble",
                "sample-flaky-upload",
                "--window",
                "2000",
                "--workspace",
                &ws,
            ],
            1,
            &["2500", "leave nothing of the 2000-token window"],
        ),
    ]);
}

#[test]
fn compact_sample_session_with_tiny_models_gives_six_slots_and_a_trace() {
    let s = Sandbox::new();
    let drafter = s.tiny(Architecture::Llama, 3, 16384);
    let target = s.tiny(Architecture::Qwen2, 5, 16384);
    let cfg = s.file("fast.toml", FAST);
    let o = s.run(&[
        "--threads",
        "1",
        "compact",
        &sample(),
        "--drafter",
        &drafter,
        "--target",
        &target,
        "--config",
        &cfg,
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "stderr:\n{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    assert_eq!(v["method"], "speculative");
    let slots = v["slots"].as_array().expect("slots");
    let names: Vec<&str> = slots.iter().map(|s| s["name"].as_str().unwrap()).collect();
    let six = "goal constraints_preferences progress key_decisions next_steps critical_context";
    assert_eq!(names, six.split(' ').collect::<Vec<_>>());
    let trace = v["trace"].as_object().expect("trace");
    assert!(trace["wall_ms"].as_f64().unwrap() > 0.0, "{trace:?}");
    assert!(trace["drafter_calls"].as_u64().unwrap() > 0, "{trace:?}");
    assert!(v["markdown"].as_str().is_some_and(|m| m.contains("## ")));
}

/// `--prompt-only` prints the sequential method's one call as token ids: the prefix the
/// sequential run prefilled, then the request.
#[test]
fn prompt_only_prints_the_sequential_call_as_tokens() {
    let s = Sandbox::new();
    let drafter = s.tiny(Architecture::Llama, 3, 16384);
    let target = s.tiny(Architecture::Qwen2, 5, 16384);
    let cfg = s.file("fast.toml", FAST);
    let common = [
        "--threads",
        "1",
        "compact",
        &sample(),
        "--drafter",
        &drafter,
        "--target",
        &target,
        "--config",
        &cfg,
        "--method",
        "sequential",
    ];
    let o = s.run(&[&common[..], &["--prompt-only"]].concat());
    assert!(o.status.success(), "stderr:\n{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    let tokens = p["tokens"].as_array().expect("tokens");
    assert!(tokens.iter().all(|t| t.as_u64().is_some()));
    assert!(p["max_tokens"].as_u64().unwrap() > 0);
    let text = p["text"].as_str().expect("text");
    assert!(
        text.contains("UploadClient") && text.contains("## "),
        "{text}"
    );
    let o = s.run(&[&common[..], &["--format", "json"]].concat());
    assert!(o.status.success(), "stderr:\n{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    let prefix = v["trace"]["target_prefix_tokens"].as_u64().unwrap() as usize;
    assert!(
        prefix > 0 && prefix < tokens.len(),
        "{prefix} of {}",
        tokens.len()
    );
}

/// `align data` with tiny models: every slot of the session is an example or a counted drop,
/// the manifest names both models, and a second run resumes instead of building again.
#[test]
fn align_data_builds_accounts_for_every_slot_and_resumes() {
    let s = Sandbox::new();
    let drafter = s.tiny(Architecture::Llama, 3, 16384);
    let target = s.tiny(Architecture::Qwen2, 5, 16384);
    let cfg = s.file("fast.toml", FAST);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sample()).unwrap()).unwrap();
    v["id"] = "sample".into();
    v["license"] = "MIT".into();
    let data = s.file("sessions.jsonl", &format!("{v}\n"));
    let args = [
        "--threads",
        "1",
        "align",
        "data",
        "--data",
        &data,
        "--out",
        "aligned",
        "--drafter",
        &drafter,
        "--target",
        &target,
        "--config",
        &cfg,
        "--max-prompt-tokens",
        "1500",
    ];
    let o = s.run(&args);
    assert!(o.status.success(), "stderr:\n{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("1 built") && out.contains("0 resumed"),
        "{out}"
    );
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s.path("aligned/manifest.json")).unwrap())
            .unwrap();
    let count = |x: &serde_json::Value| -> u64 {
        x.as_object()
            .unwrap()
            .values()
            .map(|n| n.as_u64().unwrap())
            .sum()
    };
    assert_eq!(count(&m["examples"]) + count(&m["dropped"]), 6, "{m}");
    assert!(
        m["drafter"]["sha256"]
            .as_str()
            .is_some_and(|h| h.len() == 64),
        "{m}"
    );
    assert_eq!(m["data"]["licences"]["MIT"], 1);
    let o = s.run(&args);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("0 built") && out.contains("1 resumed"),
        "{out}"
    );
    s.refuses(&[(
        &["align", "data", "--data", "missing.jsonl", "--out", "x"],
        1,
        &["reading missing.jsonl"],
    )]);
}

/// `--drafter-adapter` puts a LoRA adapter on the drafter: one trained on that drafter file
/// is used (a side path on every projection; what it changes is tested on the model), one
/// that records another file or a missing folder is refused with what is wrong.
#[test]
fn a_drafter_adapter_is_used_on_its_base_and_refused_on_another() {
    let s = Sandbox::new();
    let drafter = s.tiny(Architecture::Llama, 3, 16384);
    let target = s.tiny(Architecture::Qwen2, 5, 16384);
    let cfg = s.file("fast.toml", FAST);
    let mut spec = TinyModel::new(Architecture::Llama);
    spec.seed = 3;
    let (sha, _) = speccompact_store::sha256_file(Path::new(&drafter)).unwrap();
    let mut adapter = spec.random_adapter(4, 1).unwrap();
    adapter.base_sha256 = Some(sha.clone());
    adapter.save(&s.path("good")).unwrap();
    adapter.base_sha256 = Some("f".repeat(64));
    adapter.save(&s.path("other")).unwrap();
    let session = sample();
    // Every run logs the loader's messages.
    let compact = |extra: &[&str]| {
        let mut args = vec![
            "--threads",
            "1",
            "compact",
            &session,
            "--drafter",
            &drafter,
            "--target",
            &target,
            "--config",
            &cfg,
            "--format",
            "json",
        ];
        args.extend_from_slice(extra);
        s.run_logged(&args, Some("speccompact_loader=info"))
    };
    // The drafter runs with a side path on each of its 2 x 7 projections.
    let good = s.path("good").display().to_string();
    let o = compact(&["--drafter-adapter", &good]);
    assert!(o.status.success(), "stderr:\n{}", stderr(&o));
    assert!(
        stderr(&o).contains("side_paths=14"),
        "stderr:\n{}",
        stderr(&o)
    );
    let o = compact(&[]);
    assert!(!stderr(&o).contains("drafter adapter"), "{}", stderr(&o));
    let other = s.path("other").display().to_string();
    let o = compact(&["--drafter-adapter", &other]);
    assert_eq!(o.status.code(), Some(1), "stderr:\n{}", stderr(&o));
    assert!(
        stderr(&o).contains(&sha) && stderr(&o).contains("ffff"),
        "{}",
        stderr(&o)
    );
    let o = compact(&["--drafter-adapter", "no-such-adapter"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no-such-adapter/adapter_config.json"),
        "{}",
        stderr(&o)
    );
}
