//! The reference model: the rules of the design brief and the lab
//! document, written as plain maps and loops over the model bundle's small
//! universe. It calls nothing in `warden-core` that decides; it only names
//! the outcomes in the engine's vocabulary (reason codes, statuses).
//!
//! What it says, from the spec:
//!
//! - **Hierarchy.** An agent has at most one parent, declared capabilities
//!   and a status. Effective capabilities are the environment's intersected
//!   with every declared set along the lineage (unknown names grant
//!   nothing); a `block_write`-tagged action is never effective for an
//!   agent with a parent. Registration is refused, in this order:
//!   `not_own_child` (an agent registers only its own children),
//!   `agent_revoked` (the registering agent is not active), delegation
//!   lockdown for an agent with a parent (a pre-built child with a tool in
//!   the reserved `memory_block_` namespace, or whose config asks for the
//!   block self-edit surface, is refused; a child built from its spec has
//!   the request cleared, a `constrain`),
//!   `duplicate_agent`, `unknown_parent`, `parent_revoked`. Revocation is
//!   by the operator or an active ancestor (`not_an_ancestor` otherwise)
//!   and takes the whole subtree; an unknown target is a `NotFound` error.
//! - **Memory.** A read walks the lineage from the reader to the root. If
//!   any visible `policy` record is on it, every visible policy record is
//!   combined with the root-most one's combinator (`policy_type_mismatch`
//!   when a value does not fit it). Otherwise the nearest record decides:
//!   visible (`visible_from:<owner>`, `secret_granted` for a granted
//!   secret) or `not_visible_from:<owner>`; none is `record_not_found`.
//!   Visibility: the owner always; `children` one level down;
//!   `descendants` every level; secrets only their grantees; task state
//!   only its owner. A write or delete names the caller's own scope
//!   (`actor_is_not_owner`), needs `memory.write`, and is compare-and-set
//!   on `expected_revision` (0 = create only); the class keeps its shape
//!   (`policy` values fit the combinator, `secret`/`task` stay private,
//!   secrets are granted only to agents that exist).
//!   Task state past its expiry is gone for readers (the owner's own is
//!   `record_expired`); a write over it continues its revisions.
//! - **Agent views.** The operator, the agent itself and its active
//!   ancestors see an agent (`operator`, `self`, `ancestor`); anyone else
//!   is refused (`not_an_ancestor`, `unknown_agent`).
//! - **Preflight.** Every step gets a decision; its violations in order:
//!   the actor unknown or revoked, an empty or repeated step id, an unknown
//!   action (nothing more is checked), an action outside the effective
//!   capabilities, a memory write naming another owner, arguments outside
//!   the action's schema. The SOP is admitted when no step has one.
//! - **Declassification.** Only a listed declassifier (here `a`), active,
//!   with a justification, lowers a run's envelope: never upward, never
//!   below what the labels left (after removing the named ones, derived
//!   labels included) imply, a derived label kept implying the level of
//!   the rule that derived it; restrictions are never removed.
//! - **Runs.** An admitted run starts with an empty envelope. A step begins
//!   only after every earlier step has an outcome and while no outcome is
//!   failed or denied; a recorded step replays. The gate denies a step of
//!   a revoked agent and a step the envelope's restrictions cover (the run
//!   stops); a step it lets proceed while the envelope holds restrictions
//!   is constrained (they bind what it produces). A memory step is
//!   performed at once as the run's agent, under the memory rules above;
//!   the step fails when the read or write is not done. A completion folds the reported and catalogue labels into the
//!   envelope, where the aggregation rules add sensitivity, derived labels
//!   and restrictions (to a fixed point); an unknown label fails the step
//!   and folds nothing.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

/// The model bundle: a small catalogue, a context section with two chained
/// aggregation rules. Escalation floors are put out of reach so every gate
/// answer is allow or deny.
pub const POLICY: &str = r#"
policy_version: model-1
environment_capabilities: [memory.read, memory.write, doc.fetch, crm.lookup, finance.read, report.export, prompt.edit]
actions:
  doc.fetch:
    arguments:
      type: object
      required: [doc]
      additionalProperties: false
      properties:
        doc: {type: string, maxLength: 8}
    output_labels: [internal_doc]
  crm.lookup:
    output_labels: [customer_name]
  finance.read:
    output_labels: [financial]
  report.export:
    tags: [export]
  prompt.edit:
    tags: [block_write]
  audit.purge: {}
context:
  inherit_threshold: top_secret
  restricted_floor: top_secret
  labels:
    internal_doc: internal
    customer_name: internal
    financial: confidential
    pii: confidential
  aggregation_rules:
    - name: profile
      all_labels: [customer_name, financial]
      sensitivity: restricted
      derived: [customer-profile]
      restrict: [no_export]
    - name: profile_pii
      all_labels: [customer-profile, pii]
      sensitivity: restricted
      restrict: [no_crm]
  restrictions:
    no_export: {denies_tags: [export]}
    no_crm: {denies_actions: [crm.lookup]}
  declassifiers: [a]
"#;

