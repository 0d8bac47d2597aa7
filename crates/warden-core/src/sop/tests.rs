use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::*;

fn parse(value: Value) -> Result<Sop, SopError> {
    let limits = SopLimits::default();
    let from_value = sop_from_value(&value, &limits);
    let from_text = parse_sop(&value.to_string(), &limits);
    assert_eq!(from_value, from_text, "both entry points agree on {value}");
    from_value
}

/// Assert that `value` fails with `code` at `field`.
fn fails(value: Value, code: &str, field: &str) -> SopError {
    let err = parse(value).unwrap_err();
    assert_eq!((err.code(), err.field()), (code, field), "{err}");
    err
}

fn sop_with_step(step: Value) -> Value {
    json!({"sop_id": "s", "version": 1, "steps": [step]})
}

fn fixture(name: &str) -> &'static str {
    match name {
        "prepare-report" => include_str!("../../tests/data/sops/prepare-report.json"),
        "unsafe-report" => include_str!("../../tests/data/sops/unsafe-report.json"),
        "rewrite-manager-memory" => {
            include_str!("../../tests/data/sops/rewrite-manager-memory.json")
        }
        "unknown-action" => include_str!("../../tests/data/sops/unknown-action.json"),
        "duplicate-steps" => include_str!("../../tests/data/sops/duplicate-steps.json"),
        "empty-step-id" => include_str!("../../tests/data/sops/empty-step-id.json"),
        "injected-approval" => include_str!("../../tests/data/sops/injected-approval.json"),
        "unsafe-save-path" => include_str!("../../tests/data/sops/unsafe-save-path.json"),
        other => panic!("no fixture {other}"),
    }
}

#[test]
fn the_lab_sops_parse() {
    let sop = parse_sop(fixture("prepare-report"), &SopLimits::default()).unwrap();
    assert_eq!(sop.sop_id.as_str(), "prepare-report");
    assert_eq!(sop.version, 1);
    assert_eq!(sop.steps.len(), 2);
    assert_eq!(sop.steps[0].step_id_str(), "summarize");
    assert_eq!(sop.steps[1].action.as_str(), "artifact.save");
    assert_eq!(sop.steps[1].arguments["path"], json!("internal/report.txt"));

    for name in [
        "unsafe-report",
        "rewrite-manager-memory",
        "unknown-action",
        "injected-approval",
        "unsafe-save-path",
    ] {
        assert!(
            parse_sop(fixture(name), &SopLimits::default()).is_ok(),
            "{name}"
        );
    }
}

#[test]
fn empty_and_duplicate_step_ids_are_kept_for_the_preflight() {
    let sop = parse_sop(fixture("duplicate-steps"), &SopLimits::default()).unwrap();
    assert_eq!(sop.steps[0].step_id, sop.steps[1].step_id);
    assert_eq!(sop.steps[0].step_id_str(), "same");

    let sop = parse_sop(fixture("empty-step-id"), &SopLimits::default()).unwrap();
    assert_eq!(sop.steps[0].step_id, None);
    assert_eq!(sop.steps[0].step_id_str(), "");
    // And it serialises back as the empty string.
    let back = serde_json::to_value(&sop).unwrap();
    assert_eq!(back["steps"][0]["step_id"], json!(""));
}

#[test]
fn identity_fields_in_arguments_are_plain_data() {
    let sop = parse_sop(fixture("injected-approval"), &SopLimits::default()).unwrap();
    assert_eq!(sop.steps[0].arguments["actor"], json!("report_manager"));
}

#[test]
fn fixtures_meet_the_lab_catalogue() {
    use crate::catalogue::ActionCatalogue;
    let specs = serde_json::from_value(json!({
        "document.summarize": {"arguments": {"type": "object", "required": ["document_id"],
            "additionalProperties": false, "properties": {"document_id": {"type": "string"}}}},
        "artifact.save": {"rules": [{"path_within": {"argument": "path", "globs": ["internal/**"]}}]},
        "external.upload": {"rules": [{"host_in": {"argument": "destination", "hosts": ["uploads.example.com"]}}]}
    }))
    .unwrap();
    let cat = ActionCatalogue::compile(&specs).unwrap();
    let reasons = |name: &str| -> Vec<Vec<String>> {
        let sop = parse_sop(fixture(name), &SopLimits::default()).unwrap();
        sop.steps
            .iter()
            .map(|step| match cat.index_of(step.action.as_str()) {
                Some(idx) => cat
                    .check_argument_value(idx, &step.arguments)
                    .iter()
                    .map(|r| r.as_str().to_owned())
                    .collect(),
                None => vec!["unknown_action".to_owned()],
            })
            .collect()
    };
    assert_eq!(reasons("prepare-report"), [Vec::<String>::new(), vec![]]);
    assert_eq!(
        reasons("unsafe-report")[2],
        ["host_not_allowed:destination"]
    );
    assert_eq!(reasons("unsafe-save-path"), [["path_traversal:path"]]);
    assert_eq!(
        reasons("injected-approval"),
        [["host_not_allowed:destination"]]
    );
    assert_eq!(reasons("unknown-action"), [["unknown_action"]]);
    assert_eq!(reasons("rewrite-manager-memory"), [Vec::<String>::new()]);
}

