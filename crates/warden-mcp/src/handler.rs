//! The MCP server side: an rmcp [`ServerHandler`] per MCP connection,
//! answering `tools/list` and `tools/call` through the [`Gateway`].
//!
//! Identity is never read from a payload: the HTTP layer authenticates
//! each request's bearer token and puts an [`McpIdentity`] in the
//! request's extensions (rmcp hands the request's parts to the handler).
//! A request without one is refused.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, InitializeResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use tokio::sync::Mutex;
use warden::EngineError;
use warden_core::ids::{AgentId, SessionId};
use warden_store::Store;

use crate::gateway::Gateway;

/// Who is calling, as the HTTP layer established it from the bearer
/// token, and the session a `Warden-Session` header bound the request to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpIdentity {
    /// The token's agent.
    pub agent: AgentId,
    /// The session named by `Warden-Session`, if any.
    pub session: Option<SessionId>,
}

/// The handler of one MCP connection.
pub struct GatewayHandler<S> {
    gateway: Arc<Gateway<S>>,
    /// The connection's own session (opened on its first call without a
    /// `Warden-Session` header) and the agent it belongs to.
    own_session: Arc<Mutex<Option<(AgentId, SessionId)>>>,
}

impl<S> Clone for GatewayHandler<S> {
    fn clone(&self) -> Self {
        Self {
            gateway: Arc::clone(&self.gateway),
            own_session: Arc::clone(&self.own_session),
        }
    }
}

impl<S: Store + 'static> GatewayHandler<S> {
    /// A handler for a new connection.
    pub fn new(gateway: Arc<Gateway<S>>) -> Self {
        Self {
            gateway,
            own_session: Arc::new(Mutex::new(None)),
        }
    }

    async fn session_for(&self, who: &McpIdentity) -> Result<SessionId, ErrorData> {
        if let Some(s) = &who.session {
            return Ok(s.clone());
        }
        let mut own = self.own_session.lock().await;
        match own.as_ref() {
            Some((agent, session)) if agent == &who.agent => Ok(session.clone()),
            Some(_) => Err(ErrorData::invalid_request(
                "this MCP session belongs to another agent",
                None,
            )),
            None => {
                let session = self
                    .gateway
                    .open_connection_session(&who.agent)
                    .await
                    .map_err(engine_error)?;
                *own = Some((who.agent.clone(), session.clone()));
                Ok(session)
            }
        }
    }
}

fn identity(ctx: &RequestContext<RoleServer>) -> Result<McpIdentity, ErrorData> {
    ctx.extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.extensions.get::<McpIdentity>())
        .cloned()
        .ok_or_else(|| ErrorData::invalid_request("unauthenticated request", None))
}

fn engine_error(e: EngineError) -> ErrorData {
    match e {
        EngineError::NotFound { .. } => ErrorData::invalid_params(
            "not found (an unknown session, or one of another agent)",
            None,
        ),
        EngineError::Conflict { .. } | EngineError::Input { .. } => {
            ErrorData::invalid_params(e.to_string(), None)
        }
        other => {
            tracing::error!(error = %other, "gateway call failed");
            ErrorData::internal_error("internal error", None)
        }
    }
}

impl<S: Store + 'static> ServerHandler for GatewayHandler<S> {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("warden", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Warden MCP gateway: the tools listed are those your agent may use; \
                 every call is decided by Warden before it reaches the tool.",
        )
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.gateway.add_client(context.peer);
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let who = identity(&ctx)?;
        let tools = self
            .gateway
            .list_tools(&who.agent)
            .await
            .map_err(engine_error)?;
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let who = identity(&ctx)?;
        let session = self.session_for(&who).await?;
        let result = self
            .gateway
            .call_tool(
                &who.agent,
                &session,
                &request.name,
                request.arguments.unwrap_or_default(),
            )
            .await
            .map_err(engine_error)?;
        Ok(CallToolResponse::Complete(result))
    }
}
