//! The server's shared state and configuration.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use warden::{Clock, Engine, EngineError};
use warden_core::bundle::Policy;
use warden_store::Store;

use crate::metered::Metered;
use crate::metrics::Metrics;
use crate::signing::{EnvelopeKeyConfig, EnvelopeKeys, EnvelopeSigner};

/// Limits on what one request may carry.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body, in bytes (413 `body_too_large`).
    pub max_body_bytes: usize,
    /// Deepest JSON nesting of a body (400 `json_too_deep`). Raised to fit
    /// the policy's SOP argument depth when that is deeper.
    pub max_json_depth: usize,
    /// Largest memory value, as compact JSON, in bytes (413 `value_too_large`).
    pub max_value_bytes: usize,
    /// Most capabilities in one registration.
    pub max_capabilities: usize,
    /// Most tools in one registration.
    pub max_tools: usize,
    /// Longest tool name, in bytes.
    pub max_tool_name_bytes: usize,
    /// Largest `limit` of one audit page.
    pub max_audit_page: usize,
}

impl Default for Limits {
    /// 1 MiB bodies, depth 64, 256 KiB values, 256 capabilities, 64 tools of
    /// 256 bytes, audit pages of 1000.
    fn default() -> Self {
        Self {
            max_body_bytes: 1024 * 1024,
            max_json_depth: 64,
            max_value_bytes: 256 * 1024,
            max_capabilities: 256,
            max_tools: 64,
            max_tool_name_bytes: 256,
            max_audit_page: 1000,
        }
    }
}

/// How the server behaves.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Request limits.
    pub limits: Limits,
    /// Longest a request may take before it is answered 503 `timeout`.
    pub request_timeout: Duration,
    /// How long an admitted, unfinished run counts against
    /// `max_runs_in_flight` (an abandoned run stops counting after this).
    pub run_ttl: Duration,
    /// Where the envelope signing key comes from (see [`crate::signing`]).
    pub envelope_key: EnvelopeKeyConfig,
    /// How long after issuance a receipt's reference is promised resolvable
    /// (`resolvable_until`). Envelope versions are kept in the store, so the
    /// reference stays resolvable as long as the issuer's key does.
    pub receipt_ttl: Duration,
}

impl Default for ServerConfig {
    /// Default limits, 30 s request timeout, runs count for an hour, the
    /// signing key from `WARDEN_ENVELOPE_SIGNING_KEY` (else the one stored
    /// in the database), receipts resolvable for 30 days.
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            request_timeout: Duration::from_secs(30),
            run_ttl: Duration::from_secs(3600),
            envelope_key: EnvelopeKeyConfig::Auto,
            receipt_ttl: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// The environment variable holding the deployment's provenance secret
/// (16 to 64 bytes): the key of every session's fingerprints is derived
/// from it. Servers sharing a database set the same one; without it a
/// built-in default is used (fingerprints are then only as secret as the
/// values they hash).
pub const PROVENANCE_SECRET_ENV: &str = "WARDEN_PROVENANCE_SECRET";

pub(crate) struct Shared<S> {
    pub(crate) engine: Engine<Metered<S>>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) config: ServerConfig,
    pub(crate) clock: Arc<dyn Clock>,
    /// The envelope keys in use (swapped whole by a reload).
    pub(crate) keys: RwLock<Arc<EnvelopeKeys>>,
    /// Whether they are the stored ones (and reloads read them).
    pub(crate) keys_stored: bool,
}

/// Everything a request handler needs; cheap to clone.
pub struct AppState<S> {
    pub(crate) shared: Arc<Shared<S>>,
}

impl<S> Clone for AppState<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S> std::fmt::Debug for AppState<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S: Store> AppState<S> {
    /// Open the engine over `store` (seeding the bundle on a new store) and
    /// set up metrics and the envelope signing key (a malformed
    /// `WARDEN_ENVELOPE_SIGNING_KEY` is an [`EngineError::Input`] naming
    /// it).
    pub async fn open(
        policy: Policy,
        store: S,
        clock: Arc<dyn Clock>,
        config: ServerConfig,
    ) -> Result<Self, EngineError> {
        let configured = EnvelopeSigner::configured(&config.envelope_key)
            .map_err(|e| EngineError::input(crate::signing::ENVELOPE_SIGNING_KEY_ENV, e))?;
        let metrics = Arc::new(Metrics::new());
        let store = Metered::new(store, Arc::clone(&metrics));
        let engine = Engine::open(policy, store, Arc::clone(&clock)).await?;
        engine.set_run_ttl(config.run_ttl);
        if let Ok(secret) = std::env::var(PROVENANCE_SECRET_ENV) {
            engine
                .set_provenance_secret(secret.as_bytes())
                .map_err(|e| EngineError::input(PROVENANCE_SECRET_ENV, e))?;
        }
        let keys_stored = configured.is_none();
        let keys = match configured {
            Some(signer) => EnvelopeKeys::single(signer),
            None => {
                let seed = crate::signing::random_seed().map_err(EngineError::internal)?;
                let stored = engine.envelope_keys_or_create(seed).await?;
                EnvelopeKeys::stored(&stored).map_err(EngineError::internal)?
            }
        };
        Ok(Self {
            shared: Arc::new(Shared {
                engine,
                metrics,
                config,
                clock,
                keys: RwLock::new(Arc::new(keys)),
                keys_stored,
            }),
        })
    }

    /// Read the stored envelope keys again (when the key in use is the
    /// stored one): a rotation made since (by `warden keys rotate`, on any
    /// server) takes effect here now. `true` if the keys changed.
    pub async fn reload_envelope_keys(&self) -> Result<bool, EngineError> {
        if !self.shared.keys_stored {
            return Ok(false);
        }
        let stored = self.engine().envelope_keys().await?;
        let fresh = EnvelopeKeys::stored(&stored).map_err(EngineError::internal)?;
        let Ok(mut keys) = self.shared.keys.write() else {
            return Err(EngineError::internal("envelope key lock poisoned"));
        };
        if keys.verifying() == fresh.verifying() {
            return Ok(false);
        }
        *keys = Arc::new(fresh);
        Ok(true)
    }

    /// The engine.
    pub fn engine(&self) -> &Engine<Metered<S>> {
        &self.shared.engine
    }

    /// The backing store (without the metrics wrapper).
    pub fn store(&self) -> &S {
        self.shared.engine.store().inner()
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.shared.config
    }

    /// The deepest JSON nesting accepted in a body: the configured limit, or
    /// deeper if the policy allows deeper SOP arguments (root, `sop`,
    /// `steps`, the step object and `arguments` come first).
    pub fn max_json_depth(&self) -> usize {
        let sop_depth = self.engine().policy().sop_limits.max_depth + 4;
        self.shared
            .config
            .limits
            .max_json_depth
            .max(sop_depth)
            .min(warden_core::json::MAX_SUPPORTED_DEPTH)
    }

    /// The key that signs exported envelopes and names receipts' issuer.
    pub fn signer(&self) -> EnvelopeSigner {
        self.envelope_keys().signer().clone()
    }

    /// The envelope keys in use: the signer and every verifying key.
    pub fn envelope_keys(&self) -> Arc<EnvelopeKeys> {
        match self.shared.keys.read() {
            Ok(keys) => Arc::clone(&keys),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    pub(crate) fn now_ms(&self) -> i64 {
        self.shared.clock.now().0
    }
}
