//! Bearer tokens: issuing, revoking and the operator's token at startup.
//!
//! A token is `wdn_` followed by 64 hex digits: 256 bits from the operating
//! system's random source. Only its SHA-256 is stored
//! ([`TokenRecord::hash`]), under a public `token_id` (`tok_` + 16 hex
//! digits) that names it for revocation. Issuing and revoking are decisions
//! recorded in the same transaction as the token change (`token.issue` /
//! `token_issued` with the token id in the details, `token.revoke` /
//! `token_revoked`). Checking a token on a request is
//! [`Engine::authenticate`](crate::Engine::authenticate).
//!
//! ## The token cache
//!
//! An engine keeps the tokens it has found active in a cache
//! (`TokenCache`, by hash), so a request whose token it has seen costs
//! no read. A revocation through this engine takes its token out of the
//! cache once the store has committed it, before the revocation is
//! answered; one through another engine sharing the store reaches this one
//! by [`Engine::forget_tokens`] (the change feed, on PostgreSQL) or
//! [`Engine::forget_all_tokens`] (the periodic reconcile), the bound the
//! hierarchy cache has too. Every forget moves the cache to a new
//! generation, and a lookup that read the store under an older generation
//! does not fill it: a read that raced a revocation is used once, never
//! kept. Revoked tokens are never cached, and the agent a token names is
//! checked against the hierarchy on every request, so revoking an agent
//! needs no forget.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use serde_json::json;
use warden_core::audit::Digest;
use warden_core::decision::{Decision, Verdict};
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{AgentId, check_identifier};
use warden_store::{Store, StoreError, TokenRecord, TokenSubject};

use crate::engine::{Caller, Engine, engine_reasons as er, ops};
use crate::error::EngineError;

/// Every token starts with this.
pub const TOKEN_PREFIX: &str = "wdn_";
/// The `token_id` of the operator token generated on first start.
pub const GENERATED_OPERATOR_TOKEN_ID: &str = "operator";
/// Longest token (and `Authorization` value) looked at.
pub const MAX_TOKEN_LEN: usize = 512;
/// Shortest operator token accepted from the environment.
pub const MIN_OPERATOR_TOKEN_LEN: usize = 32;

/// Most tokens a [`TokenCache`] holds; a fill past it starts it afresh.
const TOKEN_CACHE_CAPACITY: usize = 65_536;

/// Active tokens an engine has found, by the hash of their secret (see
/// the module docs).
#[derive(Default)]
pub(crate) struct TokenCache {
    state: Mutex<TokenCacheState>,
}

#[derive(Default)]
struct TokenCacheState {
    generation: u64,
    by_hash: HashMap<[u8; 32], TokenRecord>,
}

impl TokenCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, TokenCacheState> {
        // The state is a map and a counter, consistent at every await-free
        // step: a panic elsewhere cannot leave it half-changed.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached record of `hash`, or the generation a fill from the
    /// store must carry.
    pub(crate) fn get(&self, hash: &Digest) -> Result<TokenRecord, u64> {
        let state = self.lock();
        state.by_hash.get(&hash.0).cloned().ok_or(state.generation)
    }

    /// Keep `record`, read from the store under `generation`, unless a
    /// forget came in between or it is revoked.
    pub(crate) fn fill(&self, generation: u64, record: &TokenRecord) {
        if record.revoked {
            return;
        }
        let mut state = self.lock();
        if state.generation != generation {
            return;
        }
        if state.by_hash.len() >= TOKEN_CACHE_CAPACITY {
            state.by_hash.clear();
        }
        state.by_hash.insert(record.hash.0, record.clone());
    }

    /// Drop the tokens with these ids.
    pub(crate) fn forget(&self, token_ids: &[&str]) {
        let mut state = self.lock();
        state.generation += 1;
        state
            .by_hash
            .retain(|_, r| !token_ids.contains(&r.token_id.as_str()));
    }

    /// Drop every token.
    pub(crate) fn forget_all(&self) {
        let mut state = self.lock();
        state.generation += 1;
        state.by_hash.clear();
    }

    /// How many tokens are cached.
    pub(crate) fn len(&self) -> usize {
        self.lock().by_hash.len()
    }
}