/// Agent ids of the universe (few, so operations collide). Sequences
/// start by registering some of the first [`SEEDED`]; the rest are left
/// for later registrations and delegations.
pub const AGENTS: [&str; 7] = ["a", "b", "c", "d", "e", "f", "g"];
pub const SEEDED: usize = 5;
/// An id no agent ever has (a grant to it is refused).
pub const NOBODY: &str = "zz";
/// Capabilities an agent may declare: the environment's, a catalogued
/// action outside the environment, and a name the catalogue does not know.
pub const CAPS: [&str; 9] = [
    "memory.read",
    "memory.write",
    "doc.fetch",
    "crm.lookup",
    "finance.read",
    "report.export",
    "prompt.edit",
    "audit.purge",
    "ghost.op",
];
const ENVIRONMENT: [&str; 7] = [
    "memory.read",
    "memory.write",
    "doc.fetch",
    "crm.lookup",
    "finance.read",
    "report.export",
    "prompt.edit",
];
const CATALOGUE: [&str; 8] = [
    "memory.read",
    "memory.write",
    "doc.fetch",
    "crm.lookup",
    "finance.read",
    "report.export",
    "prompt.edit",
    "audit.purge",
];
const BLOCK_WRITE: [&str; 1] = ["prompt.edit"];
pub const NAMESPACES: [&str; 2] = ["proj", "cfg"];
pub const KEYS: [&str; 2] = ["k1", "k2"];
/// Labels a completion may report (the last is not in the bundle).
pub const LABELS: [&str; 5] = [
    "internal_doc",
    "customer_name",
    "financial",
    "pii",
    "mystery",
];
/// Values a write may store. Strings carry the `sv-` marker, which must
/// never reach the decision log.
pub const VALUES: [fn() -> Value; 8] = [
    || json!(true),
    || json!(false),
    || json!(1),
    || json!(5),
    || json!(["x", "y"]),
    || json!(["y", "z"]),
    || json!("sv-1"),
    || json!("sv-2"),
];
pub const RUN_IDS: [&str; 2] = ["r1", "r2"];
pub const STEP_IDS: [&str; 4] = ["s1", "s2", "s3", "s4"];

/// A step of a model SOP: (step id, action, arguments).
pub type ModelStep = (&'static str, &'static str, fn() -> Value);

/// The SOPs an operation may validate or admit.
pub const SOPS: [&[ModelStep]; 10] = [
    &[
        ("s1", "doc.fetch", || json!({"doc": "d1"})),
        ("s2", "report.export", || json!({})),
    ],
    &[
        ("s1", "crm.lookup", || json!({})),
        ("s2", "finance.read", || json!({})),
        ("s3", "report.export", || json!({})),
    ],
    &[("s1", "doc.fetch", || json!({"doc": 5}))],
    &[("s1", "ghost.op", || json!({}))],
    &[(
        "s1",
        "memory.write",
        || json!({"namespace": "proj", "key": "k1", "value": "sv-3", "owner_agent_id": "b"}),
    )],
    &[
        ("s1", "doc.fetch", || json!({"doc": "toolongvalue"})),
        ("s1", "crm.lookup", || json!({})),
        ("", "finance.read", || json!({})),
    ],
    &[("s1", "audit.purge", || json!({}))],
    &[
        ("s1", "prompt.edit", || json!({})),
        ("s2", "crm.lookup", || json!({})),
    ],
    &[
        ("s1", "finance.read", || json!({})),
        ("s2", "crm.lookup", || json!({})),
        ("s3", "crm.lookup", || json!({})),
        ("s4", "report.export", || json!({})),
    ],
    &[
        (
            "s1",
            "memory.read",
            || json!({"namespace": "proj", "key": "k1"}),
        ),
        (
            "s2",
            "memory.write",
            || json!({"namespace": "cfg", "key": "k2", "value": 1}),
        ),
    ],
];

/// How a child is handed over: pre-built with these tools (`None`: built
/// from its spec), and its framework config.
pub type Build = (Option<&'static [&'static str]>, fn() -> Option<Value>);

/// The constructions a registration may use.
pub const BUILDS: [Build; 10] = [
    (None, || None),
    (None, || Some(json!({"model": "m"}))),
    (None, || {
        Some(json!({"prompt_block_self_edit": true, "model": "m"}))
    }),
    (None, || Some(json!({"prompt_block_self_edit": "yes"}))),
    (None, || Some(json!("text"))),
    (Some(&[]), || None),
    (Some(&["doc_fetch"]), || {
        Some(json!({"prompt_block_self_edit": false}))
    }),
    (Some(&["memory_block_append"]), || None),
    (Some(&["Doc_Fetch", "MEMORY_BLOCK_REPLACE"]), || None),
    (Some(&["doc_fetch"]), || {
        Some(json!({"prompt_block_self_edit": true}))
    }),
];

/// The lockdown field of a child's config.
const SELF_EDIT: &str = "prompt_block_self_edit";

/// Delegation lockdown for a child: a pre-built child with a tool in the
/// reserved `memory_block_` namespace (any case) or a config asking for
/// the self-edit surface is refused; a child built from its spec has the
/// request cleared. `Ok(true)`: cleared.
fn lockdown(tools: Option<&[&str]>, config: &mut Option<Value>) -> Result<bool, &'static str> {
    if tools.is_some_and(|t| {
        t.iter()
            .any(|n| n.to_lowercase().starts_with("memory_block_"))
    }) {
        return Err("child_write_surface_tool");
    }
    let asks = match config.as_ref() {
        None | Some(Value::Null) => false,
        Some(Value::Object(map)) => match map.get(SELF_EDIT) {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err("child_self_edit_flag_invalid"),
        },
        Some(_) => return Err("child_config_invalid"),
    };
    match (asks, tools) {
        (false, _) => Ok(false),
        (true, Some(_)) => Err("child_self_edit_requested"),
        (true, None) => {
            if let Some(Value::Object(map)) = config.as_mut() {
                map.insert(SELF_EDIT.into(), Value::Bool(false));
            }
            Ok(true)
        }
    }
}

