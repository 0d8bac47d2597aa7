//! The group-commit writers: tasks that each own a dedicated connection
//! and commit queued jobs in groups, one head-lock acquisition per group.
//!
//! Every appending operation is a job sent over a channel: a closure over
//! the group transaction that runs the operation's statements and returns
//! its value, its audit drafts and its change record ([`Done`]). A writer
//! takes every job queued (up to `max_batch`), `BEGIN`s, runs each job in
//! its own `SAVEPOINT` (a job that fails rolls back alone, its statements
//! and its audit drafts together; a job that runs no statement, the record
//! of a resolve or of a denial, needs none), with the `audit_head` row
//! lock taken once (first, before any job's rows, when the group runs
//! statements: see `Tx::lock_head`), records the group's changes, seals all its drafts after
//! the head and inserts them in one statement pipelined with the `COMMIT`,
//! and only then answers each job. So:
//!
//! - every acknowledgement follows a durable `COMMIT`;
//! - the head lock is taken once per group, however many decisions the
//!   group holds: for the whole group when it runs statements; in a group
//!   of records only, for its one statement and the commit flush, never
//!   across a round trip (see below);
//! - a lost transaction (the connection dropped, a failed `COMMIT`)
//!   answers every job of the group with the error: none is acknowledged.
//!   (As for any commit, a connection lost *during* `COMMIT` leaves the
//!   outcome unknown to the callers: all of the group or none of it.)
//!
//! Each group runs on a task of its own: a job that panics (an `AuditFn`
//! is caller code) loses its group's connection, which rolls the group
//! back; its callers get an error and the writer carries on with a new
//! connection. A broken connection is replaced before the next group.
//!
//! Consecutive memory puts of a group run in waves (see [`run_segment`]):
//! the first put of each owner, then the second of each owner that has
//! one, and so on. A wave's puts have distinct owners, so none reads a row
//! or a usage another writes: their reads go out together in one round
//! trip (one savepoint for the wave), their row changes in another, where
//! one at a time costs two round trips each. If one of the wave's
//! statements fails, the wave rolls back to its savepoint and each of its
//! puts runs alone in its own, as any other job; a put whose conditional
//! change lost a race (another transaction changed the row after the wave
//! read it) is decided again alone.
//!
//! A group of puts only goes further ([`pipelined_puts`]): no savepoint,
//! the head lock with the first wave's reads, each wave's row changes with
//! the next wave's reads, and the last wave's changes with the audit
//! insert and the `COMMIT`, so one wave takes two round trips after
//! `BEGIN` and holds the lock for one and the flush. Each change must
//! change its row; if the server refuses any statement, nothing of the
//! group was committed and it runs again as above. A failure without the
//! server's answer (a lost connection, a failed `COMMIT`) answers every put
//! with the error and is never run again: the group may have committed.
//!
//! A group of records only is sealed after the head the store's writers
//! predict ([`HeadHint`]: the head after the last group any of them sent)
//! and sent in one round trip as one statement, its own transaction: an
//! insert that happens only if it moves the head from the predicted one
//! (`tx::append_predicted`). Consecutive groups of one store chain on one
//! another without a round trip between them: the next waits on the head
//! row for the previous one's commit and then finds its prediction right.
//! A prediction another store made wrong (or a group before it that
//! failed) inserts nothing, and the group is sent again to be sealed inside
//! the database (`tx::append_sealed`): one statement, its own transaction,
//! that locks the head row, gives each entry its position and hash there
//! and moves the head, so the lock is held for that statement and its
//! commit, never across a round trip, whatever the other servers do. The
//! prediction is only ever a hint: the conditional update is what keeps
//! the chain one chain. (A lone server's predictions hold, and the
//! database hashes nothing; sealing every group in the database instead
//! cost one server about a sixth of its resolves on loopback, the
//! database's CPU, in `BENCHMARKS.md`.)
//!
//! Jobs are routed to a writer by a key (the record's owner, the run, the
//! session...), so jobs that lock the same rows queue behind one another in
//! one writer rather than wait on another writer's open group; records
//! only (no key) all go to the first writer, so that its groups follow
//! one another and each is sealed on the head the one before left.

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_postgres::Config;
use warden_core::audit::{AuditDraft, ChainHead};
use warden_store::{PutAuditFn, PutOutcome, StoreError};

use crate::memory::{Batched, PutJob, RowWrite, decide_read, push_reads, put_many};
use crate::pool::{self, Conn, Flight, Stmt, Tx};
use crate::sql;
use crate::tx::{ChangeRec, Predicted, Sealed, head_out, missing_head, record_key};

/// What a job leaves: its value, its audit drafts, its change record.
pub(crate) struct Done<R> {
    pub(crate) value: R,
    pub(crate) drafts: Vec<AuditDraft>,
    pub(crate) change: Option<ChangeRec>,
}

