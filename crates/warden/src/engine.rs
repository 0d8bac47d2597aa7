//! The [`Engine`]: the core's rules applied to a [`Store`], with every
//! decision recorded.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use warden_core::audit::AuditDraft;
use warden_core::audit::Digest;
use warden_core::bundle::{Policy, seed_class, seed_spec};
use warden_core::canonical::to_canonical;
use warden_core::decision::{Decision, Reason, Subject, Verdict, reasons};
use warden_core::envelope::EnvelopeId;
use warden_core::hierarchy::{AgentIdx, AgentSpec, AgentStatus, Hierarchy, HierarchyError};
use warden_core::ids::{ActionName, AgentId, Key, Namespace, RunId};
use warden_core::lockdown::{self, Sanitised};
use warden_core::memory::{
    Combinator, Contributor, MemoryRecord, Put, RecordClass, Resolution, Visibility, check_write,
    resolve,
};
use warden_core::preflight::{Preflight, PreflightContext, preflight};
use warden_core::sop::Sop;
use warden_core::time::Timestamp;
use warden_store::{
    CreateRun, Delete, DeleteOutcome, PutOutcome, RunRecord, RunStep, Store, StoredAgent,
};

use crate::clock::Clock;
use crate::context::DelegationOptions;
use crate::error::EngineError;

/// Operation names recorded in the decision log.
pub mod ops {
    /// Register an agent.
    pub const AGENT_REGISTER: &str = "agent.register";
    /// Revoke an agent (and its descendants).
    pub const AGENT_REVOKE: &str = "agent.revoke";
    /// Read memory.
    pub const MEMORY_READ: &str = "memory.read";
    /// Write memory.
    pub const MEMORY_WRITE: &str = "memory.write";
    /// Delete memory.
    pub const MEMORY_DELETE: &str = "memory.delete";
    /// Preflight an SOP.
    pub const SOP_VALIDATE: &str = "sop.validate";
    /// Admit a run.
    pub const RUN_ADMIT: &str = "run.admit";
    /// Gate one step.
    pub const STEP_BEGIN: &str = "step.begin";
    /// Record a step's outcome.
    pub const STEP_COMPLETE: &str = "step.complete";
    /// A run's context envelope was opened.
    pub const CONTEXT_OPEN: &str = "context.open";
    /// A step's result was folded into its run's envelope.
    pub const CONTEXT_ACCUMULATE: &str = "context.accumulate";
    /// A child's envelope was built from its parent's.
    pub const CONTEXT_DELEGATE: &str = "context.delegate";
    /// An envelope was declassified (or a declassification refused).
    pub const CONTEXT_DECLASSIFY: &str = "context.declassify";
    /// An envelope was signed for a trust boundary.
    pub const CONTEXT_EXPORT: &str = "context.export";
    /// A receipt was issued for an envelope.
    pub const CONTEXT_RECEIPT: &str = "context.receipt";
    /// An escalation was approved (or an approval refused).
    pub const ESCALATION_APPROVE: &str = "escalation.approve";
    /// An escalation was rejected (or a rejection refused).
    pub const ESCALATION_REJECT: &str = "escalation.reject";
}

/// Extra reason codes the engine records.
pub mod engine_reasons {
    use warden_core::decision::Reason;
    /// The agent was created from the policy bundle.
    pub const BUNDLE_SEED: Reason = Reason::code("bundle_seed");
    /// A duplicate id.
    pub const DUPLICATE_AGENT: Reason = Reason::code("duplicate_agent");
    /// The parent is unknown.
    pub const UNKNOWN_PARENT: Reason = Reason::code("unknown_parent");
    /// The parent is revoked.
    pub const PARENT_REVOKED: Reason = Reason::code("parent_revoked");
    /// The hierarchy would be too deep.
    pub const DEPTH_EXCEEDED: Reason = Reason::code("depth_exceeded");
    /// A cycle.
    pub const HIERARCHY_CYCLE: Reason = Reason::code("hierarchy_cycle");
    /// The caller is neither the operator nor an ancestor.
    pub const NOT_AN_ANCESTOR: Reason = Reason::code("not_an_ancestor");
    /// A delegating agent may only create its own children.
    pub const NOT_OWN_CHILD: Reason = Reason::code("not_own_child");
    /// Revocation of an agent and its descendants.
    pub const REVOKED: Reason = Reason::code("revoked");
    /// An admitted run.
    pub const RUN_ADMITTED: Reason = Reason::code("run_admitted");
    /// A rejected run.
    pub const RUN_REJECTED: Reason = Reason::code("run_rejected");
    /// A step whose outcome was already recorded.
    pub const STEP_REPLAYED: Reason = Reason::code("step_replayed");
    /// An earlier step failed or was denied.
    pub const RUN_STOPPED: Reason = Reason::code("run_stopped");
    /// A step begun before the steps before it completed.
    pub const STEP_OUT_OF_ORDER: Reason = Reason::code("step_out_of_order");
    /// A step's outcome recorded.
    pub const STEP_RECORDED: Reason = Reason::code("step_recorded");
    /// A step that failed.
    pub const STEP_FAILED: Reason = Reason::code("step_failed");
    /// Handlers were missing after admission.
    pub const MISSING_HANDLERS: Reason = Reason::code("missing_handlers");
    /// A run's root envelope was created (empty, `public`).
    pub const CONTEXT_CREATED: Reason = Reason::code("context_created");
    /// Capabilities a delegated child asked for were removed because its
    /// envelope restricts them.
    pub const AUTHORITY_NARROWED: Reason = Reason::code("delegated_authority_narrowed");
    /// A request that escalated before proceeds on an approval.
    pub const ESCALATION_APPROVED: Reason = Reason::code("escalation_approved");
    /// An approval was used by the request it covers.
    pub const ESCALATION_CONSUMED: Reason = Reason::code("escalation_consumed");
    /// A reviewer rejected the escalation; the request is denied.
    pub const ESCALATION_REJECTED: Reason = Reason::code("escalation_rejected");
    /// The escalation was already approved, rejected or used.
    pub const ESCALATION_NOT_PENDING: Reason = Reason::code("escalation_not_pending");
    /// The reviewer may not review this escalation (its own request, or not
    /// an ancestor of the requesting agent).
    pub const ESCALATION_REVIEWER_NOT_AUTHORIZED: Reason =
        Reason::code("escalation_reviewer_not_authorized");
    /// An envelope was signed for export.
    pub const ENVELOPE_EXPORTED: Reason = Reason::code("envelope_exported");
    /// A receipt was issued.
    pub const RECEIPT_ISSUED: Reason = Reason::code("receipt_issued");
    /// A step completed although the run's restrictions deny it: the gate
    /// was bypassed. Its labels are folded and the run stops.
    pub const COMPLETED_WITHOUT_GATE: Reason = Reason::code("completed_without_gate");
}

