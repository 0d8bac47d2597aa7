//! The server's envelope signing key: the Ed25519 key that signs exported
//! context envelopes (`GET /v1/runs/{run}/envelope/signed`) and names the
//! issuer of receipts, and the keys that verify what it signed.
//!
//! The key comes from [`EnvelopeKeyConfig`]:
//!
//! - [`EnvelopeKeyConfig::Auto`] (the default): the 32-byte seed in
//!   `WARDEN_ENVELOPE_SIGNING_KEY` (exactly 64 hex digits) if it is set
//!   (the variable wins over a stored key), else the key **stored** in the
//!   database ([`EnvelopeKeyConfig::Stored`]). A malformed variable refuses
//!   to start the server: silently falling back to another key would make
//!   every verifier reject the tokens.
//! - [`EnvelopeKeyConfig::Stored`]: the current key stored in the database
//!   (`warden::envelope_keys`). The first server to start on an empty
//!   database draws a random seed and stores it as generation 1,
//!   create-only: of servers starting together one key is stored and all
//!   use it; later starts and other servers load it, so what one signed
//!   verifies against what every other one publishes, after restarts too.
//!   `warden keys rotate` stores a new current key; the earlier ones stay
//!   published as verifying keys (`GET /v1/envelope-key`,
//!   `verifying_keys`), so what they signed still verifies. A running
//!   server picks a rotation up at its next [`AppState::reload_envelope_keys`]
//!   (`warden serve` reloads every `--sync-interval-ms`).
//!   **The seed is stored in the database as it is: whoever can read the
//!   database can sign envelopes as this deployment.**
//! - [`EnvelopeKeyConfig::Seed`]: that seed.
//! - [`EnvelopeKeyConfig::Random`]: a random key for this process (it
//!   changes at every restart: tokens signed before no longer verify).
//!
//! The issuer id is derived from the public key (`warden:` + its first 8
//! bytes in hex), so each key has its own issuer and a verifier sees a
//! different issuer rather than a forged signature.
//!
//! The seed is never logged, printed or returned: [`EnvelopeSigner`] and
//! [`EnvelopeKeyConfig`] redact it in their `Debug` output.
//!
//! [`AppState::reload_envelope_keys`]: crate::AppState::reload_envelope_keys

use std::fmt;

use warden_core::envelope::IssuerId;
use warden_core::envelope::sign::{SigningKey, VerifyingKey};
use warden_store::SigningKeyRecord;

/// The environment variable holding the signing seed (64 hex digits).
pub const ENVELOPE_SIGNING_KEY_ENV: &str = "WARDEN_ENVELOPE_SIGNING_KEY";

/// Where the envelope signing key comes from.
#[derive(Clone, Default)]
pub enum EnvelopeKeyConfig {
    /// `WARDEN_ENVELOPE_SIGNING_KEY` if set, else the stored key.
    #[default]
    Auto,
    /// The key stored in the database (created on first start).
    Stored,
    /// This 32-byte Ed25519 seed.
    Seed([u8; 32]),
    /// A random key for this process (changes at every restart).
    Random,
}

impl fmt::Debug for EnvelopeKeyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EnvelopeKeyConfig::Auto => "Auto",
            EnvelopeKeyConfig::Stored => "Stored",
            EnvelopeKeyConfig::Seed(_) => "Seed(<redacted>)",
            EnvelopeKeyConfig::Random => "Random",
        })
    }
}

/// Where the key in use came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvelopeKeySource {
    /// `WARDEN_ENVELOPE_SIGNING_KEY`.
    Environment,
    /// A seed given in the configuration.
    Configured,
    /// Random, for this process only: it changes at every restart.
    Random,
    /// Stored in the database, at this generation.
    Stored {
        /// The key's generation (1 for the first, one more per rotation).
        generation: u64,
    },
}

impl EnvelopeKeySource {
    /// The name `GET /v1/envelope-key` reports (`key_source`).
    pub fn as_str(self) -> &'static str {
        match self {
            EnvelopeKeySource::Environment => "environment",
            EnvelopeKeySource::Configured => "configured",
            EnvelopeKeySource::Random => "random",
            EnvelopeKeySource::Stored { .. } => "stored",
        }
    }
}

