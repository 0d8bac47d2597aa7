//! The gateway: listings filtered by the agent's capabilities and the
//! delegation lockdown, calls decided by the session gate before they
//! reach an upstream, results recorded before they are returned.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResult, ContentBlock, Tool};
use rmcp::{Peer, RoleServer};
use serde_json::{Map, Value, json};
use warden::{CallResult, Caller, Engine, EngineError, OpenSession, ProposedCall, SessionOpening};
use warden_core::decision::{Obligation, Verdict};
use warden_core::ids::{ActionName, AgentId, SessionId};
use warden_core::lockdown::BLOCK_WRITE_TAG;
use warden_core::mcp::split_action;
use warden_store::{EscalationStatus, Store};

use crate::upstream::{ToolCheck, Upstream, UpstreamError};

/// How often a held call looks at its escalation.
const ESCALATION_POLL: Duration = Duration::from_millis(50);

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
    counters: Mutex<BTreeMap<(String, String), Arc<ToolCounters>>>,
    listings: AtomicU64,
    /// Connected MCP clients, told when a listing changes.
    clients: Mutex<Vec<Peer<RoleServer>>>,
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

/// The labels a `constrain`'s obligations require the recorded result to
/// carry that it does not (empty: every obligation that applies to a tool
/// call is met). `ResultLabels` applies: the engine adds the labels when
/// it records the result, and the gateway returns a result only once they
/// are on its record. `InheritRestrictions` binds the agents delegated
/// from this session, not the call: the engine applies it on every
/// delegation path. The match has no catch-all: an obligation added later
/// fails to compile here until the gateway says how it is enforced.
fn unmet_result_labels(
    obligations: &[Obligation],
    recorded: &[warden_core::ids::Label],
) -> Vec<warden_core::ids::Label> {
    let mut missing = Vec::new();
    for o in obligations {
        match o {
            Obligation::ResultLabels { labels } => {
                missing.extend(labels.iter().filter(|l| !recorded.contains(l)).cloned());
            }
            Obligation::InheritRestrictions { .. } => {}
        }
    }
    missing
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
            counters: Mutex::new(BTreeMap::new()),
            listings: AtomicU64::new(0),
            clients: Mutex::new(Vec::new()),
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

    /// Watch every upstream's `tools/list_changed`: read its tools again
    /// and, when the listing changed (a tool withdrawn, exposed again, or
    /// its listed form changed), send `notifications/tools/list_changed`
    /// to every connected client. The watchers end with the gateway.
    pub fn watch(self: &Arc<Self>) {
        for u in self.upstreams.values() {
            let changed = u.changed();
            let upstream = Arc::clone(u);
            let gateway: Weak<Self> = Arc::downgrade(self);
            tokio::spawn(async move {
                loop {
                    changed.notified().await;
                    let Some(g) = gateway.upgrade() else { return };
                    match upstream.refresh(g.engine.policy()).await {
                        Ok(true) => g.notify_clients().await,
                        Ok(false) => {}
                        Err(e) => {
                            tracing::warn!(server = %upstream.name(), error = %e, "tools/list after list_changed failed");
                        }
                    }
                }
            });
        }
    }

    /// Remember a connected client, to tell it when listings change.
    pub fn add_client(&self, peer: Peer<RoleServer>) {
        if let Ok(mut c) = self.clients.lock() {
            c.retain(|p| !p.is_transport_closed());
            c.push(peer);
        }
    }

    /// Tell every connected client that the tool listing changed.
    async fn notify_clients(&self) {
        let peers: Vec<Peer<RoleServer>> = match self.clients.lock() {
            Ok(mut c) => {
                c.retain(|p| !p.is_transport_closed());
                c.clone()
            }
            Err(_) => return,
        };
        for p in peers {
            if let Err(e) = p.notify_tool_list_changed().await {
                tracing::debug!(error = %e, "a client was not told of the listing change");
            }
        }
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

    /// `tools/call` of `name` by `agent` in `session`: decided by the
    /// session gate; forwarded only when allowed (or approved while
    /// held); the result recorded before it is returned. Errors are the
    /// engine's (malformed input, an unknown session or one of another
    /// agent); every decided call is an MCP result.
    ///
    /// A call comes without a call id: after a hold that timed out, the
    /// engine finds the session's held call of the same request whose
    /// escalation was approved since (in the store, so on any server and
    /// after a restart) and uses that approval once. The gateway keeps no
    /// state of its own for it.
    pub async fn call_tool(
        &self,
        agent: &AgentId,
        session: &SessionId,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<CallToolResult, EngineError> {
        let started = Instant::now();
        let caller = Caller::Agent(agent.clone());
        let args = Value::Object(arguments.clone());
        let (server, tool) = split_action(name).unwrap_or(("", name));
        let counters = self.counters_of(server, tool);
        let proposed = ProposedCall {
            call_id: None,
            action: name.to_owned(),
            arguments: args,
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
                    // Asked again without a call id, so that the approval
                    // is used by the compare-and-set every retry goes
                    // through: if a retry on another server used it first,
                    // this call escalates afresh instead of proceeding too.
                    answer = self.engine.session_call(&caller, session, proposed).await?;
                    if answer.decision.verdict == Verdict::Escalate {
                        counters.escalated.fetch_add(1, Ordering::Relaxed);
                        return Ok(held_error(&answer));
                    }
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
                    return Ok(held_error(&answer));
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
        let decided = Instant::now();
        // Allowed: forward, unless the gateway cannot (no such upstream
        // tool, a widened schema, a write-surface name for a child); the
        // call is then recorded as failed.
        let forwarded = self.forward(agent, server, tool, name, arguments).await;
        let answered = Instant::now();
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
        let done = self
            .engine
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
        let missing = unmet_result_labels(&answer.decision.obligations, &done.call.result_labels);
        if !missing.is_empty() {
            // Fail closed: a result that does not carry the labels its
            // constrain requires is not handed on.
            return Ok(tool_error(
                format!(
                    "the result was withheld: its record lacks the labels its constrain requires ({missing:?})"
                ),
                json!({"verdict": "constrain", "error": "obligation_unmet", "call_id": call_id,
                       "missing_labels": missing}),
            ));
        }
        tracing::debug!(
            target: "warden_mcp::timing",
            gate_us = micros(decided.duration_since(started)),
            upstream_us = micros(answered.duration_since(decided)),
            record_us = micros(answered.elapsed()),
            "tools/call {name}"
        );
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
            return Err(match check.refused.iter().find(|r| r.tool == tool) {
                Some(r) => format!(
                    "upstream `{server}` tool `{tool}` is withdrawn: {}",
                    r.problems.join("; ")
                ),
                None => format!("upstream `{server}` has no tool `{tool}`"),
            });
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

/// The tool error of a call held for review past its wait: it names the
/// escalation, and a retry of the same call once it is approved proceeds.
fn held_error(answer: &warden::CallAnswer) -> CallToolResult {
    let escalation = answer.call.escalation_id.clone().unwrap_or_default();
    tool_error(
        format!(
            "held for review: escalation {escalation} ({}); retry the same call once it is approved",
            answer.decision.reason
        ),
        json!({"verdict": "escalate", "reason": answer.decision.reason.to_string(),
               "escalation_id": escalation, "call_id": answer.call.call_id}),
    )
}

enum Review {
    Approved,
    Rejected(String),
    Pending,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
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
    fn a_result_is_handed_on_only_with_the_labels_its_constrain_requires() {
        let l = |s: &str| warden_core::ids::Label::parse(s).unwrap();
        let obligations = vec![
            Obligation::ResultLabels {
                labels: vec![l("pii"), l("finance")],
            },
            Obligation::InheritRestrictions {
                restrictions: vec![l("no_export")],
            },
        ];
        assert_eq!(
            unmet_result_labels(&obligations, &[l("pii"), l("finance"), l("x")]),
            Vec::new()
        );
        assert_eq!(
            unmet_result_labels(&obligations, &[l("pii")]),
            vec![l("finance")]
        );
        assert_eq!(unmet_result_labels(&[], &[]), Vec::new());
        // A restriction to inherit binds delegation, not the call's result.
        assert_eq!(unmet_result_labels(&obligations[1..], &[]), Vec::new());
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
