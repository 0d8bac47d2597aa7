//! The one writer: a thread that owns the write connection and commits
//! queued commands in groups.
//!
//! Callers send a command over a channel and await a oneshot reply. The
//! thread takes every command queued (up to `max_batch`), runs them in one
//! `BEGIN IMMEDIATE` transaction, each inside its own savepoint, moves the
//! audit head row once, commits, and only then replies to each. So:
//!
//! - every acknowledgement is durable (it follows the COMMIT, which with
//!   `synchronous=FULL` follows the fsync of the write-ahead log);
//! - one fsync covers the whole group, which is where the throughput comes
//!   from when many callers write at once;
//! - a command that fails rolls back to its savepoint (its writes and its
//!   audit entries vanish together) without disturbing the others;
//! - if the transaction itself is lost (I/O error, disk full, a failed
//!   COMMIT), every command of the group is answered with the error: none
//!   of them is acknowledged, and none of them happened.
//!
//! A command that panics (an `AuditFn` is caller code) is caught, rolled
//! back and answered with `StoreError::Backend`; the thread carries on.
//!
//! Checkpoints (copying the write-ahead log back into the database file,
//! with its own fsyncs) run on a second thread with its own connection,
//! woken by the writer's WAL hook once the log holds
//! [`CHECKPOINT_PAGES`] pages. SQLite's automatic checkpoint would run them
//! inside a COMMIT on the writer, holding up every acknowledgement of that
//! group; a passive checkpoint beside the writer blocks neither it nor the
//! readers.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use rusqlite::Connection;
use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;
use tokio::sync::oneshot;
use warden_core::audit::{AuditDraft, ChainHead};
use warden_core::canonical::to_canonical;
use warden_store::StoreError;

use crate::error::{SqlResultExt, map};

/// The state a command works on: the open group transaction and the audit
/// head as of this point in it.
pub(crate) struct Tx<'c> {
    conn: &'c Connection,
    head: ChainHead,
    /// Set when the group transaction can no longer commit (shared: every
    /// command of the group is answered with it).
    broken: Option<Arc<StoreError>>,
}

impl<'c> Tx<'c> {
    /// The connection, inside the group transaction and the command's
    /// savepoint.
    pub(crate) fn conn(&self) -> &'c Connection {
        self.conn
    }

    /// Seal `drafts` onto the chain and insert them; returns the new head.
    pub(crate) fn append(&mut self, drafts: Vec<AuditDraft>) -> Result<ChainHead, StoreError> {
        if drafts.is_empty() {
            return Ok(self.head);
        }
        let mut stmt = self
            .conn
            .prepare_cached(
                "INSERT INTO audit (seq, time, subject, operation, resource, verdict, reason, \
                 policy_version, details, prev_hash, hash) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            )
            .store()?;
        let mut head = self.head;
        for draft in drafts {
            // Canonical text: the verifier hashes exactly these bytes.
            let details = String::from_utf8(to_canonical(&draft.details))
                .map_err(|e| StoreError::backend(format!("audit details: {e}")))?;
            let entry = draft.seal(head.seq + 1, head.hash);
            stmt.execute(rusqlite::params![
                crate::codec::seq_to_sql(entry.seq)?,
                entry.draft.time.0,
                entry.draft.subject,
                entry.draft.operation,
                entry.draft.resource,
                entry.draft.verdict.as_str(),
                entry.draft.reason,
                entry.draft.policy_version,
                details,
                entry.prev_hash.0,
                entry.hash.0,
            ])
            .store()?;
            head = ChainHead {
                count: head.count + 1,
                seq: entry.seq,
                hash: entry.hash,
            };
        }
        self.head = head;
        Ok(head)
    }
}

