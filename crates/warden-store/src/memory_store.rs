//! The in-memory store: the reference implementation of [`Store`], used by
//! tests, `warden demo`, `warden check` and embedding programs that need no
//! persistence.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use warden_core::audit::{AuditDraft, AuditEntry, ChainHead, Digest};
use warden_core::decision::Subject;
use warden_core::envelope::{EnvelopeId, EnvelopeRecord};
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, CallId, Key, Namespace, RunId, SessionId, StepId};
use warden_core::memory::{MemoryRecord, Put};
use warden_core::time::Timestamp;

use crate::{
    AuditFn, CallRecord, ConsumedEscalation, CreateRun, CreateSession, Delete, DeleteOutcome,
    Entity, EnvelopeImport, EscalationRecord, EscalationResolution, EscalationStatus,
    EscalationTarget, LeaseStep, PutAuditFn, PutEnvelope, PutEscalation, PutOutcome, RateBuckets,
    RateCharge, RecordStep, ResolveEscalation, RunRecord, RunState, RunsInFlight, SessionHead,
    SessionRecord, SessionState, SessionUpdate, SigningKeyRecord, StepLease, StepOutcome,
    StorageQuota, Store, StoreError, StoredAgent, TakeTokens, TokenRecord, UpdateSession, Usage,
    check_create, check_signing_key, decide_import, decide_put, encoded_len, missing_envelope,
    run_finished, seq_taken, sources_unless_known,
};

type RecordKey = (AgentId, Namespace, Key);

#[derive(Debug, Default)]
struct Inner {
    agents: Vec<StoredAgent>,
    agent_index: HashMap<AgentId, usize>,
    tokens: Vec<TokenRecord>,
    records: HashMap<RecordKey, MemoryRecord>,
    audit: AuditLog,
    runs: HashMap<RunId, RunState>,
    /// Every version of every envelope, ascending.
    envelopes: HashMap<EnvelopeId, Vec<EnvelopeRecord>>,
    /// Escalations in creation order.
    escalations: Vec<EscalationRecord>,
    /// Sessions by id.
    sessions: HashMap<SessionId, MemSession>,
    /// Session ids in creation order.
    session_order: Vec<SessionId>,
    /// Every envelope import, in order.
    imports: Vec<EnvelopeImport>,
    /// Envelope signing keys, by generation.
    signing_keys: Vec<SigningKeyRecord>,
}

impl Inner {
    fn head(&self) -> ChainHead {
        match self.audit.last() {
            Some(e) => ChainHead {
                count: self.audit.len() as u64,
                seq: e.seq,
                hash: e.hash,
            },
            None => ChainHead {
                count: 0,
                seq: 0,
                hash: Digest::GENESIS,
            },
        }
    }

    /// What `owner` holds: records and bytes of JSON-encoded values.
    fn usage(&self, owner: &AgentId) -> Usage {
        let mut usage = Usage::default();
        for ((o, _, _), r) in self.records.iter() {
            if o == owner {
                usage.records += 1;
                usage.bytes = usage.bytes.saturating_add(encoded_len(&r.value));
            }
        }
        usage
    }

    fn append(&mut self, drafts: Vec<AuditDraft>) -> ChainHead {
        let mut head = self.head();
        for draft in drafts {
            let entry = draft.seal(head.seq + 1, head.hash);
            head = ChainHead {
                count: head.count + 1,
                seq: entry.seq,
                hash: entry.hash,
            };
            self.audit.push(entry);
        }
        head
    }
}

/// One session: its row and index, its calls by id, and their ids by
/// `seq` (unique within the session), so that a call is found, and a
/// position checked, without walking the others.
#[derive(Debug)]
struct MemSession {
    session: SessionRecord,
    sources: Vec<u8>,
    calls: HashMap<CallId, CallRecord>,
    by_seq: BTreeMap<u64, CallId>,
}

