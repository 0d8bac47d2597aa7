//! Scenario tests: the design document's customer example, same-step
//! enforcement, the Python reference's canonical streams, delegation and
//! declassification.

mod by_origin;
mod customer;
mod declassify;
mod delegation;
mod projection;
mod records;
mod reference;
mod workload;

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::decision::{Obligation, Verdict};
use crate::ids::{ActionName, AgentId, Label};

pub(crate) fn l(s: &str) -> Label {
    Label::parse(s).unwrap()
}

pub(crate) fn ls(xs: &[&str]) -> Vec<Label> {
    xs.iter().map(|s| l(s)).collect()
}

pub(crate) fn names(n: NameSet<'_>) -> Vec<&str> {
    n.iter().map(Label::as_str).collect()
}

/// The brief's `context:` section verbatim (plus a `renewal` label for the
/// customer stream), parsed from YAML as the bundle loader will.
pub(crate) const CUSTOMER_YAML: &str = r#"
labels: {pii: confidential, financial: confidential, behavioral: internal, name: internal, public_sku: public, renewal: internal}
aggregation_rules:
  - {name: customer_risk, all_labels: [pii, financial, behavioral], sensitivity: restricted, derived: [customer-risk-profile], restrict: [no_external_export]}
backstop: {min_labels: 4, at_or_above: internal, verdict: escalate}
inherit_threshold: restricted
restricted_floor: restricted
restrictions:
  no_external_export: {denies_tags: [export]}
  no_external_delegation: {denies_delegation: external}
  no_memory_write: {denies_actions: [memory.write]}
declassifiers: [compliance_officer]
"#;

pub(crate) fn customer_policy() -> ContextPolicy {
    let spec: ContextPolicySpec = serde_saphyr::from_str(CUSTOMER_YAML).unwrap();
    ContextPolicy::compile(&spec).unwrap()
}

/// The Python benchmark's RULESET (agt_envelope_bench.py), threshold 4,
/// floor restricted. `no_print` is declared so the benchmark's child
/// restrictions are all known.
pub(crate) fn bench_policy() -> ContextPolicy {
    let spec: ContextPolicySpec = serde_json::from_value(serde_json::json!({
        "labels": {
            "public": "public", "internal": "internal", "telemetry": "internal",
            "marketing": "public", "contract": "internal", "behavioral": "internal",
            "location": "internal", "pii": "confidential", "financial": "confidential",
            "health": "confidential", "biometric": "restricted", "credentials": "restricted"
        },
        "aggregation_rules": [
            {"name": "pii_financial_behavioral", "all_labels": ["pii", "financial", "behavioral"],
             "sensitivity": "restricted", "restrict": ["no_external_export"]},
            {"name": "pii_health", "all_labels": ["pii", "health"],
             "sensitivity": "restricted", "restrict": ["no_external_export", "no_memory_write"]},
            {"name": "pii_location", "all_labels": ["pii", "location"],
             "sensitivity": "confidential", "restrict": ["no_external_delegation"]},
            {"name": "financial_contract", "all_labels": ["financial", "contract"],
             "sensitivity": "confidential", "restrict": ["no_memory_write"]},
            {"name": "credentials", "all_labels": ["credentials"], "sensitivity": "top_secret",
             "restrict": ["no_external_export", "no_external_delegation", "no_memory_write"]}
        ],
        "backstop": {"min_labels": 4, "at_or_above": "public"},
        "restricted_floor": "restricted",
        "inherit_threshold": "top_secret",
        "restrictions": {"no_print": {"denies_tags": ["print"]}},
        "declassifiers": ["compliance_officer"]
    }))
    .unwrap();
    ContextPolicy::compile(&spec).unwrap()
}

pub(crate) fn root(p: &ContextPolicy, id: &str) -> Envelope {
    Envelope::root(
        p,
        EnvelopeId::parse(id).unwrap(),
        WorkflowId::parse(&format!("wf-{id}")).unwrap(),
        AgentId::parse("customer_success").unwrap(),
    )
}

pub(crate) fn run(p: &ContextPolicy, env: &Envelope, steps: &[&[&str]]) -> Envelope {
    steps.iter().fold(env.clone(), |e, labels| {
        e.fold(p, &ls(labels), &[]).unwrap().0
    })
}

pub(crate) fn act(env: &Envelope, p: &ContextPolicy, name: &str, tags: &[&str]) -> ContextDecision {
    let tags = ls(tags);
    decide(
        env,
        p,
        &ContextRequest::Action(ActionRef { name, tags: &tags }),
    )
}

fn delegation(env: &Envelope, p: &ContextPolicy, target: TrustZone) -> ContextDecision {
    decide(
        env,
        p,
        &ContextRequest::Delegation {
            target,
            delegatee_authority: &[],
        },
    )
}

const UPLOAD: (&str, &[&str]) = ("external.upload", &["external", "export", "state_changing"]);

/// An envelope record holding only `labels` at `s`, as a fold-only
/// implementation (or an older policy) would have stored it.
fn labels_only_record(p: &ContextPolicy, labels: &[&str], s: Sensitivity) -> Envelope {
    let mut r = root(p, "env-stale").to_record();
    r.labels = ls(labels).into_iter().collect();
    r.aggregate_sensitivity = s;
    r.version = 3;
    Envelope::restore(&r, p).unwrap()
}
