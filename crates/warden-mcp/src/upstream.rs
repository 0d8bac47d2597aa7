//! One upstream MCP server: reached on first use (a launched child
//! process over stdio, or a streamable-HTTP server at its `url:`), its
//! tools read and checked against the catalogue, reconnected after a
//! failure.
//!
//! A call that finds the connection gone (the process exited, the pipe
//! closed, the HTTP session ended) connects again first; a call during
//! which the server dies, times out or answers something malformed is an
//! error of that call only, and the connection is dropped so that the next
//! call starts afresh. On the upstream's `notifications/tools/list_changed`
//! its tools are read and checked again ([`Upstream::refresh`]): a tool
//! whose schema widened is withdrawn (not listed, its calls refused with
//! the problems) until it matches again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, Tool};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceError, ServiceExt};
use serde_json::Value;
use tokio::sync::{Mutex, Notify};
use warden_core::bundle::Policy;
use warden_core::ids::ActionName;
use warden_core::mcp::{McpServer, McpTransport, check_schema, tool_action};

/// Why an upstream call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// The server could not be launched or did not complete the MCP
    /// handshake.
    #[error("upstream `{server}` could not be started: {message}")]
    Start {
        /// The server.
        server: String,
        /// What went wrong.
        message: String,
    },
    /// The call took longer than the server's `call_timeout_ms`.
    #[error("upstream `{server}` did not answer within {timeout_ms} ms")]
    Timeout {
        /// The server.
        server: String,
        /// The timeout.
        timeout_ms: u64,
    },
    /// The connection broke during the call (the server exited).
    #[error("upstream `{server}` closed the connection during the call")]
    Crashed {
        /// The server.
        server: String,
    },
    /// The server answered with an error or with something that is not a
    /// tool result.
    #[error("upstream `{server}` answered with an error: {message}")]
    Protocol {
        /// The server.
        server: String,
        /// Its message.
        message: String,
    },
}

/// A tool the gateway exposes: the upstream's tool under its action name,
/// with the declared input schema.
#[derive(Debug, Clone)]
pub struct ExposedTool {
    /// The action `S.T`.
    pub action: ActionName,
    /// The upstream's own name for it.
    pub tool: String,
    /// The tool as listed to clients (name `S.T`, the declared schema).
    pub listed: Tool,
}

/// A tool the gateway refuses to expose, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedTool {
    /// The upstream's name for it.
    pub tool: String,
    /// Why (`undeclared`, or the schema problems).
    pub problems: Vec<String>,
}

/// What checking an upstream's tools found.
#[derive(Debug, Clone, Default)]
pub struct ToolCheck {
    /// Declared, compatible tools, by action.
    pub exposed: BTreeMap<ActionName, ExposedTool>,
    /// Tools not exposed.
    pub refused: Vec<RefusedTool>,
}

/// Check an upstream's advertised tools against the catalogue: a tool is
/// exposed only when its action `S.T` is declared and its advertised
/// input schema did not widen (see [`warden_core::mcp`]).
pub fn check_tools(policy: &Policy, server: &str, tools: &[Tool]) -> ToolCheck {
    let mut out = ToolCheck::default();
    for tool in tools {
        let name = tool.name.to_string();
        let Some(action) = tool_action(server, &name) else {
            out.refused.push(RefusedTool {
                tool: name,
                problems: vec!["its name cannot be an action name".into()],
            });
            continue;
        };
        let Some(spec) = policy.spec.actions.get(&action) else {
            out.refused.push(RefusedTool {
                tool: name,
                problems: vec![format!("undeclared: no `actions.{action}` entry")],
            });
            continue;
        };
        let advertised = Value::Object((*tool.input_schema).clone());
        if let Err(problems) = check_schema(spec.arguments.as_ref(), &advertised) {
            tracing::warn!(%action, ?problems, "upstream tool schema widened; not exposed");
            out.refused.push(RefusedTool {
                tool: name,
                problems,
            });
            continue;
        }
        let mut listed = tool.clone();
        listed.name = action.to_string().into();
        if let Some(Value::Object(schema)) = &spec.arguments {
            listed.input_schema = Arc::new(schema.clone());
        }
        out.exposed.insert(
            action.clone(),
            ExposedTool {
                action,
                tool: name,
                listed,
            },
        );
    }
    out
}

