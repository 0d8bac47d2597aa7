//! Model-based tests: random sequences of operations over a small universe
//! (seven agent ids, two namespaces, two keys, a handful of capabilities,
//! labels, constructions and SOPs, so operations collide often) run against
//! the engine and against the reference model in [`reference`], on every
//! backend (MemoryStore, SQLite, and PostgreSQL when
//! `WARDEN_TEST_DATABASE_URL` is set; otherwise that test says it skipped).
//!
//! Operations: registration by the operator or an agent (capability
//! subsets, including ones the parent lacks; pre-built or spec-built
//! children), delegation from a run (inheriting its envelope), revocation,
//! agent views, memory writes (own scope and another's, with and without
//! compare-and-set, every class, secrets with grants), deletes, reads from
//! any agent, preflight, run admission, step begin and completion (with
//! reported labels, errors, memory steps), and the clock moving on.
//!
//! After every operation the test compares:
//!
//! - the outcome: status, verdict and reason, returned value with owner and
//!   revision, a combined policy's contributors, the agents a revocation
//!   took, every preflight step's violations;
//! - the capability check of every agent for every capability name;
//! - the stored state through the read APIs: every agent (parent, lineage,
//!   status, declared and effective capabilities, stored config, inherited
//!   envelope), every record at every owner, namespace and key (value,
//!   visibility, class, revision), every run's step outcomes and its
//!   envelope (labels, derived labels, restrictions, sensitivity);
//! - the decision log: exactly the entries the operation should add, in
//!   order, by operation, verdict and reason; no stored string value ever
//!   appears in it; and the chain verifies at the end of the case.
//!
//! Where the engine says more than the model, the model's part is
//! compared: a reason by its code family where the engine adds a detail
//! the model does not state (a schema violation's JSON pointer, an unknown
//! label's name); entries' details (hashes, envelope ids, transition
//! records) are not compared; an envelope's version is not compared;
//! errors by their kind (`NotFound`, `Conflict`).
//!
//! Operations are generated from plain indexes and flags, and a case's
//! seed agents from flags that shrink to "absent", so proptest shrinks a
//! failure to a short sequence of simple operations. Case counts are
//! modest by default (the in-memory store runs the most);
//! `PROPTEST_CASES=N` runs N on each backend, `MODEL_STATS=1` prints how
//! often each (operation, reason) was recorded over the in-memory run.

mod reference;

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;
use warden::{
    Admission, Caller, Completion, Engine, EngineError, ManualClock, ReadStatus, RegisterAgent,
    Registration, Revocation, StepGate, StepResult, WriteRequest, WriteStatus,
};
use warden_core::decision::Verdict;
use warden_core::ids::{ActionName, AgentId, Key, Label, Namespace, RunId, StepId};
use warden_core::memory::{Combinator, RecordClass, Visibility};
use warden_core::time::Timestamp;
use warden_store::{StepStatus, Store};

use reference::{
    AGENTS, AgentReadOutcome, BUILDS, BeginOutcome, CAPS, Class, CompleteOutcome, KEYS, LABELS,
    LADDER, Model, NAMESPACES, NOBODY, POLICY, REMOVABLE, RUN_IDS, ReadOutcome, RegOutcome, SEEDED,
    SOPS, STEP_IDS, Status, VALUES, Vis, WriteOutcome,
};

/// One operation, in indexes into the universe.
#[derive(Debug, Clone)]
enum Op {
    /// `caller` `None` is the operator.
    /// `build` indexes [`BUILDS`].
    Register {
        caller: Option<usize>,
        id: usize,
        parent: Option<usize>,
        caps: u16,
        build: usize,
    },
    /// The run's agent delegates a child that inherits the run's envelope.
    DelegateFromRun {
        run: usize,
        id: usize,
        caps: u16,
    },
    Revoke {
        caller: Option<usize>,
        target: usize,
    },
    /// `caller` (`None`: the operator) reads `target`'s view.
    ReadAgent {
        caller: Option<usize>,
        target: usize,
    },
    /// The clock moves on 1.5 s (task state expires).
    Advance,
    /// `by` declassifies run `run` to `to` (a ladder index), removing the
    /// labels of bit set `remove` over [`REMOVABLE`].
    Declassify {
        by: usize,
        run: usize,
        to: usize,
        remove: u8,
        justified: bool,
    },
    Write {
        actor: usize,
        owner: Option<usize>,
        ns: usize,
        key: usize,
        value: usize,
        expected: Option<u64>,
        visibility: Option<usize>,
        class: Option<ClassGen>,
    },
    Delete {
        actor: usize,
        owner: Option<usize>,
        ns: usize,
        key: usize,
        expected: Option<u64>,
    },
    Read {
        reader: usize,
        ns: usize,
        key: usize,
    },
    Validate {
        actor: usize,
        sop: usize,
    },
    Admit {
        actor: usize,
        sop: usize,
        run: usize,
    },
    /// `actor` `None`: the run's agent; `step` `None`: its first step
    /// without an outcome.
    Begin {
        actor: Option<usize>,
        run: usize,
        step: Option<usize>,
    },
    /// As [`Op::Begin`]; `labels` is a bit set over [`LABELS`].
    Complete {
        actor: Option<usize>,
        run: usize,
        step: Option<usize>,
        labels: u8,
        error: bool,
    },
}

#[derive(Debug, Clone)]
enum ClassGen {
    Preference,
    Policy(usize),
    /// Grants as a bit set over the agents; bit 7 is an id nobody has.
    Secret(u8),
    /// Expiry in seconds from now, or none.
    Task(Option<u8>),
}

const COMBINATORS: [&str; 5] = ["all", "any", "min", "max", "intersection"];
const VISIBILITIES: [Vis; 3] = [Vis::Private, Vis::Children, Vis::Descendants];

/// An SOP to admit: mostly one whose steps the gate and the envelope
/// decide (no memory steps, nothing preflight always refuses).
fn runnable_sop() -> impl Strategy<Value = usize> {
    prop_oneof![3 => prop::sample::select(vec![0usize, 1, 8, 9]), 1 => 0..SOPS.len()]
}

/// A namespace or key index: mostly the first, so records collide.
fn slot() -> impl Strategy<Value = usize> {
    prop_oneof![3 => Just(0usize), 1 => Just(1)]
}

/// Reported labels: usually known ones, sometimes the unknown one.
fn labels() -> impl Strategy<Value = u8> {
    prop_oneof![4 => 0u8..16, 1 => 0u8..32]
}

/// How a registered agent is built: mostly plainly, else any of [`BUILDS`].
fn build() -> impl Strategy<Value = usize> {
    prop_oneof![2 => Just(0usize), 1 => 0..BUILDS.len()]
}

/// A writer: mostly among the first seeded agents (roots and parents, since
/// agent `i`'s parent is an earlier one).
fn writer() -> impl Strategy<Value = usize> {
    prop_oneof![2 => 0..3usize, 1 => agent_ix()]
}

/// A reader: mostly among the later seeded agents (deeper in the forest).
fn reader() -> impl Strategy<Value = usize> {
    prop_oneof![2 => 2..SEEDED, 1 => agent_ix()]
}

fn agent_ix() -> impl Strategy<Value = usize> {
    0..AGENTS.len()
}

