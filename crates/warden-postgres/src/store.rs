//! [`PgStore`]: connecting, options and the pool; the `Store` methods are
//! in `store_impl` and the modules it calls (one per concern).

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Config;
use warden_core::ids::AgentId;
use warden_store::{StoreError, StoredAgent};

use crate::codec::agent_out;
use crate::error::DbResult;
use crate::pool::{self, Pool, Readers};
use crate::record_reads::RecordReads;
use crate::schema::{self, quote_ident};
use crate::sql;
use crate::writer::{WriterConfig, Writers};

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
    /// How long an operation waits on a database it cannot reach before it
    /// fails [`StoreError::Unavailable`].
    pub timeouts: PgTimeouts,
    /// How many group-commit writers the store runs, each with a dedicated
    /// connection of its own (besides the pool): every appending operation
    /// is queued to one of them and committed with the others queued there,
    /// in one transaction and one acquisition of the audit head lock.
    /// Default 1. The head lock is one for the whole deployment, so the
    /// writers of every server take turns at it, and each writer more
    /// splits what is queued into smaller groups that each pay a group's
    /// fixed cost under the lock: two servers of two writers each wrote a
    /// third less than two servers of one (`BENCHMARKS.md`). A second
    /// writer pays only for a lone server far from its database, where
    /// one group can form while the other waits a round trip.
    pub writers: usize,
    /// Most operations one writer commits in one transaction. Each one that
    /// runs statements takes a savepoint; PostgreSQL keeps up to 64
    /// subtransactions per transaction in shared memory, past which other
    /// sessions' snapshots get slower, hence the default of 64.
    pub max_batch: usize,
    /// How many connections single-statement reads (tokens, records, the
    /// audit log and head, envelopes, escalations) share, pipelined, besides
    /// the pool (which serves the reads of several statements).
    pub readers: usize,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            schema: None,
            pool_size: 8,
            listen_heartbeat: Duration::from_secs(10),
            timeouts: PgTimeouts::default(),
            writers: 1,
            max_batch: 64,
            readers: 4,
        }
    }
}

/// The bounds that turn an unreachable database into a prompt
/// [`StoreError::Unavailable`] instead of an operation that waits for the
/// operating system's defaults (hours for a silent peer). Each applies
/// unless the database URL sets its own (`connect_timeout`,
/// `tcp_user_timeout`, `keepalives*`, in seconds), or, for
/// `idle_in_transaction`, the session already has a nonzero
/// `idle_in_transaction_session_timeout` (from the URL's `options`, the
/// role, the database or the server's configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgTimeouts {
    /// Longest wait to open a connection (TCP connect and startup).
    pub connect: Duration,
    /// Longest a connection may go without a sign of life from the
    /// database host before it is declared dead: data sent but not
    /// acknowledged for this long (`TCP_USER_TIMEOUT`), or an idle
    /// connection whose keepalive probes (from half of it, then every
    /// tenth) go unanswered. Its operation fails, the connection is closed
    /// and leaves the pool.
    pub dead_connection: Duration,
    /// Longest one of this store's sessions may sit idle inside a
    /// transaction before the database ends it and releases its locks
    /// (`idle_in_transaction_session_timeout`): what bounds how long a
    /// server cut off in the middle of a transaction holds up the others
    /// (appends wait for the audit head it locked).
    pub idle_in_transaction: Duration,
}

impl Default for PgTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            dead_connection: Duration::from_secs(10),
            idle_in_transaction: Duration::from_secs(10),
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
    /// The shared connections of single-statement reads.
    pub(crate) readers: Arc<Readers>,
    /// The task that answers record reads in groups.
    pub(crate) record_reads: RecordReads,
    /// The group-commit writers every appending operation goes through.
    pub(crate) writers: Writers,
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
        let config = parse_url(url, &options.timeouts)?;
        let (mut first, first_driver) = pool::connect_driven(&config).await?;
        let (schema, create) = match &options.schema {
            Some(s) => (s.clone(), true),
            None => (current_schema(&first).await?, false),
        };
        let setup = setup_sql(&mut first, &schema, &options.timeouts).await?;
        first.batch_execute(&setup).await.db()?;
        schema::migrate(&mut first, &schema, create).await?;
        let pool = Pool::new(config.clone(), setup.clone(), options.pool_size);
        pool.adopt((first, first_driver));
        let channel = channel_for(&schema);
        let writers = Writers::spawn(
            options.writers,
            WriterConfig {
                config: config.clone(),
                setup: setup.clone(),
                channel: channel.clone(),
                max_batch: options.max_batch,
            },
        )?;
        let readers = Arc::new(Readers::new(config.clone(), setup.clone(), options.readers));
        let record_reads = RecordReads::spawn(Arc::clone(&readers))?;
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                readers,
                record_reads,
                writers,
                config,
                setup,
                channel,
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

    /// Run one read statement on a shared connection and decode its rows.
    pub(crate) async fn read<R>(
        &self,
        sql: &'static str,
        params: pool::Params<'_>,
        f: impl Fn(&tokio_postgres::Row) -> Result<R, StoreError>,
    ) -> Result<Vec<R>, StoreError> {
        self.inner
            .readers
            .query(sql, params)
            .await?
            .iter()
            .map(f)
            .collect()
    }
}

