//! The agent-governance-toolkit baseline: `agt_envelope_bench.py`'s seeded
//! workload regenerated in Rust and run through Warden's envelopes.
//!
//! Same SplitMix64 streams (seed 42 + steps), same label and action weights,
//! same five aggregation rules (plus the labels' base levels, a backstop of
//! 4 labels at or above `public`, floor `restricted`), same digest lines.
//! Warden's outcomes are mapped onto the reference's before hashing (the
//! mapping documented in `warden_core::envelope`):
//!
//! | Warden | reference |
//! | --- | --- |
//! | `deny restricted_by:*` | `constrain`, kind `restriction` |
//! | `escalate sensitivity_floor` | `constrain`, kind `floor` |
//! | `escalate aggregation_backstop` | `escalate` |
//! | `allow` / `constrain` on `memory_write` at or above `restricted` | `constrain`, kind `floor` (the one real divergence: the reference gates memory writes at the floor, Warden's floor covers flows out) |
//! | other `allow` / `constrain` | `allow` |
//!
//! and the version is doubled (the reference's `accumulate` bumps twice).
//! Timed: `fold` + `decide` per step (the reference's `accumulate` +
//! `decide_next`), and `delegate` per step (its `derive_child`).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use warden_core::decision::Verdict;
use warden_core::envelope::{
    ActionRef, ContextPolicy, ContextPolicySpec, ContextRequest, Envelope, EnvelopeId, Sensitivity,
    TrustZone, WorkflowId, decide,
};
use warden_core::ids::{AgentId, Label};

use crate::timing::{median, pct};
use crate::world::SplitMix64;

const LABELS: [(&str, u64); 12] = [
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
const ACTIONS: [(&str, u64); 6] = [
    ("export", 20),
    ("delegate", 15),
    ("memory_write", 15),
    ("read", 20),
    ("summarize", 15),
    ("search", 15),
];
const CHILD_RESTRICTIONS: [&str; 4] = [
    "no_external_export",
    "no_external_delegation",
    "no_memory_write",
    "no_print",
];

/// Digests `agt_envelope_bench.py` prints for seed 42 with
/// agent-governance-toolkit-core 5.0.0 (outcome, child), per workload.
pub const REFERENCE_DIGESTS: [(usize, &str, &str); 2] = [
    (
        10,
        "76f031c11dc1c91697b836cf2a8788f79f18beb6f1f3058462552492ce5ebde4",
        "19527ade5aee715431585c1aa2acab1221c54f15055202726945d65e131eb2fe",
    ),
    (
        50,
        "179c6940c50ee049e1a2c71da6caba4a157f05af1d925b0b2d3cf5133ed35ab4",
        "7709125bcb197afac25b5999e1407f6bbcc54056f8e35e6d1bac3a6bb7463c85",
    ),
];

/// The reference's ruleset as a Warden `context:` section.
pub fn policy() -> Result<ContextPolicy> {
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
        "restrictions": {"no_print": {"denies_tags": ["print"]}}
    }))?;
    ContextPolicy::compile(&spec).map_err(|e| anyhow!("context policy: {e}"))
}

/// One step of a workflow, as the host hands it over.
pub struct Step {
    labels: Vec<Label>,
    action: usize,
    declared: Vec<Label>,
    child_id: EnvelopeId,
}

/// One workflow.
pub struct Workflow {
    root: Envelope,
    steps: Vec<Step>,
}