/// Why the signing key could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeKeyError {
    /// The variable is not 64 hex digits.
    #[error("`{ENVELOPE_SIGNING_KEY_ENV}` must be exactly 64 hex digits (a 32-byte Ed25519 seed)")]
    Malformed,
    /// The variable is not valid Unicode.
    #[error("`{ENVELOPE_SIGNING_KEY_ENV}` is not valid Unicode")]
    NotUnicode,
    /// The operating system's random source failed.
    #[error("could not draw a random signing key: {0}")]
    Random(String),
    /// The store holds no key (a reload found none).
    #[error("the database holds no envelope signing key")]
    NoStoredKey,
}

/// Parse a seed written as 64 hex digits (surrounding whitespace ignored).
pub fn parse_seed(text: &str) -> Result<[u8; 32], EnvelopeKeyError> {
    let text = text.trim();
    let mut seed = [0u8; 32];
    if text.len() != 64 || hex::decode_to_slice(text, &mut seed).is_err() {
        return Err(EnvelopeKeyError::Malformed);
    }
    Ok(seed)
}

/// The key that signs exported envelopes, with its issuer id.
#[derive(Clone)]
pub struct EnvelopeSigner {
    key: SigningKey,
    issuer: IssuerId,
    source: EnvelopeKeySource,
}

impl fmt::Debug for EnvelopeSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvelopeSigner")
            .field("issuer", &self.issuer)
            .field("public_key", &self.public_key_hex())
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl EnvelopeSigner {
    /// The signer `config` names without the database: `None` when the key
    /// is the stored one ([`EnvelopeKeyConfig::Stored`], or
    /// [`EnvelopeKeyConfig::Auto`] without the variable).
    pub fn configured(config: &EnvelopeKeyConfig) -> Result<Option<Self>, EnvelopeKeyError> {
        match config {
            EnvelopeKeyConfig::Seed(seed) => {
                Self::from_seed(seed, EnvelopeKeySource::Configured).map(Some)
            }
            EnvelopeKeyConfig::Random => Self::random().map(Some),
            EnvelopeKeyConfig::Stored => Ok(None),
            EnvelopeKeyConfig::Auto => match std::env::var(ENVELOPE_SIGNING_KEY_ENV) {
                Ok(text) => {
                    Self::from_seed(&parse_seed(&text)?, EnvelopeKeySource::Environment).map(Some)
                }
                Err(std::env::VarError::NotPresent) => Ok(None),
                Err(std::env::VarError::NotUnicode(_)) => Err(EnvelopeKeyError::NotUnicode),
            },
        }
    }

    fn random() -> Result<Self, EnvelopeKeyError> {
        Self::from_seed(&random_seed()?, EnvelopeKeySource::Random)
    }

    /// The signer of a stored key.
    pub fn stored(key: &SigningKeyRecord) -> Result<Self, EnvelopeKeyError> {
        Self::from_seed(
            &key.seed,
            EnvelopeKeySource::Stored {
                generation: key.generation,
            },
        )
    }

    fn from_seed(seed: &[u8; 32], source: EnvelopeKeySource) -> Result<Self, EnvelopeKeyError> {
        let key = SigningKey::from_bytes(seed);
        let issuer = issuer_of(&key.verifying_key().to_bytes())?;
        Ok(Self {
            key,
            issuer,
            source,
        })
    }

    /// The signing key.
    pub fn key(&self) -> &SigningKey {
        &self.key
    }

    /// The issuer id tokens and receipts name.
    pub fn issuer(&self) -> &IssuerId {
        &self.issuer
    }

    /// The public key verifiers trust for [`EnvelopeSigner::issuer`].
    pub fn verifying_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// The public key as 64 lowercase hex digits.
    pub fn public_key_hex(&self) -> String {
        hex::encode(self.key.verifying_key().to_bytes())
    }

    /// Where the key came from.
    pub fn source(&self) -> EnvelopeKeySource {
        self.source
    }
}

/// A random 32-byte seed from the operating system.
pub fn random_seed() -> Result<[u8; 32], EnvelopeKeyError> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| EnvelopeKeyError::Random(e.to_string()))?;
    Ok(seed)
}

