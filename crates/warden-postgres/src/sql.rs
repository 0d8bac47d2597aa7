//! The SQL statements, prepared once per connection.

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
/// [`GET_RECORDS`] for several reads at once: `$1` each row's read (its
/// place in the group), `$2`-`$4` the `(namespace, key, owner)` it asks
/// for; every record found, with its read's place as the last column.
pub const GET_RECORDS_MANY: &str = "SELECT m.owner, m.namespace, m.key, m.value, \
     m.visibility, m.class, m.combine, m.grants, m.expires_at, m.revision, m.created_at, \
     m.updated_at, q.place \
     FROM unnest($1::int4[], $2::text[], $3::text[], $4::text[]) \
       AS q(place, namespace, key, owner) \
     JOIN memory m ON m.owner = q.owner AND m.namespace = q.namespace AND m.key = q.key";
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
/// [`INSERT_RECORD`] that must create the row, for a group whose `COMMIT`
/// is sent with its row changes ([`crate::writer`]): creating none divides
/// by zero, which fails the statement and with it the transaction, so that
/// the group is never committed without one of its changes.
pub const INSERT_RECORD_ONE: &str = "WITH written AS (INSERT INTO memory \
     (owner, namespace, key, value, visibility, class, combine, grants, expires_at, \
      revision, created_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1, $10, $10) \
     ON CONFLICT (owner, namespace, key) DO NOTHING RETURNING 1) \
     SELECT 1 / count(*)::int FROM written";
/// [`UPDATE_RECORD`] that must change the row, as [`INSERT_RECORD_ONE`].
pub const UPDATE_RECORD_ONE: &str = "WITH written AS (UPDATE memory SET value = $4, \
     visibility = $5, class = $6, combine = $7, grants = $8, expires_at = $9, \
     revision = revision + 1, updated_at = $10 \
     WHERE owner = $1 AND namespace = $2 AND key = $3 AND revision = $11 RETURNING 1) \
     SELECT 1 / count(*)::int FROM written";
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
/// [`APPEND`] only if the head is still `($14, $15)`: the head's update
/// and the insert happen together or not at all (a head another
/// transaction is moving is waited for, then checked again: zero rows
/// inserted means it moved).
pub const APPEND_AFTER: &str = "WITH moved AS ( \
     UPDATE audit_head SET seq = $12, hash = $13 WHERE seq = $14 AND hash = $15 RETURNING 1) \
     INSERT INTO audit_log (seq, time, subject, operation, resource, verdict, reason, \
       policy_version, details, prev_hash, hash) \
     SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], \
       $6::text[], $7::text[], $8::text[], $9::text[], $10::bytea[], $11::bytea[]) \
     WHERE EXISTS (SELECT 1 FROM moved)";
/// An audit-only group sealed inside the database, after whatever the
/// head is (migration 9's `warden_append_sealed`): the head before it and
/// each entry's sequence number and hash.
pub const APPEND_SEALED: &str = "SELECT base_seq, base_hash, seqs, hashes \
     FROM warden_append_sealed($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], \
       $6::text[], $7::text[], $8::text[], $9::bytea[])";
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
     r.envelope_id, s.lease_holder, s.lease_acquired_at, s.lease_expires_at \
     FROM runs r LEFT JOIN run_steps s ON s.run_id = r.run_id \
     WHERE r.run_id = $1 ORDER BY s.ord";
/// Exactly once, and only by the holder of a live lease (`$8`; none when
/// no lease is live at `$7`).
pub const RECORD_STEP: &str = "UPDATE run_steps \
     SET status = $3, result = $4, error = $5, labels = $6, recorded_at = $7, \
       lease_holder = NULL, lease_acquired_at = NULL, lease_expires_at = NULL \
     WHERE run_id = $1 AND step_id = $2 AND status IS NULL \
       AND (lease_holder IS NULL OR lease_expires_at <= $7 OR lease_holder = $8::text)";
pub const STEP_OUTCOME: &str = "SELECT status, result, error, labels, recorded_at, \
     lease_holder, lease_acquired_at, lease_expires_at \
     FROM run_steps WHERE run_id = $1 AND step_id = $2";
/// The compare-and-set of a step's lease: granted to `$3` at `$4` until
/// `$5` when the step has no outcome and no lease, its own, or a lapsed
/// one. Concurrent updates of the row serialise on its lock and re-check
/// the condition, so exactly one holder wins.
pub const LEASE_STEP: &str = "UPDATE run_steps \
     SET lease_holder = $3, lease_acquired_at = $4, lease_expires_at = $5 \
     WHERE run_id = $1 AND step_id = $2 AND status IS NULL \
       AND (lease_holder IS NULL OR lease_holder = $3 OR lease_expires_at <= $4)";
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
         resolved_at, rejection_reason, consumed_at, request"
    };
}
/// Zero rows: the id exists, or an open escalation holds the target
/// (the partial unique index `escalations_one_open_per_target`).
pub const INSERT_ESCALATION: &str = concat!(
    "INSERT INTO escalations (",
    escalation_cols!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) \
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
/// The pending escalations, locked: those of a consumed approval's slot are
/// withdrawn in its transaction.
pub const PENDING_ESCALATIONS_FOR_UPDATE: &str = concat!(
    "SELECT ",
    escalation_cols!(),
    " FROM escalations WHERE status = 'pending' ORDER BY ord FOR UPDATE"
);
pub const CONSUME_ESCALATION: &str = concat!(
    "UPDATE escalations SET status = 'consumed', consumed_at = $2 \
     WHERE target = $1 AND status = 'approved' RETURNING ",
    escalation_cols!()
);