impl<R> Done<R> {
    pub(crate) fn new(value: R, drafts: Vec<AuditDraft>, change: Option<ChangeRec>) -> Self {
        Self {
            value,
            drafts,
            change,
        }
    }
}

/// The future of a job over the group transaction.
pub(crate) type JobFuture<'a, R> =
    Pin<Box<dyn Future<Output = Result<Done<R>, StoreError>> + Send + 'a>>;

/// Which writer takes a job.
#[derive(Clone, Copy)]
pub(crate) enum Route<'k> {
    /// The writer of records only: one, so that its groups, one after the
    /// other, are each sealed on the head the one before left (see
    /// [`HeadHint`]).
    Audit,
    /// The writer of this key: jobs on the same rows share it.
    Key(&'k str),
}

type Effects = Option<(Vec<AuditDraft>, Option<ChangeRec>)>;

/// A job that ran: its effects (none when it failed and was rolled back)
/// and how to answer once the group's fate is known.
struct Ran {
    effects: Effects,
    answer: Box<dyn Answer>,
}

/// A queued job, type-erased.
trait Job: Send {
    /// Whether it runs statements (and so needs a savepoint).
    fn statements(&self) -> bool;
    fn run<'a>(
        self: Box<Self>,
        tx: &'a mut Tx<'_>,
    ) -> Pin<Box<dyn Future<Output = Ran> + Send + 'a>>;
    /// Answer without running.
    fn fail(self: Box<Self>, err: StoreError);
    /// For a job that runs no statement: its effects and answer, without
    /// a transaction. Any other job is handed back.
    fn audit_only(self: Box<Self>) -> Result<Ran, Box<dyn Job>>;
    /// The owner of a put, which may run together with the puts of other
    /// owners queued next to it (see [`run_segment`]).
    fn put_owner(&self) -> Option<&str> {
        None
    }
    /// The put this job is; any other job is handed back.
    fn into_put(self: Box<Self>) -> Result<PutOp, Box<dyn Job>>;
}

type Reply<R> = oneshot::Sender<Result<(R, ChainHead), StoreError>>;

/// The answer of a job that ran, held until the group commits.
trait Answer: Send {
    /// `commit` is the group's outcome: the head after this job's drafts.
    fn send(self: Box<Self>, commit: Result<ChainHead, &Arc<StoreError>>);
}

struct Pending<R> {
    result: Result<R, StoreError>,
    reply: Reply<R>,
}

impl<R: Send> Answer for Pending<R> {
    fn send(self: Box<Self>, commit: Result<ChainHead, &Arc<StoreError>>) {
        let result = match (self.result, commit) {
            (Ok(r), Ok(head)) => Ok((r, head)),
            (Ok(_), Err(e)) => Err(StoreError::fan_out(e)),
            (Err(e), _) => Err(e),
        };
        // The caller may have gone away; the outcome stands regardless.
        let _ = self.reply.send(result);
    }
}

struct Op<F, R> {
    f: F,
    reply: Reply<R>,
}

/// A job that only appends audit entries.
struct AuditOnly {
    drafts: Vec<AuditDraft>,
    reply: Reply<()>,
}

impl AuditOnly {
    fn ran(self) -> Ran {
        Ran {
            effects: Some((self.drafts, None)),
            answer: Box::new(Pending {
                result: Ok(()),
                reply: self.reply,
            }),
        }
    }
}

impl Job for AuditOnly {
    fn statements(&self) -> bool {
        false
    }

    fn run<'a>(
        self: Box<Self>,
        _: &'a mut Tx<'_>,
    ) -> Pin<Box<dyn Future<Output = Ran> + Send + 'a>> {
        Box::pin(std::future::ready(self.ran()))
    }

    fn fail(self: Box<Self>, err: StoreError) {
        let _ = self.reply.send(Err(err));
    }

    fn audit_only(self: Box<Self>) -> Result<Ran, Box<dyn Job>> {
        Ok(self.ran())
    }

    fn into_put(self: Box<Self>) -> Result<PutOp, Box<dyn Job>> {
        Err(self)
    }
}

impl<F, R> Job for Op<F, R>
where
    F: for<'a, 'c> FnOnce(&'a mut Tx<'c>) -> JobFuture<'a, R> + Send + 'static,
    R: Send + 'static,
{
    fn statements(&self) -> bool {
        true
    }

    fn run<'a>(
        self: Box<Self>,
        tx: &'a mut Tx<'_>,
    ) -> Pin<Box<dyn Future<Output = Ran> + Send + 'a>> {
        let Op { f, reply, .. } = *self;
        Box::pin(async move {
            match f(tx).await {
                Ok(done) => Ran {
                    effects: Some((done.drafts, done.change)),
                    answer: Box::new(Pending {
                        result: Ok(done.value),
                        reply,
                    }),
                },
                Err(e) => Ran {
                    effects: None,
                    answer: Box::new(Pending {
                        result: Err(e),
                        reply,
                    }),
                },
            }
        })
    }

    fn fail(self: Box<Self>, err: StoreError) {
        let _ = self.reply.send(Err(err));
    }

    fn audit_only(self: Box<Self>) -> Result<Ran, Box<dyn Job>> {
        Err(self)
    }

    fn into_put(self: Box<Self>) -> Result<PutOp, Box<dyn Job>> {
        Err(self)
    }
}

