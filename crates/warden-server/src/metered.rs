//! [`Metered`]: a [`Store`] wrapper that counts every decision appended to
//! the audit log, so `warden_decisions_total` is exactly the log's content
//! (whoever made the decision: engine, quota or authentication).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use warden_core::audit::{AuditDraft, ChainHead};
use warden_core::decision::Subject;
use warden_core::envelope::EnvelopeRecord;
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, RunId, StepId};
use warden_core::memory::Put;
use warden_core::time::Timestamp;
use warden_store::{
    AuditFn, ConsumedEscalation, CreateRun, CreateSession, Delete, DeleteOutcome, EnvelopeImport,
    EscalationRecord, EscalationResolution, EscalationTarget, PutAuditFn, PutEnvelope,
    PutEscalation, PutOutcome, RecordStep, ResolveEscalation, RunRecord, RunsInFlight,
    SessionState, SessionUpdate, StepOutcome, StorageQuota, Store, StoreError, StoredAgent,
    TokenRecord, UpdateSession,
};

use crate::metrics::Metrics;

/// A store whose appended decisions are counted in [`Metrics`].
#[derive(Debug)]
pub struct Metered<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> Metered<S> {
    /// Wrap `inner`.
    pub fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn counted<T>(&self, audit: AuditFn<T>) -> AuditFn<T>
    where
        T: 'static,
    {
        let metrics = Arc::clone(&self.metrics);
        Box::new(move |outcome| {
            let drafts = audit(outcome);
            metrics.observe_drafts(&drafts);
            drafts
        })
    }

    fn after<T>(&self, r: Result<T, StoreError>, drafts: &[AuditDraft]) -> Result<T, StoreError> {
        if r.is_ok() {
            self.metrics.observe_drafts(drafts);
        }
        r
    }
}

impl<S: Store> Store for Metered<S> {
    // Reads append nothing: forwarded as they are.
    warden_store::forward_store!(field inner;
        load_agents, find_token, get_records, owner_usage, audit_page, audit_head, get_run,
        get_envelope, get_escalation, list_escalations, get_session, get_session_head,
        list_sessions, take_request_tokens, signing_keys);

    async fn insert_signing_key(
        &self,
        key: warden_store::SigningKeyRecord,
        audit: Vec<AuditDraft>,
    ) -> Result<bool, StoreError> {
        let r = self.inner.insert_signing_key(key, audit.clone()).await;
        // Only a stored key appended its entries.
        match r {
            Ok(true) => self.after(Ok(true), &audit),
            other => other,
        }
    }

    async fn insert_agent(
        &self,
        agent: StoredAgent,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        let r = self.inner.insert_agent(agent, audit.clone()).await;
        self.after(r, &audit)
    }

    async fn set_agent_status(
        &self,
        ids: Vec<AgentId>,
        status: AgentStatus,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        let r = self
            .inner
            .set_agent_status(ids, status, audit.clone())
            .await;
        self.after(r, &audit)
    }

    async fn set_agent_capabilities(
        &self,
        id: AgentId,
        capabilities: BTreeSet<ActionName>,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        let r = self
            .inner
            .set_agent_capabilities(id, capabilities, audit.clone())
            .await;
        self.after(r, &audit)
    }

    async fn insert_token(
        &self,
        token: TokenRecord,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        let r = self.inner.insert_token(token, audit.clone()).await;
        self.after(r, &audit)
    }

    async fn revoke_token(
        &self,
        token_id: String,
        audit: Vec<AuditDraft>,
    ) -> Result<bool, StoreError> {
        let r = self.inner.revoke_token(token_id, audit.clone()).await;
        if matches!(r, Ok(true)) {
            self.metrics.observe_drafts(&audit);
        }
        r
    }

