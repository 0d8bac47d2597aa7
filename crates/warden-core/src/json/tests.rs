use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

#[test]
fn parses_like_serde_json() {
    let text = r#"{"a": [1, -2, 3.5, "x", null, true, {"b": {}}], "c": 18446744073709551615}"#;
    let ours = parse_str(text, 10).unwrap();
    let theirs: Value = serde_json::from_str(text).unwrap();
    assert_eq!(ours, theirs);
    assert_eq!(parse_slice(text.as_bytes(), 10).unwrap(), theirs);
}

#[test]
fn duplicate_keys_are_refused_with_their_path() {
    let err = parse_str(r#"{"steps": [{"action": "a", "action": "b"}]}"#, 10).unwrap_err();
    assert_eq!(err.path(), "steps[0].action");
    assert_eq!(err.code(), "duplicate_key");
    assert_eq!(
        err.kind(),
        &JsonErrorKind::DuplicateKey {
            key: "action".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "json at `steps[0].action`: key appears more than once"
    );
    let err = parse_str(r#"{"a": 1, "a": 1}"#, 10).unwrap_err();
    assert_eq!(err.path(), "a");
    let err = parse_str(r#"{"x": {"odd key": 1, "odd key": 2}}"#, 10).unwrap_err();
    assert_eq!(err.path(), r#"x["odd key"]"#);
    assert_eq!(err.position(), None);
}

#[test]
fn depth_limit_names_the_container() {
    assert!(parse_str("[[[]]]", 3).is_ok());
    assert!(parse_str("7", 0).is_ok());
    assert_eq!(parse_str("[]", 0).unwrap_err().path(), "");
    let err = parse_str(r#"{"a": [[{"b": []}]]}"#, 4).unwrap_err();
    assert_eq!(err.code(), "json_too_deep");
    assert_eq!(err.path(), "a[0][0].b");
    assert_eq!(err.kind(), &JsonErrorKind::TooDeep { max: 4 });
    assert_eq!(
        err.to_string(),
        "json at `a[0][0].b`: nests deeper than 4 levels"
    );
}

#[test]
fn the_limit_is_capped_below_serde_json_recursion_limit() {
    let deep = "[".repeat(100_000);
    let err = parse_str(&deep, 1_000).unwrap_err();
    assert_eq!(
        err.kind(),
        &JsonErrorKind::TooDeep {
            max: MAX_SUPPORTED_DEPTH
        }
    );
    let ok = format!("{}{}", "[".repeat(120), "]".repeat(120));
    assert!(parse_str(&ok, 1_000).is_ok());
    let over = format!("{}{}", "[".repeat(121), "]".repeat(121));
    assert_eq!(parse_str(&over, 1_000).unwrap_err().code(), "json_too_deep");
}

#[test]
fn syntax_errors_trailing_input_and_bad_utf8_have_a_position() {
    for text in ["", "{", r#"{"a": }"#, "{} x", "[1,]", "nul", "1e400", "NaN"] {
        let err = parse_str(text, 10).unwrap_err();
        assert_eq!(err.code(), "malformed_json", "{text:?}");
        assert_eq!(err.path(), "");
    }
    let err = parse_str("{\n  \"a\": }", 10).unwrap_err();
    assert_eq!(err.position(), Some((2, 8)));
    assert!(err.to_string().starts_with("json: malformed json: "));
    let err = parse_slice(b"\"\xff\"", 10).unwrap_err();
    assert_eq!(err.code(), "malformed_json");
    assert_eq!(err.position(), Some((1, 2)));
    let err = parse_slice(b"{\"a\": \"\\ud800\"}", 10).unwrap_err();
    assert_eq!(err.code(), "malformed_json");
}

#[test]
fn paths_quote_odd_keys_and_cut_long_ones() {
    let long = "k".repeat(70);
    assert_eq!(
        render_path(
            "a",
            [PathSeg::Key("b"), PathSeg::Index(2), PathSeg::Key("c d")]
        ),
        r#"a.b[2]["c d"]"#
    );
    assert_eq!(
        render_path("", [PathSeg::Key(&long)]),
        format!("[\"{}\"…]", "k".repeat(64))
    );
    assert_eq!(render_path("", [PathSeg::Key("")]), r#"[""]"#);
}

/// Containers on the deepest path (the root container counting as 1).
fn depth(v: &Value) -> usize {
    match v {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        (-1.0e300f64..1.0e300).prop_map(|f| json!(f)),
        "[a-z\\\\\"\u{e9}\u{1F600} ]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(8, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-c ]{0,3}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Write `v` as JSON text, repeating the first key of the `target`-th
/// non-empty object (in pre-order). Returns whether a key was repeated.
fn write_with_duplicate(v: &Value, target: usize, seen: &mut usize, out: &mut String) -> bool {
    match v {
        Value::Object(map) if !map.is_empty() => {
            let here = *seen == target;
            *seen += 1;
            let mut injected = false;
            out.push('{');
            for (i, (k, val)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(k).unwrap());
                out.push(':');
                injected |= write_with_duplicate(val, target, seen, out);
                if here && i == 0 {
                    out.push(',');
                    out.push_str(&serde_json::to_string(k).unwrap());
                    out.push_str(":null");
                    injected = true;
                }
            }
            out.push('}');
            injected
        }
        Value::Array(items) => {
            let mut injected = false;
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                injected |= write_with_duplicate(item, target, seen, out);
            }
            out.push(']');
            injected
        }
        other => {
            out.push_str(&serde_json::to_string(other).unwrap());
            false
        }
    }
}

proptest! {
    #[test]
    fn valid_json_reads_as_serde_json_reads_it(v in arb_value(), pretty in any::<bool>()) {
        let text = if pretty {
            serde_json::to_string_pretty(&v).unwrap()
        } else {
            serde_json::to_string(&v).unwrap()
        };
        let theirs: Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(parse_str(&text, MAX_SUPPORTED_DEPTH).unwrap(), theirs.clone());
        prop_assert_eq!(parse_slice(text.as_bytes(), MAX_SUPPORTED_DEPTH).unwrap(), theirs);
    }

    #[test]
    fn the_depth_limit_is_exact(v in arb_value()) {
        let text = serde_json::to_string(&v).unwrap();
        let d = depth(&v);
        prop_assert!(parse_str(&text, d).is_ok());
        if d > 0 {
            let err = parse_str(&text, d - 1).unwrap_err();
            prop_assert_eq!(err.kind(), &JsonErrorKind::TooDeep { max: d - 1 });
        }
    }

    #[test]
    fn a_duplicate_key_anywhere_is_refused(v in arb_value(), pick in any::<usize>()) {
        // Make sure there is a non-empty object to repeat a key in.
        let v = json!({"wrap": v});
        let mut count = 0;
        let mut probe = String::new();
        write_with_duplicate(&v, usize::MAX, &mut count, &mut probe);
        let mut text = String::new();
        let injected = write_with_duplicate(&v, pick % count, &mut 0, &mut text);
        prop_assert!(injected);
        let err = parse_str(&text, MAX_SUPPORTED_DEPTH).unwrap_err();
        prop_assert_eq!(err.code(), "duplicate_key");
        prop_assert!(parse_slice(text.as_bytes(), MAX_SUPPORTED_DEPTH).is_err());
    }
}
