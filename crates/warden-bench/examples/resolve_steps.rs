//! Where S3's time goes for a random reader: the resolve taken apart into
//! cumulative steps, each timed like the random-agent table times a
//! decision (one call after another, batches of 16 calls per `Instant`
//! pair, the median batch per call).
//!
//! ```sh
//! cargo run --release -p warden-bench --example resolve_steps -- 1000000
//! GLIBC_TUNABLES=glibc.malloc.hugetlb=1 target/release/examples/resolve_steps 1000000
//! ```
//!
//! The argument is the number of agents besides the 32-deep chain (default
//! 10^6). The world, the policy, the loaded state and the ring of (random
//! agent, record key) questions are the benchmark's own; the last step is
//! the benchmark's S3 decision, and its answers are checked against the
//! reference model before anything is timed.

use std::hint::black_box;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use warden_bench::warden_engine::{NS, State, load, policy};
use warden_bench::world::{Scenario, World, model};
use warden_core::hierarchy::Hierarchy;
use warden_core::ids::{AgentId, Key};
use warden_core::memory::{MemoryIndex, Resolution, resolve_for, resolve_in};
use warden_core::time::Timestamp;

/// Calls per timed batch.
const BATCH: usize = 16;
/// Batches per step and round.
const BATCHES: usize = 20_000;

type Step = fn(&Hierarchy, &MemoryIndex, &AgentId, &Key) -> u64;

fn depth_of(h: &Hierarchy, id: &str) -> u64 {
    h.index_of(id)
        .and_then(|i| h.node(i))
        .map_or(0, |n| u64::from(n.depth()))
}

/// The reader's id-table slot and node (S1's whole cost).
fn reader(h: &Hierarchy, _: &MemoryIndex, a: &AgentId, _: &Key) -> u64 {
    depth_of(h, a.as_str())
}

/// The reader, and a node every call reads (the chain's root): a second
/// node that is always in cache.
fn reader_and_root(h: &Hierarchy, _: &MemoryIndex, a: &AgentId, _: &Key) -> u64 {
    depth_of(h, a.as_str()) + depth_of(h, "c0")
}

/// The reader, and the key's entry in the memory index.
fn reader_key(h: &Hierarchy, idx: &MemoryIndex, a: &AgentId, k: &Key) -> u64 {
    depth_of(h, a.as_str()) + idx.view(NS, k.as_str()).len() as u64
}

/// ... and the key's record (its owner's id).
fn reader_key_record(h: &Hierarchy, idx: &MemoryIndex, a: &AgentId, k: &Key) -> u64 {
    let owner = idx
        .view(NS, k.as_str())
        .iter()
        .next()
        .map(|r| r.owner.as_str().len());
    depth_of(h, a.as_str()) + owner.unwrap_or(0) as u64
}

/// The key, its record and its owner's slot and node, without the reader.
fn key_owner(h: &Hierarchy, idx: &MemoryIndex, _: &AgentId, k: &Key) -> u64 {
    let view = idx.view(NS, k.as_str());
    view.iter()
        .next()
        .map_or(0, |r| depth_of(h, r.owner.as_str()))
}

/// The reader, and the key's record's owner's slot and node.
fn reader_key_owner(h: &Hierarchy, idx: &MemoryIndex, a: &AgentId, k: &Key) -> u64 {
    depth_of(h, a.as_str()) + key_owner(h, idx, a, k)
}

/// The S3 decision through `index_of` and `resolve_in`: the node's line
/// read before the resolve.
fn resolve_by_index(h: &Hierarchy, idx: &MemoryIndex, a: &AgentId, k: &Key) -> u64 {
    let Some(reader) = h.index_of(a.as_str()) else {
        return 0;
    };
    answer(resolve_in(
        h,
        reader,
        idx.view(NS, k.as_str()),
        Timestamp(1),
    ))
}

/// The benchmark's S3 decision (`resolve_for`: the node's line compared
/// last).
fn resolve(h: &Hierarchy, idx: &MemoryIndex, a: &AgentId, k: &Key) -> u64 {
    answer(resolve_for(h, a, idx.view(NS, k.as_str()), Timestamp(1)))
}

fn answer(r: Resolution<'_>) -> u64 {
    match r {
        Resolution::Found { record, .. } => {
            black_box(record);
            1
        }
        Resolution::Combined { .. } => 1,
        Resolution::Denied { .. } | Resolution::NotFound => 0,
    }
}

const STEPS: [(&str, Step); 8] = [
    ("reader (slot, node)", reader),
    ("reader + the root's node", reader_and_root),
    ("reader + key", reader_key),
    ("reader + key + record", reader_key_record),
    ("key + record + owner, no reader", key_owner),
    ("reader + key + record + owner", reader_key_owner),
    ("index_of, then resolve_in", resolve_by_index),
    ("resolve_for (the S3 decision)", resolve),
];

fn main() -> Result<()> {
    let fillers: usize = match std::env::args().nth(1) {
        Some(n) => n.parse().context("agents besides the chain")?,
        None => 1_000_000,
    };
    let t = Instant::now();
    let world = World::new(32, fillers, 42);
    let p = policy()?;
    let State { hierarchy, index } = load(&p, &world)?;
    let ring: Vec<(AgentId, Key, u64)> = world
        .random_ring(Scenario::S3, 1 << 16)
        .into_iter()
        .map(|(a, q)| {
            let agent = world.agents.get(a).context("agent")?;
            let record = world.records.get(q).context("record")?;
            Ok((
                AgentId::parse(&agent.id)?,
                Key::parse(&record.key)?,
                model::hot_for(&world, Scenario::S3, a, q),
            ))
        })
        .collect::<Result<_>>()?;
    for (i, (a, k, want)) in ring.iter().enumerate() {
        let got = resolve(&hierarchy, &index, a, k);
        if got != *want || resolve_by_index(&hierarchy, &index, a, k) != got {
            bail!("question {i}: {a} reading {k}: answered {got}, the model {want}");
        }
    }
    println!(
        "{} agents loaded in {:.1} s; {} answers agree with the model",
        world.agents.len(),
        t.elapsed().as_secs_f64(),
        ring.len()
    );
    let rounds = 3;
    let mut medians = vec![Vec::new(); STEPS.len()];
    for _ in 0..rounds {
        for ((_, step), out) in STEPS.iter().zip(medians.iter_mut()) {
            let mut per_call = Vec::with_capacity(BATCHES);
            let mut acc = 0u64;
            let mut at = 0usize;
            for _ in 0..BATCHES {
                let start = Instant::now();
                for _ in 0..BATCH {
                    if let Some((a, k, _)) = ring.get(at % ring.len()) {
                        acc =
                            acc.wrapping_add(step(&hierarchy, &index, black_box(a), black_box(k)));
                    }
                    at += 1;
                }
                per_call.push(start.elapsed().as_nanos() as f64 / BATCH as f64);
            }
            black_box(acc);
            per_call.sort_by(f64::total_cmp);
            out.push(
                per_call
                    .get(per_call.len() / 2)
                    .copied()
                    .unwrap_or(f64::NAN),
            );
        }
    }
    println!("\n| step | ns per call, {rounds} rounds |\n| --- | ---: |");
    for ((name, _), m) in STEPS.iter().zip(&medians) {
        let m: Vec<String> = m.iter().map(|x| format!("{x:.0}")).collect();
        println!("| {name} | {} |", m.join(", "));
    }
    Ok(())
}
