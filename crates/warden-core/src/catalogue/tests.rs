use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::*;

fn specs(value: Value) -> BTreeMap<ActionName, ActionSpec> {
    serde_json::from_value(value).unwrap()
}

fn compile(value: Value) -> ActionCatalogue {
    ActionCatalogue::compile(&specs(value)).unwrap()
}

fn compile_err(value: Value) -> CatalogueError {
    ActionCatalogue::compile(&specs(value)).unwrap_err()
}

fn obj(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

fn check(cat: &ActionCatalogue, action: &str, args: Value) -> Vec<String> {
    let idx = cat.index_of(action).unwrap();
    let by_map = cat.check_arguments(idx, &obj(args.clone()));
    let by_value = cat.check_argument_value(idx, &args);
    assert_eq!(by_map, by_value, "both entry points agree");
    by_map.iter().map(|r| r.as_str().to_owned()).collect()
}

/// The bundle example of the design brief.
fn lab() -> ActionCatalogue {
    compile(json!({
        "document.summarize": {
            "arguments": {"type": "object", "required": ["document_id"],
                          "additionalProperties": false,
                          "properties": {"document_id": {"type": "string", "maxLength": 128}}}
        },
        "artifact.save": {
            "arguments": {"type": "object", "required": ["path"],
                          "properties": {"path": {"type": "string"}}},
            "rules": [{"path_within": {"argument": "path", "globs": ["internal/**"]}}]
        },
        "external.upload": {
            "tags": ["external", "export", "state_changing"],
            "rules": [{"host_in": {"argument": "destination",
                                   "hosts": ["uploads.example.com", "*.cdn.example.com"],
                                   "schemes": ["https"]}}],
            "limits": {"timeout_ms": 5000, "max_output_bytes": 1048576},
            "output_labels": ["external"]
        }
    }))
}

fn single_rule(rule: Value) -> ActionCatalogue {
    compile(json!({"test.action": {"rules": [rule]}}))
}

#[test]
fn compiles_with_builtins_in_name_order() {
    let cat = lab();
    let names: Vec<&str> = cat.iter().map(|a| a.name().as_str()).collect();
    assert_eq!(
        names,
        [
            "artifact.save",
            "document.summarize",
            "external.upload",
            "memory.read",
            "memory.write"
        ]
    );
    assert_eq!(cat.len(), 5);
    assert!(!cat.is_empty());
    for (position, action) in cat.iter().enumerate() {
        assert_eq!(action.index().as_usize(), position);
        assert_eq!(cat.index_of(action.name().as_str()), Some(action.index()));
        assert_eq!(cat.get(action.index()).unwrap().name(), action.name());
    }
    assert_eq!(cat.index_of("shell.eval"), None);
    assert_eq!(cat.index_of(""), None);
    assert!(cat.by_name("memory.read").is_some());
    assert!(format!("{cat:?}").contains("memory.write"));
}

#[test]
fn metadata_is_exposed() {
    let cat = lab();
    let upload = cat.by_name("external.upload").unwrap();
    assert!(upload.has_tag("export"));
    assert!(upload.has_tag("external"));
    assert!(!upload.has_tag("exp"));
    assert_eq!(
        upload.tags().iter().map(|t| t.as_str()).collect::<Vec<_>>(),
        ["export", "external", "state_changing"]
    );
    assert_eq!(upload.limits().timeout_ms, 5000);
    assert_eq!(upload.output_labels()[0].as_str(), "external");
    assert!(!upload.has_schema());
    let summarize = cat.by_name("document.summarize").unwrap();
    assert_eq!(*summarize.limits(), ExecutionLimits::default());
    assert_eq!(summarize.limits().timeout_ms, 30_000);
    assert_eq!(summarize.limits().max_output_bytes, 1 << 20);
    assert!(summarize.has_schema());
    assert!(
        cat.by_name("memory.write")
            .unwrap()
            .has_tag("state_changing")
    );
    assert!(
        !cat.by_name("memory.read")
            .unwrap()
            .has_tag("state_changing")
    );
}

#[test]
fn an_index_from_elsewhere_fails_closed() {
    let small = ActionCatalogue::compile(&BTreeMap::new()).unwrap();
    assert_eq!(small.len(), 2);
    let big = lab();
    let foreign = big.index_of("memory.write").unwrap();
    assert!(small.get(foreign).is_none());
    assert_eq!(
        small.check_arguments(foreign, &Map::new()),
        vec![UNKNOWN_ACTION]
    );
    assert_eq!(
        small.check_argument_value(foreign, &json!({})),
        vec![UNKNOWN_ACTION]
    );
}

#[test]
fn the_lab_steps() {
    let cat = lab();
    assert!(
        check(
            &cat,
            "document.summarize",
            json!({"document_id": "fixture-1"})
        )
        .is_empty()
    );
    assert!(
        check(
            &cat,
            "artifact.save",
            json!({"path": "internal/report.txt"})
        )
        .is_empty()
    );
    assert_eq!(
        check(
            &cat,
            "external.upload",
            json!({"destination": "untrusted-service"})
        ),
        ["host_not_allowed:destination"]
    );
    assert!(
        check(
            &cat,
            "external.upload",
            json!({"destination": "https://uploads.example.com/r"})
        )
        .is_empty()
    );
}

#[test]
fn a_passing_check_returns_an_unallocated_vec() {
    let cat = lab();
    let upload = cat.index_of("external.upload").unwrap();
    let args = obj(json!({"destination": "https://uploads.example.com/r"}));
    assert_eq!(cat.check_arguments(upload, &args).capacity(), 0);
    let save = cat.index_of("artifact.save").unwrap();
    let args = json!({"path": "internal/report.txt"});
    assert_eq!(cat.check_argument_value(save, &args).capacity(), 0);
}

#[test]
fn schema_violations_name_locations_not_values() {
    let cat = lab();
    assert_eq!(
        check(&cat, "document.summarize", json!({})),
        ["argument_schema_violation:/document_id"]
    );
    let secret = "s3cr3t-".repeat(30);
    let mut got = check(
        &cat,
        "document.summarize",
        json!({"document_id": secret, "extra": 1, "a/b~c": 2}),
    );
    got.sort();
    assert_eq!(
        got,
        [
            "argument_schema_violation:/a~1b~0c",
            "argument_schema_violation:/document_id",
            "argument_schema_violation:/extra",
        ]
    );
    assert!(got.iter().all(|r| !r.contains("s3cr3t")));
    assert_eq!(
        check(&cat, "document.summarize", json!({"document_id": 7})),
        ["argument_schema_violation:/document_id"]
    );
    // Non-object arguments through the value entry point.
    let idx = cat.index_of("document.summarize").unwrap();
    assert_eq!(
        cat.check_argument_value(idx, &json!([1]))
            .iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>(),
        ["argument_schema_violation:$"]
    );
}

#[test]
fn schema_root_violations_and_long_keys() {
    let cat = compile(json!({"a.b": {"arguments": {"type": "object", "minProperties": 2}}}));
    assert_eq!(
        check(&cat, "a.b", json!({})),
        ["argument_schema_violation:$"]
    );
    let cat = compile(json!({"a.b": {"arguments": {"additionalProperties": false}}}));
    let long_key = "k".repeat(1000);
    let got = check(&cat, "a.b", json!({ long_key: 1 }));
    assert_eq!(got.len(), 1);
    assert!(got[0].len() <= "argument_schema_violation:".len() + MAX_POINTER_LEN);
}

#[test]
fn schema_violations_and_rules_are_all_reported() {
    let cat = lab();
    let got = check(&cat, "artifact.save", json!({"path": 42}));
    assert_eq!(
        got,
        [
            "argument_schema_violation:/path",
            "argument_wrong_type:path"
        ]
    );
    let got = check(&cat, "artifact.save", json!({}));
    assert_eq!(
        got,
        ["argument_schema_violation:/path", "argument_missing:path"]
    );
}

#[test]
fn schema_formats_are_asserted() {
    let cat = compile(json!({"a.b": {"arguments": {
        "type": "object", "properties": {"at": {"type": "string", "format": "date-time"}}}}}));
    assert!(check(&cat, "a.b", json!({"at": "2024-01-01T00:00:00Z"})).is_empty());
    assert_eq!(
        check(&cat, "a.b", json!({"at": "yesterday"})),
        ["argument_schema_violation:/at"]
    );
}

#[test]
fn invalid_or_remote_schemas_are_located_errors() {
    let err = compile_err(json!({"doc.sum": {"arguments": {"type": "objekt"}}}));
    assert!(
        matches!(&err, CatalogueError::InvalidSchema { action, .. } if action.as_str() == "doc.sum")
    );
    assert_eq!(err.action().map(|a| a.as_str()), Some("doc.sum"));
    assert_eq!(err.rule(), None);
    let text = err.to_string();
    assert!(
        text.starts_with("action `doc.sum`: invalid argument schema: "),
        "{text}"
    );
    assert!(!text.contains('\n'));
    assert!(!text.ends_with('.'));
    let err =
        compile_err(json!({"doc.sum": {"arguments": {"$ref": "https://example.com/s.json"}}}));
    assert!(matches!(err, CatalogueError::InvalidSchema { .. }));
    let err = compile_err(json!({"doc.sum": {"arguments": {"$ref": "file:///etc/passwd"}}}));
    assert!(matches!(err, CatalogueError::InvalidSchema { .. }));
}

#[test]
fn path_within_adversarial_paths() {
    let cat = lab();
    let cases = [
        ("internal/report.txt", None),
        ("./internal/a.txt", None),
        ("internal/a/../b.txt", None),
        ("internal/deep/er/x.txt", None),
        ("internal//a.txt", None),
        ("internal/../secret.txt", Some("path_outside_allowed")),
        ("internal/%2e%2e/x", Some("path_traversal")),
        ("internal/%252e%252e/x", Some("path_traversal")),
        ("/etc/passwd", Some("path_traversal")),
        ("C:/internal/x", Some("path_traversal")),
        ("internal\\..\\x", Some("path_traversal")),
        ("internal/\u{0}x", Some("path_traversal")),
        ("../internal/x", Some("path_traversal")),
        ("internal/../../x", Some("path_traversal")),
        ("internal", Some("path_outside_allowed")),
        ("internal/", Some("path_outside_allowed")),
        ("", Some("path_outside_allowed")),
        (".", Some("path_outside_allowed")),
        ("Internal/x", Some("path_outside_allowed")),
        ("public/x", Some("path_outside_allowed")),
    ];
    for (path, want) in cases {
        let got = check(&cat, "artifact.save", json!({ "path": path }));
        let want: Vec<String> = want.map(|w| format!("{w}:path")).into_iter().collect();
        assert_eq!(got, want, "{path:?}");
    }
}

/// Paths that read one way on a screen and another to a filesystem or an
/// archive tool: every one is refused with its own reason, wherever the
/// character sits in the path, and whether or not it would escape.
#[test]
fn path_within_refuses_ambiguous_unicode() {
    let cat = lab();
    let tricks = [
        // Fullwidth and compatibility dots: `．．` reads `..` after NFKC.
        "internal/\u{ff0e}\u{ff0e}/secret.txt",
        "internal/\u{ff0e}/a.txt",
        "internal/a\u{ff0e}txt",
        "\u{ff0e}\u{ff0e}/internal/x",
        // The one-dot and two-dot leaders (`․` is `.` after NFKC).
        "internal/\u{2024}\u{2024}/x",
        "internal/\u{2025}/x",
        "internal/a\u{2024}txt",
        // Small full stop, fullwidth solidus and reverse solidus.
        "internal/\u{fe52}\u{fe52}/x",
        "internal\u{ff0f}..\u{ff0f}x",
        "internal/..\u{ff3c}x",
        // Fullwidth letters (NFKC folds them into `internal`).
        "\u{ff49}nternal/x",
        // Bidi controls: the right-to-left override and its friends.
        "internal/\u{202e}txt.exe",
        "internal/a\u{202a}b",
        "internal/a\u{2066}b\u{2069}",
        "internal/\u{200f}a",
        "internal/a\u{61c}b",
        // Invisible characters.
        "internal/a\u{200b}b",
        "internal/\u{200d}x",
        "internal/\u{feff}x",
        "internal/a\u{ad}b",
        "internal/a\u{2060}b",
        "internal/a\u{fe0f}b",
        "internal/a\u{e0041}b",
        "internal/\u{3164}",
        // Non-ASCII whitespace and separators.
        "internal/a\u{a0}b",
        "internal/a\u{2028}b",
        "internal/a\u{3000}b",
        // A decomposed `é` (NFKC composes it).
        "internal/re\u{301}sume\u{301}.txt",
        // Ligatures and compatibility digits.
        "internal/\u{fb01}le.txt",
        "internal/\u{2460}.txt",
    ];
    for path in tricks {
        let got = check(&cat, "artifact.save", json!({ "path": path }));
        assert_eq!(got, ["path_ambiguous_unicode:path"], "{path:?}");
    }
    // Plain non-ASCII names in NFC are ordinary names.
    for path in [
        "internal/résumé.txt",
        "internal/日本語/報告.txt",
        "internal/a b.txt",
    ] {
        assert!(
            check(&cat, "artifact.save", json!({ "path": path })).is_empty(),
            "{path:?}"
        );
    }
}

#[test]
fn star_does_not_cross_separators() {
    let cat = single_rule(
        json!({"path_within": {"argument": "p", "globs": ["out/*.txt", "logs/**/*.log"]}}),
    );
    assert!(check(&cat, "test.action", json!({"p": "out/a.txt"})).is_empty());
    assert_eq!(
        check(&cat, "test.action", json!({"p": "out/a/b.txt"})),
        ["path_outside_allowed:p"]
    );
    assert!(check(&cat, "test.action", json!({"p": "logs/x.log"})).is_empty());
    assert!(check(&cat, "test.action", json!({"p": "logs/a/b/x.log"})).is_empty());
}

#[test]
fn bad_globs_are_located_errors() {
    for glob in ["internal/[", "/abs/**", "a/../b/*", "a\\b"] {
        let err = compile_err(json!({"x.y": {"rules": [
            {"max_bytes": {"argument": "a", "max": 1}},
            {"path_within": {"argument": "p", "globs": [glob]}}
        ]}}));
        assert!(
            matches!(&err, CatalogueError::InvalidGlob { rule: 1, glob: g, .. } if g == glob),
            "{glob}: {err}"
        );
        assert_eq!(err.rule(), Some(1));
        assert!(
            err.to_string()
                .starts_with("action `x.y`, rule 1: invalid glob `")
        );
    }
    let err =
        compile_err(json!({"x.y": {"rules": [{"path_within": {"argument": "p", "globs": []}}]}}));
    assert_eq!(
        err.to_string(),
        "action `x.y`, rule 0: `globs` is empty, so the rule would allow nothing"
    );
}

#[test]
fn host_in_adversarial_hosts() {
    let cat = lab();
    let cases = [
        ("https://uploads.example.com/x", None),
        ("https://UPLOADS.EXAMPLE.COM/x", None),
        ("https://img.cdn.example.com/x", None),
        (
            "https://uploads.example.com@evil.com/x",
            Some("host_not_allowed"),
        ),
        ("https://uploads.example.com./x", Some("host_not_allowed")),
        (
            "https://uploads.example.com:8443/x",
            Some("host_not_allowed"),
        ),
        ("http://uploads.example.com/x", Some("scheme_not_allowed")),
        (
            "https://uploads.example.com.evil.com/x",
            Some("host_not_allowed"),
        ),
        ("https://cdn.example.com/x", Some("host_not_allowed")),
        ("https://127.0.0.1/x", Some("host_not_allowed")),
        ("https://[::1]/x", Some("host_not_allowed")),
        ("untrusted-service", Some("host_not_allowed")),
        ("https://@uploads.example.com/x", Some("host_not_allowed")),
        ("https://@img.cdn.example.com/x", Some("host_not_allowed")),
        ("https://uploads%2eexample.com/x", Some("host_not_allowed")),
        ("https://uploads.example%2Ecom/x", Some("host_not_allowed")),
        (
            "https://uploads\u{ff0e}example\u{ff0e}com/x",
            Some("host_not_allowed"),
        ),
        (
            "https://uploads.example.com\u{202e}/x",
            Some("host_not_allowed"),
        ),
        ("https://img.cdn.example.com./x", Some("host_not_allowed")),
        ("https:uploads.example.com/x", Some("host_not_allowed")),
    ];
    for (url, want) in cases {
        let got = check(&cat, "external.upload", json!({ "destination": url }));
        let want: Vec<String> = want
            .map(|w| format!("{w}:destination"))
            .into_iter()
            .collect();
        assert_eq!(got, want, "{url:?}");
    }
    assert_eq!(
        check(
            &cat,
            "external.upload",
            json!({"destination": ["https://uploads.example.com"]})
        ),
        ["argument_wrong_type:destination"]
    );
    assert_eq!(
        check(&cat, "external.upload", json!({})),
        ["argument_missing:destination"]
    );
}

#[test]
fn host_rule_compile_errors() {
    let err = compile_err(
        json!({"x.y": {"rules": [{"host_in": {"argument": "u", "hosts": ["*.com"]}}]}}),
    );
    assert!(
        matches!(err, CatalogueError::InvalidHost { rule: 0, .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("action `x.y`, rule 0: invalid host `*.com`: ")
    );
    let err = compile_err(
        json!({"x.y": {"rules": [{"host_in": {"argument": "u", "hosts": ["a.example.com"], "schemes": ["HTTPS"]}}]}}),
    );
    assert!(matches!(err, CatalogueError::InvalidScheme { .. }), "{err}");
    let err = compile_err(json!({"x.y": {"rules": [{"host_in": {"argument": "u", "hosts": []}}]}}));
    assert!(matches!(
        err,
        CatalogueError::EmptyList { field: "hosts", .. }
    ));
    let err = compile_err(
        json!({"x.y": {"rules": [{"host_in": {"argument": "u", "hosts": ["a.example.com"], "schemes": []}}]}}),
    );
    assert!(matches!(
        err,
        CatalogueError::EmptyList {
            field: "schemes",
            ..
        }
    ));
}

#[test]
fn max_bytes() {
    let cat = single_rule(json!({"max_bytes": {"argument": "body", "max": 8}}));
    assert!(check(&cat, "test.action", json!({"body": "12345678"})).is_empty());
    assert_eq!(
        check(&cat, "test.action", json!({"body": "123456789"})),
        ["argument_too_large:body"]
    );
    // {"a":12} is 8 bytes; {"a":123} is 9.
    assert!(check(&cat, "test.action", json!({"body": {"a": 12}})).is_empty());
    assert_eq!(
        check(&cat, "test.action", json!({"body": {"a": 123}})),
        ["argument_too_large:body"]
    );
    assert!(check(&cat, "test.action", json!({"body": null})).is_empty());
    assert_eq!(
        check(&cat, "test.action", json!({})),
        ["argument_missing:body"]
    );
}

#[test]
fn pattern_is_a_full_match() {
    let cat = single_rule(json!({"pattern": {"argument": "record_id", "regex": "rec-[0-9]+"}}));
    assert!(check(&cat, "test.action", json!({"record_id": "rec-42"})).is_empty());
    for bad in ["xrec-42", "rec-42x", "rec-42\nrec-1", "rec-", ""] {
        assert_eq!(
            check(&cat, "test.action", json!({ "record_id": bad })),
            ["pattern_mismatch:record_id"],
            "{bad:?}"
        );
    }
    assert_eq!(
        check(&cat, "test.action", json!({"record_id": 42})),
        ["argument_wrong_type:record_id"]
    );
    // Alternation stays inside the anchors.
    let cat = single_rule(json!({"pattern": {"argument": "v", "regex": "a|b"}}));
    assert!(check(&cat, "test.action", json!({"v": "a"})).is_empty());
    assert_eq!(
        check(&cat, "test.action", json!({"v": "ab"})),
        ["pattern_mismatch:v"]
    );
    let err =
        compile_err(json!({"x.y": {"rules": [{"pattern": {"argument": "v", "regex": "("}}]}}));
    assert!(matches!(err, CatalogueError::InvalidRegex { rule: 0, .. }));
    assert!(!err.to_string().contains('\n'));
}

#[test]
fn mime_in() {
    let cat = single_rule(
        json!({"mime_in": {"argument": "type", "types": ["application/json", "image/*"]}}),
    );
    for ok in [
        "application/json",
        "Application/JSON",
        "application/json; charset=utf-8",
        "image/png",
        "IMAGE/webp",
    ] {
        assert!(
            check(&cat, "test.action", json!({ "type": ok })).is_empty(),
            "{ok}"
        );
    }
    for bad in [
        "text/html",
        "image",
        "image/*",
        "*/*",
        "application/json/x",
        "",
        "application/jsonx",
    ] {
        assert_eq!(
            check(&cat, "test.action", json!({ "type": bad })),
            ["mime_not_allowed:type"],
            "{bad}"
        );
    }
    let err =
        compile_err(json!({"x.y": {"rules": [{"mime_in": {"argument": "t", "types": ["json"]}}]}}));
    assert!(matches!(err, CatalogueError::InvalidMimeType { .. }));
    let err = compile_err(json!({"x.y": {"rules": [{"mime_in": {"argument": "t", "types": []}}]}}));
    assert!(matches!(
        err,
        CatalogueError::EmptyList { field: "types", .. }
    ));
}

#[test]
fn classification_at_most() {
    let cat = single_rule(
        json!({"classification_at_most": {"argument": "classification", "ceiling": "internal"}}),
    );
    for ok in ["public", "internal", "Internal"] {
        assert!(check(&cat, "test.action", json!({ "classification": ok })).is_empty());
    }
    for bad in [
        "confidential",
        "restricted",
        "top_secret",
        "secret",
        "unclassified",
        "",
    ] {
        assert_eq!(
            check(&cat, "test.action", json!({ "classification": bad })),
            ["classification_above_ceiling:classification"],
            "{bad}"
        );
    }
    assert_eq!(
        check(&cat, "test.action", json!({"classification": 1})),
        ["argument_wrong_type:classification"]
    );
}

#[test]
fn optional_and_dotted_arguments() {
    let cat = single_rule(
        json!({"path_within": {"argument": "target.path", "globs": ["out/**"], "optional": true}}),
    );
    assert!(check(&cat, "test.action", json!({})).is_empty());
    assert!(check(&cat, "test.action", json!({"target": {}})).is_empty());
    assert!(check(&cat, "test.action", json!({"target": {"path": "out/x"}})).is_empty());
    assert_eq!(
        check(&cat, "test.action", json!({"target": {"path": "../x"}})),
        ["path_traversal:target.path"]
    );
    // Present but null is not absent.
    assert_eq!(
        check(&cat, "test.action", json!({"target": {"path": null}})),
        ["argument_wrong_type:target.path"]
    );
    assert_eq!(
        check(&cat, "test.action", json!({"target": "out/x"})),
        ["argument_wrong_type:target.path"]
    );
    // A flat key spelled with a dot is not the nested argument.
    let cat = single_rule(json!({"path_within": {"argument": "target.path", "globs": ["out/**"]}}));
    assert_eq!(
        check(&cat, "test.action", json!({"target.path": "out/x"})),
        ["argument_missing:target.path"]
    );
}

#[test]
fn bad_argument_names_are_located_errors() {
    for name in ["", "a..b", "a b", ".a", "a."] {
        let err =
            compile_err(json!({"x.y": {"rules": [{"max_bytes": {"argument": name, "max": 1}}]}}));
        assert!(
            matches!(&err, CatalogueError::InvalidArgument { argument, rule: 0, .. } if argument == name),
            "{name:?}: {err}"
        );
    }
}

#[test]
fn every_violation_is_reported() {
    let cat = compile(json!({"x.y": {"rules": [
        {"path_within": {"argument": "path", "globs": ["internal/**"]}},
        {"host_in": {"argument": "url", "hosts": ["a.example.com"]}},
        {"max_bytes": {"argument": "body", "max": 1}},
        {"classification_at_most": {"argument": "class", "ceiling": "public"}}
    ]}}));
    let got = check(
        &cat,
        "x.y",
        json!({"path": "../x", "url": "http://a.example.com", "body": "ab"}),
    );
    assert_eq!(
        got,
        [
            "path_traversal:path",
            "scheme_not_allowed:url",
            "argument_too_large:body",
            "argument_missing:class"
        ]
    );
    assert!(check(
        &cat,
        "x.y",
        json!({"path": "internal/x", "url": "https://a.example.com/", "body": "a", "class": "public"})
    )
    .is_empty());
}

#[test]
fn limits_must_be_positive() {
    let err = compile_err(json!({"x.y": {"limits": {"timeout_ms": 0}}}));
    assert_eq!(
        err.to_string(),
        "action `x.y`: `limits.timeout_ms` must be at least 1"
    );
    let err = compile_err(json!({"x.y": {"limits": {"max_output_bytes": 0}}}));
    assert!(matches!(
        err,
        CatalogueError::InvalidLimit {
            field: "max_output_bytes",
            ..
        }
    ));
}

#[test]
fn builtins_have_fixed_semantics() {
    let cat = lab();
    assert!(
        check(
            &cat,
            "memory.read",
            json!({"namespace": "project", "key": "client_region"})
        )
        .is_empty()
    );
    assert_eq!(
        check(&cat, "memory.read", json!({"namespace": "project"})),
        ["argument_schema_violation:/key"]
    );
    assert_eq!(
        check(
            &cat,
            "memory.read",
            json!({"namespace": "../x", "key": "k"})
        ),
        ["argument_schema_violation:/namespace"]
    );
    // The lab's cross-owner write is well formed: whether it is allowed is
    // the preflight's decision, not the schema's.
    assert!(
        check(
            &cat,
            "memory.write",
            json!({
                "owner_agent_id": "report_manager", "namespace": "report",
                "key": "retention_days", "value": 0
            })
        )
        .is_empty()
    );
    assert_eq!(
        check(
            &cat,
            "memory.write",
            json!({"namespace": "n", "key": "k", "value": 1, "actor": "root"})
        ),
        ["argument_schema_violation:/actor"]
    );
    assert_eq!(
        check(
            &cat,
            "memory.write",
            json!({"namespace": "n", "key": "k", "value": 1, "expected_revision": 0})
        ),
        ["argument_schema_violation:/expected_revision"]
    );
}

#[test]
fn a_bundle_can_narrow_builtins_but_not_widen_them() {
    let cat = compile(json!({
        "memory.write": {
            // Tries to accept anything: the built-in schema still applies.
            "arguments": {"type": "object", "properties": {"namespace": {"enum": ["notes"]}}},
            "tags": ["memory"],
            "rules": [{"max_bytes": {"argument": "value", "max": 16}}],
            "output_labels": ["internal"],
            "limits": {"timeout_ms": 100}
        }
    }));
    let write = cat.by_name("memory.write").unwrap();
    assert!(write.has_tag("state_changing"), "built-in tag kept");
    assert!(write.has_tag("memory"), "bundle tag added");
    assert_eq!(write.output_labels()[0].as_str(), "internal");
    assert_eq!(write.limits().timeout_ms, 100);
    assert!(
        check(
            &cat,
            "memory.write",
            json!({"namespace": "notes", "key": "k", "value": 1})
        )
        .is_empty()
    );
    assert_eq!(
        check(
            &cat,
            "memory.write",
            json!({"namespace": "project", "key": "k", "value": 1})
        ),
        ["argument_schema_violation:/namespace"]
    );
    assert_eq!(
        check(
            &cat,
            "memory.write",
            json!({"namespace": "notes", "key": "k", "value": 1, "x": 2})
        ),
        ["argument_schema_violation:/x"]
    );
    assert_eq!(
        check(
            &cat,
            "memory.write",
            json!({"namespace": "notes", "key": "k", "value": "a long value here"})
        ),
        ["argument_too_large:value"]
    );
    assert_eq!(builtin_specs().len(), 2);
}

#[test]
fn errors_are_one_lowercase_line_without_final_period() {
    let errors = [
        compile_err(json!({"x.y": {"arguments": {"type": 5}}})),
        compile_err(json!({"x.y": {"rules": [{"pattern": {"argument": "v", "regex": "[a-"}}]}})),
        compile_err(
            json!({"x.y": {"rules": [{"path_within": {"argument": "p", "globs": ["{a"]}}]}}),
        ),
        compile_err(json!({"x.y": {"rules": [{"host_in": {"argument": "u", "hosts": ["a b"]}}]}})),
        compile_err(json!({"x.y": {"rules": [{"mime_in": {"argument": "t", "types": ["x"]}}]}})),
        CatalogueError::TooManyActions {
            count: 70_000,
            max: 65_536,
        },
    ];
    for err in errors {
        let text = err.to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(!text.ends_with('.'), "{text}");
        assert!(text.starts_with(|c: char| c.is_lowercase()), "{text}");
    }
}

proptest! {
    /// Any path whose `..` segments climb above the root never passes, even
    /// with a glob that allows everything.
    #[test]
    fn escaping_paths_never_pass(segments in prop::collection::vec(
        prop::sample::select(vec!["internal", "a", "b.txt", "..", ".", "", "%2e%2e", "x..y"]), 1..10)
    ) {
        let cat = single_rule(json!({"path_within": {"argument": "p", "globs": ["**"]}}));
        let path = segments.join("/");
        let mut depth: i64 = 0;
        // A leading empty segment makes the path absolute: refused as well.
        let mut escapes = false;
        for seg in &segments {
            match *seg {
                "" | "." => {}
                ".." => { depth -= 1; if depth < 0 { escapes = true; } }
                _ => depth += 1,
            }
        }
        let got = check(&cat, "test.action", json!({ "p": path }));
        if escapes || path.starts_with('/') || path.contains("%2e") {
            prop_assert_eq!(got, vec!["path_traversal:p".to_owned()]);
        } else if depth == 0 {
            prop_assert_eq!(got, vec!["path_outside_allowed:p".to_owned()]);
        } else {
            prop_assert!(got.is_empty(), "{:?} -> {:?}", path, got);
        }
    }

    /// Whatever the path, a pass means the lexically resolved path is inside
    /// `internal/`.
    #[test]
    fn passing_paths_stay_inside(path in "[a-z./%\\\\]{0,24}") {
        let cat = single_rule(json!({"path_within": {"argument": "p", "globs": ["internal/**"]}}));
        let raw = format!("internal/{path}");
        if check(&cat, "test.action", json!({ "p": raw.clone() })).is_empty() {
            let resolved = path::normalise(&raw).unwrap();
            prop_assert!(resolved.starts_with("internal/"), "{} -> {}", raw, resolved);
            prop_assert!(!resolved.split('/').any(|s| s == ".." || s == "."));
        }
    }

    /// Reasons never carry the argument's value.
    #[test]
    fn reasons_never_carry_values(value in "[a-zA-Z0-9:/@._%-]{8,40}") {
        let cat = compile(json!({"x.y": {
            "arguments": {"type": "object", "properties": {"v": {"type": "string", "maxLength": 4}}},
            "rules": [
                {"host_in": {"argument": "v", "hosts": ["a.example.com"]}},
                {"pattern": {"argument": "v", "regex": "[0-9]{2}"}},
                {"mime_in": {"argument": "v", "types": ["image/*"]}}
            ]
        }}));
        for reason in check(&cat, "x.y", json!({ "v": value.clone() })) {
            prop_assert!(!reason.contains(value.as_str()));
        }
    }
}

#[test]
fn builtin_schemas_are_compiled_once_and_shared() {
    let a = compile(json!({}));
    let b = compile(json!({"memory.write": {"arguments": {"type": "object", "maxProperties": 3}}}));
    let (x, y) = (
        a.by_name("memory.write").unwrap(),
        b.by_name("memory.write").unwrap(),
    );
    // The built-in schema is the same compiled validator in both, first;
    // the bundle's own comes after it.
    assert_eq!((x.schemas.len(), y.schemas.len()), (1, 2));
    assert!(Arc::ptr_eq(&x.schemas[0], &y.schemas[0]));
    // ...and both still check: the built-in shape, then the bundle's.
    let bad = json!({"namespace": "n", "key": "k"});
    assert_eq!(
        check(&a, "memory.write", bad.clone()),
        ["argument_schema_violation:/value"]
    );
    assert_eq!(
        check(&b, "memory.write", bad),
        ["argument_schema_violation:/value"]
    );
    let four = json!({"namespace": "n", "key": "k", "value": 1, "expected_revision": 2});
    assert!(check(&a, "memory.write", four.clone()).is_empty());
    assert_eq!(
        check(&b, "memory.write", four),
        ["argument_schema_violation:$"]
    );
}
