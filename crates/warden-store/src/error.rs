//! [`StoreError`]: why a storage operation failed, typed by what the caller
//! can do about it.

use std::fmt;

/// Any error a backend wraps (a driver error, an I/O error, a message).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What kind of stored thing an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Entity {
    /// A registered agent.
    Agent,
    /// A bearer token.
    Token,
    /// A memory record.
    Record,
    /// An admitted run.
    Run,
    /// One step of a run (`run/step`).
    Step,
    /// A context envelope (or one of its versions).
    Envelope,
    /// An escalation.
    Escalation,
    /// A tool-call session.
    Session,
    /// One call of a session (`session/#seq` or `session/call`).
    Call,
    /// The database itself (a file, a schema).
    Database,
    /// A request-rate bucket.
    RateBucket,
    /// An envelope signing key (by generation).
    SigningKey,
}

impl Entity {
    /// The entity's lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Entity::Agent => "agent",
            Entity::Token => "token",
            Entity::Record => "record",
            Entity::Run => "run",
            Entity::Step => "step",
            Entity::Envelope => "envelope",
            Entity::Escalation => "escalation",
            Entity::Session => "session",
            Entity::Call => "call",
            Entity::Database => "database",
            Entity::RateBucket => "rate bucket",
            Entity::SigningKey => "signing key",
        }
    }
}

impl fmt::Display for Entity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why storage cannot serve a request right now: the reason a backend gives
/// a [`StoreError::Unavailable`] (and, for [`StoreError::ReadOnly`],
/// [`Unavailability::ReadOnly`]). Stable: a server sends [`as_str`] to
/// clients, so each variant names a condition an operator can act on, never
/// a path or a driver's wording.
///
/// [`as_str`]: Unavailability::as_str
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Unavailability {
    /// The disk (or the database server's disk) is full: `SQLITE_FULL`,
    /// `ENOSPC`, SQLSTATE 53100.
    DiskFull,
    /// The database cannot be written: a read-only file or filesystem, a
    /// permission problem, a hot standby.
    ReadOnly,
    /// Another writer held a lock beyond the timeout, or the transaction
    /// lost a lock race (`SQLITE_BUSY`, `SQLITE_LOCKED`, SQLSTATE 40001,
    /// 40P01, 55P03, another process holding the database).
    Busy,
    /// The database cannot be reached or the connection was lost (SQLSTATE
    /// class 08, a closed connection, a refused or reset socket).
    ConnectionLost,
    /// The database server is out of resources other than disk: too many
    /// connections, out of memory (SQLSTATE class 53 but 53100).
    OutOfResources,
    /// The database server is shutting down or starting up (SQLSTATE
    /// 57P01 to 57P03).
    ShuttingDown,
    /// Reading or writing the database file failed (`SQLITE_IOERR`, an I/O
    /// error on the file).
    IoError,
    /// None of the above, or not classified.
    Other,
}

impl Unavailability {
    /// The stable snake_case name (`disk_full`), for machine-readable
    /// answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Unavailability::DiskFull => "disk_full",
            Unavailability::ReadOnly => "read_only",
            Unavailability::Busy => "busy",
            Unavailability::ConnectionLost => "connection_lost",
            Unavailability::OutOfResources => "out_of_resources",
            Unavailability::ShuttingDown => "shutting_down",
            Unavailability::IoError => "io_error",
            Unavailability::Other => "other",
        }
    }

    /// A short lowercase phrase (`disk full`), for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Unavailability::DiskFull => "disk full",
            Unavailability::ReadOnly => "the database is read-only",
            Unavailability::Busy => "the database is busy (locked by another writer)",
            Unavailability::ConnectionLost => "the database connection is lost",
            Unavailability::OutOfResources => "the database server is out of resources",
            Unavailability::ShuttingDown => "the database server is shutting down",
            Unavailability::IoError => "an i/o error on the database",
            Unavailability::Other => "the database cannot be used right now",
        }
    }

    /// Every reason, in order.
    pub const ALL: [Unavailability; 8] = [
        Unavailability::DiskFull,
        Unavailability::ReadOnly,
        Unavailability::Busy,
        Unavailability::ConnectionLost,
        Unavailability::OutOfResources,
        Unavailability::ShuttingDown,
        Unavailability::IoError,
        Unavailability::Other,
    ];
}

