//! Input formats and rendering, on hand-made fixtures and on the evaluation sessions in
//! `../shared/evaldata/dev/smoke.jsonl` (read in place; skipped with a message when the
//! data folder is absent unless `SPECCOMPACT_REQUIRE_DATA=1`).

use speccompact_history::{
    parse_history, parse_value, render, Arguments, History, HistoryError, Message, RenderOptions,
    Role,
};

#[test]
fn openai_tool_calls_and_invalid_arguments() {
    let text = r#"[
      {"role":"system","content":"be brief"},
      {"role":"user","content":"check MDCLVA"},
      {"role":"assistant","content":null,"tool_calls":[
        {"id":"c1","type":"function","function":{"name":"get_reservation_details","arguments":"{\"reservation_id\":\"MDCLVA\"}"}},
        {"id":"c2","type":"function","function":{"name":"broken","arguments":"{not json"}}]},
      {"role":"tool","tool_call_id":"c1","name":"get_reservation_details","content":"exit 1"}
    ]"#;
    let h = parse_history(text).unwrap();
    assert_eq!(h.messages.len(), 4);
    assert_eq!(
        h.messages[2].tool_calls[1].arguments,
        Arguments::Raw("{not json".into())
    );
    let t = render(&h, &RenderOptions::default());
    assert!(
        t.contains("[assistant -> get_reservation_details({\"reservation_id\":\"MDCLVA\"})]"),
        "{t}"
    );
    assert!(t.contains("[assistant -> broken({not json)]"), "{t}");
    assert!(t.contains("[tool get_reservation_details]\nexit 1"), "{t}");
}

#[test]
fn anthropic_blocks() {
    let text = r#"{"system":"sys","messages":[
      {"role":"user","content":[{"type":"text","text":"run the tests"}]},
      {"role":"assistant","content":[{"type":"text","text":"running"},{"type":"tool_use","id":"t1","name":"bash","input":{"cmd":"cargo test"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"2 failed","is_error":true}]}
    ]}"#;
    let h = parse_history(text).unwrap();
    let roles: Vec<Role> = h.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::System, Role::User, Role::Assistant, Role::Tool]
    );
    assert_eq!(h.messages[3].content, "[error] 2 failed");
    assert_eq!(h.messages[3].tool_call_id.as_deref(), Some("t1"));
    let t = render(&h, &RenderOptions::default());
    assert!(
        t.contains("[assistant -> bash({\"cmd\":\"cargo test\"})]"),
        "{t}"
    );
}

#[test]
fn long_tool_results_are_capped_with_a_marker() {
    let body = "a".repeat(500) + &"z".repeat(500);
    let v = serde_json::json!([{"role":"tool","content": body}]);
    let h = parse_value(&v).unwrap();
    let t = render(
        &h,
        &RenderOptions {
            tool_result_cap: 100,
            omit: None,
        },
    );
    assert!(t.contains("[... 900 characters omitted ...]"), "{t}");
    assert!(t.contains(&"a".repeat(50)) && t.contains(&"z".repeat(50)));
    assert!(!t.contains(&"a".repeat(51)));
}

#[test]
fn jsonl_messages_and_errors_name_the_place() {
    let h = parse_history(
        "{\"role\":\"user\",\"content\":\"hi\"}\n{\"role\":\"assistant\",\"content\":\"yo\"}\n",
    )
    .unwrap();
    assert_eq!(h.messages.len(), 2);
    let e = parse_history("{\"role\":\"user\",\"content\":\"hi\"}\n{oops\n").unwrap_err();
    assert!(matches!(e, HistoryError::Json { line: Some(2), .. }), "{e}");
    let e = parse_history(r#"[{"role":"user","content":"a"},{"content":"b"}]"#).unwrap_err();
    assert_eq!(e.to_string(), "message 1: missing `role`");
    let e = parse_history(r#"[{"role":"robot","content":"a"}]"#).unwrap_err();
    assert!(e.to_string().contains("unknown role `robot`"));
    assert_eq!(parse_history("  ").unwrap_err(), HistoryError::Empty);
    assert_eq!(parse_history("[]").unwrap_err(), HistoryError::Empty);
}

#[test]
fn evaluation_sessions_load_directly() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/evaldata/dev/smoke.jsonl");
    let Ok(text) = std::fs::read_to_string(&path) else {
        let required = std::env::var("SPECCOMPACT_REQUIRE_DATA").as_deref() == Ok("1");
        assert!(!required, "missing {}", path.display());
        eprintln!("skipped: {} not found", path.display());
        return;
    };
    let mut n = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let h = parse_value(&v).unwrap();
        let expected = v["messages"].as_array().unwrap().len();
        assert_eq!(h.messages.len(), expected, "{:?}", h.id);
        assert!(h.id.is_some());
        let t = render(&h, &RenderOptions::default());
        // Every identifier probe's strings are still in the rendered transcript (results
        // here are below the cap).
        for p in v["probes"].as_array().unwrap() {
            if p["kind"] == "identifier" || p["kind"] == "file" {
                let any = p["expect_any"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|s| t.contains(s.as_str().unwrap()));
                assert!(any, "{:?}: probe {} lost in rendering", h.id, p["id"]);
            }
        }
        n += 1;
    }
    assert_eq!(n, 6);
    // The whole file as input: its first session.
    assert_eq!(
        parse_history(&text).unwrap().id.as_deref(),
        Some("tau-airline-task49-trial0")
    );
    // Every session of the file, in order.
    let all = speccompact_history::parse_sessions(&text).unwrap();
    assert_eq!(all.len(), 6);
    assert_eq!(all[5].id.as_deref(), Some("bfcl-memory-notetaker"));
}

#[test]
fn a_middle_cut_is_marked_and_keeps_both_ends() {
    let msgs: Vec<_> = (0..6)
        .map(|i| serde_json::json!({"role":"user","content": format!("m{i}-text")}))
        .collect();
    let h = parse_value(&serde_json::Value::Array(msgs)).unwrap();
    let t = render(
        &h,
        &RenderOptions {
            omit: Some(2..5),
            ..RenderOptions::default()
        },
    );
    assert!(
        t.contains("[... messages 3-5 (3 messages, 21 characters) omitted ...]"),
        "{t}"
    );
    for kept in ["m0-text", "m1-text", "m5-text"] {
        assert!(t.contains(kept), "{kept} missing: {t}");
    }
    for gone in ["m2-text", "m3-text", "m4-text"] {
        assert!(!t.contains(gone), "{gone} kept: {t}");
    }
}

#[test]
fn a_history_is_never_built_empty() {
    assert_eq!(History::new(Vec::new()).unwrap_err(), HistoryError::Empty);
    let h = History::new(vec![Message::text(Role::User, "hi")])
        .unwrap()
        .with_id(Some("s1".into()));
    assert_eq!(h.id.as_deref(), Some("s1"));
    assert_eq!(h.messages.len(), 1);
    // A session record without messages is the same named error, with or without a system
    // prompt making it non-empty.
    assert_eq!(
        parse_history(r#"{"id":"s","messages":[]}"#).unwrap_err(),
        HistoryError::Empty
    );
    let h = parse_history(r#"{"id":"s","system":"be brief","messages":[]}"#).unwrap();
    assert_eq!(h.id.as_deref(), Some("s"));
    assert_eq!(h.messages[0].role, Role::System);
}
