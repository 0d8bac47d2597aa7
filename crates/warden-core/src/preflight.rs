//! Whole-SOP preflight: every step is authorised before any handler runs.
//!
//! [`preflight`] evaluates every step of a parsed SOP against the actor's
//! effective capabilities, the action catalogue and the argument rules, and
//! reports a decision for every step (not just the first failure). The SOP is
//! admitted only if every step is allowed. Preflight works on static data
//! only: it never calls a handler, looks up a tool, or touches storage.
//!
//! [`admit`] is the complete admission of a run: the same checks, then, for
//! a run with a context envelope, every step the starting restrictions
//! already deny. Its [`Preflight`] is final; nothing patches it afterwards.
//!
//! The acting agent is the runtime identity passed in; an `actor` or
//! `owner_agent_id` inside a step's arguments is data, checked against that
//! identity, never a source of it.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::catalogue::ActionCatalogue;
use crate::decision::{Decision, Reason, Subject, Verdict, reasons};
use crate::envelope::{ActionRef, ContextPolicy, ContextRequest, Envelope, decide};
use crate::hierarchy::{AgentNode, Hierarchy};
use crate::ids::{AgentId, check_identifier};
use crate::sop::{Sop, Step};
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

/// The envelope a run starts under, and the context policy that reads it.
#[derive(Debug, Clone, Copy)]
pub struct RunContext<'a> {
    /// The run's starting envelope: an empty root, or the one delegated from
    /// the envelope the acting agent inherited.
    pub envelope: &'a Envelope,
    /// The bundle's compiled `context:` section.
    pub policy: &'a ContextPolicy,
}

/// Evaluate every step of `sop` for `actor` on static data (no envelope):
/// [`admit`] without a [`RunContext`].
pub fn preflight(
    ctx: &PreflightContext<'_>,
    actor: &AgentId,
    sop: &Sop,
    now: Timestamp,
) -> Preflight {
    admit(ctx, actor, sop, None, now)
}

/// The complete admission of `sop` as a run of `actor`: every step's final
/// decision, in one pass.
///
/// Every step is checked on static data first (agent active, step id,
/// catalogue, effective capabilities, memory arguments, argument rules).
/// If every step passes and the run has a context (`run`), each step is
/// then decided against the run's starting envelope as the policy projects
/// it: a step a restriction already denies (`restricted_by:…`) is denied
/// with that reason and rejects the SOP, since restrictions never shrink
/// and it could never run. Other context verdicts (escalations, the floor,
/// obligations) are left to the step's own gate ([`ContextGate`]), because
/// what earlier steps produce may still change them.
///
/// An SOP rejected on static data is reported as it is, without the
/// envelope: the engine opens no envelope for it.
///
/// [`ContextGate`]: crate::envelope::ContextGate
pub fn admit(
    ctx: &PreflightContext<'_>,
    actor: &AgentId,
    sop: &Sop,
    run: Option<RunContext<'_>>,
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
    let mut found: Vec<Vec<Reason>> = sop
        .steps
        .iter()
        .map(|step| static_violations(ctx, node, agent_failure.as_ref(), actor, step, &mut seen))
        .collect();
    if let Some(run) = run
        && found.iter().all(Vec::is_empty)
    {
        for (step, violations) in sop.steps.iter().zip(found.iter_mut()) {
            let action = ActionRef {
                name: step.action.as_str(),
                tags: ctx
                    .catalogue
                    .by_name(step.action.as_str())
                    .map_or(&[], |a| a.tags()),
            };
            let cd = decide(run.envelope, run.policy, &ContextRequest::Action(action));
            if cd.is_permanent() {
                violations.push(cd.reason);
            }
        }
    }
    let mut admitted = true;
    let steps = sop
        .steps
        .iter()
        .zip(found)
        .map(|(step, violations)| {
            let check = step_check(ctx, actor, sop, step, violations, now);
            admitted &= check.decision.permits();
            check
        })
        .collect();
    Preflight { admitted, steps }
}

/// Everything wrong with `step` on static data, in check order.
fn static_violations<'s>(
    ctx: &PreflightContext<'_>,
    node: Option<&AgentNode>,
    agent_failure: Option<&Reason>,
    actor: &AgentId,
    step: &'s Step,
    seen: &mut HashSet<&'s str>,
) -> Vec<Reason> {
    let step_id = step.step_id_str();
    let mut violations = Vec::new();
    if let Some(r) = agent_failure {
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
    violations
}

/// The check of one step: denied with its first violation, if any.
fn step_check(
    ctx: &PreflightContext<'_>,
    actor: &AgentId,
    sop: &Sop,
    step: &Step,
    violations: Vec<Reason>,
    now: Timestamp,
) -> StepCheck {
    let step_id = step.step_id_str();
    let (verdict, reason) = match violations.first() {
        None => (Verdict::Allow, reasons::STEP_ALLOWED),
        Some(r) => (Verdict::Deny, r.clone()),
    };
    let mut resource = String::with_capacity(sop.sop_id.as_str().len() + 1 + step_id.len());
    resource.push_str(sop.sop_id.as_str());
    resource.push(':');
    resource.push_str(step_id);
    StepCheck {
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
    }
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

#[cfg(test)]
mod tests;
