//! A small connection pool with a per-connection statement cache.
//!
//! At most `size` connections are open; a caller waits for a free one. A
//! connection is opened on demand, set up once (its `search_path`, durable
//! commits) and returned to the pool when its guard drops, unless the
//! driver reports it closed. Every statement is prepared once per
//! connection and reused: one round trip per statement instead of two.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, GenericClient, IsolationLevel, NoTls, Row, Statement};
use warden_store::StoreError;

use crate::error::DbResult;

/// Parameters of a statement.
pub(crate) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Statements prepared on one connection, by their SQL text.
#[derive(Default)]
pub(crate) struct StmtCache(HashMap<&'static str, Statement>);

impl StmtCache {
    async fn get<C: GenericClient + Sync>(
        &mut self,
        client: &C,
        sql: &'static str,
    ) -> Result<Statement, StoreError> {
        if let Some(s) = self.0.get(sql) {
            return Ok(s.clone());
        }
        // Prepared statements belong to the session, not the transaction:
        // one prepared inside a transaction that rolls back stays usable.
        let s = client.prepare(sql).await.db()?;
        self.0.insert(sql, s.clone());
        Ok(s)
    }
}

/// One open connection.
pub(crate) struct Conn {
    client: Client,
    stmts: StmtCache,
}

impl Conn {
    /// A connection opened outside the pool (a one-off reader).
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            stmts: StmtCache::default(),
        }
    }

    /// Run a statement outside a transaction.
    pub(crate) async fn query(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let stmt = self.stmts.get(&self.client, sql).await?;
        self.client.query(&stmt, params).await.db()
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
            .client
            .build_transaction()
            .isolation_level(level)
            .read_only(read_only)
            .start()
            .await
            .db()?;
        Ok(Tx {
            tx,
            stmts: &mut self.stmts,
        })
    }
}

/// A transaction on a pooled connection. Dropping it without
/// [`Tx::commit`] rolls it back.
pub(crate) struct Tx<'c> {
    tx: tokio_postgres::Transaction<'c>,
    stmts: &'c mut StmtCache,
}

impl Tx<'_> {
    pub(crate) async fn query(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let stmt = self.stmts.get(&self.tx, sql).await?;
        self.tx.query(&stmt, params).await.db()
    }

    pub(crate) async fn query_opt(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<Option<Row>, StoreError> {
        let stmt = self.stmts.get(&self.tx, sql).await?;
        self.tx.query_opt(&stmt, params).await.db()
    }

    pub(crate) async fn execute(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<u64, StoreError> {
        let stmt = self.stmts.get(&self.tx, sql).await?;
        self.tx.execute(&stmt, params).await.db()
    }

    /// Commit. `Ok` means the server reported the commit durable (see the
    /// connection setup: `synchronous_commit` is never `off`).
    pub(crate) async fn commit(self) -> Result<(), StoreError> {
        self.tx.commit().await.db()
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

    /// [`Conn::begin`] on the pooled connection.
    pub(crate) async fn begin(&mut self) -> Result<Tx<'_>, StoreError> {
        self.conn()?.begin().await
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take()
            && !conn.client.is_closed()
        {
            self.pool.lock_idle().push(conn);
        }
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
                Some(conn) if !conn.client.is_closed() => {
                    return Ok(Pooled {
                        conn: Some(conn),
                        pool: self,
                        _permit: permit,
                    });
                }
                Some(_closed) => continue,
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
    pub(crate) fn adopt(&self, client: Client) {
        self.lock_idle().push(Conn::new(client));
    }

    async fn open(&self) -> Result<Conn, StoreError> {
        let client = connect(&self.config).await?;
        client.batch_execute(&self.setup).await.db()?;
        Ok(Conn::new(client))
    }
}

/// Open one connection and drive it on a background task.
pub(crate) async fn connect(config: &Config) -> Result<Client, StoreError> {
    let (client, connection) = config.connect(NoTls).await.map_err(|e| {
        let target = describe(config);
        crate::error::db(e).context(format_args!("cannot connect to {target}"))
    })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "postgres connection ended with an error");
        }
    });
    Ok(client)
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
