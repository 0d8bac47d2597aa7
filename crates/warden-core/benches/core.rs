//! Hot in-process decisions: capability check, ancestor questions by depth
//! (against the lineage walk), nearest-visible resolve by depth and record
//! count, and whole-SOP preflight by length.
//!
//! `cargo bench -p warden-core --bench core`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::json;
use warden_core::bundle::{Policy, compile};
use warden_core::hierarchy::{AgentIdx, AgentSpec, Hierarchy};
use warden_core::ids::{ActionName, AgentId, Key, Namespace};
use warden_core::memory::{MemoryIndex, MemoryRecord, RecordClass, Visibility, resolve};
use warden_core::preflight::{PreflightContext, preflight};
use warden_core::time::Timestamp;

const POLICY: &str = include_str!("../../../examples/report-hierarchy/policy.yaml");
const ALL: [&str; 4] = [
    "memory.read",
    "memory.write",
    "document.summarize",
    "artifact.save",
];

fn policy() -> Policy {
    compile(POLICY).unwrap()
}

fn spec(id: String, parent: Option<String>) -> AgentSpec {
    AgentSpec {
        id: AgentId::parse(&id).unwrap(),
        parent: parent.map(|p| AgentId::parse(&p).unwrap()),
        capabilities: ALL.iter().map(|a| ActionName::parse(a).unwrap()).collect(),
    }
}

/// A chain of `depth` agents (`c0` root ... `c{depth-1}`) plus `filler`
/// agents hanging off the root, so the agent count varies independently.
fn hierarchy(p: &Policy, depth: usize, filler: usize) -> (Hierarchy, AgentIdx) {
    let mut h = p.empty_hierarchy();
    let index_of = |a: &ActionName| p.action_index(a);
    let mut last = None;
    for i in 0..depth {
        let parent = (i > 0).then(|| format!("c{}", i - 1));
        last = Some(
            h.register(&spec(format!("c{i}"), parent), &index_of)
                .unwrap(),
        );
    }
    for i in 0..filler {
        h.register(&spec(format!("f{i}"), Some("c0".into())), &index_of)
            .unwrap();
    }
    (h, last.unwrap())
}

fn record(owner: &str, ns: &str, key: &str, v: i64) -> MemoryRecord {
    MemoryRecord {
        namespace: Namespace::parse(ns).unwrap(),
        key: Key::parse(key).unwrap(),
        value: json!(v),
        owner: AgentId::parse(owner).unwrap(),
        visibility: Visibility::Descendants,
        class: RecordClass::Preference,
        revision: 1,
        created_at: Timestamp(0),
        updated_at: Timestamp(0),
    }
}

/// `total` records: the target `project.client_region` at the root (the
/// worst case: the walk goes all the way up), 64 records at the same key
/// owned by agents off the lineage, the rest spread over other keys.
fn records(total: usize, filler_agents: usize) -> MemoryIndex {
    let mut idx = MemoryIndex::new();
    idx.insert(record("c0", "project", "client_region", 1));
    for i in 0..64.min(filler_agents) {
        idx.insert(record(&format!("f{i}"), "project", "client_region", 2));
    }
    let mut n = idx.len();
    let mut i = 0usize;
    while n < total {
        let owner = format!("f{}", i % filler_agents.max(1));
        idx.insert(record(
            &owner,
            &format!("ns{}", i % 1000),
            &format!("k{}", i / 1000),
            3,
        ));
        n = idx.len();
        i += 1;
    }
    idx
}

/// `n` filler ids (`f0`...) drawn at random (SplitMix64) among `agents`.
fn random_ids(agents: usize, n: usize) -> Vec<AgentId> {
    let mut x = 0x5EED_u64;
    (0..n)
        .map(|_| {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            AgentId::parse(&format!("f{}", z % agents as u64)).unwrap()
        })
        .collect()
}

fn capability(c: &mut Criterion) {
    let p = policy();
    let mut g = c.benchmark_group("capability_check");
    for agents in [1_000usize, 1_000_000] {
        let (h, leaf) = hierarchy(&p, 32, agents);
        let action = p.catalogue.index_of("artifact.save").unwrap().get();
        g.bench_with_input(BenchmarkId::new("by_index", agents), &agents, |b, _| {
            b.iter(|| black_box(h.has_capability(black_box(leaf), black_box(action))))
        });
        g.bench_with_input(BenchmarkId::new("by_name", agents), &agents, |b, _| {
            b.iter(|| {
                let idx = h.index_of(black_box("f500")).unwrap();
                let a = p.catalogue.index_of(black_box("artifact.save")).unwrap();
                black_box(h.has_capability(idx, a.get()))
            })
        });
        // A different agent per call, drawn from a ring of 65,536 ids (the
        // comparison's random-agent question): at 10^6 agents the id table
        // and the nodes are far larger than the cache.
        let ring = random_ids(agents, 1 << 16);
        let mut at = 0usize;
        g.bench_with_input(BenchmarkId::new("random_agent", agents), &agents, |b, _| {
            b.iter(|| {
                at = (at + 1) & ((1 << 16) - 1);
                let idx = h.index_of(ring[at].as_str()).unwrap();
                black_box(h.has_capability(idx, action) & h.lineage_declares(idx, action))
            })
        });
    }
    g.finish();
}

