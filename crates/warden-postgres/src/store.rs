//! [`PgStore`]: the [`Store`] implementation.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Config;
use warden_core::audit::{AuditDraft, AuditEntry, ChainHead, Digest};
use warden_core::decision::Subject;
use warden_core::envelope::{EnvelopeId, EnvelopeRecord};
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, Key, Namespace, RunId, StepId};
use warden_core::memory::{MemoryRecord, Put};
use warden_core::time::Timestamp;
use warden_store::{
    AuditFn, CreateRun, Delete, DeleteOutcome, Entity, EscalationRecord, EscalationResolution,
    EscalationStatus, EscalationTarget, PutEnvelope, PutEscalation, PutOutcome, RecordStep,
    ResolveEscalation, RunRecord, RunState, RunStep, RunsInFlight, StepOutcome, StorageQuota,
    Store, StoreError, StoredAgent, TokenRecord, Usage, decide_put,
};

use crate::changes::ChangeKind;
use crate::codec::{
    self, agent_out, audit_out, class_in, json_in, record_out, text_in, token_out, u64_in, u64_out,
};
use crate::error::DbResult;
use crate::pool::{self, Pool, Tx};
use crate::schema::{self, quote_ident};

/// How a [`PgStore`] connects. [`PgOptions::default`] is what
/// [`PgStore::connect`] uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOptions {
    /// The schema to keep Warden's tables in, created if missing: 1 to
    /// [`MAX_SCHEMA_LEN`] characters from `a-z 0-9 _`, not starting with a
    /// digit. `None` uses the connection's current schema (the first
    /// existing schema on its `search_path`, normally `public`; a URL can
    /// set it with `?options=-csearch_path%3DNAME`).
    pub schema: Option<String>,
    /// Most connections the store opens at once for its operations (the
    /// change listener of [`PgStore::subscribe`] has its own).
    pub pool_size: usize,
    /// How often a change listener checks the `changes` table for anything
    /// a notification did not bring (a dropped notification, a reconnect),
    /// and with it that its connection is alive.
    pub listen_heartbeat: Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            schema: None,
            pool_size: 8,
            listen_heartbeat: Duration::from_secs(10),
        }
    }
}

/// Longest schema name accepted: PostgreSQL identifiers are at most 63
/// bytes, and the notification channel name adds a prefix.
pub const MAX_SCHEMA_LEN: usize = 48;

/// Whether `url` names a PostgreSQL database (`postgres://` or
/// `postgresql://`): how a server picks this backend.
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    /// Config for extra connections (the change listener).
    pub(crate) config: Config,
    /// SQL run on every new connection.
    pub(crate) setup: String,
    pub(crate) schema: String,
    pub(crate) channel: String,
    pub(crate) options: PgOptions,
}

/// Warden's PostgreSQL store: a pool of connections to one schema of one
/// database, shared by any number of Warden servers. See the crate docs for
/// the consistency model.
///
/// Cloning is cheap and shares the pool.
#[derive(Clone)]
pub struct PgStore {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("database", &pool::describe(&self.inner.config))
            .field("schema", &self.inner.schema)
            .field("pool_size", &self.inner.options.pool_size)
            .finish()
    }
}

/// The notification channel of a schema: `warden_changes` for `public`,
/// `warden_changes_<schema>` otherwise, so stores in different schemas of
/// one database do not hear each other.
fn channel_for(schema: &str) -> String {
    if schema == "public" {
        "warden_changes".to_string()
    } else {
        format!("warden_changes_{schema}")
    }
}

fn check_schema_name(schema: &str) -> Result<(), StoreError> {
    let ok = !schema.is_empty()
        && schema.len() <= MAX_SCHEMA_LEN
        && schema
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::backend(format!(
            "schema name `{schema}` must be 1 to {MAX_SCHEMA_LEN} characters from a-z 0-9 _, not starting with a digit"
        )))
    }
}

impl PgStore {
    /// Connect to the database at `url` (`postgres://user@host:port/db`,
    /// any libpq-style URL parameter tokio-postgres accepts), apply the
    /// migrations, and keep the tables in the connection's current schema.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, PgOptions::default()).await
    }

    /// Like [`PgStore::connect`], keeping the tables in `schema` (created if
    /// missing). Tests use a fresh schema each to stay isolated.
    pub async fn connect_in_schema(url: &str, schema: &str) -> Result<Self, StoreError> {
        Self::connect_with(
            url,
            PgOptions {
                schema: Some(schema.to_string()),
                ..PgOptions::default()
            },
        )
        .await
    }

    /// Connect with explicit [`PgOptions`].
    pub async fn connect_with(url: &str, options: PgOptions) -> Result<Self, StoreError> {
        if let Some(schema) = &options.schema {
            check_schema_name(schema)?;
        }
        let config = parse_url(url)?;
        let mut first = pool::connect(&config).await?;
        let (schema, create) = match &options.schema {
            Some(s) => (s.clone(), true),
            None => (current_schema(&first).await?, false),
        };
        let setup = setup_sql(&mut first, &schema).await?;
        first.batch_execute(&setup).await.db()?;
        schema::migrate(&mut first, &schema, create).await?;
        let pool = Pool::new(config.clone(), setup.clone(), options.pool_size);
        pool.adopt(first);
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                config,
                setup,
                channel: channel_for(&schema),
                schema,
                options,
            }),
        })
    }

    /// The schema holding Warden's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// The `LISTEN`/`NOTIFY` channel change notifications are sent on.
    pub fn channel(&self) -> &str {
        &self.inner.channel
    }

    /// The agents with the given ids (unknown ids are left out), in
    /// registration order: what a node re-reads when a change names them.
    pub async fn agents_by_id(&self, ids: &[AgentId]) -> Result<Vec<StoredAgent>, StoreError> {
        let ids: Vec<&str> = ids.iter().map(AgentId::as_str).collect();
        let mut conn = self.inner.pool.get().await?;
        conn.query(sql::AGENTS_BY_ID, &[&ids])
            .await?
            .iter()
            .map(agent_out)
            .collect()
    }

    /// Run one read statement on a pooled connection and decode its rows.
    async fn read<R>(
        &self,
        sql: &'static str,
        params: pool::Params<'_>,
        f: impl Fn(&tokio_postgres::Row) -> Result<R, StoreError>,
    ) -> Result<Vec<R>, StoreError> {
        let mut conn = self.inner.pool.get().await?;
        conn.query(sql, params).await?.iter().map(f).collect()
    }
}