/// A memory put: a job of its own kind, so that a writer can decide a run
/// of puts of distinct owners together (see [`run_puts`]).
pub(crate) struct PutOp {
    job: PutJob,
    audit: PutAuditFn,
    reply: Reply<PutOutcome>,
}

impl PutOp {
    /// The job's audit drafts and its answer, once its outcome is known.
    fn decided(self, result: Result<PutOutcome, StoreError>) -> Ran {
        let PutOp { audit, reply, .. } = self;
        match result {
            Ok(outcome) => Ran {
                effects: Some((audit(&outcome), None)),
                answer: Box::new(Pending {
                    result: Ok(outcome),
                    reply,
                }),
            },
            Err(e) => Ran {
                effects: None,
                answer: Box::new(Pending {
                    result: Err(e),
                    reply,
                }),
            },
        }
    }
}

impl Job for PutOp {
    fn statements(&self) -> bool {
        true
    }

    fn run<'a>(
        self: Box<Self>,
        tx: &'a mut Tx<'_>,
    ) -> Pin<Box<dyn Future<Output = Ran> + Send + 'a>> {
        Box::pin(async move {
            let result = self.job.run_alone(tx).await;
            self.decided(result)
        })
    }

    fn fail(self: Box<Self>, err: StoreError) {
        let _ = self.reply.send(Err(err));
    }

    fn audit_only(self: Box<Self>) -> Result<Ran, Box<dyn Job>> {
        Err(self)
    }

    fn put_owner(&self) -> Option<&str> {
        Some(self.job.owner())
    }

    fn into_put(self: Box<Self>) -> Result<PutOp, Box<dyn Job>> {
        Ok(*self)
    }
}

/// The writers of one store; dropping it stops them once they have
/// answered every queued job.
pub(crate) struct Writers {
    senders: Vec<mpsc::UnboundedSender<Box<dyn Job>>>,
}

/// The head this store's writers expect the chain to have once the groups
/// they have sent commit: where the next audit-only group is sealed (see
/// [`crate::tx::append_predicted`]). Only a hint: a group sealed after a
/// head that has moved writes nothing and is sealed again inside the
/// database ([`crate::tx::append_sealed`]), and every group that learns
/// the head (sealed there, or under the lock of a group with statements)
/// sets it.
///
/// When other servers append too, predictions miss, and each miss costs a
/// round trip that wrote nothing. After a miss the writers stop predicting
/// for a while (1, 3, 7... up to 63 groups after consecutive misses, reset
/// by a prediction that holds), so a busy deployment costs the sealed
/// append's one round trip, not two, and a lone server predicts on.
#[derive(Default)]
struct HeadHint(std::sync::Mutex<HintState>);

#[derive(Default)]
struct HintState {
    head: Option<ChainHead>,
    /// Groups to append under the lock before predicting again.
    skip: u32,
    /// The length of the last pause (doubling with each miss).
    backoff: u32,
}

/// The longest pause after consecutive misses, in groups.
const MAX_BACKOFF: u32 = 63;

impl HeadHint {
    fn lock(&self) -> std::sync::MutexGuard<'_, HintState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set(&self, head: Option<ChainHead>) {
        self.lock().head = head;
    }

    /// Seal `drafts` for the next group: after the predicted head (which
    /// moves past them at once), or `None` when there is no prediction or
    /// predictions are paused.
    fn predict(
        &self,
        drafts: &[AuditDraft],
    ) -> Result<Option<(ChainHead, crate::tx::Sealed)>, StoreError> {
        let mut state = self.lock();
        if state.skip > 0 {
            state.skip -= 1;
            return Ok(None);
        }
        let Some(head) = state.head else {
            return Ok(None);
        };
        let sealed = crate::tx::Sealed::new(head, drafts)?;
        state.head = Some(sealed.last(head));
        Ok(Some((head, sealed)))
    }

    /// A prediction held.
    fn held(&self) {
        self.lock().backoff = 0;
    }

    /// A prediction missed: forget the head and pause.
    fn missed(&self) {
        let mut state = self.lock();
        state.head = None;
        state.backoff = (state.backoff * 2 + 1).min(MAX_BACKOFF);
        state.skip = state.backoff;
    }
}

/// What a writer needs to (re)connect and to record changes.
#[derive(Clone)]
pub(crate) struct WriterConfig {
    pub(crate) config: Config,
    pub(crate) setup: String,
    pub(crate) channel: String,
    pub(crate) max_batch: usize,
}

