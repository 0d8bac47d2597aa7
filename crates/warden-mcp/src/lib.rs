//! # warden-mcp
//!
//! Warden's MCP gateway: MCP clients reach upstream MCP servers through
//! Warden, which decides every call with the session gate and records every
//! result itself.
//!
//! ```text
//! MCP client ──streamable HTTP /mcp (bearer token)──► GatewayHandler
//!     tools/list ──► Gateway::list_tools: exposed tools ∩ effective capabilities
//!                    (no block-write tool for a child), declared schemas; recorded
//!     tools/call ──► Engine::session_call ──► allow: Upstream::call ──► Engine::record_call_result
//!                                         ├─► deny: tool error with the reason
//!                                         └─► escalate: held until approved / rejected / timeout
//! Upstream (stdio child process, relaunched after a crash)
//! ```
//!
//! - [`upstream`]: one upstream server, its checked tools
//!   ([`upstream::check_tools`]: declared in `actions:`, schema not
//!   widened), its calls with timeouts.
//! - [`gateway`]: listing and calling for an agent in a session.
//! - [`handler`]: the rmcp server handler; identity comes from the HTTP
//!   layer ([`McpIdentity`]), never from a payload.
//! - [`init`]: `warden policy init --mcp`, a starter bundle from an
//!   upstream's tools.
//! - [`bridge`]: `warden mcp`, a stdio MCP server relaying to a running
//!   `warden serve` with the agent's token.
//!
//! Supported: tools (`tools/list`, `tools/call`, and
//! `notifications/tools/list_changed` to clients when an upstream's
//! change alters the listing), from stdio and streamable-HTTP upstreams.
//! Resources and prompts are not offered: the server declares only the
//! tools capability, and `resources/*` and `prompts/*` answer
//! method-not-found. A `constrain` verdict's obligations are enforced on
//! forwarded calls as [`gateway`] describes (fail closed). A retry of a
//! call whose hold timed out proceeds once after approval whichever server
//! it reaches, and after a restart: the engine finds the held call and its
//! approval in the store; the gateway keeps nothing of it.

pub mod bridge;
pub mod gateway;
pub mod handler;
pub mod init;
pub mod upstream;

pub use gateway::Gateway;
pub use handler::{GatewayHandler, McpIdentity};

/// The header that binds a request to an existing session.
pub const SESSION_HEADER: &str = "warden-session";

use std::sync::Arc;

use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use warden_store::Store;

/// The streamable-HTTP MCP service over `gateway` (a tower service; mount
/// it behind a layer that puts an [`McpIdentity`] in each request's
/// extensions). MCP sessions are kept in memory, one handler per session.
/// The `Host` check against DNS rebinding is off: every request carries a
/// bearer token, which a rebinding page cannot.
pub fn streamable_http_service<S: Store + 'static>(
    gateway: Arc<Gateway<S>>,
    max_body_bytes: usize,
) -> StreamableHttpService<GatewayHandler<S>, LocalSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_max_request_body_bytes(max_body_bytes);
    StreamableHttpService::new(
        move || Ok(GatewayHandler::new(Arc::clone(&gateway))),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}