use engine_reasons as er;

/// Who is calling: the operator, or an agent (always from the runtime
/// credential, never from a payload).
pub type Caller = Subject;

/// A registration request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterAgent {
    /// The new agent's id.
    pub id: AgentId,
    /// Its parent (for delegation through [`Engine::delegate`], the caller).
    #[serde(default)]
    pub parent: Option<AgentId>,
    /// Declared capabilities.
    #[serde(default)]
    pub capabilities: BTreeSet<ActionName>,
    /// Tools a pre-built child was constructed with. `Some` marks the child
    /// as pre-built: a write surface is refused. `None` means the parent
    /// builds it from this spec: its config is sanitised.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// The child's framework config.
    #[serde(default)]
    pub config: Option<Value>,
}

/// An agent as the engine reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentView {
    /// Its id.
    pub agent_id: AgentId,
    /// Its parent.
    pub parent_id: Option<AgentId>,
    /// Itself and its ancestors, nearest first.
    pub lineage: Vec<AgentId>,
    /// Declared capabilities.
    pub declared_capabilities: Vec<ActionName>,
    /// Effective capabilities.
    pub effective_capabilities: Vec<ActionName>,
    /// Active or revoked.
    pub status: AgentStatus,
    /// The config as stored (sanitised).
    pub config: Option<Value>,
    /// The context envelope it inherited when it was delegated, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope_id: Option<EnvelopeId>,
}

/// What [`Engine::apply_agents`] changed in the engine's cached hierarchy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppliedAgents {
    /// Agents the cache did not know, now registered (parents first).
    pub registered: Vec<AgentId>,
    /// Agents active in the cache before, revoked now (a revoked agent's
    /// cached descendants are revoked with it).
    pub revoked: Vec<AgentId>,
    /// Agents whose declared capabilities changed (their effective sets and
    /// their descendants' were recomputed).
    pub capabilities_changed: Vec<AgentId>,
}

impl AppliedAgents {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.registered.is_empty()
            && self.revoked.is_empty()
            && self.capabilities_changed.is_empty()
    }
}

/// A resolved value with its provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedValue {
    /// The value.
    pub value: Value,
    /// The record's owner (for a combined policy value, the root-most
    /// contributor).
    pub owner_agent_id: AgentId,
    /// Visibility of the record.
    pub visibility: Visibility,
    /// Class name.
    pub class: String,
    /// Revision of the record.
    pub revision: u64,
    /// The combinator, for a `policy` value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub combinator: Option<Combinator>,
    /// Every contributing record, for a `policy` value.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub contributors: Vec<Contributor>,
}

/// The outcome of a read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadOutcome {
    /// The decision (recorded).
    pub decision: Decision,
    /// The value, when allowed.
    pub value: Option<ResolvedValue>,
}

/// The outcome of a write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteOutcome {
    /// The decision (recorded).
    pub decision: Decision,
    /// The stored record, when allowed.
    pub record: Option<MemoryRecord>,
    /// The current revision, on a conflict.
    pub current_revision: Option<u64>,
}

/// The outcome of a delete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeleteResult {
    /// The decision (recorded).
    pub decision: Decision,
    /// The deleted revision, when allowed.
    pub revision: Option<u64>,
    /// The current revision, on a conflict.
    pub current_revision: Option<u64>,
}

/// A write request in the owner's terms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteRequest {
    /// Namespace.
    pub namespace: Namespace,
    /// Key.
    pub key: Key,
    /// Value.
    pub value: Value,
    /// Owner scope; defaults to the caller. Any other owner is denied.
    #[serde(default)]
    pub owner_agent_id: Option<AgentId>,
    /// Compare-and-set revision (0 = create only).
    #[serde(default)]
    pub expected_revision: Option<u64>,
    /// Visibility (kept on update when absent).
    #[serde(default)]
    pub visibility: Option<Visibility>,
    /// Class (kept on update when absent).
    #[serde(default)]
    pub class: Option<RecordClass>,
}

pub(crate) struct State {
    pub(crate) hierarchy: Hierarchy,
    pub(crate) configs: HashMap<AgentId, Option<Value>>,
    /// Agent -> the envelope it inherited when it was delegated.
    pub(crate) envelopes: HashMap<AgentId, EnvelopeId>,
}

pub(crate) struct Inner<S> {
    pub(crate) policy: Arc<Policy>,
    pub(crate) store: S,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) state: RwLock<State>,
    /// Serialises hierarchy changes so validation and commit see one state.
    pub(crate) registry: tokio::sync::Mutex<()>,
}

/// The governance engine. Cheap to clone; all clones share state.
pub struct Engine<S> {
    pub(crate) inner: Arc<Inner<S>>,
}

impl<S> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

fn hierarchy_reason(e: &HierarchyError) -> Reason {
    match e {
        HierarchyError::DuplicateAgent(_) => er::DUPLICATE_AGENT,
        HierarchyError::UnknownParent { .. } => er::UNKNOWN_PARENT,
        HierarchyError::ParentRevoked { .. } => er::PARENT_REVOKED,
        HierarchyError::TooDeep { .. } => er::DEPTH_EXCEEDED,
        HierarchyError::Cycle(_) => er::HIERARCHY_CYCLE,
        HierarchyError::UnknownAgent(_) => reasons::UNKNOWN_AGENT,
        HierarchyError::Full => er::DEPTH_EXCEEDED,
    }
}

