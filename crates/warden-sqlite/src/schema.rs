//! The schema, its migrations, and the checks made before a file is touched.
//!
//! Opening never changes a file it is not sure about: the file is first
//! inspected with reads only (is it SQLite at all, is it Warden's, which
//! schema version), and only a fresh file or a Warden database at an older
//! version is then written (WAL mode, migrations). A foreign or damaged file
//! is [`StoreError::Corrupt`], one from a newer Warden is
//! [`StoreError::SchemaTooNew`], and either is left byte-for-byte as it was.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension};
use warden_store::{Entity, StoreError};

use crate::error::SqlResultExt;
use crate::lock::WriterLock;
use crate::options::{OpenMode, SqliteOptions};

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = 8;

/// `PRAGMA application_id` of a Warden database: ASCII `WRDN`. It marks the
/// file as Warden's before any table is read (`file(1)` shows it too).
pub const APPLICATION_ID: i32 = 0x5752_444E;

/// How long a connection waits for a lock held by another process.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Migration `n` (1-based) takes the schema from version `n - 1` to `n`.
/// Each runs in the transaction that records its version; append only.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8];

const V1: &str = r#"
CREATE TABLE meta (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    schema_version INTEGER NOT NULL
) STRICT;
INSERT INTO meta (id, schema_version) VALUES (1, 0);

-- Agents in registration order (pos).
CREATE TABLE agents (
    pos          INTEGER PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,
    parent       TEXT,
    capabilities TEXT NOT NULL,   -- JSON array of action names
    tools        TEXT NOT NULL,   -- JSON array of strings
    config       TEXT,            -- JSON, NULL when absent
    status       TEXT NOT NULL CHECK (status IN ('active', 'revoked')),
    created_at   INTEGER NOT NULL
) STRICT;

-- Bearer tokens: only the SHA-256 of the secret is kept.
CREATE TABLE tokens (
    token_id     TEXT PRIMARY KEY,
    hash         BLOB NOT NULL UNIQUE CHECK (length(hash) = 32),
    subject_kind TEXT NOT NULL CHECK (subject_kind IN ('operator', 'agent')),
    agent_id     TEXT,
    created_at   INTEGER NOT NULL,
    revoked      INTEGER NOT NULL DEFAULT 0 CHECK (revoked IN (0, 1)),
    CHECK ((subject_kind = 'agent') = (agent_id IS NOT NULL))
) STRICT;

-- Memory records, keyed by exact owner scope.
CREATE TABLE memory (
    owner      TEXT NOT NULL,
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,     -- JSON
    visibility TEXT NOT NULL CHECK (visibility IN ('private', 'children', 'descendants')),
    class      TEXT NOT NULL CHECK (class IN ('preference', 'policy', 'secret', 'task')),
    combine    TEXT,              -- policy: the combinator
    grants     TEXT,              -- secret: JSON array of agent ids
    expires_at INTEGER,           -- task: expiry, ms
    revision   INTEGER NOT NULL CHECK (revision >= 1),
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (owner, namespace, key)
) STRICT, WITHOUT ROWID;

-- The decision log: a hash chain (see warden_core::audit).
CREATE TABLE audit (
    seq            INTEGER PRIMARY KEY,
    time           INTEGER NOT NULL,
    subject        TEXT NOT NULL,
    operation      TEXT NOT NULL,
    resource       TEXT NOT NULL,
    verdict        TEXT NOT NULL,
    reason         TEXT NOT NULL,
    policy_version TEXT NOT NULL,
    details        TEXT NOT NULL, -- JSON
    prev_hash      BLOB NOT NULL,
    hash           BLOB NOT NULL
) STRICT;

-- The chain head, moved in the same transaction as every append, so a cut
-- tail no longer reaches it.
CREATE TABLE audit_head (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    seq  INTEGER NOT NULL,
    hash BLOB NOT NULL CHECK (length(hash) = 32)
) STRICT;
INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, zeroblob(32));