impl MemSession {
    /// A new session holding `state` (whose calls [`check_create`]
    /// checked).
    fn of(state: SessionState) -> Self {
        let mut s = Self {
            session: state.session,
            sources: state.sources,
            calls: HashMap::with_capacity(state.calls.len()),
            by_seq: BTreeMap::new(),
        };
        for call in state.calls {
            s.by_seq.insert(call.seq, call.call_id.clone());
            s.calls.insert(call.call_id.clone(), call);
        }
        s
    }

    /// The session with every call, by `seq`.
    fn state(&self) -> SessionState {
        SessionState {
            session: self.session.clone(),
            sources: self.sources.clone(),
            calls: self
                .by_seq
                .values()
                .filter_map(|id| self.calls.get(id))
                .cloned()
                .collect(),
        }
    }

    fn head(&self, call_id: Option<&CallId>, known_revision: Option<u64>) -> SessionHead {
        SessionHead {
            session: self.session.clone(),
            sources: sources_unless_known(&self.session, &self.sources, known_revision),
            calls: u64::try_from(self.calls.len()).unwrap_or(u64::MAX),
            call: call_id.and_then(|id| self.calls.get(id)).cloned(),
        }
    }

    /// Whether `call` may be stored: its `seq` is free or already its own.
    fn seq_free_for(&self, call: &CallRecord) -> bool {
        self.by_seq
            .get(&call.seq)
            .is_none_or(|holder| holder == &call.call_id)
    }

    /// Insert `call`, or replace the call with its id (checked with
    /// [`Self::seq_free_for`]).
    fn put_call(&mut self, call: CallRecord) {
        if let Some(old) = self.calls.get(&call.call_id)
            && old.seq != call.seq
        {
            self.by_seq.remove(&old.seq);
        }
        self.by_seq.insert(call.seq, call.call_id.clone());
        self.calls.insert(call.call_id.clone(), call);
    }
}

/// The audit log in fixed-size chunks, so appending never copies the
/// entries already stored (a single `Vec` would move the whole log, under the
/// store's lock, each time it grows).
#[derive(Debug, Default)]
struct AuditLog {
    chunks: Vec<Vec<AuditEntry>>,
    len: usize,
}

/// Entries per chunk.
const AUDIT_CHUNK: usize = 65_536;

impl AuditLog {
    fn push(&mut self, entry: AuditEntry) {
        match self.chunks.last_mut() {
            Some(c) if c.len() < AUDIT_CHUNK => c.push(entry),
            _ => {
                let mut c = Vec::with_capacity(AUDIT_CHUNK);
                c.push(entry);
                self.chunks.push(c);
            }
        }
        self.len += 1;
    }

    fn last(&self) -> Option<&AuditEntry> {
        self.chunks.last().and_then(|c| c.last())
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Index of the first entry with `seq > after` (entries are in seq order).
    fn partition_point(&self, after: u64) -> usize {
        let mut before = 0;
        for c in &self.chunks {
            match c.last() {
                Some(last) if last.seq <= after => before += c.len(),
                _ => return before + c.partition_point(|e| e.seq <= after),
            }
        }
        before
    }

    fn iter_from(&self, index: usize) -> impl Iterator<Item = &AuditEntry> {
        let chunk = index / AUDIT_CHUNK;
        let offset = index % AUDIT_CHUNK;
        self.chunks
            .iter()
            .skip(chunk)
            .enumerate()
            .flat_map(move |(i, c)| c.iter().skip(if i == 0 { offset } else { 0 }))
    }
}

/// A [`Store`] that keeps everything in process memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    /// Request-rate buckets, under their own lock.
    rates: RateBuckets,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<MutexGuard<'_, Inner>, StoreError> {
        self.inner
            .lock()
            .map_err(|_| StoreError::backend("in-memory store lock poisoned"))
    }

    /// Direct access to the stored audit entries, for tests that tamper
    /// with them.
    pub fn with_audit_mut<R>(&self, f: impl FnOnce(&mut Vec<AuditEntry>) -> R) -> Option<R> {
        self.inner.lock().ok().map(|mut g| {
            let mut flat: Vec<AuditEntry> = g.audit.iter_from(0).cloned().collect();
            let r = f(&mut flat);
            g.audit = AuditLog::default();
            for e in flat {
                g.audit.push(e);
            }
            r
        })
    }
}

