use super::names::{NAMESPACE_WORDS, VERB_FAMILY_WORDS, fold};
use super::*;
use proptest::prelude::*;
use serde_json::json;

const CORPUS: &str = include_str!("../../tests/data/lockdown-corpus.tsv");

fn owned(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn corpus_matches_the_predicate() {
    let cases = parse_corpus(CORPUS).unwrap_or_else(|e| panic!("bad corpus: {e}"));
    assert!(cases.len() >= 70, "corpus has only {} cases", cases.len());
    assert!(cases.iter().any(|(_, w)| *w) && cases.iter().any(|(_, w)| !*w));
    let mismatches: Vec<String> = cases
        .iter()
        .filter(|(name, write)| is_write_surface_tool_name(name) != *write)
        .map(|(name, write)| {
            let want = if *write { "write" } else { "allowed" };
            format!("{name:?}: expected {want}")
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
fn canonical_vocabulary_is_what_the_matcher_uses() {
    let (a, b) = NAMESPACE_WORDS;
    assert_eq!(format!("{a}_{b}_"), WRITE_SURFACE_NAMESPACE);
    for (family, (a, b)) in WRITE_SURFACE_VERB_FAMILIES.iter().zip(VERB_FAMILY_WORDS) {
        assert_eq!(format!("{a}_{b}"), *family);
        assert!(is_write_surface_tool_name(family));
    }
    assert!(is_write_surface_tool_name(WRITE_SURFACE_NAMESPACE));
}

#[test]
fn the_documented_examples_hold() {
    for name in [
        "memory_block_append",
        "MEMORY_BLOCK_APPEND",
        "  memory_block_replace\t",
        "memory_block_frobnicate",
        "memory_blocks_list",
        "memoryblock",
        "memory_block",
        "mcp__server__memory_block_append",
        "server.memory_block_append",
        "server/memory_block_append",
        "srvMemoryBlockAppend",
        "memory-block-append",
        "memoryBlockAppend",
        "memory block append",
        "mcp__srv__edit_block",
        "edit_blocks",
        "block_editor_theme",
        "MEMORY_BLOC\u{212a}_APPEND",
    ] {
        assert!(is_write_surface_tool_name(name), "{name:?} should be write");
    }
    for name in [
        "",
        "   ",
        "block",
        "readonly_block",
        "blocked_items",
        "blocked_user_list",
        "blocklist_read",
        "edit_blog",
        "memory_read",
        "grant_edit",
        "credit_block_report",
        "overwrite_block",
        "srvEditBlock",
    ] {
        assert!(
            !is_write_surface_tool_name(name),
            "{name:?} should be allowed"
        );
    }
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
        let want = LockdownError::SelfEditFlagNotBoolean { found };
        assert_eq!(sanitise_child_config(&config), Err(want.clone()));
        assert_eq!(check_prebuilt_child(&[], Some(&config)), Err(want.clone()));
        assert_eq!(want.reason(), CHILD_SELF_EDIT_FLAG_INVALID);
    }
    let err = LockdownError::SelfEditFlagNotBoolean { found: "string" };
    assert_eq!(
        err.to_string(),
        "child config field `prompt_block_self_edit` must be a boolean, found a JSON string; it is never coerced: set it to false or leave it out"
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
        assert_eq!(check_prebuilt_child(&[], Some(&config)), Err(want.clone()));
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
    let err = check_prebuilt_child(&tools, Some(&json!({SELF_EDIT_FIELD: true}))).unwrap_err();
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
    let err = check_prebuilt_child(&tools, Some(&json!({SELF_EDIT_FIELD: true}))).unwrap_err();
    assert_eq!(err, LockdownError::SelfEditRequested);
    assert_eq!(err.reason(), CHILD_SELF_EDIT_REQUESTED);
    let message = err.to_string();
    assert!(message.contains("set the flag to false"));
    assert!(message.contains("from a spec"));
}

#[test]
fn clean_prebuilt_children_pass() {
    let tools = owned(&["search", "memory_read", "block_user"]);
    assert_eq!(check_prebuilt_child(&tools, None), Ok(()));
    assert_eq!(check_prebuilt_child(&[], Some(&json!(null))), Ok(()));
    assert_eq!(
        check_prebuilt_child(&tools, Some(&json!({SELF_EDIT_FIELD: false}))),
        Ok(())
    );
}

#[test]
fn every_error_message_is_one_lowercase_line_without_final_period() {
    let errors = [
        LockdownError::WriteSurfaceTool {
            tools: owned(&["memory_block_append\nsecond line", "x"]),
        },
        LockdownError::SelfEditRequested,
        LockdownError::SelfEditFlagNotBoolean { found: "string" },
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

/// Reference model: fold to a string in which every separator is `_`,
/// then test with a regex.
fn model(name: &str) -> bool {
    let folded: String = name
        .trim()
        .chars()
        .map(|c| fold(c).unwrap_or('_'))
        .collect();
    let namespace = regex::Regex::new("memory_*block").unwrap();
    let family =
        regex::Regex::new("(^|_)((edit|write|update|append|replace|rewrite)_*block|block_*edit)")
            .unwrap();
    namespace.is_match(&folded) || family.is_match(&folded)
}

/// Names built from vocabulary fragments, separators and noise.
fn arb_name() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("memory".to_owned()),
        Just("Memory".to_owned()),
        Just("block".to_owned()),
        Just("BLOCK".to_owned()),
        Just("edit".to_owned()),
        Just("ed".to_owned()),
        Just("it".to_owned()),
        Just("write".to_owned()),
        Just("update".to_owned()),
        Just("append".to_owned()),
        Just("replace".to_owned()),
        Just("rewrite".to_owned()),
        Just("over".to_owned()),
        Just("_".to_owned()),
        Just("__".to_owned()),
        Just("-".to_owned()),
        Just(".".to_owned()),
        Just("/".to_owned()),
        Just(" ".to_owned()),
        Just("\u{212a}".to_owned()),
        "[a-zA-Z0-9_. /:-]{0,3}",
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat())
}

fn flip_case(s: &str, mask: &[bool]) -> String {
    s.chars()
        .zip(mask.iter().cycle())
        .map(|(c, &flip)| {
            if !flip {
                c
            } else if c.is_ascii_lowercase() {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

/// Configs with the flag absent, null, true or false among other fields.
fn arb_config() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "[a-z]{0,6}".prop_map(Value::String),
    ];
    let json = leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    let flag = prop_oneof![
        Just(None),
        Just(Some(Value::Null)),
        Just(Some(Value::Bool(true))),
        Just(Some(Value::Bool(false))),
    ];
    (prop::collection::btree_map("[a-z_]{1,8}", json, 0..5), flag).prop_map(|(fields, flag)| {
        let mut map: serde_json::Map<String, Value> = fields.into_iter().collect();
        match flag {
            Some(v) => {
                map.insert(SELF_EDIT_FIELD.to_owned(), v);
            }
            None => {
                map.remove(SELF_EDIT_FIELD);
            }
        }
        Value::Object(map)
    })
}

proptest! {
    #[test]
    fn predicate_ignores_surrounding_whitespace_and_ascii_case(
        name in arb_name(),
        mask in prop::collection::vec(any::<bool>(), 1..16),
        left in "[ \t\r\n\u{a0}\u{3000}]{0,3}",
        right in "[ \t\r\n\u{a0}\u{3000}]{0,3}",
    ) {
        let expected = is_write_surface_tool_name(&name);
        let variant = format!("{left}{}{right}", flip_case(&name, &mask));
        prop_assert_eq!(is_write_surface_tool_name(&variant), expected);
        prop_assert_eq!(is_write_surface_tool_name(&name.to_ascii_uppercase()), expected);
        prop_assert_eq!(is_write_surface_tool_name(&name.to_ascii_lowercase()), expected);
    }

    #[test]
    fn predicate_agrees_with_the_reference_model(name in arb_name()) {
        prop_assert_eq!(is_write_surface_tool_name(&name), model(&name));
    }

    #[test]
    fn reserved_namespace_plus_any_suffix_is_a_write_surface(
        suffix in any::<String>(),
        prefix in prop_oneof![
            Just(String::new()),
            Just("mcp__server__".to_owned()),
            "[a-zA-Z0-9]{0,6}[_./:-]",
            any::<String>(),
        ],
        mask in prop::collection::vec(any::<bool>(), 1..16),
    ) {
        let name = format!("{}{suffix}", flip_case(WRITE_SURFACE_NAMESPACE, &mask));
        prop_assert!(is_write_surface_tool_name(&name));
        let prefixed = format!("{prefix}{name}");
        prop_assert!(is_write_surface_tool_name(&prefixed));
    }

    #[test]
    fn verb_families_after_a_separator_plus_any_suffix_are_write_surfaces(
        family in prop::sample::select(WRITE_SURFACE_VERB_FAMILIES.to_vec()),
        prefix in prop_oneof![Just(String::new()), "[a-zA-Z0-9]{0,6}[_./: -]{1,2}"],
        suffix in any::<String>(),
    ) {
        let name = format!("{prefix}{family}{suffix}");
        prop_assert!(is_write_surface_tool_name(&name));
    }

    #[test]
    fn sanitising_is_idempotent_and_never_leaves_the_flag_true(config in arb_config()) {
        let once = sanitise_child_config(&config).unwrap();
        prop_assert_ne!(once.config().get(SELF_EDIT_FIELD), Some(&Value::Bool(true)));
        prop_assert_eq!(once.was_sanitised(), config[SELF_EDIT_FIELD] == json!(true));
        let twice = sanitise_child_config(once.config()).unwrap();
        prop_assert!(!twice.was_sanitised());
        prop_assert!(std::ptr::eq(twice.config(), once.config()));
        // Only the flag may differ.
        let (mut a, mut b) = (config.clone(), once.config().clone());
        if let (Some(a), Some(b)) = (a.as_object_mut(), b.as_object_mut()) {
            a.remove(SELF_EDIT_FIELD);
            b.remove(SELF_EDIT_FIELD);
        }
        prop_assert_eq!(a, b);
    }

    #[test]
    fn string_flags_are_type_errors_whatever_they_say(config in arb_config(), junk in "(true|false|yes|1|)") {
        let mut bad = config;
        if let Some(map) = bad.as_object_mut() {
            map.insert(SELF_EDIT_FIELD.to_owned(), Value::String(junk));
        }
        prop_assert_eq!(
            sanitise_child_config(&bad),
            Err(LockdownError::SelfEditFlagNotBoolean { found: "string" })
        );
    }
}