/// Parse a `postgres://` or `postgresql://` URL, with Warden's defaults
/// for what it leaves out (application name, connect timeout).
pub(crate) fn parse_url(url: &str) -> Result<Config, StoreError> {
    if !is_postgres_url(url) {
        return Err(StoreError::backend(
            "a postgres database url starts with `postgres://` or `postgresql://`",
        ));
    }
    let mut config: Config = url
        .parse()
        .map_err(|e| StoreError::backend(format!("invalid postgres url: {e}")))?;
    if config.get_application_name().is_none() {
        config.application_name("warden");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    Ok(config)
}

/// The connection's current schema (the first existing schema on its
/// `search_path`).
pub(crate) async fn current_schema(client: &tokio_postgres::Client) -> Result<String, StoreError> {
    let row = client
        .query_one("SELECT current_schema()", &[])
        .await
        .db()?;
    let current: Option<String> = row.try_get(0).map_err(crate::error::column)?;
    let current = current.ok_or_else(|| {
        StoreError::backend("the connection's search_path names no existing schema")
    })?;
    if current.len() > MAX_SCHEMA_LEN {
        return Err(StoreError::backend(format!(
            "schema name `{current}` is longer than {MAX_SCHEMA_LEN} bytes"
        )));
    }
    Ok(current)
}

/// The SQL each new connection runs: pin `search_path` to the schema, and
/// make sure a commit is acknowledged only once it is durable.
pub(crate) async fn setup_sql(
    client: &mut tokio_postgres::Client,
    schema: &str,
) -> Result<String, StoreError> {
    let mut setup = format!("SET search_path TO {}", quote_ident(schema));
    let row = client
        .query_one("SELECT current_setting('synchronous_commit')", &[])
        .await
        .db()?;
    let sync: String = row.try_get(0).map_err(crate::error::column)?;
    // `off` acknowledges commits before they reach the disk; every other
    // value (`local`, `on`, `remote_write`, `remote_apply`) waits at least
    // for the local flush, and is kept as the operator configured it.
    if sync == "off" {
        setup.push_str("; SET synchronous_commit TO on");
    }
    Ok(setup)
}

/// The SQL statements, prepared once per connection.
pub(crate) mod sql {
    pub const LOAD_AGENTS: &str = "SELECT id, parent, capabilities, tools, config, status, \
         created_at, envelope_id FROM agents ORDER BY ord";
    pub const AGENTS_BY_ID: &str = "SELECT id, parent, capabilities, tools, config, status, \
         created_at, envelope_id FROM agents WHERE id = ANY($1) ORDER BY ord";
    pub const INSERT_AGENT: &str = "INSERT INTO agents \
         (id, parent, capabilities, tools, config, status, created_at, envelope_id) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING";
    pub const SET_STATUS: &str = "UPDATE agents SET status = $1 WHERE id = ANY($2) RETURNING id";
    pub const LOCK_AGENTS: &str = "SELECT id FROM agents WHERE id = ANY($1) ORDER BY id FOR UPDATE";
    /// Conflicts with the `FOR UPDATE` of a revocation (and with any
    /// status update), not with other registrations under the same parent.
    pub const LOCK_PARENT: &str = "SELECT status FROM agents WHERE id = $1 FOR SHARE";
    /// Active descendants of `$1`, revoked; returns their ids.
    pub const REVOKE_DESCENDANTS: &str = "WITH RECURSIVE sub (id) AS ( \
           SELECT id FROM agents WHERE parent = ANY($1) \
           UNION SELECT a.id FROM agents a JOIN sub ON a.parent = sub.id) \
         UPDATE agents SET status = 'revoked' \
         WHERE id IN (SELECT id FROM sub) AND status = 'active' RETURNING id";
    pub const SET_CAPABILITIES: &str = "UPDATE agents SET capabilities = $2 WHERE id = $1";

    pub const INSERT_TOKEN: &str = "INSERT INTO tokens \
         (token_id, hash, subject_kind, subject_agent, created_at, revoked) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING";
    pub const FIND_TOKEN: &str = "SELECT token_id, hash, subject_kind, subject_agent, created_at, revoked \
         FROM tokens WHERE hash = $1";
    pub const REVOKE_TOKEN: &str =
        "UPDATE tokens SET revoked = TRUE WHERE token_id = $1 AND NOT revoked";

    pub const GET_RECORDS: &str = "SELECT owner, namespace, key, value, visibility, class, combine, \
         grants, expires_at, revision, created_at, updated_at \
         FROM memory WHERE namespace = $1 AND key = $2 AND owner = ANY($3)";
    pub const SELECT_RECORD: &str = "SELECT owner, namespace, key, value, visibility, class, combine, \
         grants, expires_at, revision, created_at, updated_at \
         FROM memory WHERE owner = $1 AND namespace = $2 AND key = $3";
    pub const SELECT_REVISION: &str =
        "SELECT revision FROM memory WHERE owner = $1 AND namespace = $2 AND key = $3";
    /// Create-only: zero rows means the record exists.
    pub const INSERT_RECORD: &str = "INSERT INTO memory \
         (owner, namespace, key, value, visibility, class, combine, grants, expires_at, \
          revision, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1, $10, $10) \
         ON CONFLICT (owner, namespace, key) DO NOTHING";
    /// The lab document's conditional update: zero rows means the revision
    /// moved on (or the record is gone).
    pub const UPDATE_RECORD: &str = "UPDATE memory SET value = $4, visibility = $5, class = $6, \
         combine = $7, grants = $8, expires_at = $9, revision = revision + 1, updated_at = $10 \
         WHERE owner = $1 AND namespace = $2 AND key = $3 AND revision = $11";
    pub const DELETE_RECORD: &str = "DELETE FROM memory \
         WHERE owner = $1 AND namespace = $2 AND key = $3 RETURNING revision";
    pub const DELETE_RECORD_AT: &str = "DELETE FROM memory \
         WHERE owner = $1 AND namespace = $2 AND key = $3 AND revision = $4 RETURNING revision";
    pub const OWNER_USAGE: &str = "SELECT count(*), coalesce(sum(value_bytes), 0)::bigint \
         FROM memory WHERE owner = $1";
    /// Serialises the quota-checked transactions of one owner (`$1` is the
    /// kind of quota, `$2` the owner or agent) until commit, on every
    /// server: usage read after it is exact until this transaction ends.
    pub const QUOTA_LOCK: &str = "SELECT pg_advisory_xact_lock($1::int, hashtext($2::text))";

    pub const HEAD: &str = "SELECT seq, hash FROM audit_head";
    /// The lock that orders every appending transaction.
    pub const LOCK_HEAD: &str = "SELECT seq, hash FROM audit_head FOR UPDATE";
    pub const APPEND: &str = "WITH appended AS ( \
         INSERT INTO audit_log (seq, time, subject, operation, resource, verdict, reason, \
           policy_version, details, prev_hash, hash) \
         SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], \
           $6::text[], $7::text[], $8::text[], $9::text[], $10::bytea[], $11::bytea[])) \
         UPDATE audit_head SET seq = $12, hash = $13";
    pub const AUDIT_PAGE: &str = "SELECT seq, time, subject, operation, resource, verdict, reason, \
         policy_version, details, prev_hash, hash \
         FROM audit_log WHERE seq > $1 ORDER BY seq LIMIT $2";

    /// Runs under the head lock: `max + 1` is then assigned in commit
    /// order. The notification is sent when (and only if) the transaction
    /// commits; more than 32 ids are left out of the payload (a listener
    /// reads them from the table).
    pub const RECORD_CHANGE: &str = "INSERT INTO changes (seq, kind, ids) \
         SELECT coalesce(max(seq), 0) + 1, $1::text, $2::text[] FROM changes \
         RETURNING seq, pg_notify($3::text, json_build_object('seq', seq, 'kind', kind, \
           'ids', CASE WHEN cardinality(ids) <= 32 THEN to_json(ids) END)::text)::text";
    pub const CHANGES_SINCE: &str =
        "SELECT seq, kind, ids FROM changes WHERE seq > $1 ORDER BY seq LIMIT $2";
    pub const CHANGE_HEAD: &str = "SELECT coalesce(max(seq), 0) FROM changes";

    pub const INSERT_RUN: &str = "INSERT INTO runs \
         (run_id, agent, sop_hash, sop, policy_version, created_at, envelope_id, finished_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (run_id) DO NOTHING";
    /// Runs of agent `$1` not finished and created at or after `$2`.
    pub const RUNS_IN_FLIGHT: &str = "SELECT count(*) FROM runs \
         WHERE agent = $1 AND finished_at IS NULL AND created_at >= $2";
    /// Serialises the step recordings of one run, so the one that records
    /// its last outcome sees the others.
    pub const LOCK_RUN: &str = "SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE";
    /// Marks the run finished if the step just recorded (`$3` its status)
    /// finished it: not completed, or the last one without an outcome.
    pub const FINISH_RUN: &str = "UPDATE runs SET finished_at = $2 \
         WHERE run_id = $1 AND finished_at IS NULL AND ($3::text <> 'completed' \
           OR NOT EXISTS (SELECT 1 FROM run_steps WHERE run_id = $1 AND status IS NULL))";
    pub const INSERT_STEPS: &str = "INSERT INTO run_steps (run_id, ord, step_id, action, operation_id) \
         SELECT $1::text, s.ord, s.step_id, s.action, s.operation_id \
         FROM unnest($2::int[], $3::text[], $4::text[], $5::text[]) \
           AS s (ord, step_id, action, operation_id)";
    pub const GET_RUN: &str = "SELECT r.agent, r.sop_hash, r.sop, r.policy_version, r.created_at, \
         s.step_id, s.action, s.operation_id, s.status, s.result, s.error, s.labels, s.recorded_at, \
         r.envelope_id \
         FROM runs r LEFT JOIN run_steps s ON s.run_id = r.run_id \
         WHERE r.run_id = $1 ORDER BY s.ord";
    pub const RECORD_STEP: &str = "UPDATE run_steps \
         SET status = $3, result = $4, error = $5, labels = $6, recorded_at = $7 \
         WHERE run_id = $1 AND step_id = $2 AND status IS NULL";
    pub const STEP_OUTCOME: &str = "SELECT status, result, error, labels, recorded_at \
         FROM run_steps WHERE run_id = $1 AND step_id = $2";
    pub const RUN_EXISTS: &str = "SELECT 1 FROM runs WHERE run_id = $1";

    /// Create an envelope: zero rows means it exists.
    pub const CREATE_ENVELOPE_HEAD: &str = "INSERT INTO envelope_heads (envelope_id, version) \
         VALUES ($1, $2) ON CONFLICT (envelope_id) DO NOTHING";
    /// The compare-and-set on the latest version: zero rows means the latest
    /// is not `$3` (or the envelope is missing), or `$2` is not above it.
    pub const ADVANCE_ENVELOPE_HEAD: &str = "UPDATE envelope_heads SET version = $2 \
         WHERE envelope_id = $1 AND version = $3 AND $2 > $3";
    pub const ENVELOPE_HEAD: &str = "SELECT version FROM envelope_heads WHERE envelope_id = $1";
    pub const INSERT_ENVELOPE: &str =
        "INSERT INTO envelopes (envelope_id, version, record) VALUES ($1, $2, $3)";
    pub const LATEST_ENVELOPE: &str = "SELECT envelope_id, version, record FROM envelopes \
         WHERE envelope_id = $1 ORDER BY version DESC LIMIT 1";
    pub const ENVELOPE_VERSION: &str = "SELECT envelope_id, version, record FROM envelopes \
         WHERE envelope_id = $1 AND version = $2";

    /// The columns `codec::escalation_out` decodes.
    macro_rules! escalation_cols {
        () => {
            "escalation_id, target, requested_by, operation, resource, reason, envelope_id, \
             envelope_version, classification, obligations, status, created_at, resolved_by, \
             resolved_at, rejection_reason, consumed_at"
        };
    }
    /// Zero rows: the id exists, or an open escalation holds the target
    /// (the partial unique index `escalations_one_open_per_target`).
    pub const INSERT_ESCALATION: &str = concat!(
        "INSERT INTO escalations (",
        escalation_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
         ON CONFLICT DO NOTHING"
    );
    pub const ESCALATION_EXISTS: &str = "SELECT 1 FROM escalations WHERE escalation_id = $1";
    pub const GET_ESCALATION: &str = concat!(
        "SELECT ",
        escalation_cols!(),
        " FROM escalations WHERE escalation_id = $1"
    );
    pub const OPEN_ESCALATION: &str = concat!(
        "SELECT ",
        escalation_cols!(),
        " FROM escalations WHERE target = $1 AND status IN ('pending', 'approved')"
    );
    pub const LIST_ESCALATIONS: &str = concat!(
        "SELECT ",
        escalation_cols!(),
        " FROM escalations WHERE $1::text IS NULL OR status = $1 ORDER BY ord"
    );
    /// Exactly once: only a pending escalation is resolved.
    pub const RESOLVE_ESCALATION: &str = concat!(
        "UPDATE escalations SET status = $2, resolved_by = $3, resolved_at = $4, \
         rejection_reason = $5 WHERE escalation_id = $1 AND status = 'pending' RETURNING ",
        escalation_cols!()
    );
    /// Exactly once: of concurrent callers, the one whose update reaches the
    /// row first changes it; the others re-check `status` after it commits
    /// and match nothing.
    pub const CONSUME_ESCALATION: &str = concat!(
        "UPDATE escalations SET status = 'consumed', consumed_at = $2 \
         WHERE target = $1 AND status = 'approved' RETURNING ",
        escalation_cols!()
    );
}

/// The chain head in a row of `seq, hash`.
pub(crate) fn head_out(row: &tokio_postgres::Row) -> Result<ChainHead, StoreError> {
    let seq: i64 = row.try_get(0).map_err(crate::error::column)?;
    let hash: &[u8] = row.try_get(1).map_err(crate::error::column)?;
    let seq = u64_out(seq, "audit head sequence number")?;
    Ok(ChainHead {
        // Sequence numbers start at 1 without gaps: the count is the last.
        count: seq,
        seq,
        hash: codec::digest_out(hash, "the audit head hash")?,
    })
}

fn missing_head() -> StoreError {
    StoreError::corrupt("the audit head row is missing")
}

/// A change to record with the transaction.
pub(crate) struct ChangeRec {
    pub kind: ChangeKind,
    pub ids: Vec<String>,
}

impl Tx<'_> {
    /// Append `drafts` and record `change` under the head lock, then
    /// commit. Returns the head after the append.
    ///
    /// The head row lock is taken last, after the transaction's own
    /// changes, so it is held only for the append and the commit.
    async fn finish(
        mut self,
        drafts: Vec<AuditDraft>,
        change: Option<ChangeRec>,
        channel: &str,
    ) -> Result<ChainHead, StoreError> {
        if drafts.is_empty() && change.is_none() {
            let head = self
                .query_opt(sql::HEAD, &[])
                .await?
                .ok_or_else(missing_head)
                .and_then(|r| head_out(&r))?;
            self.commit().await?;
            return Ok(head);
        }
        let row = self
            .query_opt(sql::LOCK_HEAD, &[])
            .await?
            .ok_or_else(missing_head)?;
        let mut head = head_out(&row)?;
        if !drafts.is_empty() {
            head = self.append(head, drafts).await?;
        }
        if let Some(change) = change {
            let ids: Vec<String> = change.ids.iter().map(|s| text_in(s).into_owned()).collect();
            self.query(sql::RECORD_CHANGE, &[&change.kind.as_str(), &ids, &channel])
                .await?;
        }
        self.commit().await?;
        Ok(head)
    }

    /// Seal `drafts` after `head` (whose row lock this transaction holds)
    /// and insert them with the new head in one statement.
    async fn append(
        &mut self,
        head: ChainHead,
        drafts: Vec<AuditDraft>,
    ) -> Result<ChainHead, StoreError> {
        let n = drafts.len();
        let mut seqs = Vec::with_capacity(n);
        let mut times = Vec::with_capacity(n);
        let mut subjects = Vec::with_capacity(n);
        let mut operations = Vec::with_capacity(n);
        let mut resources = Vec::with_capacity(n);
        let mut verdicts = Vec::with_capacity(n);
        let mut reasons = Vec::with_capacity(n);
        let mut policies = Vec::with_capacity(n);
        let mut details = Vec::with_capacity(n);
        let mut prevs: Vec<Vec<u8>> = Vec::with_capacity(n);
        let mut hashes: Vec<Vec<u8>> = Vec::with_capacity(n);
        let mut next = head;
        for draft in drafts {
            let seq = next.seq.checked_add(1).ok_or_else(|| {
                StoreError::backend("the audit log is full (sequence number overflow)")
            })?;
            let entry = draft.seal(seq, next.hash);
            seqs.push(u64_in(entry.seq, "audit sequence number")?);
            times.push(entry.draft.time.0);
            subjects.push(text_in(&entry.draft.subject).into_owned());
            operations.push(text_in(&entry.draft.operation).into_owned());
            resources.push(text_in(&entry.draft.resource).into_owned());
            verdicts.push(codec::verdict_in(entry.draft.verdict));
            reasons.push(text_in(&entry.draft.reason).into_owned());
            policies.push(text_in(&entry.draft.policy_version).into_owned());
            details.push(json_in(&entry.draft.details)?);
            prevs.push(entry.prev_hash.0.to_vec());
            hashes.push(entry.hash.0.to_vec());
            next = ChainHead {
                count: next.count + 1,
                seq: entry.seq,
                hash: entry.hash,
            };
        }
        let head_seq = u64_in(next.seq, "audit sequence number")?;
        let head_hash = next.hash.0.to_vec();
        self.execute(
            sql::APPEND,
            &[
                &seqs,
                &times,
                &subjects,
                &operations,
                &resources,
                &verdicts,
                &reasons,
                &policies,
                &details,
                &prevs,
                &hashes,
                &head_seq,
                &head_hash,
            ],
        )
        .await?;
        Ok(next)
    }
}