fn op() -> impl Strategy<Value = Op> {
    let register = prop_oneof![
        // The operator: a root, or a child of anyone.
        (agent_ix(), prop::option::of(agent_ix()), caps(), build()).prop_map(
            |(id, parent, caps, build)| Op::Register {
                caller: None,
                id,
                parent,
                caps,
                build,
            }
        ),
        // Delegation: an agent registers its own child.
        (agent_ix(), agent_ix(), caps(), build()).prop_map(|(id, p, caps, build)| {
            Op::Register {
                caller: Some(p),
                id,
                parent: Some(p),
                caps,
                build,
            }
        }),
        // An agent registering someone else's child.
        (
            agent_ix(),
            agent_ix(),
            prop::option::of(agent_ix()),
            caps(),
            build()
        )
            .prop_map(|(id, c, parent, caps, build)| Op::Register {
                caller: Some(c),
                id,
                parent,
                caps,
                build,
            }),
    ];
    let class = prop_oneof![
        1 => Just(ClassGen::Preference),
        3 => (0..COMBINATORS.len()).prop_map(ClassGen::Policy),
        2 => any::<u8>().prop_map(ClassGen::Secret),
        1 => prop::option::of(0u8..3).prop_map(ClassGen::Task),
    ];
    let write = (
        writer(),
        prop::option::weighted(0.2, agent_ix()),
        slot(),
        slot(),
        0..VALUES.len(),
        prop::option::weighted(0.4, 0u64..4),
        prop::option::weighted(
            0.7,
            prop_oneof![1 => Just(0usize), 1 => Just(1), 3 => Just(2)],
        ),
        prop::option::weighted(0.6, class),
        prop::bool::weighted(0.7),
    )
        .prop_map(
            |(actor, owner, ns, key, value, expected, visibility, class, fit)| {
                // Mostly a record its class accepts: a value the
                // combinator takes, a secret or task kept private.
                let (value, visibility) = match (&class, fit) {
                    (Some(ClassGen::Policy(c)), true) => {
                        (2 * (c / 2).min(2) + value % 2, visibility)
                    }
                    (Some(ClassGen::Secret(_) | ClassGen::Task(_)), true) => {
                        (value, visibility.filter(|v| *v == 0))
                    }
                    _ => (value, visibility),
                };
                Op::Write {
                    actor,
                    owner,
                    ns,
                    key,
                    value,
                    expected,
                    visibility,
                    class,
                }
            },
        );
    prop_oneof![
        3 => register,
        1 => (prop::option::of(agent_ix()), agent_ix())
            .prop_map(|(caller, target)| Op::ReadAgent { caller, target }),
        1 => Just(Op::Advance),
        2 => (
            prop_oneof![3 => Just(0usize), 1 => agent_ix()],
            0..RUN_IDS.len(),
            0..LADDER.len(),
            0u8..64,
            prop::bool::weighted(0.9),
        )
            .prop_map(|(by, run, to, remove, justified)| Op::Declassify {
                by,
                run,
                to,
                remove,
                justified
            }),
        1 => (prop::option::of(agent_ix()), agent_ix())
            .prop_map(|(caller, target)| Op::Revoke { caller, target }),
        2 => (0..RUN_IDS.len(), agent_ix(), caps())
            .prop_map(|(run, id, caps)| Op::DelegateFromRun { run, id, caps }),
        8 => write,
        1 => (
            agent_ix(),
            prop::option::weighted(0.2, agent_ix()),
            slot(),
            slot(),
            prop::option::of(0u64..4),
        )
            .prop_map(|(actor, owner, ns, key, expected)| Op::Delete {
                actor,
                owner,
                ns,
                key,
                expected
            }),
        5 => (reader(), slot(), slot())
            .prop_map(|(reader, ns, key)| Op::Read { reader, ns, key }),
        1 => (agent_ix(), 0..SOPS.len()).prop_map(|(actor, sop)| Op::Validate { actor, sop }),
        3 => (agent_ix(), runnable_sop(), 0..RUN_IDS.len())
            .prop_map(|(actor, sop, run)| Op::Admit { actor, sop, run }),
        6 => (prop::option::weighted(0.15, agent_ix()), 0..RUN_IDS.len(), prop::option::weighted(0.3, 0..STEP_IDS.len()))
            .prop_map(|(actor, run, step)| Op::Begin { actor, run, step }),
        6 => (
            prop::option::weighted(0.15, agent_ix()),
            0..RUN_IDS.len(),
            prop::option::weighted(0.3, 0..STEP_IDS.len()),
            labels(),
            prop::bool::weighted(0.1),
        )
            .prop_map(|(actor, run, step, labels, error)| Op::Complete {
                actor,
                run,
                step,
                labels,
                error
            }),
    ]
}

/// Declared capabilities: often all of them, so that runs get admitted.
fn caps() -> impl Strategy<Value = u16> {
    prop_oneof![
        2 => Just((1u16 << CAPS.len()) - 1),
        1 => (0u16..512).prop_map(|m| m | 0b11),
        1 => 0u16..512,
    ]
}

/// A sequence: a forest over the universe first (agent `i` a root or the
/// child of an earlier one, registered by the operator or delegated by its
/// parent), so that most operations meet agents that exist, then the
/// random operations.
fn ops() -> impl Strategy<Value = Vec<Op>> {
    let setup = prop::collection::vec(
        (
            any::<prop::sample::Index>(),
            prop::bool::weighted(0.7),
            caps(),
            any::<bool>(),
            // Shrinks to false: a minimal case registers only the agents
            // it needs.
            prop::bool::weighted(0.9),
        ),
        SEEDED,
    )
    .prop_map(|agents| {
        agents
            .into_iter()
            .enumerate()
            .filter(|(_, (.., present))| *present)
            .map(|(id, (pick, child, caps, delegated, _))| {
                let parent = (child && id > 0).then(|| pick.index(id));
                Op::Register {
                    caller: if delegated { parent } else { None },
                    id,
                    parent,
                    caps,
                    build: 0,
                }
            })
            .collect::<Vec<_>>()
    });
    (setup, prop::collection::vec(op(), 1..48)).prop_map(|(mut setup, ops)| {
        setup.extend(ops);
        setup
    })
}

// ----------------------------------------------------------------------
// Conversions between the universe's indexes and engine values
// ----------------------------------------------------------------------

fn aid(i: usize) -> AgentId {
    AgentId::parse(AGENTS[i]).unwrap()
}

fn caps_of(mask: u16) -> BTreeSet<String> {
    CAPS.iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, c)| c.to_string())
        .collect()
}

fn grants_of(mask: u8) -> Vec<String> {
    let mut out: Vec<String> = AGENTS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, a)| a.to_string())
        .collect();
    if mask & (1 << AGENTS.len()) != 0 {
        out.push(NOBODY.into());
    }
    out
}

fn model_class(c: &ClassGen, now: i64) -> Class {
    match c {
        ClassGen::Preference => Class::Preference,
        ClassGen::Policy(i) => Class::Policy(COMBINATORS[*i]),
        ClassGen::Secret(m) => Class::Secret(grants_of(*m)),
        ClassGen::Task(s) => Class::Task(s.map(|s| now + 1000 * i64::from(s))),
    }
}

fn engine_class(c: &Class) -> RecordClass {
    match c {
        Class::Preference => RecordClass::Preference,
        Class::Policy(name) => RecordClass::Policy {
            combine: match *name {
                "all" => Combinator::All,
                "any" => Combinator::Any,
                "min" => Combinator::Min,
                "max" => Combinator::Max,
                _ => Combinator::Intersection,
            },
        },
        Class::Secret(grants) => RecordClass::Secret {
            grants: grants.iter().map(|g| AgentId::parse(g).unwrap()).collect(),
        },
        Class::Task(t) => RecordClass::Task {
            expires_at: t.map(|t| Timestamp(START + t)),
        },
    }
}

