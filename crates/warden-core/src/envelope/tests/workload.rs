//! The Python benchmark's workload, reproduced: same SplitMix64 stream, same
//! digest lines. Warden's outcomes are mapped onto the reference's:
//!
//! ```text
//! deny restricted_by:*          -> constrain, kind "restriction"
//! escalate sensitivity_floor    -> constrain, kind "floor"
//! escalate aggregation_backstop -> escalate
//! allow / constrain (context_*) -> allow
//! ```
//!
//! with the one semantic difference made explicit: the reference also gates
//! `memory_write` at the floor (constrain, "floor"); Warden's floor only
//! covers export/external flows, so such steps are permitted here.
//! Matching the reference digests shows the two agree everywhere else.

use super::*;

struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    fn weighted(&mut self, weights: &[u64]) -> usize {
        let r = self.below(weights.iter().sum());
        let mut acc = 0;
        for (i, w) in weights.iter().enumerate() {
            acc += w;
            if acc > r {
                return i;
            }
        }
        unreachable!()
    }
}

const BENCH_LABELS: [(&str, u64); 12] = [
    ("public", 14),
    ("internal", 14),
    ("telemetry", 10),
    ("marketing", 8),
    ("contract", 8),
    ("behavioral", 8),
    ("location", 7),
    ("pii", 8),
    ("financial", 8),
    ("health", 5),
    ("biometric", 5),
    ("credentials", 5),
];
const BENCH_ACTIONS: [(&str, u64); 6] = [
    ("export", 20),
    ("delegate", 15),
    ("memory_write", 15),
    ("read", 20),
    ("summarize", 15),
    ("search", 15),
];
const BENCH_CHILD_RESTRICTIONS: [&str; 4] = [
    "no_external_export",
    "no_external_delegation",
    "no_memory_write",
    "no_print",
];

/// (outcome digest, child digest, outcome counts) of the reference workload.
fn reference_workload(steps: usize, workflows: usize) -> (String, String, BTreeMap<String, u64>) {
    use sha2::{Digest, Sha256};
    let p = bench_policy();
    let mut rng = SplitMix64(42 + steps as u64);
    let label_w: Vec<u64> = BENCH_LABELS.iter().map(|x| x.1).collect();
    let action_w: Vec<u64> = BENCH_ACTIONS.iter().map(|x| x.1).collect();
    let export_tags = ls(&["export"]);
    let agent = AgentId::parse("child").unwrap();
    let mut h = Sha256::new();
    let mut hc = Sha256::new();
    let mut counts = BTreeMap::new();
    for w in 0..workflows {
        let mut env = root(&p, &format!("env-{steps}-{w}"));
        for s in 0..steps {
            let k = 1 + rng.below(3) as usize;
            let mut labels: Vec<&str> = Vec::new();
            while labels.len() < k {
                let lab = BENCH_LABELS[rng.weighted(&label_w)].0;
                if !labels.contains(&lab) {
                    labels.push(lab);
                }
            }
            let action = BENCH_ACTIONS[rng.weighted(&action_w)].0;
            let d = rng.below(3) as usize;
            let mut declared: Vec<&str> = Vec::new();
            while declared.len() < d {
                let r = BENCH_CHILD_RESTRICTIONS[rng.below(4) as usize];
                if !declared.contains(&r) {
                    declared.push(r);
                }
            }

            env = env.fold(&p, &ls(&labels), &[]).unwrap().0;
            let dec = match action {
                "export" => decide(
                    &env,
                    &p,
                    &ContextRequest::Action(ActionRef {
                        name: "export",
                        tags: &export_tags,
                    }),
                ),
                "memory_write" => decide(
                    &env,
                    &p,
                    &ContextRequest::Action(ActionRef {
                        name: "memory.write",
                        tags: &[],
                    }),
                ),
                "delegate" => decide(
                    &env,
                    &p,
                    &ContextRequest::Delegation {
                        target: TrustZone::External,
                        delegatee_authority: &[],
                    },
                ),
                other => decide(
                    &env,
                    &p,
                    &ContextRequest::Action(ActionRef {
                        name: other,
                        tags: &[],
                    }),
                ),
            };
            let (outcome, kind) = match (dec.verdict, dec.reason.kind()) {
                (Verdict::Deny, reasons::RESTRICTED_BY) => ("constrain", "restriction"),
                (Verdict::Escalate, "sensitivity_floor") => ("constrain", "floor"),
                (Verdict::Escalate, "aggregation_backstop") => ("escalate", ""),
                (Verdict::Allow | Verdict::Constrain, _)
                    if action == "memory_write"
                        && dec.projected_sensitivity >= Sensitivity::Restricted =>
                {
                    ("constrain", "floor")
                }
                (Verdict::Allow | Verdict::Constrain, _) => ("allow", ""),
                other => panic!("unexpected {other:?}"),
            };
            let key = if kind.is_empty() {
                outcome.to_owned()
            } else {
                format!("{outcome}:{kind}")
            };
            *counts.entry(key).or_insert(0) += 1;
            let restrictions = names(env.restrictions()).join("|");
            let obligations = if outcome == "constrain" {
                names(dec.projected_restrictions.names()).join("|")
            } else {
                String::new()
            };
            h.update(format!(
                "{w},{s},{action},{outcome},{kind},{},{},{},{},{restrictions},{obligations}\n",
                dec.projected_sensitivity.rank(),
                env.aggregate_sensitivity().rank(),
                env.labels().len(),
                env.version() * 2, // the reference bumps twice per accumulate
            ));
            let (child, _) = env
                .delegate(
                    &p,
                    agent.clone(),
                    EnvelopeId::parse(&format!("env-{steps}-{w}:c{s}")).unwrap(),
                    &ls(&declared),
                    false,
                )
                .unwrap();
            hc.update(format!(
                "{w},{s},{}\n",
                names(child.restrictions()).join("|")
            ));
        }
    }
    (
        hex::encode(h.finalize()),
        hex::encode(hc.finalize()),
        counts,
    )
}

#[test]
fn the_reference_workload_digests_match_under_the_outcome_mapping() {
    // Digests printed by agt_envelope_bench.py (agent-governance-toolkit-core
    // 5.0.0) for seed 42.
    let (d, c, counts) = reference_workload(10, 100);
    assert_eq!(
        d,
        "1c4e53226169aa15734afb9b0e28addc7e82e0c38f649ba6fc0351020396382a"
    );
    assert_eq!(
        c,
        "f7bd7c446562b578e89e303c2695b298bbc1851472405af759a91182c604ad71"
    );
    assert_eq!(counts.values().sum::<u64>(), 1000);
    let (d, c, _) = reference_workload(10, 10_000);
    assert_eq!(
        d,
        "76f031c11dc1c91697b836cf2a8788f79f18beb6f1f3058462552492ce5ebde4"
    );
    assert_eq!(
        c,
        "19527ade5aee715431585c1aa2acab1221c54f15055202726945d65e131eb2fe"
    );
    let (d, c, _) = reference_workload(50, 2_000);
    assert_eq!(
        d,
        "179c6940c50ee049e1a2c71da6caba4a157f05af1d925b0b2d3cf5133ed35ab4"
    );
    assert_eq!(
        c,
        "7709125bcb197afac25b5999e1407f6bbcc54056f8e35e6d1bac3a6bb7463c85"
    );
}