fn not_found(entity: Entity, id: impl std::fmt::Display) -> StoreError {
    StoreError::not_found(entity, id)
}

/// The `(owner, namespace, key)` parameters of a record.
fn record_key<'a>(owner: &'a AgentId, namespace: &'a Namespace, key: &'a Key) -> [&'a str; 3] {
    [owner.as_str(), namespace.as_str(), key.as_str()]
}

/// Most passes of a revocation's cascade to descendants (each pass finds
/// those registered concurrently since the last; two suffice in practice).
const CASCADE_PASSES: usize = 16;

/// Most attempts of a put whose conditional statement keeps losing to
/// concurrent writers before it gives up with a backend error.
const PUT_ATTEMPTS: usize = 64;

impl PgStore {
    /// Decide a put inside `tx`. The outcome is final in this transaction:
    /// a `Written` outcome's row change is made, a conflict or rejection
    /// changed nothing. `None` means a concurrent writer changed the row
    /// between the read and the conditional statement and the put must be
    /// decided again.
    async fn put_in(
        tx: &mut Tx<'_>,
        put: &Put,
        now: Timestamp,
        quota: StorageQuota,
    ) -> Result<Option<PutOutcome>, StoreError> {
        let [owner, namespace, key] = record_key(&put.owner, &put.namespace, &put.key);
        let usage = if quota.is_unlimited() {
            Usage::default()
        } else {
            // Taken before anything is read: the owner's other
            // quota-checked writes (on any server) wait until this commits.
            tx.query(sql::QUOTA_LOCK, &[&QUOTA_LOCK_RECORDS, &owner])
                .await?;
            usage_out(&tx.query(sql::OWNER_USAGE, &[&owner]).await?)?
        };
        let current = match tx
            .query_opt(sql::SELECT_RECORD, &[&owner, &namespace, &key])
            .await?
        {
            Some(row) => Some(record_out(&row)?),
            None => None,
        };
        let outcome = decide_put(current.as_ref(), put, now, quota, usage);
        let PutOutcome::Written { record, .. } = &outcome else {
            return Ok(Some(outcome));
        };
        let value = json_in(&record.value)?;
        let class = class_in(&record.class);
        let visibility = record.visibility.as_str();
        let changed = match &current {
            None => {
                tx.execute(
                    sql::INSERT_RECORD,
                    &[
                        &owner,
                        &namespace,
                        &key,
                        &value,
                        &visibility,
                        &class.class,
                        &class.combine,
                        &class.grants,
                        &class.expires_at,
                        &now.0,
                    ],
                )
                .await?
            }
            Some(c) => {
                let expected = u64_in(c.revision, "revision")?;
                tx.execute(
                    sql::UPDATE_RECORD,
                    &[
                        &owner,
                        &namespace,
                        &key,
                        &value,
                        &visibility,
                        &class.class,
                        &class.combine,
                        &class.grants,
                        &class.expires_at,
                        &now.0,
                        &expected,
                    ],
                )
                .await?
            }
        };
        if changed == 1 {
            return Ok(Some(outcome));
        }
        // Zero rows: another writer committed first. For a compare-and-set
        // on a revision that is a conflict, decided here against the
        // revision now stored; a create-only put that lost the race to
        // create is a conflict too. An unconditional put is decided again
        // against the new row.
        match put.expected_revision {
            Some(_) => {
                let current = tx
                    .query_opt(sql::SELECT_REVISION, &[&owner, &namespace, &key])
                    .await?
                    .map(|row| {
                        let rev: i64 = row.try_get(0).map_err(crate::error::column)?;
                        u64_out(rev, "revision")
                    })
                    .transpose()?;
                match (current, put.expected_revision) {
                    // The record vanished and the put may create it:
                    // decide again.
                    (None, Some(0)) => Ok(None),
                    _ => Ok(Some(PutOutcome::Conflict { current })),
                }
            }
            None => Ok(None),
        }
    }
}