/// A freshly issued token: the secret is shown once, never stored (and
/// never printed by `Debug`).
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedToken {
    /// Public id, for revocation.
    pub token_id: String,
    /// The bearer secret.
    pub secret: String,
}

impl fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedToken")
            .field("token_id", &self.token_id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// The stored form of a token: SHA-256 of its bytes.
pub fn hash_token(secret: &str) -> Digest {
    Digest::of(secret.as_bytes())
}

/// Whether `secret` has the shape of a token anyone could hold: non-empty,
/// at most [`MAX_TOKEN_LEN`] bytes of printable ASCII without spaces.
pub(crate) fn well_formed(secret: &str) -> bool {
    !secret.is_empty()
        && secret.len() <= MAX_TOKEN_LEN
        && secret.bytes().all(|b| b.is_ascii_graphic())
}

fn random_hex(bytes: usize) -> Result<String, String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| format!("no randomness for a token: {e}"))?;
    Ok(hex::encode(buf))
}

/// A new random token (256 bits) and token id.
fn new_token() -> Result<IssuedToken, String> {
    Ok(IssuedToken {
        token_id: format!("tok_{}", random_hex(8)?),
        secret: format!("{TOKEN_PREFIX}{}", random_hex(32)?),
    })
}

/// What [`Engine::issue_token`] did.
#[derive(Debug, Clone)]
pub enum TokenIssue {
    /// The token was stored (its hash) and the issue recorded.
    Issued {
        /// The token; its secret exists only here.
        token: IssuedToken,
        /// The recorded decision (`token.issue`, `token_issued`).
        decision: Decision,
    },
    /// The agent is revoked: a token for it would be refused on every
    /// request, so none was made. Nothing was stored or recorded.
    AgentRevoked {
        /// The agent.
        agent: AgentId,
    },
}

/// What [`Engine::revoke_token`] did.
#[derive(Debug, Clone)]
pub enum TokenRevocation {
    /// The token was revoked and the revocation recorded.
    Revoked {
        /// The recorded decision (`token.revoke`, `token_revoked`).
        decision: Decision,
    },
    /// No active token has that id (unknown, or revoked before); nothing
    /// was recorded.
    Unknown {
        /// The id as given.
        token_id: String,
    },
}

/// Where the operator token came from at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorTokenSource {
    /// `WARDEN_OPERATOR_TOKEN` (stored hashed if it was not yet).
    Environment,
    /// Generated now, on the first start with this database: shown once.
    Generated(String),
    /// Generated on an earlier start; only its hash is stored.
    Existing,
}

/// Why the operator token could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OperatorTokenError {
    /// The environment's token is too short.
    #[error(
        "`WARDEN_OPERATOR_TOKEN` is {0} characters long; use at least {MIN_OPERATOR_TOKEN_LEN} random characters"
    )]
    TooShort(usize),
    /// The environment's token has characters that cannot go in a header.
    #[error("`WARDEN_OPERATOR_TOKEN` must be printable ASCII without spaces")]
    BadCharacters,
    /// The environment's token was revoked in this database.
    #[error("`WARDEN_OPERATOR_TOKEN` was revoked in this database; choose a new one")]
    Revoked,
    /// The environment's token belongs to an agent.
    #[error("`WARDEN_OPERATOR_TOKEN` is an agent's token in this database")]
    NotOperator,
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Randomness failed.
    #[error("could not generate a token: {0}")]
    Random(String),
}

impl<S: Store> Engine<S> {
    /// Take the tokens with these ids out of this engine's token cache: a
    /// revocation another engine sharing the store made (the change feed
    /// says which). Unknown ids are ignored.
    pub fn forget_tokens(&self, token_ids: &[&str]) {
        self.inner.tokens.forget(token_ids);
    }

    /// Empty this engine's token cache, so every token is read from the
    /// store again on its next request: after changes this engine may
    /// have missed (a reconnect of the change feed, the periodic
    /// reconcile).
    pub fn forget_all_tokens(&self) {
        self.inner.tokens.forget_all();
    }

    /// How many active tokens this engine has cached.
    pub fn cached_tokens(&self) -> usize {
        self.inner.tokens.len()
    }

