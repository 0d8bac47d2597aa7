//! Decisions are values, not errors.
//!
//! Every question Warden answers (may this agent read that record, may this
//! step run, may this child be registered) produces a [`Decision`]: a verdict,
//! a stable snake_case [`Reason`] code, the subject, the operation, the
//! resource and the policy version. A deny is a `Decision`, never an `Err`.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};
/// Short shared text: identifiers and codes of up to 23 bytes are stored
/// inline and longer ones behind an `Arc`, so cloning a [`Decision`] (or
/// building one from an identifier) never allocates for them.
pub use smol_str::SmolStr;

use crate::ids::{AgentId, Label};
use crate::time::Timestamp;

/// The four outcomes of a governance decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The operation may proceed.
    Allow,
    /// The operation may proceed, and the obligations bind what follows.
    Constrain,
    /// The operation must not proceed.
    Deny,
    /// A human must review the operation before it may proceed.
    Escalate,
}

impl Verdict {
    /// Whether the operation may proceed now (`allow` or `constrain`).
    pub fn permits(self) -> bool {
        matches!(self, Verdict::Allow | Verdict::Constrain)
    }

    /// The verdict's snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Constrain => "constrain",
            Verdict::Deny => "deny",
            Verdict::Escalate => "escalate",
        }
    }
}

impl std::str::FromStr for Verdict {
    type Err = String;

    /// Parse the snake_case name ([`Verdict::as_str`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allow" => Ok(Verdict::Allow),
            "constrain" => Ok(Verdict::Constrain),
            "deny" => Ok(Verdict::Deny),
            "escalate" => Ok(Verdict::Escalate),
            other => Err(format!("unknown verdict `{other}`")),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stable snake_case reason code, optionally with one parameter after a
/// colon (`visible_from:report_manager`).
///
/// Codes are part of Warden's contract: clients and tests match on them.
/// Modules define their codes as constants (see [`reasons`]).
///
/// Held as a [`SmolStr`]: a code is a static string and a code with its
/// parameter up to 23 bytes is held inline, so most reasons cost no
/// allocation (a resolve's `visible_from:<owner>` among them).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Reason(SmolStr);

impl Reason {
    /// A parameterless code.
    pub const fn code(code: &'static str) -> Self {
        Self(SmolStr::new_static(code))
    }

    /// A code with one parameter: `prefix:param`.
    #[inline]
    pub fn with_param(prefix: &str, param: &str) -> Self {
        // Put together in place: held inline up to 23 bytes (most
        // `visible_from:<owner>`), one allocation above.
        Self(SmolStr::from_iter([prefix, ":", param]))
    }

    /// The code as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A code from an owned string (as read back from storage).
    pub fn from_string(code: String) -> Self {
        Self(SmolStr::from(code))
    }

    /// The part before the first colon (the code without its parameter).
    pub fn kind(&self) -> &str {
        self.0.split(':').next().unwrap_or("")
    }
}

impl fmt::Debug for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reason({})", self.0)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The reason codes of the lab document and the ones Warden adds.
pub mod reasons {
    use super::Reason;