/// First key of the advisory lock of quota-checked memory writes ("WQmr").
const QUOTA_LOCK_RECORDS: i32 = 0x5751_6d72;
/// First key of the advisory lock of limited run creation ("WQrn").
const QUOTA_LOCK_RUNS: i32 = 0x5751_726e;

/// The single row of [`sql::OWNER_USAGE`].
fn usage_out(rows: &[tokio_postgres::Row]) -> Result<Usage, StoreError> {
    let Some(row) = rows.first() else {
        return Ok(Usage::default());
    };
    let records: i64 = row.try_get(0).map_err(crate::error::column)?;
    let bytes: i64 = row.try_get(1).map_err(crate::error::column)?;
    Ok(Usage {
        records: u64_out(records, "record count")?,
        bytes: u64_out(bytes, "byte count")?,
    })
}

/// A run from the rows of [`sql::GET_RUN`] (`None` when there are none).
fn run_out(run_id: &RunId, rows: &[tokio_postgres::Row]) -> Result<Option<RunState>, StoreError> {
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let col = crate::error::column;
    let agent: &str = first.try_get(0).map_err(col)?;
    let sop_hash: &[u8] = first.try_get(1).map_err(col)?;
    let sop: &str = first.try_get(2).map_err(col)?;
    let policy_version: String = first.try_get(3).map_err(col)?;
    let created_at: i64 = first.try_get(4).map_err(col)?;
    let envelope: Option<&str> = first.try_get(13).map_err(col)?;
    let mut steps = Vec::with_capacity(rows.len());
    let mut outcomes = std::collections::BTreeMap::new();
    for row in rows {
        let step_id: Option<&str> = row.try_get(5).map_err(col)?;
        let Some(step_id) = step_id else {
            continue;
        };
        let step_id = codec::step_id(step_id)?;
        let action: &str = row.try_get(6).map_err(col)?;
        let operation_id: String = row.try_get(7).map_err(col)?;
        if let Some(outcome) = codec::outcome_out(row, 8)? {
            outcomes.insert(step_id.clone(), outcome);
        }
        steps.push(RunStep {
            step_id,
            action: codec::action(action)?,
            operation_id: codec::text_out(operation_id)?,
        });
    }
    Ok(Some(RunState {
        run: RunRecord {
            run_id: codec::run_id(run_id.as_str())?,
            agent: codec::agent_id(agent)?,
            sop_hash: codec::digest_out(sop_hash, "a sop hash")?,
            sop: codec::json_out(sop)?,
            steps,
            policy_version: codec::text_out(policy_version)?,
            created_at: Timestamp(created_at),
            envelope_id: envelope.map(codec::envelope_id).transpose()?,
        },
        outcomes,
    }))
}

