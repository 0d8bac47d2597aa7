//! Property tests for the envelope invariants (design brief, invariant 8),
//! with a naive reference model of the closure.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::tests::{l, ls};
use super::*;
use crate::ids::{AgentId, Label};

const LABELS: [&str; 12] = [
    "public",
    "internal",
    "telemetry",
    "marketing",
    "contract",
    "behavioral",
    "location",
    "pii",
    "financial",
    "health",
    "biometric",
    "credentials",
];
const RESTRICTIONS: [&str; 4] = [
    "no_external_export",
    "no_external_delegation",
    "no_memory_write",
    "no_print",
];
const ACTIONS: [(&str, &[&str]); 6] = [
    ("export", &["export"]),
    ("external.upload", &["external", "export"]),
    ("memory.write", &[]),
    ("read", &[]),
    ("print", &["print"]),
    ("search", &["external"]),
];

/// The benchmark's rules plus a chain through a derived label.
fn spec() -> ContextPolicySpec {
    serde_json::from_value(serde_json::json!({
        "labels": {
            "public": "public", "internal": "internal", "telemetry": "internal",
            "marketing": "public", "contract": "internal", "behavioral": "internal",
            "location": "internal", "pii": "confidential", "financial": "confidential",
            "health": "confidential", "biometric": "restricted", "credentials": "restricted"
        },
        "aggregation_rules": [
            {"name": "profile_location", "all_labels": ["profile", "location"],
             "sensitivity": "restricted", "restrict": ["no_print"]},
            {"name": "pii_financial_behavioral", "all_labels": ["pii", "financial", "behavioral"],
             "sensitivity": "restricted", "restrict": ["no_external_export"]},
            {"name": "pii_health", "all_labels": ["pii", "health"],
             "sensitivity": "restricted", "restrict": ["no_external_export", "no_memory_write"]},
            {"name": "pii_location", "all_labels": ["pii", "location"],
             "sensitivity": "confidential", "restrict": ["no_external_delegation"]},
            {"name": "financial_contract", "all_labels": ["financial", "contract"],
             "sensitivity": "confidential", "restrict": ["no_memory_write"]},
            {"name": "credentials", "all_labels": ["credentials"], "sensitivity": "top_secret",
             "restrict": ["no_external_export", "no_external_delegation", "no_memory_write"]},
            {"name": "profile", "all_labels": ["pii", "behavioral"], "sensitivity": "confidential",
             "derived": ["profile"]}
        ],
        "backstop": {"min_labels": 4, "at_or_above": "internal"},
        "restrictions": {"no_print": {"denies_tags": ["print"]}},
        "declassifiers": ["officer"]
    }))
    .unwrap()
}

fn policy() -> ContextPolicy {
    ContextPolicy::compile(&spec()).unwrap()
}

/// Naive model: (sensitivity, derived, restrictions) implied by a label set.
fn model(labels: &BTreeSet<String>) -> (Sensitivity, BTreeSet<String>, BTreeSet<String>) {
    let s = spec();
    let mut derived_base: BTreeMap<String, Sensitivity> = BTreeMap::new();
    for r in &s.aggregation_rules {
        for d in &r.derived {
            let e = derived_base.entry(d.to_string()).or_insert(r.sensitivity);
            *e = (*e).max(r.sensitivity);
        }
    }
    let base = |x: &String| -> Sensitivity {
        s.labels
            .get(x.as_str())
            .copied()
            .or_else(|| derived_base.get(x).copied())
            .unwrap()
    };
    let mut derived = BTreeSet::new();
    let mut restrictions = BTreeSet::new();
    let mut sens = labels.iter().map(base).max().unwrap_or_default();
    loop {
        let present: BTreeSet<String> = labels.union(&derived).cloned().collect();
        let before = derived.len();
        for r in &s.aggregation_rules {
            if r.all_labels.iter().all(|x| present.contains(x.as_str())) {
                sens = sens.max(r.sensitivity);
                derived.extend(r.derived.iter().map(|x| x.to_string()));
                restrictions.extend(r.restrict.iter().map(|x| x.to_string()));
            }
        }
        if derived.len() == before {
            break;
        }
    }
    sens = sens.max(derived.iter().map(base).max().unwrap_or_default());
    (sens, derived, restrictions)
}

fn strs(n: NameSet<'_>) -> BTreeSet<String> {
    n.iter().map(|x| x.as_str().to_owned()).collect()
}

fn step_labels(idx: &[usize]) -> Vec<Label> {
    idx.iter()
        .filter_map(|i| LABELS.get(*i))
        .map(|s| l(s))
        .collect()
}

fn root(p: &ContextPolicy, id: &str) -> Envelope {
    Envelope::root(
        p,
        EnvelopeId::parse(id).unwrap(),
        WorkflowId::parse("wf").unwrap(),
        AgentId::parse("agent").unwrap(),
    )
}

fn fold_all(p: &ContextPolicy, env: &Envelope, stream: &[Vec<usize>]) -> Envelope {
    stream.iter().fold(env.clone(), |e, s| {
        e.fold(p, &step_labels(s), &[]).unwrap().0
    })
}