    /// The agent (or an ancestor) has been revoked.
    pub const AGENT_REVOKED: Reason = Reason::code("agent_revoked");
    /// The agent is not registered.
    pub const UNKNOWN_AGENT: Reason = Reason::code("unknown_agent");
    /// The capability was not passed down the lineage.
    pub const CAPABILITY_NOT_INHERITED: Reason = Reason::code("capability_not_inherited");
    /// Prefix: the record was read from this owner.
    pub const VISIBLE_FROM: &str = "visible_from";
    /// Prefix: the nearest record belongs to this owner and is not visible.
    pub const NOT_VISIBLE_FROM: &str = "not_visible_from";
    /// Prefix: a `policy`-class value combined from these owners.
    pub const COMBINED_FROM: &str = "combined_from";
    /// No record on the lineage.
    pub const RECORD_NOT_FOUND: Reason = Reason::code("record_not_found");
    /// A task record whose expiry has passed.
    pub const RECORD_EXPIRED: Reason = Reason::code("record_expired");
    /// A secret read by an agent that is neither owner nor grantee.
    pub const SECRET_NOT_GRANTED: Reason = Reason::code("secret_not_granted");
    /// A secret read by its owner or a grantee.
    pub const SECRET_GRANTED: Reason = Reason::code("secret_granted");
    /// A write or delete naming another owner.
    pub const ACTOR_IS_NOT_OWNER: Reason = Reason::code("actor_is_not_owner");
    /// A write or delete by the owner.
    pub const OWNER_WRITE: Reason = Reason::code("owner_write");
    /// A delete by the owner.
    pub const OWNER_DELETE: Reason = Reason::code("owner_delete");
    /// Compare-and-set saw another revision.
    pub const REVISION_CONFLICT: Reason = Reason::code("revision_conflict");
    /// A write that would change a record's class or combinator.
    pub const CLASS_CHANGE: Reason = Reason::code("class_change_denied");
    /// SOP step id is empty.
    pub const EMPTY_STEP_ID: Reason = Reason::code("empty_step_id");
    /// SOP step id repeats.
    pub const DUPLICATE_STEP_ID: Reason = Reason::code("duplicate_step_id");
    /// The action is not in the catalogue.
    pub const UNKNOWN_ACTION: Reason = Reason::code("unknown_action");
    /// The action is known but not in the agent's effective capabilities.
    pub const ACTION_NOT_IN_EFFECTIVE_CAPABILITIES: Reason =
        Reason::code("action_not_in_effective_capabilities");
    /// A `memory.write` step naming another owner.
    pub const CROSS_OWNER_MEMORY_WRITE: Reason = Reason::code("cross_owner_memory_write");
    /// The step passed every check.
    pub const STEP_ALLOWED: Reason = Reason::code("step_allowed");
    /// The SOP was admitted.
    pub const SOP_ADMITTED: Reason = Reason::code("sop_admitted");
    /// The SOP was rejected (at least one step failed).
    pub const SOP_REJECTED: Reason = Reason::code("sop_rejected");
    /// The agent holds the capability.
    pub const CAPABILITY_GRANTED: Reason = Reason::code("capability_granted");
    /// An agent was registered.
    pub const AGENT_REGISTERED: Reason = Reason::code("agent_registered");
    /// A registration reused an agent id.
    pub const DUPLICATE_AGENT: Reason = Reason::code("duplicate_agent");
    /// A registration named a parent that is not registered.
    pub const UNKNOWN_PARENT: Reason = Reason::code("unknown_parent");
    /// A registration named a revoked parent.
    pub const PARENT_REVOKED: Reason = Reason::code("parent_revoked");
    /// A registration would make the hierarchy too deep (or the agent table
    /// is full).
    pub const DEPTH_EXCEEDED: Reason = Reason::code("depth_exceeded");
    /// The declared parents form a cycle.
    pub const HIERARCHY_CYCLE: Reason = Reason::code("hierarchy_cycle");
    /// A request that escalated before proceeds on a reviewer's approval.
    pub const ESCALATION_APPROVED: Reason = Reason::code("escalation_approved");
}

/// Something a `constrain` verdict obliges later steps to respect.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Obligation {
    /// The step's result must carry (at least) these labels.
    ResultLabels {
        /// Labels to attach.
        labels: Vec<Label>,
    },
    /// Any child delegated from here inherits these restrictions.
    InheritRestrictions {
        /// Restriction names.
        restrictions: Vec<Label>,
    },
}

/// Who a decision is about: the operator or an agent. The subject is always
/// the runtime identity of the caller, never a field of a payload.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Subject {
    /// The operator (the orchestrator holding the operator token).
    Operator,
    /// An agent.
    Agent(AgentId),
}

impl Subject {
    /// The operator's subject string in the decision log.
    pub const OPERATOR: &'static str = "@operator";

    /// The agent, if the subject is one.
    pub fn agent(&self) -> Option<&AgentId> {
        match self {
            Subject::Operator => None,
            Subject::Agent(a) => Some(a),
        }
    }
}

impl From<AgentId> for Subject {
    fn from(a: AgentId) -> Self {
        Subject::Agent(a)
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Operator => f.write_str(Self::OPERATOR),
            Subject::Agent(a) => f.write_str(a.as_str()),
        }
    }
}

impl Serialize for Subject {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Subject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <Cow<'de, str>>::deserialize(d)?;
        if s == Self::OPERATOR {
            Ok(Subject::Operator)
        } else {
            AgentId::parse(&s)
                .map(Subject::Agent)
                .map_err(serde::de::Error::custom)
        }
    }
}

/// One governance decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The outcome.
    pub verdict: Verdict,
    /// Stable reason code.
    pub reason: Reason,
    /// The caller (always the runtime identity, never a payload field).
    pub subject: Subject,
    /// What was attempted: an action name (`memory.read`) or a governance
    /// operation (`sop.validate`, `agent.register`, ...).
    pub operation: SmolStr,
    /// What it was attempted on (`project.client_region`, `sop:step`, ...).
    pub resource: SmolStr,
    /// The policy bundle version the decision was made under.
    pub policy_version: SmolStr,
    /// Obligations attached by a `constrain` verdict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub obligations: Vec<Obligation>,
    /// When the decision was made.
    pub time: Timestamp,
}

impl Decision {
    /// Whether the operation may proceed.
    pub fn permits(&self) -> bool {
        self.verdict.permits()
    }
}

#[cfg(test)]
mod tests {
    use super::Reason;

    proptest::proptest! {
        /// A code with its parameter is `prefix:param` whether it is held
        /// inline (up to 23 bytes) or allocated, across that capacity and
        /// for text that is not ASCII.
        #[test]
        fn a_code_with_a_parameter_is_prefix_colon_param(
            prefix in "[a-z_é]{0,16}",
            param in "[a-z0-9._:é-]{0,24}",
        ) {
            let reason = Reason::with_param(&prefix, &param);
            proptest::prop_assert_eq!(reason.as_str(), format!("{prefix}:{param}"));
            proptest::prop_assert_eq!(reason.kind(), prefix.as_str());
        }
    }
}