#[test]
fn arguments_default_to_an_empty_object() {
    let sop = parse(sop_with_step(json!({"step_id": "a", "action": "x.y"}))).unwrap();
    assert!(sop.steps[0].arguments().is_empty());
}

#[test]
fn the_document_must_be_an_object() {
    let err = fails(json!([]), "wrong_type", "");
    assert_eq!(
        err.to_string(),
        "sop: expected an sop object, found an array"
    );
    fails(json!("sop"), "wrong_type", "");
    fails(json!(null), "wrong_type", "");
}

#[test]
fn unknown_fields_are_refused_everywhere() {
    let err = fails(
        json!({"sop_id": "s", "version": 1, "steps": [], "owner": "root"}),
        "unknown_field",
        "owner",
    );
    assert_eq!(err.to_string(), "field `owner`: unknown field");
    fails(
        sop_with_step(json!({"step_id": "a", "action": "x.y", "actor": "report_manager"})),
        "unknown_field",
        "steps[0].actor",
    );
    fails(
        sop_with_step(json!({"step_id": "a", "action": "x.y", "odd key.": 1})),
        "unknown_field",
        "steps[0][\"odd key.\"]",
    );
    let long = "k".repeat(500);
    let err = fails(
        sop_with_step(json!({"step_id": "a", "action": "x.y", long: 1})),
        "unknown_field",
        &format!("steps[0][\"{}\"…]", "k".repeat(64)),
    );
    assert!(err.field().len() < 100);
    let long_odd = "é".repeat(100);
    let err = parse(sop_with_step(
        json!({"step_id": "a", "action": "x.y", long_odd: 1}),
    ))
    .unwrap_err();
    assert_eq!(err.field(), format!("steps[0][\"{}\"…]", "é".repeat(32)));
}

#[test]
fn missing_fields() {
    fails(
        json!({"version": 1, "steps": []}),
        "missing_field",
        "sop_id",
    );
    fails(
        json!({"sop_id": "s", "steps": []}),
        "missing_field",
        "version",
    );
    fails(
        json!({"sop_id": "s", "version": 1}),
        "missing_field",
        "steps",
    );
    fails(
        sop_with_step(json!({"action": "x.y"})),
        "missing_field",
        "steps[0].step_id",
    );
    let err = fails(
        sop_with_step(json!({"step_id": "a"})),
        "missing_field",
        "steps[0].action",
    );
    assert_eq!(
        err.to_string(),
        "field `steps[0].action`: required field is missing"
    );
}

#[test]
fn wrong_types() {
    let ok_step = json!({"step_id": "a", "action": "x.y"});
    fails(
        json!({"sop_id": 5, "version": 1, "steps": [ok_step]}),
        "wrong_type",
        "sop_id",
    );
    let err = fails(
        json!({"sop_id": "s", "version": "1", "steps": [ok_step]}),
        "wrong_type",
        "version",
    );
    assert_eq!(
        err.to_string(),
        "field `version`: expected an integer, found a string"
    );
    for float in [json!(1.0), json!(1.5), json!(1e2)] {
        fails(
            json!({"sop_id": "s", "version": float, "steps": [ok_step]}),
            "wrong_type",
            "version",
        );
    }
    fails(
        json!({"sop_id": "s", "version": 1, "steps": {"0": ok_step}}),
        "wrong_type",
        "steps",
    );
    fails(
        json!({"sop_id": "s", "version": 1, "steps": [ok_step, "step"]}),
        "wrong_type",
        "steps[1]",
    );
    fails(
        sop_with_step(json!({"step_id": 1, "action": "x.y"})),
        "wrong_type",
        "steps[0].step_id",
    );
    fails(
        sop_with_step(json!({"step_id": null, "action": "x.y"})),
        "wrong_type",
        "steps[0].step_id",
    );
    fails(
        sop_with_step(json!({"step_id": "a", "action": ["x.y"]})),
        "wrong_type",
        "steps[0].action",
    );
    for args in [json!([]), json!("a=b"), json!(null), json!(1)] {
        fails(
            sop_with_step(json!({"step_id": "a", "action": "x.y", "arguments": args})),
            "wrong_type",
            "steps[0].arguments",
        );
    }
}

