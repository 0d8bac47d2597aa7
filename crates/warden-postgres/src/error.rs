//! Mapping driver errors to [`StoreError`].

use tokio_postgres::error::SqlState;
use warden_store::StoreError;

/// Whether a SQLSTATE means "not now" rather than "never": the server is
/// out of resources (class 53: disk full, too many connections, out of
/// memory), shutting down or starting (57P01 to 57P03), the connection
/// failed (class 08), the server ended a session left idle too long, in a
/// transaction or not (25P03, 57P05: its connection is gone), or the
/// transaction lost a lock race it may win when retried (40001, 40P01,
/// 55P03).
fn transient(code: &SqlState) -> bool {
    let c = code.code();
    c.starts_with("08")
        || c.starts_with("53")
        || matches!(
            c,
            "57P01" | "57P02" | "57P03" | "25P03" | "57P05" | "40001" | "40P01" | "55P03"
        )
}

/// A driver error as a [`StoreError`], keeping the driver error as the
/// source:
///
/// - a read-only server (a hot standby, `default_transaction_read_only`):
///   [`StoreError::ReadOnly`];
/// - a transient SQLSTATE (above), a closed connection, or a failure to
///   reach the server at all (an I/O error, a timeout):
///   [`StoreError::Unavailable`];
/// - anything else: [`StoreError::Backend`].
pub(crate) fn db(e: tokio_postgres::Error) -> StoreError {
    if let Some(d) = e.as_db_error() {
        if d.code() == &SqlState::READ_ONLY_SQL_TRANSACTION {
            return StoreError::read_only(e);
        }
        if transient(d.code()) {
            return StoreError::unavailable(e);
        }
        return StoreError::backend(e);
    }
    if e.is_closed() || io_cause(&e) {
        return StoreError::unavailable(e);
    }
    StoreError::backend(e)
}

/// Whether an I/O error (connection refused or reset, a timeout) is in the
/// error's chain.
fn io_cause(e: &tokio_postgres::Error) -> bool {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.is::<std::io::Error>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// A column that could not be read as the expected type: the schema is not
/// the one this build created.
pub(crate) fn column(e: tokio_postgres::Error) -> StoreError {
    StoreError::Corrupt {
        detail: "a column has an unexpected type".into(),
        source: Some(Box::new(e)),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_states() {
        for code in [
            SqlState::CONNECTION_FAILURE,
            SqlState::DISK_FULL,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::LOCK_NOT_AVAILABLE,
            SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
            SqlState::IDLE_SESSION_TIMEOUT,
        ] {
            assert!(transient(&code), "{code:?}");
        }
        for code in [
            SqlState::UNIQUE_VIOLATION,
            SqlState::SYNTAX_ERROR,
            SqlState::UNDEFINED_TABLE,
        ] {
            assert!(!transient(&code), "{code:?}");
        }
    }
}