/// The workload: `workflows` workflows of `steps` steps.
pub fn workload(p: &ContextPolicy, steps: usize, workflows: usize) -> Result<Vec<Workflow>> {
    let mut rng = SplitMix64(42 + steps as u64);
    let label_w: Vec<u64> = LABELS.iter().map(|x| x.1).collect();
    let action_w: Vec<u64> = ACTIONS.iter().map(|x| x.1).collect();
    let agent = AgentId::parse("customer_success")?;
    let mut out = Vec::with_capacity(workflows);
    for w in 0..workflows {
        let root = Envelope::root(
            p,
            EnvelopeId::parse(&format!("env-{steps}-{w}"))?,
            WorkflowId::parse(&format!("wf-{steps}-{w}"))?,
            agent.clone(),
        );
        let mut list = Vec::with_capacity(steps);
        for s in 0..steps {
            let k = 1 + rng.below(3) as usize;
            let mut labels: Vec<&str> = Vec::new();
            while labels.len() < k {
                let lab = LABELS.get(rng.weighted(&label_w)).map_or("", |x| x.0);
                if !labels.contains(&lab) {
                    labels.push(lab);
                }
            }
            let action = rng.weighted(&action_w);
            let d = rng.below(3) as usize;
            let mut declared: Vec<&str> = Vec::new();
            while declared.len() < d {
                let r = CHILD_RESTRICTIONS
                    .get(rng.below(4) as usize)
                    .copied()
                    .unwrap_or("");
                if !declared.contains(&r) {
                    declared.push(r);
                }
            }
            list.push(Step {
                labels: labels
                    .iter()
                    .map(|l| Label::parse(l))
                    .collect::<Result<_, _>>()?,
                action,
                declared: declared
                    .iter()
                    .map(|l| Label::parse(l))
                    .collect::<Result<_, _>>()?,
                child_id: EnvelopeId::parse(&format!("env-{steps}-{w}:c{s}"))?,
            });
        }
        out.push(Workflow { root, steps: list });
    }
    Ok(out)
}

/// The catalogue side of the reference's actions.
struct Requests {
    export_tags: Vec<Label>,
}

impl Requests {
    fn new() -> Result<Self> {
        Ok(Self {
            export_tags: vec![Label::parse("export")?],
        })
    }

    #[inline]
    fn request(&self, action: usize) -> ContextRequest<'_> {
        match action {
            0 => ContextRequest::Action(ActionRef {
                name: "export",
                tags: &self.export_tags,
            }),
            1 => ContextRequest::Delegation {
                target: TrustZone::External,
                delegatee_authority: &[],
            },
            2 => ContextRequest::Action(ActionRef {
                name: "memory.write",
                tags: &[],
            }),
            3 => ContextRequest::Action(ActionRef {
                name: "read",
                tags: &[],
            }),
            4 => ContextRequest::Action(ActionRef {
                name: "summarize",
                tags: &[],
            }),
            _ => ContextRequest::Action(ActionRef {
                name: "search",
                tags: &[],
            }),
        }
    }
}

/// Digests and counts of a workload.
#[derive(Debug, Clone, Serialize)]
pub struct Digests {
    /// Outcome digest under the mapping.
    pub digest: String,
    /// Child-restriction digest.
    pub child_digest: String,
    /// Mapped outcome counts (the reference's keys).
    pub counts: BTreeMap<String, u64>,
    /// Warden's own verdict:reason counts.
    pub warden_counts: BTreeMap<String, u64>,
}

