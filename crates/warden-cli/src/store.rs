//! The storage backend chosen by the database URL.
//!
//! `Store` returns `impl Future`, so it is not object safe: the backends are
//! an enum that implements `Store` by delegation. Adding a backend is one
//! variant, one arm in [`open`] and one line in the `delegate!` macro.

use std::collections::BTreeSet;

use anyhow::bail;
use warden_core::audit::{AuditDraft, AuditEntry, ChainHead, Digest};
use warden_core::decision::Subject;
use warden_core::envelope::{EnvelopeId, EnvelopeRecord};
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, Key, Namespace, RunId, StepId};
use warden_core::memory::{MemoryRecord, Put};
use warden_core::time::Timestamp;
use warden_store::{
    AuditFn, CreateRun, Delete, DeleteOutcome, EscalationRecord, EscalationResolution,
    EscalationStatus, EscalationTarget, MemoryStore, PutEnvelope, PutEscalation, PutOutcome,
    RecordStep, ResolveEscalation, RunRecord, RunState, RunsInFlight, StepOutcome, StorageQuota,
    Store, StoreError, StoredAgent, TokenRecord, Usage,
};

/// Every backend this binary can use.
#[derive(Debug)]
pub enum AnyStore {
    /// `memory://`: nothing survives the process.
    Memory(MemoryStore),
    /// `sqlite://FILE`: the embedded default.
    Sqlite(warden_sqlite::SqliteStore),
    /// `postgres://...` or `postgresql://...`: one database shared by
    /// several servers.
    Postgres(warden_postgres::PgStore),
}

/// Open the backend named by `url`'s scheme.
pub async fn open(url: &str) -> anyhow::Result<AnyStore> {
    let Some((scheme, _)) = url.split_once("://") else {
        bail!(
            "database URL `{url}` has no scheme: use `sqlite://FILE`, `postgres://...` or `memory://`"
        );
    };
    match scheme {
        "memory" => Ok(AnyStore::Memory(MemoryStore::new())),
        "sqlite" => Ok(AnyStore::Sqlite(
            warden_sqlite::SqliteStore::open(url)
                .await
                .map_err(|e| anyhow::anyhow!("database `{url}`: {e}"))?,
        )),
        "postgres" | "postgresql" => Ok(AnyStore::Postgres(
            open_postgres(url, warden_postgres::PgOptions::default()).await?,
        )),
        other => {
            bail!(
                "database `{url}`: unknown scheme `{other}`; use `sqlite://FILE`, `postgres://...` or `memory://`"
            )
        }
    }
}

/// Connect to PostgreSQL at `url` (applying migrations) with `options`.
/// Error messages name the database without its password.
pub async fn open_postgres(
    url: &str,
    options: warden_postgres::PgOptions,
) -> anyhow::Result<warden_postgres::PgStore> {
    warden_postgres::PgStore::connect_with(url, options)
        .await
        .map_err(|e| anyhow::anyhow!("database `{}`: {e}", redact(url)))
}

/// `url` with the password (if any) replaced by `***`, for messages.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// Call the same method on whichever backend `self` is.
macro_rules! delegate {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($s) => $call,
            AnyStore::Sqlite($s) => $call,
            AnyStore::Postgres($s) => $call,
        }
    };
}

impl Store for AnyStore {
    async fn load_agents(&self) -> Result<Vec<StoredAgent>, StoreError> {
        delegate!(self, s => s.load_agents().await)
    }

    async fn insert_agent(
        &self,
        agent: StoredAgent,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        delegate!(self, s => s.insert_agent(agent, audit).await)
    }

    async fn set_agent_status(
        &self,
        ids: Vec<AgentId>,
        status: AgentStatus,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        delegate!(self, s => s.set_agent_status(ids, status, audit).await)
    }

    async fn set_agent_capabilities(
        &self,
        id: AgentId,
        capabilities: BTreeSet<ActionName>,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        delegate!(self, s => s.set_agent_capabilities(id, capabilities, audit).await)
    }

    async fn insert_token(
        &self,
        token: TokenRecord,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        delegate!(self, s => s.insert_token(token, audit).await)
    }

    async fn find_token(&self, hash: Digest) -> Result<Option<TokenRecord>, StoreError> {
        delegate!(self, s => s.find_token(hash).await)
    }

    async fn revoke_token(
        &self,
        token_id: String,
        audit: Vec<AuditDraft>,
    ) -> Result<bool, StoreError> {
        delegate!(self, s => s.revoke_token(token_id, audit).await)
    }