impl<S: Store> Engine<S> {
    /// Open an engine over `store`. On a store with no agents, the bundle's
    /// agents and memory are seeded (and recorded); on an existing store,
    /// agents are loaded and bundle agents not yet present are added.
    pub async fn open(
        policy: Policy,
        store: S,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, EngineError> {
        let policy = Arc::new(policy);
        let stored = store.load_agents().await?;
        let first_start = stored.is_empty();
        let index_of = |a: &ActionName| policy.action_index(a);
        let mut hierarchy = policy.empty_hierarchy();
        let specs: Vec<AgentSpec> = stored.iter().map(StoredAgent::spec).collect();
        hierarchy.register_all(&specs, &index_of)?;
        let mut configs = HashMap::new();
        let mut envelopes = HashMap::new();
        for a in &stored {
            configs.insert(a.id.clone(), a.config.clone());
            if let Some(e) = &a.envelope_id {
                envelopes.insert(a.id.clone(), e.clone());
            }
            if a.status == AgentStatus::Revoked {
                hierarchy.revoke(a.id.as_str())?;
            }
        }
        let engine = Self {
            inner: Arc::new(Inner {
                policy: Arc::clone(&policy),
                store,
                clock,
                state: RwLock::new(State {
                    hierarchy,
                    configs,
                    envelopes,
                }),
                registry: tokio::sync::Mutex::new(()),
            }),
        };
        engine.seed(first_start).await?;
        Ok(engine)
    }

    async fn seed(&self, with_memory: bool) -> Result<(), EngineError> {
        let policy = Arc::clone(&self.inner.policy);
        // Bundle order may list children before parents; register parents
        // first by repeated passes (the bundle was validated at compile).
        let mut pending: Vec<_> = policy
            .agents
            .iter()
            .filter(|a| {
                self.read_state()
                    .map(|s| s.hierarchy.index_of(a.id.as_str()).is_none())
                    .unwrap_or(false)
            })
            .collect();
        while !pending.is_empty() {
            let before = pending.len();
            let mut rest = Vec::new();
            for seed in pending {
                let ready = match &seed.parent {
                    None => true,
                    Some(p) => self.read_state()?.hierarchy.index_of(p.as_str()).is_some(),
                };
                if !ready {
                    rest.push(seed);
                    continue;
                }
                if self.is_cached(&seed.id)? {
                    // Seeded meanwhile by another node sharing the store.
                    continue;
                }
                let now = self.now();
                let spec = seed_spec(seed);
                let stored = StoredAgent {
                    id: seed.id.clone(),
                    parent: seed.parent.clone(),
                    capabilities: spec.capabilities.clone(),
                    tools: seed.tools.clone(),
                    config: seed.config.clone(),
                    status: AgentStatus::Active,
                    created_at: now,
                    envelope_id: None,
                };
                let decision = self.decision(
                    &Caller::Operator,
                    Verdict::Allow,
                    er::BUNDLE_SEED,
                    ops::AGENT_REGISTER,
                    seed.id.to_string(),
                    now,
                );
                match self
                    .commit_agent(spec, stored, vec![AuditDraft::from_decision(&decision)])
                    .await
                {
                    Ok(()) => {}
                    // Another node sharing the store, starting at the same
                    // time, seeded it first (and recorded it): take the
                    // stored agents and carry on.
                    Err(EngineError::Store(warden_store::StoreError::Duplicate { .. })) => {
                        self.reload_agents().await?;
                    }
                    Err(e) => return Err(e),
                }
            }
            if rest.len() == before {
                break;
            }
            pending = rest;
        }
        if with_memory {
            for m in &policy.memory {
                let class = seed_class(m).map_err(|message| EngineError::Invalid {
                    field: "memory".into(),
                    message,
                })?;
                let put = Put {
                    owner: m.owner.clone(),
                    namespace: m.namespace.clone(),
                    key: m.key.clone(),
                    value: m.value.clone(),
                    expected_revision: Some(0),
                    visibility: Some(m.visibility),
                    class: Some(class),
                };
                let now = self.now();
                let template = self.decision(
                    &Caller::Operator,
                    Verdict::Allow,
                    er::BUNDLE_SEED,
                    ops::MEMORY_WRITE,
                    format!("{}:{}.{}", m.owner, m.namespace, m.key),
                    now,
                );
                self.inner
                    .store
                    .put_record(
                        put,
                        now,
                        warden_store::StorageQuota::default(),
                        Box::new(move |outcome| match outcome {
                            PutOutcome::Written { .. } => {
                                vec![AuditDraft::from_decision(&template)]
                            }
                            _ => Vec::new(),
                        }),
                    )
                    .await?;
            }
        }
        Ok(())
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The clock's current time.
    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    pub(crate) fn read_state(&self) -> Result<RwLockReadGuard<'_, State>, EngineError> {
        self.inner.state.read().map_err(|_| EngineError::Poisoned)
    }

    fn write_state(&self) -> Result<RwLockWriteGuard<'_, State>, EngineError> {
        self.inner.state.write().map_err(|_| EngineError::Poisoned)
    }

    pub(crate) fn decision(
        &self,
        caller: &Caller,
        verdict: Verdict,
        reason: Reason,
        operation: &str,
        resource: String,
        now: Timestamp,
    ) -> Decision {
        Decision {
            verdict,
            reason,
            subject: caller.clone(),
            operation: operation.to_owned(),
            resource,
            policy_version: self.inner.policy.version.clone(),
            obligations: Vec::new(),
            time: now,
        }
    }

    pub(crate) fn draft(&self, decision: &Decision) -> AuditDraft {
        AuditDraft::from_decision(decision)
    }

    pub(crate) async fn record(&self, decision: &Decision) -> Result<(), EngineError> {
        self.inner
            .store
            .append_audit(vec![self.draft(decision)])
            .await?;
        Ok(())
    }

    async fn commit_agent(
        &self,
        spec: AgentSpec,
        stored: StoredAgent,
        audit: Vec<AuditDraft>,
    ) -> Result<(), EngineError> {
        let index_of = |a: &ActionName| self.inner.policy.action_index(a);
        let prepared = self.read_state()?.hierarchy.prepare(&spec, &index_of)?;
        let config = stored.config.clone();
        let envelope = stored.envelope_id.clone();
        self.inner.store.insert_agent(stored, audit).await?;
        let mut state = self.write_state()?;
        state.hierarchy.commit(prepared)?;
        if let Some(e) = envelope {
            state.envelopes.insert(spec.id.clone(), e);
        }
        state.configs.insert(spec.id, config);
        Ok(())
    }

    // ------------------------------------------------------------------
    // Agents
    // ------------------------------------------------------------------

    /// Register an agent. The operator may register any agent; an agent may
    /// register only its own children (see [`Engine::delegate`]).
    ///
    /// Delegated children pass delegation lockdown: a pre-built child
    /// (`tools` given) with a block-write tool or self-edit flag is refused;
    /// a child built from a spec has its self-edit flag cleared. Refusals
    /// and sanitisations are recorded; a refused child leaves no agent.
    ///
    /// With a `context:` policy, a child whose parent holds an inherited
    /// envelope inherits from it (see [`Engine::register_agent_with`]).
    pub async fn register_agent(
        &self,
        caller: &Caller,
        req: RegisterAgent,
    ) -> Result<AgentView, EngineError> {
        self.register_agent_with(caller, req, DelegationOptions::default())
            .await
    }

