use super::*;

fn spec(yaml_json: serde_json::Value) -> ContextPolicySpec {
    serde_json::from_value(yaml_json).unwrap()
}

#[test]
fn ladder_is_ordered_and_ranked() {
    assert!(Sensitivity::Public < Sensitivity::Internal);
    assert!(Sensitivity::Restricted < Sensitivity::TopSecret);
    for (i, s) in Sensitivity::ALL.iter().enumerate() {
        assert_eq!(usize::from(s.rank()), i);
        assert_eq!(Sensitivity::from_rank(s.rank()), Some(*s));
    }
    assert_eq!(Sensitivity::from_rank(5), None);
    assert_eq!(
        serde_json::to_string(&Sensitivity::TopSecret).unwrap(),
        "\"top_secret\""
    );
}

#[test]
fn the_brief_example_compiles() {
    let s = spec(serde_json::json!({
        "labels": {"pii": "confidential", "financial": "confidential",
                   "behavioral": "internal", "name": "internal", "public_sku": "public"},
        "aggregation_rules": [{"name": "customer_risk",
            "all_labels": ["pii", "financial", "behavioral"], "sensitivity": "restricted",
            "derived": ["customer-risk-profile"], "restrict": ["no_external_export"]}],
        "backstop": {"min_labels": 4, "at_or_above": "internal", "verdict": "escalate"},
        "inherit_threshold": "restricted",
        "restricted_floor": "restricted",
        "restrictions": {
            "no_external_export": {"denies_tags": ["export"]},
            "no_external_delegation": {"denies_delegation": "external"},
            "no_memory_write": {"denies_actions": ["memory.write"]}
        },
        "declassifiers": ["compliance_officer"]
    }));
    let p = ContextPolicy::compile(&s).unwrap();
    assert_eq!(
        p.base_sensitivity("customer-risk-profile"),
        Some(Sensitivity::Restricted)
    );
    assert_eq!(p.base_sensitivity("name"), Some(Sensitivity::Internal));
    assert_eq!(p.base_sensitivity("nope"), None);
    assert_eq!(
        p.rules().map(Label::as_str).collect::<Vec<_>>(),
        ["customer_risk"]
    );
    assert_eq!(
        p.restrictions().map(Label::as_str).collect::<Vec<_>>(),
        [NO_EXTERNAL_DELEGATION, NO_EXTERNAL_EXPORT, NO_MEMORY_WRITE]
    );
    assert!(p.is_declassifier(&AgentId::parse("compliance_officer").unwrap()));
    assert_eq!(p.vocabulary_fingerprint().len(), 64);
}

#[test]
fn unknown_fields_are_rejected() {
    let r: Result<ContextPolicySpec, _> = serde_json::from_value(serde_json::json!({"lables": {}}));
    assert!(r.is_err());
    let r: Result<ContextPolicySpec, _> = serde_json::from_value(serde_json::json!({
        "aggregation_rules": [{"all_labels": ["a"], "sensitivity": "public", "extra": 1}]
    }));
    assert!(r.is_err());
    let r: Result<ContextPolicySpec, _> =
        serde_json::from_value(serde_json::json!({"labels": {"a": "secret"}}));
    assert!(r.is_err());
}

#[test]
fn references_are_checked_and_located() {
    let e = ContextPolicy::compile(&spec(serde_json::json!({
        "labels": {"pii": "confidential"},
        "aggregation_rules": [{"name": "r1", "all_labels": ["pii", "health"], "sensitivity": "restricted"}]
    })))
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "aggregation rule `r1` names undeclared label `health`"
    );

    let e = ContextPolicy::compile(&spec(serde_json::json!({
        "labels": {"pii": "confidential"},
        "aggregation_rules": [{"all_labels": ["pii"], "sensitivity": "restricted", "restrict": ["no_print"]}]
    })))
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "aggregation rule `aggregation_rules.0` names undeclared restriction `no_print`"
    );

    let e = ContextPolicy::compile(&spec(serde_json::json!({
        "aggregation_rules": [{"name": "r", "all_labels": [], "sensitivity": "restricted"}]
    })))
    .unwrap_err();
    assert_eq!(
        e,
        ContextPolicyError::EmptyRule {
            rule: Label::parse("r").unwrap()
        }
    );

    let e = ContextPolicy::compile(&spec(serde_json::json!({
        "labels": {"a": "public"},
        "aggregation_rules": [
            {"name": "r", "all_labels": ["a"], "sensitivity": "internal"},
            {"name": "r", "all_labels": ["a"], "sensitivity": "internal"}]
    })))
    .unwrap_err();
    assert!(matches!(e, ContextPolicyError::DuplicateRule { .. }));

    let e = ContextPolicy::compile(&spec(serde_json::json!({
        "labels": {"a": "public", "profile": "internal"},
        "aggregation_rules": [{"name": "r", "all_labels": ["a"], "sensitivity": "restricted", "derived": ["profile"]}]
    })))
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "label `profile` is declared `internal` but aggregation rule `r` derives it at `restricted`"
    );

    let e = ContextPolicy::compile(&spec(serde_json::json!({
        "restrictions": {"no_print": {}}
    })))
    .unwrap_err();
    assert!(matches!(e, ContextPolicyError::EmptyRestriction { .. }));

    let e = ContextPolicy::compile(&spec(serde_json::json!({
        "backstop": {"min_labels": 0}
    })))
    .unwrap_err();
    assert_eq!(e, ContextPolicyError::BackstopMinLabels);
}

#[test]
fn builtins_cannot_be_weakened() {
    let p = ContextPolicy::compile(&spec(serde_json::json!({
        "restrictions": {"no_external_export": {"denies_tags": ["print"]}}
    })))
    .unwrap();
    let export = Label::parse("export").unwrap();
    let print = Label::parse("print").unwrap();
    let i = p.vocab.restriction_index(NO_EXTERNAL_EXPORT).unwrap();
    assert!(
        p.denying_action("x", std::slice::from_ref(&export))
            .contains(i)
    );
    assert!(
        p.denying_action("x", std::slice::from_ref(&print))
            .contains(i)
    );
    assert!(p.denying_action("x", &[]).is_empty());
    let m = p.vocab.restriction_index(NO_MEMORY_WRITE).unwrap();
    assert!(p.denying_action("memory.write", &[]).contains(m));
}

#[test]
fn too_many_labels_is_an_error() {
    let mut s = ContextPolicySpec::default();
    for i in 0..=ContextPolicy::MAX_LABELS {
        s.labels
            .insert(Label::parse(&format!("l{i}")).unwrap(), Sensitivity::Public);
    }
    assert!(matches!(
        ContextPolicy::compile(&s),
        Err(ContextPolicyError::TooManyLabels {
            count: 129,
            max: 128
        })
    ));
}

#[test]
fn schema_is_generated() {
    let schema = schemars::schema_for!(ContextPolicySpec);
    let text = serde_json::to_string(&schema).unwrap();
    assert!(text.contains("aggregation_rules"));
    assert!(text.contains("top_secret"));
}