impl Store for MemoryStore {
    async fn load_agents(&self) -> Result<Vec<StoredAgent>, StoreError> {
        Ok(self.lock()?.agents.clone())
    }

    async fn insert_agent(
        &self,
        agent: StoredAgent,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        let mut g = self.lock()?;
        if g.agent_index.contains_key(&agent.id) {
            return Err(StoreError::duplicate(Entity::Agent, &agent.id));
        }
        let at = g.agents.len();
        g.agent_index.insert(agent.id.clone(), at);
        g.agents.push(agent);
        g.append(audit);
        Ok(())
    }

    async fn set_agent_status(
        &self,
        ids: Vec<AgentId>,
        status: AgentStatus,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        let mut g = self.lock()?;
        let mut positions = Vec::with_capacity(ids.len());
        for id in &ids {
            let at = g
                .agent_index
                .get(id)
                .copied()
                .ok_or_else(|| StoreError::not_found(Entity::Agent, id))?;
            positions.push(at);
        }
        for at in positions {
            if let Some(a) = g.agents.get_mut(at) {
                a.status = status;
            }
        }
        g.append(audit);
        Ok(())
    }

    async fn set_agent_capabilities(
        &self,
        id: AgentId,
        capabilities: BTreeSet<ActionName>,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        let mut g = self.lock()?;
        let at = g
            .agent_index
            .get(&id)
            .copied()
            .ok_or_else(|| StoreError::not_found(Entity::Agent, id))?;
        if let Some(a) = g.agents.get_mut(at) {
            a.capabilities = capabilities;
        }
        g.append(audit);
        Ok(())
    }

    async fn insert_token(
        &self,
        token: TokenRecord,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        let mut g = self.lock()?;
        if g.tokens
            .iter()
            .any(|t| t.hash == token.hash || t.token_id == token.token_id)
        {
            return Err(StoreError::duplicate(Entity::Token, token.token_id));
        }
        g.tokens.push(token);
        g.append(audit);
        Ok(())
    }

    async fn find_token(&self, hash: Digest) -> Result<Option<TokenRecord>, StoreError> {
        Ok(self.lock()?.tokens.iter().find(|t| t.hash == hash).cloned())
    }

    async fn revoke_token(
        &self,
        token_id: String,
        audit: Vec<AuditDraft>,
    ) -> Result<bool, StoreError> {
        let mut g = self.lock()?;
        let Some(t) = g
            .tokens
            .iter_mut()
            .find(|t| t.token_id == token_id && !t.revoked)
        else {
            return Ok(false);
        };
        t.revoked = true;
        g.append(audit);
        Ok(true)
    }

    async fn get_records(
        &self,
        namespace: Namespace,
        key: Key,
        owners: Vec<AgentId>,
    ) -> Result<Vec<MemoryRecord>, StoreError> {
        let g = self.lock()?;
        let mut out = Vec::new();
        for owner in owners {
            if let Some(r) = g.records.get(&(owner, namespace.clone(), key.clone())) {
                out.push(r.clone());
            }
        }
        Ok(out)
    }

    async fn put_record(
        &self,
        put: Put,
        now: Timestamp,
        quota: StorageQuota,
        audit: PutAuditFn,
    ) -> Result<PutOutcome, StoreError> {
        let mut g = self.lock()?;
        let usage = if quota.is_unlimited() {
            Usage::default()
        } else {
            g.usage(&put.owner)
        };
        let k = (put.owner.clone(), put.namespace.clone(), put.key.clone());
        let outcome = decide_put(g.records.get(&k), &put, now, quota, usage);
        if let PutOutcome::Written { record, .. } = &outcome {
            g.records.insert(k, record.clone());
        }
        let drafts = audit(&outcome);
        g.append(drafts);
        Ok(outcome)
    }