#[test]
fn versions() {
    let step = json!({"step_id": "a", "action": "x.y"});
    for bad in [
        json!(0),
        json!(-1),
        json!(u64::from(u32::MAX) + 1),
        json!(u64::MAX),
    ] {
        fails(
            json!({"sop_id": "s", "version": bad, "steps": [step]}),
            "invalid_version",
            "version",
        );
    }
    let sop = parse(json!({"sop_id": "s", "version": u32::MAX, "steps": [step]})).unwrap();
    assert_eq!(sop.version, u32::MAX);
}

#[test]
fn step_count_limits() {
    let err = fails(
        json!({"sop_id": "s", "version": 1, "steps": []}),
        "empty_sop",
        "steps",
    );
    assert_eq!(
        err.to_string(),
        "field `steps`: an sop needs at least one step"
    );
    let step = json!({"step_id": "a", "action": "x.y"});
    let fifty: Vec<Value> = (0..50).map(|_| step.clone()).collect();
    assert!(parse(json!({"sop_id": "s", "version": 1, "steps": fifty})).is_ok());
    let fifty_one: Vec<Value> = (0..51).map(|_| step.clone()).collect();
    let err = fails(
        json!({"sop_id": "s", "version": 1, "steps": fifty_one}),
        "too_many_steps",
        "steps",
    );
    assert_eq!(
        err.kind(),
        &SopErrorKind::TooManySteps { count: 51, max: 50 }
    );
}

#[test]
fn identifiers() {
    let step = json!({"step_id": "a", "action": "x.y"});
    fails(
        json!({"sop_id": "", "version": 1, "steps": [step]}),
        "invalid_identifier",
        "sop_id",
    );
    let err = fails(
        json!({"sop_id": "a/b", "version": 1, "steps": [step]}),
        "invalid_identifier",
        "sop_id",
    );
    assert_eq!(
        err.to_string(),
        "field `sop_id`: identifier contains `/` at byte 1; allowed are A-Z a-z 0-9 . _ : -"
    );
    fails(
        json!({"sop_id": "a".repeat(129), "version": 1, "steps": [step]}),
        "invalid_identifier",
        "sop_id",
    );
    assert!(parse(json!({"sop_id": "a".repeat(128), "version": 1, "steps": [step]})).is_ok());
    fails(
        sop_with_step(json!({"step_id": "a b", "action": "x.y"})),
        "invalid_identifier",
        "steps[0].step_id",
    );
    fails(
        sop_with_step(json!({"step_id": " ", "action": "x.y"})),
        "invalid_identifier",
        "steps[0].step_id",
    );
    fails(
        sop_with_step(json!({"step_id": "a", "action": ""})),
        "invalid_identifier",
        "steps[0].action",
    );
    let err = fails(
        sop_with_step(json!({"step_id": "a", "action": "x\u{0}y"})),
        "invalid_identifier",
        "steps[0].action",
    );
    assert!(err.to_string().contains("`\\0`"), "{err}");

    // A tighter configured length applies to every identifier.
    let limits = SopLimits {
        max_identifier_len: 4,
        ..SopLimits::default()
    };
    let err = sop_from_value(
        &sop_with_step(json!({"step_id": "abcde", "action": "x.y"})),
        &limits,
    )
    .unwrap_err();
    assert_eq!(
        (err.code(), err.field()),
        ("invalid_identifier", "steps[0].step_id")
    );
    assert_eq!(
        err.kind(),
        &SopErrorKind::InvalidIdentifier(IdentifierProblem::TooLong { len: 5, max: 4 })
    );
    // A looser one is capped at the global maximum.
    let limits = SopLimits {
        max_identifier_len: 1000,
        ..SopLimits::default()
    };
    let err = sop_from_value(
        &json!({"sop_id": "a".repeat(129), "version": 1, "steps": [step]}),
        &limits,
    )
    .unwrap_err();
    assert_eq!(
        err.kind(),
        &SopErrorKind::InvalidIdentifier(IdentifierProblem::TooLong { len: 129, max: 128 })
    );
}

