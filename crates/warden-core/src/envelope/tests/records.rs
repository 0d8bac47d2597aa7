//! Transition records, envelope records and decision records.

use super::*;

#[test]
fn transition_serialises_labels_and_ids_only() {
    let p = customer_policy();
    let env = run(&p, &root(&p, "env-t"), &[&["name", "pii"], &["behavioral"]]);
    let (_, t) = env
        .fold(&p, &ls(&["financial"]), &ls(&["financial"]))
        .unwrap();
    assert_eq!(t.result_sensitivity(), Some(Sensitivity::Confidential));
    let json = serde_json::to_value(&t).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "kind": "accumulated",
            "reason": "context_accumulated",
            "envelope_id": "env-t",
            "source_envelope_id": "env-t",
            "workflow_id": "wf-env-t",
            "agent_id": "customer_success",
            "delegation_depth": 0,
            "source_version": 2,
            "version": 3,
            "sensitivity_from": "confidential",
            "sensitivity_to": "restricted",
            "classification": "restricted",
            "labels_added": ["financial"],
            "derived_added": ["customer-risk-profile"],
            "labels_removed": [],
            "restrictions_added": ["no_external_export"],
            "rules_applied": ["customer_risk"],
            "result_sensitivity": "confidential"
        })
    );
    // Once restricted, whatever a step produces inherits the classification.
    let env = run(&p, &env, &[&["financial"]]);
    let (_, t) = env.fold(&p, &ls(&["public_sku"]), &[]).unwrap();
    assert_eq!(t.result_sensitivity(), Some(Sensitivity::Restricted));
}

#[test]
fn records_round_trip_and_are_checked() {
    let p = customer_policy();
    let env = run(
        &p,
        &root(&p, "env-r"),
        &[&["name", "pii"], &["behavioral", "financial"]],
    );
    let rec = env.to_record();
    let json = serde_json::to_string(&rec).unwrap();
    let back: EnvelopeRecord = serde_json::from_str(&json).unwrap();
    assert_eq!(Envelope::restore(&back, &p).unwrap(), env);
    assert_eq!(
        serde_json::to_value(&env).unwrap(),
        serde_json::to_value(&rec).unwrap()
    );

    let mut bad = rec.clone();
    bad.labels.insert(l("ghost"));
    assert!(matches!(
        Envelope::restore(&bad, &p),
        Err(EnvelopeError::UnknownLabels { .. })
    ));
    let mut bad = rec.clone();
    bad.restrictions.insert(l("no_ghost"));
    assert!(matches!(
        Envelope::restore(&bad, &p),
        Err(EnvelopeError::UnknownRestrictions { .. })
    ));
    let mut bad = rec.clone();
    bad.delegation_depth = 2;
    assert!(matches!(
        Envelope::restore(&bad, &p),
        Err(EnvelopeError::InconsistentRecord { .. })
    ));
    let mut bad = rec;
    bad.parent_envelope_id = Some(bad.envelope_id.clone());
    bad.delegation_depth = 1;
    assert!(matches!(
        Envelope::restore(&bad, &p),
        Err(EnvelopeError::InconsistentRecord { .. })
    ));
    assert!(
        serde_json::from_str::<EnvelopeRecord>(
            &json.replace("\"version\"", "\"extra\":1,\"version\"")
        )
        .is_err()
    );
}

#[test]
fn decisions_convert_to_decision_records() {
    let p = customer_policy();
    let env = run(
        &p,
        &root(&p, "env-dd"),
        &[&["name", "pii"], &["behavioral", "financial"]],
    );
    let d = act(&env, &p, "document.summarize", &[]).into_decision(
        AgentId::parse("customer_success").unwrap(),
        "document.summarize",
        "run-1:step-2",
        "lab-1",
        crate::time::Timestamp(1_700_000_000_000),
    );
    assert_eq!(d.verdict, Verdict::Constrain);
    assert_eq!(d.obligations.len(), 2);
    assert!(d.permits());
}

#[test]
fn chained_rules_reach_a_fixpoint() {
    let spec: ContextPolicySpec = serde_json::from_value(serde_json::json!({
        "labels": {"a": "internal", "b": "internal", "c": "internal"},
        "aggregation_rules": [
            {"name": "second", "all_labels": ["ab", "c"], "sensitivity": "top_secret", "restrict": ["no_memory_write"]},
            {"name": "first", "all_labels": ["a", "b"], "sensitivity": "confidential", "derived": ["ab"]}
        ]
    }))
    .unwrap();
    let p = ContextPolicy::compile(&spec).unwrap();
    let env = run(&p, &root(&p, "env-chain"), &[&["c"], &["a"], &["b"]]);
    assert_eq!(env.aggregate_sensitivity(), Sensitivity::TopSecret);
    assert_eq!(names(env.derived()), ["ab"]);
    assert_eq!(names(env.restrictions()), ["no_memory_write"]);
}
