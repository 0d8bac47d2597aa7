//! Where the database lives and how it is opened: `sqlite://` URLs.

use std::path::PathBuf;

use percent_encoding::percent_decode_str;

/// The database Warden uses when none is given: `warden.db` in the working
/// directory.
pub const DEFAULT_URL: &str = "sqlite://warden.db";

/// Whether the store may create and write the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenMode {
    /// Create the file if it is missing, migrate it, write it (`mode=rwc`,
    /// the default).
    #[default]
    ReadWriteCreate,
    /// The file must exist; migrate and write it (`mode=rw`).
    ReadWrite,
    /// The file must exist at the current schema version; every write
    /// fails with `StoreError::ReadOnly` and the file is never changed
    /// (`mode=ro`).
    ReadOnly,
}

/// How hard a commit waits for the disk (SQLite's `synchronous` pragma).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Every commit is fsynced before it is acknowledged: acknowledged
    /// writes survive a process crash *and* power loss or an OS crash
    /// (`synchronous=full`, the default).
    #[default]
    Full,
    /// Commits reach the operating system but are fsynced only at
    /// checkpoints: acknowledged writes survive a process crash (`kill -9`)
    /// but the last ones may be lost on power loss or an OS crash
    /// (`synchronous=normal`).
    Normal,
}

impl Synchronous {
    pub(crate) fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

/// Everything [`SqliteStore::open_with`](crate::SqliteStore::open_with)
/// needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// The database file.
    pub path: PathBuf,
    /// Create / write / read-only.
    pub mode: OpenMode,
    /// Commit durability.
    pub synchronous: Synchronous,
    /// The most commands one group commit holds.
    pub max_batch: usize,
    /// How many idle read connections are kept open.
    pub max_idle_readers: usize,
}

/// Why a database URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Not a `sqlite:` URL.
    #[error("`{0}` is not a sqlite url: expected `sqlite://PATH`")]
    Scheme(String),
    /// No file named.
    #[error("the sqlite url `{0}` names no file")]
    EmptyPath(String),
    /// The path is not valid UTF-8 after percent-decoding.
    #[error("the path in `{0}` is not valid percent-encoded utf-8")]
    Encoding(String),
    /// `:memory:` was asked for.
    #[error(
        "in-memory sqlite databases are not supported: use the in-memory store, or a temporary file"
    )]
    Memory,
    /// A query parameter Warden does not know (unknown settings are refused,
    /// not ignored).
    #[error("unknown sqlite url parameter `{0}`: known are `mode` and `synchronous`")]
    UnknownParameter(String),
    /// A known parameter with a value outside its set.
    #[error("`{value}` is not a valid `{parameter}`: expected one of {expected}")]
    BadValue {
        /// The parameter.
        parameter: String,
        /// The value given.
        value: String,
        /// The accepted values.
        expected: &'static str,
    },
}

impl SqliteOptions {
    /// Default options for the file at `path`: create if missing,
    /// `synchronous=full`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            mode: OpenMode::default(),
            synchronous: Synchronous::default(),
            max_batch: 1024,
            max_idle_readers: 8,
        }
    }

    /// Parse a database URL.
    ///
    /// Accepted forms: `sqlite://PATH` and `sqlite:PATH`, where `PATH` is
    /// percent-decoded and taken as-is, so `sqlite://warden.db` is
    /// `warden.db` relative to the working directory and
    /// `sqlite:///var/lib/warden/warden.db` is absolute. Query parameters:
    ///
    /// - `mode=rwc` (default: create if missing), `mode=rw` (must exist),
    ///   `mode=ro` (read-only, never changes the file);
    /// - `synchronous=full` (default) or `synchronous=normal` (see
    ///   [`Synchronous`]).
    ///
    /// Unknown parameters are an error.
    pub fn from_url(url: &str) -> Result<Self, UrlError> {
        let rest = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .ok_or_else(|| UrlError::Scheme(url.to_string()))?;
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let path = percent_decode_str(path)
            .decode_utf8()
            .map_err(|_| UrlError::Encoding(url.to_string()))?;
        if path.is_empty() {
            return Err(UrlError::EmptyPath(url.to_string()));
        }
        if path == ":memory:" {
            return Err(UrlError::Memory);
        }
        let mut options = Self::new(path.as_ref());
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "mode" => {
                    options.mode = match value {
                        "rwc" => OpenMode::ReadWriteCreate,
                        "rw" => OpenMode::ReadWrite,
                        "ro" => OpenMode::ReadOnly,
                        _ => {
                            return Err(UrlError::BadValue {
                                parameter: name.into(),
                                value: value.into(),
                                expected: "`rwc`, `rw`, `ro`",
                            });
                        }
                    }
                }
                "synchronous" => {
                    options.synchronous = match value.to_ascii_lowercase().as_str() {
                        "full" => Synchronous::Full,
                        "normal" => Synchronous::Normal,
                        _ => {
                            return Err(UrlError::BadValue {
                                parameter: name.into(),
                                value: value.into(),
                                expected: "`full`, `normal`",
                            });
                        }
                    }
                }
                other => return Err(UrlError::UnknownParameter(other.to_string())),
            }
        }
        Ok(options)
    }

    /// The same options, read-only.
    pub fn read_only(mut self) -> Self {
        self.mode = OpenMode::ReadOnly;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        let o = SqliteOptions::from_url(DEFAULT_URL).unwrap();
        assert_eq!(o.path, PathBuf::from("warden.db"));
        assert_eq!(o.mode, OpenMode::ReadWriteCreate);
        assert_eq!(o.synchronous, Synchronous::Full);
        let o = SqliteOptions::from_url("sqlite:///var/lib/w%20x.db?mode=ro&synchronous=normal")
            .unwrap();
        assert_eq!(o.path, PathBuf::from("/var/lib/w x.db"));
        assert_eq!(o.mode, OpenMode::ReadOnly);
        assert_eq!(o.synchronous, Synchronous::Normal);
        let o = SqliteOptions::from_url("sqlite:data/w.db?mode=rw").unwrap();
        assert_eq!(o.path, PathBuf::from("data/w.db"));
        assert_eq!(o.mode, OpenMode::ReadWrite);
    }

    #[test]
    fn refuses_what_it_does_not_understand() {
        assert!(matches!(
            SqliteOptions::from_url("postgres://x"),
            Err(UrlError::Scheme(_))
        ));
        assert!(matches!(
            SqliteOptions::from_url("sqlite://"),
            Err(UrlError::EmptyPath(_))
        ));
        assert!(matches!(
            SqliteOptions::from_url("sqlite://:memory:"),
            Err(UrlError::Memory)
        ));
        assert!(matches!(
            SqliteOptions::from_url("sqlite://w.db?cache=shared"),
            Err(UrlError::UnknownParameter(_))
        ));
        assert!(matches!(
            SqliteOptions::from_url("sqlite://w.db?mode=rwx"),
            Err(UrlError::BadValue { .. })
        ));
        assert!(matches!(
            SqliteOptions::from_url("sqlite://w.db?synchronous=off"),
            Err(UrlError::BadValue { .. })
        ));
    }
}
