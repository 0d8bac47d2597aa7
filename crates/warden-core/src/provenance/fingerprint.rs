//! Keyed token fingerprints.
//!
//! Two schemes, named by the index encoding's version:
//!
//! - [`Scheme::SipHash`] (version 2, every new index): SipHash-2-4, a
//!   pseudo-random function for short inputs under a 128-bit key
//!   (Aumasson and Bernstein, 2012), keyed with 128 bits derived from the
//!   caller's key by HMAC-SHA-256. A token costs a few dozen instructions.
//! - [`Scheme::HmacSha256`] (version 1): HMAC-SHA-256 (RFC 2104) truncated
//!   to 64 bits, two SHA-256 compressions per token. Kept so an index
//!   encoded before version 2 restores and answers exactly as it did.
//!
//! The key is the caller's (the core has no randomness). Without it,
//! nobody holding a serialised index can test guesses against it, and an
//! attacker cannot aim a collision: both schemes are keyed PRFs with
//! 64-bit outputs.

use std::fmt;
use std::hash::Hasher as _;

use sha2::{Digest as _, Sha256};
use siphasher::sip::SipHasher24;

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

/// How an index computes its fingerprints (see the module docs); the
/// discriminant is the version of the index's encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    /// Version 1: HMAC-SHA-256, truncated.
    HmacSha256 = 1,
    /// Version 2: SipHash-2-4 under a derived key.
    SipHash = 2,
}

impl Scheme {
    /// The scheme of an encoding version, if known.
    pub(crate) fn of_version(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::HmacSha256),
            2 => Some(Self::SipHash),
            _ => None,
        }
    }
}

/// The key of an index's fingerprints. Its `Debug` never prints the key.
#[derive(Clone)]
pub struct FingerprintKey {
    inner: Sha256,
    outer: Sha256,
    sip: SipHasher24,
}

impl fmt::Debug for FingerprintKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FingerprintKey(..)")
    }
}

/// What the SipHash key is derived with (HMAC-SHA-256 of this under the
/// caller's key, its first 16 bytes).
const SIP_KEY_LABEL: &[u8] = b"warden-provenance-siphash-2-4-key";

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
        let mut this = Self {
            inner,
            outer,
            sip: SipHasher24::new(),
        };
        let derived = this.mac(&[SIP_KEY_LABEL]);
        let half = |at: usize| {
            derived
                .get(at..at + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map_or(0, u64::from_le_bytes)
        };
        this.sip = SipHasher24::new_with_keys(half(0), half(8));
        Ok(this)
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

    /// The 64-bit fingerprint of `token` in `stream` under `scheme`.
    #[inline]
    pub(crate) fn fingerprint(&self, scheme: Scheme, stream: Stream, token: &str) -> u64 {
        match scheme {
            Scheme::SipHash => {
                let mut h = self.sip;
                h.write_u8(stream as u8);
                h.write(token.as_bytes());
                h.finish()
            }
            Scheme::HmacSha256 => {
                let mac = self.mac(&[&[stream as u8], token.as_bytes()]);
                mac.first_chunk::<8>().map_or(0, |b| u64::from_le_bytes(*b))
            }
        }
    }

    /// A value derived from the key that lets a restored index check it was
    /// given the key it was built with.
    pub(crate) fn check_value(&self, scheme: Scheme) -> u64 {
        self.fingerprint(scheme, Stream::KeyCheck, "warden-provenance-key-check")
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
    fn fingerprints_are_pinned() {
        // An encoded index is restored by recomputing nothing but the key
        // check: a change of either scheme would silently stop old indexes
        // matching new needles.
        let key = FingerprintKey::new(&[7; 32]).unwrap();
        let got = [Scheme::HmacSha256, Scheme::SipHash]
            .map(|s| format!("{:016x}", key.fingerprint(s, Stream::Exact, "alice")));
        assert_eq!(got, ["47043dede59e4e70", "737a8730a425303d"]);
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
        for scheme in [Scheme::HmacSha256, Scheme::SipHash] {
            assert_ne!(
                a.fingerprint(scheme, Stream::Exact, "x"),
                a.fingerprint(scheme, Stream::Caseless, "x")
            );
            assert_ne!(
                a.fingerprint(scheme, Stream::Exact, "x"),
                b.fingerprint(scheme, Stream::Exact, "x")
            );
            assert_ne!(a.check_value(scheme), b.check_value(scheme));
        }
        assert_ne!(
            a.fingerprint(Scheme::HmacSha256, Stream::Exact, "x"),
            a.fingerprint(Scheme::SipHash, Stream::Exact, "x")
        );
    }
}