impl Store for PgStore {
    async fn load_agents(&self) -> Result<Vec<StoredAgent>, StoreError> {
        self.read(sql::LOAD_AGENTS, &[], agent_out).await
    }

    async fn insert_agent(
        &self,
        agent: StoredAgent,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        let capabilities: Vec<&str> = agent.capabilities.iter().map(ActionName::as_str).collect();
        let tools: Vec<String> = agent
            .tools
            .iter()
            .map(|t| text_in(t).into_owned())
            .collect();
        let config = agent.config.as_ref().map(json_in).transpose()?;
        let parent = agent.parent.as_ref().map(AgentId::as_str);
        let envelope = agent.envelope_id.as_ref().map(EnvelopeId::as_str);
        let mut conn = self.inner.pool.get().await?;
        let mut tx = conn.begin().await?;
        // A child of a revoked agent is revoked: the parent's row is held
        // FOR SHARE until this commits, so a concurrent revocation of the
        // parent (on any server) either committed first, and the child is
        // stored revoked here, or waits for this insert and then revokes
        // the child with the rest of the subtree.
        let mut status = codec::status_in(agent.status);
        if let Some(parent) = parent
            && let Some(row) = tx.query_opt(sql::LOCK_PARENT, &[&parent]).await?
        {
            let parent_status: &str = row.try_get(0).map_err(crate::error::column)?;
            if parent_status == codec::status_in(AgentStatus::Revoked) {
                status = codec::status_in(AgentStatus::Revoked);
            }
        }
        let inserted = tx
            .execute(
                sql::INSERT_AGENT,
                &[
                    &agent.id.as_str(),
                    &parent,
                    &capabilities,
                    &tools,
                    &config,
                    &status,
                    &agent.created_at.0,
                    &envelope,
                ],
            )
            .await?;
        if inserted == 0 {
            return Err(StoreError::duplicate(Entity::Agent, &agent.id));
        }
        let change = ChangeRec {
            kind: ChangeKind::AgentInserted,
            ids: vec![agent.id.to_string()],
        };
        tx.finish(audit, Some(change), &self.inner.channel).await?;
        Ok(())
    }

    async fn set_agent_status(
        &self,
        ids: Vec<AgentId>,
        status: AgentStatus,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        let names: Vec<&str> = ids.iter().map(AgentId::as_str).collect();
        let mut conn = self.inner.pool.get().await?;
        let mut tx = conn.begin().await?;
        // Lock the named agents in one order (concurrent revocations of
        // overlapping subtrees queue rather than deadlock). This waits for
        // registrations of their children in flight (they hold the parent's
        // row FOR SHARE), so the cascade below sees those children.
        tx.query(sql::LOCK_AGENTS, &[&names]).await?;
        let rows = tx
            .query(sql::SET_STATUS, &[&codec::status_in(status), &names])
            .await?;
        let mut updated = HashSet::with_capacity(rows.len());
        for row in &rows {
            let id: String = row.try_get(0).map_err(crate::error::column)?;
            updated.insert(id);
        }
        if let Some(missing) = names.iter().find(|n| !updated.contains(**n)) {
            // Dropping `tx` rolls back the agents that were found.
            return Err(not_found(Entity::Agent, missing));
        }
        let mut changed: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        if status == AgentStatus::Revoked {
            // Revocation covers the subtree as stored, including children
            // another server registered after the revoking server computed
            // it. Each pass is a new snapshot; a child inserted meanwhile
            // under an agent this transaction has locked waits for it and
            // is then stored revoked (see `insert_agent`), so the passes end.
            for _ in 0..CASCADE_PASSES {
                let rows = tx.query(sql::REVOKE_DESCENDANTS, &[&names]).await?;
                if rows.is_empty() {
                    break;
                }
                for row in &rows {
                    changed.push(row.try_get(0).map_err(crate::error::column)?);
                }
            }
        }
        let change = ChangeRec {
            kind: ChangeKind::AgentStatus,
            ids: changed,
        };
        tx.finish(audit, Some(change), &self.inner.channel).await?;
        Ok(())
    }

