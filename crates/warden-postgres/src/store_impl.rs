//! `impl Store for PgStore`: each method is decided in the module of its
//! concern.

use std::collections::BTreeSet;

use warden_core::audit::{AuditDraft, AuditEntry, ChainHead, Digest};
use warden_core::decision::Subject;
use warden_core::envelope::{EnvelopeId, EnvelopeRecord};
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, CallId, Key, Namespace, RunId, SessionId, StepId};
use warden_core::memory::{MemoryRecord, Put};
use warden_core::time::Timestamp;
use warden_store::{
    AuditFn, CreateRun, CreateSession, Delete, DeleteOutcome, EnvelopeImport, EscalationRecord,
    EscalationResolution, EscalationStatus, EscalationTarget, PutAuditFn, PutEnvelope,
    PutEscalation, PutOutcome, RecordStep, ResolveEscalation, RunRecord, RunState, RunsInFlight,
    SessionHead, SessionRecord, SessionState, SessionUpdate, StepOutcome, StorageQuota, Store,
    StoreError, StoredAgent, TokenRecord, UpdateSession, Usage,
};

use crate::store::PgStore;

impl Store for PgStore {
    async fn load_agents(&self) -> Result<Vec<StoredAgent>, StoreError> {
        crate::agents::load_agents(self).await
    }

    async fn insert_agent(
        &self,
        agent: StoredAgent,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        crate::agents::insert_agent(self, agent, audit).await
    }

    async fn set_agent_status(
        &self,
        ids: Vec<AgentId>,
        status: AgentStatus,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        crate::agents::set_agent_status(self, ids, status, audit).await
    }

    async fn set_agent_capabilities(
        &self,
        id: AgentId,
        capabilities: BTreeSet<ActionName>,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        crate::agents::set_agent_capabilities(self, id, capabilities, audit).await
    }

    async fn insert_token(
        &self,
        token: TokenRecord,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        crate::agents::insert_token(self, token, audit).await
    }

    async fn find_token(&self, hash: Digest) -> Result<Option<TokenRecord>, StoreError> {
        crate::agents::find_token(self, hash).await
    }

    async fn revoke_token(
        &self,
        token_id: String,
        audit: Vec<AuditDraft>,
    ) -> Result<bool, StoreError> {
        crate::agents::revoke_token(self, token_id, audit).await
    }

    async fn get_records(
        &self,
        namespace: Namespace,
        key: Key,
        owners: Vec<AgentId>,
    ) -> Result<Vec<MemoryRecord>, StoreError> {
        crate::memory::get_records(self, namespace, key, owners).await
    }

    async fn put_record(
        &self,
        put: Put,
        now: Timestamp,
        quota: StorageQuota,
        audit: PutAuditFn,
    ) -> Result<PutOutcome, StoreError> {
        crate::memory::put_record(self, put, now, quota, audit).await
    }

    async fn delete_record(
        &self,
        delete: Delete,
        audit: AuditFn<DeleteOutcome>,
    ) -> Result<DeleteOutcome, StoreError> {
        crate::memory::delete_record(self, delete, audit).await
    }

    async fn owner_usage(&self, owner: AgentId) -> Result<Usage, StoreError> {
        crate::memory::owner_usage(self, owner).await
    }

    async fn append_audit(&self, drafts: Vec<AuditDraft>) -> Result<ChainHead, StoreError> {
        crate::log::append_audit(self, drafts).await
    }

    async fn audit_page(&self, after: u64, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        crate::log::audit_page(self, after, limit).await
    }

    async fn audit_head(&self) -> Result<ChainHead, StoreError> {
        crate::log::audit_head(self).await
    }