impl Writers {
    /// Start `count` writers (at least one) on a thread of their own (see
    /// [`crate::dedicated`]), which ends once every writer has: once the
    /// [`Writers`] is dropped and they have answered what was queued.
    pub(crate) fn spawn(count: usize, config: WriterConfig) -> Result<Self, StoreError> {
        let hint = Arc::new(HeadHint::default());
        let mut writers = Vec::new();
        let senders = (0..count.max(1))
            .map(|_| {
                let (sender, receiver) = mpsc::unbounded_channel();
                writers.push(run(config.clone(), Arc::clone(&hint), receiver));
                sender
            })
            .collect();
        crate::dedicated::spawn("warden-writer", async move {
            let running: Vec<_> = writers.into_iter().map(tokio::spawn).collect();
            for writer in running {
                // A job's panic is caught per group (see `run`): nothing
                // is left to answer here.
                let _ = writer.await;
            }
        })?;
        Ok(Self { senders })
    }

    fn sender(&self, route: Route<'_>) -> Option<&mpsc::UnboundedSender<Box<dyn Job>>> {
        let n = self.senders.len();
        let i = match route {
            Route::Audit => 0,
            Route::Key(key) => {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                key.hash(&mut h);
                (h.finish() % n as u64) as usize
            }
        };
        self.senders.get(i)
    }

    async fn submit<R: Send + 'static>(
        &self,
        route: Route<'_>,
        job: Box<dyn Job>,
        answer: oneshot::Receiver<Result<(R, ChainHead), StoreError>>,
    ) -> Result<(R, ChainHead), StoreError> {
        let stopped = || StoreError::backend("the postgres writer has stopped");
        self.sender(route)
            .ok_or_else(stopped)?
            .send(job)
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| {
            StoreError::backend(
                "a storage job panicked or its writer stopped; its group was rolled back",
            )
        })?
    }

    /// Run `f` in a writer's group transaction; resolves once the group
    /// that holds it has committed (or failed).
    pub(crate) async fn write<R, F>(&self, route: Route<'_>, f: F) -> Result<R, StoreError>
    where
        F: for<'a, 'c> FnOnce(&'a mut Tx<'c>) -> JobFuture<'a, R> + Send + 'static,
        R: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        Ok(self
            .submit(route, Box::new(Op { f, reply }), answer)
            .await?
            .0)
    }

    /// Decide and write a memory put in the owner's writer's next group.
    pub(crate) async fn put(
        &self,
        job: PutJob,
        audit: PutAuditFn,
    ) -> Result<PutOutcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        let owner = job.owner().to_owned();
        let op = PutOp { job, audit, reply };
        Ok(self
            .submit(Route::Key(&owner), Box::new(op), answer)
            .await?
            .0)
    }

    /// Append `drafts` (no statement of their own) with the next group;
    /// returns the head after them.
    pub(crate) async fn append(&self, drafts: Vec<AuditDraft>) -> Result<ChainHead, StoreError> {
        let (reply, answer) = oneshot::channel();
        let (_, head) = self
            .submit(Route::Audit, Box::new(AuditOnly { drafts, reply }), answer)
            .await?;
        Ok(head)
    }
}

