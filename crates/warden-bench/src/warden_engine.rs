//! Warden, through its public `warden-core` API, as an embedding program
//! calls it: names in, decision out.
//!
//! - S1: whether the agent or an ancestor declares the action
//!   ([`Hierarchy::lineage_declares`]): one bit test in the union of the
//!   lineage's declarations, kept per agent at registration (Warden has no
//!   "inherit a capability" rule, capabilities only narrow; this is the
//!   hierarchy's ancestor question, answered without walking the lineage).
//! - S2: the cached effective capabilities ([`Hierarchy::has_capability`]),
//!   computed once at registration.
//! - S3: [`resolve_for`] over a [`MemoryIndex`] view: the reader placed by
//!   the id table alone (its node is not read), the key's few records
//!   each placed on the reader's lineage by a constant-time ancestor test,
//!   instead of a walk along the lineage (which record wins and its owner
//!   and revision are part of the answer).
//! - S4: [`preflight`] of a parsed 50-step SOP: every step checked against
//!   the catalogue, the effective capabilities and the argument rules, one
//!   `StepCheck` per step (its violations: the step's full `Decision`, which
//!   shares everything else with the other steps', is built from it when it
//!   is recorded or shown).
//!
//! Churn: [`Hierarchy::register_owned`] (+ [`MemoryIndex::insert`] for S3), then
//! the decision for the new agent.

use std::collections::VecDeque;

use anyhow::{Context, Result, anyhow};
use serde_json::json;
use warden_core::bundle::{Policy, compile};
use warden_core::hierarchy::{AgentSpec, Hierarchy};
use warden_core::ids::{ActionName, AgentId, Key, Namespace};
use warden_core::memory::{
    MemoryIndex, MemoryRecord, RecordClass, Resolution, Visibility, resolve_for,
};
use warden_core::preflight::{PreflightContext, preflight};
use warden_core::sop::{Sop, parse_sop};
use warden_core::time::Timestamp;

use crate::subject::Subject;
use crate::world::{ACTIONS, Agent, Query, Record, Scenario, Vis, World};

/// The namespace of S3 records.
pub const NS: &str = "s3";
const NOW: Timestamp = Timestamp(1);

/// The policy bundle: the ten actions, all in the environment.
pub fn policy() -> Result<Policy> {
    let mut text = String::from("policy_version: bench-1\nenvironment_capabilities:\n");
    for a in ACTIONS {
        text.push_str(&format!("  - {a}\n"));
    }
    text.push_str("actions:\n");
    for a in ACTIONS {
        text.push_str(&format!("  {a}: {{}}\n"));
    }
    compile(&text).map_err(|e| anyhow!("bench policy: {e}"))
}

fn spec(a: &Agent, parent: Option<&str>) -> Result<AgentSpec> {
    Ok(AgentSpec {
        id: AgentId::parse(&a.id)?,
        parent: parent.map(AgentId::parse).transpose()?,
        capabilities: a
            .declared
            .iter()
            .filter_map(|i| ACTIONS.get(*i))
            .map(|n| ActionName::parse(n))
            .collect::<Result<_, _>>()?,
    })
}

fn record(r: &Record) -> Result<MemoryRecord> {
    Ok(MemoryRecord {
        namespace: Namespace::parse(NS)?,
        key: Key::parse(&r.key)?,
        value: json!(1),
        owner: AgentId::parse(&r.owner_id)?,
        visibility: match r.vis {
            Vis::Private => Visibility::Private,
            Vis::Children => Visibility::Children,
            Vis::Descendants => Visibility::Descendants,
        },
        class: RecordClass::Preference,
        revision: 1,
        created_at: Timestamp(0),
        updated_at: Timestamp(0),
    })
}

/// The loaded state, built once per world and cloned into each subject.
#[derive(Debug, Clone)]
pub struct State {
    /// The hierarchy.
    pub hierarchy: Hierarchy,
    /// The memory records.
    pub index: MemoryIndex,
}

/// Register the world's agents and index its records.
pub fn load(p: &Policy, w: &World) -> Result<State> {
    let mut hierarchy = p.empty_hierarchy();
    let index_of = |a: &ActionName| p.action_index(a);
    for a in &w.agents {
        let parent = a
            .parent
            .and_then(|i| w.agents.get(i))
            .map(|x| x.id.as_str());
        hierarchy
            .register(&spec(a, parent)?, &index_of)
            .with_context(|| format!("register {}", a.id))?;
    }
    let mut index = MemoryIndex::new();
    for r in &w.records {
        index.insert(record(r)?);
    }
    Ok(State { hierarchy, index })
}

struct Staged {
    spec: AgentSpec,
    record: Option<MemoryRecord>,
    query: Query,
    key: String,
}

/// Warden for one scenario.
pub struct WardenSubject<'p> {
    scenario: Scenario,
    policy: &'p Policy,
    state: State,
    leaf: AgentId,
    /// Hot questions: (asking agent, question, record key for S3).
    questions: Vec<(AgentId, Query, String)>,
    sop: Sop,
    staged: VecDeque<Staged>,
    world: std::sync::Arc<World>,
    label: String,
}

impl<'p> WardenSubject<'p> {
    /// Set up on a copy of `state`, for the leaf's hot questions.
    pub fn new(
        policy: &'p Policy,
        state: State,
        w: &std::sync::Arc<World>,
        scenario: Scenario,
        label: &str,
    ) -> Result<Self> {
        Self::asking(policy, state, w, scenario, label, &w.questions(scenario))
    }

