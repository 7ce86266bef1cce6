//! Field extraction, `render_kept`, per-slot ranking and slot-conditioned views on hand-made
//! histories, with two simple token counters (whitespace words and characters / 4).

use speccompact_history::{
    extract_fields, rank, render, render_kept, slot_view, History, Message, PatchCoord,
    RenderOptions, Role, View, ViewOptions,
};

const SLOTS: [&str; 7] = [
    "goal",
    "constraints_preferences",
    "progress",
    "key_decisions",
    "next_steps",
    "critical_context",
    "something_else",
];

fn words(s: &str) -> usize {
    s.split_whitespace().count()
}

fn quarter_chars(s: &str) -> usize {
    s.chars().count().div_ceil(4)
}

fn tool(content: &str) -> Message {
    let mut m = Message::text(Role::Tool, content);
    m.name = Some("bash".into());
    m
}

fn filler(i: usize) -> String {
    format!("listing {i}: {}", "alpha beta gamma delta ".repeat(40))
}

const NEVER_PUSH: &str = "never push to main; open a PR from a branch instead";
const FAILING: &str =
    "$ cargo test\nFAILED tests::login_flow\ntest result: FAILED. 1 passed; 3 failed\nexit 1";

/// System, task, then 30 rounds of assistant chatter and long tool output, with a user
/// constraint at round 12 and a failing test run at round 18, then a short ending.
fn long_history() -> History {
    let mut messages = vec![
        Message::text(Role::System, "You are a coding agent."),
        Message::text(Role::User, "Please fix the flaky login test in the API."),
    ];
    for i in 0..30 {
        messages.push(Message::text(
            Role::Assistant,
            &format!("Looking at part {i}."),
        ));
        match i {
            12 => messages.push(Message::text(Role::User, NEVER_PUSH)),
            18 => messages.push(tool(FAILING)),
            _ => messages.push(tool(&filler(i))),
        }
    }
    messages.push(Message::text(
        Role::Assistant,
        "I will rerun the tests next.",
    ));
    messages.push(Message::text(Role::User, "ok"));
    messages.push(Message::text(Role::Assistant, "Running them now."));
    History { id: None, messages }
}

fn index_of(h: &History, content: &str) -> usize {
    h.messages
        .iter()
        .position(|m| m.content == content)
        .expect("fixture message")
}

/// Kept and omitted partition the messages; one marker line per omitted run naming its
/// 1-based inclusive range, message count and characters; kept contents are present.
fn check_markers(h: &History, v: &View) {
    let mut covered = vec![0; h.messages.len()];
    for &i in &v.kept {
        covered[i] += 1;
    }
    for r in &v.omitted {
        assert!(!r.is_empty(), "empty run {r:?}");
        for i in r.clone() {
            covered[i] += 1;
        }
        let chars: usize = h.messages[r.clone()]
            .iter()
            .map(|m| m.content.chars().count())
            .sum();
        let marker = format!(
            "[... messages {}-{} ({} messages, {chars} characters) omitted ...]",
            r.start + 1,
            r.end,
            r.len()
        );
        assert_eq!(v.text.matches(&marker).count(), 1, "{marker} in {}", v.text);
    }
    assert!(covered.iter().all(|&c| c == 1), "{covered:?}");
    assert!(v.kept.windows(2).all(|w| w[0] < w[1]), "{:?}", v.kept);
    assert_eq!(v.text.matches("[... messages ").count(), v.omitted.len());
}

#[test]
fn extract_fields_reads_exit_codes_tests_paths_and_hunks() {
    let text = "$ pytest tests/test_api.py\n3 failed, 9 passed\nexit 1\n+++ b/src/app.py\n@@ -10,4 +10,6 @@";
    let f = extract_fields(text);
    assert_eq!(f.exit_codes, vec![1]);
    assert_eq!(f.test_results, vec!["3 failed", "9 passed"]);
    assert!(f.paths.contains(&"tests/test_api.py".to_string()), "{f:?}");
    assert!(f.paths.contains(&"src/app.py".to_string()), "{f:?}");
    assert_eq!(
        f.patches,
        vec![PatchCoord {
            file: Some("src/app.py".into()),
            old_start: 10,
            old_lines: 4,
            new_start: 10,
            new_lines: 6,
        }]
    );
}

#[test]
fn render_kept_with_everything_kept_is_render() {
    let h = long_history();
    let n = h.messages.len();
    for omit in [
        None,
        Some(0..3),
        Some(5..9),
        Some(60..100),
        Some(std::ops::Range { start: 9, end: 4 }),
    ] {
        let opts = RenderOptions {
            tool_result_cap: 50,
            omit,
        };
        assert_eq!(render_kept(&h, &vec![true; n], &opts), render(&h, &opts));
        assert_eq!(render_kept(&h, &[], &opts), render(&h, &opts));
    }
    // Two runs: messages 2-3 and the last two.
    let mut kept = vec![true; n];
    for i in [1, 2, n - 2, n - 1] {
        kept[i] = false;
    }
    let t = render_kept(&h, &kept, &RenderOptions::default());
    assert!(
        t.contains(
            "[... messages 2-3 (2 messages, 61 characters) omitted ...]\n\n[tool bash]\nlisting 0:"
        ),
        "{t}"
    );
    assert!(t.ends_with(&format!(
        "[... messages {}-{n} (2 messages, 19 characters) omitted ...]\n\n",
        n - 1
    )));
}

#[test]
fn a_history_that_fits_is_the_full_render() {
    let h = long_history();
    let opts = ViewOptions::new(words(&render(&h, &RenderOptions::default())));
    for slot in SLOTS {
        let v = slot_view(&h, slot, &opts, &mut words);
        assert_eq!(v.text, render(&h, &opts.render));
        assert!(v.omitted.is_empty());
        assert_eq!(v.kept, (0..h.messages.len()).collect::<Vec<_>>());
    }
}

