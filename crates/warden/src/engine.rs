//! The [`Engine`]: the core's rules applied to a [`Store`], with every
//! decision recorded.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde_json::Value;
use warden_core::audit::AuditDraft;
use warden_core::bundle::{Policy, seed_class, seed_spec};
use warden_core::decision::{Decision, Reason, SmolStr, Subject, Verdict, reasons};
use warden_core::envelope::EnvelopeId;
use warden_core::hierarchy::{AgentIdx, AgentSpec, AgentStatus, Hierarchy};
use warden_core::ids::{ActionName, AgentId};
use warden_core::memory::Put;
use warden_core::time::Timestamp;
use warden_store::{PutOutcome, StorageQuota, Store, StoredAgent};

use crate::clock::Clock;
use crate::error::{ConflictKind, EngineError};

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
    /// A request refused at authentication or by its route.
    pub const AUTH_REQUEST: &str = "auth.request";
    /// A token issued.
    pub const TOKEN_ISSUE: &str = "token.issue";
    /// A token revoked.
    pub const TOKEN_REVOKE: &str = "token.revoke";
    /// An agent's view read.
    pub const AGENT_READ: &str = "agent.read";
    /// Opening a tool-call session.
    pub const SESSION_OPEN: &str = "session.open";
    /// Deciding one call of a session.
    pub const SESSION_CALL: &str = "session.call";
    /// Recording a call's result.
    pub const SESSION_RESULT: &str = "session.result";
    /// Cancelling a session.
    pub const SESSION_CANCEL: &str = "session.cancel";
    /// A run's envelope read.
    pub const CONTEXT_READ: &str = "context.read";
}

/// Extra reason codes the engine records.
pub mod engine_reasons {
    use warden_core::decision::Reason;
    /// The agent was created from the policy bundle.
    pub const BUNDLE_SEED: Reason = Reason::code("bundle_seed");
    /// Hierarchy refusals (their codes live in core, with the error that
    /// names them: `HierarchyError::reason`).
    pub use warden_core::decision::reasons::{
        DEPTH_EXCEEDED, DUPLICATE_AGENT, HIERARCHY_CYCLE, PARENT_REVOKED, UNKNOWN_PARENT,
    };
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
    /// A step another worker began holds a live lease: do not run it.
    pub const STEP_IN_PROGRESS: Reason = Reason::code("step_in_progress");
    /// A completion by someone other than the holder of the step's live
    /// lease: nothing recorded.
    pub const STEP_LEASE_HELD: Reason = Reason::code("step_lease_held");
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
    /// The escalation holds no bound request (stored before approvals were
    /// bound to the request reviewed, or its request does not match its
    /// digest): it cannot be approved, only rejected.
    pub const ESCALATION_UNBOUND: Reason = Reason::code("escalation_unbound");
    /// A pending escalation withdrawn: another request for the same child
    /// id, run step or call consumed an approval, so it can never proceed.
    pub const ESCALATION_WITHDRAWN: Reason = Reason::code(warden_store::ESCALATION_WITHDRAWN);
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
    /// A write refused: it would exceed the owner's `max_records`.
    pub const QUOTA_MAX_RECORDS: Reason = Reason::code("quota_max_records");
    /// A write refused: it would exceed the owner's `max_bytes`.
    pub const QUOTA_MAX_BYTES: Reason = Reason::code("quota_max_bytes");
    /// An admission refused: the agent has `max_runs_in_flight` runs open.
    pub const QUOTA_MAX_RUNS_IN_FLIGHT: Reason = Reason::code("quota_max_runs_in_flight");
    /// A request refused: the agent is over `requests_per_second`.
    pub const QUOTA_REQUESTS_PER_SECOND: Reason = Reason::code("quota_requests_per_second");
    /// A token was issued.
    pub const TOKEN_ISSUED: Reason = Reason::code("token_issued");
    /// A token was revoked.
    pub const TOKEN_REVOKED: Reason = Reason::code("token_revoked");
    /// A route that needs the operator token, called with an agent's.
    pub const OPERATOR_ONLY: Reason = Reason::code("operator_only");
    /// A route that acts as an agent, called with the operator token.
    pub const AGENT_TOKEN_REQUIRED: Reason = Reason::code("agent_token_required");
    /// The operator sees every agent.
    pub const OPERATOR: Reason = Reason::code("operator");
    /// An agent sees itself.
    pub const SELF: Reason = Reason::code("self");
    /// An active ancestor sees its descendants.
    pub const ANCESTOR: Reason = Reason::code("ancestor");
    /// The caller is neither the run's agent nor allowed to act on its run.
    pub const NOT_RUN_AGENT: Reason = Reason::code("not_run_agent");
    /// A run's envelope was read.
    pub const ENVELOPE_READ: Reason = Reason::code("envelope_read");
}

use engine_reasons as er;

/// Who is calling: the operator, or an agent (always from the runtime
/// credential, never from a payload).
pub type Caller = Subject;

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
    /// Tickets of steps begun and not completed.
    pub(crate) tickets: crate::tickets::Tickets,
    /// How long tickets and unfinished runs count, in milliseconds.
    pub(crate) run_ttl_ms: std::sync::atomic::AtomicI64,
    pub(crate) provenance_secret: RwLock<Vec<u8>>,
    pub(crate) session_indexes: crate::sessions::IndexCache,
    /// Per-agent windows of refusals counted rather than recorded.
    pub(crate) refusals: crate::access::RefusalWindows,
    /// Active tokens found, by hash.
    pub(crate) tokens: crate::tokens::TokenCache,
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
                tickets: crate::tickets::Tickets::default(),
                provenance_secret: RwLock::new(Vec::new()),
                session_indexes: crate::sessions::IndexCache::default(),
                run_ttl_ms: std::sync::atomic::AtomicI64::new(
                    i64::try_from(crate::tickets::DEFAULT_RUN_TTL.as_millis()).unwrap_or(i64::MAX),
                ),
                refusals: crate::access::RefusalWindows::default(),
                tokens: crate::tokens::TokenCache::default(),
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
                    Err(EngineError::Conflict {
                        kind: ConflictKind::Duplicate,
                        ..
                    }) => {
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
                let class = seed_class(m).map_err(|message| {
                    EngineError::internal(format!("bundle memory seed: {message}"))
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
                        StorageQuota::default(),
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
        self.inner
            .state
            .read()
            .map_err(|_| EngineError::internal("engine state lock poisoned by an earlier panic"))
    }

    pub(crate) fn write_state(&self) -> Result<RwLockWriteGuard<'_, State>, EngineError> {
        self.inner
            .state
            .write()
            .map_err(|_| EngineError::internal("engine state lock poisoned by an earlier panic"))
    }

    pub(crate) fn decision(
        &self,
        caller: &Caller,
        verdict: Verdict,
        reason: Reason,
        operation: &str,
        resource: impl Into<SmolStr>,
        now: Timestamp,
    ) -> Decision {
        Decision {
            verdict,
            reason,
            subject: caller.clone(),
            operation: SmolStr::from(operation),
            resource: resource.into(),
            policy_version: SmolStr::from(self.inner.policy.version.as_str()),
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

    pub(crate) async fn commit_agent(
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

    pub(crate) fn lineage_of(
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

/// `<prefix>-<32 random hex digits>`: a fresh, valid identifier.
pub(crate) fn random_id(prefix: &str) -> Result<String, EngineError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| EngineError::internal(format!("no randomness for a {prefix} id: {e}")))?;
    Ok(format!("{prefix}-{}", hex::encode(bytes)))
}