/// A chain of `depth` agents where only the root declares `artifact.save`
/// (the others declare `memory.read`), plus 1,000 agents under the root:
/// "does the leaf or an ancestor declare `artifact.save`" must reach the
/// root.
fn declaring_chain(p: &Policy, depth: usize) -> (Hierarchy, AgentIdx) {
    let mut h = p.empty_hierarchy();
    let index_of = |a: &ActionName| p.action_index(a);
    let mut last = None;
    for i in 0..depth {
        let action = if i == 0 {
            "artifact.save"
        } else {
            "memory.read"
        };
        let spec = AgentSpec {
            id: AgentId::parse(&format!("c{i}")).unwrap(),
            parent: (i > 0).then(|| AgentId::parse(&format!("c{}", i - 1)).unwrap()),
            capabilities: [ActionName::parse(action).unwrap()].into(),
        };
        last = Some(h.register(&spec, &index_of).unwrap());
    }
    for i in 0..1_000 {
        h.register(&spec(format!("f{i}"), Some("c0".into())), &index_of)
            .unwrap();
    }
    (h, last.unwrap())
}

fn ancestry(c: &mut Criterion) {
    let p = policy();
    let action = p.catalogue.index_of("artifact.save").unwrap().get();
    let mut g = c.benchmark_group("ancestry");
    for depth in [3usize, 32, 64] {
        let (h, leaf) = declaring_chain(&p, depth);
        let root = h.index_of("c0").unwrap();
        assert!(h.lineage_declares(leaf, action));
        assert!(h.is_ancestor(root, leaf));
        g.bench_with_input(BenchmarkId::new("walk", depth), &depth, |b, _| {
            b.iter(|| {
                black_box(
                    h.lineage(black_box(leaf))
                        .any(|(_, n)| n.is_active() && n.declared().contains("artifact.save")),
                )
            })
        });
        g.bench_with_input(
            BenchmarkId::new("lineage_declares", depth),
            &depth,
            |b, _| b.iter(|| black_box(h.lineage_declares(black_box(leaf), black_box(action)))),
        );
        g.bench_with_input(BenchmarkId::new("is_ancestor", depth), &depth, |b, _| {
            b.iter(|| black_box(h.is_ancestor(black_box(root), black_box(leaf))))
        });
        // Churn: register a new leaf under the deepest agent, then ask.
        let parent = h.node(leaf).unwrap().id().clone();
        let index_of = |a: &ActionName| p.action_index(a);
        let mut hc = h.clone();
        let mut n = 0u64;
        g.bench_with_input(
            BenchmarkId::new("register_then_ask", depth),
            &depth,
            |b, _| {
                b.iter_batched(
                    || {
                        n += 1;
                        spec(format!("new{n}"), Some(parent.to_string()))
                    },
                    |s| {
                        let idx = hc.register(&s, &index_of).unwrap();
                        black_box(hc.lineage_declares(idx, action))
                    },
                    BatchSize::SmallInput,
                )
            },
        );
    }
    g.finish();
}

fn resolve_depth(c: &mut Criterion) {
    let p = policy();
    let mut g = c.benchmark_group("resolve");
    for total in [1_000usize, 1_000_000] {
        let filler = 1_000;
        let idx = records(total, filler);
        for depth in [1usize, 8, 32, 64] {
            let (h, leaf) = hierarchy(&p, depth, filler);
            let reader = h.node(leaf).unwrap().id().clone();
            let now = Timestamp(1);
            g.bench_with_input(
                BenchmarkId::new(format!("records_{total}"), depth),
                &depth,
                |b, _| {
                    b.iter(|| {
                        let view = idx.view(black_box("project"), black_box("client_region"));
                        let lineage = h.lineage(leaf).map(|(_, n)| n.id());
                        let out = resolve(&reader, lineage, |o| view.get(o.as_str()), now);
                        black_box(out);
                    })
                },
            );
        }
    }
    g.finish();
}