impl fmt::Display for Unavailability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// Why a storage operation failed (as opposed to being denied: denials are
/// outcomes, not errors).
///
/// The variants say who can do something about it: `Duplicate`,
/// `NotFound` and `Invalid` are the caller's (a request naming something
/// that exists or does not, or contradicting itself), `Unavailable` is transient (retry later; a server answers
/// 503), `ReadOnly`, `SchemaTooNew` and `Corrupt` need an operator, and
/// `Backend` is an internal failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A unique key already exists (agent id, token, run step, escalation).
    #[error("{entity} `{id}` already exists")]
    Duplicate {
        /// What kind of thing.
        entity: Entity,
        /// Its id.
        id: String,
    },
    /// The row to change does not exist.
    #[error("{entity} `{id}` not found")]
    NotFound {
        /// What kind of thing.
        entity: Entity,
        /// Its id.
        id: String,
    },
    /// The request contradicts itself (a session record naming one
    /// envelope given with another): nothing was stored. A caller's bug,
    /// never a state of the database.
    #[error("{entity} `{id}` refused: {detail}")]
    Invalid {
        /// What kind of thing.
        entity: Entity,
        /// Its id.
        id: String,
        /// What is inconsistent.
        detail: String,
    },
    /// The database was written by a newer Warden.
    #[error("database schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew {
        /// Version found in the database.
        found: i64,
        /// Newest version this build knows.
        supported: i64,
    },
    /// The database is not a Warden database, or its contents are damaged.
    #[error("not a usable warden database: {detail}")]
    Corrupt {
        /// What is wrong, and where.
        detail: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The database cannot be written (permissions, a read-only open, a
    /// hot standby).
    #[error("database is read-only: {source}")]
    ReadOnly {
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The database cannot be reached or cannot take writes right now:
    /// connection refused or lost, pool timeout, disk full, busy beyond the
    /// timeout. Transient: retrying later may succeed.
    #[error("database unavailable: {source}")]
    Unavailable {
        /// Why, classified.
        reason: Unavailability,
        /// Why, in the backend's words (may name paths: for the log).
        #[source]
        source: BoxError,
    },
    /// Any other backend failure: an internal error.
    #[error("storage backend failed: {source}")]
    Backend {
        /// Why.
        #[source]
        source: BoxError,
    },
}

impl StoreError {
    /// `Duplicate` of `entity` with `id`.
    pub fn duplicate(entity: Entity, id: impl fmt::Display) -> Self {
        StoreError::Duplicate {
            entity,
            id: id.to_string(),
        }
    }

    /// `Invalid` of `entity` with `id`: `detail` says what contradicts.
    pub fn invalid(entity: Entity, id: impl fmt::Display, detail: impl Into<String>) -> Self {
        StoreError::Invalid {
            entity,
            id: id.to_string(),
            detail: detail.into(),
        }
    }

    /// `NotFound` of `entity` with `id`.
    pub fn not_found(entity: Entity, id: impl fmt::Display) -> Self {
        StoreError::NotFound {
            entity,
            id: id.to_string(),
        }
    }

    /// `Corrupt` with a description and no underlying error.
    pub fn corrupt(detail: impl Into<String>) -> Self {
        StoreError::Corrupt {
            detail: detail.into(),
            source: None,
        }
    }

    /// `ReadOnly` from anything that converts into a [`BoxError`] (an
    /// error, or a message).
    pub fn read_only(source: impl Into<BoxError>) -> Self {
        StoreError::ReadOnly {
            source: source.into(),
        }
    }

    /// `Unavailable` for a reason not classified
    /// ([`Unavailability::Other`]), from anything that converts into a
    /// [`BoxError`]. Backends that know why use
    /// [`StoreError::unavailable_because`].
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        StoreError::unavailable_because(Unavailability::Other, source)
    }

    /// `Unavailable` with its `reason`, from anything that converts into a
    /// [`BoxError`].
    pub fn unavailable_because(reason: Unavailability, source: impl Into<BoxError>) -> Self {
        StoreError::Unavailable {
            reason,
            source: source.into(),
        }
    }

    /// `Backend` from anything that converts into a [`BoxError`].
    pub fn backend(source: impl Into<BoxError>) -> Self {
        StoreError::Backend {
            source: source.into(),
        }
    }

    /// The same error with `message` in front of what it says (`cannot
    /// connect to x: ...`): the variant is kept, and so is the source (now
    /// under the message). `Duplicate`, `NotFound` and `SchemaTooNew` are
    /// returned unchanged, as they already say everything (so is
    /// `Invalid`).
    pub fn context(self, message: impl fmt::Display) -> StoreError {
        let wrap = |source: BoxError| -> BoxError {
            Box::new(Context {
                message: message.to_string(),
                source,
            })
        };
        match self {
            StoreError::Corrupt { detail, source } => StoreError::Corrupt {
                detail: format!("{message}: {detail}"),
                source,
            },
            StoreError::ReadOnly { source } => StoreError::ReadOnly {
                source: wrap(source),
            },
            StoreError::Unavailable { reason, source } => StoreError::Unavailable {
                reason,
                source: wrap(source),
            },
            StoreError::Backend { source } => StoreError::Backend {
                source: wrap(source),
            },
            other => other,
        }
    }

    /// Whether retrying later may succeed ([`StoreError::Unavailable`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }

    /// Why storage cannot serve now: the reason of
    /// [`StoreError::Unavailable`], [`Unavailability::ReadOnly`] for
    /// [`StoreError::ReadOnly`], `None` for any other error.
    pub fn unavailability(&self) -> Option<Unavailability> {
        match self {
            StoreError::Unavailable { reason, .. } => Some(*reason),
            StoreError::ReadOnly { .. } => Some(Unavailability::ReadOnly),
            _ => None,
        }
    }

    /// The same error for several callers (a failed group commit answers
    /// each of its commands): the variant and its fields are kept, and the
    /// source is shared.
    pub fn fan_out(shared: &std::sync::Arc<StoreError>) -> StoreError {
        let source = || -> BoxError { Box::new(Shared(std::sync::Arc::clone(shared))) };
        match &**shared {
            StoreError::Duplicate { entity, id } => StoreError::Duplicate {
                entity: *entity,
                id: id.clone(),
            },
            StoreError::NotFound { entity, id } => StoreError::NotFound {
                entity: *entity,
                id: id.clone(),
            },
            StoreError::Invalid { entity, id, detail } => StoreError::Invalid {
                entity: *entity,
                id: id.clone(),
                detail: detail.clone(),
            },
            StoreError::SchemaTooNew { found, supported } => StoreError::SchemaTooNew {
                found: *found,
                supported: *supported,
            },
            StoreError::Corrupt { detail, source: s } => StoreError::Corrupt {
                detail: detail.clone(),
                source: s.as_ref().map(|_| source()),
            },
            StoreError::ReadOnly { .. } => StoreError::ReadOnly { source: source() },
            StoreError::Unavailable { reason, .. } => StoreError::Unavailable {
                reason: *reason,
                source: source(),
            },
            StoreError::Backend { .. } => StoreError::Backend { source: source() },
        }
    }
}

/// Errors are equal when they are the same variant with the same fields and
/// the same message (sources compare by their text): what tests need.
impl PartialEq for StoreError {
    fn eq(&self, other: &Self) -> bool {
        use StoreError as E;
        let same_source = |a: &BoxError, b: &BoxError| a.to_string() == b.to_string();
        match (self, other) {
            (E::Duplicate { entity: a, id: x }, E::Duplicate { entity: b, id: y })
            | (E::NotFound { entity: a, id: x }, E::NotFound { entity: b, id: y }) => {
                a == b && x == y
            }
            (
                E::Invalid {
                    entity: a,
                    id: x,
                    detail: p,
                },
                E::Invalid {
                    entity: b,
                    id: y,
                    detail: q,
                },
            ) => a == b && x == y && p == q,
            (
                E::SchemaTooNew {
                    found: a,
                    supported: x,
                },
                E::SchemaTooNew {
                    found: b,
                    supported: y,
                },
            ) => a == b && x == y,
            (
                E::Corrupt {
                    detail: a,
                    source: x,
                },
                E::Corrupt {
                    detail: b,
                    source: y,
                },
            ) => {
                a == b
                    && match (x, y) {
                        (None, None) => true,
                        (Some(x), Some(y)) => same_source(x, y),
                        _ => false,
                    }
            }
            (
                E::Unavailable {
                    reason: r,
                    source: a,
                },
                E::Unavailable {
                    reason: q,
                    source: b,
                },
            ) => r == q && same_source(a, b),
            (E::ReadOnly { source: a }, E::ReadOnly { source: b })
            | (E::Backend { source: a }, E::Backend { source: b }) => same_source(a, b),
            _ => false,
        }
    }
}

impl Eq for StoreError {}

/// A source with a message in front (see [`StoreError::context`]).
#[derive(Debug)]
struct Context {
    message: String,
    source: BoxError,
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.message, self.source)
    }
}