fn engine_vis(v: Vis) -> Visibility {
    match v {
        Vis::Private => Visibility::Private,
        Vis::Children => Visibility::Children,
        Vis::Descendants => Visibility::Descendants,
    }
}

fn kind(reason: &str) -> &str {
    reason.split_once(':').map_or(reason, |(k, _)| k)
}

macro_rules! check {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!($($fmt)*));
        }
    };
}

macro_rules! check_eq {
    ($left:expr, $right:expr, $($fmt:tt)*) => {
        match (&$left, &$right) {
            (l, r) => {
                if l != r {
                    return Err(format!("{}: engine {:?}, model {:?}", format!($($fmt)*), l, r));
                }
            }
        }
    };
}

/// An expected audit entry: operation, verdict, and the reason (exactly,
/// by its code family when it ends in `:*`, or not compared when `None`).
#[derive(Debug, Clone)]
struct Entry {
    op: &'static str,
    verdict: Verdict,
    reason: Option<String>,
}

fn entry(op: &'static str, verdict: Verdict, reason: &str) -> Entry {
    Entry {
        op,
        verdict,
        reason: Some(reason.to_string()),
    }
}

// ----------------------------------------------------------------------
// The driver
// ----------------------------------------------------------------------

/// With `MODEL_STATS` set: how often each (operation, reason code) was
/// recorded, printed after the in-memory run (how much the cases cover).
static STATS: std::sync::Mutex<std::collections::BTreeMap<String, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// The engine and the model side by side.
struct Pair<S> {
    engine: Engine<S>,
    clock: Arc<ManualClock>,
    model: Model,
}

/// How far [`Op::Advance`] moves the clock.
const ADVANCE_MS: i64 = 1500;

impl<S: Store> Pair<S> {
    async fn audit_count(&self) -> u64 {
        self.engine.audit_head().await.unwrap().count
    }

    /// Apply `op` to both; compare outcomes and the entries it recorded.
    async fn step(&mut self, op: &Op) -> Result<(), String> {
        let before = self.audit_count().await;
        let expected = self.apply(op).await?;
        let entries = self.engine.audit_page(before, usize::MAX).await.unwrap();
        let got: Vec<(String, Verdict, String)> = entries
            .iter()
            .map(|e| {
                (
                    e.draft.operation.clone(),
                    e.draft.verdict,
                    e.draft.reason.clone(),
                )
            })
            .collect();
        let matches = got.len() == expected.len()
            && got.iter().zip(&expected).all(|((op, v, r), e)| {
                op == e.op
                    && *v == e.verdict
                    && e.reason
                        .as_ref()
                        .is_none_or(|want| match want.strip_suffix(":*") {
                            Some(family) => kind(r) == family,
                            None => r == want,
                        })
            });
        check!(
            matches,
            "{op:?}: recorded entries {got:?}, model expects {expected:?}"
        );
        if std::env::var_os("MODEL_STATS").is_some() {
            let mut stats = STATS.lock().unwrap();
            for (op, _, reason) in &got {
                *stats.entry(format!("{op} {}", kind(reason))).or_default() += 1;
            }
        }
        for e in &entries {
            let text = serde_json::to_string(e).unwrap();
            check!(
                !text.contains("sv-"),
                "{op:?}: a stored value reached the log: {text}"
            );
        }
        self.compare_state()
            .await
            .map_err(|e| format!("after {op:?}: {e}"))
    }

