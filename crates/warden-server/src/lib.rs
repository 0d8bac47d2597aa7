//! # warden-server
//!
//! Warden's HTTP/JSON API: the engine behind bearer-token identity, request
//! limits, per-agent quotas, Prometheus metrics and an OpenAPI document.
//! This is the only crate that knows HTTP.
//!
//! ```text
//! request ──► middleware (timeout, panic → 500, latency metrics)
//!         ──► auth extractor (header → Engine::authenticate: caller, revoked?, request rate)
//!         ──► body gates (size → 413, strict JSON → 400, wire struct → 422)
//!         ──► handler ──► Engine<Metered<S>> ──► Store (state + audit)
//! ```
//!
//! ## Design choices
//!
//! - **Generic over the store.** [`AppState`] and [`router`] work with any
//!   [`Store`]; the binary chooses the backend from the
//!   database URL. The store is wrapped in [`Metered`], which counts every
//!   decision as it is appended to the audit log, so the decision metrics
//!   are exactly the log.
//! - **Identity from the token only** (see [`auth`]): the acting agent is
//!   the agent the bearer token was issued to. Tokens are 256-bit random,
//!   stored as SHA-256, looked up per request (so revocation is effective on
//!   the next request) and compared in constant time.
//! - **No probing.** A missing record and one the caller may not see answer
//!   the same 404 `not_found` (same body); the audit log keeps the real
//!   reason. The same holds for agents a caller may not see.
//! - **Client errors change nothing.** Every refusal happens before the
//!   engine mutates anything; the engine's own denials change nothing but
//!   the audit log, where a denial is evidence, not state.
//! - **Wire types are separate** from domain types ([`wire`]), with
//!   explicit conversions, so the domain can change without breaking
//!   clients and a domain field never leaks by accident.
//! - **Memory steps of a run** are executed by the server inside `begin`
//!   (the server owns memory); other actions are executed by the caller's
//!   adapter between `begin` and `complete`.
//!
//! Routes, statuses and error codes: see [`API`] (the one route list),
//! [`error`] and the document served at `/openapi.json`.

pub mod auth;
pub mod body;
pub mod conn;
mod console;
pub mod error;
mod mcp;
mod metered;
pub mod metrics;
mod middleware;
pub mod openapi;
mod routes;
pub mod signing;
mod state;
pub mod wire;

use std::future::Future;

use tokio::net::TcpListener;
use warden_store::Store;

pub use auth::{OperatorTokenError, OperatorTokenSource, ensure_operator_token};
pub use conn::{ConnectionLimits, serve_with};
pub use error::ApiError;
pub use metered::Metered;
pub use routes::{API, Access, ErrorDoc, Payload, ROUTES, Route, RouteDoc, WireType, router};
pub use signing::{
    EnvelopeKeyConfig, EnvelopeKeySource, EnvelopeKeys, EnvelopeSigner, PublishedKey,
};
pub use state::{AppState, Limits, PROVENANCE_SECRET_ENV, ServerConfig};

/// Serve the API on `listener` with the default [`ConnectionLimits`]
/// until `shutdown` completes; then stop accepting connections and finish
/// the requests in flight before returning. See [`serve_with`].
pub async fn serve<S: Store>(
    listener: TcpListener,
    state: AppState<S>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, state, ConnectionLimits::default(), shutdown).await
}
