//! Agents: registration, delegation, revocation, and reconciling the
//! cached hierarchy with agents other nodes changed.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use warden_core::decision::Decision;
use warden_core::decision::{Reason, Verdict, reasons};
use warden_core::envelope::{EnvelopeError, EnvelopeId, TrustZone};
use warden_core::hierarchy::{AgentSpec, AgentStatus, HierarchyError};
use warden_core::ids::{ActionName, AgentId, Label, RunId};
use warden_core::lockdown::{self, LockdownError, Sanitised};
use warden_store::{Store, StoredAgent};

use crate::error::{EngineError, Missing};

use crate::engine::{Caller, Engine, engine_reasons as er, ops};

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

/// The context part of a registration: where the child's envelope comes
/// from and what the delegation is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegationOptions {
    /// Inherit the envelope of this run (a run of the parent).
    #[serde(default)]
    pub from_run: Option<RunId>,
    /// Inherit the envelope of this tool-call session (a session of the
    /// parent): what the session accumulated binds the child.
    #[serde(default)]
    pub from_session: Option<warden_core::ids::SessionId>,
    /// Inherit a signed envelope from an issuer the bundle trusts: it is
    /// imported (verified; a forged, replayed or downgraded envelope
    /// refuses the delegation and creates nothing) into a session of the
    /// parent that carries it, and the child is delegated from that
    /// session. The carrier's id is derived from the child and the
    /// envelope's id and version, so a retry (after an approval, say)
    /// finds the same import instead of replaying it.
    #[serde(default)]
    pub from_envelope: Option<warden_core::envelope::sign::SignedEnvelope>,
    /// Where the child runs; `None` is internal (inside this deployment).
    #[serde(default)]
    pub zone: Option<TrustZone>,
    /// Restrictions the child gets on top of the inherited ones.
    #[serde(default)]
    pub restrictions: Vec<Label>,
    /// Pass the sensitivity and restrictions but not the labels (the child
    /// receives a reduced payload).
    #[serde(default)]
    pub redact_labels: bool,
}

/// The outcome of a registration or delegation. Every variant's decision
/// was recorded before it was returned.
#[derive(Debug, Clone, PartialEq)]
pub enum Registration {
    /// Registered: the agent as it now stands.
    Registered {
        /// The decision (`agent_registered`, or a `constrain` with the
        /// delegation's obligations).
        decision: Decision,
        /// The new agent.
        agent: Box<AgentView>,
    },
    /// Refused; no agent was created.
    Refused {
        /// The deny decision.
        decision: Decision,
        /// What refused it.
        refusal: RegistrationRefusal,
    },
    /// Held for human review; no agent was created yet. An approval lets
    /// the same parent, child and source run through once.
    Escalated {
        /// The decision (verdict `escalate`).
        decision: Decision,
        /// The pending escalation.
        escalation_id: String,
    },
}

impl Registration {
    /// The recorded decision, whatever the outcome.
    pub fn decision(&self) -> &Decision {
        match self {
            Registration::Registered { decision, .. }
            | Registration::Refused { decision, .. }
            | Registration::Escalated { decision, .. } => decision,
        }
    }

    /// The registered agent, if the registration went through.
    pub fn registered(self) -> Option<AgentView> {
        match self {
            Registration::Registered { agent, .. } => Some(*agent),
            _ => None,
        }
    }
}

/// What refused a registration.
#[derive(Debug, Clone, PartialEq)]
pub enum RegistrationRefusal {
    /// An agent may register only its own children.
    NotOwnChild,
    /// The calling agent is revoked.
    CallerRevoked,
    /// Delegation lockdown refused the child (a block write surface, the
    /// self-edit flag, a malformed config).
    Lockdown(LockdownError),
    /// The hierarchy refused it (duplicate id, unknown or revoked parent,
    /// depth, full).
    Hierarchy(HierarchyError),
    /// The context envelope the child would inherit denies the delegation
    /// (`restricted_by:…`, a zone or authority rule).
    Context,
    /// The child's envelope could not be built as asked (an unknown
    /// restriction named in the options).
    Envelope(EnvelopeError),
}

/// The outcome of a revocation; its decision was recorded.
#[derive(Debug, Clone, PartialEq)]
pub enum Revocation {
    /// Revoked, with every descendant.
    Revoked {
        /// The decision (`revoked`).
        decision: Decision,
        /// The agents revoked (the target first).
        agents: Vec<AgentId>,
    },
    /// The caller may not revoke it (`not_an_ancestor`); nothing changed.
    Refused {
        /// The deny decision.
        decision: Decision,
    },
}