    /// Register an agent with delegation options: the one path every
    /// registration and delegation goes through.
    ///
    /// Beyond [`Engine::register_agent`], when the policy has a `context:`
    /// section and the new agent has a parent, the child's envelope is built
    /// with `Envelope::delegate` from (first that applies) the envelope of
    /// `options.from_run` (a run of the parent), the parent's own inherited
    /// envelope, or, when `options.restrictions` are declared, an empty
    /// envelope of the parent. The delegation is decided against that source
    /// envelope: `deny` refuses it ([`EngineError::Denied`]), `escalate`
    /// holds it for review ([`EngineError::Escalated`]; an approval lets the
    /// same parent, child and run through once); both are recorded and
    /// create nothing. A permitted child's declared capabilities are
    /// narrowed to `effective_delegated_authority` (delegator ∩ delegatee ∩
    /// what the envelope's restrictions allow ∩ environment), recorded as
    /// `delegated_authority_narrowed`, and its runs start from its envelope.
    pub async fn register_agent_with(
        &self,
        caller: &Caller,
        mut req: RegisterAgent,
        options: DelegationOptions,
    ) -> Result<AgentView, EngineError> {
        let _guard = self.inner.registry.lock().await;
        let now = self.now();
        let resource = req.id.to_string();
        let deny = |reason: Reason| {
            self.decision(
                caller,
                Verdict::Deny,
                reason,
                ops::AGENT_REGISTER,
                resource.clone(),
                now,
            )
        };

        if let Caller::Agent(a) = caller
            && req.parent.as_ref() != Some(a)
        {
            let d = deny(er::NOT_OWN_CHILD);
            self.record(&d).await?;
            return Err(EngineError::Denied(Box::new(d)));
        }
        if let Caller::Agent(a) = caller {
            let active = self
                .read_state()?
                .hierarchy
                .get(a.as_str())
                .is_some_and(|n| n.is_active());
            if !active {
                let d = deny(reasons::AGENT_REVOKED);
                self.record(&d).await?;
                return Err(EngineError::Denied(Box::new(d)));
            }
        }

        let mut audit = Vec::new();
        let mut config = req.config.clone();
        let tools = req.tools.clone().unwrap_or_default();
        if req.parent.is_some() {
            let checked = match &req.tools {
                Some(tools) => {
                    lockdown::check_prebuilt_child(tools, req.config.as_ref()).map(|()| None)
                }
                None => match &req.config {
                    None => Ok(None),
                    Some(c) => lockdown::sanitise_child_config(c).map(|s| match s {
                        Sanitised::Unchanged(_) => None,
                        Sanitised::Cleared(v) => Some(v),
                    }),
                },
            };
            match checked {
                Err(e) => {
                    let d = deny(e.reason());
                    self.record(&d).await?;
                    return Err(EngineError::Lockdown(e));
                }
                Ok(Some(cleaned)) => {
                    let d = self.decision(
                        caller,
                        Verdict::Constrain,
                        lockdown::CHILD_SELF_EDIT_SANITISED,
                        ops::AGENT_REGISTER,
                        resource.clone(),
                        now,
                    );
                    audit.push(self.draft(&d));
                    config = Some(cleaned);
                }
                Ok(None) => {}
            }
        }

        let spec = AgentSpec {
            id: req.id.clone(),
            parent: req.parent.clone(),
            capabilities: req.capabilities.clone(),
        };
        let index_of = |a: &ActionName| self.inner.policy.action_index(a);
        let mut prepared = self.read_state()?.hierarchy.prepare(&spec, &index_of);
        if let Err(HierarchyError::UnknownParent { .. }) = prepared {
            // The parent may have been registered by another node sharing
            // the store moments ago: look again before refusing.
            self.reload_agents_locked().await?;
            prepared = self.read_state()?.hierarchy.prepare(&spec, &index_of);
        }
        if let Err(e) = prepared {
            let d = deny(hierarchy_reason(&e));
            self.record(&d).await?;
            return Err(EngineError::Hierarchy(e));
        }
        // Context: decide the delegation against the envelope the child
        // inherits, build the child's envelope, narrow its authority.
        let child_context = self
            .delegation_context(caller, &mut req, &options, now, &mut audit)
            .await?;
        let mut d = self.decision(
            caller,
            Verdict::Allow,
            reasons::AGENT_REGISTERED,
            ops::AGENT_REGISTER,
            resource,
            now,
        );
        let mut draft_details = Value::Null;
        if let Some(c) = &child_context {
            d.verdict = c.verdict;
            d.obligations = c.obligations.clone();
            draft_details = c.details.clone();
        }
        audit.push(self.draft(&d).with_details(draft_details));
        let spec = AgentSpec {
            id: req.id.clone(),
            parent: req.parent.clone(),
            capabilities: req.capabilities.clone(),
        };
        let mut envelope_id = None;
        if let Some(c) = child_context {
            // Envelopes first: one nothing references yet is inert if the
            // agent insert below fails; the transition entries commit with
            // the agent.
            for record in c.records {
                self.create_envelope(record).await?;
            }
            envelope_id = Some(c.envelope_id);
        }
        let stored = StoredAgent {
            id: req.id.clone(),
            parent: req.parent.clone(),
            capabilities: req.capabilities,
            tools,
            config,
            status: AgentStatus::Active,
            created_at: now,
            envelope_id,
        };
        self.commit_agent(spec, stored, audit).await?;
        self.agent(&req.id)
    }

    /// Register a child of `parent` (delegation): the child's effective
    /// capabilities are within the parent's, and lockdown applies. A parent
    /// holding an inherited envelope passes it on.
    pub async fn delegate(
        &self,
        parent: &AgentId,
        req: RegisterAgent,
    ) -> Result<AgentView, EngineError> {
        self.delegate_with(parent, req, DelegationOptions::default())
            .await
    }

    /// Register a child of `parent` that inherits the envelope of
    /// `from_run` (a run of `parent`): see [`Engine::register_agent_with`].
    pub async fn delegate_from_run(
        &self,
        parent: &AgentId,
        req: RegisterAgent,
        from_run: RunId,
    ) -> Result<AgentView, EngineError> {
        let options = DelegationOptions {
            from_run: Some(from_run),
            ..DelegationOptions::default()
        };
        self.delegate_with(parent, req, options).await
    }

    /// Register a child of `parent` with delegation options: see
    /// [`Engine::register_agent_with`].
    pub async fn delegate_with(
        &self,
        parent: &AgentId,
        mut req: RegisterAgent,
        options: DelegationOptions,
    ) -> Result<AgentView, EngineError> {
        req.parent = Some(parent.clone());
        self.register_agent_with(&Caller::Agent(parent.clone()), req, options)
            .await
    }

    /// An agent with its lineage and capabilities.
    pub fn agent(&self, id: &AgentId) -> Result<AgentView, EngineError> {
        let state = self.read_state()?;
        let h = &state.hierarchy;
        let idx = h
            .index_of(id.as_str())
            .ok_or_else(|| EngineError::UnknownAgent(id.to_string()))?;
        let node = h
            .node(idx)
            .ok_or_else(|| EngineError::UnknownAgent(id.to_string()))?;
        Ok(AgentView {
            agent_id: node.id().clone(),
            parent_id: node
                .parent()
                .and_then(|p| h.node(p))
                .map(|n| n.id().clone()),
            lineage: h.lineage(idx).map(|(_, n)| n.id().clone()).collect(),
            declared_capabilities: node.declared().iter().cloned().collect(),
            effective_capabilities: self.inner.policy.action_names(node.effective()),
            status: node.status(),
            config: state.configs.get(id).cloned().flatten(),
            envelope_id: state.envelopes.get(id).cloned(),
        })
    }

