//! [`SqliteStore`]: the [`Store`] implementation.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, params};
use warden_core::audit::{AuditDraft, AuditEntry, ChainHead};
use warden_core::decision::Subject;
use warden_core::envelope::{EnvelopeId, EnvelopeRecord};
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, CallId, Key, Namespace, RunId, SessionId, StepId};
use warden_core::memory::{MemoryRecord, Put};
use warden_core::time::Timestamp;
use warden_store::{
    AuditFn, CreateRun, CreateSession, Delete, DeleteOutcome, Entity, EnvelopeImport,
    EscalationRecord, EscalationResolution, EscalationStatus, EscalationTarget, HeadAnchor,
    PutAuditFn, PutEnvelope, PutEscalation, PutOutcome, RecordStep, ResolveEscalation, RunRecord,
    RunState, RunsInFlight, SessionHead, SessionRecord, SessionState, SessionUpdate, StepOutcome,
    StorageQuota, Store, StoreError, StoredAgent, TokenRecord, UpdateSession, Usage, VerifyError,
    VerifyReport,
};

use crate::audit::audit_page_in;
use crate::codec::{self};
use crate::context;
use crate::error::{SqlResultExt, duplicate_or};
use crate::lock::WriterLock;
use crate::memory::{delete_in, put_in, usage_in};
use crate::options::SqliteOptions;
use crate::runs::{create_run_in, load_run, record_step_in};
use crate::schema;
use crate::sessions;
use crate::writer::{Tx, Writer};

/// Read connections, opened on demand and kept for reuse.
struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    max_idle: usize,
}

impl Readers {
    fn take(&self) -> Result<Connection, StoreError> {
        let reused = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        match reused {
            Some(conn) => Ok(conn),
            None => schema::open_reader(&self.path),
        }
    }

    fn give_back(&self, conn: Connection) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < self.max_idle
        {
            idle.push(conn);
        }
    }
}

/// The SQLite [`Store`]. See the [crate docs](crate) for the design.
pub struct SqliteStore {
    // Field order is drop order: idle readers close first, then the writer
    // thread finishes, closes its connection last (checkpointing the WAL
    // into the file), then the writer lock is released (when no other store
    // of this process shares it), and only then is the temporary directory
    // (if any) removed.
    readers: Arc<Readers>,
    writer: Option<Writer>,
    _lock: Option<Arc<WriterLock>>,
    /// Request-rate buckets of a read-only store (a writing store uses its
    /// lock's, shared by the process's stores of the file).
    rates: warden_store::RateBuckets,
    options: SqliteOptions,
    _temp: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.options.path)
            .field("mode", &self.options.mode)
            .field("synchronous", &self.options.synchronous)
            .finish_non_exhaustive()
    }
}

/// Run blocking database work off the async executor when there is a tokio
/// runtime, inline otherwise.
async fn blocking<R, F>(f: F) -> Result<R, StoreError>
where
    F: FnOnce() -> Result<R, StoreError> + Send + 'static,
    R: Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle
            .spawn_blocking(f)
            .await
            .map_err(|e| StoreError::backend(format!("a sqlite read task failed: {e}")))?,
        Err(_) => f(),
    }
}