/// One writer: takes what is queued, commits it as one group, repeats.
async fn run(
    config: WriterConfig,
    hint: Arc<HeadHint>,
    mut receiver: mpsc::UnboundedReceiver<Box<dyn Job>>,
) {
    let max_batch = config.max_batch.max(1);
    let config = Arc::new(config);
    let mut conn: Option<Conn> = None;
    let mut jobs: Vec<Box<dyn Job>> = Vec::with_capacity(max_batch);
    while let Some(job) = receiver.recv().await {
        jobs.push(job);
        while jobs.len() < max_batch {
            match receiver.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let group = std::mem::replace(&mut jobs, Vec::with_capacity(max_batch));
        let c = match conn.take() {
            Some(c) if c.is_usable() => c,
            stale => {
                if let Some(c) = stale {
                    pool::discard(c);
                }
                match Conn::open(&config.config, &config.setup).await {
                    Ok(c) => c,
                    Err(e) => {
                        let e = Arc::new(e);
                        for job in group {
                            job.fail(StoreError::fan_out(&e));
                        }
                        continue;
                    }
                }
            }
        };
        let config = Arc::clone(&config);
        let group_hint = Arc::clone(&hint);
        // A panic in a job ends this task, dropping the connection (the
        // database rolls the group back) and the group's replies.
        match tokio::spawn(
            async move { commit_group(c, group, &config.channel, &group_hint).await },
        )
        .await
        {
            Ok(c) => conn = Some(c),
            Err(_) => hint.set(None),
        }
    }
}

/// Run `jobs` in one transaction on `conn` and answer them.
async fn commit_group(
    mut conn: Conn,
    jobs: Vec<Box<dyn Job>>,
    channel: &str,
    hint: &HeadHint,
) -> Conn {
    run_group(&mut conn, jobs, channel, hint).await;
    conn
}

async fn run_group(conn: &mut Conn, jobs: Vec<Box<dyn Job>>, channel: &str, hint: &HeadHint) {
    if jobs.iter().all(|j| !j.statements()) {
        return audit_group(conn, jobs, hint).await;
    }
    let jobs = if jobs.iter().all(|j| j.put_owner().is_some()) {
        match put_group(conn, jobs, hint).await {
            Some(again) => again,
            None => return,
        }
    } else {
        jobs
    };
    let mut tx = match conn.begin().await {
        Ok(tx) => tx,
        Err(e) => {
            let e = Arc::new(e);
            for job in jobs {
                job.fail(StoreError::fan_out(&e));
            }
            return;
        }
    };
    // The head lock first, sent with the first statement: see
    // `Tx::lock_head`.
    if let Err(e) = tx.lock_head().await {
        drop(tx);
        let e = Arc::new(e);
        for job in jobs {
            job.fail(StoreError::fan_out(&e));
        }
        return;
    }
    let mut done = Group {
        answers: Vec::with_capacity(jobs.len()),
        drafts: Vec::new(),
        changes: Vec::new(),
    };
    let mut broken: Option<StoreError> = None;
    let mut unrun: Vec<Box<dyn Job>> = Vec::new();
    let mut queue = jobs.into_iter().peekable();
    while let Some(job) = queue.next() {
        let ran = match job.into_put() {
            Ok(first) => {
                // The puts queued next to it, up to the first job of
                // another kind.
                let mut segment = vec![first];
                while let Some(next) = queue.next_if(|j| j.put_owner().is_some()) {
                    match next.into_put() {
                        Ok(op) => segment.push(op),
                        Err(job) => {
                            job.fail(StoreError::backend("a job named an owner and was no put"))
                        }
                    }
                }
                run_segment(&mut tx, segment, &mut done).await
            }
            Err(job) => run_one(&mut tx, job, &mut done).await,
        };
        if let Err(b) = ran {
            broken = Some(b.error);
            unrun = b.unrun;
            break;
        }
    }
    let Group {
        answers,
        drafts,
        changes,
    } = done;
    let outcome = match broken {
        Some(e) => {
            drop(tx);
            Err(Arc::new(e))
        }
        None => tx
            .seal_and_commit(drafts, changes, channel)
            .await
            .map_err(Arc::new),
    };
    hint.set(match &outcome {
        Ok((base, heads)) => Some(heads.last().copied().unwrap_or(*base)),
        Err(_) => None,
    });
    for (answer, end) in answers {
        answer.send(match &outcome {
            Ok((base, heads)) => Ok(end
                .checked_sub(1)
                .and_then(|i| heads.get(i).copied())
                .unwrap_or(*base)),
            Err(e) => Err(e),
        });
    }
    if let Err(e) = &outcome {
        for job in unrun.into_iter().chain(queue) {
            job.fail(StoreError::fan_out(e));
        }
    }
}

/// What a group's jobs have left so far: each answer with the number of
/// drafts up to and including its own, the drafts, the changes.
struct Group {
    answers: Vec<(Box<dyn Answer>, usize)>,
    drafts: Vec<AuditDraft>,
    changes: Vec<ChangeRec>,
}

impl Group {
    fn push(&mut self, ran: Ran) {
        if let Some((d, c)) = ran.effects {
            self.drafts.extend(d);
            self.changes.extend(c);
        }
        self.answers.push((ran.answer, self.drafts.len()));
    }
}

/// The group's transaction was lost: its error, and the jobs taken from
/// the queue that neither ran nor were answered.
struct Broken {
    error: StoreError,
    unrun: Vec<Box<dyn Job>>,
}

impl From<StoreError> for Broken {
    fn from(error: StoreError) -> Self {
        Self {
            error,
            unrun: Vec::new(),
        }
    }
}

/// Run one job in its own savepoint (when it runs statements): one that
/// fails rolls back alone, its statements and its drafts together.
async fn run_one(tx: &mut Tx<'_>, job: Box<dyn Job>, done: &mut Group) -> Result<(), Broken> {
    let savepoint = job.statements();
    if savepoint {
        // Sent with the job's first statement.
        tx.savepoint("SAVEPOINT job");
    }
    let ran = job.run(tx).await;
    let failed = ran.effects.is_none();
    done.push(ran);
    if failed && savepoint {
        // A savepoint that failed (a lost transaction) fails its job's
        // first statement and then the rollback to it: the group is lost.
        tx.rollback_to("ROLLBACK TO SAVEPOINT job").await?;
    }
    Ok(())
}

/// Run consecutive puts in waves: the first put of each owner, then the
/// second of each owner that has one, and so on. A wave's puts have
/// distinct owners and run together ([`run_puts`]); an owner's puts keep
/// their order, each seeing the one before, and puts of different owners,
/// independent of each other, are recorded in wave order.
async fn run_segment(tx: &mut Tx<'_>, segment: Vec<PutOp>, done: &mut Group) -> Result<(), Broken> {
    let mut waves: Vec<Vec<PutOp>> = Vec::new();
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for op in segment {
        let n = seen.entry(op.job.owner().to_owned()).or_insert(0);
        let wave = *n;
        *n += 1;
        if wave == waves.len() {
            waves.push(Vec::new());
        }
        if let Some(w) = waves.get_mut(wave) {
            w.push(op);
        }
    }
    let mut waves = waves.into_iter();
    while let Some(wave) = waves.next() {
        if let Err(mut b) = run_puts(tx, wave, done).await {
            b.unrun
                .extend(waves.flatten().map(|op| Box::new(op) as Box<dyn Job>));
            return Err(b);
        }
    }
    Ok(())
}

/// Run puts of distinct owners together, in one savepoint: their reads in
/// one round trip, their row changes in another ([`put_many`]). A put
/// whose conditional change lost a race runs again alone. If a statement
/// fails, the run is rolled back to its savepoint and every put runs
/// alone, each in its own savepoint, as any other job: a put that fails
/// then fails alone.
async fn run_puts(tx: &mut Tx<'_>, mut run: Vec<PutOp>, done: &mut Group) -> Result<(), Broken> {
    if run.len() == 1 {
        let op = run.pop().map(|op| Box::new(op) as Box<dyn Job>);
        return match op {
            Some(op) => run_one(tx, op, done).await,
            None => Ok(()),
        };
    }
    tx.savepoint("SAVEPOINT puts");
    let jobs: Vec<&PutJob> = run.iter().map(|op| &op.job).collect();
    let batched = put_many(tx, &jobs).await;
    let alone = match batched {
        Ok(batched) => {
            let mut again = Vec::new();
            for (op, b) in run.into_iter().zip(batched) {
                match b {
                    Batched::Decided(outcome) => done.push(op.decided(Ok(outcome))),
                    Batched::Failed(e) => done.push(op.decided(Err(e))),
                    Batched::Again => again.push(op),
                }
            }
            again
        }
        Err(_) => {
            if let Err(error) = tx.rollback_to("ROLLBACK TO SAVEPOINT puts").await {
                return Err(Broken {
                    error,
                    unrun: run
                        .into_iter()
                        .map(|op| Box::new(op) as Box<dyn Job>)
                        .collect(),
                });
            }
            run
        }
    };
    let mut alone = alone.into_iter();
    while let Some(op) = alone.next() {
        if let Err(mut b) = run_one(tx, Box::new(op), done).await {
            b.unrun.extend(alone.map(|op| Box::new(op) as Box<dyn Job>));
            return Err(b);
        }
    }
    Ok(())
}

/// A group of puts only, pipelined ([`pipelined_puts`]) and answered;
/// when the server refused one of its statements (nothing was committed),
/// its jobs are handed back to run the careful way, each put in its own
/// savepoint.
async fn put_group(
    conn: &mut Conn,
    jobs: Vec<Box<dyn Job>>,
    hint: &HeadHint,
) -> Option<Vec<Box<dyn Job>>> {
    let mut ops = Vec::with_capacity(jobs.len());
    for job in jobs {
        match job.into_put() {
            Ok(op) => ops.push(op),
            Err(job) => job.fail(StoreError::backend("a job named an owner and was no put")),
        }
    }
    match pipelined_puts(conn, &ops).await {
        Flight::Answered(done) => {
            let PutsDone {
                results,
                base,
                heads,
            } = done;
            hint.set(Some(heads.last().copied().unwrap_or(base)));
            for (op, (result, end)) in ops.into_iter().zip(results) {
                let head = end
                    .checked_sub(1)
                    .and_then(|i| heads.get(i).copied())
                    .unwrap_or(base);
                // The caller may have gone away; the outcome stands.
                let _ = op.reply.send(result.map(|outcome| (outcome, head)));
            }
            None
        }
        Flight::Refused(_) => Some(
            ops.into_iter()
                .map(|op| Box::new(op) as Box<dyn Job>)
                .collect(),
        ),
        Flight::Unknown(e) => {
            hint.set(None);
            let e = Arc::new(e);
            for op in ops {
                Box::new(op).fail(StoreError::fan_out(&e));
            }
            None
        }
    }
}

/// What a committed group of puts decided: for each put, in the order
/// given, its outcome (or the error it alone failed with) and the number
/// of the group's drafts up to and including its own; the head before the
/// group's drafts and after each.
struct PutsDone {
    results: Vec<(Result<PutOutcome, StoreError>, usize)>,
    base: ChainHead,
    heads: Vec<ChainHead>,
}

/// Decide and commit puts in waves (as [`run_segment`]), every statement
/// pipelined, no savepoint: the head lock with the first wave's reads,
/// each wave's row changes with the next wave's reads, and the last
/// wave's row changes with the group's audit entries and the `COMMIT`. A
/// group of one wave takes two round trips after its `BEGIN`, and holds
/// the head lock for one and the commit's flush, where a savepoint per
/// wave and a round trip for its reads, its changes and the commit hold
/// it for three.
///
/// Every row change must change its row ([`RowWrite::sql_one`]): one that
/// lost a race, like any statement the server refuses, rolls the group
/// back (`Flight::Refused`), and the caller runs it again the careful way,
/// where a put that fails fails alone. A put's audit entries are drafted
/// before its change is known to have been made, which is why a put's
/// audit may be called once per attempt ([`PutAuditFn`]).
async fn pipelined_puts(conn: &mut Conn, ops: &[PutOp]) -> Flight<PutsDone> {
    if let Err(e) = conn
        .prepare(&[
            sql::LOCK_HEAD,
            sql::QUOTA_LOCK,
            sql::OWNER_USAGE,
            sql::SELECT_RECORD,
            sql::INSERT_RECORD_ONE,
            sql::UPDATE_RECORD_ONE,
            sql::APPEND,
        ])
        .await
    {
        return Flight::Unknown(e);
    }
    let mut tx = match conn.begin().await {
        Ok(tx) => tx,
        Err(e) => return Flight::Unknown(e),
    };
    if let Err(e) = tx.lock_head().await {
        return Flight::Unknown(e);
    }
    let keys: Vec<[&str; 3]> = ops
        .iter()
        .map(|op| record_key(&op.job.put.owner, &op.job.put.namespace, &op.job.put.key))
        .collect();
    let mut results: Vec<Option<Result<PutOutcome, StoreError>>> =
        ops.iter().map(|_| None).collect();
    let mut order: Vec<usize> = Vec::with_capacity(ops.len());
    let mut writes: Vec<RowWrite<'_>> = Vec::new();
    for wave in waves(ops.iter().map(|op| op.job.owner())) {
        let rows = {
            let mut stmts: Vec<Stmt<'_>> =
                writes.iter().map(|w| (w.sql_one(), w.params())).collect();
            let changes = stmts.len();
            for &i in &wave {
                if let (Some(op), Some(key)) = (ops.get(i), keys.get(i)) {
                    push_reads(&mut stmts, &op.job, key);
                }
            }
            match tx.flight(&stmts).await {
                Flight::Answered(rows) => rows.into_iter().skip(changes),
                Flight::Refused(e) => return Flight::Refused(e),
                Flight::Unknown(e) => return Flight::Unknown(e),
            }
        };
        let mut rows = rows;
        writes.clear();
        for &i in &wave {
            let (Some(op), Some(slot)) = (ops.get(i), results.get_mut(i)) else {
                continue;
            };
            match decide_read(&op.job, &mut rows) {
                Ok(Ok((outcome, write))) => {
                    writes.extend(write);
                    *slot = Some(Ok(outcome));
                }
                Ok(Err(e)) => *slot = Some(Err(e)),
                // An answer missing from the flight: the transaction is
                // dropped (rolled back), nothing is acknowledged.
                Err(e) => return Flight::Unknown(e),
            }
            order.push(i);
        }
    }
    let row = match tx.locked_row().await {
        Ok(Some(row)) => row,
        Ok(None) => return Flight::Unknown(missing_head()),
        Err(e) => return Flight::Unknown(e),
    };
    let base = match head_out(&row) {
        Ok(head) => head,
        Err(e) => return Flight::Unknown(e),
    };
    let mut drafts = Vec::new();
    let mut ends = vec![0; ops.len()];
    for &i in &order {
        if let (Some(op), Some(Some(Ok(outcome)))) = (ops.get(i), results.get(i)) {
            drafts.extend((op.audit)(outcome));
        }
        if let Some(end) = ends.get_mut(i) {
            *end = drafts.len();
        }
    }
    let sealed = match drafts.is_empty() {
        true => None,
        // Nothing was committed: the transaction is dropped, and the
        // careful way meets the same error for the jobs alone.
        false => match Sealed::new(base, &drafts) {
            Ok(sealed) => Some(sealed),
            Err(e) => return Flight::Refused(e),
        },
    };
    let mut stmts: Vec<Stmt<'_>> = writes.iter().map(|w| (w.sql_one(), w.params())).collect();
    if let Some(sealed) = &sealed {
        stmts.push((sql::APPEND, sealed.params().to_vec()));
    }
    tx.flight_commit(&stmts).await.map(|_| PutsDone {
        results: results
            .into_iter()
            .zip(ends)
            .map(|(result, end)| {
                let result = result
                    .unwrap_or_else(|| Err(StoreError::backend("a put of the group was not run")));
                (result, end)
            })
            .collect(),
        base,
        heads: sealed.map(|s| s.heads).unwrap_or_default(),
    })
}

/// The waves of a run of puts whose owners are `owners`: the positions of
/// each owner's first put, then of each owner's second, and so on.
fn waves<'a>(owners: impl Iterator<Item = &'a str>) -> Vec<Vec<usize>> {
    let mut waves: Vec<Vec<usize>> = Vec::new();
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, owner) in owners.enumerate() {
        let n = seen.entry(owner).or_insert(0);
        if *n == waves.len() {
            waves.push(Vec::new());
        }
        if let Some(w) = waves.get_mut(*n) {
            w.push(i);
        }
        *n += 1;
    }
    waves
}

