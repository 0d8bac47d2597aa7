//! Mapping SQLite failures onto [`StoreError`].

use std::path::Path;

use rusqlite::ErrorCode;
use warden_store::{Entity, StoreError};

/// Classify a SQLite error by its result code; the driver error is kept as
/// the source.
///
/// - `SQLITE_READONLY`, `SQLITE_PERM`: [`StoreError::ReadOnly`];
/// - `SQLITE_NOTADB`, `SQLITE_CORRUPT`: [`StoreError::Corrupt`];
/// - `SQLITE_FULL` (disk full), `SQLITE_BUSY` and `SQLITE_LOCKED` (another
///   writer held the lock beyond the busy timeout): [`StoreError::Unavailable`];
/// - anything else: [`StoreError::Backend`].
pub(crate) fn map(e: rusqlite::Error) -> StoreError {
    let code = match &e {
        rusqlite::Error::SqliteFailure(f, _) => Some(f.code),
        _ => None,
    };
    match code {
        Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied) => StoreError::read_only(e),
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
            detail: format!("sqlite: {e}"),
            source: Some(Box::new(e)),
        },
        Some(ErrorCode::DiskFull | ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            StoreError::unavailable(e)
        }
        _ => StoreError::backend(e),
    }
}

/// A failed file operation on `path` (`what`: "create the lock file"),
/// said plainly: a read-only filesystem or a permission problem is
/// [`StoreError::ReadOnly`], a full disk [`StoreError::Unavailable`],
/// anything else [`StoreError::Backend`].
pub(crate) fn io_failure(path: &Path, what: &str, e: &std::io::Error) -> StoreError {
    use std::io::ErrorKind;
    let p = path.display();
    match e.kind() {
        ErrorKind::ReadOnlyFilesystem => {
            StoreError::read_only(format!("cannot write `{p}`: read-only file system"))
        }
        ErrorKind::PermissionDenied => {
            StoreError::read_only(format!("cannot write `{p}`: permission denied"))
        }
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => {
            StoreError::unavailable(format!("cannot write `{p}`: disk full"))
        }
        ErrorKind::NotFound => {
            StoreError::backend(format!("cannot {what} `{p}`: its directory does not exist"))
        }
        _ => StoreError::backend(format!("cannot {what} `{p}`: {e}")),
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

/// A uniqueness violation as `Duplicate` of `entity` with `id`, anything
/// else classified by [`map`].
pub(crate) fn duplicate_or(e: rusqlite::Error, entity: Entity, id: &str) -> StoreError {
    if is_unique_violation(&e) {
        StoreError::duplicate(entity, id)
    } else {
        map(e)
    }
}

/// A stored value that does not decode: the file was edited or damaged.
pub(crate) fn corrupt(what: impl std::fmt::Display, why: impl std::fmt::Display) -> StoreError {
    StoreError::corrupt(format!("{what}: {why}"))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: std::ffi::c_int) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)
    }

    #[test]
    fn result_codes_are_classified() {
        use rusqlite::ffi;
        assert!(matches!(
            map(failure(ffi::SQLITE_BUSY)),
            StoreError::Unavailable { .. }
        ));
        assert!(matches!(
            map(failure(ffi::SQLITE_LOCKED)),
            StoreError::Unavailable { .. }
        ));
        assert!(matches!(
            map(failure(ffi::SQLITE_FULL)),
            StoreError::Unavailable { .. }
        ));
        assert!(matches!(
            map(failure(ffi::SQLITE_READONLY)),
            StoreError::ReadOnly { .. }
        ));
        assert!(matches!(
            map(failure(ffi::SQLITE_PERM)),
            StoreError::ReadOnly { .. }
        ));
        assert!(matches!(
            map(failure(ffi::SQLITE_NOTADB)),
            StoreError::Corrupt { .. }
        ));
        assert!(matches!(
            map(failure(ffi::SQLITE_CORRUPT)),
            StoreError::Corrupt { .. }
        ));
        assert!(matches!(
            map(failure(ffi::SQLITE_ERROR)),
            StoreError::Backend { .. }
        ));
        let e = map(failure(ffi::SQLITE_BUSY));
        assert!(
            std::error::Error::source(&e).is_some(),
            "the driver error is the source"
        );
    }

    #[test]
    fn unique_violations_are_duplicates() {
        let e = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE),
            None,
        );
        assert!(matches!(
            duplicate_or(e, Entity::Agent, "a"),
            StoreError::Duplicate { entity: Entity::Agent, ref id } if id == "a"
        ));
    }
}
