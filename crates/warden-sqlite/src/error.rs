//! Mapping SQLite failures onto [`StoreError`].

use rusqlite::ErrorCode;
use warden_store::StoreError;

/// Classify a SQLite error.
pub(crate) fn map(e: rusqlite::Error) -> StoreError {
    match &e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            ErrorCode::ReadOnly | ErrorCode::PermissionDenied => {
                StoreError::ReadOnly(e.to_string())
            }
            ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt => {
                StoreError::Corrupt(e.to_string())
            }
            ErrorCode::DiskFull => StoreError::Backend(format!("disk full: {e}")),
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                StoreError::Backend(format!("database is locked: {e}"))
            }
            _ => StoreError::Backend(e.to_string()),
        },
        _ => StoreError::Backend(e.to_string()),
    }
}

/// Whether `e` is a uniqueness (or primary key) violation.
pub(crate) fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if f.code == ErrorCode::ConstraintViolation
                && (f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                    || f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY)
    )
}

/// A stored value that does not decode: the file was edited or damaged.
pub(crate) fn corrupt(what: impl std::fmt::Display, why: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {why}"))
}

/// Shorthand used by every query.
pub(crate) trait SqlResultExt<T> {
    /// Map the error with [`map`].
    fn store(self) -> Result<T, StoreError>;
}

impl<T> SqlResultExt<T> for Result<T, rusqlite::Error> {
    fn store(self) -> Result<T, StoreError> {
        self.map_err(map)
    }
}
