//! Envelope signing keys kept in the store, so every server sharing it
//! signs with one key and verifies what any of them signed before.

use std::fmt;

use warden_core::time::Timestamp;

use crate::{Entity, StoreError};

/// One envelope signing key. Keys are numbered by `generation` from 1; the
/// highest generation is the current key, the others stay published as
/// verifying keys. A generation is written once ([`Store::insert_signing_key`]
/// is create-only) and never changed or removed.
///
/// The seed is stored as it is: whoever can read the database can sign
/// envelopes. `Debug` leaves it out.
///
/// [`Store::insert_signing_key`]: crate::Store::insert_signing_key
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKeyRecord {
    /// 1, 2, …: the order of rotations.
    pub generation: u64,
    /// The 32-byte Ed25519 seed.
    pub seed: [u8; 32],
    /// Its public key.
    pub public_key: [u8; 32],
    /// When it was made.
    pub created_at: Timestamp,
}

impl fmt::Debug for SigningKeyRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKeyRecord")
            .field("generation", &self.generation)
            .field("public_key", &hex_of(&self.public_key))
            .field("created_at", &self.created_at)
            .finish_non_exhaustive()
    }
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A key a store accepts: generation 1 or more (else
/// [`StoreError::Invalid`], and nothing is stored).
pub fn check_signing_key(key: &SigningKeyRecord) -> Result<(), StoreError> {
    if key.generation == 0 || i64::try_from(key.generation).is_err() {
        return Err(StoreError::invalid(
            Entity::SigningKey,
            key.generation,
            "generations are numbered from 1",
        ));
    }
    Ok(())
}