-- Append-only, as far as SQL through this schema goes. Anyone who can
-- write the file can drop these; the chain and an external anchor are what
-- detect that (see the crate docs).
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER audit_head_forward BEFORE UPDATE ON audit_head
WHEN NEW.seq < OLD.seq OR NEW.id != OLD.id
BEGIN SELECT RAISE(ABORT, 'the audit head only moves forward'); END;
CREATE TRIGGER audit_head_no_delete BEFORE DELETE ON audit_head
BEGIN SELECT RAISE(ABORT, 'the audit head cannot be deleted'); END;

-- Admitted runs; a run id is a client-supplied idempotency key.
CREATE TABLE runs (
    run_id         TEXT PRIMARY KEY,
    agent          TEXT NOT NULL,
    sop_hash       BLOB NOT NULL CHECK (length(sop_hash) = 32),
    sop            TEXT NOT NULL, -- JSON
    policy_version TEXT NOT NULL,
    created_at     INTEGER NOT NULL
) STRICT;

-- The steps of each run in order, with their outcome once recorded. The
-- outcome is set once: `UPDATE ... WHERE status IS NULL`.
CREATE TABLE run_steps (
    run_id       TEXT NOT NULL REFERENCES runs (run_id),
    position     INTEGER NOT NULL,
    step_id      TEXT NOT NULL,
    action       TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    status       TEXT CHECK (status IN ('completed', 'failed', 'denied')),
    result       TEXT,            -- JSON
    error        TEXT,
    labels       TEXT,            -- JSON array
    recorded_at  INTEGER,
    PRIMARY KEY (run_id, step_id),
    UNIQUE (run_id, position)
) STRICT, WITHOUT ROWID;
"#;

/// Context envelopes and the escalation queue.
const V2: &str = r#"
-- The context envelope an agent inherited / a run started from.
ALTER TABLE agents ADD COLUMN envelope_id TEXT;
ALTER TABLE runs ADD COLUMN envelope_id TEXT;

-- Every version of every context envelope: receipts refer to
-- (envelope_id, version), so versions are never changed or removed. The
-- record is the EnvelopeRecord's canonical JSON; the other columns repeat
-- parts of it for lookups.
CREATE TABLE envelopes (
    envelope_id        TEXT NOT NULL,
    version            INTEGER NOT NULL CHECK (version >= 0),
    parent_envelope_id TEXT,
    workflow_id        TEXT NOT NULL,
    agent_id           TEXT NOT NULL,
    record             TEXT NOT NULL, -- canonical JSON
    PRIMARY KEY (envelope_id, version)
) STRICT, WITHOUT ROWID;
CREATE TRIGGER envelopes_no_update BEFORE UPDATE ON envelopes
BEGIN SELECT RAISE(ABORT, 'envelope versions are immutable'); END;
CREATE TRIGGER envelopes_no_delete BEFORE DELETE ON envelopes
BEGIN SELECT RAISE(ABORT, 'envelope versions are immutable'); END;

-- Requests held for human review, in creation order (pos). `target` is the
-- canonical JSON of the EscalationTarget, `record` that of the whole
-- EscalationRecord (its status always equals the `status` column).
CREATE TABLE escalations (
    pos           INTEGER PRIMARY KEY,
    escalation_id TEXT NOT NULL UNIQUE,
    target        TEXT NOT NULL,
    status        TEXT NOT NULL
                  CHECK (status IN ('pending', 'approved', 'rejected', 'consumed')),
    created_at    INTEGER NOT NULL,
    record        TEXT NOT NULL -- canonical JSON
) STRICT;
-- At most one open (pending or approved) escalation per target.
CREATE UNIQUE INDEX escalations_one_open ON escalations (target)
WHERE status IN ('pending', 'approved');
CREATE INDEX escalations_by_status ON escalations (status, pos);
-- An escalation only moves pending -> approved | rejected, approved ->
-- consumed, and never changes what it is about.
CREATE TRIGGER escalations_forward BEFORE UPDATE ON escalations
WHEN NOT ((OLD.status = 'pending' AND NEW.status IN ('approved', 'rejected'))
       OR (OLD.status = 'approved' AND NEW.status = 'consumed'))
  OR NEW.pos IS NOT OLD.pos
  OR NEW.escalation_id IS NOT OLD.escalation_id
  OR NEW.target IS NOT OLD.target
  OR NEW.created_at IS NOT OLD.created_at