#[test]
fn views_fit_the_budget_and_keep_head_and_tail() {
    let h = long_history();
    let n = h.messages.len();
    let counters: [fn(&str) -> usize; 2] = [words, quarter_chars];
    for count in counters {
        let full = count(&render(&h, &RenderOptions::default()));
        for budget in [400, 700, 1500, full - 1] {
            for slot in SLOTS {
                let opts = ViewOptions::new(budget);
                let v = slot_view(&h, slot, &opts, &mut |s| count(s));
                assert!(
                    count(&v.text) <= budget,
                    "{slot} {budget}: {}",
                    count(&v.text)
                );
                assert!(!v.omitted.is_empty(), "{slot} {budget}");
                for i in [0, 1, n - 4, n - 3, n - 2, n - 1] {
                    assert!(
                        v.kept.contains(&i),
                        "{slot} {budget}: {i} not in {:?}",
                        v.kept
                    );
                }
                check_markers(&h, &v);
            }
        }
    }
}

#[test]
fn constraints_keep_a_user_rule_from_the_middle_and_omit_filler() {
    let h = long_history();
    let rule = index_of(&h, NEVER_PUSH);
    for count in [words as fn(&str) -> usize, quarter_chars] {
        let opts = ViewOptions::new(600);
        let v = slot_view(&h, "constraints_preferences", &opts, &mut |s| count(s));
        assert!(v.kept.contains(&rule), "{:?}", v.kept);
        assert!(v.text.contains(NEVER_PUSH));
        let fillers_kept = (0..30).filter(|&i| v.text.contains(&filler(i))).count();
        assert!(fillers_kept < 10, "{fillers_kept} fillers kept");
        assert!(count(&v.text) <= 600);
        check_markers(&h, &v);
    }
    let scores = rank(&h, "constraints_preferences");
    let best = (0..scores.len())
        .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
        .unwrap_or(0);
    assert_eq!(best, rule, "{scores:?}");
}

#[test]
fn progress_keeps_a_failing_test_run() {
    let h = long_history();
    let failing = index_of(&h, FAILING);
    for count in [words as fn(&str) -> usize, quarter_chars] {
        let opts = ViewOptions::new(500);
        let v = slot_view(&h, "progress", &opts, &mut |s| count(s));
        assert!(v.kept.contains(&failing), "{:?}", v.kept);
        assert!(v.text.contains("3 failed") && v.text.contains("exit 1"));
        check_markers(&h, &v);
    }
    let scores = rank(&h, "progress");
    assert!(
        (0..scores.len()).all(|i| i == failing || scores[i] < scores[failing]),
        "{scores:?}"
    );
}

#[test]
fn a_single_huge_message_still_fits() {
    let huge = "word ".repeat(5000);
    for role in [Role::User, Role::Tool, Role::Assistant] {
        let mut last = Message::text(role, &huge);
        if role == Role::Assistant {
            last.tool_calls.push(speccompact_history::ToolCall {
                id: None,
                name: "write".into(),
                arguments: speccompact_history::Arguments::Raw(huge.clone()),
            });
        }
        let h = History {
            id: None,
            messages: vec![
                Message::text(Role::System, &huge),
                Message::text(Role::User, &huge),
                last,
            ],
        };
        for budget in [100, 20] {
            let v = slot_view(&h, "goal", &ViewOptions::new(budget), &mut words);
            assert!(words(&v.text) <= budget, "{role:?} {budget}: {}", v.text);
            assert_eq!(v.kept, vec![2], "{role:?} {budget}");
            assert_eq!(v.omitted, vec![0..2]);
            assert!(v
                .text
                .contains("[... messages 1-2 (2 messages, 50000 characters) omitted ...]"));
            if budget == 100 {
                // Room for part of the message itself (at 20 only its markers fit).
                assert!(v.text.contains("word word"), "{}", v.text);
            }
        }
        // Too small even for the marker: a prefix that fits.
        let v = slot_view(&h, "goal", &ViewOptions::new(3), &mut words);
        assert!(words(&v.text) <= 3, "{}", v.text);
    }
}

#[test]
fn ranking_and_views_are_deterministic() {
    let h = long_history();
    for slot in SLOTS {
        let a = rank(&h, slot);
        assert_eq!(a.len(), h.messages.len());
        assert_eq!(a, rank(&h, slot));
        assert!(a.iter().all(|s| s.is_finite()));
        let opts = ViewOptions::new(400);
        assert_eq!(
            slot_view(&h, slot, &opts, &mut words),
            slot_view(&h, slot, &opts, &mut words)
        );
    }
    // Slots rank differently: the rule leads constraints, the failing run leads progress.
    let (rule, failing) = (index_of(&h, NEVER_PUSH), index_of(&h, FAILING));
    let c = rank(&h, "constraints_preferences");
    let p = rank(&h, "progress");
    assert!(c[rule] > c[failing] && p[failing] > p[rule]);
}

#[test]
fn the_final_count_shrinks_a_view_its_estimates_undercount() {
    // Superadditive: the whole text costs more than its messages counted alone.
    let mut count = |s: &str| {
        let w = words(s);
        w + w * w / 400
    };
    let h = long_history();
    for slot in SLOTS {
        for budget in [600, 1200] {
            let v = slot_view(&h, slot, &ViewOptions::new(budget), &mut count);
            assert!(
                count(&v.text) <= budget,
                "{slot} {budget}: {}",
                count(&v.text)
            );
            assert!(v.kept.contains(&(h.messages.len() - 1)));
            check_markers(&h, &v);
        }
    }
}
