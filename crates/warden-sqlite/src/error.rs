//! Mapping SQLite failures onto [`StoreError`].

use std::path::Path;

use rusqlite::ErrorCode;
use warden_store::{Entity, StoreError, Unavailability};

/// Classify a SQLite error by its result code; the driver error is kept as
/// the source.
///
/// - `SQLITE_READONLY`, `SQLITE_PERM`: [`StoreError::ReadOnly`];
/// - `SQLITE_NOTADB`, `SQLITE_CORRUPT`: [`StoreError::Corrupt`];
/// - [`StoreError::Unavailable`], with its [`Unavailability`]:
///   `SQLITE_FULL` is [`Unavailability::DiskFull`]; `SQLITE_BUSY` and
///   `SQLITE_LOCKED` (another writer held the lock beyond the busy timeout)
///   [`Unavailability::Busy`]; `SQLITE_IOERR` (the file could not be read
///   or written) [`Unavailability::IoError`]; `SQLITE_NOMEM`
///   [`Unavailability::OutOfResources`];
/// - anything else: [`StoreError::Backend`].
pub(crate) fn map(e: rusqlite::Error) -> StoreError {
    let code = match &e {
        rusqlite::Error::SqliteFailure(f, _) => Some(f.code),
        _ => None,
    };
    let reason = match code {
        Some(ErrorCode::DiskFull) => Some(Unavailability::DiskFull),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Some(Unavailability::Busy),
        Some(ErrorCode::SystemIoFailure) => Some(Unavailability::IoError),
        Some(ErrorCode::OutOfMemory) => Some(Unavailability::OutOfResources),
        _ => None,
    };
    if let Some(reason) = reason {
        return StoreError::unavailable_because(reason, e);
    }
    match code {
        Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied) => StoreError::read_only(e),
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
            detail: format!("sqlite: {e}"),
            source: Some(Box::new(e)),
        },
        _ => StoreError::backend(e),
    }
}

/// A failed file operation on `path` (`what`: "create the lock file"),
/// said plainly: a read-only filesystem or a permission problem is
/// [`StoreError::ReadOnly`], a full disk [`StoreError::Unavailable`]
/// ([`Unavailability::DiskFull`]), anything else [`StoreError::Backend`].
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
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => StoreError::unavailable_because(
            Unavailability::DiskFull,
            format!("cannot write `{p}`: disk full"),
        ),
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
        for (code, reason) in [
            (ffi::SQLITE_FULL, Unavailability::DiskFull),
            (ffi::SQLITE_BUSY, Unavailability::Busy),
            (ffi::SQLITE_BUSY_TIMEOUT, Unavailability::Busy),
            (ffi::SQLITE_LOCKED, Unavailability::Busy),
            (ffi::SQLITE_IOERR, Unavailability::IoError),
            (ffi::SQLITE_IOERR_WRITE, Unavailability::IoError),
            (ffi::SQLITE_IOERR_FSYNC, Unavailability::IoError),
            (ffi::SQLITE_NOMEM, Unavailability::OutOfResources),
        ] {
            let e = map(failure(code));
            assert!(
                matches!(e, StoreError::Unavailable { reason: r, .. } if r == reason),
                "{code}: {e:?}"
            );
            assert_eq!(e.unavailability(), Some(reason));
            assert!(e.is_transient());
        }
        for code in [ffi::SQLITE_READONLY, ffi::SQLITE_PERM] {
            let e = map(failure(code));
            assert!(matches!(e, StoreError::ReadOnly { .. }), "{code}: {e:?}");
            assert_eq!(e.unavailability(), Some(Unavailability::ReadOnly));
        }
        for code in [ffi::SQLITE_NOTADB, ffi::SQLITE_CORRUPT] {
            assert!(
                matches!(map(failure(code)), StoreError::Corrupt { .. }),
                "{code}"
            );
        }
        for code in [
            ffi::SQLITE_ERROR,
            ffi::SQLITE_MISUSE,
            ffi::SQLITE_CONSTRAINT,
        ] {
            let e = map(failure(code));
            assert!(matches!(e, StoreError::Backend { .. }), "{code}: {e:?}");
            assert_eq!(e.unavailability(), None);
        }
        let e = map(failure(ffi::SQLITE_BUSY));
        assert!(
            std::error::Error::source(&e).is_some(),
            "the driver error is the source"
        );
    }

    #[test]
    fn file_failures_are_classified() {
        use std::io::{Error, ErrorKind};
        let path = Path::new("/some/dir/warden.db");
        let full = io_failure(path, "open", &Error::from(ErrorKind::StorageFull));
        assert_eq!(full.unavailability(), Some(Unavailability::DiskFull));
        assert_eq!(
            full.to_string(),
            "database unavailable: cannot write `/some/dir/warden.db`: disk full"
        );
        let quota = io_failure(path, "open", &Error::from(ErrorKind::QuotaExceeded));
        assert_eq!(quota.unavailability(), Some(Unavailability::DiskFull));
        let ro = io_failure(path, "open", &Error::from(ErrorKind::ReadOnlyFilesystem));
        assert_eq!(ro.unavailability(), Some(Unavailability::ReadOnly));
        let other = io_failure(path, "open", &Error::from(ErrorKind::InvalidData));
        assert!(matches!(other, StoreError::Backend { .. }));
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
