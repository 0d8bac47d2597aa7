//! Identifiers of envelopes and workflows.
//!
//! Both follow the crate-wide identifier rules of [`crate::ids`] (1 to
//! [`MAX_IDENTIFIER_LEN`] bytes from `[A-Za-z0-9._:-]`), so they can appear in
//! audit entries, signed tokens and receipts without escaping.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::{IdentifierError, MAX_IDENTIFIER_LEN, check_identifier};

macro_rules! envelope_identifier {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Parse `s`, rejecting anything that is not a valid identifier.
            pub fn parse(s: &str) -> Result<Self, IdentifierError> {
                check_identifier(s)?;
                Ok(Self(Arc::from(s)))
            }

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
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

envelope_identifier!(
    /// The stable id of one envelope lineage (`env-01JZ4A9K2M`). Every version
    /// of an envelope shares it; a delegated child gets a new one.
    EnvelopeId
);
envelope_identifier!(
    /// The workflow an envelope belongs to; children keep their parent's.
    WorkflowId
);
envelope_identifier!(
    /// The key id of a party that signs envelopes (`warden.eu-1`). A
    /// [`Verifier`](super::sign::Verifier) maps it to a trusted public key.
    IssuerId
);
