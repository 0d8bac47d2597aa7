//! Mapping driver errors to [`StoreError`].

use tokio_postgres::error::SqlState;
use warden_store::StoreError;

/// A driver error as a [`StoreError`]: a read-only server (a hot standby,
/// `default_transaction_read_only`) is `ReadOnly`, anything else `Backend`,
/// with the server's message and SQLSTATE when there is one.
pub(crate) fn db(e: tokio_postgres::Error) -> StoreError {
    if let Some(d) = e.as_db_error() {
        if d.code() == &SqlState::READ_ONLY_SQL_TRANSACTION {
            return StoreError::ReadOnly(d.message().to_string());
        }
        return StoreError::Backend(format!("postgres: {} ({})", d.message(), d.code().code()));
    }
    if e.is_closed() {
        return StoreError::Backend("postgres: the connection is closed".into());
    }
    // The source carries the useful part (an I/O error, a timeout).
    match std::error::Error::source(&e) {
        Some(source) => StoreError::Backend(format!("postgres: {e}: {source}")),
        None => StoreError::Backend(format!("postgres: {e}")),
    }
}

/// A column that could not be read as the expected type: the schema is not
/// the one this build created.
pub(crate) fn column(e: tokio_postgres::Error) -> StoreError {
    StoreError::Corrupt(format!("unexpected column type: {e}"))
}

/// Extension to map driver results.
pub(crate) trait DbResult<T> {
    /// Map the error with [`db`].
    fn db(self) -> Result<T, StoreError>;
}

impl<T> DbResult<T> for Result<T, tokio_postgres::Error> {
    fn db(self) -> Result<T, StoreError> {
        self.map_err(db)
    }
}