/// The JSON text of model SOP `i`.
pub fn sop_json(i: usize) -> String {
    let steps: Vec<Value> = SOPS[i]
        .iter()
        .map(|(s, a, args)| json!({"step_id": s, "action": a, "arguments": args()}))
        .collect();
    json!({"sop_id": format!("sop{i}"), "version": 1, "steps": steps}).to_string()
}

/// Who reads a record besides its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vis {
    Private,
    Children,
    Descendants,
}

/// A record's class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Class {
    Preference,
    /// Combinator name: all, any, min, max, intersection.
    Policy(&'static str),
    Secret(Vec<String>),
    /// Expiry, in milliseconds on the model's clock.
    Task(Option<i64>),
}

#[derive(Debug, Clone)]
pub struct Agent {
    pub parent: Option<String>,
    pub declared: BTreeSet<String>,
    pub active: bool,
    /// The envelope it inherited when it was delegated.
    pub envelope: Option<Envelope>,
    /// Its config as stored.
    pub config: Option<Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub value: Value,
    pub visibility: Vis,
    pub class: Class,
    pub revision: u64,
}

/// A step outcome's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Completed,
    Failed,
    Denied,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Envelope {
    pub labels: BTreeSet<String>,
    pub derived: BTreeSet<String>,
    pub restrictions: BTreeSet<String>,
    /// Index on the ladder public(0) < internal < confidential <
    /// restricted < top_secret.
    pub sensitivity: usize,
}

pub const LADDER: [&str; 5] = [
    "public",
    "internal",
    "confidential",
    "restricted",
    "top_secret",
];

#[derive(Debug, Clone)]
pub struct Run {
    pub agent: String,
    pub sop: usize,
    pub outcomes: BTreeMap<String, Status>,
    /// Steps the gate let proceed whose completion is pending.
    /// Begun steps whose ticket (and lease) is held: when the lease lapses.
    pub tickets: BTreeMap<String, i64>,
    /// Steps denied at a later `begin` while an earlier one's ticket was
    /// pending: completing them hits a known engine defect (see
    /// `completing_a_step_the_gate_denied_changes_nothing`), so the driver
    /// does not complete them.
    pub stale: BTreeSet<String>,
    pub envelope: Envelope,
}

/// The model's whole state.
#[derive(Debug, Clone, Default)]
pub struct Model {
    pub agents: BTreeMap<String, Agent>,
    /// (owner, namespace, key) to record.
    pub records: BTreeMap<(String, String, String), Record>,
    pub runs: BTreeMap<String, Run>,
    /// Milliseconds since the start.
    pub now: i64,
}

/// Who sees an agent's view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentReadOutcome {
    Visible(&'static str),
    Hidden(&'static str),
    /// An agent asking for itself when it does not exist: recorded
    /// (allowed, `unknown_agent`), then a `NotFound` error.
    Missing,
}

/// A registration's predicted outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegOutcome {
    /// Registered; whether its declared capabilities were narrowed by an
    /// inherited envelope; `inherited`: `None` without an envelope, else
    /// whether it carries restrictions (the registration is constrained).
    Registered {
        /// The child's self-edit request was cleared.
        sanitised: bool,
        narrowed: bool,
        inherited: Option<bool>,
    },
    Refused(&'static str),
}

/// A read's predicted outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadOutcome {
    /// Found (or combined): reason, value, owner (the root-most
    /// contributor for a policy), revision, contributing owners (empty
    /// unless combined).
    Found {
        reason: String,
        value: Value,
        owner: String,
        revision: u64,
        contributors: Vec<String>,
    },
    /// Nothing the reader may see.
    Hidden(String),
    /// The read itself is refused.
    Denied(String),
}

/// A write's predicted outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    Done(u64),
    Conflict(Option<u64>),
    /// Refused before storage: reason kind.
    Denied(&'static str),
    /// The record would be invalid: reason parameter.
    Invalid(&'static str),
    NotFound,
}

/// A step's lease (the bundle's default `limits.step_lease_ms`).
pub const STEP_LEASE_MS: i64 = 300_000;

/// A begin's predicted outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum BeginOutcome {
    /// No such run (of this agent) or step: an error, nothing recorded.
    NotFound,
    Replay,
    /// Another begin holds the step's live lease.
    InProgress,
    RunStopped,
    OutOfOrder,
    /// Denied by the gate: reason.
    Denied(String),
    /// Let proceed; constrained (the envelope's restrictions bind what the
    /// step produces) when the envelope has any.
    Proceed(bool),
    /// A memory step, performed by the engine: the memory operation's own
    /// outcome and the step's.
    Executed {
        constrained: bool,
        memory: MemoryStep,
        status: Status,
    },
}

/// What a memory step's operation decided.
#[derive(Debug, Clone, PartialEq)]
pub enum MemoryStep {
    Read(ReadOutcome),
    Write(WriteOutcome),
}

