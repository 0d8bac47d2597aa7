//! The server's envelope signing key: the Ed25519 key that signs exported
//! context envelopes (`GET /v1/runs/{run}/envelope/signed`) and names the
//! issuer of receipts.
//!
//! The key comes from [`EnvelopeKeyConfig`]:
//!
//! - [`EnvelopeKeyConfig::Auto`] (the default): the 32-byte seed in
//!   `WARDEN_ENVELOPE_SIGNING_KEY` (exactly 64 hex digits) if it is set,
//!   else a random key drawn from the operating system for this process.
//!   A malformed variable refuses to start the server: silently falling
//!   back to a random key would make every verifier reject the tokens.
//! - [`EnvelopeKeyConfig::Seed`]: that seed.
//! - [`EnvelopeKeyConfig::Random`]: a random key for this process.
//!
//! **A random key changes at every restart**: tokens signed before a restart
//! no longer verify against the key published after it
//! (`GET /v1/envelope-key`). The issuer id is derived from the public key
//! (`warden:` + its first 8 bytes in hex), so a verifier sees a different
//! issuer rather than a forged signature. Set `WARDEN_ENVELOPE_SIGNING_KEY`
//! for a key that survives restarts and is shared by every process of one
//! deployment.
//!
//! The seed is never logged, printed or returned: [`EnvelopeSigner`] and
//! [`EnvelopeKeyConfig`] redact it in their `Debug` output.

use std::fmt;

use warden_core::envelope::IssuerId;
use warden_core::envelope::sign::{SigningKey, VerifyingKey};

/// The environment variable holding the signing seed (64 hex digits).
pub const ENVELOPE_SIGNING_KEY_ENV: &str = "WARDEN_ENVELOPE_SIGNING_KEY";

/// Where the envelope signing key comes from.
#[derive(Clone, Default)]
pub enum EnvelopeKeyConfig {
    /// `WARDEN_ENVELOPE_SIGNING_KEY` if set, else a random per-process key.
    #[default]
    Auto,
    /// This 32-byte Ed25519 seed.
    Seed([u8; 32]),
    /// A random key for this process (changes at every restart).
    Random,
}

impl fmt::Debug for EnvelopeKeyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EnvelopeKeyConfig::Auto => "Auto",
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
    /// The signer `config` describes (reading the environment for
    /// [`EnvelopeKeyConfig::Auto`]).
    pub fn new(config: &EnvelopeKeyConfig) -> Result<Self, EnvelopeKeyError> {
        match config {
            EnvelopeKeyConfig::Seed(seed) => Self::from_seed(seed, EnvelopeKeySource::Configured),
            EnvelopeKeyConfig::Random => Self::random(),
            EnvelopeKeyConfig::Auto => match std::env::var(ENVELOPE_SIGNING_KEY_ENV) {
                Ok(text) => Self::from_seed(&parse_seed(&text)?, EnvelopeKeySource::Environment),
                Err(std::env::VarError::NotPresent) => Self::random(),
                Err(std::env::VarError::NotUnicode(_)) => Err(EnvelopeKeyError::NotUnicode),
            },
        }
    }

    fn random() -> Result<Self, EnvelopeKeyError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| EnvelopeKeyError::Random(e.to_string()))?;
        Self::from_seed(&seed, EnvelopeKeySource::Random)
    }

    fn from_seed(seed: &[u8; 32], source: EnvelopeKeySource) -> Result<Self, EnvelopeKeyError> {
        let key = SigningKey::from_bytes(seed);
        let public = key.verifying_key().to_bytes();
        let short = hex::encode(public.get(..8).unwrap_or(&public));
        // `warden:` + 16 hex digits is always a valid identifier.
        let issuer =
            IssuerId::parse(&format!("warden:{short}")).map_err(|_| EnvelopeKeyError::Malformed)?;
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
        let s = EnvelopeSigner::new(&EnvelopeKeyConfig::Seed(seed)).unwrap();
        assert_eq!(s.source(), EnvelopeKeySource::Configured);
        assert!(s.issuer().as_str().starts_with("warden:"));
        let debug = format!("{s:?} {:?}", EnvelopeKeyConfig::Seed(seed));
        assert!(!debug.contains(&"ab".repeat(32)), "{debug}");
        let again = EnvelopeSigner::new(&EnvelopeKeyConfig::Seed(seed)).unwrap();
        assert_eq!(again.public_key_hex(), s.public_key_hex());
        let r = EnvelopeSigner::new(&EnvelopeKeyConfig::Random).unwrap();
        assert_ne!(r.public_key_hex(), s.public_key_hex());
        assert_ne!(r.issuer(), s.issuer());
    }
}
