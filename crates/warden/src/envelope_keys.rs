//! Envelope signing keys kept in the store, so every server sharing it
//! signs with one key and verifies what any of them signed before.
//!
//! Keys are numbered by generation from 1; the highest is the **current**
//! key (it signs), every earlier one stays a **verifying** key (what it
//! signed still verifies). On first start a server stores the fresh seed
//! it drew as generation 1, create-only ([`load_or_create`]): of servers
//! starting together exactly one key is stored and all of them use it.
//! [`rotate`] stores a new current key as the next generation (`warden
//! keys rotate`); servers learn of it when they reload the keys (`warden
//! serve` reloads them on a bound, see its docs).
//!
//! Recorded, subject the operator: `envelope_key.create` (the first key)
//! and `envelope_key.rotate`, resource `generation N`, details the
//! generation and public key (never the seed). The seed is stored as it
//! is: whoever can read the database can sign envelopes.

use serde_json::json;
use warden_core::audit::AuditDraft;
use warden_core::decision::{Decision, Reason, Subject, Verdict};
use warden_core::envelope::sign::SigningKey;
use warden_core::time::Timestamp;
use warden_store::{SigningKeyRecord, Store};

use crate::error::{ConflictKind, EngineError};

/// The operation recorded when the first key is stored.
pub const ENVELOPE_KEY_CREATE: &str = "envelope_key.create";
/// The operation recorded when a new current key is stored.
pub const ENVELOPE_KEY_ROTATE: &str = "envelope_key.rotate";
/// The reason recorded with either.
pub const ENVELOPE_KEY_STORED: Reason = Reason::code("envelope_key_stored");

/// The key record of `seed` at `generation`.
pub fn key_record(seed: [u8; 32], generation: u64, now: Timestamp) -> SigningKeyRecord {
    let public_key = SigningKey::from_bytes(&seed).verifying_key().to_bytes();
    SigningKeyRecord {
        generation,
        seed,
        public_key,
        created_at: now,
    }
}

fn drafts(
    operation: &str,
    key: &SigningKeyRecord,
    policy_version: &str,
    now: Timestamp,
) -> Vec<AuditDraft> {
    let decision = Decision {
        verdict: Verdict::Allow,
        reason: ENVELOPE_KEY_STORED,
        subject: Subject::Operator,
        operation: operation.into(),
        resource: format!("generation {}", key.generation).into(),
        policy_version: policy_version.into(),
        obligations: Vec::new(),
        time: now,
    };
    vec![AuditDraft::from_decision(&decision).with_details(json!({
        "generation": key.generation,
        "public_key": hex::encode(key.public_key),
    }))]
}

/// The stored keys (by generation, the last current); when there are none,
/// `fresh_seed` is stored as generation 1 first (create-only, recorded
/// `envelope_key.create`), and if another server's first key won, that
/// one is returned. Never empty.
pub async fn load_or_create<S: Store>(
    store: &S,
    fresh_seed: [u8; 32],
    now: Timestamp,
    policy_version: &str,
) -> Result<Vec<SigningKeyRecord>, EngineError> {
    let keys = store.signing_keys().await?;
    if !keys.is_empty() {
        return Ok(keys);
    }
    let first = key_record(fresh_seed, 1, now);
    let audit = drafts(ENVELOPE_KEY_CREATE, &first, policy_version, now);
    store.insert_signing_key(first, audit).await?;
    let keys = store.signing_keys().await?;
    if keys.is_empty() {
        return Err(EngineError::internal(
            "the envelope signing key was stored but reads back missing",
        ));
    }
    Ok(keys)
}

/// Store `seed` as the new current key (the generation after the stored
/// current one, or 1), recorded `envelope_key.rotate`. A concurrent
/// rotation that took the generation first is
/// [`EngineError::Conflict`] ([`ConflictKind::Duplicate`]) and stores
/// nothing: retry.
pub async fn rotate<S: Store>(
    store: &S,
    seed: [u8; 32],
    now: Timestamp,
    policy_version: &str,
) -> Result<SigningKeyRecord, EngineError> {
    let keys = store.signing_keys().await?;
    let generation = keys.last().map_or(1, |k| k.generation.saturating_add(1));
    let key = key_record(seed, generation, now);
    let audit = drafts(ENVELOPE_KEY_ROTATE, &key, policy_version, now);
    if store.insert_signing_key(key.clone(), audit).await? {
        Ok(key)
    } else {
        Err(EngineError::Conflict {
            kind: ConflictKind::Duplicate,
            id: format!("envelope signing key generation {generation}"),
        })
    }
}

impl<S: Store> crate::Engine<S> {
    /// The stored envelope signing keys, storing `fresh_seed` as the first
    /// when there are none ([`load_or_create`], under this engine's policy
    /// version and clock).
    pub async fn envelope_keys_or_create(
        &self,
        fresh_seed: [u8; 32],
    ) -> Result<Vec<SigningKeyRecord>, EngineError> {
        load_or_create(
            &self.inner.store,
            fresh_seed,
            self.now(),
            &self.inner.policy.version,
        )
        .await
    }

    /// The stored envelope signing keys, by generation (empty when none
    /// was stored yet).
    pub async fn envelope_keys(&self) -> Result<Vec<SigningKeyRecord>, EngineError> {
        Ok(self.inner.store.signing_keys().await?)
    }

    /// Store `seed` as the new current envelope signing key ([`rotate`]).
    pub async fn rotate_envelope_key(
        &self,
        seed: [u8; 32],
    ) -> Result<SigningKeyRecord, EngineError> {
        rotate(
            &self.inner.store,
            seed,
            self.now(),
            &self.inner.policy.version,
        )
        .await
    }
}