#[test]
fn argument_size_limit() {
    let limits = SopLimits::default();
    // {"a":"…"} is 8 bytes of framing.
    let fits = "x".repeat(limits.max_argument_bytes - 8);
    assert!(
        parse(sop_with_step(
            json!({"step_id": "a", "action": "x.y", "arguments": {"a": fits}})
        ))
        .is_ok()
    );
    let over = "x".repeat(limits.max_argument_bytes - 7);
    let err = fails(
        sop_with_step(json!({"step_id": "a", "action": "x.y", "arguments": {"a": over}})),
        "arguments_too_large",
        "steps[0].arguments",
    );
    assert_eq!(
        err.to_string(),
        "field `steps[0].arguments`: arguments encode to more than 65536 bytes"
    );
}

/// `depth` arrays around `1`, built without `json!` (which would serialise
/// its argument recursively).
fn nested_arrays(depth: usize) -> Value {
    let mut v = Value::from(1);
    for _ in 0..depth {
        v = Value::Array(vec![v]);
    }
    v
}

/// A one-step SOP whose arguments are `{"a": value}`, built without `json!`.
fn sop_with_argument(value: Value) -> Value {
    let mut args = Map::new();
    args.insert("a".to_owned(), value);
    let mut step = sop_with_step(json!({"step_id": "a", "action": "x.y"}));
    step["steps"][0]["arguments"] = Value::Object(args);
    step
}

#[test]
fn nesting_limit_names_the_container() {
    // The arguments object is depth 1, so 31 nested arrays inside is 32.
    let ok = sop_with_argument(nested_arrays(31));
    assert!(parse(ok).is_ok());
    let deep = sop_with_argument(nested_arrays(32));
    let field = format!("steps[0].arguments.a{}", "[0]".repeat(31));
    let err = fails(deep, "nesting_too_deep", &field);
    assert_eq!(err.kind(), &SopErrorKind::NestingTooDeep { max: 32 });

    let limits = SopLimits {
        max_depth: 0,
        ..SopLimits::default()
    };
    let flat = sop_with_step(json!({"step_id": "a", "action": "x.y", "arguments": {}}));
    for result in [
        sop_from_value(&flat, &limits),
        parse_sop(&flat.to_string(), &limits),
    ] {
        let err = result.unwrap_err();
        assert_eq!(
            (err.code(), err.field()),
            ("nesting_too_deep", "steps[0].arguments")
        );
    }
}

#[test]
fn nesting_beyond_serde_json_is_the_same_error() {
    // 200 levels: serde_json alone would stop at 128 with a recursion error.
    let text = format!(
        r#"{{"sop_id": "s", "version": 1, "steps": [{{"step_id": "a", "action": "x.y", "arguments": {{"a": {}1{}}}}}]}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let err = parse_sop(&text, &SopLimits::default()).unwrap_err();
    assert_eq!(err.code(), "nesting_too_deep");
    assert!(
        err.field().starts_with("steps[0].arguments.a[0]"),
        "{}",
        err.field()
    );

    // A configured limit above what is supported is capped, not trusted.
    let limits = SopLimits {
        max_depth: 10_000,
        ..SopLimits::default()
    };
    let err = parse_sop(&text, &limits).unwrap_err();
    assert_eq!(
        err.kind(),
        &SopErrorKind::NestingTooDeep {
            max: MAX_SUPPORTED_DEPTH
        }
    );

    // A value built in memory far deeper than any parser allows is walked
    // without recursion.
    let deep = sop_with_argument(nested_arrays(5_000));
    let err = sop_from_value(&deep, &limits).unwrap_err();
    assert_eq!(err.code(), "nesting_too_deep");
    drop_iteratively(deep);
}

/// Dropping a very deep value recurses in serde_json; take it apart with a
/// heap stack instead of depending on the test thread's stack size.
fn drop_iteratively(value: Value) {
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

#[test]
fn malformed_and_duplicate_json() {
    for text in ["", "{", "{\"sop_id\": }", "{} {}", "[1,]", "{\"a\" 1}"] {
        let err = parse_sop(text, &SopLimits::default()).unwrap_err();
        assert_eq!(
            (err.code(), err.field()),
            ("malformed_json", ""),
            "{text:?}"
        );
        assert!(err.to_string().starts_with("sop: malformed json: "));
    }
    let text = r#"{"sop_id": "s", "version": 1, "steps": [{"step_id": "a", "action": "memory.read", "action": "external.upload"}]}"#;
    let err = parse_sop(text, &SopLimits::default()).unwrap_err();
    assert_eq!(
        (err.code(), err.field()),
        ("duplicate_field", "steps[0].action")
    );
    assert_eq!(
        err.to_string(),
        "field `steps[0].action`: field appears more than once"
    );
    let text = r#"{"sop_id": "s", "sop_id": "t", "version": 1, "steps": []}"#;
    let err = parse_sop(text, &SopLimits::default()).unwrap_err();
    assert_eq!((err.code(), err.field()), ("duplicate_field", "sop_id"));
}

#[test]
fn error_messages_are_one_lowercase_line() {
    let cases = [
        json!([]),
        json!({"sop_id": "s", "version": 0, "steps": []}),
        json!({"sop_id": "s", "version": 1, "steps": []}),
        sop_with_step(json!({"step_id": "a\nb", "action": "x.y"})),
    ];
    for case in cases {
        let text = parse(case).unwrap_err().to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(!text.ends_with('.'), "{text}");
        assert!(text.starts_with(|c: char| c.is_lowercase()), "{text}");
    }
}

// ---- properties ----

fn identifier_strategy() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._:-]{1,24}"
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1.0e9f64..1.0e9).prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ]
}