/// A queued command, type-erased.
trait Command: Send {
    /// Run inside the group transaction; returns how to answer once the
    /// group's fate is known.
    fn run(self: Box<Self>, tx: &mut Tx<'_>) -> Box<dyn Answer>;
    /// Answer without running.
    fn fail(self: Box<Self>, err: StoreError);
}

/// The answer of a command that ran, held until the group commits.
trait Answer: Send {
    /// `commit` is the group's outcome.
    fn send(self: Box<Self>, commit: Result<(), &Arc<StoreError>>);
}

struct Op<F, R> {
    f: F,
    reply: oneshot::Sender<Result<R, StoreError>>,
}

struct Pending<R> {
    result: Result<R, StoreError>,
    reply: oneshot::Sender<Result<R, StoreError>>,
}

impl<R: Send> Answer for Pending<R> {
    fn send(self: Box<Self>, commit: Result<(), &Arc<StoreError>>) {
        let result = match (self.result, commit) {
            (Ok(r), Ok(())) => Ok(r),
            (Ok(_), Err(e)) => Err(StoreError::fan_out(e)),
            (Err(e), _) => Err(e),
        };
        // The caller may have gone away; the outcome stands regardless.
        let _ = self.reply.send(result);
    }
}

fn exec_cached(conn: &Connection, sql: &str) -> Result<(), rusqlite::Error> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

impl<F, R> Command for Op<F, R>
where
    F: FnOnce(&mut Tx<'_>) -> Result<R, StoreError> + Send,
    R: Send + 'static,
{
    fn run(self: Box<Self>, tx: &mut Tx<'_>) -> Box<dyn Answer> {
        let Op { f, reply } = *self;
        let saved = tx.head;
        let result = match exec_cached(tx.conn, "SAVEPOINT cmd") {
            Err(e) => {
                let e = Arc::new(map(e));
                tx.broken = Some(Arc::clone(&e));
                Err(StoreError::fan_out(&e))
            }
            Ok(()) => match catch_unwind(AssertUnwindSafe(|| f(tx))) {
                Ok(r) => r,
                Err(_) => Err(StoreError::backend(
                    "a storage command panicked; it was rolled back",
                )),
            },
        };
        if tx.broken.is_none() {
            let settle = match &result {
                Ok(_) => exec_cached(tx.conn, "RELEASE cmd"),
                Err(_) if tx.conn.is_autocommit() => Ok(()),
                Err(_) => exec_cached(tx.conn, "ROLLBACK TO cmd")
                    .and_then(|()| exec_cached(tx.conn, "RELEASE cmd")),
            };
            if let Err(e) = settle {
                tx.broken = Some(Arc::new(map(e)));
            } else if tx.conn.is_autocommit() {
                // SQLite rolled the whole transaction back (I/O error, disk
                // full): nothing of this group happened.
                let why = match &result {
                    Err(e) => e.to_string(),
                    Ok(_) => "the transaction ended early".into(),
                };
                tx.broken = Some(Arc::new(StoreError::backend(format!(
                    "the write transaction was rolled back: {why}"
                ))));
            }
        }
        if result.is_err() {
            tx.head = saved;
        }
        Box::new(Pending { result, reply })
    }

    fn fail(self: Box<Self>, err: StoreError) {
        let _ = self.reply.send(Err(err));
    }
}

/// The handle callers hold; dropping it stops the thread after it has
/// answered every queued command, and waits for that.
pub(crate) struct Writer {
    sender: Option<mpsc::Sender<Box<dyn Command>>>,
    thread: Option<JoinHandle<()>>,
}

/// WAL size (in pages) at which the checkpointer is woken.
pub(crate) const CHECKPOINT_PAGES: c_int = 1000;

type WalHook = fn(&mut Wal, c_int) -> rusqlite::Result<()>;

/// Start the checkpointer for the database at `path`; it stops once the
/// writer's WAL hook (which holds the other end of its channel) is removed.
fn spawn_checkpointer(writer: &mut Connection, path: &Path) -> Result<JoinHandle<()>, StoreError> {
    let conn = crate::schema::open_checkpointer(path)?;
    let (kick, kicked) = mpsc::sync_channel::<()>(1);
    writer
        .wal_hook(Some(move |_: &mut Wal, pages: c_int| {
            if pages >= CHECKPOINT_PAGES {
                // Already pending is as good as sent.
                let _ = kick.try_send(());
            }
            Ok(())
        }))
        .store()?;
    std::thread::Builder::new()
        .name("warden-sqlite-checkpointer".into())
        .spawn(move || {
            while kicked.recv().is_ok() {
                // Best effort: a checkpoint that cannot finish now (a reader
                // holds old frames) is retried at the next wake-up.
                let _ = conn.wal_checkpoint_v2(None::<&str>, CheckpointMode::PASSIVE);
            }
        })
        .map_err(|e| StoreError::backend(format!("cannot start the checkpointer thread: {e}")))
}

impl Writer {
    /// Start the writer thread on `conn`, the connection to `path`.
    pub(crate) fn spawn(
        mut conn: Connection,
        path: &Path,
        max_batch: usize,
    ) -> Result<Self, StoreError> {
        let checkpointer = spawn_checkpointer(&mut conn, path)?;
        let (sender, receiver) = mpsc::channel::<Box<dyn Command>>();
        let thread = std::thread::Builder::new()
            .name("warden-sqlite-writer".into())
            .spawn(move || run(conn, receiver, max_batch.max(1), checkpointer))
            .map_err(|e| StoreError::backend(format!("cannot start the writer thread: {e}")))?;
        Ok(Self {
            sender: Some(sender),
            thread: Some(thread),
        })
    }

    /// Run `f` in the writer's transaction; resolves after the group that
    /// holds it has committed (or failed).
    pub(crate) async fn call<F, R>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::backend("the sqlite writer thread has stopped");
        self.sender
            .as_ref()
            .ok_or_else(stopped)?
            .send(Box::new(Op { f, reply }))
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.sender.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(
    mut conn: Connection,
    receiver: mpsc::Receiver<Box<dyn Command>>,
    max_batch: usize,
    checkpointer: JoinHandle<()>,
) {
    let mut queue: VecDeque<Box<dyn Command>> = VecDeque::new();
    loop {
        if queue.is_empty() {
            match receiver.recv() {
                Ok(cmd) => queue.push_back(cmd),
                Err(_) => break,
            }
        }
        while queue.len() < max_batch {
            match receiver.try_recv() {
                Ok(cmd) => queue.push_back(cmd),
                Err(_) => break,
            }
        }
        commit_group(&conn, &mut queue, max_batch);
    }
    // Stop the checkpointer (removing the hook drops its channel), so that
    // this connection closes last: closing the last connection checkpoints
    // the WAL into the main file and removes it.
    let _ = conn.wal_hook(None::<WalHook>);
    let _ = checkpointer.join();
    let _ = conn.close();
}

fn write_head(conn: &Connection, head: &ChainHead) -> Result<(), StoreError> {
    let changed = conn
        .prepare_cached("UPDATE audit_head SET seq = ?1, hash = ?2 WHERE id = 1")
        .store()?
        .execute(rusqlite::params![
            crate::codec::seq_to_sql(head.seq)?,
            head.hash.0
        ])
        .store()?;
    if changed != 1 {
        return Err(crate::error::corrupt(
            "audit head",
            "the head row is missing",
        ));
    }
    Ok(())
}

/// Run up to `max_batch` queued commands in one transaction and answer
/// them. Commands not reached (the transaction broke first) stay queued.
fn commit_group(conn: &Connection, queue: &mut VecDeque<Box<dyn Command>>, max_batch: usize) {
    let n = queue.len().min(max_batch);
    let start = exec_cached(conn, "BEGIN IMMEDIATE")
        .map_err(map)
        .and_then(|()| crate::audit::read_head(conn));
    let head = match start {
        Ok(head) => head,
        Err(e) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            let e = Arc::new(e);
            for cmd in queue.drain(..n) {
                cmd.fail(StoreError::fan_out(&e));
            }
            return;
        }
    };
    let mut tx = Tx {
        conn,
        head,
        broken: None,
    };
    let mut answers = Vec::with_capacity(n);
    for _ in 0..n {
        let Some(cmd) = queue.pop_front() else { break };
        answers.push(cmd.run(&mut tx));
        if tx.broken.is_some() {
            break;
        }
    }
    let outcome = match tx.broken.take() {
        Some(e) => Err(e),
        None => {
            let moved = if tx.head == head {
                Ok(())
            } else {
                write_head(conn, &tx.head)
            };
            moved
                .and_then(|()| exec_cached(conn, "COMMIT").map_err(map))
                .map_err(Arc::new)
        }
    };
    if outcome.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    for answer in answers {
        answer.send(outcome.as_ref().map(|_| ()));
    }
}