impl SqliteStore {
    /// Open (creating and migrating as the URL allows) the database named
    /// by a `sqlite://` URL; see [`SqliteOptions::from_url`].
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let options = SqliteOptions::from_url(url)
            .map_err(|e| StoreError::backend(format!("invalid database url: {e}")))?;
        Self::open_with(options).await
    }

    /// Open with explicit options.
    pub async fn open_with(options: SqliteOptions) -> Result<Self, StoreError> {
        blocking(move || Self::open_blocking(options, None)).await
    }

    /// A store in a new temporary directory, removed when the store is
    /// dropped: for tests, demos and benchmarks.
    pub async fn open_temp() -> Result<Self, StoreError> {
        blocking(|| {
            let dir = tempfile::Builder::new()
                .prefix("warden-sqlite-")
                .tempdir()
                .map_err(|e| {
                    StoreError::backend(format!("cannot create a temporary directory: {e}"))
                })?;
            let options = SqliteOptions::new(dir.path().join("warden.db"));
            Self::open_blocking(options, Some(dir))
        })
        .await
    }

    /// Open without an async runtime (blocks the calling thread).
    pub fn open_blocking_with(options: SqliteOptions) -> Result<Self, StoreError> {
        Self::open_blocking(options, None)
    }

    fn open_blocking(
        options: SqliteOptions,
        temp: Option<tempfile::TempDir>,
    ) -> Result<Self, StoreError> {
        let (writer, lock) = match schema::open_writer(&options)? {
            Some((conn, lock)) => (
                Some(Writer::spawn(conn, &options.path, options.max_batch)?),
                Some(lock),
            ),
            None => (None, None),
        };
        let readers = Arc::new(Readers {
            path: options.path.clone(),
            idle: Mutex::new(Vec::new()),
            max_idle: options.max_idle_readers,
        });
        // Open one reader now so a file that cannot be read fails here.
        let first = readers.take()?;
        readers.give_back(first);
        Ok(Self {
            readers,
            writer,
            _lock: lock,
            rates: warden_store::RateBuckets::default(),
            options,
            _temp: temp,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.options.path
    }

    /// The options it was opened with.
    pub fn options(&self) -> &SqliteOptions {
        &self.options
    }

    /// Verify the audit chain from one read snapshot, against the recorded
    /// head and an optional external anchor (see [`crate::verify_audit`]).
    /// Runs beside the writer without blocking it.
    pub async fn verify_audit(
        &self,
        anchor: Option<HeadAnchor>,
    ) -> Result<VerifyReport, VerifyError> {
        let readers = Arc::clone(&self.readers);
        let run = move || {
            let mut conn = readers.take()?;
            let result = crate::audit::verify_conn(&mut conn, anchor, None);
            readers.give_back(conn);
            Ok(result)
        };
        blocking(run).await?
    }

    /// A bounded point lookup (a primary-key or unique-index probe, a few
    /// microseconds): run it right here. Handing it to a blocking thread
    /// would cost several times the lookup itself.
    fn read_now<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Connection) -> Result<R, StoreError>,
    {
        let mut conn = self.readers.take()?;
        let result = f(&mut conn);
        self.readers.give_back(conn);
        result
    }

    /// A read whose cost grows with the data (a scan): run it on tokio's
    /// blocking threads so it never stalls the executor.
    async fn read<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        let readers = Arc::clone(&self.readers);
        blocking(move || {
            let mut conn = readers.take()?;
            let result = f(&mut conn);
            readers.give_back(conn);
            result
        })
        .await
    }

    async fn write<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        match &self.writer {
            Some(w) => w.call(f).await,
            None => Err(StoreError::read_only(format!(
                "`{}` was opened read-only",
                self.options.path.display()
            ))),
        }
    }
}

