//! [`forward_store!`](crate::forward_store): one way to write a store that
//! wraps another.
//!
//! A wrapper (a metering layer, a test store that yields, an enum over
//! backends) implements [`Store`](crate::Store) by forwarding most methods
//! to what it wraps. The macro writes those forwards from one table of the
//! trait's signatures (`__forward_one!`, below), so a new trait method is
//! added there once and every wrapper follows.
//!
//! Three forms:
//!
//! ```text
//! // The whole impl, every method forwarded to a field (optionally running
//! // a block before each call):
//! warden_store::forward_store!(impl Store for ScratchStore => field store);
//!
//! // The whole impl over an enum, each method dispatched to the variant's
//! // store (every variant a one-field tuple variant):
//! warden_store::forward_store!(impl Store for AnyStore => enum Memory, Sqlite, Postgres);
//!
//! // Inside an impl that writes some methods itself: forward the others.
//! impl<S: Store> Store for Metered<S> {
//!     warden_store::forward_store!(field inner; load_agents, find_token);
//!     async fn insert_agent(&self, /* ... */) { /* counted */ }
//! }
//! ```
//!
//! A method neither forwarded nor written is a compile error, and so is one
//! forwarded and written.

/// Forward [`Store`](crate::Store) methods to a wrapped store; see the
/// [module docs](crate::forward).
#[macro_export]
macro_rules! forward_store {
    (impl Store for $ty:ty => field $field:ident $(before $before:block)?) => {
        impl $crate::Store for $ty {
            $crate::forward_store!(field $field $(before $before)?;
                load_agents,
                insert_agent,
                set_agent_status,
                set_agent_capabilities,
                insert_token,
                find_token,
                revoke_token,
                get_records,
                put_record,
                delete_record,
                owner_usage,
                append_audit,
                audit_page,
                audit_head,
                create_run,
                get_run,
                record_step,
                record_step_as,
                lease_step,
                put_envelope,
                get_envelope,
                put_escalation,
                get_escalation,
                list_escalations,
                resolve_escalation,
                consume_escalation,
                create_session,
                get_session,
                get_session_head,
                update_session,
                list_sessions,
                take_request_tokens,
                signing_keys,
                insert_signing_key);
        }
    };
    (impl Store for $ty:ty => enum $($variant:ident),+ $(,)?) => {
        impl $crate::Store for $ty {
            $crate::forward_store!(enum $($variant),+;
                load_agents,
                insert_agent,
                set_agent_status,
                set_agent_capabilities,
                insert_token,
                find_token,
                revoke_token,
                get_records,
                put_record,
                delete_record,
                owner_usage,
                append_audit,
                audit_page,
                audit_head,
                create_run,
                get_run,
                record_step,
                record_step_as,
                lease_step,
                put_envelope,
                get_envelope,
                put_escalation,
                get_escalation,
                list_escalations,
                resolve_escalation,
                consume_escalation,
                create_session,
                get_session,
                get_session_head,
                update_session,
                list_sessions,
                take_request_tokens,
                signing_keys,
                insert_signing_key);
        }
    };
    (field $field:ident $(before $before:block)?; $($method:ident),* $(,)?) => {
        $crate::forward_store!(@field $field { $($before)? }; $($method),*);
    };
    (@field $field:ident $before:block; $($method:ident),*) => {
        $( $crate::__forward_one!($method, (field $field $before)); )*
    };
    (enum $($variant:ident),+; $($method:ident),* $(,)?) => {
        $crate::forward_store!(@enum ($($variant)+); $($method),*);
    };
    (@enum $variants:tt; $($method:ident),*) => {
        $( $crate::__forward_one!($method, (enum $variants)); )*
    };
}

