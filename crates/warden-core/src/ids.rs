//! Identifiers that can only be built valid.
//!
//! Every name that crosses Warden's boundary (agent ids, action names, memory
//! namespaces and keys, SOP and step ids, run ids, labels) is an identifier
//! underneath: 1 to [`MAX_IDENTIFIER_LEN`] bytes from `[A-Za-z0-9._:-]`.
//! Parsing happens once at the edge; past it, an `AgentId` is known to be
//! well formed and comparisons are plain string comparisons.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest identifier accepted anywhere, in bytes.
pub const MAX_IDENTIFIER_LEN: usize = 128;

/// Why a string is not a valid identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifierError {
    /// The string is empty.
    #[error("identifier is empty")]
    Empty,
    /// The string is longer than [`MAX_IDENTIFIER_LEN`].
    #[error("identifier is {len} bytes long, the limit is {MAX_IDENTIFIER_LEN}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The string holds a character outside `[A-Za-z0-9._:-]`.
    #[error("identifier contains `{ch}` at byte {at}; allowed are A-Z a-z 0-9 . _ : -")]
    BadChar {
        /// The offending character.
        ch: char,
        /// Its byte offset.
        at: usize,
    },
}

/// Check that `s` is a valid identifier.
pub fn check_identifier(s: &str) -> Result<(), IdentifierError> {
    if s.is_empty() {
        return Err(IdentifierError::Empty);
    }
    if s.len() > MAX_IDENTIFIER_LEN {
        return Err(IdentifierError::TooLong { len: s.len() });
    }
    for (at, ch) in s.char_indices() {
        if !(ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | ':' | '-')) {
            return Err(IdentifierError::BadChar { ch, at });
        }
    }
    Ok(())
}

macro_rules! identifier {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(::smol_str::SmolStr);

        impl $name {
            /// Parse `s`, rejecting anything that is not a valid identifier.
            pub fn parse(s: &str) -> Result<Self, IdentifierError> {
                check_identifier(s)?;
                Ok(Self(::smol_str::SmolStr::from(s)))
            }

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The identifier as shared text; cloning it does not allocate.
            pub fn as_text(&self) -> &::smol_str::SmolStr {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdentifierError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                Self::parse(&s).map_err(serde::de::Error::custom)
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                "Identifier".into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_IDENTIFIER_LEN,
                    "pattern": "^[A-Za-z0-9._:-]+$"
                })
            }
        }
    };
}

/// Defines an identifier newtype with the crate-wide rules; used here and by
/// the envelope identifiers.
pub(crate) use identifier;

identifier!(
    /// The stable runtime identity of an agent.
    AgentId
);
identifier!(
    /// A known action (and the capability to perform it), e.g. `memory.read`.
    ActionName
);
identifier!(
    /// A memory namespace, e.g. `project`.
    Namespace
);
identifier!(
    /// A memory key inside a namespace, e.g. `client_region`.
    Key
);
identifier!(
    /// The id of a standard operating procedure.
    SopId
);
identifier!(
    /// The id of one step inside an SOP.
    StepId
);
identifier!(
    /// The id of an admitted run (a client-suppliable idempotency key).
    RunId
);
identifier!(
    /// The id of a tool-call session (a client-suppliable idempotency key).
    SessionId
);
identifier!(
    /// The id of one call inside a session (a client-suppliable idempotency
    /// key).
    CallId
);
identifier!(
    /// A data label (`pii`, `financial`, ...), a restriction name or a tag.
    Label
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_charset() {
        assert!(AgentId::parse("report_manager").is_ok());
        assert!(ActionName::parse("memory.read").is_ok());
        assert!(StepId::parse("a-b:c.d_e9").is_ok());
    }

    #[test]
    fn rejects_empty_long_and_foreign_characters() {
        assert_eq!(AgentId::parse(""), Err(IdentifierError::Empty));
        assert_eq!(
            AgentId::parse(&"a".repeat(129)),
            Err(IdentifierError::TooLong { len: 129 })
        );
        assert!(AgentId::parse(&"a".repeat(128)).is_ok());
        assert_eq!(
            AgentId::parse("a b"),
            Err(IdentifierError::BadChar { ch: ' ', at: 1 })
        );
        assert!(AgentId::parse("../etc").is_err());
        assert!(AgentId::parse("é").is_err());
    }

    #[test]
    fn deserialising_validates() {
        let ok: Result<AgentId, _> = serde_json::from_str("\"researcher\"");
        assert!(ok.is_ok());
        let bad: Result<AgentId, _> = serde_json::from_str("\"re searcher\"");
        assert!(bad.is_err());
    }
}
