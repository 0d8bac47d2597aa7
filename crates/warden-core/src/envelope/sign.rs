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
//! A [`Verifier`] holds the trusted issuers and, per envelope id, the highest
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

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::{Signature, Signer};
/// The Ed25519 key types, re-exported so callers need no direct dependency.
pub use ed25519_dalek::{SigningKey, VerifyingKey};
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::ident::{EnvelopeId, IssuerId};
use super::policy::Sensitivity;
use super::reasons;
use super::state::{EnvelopeRecord, backticked};
use crate::decision::Reason;
use crate::ids::Label;
use crate::time::Timestamp;

/// The domain-separation prefix of every envelope signature.
pub const SIGNING_CONTEXT: &[u8] = b"warden.envelope.v1\n";

/// Deepest nesting [`canonical_json`] accepts.
pub const MAX_CANONICAL_DEPTH: usize = 64;

/// Why a value has no canonical encoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    /// A number that is not an integer.
    #[error("canonical json holds integers only, found `{number}`")]
    NonInteger {
        /// The number as written.
        number: String,
    },
    /// Nesting deeper than [`MAX_CANONICAL_DEPTH`].
    #[error("canonical json nests deeper than {MAX_CANONICAL_DEPTH} levels")]
    TooDeep,
    /// The value could not be turned into JSON.
    #[error("value has no json form: {detail}")]
    NotJson {
        /// serde_json's message.
        detail: String,
    },
}

/// The canonical encoding of `value` (see the module docs).
pub fn canonical_json(value: &Value) -> Result<String, CanonicalError> {
    let mut out = String::new();
    write_value(&mut out, value, 0)?;
    Ok(out)
}

fn write_value(out: &mut String, value: &Value, depth: usize) -> Result<(), CanonicalError> {
    if depth > MAX_CANONICAL_DEPTH {
        return Err(CanonicalError::TooDeep);
    }
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else {
                return Err(CanonicalError::NonInteger {
                    number: n.to_string(),
                });
            }
        }
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item, depth + 1)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k);
                out.push(':');
                write_value(out, v, depth + 1)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn to_canonical<T: Serialize>(value: &T) -> Result<String, CanonicalError> {
    let v = serde_json::to_value(value).map_err(|e| CanonicalError::NotJson {
        detail: e.to_string(),
    })?;
    canonical_json(&v)
}

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

/// Which way a token was a downgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Downgrade {
    /// A version below the highest accepted.
    Version,
    /// A higher version without some accepted restrictions.
    Restrictions {
        /// The restrictions it dropped.
        missing: Vec<Label>,
    },
}

/// Why a token was rejected. Nothing is recorded for a rejected token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// Not a token: bad JSON, unknown fields, bad base64, wrong length.
    #[error("envelope token is malformed: {detail}")]
    Malformed {
        /// What is wrong.
        detail: String,
    },
    /// The issuer is not trusted by this verifier.
    #[error("envelope issuer `{issuer}` is not trusted")]
    UnknownIssuer {
        /// The issuer named by the token.
        issuer: IssuerId,
    },
    /// The signature does not verify under the issuer's key: the body was
    /// altered, or another key signed it.
    #[error("envelope signature does not verify for issuer `{issuer}`")]
    BadSignature {
        /// The issuer named by the token.
        issuer: IssuerId,
    },
    /// A lower version, or fewer restrictions, than already accepted.
    #[error("envelope `{envelope_id}` version {presented} is a downgrade of accepted version {accepted}{}", downgrade_detail(.kind))]
    Downgraded {
        /// The envelope.
        envelope_id: EnvelopeId,
        /// The version presented.
        presented: u64,
        /// The highest version accepted.
        accepted: u64,
        /// How.
        kind: Downgrade,
    },
    /// An `(envelope_id, version)` already accepted.
    #[error("envelope `{envelope_id}` version {version} was already accepted")]
    Replayed {
        /// The envelope.
        envelope_id: EnvelopeId,
        /// The version.
        version: u64,
    },
}

