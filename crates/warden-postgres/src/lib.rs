//! # warden-postgres
//!
//! Warden's scale-out storage backend: [`PgStore`] implements
//! [`warden_store::Store`] on PostgreSQL, so several stateless `warden
//! serve` processes can share one database. It is selected by a
//! `postgres://` or `postgresql://` URL ([`is_postgres_url`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), warden_store::StoreError> {
//! use warden_postgres::PgStore;
//! let store = PgStore::connect("postgres://warden@db.internal:5432/warden").await?;
//! let mut changes = store.subscribe().await?; // for cache invalidation
//! # Ok(()) }
//! ```
//!
//! ## Consistency model
//!
//! - **Every decision is made in the database, in one transaction with its
//!   audit entries.** A put reads the row, computes the new record with the
//!   core's `apply_put` and `check_result`, and writes it with a conditional
//!   statement: `UPDATE memory ... WHERE owner = $1 AND namespace = $2 AND
//!   key = $3 AND revision = $4` (the lab document's statement; zero rows
//!   is a conflict) or, to create, `INSERT ... ON CONFLICT DO NOTHING` (zero
//!   rows: the record exists). The outcome (written, conflict, rejected) is
//!   turned into audit drafts by the caller's `AuditFn` and committed in
//!   the same transaction. Compare-and-set is therefore exact across any
//!   number of servers: of writers expecting the same revision, exactly one
//!   writes; the others see the revision it wrote. Transactions run at READ
//!   COMMITTED, which the conditional statements are designed for (they
//!   re-check their condition against the newest committed row).
//! - **Envelope versions and escalations are decided the same way.**
//!   [`put_envelope`](warden_store::Store::put_envelope) is one
//!   conditional statement on the envelope's head row (`INSERT ... ON
//!   CONFLICT DO NOTHING` to create, `UPDATE envelope_heads SET version =
//!   $new WHERE envelope_id = $1 AND version = $expected AND $new >
//!   $expected` to advance; zero rows is `Conflict { current }`), with the
//!   version's row inserted into `envelopes` (every version kept, primary
//!   key `(envelope_id, version)`) in the same transaction: of two servers
//!   folding from one version, exactly one writes. The `escalations` table
//!   has a partial unique index on the target for open (pending or
//!   approved) rows, so there is at most one open escalation per target
//!   across all servers; resolution is `UPDATE ... WHERE status =
//!   'pending'` and consumption `UPDATE ... WHERE status = 'approved'`, each
//!   one statement, so each happens exactly once; a trigger refuses any
//!   other transition. Every outcome's audit entries (conflicts, "already
//!   open", "not pending" included) commit in the same transaction.
//! - **Tool-call sessions are decided the same way.**
//!   [`create_session`](warden_store::Store::create_session) inserts the
//!   session row with `ON CONFLICT DO NOTHING` (of creators of one id on
//!   any servers, exactly one inserts; the others find it, `Existing`), its
//!   first envelope version through `envelope_heads` as `put_envelope`
//!   does, and the note of an imported envelope in `envelope_imports`. The
//!   import is decided by `warden_store::decide_import` against the
//!   earlier notes of its `(issuer, envelope_id)`, read after taking a
//!   transaction-scoped advisory lock on that pair, so of two servers
//!   importing one envelope at once the second decides after the first
//!   commits: a replayed version opens one session only, and a downgrade
//!   is refused whatever the interleaving.
//!   [`update_session`](warden_store::Store::update_session) is one
//!   conditional statement, `UPDATE sessions ... WHERE session_id = $1 AND
//!   revision = $expected` (zero rows: `Conflict { current }`), then the
//!   call's upsert by `(session_id, call_id)`, in one transaction with its
//!   audit entries.
//! - **One audit chain, one total order.** The `audit_head` table has one
//!   row, `(seq, hash)`. Every appending operation is a job for one of the
//!   store's group-commit writers ([`PgOptions::writers`], each with a
//!   dedicated connection, all on a thread of the store's own, as is the
//!   task that groups record reads): a writer takes every job queued (up to
//!   [`PgOptions::max_batch`]), locks the head row with `SELECT ... FOR
//!   UPDATE` once (when a job runs statements, before any of their rows),
//!   runs the jobs in one transaction, each in its own savepoint (a
//!   failing job rolls back alone, with its audit entries; consecutive
//!   memory puts run in waves of distinct owners, each wave's reads in one
//!   round trip and its row changes in another), then
//!   records the group's [`Change`]s, assigns the next sequence numbers to
//!   all the group's entries in the order the jobs ran, links each to the previous hash,
//!   inserts them and moves the row in one statement sent together with the
//!   `COMMIT`, and answers the jobs only once the commit returned. The
//!   order of the log is thus the commit order of the head-lock holders,
//!   across all writers of all servers, with no gaps; the `audit_head` row
//!   is also the recorded head that detects a truncated tail
//!   ([`PgStore::verify_audit`]). Jobs are routed to a writer by the rows
//!   they lock (a record's owner, a run, a session, an envelope; agents,
//!   tokens and escalations each to one writer), so jobs on the same rows
//!   queue in one writer instead of waiting on another's open group; a
//!   group that runs statements takes the head lock before any of its
//!   jobs' rows, so groups never deadlock on each other's rows.
//!   *Cost*: the head lock is taken once per group, however many decisions
//!   the group holds. A group of records only (a resolve, a denial: no
//!   statement of their own) is sealed on the head its store predicts and
//!   sent in one round trip whose insert happens only if the head is still
//!   the predicted one, so it holds the lock for its insert and the commit
//!   flush; a wrong prediction (another store moved the head) writes
//!   nothing and the group is sealed inside the database instead (one
//!   statement, its own transaction: the schema's `warden_append_sealed`
//!   locks the head, gives each entry its position and its hash,
//!   `warden_core::audit::entry_hash` computed there from the entry's
//!   [`entry_body`](warden_core::audit::entry_body), and moves the head;
//!   the server checks every hash returned), holding the lock for that
//!   statement and the flush, and predictions pause for a while. A group that
//!   runs statements holds the lock for its whole transaction; the lock
//!   travels with its first statement. A group of puts only sends each
//!   wave's row changes with the next wave's reads, and the last wave's
//!   with the audit insert and the `COMMIT`, without savepoints (two round
//!   trips after `BEGIN` for one wave): each change must change its row,
//!   and if the server refuses any statement the whole group was rolled
//!   back and runs again the careful way, one savepoint per put. Throughput
//!   is about `groups in flight x group size / (lock hold)`; see
//!   `BENCHMARKS.md` for measurements and `ARCHITECTURE.md` ("Past one
//!   database") for the model. Reads never take the lock.
//! - **Quotas are exact across servers.** A put with a `StorageQuota`
//!   takes a transaction-scoped advisory lock on its owner
//!   (`pg_advisory_xact_lock`), then reads the owner's usage and decides in
//!   the same transaction; a `create_run` with a `RunsInFlight` limit does
//!   the same per agent and counts the unfinished runs (`runs.finished_at`,
//!   schema version 3, set when the step that finishes a run is recorded,
//!   under the run's row lock). Of concurrent writers on any number of
//!   servers, the limit is never exceeded. Writes without a quota take no
//!   lock.
//! - **Acknowledged means durable.** A method returns `Ok` only after the
//!   commit of the group holding it returned (its `COMMIT`, or the end of
//!   the one statement a group of records only may be); a group whose
//!   transaction is lost answers every one of its jobs with the error.
//!   Each connection makes sure `synchronous_commit` is not `off` (any
//!   stronger setting the operator chose, such as `remote_apply` for a
//!   synchronous standby, is kept), and runs a statement outside an
//!   explicit transaction at read committed whatever the database's
//!   default (explicit transactions name their level). A connection lost
//!   mid-transaction rolls back: the write and its audit entries are both
//!   absent. An error does not prove the opposite, though: a connection
//!   lost *during* `COMMIT` leaves the outcome unknown to the caller (the
//!   write and its audit entries are then either both present or both
//!   absent); re-read, or retry with compare-and-set.
//! - **Reads** (`get_records`, `load_agents`, `find_token`, ...) are single
//!   statements and see everything committed before they start, on any
//!   server: there is no replica lag as long as every server uses the
//!   primary. Record reads (every resolve's) queued while one is at the
//!   database share the next statement; it starts after each of them was
//!   asked for, so what each sees is unchanged. Servers that cache agents
//!   refresh them from [change notifications](changes); see below for the
//!   bound on how stale such a cache can be.
//! - **Revocation covers the subtree as stored.** Revoking (status
//!   `revoked`) locks the named agents, then revokes every active
//!   descendant in the same transaction, including children another server
//!   registered after the revoking server computed the subtree; the change
//!   names them all. A registration holds its parent's row `FOR SHARE`
//!   until it commits, and a child whose parent is revoked by then is
//!   stored revoked. So no interleaving of registrations and revocations on
//!   different servers leaves an active agent under a revoked one.
//! - **Migrations** are versioned and applied on connect, under a
//!   transaction-scoped advisory lock, so servers starting together do not
//!   race; a database from a newer Warden is refused
//!   ([`StoreError::SchemaTooNew`](warden_store::StoreError::SchemaTooNew))
//!   and left unchanged. See [`SCHEMA_VERSION`].
//!
//! ## Several servers: what a reader may observe
//!
//! With `warden serve` on PostgreSQL, each server keeps the agent hierarchy
//! (agents, declared and effective capabilities, revocation, inherited
//! envelope ids) in memory for its hot paths and reads everything else
//! from the database on every request. It follows the other servers'
//! hierarchy changes through [`PgStore::subscribe`] (subscribed before it
//! loads the agents) and reconciles its whole hierarchy from
//! `load_agents` after a reconnect and every sync interval
//! (`warden serve --sync-interval-ms`, default 10 s, also the listener's
//! [`PgOptions::listen_heartbeat`]).
//!
//! - **Read-your-writes on one server.** A request sees every write the
//!   same server acknowledged before it started: memory, runs, envelopes,
//!   escalations, tokens and the log are read from the database, and the
//!   server applies its own registrations and revocations to its cache
//!   before acknowledging them.
//! - **Data read per request is current on every server.** A memory record,
//!   run, step outcome, envelope version, escalation, token (issued or
//!   revoked) or log entry committed through server A is seen by every
//!   request server B starts after the commit: one primary, no replicas.
//! - **Compare-and-set is exact across servers**, because it is decided in
//!   the database: memory revisions, envelope versions, escalation
//!   resolution and consumption, step outcomes and run ids. Of concurrent
//!   writers expecting the same state, exactly one succeeds, whichever
//!   servers they used; the others get the conflict and the current state.
//! - **Hierarchy, capabilities and revocation: bounded staleness.** A
//!   registration, revocation or capability change committed through A
//!   reaches B's cache after the notification latency (`NOTIFY` on commit;
//!   milliseconds: 3 to 40 ms in the process tests on one machine). If the
//!   notification is lost or B's listener is disconnected, it arrives at the
//!   latest one sync interval later (plus one `load_agents` read), because B
//!   reconciles through its connection pool regardless of the listener; a
//!   server that cannot reach the database cannot authenticate any request
//!   either (tokens are looked up per request). Until then B may still
//!   allow an agent revoked through A, or decide with capabilities changed
//!   through A. An agent B has not heard of at all is looked up in the
//!   database when a request names it (its token, a registration under it,
//!   its revocation), so a new agent can act on every server as soon as its
//!   registration is acknowledged.
//! - **The log is one chain** in commit order across servers (above); a
//!   revocation made on A is in it before A acknowledges it.
//!
//! //! ## Change notifications
//!
//! Transactions that change agents or tokens also record a [`Change`]
//! (`changes` table, gapless sequence numbers in commit order) and
//! `NOTIFY` it; [`PgStore::subscribe`] returns a [`ChangeStream`] that
//! delivers every change once, in order, across reconnects, and
//! [`PgStore::changes_since`] reads the table directly. See [`changes`].
//!
//! ## Audit verification and export
//!
//! [`PgStore::verify_audit`] and [`PgStore::export_audit`] work on an open
//! store; [`verify_audit`], [`export_audit`] and [`read_audit_head`] take a
//! URL, open one connection and change nothing (what `warden audit verify`
//! and `warden audit export` call, as they call the SQLite backend's
//! functions of the same names). See [`verify`].
//!
//! ## Schema
//!
//! Tables (in the schema chosen by [`PgOptions::schema`]): `warden_meta`
//! (schema version), `agents`, `tokens` (SHA-256 hashes only), `memory`
//! (primary key `(owner, namespace, key)`), `audit_log` (append-only,
//! enforced by a trigger), `audit_head`, `runs` and `run_steps` (one row per
//! step; an outcome is set once with `UPDATE ... WHERE status IS NULL`),
//! `changes`, and (schema version 2) `envelopes` with `envelope_heads`,
//! `escalations`, and the `envelope_id` columns of `agents` and `runs`;
//! (schema version 3) `runs.finished_at` with a partial index; (schema
//! version 4) `sessions` (the session row with its serialised source
//! index), `session_calls` (primary key `(session_id, call_id)`) and
//! `envelope_imports` (primary key `(issuer, envelope_id, version)`).
//! A version 1 database is migrated in place on connect, its rows kept
//! (agents and runs made before have no envelope). JSON values are stored as the exact text serde_json
//! writes, so values, audit details and hashes round-trip exactly.
//!
//! ## Limits
//!
//! The store needs a Tokio runtime (tokio-postgres drives its connections
//! on background tasks).
//!
//! Connections are made without TLS (`sslmode=require` fails rather than
//! fall back): reach a remote database over a trusted network, a Unix
//! socket or a TLS-terminating proxy.
//!
//! Tested on PostgreSQL 15. The schema uses advisory locks, `LISTEN` /
//! `NOTIFY`, a PL/pgSQL trigger and a stored generated column; a
//! Postgres-compatible distributed engine lacking one of them is not
//! supported yet (without `NOTIFY`, nodes could poll
//! [`PgStore::changes_since`] instead).
//!
//! The `changes` table is never pruned by Warden; it grows by one small row
//! per agent or token change.

mod agents;
mod codec;
mod context;
mod dedicated;
mod error;
mod log;
mod memory;
mod pool;
mod record_reads;
mod runs;
mod schema;
mod sessions;
mod shared;
mod sql;
mod store;
mod store_impl;
mod tx;
mod writer;

pub mod changes;
pub mod verify;

pub use changes::{Change, ChangeEvent, ChangeKind, ChangeStream};
pub use schema::SCHEMA_VERSION;
pub use store::{MAX_SCHEMA_LEN, PgOptions, PgStore, PgTimeouts, is_postgres_url};
pub use verify::{
    AnchorParseError, AuditChecker, ExportError, HeadAnchor, VERIFY_PAGE, VerifyError,
    VerifyReport, export_audit, read_audit_head, verify_audit, verify_audit_with,
};
