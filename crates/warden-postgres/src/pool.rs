//! A small connection pool with a per-connection statement cache.
//!
//! At most `size` connections are open; a caller waits for a free one. A
//! connection is opened on demand, set up once (its `search_path`, durable
//! commits, the idle-in-transaction bound) and returned to the pool when
//! its guard drops, unless it is broken: the driver reports it closed (the
//! database went away, or the connection's TCP timeouts declared it dead),
//! or an operation on it was abandoned half-way (its future dropped, e.g.
//! by the server's request timeout), which leaves an unknown exchange on
//! it. A broken connection is closed, never handed out again. Every
//! statement is prepared once per connection and reused: one round trip
//! per statement instead of two.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::task::AbortHandle;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, GenericClient, IsolationLevel, NoTls, Row, Statement};
use warden_store::StoreError;

use crate::error::DbResult;

/// Parameters of a statement.
pub(crate) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Statements prepared on one connection, by their SQL text, and whether
/// an exchange on the connection is in progress.
#[derive(Default)]
pub(crate) struct StmtCache {
    stmts: HashMap<&'static str, Statement>,
    /// Set while an operation awaits the database, cleared when it has its
    /// answer: still set when the guard drops means it was abandoned.
    in_flight: bool,
}

impl StmtCache {
    async fn get<C: GenericClient + Sync>(
        &mut self,
        client: &C,
        sql: &'static str,
    ) -> Result<Statement, StoreError> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        // Prepared statements belong to the session, not the transaction:
        // one prepared inside a transaction that rolls back stays usable.
        let s = self.exchange(client.prepare(sql)).await?;
        self.stmts.insert(sql, s.clone());
        Ok(s)
    }

    /// Await one exchange with the database, marked in flight meanwhile.
    async fn exchange<T>(
        &mut self,
        f: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, StoreError> {
        self.in_flight = true;
        let result = f.await;
        self.in_flight = false;
        result.db()
    }
}

/// One open connection.
pub(crate) struct Conn {
    client: Client,
    stmts: StmtCache,
    /// The task driving the connection: aborted when a broken connection
    /// is discarded, which closes its socket at once (a dead peer would
    /// otherwise keep it until the operating system gives up).
    driver: Option<AbortHandle>,
}

impl Conn {
    /// A connection opened outside the pool (a one-off reader).
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            stmts: StmtCache::default(),
            driver: None,
        }
    }

    fn driven(client: Client, driver: AbortHandle) -> Self {
        Self {
            driver: Some(driver),
            ..Self::new(client)
        }
    }

    /// Open a connection from `config` and run `setup` on it (the writer's
    /// dedicated connection; the pool opens its own the same way).
    pub(crate) async fn open(config: &Config, setup: &str) -> Result<Self, StoreError> {
        let (client, driver) = connect_driven(config).await?;
        let mut conn = Conn::driven(client, driver);
        // Dropped half-way (the caller gave up), the connection is broken.
        let done = conn.stmts.exchange(conn.client.batch_execute(setup)).await;
        if let Err(e) = done {
            discard(conn);
            return Err(e);
        }
        Ok(conn)
    }

    /// Whether the connection may be used again.
    pub(crate) fn is_usable(&self) -> bool {
        !self.stmts.in_flight && !self.client.is_closed()
    }

    /// Run a statement outside a transaction.
    pub(crate) async fn query(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let stmt = self.stmts.get(&self.client, sql).await?;
        self.stmts.exchange(self.client.query(&stmt, params)).await
    }

    /// Execute `sql` as a transaction of its own (autocommit: the
    /// statement is its transaction, committed when it ends, at the read
    /// committed level the connection setup makes the session's default).
    /// One round trip once the statement is prepared, and one message for
    /// the server where `BEGIN`, the statement and `COMMIT` were three.
    /// Returns the rows `sql` affected; `Ok` only when its commit
    /// succeeded, durable as any commit (see the connection setup). A
    /// statement the server refused leaves no transaction open, so, as
    /// after [`Conn::query`], the connection stays usable unless it was
    /// lost or the exchange abandoned.
    pub(crate) async fn execute_committed(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<u64, StoreError> {
        let stmt = self.stmts.get(&self.client, sql).await?;
        self.stmts
            .exchange(self.client.execute(&stmt, params))
            .await
    }

    /// Prepare `sqls` on this connection (those not prepared yet), outside
    /// any transaction: a [`Tx::flight`] of them then sends each at once.
    pub(crate) async fn prepare(&mut self, sqls: &[&'static str]) -> Result<(), StoreError> {
        for sql in sqls {
            self.stmts.get(&self.client, sql).await?;
        }
        Ok(())
    }

    /// Start a read-committed transaction (the isolation level every write
    /// path is designed for, whatever the server's default).
    pub(crate) async fn begin(&mut self) -> Result<Tx<'_>, StoreError> {
        self.begin_with(IsolationLevel::ReadCommitted, false).await
    }

    /// Start a read-only repeatable-read transaction: one snapshot for
    /// several statements.
    pub(crate) async fn snapshot(&mut self) -> Result<Tx<'_>, StoreError> {
        self.begin_with(IsolationLevel::RepeatableRead, true).await
    }

    async fn begin_with(
        &mut self,
        level: IsolationLevel,
        read_only: bool,
    ) -> Result<Tx<'_>, StoreError> {
        let tx = self
            .stmts
            .exchange(
                self.client
                    .build_transaction()
                    .isolation_level(level)
                    .read_only(read_only)
                    .start(),
            )
            .await?;
        Ok(Tx {
            tx,
            stmts: &mut self.stmts,
            prefix: Prefix::default(),
            head: None,
        })
    }
}

