//! Receipts: an opaque join point between evidence and an envelope.

use super::*;

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
