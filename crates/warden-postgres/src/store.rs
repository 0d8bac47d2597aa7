//! [`PgStore`]: connecting, options and the pool; the `Store` methods are
//! in `store_impl` and the modules it calls (one per concern).

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Config;
use warden_core::ids::AgentId;
use warden_store::{StoreError, StoredAgent};

use crate::codec::agent_out;
use crate::error::DbResult;
use crate::pool::{self, Pool};
use crate::schema::{self, quote_ident};
use crate::sql;

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
        let (mut first, first_driver) = pool::connect_driven(&config).await?;
        let (schema, create) = match &options.schema {
            Some(s) => (s.clone(), true),
            None => (current_schema(&first).await?, false),
        };
        let setup = setup_sql(&mut first, &schema).await?;
        first.batch_execute(&setup).await.db()?;
        schema::migrate(&mut first, &schema, create).await?;
        let pool = Pool::new(config.clone(), setup.clone(), options.pool_size);
        pool.adopt((first, first_driver));
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
    pub(crate) async fn read<R>(
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