    /// Set up on a copy of `state`; `hot(p)` answers `questions[p]`
    /// (agent index, question).
    pub fn asking(
        policy: &'p Policy,
        state: State,
        w: &std::sync::Arc<World>,
        scenario: Scenario,
        label: &str,
        questions: &[(usize, Query)],
    ) -> Result<Self> {
        let leaf = AgentId::parse(&w.agents.get(w.leaf()).context("leaf")?.id)?;
        let questions = questions
            .iter()
            .map(|(a, q)| {
                let id = AgentId::parse(&w.agents.get(*a).context("agent")?.id)?;
                let key = match scenario {
                    Scenario::S3 => w.records.get(*q).map(|r| r.key.clone()).unwrap_or_default(),
                    _ => String::new(),
                };
                Ok((id, *q, key))
            })
            .collect::<Result<_>>()?;
        let steps: Vec<_> = w
            .sop
            .iter()
            .enumerate()
            .map(|(i, a)| json!({"step_id": format!("step-{i}"), "action": ACTIONS.get(*a)}))
            .collect();
        let text = json!({"sop_id": "bench", "version": 1, "steps": steps}).to_string();
        let sop = parse_sop(&text, &policy.sop_limits).map_err(|e| anyhow!("sop: {e:?}"))?;
        Ok(Self {
            scenario,
            policy,
            state,
            leaf,
            questions,
            sop,
            staged: VecDeque::new(),
            world: std::sync::Arc::clone(w),
            label: label.to_owned(),
        })
    }

    /// S3 with provenance: (allowed, owner and revision of the record that won).
    pub fn resolve_with_provenance(
        &self,
        reader: &AgentId,
        key: &str,
    ) -> (u64, Option<(String, u64)>) {
        let h = &self.state.hierarchy;
        let view = self.state.index.view(NS, key);
        match resolve_for(h, reader, view, NOW) {
            Resolution::Found { record, .. } => {
                (1, Some((record.owner.to_string(), record.revision)))
            }
            Resolution::Combined { .. } => (1, None),
            Resolution::Denied { .. } | Resolution::NotFound => (0, None),
        }
    }

    /// The leaf's id.
    pub fn leaf(&self) -> &AgentId {
        &self.leaf
    }

    #[inline]
    fn decide(&self, agent: &AgentId, q: Query, key: &str) -> u64 {
        let h = &self.state.hierarchy;
        match self.scenario {
            Scenario::S1 => {
                let action = ACTIONS.get(q).copied().unwrap_or("");
                match (
                    h.index_of(agent.as_str()),
                    self.policy.catalogue.index_of(action),
                ) {
                    (Some(idx), Some(a)) => u64::from(h.lineage_declares(idx, a.get())),
                    _ => 0,
                }
            }
            Scenario::S2 => {
                let action = ACTIONS.get(q).copied().unwrap_or("");
                match (
                    h.index_of(agent.as_str()),
                    self.policy.catalogue.index_of(action),
                ) {
                    (Some(idx), Some(a)) => u64::from(h.has_capability(idx, a.get())),
                    _ => 0,
                }
            }
            Scenario::S3 => {
                let view = self.state.index.view(NS, key);
                match resolve_for(h, agent, view, NOW) {
                    Resolution::Found { record, .. } => {
                        std::hint::black_box(record);
                        1
                    }
                    Resolution::Combined { .. } => 1,
                    Resolution::Denied { .. } | Resolution::NotFound => 0,
                }
            }
            Scenario::S4 => {
                let ctx = PreflightContext {
                    hierarchy: h,
                    catalogue: &self.policy.catalogue,
                    policy_version: &self.policy.version,
                };
                let p = preflight(&ctx, agent, &self.sop, NOW);
                p.steps
                    .iter()
                    .enumerate()
                    .fold(0u64, |acc, (i, s)| acc | (u64::from(s.permits()) << i))
            }
        }
    }
}

impl Subject for WardenSubject<'_> {
    fn label(&self) -> String {
        self.label.clone()
    }

    fn hot(&mut self, p: usize) -> Result<u64> {
        let (agent, q, key) = self.questions.get(p).context("question")?;
        Ok(self.decide(agent, *q, key))
    }

    fn stage(&mut self, k: usize) -> Result<()> {
        let w = &self.world;
        let agent = w.churn_agent(k);
        let parent = w.agents.get(w.churn_parent()).map(|a| a.id.as_str());
        let query = w.churn_query(self.scenario, k);
        let record = match self.scenario {
            Scenario::S3 => Some(record(&w.churn_record(k))?),
            _ => None,
        };
        let key = match self.scenario {
            Scenario::S3 => w.churn_query_record(k, query).key,
            _ => String::new(),
        };
        self.staged.push_back(Staged {
            spec: spec(&agent, parent)?,
            record,
            query,
            key,
        });
        Ok(())
    }

    fn churn(&mut self, k: usize) -> Result<u64> {
        let st = self.staged.pop_front().context("nothing staged")?;
        let index_of = |a: &ActionName| self.policy.action_index(a);
        // The spec is the embedder's to give up: its id and declared names
        // move into the hierarchy (the decision below asks by name, as
        // every engine's does).
        let id = st.spec.id.clone();
        self.state
            .hierarchy
            .register_owned(st.spec, &index_of)
            .with_context(|| format!("register churn agent {k}"))?;
        if let Some(r) = st.record {
            self.state.index.insert(r);
        }
        Ok(self.decide(&id, st.query, &st.key))
    }
}