fn downgrade_detail(kind: &Downgrade) -> String {
    match kind {
        Downgrade::Version => String::new(),
        Downgrade::Restrictions { missing } => format!(" (drops {})", backticked(missing)),
    }
}

impl VerifyError {
    /// The stable code: `malformed`, `forged`, `downgraded` or `replayed`.
    pub fn code(&self) -> &'static str {
        match self {
            VerifyError::Malformed { .. } => "malformed",
            VerifyError::UnknownIssuer { .. } | VerifyError::BadSignature { .. } => "forged",
            VerifyError::Downgraded { .. } => "downgraded",
            VerifyError::Replayed { .. } => "replayed",
        }
    }

    /// The reason code to record (`envelope_<code>`).
    pub fn reason(&self) -> Reason {
        match self {
            VerifyError::Malformed { .. } => reasons::ENVELOPE_MALFORMED,
            VerifyError::UnknownIssuer { .. } | VerifyError::BadSignature { .. } => {
                reasons::ENVELOPE_FORGED
            }
            VerifyError::Downgraded { .. } => reasons::ENVELOPE_DOWNGRADED,
            VerifyError::Replayed { .. } => reasons::ENVELOPE_REPLAYED,
        }
    }
}

/// A token that passed verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedEnvelope {
    /// Who signed it.
    pub issuer: IssuerId,
    /// The envelope record (bind it to a local policy with
    /// [`Envelope::restore`](super::Envelope::restore)).
    pub envelope: EnvelopeRecord,
}

#[derive(Debug, Clone)]
struct Accepted {
    version: u64,
    restrictions: BTreeSet<Label>,
}

/// Verifies signed envelopes and enforces per-envelope monotonicity.
///
/// Holds state (the highest accepted version of every envelope it has seen),
/// so it grows with the number of envelope ids; a long-lived service keeps
/// one per trust boundary and persists it where replay protection must
/// survive a restart.
#[derive(Debug, Clone, Default)]
pub struct Verifier {
    issuers: BTreeMap<IssuerId, VerifyingKey>,
    accepted: BTreeMap<EnvelopeId, Accepted>,
}

impl Verifier {
    /// A verifier trusting nobody.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trust `key` for tokens naming `issuer` (replaces an earlier key).
    pub fn trust(&mut self, issuer: IssuerId, key: VerifyingKey) {
        self.issuers.insert(issuer, key);
    }

    /// The highest version of `envelope_id` accepted so far.
    pub fn highest_accepted(&self, envelope_id: &EnvelopeId) -> Option<u64> {
        self.accepted.get(envelope_id).map(|a| a.version)
    }

    /// Parse and verify a token.
    pub fn verify_json(&mut self, token: &str) -> Result<VerifiedEnvelope, VerifyError> {
        self.verify(&SignedEnvelope::from_json(token)?)
    }

    /// Verify a token; on success remember its version and restrictions.
    pub fn verify(&mut self, token: &SignedEnvelope) -> Result<VerifiedEnvelope, VerifyError> {
        let key = self
            .issuers
            .get(&token.issuer)
            .ok_or_else(|| VerifyError::UnknownIssuer {
                issuer: token.issuer.clone(),
            })?;
        let raw =
            BASE64
                .decode(token.signature.as_bytes())
                .map_err(|e| VerifyError::Malformed {
                    detail: format!("signature is not base64: {e}"),
                })?;
        let signature = Signature::from_slice(&raw).map_err(|_| VerifyError::Malformed {
            detail: format!("signature is {} bytes, expected 64", raw.len()),
        })?;
        let input =
            signing_input(&token.envelope, &token.issuer).map_err(|e| VerifyError::Malformed {
                detail: e.to_string(),
            })?;
        key.verify_strict(&input, &signature)
            .map_err(|_| VerifyError::BadSignature {
                issuer: token.issuer.clone(),
            })?;

        let record = &token.envelope;
        if let Some(seen) = self.accepted.get(&record.envelope_id) {
            if record.version < seen.version {
                return Err(VerifyError::Downgraded {
                    envelope_id: record.envelope_id.clone(),
                    presented: record.version,
                    accepted: seen.version,
                    kind: Downgrade::Version,
                });
            }
            if record.version == seen.version {
                return Err(VerifyError::Replayed {
                    envelope_id: record.envelope_id.clone(),
                    version: record.version,
                });
            }
            let missing: Vec<Label> = seen
                .restrictions
                .difference(&record.restrictions)
                .cloned()
                .collect();
            if !missing.is_empty() {
                return Err(VerifyError::Downgraded {
                    envelope_id: record.envelope_id.clone(),
                    presented: record.version,
                    accepted: seen.version,
                    kind: Downgrade::Restrictions { missing },
                });
            }
        }
        self.accepted.insert(
            record.envelope_id.clone(),
            Accepted {
                version: record.version,
                restrictions: record.restrictions.clone(),
            },
        );
        Ok(VerifiedEnvelope {
            issuer: token.issuer.clone(),
            envelope: record.clone(),
        })
    }
}