    async fn put_record(
        &self,
        put: Put,
        now: Timestamp,
        quota: StorageQuota,
        audit: PutAuditFn,
    ) -> Result<PutOutcome, StoreError> {
        // A put's audit may be called once per attempt (`PutAuditFn`): the
        // drafts of the last one are counted, once the put has committed.
        let last: Arc<Mutex<Vec<AuditDraft>>> = Arc::default();
        let slot = Arc::clone(&last);
        let audit: PutAuditFn = Box::new(move |outcome| {
            let drafts = audit(outcome);
            if let Ok(mut slot) = slot.lock() {
                slot.clone_from(&drafts);
            }
            drafts
        });
        let r = self.inner.put_record(put, now, quota, audit).await;
        let drafts = last
            .lock()
            .map(|mut d| std::mem::take(&mut *d))
            .unwrap_or_default();
        self.after(r, &drafts)
    }

    async fn delete_record(
        &self,
        delete: Delete,
        audit: AuditFn<DeleteOutcome>,
    ) -> Result<DeleteOutcome, StoreError> {
        let audit = self.counted(audit);
        self.inner.delete_record(delete, audit).await
    }

    async fn append_audit(&self, drafts: Vec<AuditDraft>) -> Result<ChainHead, StoreError> {
        let r = self.inner.append_audit(drafts.clone()).await;
        self.after(r, &drafts)
    }

    async fn create_run(
        &self,
        run: RunRecord,
        limit: Option<RunsInFlight>,
        audit: AuditFn<CreateRun>,
    ) -> Result<CreateRun, StoreError> {
        let audit = self.counted(audit);
        self.inner.create_run(run, limit, audit).await
    }

    async fn record_step_as(
        &self,
        run_id: RunId,
        step_id: StepId,
        outcome: StepOutcome,
        holder: Option<String>,
        audit: Vec<AuditDraft>,
    ) -> Result<RecordStep, StoreError> {
        let r = self
            .inner
            .record_step_as(run_id, step_id, outcome, holder, audit.clone())
            .await;
        if matches!(r, Ok(RecordStep::Recorded)) {
            self.metrics.observe_drafts(&audit);
        }
        r
    }

    async fn lease_step(
        &self,
        run_id: RunId,
        step_id: StepId,
        lease: warden_store::StepLease,
        audit: AuditFn<warden_store::LeaseStep>,
    ) -> Result<warden_store::LeaseStep, StoreError> {
        self.inner
            .lease_step(run_id, step_id, lease, self.counted(audit))
            .await
    }

    async fn put_envelope(
        &self,
        record: EnvelopeRecord,
        expected_version: Option<u64>,
        audit: AuditFn<PutEnvelope>,
    ) -> Result<PutEnvelope, StoreError> {
        self.inner
            .put_envelope(record, expected_version, self.counted(audit))
            .await
    }

    async fn create_session(
        &self,
        state: SessionState,
        envelope: Option<EnvelopeRecord>,
        import: Option<EnvelopeImport>,
        audit: AuditFn<CreateSession>,
    ) -> Result<CreateSession, StoreError> {
        self.inner
            .create_session(state, envelope, import, self.counted(audit))
            .await
    }

    async fn update_session(
        &self,
        update: SessionUpdate,
        expected_revision: u64,
        audit: AuditFn<UpdateSession>,
    ) -> Result<UpdateSession, StoreError> {
        self.inner
            .update_session(update, expected_revision, self.counted(audit))
            .await
    }

    async fn put_escalation(
        &self,
        escalation: EscalationRecord,
        audit: AuditFn<PutEscalation>,
    ) -> Result<PutEscalation, StoreError> {
        self.inner
            .put_escalation(escalation, self.counted(audit))
            .await
    }

    async fn resolve_escalation(
        &self,
        escalation_id: String,
        resolution: EscalationResolution,
        by: Subject,
        at: Timestamp,
        audit: AuditFn<ResolveEscalation>,
    ) -> Result<ResolveEscalation, StoreError> {
        self.inner
            .resolve_escalation(escalation_id, resolution, by, at, self.counted(audit))
            .await
    }

    async fn consume_escalation(
        &self,
        target: EscalationTarget,
        at: Timestamp,
        audit: AuditFn<Option<ConsumedEscalation>>,
    ) -> Result<Option<ConsumedEscalation>, StoreError> {
        self.inner
            .consume_escalation(target, at, self.counted(audit))
            .await
    }
}
