//! Agents, delegation and tokens.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use warden::AgentView;
use warden_core::envelope::TrustZone;
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, Label, RunId};

/// `POST /v1/agents`: register an agent (operator).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterAgentRequest {
    /// The new agent's id (`self` is reserved).
    pub agent_id: AgentId,
    /// Its parent; absent for a root agent.
    #[serde(default)]
    pub parent_id: Option<AgentId>,
    /// Declared capabilities (action names from the catalogue).
    #[serde(default)]
    pub capabilities: Vec<ActionName>,
    /// The framework config of the agent (a JSON object). For a child built
    /// from this spec, a self-edit flag is cleared (delegation lockdown).
    #[serde(default)]
    pub config: Option<Value>,
    /// Tools a pre-built child carries; a prompt-block write tool is refused.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
}

/// `POST /v1/agents/self/children`: register a child of the calling agent.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DelegateRequest {
    /// The child's id.
    pub agent_id: AgentId,
    /// Optional; if given it must be the caller (anything else is denied
    /// `not_own_child` and recorded).
    #[serde(default)]
    pub parent_id: Option<AgentId>,
    /// Requested capabilities; the child's effective set is within the
    /// caller's whatever is asked.
    #[serde(default)]
    pub capabilities: Vec<ActionName>,
    /// The child's framework config.
    #[serde(default)]
    pub config: Option<Value>,
    /// Tools of a pre-built child.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Inherit the context envelope of this run (one of the caller's own
    /// runs; another agent's run answers 404). Without it, the child
    /// inherits the caller's own inherited envelope, if it holds one.
    #[serde(default)]
    pub from_run: Option<RunId>,
    /// Inherit the context envelope of this tool-call session (one of the
    /// caller's own sessions; another agent's answers 404).
    #[serde(default)]
    pub from_session: Option<warden_core::ids::SessionId>,
    /// Inherit a signed envelope from an issuer the bundle trusts
    /// (`{envelope, issuer, signature}`, as `GET /v1/runs/{run}/envelope/signed`
    /// answers it): forged, replayed and downgraded envelopes refuse the
    /// delegation (403 `delegation_denied`) and create nothing.
    #[serde(default)]
    pub from_envelope: Option<serde_json::Value>,
    /// Restrictions the child gets on top of the inherited ones (names from
    /// the bundle's `context.restrictions`, or built-in ones).
    #[serde(default)]
    pub restrictions: Vec<Label>,
    /// Where the child runs: `internal` (default, inside this deployment) or
    /// `external` (across a trust boundary).
    #[serde(default)]
    pub zone: Option<TrustZoneBody>,
    /// Pass the sensitivity and restrictions but not the labels.
    #[serde(default)]
    pub redact_labels: bool,
}

/// The trust zone of a delegated child.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TrustZoneBody {
    /// Inside this Warden deployment: its envelope is enforced here.
    Internal,
    /// Across a trust boundary: its envelope travels as a signed token.
    External,
}

impl From<TrustZoneBody> for TrustZone {
    fn from(z: TrustZoneBody) -> Self {
        match z {
            TrustZoneBody::Internal => TrustZone::Internal,
            TrustZoneBody::External => TrustZone::External,
        }
    }
}

/// A registered agent and its one-time token.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AgentCreatedResponse {
    /// The agent.
    pub agent_id: AgentId,
    /// Its parent.
    pub parent_id: Option<AgentId>,
    /// The bearer token: shown once, only its hash is stored.
    pub token: String,
    /// The token's public id (for revocation).
    pub token_id: String,
    /// Effective capabilities.
    pub effective_capabilities: Vec<ActionName>,
}

/// A token issued for an existing agent.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TokenIssuedResponse {
    /// The agent.
    pub agent_id: AgentId,
    /// The token's public id.
    pub token_id: String,
    /// The bearer token: shown once.
    pub token: String,
}

/// Active or revoked.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AgentStatusBody {
    /// May act.
    Active,
    /// Revoked with its descendants.
    Revoked,
}

/// An agent, its lineage and capabilities.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AgentResponse {
    /// Its id.
    pub agent_id: AgentId,
    /// Its parent.
    pub parent_id: Option<AgentId>,
    /// Itself and its ancestors, nearest first.
    pub lineage: Vec<AgentId>,
    /// Declared capabilities.
    pub declared_capabilities: Vec<ActionName>,
    /// Effective capabilities.
    pub effective_capabilities: Vec<ActionName>,
    /// Status.
    pub status: AgentStatusBody,
    /// The stored (sanitised) config.
    pub config: Option<Value>,
}

impl From<AgentView> for AgentResponse {
    fn from(v: AgentView) -> Self {
        Self {
            agent_id: v.agent_id,
            parent_id: v.parent_id,
            lineage: v.lineage,
            declared_capabilities: v.declared_capabilities,
            effective_capabilities: v.effective_capabilities,
            status: match v.status {
                AgentStatus::Active => AgentStatusBody::Active,
                AgentStatus::Revoked => AgentStatusBody::Revoked,
            },
            config: v.config,
        }
    }
}

/// Agents revoked by a `DELETE /v1/agents/{id}`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RevokedResponse {
    /// Newly revoked agents, the target first.
    pub revoked: Vec<AgentId>,
}

/// A token revoked.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TokenRevokedResponse {
    /// Its id.
    pub token_id: String,
    /// Always true.
    pub revoked: bool,
}