    async fn apply(&mut self, op: &Op) -> Result<Vec<Entry>, String> {
        let e = &self.engine;
        let m = &mut self.model;
        Ok(match op {
            Op::Register {
                caller,
                id,
                parent,
                caps,
                build,
            } => register(e, m, op, *caller, *id, *parent, *caps, None, BUILDS[*build]).await?,
            Op::DelegateFromRun { run, id, caps } => {
                let (parent, _) = m.resolve_step(None, *run, None);
                let run = Some(RUN_IDS[*run]);
                register(
                    e,
                    m,
                    op,
                    Some(parent),
                    *id,
                    Some(parent),
                    *caps,
                    run,
                    BUILDS[0],
                )
                .await?
            }
            Op::Declassify {
                by,
                run,
                to,
                remove,
                justified,
            } => {
                let names: Vec<&str> = REMOVABLE
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| remove & (1 << i) != 0)
                    .map(|(_, l)| *l)
                    .collect();
                let level: warden_core::envelope::Sensitivity =
                    serde_json::from_value(Value::from(LADDER[*to])).unwrap();
                let got = e
                    .declassify(
                        &aid(*by),
                        &RunId::parse(RUN_IDS[*run]).unwrap(),
                        level,
                        &names
                            .iter()
                            .map(|l| Label::parse(l).unwrap())
                            .collect::<Vec<_>>(),
                        if *justified { "reviewed" } else { " " },
                    )
                    .await;
                let want = m.declassify(AGENTS[*by], RUN_IDS[*run], *to, &names, *justified);
                match (got, want) {
                    (Err(EngineError::NotFound { .. }), Err(())) => vec![],
                    (Ok(out), Ok(Ok(()))) => {
                        check_eq!(out.decision.verdict, Verdict::Allow, "{op:?}");
                        vec![entry("context.declassify", Verdict::Allow, "declassified")]
                    }
                    (Ok(out), Ok(Err(reason))) => {
                        check_eq!(out.decision.reason.as_str(), reason, "{op:?}");
                        vec![entry("context.declassify", Verdict::Deny, reason)]
                    }
                    (got, want) => return Err(format!("{op:?}: engine {got:?}, model {want:?}")),
                }
            }
            Op::Advance => {
                self.clock.advance(ADVANCE_MS);
                m.now += ADVANCE_MS;
                vec![]
            }
            Op::ReadAgent { caller, target } => {
                let who = caller.map_or(Caller::Operator, |c| Caller::Agent(aid(c)));
                let got = e.read_agent(&who, &aid(*target)).await;
                let want = m.read_agent(caller.map(|c| AGENTS[c]), AGENTS[*target]);
                match (got, want) {
                    (Err(EngineError::NotFound { .. }), AgentReadOutcome::Missing) => {
                        vec![entry("agent.read", Verdict::Allow, "unknown_agent")]
                    }
                    (
                        Ok(warden::AgentRead::Visible { agent, decision }),
                        AgentReadOutcome::Visible(r),
                    ) => {
                        check_eq!(decision.reason.as_str(), r, "{op:?}");
                        check_eq!(agent.agent_id.as_str(), AGENTS[*target], "{op:?}");
                        vec![entry("agent.read", Verdict::Allow, r)]
                    }
                    (Ok(warden::AgentRead::Hidden { decision }), AgentReadOutcome::Hidden(r)) => {
                        check_eq!(decision.reason.as_str(), r, "{op:?}");
                        vec![entry("agent.read", Verdict::Deny, r)]
                    }
                    (got, want) => return Err(format!("{op:?}: engine {got:?}, model {want:?}")),
                }
            }
            Op::Revoke { caller, target } => {
                let who = caller.map_or(Caller::Operator, |c| Caller::Agent(aid(c)));
                let got = e.revoke_agent(&who, &aid(*target)).await;
                let want = m.revoke(caller.map(|c| AGENTS[c]), AGENTS[*target]);
                match (got, want) {
                    (Err(EngineError::NotFound { .. }), Err(())) => vec![],
                    (Ok(Revocation::Refused { decision }), Ok(None)) => {
                        check_eq!(decision.reason.as_str(), "not_an_ancestor", "{op:?}");
                        vec![entry("agent.revoke", Verdict::Deny, "not_an_ancestor")]
                    }
                    (Ok(Revocation::Revoked { agents, .. }), Ok(Some(subtree))) => {
                        let agents: BTreeSet<String> =
                            agents.iter().map(|a| a.to_string()).collect();
                        check_eq!(agents, subtree, "{op:?}: revoked");
                        vec![entry("agent.revoke", Verdict::Allow, "revoked")]
                    }
                    (got, want) => return Err(format!("{op:?}: engine {got:?}, model {want:?}")),
                }
            }
            Op::Write {
                actor,
                owner,
                ns,
                key,
                value,
                expected,
                visibility,
                class,
            } => {
                let class = class.as_ref().map(|c| model_class(c, m.now));
                let visibility = visibility.map(|v| VISIBILITIES[v]);
                let value = VALUES[*value]();
                let req = WriteRequest {
                    namespace: Namespace::parse(NAMESPACES[*ns]).unwrap(),
                    key: Key::parse(KEYS[*key]).unwrap(),
                    value: value.clone(),
                    owner_agent_id: owner.map(aid),
                    expected_revision: *expected,
                    visibility: visibility.map(engine_vis),
                    class: class.as_ref().map(engine_class),
                };
                let got = e
                    .write(&aid(*actor), req)
                    .await
                    .map_err(|e| format!("{op:?}: {e}"))?;
                let want = m.write(
                    AGENTS[*actor],
                    owner.map(|o| AGENTS[o]),
                    NAMESPACES[*ns],
                    KEYS[*key],
                    value,
                    *expected,
                    visibility,
                    class,
                );
                let reason = got.decision.reason.as_str().to_string();
                match (&got.status, &want) {
                    (WriteStatus::Done, WriteOutcome::Done(rev)) => {
                        check_eq!(
                            got.record.as_ref().map(|r| r.revision),
                            Some(*rev),
                            "{op:?}"
                        );
                        vec![entry("memory.write", Verdict::Allow, "owner_write")]
                    }
                    (WriteStatus::Conflict, WriteOutcome::Conflict(current)) => {
                        check_eq!(got.current_revision, *current, "{op:?}");
                        vec![entry("memory.write", Verdict::Deny, "revision_conflict")]
                    }
                    (WriteStatus::Denied, WriteOutcome::Denied(r)) => {
                        check_eq!(reason.as_str(), *r, "{op:?}");
                        vec![entry("memory.write", Verdict::Deny, r)]
                    }
                    (WriteStatus::InvalidRecord, WriteOutcome::Invalid(p)) => {
                        let want = format!("invalid_record:{p}");
                        check_eq!(reason, want, "{op:?}");
                        vec![entry("memory.write", Verdict::Deny, &want)]
                    }
                    _ => return Err(format!("{op:?}: engine {got:?}, model {want:?}")),
                }
            }
            Op::Delete {
                actor,
                owner,
                ns,
                key,
                expected,
            } => {
                let got = e
                    .delete(
                        &aid(*actor),
                        owner.map(aid),
                        Namespace::parse(NAMESPACES[*ns]).unwrap(),
                        Key::parse(KEYS[*key]).unwrap(),
                        *expected,
                    )
                    .await
                    .map_err(|e| format!("{op:?}: {e}"))?;
                let want = m.delete(
                    AGENTS[*actor],
                    owner.map(|o| AGENTS[o]),
                    NAMESPACES[*ns],
                    KEYS[*key],
                    *expected,
                );
                let reason = got.decision.reason.as_str().to_string();
                match (&got.status, &want) {
                    (WriteStatus::Done, WriteOutcome::Done(rev)) => {
                        check_eq!(got.revision, Some(*rev), "{op:?}");
                        vec![entry("memory.delete", Verdict::Allow, "owner_delete")]
                    }
                    (WriteStatus::Conflict, WriteOutcome::Conflict(current)) => {
                        check_eq!(got.current_revision, *current, "{op:?}");
                        vec![entry("memory.delete", Verdict::Deny, "revision_conflict")]
                    }
                    (WriteStatus::NotFound, WriteOutcome::NotFound) => {
                        vec![entry("memory.delete", Verdict::Deny, "record_not_found")]
                    }
                    (WriteStatus::Denied, WriteOutcome::Denied(r)) => {
                        check_eq!(reason.as_str(), *r, "{op:?}");
                        vec![entry("memory.delete", Verdict::Deny, r)]
                    }
                    _ => return Err(format!("{op:?}: engine {got:?}, model {want:?}")),
                }
            }
            Op::Read { reader, ns, key } => {
                let got = e
                    .read(
                        &aid(*reader),
                        &Namespace::parse(NAMESPACES[*ns]).unwrap(),
                        &Key::parse(KEYS[*key]).unwrap(),
                    )
                    .await
                    .map_err(|e| format!("{op:?}: {e}"))?;
                let want = m.read(AGENTS[*reader], NAMESPACES[*ns], KEYS[*key]);
                let reason = got.decision.reason.as_str().to_string();
                match (&got.status, &want) {
                    (
                        ReadStatus::Found,
                        ReadOutcome::Found {
                            reason: r,
                            value,
                            owner,
                            revision,
                            contributors,
                        },
                    ) => {
                        check_eq!(&reason, r, "{op:?}: reason");
                        let v = got.value.as_ref().unwrap();
                        check_eq!(&v.value, value, "{op:?}: value");
                        check_eq!(v.owner_agent_id.as_str(), owner.as_str(), "{op:?}: owner");
                        check_eq!(v.revision, *revision, "{op:?}: revision");
                        let c: Vec<String> = v
                            .contributors
                            .iter()
                            .map(|c| c.owner_agent_id.to_string())
                            .collect();
                        check_eq!(&c, contributors, "{op:?}: contributors");
                        vec![entry("memory.read", Verdict::Allow, r)]
                    }
                    (ReadStatus::Hidden, ReadOutcome::Hidden(r))
                    | (ReadStatus::Denied, ReadOutcome::Denied(r)) => {
                        check_eq!(&reason, r, "{op:?}: reason");
                        check!(got.value.is_none(), "{op:?}: a value with a refusal");
                        vec![entry("memory.read", Verdict::Deny, r)]
                    }
                    _ => return Err(format!("{op:?}: engine {got:?}, model {want:?}")),
                }
            }
            Op::Validate { actor, sop } => {
                let parsed = parse_sop(e, *sop);
                let got = e
                    .validate_sop(&aid(*actor), &parsed)
                    .await
                    .map_err(|e| format!("{op:?}: {e}"))?;
                let want = m.preflight(AGENTS[*actor], *sop);
                compare_preflight(op, &got, &want)?;
                step_entries(&want)
            }
            Op::Admit { actor, sop, run } => {
                let inherits = m
                    .agents
                    .get(AGENTS[*actor])
                    .is_some_and(|a| a.envelope.is_some());
                let parsed = parse_sop(e, *sop);
                let got = e
                    .admit_run(
                        &aid(*actor),
                        &parsed,
                        Some(RunId::parse(RUN_IDS[*run]).unwrap()),
                    )
                    .await;
                let want = m.admit(AGENTS[*actor], *sop, RUN_IDS[*run]);
                match (got, want) {
                    (Err(EngineError::Conflict { .. }), Err(())) => vec![],
                    (Ok(Admission::Rejected(pf)), Ok((v, false))) => {
                        compare_preflight(op, &pf, &v)?;
                        check!(v.iter().any(|s| !s.is_empty()), "{op:?}: model admits");
                        let mut out = step_entries(&v);
                        out.push(entry("run.admit", Verdict::Deny, "run_rejected"));
                        out
                    }
                    (
                        Ok(Admission::Admitted {
                            existing,
                            preflight,
                            ..
                        }),
                        Ok((v, created)),
                    ) => {
                        compare_preflight(op, &preflight, &v)?;
                        check_eq!(existing, !created, "{op:?}: existing");
                        if created {
                            let mut out = step_entries(&v);
                            out.push(entry("run.admit", Verdict::Allow, "run_admitted"));
                            // A root envelope, or one delegated from the
                            // agent's inherited envelope.
                            let reason = if inherits {
                                "context_delegated"
                            } else {
                                "context_created"
                            };
                            out.push(entry("context.open", Verdict::Allow, reason));
                            out
                        } else {
                            vec![]
                        }
                    }
                    (got, want) => return Err(format!("{op:?}: engine {got:?}, model {want:?}")),
                }
            }
            Op::Begin { actor, run, step } => {
                let (actor, step) = m.resolve_step(*actor, *run, *step);
                let (actor, step) = (&actor, &step);
                let got = e
                    .begin_step(
                        &aid(*actor),
                        &RunId::parse(RUN_IDS[*run]).unwrap(),
                        &StepId::parse(STEP_IDS[*step]).unwrap(),
                    )
                    .await;
                let want = m.begin(AGENTS[*actor], RUN_IDS[*run], STEP_IDS[*step]);
                let d = |o: &StepGate| match o {
                    StepGate::Proceed { decision, .. }
                    | StepGate::Executed { decision, .. }
                    | StepGate::Replay { decision, .. }
                    | StepGate::Refused { decision, .. }
                    | StepGate::InProgress { decision, .. }
                    | StepGate::Escalated { decision, .. } => decision.clone(),
                };
                match (got, &want) {
                    (Err(EngineError::NotFound { .. }), BeginOutcome::NotFound) => vec![],
                    (Ok(g @ StepGate::Replay { .. }), BeginOutcome::Replay) => {
                        check_eq!(d(&g).reason.as_str(), "step_replayed", "{op:?}");
                        vec![entry("step.begin", Verdict::Allow, "step_replayed")]
                    }
                    (Ok(g @ StepGate::InProgress { .. }), BeginOutcome::InProgress) => {
                        check_eq!(d(&g).reason.as_str(), "step_in_progress", "{op:?}");
                        vec![entry("step.begin", Verdict::Deny, "step_in_progress")]
                    }
                    (Ok(g @ StepGate::Refused { .. }), BeginOutcome::RunStopped) => {
                        check_eq!(d(&g).reason.as_str(), "run_stopped", "{op:?}");
                        vec![entry("step.begin", Verdict::Deny, "run_stopped")]
                    }
                    (Ok(g @ StepGate::Refused { .. }), BeginOutcome::OutOfOrder) => {
                        check_eq!(d(&g).reason.as_str(), "step_out_of_order", "{op:?}");
                        vec![entry("step.begin", Verdict::Deny, "step_out_of_order")]
                    }
                    (Ok(g @ StepGate::Refused { .. }), BeginOutcome::Denied(r)) => {
                        check_eq!(d(&g).reason.as_str(), r.as_str(), "{op:?}");
                        vec![entry("step.begin", Verdict::Deny, r)]
                    }
                    (
                        Ok(g @ StepGate::Executed { .. }),
                        BeginOutcome::Executed {
                            constrained,
                            memory,
                            status: st,
                        },
                    ) => {
                        let (verdict, reason) = if *constrained {
                            (Verdict::Constrain, "context_constrained")
                        } else {
                            (Verdict::Allow, "step_allowed")
                        };
                        check_eq!(d(&g).verdict, verdict, "{op:?}");
                        let StepGate::Executed { outcome, .. } = &g else {
                            unreachable!()
                        };
                        check_eq!(status(outcome.status), *st, "{op:?}: outcome");
                        let mut out = vec![entry("step.begin", verdict, reason)];
                        out.push(memory_entry(memory));
                        out.push(entry(
                            "context.accumulate",
                            Verdict::Allow,
                            "context_accumulated",
                        ));
                        out.push(match st {
                            Status::Completed => {
                                entry("step.complete", Verdict::Allow, "step_recorded")
                            }
                            _ => entry("step.complete", Verdict::Deny, "step_failed"),
                        });
                        out
                    }
                    (Ok(g @ StepGate::Proceed { .. }), BeginOutcome::Proceed(constrained)) => {
                        let (verdict, reason) = if *constrained {
                            (Verdict::Constrain, "context_constrained")
                        } else {
                            (Verdict::Allow, "step_allowed")
                        };
                        check_eq!(d(&g).verdict, verdict, "{op:?}");
                        check_eq!(d(&g).reason.as_str(), reason, "{op:?}");
                        vec![entry("step.begin", verdict, reason)]
                    }
                    (got, want) => return Err(format!("{op:?}: engine {got:?}, model {want:?}")),
                }
            }
            Op::Complete {
                actor,
                run,
                step,
                labels,
                error,
            } => {
                let (actor, step) = m.resolve_step(*actor, *run, *step);
                let (actor, step) = (&actor, &step);
                if m.runs
                    .get(RUN_IDS[*run])
                    .is_some_and(|r| r.agent == AGENTS[*actor] && r.stale.contains(STEP_IDS[*step]))
                {
                    // The known defect: skipped, not completed.
                    return Ok(vec![]);
                }
                let names: Vec<&str> = LABELS
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| labels & (1 << i) != 0)
                    .map(|(_, l)| *l)
                    .collect();
                let result = StepResult {
                    result: None,
                    result_labels: names.iter().map(|l| Label::parse(l).unwrap()).collect(),
                    error: error.then(|| "handler failed".to_string()),
                };
                let got = e
                    .complete_begun_step(
                        &aid(*actor),
                        &RunId::parse(RUN_IDS[*run]).unwrap(),
                        &StepId::parse(STEP_IDS[*step]).unwrap(),
                        result,
                    )
                    .await;
                let want = m.complete(
                    AGENTS[*actor],
                    RUN_IDS[*run],
                    STEP_IDS[*step],
                    &names,
                    *error,
                );
                match (got, &want) {
                    (Err(EngineError::NotFound { .. }), CompleteOutcome::NotFound) => vec![],
                    (Ok(Completion::NotBegun), CompleteOutcome::NotBegun) => vec![],
                    (Ok(Completion::Recorded(o)), CompleteOutcome::Existing(s)) => {
                        check_eq!(status(o.status), *s, "{op:?}");
                        vec![]
                    }
                    (Ok(Completion::Recorded(o)), CompleteOutcome::Recorded(s, folded)) => {
                        check_eq!(status(o.status), *s, "{op:?}");
                        let mut out = Vec::new();
                        if *folded {
                            out.push(entry(
                                "context.accumulate",
                                Verdict::Allow,
                                "context_accumulated",
                            ));
                        }
                        out.push(match s {
                            Status::Completed => {
                                entry("step.complete", Verdict::Allow, "step_recorded")
                            }
                            // Failed: by the handler's error, or by a label
                            // the bundle does not know (nothing folded).
                            _ if *folded => entry("step.complete", Verdict::Deny, "step_failed"),
                            _ => entry("step.complete", Verdict::Deny, "unknown_label:*"),
                        });
                        out
                    }
                    (got, want) => return Err(format!("{op:?}: engine {got:?}, model {want:?}")),
                }
            }
        })
    }

    /// Compare everything stored with the model.
    async fn compare_state(&self) -> Result<(), String> {
        let m = &self.model;
        for a in AGENTS {
            let got = self.engine.agent(&AgentId::parse(a).unwrap());
            let Some(want) = m.agents.get(a) else {
                check!(
                    matches!(got, Err(EngineError::NotFound { .. })),
                    "agent {a}: engine {got:?}, model has none"
                );
                continue;
            };
            let got = got.map_err(|e| format!("agent {a}: {e}"))?;
            check_eq!(
                got.parent_id.as_ref().map(|p| p.to_string()),
                want.parent,
                "agent {a}: parent"
            );
            let lineage: Vec<String> = got.lineage.iter().map(|x| x.to_string()).collect();
            check_eq!(lineage, m.lineage(a), "agent {a}: lineage");
            check_eq!(
                got.status == warden_core::hierarchy::AgentStatus::Active,
                want.active,
                "agent {a}: active"
            );
            let declared: BTreeSet<String> = got
                .declared_capabilities
                .iter()
                .map(|c| c.to_string())
                .collect();
            check_eq!(declared, want.declared, "agent {a}: declared");
            check_eq!(got.config, want.config, "agent {a}: config");
            match (&got.envelope_id, &want.envelope) {
                (None, None) => {}
                (Some(id), Some(env)) => {
                    let stored = self.engine.envelope(id, None).await.unwrap();
                    let stored = stored.ok_or_else(|| format!("agent {a}: no envelope {id}"))?;
                    compare_envelope(&stored, env).map_err(|e| format!("agent {a}: {e}"))?;
                }
                (g, w) => return Err(format!("agent {a}: envelope: engine {g:?}, model {w:?}")),
            }
            if want.active {
                let effective: BTreeSet<String> = got
                    .effective_capabilities
                    .iter()
                    .map(|c| c.to_string())
                    .collect();
                check_eq!(effective, m.effective(a), "agent {a}: effective");
            }
        }
        for a in AGENTS {
            for c in CAPS {
                let d = self
                    .engine
                    .check_capability(&AgentId::parse(a).unwrap(), c)
                    .map_err(|e| e.to_string())?;
                check_eq!(d.reason.as_str(), m.capability(a, c), "capability {a} {c}");
            }
        }
        let owners: Vec<AgentId> = AGENTS.iter().map(|a| AgentId::parse(a).unwrap()).collect();
        for ns in NAMESPACES {
            for key in KEYS {
                let stored = self
                    .engine
                    .store()
                    .get_records(
                        Namespace::parse(ns).unwrap(),
                        Key::parse(key).unwrap(),
                        owners.clone(),
                    )
                    .await
                    .unwrap();
                for a in AGENTS {
                    let got = stored.iter().find(|r| r.owner.as_str() == a);
                    let want = m
                        .records
                        .get(&(a.to_string(), ns.to_string(), key.to_string()));
                    match (got, want) {
                        (None, None) => {}
                        (Some(g), Some(w)) => {
                            let place = format!("record {a}:{ns}.{key}");
                            check_eq!(g.value, w.value, "{place}: value");
                            check_eq!(
                                g.visibility,
                                engine_vis(w.visibility),
                                "{place}: visibility"
                            );
                            check_eq!(g.class, engine_class(&w.class), "{place}: class");
                            check_eq!(g.revision, w.revision, "{place}: revision");
                        }
                        (g, w) => {
                            return Err(format!(
                                "record {a}:{ns}.{key}: engine {g:?}, model {w:?}"
                            ));
                        }
                    }
                }
            }
        }
        for run in RUN_IDS {
            let rid = RunId::parse(run).unwrap();
            let got = self.engine.store().get_run(rid.clone()).await.unwrap();
            let Some(want) = m.runs.get(run) else {
                check!(got.is_none(), "run {run}: engine has one, model none");
                continue;
            };
            let got = got.ok_or_else(|| format!("run {run}: model has one, engine none"))?;
            check_eq!(
                got.run.agent.as_str(),
                want.agent.as_str(),
                "run {run}: agent"
            );
            let outcomes: Vec<(String, Status)> = got
                .outcomes
                .iter()
                .map(|(s, o)| (s.to_string(), status(o.status)))
                .collect();
            let want_outcomes: Vec<(String, Status)> =
                want.outcomes.iter().map(|(s, o)| (s.clone(), *o)).collect();
            check_eq!(outcomes, want_outcomes, "run {run}: outcomes");
            let env = self
                .engine
                .run_envelope(&rid)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("run {run}: no envelope"))?;
            compare_envelope(&env, &want.envelope).map_err(|e| format!("run {run}: {e}"))?;
        }
        Ok(())
    }
}