/// A transaction on a pooled connection. Dropping it without
/// [`Tx::commit`] rolls it back.
pub(crate) struct Tx<'c> {
    tx: tokio_postgres::Transaction<'c>,
    stmts: &'c mut StmtCache,
    /// Statements not sent yet: they travel with the next statement.
    prefix: Prefix,
    /// The answer to the head-row lock [`Tx::lock_head`] asked for, once
    /// it was sent.
    head: Option<Result<Option<Row>, tokio_postgres::Error>>,
}

/// What travels with a transaction's next statement, in this order: the
/// row lock ([`Tx::lock_row`]), then a savepoint ([`Tx::savepoint`]).
/// The lock comes first so that rolling back to the savepoint keeps it.
#[derive(Default)]
struct Prefix {
    /// The prepared head-lock statement.
    lock: Option<Statement>,
    /// A `SAVEPOINT` statement.
    savepoint: Option<&'static str>,
}

/// Send `prefix` and then `f`'s statements, pipelined: all are sent before
/// any answer is awaited (a request is sent when its future is first
/// polled, and `join!` polls in order), and run in that order. Returns the
/// answer to the prefix's lock (if one was sent), to its savepoint, and
/// `f`'s output.
async fn with_prefix<T>(
    tx: &tokio_postgres::Transaction<'_>,
    prefix: Prefix,
    f: impl Future<Output = T>,
) -> (
    Option<Result<Option<Row>, tokio_postgres::Error>>,
    Result<(), tokio_postgres::Error>,
    T,
) {
    let Prefix { lock, savepoint } = prefix;
    tokio::join!(
        async {
            match &lock {
                Some(stmt) => Some(tx.query_opt(stmt, &[]).await),
                None => None,
            }
        },
        async {
            match savepoint {
                Some(sql) => tx.batch_execute(sql).await,
                None => Ok(()),
            }
        },
        f
    )
}

/// [`with_prefix`] for a statement's future: the answer to a head lock
/// sent here is left in `head`, whatever became of `f`.
async fn after_prefix<T>(
    tx: &tokio_postgres::Transaction<'_>,
    prefix: Prefix,
    head: &mut Option<Result<Option<Row>, tokio_postgres::Error>>,
    f: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, tokio_postgres::Error> {
    let (locked, saved, result) = with_prefix(tx, prefix, f).await;
    if locked.is_some() {
        *head = locked;
    }
    saved?;
    result
}

/// Await every future, polling them in the order given until all are
/// done. A tokio-postgres request is sent when its future is first
/// polled, so the requests go out in this order, together, and run in
/// this order on the server.
async fn in_order<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (future, out) in pending.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => waiting = true,
                }
            }
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

/// A statement and its parameters.
pub(crate) type Stmt<'a> = (&'static str, Vec<&'a (dyn ToSql + Sync)>);

/// What a flight of pipelined statements ([`Tx::flight`],
/// [`Tx::flight_commit`]) came to.
pub(crate) enum Flight<T> {
    /// Every statement (and the `COMMIT`, if any) succeeded.
    Answered(T),
    /// The server refused a statement: the transaction is aborted, and
    /// rolled back if a `COMMIT` followed; nothing of it is or will be
    /// committed.
    Refused(StoreError),
    /// A statement got no answer from the server (the connection failed):
    /// what the server did with the flight is not known.
    Unknown(StoreError),
}

