//! Identifiers of envelopes and workflows.
//!
//! Both follow the crate-wide identifier rules of [`crate::ids`] (1 to
//! [`MAX_IDENTIFIER_LEN`] bytes from `[A-Za-z0-9._:-]`), so they can appear in
//! audit entries, signed tokens and receipts without escaping.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::{IdentifierError, MAX_IDENTIFIER_LEN, check_identifier, identifier};

identifier!(
    /// The stable id of one envelope lineage (`env-01JZ4A9K2M`). Every version
    /// of an envelope shares it; a delegated child gets a new one.
    EnvelopeId
);
identifier!(
    /// The workflow an envelope belongs to; children keep their parent's.
    WorkflowId
);
identifier!(
    /// The key id of a party that signs envelopes (`warden.eu-1`). A
    /// [`Verifier`](super::sign::Verifier) maps it to a trusted public key.
    IssuerId
);