/// The issuer id of a public key: `warden:` + its first 8 bytes in hex.
pub fn issuer_of(public_key: &[u8; 32]) -> Result<IssuerId, EnvelopeKeyError> {
    let short = hex::encode(public_key.get(..8).unwrap_or(public_key));
    // `warden:` + 16 hex digits is always a valid identifier.
    IssuerId::parse(&format!("warden:{short}")).map_err(|_| EnvelopeKeyError::Malformed)
}

/// A key that verifies envelopes this deployment signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedKey {
    /// Its issuer id.
    pub issuer: IssuerId,
    /// The Ed25519 public key.
    pub public_key: [u8; 32],
    /// Its generation, for a stored key.
    pub generation: Option<u64>,
}

/// The signer in use and every key that verifies what this deployment
/// signed, oldest first (the current key last).
#[derive(Debug, Clone)]
pub struct EnvelopeKeys {
    signer: EnvelopeSigner,
    verifying: Vec<PublishedKey>,
}

impl EnvelopeKeys {
    /// One key that is not stored: it alone verifies.
    pub fn single(signer: EnvelopeSigner) -> Self {
        let verifying = vec![PublishedKey {
            issuer: signer.issuer.clone(),
            public_key: signer.verifying_key().to_bytes(),
            generation: None,
        }];
        Self { signer, verifying }
    }

    /// The stored keys (by generation): the last signs, all verify.
    pub fn stored(keys: &[SigningKeyRecord]) -> Result<Self, EnvelopeKeyError> {
        let current = keys.last().ok_or(EnvelopeKeyError::NoStoredKey)?;
        let signer = EnvelopeSigner::stored(current)?;
        let verifying = keys
            .iter()
            .map(|k| {
                Ok(PublishedKey {
                    issuer: issuer_of(&k.public_key)?,
                    public_key: k.public_key,
                    generation: Some(k.generation),
                })
            })
            .collect::<Result<_, EnvelopeKeyError>>()?;
        Ok(Self { signer, verifying })
    }

    /// The key that signs.
    pub fn signer(&self) -> &EnvelopeSigner {
        &self.signer
    }

    /// Every key that verifies, the signer's included, oldest first.
    pub fn verifying(&self) -> &[PublishedKey] {
        &self.verifying
    }

    /// The issuers and keys a verifier trusts for this deployment (what a
    /// bundle's `trusted_issuers` would list).
    pub fn trusted(&self) -> std::collections::BTreeMap<IssuerId, VerifyingKey> {
        self.verifying
            .iter()
            .filter_map(|k| {
                VerifyingKey::from_bytes(&k.public_key)
                    .ok()
                    .map(|v| (k.issuer.clone(), v))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_strictly_and_debug_redacts() {
        let seed = parse_seed(&"ab".repeat(32)).unwrap();
        assert_eq!(seed, [0xab; 32]);
        for bad in ["", "ab", &"zz".repeat(32), &"ab".repeat(33)] {
            assert_eq!(parse_seed(bad), Err(EnvelopeKeyError::Malformed), "{bad}");
        }
        let s = EnvelopeSigner::configured(&EnvelopeKeyConfig::Seed(seed))
            .unwrap()
            .unwrap();
        assert_eq!(s.source(), EnvelopeKeySource::Configured);
        assert!(s.issuer().as_str().starts_with("warden:"));
        let debug = format!("{s:?} {:?}", EnvelopeKeyConfig::Seed(seed));
        assert!(!debug.contains(&"ab".repeat(32)), "{debug}");
        let again = EnvelopeSigner::configured(&EnvelopeKeyConfig::Seed(seed))
            .unwrap()
            .unwrap();
        assert_eq!(again.public_key_hex(), s.public_key_hex());
        let r = EnvelopeSigner::configured(&EnvelopeKeyConfig::Random)
            .unwrap()
            .unwrap();
        assert!(
            EnvelopeSigner::configured(&EnvelopeKeyConfig::Stored)
                .unwrap()
                .is_none()
        );
        assert_ne!(r.public_key_hex(), s.public_key_hex());
        assert_ne!(r.issuer(), s.issuer());
    }
}
