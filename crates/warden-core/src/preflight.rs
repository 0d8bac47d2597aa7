//! Whole-SOP preflight: every step is authorised before any handler runs.
//!
//! [`preflight`] evaluates every step of a parsed SOP against the actor's
//! effective capabilities, the action catalogue and the argument rules, and
//! reports a decision for every step (not just the first failure). The SOP is
//! admitted only if every step is allowed. Preflight works on static data
//! only: it never calls a handler, looks up a tool, or touches storage.
//!
//! The acting agent is the runtime identity passed in; an `actor` or
//! `owner_agent_id` inside a step's arguments is data, checked against that
//! identity, never a source of it.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::catalogue::ActionCatalogue;
use crate::decision::{Decision, Reason, Subject, Verdict, reasons};
use crate::hierarchy::Hierarchy;
use crate::ids::{AgentId, check_identifier};
use crate::sop::Sop;
use crate::time::Timestamp;

/// The operation name recorded for step decisions.
pub const OP_SOP_VALIDATE: &str = "sop.validate";
/// Built-in action: read memory.
pub const MEMORY_READ: &str = "memory.read";
/// Built-in action: write memory.
pub const MEMORY_WRITE: &str = "memory.write";
/// A memory step whose `namespace`, `key` or owner is malformed.
pub const MEMORY_ARGUMENT_INVALID: &str = "memory_argument_invalid";

/// What preflight needs from the policy and hierarchy.
#[derive(Debug, Clone, Copy)]
pub struct PreflightContext<'a> {
    /// The agent hierarchy.
    pub hierarchy: &'a Hierarchy,
    /// The action catalogue.
    pub catalogue: &'a ActionCatalogue,
    /// The policy version decisions record.
    pub policy_version: &'a str,
}

/// The decision for one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepCheck {
    /// The step id as written (may be empty or repeated: that is a finding).
    pub step_id: String,
    /// The action as written.
    pub action: String,
    /// The decision (its reason is the first violation).
    pub decision: Decision,
    /// Every violation found for this step, in check order.
    pub violations: Vec<Reason>,
}

/// The result of preflight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preflight {
    /// Whether every step is allowed.
    pub admitted: bool,
    /// One check per step, in order.
    pub steps: Vec<StepCheck>,
}

impl Preflight {
    /// The steps that were denied.
    pub fn rejected(&self) -> impl Iterator<Item = &StepCheck> {
        self.steps.iter().filter(|s| !s.decision.permits())
    }
}

/// Evaluate every step of `sop` for `actor`.
pub fn preflight(
    ctx: &PreflightContext<'_>,
    actor: &AgentId,
    sop: &Sop,
    now: Timestamp,
) -> Preflight {
    let node = ctx
        .hierarchy
        .index_of(actor.as_str())
        .and_then(|i| ctx.hierarchy.node(i));
    let agent_failure = match node {
        None => Some(reasons::UNKNOWN_AGENT),
        Some(n) if !n.is_active() => Some(reasons::AGENT_REVOKED),
        Some(_) => None,
    };
    let mut seen: HashSet<&str> = HashSet::with_capacity(sop.steps.len());
    let mut steps = Vec::with_capacity(sop.steps.len());
    let mut admitted = true;
    for step in &sop.steps {
        let step_id = step.step_id_str();
        let mut violations = Vec::new();
        if let Some(r) = &agent_failure {
            violations.push(r.clone());
        }
        if step_id.is_empty() {
            violations.push(reasons::EMPTY_STEP_ID);
        } else if !seen.insert(step_id) {
            violations.push(reasons::DUPLICATE_STEP_ID);
        }
        match ctx.catalogue.index_of(step.action.as_str()) {
            None => violations.push(reasons::UNKNOWN_ACTION),
            Some(idx) => {
                if let Some(n) = node
                    && !n.effective().contains(idx.get())
                {
                    violations.push(reasons::ACTION_NOT_IN_EFFECTIVE_CAPABILITIES);
                }
                let action = step.action.as_str();
                if action == MEMORY_WRITE || action == MEMORY_READ {
                    check_memory_step(action, step.arguments(), actor, &mut violations);
                }
                violations.extend(ctx.catalogue.check_argument_value(idx, &step.arguments));
            }
        }
        let (verdict, reason) = match violations.first() {
            None => (Verdict::Allow, reasons::STEP_ALLOWED),
            Some(r) => (Verdict::Deny, r.clone()),
        };
        admitted &= verdict.permits();
        let mut resource = String::with_capacity(sop.sop_id.as_str().len() + 1 + step_id.len());
        resource.push_str(sop.sop_id.as_str());
        resource.push(':');
        resource.push_str(step_id);
        steps.push(StepCheck {
            step_id: step_id.to_owned(),
            action: step.action.to_string(),
            decision: Decision {
                verdict,
                reason,
                subject: Subject::Agent(actor.clone()),
                operation: OP_SOP_VALIDATE.to_owned(),
                resource,
                policy_version: ctx.policy_version.to_owned(),
                obligations: Vec::new(),
                time: now,
            },
            violations,
        });
    }
    Preflight { admitted, steps }
}

fn check_memory_step(
    action: &str,
    args: &serde_json::Map<String, Value>,
    actor: &AgentId,
    violations: &mut Vec<Reason>,
) {
    for field in ["namespace", "key"] {
        let ok = args
            .get(field)
            .and_then(Value::as_str)
            .is_some_and(|s| check_identifier(s).is_ok());
        if !ok {
            violations.push(Reason::with_param(MEMORY_ARGUMENT_INVALID, field));
        }
    }
    if action == MEMORY_WRITE {
        if !args.contains_key("value") {
            violations.push(Reason::with_param(MEMORY_ARGUMENT_INVALID, "value"));
        }
        // The owner scope defaults to the actor; naming anyone else is the
        // lab document's cross-owner write.
        match args.get("owner_agent_id") {
            None => {}
            Some(Value::String(owner)) if owner == actor.as_str() => {}
            Some(_) => violations.push(reasons::CROSS_OWNER_MEMORY_WRITE),
        }
    }
}