BEGIN SELECT RAISE(ABORT, 'an escalation resolves once and is consumed once'); END;
CREATE TRIGGER escalations_no_delete BEFORE DELETE ON escalations
BEGIN SELECT RAISE(ABORT, 'escalations are kept'); END;
"#;

/// Runs in flight: when a run finished, so `create_run` can count the
/// agent's unfinished runs in its transaction.
const V3: &str = r#"
-- Set once, in the transaction that records the step which finishes the
-- run: a step that did not complete, or the last step without an outcome.
ALTER TABLE runs ADD COLUMN finished_at INTEGER;
UPDATE runs SET finished_at = coalesce(
    (SELECT max(recorded_at) FROM run_steps s WHERE s.run_id = runs.run_id),
    created_at)
WHERE EXISTS (SELECT 1 FROM run_steps s
              WHERE s.run_id = runs.run_id AND s.status IN ('failed', 'denied'))
   OR NOT EXISTS (SELECT 1 FROM run_steps s
                  WHERE s.run_id = runs.run_id AND s.status IS NULL);
CREATE INDEX runs_in_flight ON runs (agent, created_at) WHERE finished_at IS NULL;
"#;

/// Tool-call sessions: the session rows, their calls, and every envelope
/// import (so a replayed or downgraded envelope is refused after a restart
/// too).
const V4: &str = r#"
-- One row per session, changed only by compare-and-set on `revision`
-- (`UPDATE ... WHERE revision = :expected`, one revision at a time).
-- `record` is the SessionRecord's canonical JSON (the other columns repeat
-- parts of it for lookups), `sources` the serialised source index (keyed
-- fingerprints, never tool output), `pos` the creation order.
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    pos        INTEGER NOT NULL UNIQUE,
    agent      TEXT NOT NULL,
    revision   INTEGER NOT NULL CHECK (revision >= 1),
    created_at INTEGER NOT NULL,
    record     TEXT NOT NULL, -- canonical JSON
    sources    BLOB NOT NULL
) STRICT;
CREATE INDEX sessions_by_agent ON sessions (agent, pos);
CREATE TRIGGER sessions_forward BEFORE UPDATE ON sessions
WHEN NEW.revision IS NOT OLD.revision + 1
  OR NEW.session_id IS NOT OLD.session_id
  OR NEW.pos IS NOT OLD.pos
BEGIN SELECT RAISE(ABORT, 'a session changes one revision at a time'); END;
CREATE TRIGGER sessions_no_delete BEFORE DELETE ON sessions
BEGIN SELECT RAISE(ABORT, 'sessions are kept'); END;