    async fn set_agent_capabilities(
        &self,
        id: AgentId,
        capabilities: BTreeSet<ActionName>,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        let capabilities: Vec<&str> = capabilities.iter().map(ActionName::as_str).collect();
        let mut conn = self.inner.pool.get().await?;
        let mut tx = conn.begin().await?;
        let updated = tx
            .execute(sql::SET_CAPABILITIES, &[&id.as_str(), &capabilities])
            .await?;
        if updated == 0 {
            return Err(not_found(Entity::Agent, &id));
        }
        let change = ChangeRec {
            kind: ChangeKind::AgentCapabilities,
            ids: vec![id.to_string()],
        };
        tx.finish(audit, Some(change), &self.inner.channel).await?;
        Ok(())
    }

    async fn insert_token(
        &self,
        token: TokenRecord,
        audit: Vec<AuditDraft>,
    ) -> Result<(), StoreError> {
        let (kind, agent) = codec::subject_in(&token.subject);
        let token_id = text_in(&token.token_id).into_owned();
        let hash: &[u8] = &token.hash.0;
        let mut conn = self.inner.pool.get().await?;
        let mut tx = conn.begin().await?;
        let inserted = tx
            .execute(
                sql::INSERT_TOKEN,
                &[
                    &token_id,
                    &hash,
                    &kind,
                    &agent,
                    &token.created_at.0,
                    &token.revoked,
                ],
            )
            .await?;
        if inserted == 0 {
            return Err(StoreError::duplicate(Entity::Token, token.token_id));
        }
        let change = ChangeRec {
            kind: ChangeKind::TokenInserted,
            ids: vec![token.token_id.clone()],
        };
        tx.finish(audit, Some(change), &self.inner.channel).await?;
        Ok(())
    }

    async fn find_token(&self, hash: Digest) -> Result<Option<TokenRecord>, StoreError> {
        let hash: &[u8] = &hash.0;
        Ok(self
            .read(sql::FIND_TOKEN, &[&hash], token_out)
            .await?
            .into_iter()
            .next())
    }

    async fn revoke_token(
        &self,
        token_id: String,
        audit: Vec<AuditDraft>,
    ) -> Result<bool, StoreError> {
        let encoded = text_in(&token_id).into_owned();
        let mut conn = self.inner.pool.get().await?;
        let mut tx = conn.begin().await?;
        if tx.execute(sql::REVOKE_TOKEN, &[&encoded]).await? == 0 {
            return Ok(false);
        }
        let change = ChangeRec {
            kind: ChangeKind::TokenRevoked,
            ids: vec![token_id],
        };
        tx.finish(audit, Some(change), &self.inner.channel).await?;
        Ok(true)
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
        let names: Vec<&str> = owners.iter().map(AgentId::as_str).collect();
        let found = self
            .read(
                sql::GET_RECORDS,
                &[&namespace.as_str(), &key.as_str(), &names],
                record_out,
            )
            .await?;
        // In the order of `owners`, as the resolver walks the lineage.
        let by_owner: HashMap<AgentId, MemoryRecord> =
            found.into_iter().map(|r| (r.owner.clone(), r)).collect();
        Ok(owners
            .iter()
            .filter_map(|owner| by_owner.get(owner).cloned())
            .collect())
    }

    async fn put_record(
        &self,
        put: Put,
        now: Timestamp,
        quota: StorageQuota,
        audit: AuditFn<PutOutcome>,
    ) -> Result<PutOutcome, StoreError> {
        let mut conn = self.inner.pool.get().await?;
        for _ in 0..PUT_ATTEMPTS {
            let mut tx = conn.begin().await?;
            let Some(outcome) = Self::put_in(&mut tx, &put, now, quota).await? else {
                // Lost a race before deciding: roll back and decide again.
                drop(tx);
                continue;
            };
            let drafts = audit(&outcome);
            tx.finish(drafts, None, &self.inner.channel).await?;
            return Ok(outcome);
        }
        Err(StoreError::backend(format!(
            "the write to `{}.{}` lost {PUT_ATTEMPTS} races with concurrent writers",
            put.namespace, put.key
        )))
    }

    async fn delete_record(
        &self,
        delete: Delete,
        audit: AuditFn<DeleteOutcome>,
    ) -> Result<DeleteOutcome, StoreError> {
        let [owner, namespace, key] = record_key(&delete.owner, &delete.namespace, &delete.key);
        let mut conn = self.inner.pool.get().await?;
        let mut tx = conn.begin().await?;
        let deleted = match delete.expected_revision {
            None => {
                tx.query_opt(sql::DELETE_RECORD, &[&owner, &namespace, &key])
                    .await?
            }
            Some(expected) => {
                let expected = u64_in(expected, "revision")?;
                tx.query_opt(
                    sql::DELETE_RECORD_AT,
                    &[&owner, &namespace, &key, &expected],
                )
                .await?
            }
        };
        let revision_of = |row: tokio_postgres::Row| -> Result<u64, StoreError> {
            let rev: i64 = row.try_get(0).map_err(crate::error::column)?;
            u64_out(rev, "revision")
        };
        let outcome = match deleted {
            Some(row) => DeleteOutcome::Deleted {
                revision: revision_of(row)?,
            },
            None => match tx
                .query_opt(sql::SELECT_REVISION, &[&owner, &namespace, &key])
                .await?
            {
                None => DeleteOutcome::NotFound,
                Some(row) => DeleteOutcome::Conflict {
                    current: revision_of(row)?,
                },
            },
        };
        let drafts = audit(&outcome);
        tx.finish(drafts, None, &self.inner.channel).await?;
        Ok(outcome)
    }

    async fn owner_usage(&self, owner: AgentId) -> Result<Usage, StoreError> {
        let mut conn = self.inner.pool.get().await?;
        usage_out(&conn.query(sql::OWNER_USAGE, &[&owner.as_str()]).await?)
    }

    async fn append_audit(&self, drafts: Vec<AuditDraft>) -> Result<ChainHead, StoreError> {
        if drafts.is_empty() {
            return self.audit_head().await;
        }
        let mut conn = self.inner.pool.get().await?;
        let tx = conn.begin().await?;
        tx.finish(drafts, None, &self.inner.channel).await
    }

    async fn audit_page(&self, after: u64, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let Ok(after) = i64::try_from(after) else {
            return Ok(Vec::new());
        };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(sql::AUDIT_PAGE, &[&after, &limit], audit_out)
            .await
    }