// ---------------------------------------------------------------------------
// Receipts
// ---------------------------------------------------------------------------

/// An opaque reference to one envelope version: lowercase hex of
/// `sha256("warden.envelope-ref.v1" || u64be(len(issuer)) || issuer ||
/// u64be(len(envelope_id)) || envelope_id || u64be(version))`.
///
/// It reveals nothing of the envelope's contents; it is not secret either
/// (anyone who knows the three inputs can recompute it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EnvelopeRef(String);

/// Why a string is not an [`EnvelopeRef`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("envelope reference must be 64 lowercase hex digits")]
pub struct EnvelopeRefError;

impl EnvelopeRef {
    /// The reference of `envelope_id` at `version`, issued by `issuer`.
    pub fn compute(issuer: &IssuerId, envelope_id: &EnvelopeId, version: u64) -> Self {
        let mut h = Sha256::new();
        h.update(b"warden.envelope-ref.v1");
        for part in [issuer.as_str(), envelope_id.as_str()] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        h.update(version.to_be_bytes());
        Self(hex::encode(h.finalize()))
    }

    /// Parse a reference.
    pub fn parse(s: &str) -> Result<Self, EnvelopeRefError> {
        if s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            Ok(Self(s.to_owned()))
        } else {
            Err(EnvelopeRefError)
        }
    }

    /// The reference as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Serialize for EnvelopeRef {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for EnvelopeRef {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for EnvelopeRef {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EnvelopeRef".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string", "pattern": "^[0-9a-f]{64}$"})
    }
}

/// A small, stable join point between evidence and an envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// The opaque reference.
    pub envelope_ref: EnvelopeRef,
    /// The envelope's sensitivity: a coarse routing hint for the verifier.
    pub sensitivity_tier: Sensitivity,
    /// Who resolves the reference.
    pub issuer: IssuerId,
    /// Last instant (inclusive, ms since the epoch) the issuer keeps the
    /// reference resolvable.
    #[schemars(with = "i64")]
    pub resolvable_until: Timestamp,
}

impl Receipt {
    /// The receipt of `record` as issued by `issuer`.
    pub fn issue(record: &EnvelopeRecord, issuer: &IssuerId, resolvable_until: Timestamp) -> Self {
        Self {
            envelope_ref: EnvelopeRef::compute(issuer, &record.envelope_id, record.version),
            sensitivity_tier: record.aggregate_sensitivity,
            issuer: issuer.clone(),
            resolvable_until,
        }
    }
}

/// What resolving a receipt gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiptOutcome<T> {
    /// The issuer's lookup found the referenced context.
    Resolved(T),
    /// The window has passed; the lookup was not attempted.
    Expired,
    /// Within the window, but the lookup found nothing.
    Unresolved,
}

impl<T> ReceiptOutcome<T> {
    /// `resolved`, `expired` or `unresolved`.
    pub fn code(&self) -> &'static str {
        match self {
            ReceiptOutcome::Resolved(_) => "resolved",
            ReceiptOutcome::Expired => "expired",
            ReceiptOutcome::Unresolved => "unresolved",
        }
    }
}