-- The calls of each session, keyed by their id (a retried call replaces
-- its row), read back by `seq`. `record` is the CallRecord's canonical JSON.
CREATE TABLE session_calls (
    session_id TEXT NOT NULL REFERENCES sessions (session_id),
    call_id    TEXT NOT NULL,
    seq        INTEGER NOT NULL CHECK (seq >= 0),
    record     TEXT NOT NULL, -- canonical JSON
    PRIMARY KEY (session_id, call_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX session_calls_by_seq ON session_calls (session_id, seq);
CREATE TRIGGER session_calls_no_delete BEFORE DELETE ON session_calls
BEGIN SELECT RAISE(ABORT, 'session calls are kept'); END;

-- Every envelope a session was opened from, per issuer, envelope and
-- version: a create decides a new import against these in its
-- transaction. `record` is the EnvelopeImport's canonical JSON.
CREATE TABLE envelope_imports (
    issuer      TEXT NOT NULL,
    envelope_id TEXT NOT NULL,
    version     INTEGER NOT NULL CHECK (version >= 0),
    record      TEXT NOT NULL, -- canonical JSON
    PRIMARY KEY (issuer, envelope_id, version)
) STRICT, WITHOUT ROWID;
CREATE TRIGGER envelope_imports_no_update BEFORE UPDATE ON envelope_imports
BEGIN SELECT RAISE(ABORT, 'envelope imports are kept as noted'); END;
CREATE TRIGGER envelope_imports_no_delete BEFORE DELETE ON envelope_imports
BEGIN SELECT RAISE(ABORT, 'envelope imports are kept as noted'); END;
"#;

/// A call's `seq` is unique within its session: the index that reads calls
/// back by `seq` becomes a unique one. (Every engine wrote each new call at
/// the session's call count under the session's compare-and-set, so a
/// database it wrote holds no two calls at one `seq`; one that does fails
/// this migration, which then changes nothing.)
const V5: &str = r#"
DROP INDEX session_calls_by_seq;
CREATE UNIQUE INDEX session_calls_by_seq ON session_calls (session_id, seq);
"#;

/// Version 6: a client-executed step that has begun and not completed is
/// leased to one holder from `lease_acquired_at` until `lease_expires_at`
/// (ms since the epoch); all three are set or none is (the record step
/// and lease writes keep that). Escalations keep their request in the
/// `record` JSON, so they need no change.
const V6: &str = r#"
ALTER TABLE run_steps ADD COLUMN lease_holder TEXT;
ALTER TABLE run_steps ADD COLUMN lease_acquired_at INTEGER;
ALTER TABLE run_steps ADD COLUMN lease_expires_at INTEGER;
"#;

/// Version 7: a session's source index leaves the session row for parts
/// of its own, keyed by the revision that wrote them: the create writes
/// the first, a recorded result appends its delta, a replace drops the
/// parts and writes one. The index is the parts' bytes in revision order.
/// A call decision, which changes only the row, no longer rewrites the
/// index with it, and a result writes its delta, not the whole index.
/// Every stored index becomes the one part of its session's revision.
const V7: &str = r#"
CREATE TABLE session_index (
    session_id TEXT NOT NULL REFERENCES sessions (session_id),
    revision   INTEGER NOT NULL CHECK (revision >= 1),
    bytes      BLOB NOT NULL,
    PRIMARY KEY (session_id, revision)
) STRICT;
CREATE TRIGGER session_index_no_update BEFORE UPDATE ON session_index
BEGIN SELECT RAISE(ABORT, 'index parts are appended, never changed'); END;
INSERT INTO session_index (session_id, revision, bytes)
SELECT session_id, revision, sources FROM sessions;
ALTER TABLE sessions DROP COLUMN sources;
"#;

/// Version 8: envelope signing keys by generation (the highest is
/// current), written once each and never changed. The seed is stored as it
/// is: whoever can read the file can sign envelopes. (Request-rate buckets
/// stay in the writing process: one process writes a file.)
const V8: &str = r#"
CREATE TABLE envelope_signing_keys (
    generation INTEGER PRIMARY KEY CHECK (generation >= 1),
    seed       BLOB NOT NULL CHECK (length(seed) = 32),
    public_key BLOB NOT NULL CHECK (length(public_key) = 32),
    created_at INTEGER NOT NULL
) STRICT;
CREATE TRIGGER envelope_signing_keys_no_update BEFORE UPDATE ON envelope_signing_keys
BEGIN SELECT RAISE(ABORT, 'signing keys are never changed'); END;
CREATE TRIGGER envelope_signing_keys_no_delete BEFORE DELETE ON envelope_signing_keys
BEGIN SELECT RAISE(ABORT, 'signing keys are never removed'); END;
"#;

/// What a file holds, found by reading only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// An empty database (or a new, zero-length file).
    Fresh,
    /// A Warden database at this schema version.
    Warden(i64),
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

fn configure(conn: &Connection) -> Result<(), StoreError> {
    conn.busy_timeout(BUSY_TIMEOUT).store()?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// Inspect `conn` with reads only.
fn inspect(conn: &Connection, path: &Path) -> Result<Found, StoreError> {
    let p = display(path);
    // The first read parses the header: random bytes fail here. A file
    // that cannot even be opened (a WAL database on a read-only filesystem
    // whose shared-memory file is missing) is not thereby corrupt, nor is
    // one a crashed writer left with a transaction to roll back (a hot
    // journal), which a read-only connection may not do.
    let not_sqlite = |e: rusqlite::Error| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::CannotOpen) => open_failed(path, e),
        Some(rusqlite::ErrorCode::ReadOnly) => StoreError::read_only(format!(
            "`{p}` needs recovery (a writer stopped in the middle of a transaction), \
             which a read-only open cannot do; open it once read-write: {e}"
        )),
        _ => StoreError::corrupt(format!("`{p}` is not a sqlite database: {e}")),
    };
    let app_id: i32 = conn
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .map_err(not_sqlite)?;
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(not_sqlite)?;
    if app_id == 0 && tables == 0 {
        return Ok(Found::Fresh);
    }
    if app_id != APPLICATION_ID {
        return Err(StoreError::corrupt(format!(
            "`{p}` is a sqlite database of another application (application id {app_id:#x}, {tables} schema objects), not a warden database"
        )));
    }
    let version: Option<i64> = conn
        .query_row("SELECT schema_version FROM meta WHERE id = 1", [], |r| {
            r.get(0)
        })
        .optional()
        .map_err(|e| StoreError::corrupt(format!("`{p}` has no readable schema version: {e}")))?;
    match version {
        Some(v) if v >= 1 => Ok(Found::Warden(v)),
        _ => Err(StoreError::corrupt(format!(
            "`{p}` is marked as a warden database but has no schema version"
        ))),
    }
}

/// Fail unless `found` can be used at [`SCHEMA_VERSION`] without writing.
fn require_current(found: Found, path: &Path) -> Result<(), StoreError> {
    match found {
        Found::Warden(SCHEMA_VERSION) => Ok(()),
        Found::Warden(v) if v > SCHEMA_VERSION => Err(StoreError::SchemaTooNew {
            found: v,
            supported: SCHEMA_VERSION,
        }),
        Found::Warden(v) => Err(StoreError::read_only(format!(
            "`{}` is at schema version {v} and needs migrating to {SCHEMA_VERSION}, which a read-only open cannot do",
            display(path)
        ))),
        Found::Fresh => Err(StoreError::read_only(format!(
            "`{}` is not initialised, which a read-only open cannot do",
            display(path)
        ))),
    }
}

fn open_failed(path: &Path, e: rusqlite::Error) -> StoreError {
    let p = display(path);
    match crate::error::map(e) {
        StoreError::Backend { source: m } => {
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if path.is_dir() {
                StoreError::backend(format!("cannot open `{p}`: it is a directory"))
            } else if !dir.is_dir() {
                StoreError::backend(format!(
                    "cannot open `{p}`: directory `{}` does not exist",
                    dir.display()
                ))
            } else {
                StoreError::read_only(format!("cannot open or create `{p}`: {m}"))
            }
        }
        other => other,
    }
}

/// Open a read-only connection to an existing database at the current
/// schema version. Never writes the file.
pub(crate) fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    if !path.exists() {
        return Err(StoreError::not_found(Entity::Database, display(path)));
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| open_failed(path, e))?;
    configure(&conn)?;
    require_current(inspect(&conn, path)?, path)?;
    Ok(conn)
}