    async fn create_run(
        &self,
        run: RunRecord,
        limit: Option<RunsInFlight>,
        audit: AuditFn<CreateRun>,
    ) -> Result<CreateRun, StoreError> {
        crate::runs::create_run(self, run, limit, audit).await
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<RunState>, StoreError> {
        crate::runs::get_run(self, run_id).await
    }

    async fn record_step_as(
        &self,
        run_id: RunId,
        step_id: StepId,
        outcome: StepOutcome,
        holder: Option<String>,
        audit: Vec<AuditDraft>,
    ) -> Result<RecordStep, StoreError> {
        crate::runs::record_step(self, run_id, step_id, outcome, holder, audit).await
    }

    async fn lease_step(
        &self,
        run_id: RunId,
        step_id: StepId,
        lease: warden_store::StepLease,
        audit: AuditFn<warden_store::LeaseStep>,
    ) -> Result<warden_store::LeaseStep, StoreError> {
        crate::runs::lease_step(self, run_id, step_id, lease, audit).await
    }

    async fn put_envelope(
        &self,
        record: EnvelopeRecord,
        expected_version: Option<u64>,
        audit: AuditFn<PutEnvelope>,
    ) -> Result<PutEnvelope, StoreError> {
        crate::context::put_envelope(self, record, expected_version, audit).await
    }

    async fn get_envelope(
        &self,
        envelope_id: EnvelopeId,
        version: Option<u64>,
    ) -> Result<Option<EnvelopeRecord>, StoreError> {
        crate::context::get_envelope(self, envelope_id, version).await
    }

    async fn put_escalation(
        &self,
        escalation: EscalationRecord,
        audit: AuditFn<PutEscalation>,
    ) -> Result<PutEscalation, StoreError> {
        crate::context::put_escalation(self, escalation, audit).await
    }

    async fn get_escalation(
        &self,
        escalation_id: String,
    ) -> Result<Option<EscalationRecord>, StoreError> {
        crate::context::get_escalation(self, escalation_id).await
    }

    async fn list_escalations(
        &self,
        status: Option<EscalationStatus>,
    ) -> Result<Vec<EscalationRecord>, StoreError> {
        crate::context::list_escalations(self, status).await
    }

    async fn resolve_escalation(
        &self,
        escalation_id: String,
        resolution: EscalationResolution,
        by: Subject,
        at: Timestamp,
        audit: AuditFn<ResolveEscalation>,
    ) -> Result<ResolveEscalation, StoreError> {
        crate::context::resolve_escalation(self, escalation_id, resolution, by, at, audit).await
    }

    async fn consume_escalation(
        &self,
        target: EscalationTarget,
        at: Timestamp,
        audit: AuditFn<Option<warden_store::ConsumedEscalation>>,
    ) -> Result<Option<warden_store::ConsumedEscalation>, StoreError> {
        crate::context::consume_escalation(self, target, at, audit).await
    }

    async fn create_session(
        &self,
        state: SessionState,
        envelope: Option<EnvelopeRecord>,
        import: Option<EnvelopeImport>,
        audit: AuditFn<CreateSession>,
    ) -> Result<CreateSession, StoreError> {
        crate::sessions::create_session(self, state, envelope, import, audit).await
    }

    async fn get_session(&self, session_id: SessionId) -> Result<Option<SessionState>, StoreError> {
        crate::sessions::get_session(self, session_id).await
    }

    async fn get_session_head(
        &self,
        session_id: SessionId,
        call_id: Option<CallId>,
        known_revision: Option<u64>,
    ) -> Result<Option<SessionHead>, StoreError> {
        crate::sessions::get_session_head(self, session_id, call_id, known_revision).await
    }

    async fn update_session(
        &self,
        update: SessionUpdate,
        expected_revision: u64,
        audit: AuditFn<UpdateSession>,
    ) -> Result<UpdateSession, StoreError> {
        crate::sessions::update_session(self, update, expected_revision, audit).await
    }

    async fn list_sessions(
        &self,
        agent: Option<AgentId>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        crate::sessions::list_sessions(self, agent, limit).await
    }

    async fn take_request_tokens(
        &self,
        charges: Vec<warden_store::RateCharge>,
        now: Timestamp,
    ) -> Result<warden_store::TakeTokens, StoreError> {
        crate::shared::take_request_tokens(self, charges, now).await
    }

    async fn signing_keys(&self) -> Result<Vec<warden_store::SigningKeyRecord>, StoreError> {
        crate::shared::signing_keys(self).await
    }

    async fn insert_signing_key(
        &self,
        key: warden_store::SigningKeyRecord,
        audit: Vec<AuditDraft>,
    ) -> Result<bool, StoreError> {
        crate::shared::insert_signing_key(self, key, audit).await
    }
}