    /// Whether `caller` may see or manage `target`: the operator, the agent
    /// itself, or one of its ancestors.
    pub fn may_manage(
        &self,
        caller: &Caller,
        target: &AgentId,
        include_self: bool,
    ) -> Result<bool, EngineError> {
        let Caller::Agent(a) = caller else {
            return Ok(true);
        };
        if a == target {
            return Ok(include_self);
        }
        let state = self.read_state()?;
        let h = &state.hierarchy;
        let (Some(ai), Some(ti)) = (h.index_of(a.as_str()), h.index_of(target.as_str())) else {
            return Ok(false);
        };
        Ok(h.node(ai).is_some_and(|n| n.is_active()) && h.is_ancestor(ai, ti))
    }

    /// Revoke an agent and its descendants. The operator or an ancestor may
    /// revoke; the revocation is recorded and takes effect at once.
    pub async fn revoke_agent(
        &self,
        caller: &Caller,
        id: &AgentId,
    ) -> Result<Vec<AgentId>, EngineError> {
        let _guard = self.inner.registry.lock().await;
        let now = self.now();
        if !self.is_cached(id)? {
            // Registered by another node moments ago?
            self.reload_agents_locked().await?;
        }
        if !self.is_cached(id)? {
            return Err(EngineError::UnknownAgent(id.to_string()));
        }
        if !self.may_manage(caller, id, false)? {
            let d = self.decision(
                caller,
                Verdict::Deny,
                er::NOT_AN_ANCESTOR,
                ops::AGENT_REVOKE,
                id.to_string(),
                now,
            );
            self.record(&d).await?;
            return Err(EngineError::Denied(Box::new(d)));
        }
        // Compute the subtree on a copy, persist, then apply.
        let mut copy = self.read_state()?.hierarchy.clone();
        let revoked = copy.revoke(id.as_str())?;
        let d = self.decision(
            caller,
            Verdict::Allow,
            er::REVOKED,
            ops::AGENT_REVOKE,
            id.to_string(),
            now,
        );
        let draft = self.draft(&d).with_details(json!({
            "revoked": revoked.iter().map(|a| a.as_str()).collect::<Vec<_>>()
        }));
        self.inner
            .store
            .set_agent_status(revoked.clone(), AgentStatus::Revoked, vec![draft])
            .await?;
        self.write_state()?.hierarchy.revoke(id.as_str())?;
        Ok(revoked)
    }

    /// Apply a revocation made elsewhere (another node) to this engine's
    /// cached hierarchy without recording it again.
    pub fn apply_remote_revocation(&self, id: &AgentId) -> Result<(), EngineError> {
        self.write_state()?.hierarchy.revoke(id.as_str())?;
        Ok(())
    }

    // ------------------------------------------------------------------
    // Agents changed by other nodes
    // ------------------------------------------------------------------

    /// Reconcile the cached hierarchy with agents as stored (changed by
    /// another node sharing the store), without recording anything: the
    /// node that made each change recorded its decision.
    ///
    /// Agents the cache does not know are registered, parents before
    /// children (a parent must be cached or among `agents`); a stored
    /// revocation is applied with its cached descendants (revocation is
    /// final: an agent revoked in the cache stays revoked); changed
    /// declared capabilities are replaced and the effective sets below them
    /// recomputed; configs and inherited envelope ids are kept as stored.
    /// Agents already cached as stored change nothing, so applying a change
    /// twice is harmless.
    ///
    /// The new hierarchy is built aside and swapped in whole: on an error
    /// (an agent whose parent is unknown, a hierarchy the policy's limits
    /// refuse) the cache is unchanged. Serialised with this node's own
    /// registrations and revocations.
    pub async fn apply_agents(
        &self,
        agents: Vec<StoredAgent>,
    ) -> Result<AppliedAgents, EngineError> {
        let _guard = self.inner.registry.lock().await;
        self.apply_agents_locked(agents)
    }

    /// Reconcile the cached hierarchy with every stored agent
    /// ([`Store::load_agents`] then [`Engine::apply_agents`]): what a node
    /// does after missing changes (a reconnect) and periodically.
    pub async fn reload_agents(&self) -> Result<AppliedAgents, EngineError> {
        let _guard = self.inner.registry.lock().await;
        self.reload_agents_locked().await
    }

    /// Make sure `id` is cached if it is stored: when the cache does not
    /// know it (another node registered it moments ago), reload the agents
    /// from the store. Returns whether the agent is known now. A request
    /// for an agent this node has not yet heard of thus sees it at once.
    pub async fn refresh_agent(&self, id: &AgentId) -> Result<bool, EngineError> {
        if self.is_cached(id)? {
            return Ok(true);
        }
        let _guard = self.inner.registry.lock().await;
        // Another request may have reloaded while this one waited.
        if !self.is_cached(id)? {
            self.reload_agents_locked().await?;
        }
        self.is_cached(id)
    }

    fn is_cached(&self, id: &AgentId) -> Result<bool, EngineError> {
        Ok(self.read_state()?.hierarchy.index_of(id.as_str()).is_some())
    }

    async fn reload_agents_locked(&self) -> Result<AppliedAgents, EngineError> {
        let stored = self.inner.store.load_agents().await?;
        self.apply_agents_locked(stored)
    }