/// Open the checkpointer's connection to a database the writer has opened.
pub(crate) fn open_checkpointer(path: &Path) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| open_failed(path, e))?;
    configure(&conn)?;
    Ok(conn)
}

/// Open the connection that writes, creating and migrating the file as
/// `options` allow. For [`OpenMode::ReadOnly`] this checks the file and
/// returns `None`: the store then has no writer. The writer lock (see
/// [`crate::lock`]) is taken after the file is known to be usable and
/// before anything is written, and returned with the connection.
pub(crate) fn open_writer(
    options: &SqliteOptions,
) -> Result<Option<(Connection, Arc<WriterLock>)>, StoreError> {
    let opened = open_writer_inner(options);
    if options.mode == OpenMode::ReadOnly {
        return opened;
    }
    opened.map_err(|e| explain(e, &options.path))
}

/// Say plainly why a file could not be opened for writing when the
/// filesystem is the reason: `cannot write PATH: read-only file system`,
/// `permission denied` or `disk full`. Other errors are kept.
fn explain(e: StoreError, path: &Path) -> StoreError {
    match e {
        StoreError::ReadOnly { .. } | StoreError::Backend { .. } => {
            why_unwritable(path).unwrap_or(e)
        }
        StoreError::Unavailable { ref source, .. } if is_disk_full(source.as_ref()) => {
            StoreError::unavailable_because(
                warden_store::Unavailability::DiskFull,
                format!("cannot write `{}`: disk full", display(path)),
            )
        }
        other => other,
    }
}