    async fn audit_head(&self) -> Result<ChainHead, StoreError> {
        self.read(sql::HEAD, &[], head_out)
            .await?
            .into_iter()
            .next()
            .ok_or_else(missing_head)
    }

    async fn create_run(
        &self,
        run: RunRecord,
        limit: Option<RunsInFlight>,
        audit: AuditFn<CreateRun>,
    ) -> Result<CreateRun, StoreError> {
        let sop = json_in(&run.sop)?;
        let sop_hash: &[u8] = &run.sop_hash.0;
        let policy_version = text_in(&run.policy_version).into_owned();
        let mut ords = Vec::with_capacity(run.steps.len());
        let mut step_ids = Vec::with_capacity(run.steps.len());
        let mut actions = Vec::with_capacity(run.steps.len());
        let mut operation_ids = Vec::with_capacity(run.steps.len());
        for (i, step) in run.steps.iter().enumerate() {
            ords.push(
                i32::try_from(i).map_err(|_| StoreError::backend("a run has too many steps"))?,
            );
            step_ids.push(step.step_id.as_str());
            actions.push(step.action.as_str());
            operation_ids.push(text_in(&step.operation_id).into_owned());
        }
        let run_id = run.run_id.as_str();
        let agent = run.agent.as_str();
        let envelope = run.envelope_id.as_ref().map(EnvelopeId::as_str);
        // A run without steps has nothing left to do.
        let finished_at = run.steps.is_empty().then_some(run.created_at.0);
        let mut conn = self.inner.pool.get().await?;
        for _ in 0..PUT_ATTEMPTS {
            let mut tx = conn.begin().await?;
            if limit.is_some() {
                // The agent's other limited creates (on any server) wait
                // until this commits, so the count below stays exact.
                tx.query(sql::QUOTA_LOCK, &[&QUOTA_LOCK_RUNS, &agent])
                    .await?;
            }
            // An existing run is returned whatever the quota.
            let rows = tx.query(sql::GET_RUN, &[&run_id]).await?;
            let outcome = if let Some(existing) = run_out(&run.run_id, &rows)? {
                CreateRun::Existing(Box::new(existing))
            } else {
                let over = match limit {
                    None => None,
                    Some(l) => {
                        let row = tx
                            .query_opt(sql::RUNS_IN_FLIGHT, &[&agent, &l.since.0])
                            .await?;
                        let n: i64 = match row {
                            Some(r) => r.try_get(0).map_err(crate::error::column)?,
                            None => 0,
                        };
                        let n = u32::try_from(n).unwrap_or(u32::MAX);
                        (n >= l.max).then_some(CreateRun::OverQuota {
                            limit: l.max,
                            in_flight: n,
                        })
                    }
                };
                match over {
                    Some(over) => over,
                    None => {
                        let inserted = tx
                            .execute(
                                sql::INSERT_RUN,
                                &[
                                    &run_id,
                                    &agent,
                                    &sop_hash,
                                    &sop,
                                    &policy_version,
                                    &run.created_at.0,
                                    &envelope,
                                    &finished_at,
                                ],
                            )
                            .await?;
                        if inserted == 0 {
                            // A concurrent creator of this id committed
                            // after the read above: decide again.
                            drop(tx);
                            continue;
                        }
                        tx.execute(
                            sql::INSERT_STEPS,
                            &[&run_id, &ords, &step_ids, &actions, &operation_ids],
                        )
                        .await?;
                        CreateRun::Created
                    }
                }
            };
            let drafts = audit(&outcome);
            tx.finish(drafts, None, &self.inner.channel).await?;
            return Ok(outcome);
        }
        Err(StoreError::backend(format!(
            "the run `{}` lost {PUT_ATTEMPTS} races with concurrent creators",
            run.run_id
        )))
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<RunState>, StoreError> {
        let mut conn = self.inner.pool.get().await?;
        let rows = conn.query(sql::GET_RUN, &[&run_id.as_str()]).await?;
        run_out(&run_id, &rows)
    }

    async fn record_step(
        &self,
        run_id: RunId,
        step_id: StepId,
        outcome: StepOutcome,
        audit: Vec<AuditDraft>,
    ) -> Result<RecordStep, StoreError> {
        let result = outcome.result.as_ref().map(json_in).transpose()?;
        let error = outcome.error.as_deref().map(|e| text_in(e).into_owned());
        let labels: Vec<&str> = outcome.labels.iter().map(|l| l.as_str()).collect();
        let status = codec::step_status_in(outcome.status);
        let (run, step) = (run_id.as_str(), step_id.as_str());
        let mut conn = self.inner.pool.get().await?;
        let mut tx = conn.begin().await?;
        // One recording per run at a time, so the one that records the last
        // outcome sees every other and marks the run finished.
        tx.query(sql::LOCK_RUN, &[&run]).await?;
        // Exactly once: only a step with no outcome yet is updated.
        let updated = tx
            .execute(
                sql::RECORD_STEP,
                &[
                    &run,
                    &step,
                    &status,
                    &result,
                    &error,
                    &labels,
                    &outcome.recorded_at.0,
                ],
            )
            .await?;
        if updated == 1 {
            tx.execute(sql::FINISH_RUN, &[&run, &outcome.recorded_at.0, &status])
                .await?;
            tx.finish(audit, None, &self.inner.channel).await?;
            return Ok(RecordStep::Recorded);
        }
        let Some(row) = tx.query_opt(sql::STEP_OUTCOME, &[&run, &step]).await? else {
            return Err(if tx.query_opt(sql::RUN_EXISTS, &[&run]).await?.is_none() {
                not_found(Entity::Run, &run_id)
            } else {
                not_found(Entity::Step, format!("{run_id}/{step_id}"))
            });
        };
        match codec::outcome_out(&row, 0)? {
            Some(first) => Ok(RecordStep::AlreadyRecorded(first)),
            None => Err(StoreError::backend(format!(
                "step `{run_id}/{step_id}` could not be recorded"
            ))),
        }
    }

    async fn put_envelope(
        &self,
        record: EnvelopeRecord,
        expected_version: Option<u64>,
        audit: AuditFn<PutEnvelope>,
    ) -> Result<PutEnvelope, StoreError> {
        let id = record.envelope_id.as_str();
        let version = u64_in(record.version, "envelope version")?;
        let text = codec::envelope_in(&record)?;
        let expected = expected_version
            .map(|v| u64_in(v, "envelope version"))
            .transpose()?;
        let mut conn = self.inner.pool.get().await?;
        let mut tx = conn.begin().await?;
        // The decision is one conditional statement on the envelope's head
        // row: a concurrent writer of the same envelope waits for this
        // transaction and then re-checks its condition against what it
        // committed (READ COMMITTED), so of two folds from one version
        // exactly one writes.
        let won = match expected {
            None => {
                tx.execute(sql::CREATE_ENVELOPE_HEAD, &[&id, &version])
                    .await?
            }
            Some(expected) => {
                tx.execute(sql::ADVANCE_ENVELOPE_HEAD, &[&id, &version, &expected])
                    .await?
            }
        } == 1;
        let outcome = if won {
            tx.execute(sql::INSERT_ENVELOPE, &[&id, &version, &text])
                .await?;
            PutEnvelope::Written
        } else {
            let current = tx
                .query_opt(sql::ENVELOPE_HEAD, &[&id])
                .await?
                .map(|row| {
                    let v: i64 = row.try_get(0).map_err(crate::error::column)?;
                    u64_out(v, "envelope version")
                })
                .transpose()?;
            PutEnvelope::Conflict { current }
        };
        let drafts = audit(&outcome);
        tx.finish(drafts, None, &self.inner.channel).await?;
        Ok(outcome)
    }

    async fn get_envelope(
        &self,
        envelope_id: EnvelopeId,
        version: Option<u64>,
    ) -> Result<Option<EnvelopeRecord>, StoreError> {
        let id = envelope_id.as_str();
        let rows = match version {
            None => {
                self.read(sql::LATEST_ENVELOPE, &[&id], codec::envelope_out)
                    .await?
            }
            Some(v) => {
                let Ok(v) = i64::try_from(v) else {
                    return Ok(None);
                };
                self.read(sql::ENVELOPE_VERSION, &[&id, &v], codec::envelope_out)
                    .await?
            }
        };
        Ok(rows.into_iter().next())
    }

    async fn put_escalation(
        &self,
        escalation: EscalationRecord,
        audit: AuditFn<PutEscalation>,
    ) -> Result<PutEscalation, StoreError> {
        let e = &escalation;
        let escalation_id = text_in(&e.escalation_id).into_owned();
        let target = codec::target_in(&e.target)?;
        let requested_by = e.requested_by.to_string();
        let operation = text_in(&e.operation).into_owned();
        let resource = text_in(&e.resource).into_owned();
        let reason = text_in(e.reason.as_str()).into_owned();
        let envelope = e.envelope_id.as_ref().map(EnvelopeId::as_str);
        let envelope_version = e
            .envelope_version
            .map(|v| u64_in(v, "envelope version"))
            .transpose()?;
        let classification = e.classification.as_str();
        let obligations = codec::obligations_in(&e.obligations)?;
        let status = e.status.as_str();
        let resolved_by = e.resolved_by.as_ref().map(Subject::to_string);
        let resolved_at = e.resolved_at.map(|t| t.0);
        let rejection_reason = e
            .rejection_reason
            .as_deref()
            .map(|r| text_in(r).into_owned());
        let consumed_at = e.consumed_at.map(|t| t.0);
        let mut conn = self.inner.pool.get().await?;
        for _ in 0..PUT_ATTEMPTS {
            let mut tx = conn.begin().await?;
            let inserted = tx
                .execute(
                    sql::INSERT_ESCALATION,
                    &[
                        &escalation_id,
                        &target,
                        &requested_by,
                        &operation,
                        &resource,
                        &reason,
                        &envelope,
                        &envelope_version,
                        &classification,
                        &obligations,
                        &status,
                        &e.created_at.0,
                        &resolved_by,
                        &resolved_at,
                        &rejection_reason,
                        &consumed_at,
                    ],
                )
                .await?;
            let outcome = if inserted == 1 {
                PutEscalation::Created
            } else if tx
                .query_opt(sql::ESCALATION_EXISTS, &[&escalation_id])
                .await?
                .is_some()
            {
                return Err(StoreError::duplicate(
                    Entity::Escalation,
                    escalation.escalation_id,
                ));
            } else {
                match tx.query_opt(sql::OPEN_ESCALATION, &[&target]).await? {
                    Some(row) => PutEscalation::Existing(Box::new(codec::escalation_out(&row)?)),
                    // The open escalation that blocked the insert was
                    // consumed or rejected since: decide again.
                    None => {
                        drop(tx);
                        continue;
                    }
                }
            };
            let drafts = audit(&outcome);
            tx.finish(drafts, None, &self.inner.channel).await?;
            return Ok(outcome);
        }
        Err(StoreError::backend(format!(
            "the escalation `{}` lost {PUT_ATTEMPTS} races with concurrent writers",
            escalation.escalation_id
        )))
    }

    async fn get_escalation(
        &self,
        escalation_id: String,
    ) -> Result<Option<EscalationRecord>, StoreError> {
        let id = text_in(&escalation_id).into_owned();
        Ok(self
            .read(sql::GET_ESCALATION, &[&id], codec::escalation_out)
            .await?
            .into_iter()
            .next())
    }

    async fn list_escalations(
        &self,
        status: Option<EscalationStatus>,
    ) -> Result<Vec<EscalationRecord>, StoreError> {
        let status = status.map(EscalationStatus::as_str);
        self.read(sql::LIST_ESCALATIONS, &[&status], codec::escalation_out)
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
        let id = text_in(&escalation_id).into_owned();
        let (status, rejection_reason) = match &resolution {
            EscalationResolution::Approve => (EscalationStatus::Approved, None),
            EscalationResolution::Reject { reason } => (
                EscalationStatus::Rejected,
                Some(text_in(reason).into_owned()),
            ),
        };
        let by = by.to_string();
        let mut conn = self.inner.pool.get().await?;
        let mut tx = conn.begin().await?;
        // Exactly once: a concurrent resolver's update waits for this one
        // and then finds the escalation no longer pending.
        let resolved = tx
            .query_opt(
                sql::RESOLVE_ESCALATION,
                &[&id, &status.as_str(), &by, &at.0, &rejection_reason],
            )
            .await?;
        let outcome = match resolved {
            Some(row) => ResolveEscalation::Resolved(Box::new(codec::escalation_out(&row)?)),
            None => match tx.query_opt(sql::GET_ESCALATION, &[&id]).await? {
                Some(row) => ResolveEscalation::NotPending(Box::new(codec::escalation_out(&row)?)),
                None => ResolveEscalation::NotFound,
            },
        };
        let drafts = audit(&outcome);
        tx.finish(drafts, None, &self.inner.channel).await?;
        Ok(outcome)
    }

    async fn consume_escalation(
        &self,
        target: EscalationTarget,
        at: Timestamp,
        audit: AuditFn<Option<EscalationRecord>>,
    ) -> Result<Option<EscalationRecord>, StoreError> {
        let target = codec::target_in(&target)?;
        let mut conn = self.inner.pool.get().await?;
        let mut tx = conn.begin().await?;
        // At most one approved escalation per target (the partial unique
        // index), and one conditional update: two concurrent consumers
        // never both get it.
        let outcome = tx
            .query_opt(sql::CONSUME_ESCALATION, &[&target, &at.0])
            .await?
            .map(|row| codec::escalation_out(&row))
            .transpose()?;
        let drafts = audit(&outcome);
        tx.finish(drafts, None, &self.inner.channel).await?;
        Ok(outcome)
    }
}