    /// [`Engine::apply_agents`] with the registry lock held.
    fn apply_agents_locked(&self, agents: Vec<StoredAgent>) -> Result<AppliedAgents, EngineError> {
        let mut applied = AppliedAgents::default();
        // Classify under the read lock: usually nothing changed.
        let (specs, revoked, configs, envelopes) = {
            let state = self.read_state()?;
            let h = &state.hierarchy;
            let mut changed: HashMap<&AgentId, &StoredAgent> = HashMap::new();
            let mut fresh: Vec<&StoredAgent> = Vec::new();
            for a in &agents {
                match h.get(a.id.as_str()) {
                    None => {
                        if !fresh.iter().any(|f| f.id == a.id) {
                            applied.registered.push(a.id.clone());
                            fresh.push(a);
                        }
                    }
                    Some(node) => {
                        if a.status == AgentStatus::Revoked && node.is_active() {
                            applied.revoked.push(a.id.clone());
                        }
                        if node.declared() != &a.capabilities {
                            applied.capabilities_changed.push(a.id.clone());
                        }
                        changed.insert(&a.id, a);
                    }
                }
            }
            if applied.is_empty() {
                // Configs and inherited envelope ids are set once, at
                // registration: a cached agent already has them.
                return Ok(applied);
            }
            // Every agent, cached order first (then the new ones), with its
            // declared capabilities as stored and its status: revoked if
            // the cache or the store says so.
            let mut specs: Vec<AgentSpec> = Vec::with_capacity(h.len() + fresh.len());
            let mut revoked: Vec<AgentId> = Vec::new();
            for (_, node) in h.iter() {
                let parent = node
                    .parent()
                    .and_then(|p| h.node(p))
                    .map(|p| p.id().clone());
                let stored = changed.get(node.id());
                let capabilities =
                    stored.map_or_else(|| node.declared().clone(), |a| a.capabilities.clone());
                if !node.is_active() || stored.is_some_and(|a| a.status == AgentStatus::Revoked) {
                    revoked.push(node.id().clone());
                }
                specs.push(AgentSpec {
                    id: node.id().clone(),
                    parent,
                    capabilities,
                });
            }
            for a in &fresh {
                if a.status == AgentStatus::Revoked {
                    revoked.push(a.id.clone());
                }
                specs.push(a.spec());
            }
            let mut configs = state.configs.clone();
            let mut envelopes = state.envelopes.clone();
            for a in &agents {
                configs.insert(a.id.clone(), a.config.clone());
                if let Some(e) = &a.envelope_id {
                    envelopes.insert(a.id.clone(), e.clone());
                }
            }
            (specs, revoked, configs, envelopes)
        };
        // Rebuild aside: registering everything active first, then revoking,
        // also places an agent stored under a parent revoked meanwhile.
        let index_of = |a: &ActionName| self.inner.policy.action_index(a);
        let mut hierarchy = self.inner.policy.empty_hierarchy();
        hierarchy.register_all(&specs, &index_of)?;
        for id in &revoked {
            hierarchy.revoke(id.as_str())?;
        }
        // Descendants revoked with a newly revoked agent count as revoked.
        {
            let state = self.read_state()?;
            applied.revoked = hierarchy
                .iter()
                .filter(|(_, n)| !n.is_active())
                .filter(|(_, n)| {
                    state
                        .hierarchy
                        .get(n.id().as_str())
                        .is_some_and(|old| old.is_active())
                })
                .map(|(_, n)| n.id().clone())
                .collect();
        }
        let mut state = self.write_state()?;
        state.hierarchy = hierarchy;
        state.configs = configs;
        state.envelopes = envelopes;
        Ok(applied)
    }

    // ------------------------------------------------------------------
    // Capabilities
    // ------------------------------------------------------------------

    /// Whether `agent` may perform `action` (pure lookup, not recorded).
    pub fn check_capability(&self, agent: &AgentId, action: &str) -> Result<Decision, EngineError> {
        let now = self.now();
        let state = self.read_state()?;
        let reason = capability_reason(&state.hierarchy, &self.inner.policy, agent, action);
        let verdict = if reason == reasons::CAPABILITY_GRANTED {
            Verdict::Allow
        } else {
            Verdict::Deny
        };
        Ok(self.decision(
            &Caller::Agent(agent.clone()),
            verdict,
            reason,
            action,
            action.to_owned(),
            now,
        ))
    }

    fn lineage_of(
        &self,
        agent: &AgentId,
        action: &str,
    ) -> Result<Result<Vec<AgentId>, Reason>, EngineError> {
        let state = self.read_state()?;
        let h = &state.hierarchy;
        let reason = capability_reason(h, &self.inner.policy, agent, action);
        if reason != reasons::CAPABILITY_GRANTED {
            return Ok(Err(reason));
        }
        let Some(idx) = h.index_of(agent.as_str()) else {
            return Ok(Err(reasons::UNKNOWN_AGENT));
        };
        Ok(Ok(h.lineage(idx).map(|(_, n)| n.id().clone()).collect()))
    }

    // ------------------------------------------------------------------
    // Memory
    // ------------------------------------------------------------------

    /// Resolve `namespace.key` for `reader`, walking toward the root.
    pub async fn read(
        &self,
        reader: &AgentId,
        namespace: &Namespace,
        key: &Key,
    ) -> Result<ReadOutcome, EngineError> {
        let now = self.now();
        let caller = Caller::Agent(reader.clone());
        let resource = format!("{namespace}.{key}");
        let lineage = match self.lineage_of(reader, ops::MEMORY_READ)? {
            Ok(l) => l,
            Err(reason) => {
                let d = self.decision(
                    &caller,
                    Verdict::Deny,
                    reason,
                    ops::MEMORY_READ,
                    resource,
                    now,
                );
                self.record(&d).await?;
                return Ok(ReadOutcome {
                    decision: d,
                    value: None,
                });
            }
        };
        let records = self
            .inner
            .store
            .get_records(namespace.clone(), key.clone(), lineage.clone())
            .await?;
        let resolution = resolve(
            reader,
            lineage.iter(),
            |owner| records.iter().find(|r| &r.owner == owner),
            now,
        );
        let (verdict, reason, value) = match resolution {
            Resolution::Found { record, reason } => (
                Verdict::Allow,
                reason,
                Some(ResolvedValue {
                    value: record.value.clone(),
                    owner_agent_id: record.owner.clone(),
                    visibility: record.visibility,
                    class: record.class.name().to_owned(),
                    revision: record.revision,
                    combinator: None,
                    contributors: Vec::new(),
                }),
            ),
            Resolution::Combined {
                value,
                combinator,
                contributors,
                reason,
            } => {
                let root = contributors.last().cloned();
                (
                    Verdict::Allow,
                    reason,
                    root.map(|root| ResolvedValue {
                        value,
                        owner_agent_id: root.owner_agent_id,
                        visibility: Visibility::Descendants,
                        class: "policy".into(),
                        revision: root.revision,
                        combinator: Some(combinator),
                        contributors,
                    }),
                )
            }
            Resolution::Denied { reason } => (Verdict::Deny, reason, None),
            Resolution::NotFound => (Verdict::Deny, reasons::RECORD_NOT_FOUND, None),
        };
        let d = self.decision(&caller, verdict, reason, ops::MEMORY_READ, resource, now);
        self.record(&d).await?;
        Ok(ReadOutcome { decision: d, value })
    }

