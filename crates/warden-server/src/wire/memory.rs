//! Scoped memory.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use warden::ResolvedValue;
use warden_core::bundle::ClassName;
use warden_core::ids::{AgentId, Key, Namespace};
use warden_core::memory::{Combinator, MemoryRecord, Visibility};

/// `PUT /v1/memory/{namespace}/{key}`: write a record in the caller's scope.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PutMemoryRequest {
    /// The value (any JSON).
    pub value: Value,
    /// Compare-and-set: `0` = create only, `n` = only at revision `n`.
    #[serde(default)]
    pub expected_revision: Option<u64>,
    /// Visibility (kept on update when absent; private on create).
    #[serde(default)]
    pub visibility: Option<Visibility>,
    /// Record class (kept on update when absent; preference on create).
    #[serde(default)]
    pub class: Option<ClassName>,
    /// Combinator, for class `policy` (required there).
    #[serde(default)]
    pub combine: Option<Combinator>,
    /// Grantees, for class `secret`.
    #[serde(default)]
    pub grants: Option<Vec<AgentId>>,
    /// Expiry (ms since the epoch), for class `task`.
    #[serde(default)]
    pub expires_at: Option<i64>,
    /// The owner scope; defaults to the caller. Any other owner is denied
    /// `actor_is_not_owner` and recorded.
    #[serde(default)]
    pub owner_agent_id: Option<AgentId>,
}

/// Query of `DELETE /v1/memory/{namespace}/{key}`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteMemoryQuery {
    /// Delete only at this revision.
    #[serde(default)]
    pub expected_revision: Option<u64>,
}

/// One contributor to a combined `policy` value.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ContributorBody {
    /// Its owner.
    pub owner_agent_id: AgentId,
    /// Its revision.
    pub revision: u64,
    /// Its own value.
    pub value: Value,
}

/// A resolved memory value with its provenance.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct MemoryValueResponse {
    /// Namespace.
    pub namespace: Namespace,
    /// Key.
    pub key: Key,
    /// The value.
    pub value: Value,
    /// Its owner (for a combined policy value, the root-most contributor).
    pub owner_agent_id: AgentId,
    /// Visibility.
    pub visibility: Visibility,
    /// Class name.
    pub class: String,
    /// Revision.
    pub revision: u64,
    /// The decision's reason (`visible_from:<owner>`, `combined_from:...`).
    pub reason: String,
    /// For a policy value: the combinator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub combinator: Option<Combinator>,
    /// For a policy value: every contributing record, nearest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub contributors: Vec<ContributorBody>,
}

impl MemoryValueResponse {
    /// From a resolved value.
    pub fn new(namespace: Namespace, key: Key, v: ResolvedValue, reason: String) -> Self {
        Self {
            namespace,
            key,
            value: v.value,
            owner_agent_id: v.owner_agent_id,
            visibility: v.visibility,
            class: v.class,
            revision: v.revision,
            reason,
            combinator: v.combinator,
            contributors: v
                .contributors
                .into_iter()
                .map(|c| ContributorBody {
                    owner_agent_id: c.owner_agent_id,
                    revision: c.revision,
                    value: c.value,
                })
                .collect(),
        }
    }
}

/// A stored record after a write.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct MemoryWrittenResponse {
    /// Namespace.
    pub namespace: Namespace,
    /// Key.
    pub key: Key,
    /// Owner (the caller).
    pub owner_agent_id: AgentId,
    /// New revision.
    pub revision: u64,
    /// Visibility.
    pub visibility: Visibility,
    /// Class name.
    pub class: String,
    /// Whether the write created the record.
    pub created: bool,
}

impl From<&MemoryRecord> for MemoryWrittenResponse {
    fn from(r: &MemoryRecord) -> Self {
        Self {
            namespace: r.namespace.clone(),
            key: r.key.clone(),
            owner_agent_id: r.owner.clone(),
            revision: r.revision,
            visibility: r.visibility,
            class: r.class.name().to_owned(),
            created: r.revision == 1,
        }
    }
}

/// A deleted record.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct MemoryDeletedResponse {
    /// Namespace.
    pub namespace: Namespace,
    /// Key.
    pub key: Key,
    /// Owner (the caller).
    pub owner_agent_id: AgentId,
    /// The revision it had.
    pub revision: u64,
}