fn json_value(keys: BoxedStrategy<String>) -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(5, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(keys.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn valid_step() -> impl Strategy<Value = Step> {
    (
        prop::option::weighted(0.9, identifier_strategy()),
        "[a-z]{1,8}\\.[a-z_]{1,8}",
        prop::collection::btree_map(".{0,8}", json_value(".{0,8}".boxed()).boxed(), 0..5),
    )
        .prop_map(|(id, action, args)| Step {
            step_id: id.map(|s| StepId::parse(&s).unwrap()),
            action: ActionName::parse(&action).unwrap(),
            arguments: args.into_iter().collect(),
        })
}

fn valid_sop() -> impl Strategy<Value = Sop> {
    (
        identifier_strategy(),
        1..=u32::MAX,
        prop::collection::vec(valid_step(), 1..=8),
    )
        .prop_map(|(id, version, steps)| Sop {
            sop_id: SopId::parse(&id).unwrap(),
            version,
            steps,
        })
}

/// Values shaped somewhat like SOPs, to reach deep into the parser.
fn sop_like() -> impl Strategy<Value = Value> {
    let keys = prop_oneof![
        Just("sop_id".to_owned()),
        Just("version".to_owned()),
        Just("steps".to_owned()),
        Just("step_id".to_owned()),
        Just("action".to_owned()),
        Just("arguments".to_owned()),
        ".{0,4}",
    ]
    .boxed();
    json_value(keys)
}

proptest! {
    #[test]
    fn round_trips(sop in valid_sop()) {
        let text = serde_json::to_string(&sop).unwrap();
        let back = parse_sop(&text, &SopLimits::default()).unwrap();
        prop_assert_eq!(&back, &sop);
        let value = serde_json::to_value(&sop).unwrap();
        prop_assert_eq!(sop_from_value(&value, &SopLimits::default()).unwrap(), sop);
    }

    #[test]
    fn never_panics_on_values(value in sop_like()) {
        let limits = SopLimits { max_depth: 3, max_argument_bytes: 64, ..SopLimits::default() };
        let a = sop_from_value(&value, &limits);
        let b = parse_sop(&value.to_string(), &limits);
        // Duplicate keys cannot occur in a Value, so both agree, except that
        // the text parser bounds the depth of the whole document up front.
        let deep = |r: &Result<Sop, SopError>| {
            matches!(r, Err(e) if e.code() == "nesting_too_deep")
        };
        if !deep(&a) && !deep(&b) {
            prop_assert_eq!(a, b);
        }
    }

    #[test]
    fn never_panics_on_structured_sops(
        steps in prop::collection::vec(
            prop::collection::btree_map(
                prop_oneof![Just("step_id".to_owned()), Just("action".to_owned()),
                            Just("arguments".to_owned()), Just("x".to_owned())],
                sop_like(), 0..4),
            0..4),
        version in json_leaf(),
    ) {
        let steps: Vec<Value> = steps.into_iter().map(|m| Value::Object(m.into_iter().collect())).collect();
        let value = json!({"sop_id": "s", "version": version, "steps": steps});
        let _ = sop_from_value(&value, &SopLimits::default());
    }

    #[test]
    fn never_panics_on_text(text in ".{0,64}") {
        let _ = parse_sop(&text, &SopLimits::default());
    }

    #[test]
    fn never_panics_on_json_fragments(
        parts in prop::collection::vec(prop_oneof![
            Just("{"), Just("}"), Just("["), Just("]"), Just(","), Just(":"),
            Just("\"sop_id\""), Just("\"steps\""), Just("\"version\""), Just("\"action\""),
            Just("\"step_id\""), Just("\"arguments\""), Just("1"), Just("\"a\""), Just("null"),
        ], 0..64)
    ) {
        let _ = parse_sop(&parts.concat(), &SopLimits::default());
    }
}