/// The least time a server gets to start and list its tools.
pub const STARTUP_TIMEOUT_MS: u64 = 30_000;

/// The gateway's side of a connection to an upstream: it hears the
/// upstream's `notifications/tools/list_changed`.
#[derive(Debug, Clone, Default)]
pub struct UpstreamClient {
    changed: Arc<Notify>,
}

impl ClientHandler for UpstreamClient {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        self.changed.notify_one();
        std::future::ready(())
    }
}

/// A connection to an upstream.
pub type UpstreamService = RunningService<RoleClient, UpstreamClient>;

/// The HTTP client of streamable-HTTP upstreams: rustls with the ring
/// provider and the platform's roots, no proxy from the environment.
fn http_client() -> Result<reqwest::Client, String> {
    // Installed once per process; a second install is refused and the
    // first provider stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| e.to_string())
}

/// Connect to `config`'s server (launch it, or open a streamable-HTTP
/// session at its URL), complete the MCP handshake and read its tools
/// (each step within its `call_timeout_ms`, and at least
/// [`STARTUP_TIMEOUT_MS`]); `client` hears its notifications. A launched
/// server's environment is `PATH` and its `env:` only, unless
/// `inherit_env`.
pub async fn connect(
    config: &McpServer,
    inherit_env: bool,
    client: UpstreamClient,
) -> Result<(UpstreamService, Vec<Tool>), UpstreamError> {
    let server = config.name.clone();
    let start = |message: String| UpstreamError::Start {
        server: server.clone(),
        message,
    };
    let timeout = Duration::from_millis(config.call_timeout_ms.max(STARTUP_TIMEOUT_MS));
    let no_handshake = || start(format!("no handshake within {} ms", timeout.as_millis()));
    let service = match &config.transport {
        McpTransport::Stdio { argv, env } => {
            let Some((program, args)) = argv.split_first() else {
                return Err(start("no program".into()));
            };
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args).kill_on_drop(true);
            if !inherit_env {
                cmd.env_clear();
                if let Some(path) = std::env::var_os("PATH") {
                    cmd.env("PATH", path);
                }
            }
            cmd.envs(env);
            let transport = TokioChildProcess::new(cmd).map_err(|e| start(e.to_string()))?;
            tokio::time::timeout(timeout, client.serve(transport))
                .await
                .map_err(|_| no_handshake())?
                .map_err(|e| start(e.to_string()))?
        }
        McpTransport::Http { url } => {
            let transport = StreamableHttpClientTransport::with_client(
                http_client().map_err(start)?,
                StreamableHttpClientTransportConfig::with_uri(url.as_str()),
            );
            tokio::time::timeout(timeout, client.serve(transport))
                .await
                .map_err(|_| no_handshake())?
                .map_err(|e| start(e.to_string()))?
        }
    };
    let tools = tokio::time::timeout(timeout, service.peer().list_all_tools())
        .await
        .map_err(|_| start(format!("no tools/list within {} ms", timeout.as_millis())))?
        .map_err(|e| start(format!("tools/list: {e}")))?;
    Ok((service, tools))
}

struct Connected {
    service: UpstreamService,
    check: Arc<ToolCheck>,
    /// Which connection this is (1 for the first).
    generation: u64,
}

