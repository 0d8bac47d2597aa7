//! Context envelopes: the per-step cost of accumulation and decision, of
//! signing and verification, and of a whole gated step through the engine.
//!
//! `cargo bench -p warden --bench envelope`
//!
//! - `envelope/fold_decide/*`: one step's core work, `Envelope::fold` of the
//!   step's labels then `decide` of the next action against the result;
//! - `envelope/restore_fold_decide`: the same from a stored record, as the
//!   engine does it (`Envelope::restore` first);
//! - `envelope/sign`, `envelope/verify`: an exported token;
//! - `engine/step/*`: `begin_step` + `complete_step` through the engine over
//!   the in-memory store, with and without a `context:` section (the
//!   difference is the envelope's cost in the engine: two envelope reads,
//!   one compare-and-set write and one more audit entry per step).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use serde_json::json;
use warden::{Admission, Engine, ManualClock, StepGate, StepResult};
use warden_core::envelope::sign::{SigningKey, Verifier, sign};
use warden_core::envelope::{
    ActionRef, ContextPolicy, ContextRequest, Envelope, EnvelopeId, IssuerId, WorkflowId, decide,
};
use warden_core::ids::{AgentId, Label, RunId};
use warden_core::time::Timestamp;
use warden_store::MemoryStore;

const POLICY: &str = include_str!("../../../examples/report-hierarchy/policy.yaml");

fn context() -> (warden_core::bundle::Policy, ContextPolicy) {
    let p = warden_core::bundle::compile(POLICY).unwrap();
    let c = p.context.clone().unwrap();
    (p, c)
}

fn labels(xs: &[&str]) -> Vec<Label> {
    xs.iter().map(|s| Label::parse(s).unwrap()).collect()
}

fn root(policy: &ContextPolicy) -> Envelope {
    Envelope::root(
        policy,
        EnvelopeId::parse("env-bench").unwrap(),
        WorkflowId::parse("wf-bench").unwrap(),
        AgentId::parse("researcher").unwrap(),
    )
}

fn core(c: &mut Criterion) {
    let (p, policy) = context();
    let export_tags = p
        .catalogue
        .by_name("report.export")
        .unwrap()
        .tags()
        .to_vec();
    let save_tags = p
        .catalogue
        .by_name("artifact.save")
        .unwrap()
        .tags()
        .to_vec();
    let export = ContextRequest::Action(ActionRef {
        name: "report.export",
        tags: &export_tags,
    });
    let save = ContextRequest::Action(ActionRef {
        name: "artifact.save",
        tags: &save_tags,
    });
    let empty = root(&policy);
    let partial = empty
        .fold(
            &policy,
            &labels(&["customer_name", "renewal_status", "usage_analytics"]),
            &[],
        )
        .unwrap()
        .0;
    let restricted = partial
        .fold(&policy, &labels(&["financial_indicators"]), &[])
        .unwrap()
        .0;
    let one = labels(&["customer_name"]);
    let last = labels(&["financial_indicators"]);
    let doc = labels(&["internal_document"]);

    let mut g = c.benchmark_group("envelope/fold_decide");
    // A first label into an empty envelope; the export is allowed.
    g.bench_function("public_allow", |b| {
        b.iter(|| {
            let (next, t) = black_box(&empty).fold(&policy, &one, &[]).unwrap();
            black_box(&t);
            black_box(decide(&next, &policy, &export))
        })
    });
    // The fold that completes the customer profile; the export is denied.
    g.bench_function("aggregation_deny", |b| {
        b.iter(|| {
            let (next, t) = black_box(&partial).fold(&policy, &last, &[]).unwrap();
            black_box(&t);
            black_box(decide(&next, &policy, &export))
        })
    });
    // A restricted envelope: the next step is constrained (obligations).
    g.bench_function("restricted_constrain", |b| {
        b.iter(|| {
            let (next, t) = black_box(&restricted).fold(&policy, &doc, &[]).unwrap();
            black_box(&t);
            black_box(decide(&next, &policy, &save).obligations.to_vec())
        })
    });
    g.finish();

    let record = restricted.to_record();
    c.bench_function("envelope/restore_fold_decide", |b| {
        b.iter(|| {
            let env = Envelope::restore(black_box(&record), &policy).unwrap();
            let (next, _) = env.fold(&policy, &doc, &[]).unwrap();
            black_box(decide(&next, &policy, &export))
        })
    });

    let issuer = IssuerId::parse("warden.bench-1").unwrap();
    let key = SigningKey::from_bytes(&[9u8; 32]);
    c.bench_function("envelope/sign", |b| {
        b.iter(|| black_box(sign(black_box(&record), &issuer, &key).unwrap()))
    });
    let token = sign(&record, &issuer, &key).unwrap();
    let mut trusted = Verifier::new();
    trusted.trust(issuer.clone(), key.verifying_key());
    c.bench_function("envelope/verify", |b| {
        b.iter_batched_ref(
            || trusted.clone(),
            |v| black_box(v.verify(black_box(&token)).unwrap()),
            BatchSize::SmallInput,
        )
    });
}

const STEPS: usize = 50;

async fn engine(policy: &str) -> Engine<MemoryStore> {
    Engine::open(
        warden_core::bundle::compile(policy).unwrap(),
        MemoryStore::new(),
        Arc::new(ManualClock::new(Timestamp(1_700_000_000_000))),
    )
    .await
    .unwrap()
}

/// Time `n` gated steps (begin + complete) over fresh 50-step runs.
async fn gated_steps(e: &Engine<MemoryStore>, n: u64, next_run: &mut u64) -> Duration {
    let researcher = AgentId::parse("researcher").unwrap();
    let steps: Vec<_> = (0..STEPS)
        .map(|i| {
            json!({"step_id": format!("s{i}"), "action": "artifact.save",
                   "arguments": {"path": "internal/x"}})
        })
        .collect();
    let sop = warden_core::sop::parse_sop(
        &json!({"sop_id": "bench", "version": 1, "steps": steps}).to_string(),
        &e.policy().sop_limits,
    )
    .unwrap();
    let result = StepResult {
        result: Some(json!({"ok": true})),
        result_labels: labels(&["internal_document"]),
        error: None,
    };
    let mut total = Duration::ZERO;
    let mut left = n;
    while left > 0 {
        *next_run += 1;
        let run_id = RunId::parse(&format!("run-{next_run}")).unwrap();
        let Admission::Admitted { run, .. } = e
            .admit_run(&researcher, &sop, Some(run_id.clone()))
            .await
            .unwrap()
        else {
            panic!("rejected")
        };
        let take = left.min(STEPS as u64);
        let start = Instant::now();
        for step in run.steps.iter().take(take as usize) {
            let gate = e
                .begin_step(&researcher, &run_id, &step.step_id)
                .await
                .unwrap();
            assert!(matches!(gate, StepGate::Proceed { .. }));
            black_box(
                e.complete_step(&researcher, &run_id, &step.step_id, result.clone())
                    .await
                    .unwrap(),
            );
        }
        total += start.elapsed();
        left -= take;
    }
    total
}

fn engine_steps(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let without = POLICY[..POLICY.find("\n# Context accumulation").unwrap()].to_string();
    let mut g = c.benchmark_group("engine/step");
    for (name, policy) in [
        ("with_context", POLICY.to_string()),
        ("without_context", without),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    // A fresh engine per sample keeps the log from growing
                    // across the whole benchmark.
                    let e = engine(&policy).await;
                    let mut next_run = 0;
                    gated_steps(&e, iters, &mut next_run).await
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, core, engine_steps);
criterion_main!(benches);