fn compare_envelope(
    got: &warden_core::envelope::EnvelopeRecord,
    want: &reference::Envelope,
) -> Result<(), String> {
    let names =
        |s: &BTreeSet<Label>| -> BTreeSet<String> { s.iter().map(|l| l.to_string()).collect() };
    check_eq!(names(&got.labels), want.labels, "labels");
    check_eq!(names(&got.derived), want.derived, "derived");
    check_eq!(names(&got.restrictions), want.restrictions, "restrictions");
    check_eq!(
        serde_json::to_value(got.aggregate_sensitivity).unwrap(),
        Value::from(LADDER[want.sensitivity]),
        "sensitivity"
    );
    Ok(())
}

/// A registration on both sides (`from_run`: the child inherits that
/// run's envelope).
#[allow(clippy::too_many_arguments)]
async fn register<S: Store>(
    e: &Engine<S>,
    m: &mut Model,
    op: &Op,
    caller: Option<usize>,
    id: usize,
    parent: Option<usize>,
    caps: u16,
    from_run: Option<&str>,
    build: reference::Build,
) -> Result<Vec<Entry>, String> {
    let declared = caps_of(caps);
    let req = RegisterAgent {
        id: aid(id),
        parent: parent.map(aid),
        capabilities: declared
            .iter()
            .map(|c| ActionName::parse(c).unwrap())
            .collect(),
        tools: build.0.map(|t| t.iter().map(|s| s.to_string()).collect()),
        config: build.1(),
    };
    let who = caller.map_or(Caller::Operator, |c| Caller::Agent(aid(c)));
    let options = warden::DelegationOptions {
        from_run: from_run.map(|r| RunId::parse(r).unwrap()),
        ..warden::DelegationOptions::default()
    };
    let got = e.register_agent_with(&who, req, options).await;
    let want = m.register(
        caller.map(|c| AGENTS[c]),
        AGENTS[id],
        parent.map(|p| AGENTS[p]),
        declared,
        from_run,
        build,
    );
    Ok(match (got, &want) {
        (Err(EngineError::NotFound { .. }), Err(())) => vec![],
        (
            Ok(Registration::Registered { decision, .. }),
            Ok(RegOutcome::Registered {
                sanitised,
                narrowed,
                inherited,
            }),
        ) => {
            let verdict = if *inherited == Some(true) {
                Verdict::Constrain
            } else {
                Verdict::Allow
            };
            check_eq!(decision.verdict, verdict, "{op:?}");
            let mut out = Vec::new();
            if *sanitised {
                out.push(entry(
                    "agent.register",
                    Verdict::Constrain,
                    "child_self_edit_sanitised",
                ));
            }
            if *narrowed {
                out.push(entry(
                    "agent.register",
                    Verdict::Constrain,
                    "delegated_authority_narrowed",
                ));
            }
            if inherited.is_some() {
                out.push(entry(
                    "context.delegate",
                    Verdict::Allow,
                    "context_delegated",
                ));
            }
            out.push(entry("agent.register", verdict, "agent_registered"));
            out
        }
        (Ok(Registration::Refused { decision, .. }), Ok(RegOutcome::Refused(reason))) => {
            check_eq!(decision.reason.as_str(), *reason, "{op:?}");
            vec![entry("agent.register", Verdict::Deny, reason)]
        }
        (got, want) => return Err(format!("{op:?}: engine {got:?}, model {want:?}")),
    })
}

