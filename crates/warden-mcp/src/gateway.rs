//! The gateway: listings filtered by the agent's capabilities and the
//! delegation lockdown, calls decided by the session gate before they
//! reach an upstream, results recorded before they are returned.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResult, ContentBlock, Tool};
use serde_json::{Map, Value, json};
use warden::{CallResult, Caller, Engine, EngineError, OpenSession, ProposedCall, SessionOpening};
use warden_core::canonical::to_canonical;
use warden_core::decision::Verdict;
use warden_core::ids::{ActionName, AgentId, CallId, SessionId};
use warden_core::lockdown::BLOCK_WRITE_TAG;
use warden_core::mcp::split_action;
use warden_store::{EscalationStatus, Store};

use crate::upstream::{ToolCheck, Upstream, UpstreamError};

/// How often a held call looks at its escalation.
const ESCALATION_POLL: Duration = Duration::from_millis(50);

/// Most timed-out escalated calls remembered for a retry.
const MAX_HELD: usize = 4096;

/// Counters of one upstream tool.
#[derive(Debug, Default)]
pub struct ToolCounters {
    /// Calls forwarded to the upstream.
    pub forwarded: AtomicU64,
    /// Calls denied (never forwarded).
    pub denied: AtomicU64,
    /// Calls escalated and not (yet) approved.
    pub escalated: AtomicU64,
    /// Forwarded calls that failed upstream (timeout, crash, malformed).
    pub upstream_errors: AtomicU64,
}

/// The MCP gateway over one engine.
pub struct Gateway<S> {
    engine: Engine<S>,
    upstreams: BTreeMap<String, Arc<Upstream>>,
    /// Escalated calls that timed out while held, by session and call
    /// hash: a retry of the same call uses the same call id, so an
    /// approval made since lets it through once.
    held: Mutex<HashMap<(SessionId, String), CallId>>,
    counters: Mutex<BTreeMap<(String, String), Arc<ToolCounters>>>,
    listings: AtomicU64,
}

impl<S> std::fmt::Debug for Gateway<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("upstreams", &self.upstreams)
            .finish_non_exhaustive()
    }
}

/// A tool error (an MCP result with `isError: true`) carrying `text` and a
/// structured form of why.
fn tool_error(text: String, detail: Value) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
    r.structured_content = Some(detail);
    r
}

/// What an upstream's result is recorded as: its structured content when
/// it has some, else its text blocks (each parsed as JSON when it is JSON,
/// so fields keep their paths), else the whole result.
fn recorded_form(result: &CallToolResult) -> Value {
    if let Some(s) = &result.structured_content {
        return s.clone();
    }
    let texts: Vec<Value> = result
        .content
        .iter()
        .filter_map(|c| serde_json::to_value(c).ok())
        .filter_map(|v| v.get("text").and_then(Value::as_str).map(str::to_owned))
        .map(|t| serde_json::from_str::<Value>(&t).unwrap_or(Value::String(t)))
        .collect();
    if texts.len() == result.content.len() {
        match texts.len() {
            1 => texts.into_iter().next().unwrap_or(Value::Null),
            _ => Value::Array(texts),
        }
    } else {
        serde_json::to_value(&result.content).unwrap_or(Value::Null)
    }
}