/// Parse a `postgres://` or `postgresql://` URL, with Warden's defaults
/// for what it leaves out (application name, the connection timeouts of
/// [`PgTimeouts`]).
pub(crate) fn parse_url(url: &str, timeouts: &PgTimeouts) -> Result<Config, StoreError> {
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
        config.connect_timeout(timeouts.connect);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(timeouts.dead_connection);
    }
    // The driver's keepalive defaults (the first probe after two hours)
    // cannot be told apart from values the URL set, so the URL is asked.
    let keys = url_parameters(url);
    if config.get_keepalives() && !keys.iter().any(|k| k.starts_with("keepalives_")) {
        let dead = timeouts.dead_connection;
        let interval = (dead / 10).max(Duration::from_secs(1));
        config
            .keepalives_idle((dead / 2).max(Duration::from_secs(1)))
            .keepalives_interval(interval)
            .keepalives_retries(5);
    }
    Ok(config)
}

/// The parameter names in a URL's query string.
fn url_parameters(url: &str) -> Vec<&str> {
    url.split_once('?')
        .map(|(_, query)| {
            query
                .split('&')
                .map(|kv| kv.split_once('=').map_or(kv, |(k, _)| k))
                .collect()
        })
        .unwrap_or_default()
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

/// The SQL each new connection runs: pin `search_path` to the schema,
/// make sure a commit is acknowledged only once it is durable, run a
/// statement outside an explicit transaction at read committed, and bound
/// how long the session may hold a transaction open while idle.
pub(crate) async fn setup_sql(
    client: &mut tokio_postgres::Client,
    schema: &str,
    timeouts: &PgTimeouts,
) -> Result<String, StoreError> {
    let mut setup = format!("SET search_path TO {}", quote_ident(schema));
    let row = client
        .query_one(
            "SELECT current_setting('synchronous_commit'), \
             current_setting('idle_in_transaction_session_timeout'), \
             current_setting('default_transaction_isolation')",
            &[],
        )
        .await
        .db()?;
    let sync: String = row.try_get(0).map_err(crate::error::column)?;
    let idle: String = row.try_get(1).map_err(crate::error::column)?;
    let isolation: String = row.try_get(2).map_err(crate::error::column)?;
    // `off` acknowledges commits before they reach the disk; every other
    // value (`local`, `on`, `remote_write`, `remote_apply`) waits at least
    // for the local flush, and is kept as the operator configured it.
    if sync == "off" {
        setup.push_str("; SET synchronous_commit TO on");
    }
    // Every explicit transaction names its level; a statement run as its
    // own transaction (a predicted append: its conditional update must
    // wait for a concurrent one and check the row again, not fail with a
    // serialization error) runs at read committed whatever the default.
    if isolation != "read committed" {
        setup.push_str("; SET default_transaction_isolation TO 'read committed'");
    }
    // `0` disables the timeout; any other value was configured and is kept.
    if idle == "0" {
        let ms = timeouts.idle_in_transaction.as_millis().max(1);
        setup.push_str(&format!(
            "; SET idle_in_transaction_session_timeout TO {ms}"
        ));
    }
    Ok(setup)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeouts_apply_unless_the_url_sets_its_own() {
        let t = PgTimeouts::default();
        let c = parse_url("postgres://u@db/w", &t).unwrap();
        assert_eq!(c.get_connect_timeout(), Some(&t.connect));
        assert_eq!(c.get_tcp_user_timeout(), Some(&t.dead_connection));
        assert!(c.get_keepalives());
        assert_eq!(c.get_keepalives_idle(), t.dead_connection / 2);
        assert_eq!(c.get_keepalives_interval(), Some(Duration::from_secs(1)));
        assert_eq!(c.get_keepalives_retries(), Some(5));

        let c = parse_url(
            "postgres://u@db/w?connect_timeout=2&tcp_user_timeout=3&keepalives_idle=7",
            &t,
        )
        .unwrap();
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(2)));
        assert_eq!(c.get_tcp_user_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(c.get_keepalives_idle(), Duration::from_secs(7));
        assert_eq!(c.get_keepalives_interval(), None);

        let c = parse_url("postgres://u@db/w?keepalives=0", &t).unwrap();
        assert!(!c.get_keepalives());
    }
}