    async fn delete_record(
        &self,
        delete: Delete,
        audit: AuditFn<DeleteOutcome>,
    ) -> Result<DeleteOutcome, StoreError> {
        let mut g = self.lock()?;
        let k = (delete.owner, delete.namespace, delete.key);
        let outcome = match g.records.get(&k) {
            None => DeleteOutcome::NotFound,
            Some(r) if delete.expected_revision.is_some_and(|e| e != r.revision) => {
                DeleteOutcome::Conflict {
                    current: r.revision,
                }
            }
            Some(r) => DeleteOutcome::Deleted {
                revision: r.revision,
            },
        };
        if matches!(outcome, DeleteOutcome::Deleted { .. }) {
            g.records.remove(&k);
        }
        let drafts = audit(&outcome);
        g.append(drafts);
        Ok(outcome)
    }

    async fn owner_usage(&self, owner: AgentId) -> Result<Usage, StoreError> {
        Ok(self.lock()?.usage(&owner))
    }

    async fn append_audit(&self, drafts: Vec<AuditDraft>) -> Result<ChainHead, StoreError> {
        Ok(self.lock()?.append(drafts))
    }

    async fn audit_page(&self, after: u64, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        let g = self.lock()?;
        let start = g.audit.partition_point(after);
        Ok(g.audit.iter_from(start).take(limit).cloned().collect())
    }

    async fn audit_head(&self) -> Result<ChainHead, StoreError> {
        Ok(self.lock()?.head())
    }