fn status(s: StepStatus) -> Status {
    match s {
        StepStatus::Completed => Status::Completed,
        StepStatus::Failed => Status::Failed,
        StepStatus::Denied => Status::Denied,
    }
}

/// The entry a memory step's read or write records.
fn memory_entry(memory: &reference::MemoryStep) -> Entry {
    use reference::MemoryStep;
    match memory {
        MemoryStep::Read(ReadOutcome::Found { reason, .. }) => {
            entry("memory.read", Verdict::Allow, reason)
        }
        MemoryStep::Read(ReadOutcome::Hidden(r) | ReadOutcome::Denied(r)) => {
            entry("memory.read", Verdict::Deny, r)
        }
        MemoryStep::Write(WriteOutcome::Done(_)) => {
            entry("memory.write", Verdict::Allow, "owner_write")
        }
        MemoryStep::Write(WriteOutcome::Conflict(_)) => {
            entry("memory.write", Verdict::Deny, "revision_conflict")
        }
        MemoryStep::Write(WriteOutcome::Denied(r)) => entry("memory.write", Verdict::Deny, r),
        MemoryStep::Write(WriteOutcome::Invalid(p)) => entry(
            "memory.write",
            Verdict::Deny,
            &format!("invalid_record:{p}"),
        ),
        MemoryStep::Write(WriteOutcome::NotFound) => Entry {
            op: "memory.write",
            verdict: Verdict::Deny,
            reason: None,
        },
    }
}