/// A group of audit-only jobs: one round trip, on the predicted head (see
/// [`HeadHint`]) or sealed inside the database.
async fn audit_group(conn: &mut Conn, jobs: Vec<Box<dyn Job>>, hint: &HeadHint) {
    let mut answers = Vec::with_capacity(jobs.len());
    let mut drafts = Vec::new();
    for job in jobs {
        match job.audit_only() {
            Ok(ran) => {
                if let Some((d, _)) = ran.effects {
                    drafts.extend(d);
                }
                answers.push((ran.answer, drafts.len()));
            }
            Err(job) => job.fail(StoreError::backend("a write was queued as an audit record")),
        }
    }
    let outcome = append_audit(conn, &drafts, hint).await.map_err(Arc::new);
    for (answer, end) in answers {
        answer.send(match &outcome {
            Ok((base, heads)) => Ok(end
                .checked_sub(1)
                .and_then(|i| heads.get(i).copied())
                .unwrap_or(*base)),
            Err(e) => Err(e),
        });
    }
}

/// Append an audit-only group's `drafts`: sealed after the hinted head in
/// one round trip when there is a hint (which moves past them at once, so
/// the next group, on any writer, is sealed after them while they commit),
/// sealed inside the database, also in one round trip, when there is none
/// or it was wrong. Returns the head before and after each draft.
async fn append_audit(
    conn: &mut Conn,
    drafts: &[AuditDraft],
    hint: &HeadHint,
) -> Result<(ChainHead, Vec<ChainHead>), StoreError> {
    if let Some((head, sealed)) = hint.predict(drafts)? {
        match crate::tx::append_predicted(conn, head, sealed).await {
            Ok(Predicted::Appended(heads)) => {
                hint.held();
                return Ok((head, heads));
            }
            Ok(Predicted::Moved) => hint.missed(),
            Err(e) => {
                hint.set(None);
                return Err(e);
            }
        }
    }
    let appended = crate::tx::append_sealed(conn, drafts).await;
    hint.set(match &appended {
        Ok((base, heads)) => Some(heads.last().copied().unwrap_or(*base)),
        Err(_) => None,
    });
    appended
}