impl Revocation {
    /// The agents revoked, if the revocation went through.
    pub fn revoked(self) -> Option<Vec<AgentId>> {
        match self {
            Revocation::Revoked { agents, .. } => Some(agents),
            Revocation::Refused { .. } => None,
        }
    }
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

impl<S: Store> Engine<S> {
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
    ) -> Result<Registration, EngineError> {
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
    /// envelope: `deny` refuses it ([`Registration::Refused`]), `escalate`
    /// holds it for review ([`Registration::Escalated`]; an approval lets the
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
    ) -> Result<Registration, EngineError> {
        let options = match self.import_for_child(caller, &req, options).await? {
            Ok(options) => options,
            Err(refused) => return Ok(refused),
        };
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
            return Ok(Registration::Refused {
                decision: d,
                refusal: RegistrationRefusal::NotOwnChild,
            });
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
                return Ok(Registration::Refused {
                    decision: d,
                    refusal: RegistrationRefusal::CallerRevoked,
                });
            }
        }

        let mut audit = Vec::new();
        let mut config = req.config.clone();
        let tools = req.tools.clone().unwrap_or_default();
        if req.parent.is_some() {
            let checked = match &req.tools {
                Some(tools) => lockdown::check_prebuilt_child(
                    self.inner.policy.lockdown(),
                    tools,
                    req.config.as_ref(),
                )
                .map(|()| None),
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
                    return Ok(Registration::Refused {
                        decision: d,
                        refusal: RegistrationRefusal::Lockdown(e),
                    });
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
            let d = deny(e.reason());
            self.record(&d).await?;
            return Ok(Registration::Refused {
                decision: d,
                refusal: RegistrationRefusal::Hierarchy(e),
            });
        }
        // Context: decide the delegation against the envelope the child
        // inherits, build the child's envelope, narrow its authority.
        let child_context = match self
            .delegation_context(caller, &mut req, &options, now, &mut audit)
            .await?
        {
            Ok(context) => context,
            Err(refused) => return Ok(refused),
        };
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
        // The child id is used: no other request for it can proceed now.
        self.withdraw_child_slot(caller, &req.id, now).await?;
        Ok(Registration::Registered {
            decision: d,
            agent: Box::new(self.agent(&req.id)?),
        })
    }

    /// Register a child of `parent` (delegation): the child's effective
    /// capabilities are within the parent's, and lockdown applies. A parent
    /// holding an inherited envelope passes it on.
    pub async fn delegate(
        &self,
        parent: &AgentId,
        req: RegisterAgent,
    ) -> Result<Registration, EngineError> {
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
    ) -> Result<Registration, EngineError> {
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
    ) -> Result<Registration, EngineError> {
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
            .ok_or_else(|| EngineError::not_found(Missing::Agent, id.to_string()))?;
        let node = h
            .node(idx)
            .ok_or_else(|| EngineError::not_found(Missing::Agent, id.to_string()))?;
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
    ) -> Result<Revocation, EngineError> {
        let _guard = self.inner.registry.lock().await;
        let now = self.now();
        if !self.is_cached(id)? {
            // Registered by another node moments ago?
            self.reload_agents_locked().await?;
        }
        if !self.is_cached(id)? {
            return Err(EngineError::not_found(Missing::Agent, id.to_string()));
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
            return Ok(Revocation::Refused { decision: d });
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
        Ok(Revocation::Revoked {
            decision: d,
            agents: revoked,
        })
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
        self.registered_now(id).await
    }

    /// Whether `id` is registered in the store now, with the registry lock
    /// held: the cache first, then (when it does not know `id`) every
    /// stored agent, reloaded.
    pub(crate) async fn registered_now(&self, id: &AgentId) -> Result<bool, EngineError> {
        if self.is_cached(id)? {
            return Ok(true);
        }
        self.reload_agents_locked().await?;
        self.is_cached(id)
    }

    pub(crate) fn is_cached(&self, id: &AgentId) -> Result<bool, EngineError> {
        Ok(self.read_state()?.hierarchy.index_of(id.as_str()).is_some())
    }

    pub(crate) async fn reload_agents_locked(&self) -> Result<AppliedAgents, EngineError> {
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
}