/// Replay the workload, hash per-step outcomes as the reference does.
pub fn digests(p: &ContextPolicy, wfs: &[Workflow]) -> Result<Digests> {
    let reqs = Requests::new()?;
    let agent = AgentId::parse("child")?;
    let mut h = Sha256::new();
    let mut hc = Sha256::new();
    let mut counts = BTreeMap::new();
    let mut warden_counts = BTreeMap::new();
    for (w, wf) in wfs.iter().enumerate() {
        let mut env = wf.root.clone();
        for (s, st) in wf.steps.iter().enumerate() {
            env = env
                .fold(p, &st.labels, &[])
                .map_err(|e| anyhow!("fold: {e}"))?
                .0;
            let dec = decide(&env, p, &reqs.request(st.action));
            let action = ACTIONS.get(st.action).map_or("", |a| a.0);
            *warden_counts
                .entry(format!(
                    "{}:{}",
                    serde_json::to_value(dec.verdict)?.as_str().unwrap_or("?"),
                    dec.reason.as_str()
                ))
                .or_insert(0u64) += 1;
            let (outcome, kind) = match (dec.verdict, dec.reason.kind()) {
                (Verdict::Deny, "restricted_by") => ("constrain", "restriction"),
                (Verdict::Escalate, "sensitivity_floor") => ("constrain", "floor"),
                (Verdict::Escalate, "aggregation_backstop") => ("escalate", ""),
                (Verdict::Allow | Verdict::Constrain, _)
                    if action == "memory_write"
                        && dec.projected_sensitivity >= Sensitivity::Restricted =>
                {
                    ("constrain", "floor")
                }
                (Verdict::Allow | Verdict::Constrain, _) => ("allow", ""),
                other => bail!("unexpected decision {other:?} at {w},{s}"),
            };
            let key = if kind.is_empty() {
                outcome.to_owned()
            } else {
                format!("{outcome}:{kind}")
            };
            *counts.entry(key).or_insert(0u64) += 1;
            let names = |n: warden_core::envelope::NameSet<'_>| {
                n.iter().map(Label::as_str).collect::<Vec<_>>().join("|")
            };
            let restrictions = names(env.restrictions());
            let obligations = if outcome == "constrain" {
                names(dec.projected_restrictions.names())
            } else {
                String::new()
            };
            h.update(format!(
                "{w},{s},{action},{outcome},{kind},{},{},{},{},{restrictions},{obligations}\n",
                dec.projected_sensitivity.rank(),
                env.aggregate_sensitivity().rank(),
                env.labels().len(),
                env.version() * 2,
            ));
            let (child, _) = env
                .delegate(p, agent.clone(), st.child_id.clone(), &st.declared, false)
                .map_err(|e| anyhow!("delegate: {e}"))?;
            hc.update(format!("{w},{s},{}\n", names(child.restrictions())));
        }
    }
    Ok(Digests {
        digest: hex::encode(h.finalize()),
        child_digest: hex::encode(hc.finalize()),
        counts,
        warden_counts,
    })
}

/// Timings of one run, ns.
#[derive(Debug, Clone, Serialize)]
pub struct Timings {
    /// fold + decide per step: median over batches.
    pub step_median_ns: f64,
    /// fold + decide per step: p99 over batches.
    pub step_p99_ns: f64,
    /// One pass over the whole workload, per step.
    pub step_batch_ns: f64,
    /// delegate per op: median over batches.
    pub delegate_median_ns: f64,
    /// delegate per op: p99 over batches.
    pub delegate_p99_ns: f64,
    /// Steps per timed batch.
    pub batch_steps: usize,
}