/// The columns `sessions::session_out` decodes.
macro_rules! session_cols {
    () => {
        "session_id, agent, revision, created_at, record"
    };
}
/// Zero rows: a session with this id exists (or is being created by a
/// transaction that then commits).
pub const INSERT_SESSION: &str = "INSERT INTO sessions \
     (session_id, agent, revision, created_at, record) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (session_id) DO NOTHING";
/// A session's index, the bytes of its parts in revision order (NULL when
/// it has none, which a stored session never has).
macro_rules! session_index {
    () => {
        "(SELECT string_agg(p.bytes, ''::bytea ORDER BY p.revision) \
         FROM session_index p WHERE p.session_id = sessions.session_id)"
    };
}
/// The session row, held `FOR SHARE` until the transaction ends so that
/// its calls, read next, belong to the same revision.
pub const LOCK_SESSION: &str = concat!(
    "SELECT ",
    session_cols!(),
    ", ",
    session_index!(),
    " FROM sessions WHERE session_id = $1 FOR SHARE"
);
pub const GET_SESSION: &str = concat!(
    "SELECT ",
    session_cols!(),
    ", ",
    session_index!(),
    " FROM sessions WHERE session_id = $1"
);
/// [`GET_SESSION`] with the index NULL when the stored revision is `$2`
/// (the caller holds that revision's index: the parts are not read).
pub const GET_SESSION_HEAD: &str = concat!(
    "SELECT ",
    session_cols!(),
    ", CASE WHEN revision IS NOT DISTINCT FROM $2::bigint THEN NULL ELSE ",
    session_index!(),
    " END FROM sessions WHERE session_id = $1"
);
/// One part of a session's index, written at revision `$2`.
pub const INSERT_INDEX_PART: &str =
    "INSERT INTO session_index (session_id, revision, bytes) VALUES ($1, $2, $3)";
/// Every part of a session's index (before a replace writes one).
pub const DELETE_INDEX_PARTS: &str = "DELETE FROM session_index WHERE session_id = $1";
pub const SESSION_CALLS: &str = "SELECT call_id, seq, record FROM session_calls \
     WHERE session_id = $1 ORDER BY seq, call_id";
pub const SESSION_CALL_COUNT: &str = "SELECT count(*) FROM session_calls WHERE session_id = $1";
pub const SESSION_CALL: &str = "SELECT call_id, seq, record FROM session_calls \
     WHERE session_id = $1 AND call_id = $2";
/// The call of session `$1` at `seq` `$2`, if any.
pub const CALL_AT_SEQ: &str = "SELECT call_id FROM session_calls \
     WHERE session_id = $1 AND seq = $2";
pub const SESSION_REVISION: &str = "SELECT revision FROM sessions WHERE session_id = $1";
/// The compare-and-set: zero rows means the stored revision is not `$6`
/// (or there is no such session).
pub const UPDATE_SESSION: &str = "UPDATE sessions SET agent = $2, revision = $3, \
     created_at = $4, record = $5 WHERE session_id = $1 AND revision = $6";
pub const UPSERT_CALL: &str = "INSERT INTO session_calls (session_id, call_id, seq, record) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (session_id, call_id) \
     DO UPDATE SET seq = EXCLUDED.seq, record = EXCLUDED.record";
pub const LIST_SESSIONS: &str = concat!(
    "SELECT ",
    session_cols!(),
    " FROM sessions WHERE $1::text IS NULL OR agent = $1 ORDER BY ord LIMIT $2"
);
/// Serialises the imports of one `($2 issuer, $3 envelope id)` until
/// commit, on every server (`$1` the lock class).
pub const IMPORT_LOCK: &str =
    "SELECT pg_advisory_xact_lock($1::int, hashtext($2::text || chr(10) || $3::text))";
pub const EARLIER_IMPORTS: &str = "SELECT version, record FROM envelope_imports \
     WHERE issuer = $1 AND envelope_id = $2";
/// Zero rows: this version was noted already.
pub const INSERT_IMPORT: &str = "INSERT INTO envelope_imports \
     (issuer, envelope_id, version, record) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";
pub const ENVELOPE_EXISTS: &str = "SELECT 1 FROM envelope_heads WHERE envelope_id = $1";