    async fn create_run(
        &self,
        run: RunRecord,
        limit: Option<RunsInFlight>,
        audit: AuditFn<CreateRun>,
    ) -> Result<CreateRun, StoreError> {
        let mut g = self.lock()?;
        let outcome = if let Some(existing) = g.runs.get(&run.run_id) {
            CreateRun::Existing(Box::new(existing.clone()))
        } else {
            let in_flight = limit.map(|l| {
                let n = g
                    .runs
                    .values()
                    .filter(|s| {
                        s.run.agent == run.agent && s.run.created_at >= l.since && !run_finished(s)
                    })
                    .count();
                (l.max, u32::try_from(n).unwrap_or(u32::MAX))
            });
            match in_flight {
                Some((max, n)) if n >= max => CreateRun::OverQuota {
                    limit: max,
                    in_flight: n,
                },
                _ => CreateRun::Created,
            }
        };
        if matches!(outcome, CreateRun::Created) {
            g.runs.insert(
                run.run_id.clone(),
                RunState {
                    run,
                    outcomes: Default::default(),
                    leases: Default::default(),
                },
            );
        }
        let drafts = audit(&outcome);
        g.append(drafts);
        Ok(outcome)
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<RunState>, StoreError> {
        Ok(self.lock()?.runs.get(&run_id).cloned())
    }

    async fn record_step_as(
        &self,
        run_id: RunId,
        step_id: StepId,
        outcome: StepOutcome,
        holder: Option<String>,
        audit: Vec<AuditDraft>,
    ) -> Result<RecordStep, StoreError> {
        let mut g = self.lock()?;
        let run = g
            .runs
            .get_mut(&run_id)
            .ok_or_else(|| StoreError::not_found(Entity::Run, &run_id))?;
        if !run.run.steps.iter().any(|s| s.step_id == step_id) {
            return Err(StoreError::not_found(
                Entity::Step,
                format!("{run_id}/{step_id}"),
            ));
        }
        if let Some(existing) = run.outcomes.get(&step_id) {
            return Ok(RecordStep::AlreadyRecorded(existing.clone()));
        }
        if let Some(lease) = run.leases.get(&step_id)
            && lease.is_live(outcome.recorded_at)
            && holder.as_deref() != Some(lease.holder.as_str())
        {
            return Ok(RecordStep::LeaseHeld(lease.clone()));
        }
        run.leases.remove(&step_id);
        run.outcomes.insert(step_id, outcome);
        g.append(audit);
        Ok(RecordStep::Recorded)
    }

    async fn lease_step(
        &self,
        run_id: RunId,
        step_id: StepId,
        lease: StepLease,
        audit: AuditFn<LeaseStep>,
    ) -> Result<LeaseStep, StoreError> {
        let mut g = self.lock()?;
        let run = g
            .runs
            .get_mut(&run_id)
            .ok_or_else(|| StoreError::not_found(Entity::Run, &run_id))?;
        if !run.run.steps.iter().any(|s| s.step_id == step_id) {
            return Err(StoreError::not_found(
                Entity::Step,
                format!("{run_id}/{step_id}"),
            ));
        }
        let outcome = match (run.outcomes.get(&step_id), run.leases.get(&step_id)) {
            (Some(recorded), _) => LeaseStep::Recorded(recorded.clone()),
            (None, Some(held)) if !held.yields_to(&lease.holder, lease.acquired_at) => {
                LeaseStep::Held(held.clone())
            }
            (None, _) => {
                run.leases.insert(step_id, lease);
                LeaseStep::Granted
            }
        };
        let drafts = audit(&outcome);
        g.append(drafts);
        Ok(outcome)
    }

    async fn put_envelope(
        &self,
        record: EnvelopeRecord,
        expected_version: Option<u64>,
        audit: AuditFn<PutEnvelope>,
    ) -> Result<PutEnvelope, StoreError> {
        let mut g = self.lock()?;
        let current = g
            .envelopes
            .get(&record.envelope_id)
            .and_then(|v| v.last())
            .map(|r| r.version);
        let fits = match (expected_version, current) {
            (None, None) => true,
            (Some(expected), Some(current)) => expected == current && record.version > current,
            _ => false,
        };
        let outcome = if fits {
            PutEnvelope::Written
        } else {
            PutEnvelope::Conflict { current }
        };
        if fits {
            g.envelopes
                .entry(record.envelope_id.clone())
                .or_default()
                .push(record);
        }
        let drafts = audit(&outcome);
        g.append(drafts);
        Ok(outcome)
    }

    async fn get_envelope(
        &self,
        envelope_id: EnvelopeId,
        version: Option<u64>,
    ) -> Result<Option<EnvelopeRecord>, StoreError> {
        let g = self.lock()?;
        let Some(versions) = g.envelopes.get(&envelope_id) else {
            return Ok(None);
        };
        Ok(match version {
            None => versions.last().cloned(),
            Some(v) => versions.iter().find(|r| r.version == v).cloned(),
        })
    }

    async fn put_escalation(
        &self,
        escalation: EscalationRecord,
        audit: AuditFn<PutEscalation>,
    ) -> Result<PutEscalation, StoreError> {
        let mut g = self.lock()?;
        if g.escalations
            .iter()
            .any(|e| e.escalation_id == escalation.escalation_id)
        {
            return Err(StoreError::duplicate(
                Entity::Escalation,
                escalation.escalation_id,
            ));
        }
        let outcome = match g
            .escalations
            .iter()
            .find(|e| e.target == escalation.target && e.status.is_open())
        {
            Some(open) => PutEscalation::Existing(Box::new(open.clone())),
            None => PutEscalation::Created,
        };
        if outcome == PutEscalation::Created {
            g.escalations.push(escalation);
        }
        let drafts = audit(&outcome);
        g.append(drafts);
        Ok(outcome)
    }

    async fn get_escalation(
        &self,
        escalation_id: String,
    ) -> Result<Option<EscalationRecord>, StoreError> {
        Ok(self
            .lock()?
            .escalations
            .iter()
            .find(|e| e.escalation_id == escalation_id)
            .cloned())
    }

    async fn list_escalations(
        &self,
        status: Option<EscalationStatus>,
    ) -> Result<Vec<EscalationRecord>, StoreError> {
        Ok(self
            .lock()?
            .escalations
            .iter()
            .filter(|e| status.is_none_or(|s| e.status == s))
            .cloned()
            .collect())
    }

    async fn resolve_escalation(
        &self,
        escalation_id: String,
        resolution: EscalationResolution,
        by: Subject,
        at: Timestamp,
        audit: AuditFn<ResolveEscalation>,
    ) -> Result<ResolveEscalation, StoreError> {
        let mut g = self.lock()?;
        let outcome = match g
            .escalations
            .iter_mut()
            .find(|e| e.escalation_id == escalation_id)
        {
            None => ResolveEscalation::NotFound,
            Some(e) if e.status != EscalationStatus::Pending => {
                ResolveEscalation::NotPending(Box::new(e.clone()))
            }
            Some(e) => {
                match resolution {
                    EscalationResolution::Approve => e.status = EscalationStatus::Approved,
                    EscalationResolution::Reject { reason } => {
                        e.status = EscalationStatus::Rejected;
                        e.rejection_reason = Some(reason);
                    }
                }
                e.resolved_by = Some(by);
                e.resolved_at = Some(at);
                ResolveEscalation::Resolved(Box::new(e.clone()))
            }
        };
        let drafts = audit(&outcome);
        g.append(drafts);
        Ok(outcome)
    }

    async fn consume_escalation(
        &self,
        target: EscalationTarget,
        at: Timestamp,
        audit: AuditFn<Option<ConsumedEscalation>>,
    ) -> Result<Option<ConsumedEscalation>, StoreError> {
        let mut g = self.lock()?;
        let consumed = g
            .escalations
            .iter_mut()
            .find(|e| e.target == target && e.status == EscalationStatus::Approved)
            .map(|e| {
                e.status = EscalationStatus::Consumed;
                e.consumed_at = Some(at);
                e.clone()
            });
        let outcome = consumed.map(|escalation| {
            let mut withdrawn = Vec::new();
            for e in g.escalations.iter_mut() {
                if e.status == EscalationStatus::Pending && e.target.same_slot(&target) {
                    *e = ConsumedEscalation::withdraw(&escalation, e.clone(), at);
                    withdrawn.push(e.clone());
                }
            }
            ConsumedEscalation {
                escalation,
                withdrawn,
            }
        });
        let drafts = audit(&outcome);
        g.append(drafts);
        Ok(outcome)
    }

    async fn create_session(
        &self,
        state: SessionState,
        envelope: Option<EnvelopeRecord>,
        import: Option<EnvelopeImport>,
        audit: AuditFn<CreateSession>,
    ) -> Result<CreateSession, StoreError> {
        check_create(&state, envelope.as_ref())?;
        let mut g = self.lock()?;
        let id = state.session.session_id.clone();
        if let Some(existing) = g.sessions.get(&id) {
            let outcome = CreateSession::Existing(Box::new(existing.state()));
            let drafts = audit(&outcome);
            g.append(drafts);
            return Ok(outcome);
        }
        if let Some(e) = &envelope
            && g.envelopes.contains_key(&e.envelope_id)
        {
            return Err(StoreError::duplicate(Entity::Envelope, &e.envelope_id));
        }
        if envelope.is_none()
            && let Some(named) = &state.session.envelope_id
            && !g.envelopes.contains_key(named)
        {
            return Err(missing_envelope(named));
        }
        if let Some(import) = &import {
            let earlier: Vec<EnvelopeImport> = g
                .imports
                .iter()
                .filter(|e| e.issuer == import.issuer && e.envelope_id == import.envelope_id)
                .cloned()
                .collect();
            if let Err(refusal) = decide_import(import, &earlier) {
                let outcome = CreateSession::ImportRefused(refusal);
                let drafts = audit(&outcome);
                g.append(drafts);
                return Ok(outcome);
            }
        }
        if let Some(e) = envelope {
            g.envelopes.insert(e.envelope_id.clone(), vec![e]);
        }
        if let Some(import) = import {
            g.imports.push(import);
        }
        g.sessions.insert(id.clone(), MemSession::of(state));
        g.session_order.push(id);
        let outcome = CreateSession::Created;
        let drafts = audit(&outcome);
        g.append(drafts);
        Ok(outcome)
    }

    async fn get_session(&self, session_id: SessionId) -> Result<Option<SessionState>, StoreError> {
        let g = self.lock()?;
        Ok(g.sessions.get(&session_id).map(MemSession::state))
    }

    async fn get_session_head(
        &self,
        session_id: SessionId,
        call_id: Option<CallId>,
        known_revision: Option<u64>,
    ) -> Result<Option<SessionHead>, StoreError> {
        let g = self.lock()?;
        Ok(g.sessions
            .get(&session_id)
            .map(|s| s.head(call_id.as_ref(), known_revision)))
    }

    async fn update_session(
        &self,
        update: SessionUpdate,
        expected_revision: u64,
        audit: AuditFn<UpdateSession>,
    ) -> Result<UpdateSession, StoreError> {
        let mut g = self.lock()?;
        let id = &update.session.session_id;
        let current = g.sessions.get(id).map(|s| s.session.revision);
        let fits = current == Some(expected_revision)
            && update.session.revision == expected_revision.saturating_add(1);
        let outcome = if fits {
            UpdateSession::Updated
        } else {
            UpdateSession::Conflict { current }
        };
        if fits && let Some(stored) = g.sessions.get_mut(id) {
            if let Some(call) = &update.call
                && !stored.seq_free_for(call)
            {
                return Err(seq_taken(id, call.seq));
            }
            stored.session = update.session;
            if let Some(change) = update.sources {
                change.apply_to(&mut stored.sources);
            }
            if let Some(call) = update.call {
                stored.put_call(call);
            }
        }
        let drafts = audit(&outcome);
        g.append(drafts);
        Ok(outcome)
    }

    async fn list_sessions(
        &self,
        agent: Option<AgentId>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let g = self.lock()?;
        Ok(g.session_order
            .iter()
            .filter_map(|id| g.sessions.get(id))
            .filter(|s| agent.as_ref().is_none_or(|a| &s.session.agent == a))
            .take(limit)
            .map(|s| s.session.clone())
            .collect())
    }

    async fn take_request_tokens(
        &self,
        charges: Vec<RateCharge>,
        now: Timestamp,
    ) -> Result<TakeTokens, StoreError> {
        self.rates.take(&charges, now)
    }

    async fn signing_keys(&self) -> Result<Vec<SigningKeyRecord>, StoreError> {
        Ok(self.lock()?.signing_keys.clone())
    }

    async fn insert_signing_key(
        &self,
        key: SigningKeyRecord,
        audit: Vec<AuditDraft>,
    ) -> Result<bool, StoreError> {
        check_signing_key(&key)?;
        let mut g = self.lock()?;
        if g.signing_keys
            .iter()
            .any(|k| k.generation == key.generation)
        {
            return Ok(false);
        }
        let at = g
            .signing_keys
            .partition_point(|k| k.generation < key.generation);
        g.signing_keys.insert(at, key);
        g.append(audit);
        Ok(true)
    }
}

#[cfg(test)]
mod audit_log_tests {
    use super::*;
    use warden_core::audit::ChainVerifier;
    use warden_core::decision::Verdict;