    /// Write one record in the caller's own scope.
    pub async fn write(
        &self,
        actor: &AgentId,
        req: WriteRequest,
    ) -> Result<WriteOutcome, EngineError> {
        let now = self.now();
        let caller = Caller::Agent(actor.clone());
        let owner = req.owner_agent_id.clone().unwrap_or_else(|| actor.clone());
        let resource = format!("{owner}:{}.{}", req.namespace, req.key);
        let put = Put {
            owner,
            namespace: req.namespace,
            key: req.key,
            value: req.value,
            expected_revision: req.expected_revision,
            visibility: req.visibility,
            class: req.class,
        };
        let pre = match self.lineage_of(actor, ops::MEMORY_WRITE)? {
            Err(reason) => Err(reason),
            Ok(_) => check_write(actor, &put),
        };
        if let Err(reason) = pre {
            let d = self.decision(
                &caller,
                Verdict::Deny,
                reason,
                ops::MEMORY_WRITE,
                resource,
                now,
            );
            self.record(&d).await?;
            return Ok(WriteOutcome {
                decision: d,
                record: None,
                current_revision: None,
            });
        }
        let allow = self.decision(
            &caller,
            Verdict::Allow,
            reasons::OWNER_WRITE,
            ops::MEMORY_WRITE,
            resource.clone(),
            now,
        );
        let conflict = self.decision(
            &caller,
            Verdict::Deny,
            reasons::REVISION_CONFLICT,
            ops::MEMORY_WRITE,
            resource.clone(),
            now,
        );
        let rejected = self.decision(
            &caller,
            Verdict::Deny,
            reasons::REVISION_CONFLICT,
            ops::MEMORY_WRITE,
            resource,
            now,
        );
        let (a, c, r) = (allow.clone(), conflict.clone(), rejected.clone());
        let outcome = self
            .inner
            .store
            .put_record(
                put,
                now,
                warden_store::StorageQuota::default(),
                Box::new(move |o| {
                    let d = match o {
                        PutOutcome::Written { record, .. } => {
                            return vec![
                                AuditDraft::from_decision(&a)
                                    .with_details(json!({"revision": record.revision})),
                            ];
                        }
                        PutOutcome::Conflict { .. } => c,
                        PutOutcome::Rejected { reason } => Decision {
                            reason: Reason::from_string(reason.clone()),
                            ..r
                        },
                        // No quota is passed: never happens.
                        PutOutcome::OverQuota { .. } => return Vec::new(),
                    };
                    vec![AuditDraft::from_decision(&d)]
                }),
            )
            .await?;
        Ok(match outcome {
            PutOutcome::Written { record, .. } => WriteOutcome {
                decision: allow,
                record: Some(record),
                current_revision: None,
            },
            PutOutcome::Conflict { current } => WriteOutcome {
                decision: conflict,
                record: None,
                current_revision: current,
            },
            PutOutcome::Rejected { reason } => WriteOutcome {
                decision: Decision {
                    reason: Reason::from_string(reason),
                    ..rejected
                },
                record: None,
                current_revision: None,
            },
            // No quota is passed: never happens.
            PutOutcome::OverQuota { .. } => {
                return Err(EngineError::Store(warden_store::StoreError::backend(
                    "a write without a quota was refused as over quota",
                )));
            }
        })
    }

    /// Delete one of the caller's own records.
    pub async fn delete(
        &self,
        actor: &AgentId,
        owner: Option<AgentId>,
        namespace: Namespace,
        key: Key,
        expected_revision: Option<u64>,
    ) -> Result<DeleteResult, EngineError> {
        let now = self.now();
        let caller = Caller::Agent(actor.clone());
        let owner = owner.unwrap_or_else(|| actor.clone());
        let resource = format!("{owner}:{namespace}.{key}");
        let pre = match self.lineage_of(actor, ops::MEMORY_WRITE)? {
            Err(reason) => Err(reason),
            Ok(_) if &owner != actor => Err(reasons::ACTOR_IS_NOT_OWNER),
            Ok(_) => Ok(()),
        };
        if let Err(reason) = pre {
            let d = self.decision(
                &caller,
                Verdict::Deny,
                reason,
                ops::MEMORY_DELETE,
                resource,
                now,
            );
            self.record(&d).await?;
            return Ok(DeleteResult {
                decision: d,
                revision: None,
                current_revision: None,
            });
        }
        let template = self.decision(
            &caller,
            Verdict::Allow,
            reasons::OWNER_DELETE,
            ops::MEMORY_DELETE,
            resource,
            now,
        );
        let t = template.clone();
        let outcome = self
            .inner
            .store
            .delete_record(
                Delete {
                    owner,
                    namespace,
                    key,
                    expected_revision,
                },
                Box::new(move |o| {
                    let d = outcome_decision(&t, o);
                    vec![AuditDraft::from_decision(&d)]
                }),
            )
            .await?;
        let decision = outcome_decision(&template, &outcome);
        Ok(match outcome {
            DeleteOutcome::Deleted { revision } => DeleteResult {
                decision,
                revision: Some(revision),
                current_revision: None,
            },
            DeleteOutcome::NotFound => DeleteResult {
                decision,
                revision: None,
                current_revision: None,
            },
            DeleteOutcome::Conflict { current } => DeleteResult {
                decision,
                revision: None,
                current_revision: Some(current),
            },
        })
    }

    // ------------------------------------------------------------------
    // SOPs
    // ------------------------------------------------------------------

    /// Preflight `sop` for `actor` without recording anything (offline
    /// checks, `warden check`).
    pub fn preflight(&self, actor: &AgentId, sop: &Sop) -> Result<Preflight, EngineError> {
        let now = self.now();
        let state = self.read_state()?;
        let ctx = PreflightContext {
            hierarchy: &state.hierarchy,
            catalogue: &self.inner.policy.catalogue,
            policy_version: &self.inner.policy.version,
        };
        Ok(preflight(&ctx, actor, sop, now))
    }

    /// Preflight `sop` for `actor` and record every step's decision.
    pub async fn validate_sop(&self, actor: &AgentId, sop: &Sop) -> Result<Preflight, EngineError> {
        let result = self.preflight(actor, sop)?;
        let drafts = result
            .steps
            .iter()
            .map(|s| {
                self.draft(&s.decision)
                    .with_details(violations_details(&s.violations))
            })
            .collect();
        self.inner.store.append_audit(drafts).await?;
        Ok(result)
    }

