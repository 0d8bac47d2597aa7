//! Keyed token fingerprints: HMAC-SHA-256 (RFC 2104) truncated to 64 bits.
//!
//! The key is the caller's (the core has no randomness); the keyed inner
//! and outer hash states are computed once, so a fingerprint costs two
//! SHA-256 compressions. Without the key, nobody holding a serialised index
//! can test guesses against it, and an attacker cannot aim a collision.

use std::fmt;

use sha2::{Digest as _, Sha256};

use super::IndexError;

/// SHA-256's block size, the HMAC key block.
const BLOCK: usize = 64;
/// Shortest key accepted, in bytes.
pub const MIN_KEY_LEN: usize = 16;
/// Longest key accepted, in bytes (one SHA-256 block).
pub const MAX_KEY_LEN: usize = BLOCK;

/// Which token stream a fingerprint belongs to (domain separation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Exact = 1,
    Caseless = 2,
    Skeleton = 3,
    KeyCheck = 0xff,
}

/// The key of an index's fingerprints. Its `Debug` never prints the key.
#[derive(Clone)]
pub struct FingerprintKey {
    inner: Sha256,
    outer: Sha256,
}

impl fmt::Debug for FingerprintKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FingerprintKey(..)")
    }
}

impl FingerprintKey {
    /// A key from 16 to 64 bytes of secret, random material the caller
    /// keeps (the same key must be passed to restore a serialised index).
    pub fn new(key: &[u8]) -> Result<Self, IndexError> {
        if !(MIN_KEY_LEN..=MAX_KEY_LEN).contains(&key.len()) {
            return Err(IndexError::KeyLength { len: key.len() });
        }
        let mut block = [0u8; BLOCK];
        for (b, k) in block.iter_mut().zip(key) {
            *b = *k;
        }
        let mut inner = Sha256::new();
        inner.update(block.map(|b| b ^ 0x36));
        let mut outer = Sha256::new();
        outer.update(block.map(|b| b ^ 0x5c));
        Ok(Self { inner, outer })
    }

    /// HMAC-SHA-256 of the concatenated `parts`.
    pub(crate) fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut inner = self.inner.clone();
        for part in parts {
            inner.update(part);
        }
        let mut outer = self.outer.clone();
        outer.update(inner.finalize());
        outer.finalize().into()
    }

    /// The 64-bit fingerprint of `token` in `stream`.
    pub(crate) fn fingerprint(&self, stream: Stream, token: &str) -> u64 {
        let mac = self.mac(&[&[stream as u8], token.as_bytes()]);
        mac.first_chunk::<8>().map_or(0, |b| u64::from_le_bytes(*b))
    }

    /// A value derived from the key that lets a restored index check it was
    /// given the key it was built with.
    pub(crate) fn check_value(&self) -> u64 {
        self.fingerprint(Stream::KeyCheck, "warden-provenance-key-check")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 1 has a 20-byte key of 0x0b.
        let key = FingerprintKey::new(&[0x0b; 20]).unwrap();
        assert_eq!(
            hex::encode(key.mac(&[b"Hi There"])),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        // Test case 4: a 25-byte key 0x01..0x19, 50 bytes of 0xcd, split.
        let k: Vec<u8> = (1..=25).collect();
        let key = FingerprintKey::new(&k).unwrap();
        assert_eq!(
            hex::encode(key.mac(&[&[0xcd; 20], &[0xcd; 30]])),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"
        );
    }

    #[test]
    fn key_length_is_checked_and_never_printed() {
        assert_eq!(
            FingerprintKey::new(&[1; 15]).unwrap_err(),
            IndexError::KeyLength { len: 15 }
        );
        assert!(FingerprintKey::new(&[1; 65]).is_err());
        let key = FingerprintKey::new(&[7; 32]).unwrap();
        assert_eq!(format!("{key:?}"), "FingerprintKey(..)");
    }

    #[test]
    fn streams_and_keys_separate_fingerprints() {
        let a = FingerprintKey::new(&[1; 32]).unwrap();
        let b = FingerprintKey::new(&[2; 32]).unwrap();
        assert_ne!(
            a.fingerprint(Stream::Exact, "x"),
            a.fingerprint(Stream::Caseless, "x")
        );
        assert_ne!(
            a.fingerprint(Stream::Exact, "x"),
            b.fingerprint(Stream::Exact, "x")
        );
        assert_ne!(a.check_value(), b.check_value());
    }
}