    fn draft(i: usize) -> AuditDraft {
        AuditDraft {
            time: Timestamp(i as i64),
            subject: "a".into(),
            operation: "op".into(),
            resource: "r".into(),
            verdict: Verdict::Allow,
            reason: "ok".into(),
            policy_version: "1".into(),
            details: serde_json::Value::Null,
        }
    }

    #[tokio::test]
    async fn audit_pages_across_chunk_boundaries() {
        let store = MemoryStore::new();
        let n = AUDIT_CHUNK + 100;
        store
            .append_audit((0..n).map(draft).collect())
            .await
            .unwrap();
        let head = store.audit_head().await.unwrap();
        assert_eq!(head.count, n as u64);
        let page = store.audit_page(AUDIT_CHUNK as u64 - 5, 10).await.unwrap();
        let seqs: Vec<u64> = page.iter().map(|e| e.seq).collect();
        let first = AUDIT_CHUNK as u64 - 4;
        assert_eq!(seqs, (first..first + 10).collect::<Vec<_>>());
        let mut v = ChainVerifier::new();
        let mut after = 0;
        loop {
            let page = store.audit_page(after, 7_000).await.unwrap();
            for e in &page {
                v.push(e).unwrap();
            }
            match page.last() {
                Some(last) => after = last.seq,
                None => break,
            }
        }
        assert_eq!(v.finish(), head);
    }
}