#[cfg(test)]
mod tests {
    use warden_core::audit::Digest;
    use warden_core::decision::Verdict;
    use warden_core::time::Timestamp;

    use super::*;

    fn draft() -> AuditDraft {
        AuditDraft {
            time: Timestamp(1),
            subject: "a".into(),
            operation: "memory.read".into(),
            resource: "project.k".into(),
            verdict: Verdict::Allow,
            reason: "visible_from:a".into(),
            policy_version: "v1".into(),
            details: serde_json::Value::Null,
        }
    }

    const START: ChainHead = ChainHead {
        count: 7,
        seq: 7,
        hash: Digest::GENESIS,
    };

    /// Whether the next group is predicted (a prediction is made when
    /// there is one, and it moves the head past the group).
    fn predicts(hint: &HeadHint) -> bool {
        hint.predict(&[draft()]).unwrap().is_some()
    }

    #[test]
    fn predictions_chain_on_and_pause_after_misses() {
        let hint = HeadHint::default();
        assert!(!predicts(&hint), "no head known: no prediction");
        hint.set(Some(START));
        let (head, sealed) = hint.predict(&[draft(), draft()]).unwrap().unwrap();
        assert_eq!(head, START);
        // The next group is sealed after this one's two entries.
        let (next, _) = hint.predict(&[draft()]).unwrap().unwrap();
        assert_eq!(next, sealed.last(head));
        assert_eq!(next.seq, 9);
        // Consecutive misses pause for 1, 3, 7 groups; the appends sealed
        // in the database meanwhile set the head, which is used once the pause is over.
        for pause in [1, 3, 7] {
            hint.missed();
            hint.set(Some(START));
            for _ in 0..pause {
                assert!(!predicts(&hint), "paused for {pause}");
            }
            assert!(predicts(&hint), "predicting again after {pause}");
        }
        // A prediction that held resets the pause to one group.
        hint.held();
        hint.missed();
        hint.set(Some(START));
        assert!(!predicts(&hint));
        assert!(predicts(&hint));
        // The pause never grows past its bound.
        for _ in 0..20 {
            hint.missed();
        }
        hint.set(Some(START));
        for _ in 0..MAX_BACKOFF {
            assert!(!predicts(&hint));
        }
        assert!(predicts(&hint));
    }
}
