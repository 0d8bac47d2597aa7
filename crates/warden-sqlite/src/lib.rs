//! # warden-sqlite
//!
//! Warden's embedded storage backend: one SQLite file implementing the
//! [`Store`](warden_store::Store) trait, with a tamper-evident audit chain
//! and exactly-once run steps.
//!
//! ## Opening
//!
//! [`SqliteStore::open`] takes a URL, `sqlite://PATH` (default
//! [`DEFAULT_URL`], `sqlite://warden.db`), with optional `?mode=rwc|rw|ro`
//! and `?synchronous=full|normal` (see [`SqliteOptions::from_url`]). The file
//! is created on first use and migrated automatically: migrations are
//! numbered, each runs in one transaction with its version bump in the
//! `meta` table, and the file is marked with `PRAGMA application_id`
//! ([`APPLICATION_ID`]).
//!
//! Before anything is written the file is inspected with reads only. A file
//! that is not SQLite, or SQLite of another application, is
//! `StoreError::Corrupt`; a Warden database from a newer build is
//! `StoreError::SchemaTooNew`; a file or directory that cannot be written is
//! `StoreError::ReadOnly`. In each case the file is left exactly as it was.
//!
//! ## Schema (version 4)
//!
//! All tables are `STRICT` (SQLite checks every column's type); JSON is
//! stored as text.
//!
//! | table | holds |
//! | --- | --- |
//! | `meta` | one row: `schema_version` |
//! | `agents` | `id` (unique), `parent`, `capabilities`, `tools`, `config`, `status`, `created_at`, `envelope_id` (v2); registration order is the `pos` key |
//! | `tokens` | `token_id`, `hash` (SHA-256 of the secret, unique; the secret itself is never stored), subject, `created_at`, `revoked` |
//! | `memory` | key `(owner, namespace, key)`; `value`, `visibility`, `class` with `combine` / `grants` / `expires_at`, `revision`, `created_at`, `updated_at` |
//! | `audit` | the hash chain, below |
//! | `audit_head` | one row: the chain's last `seq` and `hash` |
//! | `runs` | `run_id` (the idempotency key), `agent`, `sop_hash`, `sop`, `policy_version`, `created_at`, `envelope_id` (v2), `finished_at` (v3, with a partial index on unfinished runs per agent) |
//! | `run_steps` | per run and step: `position`, `action`, `operation_id`, and once recorded `status`, `result`, `error`, `labels`, `recorded_at` |
//! | `envelopes` (v2) | every version of every context envelope: key `(envelope_id, version)`, `record` (the `EnvelopeRecord` as canonical JSON), plus `parent_envelope_id`, `workflow_id`, `agent_id` |
//! | `escalations` (v2) | the escalation queue in creation order (`pos`): `escalation_id` (unique), `target` (canonical JSON), `status`, `created_at`, `record` (the `EscalationRecord` as canonical JSON) |
//! | `sessions` (v4) | tool-call sessions: `session_id` (the key), `pos` (creation order), `agent`, `revision`, `created_at`, `record` (the `SessionRecord` as canonical JSON); `sources` (the serialised source index) until v7 |
//! | `session_index` (v7) | a session's source index in parts: key `(session_id, revision)` (the revision that wrote the part), `bytes`; the index is the parts in revision order |
//! | `session_calls` (v4) | key `(session_id, call_id)`: `seq`, `record` (the `CallRecord` as canonical JSON) |
//! | `envelope_imports` (v4) | every envelope a session was opened from: key `(issuer, envelope_id, version)`, `record` (the `EnvelopeImport` as canonical JSON) |
//!
//! Version 2 (context envelopes) adds the two `envelope_id` columns (`NULL`
//! for rows written at version 1, read as "no envelope") and the last two
//! tables; a version 1 file is migrated in place when first opened for
//! writing, its rows untouched. Version 3 (runs in flight) adds
//! `runs.finished_at`, set in the transaction that records the step which
//! finishes a run; the migration marks the runs already finished. Version
//! 4 (tool-call sessions) adds the last three tables. Version 7 moves each
//! session's source index into `session_index` (the stored index becomes
//! its session's one part): a decision no longer rewrites the index with
//! the session row, and a recorded result appends its delta.
//!
//! ## Quotas
//!
//! `put_record` with a `StorageQuota` reads the owner's usage in the
//! writer's transaction, and `create_run` with a `RunsInFlight` limit
//! counts the agent's unfinished runs there: the writer serialises every
//! write, so both limits are exact, also for two stores on one file.
//!
//! ## Writing: one writer thread, group commit
//!
//! Every mutation goes to one dedicated thread that owns the only write
//! connection. Callers queue a command and await its answer. The thread
//! takes everything queued (up to [`SqliteOptions::max_batch`]) and runs it
//! in one `BEGIN IMMEDIATE` transaction, each command inside its own
//! savepoint, then commits once and answers every command *after* the
//! commit. So:
//!
//! - **writes are serialised** in one total order, which is also the audit
//!   chain's order (the writer assigns sequence numbers and links hashes);
//! - **compare-and-set is atomic**: a put reads the current row, runs the
//!   core's `apply_put` and `check_result`, and writes with the lab
//!   document's conditional `UPDATE ... WHERE revision = :expected` (zero
//!   rows would be a conflict; with the write lock held it cannot happen,
//!   and it is kept as defence in depth), all inside the transaction;
//! - **a decision commits with the change it describes**: the audit entries
//!   (for a put or delete, computed by the caller's `AuditFn` from the
//!   outcome decided inside the transaction) are inserted in the same
//!   savepoint, and the `audit_head` row moves in the same transaction.
//!   There is never a write without its entry nor an "allowed" entry for a
//!   write that did not happen. A command that fails (duplicate, not found,
//!   a panic in an `AuditFn`) rolls back to its savepoint, taking its
//!   entries with it, without disturbing the rest of the group;
//! - **an acknowledgement is durable**: nobody is answered before COMMIT
//!   returns; if the transaction is lost, everyone in the group gets the
//!   error;
//! - **throughput**: one fsync covers a whole group, so many concurrent
//!   callers share it (see the benchmarks).
//!
//! Each group reads the audit head under the write lock, so two stores on
//! one file (in one process) still build one chain; they take turns on
//! SQLite's write lock (waiting up to 5 s for it). Dropping a
//! [`SqliteStore`] waits for the writer to answer what is queued and close
//! the file.
//!
//! ## One writing process per file
//!
//! A store opened for writing holds an exclusive advisory lock on the
//! sibling file `PATH.lock` ([`lock_path`]; `flock(2)` on Unix through
//! `std::fs::File::try_lock`) for as long as it lives. It is taken after
//! the file is inspected and before anything is written, so a second
//! *process* opening the file for writing fails with
//! `StoreError::Unavailable` (`` `PATH` is in use by another Warden process
//! (it holds the lock on `PATH.lock`) ``) and changes nothing. Two servers
//! on one file would each cache the hierarchy, and a revocation made
//! through one would never reach the other; servers that share a database
//! use PostgreSQL.
//!
//! - Stores of one process share the lock (a registry keyed by the lock
//!   file's canonical path), so tests and tools may open a file twice; the
//!   lock is released when the last of them is dropped.
//! - Read-only opens (`mode=ro`, [`verify_audit`], [`export_audit`],
//!   `warden audit verify` and `export`) take no lock and work beside a
//!   running server: WAL readers never disturb the writer.
//! - The lock lives on a sibling file, not on the database, because SQLite's
//!   own POSIX locks on the database are dropped whenever any descriptor of
//!   it is closed in the process. The kernel releases the lock when the
//!   process ends (`kill -9` included); the empty file stays. Removing it
//!   while a server runs defeats the check.
//!
//! ## When the filesystem is the problem
//!
//! Opening for writing says what is wrong: `` cannot write `PATH`:
//! read-only file system `` or `permission denied` (`StoreError::ReadOnly`),
//! `` cannot write `PATH`: disk full `` (`StoreError::Unavailable`). While
//! serving, `SQLITE_FULL` is `StoreError::Unavailable` (HTTP 503): every
//! write fails, and so does a read the engine records; reads that record
//! nothing (the audit log and its verification) still answer, and writes
//! succeed again once there is room.
//!
//! ## Reading
//!
//! The database runs in WAL mode, so readers never block the writer and are
//! never blocked by it. Reads use a small pool of read-only connections.
//! Each read is one statement or one read transaction, so it sees one
//! committed snapshot, and a read started after a write was acknowledged
//! sees it. Bounded point lookups (`get_records`, `find_token`,
//! `audit_head`: primary-key or unique-index probes of a few microseconds)
//! run inline in the calling task, since handing them to another thread
//! costs several times the lookup; reads that grow with the data
//! (`load_agents`, `audit_page`, `owner_usage`, `get_run`, verification) run
//! on tokio's blocking threads. Without a tokio runtime everything runs
//! inline.
//!
//! Checkpoints (copying the log back into the database file) run on a
//! third connection and thread, woken by the writer's WAL hook every
//! thousand pages, so their fsyncs never delay an acknowledgement. Closing
//! the store closes the writer last, which folds the log into the file and
//! removes it.
//!
//! ## Durability
//!
//! The default is `synchronous=FULL`: each group commit fsyncs the
//! write-ahead log before anyone is answered, so an acknowledged write
//! survives `kill -9` of the process *and* power loss or an OS crash.
//! `?synchronous=normal` is offered for deployments that accept losing the
//! last moments of writes on power loss: in WAL mode a commit then reaches
//! the OS page cache (a `write(2)`) before it is acknowledged but is fsynced
//! only at checkpoints, which survives a process crash (the kernel still
//! holds and later writes those pages) but not the machine going down.
//! Design invariant 10 (`kill -9`) holds in both modes; the crash test runs
//! with the default.
//!
//! ## The audit log and what detects tampering
//!
//! Table `audit` holds the hash chain of `warden_core::audit`: `seq`, every
//! field, `prev_hash`, `hash`, with `details` kept as their canonical JSON
//! text, so verification hashes the stored bytes straight from the cursor
//! (no entry is built, memory stays constant for any length) and any byte
//! changed there, even one that keeps the JSON's meaning, is detected. Triggers refuse `UPDATE` and `DELETE` on it
//! through SQL, and `audit_head` (one row: the last `seq` and `hash`) is
//! moved in the same transaction as every append and may only move forward.
//! What each layer defeats:
//!
//! - **Editing, deleting, inserting, reordering or swapping entries** breaks
//!   the chain at the first affected entry: [`verify_audit`] names its
//!   `seq`.
//! - **Cutting off the tail** leaves a valid shorter chain; it no longer
//!   reaches the `audit_head` row, which [`verify_audit`] checks. An actor
//!   that can only act through Warden (an agent, the orchestrator) can
//!   rewrite neither.
//! - **Someone who can rewrite the whole file** (drop the triggers, cut or
//!   edit entries, recompute every later hash and the head row) produces a
//!   file that verifies on its own. Only an *external anchor* defeats them:
//!   export the head ([`read_audit_head`], printed `SEQ:HASH`) to somewhere
//!   they cannot write (a ticket, another machine, a signed report) and
//!   verify later with it (`warden audit verify --expect-head SEQ:HASH`,
//!   [`verify_audit`]'s `anchor`): a rewritten chain no longer has that hash
//!   at that `seq`, and a shortened one no longer reaches it.
//!
//! ## Runs: exactly once
//!
//! `runs` holds each admitted run under its caller-supplied id (a reused id
//! returns the stored run, `CreateRun::Existing`, and the engine compares
//! SOP hashes); `run_steps` holds each planned step, its operation id and,
//! once recorded, its outcome. Recording is `UPDATE ... WHERE status IS
//! NULL`: the first outcome wins and a retry gets it back without appending
//! anything.
//!
//! ## Context envelopes and escalations
//!
//! `put_envelope` is a compare-and-set on an envelope's latest version, as
//! one guarded statement (`INSERT ... SELECT ... WHERE (SELECT
//! max(version) ...) IS :expected AND :version > :expected`) in the
//! writer's transaction with the audit entries its `AuditFn` returns; a
//! conflict stores nothing and reports the latest version. Versions are
//! never updated or deleted (triggers refuse it): receipts refer to
//! `(envelope_id, version)`.
//!
//! An escalation moves `pending` → `approved` | `rejected` and `approved` →
//! `consumed`, each by a conditional `UPDATE ... WHERE status = :from` in
//! the writer's transaction with its audit entries, so it resolves once and
//! an approval is consumed once however many callers race. A partial
//! unique index keeps at most one open (pending or approved) escalation per
//! target, and a trigger refuses any other status change through SQL.
//!
//! ## Tool-call sessions
//!
//! `create_session` runs in the writer's transaction: an existing session
//! id returns the stored session; otherwise the envelope id must be free,
//! an imported envelope is decided with `warden_store::decide_import`
//! against every earlier import of the same `(issuer, envelope_id)` read
//! there, and only then are the session row, its first envelope version
//! (in `envelopes`, beside every other envelope) and the import note
//! inserted, with the audit entries. `update_session` is a compare-and-set:
//! one `UPDATE sessions ... WHERE session_id = :id AND revision =
//! :expected` (a trigger lets a revision move only by one), then the call
//! is inserted or replaced by `call_id`, in the same savepoint as its audit
//! entries. Imports are never updated or deleted, so a replayed or
//! downgraded envelope is refused after a restart as before it.
//!
//! ## Entry points for the CLI
//!
//! - `warden audit verify --database URL [--expect-head SEQ:HASH]`:
//!   [`verify_audit`]; on failure print the error (it names the entry) and
//!   exit 1.
//! - `warden audit export --database URL [--after SEQ]`: [`export_audit`]
//!   writes JSON Lines to any `Write` (treat a broken pipe as success).
//! - exporting an anchor: [`read_audit_head`] (`HeadAnchor` displays as
//!   `SEQ:HASH` and parses back with `str::parse`).
//!
//! They are synchronous (they open their own read-only connection); a
//! server holding a [`SqliteStore`] uses [`SqliteStore::verify_audit`]
//! instead, or the backend-agnostic `warden_store::verify_store`.

mod audit;
mod codec;
mod context;
mod error;
mod keys;
mod lock;
mod memory;
#[cfg(test)]
mod migration_tests;
mod options;
mod runs;
mod schema;
mod sessions;
mod store;
mod writer;

pub use audit::{
    ExportError, export_audit, read_audit_head, verify_audit, verify_audit_path, verify_audit_with,
};
pub use lock::lock_path;
pub use options::{DEFAULT_URL, OpenMode, SqliteOptions, Synchronous, UrlError};
pub use schema::{APPLICATION_ID, SCHEMA_VERSION};
pub use store::SqliteStore;