/// A random reader per call (the comparison's S3 at scale): a chain of 32
/// agents and `agents` fillers under its root, three records per chain
/// agent (one per visibility) and one for each of eight fillers, every key
/// held once; each call asks for one of those keys as a random filler.
fn resolve_random(c: &mut Criterion) {
    let p = policy();
    let mut g = c.benchmark_group("resolve_random_reader");
    for agents in [1_000usize, 1_000_000] {
        let (h, _) = hierarchy(&p, 32, agents);
        let mut idx = MemoryIndex::new();
        let mut keys = Vec::new();
        for i in 0..32 {
            for (v, vis) in [
                ("private", Visibility::Private),
                ("children", Visibility::Children),
                ("descendants", Visibility::Descendants),
            ] {
                let key = format!("r_{i}_{v}");
                let mut r = record(&format!("c{i}"), "s3", &key, 1);
                r.visibility = vis;
                idx.insert(r);
                keys.push(key);
            }
        }
        for j in 0..8 {
            let key = format!("r_f{j}");
            idx.insert(record(&format!("f{j}"), "s3", &key, 1));
            keys.push(key);
        }
        let ring: Vec<&str> = (0..1usize << 16)
            .map(|i| keys[(i * 7) % keys.len()].as_str())
            .collect();
        let names = random_ids(agents, 1 << 16);
        let mut at = 0usize;
        g.bench_with_input(BenchmarkId::new("by_name", agents), &agents, |b, _| {
            b.iter(|| {
                at = (at + 1) & ((1 << 16) - 1);
                let reader = h.index_of(names[at].as_str()).unwrap();
                let view = idx.view("s3", ring[at]);
                black_box(warden_core::memory::resolve_in(
                    &h,
                    reader,
                    view,
                    Timestamp(1),
                ))
            })
        });
        g.bench_with_input(BenchmarkId::new("resolve_for", agents), &agents, |b, _| {
            b.iter(|| {
                at = (at + 1) & ((1 << 16) - 1);
                let view = idx.view("s3", ring[at]);
                black_box(warden_core::memory::resolve_for(
                    &h,
                    &names[at],
                    view,
                    Timestamp(1),
                ))
            })
        });
    }
    g.finish();
}

fn sop_json(steps: usize) -> String {
    let kinds = [
        json!({"action": "document.summarize", "arguments": {"document_id": "fixture-1"}}),
        json!({"action": "artifact.save", "arguments": {"path": "internal/reports/q3/summary.txt", "content_type": "text/plain"}}),
        json!({"action": "external.upload", "arguments": {"destination": "https://uploads.example.com/drop/q3"}}),
        json!({"action": "memory.read", "arguments": {"namespace": "project", "key": "client_region"}}),
        json!({"action": "memory.write", "arguments": {"namespace": "notes", "key": "status", "value": {"stage": 2}}}),
    ];
    let steps: Vec<_> = (0..steps)
        .map(|i| {
            let mut s = kinds[i % kinds.len()].clone();
            s["step_id"] = json!(format!("step-{i}"));
            s
        })
        .collect();
    json!({"sop_id": "bench", "version": 1, "steps": steps}).to_string()
}

fn preflight_len(c: &mut Criterion) {
    let p = policy();
    let mut h = p.empty_hierarchy();
    let index_of = |a: &ActionName| p.action_index(a);
    for a in &p.agents {
        h.register(&warden_core::bundle::seed_spec(a), &index_of)
            .unwrap();
    }
    let actor = AgentId::parse("report_manager").unwrap();
    let ctx = PreflightContext {
        hierarchy: &h,
        catalogue: &p.catalogue,
        policy_version: &p.version,
    };
    let mut g = c.benchmark_group("preflight");
    for steps in [10usize, 25, 50] {
        let text = sop_json(steps);
        let sop = warden_core::sop::parse_sop(&text, &p.sop_limits).unwrap();
        assert!(preflight(&ctx, &actor, &sop, Timestamp(0)).admitted);
        g.bench_with_input(BenchmarkId::new("steps", steps), &steps, |b, _| {
            b.iter(|| {
                black_box(preflight(
                    &ctx,
                    black_box(&actor),
                    black_box(&sop),
                    Timestamp(0),
                ))
            })
        });
        g.bench_with_input(
            BenchmarkId::new("parse_and_preflight", steps),
            &steps,
            |b, _| {
                b.iter(|| {
                    let sop = warden_core::sop::parse_sop(black_box(&text), &p.sop_limits).unwrap();
                    black_box(preflight(&ctx, &actor, &sop, Timestamp(0)))
                })
            },
        );
    }
    g.finish();
}

criterion_group!(
    benches,
    capability,
    ancestry,
    resolve_depth,
    resolve_random,
    preflight_len
);
criterion_main!(benches);