/// A completion's predicted outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompleteOutcome {
    NotFound,
    NotBegun,
    /// Recorded before (nothing changes).
    Existing(Status),
    /// Recorded now; whether labels were folded into the envelope.
    Recorded(Status, bool),
}

fn combinator_accepts(c: &str, v: &Value) -> bool {
    match c {
        "all" | "any" => v.is_boolean(),
        "min" | "max" => v.is_number(),
        _ => v.is_array(),
    }
}

impl Model {
    pub fn lineage(&self, agent: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut cur = Some(agent.to_string());
        while let Some(a) = cur {
            cur = self.agents.get(&a).and_then(|x| x.parent.clone());
            out.push(a);
        }
        out
    }

    pub fn effective(&self, agent: &str) -> BTreeSet<String> {
        let mut caps: BTreeSet<String> = ENVIRONMENT.iter().map(|s| s.to_string()).collect();
        for a in self.lineage(agent) {
            let declared = &self.agents[&a].declared;
            caps.retain(|c| declared.contains(c));
        }
        if self.agents[agent].parent.is_some() {
            caps.retain(|c| !BLOCK_WRITE.contains(&c.as_str()));
        }
        caps
    }

    /// `by` declassifies run `run`'s envelope. `Err(())`: no such run.
    pub fn declassify(
        &mut self,
        by: &str,
        run: &str,
        to: usize,
        remove: &[&str],
        justified: bool,
    ) -> Result<Result<(), &'static str>, ()> {
        let refusal = match self.agents.get(by) {
            None => Some("unknown_agent"),
            Some(a) if !a.active => Some("agent_revoked"),
            Some(_) if by != "a" => Some("declassification_not_authorized"),
            Some(_) if !justified => Some("declassification_invalid"),
            Some(_) => None,
        };
        let r = self.runs.get_mut(run).ok_or(())?;
        if let Some(reason) = refusal {
            return Ok(Err(reason));
        }
        Ok(r.envelope.declassify(to, remove).map(|e| r.envelope = e))
    }

    /// The capability check's answer for `agent` and `action`.
    pub fn capability(&self, agent: &str, action: &str) -> &'static str {
        match self.agents.get(agent) {
            None => "unknown_agent",
            Some(a) if !a.active => "agent_revoked",
            Some(_) if !CATALOGUE.contains(&action) => "unknown_action",
            Some(_) if !self.effective(agent).contains(action) => "capability_not_inherited",
            Some(_) => "capability_granted",
        }
    }

    /// The refusal of `agent` using `action` (unknown, revoked, lacking
    /// it), if any.
    fn capability_refusal(&self, agent: &str, action: &str) -> Option<&'static str> {
        match self.agents.get(agent) {
            None => Some("unknown_agent"),
            Some(a) if !a.active => Some("agent_revoked"),
            Some(_) if !self.effective(agent).contains(action) => Some("capability_not_inherited"),
            Some(_) => None,
        }
    }

    /// `from_run`: the child inherits that run's envelope (`Err(())` when
    /// it is not a run of the parent: an error, nothing recorded).
    pub fn register(
        &mut self,
        caller: Option<&str>,
        id: &str,
        parent: Option<&str>,
        mut declared: BTreeSet<String>,
        from_run: Option<&str>,
        build: Build,
    ) -> Result<RegOutcome, ()> {
        if let Some(c) = caller {
            if parent != Some(c) {
                return Ok(RegOutcome::Refused("not_own_child"));
            }
            if !self.agents.get(c).is_some_and(|a| a.active) {
                return Ok(RegOutcome::Refused("agent_revoked"));
            }
        }
        let mut config = build.1();
        let mut sanitised = false;
        if parent.is_some() {
            match lockdown(build.0, &mut config) {
                Err(reason) => return Ok(RegOutcome::Refused(reason)),
                Ok(cleared) => sanitised = cleared,
            }
        }
        if self.agents.contains_key(id) {
            return Ok(RegOutcome::Refused("duplicate_agent"));
        }
        if let Some(p) = parent {
            match self.agents.get(p) {
                None => return Ok(RegOutcome::Refused("unknown_parent")),
                Some(a) if !a.active => return Ok(RegOutcome::Refused("parent_revoked")),
                Some(_) => {}
            }
        }
        let source = match (from_run, parent) {
            (Some(run), Some(p)) => match self.runs.get(run) {
                Some(r) if r.agent == p => Some(r.envelope.clone()),
                _ => return Err(()),
            },
            (Some(_), None) => return Err(()),
            (None, Some(p)) => self.agents[p].envelope.clone(),
            (None, None) => None,
        };
        let mut narrowed = BTreeSet::new();
        if let (Some(env), Some(p)) = (&source, parent) {
            // Authority the envelope's restrictions deny is taken from
            // what the child declares (of what the parent could pass on).
            let parent_effective = self.effective(p);
            narrowed = declared
                .iter()
                .filter(|c| parent_effective.contains(*c) && env.denies(c))
                .cloned()
                .collect();
            declared.retain(|c| !narrowed.contains(c));
        }
        let inherited = source.as_ref().map(|e| !e.restrictions.is_empty());
        self.agents.insert(
            id.to_string(),
            Agent {
                parent: parent.map(str::to_string),
                declared,
                active: true,
                envelope: source,
                config,
            },
        );
        Ok(RegOutcome::Registered {
            sanitised,
            narrowed: !narrowed.is_empty(),
            inherited,
        })
    }

    /// `Err(())`: unknown target; `Ok(None)`: refused; `Ok(Some(set))`:
    /// revoked, with the agents of the subtree it revoked.
    pub fn revoke(
        &mut self,
        caller: Option<&str>,
        target: &str,
    ) -> Result<Option<BTreeSet<String>>, ()> {
        if !self.agents.contains_key(target) {
            return Err(());
        }
        if let Some(c) = caller {
            let ancestor = c != target
                && self.agents.get(c).is_some_and(|a| a.active)
                && self.lineage(target).iter().any(|a| a == c);
            if !ancestor {
                return Ok(None);
            }
        }
        // The answer lists the agents this revocation changed: the
        // subtree's active members (none when the target was revoked).
        let subtree: BTreeSet<String> = self
            .agents
            .iter()
            .filter(|(a, x)| x.active && self.lineage(a).iter().any(|x| x == target))
            .map(|(a, _)| a)
            .cloned()
            .collect();
        for a in &subtree {
            if let Some(x) = self.agents.get_mut(a) {
                x.active = false;
            }
        }
        Ok(Some(subtree))
    }

    /// `caller` reads `target`'s view: the operator, the agent itself and
    /// its active ancestors see it.
    pub fn read_agent(&self, caller: Option<&str>, target: &str) -> AgentReadOutcome {
        let exists = self.agents.contains_key(target);
        match caller {
            None if exists => AgentReadOutcome::Visible("operator"),
            None => AgentReadOutcome::Hidden("unknown_agent"),
            Some(a) if !exists && a == target => AgentReadOutcome::Missing,
            Some(_) if !exists => AgentReadOutcome::Hidden("unknown_agent"),
            Some(a) if a == target => AgentReadOutcome::Visible("self"),
            Some(a) => {
                let ancestor = self.agents.get(a).is_some_and(|x| x.active)
                    && self.lineage(target).iter().any(|x| x == a);
                if ancestor {
                    AgentReadOutcome::Visible("ancestor")
                } else {
                    AgentReadOutcome::Hidden("not_an_ancestor")
                }
            }
        }
    }

    fn visible(&self, record: &Record, owner: &str, reader: &str, position: usize) -> bool {
        if owner == reader {
            return true;
        }
        match &record.class {
            Class::Secret(grants) => grants.iter().any(|g| g == reader),
            Class::Task(_) => false,
            Class::Preference | Class::Policy(_) => match record.visibility {
                Vis::Private => false,
                Vis::Children => position == 1,
                Vis::Descendants => true,
            },
        }
    }

    pub fn read(&self, reader: &str, ns: &str, key: &str) -> ReadOutcome {
        if let Some(r) = self.capability_refusal(reader, "memory.read") {
            return ReadOutcome::Denied(r.to_string());
        }
        // (position, owner, record) along the lineage, nearest first;
        // expired task state is not there any more.
        let mut expired_own = false;
        let along: Vec<(usize, String, &Record)> = self
            .lineage(reader)
            .into_iter()
            .enumerate()
            .filter_map(|(pos, owner)| {
                let r = self
                    .records
                    .get(&(owner.clone(), ns.to_string(), key.to_string()))?;
                if matches!(r.class, Class::Task(Some(t)) if t <= self.now) {
                    expired_own |= pos == 0;
                    return None;
                }
                Some((pos, owner, r))
            })
            .collect();
        let policies: Vec<&(usize, String, &Record)> = along
            .iter()
            .filter(|(pos, owner, r)| {
                matches!(r.class, Class::Policy(_)) && self.visible(r, owner, reader, *pos)
            })
            .collect();
        if let Some((_, root_owner, root)) = policies.last() {
            let Class::Policy(c) = root.class else {
                unreachable!()
            };
            let mut acc: Option<Value> = None;
            for (_, owner, r) in policies.iter().rev() {
                if !combinator_accepts(c, &r.value) {
                    return ReadOutcome::Denied(format!("policy_type_mismatch:{owner}"));
                }
                acc = Some(match acc {
                    None => r.value.clone(),
                    Some(a) => combine(c, &a, &r.value),
                });
            }
            let owners: Vec<String> = policies.iter().map(|(_, o, _)| o.clone()).collect();
            return ReadOutcome::Found {
                reason: format!("combined_from:{}", owners.join("+")),
                value: acc.unwrap_or(Value::Null),
                owner: root_owner.clone(),
                revision: root.revision,
                contributors: owners,
            };
        }
        match along.first() {
            None if expired_own => ReadOutcome::Hidden("record_expired".into()),
            None => ReadOutcome::Hidden("record_not_found".into()),
            Some((pos, owner, r)) if self.visible(r, owner, reader, *pos) => ReadOutcome::Found {
                reason: if matches!(r.class, Class::Secret(_)) && *pos > 0 {
                    "secret_granted".into()
                } else {
                    format!("visible_from:{owner}")
                },
                value: r.value.clone(),
                owner: owner.clone(),
                revision: r.revision,
                contributors: Vec::new(),
            },
            Some((_, owner, _)) => ReadOutcome::Hidden(format!("not_visible_from:{owner}")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &mut self,
        actor: &str,
        owner: Option<&str>,
        ns: &str,
        key: &str,
        value: Value,
        expected: Option<u64>,
        visibility: Option<Vis>,
        class: Option<Class>,
    ) -> WriteOutcome {
        if let Some(r) = self.capability_refusal(actor, "memory.write") {
            return WriteOutcome::Denied(r);
        }
        let owner = owner.unwrap_or(actor);
        if owner != actor {
            return WriteOutcome::Denied("actor_is_not_owner");
        }
        if let Some(c) = &class
            && let Some(problem) = class_problem(c, visibility, &value)
        {
            return WriteOutcome::Invalid(problem);
        }
        if let Some(Class::Secret(grants)) = &class
            && grants.iter().any(|g| !self.agents.contains_key(g))
        {
            return WriteOutcome::Invalid("unknown_grantee");
        }
        let k = (owner.to_string(), ns.to_string(), key.to_string());
        let current = self.records.get(&k);
        let conflict = match (current, expected) {
            (None, Some(n)) => n != 0,
            (Some(c), Some(n)) => c.revision != n,
            (_, None) => false,
        };
        if conflict {
            return WriteOutcome::Conflict(current.map(|c| c.revision));
        }
        let record = Record {
            value,
            visibility: visibility
                .or(current.map(|c| c.visibility))
                .unwrap_or(Vis::Private),
            class: class
                .or(current.map(|c| c.class.clone()))
                .unwrap_or(Class::Preference),
            revision: current.map_or(1, |c| c.revision + 1),
        };
        if let Some(problem) = class_problem(&record.class, Some(record.visibility), &record.value)
        {
            return WriteOutcome::Invalid(problem);
        }
        let rev = record.revision;
        self.records.insert(k, record);
        WriteOutcome::Done(rev)
    }

    pub fn delete(
        &mut self,
        actor: &str,
        owner: Option<&str>,
        ns: &str,
        key: &str,
        expected: Option<u64>,
    ) -> WriteOutcome {
        if let Some(r) = self.capability_refusal(actor, "memory.write") {
            return WriteOutcome::Denied(r);
        }
        let owner = owner.unwrap_or(actor);
        if owner != actor {
            return WriteOutcome::Denied("actor_is_not_owner");
        }
        let k = (owner.to_string(), ns.to_string(), key.to_string());
        match (self.records.get(&k), expected) {
            (None, _) => WriteOutcome::NotFound,
            (Some(c), Some(n)) if c.revision != n => WriteOutcome::Conflict(Some(c.revision)),
            (Some(c), _) => {
                let rev = c.revision;
                self.records.remove(&k);
                WriteOutcome::Done(rev)
            }
        }
    }

    /// Every step's violations (reason kinds), in order.
    pub fn preflight(&self, actor: &str, sop: usize) -> Vec<Vec<String>> {
        let agent_failure = match self.agents.get(actor) {
            None => Some("unknown_agent"),
            Some(a) if !a.active => Some("agent_revoked"),
            Some(_) => None,
        };
        let effective = if self.agents.contains_key(actor) {
            self.effective(actor)
        } else {
            BTreeSet::new()
        };
        let mut seen = BTreeSet::new();
        SOPS[sop]
            .iter()
            .map(|(step_id, action, args)| {
                let mut v: Vec<String> = Vec::new();
                if let Some(f) = agent_failure {
                    v.push(f.into());
                }
                if step_id.is_empty() {
                    v.push("empty_step_id".into());
                } else if !seen.insert(*step_id) {
                    v.push("duplicate_step_id".into());
                }
                if !CATALOGUE.contains(action) {
                    v.push("unknown_action".into());
                    return v;
                }
                // A revoked agent keeps its capabilities on record: both
                // violations are listed.
                if self.agents.contains_key(actor) && !effective.contains(*action) {
                    v.push("action_not_in_effective_capabilities".into());
                }
                let args = args();
                if *action == "memory.write"
                    && args.get("owner_agent_id").is_some_and(|o| o != actor)
                {
                    v.push("cross_owner_memory_write".into());
                }
                if *action == "doc.fetch" {
                    let ok = args
                        .get("doc")
                        .and_then(Value::as_str)
                        .is_some_and(|d| d.chars().count() <= 8);
                    if !ok {
                        v.push("argument_schema_violation".into());
                    }
                }
                v
            })
            .collect()
    }

    /// `Err(())`: the run id is taken by another agent or SOP.
    /// `Ok((violations, created))`.
    pub fn admit(
        &mut self,
        actor: &str,
        sop: usize,
        run: &str,
    ) -> Result<(Vec<Vec<String>>, bool), ()> {
        let mut violations = self.preflight(actor, sop);
        // Then every step against the run's starting envelope (the
        // agent's inherited one).
        if let Some(env) = self.agents.get(actor).and_then(|a| a.envelope.as_ref())
            && violations.iter().all(Vec::is_empty)
        {
            for ((_, action, _), v) in SOPS[sop].iter().zip(&mut violations) {
                if env.denies(action) {
                    v.push("restricted_by".into());
                }
            }
        }
        let admitted = violations.iter().all(Vec::is_empty);
        if !admitted {
            return Ok((violations, false));
        }
        if let Some(r) = self.runs.get(run) {
            return if r.agent == actor && r.sop == sop {
                Ok((violations, false))
            } else {
                Err(())
            };
        }
        self.runs.insert(
            run.to_string(),
            Run {
                agent: actor.to_string(),
                sop,
                outcomes: BTreeMap::new(),
                tickets: BTreeMap::new(),
                stale: BTreeSet::new(),
                envelope: self.agents[actor].envelope.clone().unwrap_or_default(),
            },
        );
        Ok((violations, true))
    }

    /// The agent and step an operation on a run means: `None` is the
    /// run's agent (agent 0 when there is no run) and its first step
    /// without an outcome (the first step when there is none).
    pub fn resolve_step(
        &self,
        actor: Option<usize>,
        run: usize,
        step: Option<usize>,
    ) -> (usize, usize) {
        let r = self.runs.get(RUN_IDS[run]);
        let actor = actor.unwrap_or_else(|| {
            r.and_then(|r| AGENTS.iter().position(|a| *a == r.agent))
                .unwrap_or(0)
        });
        let step = step.unwrap_or_else(|| {
            r.and_then(|r| {
                SOPS[r.sop]
                    .iter()
                    .position(|(s, _, _)| !r.outcomes.contains_key(*s))
            })
            .unwrap_or(0)
        });
        (actor, step)
    }

    fn step_of(&self, actor: &str, run: &str, step: &str) -> Option<(usize, &'static str)> {
        let r = self.runs.get(run).filter(|r| r.agent == actor)?;
        SOPS[r.sop]
            .iter()
            .position(|(s, _, _)| *s == step)
            .map(|i| (i, SOPS[r.sop][i].1))
    }

    pub fn begin(&mut self, actor: &str, run: &str, step: &str) -> BeginOutcome {
        let Some((position, action)) = self.step_of(actor, run, step) else {
            return BeginOutcome::NotFound;
        };
        let active = self.agents.get(actor).is_some_and(|a| a.active);
        let r = self.runs.get_mut(run).unwrap();
        if r.outcomes.contains_key(step) {
            return BeginOutcome::Replay;
        }
        if r.outcomes.values().any(|s| *s != Status::Completed) {
            return BeginOutcome::RunStopped;
        }
        if SOPS[r.sop][..position]
            .iter()
            .any(|(s, _, _)| !r.outcomes.contains_key(*s))
        {
            return BeginOutcome::OutOfOrder;
        }
        // Another begin holds the step's live lease: nothing is decided.
        if !action.starts_with("memory.")
            && r.tickets.get(step).is_some_and(|&until| self.now < until)
        {
            return BeginOutcome::InProgress;
        }
        let denied = if !active {
            Some("agent_revoked".to_string())
        } else if r.envelope.denies(action) {
            Some(format!(
                "restricted_by:{}",
                if action == "crm.lookup" {
                    "no_crm"
                } else {
                    "no_export"
                }
            ))
        } else {
            None
        };
        if let Some(reason) = denied {
            r.outcomes.insert(step.to_string(), Status::Denied);
            if r.tickets.remove(step).is_some() {
                r.stale.insert(step.to_string());
            }
            return BeginOutcome::Denied(reason);
        }
        let constrained = !r.envelope.restrictions.is_empty();
        if !action.starts_with("memory.") {
            r.tickets.insert(step.to_string(), self.now + STEP_LEASE_MS);
            return BeginOutcome::Proceed(constrained);
        }
        // A memory step: the engine performs it as the run's agent and
        // records its outcome (failed when the memory operation is not
        // done), folding nothing new into the envelope.
        let args = SOPS[r.sop][position].2();
        let text = |f: &str| {
            args.get(f)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (ns, key) = (text("namespace"), text("key"));
        let (memory, done) = if action == "memory.read" {
            let out = self.read(actor, &ns, &key);
            let done = matches!(out, ReadOutcome::Found { .. });
            (MemoryStep::Read(out), done)
        } else {
            let value = args.get("value").cloned().unwrap_or(Value::Null);
            let expected = args.get("expected_revision").and_then(Value::as_u64);
            let out = self.write(actor, None, &ns, &key, value, expected, None, None);
            let done = matches!(out, WriteOutcome::Done(_));
            (MemoryStep::Write(out), done)
        };
        let status = if done {
            Status::Completed
        } else {
            Status::Failed
        };
        if let Some(r) = self.runs.get_mut(run) {
            r.outcomes.insert(step.to_string(), status);
            r.tickets.remove(step);
        }
        BeginOutcome::Executed {
            constrained,
            memory,
            status,
        }
    }

    pub fn complete(
        &mut self,
        actor: &str,
        run: &str,
        step: &str,
        labels: &[&str],
        error: bool,
    ) -> CompleteOutcome {
        let Some((_, action)) = self.step_of(actor, run, step) else {
            return CompleteOutcome::NotFound;
        };
        let r = self.runs.get_mut(run).unwrap();
        if r.tickets.remove(step).is_none() {
            return match r.outcomes.get(step) {
                Some(s) => CompleteOutcome::Existing(*s),
                None => CompleteOutcome::NotBegun,
            };
        }
        if let Some(s) = r.outcomes.get(step) {
            return CompleteOutcome::Existing(*s);
        }
        let mut all: BTreeSet<String> = labels.iter().map(|l| l.to_string()).collect();
        all.extend(output_labels(action).iter().map(|l| l.to_string()));
        let (status, folded) = if all.iter().any(|l| base_sensitivity(l).is_none()) {
            (Status::Failed, false)
        } else {
            r.envelope.fold(&all);
            (
                if error {
                    Status::Failed
                } else {
                    Status::Completed
                },
                true,
            )
        };
        r.outcomes.insert(step.to_string(), status);
        CompleteOutcome::Recorded(status, folded)
    }
}

fn output_labels(action: &str) -> &'static [&'static str] {
    match action {
        "doc.fetch" => &["internal_doc"],
        "crm.lookup" => &["customer_name"],
        "finance.read" => &["financial"],
        _ => &[],
    }
}

fn base_sensitivity(label: &str) -> Option<usize> {
    match label {
        "internal_doc" | "customer_name" => Some(1),
        "financial" | "pii" => Some(2),
        _ => None,
    }
}

/// An aggregation rule: all these labels (or derived labels), the
/// sensitivity they imply, the labels they derive, the restrictions they
/// add.
type Rule = (
    &'static [&'static str],
    usize,
    &'static [&'static str],
    &'static [&'static str],
);

