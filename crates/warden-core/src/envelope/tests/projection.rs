//! Same-step enforcement (the reference's gap): decisions project rules.

use super::*;

#[test]
fn a_rule_implied_restriction_binds_the_very_next_decision() {
    let p = bench_policy();
    // Labels folded, rules not applied (restored from a fold-only writer).
    let env = labels_only_record(
        &p,
        &["pii", "financial", "behavioral"],
        Sensitivity::Confidential,
    );
    assert!(env.restrictions().is_empty());
    let d = act(&env, &p, "export", &["export"]);
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.reason.as_str(), "restricted_by:no_external_export");
    assert_eq!(d.projected_sensitivity, Sensitivity::Restricted);
    assert_eq!(
        names(d.projected_restrictions.names()),
        ["no_external_export"]
    );

    let env = labels_only_record(&p, &["pii", "location"], Sensitivity::Confidential);
    let d = delegation(&env, &p, TrustZone::External);
    assert_eq!(d.reason.as_str(), "restricted_by:no_external_delegation");

    // The next fold stores what the decision projected.
    let (next, t) = env.fold(&p, &[], &[]).unwrap();
    assert_eq!(names(next.restrictions()), ["no_external_delegation"]);
    assert_eq!(names(t.restrictions_added()), ["no_external_delegation"]);
    assert_eq!(names(t.rules_applied()), ["pii_location"]);
}

#[test]
fn a_policy_upgrade_binds_restored_envelopes() {
    // v1 has no rules; v2 adds one over the same labels. A record written
    // under v1 and restored under v2 is decided with v2's rule.
    let v1: ContextPolicySpec = serde_json::from_value(serde_json::json!({
        "labels": {"pii": "confidential", "health": "confidential"}
    }))
    .unwrap();
    let mut v2 = v1.clone();
    v2.aggregation_rules.push(AggregationRuleSpec {
        name: Some(l("pii_health")),
        all_labels: ls(&["pii", "health"]),
        sensitivity: Sensitivity::Restricted,
        derived: vec![],
        restrict: ls(&["no_memory_write"]),
    });
    let p1 = ContextPolicy::compile(&v1).unwrap();
    let p2 = ContextPolicy::compile(&v2).unwrap();
    let env1 = run(&p1, &root(&p1, "env-up"), &[&["pii", "health"]]);
    assert!(env1.restrictions().is_empty());
    // Vocabularies differ (rule names are part of it): refuse, don't guess.
    let d = act(&env1, &p2, "memory.write", &[]);
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Deny, reasons::ENVELOPE_POLICY_MISMATCH)
    );
    assert!(matches!(
        env1.fold(&p2, &[], &[]),
        Err(EnvelopeError::PolicyMismatch { .. })
    ));
    let env2 = Envelope::restore(&env1.to_record(), &p2).unwrap();
    let d = act(&env2, &p2, "memory.write", &[]);
    assert_eq!(d.reason.as_str(), "restricted_by:no_memory_write");
}

#[test]
fn a_closed_envelope_is_reprojected_under_a_changed_rule_with_the_same_vocabulary() {
    // Same label, restriction and rule names (same vocabulary, so no
    // mismatch), different rule content: an envelope closed under A must
    // not be taken as closed under B.
    let spec = |needs: &[&str]| -> ContextPolicySpec {
        serde_json::from_value(serde_json::json!({
            "labels": {"pii": "confidential", "health": "confidential"},
            "aggregation_rules": [{"name": "r", "all_labels": needs, "sensitivity": "restricted",
                                   "restrict": ["no_memory_write"]}]
        }))
        .unwrap()
    };
    let a = ContextPolicy::compile(&spec(&["pii", "health"])).unwrap();
    let b = ContextPolicy::compile(&spec(&["pii"])).unwrap();
    assert_eq!(a.vocabulary_fingerprint(), b.vocabulary_fingerprint());
    let env = run(&a, &root(&a, "env-cache"), &[&["pii"]]);
    assert_eq!(act(&env, &a, "memory.write", &[]).verdict, Verdict::Allow);
    let d = act(&env, &b, "memory.write", &[]);
    assert_eq!(d.reason.as_str(), "restricted_by:no_memory_write");
    assert_eq!(d.projected_sensitivity, Sensitivity::Restricted);
    let (next, t) = env.fold(&b, &[], &[]).unwrap();
    assert_eq!(names(next.restrictions()), ["no_memory_write"]);
    assert_eq!(names(t.rules_applied()), ["r"]);
}
