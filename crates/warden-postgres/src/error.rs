//! Mapping driver errors to [`StoreError`].

use tokio_postgres::error::SqlState;
use warden_store::{StoreError, Unavailability};

/// Why a SQLSTATE means "not now" rather than "never", or `None` when it
/// does not: the server is out of disk (53100) or of other resources (the
/// rest of class 53: too many connections, out of memory), shutting down or
/// starting (57P01 to 57P03), the connection failed (class 08), the server
/// ended a session left idle too long, in a transaction or not (25P03,
/// 57P05: its connection is gone), or the
/// transaction lost a lock race it may win when retried (40001, 40P01,
/// 55P03).
fn transient(code: &SqlState) -> Option<Unavailability> {
    let c = code.code();
    if c == "53100" {
        Some(Unavailability::DiskFull)
    } else if c.starts_with("53") {
        Some(Unavailability::OutOfResources)
    } else if c.starts_with("08") {
        Some(Unavailability::ConnectionLost)
    } else if matches!(c, "57P01" | "57P02" | "57P03") {
        Some(Unavailability::ShuttingDown)
    } else if matches!(c, "25P03" | "57P05") {
        Some(Unavailability::ConnectionLost)
    } else if matches!(c, "40001" | "40P01" | "55P03") {
        Some(Unavailability::Busy)
    } else {
        None
    }
}

/// A driver error as a [`StoreError`], keeping the driver error as the
/// source:
///
/// - a read-only server (a hot standby, `default_transaction_read_only`):
///   [`StoreError::ReadOnly`];
/// - a transient SQLSTATE (above), with its reason, a closed connection or a
///   failure to reach the server at all (an I/O error, a timeout:
///   [`Unavailability::ConnectionLost`]): [`StoreError::Unavailable`];
/// - anything else: [`StoreError::Backend`].
pub(crate) fn db(e: tokio_postgres::Error) -> StoreError {
    if let Some(d) = e.as_db_error() {
        if d.code() == &SqlState::READ_ONLY_SQL_TRANSACTION {
            return StoreError::read_only(e);
        }
        if let Some(reason) = transient(d.code()) {
            return StoreError::unavailable_because(reason, e);
        }
        return StoreError::backend(e);
    }
    if e.is_closed() || io_cause(&e) {
        return StoreError::unavailable_because(Unavailability::ConnectionLost, e);
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
        for (code, reason) in [
            (SqlState::DISK_FULL, Unavailability::DiskFull),
            (
                SqlState::INSUFFICIENT_RESOURCES,
                Unavailability::OutOfResources,
            ),
            (SqlState::OUT_OF_MEMORY, Unavailability::OutOfResources),
            (
                SqlState::TOO_MANY_CONNECTIONS,
                Unavailability::OutOfResources,
            ),
            (
                SqlState::CONNECTION_EXCEPTION,
                Unavailability::ConnectionLost,
            ),
            (SqlState::CONNECTION_FAILURE, Unavailability::ConnectionLost),
            (
                SqlState::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
                Unavailability::ConnectionLost,
            ),
            (SqlState::ADMIN_SHUTDOWN, Unavailability::ShuttingDown),
            (SqlState::CRASH_SHUTDOWN, Unavailability::ShuttingDown),
            (SqlState::CANNOT_CONNECT_NOW, Unavailability::ShuttingDown),
            (SqlState::T_R_SERIALIZATION_FAILURE, Unavailability::Busy),
            (SqlState::T_R_DEADLOCK_DETECTED, Unavailability::Busy),
            (SqlState::LOCK_NOT_AVAILABLE, Unavailability::Busy),
            (
                SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
                Unavailability::ConnectionLost,
            ),
            (
                SqlState::IDLE_SESSION_TIMEOUT,
                Unavailability::ConnectionLost,
            ),
        ] {
            assert_eq!(transient(&code), Some(reason), "{code:?}");
        }
        for code in [
            SqlState::UNIQUE_VIOLATION,
            SqlState::SYNTAX_ERROR,
            SqlState::UNDEFINED_TABLE,
            SqlState::READ_ONLY_SQL_TRANSACTION,
            SqlState::QUERY_CANCELED,
        ] {
            assert_eq!(transient(&code), None, "{code:?}");
        }
    }
}
