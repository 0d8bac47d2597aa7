//! Restrictions that escalate, and restrictions applied by origin (the
//! per-value form of "no export after untrusted content").

use std::collections::BTreeSet;

use super::*;
use crate::decision::Verdict;
use crate::ids::{ActionName, AgentId};
use crate::provenance::{Origin, OriginSet};

fn policy() -> ContextPolicy {
    let spec: ContextPolicySpec = serde_json::from_value(serde_json::json!({
        "labels": {"untrusted_content": "internal", "pii": "confidential"},
        "aggregation_rules": [
            {"name": "after_untrusted", "all_labels": ["untrusted_content"],
             "sensitivity": "internal", "restrict": ["untrusted_export"]},
            {"name": "after_pii", "all_labels": ["pii"],
             "sensitivity": "confidential", "restrict": ["review_sends"]},
        ],
        "restrictions": {
            "untrusted_export": {"denies_tags": ["export"],
                                 "when_arguments_from": ["untrusted", "none"],
                                 "verdict": "escalate"},
            "review_sends": {"denies_actions": ["send_email"], "verdict": "escalate"},
        },
    }))
    .unwrap();
    ContextPolicy::compile(&spec).unwrap()
}

fn envelope(p: &ContextPolicy, labels: &[&str]) -> Envelope {
    let root = Envelope::root(
        p,
        EnvelopeId::parse("env-1").unwrap(),
        WorkflowId::parse("wf-1").unwrap(),
        AgentId::parse("agent").unwrap(),
    );
    root.fold(p, &ls(labels), &[]).unwrap().0
}

const EXPORT: &[&str] = &["export"];

fn call(
    e: &Envelope,
    p: &ContextPolicy,
    name: &str,
    tags: &[Label],
    origins: &[&[Origin]],
) -> ContextDecision {
    let sets: Vec<OriginSet> = origins.iter().map(|o| OriginSet::of(o)).collect();
    decide(
        e,
        p,
        &ContextRequest::Call {
            action: ActionRef { name, tags },
            arguments: &sets,
        },
    )
}

#[test]
fn an_export_escalates_only_for_a_value_from_nothing_but_untrusted_content_or_nowhere() {
    let p = policy();
    let tags = ls(EXPORT);
    let e = envelope(&p, &["untrusted_content"]);
    // Every value from the user: the restriction does not cover the call.
    // (It proceeds, constrained: children inherit the restriction.)
    let d = call(
        &e,
        &p,
        "upload",
        &tags,
        &[&[Origin::User], &[Origin::Trusted]],
    );
    assert_eq!(d.verdict, Verdict::Constrain, "{d:?}");
    // A value also in the user's request is vouched: not covered.
    let d = call(
        &e,
        &p,
        "upload",
        &tags,
        &[&[Origin::User, Origin::Untrusted]],
    );
    assert_eq!(d.verdict, Verdict::Constrain);
    // A value only in untrusted content, or composed (nowhere): escalate.
    for only in [&[Origin::Untrusted][..], &[Origin::None]] {
        let d = call(&e, &p, "upload", &tags, &[&[Origin::User], only]);
        assert_eq!(d.verdict, Verdict::Escalate, "{only:?}");
        assert_eq!(d.reason.as_str(), "restricted_by:untrusted_export");
        assert!(!d.is_permanent());
    }
    // Origins unknown (an `Action` request): covered, fails closed.
    let d = decide(
        &e,
        &p,
        &ContextRequest::Action(ActionRef {
            name: "upload",
            tags: &tags,
        }),
    );
    assert_eq!(d.verdict, Verdict::Escalate);
    // A plan literal is not untrusted: a run's step is not covered.
    let d = call(&e, &p, "upload", &tags, &[&[Origin::Plan]]);
    assert_eq!(d.verdict, Verdict::Constrain);
    // Before any untrusted content the restriction is not held at all.
    let clean = envelope(&p, &[]);
    let d = call(&clean, &p, "upload", &tags, &[&[Origin::None]]);
    assert_eq!(d.verdict, Verdict::Allow);
}

#[test]
fn an_escalating_restriction_escalates_and_a_deny_still_wins() {
    let p = policy();
    let e = envelope(&p, &["pii", "untrusted_content"]);
    let d = call(&e, &p, "send_email", &[], &[&[Origin::User]]);
    assert_eq!(d.verdict, Verdict::Escalate);
    assert_eq!(d.reason.as_str(), "restricted_by:review_sends");
    // The built-in no_external_export still denies outright once held.
    let strict: ContextPolicySpec = serde_json::from_value(serde_json::json!({
        "labels": {"secret": "restricted"},
        "aggregation_rules": [{"all_labels": ["secret"], "sensitivity": "restricted",
                               "restrict": ["no_external_export", "soft"]}],
        "restrictions": {"soft": {"denies_tags": ["export"], "verdict": "escalate"}},
    }))
    .unwrap();
    let sp = ContextPolicy::compile(&strict).unwrap();
    let se = envelope(&sp, &["secret"]);
    let d = call(&se, &sp, "upload", &ls(EXPORT), &[&[Origin::User]]);
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.reason.as_str(), "restricted_by:no_external_export");
    assert!(d.is_permanent());
}

#[test]
fn only_restrictions_that_always_deny_remove_delegated_authority() {
    let p = policy();
    let e = envelope(&p, &["pii", "untrusted_content"]);
    let acts: BTreeSet<ActionName> = ["send_email", "upload", "read"]
        .iter()
        .map(|a| ActionName::parse(a).unwrap())
        .collect();
    let export = ls(EXPORT);
    let kept = effective_delegated_authority(
        &acts,
        &acts,
        &e,
        &p,
        |a| {
            Some(if a.as_str() == "upload" {
                &export[..]
            } else {
                &[][..]
            })
        },
        &acts,
    );
    // Escalating and origin-applied restrictions are decided on each of
    // the child's calls (its envelope inherits them), not removed here.
    assert_eq!(kept, acts);
}

#[test]
fn built_ins_cannot_be_weakened_and_delegation_cannot_be_conditional() {
    for (restrictions, needle) in [
        (
            serde_json::json!({"no_external_export": {"denies_tags": ["x"], "verdict": "escalate"}}),
            "built in",
        ),
        (
            serde_json::json!({"no_memory_write": {"denies_tags": ["x"], "when_arguments_from": ["none"]}}),
            "built in",
        ),
        (
            serde_json::json!({"r": {"denies_delegation": "all", "when_arguments_from": ["untrusted"]}}),
            "cannot be conditional",
        ),
    ] {
        let spec: ContextPolicySpec =
            serde_json::from_value(serde_json::json!({"restrictions": restrictions})).unwrap();
        let err = ContextPolicy::compile(&spec).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    }
    // Unknown origins are refused by the reader.
    let bad = serde_json::from_value::<ContextPolicySpec>(serde_json::json!({
        "restrictions": {"r": {"denies_tags": ["x"], "when_arguments_from": ["elsewhere"]}},
    }));
    assert!(bad.is_err());
}
