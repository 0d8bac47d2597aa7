use super::*;
use proptest::prelude::*;
use serde_json::json;

const CORPUS: &str = include_str!("../../tests/data/lockdown-corpus.tsv");

fn owned(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

fn corpus() -> Vec<(String, bool)> {
    parse_corpus(CORPUS).unwrap_or_else(|e| panic!("bad corpus: {e}"))
}

fn vocabulary(yaml: &str) -> Vocabulary {
    let spec: LockdownSpec = serde_saphyr::from_str(yaml).unwrap();
    Vocabulary::compile(&spec).unwrap()
}

#[test]
fn corpus_matches_the_predicate() {
    let cases = corpus();
    assert!(cases.len() >= 150, "corpus has only {} cases", cases.len());
    assert!(cases.iter().any(|(_, w)| *w) && cases.iter().any(|(_, w)| !*w));
    let mismatches: Vec<String> = cases
        .iter()
        .filter(|(name, write)| is_write_surface_tool_name(name) != *write)
        .map(|(name, write)| {
            let want = if *write { "write" } else { "allowed" };
            format!("{name:?} ({:?}): expected {want}", canonical_name(name))
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "{} corpus mismatch(es):\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[test]
fn the_defect_names_are_caught_and_reads_pass() {
    for name in [
        "core_memory_append",
        "core_memory_replace",
        "memory_replace",
        "memory_insert",
        "memory_rethink",
        "memory",
        "block_update",
        "set_block",
        "\u{ff43}\u{ff4f}\u{ff52}\u{ff45}_memory_append",
        "core_mem\u{200b}ory_append",
        "core_m\u{435}mory_append",
        "c\u{3bf}re_memory_replace",
        "core_me\u{301}mory_append",
    ] {
        assert!(is_write_surface_tool_name(name), "{name:?} should be write");
    }
    for name in [
        "read_memory_block",
        "get_block",
        "list_blocks",
        "memory_search",
        "archival_memory_search",
    ] {
        assert!(
            !is_write_surface_tool_name(name),
            "{name:?} should be allowed"
        );
    }
}

#[test]
fn canonical_names_fold_spelling_and_look_alikes() {
    let plain = canonical_name("memory_block_append");
    for variant in [
        "MEMORY_BLOCK_APPEND",
        "  memory-block-append\t",
        "Memory Block Append",
        "\u{ff4d}\u{ff45}\u{ff4d}\u{ff4f}\u{ff52}\u{ff59}_block_append",
        "mem\u{200b}ory_blo\u{200d}ck_app\u{feff}end",
        "m\u{435}m\u{43e}ry_bl\u{3bf}ck_\u{430}ppend",
        "me\u{301}mory_block_appe\u{308}nd",
        "memory_b1ock_append",
        "MEMORY_BL0CK_APPEND",
    ] {
        assert_eq!(canonical_name(variant), plain, "{variant:?}");
    }
    assert_eq!(
        canonical_name("memoryBlockAppend"),
        canonical_name("memoryblockappend")
    );
    assert_eq!(
        canonical_name("mcp__srv__memory_block"),
        format!(
            "{}.srv.{}",
            canonical_name("mcp"),
            canonical_name("memory_block")
        )
    );
    assert_eq!(canonical_name("srv.tools/x:y"), "srv.tools.x.y");
    assert_eq!(canonical_name(""), "");
    assert_eq!(canonical_name(" _-. "), "");
}

#[test]
fn every_preset_name_is_caught_only_with_its_preset() {
    for preset in Preset::ALL {
        let on = vocabulary(&format!("presets: [{}]", preset.as_str()));
        assert_eq!(on.presets(), [preset]);
        for name in preset.names() {
            assert!(on.is_write_surface(name), "{name} with {preset:?}");
            let prefixed = format!("mcp__srv__{name}");
            assert!(on.is_write_surface(&prefixed), "{prefixed} with {preset:?}");
            assert_eq!(
                Vocabulary::builtin().is_write_surface(name),
                preset.is_builtin(),
                "{name} without {preset:?}"
            );
        }
    }
    // Each preset's reads stay reads with it on.
    let all = vocabulary("presets: [letta, langgraph, mem0, mcp_memory]");
    for read in [
        "search_memory",
        "search_memories",
        "list_memories",
        "get_memory",
        "read_graph",
        "search_nodes",
        "open_nodes",
        "archival_memory_search",
        "conversation_search",
    ] {
        assert!(!all.is_write_surface(read), "{read}");
    }
}

#[test]
fn bundle_names_and_patterns_add_and_never_remove() {
    let v = vocabulary(
        "write_surface_names: [save_note_to_prompt, Persona.Set]\nwrite_surface_patterns: ['*persona*', 'rules_*']",
    );
    for name in [
        "save_note_to_prompt",
        "SaveNoteToPrompt",
        "mcp__srv__save-note-to-prompt",
        "persona_set",
        "update_persona",
        "PersonaEdit",
        "get_persona",
        "rules_v2",
        "RULES",
        // The built-in vocabulary is still there.
        "memory_block_append",
        "core_memory_replace",
    ] {
        assert!(v.is_write_surface(name), "{name}");
    }
    for name in ["save_note", "my_rules", "read_memory_block", "search"] {
        assert!(!v.is_write_surface(name), "{name}");
    }
    // An empty section is the built-in vocabulary.
    assert_eq!(
        &Vocabulary::compile(&LockdownSpec::default()).unwrap(),
        Vocabulary::builtin()
    );
}

#[test]
fn bad_lockdown_entries_are_located() {
    let spec = LockdownSpec {
        presets: vec![],
        write_surface_names: vec!["ok".into(), " _ ".into(), "x".repeat(MAX_ENTRY_LEN + 1)],
        write_surface_patterns: vec!["*".into(), "a?b".into(), "[ab]".into(), "*ok*".into()],
    };
    let issues = Vocabulary::compile(&spec).unwrap_err();
    let locations: Vec<&str> = issues.iter().map(|i| i.location.as_str()).collect();
    assert_eq!(
        locations,
        [
            "lockdown.write_surface_names[1]",
            "lockdown.write_surface_names[2]",
            "lockdown.write_surface_patterns[0]",
            "lockdown.write_surface_patterns[1]",
            "lockdown.write_surface_patterns[2]",
        ]
    );
    assert!(issues[0].message.contains("no letter or digit"));
    assert!(issues[2].message.contains("match every name"));
    assert!(issues[3].message.contains("`?` is not allowed"));
    let too_many = LockdownSpec {
        write_surface_names: vec!["a".into(); MAX_EXTRA_ENTRIES + 1],
        ..LockdownSpec::default()
    };
    let issues = Vocabulary::compile(&too_many).unwrap_err();
    assert_eq!(issues[0].location, "lockdown.write_surface_names");
    // Unknown presets and fields are parse errors.
    assert!(serde_saphyr::from_str::<LockdownSpec>("presets: [openai]").is_err());
    assert!(serde_saphyr::from_str::<LockdownSpec>("disable: [letta]").is_err());
}

#[test]
fn near_miss_flag_keys_are_the_flag_at_any_depth() {
    for (config, key) in [
        (
            json!({"Prompt_Block_Self_Edit": true}),
            "Prompt_Block_Self_Edit",
        ),
        (
            json!({"prompt_block_self_edit ": true}),
            "[\"prompt_block_self_edit \"]",
        ),
        (json!({"promptBlockSelfEdit": true}), "promptBlockSelfEdit"),
        (
            json!({"PROMPT-BLOCK-SELF-EDIT": true}),
            "PROMPT-BLOCK-SELF-EDIT",
        ),
        (
            json!({"prompt_block_self\u{200b}_edit": true}),
            "[\"prompt_block_self\u{200b}_edit\"]",
        ),
        (
            json!({"pr\u{43e}mpt_bl\u{3bf}ck_self_edit": true}),
            "[\"pr\u{43e}mpt_bl\u{3bf}ck_self_edit\"]",
        ),
        (
            json!({"agent": {"llm": [1, {"prompt_block_self_edit": true}]}}),
            "agent.llm[1].prompt_block_self_edit",
        ),
        (
            json!({SELF_EDIT_FIELD: false, "nested": {"PromptBlockSelfEdit": true}}),
            "nested.PromptBlockSelfEdit",
        ),
    ] {
        assert_eq!(requests_self_edit(&config), Ok(true), "{config}");
        assert_eq!(
            check_prebuilt_child(Vocabulary::builtin(), &[], Some(&config)),
            Err(LockdownError::SelfEditRequested {
                key: key.to_owned()
            }),
            "{config}"
        );
        let cleared = sanitise_child_config(&config).unwrap();
        assert!(cleared.was_sanitised());
        assert_eq!(requests_self_edit(cleared.config()), Ok(false));
    }
    // A nested near miss of the wrong type is a located type error.
    let config = json!({"a": {"Prompt_Block_Self_Edit": "yes"}});
    assert_eq!(
        sanitise_child_config(&config),
        Err(LockdownError::SelfEditFlagNotBoolean {
            key: "a.Prompt_Block_Self_Edit".to_owned(),
            found: "string"
        })
    );
    // Keys that only look related are not the flag.
    for config in [
        json!({"prompt_block": true, "self_edit": true}),
        json!({"prompt_block_self_edit_log": true}),
        json!({"block_self_edit": true}),
        json!({"x": "prompt_block_self_edit"}),
    ] {
        assert_eq!(requests_self_edit(&config), Ok(false), "{config}");
    }
    // Sanitising clears every copy under its own spelling, nothing else.
    let config = json!({
        "Prompt_Block_Self_Edit": true,
        "agent": {"prompt_block_self_edit": true, "keep": true},
        "list": [{"promptBlockSelfEdit": true}]
    });
    assert_eq!(
        sanitise_child_config(&config).unwrap().config(),
        &json!({
            "Prompt_Block_Self_Edit": false,
            "agent": {"prompt_block_self_edit": false, "keep": true},
            "list": [{"promptBlockSelfEdit": false}]
        })
    );
}

#[test]
fn a_very_deep_config_is_walked_without_recursion() {
    // Built by hand: `json!` with a value inside serialises it, recursively.
    let mut config = json!({"prompt_block_self_edit": true});
    for _ in 0..100_000 {
        let mut map = serde_json::Map::new();
        map.insert("n".to_owned(), config);
        config = Value::Object(map);
    }
    assert_eq!(requests_self_edit(&config), Ok(true));
    let Err(LockdownError::SelfEditRequested { key }) =
        check_prebuilt_child(Vocabulary::builtin(), &[], Some(&config))
    else {
        panic!("deep flag not found");
    };
    assert!(key.ends_with("n.n.prompt_block_self_edit"), "{key}");
    // Dropping a deep `Value` recurses (serde_json's, not ours): forget it.
    std::mem::forget(config);
}

#[test]
fn prebuilt_children_are_checked_with_the_given_vocabulary() {
    let tools = owned(&["search", "manage_memory"]);
    assert_eq!(
        check_prebuilt_child(Vocabulary::builtin(), &tools, None),
        Ok(())
    );
    assert_eq!(
        check_prebuilt_child(&vocabulary("presets: [langgraph]"), &tools, None),
        Err(LockdownError::WriteSurfaceTool {
            tools: owned(&["manage_memory"])
        })
    );
}

#[test]
fn unchanged_configs_are_borrowed_not_copied() {
    for config in [
        json!(null),
        json!({}),
        json!({"model": "small"}),
        json!({SELF_EDIT_FIELD: null, "x": 1}),
        json!({SELF_EDIT_FIELD: false}),
    ] {
        let out = sanitise_child_config(&config).unwrap();
        assert!(!out.was_sanitised());
        assert_eq!(out.reason(), CHILD_LOCKDOWN_PASSED);
        let Sanitised::Unchanged(same) = out else {
            panic!("{config} should be unchanged");
        };
        assert!(std::ptr::eq(same, &config));
    }
}

#[test]
fn a_true_flag_is_cleared_on_a_copy() {
    let config = json!({SELF_EDIT_FIELD: true, "model": "small", "tools": ["a"]});
    let out = sanitise_child_config(&config).unwrap();
    assert!(out.was_sanitised());
    assert_eq!(out.reason(), CHILD_SELF_EDIT_SANITISED);
    assert_eq!(
        out.config(),
        &json!({SELF_EDIT_FIELD: false, "model": "small", "tools": ["a"]})
    );
    assert_eq!(config[SELF_EDIT_FIELD], json!(true), "input untouched");
    let again = sanitise_child_config(out.config()).unwrap();
    assert!(!again.was_sanitised());
}

#[test]
fn non_boolean_flags_are_type_errors_never_coerced() {
    for (flag, found) in [
        (json!("true"), "string"),
        (json!("false"), "string"),
        (json!(1), "number"),
        (json!(0), "number"),
        (json!({}), "object"),
        (json!([true]), "array"),
    ] {
        let config = json!({ SELF_EDIT_FIELD: flag });
        let want = LockdownError::SelfEditFlagNotBoolean {
            key: SELF_EDIT_FIELD.to_owned(),
            found,
        };
        assert_eq!(sanitise_child_config(&config), Err(want.clone()));
        assert_eq!(
            check_prebuilt_child(Vocabulary::builtin(), &[], Some(&config)),
            Err(want.clone())
        );
        assert_eq!(want.reason(), CHILD_SELF_EDIT_FLAG_INVALID);
    }
    let err = LockdownError::SelfEditFlagNotBoolean {
        key: SELF_EDIT_FIELD.to_owned(),
        found: "string",
    };
    assert_eq!(
        err.to_string(),
        "child config field `prompt_block_self_edit` (the self-edit flag `prompt_block_self_edit`) must be a boolean, found a JSON string; it is never coerced: set it to false or leave it out"
    );
}

#[test]
fn non_object_configs_are_errors() {
    for (config, found) in [
        (json!("x"), "string"),
        (json!([]), "array"),
        (json!(true), "boolean"),
        (json!(3), "number"),
    ] {
        let want = LockdownError::ConfigNotObject { found };
        assert_eq!(sanitise_child_config(&config), Err(want.clone()));
        assert_eq!(
            check_prebuilt_child(Vocabulary::builtin(), &[], Some(&config)),
            Err(want.clone())
        );
        assert_eq!(want.reason(), CHILD_CONFIG_INVALID);
    }
}

#[test]
fn prebuilt_child_with_write_tools_is_refused_naming_each() {
    let tools = owned(&[
        "search",
        "mcp__srv__memory_block_append",
        "summarise",
        "  EDIT_BLOCK ",
    ]);
    let err = check_prebuilt_child(
        Vocabulary::builtin(),
        &tools,
        Some(&json!({SELF_EDIT_FIELD: true})),
    )
    .unwrap_err();
    assert_eq!(
        err,
        LockdownError::WriteSurfaceTool {
            tools: owned(&["mcp__srv__memory_block_append", "  EDIT_BLOCK "])
        }
    );
    assert_eq!(err.reason(), CHILD_WRITE_SURFACE_TOOL);
    let message = err.to_string();
    assert_eq!(
        message,
        "child carries the prompt-block write tool(s) `mcp__srv__memory_block_append`, `  EDIT_BLOCK `; a delegated child may not write a prompt block: remove the tool(s), or register the child from a spec so the parent builds it with the write surface cleared"
    );
}

#[test]
fn prebuilt_child_requesting_self_edit_is_refused() {
    let tools = owned(&["search", "grant_edit"]);
    let err = check_prebuilt_child(
        Vocabulary::builtin(),
        &tools,
        Some(&json!({SELF_EDIT_FIELD: true})),
    )
    .unwrap_err();
    assert_eq!(
        err,
        LockdownError::SelfEditRequested {
            key: SELF_EDIT_FIELD.to_owned()
        }
    );
    assert_eq!(err.reason(), CHILD_SELF_EDIT_REQUESTED);
    let message = err.to_string();
    assert!(message.contains("set the flag to false"));
    assert!(message.contains("from a spec"));
}

#[test]
fn clean_prebuilt_children_pass() {
    let tools = owned(&["search", "memory_read", "block_user"]);
    assert_eq!(
        check_prebuilt_child(Vocabulary::builtin(), &tools, None),
        Ok(())
    );
    assert_eq!(
        check_prebuilt_child(Vocabulary::builtin(), &[], Some(&json!(null))),
        Ok(())
    );
    assert_eq!(
        check_prebuilt_child(
            Vocabulary::builtin(),
            &tools,
            Some(&json!({SELF_EDIT_FIELD: false}))
        ),
        Ok(())
    );
}

#[test]
fn every_error_message_is_one_lowercase_line_without_final_period() {
    let errors = [
        LockdownError::WriteSurfaceTool {
            tools: owned(&["memory_block_append\nsecond line", "x"]),
        },
        LockdownError::SelfEditRequested {
            key: "a.b\nc".to_owned(),
        },
        LockdownError::SelfEditFlagNotBoolean {
            key: "x".to_owned(),
            found: "string",
        },
        LockdownError::ConfigNotObject { found: "array" },
    ];
    for err in errors {
        let m = err.to_string();
        assert!(!m.contains('\n'), "{m}");
        assert!(m.starts_with(|c: char| c.is_ascii_lowercase()), "{m}");
        assert!(!m.ends_with('.'), "{m}");
    }
}

#[test]
fn corpus_parser_decodes_json_names_and_reports_every_bad_line() {
    let text = "# comment\n\nplain\twrite\n\"  padded \"\tallowed\n\"\"\tallowed\r\n   # indented comment\n";
    assert_eq!(
        parse_corpus(text),
        Ok(vec![
            ("plain".to_owned(), true),
            ("  padded ".to_owned(), false),
            (String::new(), false),
        ])
    );
    let bad = "no_tab\n a \twrite\n\"unterminated\twrite\nx\tmaybe\nx\twrite\nx\tallowed\n\twrite\na\twrite\textra\n";
    let err = parse_corpus(bad).unwrap_err();
    for line in 1..=8 {
        if line == 5 {
            continue;
        }
        assert!(
            err.contains(&format!("line {line}:")),
            "line {line} in {err}"
        );
    }
    assert!(
        err.contains("duplicate name `x` (first on line 5)"),
        "{err}"
    );
}

/// Names built from vocabulary fragments, separators and noise.
fn arb_name() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("memory".to_owned()),
        Just("Memory".to_owned()),
        Just("core".to_owned()),
        Just("block".to_owned()),
        Just("Block".to_owned()),
        Just("edit".to_owned()),
        Just("set".to_owned()),
        Just("update".to_owned()),
        Just("insert".to_owned()),
        Just("replace".to_owned()),
        Just("read".to_owned()),
        Just("get".to_owned()),
        Just("list".to_owned()),
        Just("search".to_owned()),
        Just("_".to_owned()),
        Just("__".to_owned()),
        Just("-".to_owned()),
        Just(".".to_owned()),
        Just("/".to_owned()),
        Just(" ".to_owned()),
        "[a-z]{0,3}",
    ];
    prop::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat())
}

/// A name from the corpus (either verdict) or a generated one.
fn arb_case() -> impl Strategy<Value = String> {
    let names: Vec<String> = corpus().into_iter().map(|(n, _)| n).collect();
    prop_oneof![prop::sample::select(names), arb_name()]
}

/// Lowercase look-alikes of lowercase ASCII letters (same case, so camelCase
/// humps are unchanged).
fn look_alikes(c: char) -> &'static [char] {
    match c {
        'a' => &['\u{430}'],
        'c' => &['\u{441}', '\u{3f2}'],
        'e' => &['\u{435}'],
        'i' => &['\u{456}'],
        'j' => &['\u{458}'],
        'o' => &['\u{43e}', '\u{3bf}'],
        'p' => &['\u{440}', '\u{3c1}'],
        's' => &['\u{455}'],
        'x' => &['\u{445}'],
        'y' => &['\u{443}'],
        _ => &[],
    }
}