/// One forwarding method, from the trait's signature table.
#[doc(hidden)]
#[macro_export]
macro_rules! __forward_one {
    (load_agents, $how:tt) => {
        async fn load_agents(&self) -> Result<Vec<$crate::StoredAgent>, $crate::StoreError> {
            $crate::__forward_call!(self, $how, load_agents())
        }
    };
    (insert_agent, $how:tt) => {
        async fn insert_agent(
            &self,
            agent: $crate::StoredAgent,
            audit: Vec<$crate::__core::audit::AuditDraft>,
        ) -> Result<(), $crate::StoreError> {
            $crate::__forward_call!(self, $how, insert_agent(agent, audit))
        }
    };
    (set_agent_status, $how:tt) => {
        async fn set_agent_status(
            &self,
            ids: Vec<$crate::__core::ids::AgentId>,
            status: $crate::__core::hierarchy::AgentStatus,
            audit: Vec<$crate::__core::audit::AuditDraft>,
        ) -> Result<(), $crate::StoreError> {
            $crate::__forward_call!(self, $how, set_agent_status(ids, status, audit))
        }
    };
    (set_agent_capabilities, $how:tt) => {
        async fn set_agent_capabilities(
            &self,
            id: $crate::__core::ids::AgentId,
            capabilities: ::std::collections::BTreeSet<$crate::__core::ids::ActionName>,
            audit: Vec<$crate::__core::audit::AuditDraft>,
        ) -> Result<(), $crate::StoreError> {
            $crate::__forward_call!(self, $how, set_agent_capabilities(id, capabilities, audit))
        }
    };
    (insert_token, $how:tt) => {
        async fn insert_token(
            &self,
            token: $crate::TokenRecord,
            audit: Vec<$crate::__core::audit::AuditDraft>,
        ) -> Result<(), $crate::StoreError> {
            $crate::__forward_call!(self, $how, insert_token(token, audit))
        }
    };
    (find_token, $how:tt) => {
        async fn find_token(
            &self,
            hash: $crate::__core::audit::Digest,
        ) -> Result<Option<$crate::TokenRecord>, $crate::StoreError> {
            $crate::__forward_call!(self, $how, find_token(hash))
        }
    };
    (revoke_token, $how:tt) => {
        async fn revoke_token(
            &self,
            token_id: String,
            audit: Vec<$crate::__core::audit::AuditDraft>,
        ) -> Result<bool, $crate::StoreError> {
            $crate::__forward_call!(self, $how, revoke_token(token_id, audit))
        }
    };
    (get_records, $how:tt) => {
        async fn get_records(
            &self,
            namespace: $crate::__core::ids::Namespace,
            key: $crate::__core::ids::Key,
            owners: Vec<$crate::__core::ids::AgentId>,
        ) -> Result<Vec<$crate::__core::memory::MemoryRecord>, $crate::StoreError> {
            $crate::__forward_call!(self, $how, get_records(namespace, key, owners))
        }
    };
    (put_record, $how:tt) => {
        async fn put_record(
            &self,
            put: $crate::__core::memory::Put,
            now: $crate::__core::time::Timestamp,
            quota: $crate::StorageQuota,
            audit: $crate::PutAuditFn,
        ) -> Result<$crate::PutOutcome, $crate::StoreError> {
            $crate::__forward_call!(self, $how, put_record(put, now, quota, audit))
        }
    };
    (delete_record, $how:tt) => {
        async fn delete_record(
            &self,
            delete: $crate::Delete,
            audit: $crate::AuditFn<$crate::DeleteOutcome>,
        ) -> Result<$crate::DeleteOutcome, $crate::StoreError> {
            $crate::__forward_call!(self, $how, delete_record(delete, audit))
        }
    };
    (owner_usage, $how:tt) => {
        async fn owner_usage(
            &self,
            owner: $crate::__core::ids::AgentId,
        ) -> Result<$crate::Usage, $crate::StoreError> {
            $crate::__forward_call!(self, $how, owner_usage(owner))
        }
    };
    (append_audit, $how:tt) => {
        async fn append_audit(
            &self,
            drafts: Vec<$crate::__core::audit::AuditDraft>,
        ) -> Result<$crate::__core::audit::ChainHead, $crate::StoreError> {
            $crate::__forward_call!(self, $how, append_audit(drafts))
        }
    };
    (audit_page, $how:tt) => {
        async fn audit_page(
            &self,
            after: u64,
            limit: usize,
        ) -> Result<Vec<$crate::__core::audit::AuditEntry>, $crate::StoreError> {
            $crate::__forward_call!(self, $how, audit_page(after, limit))
        }
    };
    (audit_head, $how:tt) => {
        async fn audit_head(&self) -> Result<$crate::__core::audit::ChainHead, $crate::StoreError> {
            $crate::__forward_call!(self, $how, audit_head())
        }
    };
    (create_run, $how:tt) => {
        async fn create_run(
            &self,
            run: $crate::RunRecord,
            limit: Option<$crate::RunsInFlight>,
            audit: $crate::AuditFn<$crate::CreateRun>,
        ) -> Result<$crate::CreateRun, $crate::StoreError> {
            $crate::__forward_call!(self, $how, create_run(run, limit, audit))
        }
    };
    (get_run, $how:tt) => {
        async fn get_run(
            &self,
            run_id: $crate::__core::ids::RunId,
        ) -> Result<Option<$crate::RunState>, $crate::StoreError> {
            $crate::__forward_call!(self, $how, get_run(run_id))
        }
    };
    (record_step, $how:tt) => {
        async fn record_step(
            &self,
            run_id: $crate::__core::ids::RunId,
            step_id: $crate::__core::ids::StepId,
            outcome: $crate::StepOutcome,
            audit: Vec<$crate::__core::audit::AuditDraft>,
        ) -> Result<$crate::RecordStep, $crate::StoreError> {
            $crate::__forward_call!(self, $how, record_step(run_id, step_id, outcome, audit))
        }
    };
    (record_step_as, $how:tt) => {
        async fn record_step_as(
            &self,
            run_id: $crate::__core::ids::RunId,
            step_id: $crate::__core::ids::StepId,
            outcome: $crate::StepOutcome,
            holder: Option<String>,
            audit: Vec<$crate::__core::audit::AuditDraft>,
        ) -> Result<$crate::RecordStep, $crate::StoreError> {
            $crate::__forward_call!(
                self,
                $how,
                record_step_as(run_id, step_id, outcome, holder, audit)
            )
        }
    };
    (lease_step, $how:tt) => {
        async fn lease_step(
            &self,
            run_id: $crate::__core::ids::RunId,
            step_id: $crate::__core::ids::StepId,
            lease: $crate::StepLease,
            audit: $crate::AuditFn<$crate::LeaseStep>,
        ) -> Result<$crate::LeaseStep, $crate::StoreError> {
            $crate::__forward_call!(self, $how, lease_step(run_id, step_id, lease, audit))
        }
    };
    (put_envelope, $how:tt) => {
        async fn put_envelope(
            &self,
            record: $crate::__core::envelope::EnvelopeRecord,
            expected_version: Option<u64>,
            audit: $crate::AuditFn<$crate::PutEnvelope>,
        ) -> Result<$crate::PutEnvelope, $crate::StoreError> {
            $crate::__forward_call!(self, $how, put_envelope(record, expected_version, audit))
        }
    };
    (get_envelope, $how:tt) => {
        async fn get_envelope(
            &self,
            envelope_id: $crate::__core::envelope::EnvelopeId,
            version: Option<u64>,
        ) -> Result<Option<$crate::__core::envelope::EnvelopeRecord>, $crate::StoreError> {
            $crate::__forward_call!(self, $how, get_envelope(envelope_id, version))
        }
    };
    (put_escalation, $how:tt) => {
        async fn put_escalation(
            &self,
            escalation: $crate::EscalationRecord,
            audit: $crate::AuditFn<$crate::PutEscalation>,
        ) -> Result<$crate::PutEscalation, $crate::StoreError> {
            $crate::__forward_call!(self, $how, put_escalation(escalation, audit))
        }
    };
    (get_escalation, $how:tt) => {
        async fn get_escalation(
            &self,
            escalation_id: String,
        ) -> Result<Option<$crate::EscalationRecord>, $crate::StoreError> {
            $crate::__forward_call!(self, $how, get_escalation(escalation_id))
        }
    };
    (list_escalations, $how:tt) => {
        async fn list_escalations(
            &self,
            status: Option<$crate::EscalationStatus>,
        ) -> Result<Vec<$crate::EscalationRecord>, $crate::StoreError> {
            $crate::__forward_call!(self, $how, list_escalations(status))
        }
    };
    (resolve_escalation, $how:tt) => {
        async fn resolve_escalation(
            &self,
            escalation_id: String,
            resolution: $crate::EscalationResolution,
            by: $crate::__core::decision::Subject,
            at: $crate::__core::time::Timestamp,
            audit: $crate::AuditFn<$crate::ResolveEscalation>,
        ) -> Result<$crate::ResolveEscalation, $crate::StoreError> {
            $crate::__forward_call!(
                self,
                $how,
                resolve_escalation(escalation_id, resolution, by, at, audit)
            )
        }
    };
    (consume_escalation, $how:tt) => {
        async fn consume_escalation(
            &self,
            target: $crate::EscalationTarget,
            at: $crate::__core::time::Timestamp,
            audit: $crate::AuditFn<Option<$crate::ConsumedEscalation>>,
        ) -> Result<Option<$crate::ConsumedEscalation>, $crate::StoreError> {
            $crate::__forward_call!(self, $how, consume_escalation(target, at, audit))
        }
    };
    (create_session, $how:tt) => {
        async fn create_session(
            &self,
            state: $crate::SessionState,
            envelope: Option<$crate::__core::envelope::EnvelopeRecord>,
            import: Option<$crate::EnvelopeImport>,
            audit: $crate::AuditFn<$crate::CreateSession>,
        ) -> Result<$crate::CreateSession, $crate::StoreError> {
            $crate::__forward_call!(self, $how, create_session(state, envelope, import, audit))
        }
    };
    (get_session, $how:tt) => {
        async fn get_session(
            &self,
            session_id: $crate::__core::ids::SessionId,
        ) -> Result<Option<$crate::SessionState>, $crate::StoreError> {
            $crate::__forward_call!(self, $how, get_session(session_id))
        }
    };
    (get_session_head, $how:tt) => {
        async fn get_session_head(
            &self,
            session_id: $crate::__core::ids::SessionId,
            call_id: Option<$crate::__core::ids::CallId>,
            known_revision: Option<u64>,
        ) -> Result<Option<$crate::SessionHead>, $crate::StoreError> {
            $crate::__forward_call!(
                self,
                $how,
                get_session_head(session_id, call_id, known_revision)
            )
        }
    };
    (update_session, $how:tt) => {
        async fn update_session(
            &self,
            update: $crate::SessionUpdate,
            expected_revision: u64,
            audit: $crate::AuditFn<$crate::UpdateSession>,
        ) -> Result<$crate::UpdateSession, $crate::StoreError> {
            $crate::__forward_call!(self, $how, update_session(update, expected_revision, audit))
        }
    };
    (list_sessions, $how:tt) => {
        async fn list_sessions(
            &self,
            agent: Option<$crate::__core::ids::AgentId>,
            limit: usize,
        ) -> Result<Vec<$crate::SessionRecord>, $crate::StoreError> {
            $crate::__forward_call!(self, $how, list_sessions(agent, limit))
        }
    };
    (take_request_tokens, $how:tt) => {
        async fn take_request_tokens(
            &self,
            charges: Vec<$crate::RateCharge>,
            now: $crate::__core::time::Timestamp,
        ) -> Result<$crate::TakeTokens, $crate::StoreError> {
            $crate::__forward_call!(self, $how, take_request_tokens(charges, now))
        }
    };
    (signing_keys, $how:tt) => {
        async fn signing_keys(&self) -> Result<Vec<$crate::SigningKeyRecord>, $crate::StoreError> {
            $crate::__forward_call!(self, $how, signing_keys())
        }
    };
    (insert_signing_key, $how:tt) => {
        async fn insert_signing_key(
            &self,
            key: $crate::SigningKeyRecord,
            audit: Vec<$crate::__core::audit::AuditDraft>,
        ) -> Result<bool, $crate::StoreError> {
            $crate::__forward_call!(self, $how, insert_signing_key(key, audit))
        }
    };
}

/// The body of a forwarding method.
#[doc(hidden)]
#[macro_export]
macro_rules! __forward_call {
    ($self:ident, (field $field:ident $before:block), $method:ident($($arg:ident),*)) => {{
        use $crate::Store as _;
        $before;
        $self.$field.$method($($arg),*).await
    }};
    ($self:ident, (enum ($($variant:ident)+)), $method:ident $args:tt) => {{
        use $crate::Store as _;
        match $self {
            $( Self::$variant(s) => s.$method $args.await, )+
        }
    }};
}
