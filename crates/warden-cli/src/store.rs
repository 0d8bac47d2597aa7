//! The storage backend chosen by the database URL.
//!
//! `Store` returns `impl Future`, so it is not object safe: the backends are
//! an enum that implements `Store` by delegation. Adding a backend is one
//! variant, one arm in [`open`] and one name in the `forward_store!` line.

use anyhow::bail;
use warden_store::MemoryStore;

/// Every backend this binary can use.
#[derive(Debug)]
pub enum AnyStore {
    /// `memory://`: nothing survives the process.
    Memory(Box<MemoryStore>),
    /// `sqlite://FILE`: the embedded default.
    Sqlite(warden_sqlite::SqliteStore),
    /// `postgres://...` or `postgresql://...`: one database shared by
    /// several servers.
    Postgres(warden_postgres::PgStore),
}

/// Open the backend named by `url`'s scheme.
pub async fn open(url: &str) -> anyhow::Result<AnyStore> {
    let Some((scheme, _)) = url.split_once("://") else {
        bail!(
            "database URL `{url}` has no scheme: use `sqlite://FILE`, `postgres://...` or `memory://`"
        );
    };
    match scheme {
        "memory" => Ok(AnyStore::Memory(Box::default())),
        "sqlite" => Ok(AnyStore::Sqlite(
            warden_sqlite::SqliteStore::open(url)
                .await
                .map_err(|e| anyhow::anyhow!("database `{url}`: {e}"))?,
        )),
        "postgres" | "postgresql" => Ok(AnyStore::Postgres(
            open_postgres(url, warden_postgres::PgOptions::default()).await?,
        )),
        other => {
            bail!(
                "database `{url}`: unknown scheme `{other}`; use `sqlite://FILE`, `postgres://...` or `memory://`"
            )
        }
    }
}

/// Connect to PostgreSQL at `url` (applying migrations) with `options`.
/// Error messages name the database without its password.
pub async fn open_postgres(
    url: &str,
    options: warden_postgres::PgOptions,
) -> anyhow::Result<warden_postgres::PgStore> {
    warden_postgres::PgStore::connect_with(url, options)
        .await
        .map_err(|e| anyhow::anyhow!("database `{}`: {e}", redact(url)))
}

/// `url` with the password (if any) replaced by `***`, for messages.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

// Every method goes to the variant's store.
warden_store::forward_store!(impl Store for AnyStore => enum Memory, Sqlite, Postgres);

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://u:secret@db:5432/w?sslmode=disable"),
            "postgres://u:***@db:5432/w?sslmode=disable"
        );
        assert_eq!(redact("postgres://u@db/w"), "postgres://u@db/w");
        assert_eq!(redact("postgresql://db/w"), "postgresql://db/w");
        assert_eq!(redact("sqlite://warden.db"), "sqlite://warden.db");
    }
}