    /// Admit `sop` as a run. A rejected SOP creates no run and runs nothing;
    /// every step's decision is recorded either way. A reused `run_id` with
    /// the same SOP and agent returns the existing run (idempotent).
    ///
    /// With a `context:` policy the run gets its own envelope: a new, empty
    /// root, or, for an agent holding an inherited envelope, one delegated
    /// from it (same restrictions, sensitivity at least as high). A step the
    /// starting restrictions already deny (`restricted_by:…`) rejects the
    /// whole SOP here, since restrictions never shrink. Admission stays
    /// all-or-nothing over what is known up front: later steps can still be
    /// denied or escalated by what earlier steps accumulate.
    pub async fn admit_run(
        &self,
        actor: &AgentId,
        sop: &Sop,
        run_id: Option<RunId>,
    ) -> Result<Admission, EngineError> {
        let now = self.now();
        let caller = Caller::Agent(actor.clone());
        let mut result = self.preflight(actor, sop)?;
        let run_id = match run_id {
            Some(r) => r,
            None => new_run_id()?,
        };
        let sop_value = serde_json::to_value(sop).map_err(|e| EngineError::Invalid {
            field: "sop".into(),
            message: e.to_string(),
        })?;
        let sop_hash = Digest::of(&to_canonical(&sop_value));
        let mut opened = None;
        if result.admitted && self.context_policy().is_some() {
            // An existing run keeps its envelope: open none for it.
            if let Some(state) = self.inner.store.get_run(run_id.clone()).await? {
                return existing_admission(state, actor, sop_hash, result, &run_id);
            }
            let (envelope, draft) = self.open_run_envelope(actor, &run_id, now).await?;
            self.restrict_admission(&mut result, &envelope);
            opened = Some((envelope, draft));
        }
        let mut drafts: Vec<AuditDraft> = result
            .steps
            .iter()
            .map(|s| {
                self.draft(&s.decision)
                    .with_details(violations_details(&s.violations))
            })
            .collect();
        if !result.admitted {
            let d = self.decision(
                &caller,
                Verdict::Deny,
                er::RUN_REJECTED,
                ops::RUN_ADMIT,
                sop.sop_id.to_string(),
                now,
            );
            drafts.push(self.draft(&d));
            self.inner.store.append_audit(drafts).await?;
            return Ok(Admission::Rejected(result));
        }
        let steps: Vec<RunStep> = sop
            .steps
            .iter()
            .filter_map(|s| {
                s.step_id.clone().map(|step_id| RunStep {
                    operation_id: format!("{run_id}:{step_id}"),
                    step_id,
                    action: s.action.clone(),
                })
            })
            .collect();
        let record = RunRecord {
            run_id: run_id.clone(),
            agent: actor.clone(),
            sop_hash,
            sop: sop_value,
            steps,
            policy_version: self.inner.policy.version.clone(),
            created_at: now,
            envelope_id: opened.as_ref().map(|(e, _)| e.envelope_id().clone()),
        };
        let d = self.decision(
            &caller,
            Verdict::Allow,
            er::RUN_ADMITTED,
            ops::RUN_ADMIT,
            run_id.to_string(),
            now,
        );
        drafts.push(
            self.draft(&d).with_details(
                json!({"sop_id": sop.sop_id.as_str(), "sop_hash": sop_hash.to_hex()}),
            ),
        );
        if let Some((envelope, draft)) = opened {
            // The envelope first (inert until the run names it); its opening
            // is recorded with the admission.
            self.create_envelope(envelope.to_record()).await?;
            drafts.push(draft);
        }
        match self
            .inner
            .store
            .create_run(record.clone(), None, warden_store::audit_if_created(drafts))
            .await?
        {
            CreateRun::Created => Ok(Admission::Admitted {
                run: record,
                preflight: result,
                existing: false,
            }),
            CreateRun::Existing(state) => {
                existing_admission(*state, actor, sop_hash, result, &run_id)
            }
            // No limit is passed: never happens.
            CreateRun::OverQuota { .. } => {
                Err(EngineError::Store(warden_store::StoreError::backend(
                    "a run without a limit was refused as over quota",
                )))
            }
        }
    }
}

/// The admission of a run that already exists under `run_id`: the same run
/// if the SOP and agent match, a conflict otherwise.
fn existing_admission(
    state: warden_store::RunState,
    actor: &AgentId,
    sop_hash: Digest,
    preflight: Preflight,
    run_id: &RunId,
) -> Result<Admission, EngineError> {
    if state.run.sop_hash == sop_hash && &state.run.agent == actor {
        Ok(Admission::Admitted {
            run: state.run,
            preflight,
            existing: true,
        })
    } else {
        Err(EngineError::RunIdConflict(run_id.to_string()))
    }
}

/// The result of admitting a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Admitted (or already admitted with the same SOP).
    Admitted {
        /// The run.
        run: RunRecord,
        /// Every step's decision.
        preflight: Preflight,
        /// Whether the run existed already.
        existing: bool,
    },
    /// Rejected: nothing will run.
    Rejected(Preflight),
}

fn violations_details(v: &[Reason]) -> Value {
    if v.len() <= 1 {
        Value::Null
    } else {
        json!({"violations": v.iter().map(|r| r.as_str()).collect::<Vec<_>>()})
    }
}

fn outcome_decision(template: &Decision, o: &DeleteOutcome) -> Decision {
    match o {
        DeleteOutcome::Deleted { .. } => template.clone(),
        DeleteOutcome::NotFound => Decision {
            verdict: Verdict::Deny,
            reason: reasons::RECORD_NOT_FOUND,
            ..template.clone()
        },
        DeleteOutcome::Conflict { .. } => Decision {
            verdict: Verdict::Deny,
            reason: reasons::REVISION_CONFLICT,
            ..template.clone()
        },
    }
}

pub(crate) fn capability_reason(
    h: &Hierarchy,
    policy: &Policy,
    agent: &AgentId,
    action: &str,
) -> Reason {
    let Some(idx) = h.index_of(agent.as_str()) else {
        return reasons::UNKNOWN_AGENT;
    };
    capability_reason_idx(h, policy, idx, action)
}

pub(crate) fn capability_reason_idx(
    h: &Hierarchy,
    policy: &Policy,
    idx: AgentIdx,
    action: &str,
) -> Reason {
    let Some(node) = h.node(idx) else {
        return reasons::UNKNOWN_AGENT;
    };
    if !node.is_active() {
        return reasons::AGENT_REVOKED;
    }
    match policy.catalogue.index_of(action) {
        None => reasons::UNKNOWN_ACTION,
        Some(a) if node.effective().contains(a.get()) => reasons::CAPABILITY_GRANTED,
        Some(_) => reasons::CAPABILITY_NOT_INHERITED,
    }
}

fn new_run_id() -> Result<RunId, EngineError> {
    RunId::parse(&random_id("run")?).map_err(|e| EngineError::Invalid {
        field: "run_id".into(),
        message: e.to_string(),
    })
}

/// `<prefix>-<32 random hex digits>`: a fresh, valid identifier.
pub(crate) fn random_id(prefix: &str) -> Result<String, EngineError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| EngineError::Invalid {
        field: format!("{prefix} id"),
        message: e.to_string(),
    })?;
    Ok(format!("{prefix}-{}", hex::encode(bytes)))
}