impl<S: Store + 'static> Gateway<S> {
    /// A gateway over `engine` for the upstreams its policy declares
    /// (none started yet: see [`Gateway::start`]).
    pub fn new(engine: Engine<S>) -> Self {
        let upstreams = engine
            .policy()
            .mcp_servers()
            .iter()
            .map(|s| (s.name.clone(), Arc::new(Upstream::new(s.clone()))))
            .collect();
        Self {
            engine,
            upstreams,
            held: Mutex::new(HashMap::new()),
            counters: Mutex::new(BTreeMap::new()),
            listings: AtomicU64::new(0),
        }
    }

    /// The upstreams, by name.
    pub fn upstreams(&self) -> &BTreeMap<String, Arc<Upstream>> {
        &self.upstreams
    }

    /// Launch every upstream and check its tools (an upstream that fails
    /// to start is retried on first use).
    pub async fn start(&self) -> BTreeMap<String, Result<Arc<ToolCheck>, UpstreamError>> {
        let mut out = BTreeMap::new();
        for (name, u) in &self.upstreams {
            let r = u.tools(self.engine.policy()).await;
            if let Err(e) = &r {
                tracing::warn!(server = %name, error = %e, "upstream did not start");
            }
            out.insert(name.clone(), r);
        }
        out
    }

    /// Stop every upstream.
    pub async fn stop(&self) {
        for u in self.upstreams.values() {
            u.stop().await;
        }
    }

    fn counters_of(&self, server: &str, tool: &str) -> Arc<ToolCounters> {
        let Ok(mut map) = self.counters.lock() else {
            return Arc::new(ToolCounters::default());
        };
        Arc::clone(map.entry((server.to_owned(), tool.to_owned())).or_default())
    }

    /// The gateway's counters in the Prometheus text format:
    /// `warden_mcp_calls_total{server, tool, outcome}` and
    /// `warden_mcp_listings_total`.
    pub fn render_metrics(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        out.push_str("# HELP warden_mcp_calls_total MCP tool calls through the gateway, by upstream, tool and outcome.\n");
        out.push_str("# TYPE warden_mcp_calls_total counter\n");
        if let Ok(map) = self.counters.lock() {
            for ((server, tool), c) in map.iter() {
                for (outcome, n) in [
                    ("forwarded", &c.forwarded),
                    ("denied", &c.denied),
                    ("escalated", &c.escalated),
                    ("upstream_error", &c.upstream_errors),
                ] {
                    let _ = writeln!(
                        out,
                        "warden_mcp_calls_total{{server=\"{}\",tool=\"{}\",outcome=\"{outcome}\"}} {}",
                        escape(server),
                        escape(tool),
                        n.load(Ordering::Relaxed)
                    );
                }
            }
        }
        out.push_str("# HELP warden_mcp_listings_total MCP tools/list answers.\n");
        out.push_str("# TYPE warden_mcp_listings_total counter\n");
        let _ = writeln!(
            out,
            "warden_mcp_listings_total {}",
            self.listings.load(Ordering::Relaxed)
        );
        out
    }

    /// Whether `agent` may see and call `action` through the gateway: in
    /// its effective capabilities, and, for an agent with a parent, not a
    /// block-write-surface tool (by tag or by name).
    fn visible_to(
        &self,
        agent: &AgentId,
        has_parent: bool,
        effective: &[ActionName],
        action: &ActionName,
        tool: &str,
    ) -> bool {
        let _ = agent;
        if !effective.contains(action) {
            return false;
        }
        if has_parent {
            let vocabulary = self.engine.policy().lockdown();
            let tagged = self
                .engine
                .policy()
                .catalogue
                .by_name(action.as_str())
                .is_none_or(|a| a.has_tag(BLOCK_WRITE_TAG));
            if tagged
                || vocabulary.is_write_surface(tool)
                || vocabulary.is_write_surface(action.as_str())
            {
                return false;
            }
        }
        true
    }

    /// `tools/list` for `agent`: exactly the exposed upstream tools in its
    /// effective capabilities (block-write tools never for an agent with a
    /// parent), with the declared schemas. Recorded.
    pub async fn list_tools(&self, agent: &AgentId) -> Result<Vec<Tool>, EngineError> {
        let view = self.engine.agent(agent)?;
        let has_parent = view.parent_id.is_some();
        let mut listed = Vec::new();
        let mut names = Vec::new();
        let mut withheld = 0usize;
        for u in self.upstreams.values() {
            let check = match u.tools(self.engine.policy()).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(server = %u.name(), error = %e, "upstream unavailable for tools/list");
                    continue;
                }
            };
            for t in check.exposed.values() {
                if self.visible_to(
                    agent,
                    has_parent,
                    &view.effective_capabilities,
                    &t.action,
                    &t.tool,
                ) {
                    names.push(t.action.clone());
                    listed.push(t.listed.clone());
                } else {
                    withheld += 1;
                }
            }
        }
        self.engine
            .record_tool_listing(&Caller::Agent(agent.clone()), "mcp", &names, withheld)
            .await?;
        self.listings.fetch_add(1, Ordering::Relaxed);
        Ok(listed)
    }

    /// Open the session a connection uses when it names none: the agent's
    /// own, with no trusted inputs.
    pub async fn open_connection_session(&self, agent: &AgentId) -> Result<SessionId, EngineError> {
        let opening = self
            .engine
            .open_session(&Caller::Agent(agent.clone()), OpenSession::default())
            .await?;
        match opening {
            SessionOpening::Opened { session, .. } => Ok(session.state.session.session_id.clone()),
            SessionOpening::Refused { decision, .. } => Err(EngineError::input(
                "session",
                format!("refused: {}", decision.reason),
            )),
        }
    }

    fn held_key(session: &SessionId, name: &str, arguments: &Value) -> (SessionId, String) {
        let canonical = to_canonical(&json!({"action": name, "arguments": arguments}));
        (
            session.clone(),
            warden_core::audit::Digest::of(&canonical).to_hex(),
        )
    }

    fn take_held(&self, key: &(SessionId, String)) -> Option<CallId> {
        self.held.lock().ok().and_then(|mut m| m.remove(key))
    }

    fn put_held(&self, key: (SessionId, String), call: CallId) {
        if let Ok(mut m) = self.held.lock() {
            if m.len() >= MAX_HELD {
                m.clear();
            }
            m.insert(key, call);
        }
    }

    /// `tools/call` of `name` by `agent` in `session`: decided by the
    /// session gate; forwarded only when allowed (or approved while
    /// held); the result recorded before it is returned. Errors are the
    /// engine's (malformed input, an unknown session or one of another
    /// agent); every decided call is an MCP result.
    pub async fn call_tool(
        &self,
        agent: &AgentId,
        session: &SessionId,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, EngineError> {
        let caller = Caller::Agent(agent.clone());
        let args = Value::Object(arguments.clone());
        let (server, tool) = split_action(name).unwrap_or(("", name));
        let counters = self.counters_of(server, tool);
        let key = Self::held_key(session, name, &args);
        let call_id = self.take_held(&key);
        let proposed = ProposedCall {
            call_id,
            action: name.to_owned(),
            arguments: args.clone(),
        };
        let mut answer = self
            .engine
            .session_call(&caller, session, proposed.clone())
            .await?;
        if answer.decision.verdict == Verdict::Escalate {
            let escalation = answer.call.escalation_id.clone().unwrap_or_default();
            let wait = self
                .upstreams
                .get(server)
                .map_or(0, |u| u.config().escalation_wait_ms);
            match self.wait_for_review(&escalation, wait).await? {
                Review::Approved => {
                    let again = ProposedCall {
                        call_id: Some(answer.call.call_id.clone()),
                        ..proposed
                    };
                    answer = self.engine.session_call(&caller, session, again).await?;
                }
                Review::Rejected(why) => {
                    counters.denied.fetch_add(1, Ordering::Relaxed);
                    return Ok(tool_error(
                        format!("refused by the reviewer of escalation {escalation}: {why}"),
                        json!({"verdict": "deny", "reason": "escalation_rejected",
                               "escalation_id": escalation, "rejection_reason": why}),
                    ));
                }
                Review::Pending => {
                    counters.escalated.fetch_add(1, Ordering::Relaxed);
                    self.put_held(key, answer.call.call_id.clone());
                    return Ok(tool_error(
                        format!(
                            "held for review: escalation {escalation} ({}); retry the same call once it is approved",
                            answer.decision.reason
                        ),
                        json!({"verdict": "escalate", "reason": answer.decision.reason.to_string(),
                               "escalation_id": escalation, "call_id": answer.call.call_id}),
                    ));
                }
            }
        }
        match answer.decision.verdict {
            Verdict::Allow | Verdict::Constrain => {}
            Verdict::Deny | Verdict::Escalate => {
                counters.denied.fetch_add(1, Ordering::Relaxed);
                return Ok(tool_error(
                    format!("denied by Warden: {}", answer.decision.reason),
                    json!({"verdict": answer.decision.verdict.as_str(),
                           "reason": answer.decision.reason.to_string(),
                           "reasons": answer.call.detail.get("reasons").cloned().unwrap_or(Value::Null),
                           "call_id": answer.call.call_id}),
                ));
            }
        }
        let call_id = answer.call.call_id.clone();
        // Allowed: forward, unless the gateway cannot (no such upstream
        // tool, a widened schema, a write-surface name for a child); the
        // call is then recorded as failed.
        let forwarded = self.forward(agent, server, tool, name, arguments).await;
        let result = match forwarded {
            Ok(r) => {
                counters.forwarded.fetch_add(1, Ordering::Relaxed);
                r
            }
            Err(message) => {
                counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                self.engine
                    .record_call_result(
                        &caller,
                        session,
                        &call_id,
                        CallResult {
                            result: Value::Null,
                            error: Some(message.clone()),
                            labels: Vec::new(),
                        },
                    )
                    .await?;
                return Ok(tool_error(
                    message,
                    json!({"verdict": "allow", "error": "upstream", "call_id": call_id}),
                ));
            }
        };
        let error = (result.is_error == Some(true)).then(|| {
            let text = recorded_form(&result);
            match text {
                Value::String(s) => s,
                other => other.to_string(),
            }
        });
        let recorded = if error.is_some() {
            Value::Null
        } else {
            recorded_form(&result)
        };
        self.engine
            .record_call_result(
                &caller,
                session,
                &call_id,
                CallResult {
                    result: recorded,
                    error,
                    labels: Vec::new(),
                },
            )
            .await?;
        Ok(result)
    }

    async fn forward(
        &self,
        agent: &AgentId,
        server: &str,
        tool: &str,
        action: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, String> {
        let Some(upstream) = self.upstreams.get(server) else {
            return Err(format!(
                "`{action}` is not a tool of any upstream MCP server"
            ));
        };
        let check = upstream
            .tools(self.engine.policy())
            .await
            .map_err(|e| e.to_string())?;
        let Some(exposed) = check.exposed.get(action) else {
            return Err(format!(
                "upstream `{server}` exposes no tool `{tool}` compatible with its declaration"
            ));
        };
        let view = self.engine.agent(agent).map_err(|e| e.to_string())?;
        if !self.visible_to(
            agent,
            view.parent_id.is_some(),
            &view.effective_capabilities,
            &exposed.action,
            &exposed.tool,
        ) {
            return Err(format!("`{action}` is not available to this agent"));
        }
        upstream
            .call(self.engine.policy(), &exposed.tool, arguments)
            .await
            .map_err(|e| e.to_string())
    }

    async fn wait_for_review(&self, escalation: &str, wait_ms: u64) -> Result<Review, EngineError> {
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        loop {
            let e = self.engine.escalation(escalation).await?;
            match e.status {
                EscalationStatus::Approved => return Ok(Review::Approved),
                EscalationStatus::Rejected => {
                    return Ok(Review::Rejected(
                        e.rejection_reason.unwrap_or_else(|| "rejected".into()),
                    ));
                }
                EscalationStatus::Consumed => return Ok(Review::Pending),
                EscalationStatus::Pending => {}
            }
            if Instant::now() >= deadline {
                return Ok(Review::Pending);
            }
            tokio::time::sleep(ESCALATION_POLL).await;
        }
    }
}

enum Review {
    Approved,
    Rejected(String),
    Pending,
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(v: Value) -> CallToolResult {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn results_are_recorded_by_their_structure() {
        // Structured content wins.
        assert_eq!(
            recorded_form(&result(json!({
                "content": [{"type": "text", "text": "x"}],
                "structuredContent": {"to": "bob"}
            }))),
            json!({"to": "bob"})
        );
        // JSON text keeps its fields; plain text stays text.
        assert_eq!(
            recorded_form(&result(json!({
                "content": [{"type": "text", "text": "{\"from\": \"eve@x\"}"}]
            }))),
            json!({"from": "eve@x"})
        );
        assert_eq!(
            recorded_form(&result(json!({
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
            }))),
            json!(["a", "b"])
        );
        // Anything else: the content blocks as they are.
        let image = json!({"type": "image", "data": "AAAA", "mimeType": "image/png"});
        assert_eq!(
            recorded_form(&result(json!({"content": [image.clone()]}))),
            json!([image])
        );
    }
}