/// Resolve `receipt` at `now` through `lookup` (the issuer's governed
/// resolver), unless its window has passed (`now > resolvable_until`).
pub fn resolve_receipt<T>(
    receipt: &Receipt,
    now: Timestamp,
    lookup: impl FnOnce(&Receipt) -> Option<T>,
) -> ReceiptOutcome<T> {
    if now > receipt.resolvable_until {
        return ReceiptOutcome::Expired;
    }
    match lookup(receipt) {
        Some(v) => ReceiptOutcome::Resolved(v),
        None => ReceiptOutcome::Unresolved,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ed25519_dalek::SigningKey;

    use super::*;
    use crate::envelope::tests::{customer_policy, ls, root};
    use crate::envelope::{Envelope, EnvelopeId};
    use crate::ids::AgentId;

    macro_rules! vector {
        ($name:literal) => {
            include_str!(concat!("../../tests/data/envelope/", $name))
        };
    }

    fn key(seed_hex: &str) -> SigningKey {
        let seed: [u8; 32] = hex::decode(seed_hex.trim()).unwrap().try_into().unwrap();
        SigningKey::from_bytes(&seed)
    }

    fn issuer() -> IssuerId {
        IssuerId::parse("warden.test-1").unwrap()
    }

    /// The vector envelope: a delegated child of the customer example, one
    /// step after delegation.
    fn vector_envelope() -> Envelope {
        let p = customer_policy();
        let parent = crate::envelope::tests::run(
            &p,
            &root(&p, "env-vec-1"),
            &[&["name", "pii"], &["behavioral", "financial"]],
        );
        let (child, _) = parent
            .delegate(
                &p,
                AgentId::parse("researcher").unwrap(),
                EnvelopeId::parse("env-vec-1:c1").unwrap(),
                &ls(&["no_memory_write"]),
                false,
            )
            .unwrap();
        child.fold(&p, &ls(&["renewal"]), &[]).unwrap().0
    }

    fn verifier() -> Verifier {
        let mut v = Verifier::new();
        v.trust(issuer(), key(vector!("seed.hex")).verifying_key());
        v
    }

    fn token(json: &str) -> SignedEnvelope {
        SignedEnvelope::from_json(json).unwrap()
    }

    fn regen_hint(name: &str, actual: &str) -> String {
        format!(
            "tests/data/envelope/{name} drifted; if the change is intended, the new content is:\n{actual}"
        )
    }

    #[test]
    fn fixed_vectors_match_byte_for_byte() {
        let k = key(vector!("seed.hex"));
        assert_eq!(
            hex::encode(k.verifying_key().to_bytes()),
            vector!("public_key.hex")
        );
        let rec = vector_envelope().to_record();

        let canonical = to_canonical(&rec).unwrap();
        assert_eq!(
            canonical,
            vector!("envelope.json"),
            "{}",
            regen_hint("envelope.json", &canonical)
        );
        let input = signing_input(&rec, &issuer()).unwrap();
        assert_eq!(input, vector!("signing_input.txt").as_bytes());
        let signed = sign(&rec, &issuer(), &k).unwrap();
        assert_eq!(signed.signature, vector!("signature.b64"));
        let json = signed.to_canonical_json().unwrap();
        assert_eq!(
            json,
            vector!("token.json"),
            "{}",
            regen_hint("token.json", &json)
        );
        // Parsing and re-encoding is the identity on canonical tokens.
        assert_eq!(
            token(vector!("token.json")).to_canonical_json().unwrap(),
            vector!("token.json")
        );
        // The committed record restores under the policy that made it.
        let env =
            Envelope::restore(&token(vector!("token.json")).envelope, &customer_policy()).unwrap();
        assert_eq!(env, vector_envelope());

        let receipt = Receipt::issue(&rec, &issuer(), Timestamp(1_767_225_600_000));
        assert_eq!(to_canonical(&receipt).unwrap(), vector!("receipt.json"));
        let parsed: Receipt = serde_json::from_str(vector!("receipt.json")).unwrap();
        assert_eq!(parsed, receipt);
    }

    #[test]
    fn valid_token_verifies_once() {
        let mut v = verifier();
        let ok = v.verify_json(vector!("token.json")).unwrap();
        assert_eq!(ok.issuer, issuer());
        assert_eq!(ok.envelope, vector_envelope().to_record());
        assert_eq!(v.highest_accepted(&ok.envelope.envelope_id), Some(1));
        // Pretty-printed JSON is the same token.
        let pretty = serde_json::to_string_pretty(&token(vector!("next_version.json"))).unwrap();
        assert!(v.verify_json(&pretty).is_ok());
    }

    #[test]
    fn rejections_have_stable_codes_and_leave_no_trace() {
        let mut v = verifier();
        let id = EnvelopeId::parse("env-vec-1:c1").unwrap();
        let code = |v: &mut Verifier, json: &str| v.verify_json(json).unwrap_err().code();

        assert_eq!(code(&mut v, vector!("tampered.json")), "forged");
        assert_eq!(code(&mut v, vector!("wrong_key.json")), "forged");
        let e = v.verify_json(vector!("unknown_issuer.json")).unwrap_err();
        assert_eq!((e.code(), e.reason()), ("forged", reasons::ENVELOPE_FORGED));
        assert_eq!(
            e.to_string(),
            "envelope issuer `warden.unknown` is not trusted"
        );
        assert_eq!(v.highest_accepted(&id), None);

        v.verify_json(vector!("token.json")).unwrap();
        let e = v.verify_json(vector!("token.json")).unwrap_err();
        assert_eq!(
            (e.code(), e.reason()),
            ("replayed", reasons::ENVELOPE_REPLAYED)
        );
        let e = v
            .verify_json(vector!("downgraded_version.json"))
            .unwrap_err();
        assert_eq!(e.code(), "downgraded");
        assert_eq!(
            e.to_string(),
            "envelope `env-vec-1:c1` version 0 is a downgrade of accepted version 1"
        );
        let e = v
            .verify_json(vector!("downgraded_restrictions.json"))
            .unwrap_err();
        assert_eq!(
            e,
            VerifyError::Downgraded {
                envelope_id: id.clone(),
                presented: 2,
                accepted: 1,
                kind: Downgrade::Restrictions {
                    missing: ls(&["no_memory_write"])
                },
            }
        );
        assert_eq!(
            e.to_string(),
            "envelope `env-vec-1:c1` version 2 is a downgrade of accepted version 1 (drops `no_memory_write`)"
        );
        assert_eq!(v.highest_accepted(&id), Some(1));
        // A higher version keeping every restriction is accepted, even with a
        // lower sensitivity (a declassification, signed by the issuer).
        let next = v.verify_json(vector!("next_version.json")).unwrap();
        assert_eq!(
            next.envelope.aggregate_sensitivity,
            Sensitivity::Confidential
        );
        assert_eq!(v.highest_accepted(&id), Some(2));
        assert_eq!(code(&mut v, vector!("token.json")), "downgraded");
    }

    #[test]
    fn tampering_any_field_is_forged() {
        let mut v = verifier();
        let good = token(vector!("token.json"));
        let mut cases = Vec::new();
        let mut t = good.clone();
        t.envelope.version = 9;
        cases.push(t);
        let mut t = good.clone();
        t.envelope.aggregate_sensitivity = Sensitivity::Public;
        cases.push(t);
        let mut t = good.clone();
        t.envelope.labels.remove("pii");
        cases.push(t);
        let mut t = good.clone();
        t.envelope.agent_id = AgentId::parse("intruder").unwrap();
        cases.push(t);
        let mut t = good.clone();
        t.envelope.parent_envelope_id = None;
        cases.push(t);
        for t in cases {
            assert!(
                matches!(v.verify(&t), Err(VerifyError::BadSignature { .. })),
                "{t:?}"
            );
        }
        // Re-labelling the issuer breaks the signature too (the issuer is signed).
        let mut t = good.clone();
        t.issuer = IssuerId::parse("warden.test-2").unwrap();
        v.trust(t.issuer.clone(), key(vector!("seed.hex")).verifying_key());
        assert_eq!(v.verify(&t).unwrap_err().code(), "forged");
        assert!(v.verify(&good).is_ok());
    }

    #[test]
    fn malformed_tokens() {
        let mut v = verifier();
        let good = token(vector!("token.json"));
        let mut t = good.clone();
        t.signature = "not base64!".into();
        assert_eq!(v.verify(&t).unwrap_err().code(), "malformed");
        let mut t = good.clone();
        t.signature = BASE64.encode([0u8; 32]);
        assert_eq!(v.verify(&t).unwrap_err().code(), "malformed");
        let extra = vector!("token.json").replacen('{', "{\"extra\":1,", 1);
        assert_eq!(v.verify_json(&extra).unwrap_err().code(), "malformed");
        assert_eq!(
            v.verify_json("{").unwrap_err().reason(),
            reasons::ENVELOPE_MALFORMED
        );
        let bad_issuer = vector!("token.json").replace("warden.test-1", "warden test");
        assert_eq!(v.verify_json(&bad_issuer).unwrap_err().code(), "malformed");
        assert_eq!(v.highest_accepted(&good.envelope.envelope_id), None);
    }

    #[test]
    fn wrong_key_vector_is_signed_by_the_other_seed() {
        let t = token(vector!("wrong_key.json"));
        let mut v = Verifier::new();
        v.trust(issuer(), key(vector!("wrong_seed.hex")).verifying_key());
        assert!(v.verify(&t).is_ok());
    }

    #[test]
    fn canonical_json_rules() {
        let v = serde_json::json!({"b": [1, -2, true, null], "a": {"y": "\"\\\n\t\u{1}é", "x": {}}, "A": []});
        assert_eq!(
            canonical_json(&v).unwrap(),
            r#"{"A":[],"a":{"x":{},"y":"\"\\\n\t\u0001é"},"b":[1,-2,true,null]}"#
        );
        assert!(matches!(
            canonical_json(&serde_json::json!({"x": 1.5})),
            Err(CanonicalError::NonInteger { .. })
        ));
        let mut deep = serde_json::json!(0);
        for _ in 0..=MAX_CANONICAL_DEPTH {
            deep = serde_json::json!([deep]);
        }
        assert_eq!(canonical_json(&deep), Err(CanonicalError::TooDeep));
    }

    #[test]
    fn receipts_resolve_expire_or_stay_unresolved() {
        let receipt: Receipt = serde_json::from_str(vector!("receipt.json")).unwrap();
        let mut store = BTreeMap::new();
        store.insert(receipt.envelope_ref.clone(), "governed context");
        let until = receipt.resolvable_until;
        let lookup = |r: &Receipt| store.get(&r.envelope_ref).copied();
        assert_eq!(
            resolve_receipt(&receipt, until, lookup),
            ReceiptOutcome::Resolved("governed context")
        );
        let expired = resolve_receipt(&receipt, until.plus_millis(1), |_| -> Option<()> {
            unreachable!("an expired receipt is not looked up")
        });
        assert_eq!(
            (expired.code(), &expired),
            ("expired", &ReceiptOutcome::Expired)
        );
        let mut other = receipt.clone();
        other.envelope_ref =
            EnvelopeRef::compute(&issuer(), &EnvelopeId::parse("env-gone").unwrap(), 1);
        assert_eq!(
            resolve_receipt(&other, until, lookup),
            ReceiptOutcome::Unresolved
        );
        // The reference depends on issuer, id and version, and carries no contents.
        let r1 = EnvelopeRef::compute(&issuer(), &EnvelopeId::parse("env-vec-1:c1").unwrap(), 1);
        assert_eq!(r1, receipt.envelope_ref);
        assert_ne!(
            r1,
            EnvelopeRef::compute(&issuer(), &EnvelopeId::parse("env-vec-1:c1").unwrap(), 2)
        );
        assert!(!vector!("receipt.json").contains("pii"));
        // A malformed reference is a malformed receipt; an expired one is not.
        let bad = vector!("receipt.json").replace(receipt.envelope_ref.as_str(), "zz");
        assert!(serde_json::from_str::<Receipt>(&bad).is_err());
        assert!(EnvelopeRef::parse(&"A".repeat(64)).is_err());
    }
}