fn parse_sop<S: Store>(e: &Engine<S>, i: usize) -> warden_core::sop::Sop {
    warden_core::sop::parse_sop(&reference::sop_json(i), &e.policy().sop_limits).unwrap()
}

fn compare_preflight(
    op: &Op,
    got: &warden_core::preflight::Preflight,
    want: &[Vec<String>],
) -> Result<(), String> {
    check_eq!(got.steps.len(), want.len(), "{op:?}: steps");
    check_eq!(
        got.admitted,
        want.iter().all(Vec::is_empty),
        "{op:?}: admitted"
    );
    for (i, (g, w)) in got.steps.iter().zip(want).enumerate() {
        let kinds: Vec<&str> = g.violations.iter().map(|r| kind(r.as_str())).collect();
        check_eq!(kinds, *w, "{op:?}: step {i} violations");
        let reason = w.first().map_or("step_allowed", String::as_str);
        check_eq!(kind(g.reason().as_str()), reason, "{op:?}: step {i} reason");
    }
    Ok(())
}

fn step_entries(want: &[Vec<String>]) -> Vec<Entry> {
    want.iter()
        .map(|v| match v.first() {
            None => entry("sop.validate", Verdict::Allow, "step_allowed"),
            Some(r) => entry("sop.validate", Verdict::Deny, &format!("{r}:*")),
        })
        .collect()
}

// ----------------------------------------------------------------------
// Backends
// ----------------------------------------------------------------------

fn policy() -> warden_core::bundle::Policy {
    warden_core::bundle::compile(POLICY).unwrap()
}

/// The engine clock's start; the model counts from 0.
const START: i64 = 1_700_000_000_000;

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(Timestamp(START)))
}

async fn run_case<S: Store>(store: S, ops: &[Op]) -> Result<Model, String> {
    let clock = clock();
    let engine = Engine::open(policy(), store, clock.clone()).await.unwrap();
    let mut pair = Pair {
        engine,
        clock,
        model: Model::default(),
    };
    for op in ops {
        pair.step(op).await?;
    }
    let verified = pair.engine.verify_audit().await.unwrap();
    check!(
        verified.is_valid(),
        "the chain does not verify: {verified:?}"
    );
    Ok(pair.model)
}