/// Time fold + decide and delegate over the workload.
pub fn time(p: &ContextPolicy, wfs: &[Workflow]) -> Result<Timings> {
    let reqs = Requests::new()?;
    let agent = AgentId::parse("child")?;
    let steps = wfs.first().map_or(1, |w| w.steps.len().max(1));
    // Batches of whole workflows lasting ≥ ~2 µs (timer overhead < 1%).
    let per_batch = (40 / steps).max(1);
    let run_wf = |wf: &Workflow| -> Result<Envelope> {
        let mut env = wf.root.clone();
        for st in &wf.steps {
            env = env
                .fold(p, &st.labels, &[])
                .map_err(|e| anyhow!("fold: {e}"))?
                .0;
            black_box(decide(&env, p, &reqs.request(st.action)));
        }
        Ok(env)
    };
    // Warm-up.
    for wf in wfs.iter().take(1000) {
        black_box(run_wf(wf)?);
    }
    let mut samples = Vec::with_capacity(wfs.len() / per_batch + 1);
    for chunk in wfs.chunks(per_batch) {
        let start = Instant::now();
        for wf in chunk {
            black_box(run_wf(wf)?);
        }
        samples.push(start.elapsed().as_nanos() as f64 / (chunk.len() * steps) as f64);
    }
    let start = Instant::now();
    for wf in wfs {
        black_box(run_wf(wf)?);
    }
    let step_batch_ns = start.elapsed().as_nanos() as f64 / (wfs.len() * steps) as f64;

    // Delegation: parents = envelopes after each step's fold (untimed).
    let mut parents = Vec::with_capacity(wfs.len() * steps);
    for wf in wfs {
        let mut env = wf.root.clone();
        for st in &wf.steps {
            env = env
                .fold(p, &st.labels, &[])
                .map_err(|e| anyhow!("fold: {e}"))?
                .0;
            parents.push((env.clone(), st));
        }
    }
    let delegate_batch = 32;
    let mut dsamples = Vec::with_capacity(parents.len() / delegate_batch + 1);
    for chunk in parents.chunks(delegate_batch) {
        let start = Instant::now();
        for (env, st) in chunk {
            black_box(
                env.delegate(p, agent.clone(), st.child_id.clone(), &st.declared, false)
                    .map_err(|e| anyhow!("delegate: {e}"))?,
            );
        }
        dsamples.push(start.elapsed().as_nanos() as f64 / chunk.len() as f64);
    }
    samples.sort_by(f64::total_cmp);
    dsamples.sort_by(f64::total_cmp);
    Ok(Timings {
        step_median_ns: median(&samples),
        step_p99_ns: pct(&samples, 0.99),
        step_batch_ns,
        delegate_median_ns: median(&dsamples),
        delegate_p99_ns: pct(&dsamples, 0.99),
        batch_steps: per_batch * steps,
    })
}

/// What one Python run reported for one workload.
#[derive(Debug, Clone, Serialize)]
pub struct PythonRun {
    /// Outcome digest.
    pub digest: String,
    /// Child digest.
    pub child_digest: String,
    /// Outcome counts.
    pub counts: BTreeMap<String, u64>,
    /// accumulate + decide_next, median per step.
    pub step_median_ns: f64,
    /// p99 per step.
    pub step_p99_ns: f64,
    /// Batch pass per step.
    pub step_batch_ns: f64,
    /// derive_child median.
    pub delegate_median_ns: f64,
    /// derive_child p99.
    pub delegate_p99_ns: f64,
    /// Package version.
    pub version: String,
}

/// Read one workload's numbers out of `agt_envelope_bench.py --json`.
pub fn read_python(json: &Json, steps: usize) -> Result<PythonRun> {
    let e = json
        .get(format!("steps{steps}"))
        .with_context(|| format!("no steps{steps} in python json"))?;
    let f = |path: &[&str]| -> Result<f64> {
        let mut v = e;
        for p in path {
            v = v
                .get(p)
                .with_context(|| format!("python json: no {path:?}"))?;
        }
        v.as_f64()
            .with_context(|| format!("python json: {path:?} not a number"))
    };
    let s = |k: &str| -> Result<String> {
        Ok(e.get(k)
            .and_then(Json::as_str)
            .with_context(|| format!("python json: no {k}"))?
            .to_owned())
    };
    let counts = e
        .get("outcome_counts")
        .and_then(Json::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_u64().map(|n| (k.clone(), n)))
                .collect()
        })
        .unwrap_or_default();
    Ok(PythonRun {
        digest: s("digest_sha256")?,
        child_digest: s("child_digest_sha256")?,
        counts,
        step_median_ns: f(&["fold_decide", "median_ns"])?,
        step_p99_ns: f(&["fold_decide", "p99_ns"])?,
        step_batch_ns: f(&["fold_decide_batch", "ns_per_step"])?,
        delegate_median_ns: f(&["delegation_derive_child", "median_ns"])?,
        delegate_p99_ns: f(&["delegation_derive_child", "p99_ns"])?,
        version: json
            .get("meta")
            .and_then(|m| m.get("agt_core_version"))
            .and_then(Json::as_str)
            .unwrap_or("?")
            .to_owned(),
    })
}
