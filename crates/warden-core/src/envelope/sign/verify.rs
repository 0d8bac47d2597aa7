//! Verifying signed envelopes, with per-envelope monotonicity.

use super::*;

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
    /// [`Envelope::restore`](crate::envelope::Envelope::restore)).
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

    /// A verifier trusting `issuers` (a bundle's `trusted_issuers`).
    pub fn trusting(issuers: BTreeMap<IssuerId, VerifyingKey>) -> Self {
        Self {
            issuers,
            accepted: BTreeMap::new(),
        }
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

    /// Verify a token ([`verify_signature`] against the trusted issuers,
    /// then monotonicity); on success remember its version and
    /// restrictions.
    pub fn verify(&mut self, token: &SignedEnvelope) -> Result<VerifiedEnvelope, VerifyError> {
        let verified = verify_signature(token, &self.issuers)?;
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
        Ok(verified)
    }
}

/// The stateless part of verification: `token`'s issuer is in `issuers` and
/// its signature verifies (Ed25519, strict) under that issuer's key over
/// [`signing_input`]. Nothing about earlier tokens is checked (replay and
/// downgrade are decided over the imports a caller has recorded, as
/// [`Verifier::verify`] does over the ones it holds).
///
/// Errors: [`VerifyError::UnknownIssuer`] and [`VerifyError::BadSignature`]
/// (both `forged`), [`VerifyError::Malformed`] for a signature that is not
/// base64 of 64 bytes or a body that has no canonical form.
pub fn verify_signature(
    token: &SignedEnvelope,
    issuers: &BTreeMap<IssuerId, VerifyingKey>,
) -> Result<VerifiedEnvelope, VerifyError> {
    let key = issuers
        .get(&token.issuer)
        .ok_or_else(|| VerifyError::UnknownIssuer {
            issuer: token.issuer.clone(),
        })?;
    let raw = BASE64
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
    Ok(VerifiedEnvelope {
        issuer: token.issuer.clone(),
        envelope: token.envelope.clone(),
    })
}