impl Store for SqliteStore {
    async fn load_agents(&self) -> Result<Vec<StoredAgent>, StoreError> {
        self.read(|conn| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {} FROM agents ORDER BY pos",
                    codec::AGENT_COLUMNS
                ))
                .store()?;
            let mut rows = stmt.query([]).store()?;
            let mut out = Vec::new();
            while let Some(row) = rows.next().store()? {
                out.push(codec::agent_from_row(row)?);
            }
            Ok(out)
        })
        .await
    }

    async fn insert_agent(
        &self,
        agent: StoredAgent,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        self.write(move |tx| {
            let capabilities = codec::json_text(&agent.capabilities)?;
            let tools = codec::json_text(&agent.tools)?;
            let config = agent.config.as_ref().map(codec::json_text).transpose()?;
            tx.conn()
                .prepare_cached(
                    "INSERT INTO agents (id, parent, capabilities, tools, config, status, \
                     created_at, envelope_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )
                .store()?
                .execute(params![
                    agent.id.as_str(),
                    agent.parent.as_ref().map(|p| p.as_str()),
                    capabilities,
                    tools,
                    config,
                    codec::status_to_sql(agent.status),
                    agent.created_at.0,
                    agent.envelope_id.as_ref().map(|e| e.as_str()),
                ])
                .map_err(|e| duplicate_or(e, Entity::Agent, agent.id.as_str()))?;
            tx.append(audit)?;
            Ok(())
        })
        .await
    }

    async fn set_agent_status(
        &self,
        ids: Vec<AgentId>,
        status: AgentStatus,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        self.write(move |tx| {
            let mut stmt = tx
                .conn()
                .prepare_cached("UPDATE agents SET status = ?2 WHERE id = ?1")
                .store()?;
            for id in &ids {
                let changed = stmt
                    .execute(params![id.as_str(), codec::status_to_sql(status)])
                    .store()?;
                if changed == 0 {
                    return Err(StoreError::not_found(Entity::Agent, id));
                }
            }
            drop(stmt);
            tx.append(audit)?;
            Ok(())
        })
        .await
    }

    async fn set_agent_capabilities(
        &self,
        id: AgentId,
        capabilities: BTreeSet<ActionName>,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        self.write(move |tx| {
            let changed = tx
                .conn()
                .prepare_cached("UPDATE agents SET capabilities = ?2 WHERE id = ?1")
                .store()?
                .execute(params![id.as_str(), codec::json_text(&capabilities)?])
                .store()?;
            if changed == 0 {
                return Err(StoreError::not_found(Entity::Agent, id));
            }
            tx.append(audit)?;
            Ok(())
        })
        .await
    }

    async fn insert_token(
        &self,
        token: TokenRecord,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        self.write(move |tx| {
            let (kind, agent) = codec::subject_to_sql(&token.subject);
            tx.conn()
                .prepare_cached(
                    "INSERT INTO tokens (token_id, hash, subject_kind, agent_id, created_at, revoked) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .store()?
                .execute(params![
                    token.token_id,
                    token.hash.0,
                    kind,
                    agent,
                    token.created_at.0,
                    token.revoked,
                ])
                .map_err(|e| duplicate_or(e, Entity::Token, &token.token_id))?;
            tx.append(audit)?;
            Ok(())
        })
        .await
    }

    async fn find_token(
        &self,
        hash: warden_core::audit::Digest,
    ) -> Result<Option<TokenRecord>, StoreError> {
        self.read_now(move |conn| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {} FROM tokens WHERE hash = ?1",
                    codec::TOKEN_COLUMNS
                ))
                .store()?;
            let mut rows = stmt.query([hash.0]).store()?;
            match rows.next().store()? {
                Some(row) => Ok(Some(codec::token_from_row(row)?)),
                None => Ok(None),
            }
        })
    }

    async fn revoke_token(
        &self,
        token_id: String,
        audit: Vec<AuditDraft>,
    ) -> Result<bool, StoreError> {
        self.write(move |tx| {
            let changed = tx
                .conn()
                .prepare_cached("UPDATE tokens SET revoked = 1 WHERE token_id = ?1 AND revoked = 0")
                .store()?
                .execute([&token_id])
                .store()?;
            if changed == 0 {
                return Ok(false);
            }
            tx.append(audit)?;
            Ok(true)
        })
        .await
    }

    async fn get_records(
        &self,
        namespace: Namespace,
        key: Key,
        owners: Vec<AgentId>,
    ) -> Result<Vec<MemoryRecord>, StoreError> {
        if owners.is_empty() {
            return Ok(Vec::new());
        }
        self.read_now(move |conn| {
            // One statement, so one snapshot, whatever the lineage depth.
            let owner_list = codec::json_text(&owners)?;
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {} FROM memory WHERE namespace = ?1 AND key = ?2 \
                     AND owner IN (SELECT value FROM json_each(?3))",
                    codec::MEMORY_COLUMNS
                ))
                .store()?;
            let mut rows = stmt
                .query(params![namespace.as_str(), key.as_str(), owner_list])
                .store()?;
            let mut found = Vec::with_capacity(owners.len().min(8));
            while let Some(row) = rows.next().store()? {
                found.push(codec::record_from_row(row)?);
            }
            // In the order of `owners` (a repeated owner repeats its record,
            // as in the in-memory store).
            Ok(owners
                .iter()
                .filter_map(|owner| found.iter().find(|r| &r.owner == owner).cloned())
                .collect())
        })
    }

    async fn put_record(
        &self,
        put: Put,
        now: Timestamp,
        quota: StorageQuota,
        audit: PutAuditFn,
    ) -> Result<PutOutcome, StoreError> {
        self.write(move |tx| {
            let outcome = put_in(tx, put, now, quota)?;
            tx.append(audit(&outcome))?;
            Ok(outcome)
        })
        .await
    }

    async fn delete_record(
        &self,
        delete: Delete,
        audit: AuditFn<DeleteOutcome>,
    ) -> Result<DeleteOutcome, StoreError> {
        self.write(move |tx| {
            let outcome = delete_in(tx.conn(), &delete)?;
            tx.append(audit(&outcome))?;
            Ok(outcome)
        })
        .await
    }

    async fn owner_usage(&self, owner: AgentId) -> Result<Usage, StoreError> {
        self.read(move |conn| usage_in(conn, &owner)).await
    }

    async fn append_audit(&self, drafts: Vec<AuditDraft>) -> Result<ChainHead, StoreError> {
        self.write(move |tx| tx.append(drafts)).await
    }

    async fn audit_page(&self, after: u64, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.read(move |conn| audit_page_in(conn, after, limit))
            .await
    }

    async fn audit_head(&self) -> Result<ChainHead, StoreError> {
        self.read_now(|conn| crate::audit::read_head(conn))
    }

    async fn create_run(
        &self,
        run: RunRecord,
        limit: Option<RunsInFlight>,
        audit: AuditFn<CreateRun>,
    ) -> Result<CreateRun, StoreError> {
        self.write(move |tx| create_run_in(tx, run, limit, audit))
            .await
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<RunState>, StoreError> {
        self.read(move |conn| {
            // Run and outcomes from one snapshot.
            let tx = conn.transaction().store()?;
            let state = load_run(&tx, &run_id)?;
            tx.finish().store()?;
            Ok(state)
        })
        .await
    }

    async fn record_step_as(
        &self,
        run_id: RunId,
        step_id: StepId,
        outcome: StepOutcome,
        holder: Option<String>,
        audit: Vec<AuditDraft>,
    ) -> Result<RecordStep, StoreError> {
        self.write(move |tx| record_step_in(tx, run_id, step_id, outcome, holder, audit))
            .await
    }

    async fn lease_step(
        &self,
        run_id: RunId,
        step_id: StepId,
        lease: warden_store::StepLease,
        audit: AuditFn<warden_store::LeaseStep>,
    ) -> Result<warden_store::LeaseStep, StoreError> {
        self.write(move |tx| crate::runs::lease_step_in(tx, run_id, step_id, lease, audit))
            .await
    }

    async fn put_envelope(
        &self,
        record: EnvelopeRecord,
        expected_version: Option<u64>,
        audit: AuditFn<PutEnvelope>,
    ) -> Result<PutEnvelope, StoreError> {
        self.write(move |tx| {
            let outcome = context::put_envelope_in(tx.conn(), &record, expected_version)?;
            tx.append(audit(&outcome))?;
            Ok(outcome)
        })
        .await
    }

    async fn get_envelope(
        &self,
        envelope_id: EnvelopeId,
        version: Option<u64>,
    ) -> Result<Option<EnvelopeRecord>, StoreError> {
        self.read_now(move |conn| context::get_envelope_in(conn, &envelope_id, version))
    }

    async fn put_escalation(
        &self,
        escalation: EscalationRecord,
        audit: AuditFn<PutEscalation>,
    ) -> Result<PutEscalation, StoreError> {
        self.write(move |tx| {
            let outcome = context::put_escalation_in(tx.conn(), &escalation)?;
            tx.append(audit(&outcome))?;
            Ok(outcome)
        })
        .await
    }

    async fn get_escalation(
        &self,
        escalation_id: String,
    ) -> Result<Option<EscalationRecord>, StoreError> {
        self.read_now(move |conn| context::get_escalation_in(conn, &escalation_id))
    }

    async fn list_escalations(
        &self,
        status: Option<EscalationStatus>,
    ) -> Result<Vec<EscalationRecord>, StoreError> {
        self.read(move |conn| context::list_escalations_in(conn, status))
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
        self.write(move |tx| {
            let outcome =
                context::resolve_escalation_in(tx.conn(), &escalation_id, resolution, by, at)?;
            tx.append(audit(&outcome))?;
            Ok(outcome)
        })
        .await
    }

    async fn consume_escalation(
        &self,
        target: EscalationTarget,
        at: Timestamp,
        audit: AuditFn<Option<warden_store::ConsumedEscalation>>,
    ) -> Result<Option<warden_store::ConsumedEscalation>, StoreError> {
        self.write(move |tx| {
            let outcome = context::consume_escalation_in(tx.conn(), &target, at)?;
            tx.append(audit(&outcome))?;
            Ok(outcome)
        })
        .await
    }

    async fn create_session(
        &self,
        state: SessionState,
        envelope: Option<EnvelopeRecord>,
        import: Option<EnvelopeImport>,
        audit: AuditFn<CreateSession>,
    ) -> Result<CreateSession, StoreError> {
        self.write(move |tx| sessions::create_session_in(tx, state, envelope, import, audit))
            .await
    }

    async fn get_session(&self, session_id: SessionId) -> Result<Option<SessionState>, StoreError> {
        self.read(move |conn| {
            // The row and its calls from one snapshot.
            let tx = conn.transaction().store()?;
            let state = sessions::load_session(&tx, &session_id)?;
            tx.finish().store()?;
            Ok(state)
        })
        .await
    }

    async fn get_session_head(
        &self,
        session_id: SessionId,
        call_id: Option<CallId>,
        known_revision: Option<u64>,
    ) -> Result<Option<SessionHead>, StoreError> {
        self.read(move |conn| {
            // The row, the count and the call from one snapshot.
            let tx = conn.transaction().store()?;
            let head = sessions::load_head(&tx, &session_id, call_id.as_ref(), known_revision)?;
            tx.finish().store()?;
            Ok(head)
        })
        .await
    }

    async fn update_session(
        &self,
        update: SessionUpdate,
        expected_revision: u64,
        audit: AuditFn<UpdateSession>,
    ) -> Result<UpdateSession, StoreError> {
        self.write(move |tx| sessions::update_session_in(tx, update, expected_revision, audit))
            .await
    }

    async fn list_sessions(
        &self,
        agent: Option<AgentId>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.read(move |conn| sessions::list_sessions_in(conn, agent.as_ref(), limit))
            .await
    }

    async fn take_request_tokens(
        &self,
        charges: Vec<warden_store::RateCharge>,
        now: Timestamp,
    ) -> Result<warden_store::TakeTokens, StoreError> {
        let rates = self._lock.as_ref().map_or(&self.rates, |l| &l.rates);
        rates.take(&charges, now)
    }

    async fn signing_keys(&self) -> Result<Vec<warden_store::SigningKeyRecord>, StoreError> {
        self.read_now(crate::keys::signing_keys_in)
    }

    async fn insert_signing_key(
        &self,
        key: warden_store::SigningKeyRecord,
        audit: Vec<AuditDraft>,
    ) -> Result<bool, StoreError> {
        warden_store::check_signing_key(&key)?;
        self.write(move |tx| crate::keys::insert_signing_key_in(tx, &key, audit))
            .await
    }
}