impl std::error::Error for Context {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// The source of a shared [`StoreError`]: displays as the original's
/// source (so messages are not prefixed twice).
#[derive(Debug)]
struct Shared(std::sync::Arc<StoreError>);

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::error::Error::source(&*self.0) {
            Some(s) => fmt::Display::fmt(s, f),
            None => fmt::Display::fmt(&*self.0, f),
        }
    }
}

impl std::error::Error for Shared {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&*self.0).and_then(std::error::Error::source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn messages_are_one_lowercase_line() {
        let e = StoreError::duplicate(Entity::Agent, "a1");
        assert_eq!(e.to_string(), "agent `a1` already exists");
        let e = StoreError::not_found(Entity::Step, "r/s");
        assert_eq!(e.to_string(), "step `r/s` not found");
        let e = StoreError::unavailable("connection refused");
        assert_eq!(e.to_string(), "database unavailable: connection refused");
        assert!(e.is_transient());
        assert!(!StoreError::backend("x").is_transient());
    }

    #[test]
    fn fan_out_keeps_variant_and_message() {
        let shared = Arc::new(StoreError::unavailable_because(
            Unavailability::DiskFull,
            "disk full",
        ));
        let copy = StoreError::fan_out(&shared);
        assert!(matches!(
            copy,
            StoreError::Unavailable {
                reason: Unavailability::DiskFull,
                ..
            }
        ));
        assert_eq!(copy.to_string(), shared.to_string());
        assert_eq!(copy, *shared);
        let shared = Arc::new(StoreError::duplicate(Entity::Run, "r1"));
        let copy = StoreError::fan_out(&shared);
        assert!(matches!(
            copy,
            StoreError::Duplicate { entity: Entity::Run, ref id } if id == "r1"
        ));
    }

    #[test]
    fn context_keeps_variant_and_source() {
        let e = StoreError::unavailable(std::io::Error::other("refused")).context("cannot connect");
        assert!(matches!(e, StoreError::Unavailable { .. }));
        assert_eq!(
            e.to_string(),
            "database unavailable: cannot connect: refused"
        );
        let source = std::error::Error::source(&e).unwrap();
        assert!(
            std::error::Error::source(source)
                .unwrap()
                .is::<std::io::Error>()
        );
        let e = StoreError::not_found(Entity::Agent, "a").context("ignored");
        assert_eq!(e.to_string(), "agent `a` not found");
        let e = StoreError::unavailable_because(Unavailability::Busy, "locked").context("write");
        assert_eq!(e.unavailability(), Some(Unavailability::Busy));
    }

    #[test]
    fn unavailability_is_typed_and_stable() {
        let e = StoreError::unavailable("refused");
        assert_eq!(e.unavailability(), Some(Unavailability::Other));
        let e = StoreError::unavailable_because(Unavailability::DiskFull, "x");
        assert_eq!(e.unavailability(), Some(Unavailability::DiskFull));
        assert_eq!(e.to_string(), "database unavailable: x");
        assert_eq!(
            StoreError::read_only("standby").unavailability(),
            Some(Unavailability::ReadOnly)
        );
        assert_eq!(StoreError::backend("x").unavailability(), None);
        assert_eq!(StoreError::corrupt("x").unavailability(), None);
        // Equal only with the same reason.
        assert_ne!(
            StoreError::unavailable_because(Unavailability::Busy, "x"),
            StoreError::unavailable_because(Unavailability::IoError, "x")
        );
        // Names are distinct snake_case words, phrases one lowercase line.
        let names: std::collections::BTreeSet<_> =
            Unavailability::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Unavailability::ALL.len());
        for r in Unavailability::ALL {
            assert!(
                r.as_str()
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_'),
                "{r:?}"
            );
            let d = r.describe();
            assert!(
                !d.is_empty() && !d.contains('\n') && d == d.to_lowercase(),
                "{r:?}"
            );
            assert_eq!(r.to_string(), d);
        }
        assert_eq!(Unavailability::DiskFull.as_str(), "disk_full");
        assert_eq!(Unavailability::DiskFull.describe(), "disk full");
    }
}