/// `name` with a character put after the `at`-th character (mod length).
fn insert_at(name: &str, at: usize, what: char) -> String {
    let n = name.chars().count();
    let at = if n == 0 { 0 } else { at % (n + 1) };
    let mut out: String = name.chars().take(at).collect();
    out.push(what);
    out.extend(name.chars().skip(at));
    out
}

fn fullwidth(c: char) -> char {
    if c.is_ascii_graphic() {
        char::from_u32(c as u32 - 0x21 + 0xff01).unwrap_or(c)
    } else {
        c
    }
}

proptest! {
    #[test]
    fn canonical_names_are_fixed_points(name in prop_oneof![any::<String>(), arb_case()]) {
        let once = canonical_name(&name);
        prop_assert_eq!(canonical_name(&once), once.clone());
        prop_assert!(!once.starts_with(['_', '.']) && !once.ends_with(['_', '.']));
        prop_assert!(!once.contains("__") && !once.contains("._") && !once.contains("_.") && !once.contains(".."));
    }

    #[test]
    fn invisible_characters_never_change_the_verdict(
        name in arb_case(),
        inserts in prop::collection::vec((any::<usize>(), prop::sample::select(vec![
            '\u{200b}', '\u{200c}', '\u{200d}', '\u{2060}', '\u{feff}', '\u{ad}', '\u{202e}', '\u{2066}', '\u{fe0f}', '\u{e0041}',
        ])), 1..4),
    ) {
        let mut variant = name.clone();
        for (at, c) in inserts {
            variant = insert_at(&variant, at, c);
        }
        prop_assert_eq!(is_write_surface_tool_name(&variant), is_write_surface_tool_name(&name), "{:?}", variant);
    }

    #[test]
    fn look_alike_letters_never_change_the_verdict(
        name in arb_case(),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 1..6),
        choice in any::<prop::sample::Index>(),
    ) {
        let mut chars: Vec<char> = name.chars().collect();
        if !chars.is_empty() {
            for pick in picks {
                let i = pick.index(chars.len());
                if let Some(c) = chars.get_mut(i) {
                    let alikes = look_alikes(*c);
                    if !alikes.is_empty() {
                        *c = alikes[choice.index(alikes.len())];
                    }
                }
            }
        }
        let variant: String = chars.into_iter().collect();
        prop_assert_eq!(is_write_surface_tool_name(&variant), is_write_surface_tool_name(&name), "{:?}", variant);
        let wide: String = name.chars().map(fullwidth).collect();
        prop_assert_eq!(is_write_surface_tool_name(&wide), is_write_surface_tool_name(&name), "{:?}", wide);
    }

    #[test]
    fn combining_marks_after_letters_never_change_the_verdict(
        name in arb_case(),
        at in any::<prop::sample::Index>(),
        mark in prop::sample::select(vec!['\u{301}', '\u{308}', '\u{323}', '\u{338}', '\u{20d7}']),
    ) {
        let chars: Vec<char> = name.chars().collect();
        let letters: Vec<usize> = (0..chars.len()).filter(|&i| chars[i].is_ascii_alphabetic()).collect();
        prop_assume!(!letters.is_empty());
        let i = letters[at.index(letters.len())];
        let variant = insert_at(&name, i + 1, mark);
        prop_assert_eq!(is_write_surface_tool_name(&variant), is_write_surface_tool_name(&name), "{:?}", variant);
    }

    #[test]
    fn a_client_prefix_never_lets_a_caught_name_pass(
        name in prop::sample::select(corpus().into_iter().filter(|(_, w)| *w).map(|(n, _)| n).collect::<Vec<_>>()),
        prefix in prop_oneof![Just("mcp__srv__".to_owned()), "[a-z][a-z0-9]{0,5}[./:]", "[a-z]{1,5}__"],
    ) {
        let prefixed = prefix + name.trim();
        prop_assert!(is_write_surface_tool_name(&prefixed), "{:?}", prefixed);
    }

    #[test]
    fn a_bundle_vocabulary_only_adds(
        name in arb_case(),
        extra in prop::collection::vec("[a-z]{1,6}(_[a-z]{1,6}){0,2}", 0..4),
    ) {
        let spec = LockdownSpec {
            presets: Preset::ALL.to_vec(),
            write_surface_names: extra.clone(),
            write_surface_patterns: extra.iter().map(|e| format!("*{e}*")).collect(),
        };
        let v = Vocabulary::compile(&spec).unwrap();
        if is_write_surface_tool_name(&name) {
            prop_assert!(v.is_write_surface(&name));
        }
        for e in &extra {
            prop_assert!(v.is_write_surface(e));
        }
    }

    #[test]
    fn sanitising_is_idempotent_and_never_leaves_a_flag_true(config in arb_config()) {
        let once = sanitise_child_config(&config).unwrap();
        prop_assert_eq!(requests_self_edit(once.config()), Ok(false));
        prop_assert_eq!(once.was_sanitised(), requests_self_edit(&config).unwrap());
        let twice = sanitise_child_config(once.config()).unwrap();
        prop_assert!(!twice.was_sanitised());
        prop_assert!(std::ptr::eq(twice.config(), once.config()));
        // A pre-built child with the same config is refused exactly when
        // sanitising changed something.
        prop_assert_eq!(
            check_prebuilt_child(Vocabulary::builtin(), &[], Some(&config)).is_err(),
            once.was_sanitised()
        );
    }

    #[test]
    fn string_flags_are_type_errors_whatever_they_say(config in arb_config(), junk in "(true|false|yes|1|)") {
        let mut bad = config;
        if let Some(map) = bad.as_object_mut() {
            map.retain(|k, _| !is_self_edit_key(k));
            map.insert("Prompt_Block_Self_Edit".to_owned(), Value::String(junk));
        }
        prop_assert_eq!(
            sanitise_child_config(&bad),
            Err(LockdownError::SelfEditFlagNotBoolean { key: "Prompt_Block_Self_Edit".to_owned(), found: "string" })
        );
    }
}

/// Configs with flags (in near-miss spellings, at any depth) absent, null,
/// true or false among other fields.
fn arb_config() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        4 => "[a-z_]{1,8}",
        1 => prop::sample::select(vec![
            SELF_EDIT_FIELD.to_owned(),
            "Prompt_Block_Self_Edit".to_owned(),
            "promptBlockSelfEdit".to_owned(),
            "prompt-block-self-edit ".to_owned(),
        ]),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "[a-z]{0,6}".prop_map(Value::String),
    ];
    let flag_safe = leaf.prop_recursive(3, 24, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key.clone(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    prop::collection::btree_map("[a-z_]{1,8}", flag_safe, 0..5)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
        .prop_filter("flags hold booleans or null", |v| true_flags(v).is_ok())
}