    async fn get_records(
        &self,
        namespace: Namespace,
        key: Key,
        owners: Vec<AgentId>,
    ) -> Result<Vec<MemoryRecord>, StoreError> {
        delegate!(self, s => s.get_records(namespace, key, owners).await)
    }

    async fn put_record(
        &self,
        put: Put,
        now: Timestamp,
        quota: StorageQuota,
        audit: AuditFn<PutOutcome>,
    ) -> Result<PutOutcome, StoreError> {
        delegate!(self, s => s.put_record(put, now, quota, audit).await)
    }

    async fn delete_record(
        &self,
        delete: Delete,
        audit: AuditFn<DeleteOutcome>,
    ) -> Result<DeleteOutcome, StoreError> {
        delegate!(self, s => s.delete_record(delete, audit).await)
    }

    async fn owner_usage(&self, owner: AgentId) -> Result<Usage, StoreError> {
        delegate!(self, s => s.owner_usage(owner).await)
    }

    async fn append_audit(&self, drafts: Vec<AuditDraft>) -> Result<ChainHead, StoreError> {
        delegate!(self, s => s.append_audit(drafts).await)
    }

    async fn audit_page(&self, after: u64, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        delegate!(self, s => s.audit_page(after, limit).await)
    }

    async fn audit_head(&self) -> Result<ChainHead, StoreError> {
        delegate!(self, s => s.audit_head().await)
    }

    async fn create_run(
        &self,
        run: RunRecord,
        limit: Option<RunsInFlight>,
        audit: AuditFn<CreateRun>,
    ) -> Result<CreateRun, StoreError> {
        delegate!(self, s => s.create_run(run, limit, audit).await)
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<RunState>, StoreError> {
        delegate!(self, s => s.get_run(run_id).await)
    }

    async fn record_step(
        &self,
        run_id: RunId,
        step_id: StepId,
        outcome: StepOutcome,
        audit: Vec<AuditDraft>,
    ) -> Result<RecordStep, StoreError> {
        delegate!(self, s => s.record_step(run_id, step_id, outcome, audit).await)
    }

    async fn put_envelope(
        &self,
        record: EnvelopeRecord,
        expected_version: Option<u64>,
        audit: AuditFn<PutEnvelope>,
    ) -> Result<PutEnvelope, StoreError> {
        delegate!(self, s => s.put_envelope(record, expected_version, audit).await)
    }

    async fn get_envelope(
        &self,
        envelope_id: EnvelopeId,
        version: Option<u64>,
    ) -> Result<Option<EnvelopeRecord>, StoreError> {
        delegate!(self, s => s.get_envelope(envelope_id, version).await)
    }

    async fn put_escalation(
        &self,
        escalation: EscalationRecord,
        audit: AuditFn<PutEscalation>,
    ) -> Result<PutEscalation, StoreError> {
        delegate!(self, s => s.put_escalation(escalation, audit).await)
    }

    async fn get_escalation(
        &self,
        escalation_id: String,
    ) -> Result<Option<EscalationRecord>, StoreError> {
        delegate!(self, s => s.get_escalation(escalation_id).await)
    }

    async fn list_escalations(
        &self,
        status: Option<EscalationStatus>,
    ) -> Result<Vec<EscalationRecord>, StoreError> {
        delegate!(self, s => s.list_escalations(status).await)
    }

    async fn resolve_escalation(
        &self,
        escalation_id: String,
        resolution: EscalationResolution,
        by: Subject,
        at: Timestamp,
        audit: AuditFn<ResolveEscalation>,
    ) -> Result<ResolveEscalation, StoreError> {
        delegate!(self, s => s.resolve_escalation(escalation_id, resolution, by, at, audit).await)
    }

    async fn consume_escalation(
        &self,
        target: EscalationTarget,
        at: Timestamp,
        audit: AuditFn<Option<EscalationRecord>>,
    ) -> Result<Option<EscalationRecord>, StoreError> {
        delegate!(self, s => s.consume_escalation(target, at, audit).await)
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://u:secret@db:5432/w?sslmode=disable"),
            "postgres://u:***@db:5432/w?sslmode=disable"
        );
        assert_eq!(redact("postgres://u@db/w"), "postgres://u@db/w");
        assert_eq!(redact("postgresql://db/w"), "postgresql://db/w");
        assert_eq!(redact("sqlite://warden.db"), "sqlite://warden.db");
    }
}