/// Whether an error (or its source chain) is SQLite's `SQLITE_FULL`.
fn is_disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(e);
    while let Some(e) = current {
        if let Some(rusqlite::Error::SqliteFailure(f, _)) = e.downcast_ref::<rusqlite::Error>()
            && f.code == rusqlite::ErrorCode::DiskFull
        {
            return true;
        }
        current = e.source();
    }
    false
}

/// Why `path` or its directory cannot be written, found by trying without
/// changing anything: opening the file for writing (no truncation) and
/// creating an anonymous temporary file beside it.
fn why_unwritable(path: &Path) -> Option<StoreError> {
    if path.is_file()
        && let Err(e) = std::fs::OpenOptions::new().write(true).open(path)
    {
        return Some(crate::error::io_failure(path, "open", &e));
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return None;
    }
    match tempfile::tempfile_in(dir) {
        Ok(_) => None,
        Err(e) => match crate::error::io_failure(path, "create a file beside", &e) {
            StoreError::Backend { .. } => None,
            plain => Some(plain),
        },
    }
}

fn open_writer_inner(
    options: &SqliteOptions,
) -> Result<Option<(Connection, Arc<WriterLock>)>, StoreError> {
    let path = options.path.as_path();
    let p = display(path);
    if options.mode == OpenMode::ReadOnly {
        drop(open_reader(path)?);
        return Ok(None);
    }
    let exists = path.exists();
    if !exists && options.mode == OpenMode::ReadWrite {
        return Err(StoreError::not_found(Entity::Database, p));
    }
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if options.mode == OpenMode::ReadWriteCreate {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let mut conn = Connection::open_with_flags(path, flags).map_err(|e| open_failed(path, e))?;
    configure(&conn)?;
    let found = inspect(&conn, path)?;
    if let Found::Warden(v) = found
        && v > SCHEMA_VERSION
    {
        return Err(StoreError::SchemaTooNew {
            found: v,
            supported: SCHEMA_VERSION,
        });
    }
    // SQLite silently opens a write-protected file read-only.
    if conn.is_readonly(rusqlite::MAIN_DB).store()? {
        return Err(StoreError::read_only(format!(
            "`{p}` cannot be written (file permissions or a read-only filesystem)"
        )));
    }
    // One writing process per file: refuse before writing anything.
    let lock = crate::lock::acquire(path)?;
    // Only now, with a file known to be ours (or empty), write to it.
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .map_err(|e| open_failed(path, e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::backend(format!(
            "`{p}` cannot use write-ahead logging (journal mode stays `{mode}`)"
        )));
    }
    conn.pragma_update(None, "synchronous", options.synchronous.pragma())
        .store()?;
    conn.pragma_update(None, "foreign_keys", true).store()?;
    conn.pragma_update(None, "temp_store", "MEMORY").store()?;
    conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)
        .store()?;
    migrate(&mut conn, path, SCHEMA_VERSION)?;
    Ok(Some((conn, lock)))
}

/// Apply every migration past the file's version up to `target` (always
/// [`SCHEMA_VERSION`] outside tests), each in its own transaction with its
/// version bump. Safe against a concurrent opener: the version is re-read
/// under the write lock.
pub(crate) fn migrate(conn: &mut Connection, path: &Path, target: i64) -> Result<(), StoreError> {
    loop {
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .store()?;
        let current = match inspect(&tx, path)? {
            Found::Fresh => 0,
            Found::Warden(v) => v,
        };
        if current > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                found: current,
                supported: SCHEMA_VERSION,
            });
        }
        if current >= target {
            return Ok(());
        }
        let next = current + 1;
        let Some(sql) = usize::try_from(current)
            .ok()
            .and_then(|i| MIGRATIONS.get(i))
        else {
            return Err(StoreError::backend(format!(
                "no migration from schema version {current}"
            )));
        };
        tx.execute_batch(sql).store()?;
        tx.execute("UPDATE meta SET schema_version = ?1 WHERE id = 1", [next])
            .store()?;
        if current == 0 {
            tx.pragma_update(None, "application_id", APPLICATION_ID)
                .store()?;
        }
        tx.commit().store()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_cover_every_version() {
        assert_eq!(MIGRATIONS.len() as i64, SCHEMA_VERSION);
    }
}
