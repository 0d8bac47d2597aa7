//! Envelope authenticity across trust boundaries, and receipts.
//!
//! # Signed tokens
//!
//! The delegating side exports an envelope as a [`SignedEnvelope`]:
//! `{"envelope": <EnvelopeRecord>, "issuer": "<key id>", "signature": "<base64>"}`.
//! The signature is Ed25519 (RFC 8032, pure) over the bytes
//!
//! ```text
//! "warden.envelope.v1\n" || canonical_json({"envelope": <record>, "issuer": "<key id>"})
//! ```
//!
//! so the issuer is bound to the body and the bytes cannot be mistaken for
//! another Warden signature. `signature` is standard base64 with padding.
//!
//! # Canonical JSON
//!
//! [`canonical_json`] is RFC 8785 (JCS) restricted to what an envelope
//! holds: objects with keys sorted by their bytes (the same order as JCS's
//! UTF-16 order for the ASCII keys envelopes use), arrays in order, no
//! whitespace, `null`, `true`/`false`, integers written in decimal (any other
//! number is refused), strings with `"` and `\` escaped, `\b \f \n \r \t` for
//! those controls, `\u00xx` (lowercase hex) for the other controls below
//! U+0020, and every other character as UTF-8. Record sets are sorted arrays,
//! `parent_envelope_id` is `null` for a root. The files in
//! `tests/data/envelope/` pin the encoding byte for byte.
//!
//! # Verification
//!
//! [`verify_signature`] is the stateless check (a trusted issuer, a
//! signature that verifies); every verification goes through it. A
//! [`Verifier`] holds the trusted issuers and, per envelope id, the highest
//! version it accepted and that version's restrictions. It rejects, with
//! stable codes ([`VerifyError::code`]): an unknown issuer or a signature
//! that does not verify (`forged`: a tampered body, a wrong key and a forged
//! signature are indistinguishable, and it does not guess); a version below
//! the highest accepted, or a higher version that drops any accepted
//! restriction (`downgraded`); a version equal to the highest accepted
//! (`replayed`: each `(envelope_id, version)` is accepted once, even with a
//! different body). Sensitivity may drop between accepted versions: that is
//! how a signed declassification looks from outside. Nothing is recorded for
//! a rejected token.
//!
//! # Receipts
//!
//! A [`Receipt`] joins evidence to an envelope without carrying it: an
//! opaque [`EnvelopeRef`], a coarse sensitivity tier (a routing hint), the
//! issuer, and the end of the window in which the issuer keeps the reference
//! resolvable. [`resolve_receipt`] reports an expired or unresolved
//! reference as an outcome, not as a malformed receipt.

mod canonical;
mod receipt;
#[cfg(test)]
mod tests;
mod verify;

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::{Signature, Signer};
/// The Ed25519 key types, re-exported so callers need no direct dependency.
pub use ed25519_dalek::{SigningKey, VerifyingKey};
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use super::ident::{EnvelopeId, IssuerId};
use super::policy::Sensitivity;
use super::reasons;
use super::state::{EnvelopeRecord, backticked};
use crate::decision::Reason;
use crate::ids::Label;
use crate::time::Timestamp;

use canonical::to_canonical;
pub use canonical::{CanonicalError, MAX_CANONICAL_DEPTH, canonical_json};
pub use receipt::{EnvelopeRef, EnvelopeRefError, Receipt, ReceiptOutcome, resolve_receipt};
pub use verify::{Downgrade, VerifiedEnvelope, Verifier, VerifyError, verify_signature};

/// The domain-separation prefix of every envelope signature.
pub const SIGNING_CONTEXT: &[u8] = b"warden.envelope.v1\n";
#[derive(Serialize)]
struct SignedBody<'a> {
    envelope: &'a EnvelopeRecord,
    issuer: &'a IssuerId,
}

/// The exact bytes an issuer signs for `record`.
pub fn signing_input(
    record: &EnvelopeRecord,
    issuer: &IssuerId,
) -> Result<Vec<u8>, CanonicalError> {
    let body = to_canonical(&SignedBody {
        envelope: record,
        issuer,
    })?;
    let mut out = Vec::with_capacity(SIGNING_CONTEXT.len() + body.len());
    out.extend_from_slice(SIGNING_CONTEXT);
    out.extend_from_slice(body.as_bytes());
    Ok(out)
}

/// An envelope exported across a trust boundary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignedEnvelope {
    /// The envelope.
    pub envelope: EnvelopeRecord,
    /// The signing key's id.
    pub issuer: IssuerId,
    /// Ed25519 signature, standard base64 with padding.
    pub signature: String,
}

impl SignedEnvelope {
    /// The token's canonical JSON (how Warden writes tokens).
    pub fn to_canonical_json(&self) -> Result<String, CanonicalError> {
        to_canonical(self)
    }

    /// Parse a token (any JSON layout; the signature covers the canonical
    /// form of what is parsed).
    pub fn from_json(token: &str) -> Result<Self, VerifyError> {
        serde_json::from_str(token).map_err(|e| VerifyError::Malformed {
            detail: e.to_string(),
        })
    }
}

/// Sign `record` as `issuer` with `key` (the delegating side's key).
pub fn sign(
    record: &EnvelopeRecord,
    issuer: &IssuerId,
    key: &SigningKey,
) -> Result<SignedEnvelope, CanonicalError> {
    let input = signing_input(record, issuer)?;
    let signature = key.sign(&input);
    Ok(SignedEnvelope {
        envelope: record.clone(),
        issuer: issuer.clone(),
        signature: BASE64.encode(signature.to_bytes()),
    })
}