impl<T> Flight<T> {
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Flight<U> {
        match self {
            Flight::Answered(v) => Flight::Answered(f(v)),
            Flight::Refused(e) => Flight::Refused(e),
            Flight::Unknown(e) => Flight::Unknown(e),
        }
    }
}

/// Classify the answers of a flight, in the order sent: any statement the
/// server refused (an error with an SQLSTATE) aborted the transaction,
/// whatever became of the others; otherwise the first error is one the
/// server did not answer.
fn classify<T>(answers: Vec<Result<T, tokio_postgres::Error>>) -> Flight<Vec<T>> {
    let mut values = Vec::with_capacity(answers.len());
    let mut unanswered = None;
    for answer in answers {
        match answer {
            Ok(v) => values.push(v),
            Err(e) if e.code().is_some() => return Flight::Refused(crate::error::db(e)),
            Err(e) => {
                unanswered.get_or_insert(e);
            }
        }
    }
    match unanswered {
        Some(e) => Flight::Unknown(crate::error::db(e)),
        None => Flight::Answered(values),
    }
}

impl Tx<'_> {
    /// Send the waiting prefix (a row lock; no savepoint) and `stmts`,
    /// pipelined: one round trip. The statements must have been prepared
    /// ([`Conn::prepare`]); one that was not is prepared first.
    pub(crate) async fn flight(&mut self, stmts: &[Stmt<'_>]) -> Flight<Vec<Vec<Row>>> {
        let prepared = match self.prepare_all(stmts).await {
            Ok(p) => p,
            Err(e) => return Flight::Unknown(e),
        };
        let prefix = std::mem::take(&mut self.prefix);
        let tx = &self.tx;
        self.stmts.in_flight = true;
        let (locked, saved, answers) = with_prefix(
            tx,
            prefix,
            in_order(
                prepared
                    .iter()
                    .zip(stmts)
                    .map(|(s, (_, p))| tx.query(s, p.as_slice())),
            ),
        )
        .await;
        self.stmts.in_flight = false;
        let mut head = None;
        let mut prefix = Vec::new();
        if let Some(locked) = locked {
            match locked {
                Ok(row) => head = Some(Ok(row)),
                Err(e) => prefix.push(Err(e)),
            }
        }
        prefix.push(saved.map(|()| Vec::<Row>::new()));
        let flight = match classify(prefix) {
            Flight::Answered(_) => classify(answers),
            other => other.map(|_| Vec::new()),
        };
        if let Some(head) = head {
            self.head = Some(head);
        }
        flight
    }

    /// [`Tx::flight`] of `stmts` followed by `COMMIT`, pipelined: one round
    /// trip for the statements and the commit. `Answered` means every
    /// statement succeeded and the commit is durable; `Refused`, that the
    /// server refused one of the statements, so the `COMMIT` rolled the
    /// transaction back; a failed `COMMIT` is `Unknown`.
    pub(crate) async fn flight_commit(mut self, stmts: &[Stmt<'_>]) -> Flight<Vec<Vec<Row>>> {
        let prepared = match self.prepare_all(stmts).await {
            Ok(p) => p,
            Err(e) => return Flight::Unknown(e),
        };
        // Nothing waits in the prefix here: the head lock went with the
        // group's first flight, and no savepoint is opened.
        let Tx {
            tx, stmts: cache, ..
        } = self;
        cache.in_flight = true;
        let (answers, committed) = tokio::join!(
            in_order(
                prepared
                    .iter()
                    .zip(stmts)
                    .map(|(s, (_, p))| tx.query(s, p.as_slice()))
            ),
            tx.batch_execute("COMMIT")
        );
        cache.in_flight = false;
        // The `COMMIT` ended the transaction either way (see
        // `Tx::execute_and_commit`).
        std::mem::forget(tx);
        match classify(answers) {
            Flight::Answered(rows) => match committed {
                Ok(()) => Flight::Answered(rows),
                // Whatever the server said of the `COMMIT` itself (a
                // shutdown or a failed flush may come with an SQLSTATE
                // while the commit record is on disk), its outcome is not
                // known: never run again.
                Err(e) => Flight::Unknown(crate::error::db(e)),
            },
            other => other,
        }
    }

    /// Open a savepoint (`sql` is its `SAVEPOINT` statement) with the next
    /// statement, pipelined, rather than in a round trip of its own. Until
    /// a statement runs there is nothing to roll back to:
    /// [`Tx::rollback_to`] then sends nothing.
    pub(crate) fn savepoint(&mut self, sql: &'static str) {
        self.prefix.savepoint = Some(sql);
    }

    /// Roll back to the savepoint [`Tx::savepoint`] opened (`sql` is the
    /// `ROLLBACK TO SAVEPOINT` statement); nothing to do if no statement
    /// ran since.
    pub(crate) async fn rollback_to(&mut self, sql: &'static str) -> Result<(), StoreError> {
        if self.prefix.savepoint.take().is_some() {
            return Ok(());
        }
        self.simple(sql).await
    }

    /// Ask for the row lock of `lock_sql` (a `SELECT ... FOR UPDATE` of one
    /// row): it is sent with the next statement, ahead of it, rather than
    /// in a round trip of its own, and [`Tx::locked_row`] returns the row.
    pub(crate) async fn lock_row(&mut self, lock_sql: &'static str) -> Result<(), StoreError> {
        let stmt = self.stmts.get(&self.tx, lock_sql).await?;
        self.prefix.lock = Some(stmt);
        Ok(())
    }

    /// The row [`Tx::lock_row`] locked (`None`: there is no such row),
    /// sending the lock now if no statement has carried it yet.
    pub(crate) async fn locked_row(&mut self) -> Result<Option<Row>, StoreError> {
        if self.prefix.lock.is_some() {
            self.simple_prefix().await?;
        }
        match self.head.take() {
            Some(answer) => answer.db(),
            None => Err(StoreError::backend(
                "no row lock was asked for in this transaction",
            )),
        }
    }

    /// Send what waits in the prefix, with no statement after it.
    async fn simple_prefix(&mut self) -> Result<(), StoreError> {
        let prefix = std::mem::take(&mut self.prefix);
        self.stmts
            .exchange(after_prefix(
                &self.tx,
                prefix,
                &mut self.head,
                std::future::ready(Ok(())),
            ))
            .await
    }

    pub(crate) async fn query(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let stmt = self.stmts.get(&self.tx, sql).await?;
        let prefix = std::mem::take(&mut self.prefix);
        self.stmts
            .exchange(after_prefix(
                &self.tx,
                prefix,
                &mut self.head,
                self.tx.query(&stmt, params),
            ))
            .await
    }

    /// Three queries pipelined (one round trip), answered in order; the
    /// first error wins. Each runs after the one before it, as if awaited
    /// one by one (a lock the first takes is held when the others read).
    pub(crate) async fn query3(
        &mut self,
        a: (&'static str, Params<'_>),
        b: (&'static str, Params<'_>),
        c: (&'static str, Params<'_>),
    ) -> Result<[Vec<Row>; 3], StoreError> {
        let sa = self.stmts.get(&self.tx, a.0).await?;
        let sb = self.stmts.get(&self.tx, b.0).await?;
        let sc = self.stmts.get(&self.tx, c.0).await?;
        let prefix = std::mem::take(&mut self.prefix);
        let tx = &self.tx;
        self.stmts
            .exchange(after_prefix(tx, prefix, &mut self.head, async {
                let (ra, rb, rc) =
                    tokio::join!(tx.query(&sa, a.1), tx.query(&sb, b.1), tx.query(&sc, c.1));
                Ok([ra?, rb?, rc?])
            }))
            .await
    }

    /// Statements pipelined (one round trip, with a pending savepoint),
    /// each run after the one before it as if awaited one by one; their
    /// rows in order. The first error wins (PostgreSQL fails every
    /// statement after a failed one until the transaction rolls back).
    pub(crate) async fn pipeline(
        &mut self,
        stmts: &[(&'static str, Vec<&(dyn ToSql + Sync)>)],
    ) -> Result<Vec<Vec<Row>>, StoreError> {
        let prepared = self.prepare_all(stmts).await?;
        let prefix = std::mem::take(&mut self.prefix);
        let tx = &self.tx;
        let sent = prepared
            .iter()
            .zip(stmts)
            .map(|(s, (_, p))| tx.query(s, p.as_slice()));
        self.stmts
            .exchange(after_prefix(tx, prefix, &mut self.head, async {
                in_order(sent).await.into_iter().collect()
            }))
            .await
    }

    /// As [`Tx::pipeline`], for statements whose row counts are wanted.
    pub(crate) async fn pipeline_execute(
        &mut self,
        stmts: &[(&'static str, Vec<&(dyn ToSql + Sync)>)],
    ) -> Result<Vec<u64>, StoreError> {
        let prepared = self.prepare_all(stmts).await?;
        let prefix = std::mem::take(&mut self.prefix);
        let tx = &self.tx;
        let sent = prepared
            .iter()
            .zip(stmts)
            .map(|(s, (_, p))| tx.execute(s, p.as_slice()));
        self.stmts
            .exchange(after_prefix(tx, prefix, &mut self.head, async {
                in_order(sent).await.into_iter().collect()
            }))
            .await
    }

    async fn prepare_all(&mut self, stmts: &[Stmt<'_>]) -> Result<Vec<Statement>, StoreError> {
        let mut prepared = Vec::with_capacity(stmts.len());
        for (sql, _) in stmts {
            prepared.push(self.stmts.get(&self.tx, sql).await?);
        }
        Ok(prepared)
    }

    pub(crate) async fn query_opt(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<Option<Row>, StoreError> {
        let stmt = self.stmts.get(&self.tx, sql).await?;
        let prefix = std::mem::take(&mut self.prefix);
        self.stmts
            .exchange(after_prefix(
                &self.tx,
                prefix,
                &mut self.head,
                self.tx.query_opt(&stmt, params),
            ))
            .await
    }

    pub(crate) async fn execute(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<u64, StoreError> {
        let stmt = self.stmts.get(&self.tx, sql).await?;
        let prefix = std::mem::take(&mut self.prefix);
        self.stmts
            .exchange(after_prefix(
                &self.tx,
                prefix,
                &mut self.head,
                self.tx.execute(&stmt, params),
            ))
            .await
    }

    /// Commit. `Ok` means the server reported the commit durable (see the
    /// connection setup: `synchronous_commit` is never `off`).
    pub(crate) async fn commit(self) -> Result<(), StoreError> {
        self.stmts.exchange(self.tx.commit()).await
    }

    /// Run a simple statement without parameters (savepoints).
    pub(crate) async fn simple(&mut self, sql: &'static str) -> Result<(), StoreError> {
        let prefix = std::mem::take(&mut self.prefix);
        self.stmts
            .exchange(after_prefix(
                &self.tx,
                prefix,
                &mut self.head,
                self.tx.batch_execute(sql),
            ))
            .await
    }

    /// Execute `sql` and commit, pipelined: both are sent before either
    /// answer is awaited, so the pair costs one round trip. `Ok` only when
    /// both succeeded (a failed statement makes PostgreSQL answer the
    /// `COMMIT` with a rollback, which is reported as the statement's
    /// error) and the commit is durable, as for [`Tx::commit`].
    pub(crate) async fn execute_and_commit(
        self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<u64, StoreError> {
        // A savepoint not sent yet has no statement after it: dropped.
        let Tx { tx, stmts, .. } = self;
        let stmt = stmts.get(&tx, sql).await?;
        stmts.in_flight = true;
        let (executed, committed) =
            tokio::join!(tx.execute(&stmt, params), tx.batch_execute("COMMIT"));
        stmts.in_flight = false;
        // The `COMMIT` above ended the transaction either way; the
        // handle's drop would send a needless `ROLLBACK`. It owns no
        // memory of its own (a borrow of the client and no savepoint name).
        std::mem::forget(tx);
        let n = executed.db()?;
        committed.db()?;
        Ok(n)
    }
}

/// The pool.
pub(crate) struct Pool {
    config: Config,
    setup: String,
    idle: Mutex<Vec<Conn>>,
    permits: Semaphore,
}

/// A connection borrowed from the pool; returned when dropped.
pub(crate) struct Pooled<'p> {
    conn: Option<Conn>,
    pool: &'p Pool,
    _permit: SemaphorePermit<'p>,
}

impl Pooled<'_> {
    /// The connection: present until the guard drops.
    pub(crate) fn conn(&mut self) -> Result<&mut Conn, StoreError> {
        self.conn
            .as_mut()
            .ok_or_else(|| StoreError::backend("the pooled connection was already returned"))
    }

    /// [`Conn::query`] on the pooled connection.
    pub(crate) async fn query(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        self.conn()?.query(sql, params).await
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if conn.is_usable() {
                self.pool.lock_idle().push(conn);
            } else {
                discard(conn);
            }
        }
    }
}

/// Close a broken connection now.
pub(crate) fn discard(conn: Conn) {
    if let Some(driver) = &conn.driver {
        driver.abort();
    }
}

impl Pool {
    /// A pool of at most `size` connections made from `config`, each set up
    /// with the SQL in `setup` when it opens.
    pub(crate) fn new(config: Config, setup: String, size: usize) -> Self {
        Self {
            config,
            setup,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(size.max(1)),
        }
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<Conn>> {
        // The lock only guards push and pop; a panic cannot leave the
        // vector inconsistent, so a poisoned lock is still usable.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection, waiting for a free one if all are in use.
    pub(crate) async fn get(&self) -> Result<Pooled<'_>, StoreError> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| StoreError::backend("the connection pool is closed"))?;
        loop {
            let candidate = self.lock_idle().pop();
            match candidate {
                Some(conn) if conn.is_usable() => {
                    return Ok(Pooled {
                        conn: Some(conn),
                        pool: self,
                        _permit: permit,
                    });
                }
                Some(broken) => discard(broken),
                None => break,
            }
        }
        let conn = self.open().await?;
        Ok(Pooled {
            conn: Some(conn),
            pool: self,
            _permit: permit,
        })
    }

    /// Put a connection opened elsewhere (the one that ran the migrations)
    /// into the pool.
    pub(crate) fn adopt(&self, (client, driver): (Client, AbortHandle)) {
        self.lock_idle().push(Conn::driven(client, driver));
    }

    async fn open(&self) -> Result<Conn, StoreError> {
        Conn::open(&self.config, &self.setup).await
    }
}

/// Open one connection and drive it on a background task.
pub(crate) async fn connect(config: &Config) -> Result<Client, StoreError> {
    Ok(connect_driven(config).await?.0)
}

/// [`connect`], with the handle that aborts the connection's task.
pub(crate) async fn connect_driven(config: &Config) -> Result<(Client, AbortHandle), StoreError> {
    let (client, connection) = config.connect(NoTls).await.map_err(|e| {
        let target = describe(config);
        crate::error::db(e).context(format_args!("cannot connect to {target}"))
    })?;
    let driver = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "postgres connection ended with an error");
        }
    });
    Ok((client, driver.abort_handle()))
}

/// `host:port/dbname` for messages (never the password).
pub(crate) fn describe(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().or(config.get_user()).unwrap_or("");
    format!("`{host}:{port}/{db}`")
}

/// Connections shared by single-statement reads. Reads issued at once on
/// one connection are pipelined by the driver (each is sent without
/// waiting for the answers before it), so a read costs one round trip of
/// latency but holds no connection for it: with a slow network, many
/// concurrent reads share a few connections. A read abandoned half-way
/// leaves the connection usable (the driver drains its answer); a closed
/// connection is replaced by the next read.
pub(crate) struct Readers {
    config: Config,
    setup: String,
    slots: Vec<tokio::sync::Mutex<Option<Arc<Shared>>>>,
    next: AtomicUsize,
}

struct Shared {
    client: Client,
    stmts: Mutex<HashMap<&'static str, Statement>>,
    driver: AbortHandle,
}

impl Readers {
    /// `count` shared connections (at least one), opened on first use.
    pub(crate) fn new(config: Config, setup: String, count: usize) -> Self {
        Self {
            config,
            setup,
            slots: (0..count.max(1))
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    async fn shared(&self) -> Result<Arc<Shared>, StoreError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let Some(slot) = self.slots.get(i) else {
            return Err(StoreError::backend("the store has no read connections"));
        };
        let mut slot = slot.lock().await;
        if let Some(s) = slot.as_ref()
            && !s.client.is_closed()
        {
            return Ok(Arc::clone(s));
        }
        if let Some(old) = slot.take() {
            old.driver.abort();
        }
        let (client, driver) = connect_driven(&self.config).await?;
        if let Err(e) = client.batch_execute(&self.setup).await.db() {
            driver.abort();
            return Err(e);
        }
        let s = Arc::new(Shared {
            client,
            stmts: Mutex::new(HashMap::new()),
            driver,
        });
        *slot = Some(Arc::clone(&s));
        Ok(s)
    }

    /// Run one read statement on a shared connection.
    pub(crate) async fn query(
        &self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let s = self.shared().await?;
        let cached = s
            .stmts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(sql)
            .cloned();
        let stmt = match cached {
            Some(stmt) => stmt,
            None => {
                let stmt = s.client.prepare(sql).await.db()?;
                s.stmts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(sql, stmt.clone());
                stmt
            }
        };
        s.client.query(&stmt, params).await.db()
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Some(s) = slot.get_mut().take() {
                s.driver.abort();
            }
        }
    }
}