fn stream() -> impl Strategy<Value = Vec<Vec<usize>>> {
    prop::collection::vec(prop::collection::vec(0..LABELS.len(), 1..=3), 0..12)
}

fn restricted_by(d: &ContextDecision) -> bool {
    d.reason.kind() == reasons::RESTRICTED_BY
}

fn decide_all(env: &Envelope, p: &ContextPolicy) -> Vec<ContextDecision> {
    let mut out: Vec<ContextDecision> = ACTIONS
        .iter()
        .map(|(name, tags)| {
            let tags = ls(tags);
            decide(
                env,
                p,
                &ContextRequest::Action(ActionRef { name, tags: &tags }),
            )
        })
        .collect();
    for target in [TrustZone::Internal, TrustZone::External] {
        out.push(decide(
            env,
            p,
            &ContextRequest::Delegation {
                target,
                delegatee_authority: &[],
            },
        ));
    }
    out
}

#[derive(Debug, Clone)]
enum Op {
    Fold {
        node: usize,
        labels: Vec<usize>,
    },
    Delegate {
        node: usize,
        declared: Vec<usize>,
        redact: bool,
    },
    Declassify {
        node: usize,
        officer: bool,
        to: u8,
        remove: Vec<usize>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<usize>(), prop::collection::vec(0..LABELS.len(), 1..=3))
            .prop_map(|(node, labels)| Op::Fold { node, labels }),
        2 => (any::<usize>(), prop::collection::vec(0..RESTRICTIONS.len(), 0..=2), any::<bool>())
            .prop_map(|(node, declared, redact)| Op::Delegate { node, declared, redact }),
        1 => (any::<usize>(), any::<bool>(), 0u8..5, prop::collection::vec(0..LABELS.len(), 0..=4))
            .prop_map(|(node, officer, to, remove)| Op::Declassify { node, officer, to, remove }),
    ]
}