    /// Issue a token for `subject`, recorded as issued by `issuer`
    /// (`token.issue`). An unknown agent is [`EngineError::NotFound`]; a
    /// revoked one is [`TokenIssue::AgentRevoked`].
    pub async fn issue_token(
        &self,
        issuer: &Caller,
        subject: TokenSubject,
    ) -> Result<TokenIssue, EngineError> {
        if let TokenSubject::Agent(agent) = &subject
            && self.agent(agent)?.status == AgentStatus::Revoked
        {
            return Ok(TokenIssue::AgentRevoked {
                agent: agent.clone(),
            });
        }
        let token = new_token().map_err(EngineError::internal)?;
        let decision = self.insert_token(&token, subject, issuer).await?;
        Ok(TokenIssue::Issued { token, decision })
    }

    /// Store `token` for `subject` with its `token.issue` decision.
    async fn insert_token(
        &self,
        token: &IssuedToken,
        subject: TokenSubject,
        issuer: &Caller,
    ) -> Result<Decision, StoreError> {
        let now = self.now();
        let resource = match &subject {
            TokenSubject::Operator => Caller::OPERATOR.to_owned(),
            TokenSubject::Agent(a) => a.to_string(),
        };
        let decision = self.decision(
            issuer,
            Verdict::Allow,
            er::TOKEN_ISSUED,
            ops::TOKEN_ISSUE,
            resource,
            now,
        );
        let draft = self
            .draft(&decision)
            .with_details(json!({"token_id": token.token_id}));
        let record = TokenRecord {
            token_id: token.token_id.clone(),
            hash: hash_token(&token.secret),
            subject,
            created_at: now,
            revoked: false,
        };
        self.inner.store.insert_token(record, vec![draft]).await?;
        Ok(decision)
    }

    /// Revoke the token named `token_id`, recorded as revoked by `by`
    /// (`token.revoke`). The agent it names stays active.
    pub async fn revoke_token(
        &self,
        by: &Caller,
        token_id: &str,
    ) -> Result<TokenRevocation, EngineError> {
        let unknown = || TokenRevocation::Unknown {
            token_id: token_id.to_owned(),
        };
        // No stored token has an id that is not an identifier.
        if check_identifier(token_id).is_err() {
            return Ok(unknown());
        }
        let decision = self.decision(
            by,
            Verdict::Allow,
            er::TOKEN_REVOKED,
            ops::TOKEN_REVOKE,
            token_id.to_owned(),
            self.now(),
        );
        let revoked = self
            .inner
            .store
            .revoke_token(token_id.to_owned(), vec![self.draft(&decision)])
            .await;
        // Whatever the store said: a failed commit may still have
        // committed.
        self.inner.tokens.forget(&[token_id]);
        Ok(if revoked? {
            TokenRevocation::Revoked { decision }
        } else {
            unknown()
        })
    }

    /// Make sure an operator token exists: the one from the environment if
    /// given (stored hashed on first use), else the one generated on an
    /// earlier start, else a new one (returned so the caller can print it
    /// once). Tolerates another engine sharing the store storing the same
    /// token first.
    pub async fn ensure_operator_token(
        &self,
        from_env: Option<&str>,
    ) -> Result<OperatorTokenSource, OperatorTokenError> {
        if let Some(secret) = from_env {
            if secret.len() < MIN_OPERATOR_TOKEN_LEN {
                return Err(OperatorTokenError::TooShort(secret.len()));
            }
            if !well_formed(secret) {
                return Err(OperatorTokenError::BadCharacters);
            }
            let hash = hash_token(secret);
            let found = self.inner.store.find_token(hash).await?;
            if check_operator_token(found.as_ref())? {
                return Ok(OperatorTokenSource::Environment);
            }
            let token = IssuedToken {
                token_id: format!("operator-env-{}", hash.to_hex().get(..12).unwrap_or("")),
                secret: secret.to_owned(),
            };
            match self
                .insert_token(&token, TokenSubject::Operator, &Caller::Operator)
                .await
            {
                Ok(_) => {}
                // Another server sharing the database, starting at the same
                // time with the same token, stored it first.
                Err(StoreError::Duplicate { .. }) => {
                    let found = self.inner.store.find_token(hash).await?;
                    if !check_operator_token(found.as_ref())? {
                        return Err(StoreError::duplicate(
                            warden_store::Entity::Token,
                            token.token_id,
                        )
                        .into());
                    }
                }
                Err(e) => return Err(e.into()),
            }
            return Ok(OperatorTokenSource::Environment);
        }
        let mut token = new_token().map_err(OperatorTokenError::Random)?;
        token.token_id = GENERATED_OPERATOR_TOKEN_ID.to_owned();
        match self
            .insert_token(&token, TokenSubject::Operator, &Caller::Operator)
            .await
        {
            Ok(_) => Ok(OperatorTokenSource::Generated(token.secret)),
            // The fixed id is taken: an operator token was generated before.
            Err(StoreError::Duplicate { .. }) => Ok(OperatorTokenSource::Existing),
            Err(e) => Err(e.into()),
        }
    }
}