/// One upstream server and its (lazily made) connection.
pub struct Upstream {
    config: McpServer,
    conn: Mutex<Option<Connected>>,
    starts: AtomicU64,
    /// Signalled when the upstream says its tools changed.
    changed: Arc<Notify>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.config.name)
            .field("starts", &self.starts.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Whether two checks list different tools (names or listed forms).
fn listing_differs(a: &ToolCheck, b: &ToolCheck) -> bool {
    a.exposed.len() != b.exposed.len()
        || a.exposed
            .iter()
            .zip(b.exposed.iter())
            .any(|((ka, ta), (kb, tb))| ka != kb || ta.listed != tb.listed)
}

impl Upstream {
    /// An upstream for `config`, not connected yet.
    pub fn new(config: McpServer) -> Self {
        Self {
            config,
            conn: Mutex::new(None),
            starts: AtomicU64::new(0),
            changed: Arc::new(Notify::new()),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Its configuration.
    pub fn config(&self) -> &McpServer {
        &self.config
    }

    /// How many times it was connected (launched, for a stdio server).
    pub fn starts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed)
    }

    /// Signalled (one stored permit) when the upstream sends
    /// `notifications/tools/list_changed`.
    pub fn changed(&self) -> Arc<Notify> {
        Arc::clone(&self.changed)
    }

    async fn launch(&self, policy: &Policy) -> Result<Connected, UpstreamError> {
        let client = UpstreamClient {
            changed: Arc::clone(&self.changed),
        };
        let (service, tools) = connect(&self.config, false, client).await?;
        let generation = self.starts.fetch_add(1, Ordering::Relaxed) + 1;
        let check = check_tools(policy, &self.config.name, &tools);
        tracing::info!(
            server = %self.config.name,
            exposed = check.exposed.len(),
            refused = check.refused.len(),
            "upstream connected"
        );
        Ok(Connected {
            service,
            check: Arc::new(check),
            generation,
        })
    }

    /// The checked tools, connecting if there is no live connection.
    pub async fn tools(&self, policy: &Policy) -> Result<Arc<ToolCheck>, UpstreamError> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref()
            && !c.service.is_closed()
        {
            return Ok(Arc::clone(&c.check));
        }
        let fresh = self.launch(policy).await?;
        let check = Arc::clone(&fresh.check);
        *conn = Some(fresh);
        Ok(check)
    }

    /// Read the upstream's tools again and check them (after its
    /// `tools/list_changed`): a tool whose schema widened is withdrawn,
    /// one that matches again is exposed again. Whether the listing
    /// changed; `false` when there is no live connection (the next
    /// connection reads the tools anyway).
    pub async fn refresh(&self, policy: &Policy) -> Result<bool, UpstreamError> {
        let server = self.config.name.clone();
        let (peer, generation) = {
            let conn = self.conn.lock().await;
            match conn.as_ref() {
                Some(c) if !c.service.is_closed() => (c.service.peer().clone(), c.generation),
                _ => return Ok(false),
            }
        };
        let timeout_ms = self.config.call_timeout_ms;
        let tools = tokio::time::timeout(Duration::from_millis(timeout_ms), peer.list_all_tools())
            .await
            .map_err(|_| UpstreamError::Timeout {
                server: server.clone(),
                timeout_ms,
            })?
            .map_err(|e| UpstreamError::Protocol {
                server: server.clone(),
                message: format!("tools/list: {e}"),
            })?;
        let check = check_tools(policy, &server, &tools);
        let mut conn = self.conn.lock().await;
        let Some(c) = conn.as_mut().filter(|c| c.generation == generation) else {
            return Ok(false);
        };
        let changed = listing_differs(&c.check, &check);
        tracing::info!(
            server = %server,
            exposed = check.exposed.len(),
            refused = check.refused.len(),
            changed,
            "upstream tools read again"
        );
        c.check = Arc::new(check);
        Ok(changed)
    }

    /// Call the upstream's tool `tool` (its own name) with `arguments`.
    pub async fn call(
        &self,
        policy: &Policy,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
    ) -> Result<CallToolResult, UpstreamError> {
        let server = self.config.name.clone();
        let (peer, generation) = {
            let mut conn = self.conn.lock().await;
            let alive = conn.as_ref().is_some_and(|c| !c.service.is_closed());
            if !alive {
                *conn = Some(self.launch(policy).await?);
            }
            match conn.as_ref() {
                Some(c) => (c.service.peer().clone(), c.generation),
                None => return Err(UpstreamError::Crashed { server }),
            }
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let timeout_ms = self.config.call_timeout_ms;
        let outcome =
            tokio::time::timeout(Duration::from_millis(timeout_ms), peer.call_tool(params)).await;
        let failure = match outcome {
            Ok(Ok(result)) => return Ok(result),
            Err(_) => UpstreamError::Timeout {
                server: server.clone(),
                timeout_ms,
            },
            Ok(Err(ServiceError::McpError(e))) => {
                return Err(UpstreamError::Protocol {
                    server,
                    message: e.message.to_string(),
                });
            }
            Ok(Err(ServiceError::UnexpectedResponse)) => {
                return Err(UpstreamError::Protocol {
                    server,
                    message: "not a tool result".into(),
                });
            }
            Ok(Err(_)) => UpstreamError::Crashed {
                server: server.clone(),
            },
        };
        // Drop the connection that broke or hung (unless another call
        // already replaced it): the next call connects again.
        let mut conn = self.conn.lock().await;
        if conn.as_ref().is_some_and(|c| c.generation == generation)
            && let Some(c) = conn.take()
        {
            // Stopping waits for the process to exit: not under the lock.
            tokio::spawn(async move {
                let _ = c.service.cancel().await;
            });
        }
        Err(failure)
    }

    /// Close the connection if there is one (a launched server is
    /// stopped).
    pub async fn stop(&self) {
        if let Some(c) = self.conn.lock().await.take() {
            let _ = c.service.cancel().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, schema: Value) -> Tool {
        serde_json::from_value(json!({"name": name, "inputSchema": schema})).unwrap()
    }

    #[test]
    fn only_declared_tools_whose_schema_did_not_widen_are_exposed() {
        let policy = warden_core::bundle::compile(
            "policy_version: t\n\
             mcp_servers: {mail: {command: [x], trust: untrusted}}\n\
             actions:\n  \
               mail.send:\n    \
                 arguments: {type: object, properties: {to: {type: string}}, additionalProperties: false}\n  \
               mail.read: {}\n  \
               mail.grew:\n    \
                 arguments: {type: object, properties: {to: {type: string}}}\n",
        )
        .unwrap();
        let advertised = [
            tool(
                "send",
                json!({"type": "object", "properties": {"to": {"type": "string"}}}),
            ),
            tool("read", json!({"type": "object", "properties": {"x": {}}})),
            tool(
                "grew",
                json!({"type": "object", "properties": {"to": {"type": "string"}, "bcc": {"type": "string"}}}),
            ),
            tool("secret", json!({"type": "object"})),
            tool("bad name", json!({"type": "object"})),
        ];
        let check = check_tools(&policy, "mail", &advertised);
        let exposed: Vec<&str> = check.exposed.keys().map(ActionName::as_str).collect();
        assert_eq!(exposed, vec!["mail.read", "mail.send"]);
        // Listed under the action name, with the declared schema (or the
        // advertised one when none is declared).
        let send = &check.exposed[&ActionName::parse("mail.send").unwrap()];
        assert_eq!(send.tool, "send");
        assert_eq!(send.listed.name, "mail.send");
        assert_eq!(
            Value::Object((*send.listed.input_schema).clone()),
            json!({"type": "object", "properties": {"to": {"type": "string"}}, "additionalProperties": false})
        );
        let read = &check.exposed[&ActionName::parse("mail.read").unwrap()];
        assert_eq!(read.listed.input_schema["properties"], json!({"x": {}}));
        let refused: Vec<(&str, usize)> = check
            .refused
            .iter()
            .map(|r| (r.tool.as_str(), r.problems.len()))
            .collect();
        assert_eq!(refused, vec![("grew", 1), ("secret", 1), ("bad name", 1)]);
        assert!(check.refused[0].problems[0].contains("`bcc`"));
    }
}