proptest! {
    #[test]
    fn fold_is_monotone_and_versions_increase(stream in stream()) {
        let p = policy();
        let mut env = root(&p, "env-p");
        for step in &stream {
            let (next, t) = env.fold(&p, &step_labels(step), &[]).unwrap();
            prop_assert!(strs(env.restrictions()).is_subset(&strs(next.restrictions())));
            prop_assert!(strs(env.labels()).is_subset(&strs(next.labels())));
            prop_assert!(strs(env.derived()).is_subset(&strs(next.derived())));
            prop_assert!(next.aggregate_sensitivity() >= env.aggregate_sensitivity());
            prop_assert_eq!(next.version(), env.version() + 1);
            prop_assert_eq!(t.version(), next.version());
            prop_assert_eq!(t.source_version(), env.version());
            prop_assert_eq!(t.sensitivity_from(), env.aggregate_sensitivity());
            prop_assert_eq!(t.sensitivity_to(), next.aggregate_sensitivity());
            prop_assert!(t.result_sensitivity().is_some());
            env = next;
        }
    }

    #[test]
    fn accumulation_matches_the_reference_model(stream in stream()) {
        let p = policy();
        let env = fold_all(&p, &root(&p, "env-m"), &stream);
        let labels: BTreeSet<String> = stream.iter().flatten()
            .filter_map(|i| LABELS.get(*i)).map(|s| s.to_string()).collect();
        let (sens, derived, restrictions) = model(&labels);
        prop_assert_eq!(strs(env.labels()), labels);
        prop_assert_eq!(env.aggregate_sensitivity(), sens);
        prop_assert_eq!(strs(env.derived()), derived);
        prop_assert_eq!(strs(env.restrictions()), restrictions);
    }

    #[test]
    fn accumulation_is_order_independent(
        (stream, shuffled) in stream().prop_flat_map(|s| (Just(s.clone()), Just(s).prop_shuffle()))
    ) {
        let p = policy();
        let a = fold_all(&p, &root(&p, "env-o"), &stream);
        let b = fold_all(&p, &root(&p, "env-o"), &shuffled);
        let all: Vec<usize> = stream.iter().flatten().copied().collect();
        let c = fold_all(&p, &root(&p, "env-o"), std::slice::from_ref(&all));
        for other in [&b, &c] {
            prop_assert_eq!(strs(a.labels()), strs(other.labels()));
            prop_assert_eq!(strs(a.derived()), strs(other.derived()));
            prop_assert_eq!(strs(a.restrictions()), strs(other.restrictions()));
            prop_assert_eq!(a.aggregate_sensitivity(), other.aggregate_sensitivity());
        }
        prop_assert_eq!(a.version(), b.version());
        // Same state, same decisions.
        prop_assert_eq!(decide_all(&a, &p), decide_all(&b, &p));
    }

    #[test]
    fn decide_is_a_pure_function(stream in stream()) {
        let p = policy();
        let env = fold_all(&p, &root(&p, "env-d"), &stream);
        let again = Envelope::restore(&env.to_record(), &policy()).unwrap();
        prop_assert_eq!(decide_all(&env, &p), decide_all(&env, &p));
        prop_assert_eq!(decide_all(&env, &p), decide_all(&again, &p));
    }

    #[test]
    fn projection_equals_the_folded_state(stream in stream()) {
        // Deciding on a labels-only record (rules never applied) gives the
        // decisions of the fully folded envelope.
        let p = policy();
        let env = fold_all(&p, &root(&p, "env-s"), &stream);
        let mut rec = env.to_record();
        rec.derived.clear();
        rec.restrictions.clear();
        rec.aggregate_sensitivity = Sensitivity::Public;
        let stale = Envelope::restore(&rec, &p).unwrap();
        prop_assert_eq!(decide_all(&stale, &p), decide_all(&env, &p));
    }

    #[test]
    fn delegation_trees_never_lose_restrictions(ops in prop::collection::vec(op(), 1..24)) {
        let p = policy();
        let officer = AgentId::parse("officer").unwrap();
        let other = AgentId::parse("agent").unwrap();
        let mut nodes = vec![root(&p, "env-root")];
        let mut next_id = 0usize;
        for op in ops {
            match op {
                Op::Fold { node, labels } => {
                    let env = nodes[node % nodes.len()].clone();
                    let (next, _) = env.fold(&p, &step_labels(&labels), &[]).unwrap();
                    prop_assert!(strs(env.restrictions()).is_subset(&strs(next.restrictions())));
                    prop_assert!(next.aggregate_sensitivity() >= env.aggregate_sensitivity());
                    prop_assert!(next.version() > env.version());
                    let i = node % nodes.len();
                    nodes[i] = next;
                }
                Op::Delegate { node, declared, redact } => {
                    let parent = nodes[node % nodes.len()].clone();
                    next_id += 1;
                    let declared: Vec<Label> =
                        declared.iter().filter_map(|i| RESTRICTIONS.get(*i)).map(|s| l(s)).collect();
                    let (child, t) = parent
                        .delegate(&p, AgentId::parse("child").unwrap(),
                                  EnvelopeId::parse(&format!("env-{next_id}")).unwrap(), &declared, redact)
                        .unwrap();
                    let projected = decide(&parent, &p, &ContextRequest::Action(ActionRef { name: "read", tags: &[] }));
                    prop_assert!(strs(parent.restrictions()).is_subset(&strs(child.restrictions())));
                    prop_assert!(strs(projected.projected_restrictions.names()).is_subset(&strs(child.restrictions())));
                    prop_assert!(declared.iter().all(|r| child.restrictions().contains(r.as_str())));
                    prop_assert!(child.aggregate_sensitivity() >= parent.aggregate_sensitivity());
                    prop_assert!(child.aggregate_sensitivity() >= projected.projected_sensitivity);
                    prop_assert_eq!(child.delegation_depth(), parent.delegation_depth() + 1);
                    prop_assert_eq!(child.parent_envelope_id(), Some(parent.envelope_id()));
                    prop_assert_eq!(child.workflow_id(), parent.workflow_id());
                    prop_assert_eq!(t.redacted(), redact);
                    if redact {
                        prop_assert!(child.labels().is_empty() && child.derived().is_empty());
                    } else {
                        prop_assert_eq!(strs(child.labels()), strs(parent.labels()));
                        prop_assert!(strs(parent.derived()).is_subset(&strs(child.derived())));
                    }
                    // Whatever a restriction denies the parent, it denies the child.
                    for (pd, cd) in decide_all(&parent, &p).iter().zip(decide_all(&child, &p).iter()) {
                        if restricted_by(pd) {
                            prop_assert!(restricted_by(cd), "parent {:?} child {:?}", pd, cd);
                        }
                        prop_assert!(cd.projected_sensitivity >= pd.projected_sensitivity);
                    }
                    nodes.push(child);
                }
                Op::Declassify { node, officer: is_officer, to, remove } => {
                    let i = node % nodes.len();
                    let env = nodes[i].clone();
                    let by = if is_officer { &officer } else { &other };
                    let to = Sensitivity::from_rank(to).unwrap();
                    match env.declassify(&p, by, to, &step_labels(&remove), "reviewed") {
                        Ok((next, t)) => {
                            prop_assert!(is_officer);
                            prop_assert_eq!(next.aggregate_sensitivity(), to);
                            prop_assert!(strs(env.restrictions()).is_subset(&strs(next.restrictions())));
                            prop_assert_eq!(next.version(), env.version() + 1);
                            prop_assert!(t.declassification().is_some());
                            // Consistent: folding nothing does not undo it.
                            let (again, _) = next.fold(&p, &[], &[]).unwrap();
                            prop_assert_eq!(again.aggregate_sensitivity(), to);
                            nodes[i] = next;
                        }
                        Err(e) => {
                            if !is_officer {
                                prop_assert_eq!(e.reason(), reasons::DECLASSIFICATION_NOT_AUTHORIZED);
                            }
                        }
                    }
                }
            }
        }
    }
}