/// `Ok(true)` if `found` is an active operator token, `Ok(false)` if there
/// is none, and the refusal if it is an agent's or revoked.
fn check_operator_token(found: Option<&TokenRecord>) -> Result<bool, OperatorTokenError> {
    match found {
        None => Ok(false),
        Some(t) if t.subject != TokenSubject::Operator => Err(OperatorTokenError::NotOperator),
        Some(t) if t.revoked => Err(OperatorTokenError::Revoked),
        Some(_) => Ok(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_tokens_have_the_documented_shape_and_differ() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert!(a.secret.starts_with(TOKEN_PREFIX));
        assert_eq!(a.secret.len(), TOKEN_PREFIX.len() + 64);
        assert!(a.token_id.starts_with("tok_"));
        assert_eq!(a.token_id.len(), 4 + 16);
        assert_ne!(a.secret, b.secret);
        assert_ne!(a.token_id, b.token_id);
        assert!(well_formed(&a.secret));
        assert!(!format!("{a:?}").contains(&a.secret));
    }

    #[test]
    fn well_formed_refuses_empty_long_and_spaced_secrets() {
        assert!(!well_formed(""));
        assert!(!well_formed("has space"));
        assert!(!well_formed(&"a".repeat(MAX_TOKEN_LEN + 1)));
        assert!(well_formed(&"a".repeat(MAX_TOKEN_LEN)));
    }

    fn record(n: u8, revoked: bool) -> TokenRecord {
        TokenRecord {
            token_id: format!("tok_{n}"),
            hash: Digest([n; 32]),
            subject: TokenSubject::Operator,
            created_at: warden_core::time::Timestamp(0),
            revoked,
        }
    }

    #[test]
    fn the_cache_keeps_only_active_tokens_read_in_the_current_generation() {
        let cache = TokenCache::default();
        let generation = cache.get(&Digest([1; 32])).unwrap_err();
        cache.fill(generation, &record(1, false));
        assert_eq!(cache.get(&Digest([1; 32])).unwrap(), record(1, false));
        // A revoked record is never kept.
        cache.fill(generation, &record(2, true));
        assert!(cache.get(&Digest([2; 32])).is_err());
        // A read that raced a forget (of any token) is not kept.
        let stale = cache.get(&Digest([3; 32])).unwrap_err();
        cache.forget(&["tok_unrelated"]);
        cache.fill(stale, &record(3, false));
        assert!(cache.get(&Digest([3; 32])).is_err());
        assert_eq!(cache.len(), 1);
        let stale = cache.get(&Digest([3; 32])).unwrap_err();
        cache.forget_all();
        assert_eq!(cache.len(), 0);
        cache.fill(stale, &record(3, false));
        assert_eq!(cache.len(), 0);
        // Forgetting by id drops that token only.
        let generation = cache.get(&Digest([4; 32])).unwrap_err();
        cache.fill(generation, &record(4, false));
        cache.fill(generation, &record(5, false));
        cache.forget(&["tok_4"]);
        assert!(cache.get(&Digest([4; 32])).is_err());
        assert!(cache.get(&Digest([5; 32])).is_ok());
    }

    #[test]
    fn a_full_cache_starts_afresh() {
        let cache = TokenCache::default();
        for i in 0..=TOKEN_CACHE_CAPACITY {
            let mut r = record(0, false);
            r.hash.0[..8].copy_from_slice(&(i as u64).to_le_bytes());
            r.token_id = format!("tok_{i}");
            cache.fill(0, &r);
        }
        assert_eq!(cache.len(), 1);
    }
}