/// Labels a declassification may name (derived ones too; the last is
/// unknown).
pub const REMOVABLE: [&str; 6] = [
    "internal_doc",
    "customer_name",
    "financial",
    "pii",
    "customer-profile",
    "mystery",
];

impl Envelope {
    /// Lower to `to` (a ladder index), removing `remove`: allowed to a
    /// declassifier with a justification, never upward, never below what
    /// the labels left imply; restrictions stay.
    fn declassify(&self, to: usize, remove: &[&str]) -> Result<Envelope, &'static str> {
        if remove
            .iter()
            .any(|l| base_sensitivity(l).is_none() && *l != "customer-profile")
        {
            return Err("unknown_label");
        }
        if to > self.sensitivity {
            return Err("declassification_invalid");
        }
        let mut left = Envelope {
            labels: self
                .labels
                .iter()
                .filter(|l| !remove.contains(&l.as_str()))
                .cloned()
                .collect(),
            derived: self
                .derived
                .iter()
                .filter(|l| !remove.contains(&l.as_str()))
                .cloned()
                .collect(),
            restrictions: self.restrictions.clone(),
            sensitivity: 0,
        };
        let labels = left.labels.clone();
        left.fold(&labels);
        // A derived label kept is still known: it implies the level of the
        // rule that derived it.
        for d in &left.derived {
            if d == "customer-profile" {
                left.sensitivity = left.sensitivity.max(3);
            }
        }
        if left.sensitivity > to {
            return Err("declassification_invalid");
        }
        left.sensitivity = to;
        Ok(left)
    }

    /// Whether the envelope's restrictions deny `action`.
    pub fn denies(&self, action: &str) -> bool {
        (action == "report.export" && self.restrictions.contains("no_export"))
            || (action == "crm.lookup" && self.restrictions.contains("no_crm"))
    }

    /// Fold labels in, then apply the aggregation rules to a fixed point.
    pub fn fold(&mut self, labels: &BTreeSet<String>) {
        for l in labels {
            self.labels.insert(l.clone());
            self.sensitivity = self.sensitivity.max(base_sensitivity(l).unwrap_or(4));
        }
        let rules: [Rule; 2] = [
            (
                &["customer_name", "financial"],
                3,
                &["customer-profile"],
                &["no_export"],
            ),
            (&["customer-profile", "pii"], 3, &[], &["no_crm"]),
        ];
        loop {
            let mut changed = false;
            for (all, sens, derived, restrict) in rules {
                let holds = all
                    .iter()
                    .all(|l| self.labels.contains(*l) || self.derived.contains(*l));
                if holds {
                    let before = (
                        self.derived.len(),
                        self.restrictions.len(),
                        self.sensitivity,
                    );
                    self.derived.extend(derived.iter().map(|s| s.to_string()));
                    self.restrictions
                        .extend(restrict.iter().map(|s| s.to_string()));
                    self.sensitivity = self.sensitivity.max(sens);
                    changed |= before
                        != (
                            self.derived.len(),
                            self.restrictions.len(),
                            self.sensitivity,
                        );
                }
            }
            if !changed {
                break;
            }
        }
    }
}

fn combine(c: &str, a: &Value, b: &Value) -> Value {
    match c {
        "all" => json!(a.as_bool() == Some(true) && b.as_bool() == Some(true)),
        "any" => json!(a.as_bool() == Some(true) || b.as_bool() == Some(true)),
        "min" => json!(a.as_i64().unwrap().min(b.as_i64().unwrap())),
        "max" => json!(a.as_i64().unwrap().max(b.as_i64().unwrap())),
        _ => {
            let bs = b.as_array().unwrap();
            Value::Array(
                a.as_array()
                    .unwrap()
                    .iter()
                    .filter(|x| bs.contains(x))
                    .cloned()
                    .collect(),
            )
        }
    }
}

/// Why a record of `class` with `visibility` and `value` would be invalid.
fn class_problem(class: &Class, visibility: Option<Vis>, value: &Value) -> Option<&'static str> {
    match class {
        Class::Policy(c) if !combinator_accepts(c, value) => {
            Some("policy_value_does_not_fit_combinator")
        }
        Class::Secret(_) | Class::Task(_) if visibility.is_some_and(|v| v != Vis::Private) => {
            Some("class_is_private_only")
        }
        _ => None,
    }
}