/// Cases per backend: `PROPTEST_CASES` when set, else `default`.
fn config(default: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn run_property<F>(default_cases: u32, case: F)
where
    F: Fn(Vec<Op>) -> Result<(), String>,
{
    let mut runner = TestRunner::new(config(default_cases));
    let result = runner.run(&ops(), |ops| case(ops).map_err(TestCaseError::fail));
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn the_engine_on_the_memory_store_agrees_with_the_model() {
    run_property(256, |ops| {
        runtime()
            .block_on(run_case(warden_store::MemoryStore::new(), &ops))
            .map(drop)
    });
    if std::env::var_os("MODEL_STATS").is_some() {
        for (what, n) in STATS.lock().unwrap().iter() {
            eprintln!("{n:>8} {what}");
        }
    }
}

#[test]
fn the_engine_on_sqlite_agrees_with_the_model() {
    run_property(24, |ops| {
        runtime().block_on(async {
            let store = warden_sqlite::SqliteStore::open_temp().await.unwrap();
            run_case(store, &ops).await.map(drop)
        })
    });
}

#[test]
fn the_engine_on_postgres_agrees_with_the_model() {
    let Some(url) = std::env::var("WARDEN_TEST_DATABASE_URL")
        .ok()
        .filter(|s| !s.trim().is_empty())
    else {
        eprintln!("skipped: WARDEN_TEST_DATABASE_URL is not set");
        return;
    };
    run_property(12, |ops| {
        runtime().block_on(async {
            let schema = fresh_schema();
            let store = warden_postgres::PgStore::connect_in_schema(&url, &schema)
                .await
                .unwrap();
            let result = run_case(store, &ops).await.map(drop);
            drop_schema(&url, &schema).await;
            result
        })
    });
}

/// A schema of its own per case, named as the PostgreSQL crate's test
/// schemas (`wtest_<unix secs>_<pid>_<counter>_<nanos>`) so that its sweep
/// drops any a killed run leaves behind.
pub(crate) fn fresh_schema() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "wtest_{}_{}_{}_{:x}",
        now.as_secs(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        now.subsec_nanos()
    )
}

pub(crate) async fn drop_schema(url: &str, schema: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await
        .unwrap();
    drop(client);
    let _ = driver.await;
}

/// Run one fixed sequence on the in-memory store, checked as the
/// properties check theirs; the model's final state.
fn replay(ops: &[Op]) -> Model {
    runtime()
        .block_on(run_case(warden_store::MemoryStore::new(), ops))
        .unwrap()
}

// Fixed sequences for outcomes random cases reach rarely; each asserts that
// the model predicts the outcome, so the agreement is not vacuous.

const ALL: u16 = (1 << CAPS.len()) - 1;

fn root(id: usize) -> Op {
    Op::Register {
        caller: None,
        id,
        parent: None,
        caps: ALL,
        build: 0,
    }
}

fn child(id: usize, parent: usize) -> Op {
    Op::Register {
        caller: Some(parent),
        id,
        parent: Some(parent),
        caps: ALL,
        build: 0,
    }
}

fn policy_write(actor: usize, combinator: usize, value: usize) -> Op {
    Op::Write {
        actor,
        owner: None,
        ns: 0,
        key: 0,
        value,
        expected: None,
        visibility: Some(2),
        class: Some(ClassGen::Policy(combinator)),
    }
}

#[test]
fn policies_combine_down_the_lineage_and_a_mismatched_level_is_refused() {
    // a: `min` 5; b below: `min` 1; c below b: `all` true (a boolean where
    // the root-most combinator wants numbers).
    let read = |reader| Op::Read {
        reader,
        ns: 0,
        key: 0,
    };
    let m = replay(&[
        root(0),
        child(1, 0),
        child(2, 1),
        policy_write(0, 2, 3),
        policy_write(1, 2, 2),
        read(1),
        policy_write(2, 0, 0),
        read(2),
    ]);
    assert!(matches!(
        m.read("b", "proj", "k1"),
        ReadOutcome::Found { value, .. } if value == serde_json::json!(1)
    ));
    assert_eq!(
        m.read("c", "proj", "k1"),
        ReadOutcome::Denied("policy_type_mismatch:c".into())
    );
}

#[test]
fn chained_aggregation_rules_deny_a_later_step_and_bind_a_delegated_child() {
    // SOP 8: finance.read, crm.lookup, crm.lookup, report.export. The first
    // two make a profile (no_export); `pii` reported with the second adds
    // no_crm; the third step is denied; a child delegated from the run
    // loses crm.lookup and report.export, and cannot admit an export.
    let begin = Op::Begin {
        actor: None,
        run: 0,
        step: None,
    };
    let complete = |labels| Op::Complete {
        actor: None,
        run: 0,
        step: None,
        labels,
        error: false,
    };
    let m = replay(&[
        root(0),
        Op::Admit {
            actor: 0,
            sop: 8,
            run: 0,
        },
        begin.clone(),
        complete(0),
        begin.clone(),
        complete(0b1000),
        begin.clone(),
        Op::DelegateFromRun {
            run: 0,
            id: 5,
            caps: ALL,
        },
        Op::Admit {
            actor: 5,
            sop: 0,
            run: 1,
        },
    ]);
    let run = &m.runs["r1"];
    assert_eq!(run.outcomes.get("s3"), Some(&Status::Denied));
    let restrictions: Vec<&str> = run
        .envelope
        .restrictions
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(restrictions, ["no_crm", "no_export"]);
    let f = &m.agents["f"];
    assert!(!f.declared.contains("crm.lookup") && !f.declared.contains("report.export"));
    assert!(f.envelope.is_some() && !m.runs.contains_key("r2"));
}

// ----------------------------------------------------------------------
// Defects the model found
// ----------------------------------------------------------------------

/// Found by the model: a step the agent began (the gate let it proceed),
/// then denied at a later `begin` (the agent revoked, its lease lapsed), is
/// recorded `Denied` and stops the run; completing it afterwards consumed
/// the first begin's ticket and folded the reported labels into the run's
/// envelope, recording a `context.accumulate` allow for a step whose
/// outcome is a denial, on behalf of a revoked agent. A step with a
/// recorded outcome completes to that outcome and changes nothing: no
/// label folded, nothing recorded.
#[test]
fn completing_a_step_the_gate_denied_changes_nothing() {
    runtime().block_on(async {
        let clock = clock();
        let e = Engine::open(policy(), warden_store::MemoryStore::new(), clock.clone())
            .await
            .unwrap();
        let a = aid(0);
        let all = CAPS.iter().map(|c| ActionName::parse(c).unwrap()).collect();
        let req = RegisterAgent {
            id: a.clone(),
            parent: None,
            capabilities: all,
            tools: None,
            config: None,
        };
        e.register_agent(&Caller::Operator, req).await.unwrap();
        let run = RunId::parse("r1").unwrap();
        let (s1, s2) = (StepId::parse("s1").unwrap(), StepId::parse("s2").unwrap());
        let admitted = e.admit_run(&a, &parse_sop(&e, 0), Some(run.clone())).await;
        assert!(matches!(admitted, Ok(Admission::Admitted { .. })));
        e.begin_step(&a, &run, &s1).await.unwrap();
        e.complete_begun_step(&a, &run, &s1, StepResult::default())
            .await
            .unwrap();
        let first = e.begin_step(&a, &run, &s2).await.unwrap();
        assert!(matches!(first, StepGate::Proceed { .. }));
        e.revoke_agent(&Caller::Operator, &a).await.unwrap();
        // While the first begin's lease holds, a second begin decides
        // nothing; once it lapses, the gate decides (and denies).
        let held = e.begin_step(&a, &run, &s2).await.unwrap();
        assert!(matches!(held, StepGate::InProgress { .. }), "{held:?}");
        clock.advance(i64::try_from(e.policy().step_lease_ms).unwrap() + 1);
        let second = e.begin_step(&a, &run, &s2).await.unwrap();
        assert!(matches!(second, StepGate::Refused { .. }));

        let envelope = e.run_envelope(&run).await.unwrap().unwrap();
        let head = e.audit_head().await.unwrap().count;
        let labels = ["customer_name", "financial"].map(|l| Label::parse(l).unwrap());
        let result = StepResult {
            result: None,
            result_labels: labels.to_vec(),
            error: None,
        };
        let done = e.complete_begun_step(&a, &run, &s2, result).await.unwrap();
        let Completion::Recorded(outcome) = done else {
            panic!("the denied outcome is returned: {done:?}");
        };
        assert_eq!(outcome.status, StepStatus::Denied);
        assert_eq!(e.run_envelope(&run).await.unwrap().unwrap(), envelope);
        assert_eq!(e.audit_head().await.unwrap().count, head);
    });
}

#[test]
fn a_declassification_lowers_only_as_far_as_the_labels_left_allow() {
    // A profile run (restricted, no_export); `b` may not declassify; `a`
    // may not go below what customer_name + financial imply, nor upward,
    // nor below what the derived profile implies once `financial` is
    // removed; removing both lowers it to internal, and the restriction
    // stays.
    let step = [
        Op::Begin {
            actor: None,
            run: 0,
            step: None,
        },
        Op::Complete {
            actor: None,
            run: 0,
            step: None,
            labels: 0,
            error: false,
        },
    ];
    let declassify = |by, to, remove| Op::Declassify {
        by,
        run: 0,
        to,
        remove,
        justified: true,
    };
    let mut ops = vec![
        root(0),
        root(1),
        Op::Admit {
            actor: 0,
            sop: 1,
            run: 0,
        },
    ];
    ops.extend(step.iter().cloned());
    ops.extend(step.iter().cloned());
    ops.extend([
        declassify(1, 1, 0b100),
        declassify(0, 1, 0),
        declassify(0, 4, 0),
        declassify(0, 1, 0b100),
        declassify(0, 1, 0b10100),
    ]);
    let m = replay(&ops);
    let env = &m.runs["r1"].envelope;
    assert_eq!(env.sensitivity, 1);
    assert!(!env.labels.contains("financial") && env.restrictions.contains("no_export"));
}
